"""The engine benchmark under every instruction set this machine can emulate (run:
``python packages/uqreg/benchmarks/bench_engine_isas.py [bench_engine options]``).

A CPU with faster matrix units (AVX-512) raises the GEMM roofline while the memory-bound parts
of the step (Adam, element-wise work) do not follow, so the engine's targets (>= 0.90 of the
GEMM roofline, >= 1.5x the vmap peer) must hold for each instruction set, not only for the
machine's best. Runs ``bench_engine.py`` in a fresh interpreter per setting (the settings are
read when torch loads), one after the other, and prints the host's CPU, each setting's
``RESULT`` line and which targets it meets. The ratios inside one line are measured side by
side in one run; lines are comparable only as ratios.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

SETTINGS = {
    "native": {},
    "aten=avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "aten=default": {"ATEN_CPU_CAPABILITY": "default"},
    "mkl=avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "aten=avx2,mkl=avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                flags = Path("/proc/cpuinfo").read_text()
                isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f" {f} " in flags]
                return f"{line.split(':', 1)[1].strip()} ({', '.join(isa)})"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str]) -> int:
    bench = Path(__file__).with_name("bench_engine.py")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores")
    rows = []
    for name, env in SETTINGS.items():
        full = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")}
        full.update(env)
        print(f"[{name}] running bench_engine.py {' '.join(argv)}", flush=True)
        run = subprocess.run([sys.executable, str(bench), "--no-profile", *argv], env=full, capture_output=True,
                             text=True, check=False)
        result = [line for line in run.stdout.splitlines() if line.startswith("RESULT")]
        if run.returncode or not result:
            print(run.stdout[-2000:], run.stderr[-2000:], sep="\n")
            rows.append((name, "failed", ""))
            continue
        values = dict(re.findall(r"(\w+)=([\d.]+)", result[-1]))
        met = (float(values["fraction_of_gemm_roofline"]) >= 0.90, float(values["speedup_vs_vmap"]) >= 1.5)
        verdict = ", ".join(f"{t} {'met' if ok else 'NOT met'}" for t, ok in zip(("roofline>=0.90", "vmap>=1.5x"), met))
        rows.append((name, result[-1], verdict))
        print(f"[{name}] {result[-1]}  ({verdict})", flush=True)
    print("\nsummary")
    for name, line, verdict in rows:
        print(f"  {name:20s} {line}  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
