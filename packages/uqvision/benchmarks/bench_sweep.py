"""A zoo sweep of 8 models sharing one preprocessing against 8 separate ``predict`` runs,
measured side by side in one run.

Run from the repository root::

    .tox/uqvision/bin/python packages/uqvision/benchmarks/bench_sweep.py [--device cpu|cuda]
        [--images 320] [--workers N] [--rounds 3] [--batch-size 32]

The folder: ``--images`` generated JPEGs of about 500 x 375 pixels (smooth random colour
fields with noise, quality 90, in 4 class folders; an ImageNet validation image is about
500 x 375). The models: 8 of timm's ``test_*`` networks with random weights
(``pretrained=False``), each written as a checkpoint whose sidecar gives them one data
configuration, 224 px (``resize 256, centre crop 224, bilinear``; their own mean and std,
which the shared decoding leaves to each model).

Each round, in the same order:

- ``sweep``: :func:`uqvision.sweep.sweep_predictions` of the 8 models into a fresh caches
  folder on a Dask ``LocalCluster`` started before the first round (``--workers`` worker
  processes, default 1 on a GPU, else the cores, each cell on ``cores / workers`` torch
  threads; its start-up and the workers' imports are not timed, as the imports are not timed
  for ``predict``), which decodes each image once for the group (:mod:`uqvision.sweep.decode`);
- ``separate``: :func:`uqvision.predict.predict_to_files` of each model in turn into another
  fresh folder, in this process (``uqvision predict`` without the import: its DataLoader
  workers as the command picks them).

``zoo_vs_separate`` is sweep / separate (median over rounds); ``decodes_per_image`` counts
the full decodes of the image files during the timed sweeps (the loader's decode functions,
``uqvision.data.folders.load_image`` / ``_load_sample`` and the decoded module's, wrapped in
every process: this one, its DataLoader workers and the Dask workers) per image and per
preprocessing group. Also printed: ``DETAIL`` (the separate runs' decodes per image, whether
the caches of both sides are bit-identical, the seconds of each side). A warm-up round of
both sides (not timed) checks the images in every process first (as a command does once).
Targets (the issue's): ``zoo_vs_separate <= 0.6`` on a CPU, ``<= 0.2`` on a GPU,
``decodes_per_image = 1``. Timings on a shared machine move with its load: compare numbers
of one run only.
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


def make_jpegs(root: Path, n: int, seed: int = 0) -> Path:
    """``n`` JPEGs of 500 x 375 (every 4th 375 x 500) in ``N_CLASSES`` class folders."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        w, h = (375, 500) if i % 4 == 3 else (500, 375)
        low = rng.integers(0, 256, (h // 25 + 1, w // 25 + 1, 3), dtype=np.uint8)
        img = Image.fromarray(low).resize((w, h), Image.BICUBIC)
        a = np.asarray(img, np.int16) + rng.integers(-20, 21, (h, w, 3), dtype=np.int16)
        d = root / f"class_{i % N_CLASSES}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(d / f"{i:05d}.jpg",
                                                                  quality=90)
    return root


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
    a = ap.parse_args(argv)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench_sweep: no CUDA device; nothing to measure")
        return 0
    from dask.distributed import Client, LocalCluster

    from uqvision.predict import PredictConfig, predict_to_files
    from uqvision.runtime import usable_cores
    from uqvision.sweep import sweep_predictions

    work = Path(a.work or tempfile.mkdtemp(prefix="bench_sweep_"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    folder = make_jpegs(work / "jpegs", a.images)
    warm = make_jpegs(work / "warm", 8, seed=1)
    specs = make_models(work)
    log_dir = work / "decodes"
    log_dir.mkdir(exist_ok=True)
    install_counter(str(log_dir))
    cores = usable_cores()
    n_workers = a.workers or (1 if a.device.startswith("cuda") else cores)
    cell_threads = max(1, cores // n_workers)  # the cores shared out, none oversubscribed
    cfg = PredictConfig(batch_size=a.batch_size, device=a.device)
    print(f"bench_sweep: {len(specs)} models ({', '.join(MODELS)}), {a.images} JPEGs "
          f"(~500x375) at 224 px, batch {a.batch_size}, device {a.device}, {cores} cores, "
          f"{n_workers} Dask worker(s) of {cell_threads} torch thread(s), made in {time.perf_counter() - t0:.1f} s", flush=True)
    rows, sep_decodes, identical = [], [], True
    with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        client.run(install_counter, str(log_dir))
        for r in range(-1, a.rounds):  # round -1: warm-up (imports, image checks), not timed
            src = warm if r < 0 else folder
            out_sweep, out_sep = work / f"sweep{r}", work / f"separate{r}"
            for old in (out_sweep, out_sep):  # an earlier run's, cut: every cache computed
                shutil.rmtree(old, ignore_errors=True)
            decodes(log_dir)
            t = time.perf_counter()
            report = sweep_predictions(specs, src, out_sweep, cfg, client=client,
                                       threads=cell_threads)
            t_sweep = time.perf_counter() - t
            if report.failed:
                print(f"bench_sweep: the sweep failed: {report.failed}", file=sys.stderr)
                return 1
            n_sweep = decodes(log_dir)
            t = time.perf_counter()
            for spec in specs:
                predict_to_files(spec, src, out_sep, cfg)
            t_sep = time.perf_counter() - t
            n_sep = decodes(log_dir)
            if r < 0:
                continue
            a_l, b_l = logits_of(out_sweep), logits_of(out_sep)
            identical &= a_l.keys() == b_l.keys() and all(
                np.array_equal(a_l[k], b_l[k]) for k in a_l)
            rows.append({"ratio": t_sweep / t_sep, "decodes": n_sweep / a.images,
                         "sweep": t_sweep, "separate": t_sep})
            sep_decodes.append(n_sep / a.images)
            print(f"round {r}: sweep={t_sweep:.2f}s separate={t_sep:.2f}s "
                  f"decodes/image sweep={n_sweep / a.images:.2f} "
                  f"separate={n_sep / a.images:.2f}", flush=True)
            shutil.rmtree(out_sweep)
            shutil.rmtree(out_sep)
    med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
    print(f"DETAIL separate_decodes_per_image={max(sep_decodes):.2f} "
          f"logits_bit_identical={int(identical)} sweep_s={med['sweep']:.2f} "
          f"separate_s={med['separate']:.2f} groups=1", flush=True)
    print(f"RESULT zoo_vs_separate={med['ratio']:.2f} "
          f"decodes_per_image={max(row['decodes'] for row in rows):.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
