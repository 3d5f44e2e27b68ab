"""Benchmark of the mean–variance heads against the mean-only heads (run:
``python packages/uqreg/benchmarks/bench_meanvar.py``).

For each pair ``<method>`` / ``<method>+mv`` it trains and predicts the same networks (sinusoid,
f_main = 1, 50 training points, the paper's network d→128→64→32→1, 300 full-batch epochs;
``--members`` ensemble members or ``--reps`` dropout networks, one chunk, one thread) in ONE
run, alternating the two ``--rounds`` times, and keeps each one's best time: the CPU time of the
thread that runs the chunk (``time.thread_time``; the machine may be shared, so wall time is
printed beside it but not used for the ratio). The ratio mean–variance / mean-only is the cost
of the second output layer and the NLL (target ≤ 1.3).

The last line is machine readable: ``RESULT <method>=<ratio> ... max=<ratio>``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from uqreg.engine import TrainConfig
from uqreg.methods import get_method
from uqreg.tasks import get_task


def timed(name: str, inst, cfg: TrainConfig, reps: int, epochs: int) -> tuple[float, float]:
    """(thread CPU seconds, wall seconds) of one training + prediction of ``name``."""
    y = inst.targets(range(reps))
    method = get_method(name)
    wall, cpu = time.perf_counter(), time.thread_time()
    method.run(inst, y, range(reps), cfg, epochs=epochs)
    return time.thread_time() - cpu, time.perf_counter() - wall


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="ens,ens_adv,bd,vd", help="comma-separated base methods")
    ap.add_argument("--members", type=int, default=32, help="ensemble members (one repetition)")
    ap.add_argument("--reps", type=int, default=32, help="dropout networks (repetitions)")
    ap.add_argument("--epochs", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    inst = get_task("sinusoid").instance(1, 0)
    print(f"torch {torch.__version__}, {inst.x_train.shape[0]} training points, {args.epochs} epochs, "
          f"best of {args.rounds} alternating rounds, one thread (thread CPU time)")
    ratios = {}
    for base in args.methods.split(","):
        ens = get_method(base).ensemble
        cfg = TrainConfig(members=args.members, parallel_chunks=1, chunk_networks=None, mc_samples=200)
        reps = 1 if ens else args.reps
        best = {base: [np.inf, np.inf], f"{base}+mv": [np.inf, np.inf]}
        timed(base, inst, cfg, reps, 2)  # warm-up
        for _ in range(args.rounds):
            for name in best:
                cpu, wall = timed(name, inst, cfg, reps, args.epochs)
                best[name] = [min(best[name][0], cpu), min(best[name][1], wall)]
        ratios[base] = best[f"{base}+mv"][0] / best[base][0]
        nets = args.members if ens else args.reps
        print(f"{base:8s} {nets:4d} networks: mean-only {best[base][0]:7.2f} s CPU ({best[base][1]:6.2f} s wall), "
              f"mean-variance {best[f'{base}+mv'][0]:7.2f} s CPU ({best[f'{base}+mv'][1]:6.2f} s wall), "
              f"ratio {ratios[base]:.2f}")
    print("RESULT " + " ".join(f"{k}={v:.3f}" for k, v in ratios.items()) + f" max={max(ratios.values()):.3f}")


if __name__ == "__main__":
    main()
