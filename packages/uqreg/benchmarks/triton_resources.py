"""What uqreg's Triton step kernel costs a GPU's streaming multiprocessor, found without a GPU
(run: ``python packages/uqreg/benchmarks/triton_resources.py``; needs ``uqreg[triton]``).

Triton compiles a kernel for a named NVIDIA target on any machine, and its wheel carries
NVIDIA's ``ptxas``. This script compiles :func:`uqreg.engine.triton_step._step_kernel` for the
paper's network (widths 1-128-64-32-1; full batches of 50 rows padded to 64, bootstrap batches
of 25 padded to 32) at each warp count, with and without FGSM's second pass, and prints what
``ptxas -v`` reports: registers per thread, the stack frame and spill traffic per thread (spills
go to local memory, which the L1 cache holds), and the shared memory per program. With the
registers it gives the programs (networks) an SM can hold at once: 65,536 registers per SM on
sm_80 to sm_100, and at most 64 warps (``programs_per_sm``).

It measures the kernel as compiled, not its speed: ``bench_engine.py --device cuda --triton``
times it on a GPU.

The last line is machine readable: ``RESULT spill_stores_w<warps>=<bytes> ...`` for the full
batch without FGSM, the kernel of ``ens``'s step (``spill_stores_<precision>_w<warps>`` for
another ``--precisions``).
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # a compiled kernel, not the interpreter's

import triton
from triton.backends.compiler import GPUTarget

from uqreg.engine import triton_step

#: Registers per SM (compute capability 8.0 to 10.0) and the most warps an SM holds (H100).
REGISTERS_PER_SM, WARPS_PER_SM = 65536, 64
#: The kernel's float arguments (every other non-constexpr argument is a pointer or an integer).
FLOAT_ARGS = {"inv_n", "slope", "lr", "beta1", "beta2", "c_beta1", "c_beta2", "log_beta1", "log_beta2", "eps",
              "l2", "decay"}


def ptxas_path(arch: int) -> str:
    """The ``ptxas`` Triton itself uses for ``sm_<arch>``, or the one its wheel carries."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        return get_ptxas(arch).path
    except (ImportError, AttributeError):
        return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def resources(hidden: tuple[int, int, int], rows: int, fgsm: bool, warps: int, arch: int = 90,
              d_in: int = 1, precision: str = "ieee") -> dict[str, int]:
    """Compile the step kernel for ``sm_<arch>`` (its products at ``input_precision``
    ``precision``) and read ``ptxas -v``.

    Returns
    -------
    dict
        ``registers``, ``stack``, ``spill_stores``, ``spill_loads`` (bytes per thread),
        ``shared`` (bytes per program), ``programs_per_sm``.
    """
    fn = triton_step._step_kernel
    pads = [triton_step._pad(h) for h in hidden]
    consts = {"D": d_in, "H1": hidden[0], "H2": hidden[1], "H3": hidden[2], "P1": pads[0], "P2": pads[1],
              "P3": pads[2], "NP": triton_step._pad(rows), "FGSM": fgsm, "PREC": precision}
    sig = {n: "constexpr" if n in consts else "*fp32" if n.endswith("_ptr") else "fp32" if n in FLOAT_ARGS
           else "i64" for n in fn.arg_names}
    target = GPUTarget("cuda", arch, 32)
    kernel = triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts), target=target,
                            options={"num_warps": warps})
    suffix = "a" if arch == 90 else ""
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "step.ptx")
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        report = subprocess.run([ptxas_path(arch), f"-arch=sm_{arch}{suffix}", "-v", ptx, "-o",
                                 os.path.join(tmp, "step.cubin")], capture_output=True, text=True, check=True).stderr

    def number(pattern: str) -> int:
        match = re.search(pattern, report)
        return int(match.group(1)) if match else 0

    out = {"registers": number(r"Used (\d+) registers"), "stack": number(r"(\d+) bytes stack frame"),
           "spill_stores": number(r"(\d+) bytes spill stores"), "spill_loads": number(r"(\d+) bytes spill loads"),
           "shared": int(kernel.metadata.shared)}
    out["programs_per_sm"] = min(REGISTERS_PER_SM // max(1, out["registers"] * 32 * warps), WARPS_PER_SM // warps)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", type=int, default=90, help="compute capability x 10 (default 90: H100, H200)")
    p.add_argument("--warps", default="4,8,16", help="warps per program, comma-separated")
    p.add_argument("--hidden", default="128,64,32", help="the three hidden widths")
    p.add_argument("--precisions", default="ieee", help="the products' input_precision, comma-separated "
                   "(ieee: the backend's exact float32; tf32x3: three TF32 tensor-core products)")
    a = p.parse_args(argv)
    hidden = tuple(int(h) for h in a.hidden.split(","))
    warps = [int(w) for w in a.warps.split(",")]
    print(f"triton {triton.__version__}, ptxas {ptxas_path(a.arch)}, sm_{a.arch}, widths 1-{a.hidden}-1")
    result = {}
    for prec, fgsm, rows, w in itertools.product(a.precisions.split(","), (False, True), (50, 25), warps):
        r = resources(hidden, rows, fgsm, w, a.arch, precision=prec)
        print(f"  {prec:6s} {'FGSM' if fgsm else 'plain'} rows={rows:2d} warps={w:2d}: {r['registers']:3d} registers, "
              f"stack {r['stack']:5d} B, spill stores {r['spill_stores']:5d} B, loads {r['spill_loads']:5d} B "
              f"per thread; shared {r['shared']:6d} B; {r['programs_per_sm']} program(s) per SM")
        if not fgsm and rows == 50:
            result[f"{'' if prec == 'ieee' else prec + '_'}w{w}"] = r["spill_stores"]
    print("RESULT " + " ".join(f"spill_stores_{key}={b}" for key, b in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
