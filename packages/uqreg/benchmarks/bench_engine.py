"""Benchmark of the batched training engine (run: ``python packages/uqreg/benchmarks/bench_engine.py``).

Prints, from ONE run, side by side:

1. the time to train a 120-member deep ensemble (sinusoid, f_main = 1, 50 training points,
   300 full-batch epochs) with the batched engine and with the per-network loop peer libraries
   use (one ``nn.Module`` + ``torch.optim.Adam`` per member, ``tests/loop_reference.py``), and
   their ratio;
2. the achieved GFLOP/s of the training step for one study cell of 6,000 networks
   (50 repetitions × 120 members) against this machine's own float32 matmul peak, measured in
   the same run with a large square matmul, and the peak resident memory;
3. with ``--explore``, the variants tried (chunk sizes, foreach vs fused Adam, concurrent
   chunks), so the losers' numbers are on record;
4. a torch-profiler table of one chunk's training: where the time goes.

FLOPs counted: 6·n·Σ fan_in·fan_out per network and epoch (2 forward, 4 backward), the usual
dense-training count; element-wise work (activations, Adam) is not counted as FLOPs, so the
fraction of peak is a lower bound of how busy the matmul units are.

The last line is machine readable:
``RESULT speedup_vs_loop=<x> fraction_of_matmul_peak=<y>``.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from loop_reference import train_ensemble_loop  # noqa: E402

from uqreg.engine import NetworkBatch, TrainConfig, torch_threads, train_batched  # noqa: E402
from uqreg.methods import get_method  # noqa: E402
from uqreg.tasks import get_task  # noqa: E402


def matmul_peak(device: str, dtype=torch.float32, n: int = 4096, repeats: int = 5) -> float:
    """float32 GFLOP/s of a large square matmul (best of ``repeats``)."""
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    best = float("inf")
    for _ in range(repeats + 1):
        _sync(device)
        t = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def _sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def train_flops(n_rows: int, input_dim: int, cfg: TrainConfig) -> float:
    widths = (input_dim, *cfg.hidden, 1)
    return 6.0 * n_rows * sum(a * b for a, b in zip(widths[:-1], widths[1:]))


def time_batched(inst, y, n_reps: int, members: int, epochs: int, cfg: TrainConfig, chunk: int | None = None) -> float:
    """Seconds to train n_reps × members networks for ``epochs`` epochs (training only, no
    prediction), chunked and run on ``cfg.threads`` concurrent chunks as ``Method.run`` does."""
    nets = NetworkBatch(np.repeat(np.arange(n_reps), members), np.tile(np.arange(members), n_reps))
    chunk = chunk or get_method("ens").chunk(inst, cfg, len(nets))
    parts = list(nets.chunks(chunk))

    def train(part):
        train_batched(inst.x_train, y, part, seed=inst.seed, head="deterministic", sampler="full",
                      adversarial=False, cfg=cfg, epochs=epochs)

    threads = min(cfg.threads, len(parts))
    _sync(cfg.device)
    t = time.perf_counter()
    if threads > 1:
        with torch_threads(1), ThreadPoolExecutor(threads) as pool:
            list(pool.map(train, parts))
    else:
        for part in parts:
            train(part)
    _sync(cfg.device)
    return time.perf_counter() - t


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="concurrent chunks (default: cores on CPU)")
    p.add_argument("--epochs", type=int, default=300, help="epochs of the 120-member comparison")
    p.add_argument("--loop-members", type=int, default=120, help="members trained by the loop (time scaled to 120)")
    p.add_argument("--cell-epochs", type=int, default=10, help="epochs timed for the 6,000-network cell")
    p.add_argument("--chunk", type=int, default=None, help="networks per chunk for the 6,000-network cell")
    p.add_argument("--tf32", action="store_true", help="allow TF32 matmuls on CUDA")
    p.add_argument("--explore", action="store_true", help="also time chunk sizes and Adam variants")
    p.add_argument("--no-profile", action="store_true", help="skip the profile of one chunk's training")
    a = p.parse_args(argv)
    if a.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
    cfg = TrainConfig(device=a.device, parallel_chunks=a.threads)
    inst = get_task("sinusoid").instance(1, seed=0)
    members = 120
    print(f"device={a.device} torch={torch.__version__} concurrent chunks={cfg.threads} "
          f"torch threads={torch.get_num_threads()}")

    # warm-up (imports, allocator)
    y1 = inst.targets([0])
    time_batched(inst, y1, 1, 8, 3, cfg)
    train_ensemble_loop(inst.x_train, y1[0], 1, cfg, 3)

    # 1. 120-member ensemble: batched vs loop
    t_batched = time_batched(inst, y1, 1, members, a.epochs, cfg)
    _sync(a.device)
    t0 = time.perf_counter()
    train_ensemble_loop(inst.x_train, y1[0], a.loop_members, cfg, a.epochs)
    _sync(a.device)
    t_loop = (time.perf_counter() - t0) * members / a.loop_members
    speedup = t_loop / t_batched
    print(f"\n[1] 120-member ensemble, sinusoid f_main=1, N=50, {a.epochs} epochs")
    print(f"    batched engine : {t_batched:8.2f} s")
    print(f"    per-network loop: {t_loop:8.2f} s" + (f"  (timed {a.loop_members} members, scaled)" if a.loop_members != members else ""))
    print(f"    speedup         : {speedup:8.1f} x")

    # 2. one study cell: 50 repetitions x 120 members = 6000 networks
    peak = matmul_peak(a.device)
    reps = 50
    y = inst.targets(np.arange(reps))
    flops = train_flops(inst.x_train.shape[0], 1, cfg) * reps * members * a.cell_epochs
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if a.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t_init = time_batched(inst, y, reps, members, 0, cfg, chunk=a.chunk)  # initialisation only
    t_cell = time_batched(inst, y, reps, members, a.cell_epochs, cfg, chunk=a.chunk) - t_init
    peak_after = matmul_peak(a.device)
    peak = max(peak, peak_after)
    achieved = flops / t_cell / 1e9
    frac = achieved / peak
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"\n[2] one cell: {reps} x {members} = {reps * members} networks, {a.cell_epochs} epochs, chunk={a.chunk or 'all'}")
    print(f"    initialisation   : {t_init:8.3f} s (once per cell, not counted below)")
    print(f"    time per epoch   : {t_cell / a.cell_epochs:8.3f} s")
    print(f"    achieved         : {achieved:8.1f} GFLOP/s")
    print(f"    matmul peak      : {peak:8.1f} GFLOP/s (4096^2 float32, best of before/after)")
    print(f"    fraction of peak : {frac:8.3f}")
    print(f"    peak RSS         : {rss / 1024:8.0f} MiB (before the cell {rss0 / 1024:.0f} MiB)")
    if a.device.startswith("cuda"):
        print(f"    peak CUDA memory : {torch.cuda.max_memory_allocated() / 2**20:8.0f} MiB")

    if a.explore:
        print("\n[3] variants (6,000-network cell, GFLOP/s and fraction of the same peak)")
        for chunk in (60, 120, 300, 1200, 3000):
            for impl, threads in (("fused", None), ("foreach", None), ("fused", 1)):
                c = replace(cfg, adam=impl, parallel_chunks=threads)
                t = time_batched(inst, y, reps, members, a.cell_epochs, c, chunk=chunk) - time_batched(inst, y, reps, members, 0, c, chunk=chunk)
                g = flops / t / 1e9
                print(f"    chunk={chunk:5d} adam={impl:8s} concurrent chunks={c.threads}: "
                      f"{t / a.cell_epochs:7.3f} s/epoch {g:7.1f} GFLOP/s {g / peak:6.3f}")

    if not a.no_profile:
        # where the time goes: torch profiler over one 60-network chunk, single-threaded kernels
        from torch.profiler import profile

        part = NetworkBatch(np.zeros(60, dtype=np.int64), np.arange(60))
        with torch_threads(1), profile() as prof:
            train_batched(inst.x_train, y, part, seed=inst.seed, head="deterministic", sampler="full",
                          adversarial=False, cfg=cfg, epochs=50)
        print("\n[4] profile: one 60-network chunk, 50 epochs, 1 thread (initialisation included)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
        if speedup < 40 or frac < 0.5:
            print("    targets (>= 40x, >= 0.5 of peak) not reached: the small batched GEMMs run below the\n"
                  "    large-matmul rate and element-wise work (Adam, activations, reductions) is not fused;\n"
                  "    see the README's performance section.")

    print(f"\nRESULT speedup_vs_loop={speedup:.1f} fraction_of_matmul_peak={frac:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
