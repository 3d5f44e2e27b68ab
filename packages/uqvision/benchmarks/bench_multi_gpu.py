"""A zoo sweep on one GPU against the same sweep on every GPU of this machine (one Dask worker
per GPU, ``--gpus``), measured side by side in one run.

Run from the repository root::

    .tox/uqvision/bin/python packages/uqvision/benchmarks/bench_multi_gpu.py [--device cuda|cpu]
        [--images 2000] [--gpus all|N] [--rounds 1] [--batch-size 64]

The folder and the models are bench_sweep.py's (imported from it): ``--images`` generated
JPEGs of about 500 x 375 and 8 of timm's ``test_*`` networks with random weights sharing one
preprocessing, so the sweep decodes each image once (in this process, before the cells) and
its 8 cells run on the workers.

Two local clusters are started before the first round (their start-up and the workers'
imports are not timed): ``one``, a ``LocalCluster`` of one worker pinned to the first GPU, and
``many``, one worker per GPU (:class:`uqmetrics.runs.sweep.ClusterSpec` with ``gpus``: each
worker's ``CUDA_VISIBLE_DEVICES`` is its GPU alone, and it has the Dask resource ``GPU=1``).
Both sides run their cells on the same torch threads (the cores shared out among the GPUs), so
the ratio is the scaling out alone. A warm-up sweep of the 8 small images runs on each first
(not timed). Each round then times :func:`uqvision.sweep.sweep_predictions` into a fresh
caches folder on ``one``, then on ``many``, and compares the two folders: every data variable
of every cache bit for bit (``caches_bit_identical``: results never depend on the number of
workers or GPUs).

``RESULT multi_gpu_speedup`` is one / many (median over rounds), with ``gpus`` the GPUs of
``many``; ``DETAIL`` gives the seconds of each side and ``efficiency`` (speed-up / GPUs). The
sweep's serial part (hashing the folder, decoding it once, the plan) is in both sides, so the
speed-up is below ``gpus`` by that much (Amdahl). With fewer than 2 GPUs it prints one
``SKIP`` line and exits 0. ``--device cpu`` runs the same code path on the CPU as the
benchmark's own check, with ``--workers`` (default 2) CPU workers standing in for the GPUs
(their ``CUDA_VISIBLE_DEVICES`` set, and unused), and prints ``RESULT
multi_worker_speedup_cpu`` (information: two processes on a shared 2-core machine). Timings on
a shared machine move with its load: compare numbers of one run only.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sweep import MODELS, SMALL, make_jpegs, make_models
from compare_results import compare_file


def caches_identical(a: Path, b: Path) -> tuple[bool, int]:
    """Whether the caches of folders ``a`` and ``b`` are the same files with every data
    variable and coordinate equal (NaN where NaN; compare_results.py's exact comparison), and
    how many there are."""
    names_a = sorted(p.name for p in a.glob("*.nc"))
    names_b = sorted(p.name for p in b.glob("*.nc"))
    same = names_a == names_b and bool(names_a) and not any(
        compare_file(a / name, b / name, 0.0, 0.0)[1] for name in names_a)
    return same, len(names_a)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (the measure) or cpu (the check)")
    ap.add_argument("--images", type=int, default=None,
                    help="generated JPEGs (default 2000 on cuda, 64 on cpu)")
    ap.add_argument("--gpus", default="all", help="the GPUs of the many side: all or N (cuda)")
    ap.add_argument("--workers", type=int, default=2,
                    help="the workers of the many side on the cpu (default 2)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--work", default=None, help="working folder (default: a temporary one)")
    a = ap.parse_args(argv)
    import torch
    from uqmetrics.runs.sweep import ClusterSpec, open_client, select_gpus, visible_gpus

    from uqvision.predict import PredictConfig
    from uqvision.runtime import usable_cores
    from uqvision.sweep import sweep_predictions

    cuda = a.device.startswith("cuda")
    if cuda:
        if a.device not in ("cuda", "cuda:0"):
            ap.error(f"--device {a.device}: give cuda (each worker sees its GPU as cuda)")
        here = visible_gpus() if torch.cuda.is_available() else ()
        if len(here) < 2:
            print(f"bench_multi_gpu: SKIP multi_gpu: {len(here)} GPU(s) visible here, 2 or "
                  "more needed; nothing to measure")
            return 0
        try:
            many = select_gpus(a.gpus, here)
        except ValueError as err:
            ap.error(str(err))
        if len(many) < 2:
            ap.error(f"--gpus {a.gpus}: the many side needs 2 GPUs or more")
        one = many[:1]
    else:
        if a.workers < 2:
            ap.error(f"--workers: {a.workers} is not 2 or more")
        many = tuple(str(i) for i in range(a.workers))  # names only: unused on the cpu
        one = many[:1]
    images = a.images or (2000 if cuda else 64)
    if images <= SMALL:
        ap.error(f"--images: {images} is not above the small folder's {SMALL}")
    work = Path(a.work or tempfile.mkdtemp(prefix="bench_multi_gpu_"))
    work.mkdir(parents=True, exist_ok=True)
    cores = usable_cores()
    threads = max(1, cores // len(many))  # the same on both sides
    t0 = time.perf_counter()
    for old in ("jpegs", "warm"):  # an earlier run's, maybe of another size or cut
        shutil.rmtree(work / old, ignore_errors=True)
    folder = make_jpegs(work / "jpegs", images, threads=cores)
    warm = make_jpegs(work / "warm", SMALL, seed=1, threads=cores)
    specs = make_models(work)
    cfg = PredictConfig(batch_size=a.batch_size, device="cuda" if cuda else "cpu")
    unit = "GPU" if cuda else "CPU worker"
    print(f"bench_multi_gpu: {len(specs)} models ({', '.join(MODELS)}), {images} JPEGs "
          f"(~500x375) at 224 px, batch {a.batch_size}, device {cfg.device}; one: 1 {unit}, "
          f"many: {len(many)} {unit}s (CUDA_VISIBLE_DEVICES {', '.join(many)}); {cores} cores, "
          f"{threads} torch thread(s) per cell on both; made in {time.perf_counter() - t0:.1f} s",
          flush=True)
    gpu = {"GPU": 1} if cuda else None
    sides = {"one": ClusterSpec(gpus=one, resources=gpu),
             "many": ClusterSpec(gpus=many, resources=gpu)}
    rows: list[dict[str, float]] = []
    identical, n_caches = True, 0
    with open_client(sides["one"]) as c_one, open_client(sides["many"]) as c_many:
        clients = {"one": c_one, "many": c_many}

        def sweep(side: str, src: Path, tag: str) -> float:
            out = work / f"{side}{tag}"
            shutil.rmtree(out, ignore_errors=True)
            t = time.perf_counter()
            report = sweep_predictions(specs, src, out, cfg, client=clients[side],
                                       threads=threads)
            seconds = time.perf_counter() - t
            if report.failed:
                raise RuntimeError(f"the sweep on {side} failed: {report.failed}")
            return seconds

        try:
            for side in sides:  # warm-up: imports, image checks, CUDA contexts; not timed
                sweep(side, warm, "-warm")
            for r in range(a.rounds):
                t_one = sweep("one", folder, str(r))
                t_many = sweep("many", folder, str(r))
                same, n_caches = caches_identical(work / f"one{r}", work / f"many{r}")
                identical &= same
                for side in sides:
                    shutil.rmtree(work / f"{side}{r}")
                rows.append({"speedup": t_one / t_many, "one": t_one, "many": t_many})
                print(f"round {r}: one={t_one:.2f}s many={t_many:.2f}s "
                      f"speedup={t_one / t_many:.2f} caches_bit_identical={int(same)}",
                      flush=True)
        except RuntimeError as exc:
            print(f"bench_multi_gpu: {exc}", file=sys.stderr)
            return 1
    med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
    n = len(many)
    print(f"DETAIL one_s={med['one']:.2f} many_s={med['many']:.2f} "
          f"efficiency={med['speedup'] / n:.2f} caches_bit_identical={int(identical)} "
          f"caches={n_caches} images={images} threads_per_cell={threads}", flush=True)
    if cuda:
        print(f"RESULT multi_gpu_speedup={med['speedup']:.2f} gpus={n} "
              f"caches_bit_identical={int(identical)}", flush=True)
    else:
        print(f"RESULT multi_worker_speedup_cpu={med['speedup']:.2f} workers={n} "
              f"caches_bit_identical={int(identical)} (cpu: information only)", flush=True)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
