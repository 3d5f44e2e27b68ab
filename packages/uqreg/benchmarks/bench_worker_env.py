"""A study's cells in a Dask worker of Dask's defaults, run plainly and as a sweep runs them
(run: ``python packages/uqreg/benchmarks/bench_worker_env.py``).

Dask's nanny starts every worker with ``MALLOC_TRIM_THRESHOLD_=65536``
(``distributed.nanny.pre-spawn-environ``). Setting it also turns glibc's adaptive mmap threshold
off, so every array above 128 KiB is mapped afresh, and page-faulted in, each time it is made.
The engine makes many such arrays: activations, dropout masks and their random numbers. A sweep
cell first gives the allocator back its reuse of large blocks
(``uqmetrics.runs.sweep.heap_for_arrays``, docs/conventions.md#sweep-workers).

The script starts one ``LocalCluster`` of Dask's defaults with two workers of one thread: on
one (``plain``) it runs the cells as they are, on the other (``sweep``) after
``heap_for_arrays``, as a sweep does (the setting lasts for the process, hence two workers). The
cells are paper-e1's (``--methods``, f_main = 1, ``--epochs`` epochs, 50 repetitions), run on
each side in turn ``--rounds`` times after one untimed round; each side keeps its best time.
It checks that both sides' cells are bit-identical.

The last line is machine readable: ``RESULT plain_vs_sweep=<ratio>``, the plain side's best
seconds over the sweep side's, summed over the methods; ``DETAIL`` lines give each method's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace

import numpy as np
import xarray as xr

from uqreg.presets import PRESETS
from uqreg.sweep import plan_cells, run_cell


def _timed_cell(config: dict, as_a_sweep: bool) -> tuple[float, xr.Dataset]:
    """(seconds, dataset) of one cell, after ``heap_for_arrays`` if ``as_a_sweep``."""
    from uqmetrics.runs.sweep import heap_for_arrays

    if as_a_sweep:
        heap_for_arrays()
    t = time.perf_counter()
    ds = run_cell(config)
    return time.perf_counter() - t, ds


def _identical(a: xr.Dataset, b: xr.Dataset) -> bool:
    return all(np.array_equal(a[v].values, b[v].values, equal_nan=a[v].dtype.kind == "f")
               for v in a.data_vars) and set(a.data_vars) == set(b.data_vars)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="bd,ens", help="comma-separated methods (default bd,ens)")
    ap.add_argument("--epochs", type=int, default=2,
                    help="epochs per cell (default 2: nearly all of a cell is then what it costs "
                         "whatever its epochs)")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    from dask.distributed import Client, LocalCluster

    base = PRESETS["paper-e1"].config
    configs = {}
    for method in a.methods.split(","):
        cfg = replace(base, complexities=(1,), methods=(method,),
                      train=replace(base.train, epochs=a.epochs))
        configs[method] = plan_cells(cfg, chunk_repetitions=base.repetitions)[0].params["config"]
    sides = ("plain", "sweep")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        worker = dict(zip(sides, sorted(client.scheduler_info()["workers"])))
        trim = client.run(os.environ.get, "MALLOC_TRIM_THRESHOLD_")
        print(f"bench_worker_env: methods {a.methods}, {a.epochs} epochs, best of {a.rounds} "
              f"rounds, two workers of one thread; MALLOC_TRIM_THRESHOLD_ in the workers: "
              f"{sorted(set(trim.values()), key=str)}", flush=True)

        def run(side: str, config: dict) -> tuple[float, xr.Dataset]:
            return client.submit(_timed_cell, config, side == "sweep", workers=[worker[side]],
                                 pure=False).result()

        for side in sides:  # warm-up: imports, first calls (not timed)
            for config in configs.values():
                run(side, config)
        best = {side: dict.fromkeys(configs, float("inf")) for side in sides}
        results: dict = {}
        for r in range(a.rounds):
            for side in sides:
                for method, config in configs.items():
                    seconds, ds = run(side, config)
                    best[side][method] = min(best[side][method], seconds)
                    results.setdefault(method, {})[side] = ds
            print(f"round {r}: " + " ".join(f"{side}_{m}={best[side][m]:.2f}s"
                                            for side in sides for m in configs), flush=True)
    identical = all(_identical(r["plain"], r["sweep"]) for r in results.values())
    for method in configs:
        print(f"DETAIL {method} plain_s={best['plain'][method]:.3f} "
              f"sweep_s={best['sweep'][method]:.3f} "
              f"ratio={best['plain'][method] / best['sweep'][method]:.2f}")
    total = {side: sum(best[side].values()) for side in sides}
    print(f"DETAIL cells_bit_identical={int(identical)}")
    print(f"RESULT plain_vs_sweep={total['plain'] / total['sweep']:.2f}", flush=True)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
