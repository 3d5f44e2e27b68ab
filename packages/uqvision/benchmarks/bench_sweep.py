"""A zoo sweep of 8 models sharing one preprocessing against 8 separate ``predict`` runs,
measured side by side in one run.

Run from the repository root::

    .tox/uqvision/bin/python packages/uqvision/benchmarks/bench_sweep.py [--device cpu|cuda]
        [--images 320] [--workers N] [--rounds 3] [--batch-size 32] [--profile IMAGES]

The folder: ``--images`` generated JPEGs of about 500 x 375 pixels (smooth random colour
fields with noise, quality 90, in 4 class folders; an ImageNet validation image is about
500 x 375), each from its own seed, made by threads (any number of images: 5,000 take about
400 MB of JPEGs and, while the sweep runs, a 750 MB decoded file, which it reads through a
memory map; both are printed before the first round). The models: 8 of timm's ``test_*`` networks with random weights
(``pretrained=False``), each written as a checkpoint whose sidecar gives them one data
configuration, 224 px (``resize 256, centre crop 224, bilinear``; their own mean and std,
which the shared decoding leaves to each model).

Each round, in the same order:

- ``sweep``: :func:`uqvision.sweep.sweep_predictions` of the 8 models into a fresh caches
  folder on the Dask ``LocalCluster`` the command starts (``uqmetrics.runs.sweep.open_client``;
  docs/conventions.md#sweep-workers), started before the first round (``--workers`` worker
  processes, default 1 on a GPU, else the cores, each cell on ``cores / workers`` torch
  threads; its start-up and the workers' imports are not timed, as the imports are not timed
  for ``predict``), which decodes each image once for the group (:mod:`uqvision.sweep.decode`);
- ``separate``: :func:`uqvision.predict.predict_to_files` of each model in turn into another
  fresh folder, in this process (``uqvision predict`` without the import: its DataLoader
  workers as the command picks them).

Each round also times both sides on the small folder of the warm-up (``SMALL`` = 8 images,
one batch), after the large one. The cost of a side is then taken as linear in the images,
``t(n) = F + v n`` through its two points (:func:`fixed_cost`); ``per_cell_fixed_s`` is the
sweep's ``F`` over its cells (the wall-clock seconds a cell costs whatever its images: model
build and load, warm-up, reading the decoded file, the cache write, the Dask task; the plan's
fingerprinting and decoding set-up are shared out among the cells), ``separate_fixed_s`` the
same for one separate run, and ``marginal_zoo_vs_separate`` the ratio of the two sides' ``v``:
what ``zoo_vs_separate`` tends to as the folder grows.

``zoo_vs_separate`` is sweep / separate (median over rounds); ``decodes_per_image`` counts
the full decodes of the image files during the timed sweeps (the loader's decode functions,
``uqvision.data.folders.load_image`` / ``_load_sample`` and the decoded module's, wrapped in
every process: this one, its DataLoader workers and the Dask workers) per image and per
preprocessing group. Also printed: ``DETAIL`` (the separate runs' decodes per image, whether
the caches of both sides are bit-identical and, where not, their largest logit difference
and the torch threads of each side, the seconds of each side). A warm-up round of
both sides (not timed) checks the images in every process first (as a command does once).
Targets (the issue's): ``zoo_vs_separate <= 0.6`` on a CPU, ``<= 0.2`` on a GPU at 5,000
images or more, ``decodes_per_image = 1``. Timings on a shared machine move with its load: compare numbers
of one run only.

``--profile IMAGES`` then says where a cell's time per image goes (:func:`profile_cells`):
each model predicts a folder of ``IMAGES`` more JPEGs in this process as a cell does, under
:mod:`torch.profiler`, with the network's forward and the making of each batch labelled.
``profile_gpu_busy_fraction`` is the CUDA kernels' time over the wall time: far below 1, the
cells are bound by the CPU launching kernels and running Python, not by the GPU. On CUDA it
then times each model's forward replayed from a CUDA graph against the eager forward
(:func:`graph_forwards`: ``graph_forward_speedup``, ``graph_bit_identical``), the lever such a
bound calls for, measured before the library uses it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import safetensors.torch
import timm
import torch
import xarray as xr
from PIL import Image

#: 8 cheap timm test networks that take 224-px input (``test_vit`` with ``img_size=224``).
MODELS = ("test_vit", "test_convnext", "test_mambaout", "test_byobnet", "test_convnext2",
          "test_convnext3", "test_efficientnet_gn", "test_efficientnet_ln")
#: The one data configuration every model's sidecar gives it (``pretrained_cfg``).
DATA_CONFIG = {"input_size": [3, 224, 224], "crop_pct": 0.875, "interpolation": "bilinear",
               "crop_mode": "center"}
N_CLASSES = 4
#: Images of the small folder (the warm-up's), timed each round for the fixed costs.
SMALL = 8


def _make_jpeg(root: Path, i: int, seed: int) -> None:
    rng = np.random.default_rng((seed, i))
    w, h = (375, 500) if i % 4 == 3 else (500, 375)
    low = rng.integers(0, 256, (h // 25 + 1, w // 25 + 1, 3), dtype=np.uint8)
    img = Image.fromarray(low).resize((w, h), Image.BICUBIC)
    a = np.asarray(img, np.int16) + rng.integers(-20, 21, (h, w, 3), dtype=np.int16)
    Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(
        root / f"class_{i % N_CLASSES}" / f"{i:05d}.jpg", quality=90)


def make_jpegs(root: Path, n: int, seed: int = 0, threads: int = 1) -> Path:
    """``n`` JPEGs of 500 x 375 (every 4th 375 x 500) in ``N_CLASSES`` class folders, image
    ``i`` from the seed ``(seed, i)``: the same files whatever ``threads`` (Pillow and NumPy
    release the GIL for most of the work)."""
    for c in range(N_CLASSES):
        (root / f"class_{c}").mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max(1, threads)) as pool:
        list(pool.map(lambda i: _make_jpeg(root, i, seed), range(n)))
    return root


def fixed_cost(t_small: float, n_small: int, t_large: float, n_large: int
               ) -> tuple[float, float]:
    """``(F, v)`` of the line ``t(n) = F + v n`` through ``(n_small, t_small)`` and
    ``(n_large, t_large)``: the seconds that do not depend on the images, and the seconds per
    image. ``n_large > n_small`` (else ``ValueError``).

    >>> fixed_cost(3.0, 8, 13.0, 1008)
    (2.92, 0.01)
    """
    if n_large <= n_small:
        raise ValueError(f"n_large: {n_large} is not above n_small ({n_small})")
    v = (t_large - t_small) / (n_large - n_small)
    return t_small - v * n_small, v


def du_mb(path: Path) -> float:
    """Megabytes of the files below ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def make_models(work: Path) -> list[str]:
    """The specs ``arch=checkpoint`` of :data:`MODELS` (random weights, seed 0)."""
    specs = []
    for arch in MODELS:
        kw = {"img_size": 224} if arch.startswith("test_vit") else {}
        torch.manual_seed(0)
        net = timm.create_model(arch, pretrained=False, num_classes=N_CLASSES, **kw)
        ckpt = work / f"{arch}.safetensors"
        safetensors.torch.save_file(net.state_dict(), str(ckpt))
        cfg = {**DATA_CONFIG, "mean": list(net.pretrained_cfg["mean"]),
               "std": list(net.pretrained_cfg["std"])}
        ckpt.with_suffix(".json").write_text(json.dumps({
            "classes": [f"class_{c}" for c in range(N_CLASSES)], "model_kwargs": kw,
            "pretrained_cfg": cfg}))
        specs.append(f"{arch}={ckpt}")
    return specs


def install_counter(log_dir: str) -> None:
    """Wrap the loader's decode functions of this process: each full decode appends the image
    to ``log_dir/<pid>.txt`` (run in every process that decodes; forked children inherit)."""
    folders = importlib.import_module("uqvision.data.folders")
    decoded = importlib.import_module("uqvision.predict.decoded")

    def counted(fn):
        if getattr(fn, "_counted", False):
            return fn

        def wrapper(*args, **kwargs):
            with open(Path(log_dir) / f"{os.getpid()}.txt", "a") as f:
                f.write(f"{args[-1]}\n")
            return fn(*args, **kwargs)
        wrapper._counted = True
        return wrapper

    for mod in (folders, decoded):
        mod.load_image = counted(mod.load_image)
        mod._load_sample = counted(mod._load_sample)


def decodes(log_dir: Path) -> int:
    """Decodes logged so far (and the logs emptied)."""
    n = 0
    for p in log_dir.glob("*.txt"):
        n += len(p.read_text().splitlines())
        p.unlink()
    return n


def logits_of(folder: Path) -> dict[str, np.ndarray]:
    out = {}
    for p in sorted(folder.glob("*.nc")):
        with xr.open_dataset(p) as ds:
            out[p.name] = ds["logits"].values
    return out


def profile_cells(specs: list[str], folder: Path, cfg, work: Path) -> None:
    """Where a zoo cell's time goes, per model: each model predicts ``folder`` in this
    process as a sweep's cell does (its images decoded once for the group beforehand, the
    network kept built: :func:`uqvision.predict.predict` with ``decoded`` and ``keep_model``),
    once to warm up, then once under :mod:`torch.profiler`. Printed per model, per batch:
    ``wall_ms`` (the call's wall time over its batches), ``forward_cpu_ms`` (the CPU time of
    the network's forward, which on CUDA is mostly launching kernels), ``batch_cpu_ms``
    (making the input from the decoded rows), ``kernels`` and ``kernel_ms`` (CUDA kernels run
    and their summed time), ``to_copy_ms`` (the CPU time of torch's copies between dtypes and
    devices: the input's conversion to float, and the logits to the host, which on CUDA waits
    for the batch's kernels), and the three ops of most self CPU time. With the
    summed ``RESULT profile_gpu_busy_fraction`` (kernel time over wall time: near 1 the GPU's
    work bounds the cell; near 0 the CPU's launches and Python do) and
    ``profile_forward_cpu_fraction``."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from uqvision.data import ImageFolderDataset, eval_transform, folder_fingerprint
    from uqvision.models import ModelSpec, data_config
    from uqvision.predict import decoded as decoded_mod
    from uqvision.predict import loop, predict
    from uqvision.predict.decoded import decode_images, split_transform

    ds = ImageFolderDataset(str(folder))
    fp = folder_fingerprint(ds)
    path = work / "profile_decoded.npy"
    decode_images(ds, split_transform(eval_transform(data_config(ModelSpec.parse(specs[0])))),
                  path, fp)
    cuda = cfg.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    forward, to_device = loop._forward, decoded_mod._DecodedBatches.to_device

    def labelled(fn, label):
        def wrapper(*args, **kwargs):
            with record_function(label):
                return fn(*args, **kwargs)
        return wrapper

    loop._forward = labelled(forward, "bench::forward")
    decoded_mod._DecodedBatches.to_device = labelled(to_device, "bench::batch")
    n_batches = -(-len(ds) // cfg.batch_size)
    busy = wall_all = fwd_all = 0.0
    try:
        for text in specs:
            spec = ModelSpec.parse(text)
            predict(spec, ds, cfg, decoded=path, keep_model=True)  # build, warm up
            if cuda:
                torch.cuda.synchronize()
            with profile(activities=activities) as prof:
                t = time.perf_counter()
                predict(spec, ds, cfg, decoded=path, keep_model=True)
                if cuda:
                    torch.cuda.synchronize()
                wall = time.perf_counter() - t
            ev = prof.key_averages()
            cpu = {e.key: e.cpu_time_total / 1e3 for e in ev}  # ms
            kernels = [e for e in ev if getattr(e, "device_type", None) is not None
                       and str(e.device_type).endswith("CUDA")]
            n_kern = sum(e.count for e in kernels)
            k_ms = sum(getattr(e, "self_device_time_total", 0.0) for e in kernels) / 1e3
            top = sorted((e for e in ev if not e.key.startswith("bench::")),
                         key=lambda e: -e.self_cpu_time_total)[:3]
            busy += k_ms
            wall_all += wall * 1e3
            fwd_all += cpu.get("bench::forward", 0.0)
            print(f"DETAIL profile {spec.name}: wall_ms={wall * 1e3 / n_batches:.2f} "
                  f"forward_cpu_ms={cpu.get('bench::forward', 0.0) / n_batches:.2f} "
                  f"batch_cpu_ms={cpu.get('bench::batch', 0.0) / n_batches:.2f} "
                  f"kernels={n_kern / n_batches:.0f} kernel_ms={k_ms / n_batches:.2f} "
                  f"to_copy_ms={cpu.get('aten::_to_copy', 0.0) / n_batches:.2f} "
                  f"(per batch of {cfg.batch_size}, {n_batches} batches) top: "
                  + ", ".join(f"{e.key} {e.self_cpu_time_total / 1e3 / n_batches:.2f}"
                              for e in top), flush=True)
    finally:
        loop._forward = forward
        decoded_mod._DecodedBatches.to_device = to_device
        path.unlink(missing_ok=True)
    print(f"RESULT profile_gpu_busy_fraction={busy / wall_all:.2f} "
          f"profile_forward_cpu_fraction={fwd_all / wall_all:.2f}", flush=True)


def graph_forwards(batch_size: int, device: str, repeats: int = 50) -> None:
    """Whether replaying a CUDA graph of each model's forward would pay, before the library
    does it: each of :data:`MODELS` (random weights, as :func:`make_models`) runs a batch of
    ``batch_size`` random 224-px images ``repeats`` times eagerly and ``repeats`` times as
    replays of one graph captured of its forward (warmed up on a side stream first, as
    ``torch.cuda.graphs`` asks). Printed per model: milliseconds per forward each way and
    whether the replay's logits equal the eager ones bit for bit; ``RESULT
    graph_forward_speedup`` (geometric mean of eager / replay) and ``graph_bit_identical``
    (all models). CUDA only."""
    dev = torch.device(device)
    speedups, identical = [], True
    for arch in MODELS:
        kw = {"img_size": 224} if arch.startswith("test_vit") else {}
        torch.manual_seed(0)
        net = timm.create_model(arch, pretrained=False, num_classes=N_CLASSES, **kw)
        net = net.eval().to(dev)
        x = torch.randn(batch_size, 3, 224, 224, generator=torch.Generator().manual_seed(0))
        x = x.to(dev)
        with torch.inference_mode():
            eager = net(x)
            torch.cuda.synchronize(dev)
            t = time.perf_counter()
            for _ in range(repeats):
                net(x)
            torch.cuda.synchronize(dev)
            t_eager = (time.perf_counter() - t) / repeats
            static = x.clone()
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                for _ in range(3):
                    net(static)
            torch.cuda.current_stream(dev).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    out = net(static)
            except RuntimeError as exc:  # an op the capture cannot hold (a host sync)
                print(f"DETAIL graph {arch}: not capturable: {str(exc).splitlines()[0]}",
                      flush=True)
                identical = False
                continue
            graph.replay()
            torch.cuda.synchronize(dev)
            same = bool(torch.equal(out, eager))
            t = time.perf_counter()
            for _ in range(repeats):
                graph.replay()
            torch.cuda.synchronize(dev)
            t_graph = (time.perf_counter() - t) / repeats
        speedups.append(t_eager / t_graph)
        identical &= same
        print(f"DETAIL graph {arch}: eager_ms={t_eager * 1e3:.2f} replay_ms={t_graph * 1e3:.2f} "
              f"bit_identical={int(same)} (batch {batch_size})", flush=True)
        del graph, out, net
    if speedups:
        print(f"RESULT graph_forward_speedup={statistics.geometric_mean(speedups):.2f} "
              f"graph_bit_identical={int(identical)} captured={len(speedups)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N] (both sides)")
    ap.add_argument("--images", type=int, default=320, help="generated JPEGs")
    ap.add_argument("--workers", type=int, default=None,
                    help="Dask worker processes of the sweep (default: 1 on a GPU, else the "
                         "usable cores)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--work", default=None, help="working folder (default: a temporary one)")
    ap.add_argument("--profile", type=int, default=0, metavar="IMAGES",
                    help="then profile each model's cell in this process on a folder of "
                         "IMAGES generated JPEGs (profile_cells; 0: no profile)")
    a = ap.parse_args(argv)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench_sweep: no CUDA device; nothing to measure")
        return 0
    from uqmetrics.runs.sweep import ClusterSpec, open_client

    from uqvision.predict import PredictConfig, predict_to_files
    from uqvision.runtime import usable_cores
    from uqvision.sweep import sweep_predictions

    if a.images <= SMALL:
        ap.error(f"--images: {a.images} is not above the small folder's {SMALL}")
    work = Path(a.work or tempfile.mkdtemp(prefix="bench_sweep_"))
    work.mkdir(parents=True, exist_ok=True)
    cores = usable_cores()
    t0 = time.perf_counter()
    for old in ("jpegs", "warm"):  # an earlier run's, maybe of another size or cut
        shutil.rmtree(work / old, ignore_errors=True)
    folder = make_jpegs(work / "jpegs", a.images, threads=cores)
    warm = make_jpegs(work / "warm", SMALL, seed=1, threads=cores)
    specs = make_models(work)
    log_dir = work / "decodes"
    log_dir.mkdir(exist_ok=True)
    install_counter(str(log_dir))
    n_workers = a.workers or (1 if a.device.startswith("cuda") else cores)
    cell_threads = max(1, cores // n_workers)  # the cores shared out, none oversubscribed
    cfg = PredictConfig(batch_size=a.batch_size, device=a.device)
    decoded_mb = a.images * 224 * 224 * 3 / 1e6
    print(f"bench_sweep: {len(specs)} models ({', '.join(MODELS)}), {a.images} JPEGs "
          f"(~500x375) at 224 px, batch {a.batch_size}, device {a.device}, {cores} cores, "
          f"{n_workers} Dask worker(s) of {cell_threads} torch thread(s), made in "
          f"{time.perf_counter() - t0:.1f} s; disk: JPEGs {du_mb(folder):.0f} MB, decoded "
          f"file {decoded_mb:.0f} MB (memory-mapped), {shutil.disk_usage(work).free / 1e9:.0f} GB "
          f"free", flush=True)
    rows, sep_decodes, identical, max_diff = [], [], True, 0.0

    def both(src: Path, tag: str) -> tuple[float, float, int, int]:
        """Sweep then separate runs of ``src`` into fresh folders: seconds and decodes of
        each; the caches compared (bit-identity) and removed."""
        nonlocal identical, max_diff
        out_sweep, out_sep = work / f"sweep{tag}", work / f"separate{tag}"
        for old in (out_sweep, out_sep):  # an earlier run's, cut: every cache computed
            shutil.rmtree(old, ignore_errors=True)
        decodes(log_dir)
        t = time.perf_counter()
        report = sweep_predictions(specs, src, out_sweep, cfg, client=client,
                                   threads=cell_threads)
        t_sweep = time.perf_counter() - t
        if report.failed:
            raise RuntimeError(f"the sweep failed: {report.failed}")
        n_sweep = decodes(log_dir)
        t = time.perf_counter()
        for spec in specs:
            predict_to_files(spec, src, out_sep, cfg)
        t_sep = time.perf_counter() - t
        n_sep = decodes(log_dir)
        a_l, b_l = logits_of(out_sweep), logits_of(out_sep)
        identical &= a_l.keys() == b_l.keys() and all(
            np.array_equal(a_l[k], b_l[k]) for k in a_l)
        max_diff = max([max_diff, *(float(np.abs(a_l[k] - b_l[k]).max()) for k in a_l
                                    if k in b_l)])
        shutil.rmtree(out_sweep)
        shutil.rmtree(out_sep)
        return t_sweep, t_sep, n_sweep, n_sep

    # the cluster `uqvision sweep` starts (docs/conventions.md#sweep-workers), not Dask's defaults
    with open_client(ClusterSpec(dashboard="none"), n_workers=n_workers) as client:
        client.run(install_counter, str(log_dir))
        try:
            both(warm, "-1")  # warm-up (imports, image checks), not timed
            for r in range(a.rounds):
                t_sweep, t_sep, n_sweep, n_sep = both(folder, str(r))
                s_sweep, s_sep, _, _ = both(warm, f"{r}s")
                f_sweep, v_sweep = fixed_cost(s_sweep, SMALL, t_sweep, a.images)
                f_sep, v_sep = fixed_cost(s_sep, SMALL, t_sep, a.images)
                rows.append({"ratio": t_sweep / t_sep, "decodes": n_sweep / a.images,
                             "sweep": t_sweep, "separate": t_sep,
                             "fixed": f_sweep / len(specs), "sep_fixed": f_sep / len(specs),
                             "marginal": v_sweep / v_sep if v_sep > 0 else float("nan"),
                             "small": s_sweep / s_sep})
                sep_decodes.append(n_sep / a.images)
                print(f"round {r}: sweep={t_sweep:.2f}s separate={t_sep:.2f}s "
                      f"decodes/image sweep={n_sweep / a.images:.2f} "
                      f"separate={n_sep / a.images:.2f}; {SMALL} images: sweep={s_sweep:.2f}s "
                      f"separate={s_sep:.2f}s", flush=True)
        except RuntimeError as exc:
            print(f"bench_sweep: {exc}", file=sys.stderr)
            return 1
    med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
    print(f"DETAIL separate_decodes_per_image={max(sep_decodes):.2f} "
          f"logits_bit_identical={int(identical)} logits_max_diff={max_diff:.2e} "
          f"threads_sweep={cell_threads} threads_separate={torch.get_num_threads()} "
          f"sweep_s={med['sweep']:.2f} "
          f"separate_s={med['separate']:.2f} groups=1 "
          f"separate_fixed_s={med['sep_fixed']:.3f} "
          f"marginal_zoo_vs_separate={med['marginal']:.2f} "
          f"small_zoo_vs_separate={med['small']:.2f}", flush=True)
    print(f"RESULT zoo_vs_separate={med['ratio']:.2f} "
          f"decodes_per_image={max(row['decodes'] for row in rows):.2f} "
          f"per_cell_fixed_s={med['fixed']:.3f}", flush=True)
    if a.profile:
        shutil.rmtree(work / "profile", ignore_errors=True)
        profile_cells(specs, make_jpegs(work / "profile", a.profile, seed=2, threads=cores),
                      cfg, work)
        if a.device.startswith("cuda"):
            graph_forwards(a.batch_size, a.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
