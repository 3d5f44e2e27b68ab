"""``uqvision predict`` against the loop a user would write, measured interleaved in one run.

Run from the repository root::

    .tox/uqvision/bin/python packages/uqvision/benchmarks/bench_predict.py [--rounds 3]
        [--arch gernet_s] [--images 256] [--mc-images 32] [--batch-size 32] [--threads N]

The plain loop is timm's own recipe: ``ImageFolder`` with ``create_transform(
**resolve_data_config({}, model=model))``, a ``DataLoader`` (the same number of workers
``uqvision predict`` picks by default, :func:`uqvision.runtime.loader_workers`), the model
built and its weights loaded, ``eval()``, ``torch.inference_mode()``. Both sides run on a
generated folder (:func:`uqvision.data.make_synthetic_folder`, 224-px images) with the same
randomly initialised timm network (``drop_rate=0.2``: its only dropout module is in the head),
written as a checkpoint uqvision loads. Each round times every quantity once, in the same
order; ratios are taken within a round and the medians over rounds are printed:

- ``predict_vs_plain``: plain loop / :func:`uqvision.predict.predict` with its defaults
  (steady state: model built, weights loaded, the folder read, a cache Dataset made; the
  import excluded; ``channels_last`` chosen by architecture and device,
  :func:`uqvision.predict.resolve_channels_last`: on for GENet-S on a CPU, off on CUDA);
- ``mc30_vs_plain30``: 30 plain MC-dropout passes (dropout modules in train mode, 30 full
  forwards of each batch) / uqvision's 30 MC-dropout passes (its backbone once per batch);
- ``mc30_vs_one_pass``: uqvision's 30 passes / one plain pass, on the same (smaller) folder;
- ``command_overhead_s``: wall time of ``uqvision predict`` as a subprocess minus the wall time
  of ``python -c "import torch, timm"`` and the in-process steady-state prediction, both on the
  small folder (a fixed cost is measured where the forward passes do not drown it in noise).

With ``--decoder torchvision`` the rounds compare the decoders instead, on a folder of JPEGs
(``--jpeg-size``, 500 x 375 by default, ImageNet's typical size; smooth random images with
noise, quality 90, so that decoding and resizing cost what they cost on photographs):

- ``decoder_vs_plain``: timm's plain loop decoding with Pillow on the loader's CPU workers
  (the user's alternative) / :func:`uqvision.predict.predict` with ``decoder="torchvision"``
  (JPEGs decoded in batches by ``torchvision.io.decode_jpeg`` on ``--device``: nvJPEG on CUDA);
- ``decoder_vs_plain_device_decode``: the same plain loop decoding on the device as a user
  would write it (workers read the bytes, ``decode_jpeg(list, device=...)``, torchvision's
  ``resize`` and ``center_crop`` per image) / uqvision's ``torchvision`` decoder;
- ``pil_vs_plain``: the plain loop / uqvision's default ``pil`` decoder on the same JPEGs;
- ``DETAIL``: the difference of the two decoders' logits on the same images and model (max
  abs, relative to the logit scale) and their top-1 agreement; images per second of each side.

The issue's targets: ``predict_vs_plain >= 1.0``, ``mc30_vs_one_pass <= 2``,
``command_overhead_s <= 1``. Also printed: ``DETAIL`` (the same ratio with
``channels_last`` given on and off, the default's choice, the largest logit differences
uqvision vs plain, contiguous uqvision vs plain (0: the same computation) and
channels_last vs contiguous, the workers, the load average). Timings on a shared machine move with its load:
compare numbers of one run only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import safetensors.torch
import timm
import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config
from torch.utils.data import DataLoader, Dataset
from torchvision.datasets import ImageFolder
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF

from uqvision.data import make_synthetic_folder
from uqvision.predict import AMP_MODES, PredictConfig, predict, resolve_channels_last
from uqvision.runtime import loader_workers


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() \
        else "?"


def _net(arch: str, n_classes: int, ckpt: Path) -> torch.nn.Module:
    """The network as the user builds it: the architecture, then the checkpoint's weights."""
    net = timm.create_model(arch, num_classes=n_classes, drop_rate=0.2)
    net.load_state_dict(safetensors.torch.load_file(str(ckpt)))
    return net.eval()


def plain_loop(arch: str, ckpt: Path, folder: Path, n_classes: int, batch_size: int,
               workers: int, passes: int = 1, device: str = "cpu",
               amp: torch.dtype | None = None) -> tuple[float, np.ndarray]:
    """The loop a user writes; ``passes > 1``: MC dropout, every pass a full forward; ``amp``:
    the forward under ``torch.autocast`` of that dtype."""
    t0 = time.perf_counter()
    net = _net(arch, n_classes, ckpt).to(device)
    ds = ImageFolder(str(folder), transform=create_transform(**resolve_data_config({}, model=net)))
    if passes > 1:
        for m in net.modules():
            if isinstance(m, torch.nn.Dropout):
                m.train()
    out = []
    cuda = device.startswith("cuda")
    with torch.inference_mode(), torch.autocast(device.split(":")[0], dtype=amp,
                                                enabled=amp is not None):
        for x, _ in DataLoader(ds, batch_size=batch_size, num_workers=workers, pin_memory=cuda):
            x = x.to(device, non_blocking=True)
            out.append(torch.stack([net(x).float() for _ in range(passes)]).cpu().numpy())
    return time.perf_counter() - t0, np.concatenate(out, axis=1)


class _FileBytes(Dataset):
    """An ``ImageFolder``'s files as bytes (what the workers of a device-decoding loop read;
    numpy arrays: a tensor each from the workers would each hold a shared-memory file
    descriptor)."""

    def __init__(self, root: Path):
        self.samples = ImageFolder(str(root)).samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        return np.fromfile(path, dtype=np.uint8), label


def _list_collate(batch):
    return [x for x, _ in batch], torch.tensor([y for _, y in batch])


def plain_loop_device_decode(arch: str, ckpt: Path, folder: Path, n_classes: int,
                             batch_size: int, workers: int,
                             device: str = "cpu") -> tuple[float, np.ndarray]:
    """The plain loop decoding on the device, as a user writes it: the workers read the files'
    bytes, ``decode_jpeg(list, device=...)`` decodes a batch, torchvision's tensor ``resize``
    (timm's short side, interpolation, antialiased) and ``center_crop`` each image, then
    ``/ 255`` and timm's mean and std."""
    t0 = time.perf_counter()
    net = _net(arch, n_classes, ckpt).to(device)
    cfg = resolve_data_config({}, model=net)
    crop = cfg["input_size"][1:]
    short = math.floor(crop[0] / cfg["crop_pct"])
    interp = InterpolationMode(cfg["interpolation"])
    mean = torch.tensor(cfg["mean"], device=device).view(1, 3, 1, 1)
    std = torch.tensor(cfg["std"], device=device).view(1, 3, 1, 1)
    out = []
    loader = DataLoader(_FileBytes(folder), batch_size=batch_size, num_workers=workers,
                        collate_fn=_list_collate)
    with torch.inference_mode():
        for data, _ in loader:
            imgs = decode_jpeg([torch.from_numpy(b) for b in data], mode=ImageReadMode.RGB,
                               device=device)
            x = torch.stack([TF.center_crop(TF.resize(im, short, interpolation=interp,
                                                      antialias=True), list(crop))
                             for im in imgs])
            x = (x.float() / 255 - mean) / std
            out.append(net(x).float().cpu().numpy())
    return time.perf_counter() - t0, np.concatenate(out)[None]


def jpeg_folder(root: Path, n_images: int, n_classes: int, size: tuple[int, int],
                seed: int = 0) -> Path:
    """``root/class_<k>/*.jpg``: smooth random images (a 12 x 9 random image upscaled bicubic)
    with Gaussian noise (sigma 8), ``size`` (width, height), JPEG quality 90; like photographs
    for the decoder (file sizes, entropy) and the resize (a large image to bring down). Image
    ``k`` is drawn from ``(seed, k)``; written on the usable cores' threads."""
    from concurrent.futures import ThreadPoolExecutor

    from uqvision.runtime import usable_cores

    def one(k: int) -> None:
        rng = np.random.default_rng([seed, k])
        d = root / f"class_{k % n_classes:03d}"
        d.mkdir(parents=True, exist_ok=True)
        small = Image.fromarray(rng.integers(0, 256, (9, 12, 3), dtype=np.uint8))
        big = np.asarray(small.resize(size, Image.BICUBIC), dtype=np.float32)
        noise = rng.standard_normal(big.shape, dtype=np.float32) * 8
        Image.fromarray(np.clip(big + noise, 0, 255).astype(np.uint8)).save(
            d / f"{k:05d}.jpg", quality=90)

    with ThreadPoolExecutor(usable_cores()) as pool:
        list(pool.map(one, range(n_images)))
    return root


def decoder_rounds(a, spec: str, ckpt: Path, folder: Path, n_classes: int, workers: int) -> int:
    """The decoder comparison (``--decoder torchvision``): rounds of the four loops on the
    folder of JPEGs (:func:`jpeg_folder`); medians of the ratios within each round."""
    dev, bs = a.device, a.batch_size
    tv = PredictConfig(batch_size=bs, device=dev, decoder="torchvision")
    pil = PredictConfig(batch_size=bs, device=dev)
    kb = sum(f.stat().st_size for f in folder.rglob("*.jpg")) / a.images / 1e3
    print(f"bench_predict: decoders, {a.arch} (random init), {a.images} JPEGs of {a.jpeg_size} "
          f"(quality 90, {kb:.0f} kB each), batch {bs}, device {dev}, workers {workers}, "
          f"{torch.get_num_threads()} torch threads, {os.cpu_count()} cores, load {_load()}",
          flush=True)
    uqvision_predict(spec, folder, tv)  # warm-up: the images checked once, nvJPEG's handle
    uqvision_predict(spec, folder, pil)
    plain_loop_device_decode(a.arch, ckpt, folder, n_classes, bs, workers, device=dev)
    rows = []
    for r in range(a.rounds):
        t = {}
        t["plain"], z_plain = plain_loop(a.arch, ckpt, folder, n_classes, bs, workers,
                                         device=dev)
        t["plain_devdec"], z_dd = plain_loop_device_decode(a.arch, ckpt, folder, n_classes, bs,
                                                           workers, device=dev)
        t["uq_tv"], z_tv = uqvision_predict(spec, folder, tv)
        t["uq_pil"], z_pil = uqvision_predict(spec, folder, pil)
        scale = float(np.abs(z_pil).max())
        rows.append({"decoder_vs_plain": t["plain"] / t["uq_tv"],
                     "decoder_vs_plain_device_decode": t["plain_devdec"] / t["uq_tv"],
                     "pil_vs_plain": t["plain"] / t["uq_pil"],
                     "max_logit_diff": float(np.abs(z_tv - z_pil).max()),
                     "rel_logit_diff": float(np.abs(z_tv - z_pil).max()) / scale,
                     "top1_agreement": float(np.mean(z_tv.argmax(1) == z_pil.argmax(1))),
                     "top1_agreement_plain_device_decode": float(
                         np.mean(z_dd[0].argmax(1) == z_plain[0].argmax(1))),
                     "pil_vs_plain_logits": float(np.abs(z_pil - z_plain[0]).max()),
                     **{f"{k}_img_s": a.images / v for k, v in t.items()}})
        print(f"round {r}: " + " ".join(f"{k}={v:.2f}s" for k, v in t.items())
              + f"  load {_load()}", flush=True)
    med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
    print("DETAIL " + " ".join(
        f"{k}={med[k]:.1f}" for k in rows[0] if k.endswith("_img_s"))
        + f" max_logit_diff_torchvision_vs_pil={max(r['max_logit_diff'] for r in rows):.2e}"
        f" relative_to_logit_scale={max(r['rel_logit_diff'] for r in rows):.2e}"
        f" top1_agreement_torchvision_vs_pil={min(r['top1_agreement'] for r in rows):.4f}"
        f" top1_agreement_plain_device_vs_plain="
        f"{min(r['top1_agreement_plain_device_decode'] for r in rows):.4f}"
        f" max_logit_diff_pil_vs_plain={max(r['pil_vs_plain_logits'] for r in rows):.2e}"
        f" workers={workers} load={_load().replace(' ', '/')}")
    print(f"RESULT decoder_vs_plain={med['decoder_vs_plain']:.2f} "
          f"decoder_vs_plain_device_decode={med['decoder_vs_plain_device_decode']:.2f} "
          f"pil_vs_plain={med['pil_vs_plain']:.2f}", flush=True)
    return 0


def uqvision_predict(spec: str, folder: Path, config: PredictConfig) -> tuple[float, np.ndarray]:
    t0 = time.perf_counter()
    (ds,) = predict(spec, folder, config)
    return time.perf_counter() - t0, ds["logits"].values


def wall(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(args, check=True, capture_output=True)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arch", default="gernet_s",
                    help="a timm network whose dropout is an nn.Dropout in its head (default: "
                         "GENet-S, a ResNet-like 6.3M-parameter network; timm's ResNet applies "
                         "F.dropout, which no MC dropout over modules reaches)")
    ap.add_argument("--images", type=int, default=256, help="images of the main folder")
    ap.add_argument("--mc-images", type=int, default=32, help="images of the MC-dropout folder")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads of every side, the command's --threads too (default: "
                         "torch's; 1 on a machine other jobs load, where threads that wait for "
                         "each other make every timing erratic)")
    ap.add_argument("--work", default=None, help="working folder (default: a temporary one)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N] (every side)")
    ap.add_argument("--amp", default="bf16", choices=("fp16", "bf16"),
                    help="autocast dtype of the AMP comparison (predict_amp_vs_plain_amp)")
    ap.add_argument("--decoder", default="pil", choices=("pil", "torchvision"),
                    help="pil: the comparisons above (the default decoder); torchvision: the "
                         "decoder comparison on a folder of JPEGs (--images of them)")
    ap.add_argument("--jpeg-size", default="500x375", metavar="WxH",
                    help="size of the JPEGs of --decoder torchvision (default: ImageNet's "
                         "typical 500x375)")
    a = ap.parse_args(argv)
    dev = a.device
    if dev.startswith("cuda") and not torch.cuda.is_available():
        print("bench_predict: no CUDA device; nothing to measure")
        return 0
    amp_dtype = getattr(torch, AMP_MODES[a.amp])
    if a.threads:
        torch.set_num_threads(a.threads)
    n_classes = 4
    work = Path(a.work or tempfile.mkdtemp(prefix="bench_predict_"))
    if a.decoder == "torchvision":
        w, h = (int(v) for v in a.jpeg_size.split("x"))
        folder = jpeg_folder(work / "jpeg", a.images, n_classes, (w, h))
    else:
        folder = make_synthetic_folder(work / "main", n_classes=n_classes,
                                       n_per_class=a.images // n_classes,
                                       overwrite=True) / "test"
        mc_folder = make_synthetic_folder(work / "mc", n_classes=n_classes,
                                          n_per_class=a.mc_images // n_classes, seed=1,
                                          overwrite=True) / "test"
    torch.manual_seed(0)
    ckpt = work / f"{a.arch}.safetensors"
    safetensors.torch.save_file(timm.create_model(a.arch, num_classes=n_classes,
                                                  drop_rate=0.2).state_dict(), str(ckpt))
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    ckpt.with_suffix(".json").write_text(json.dumps({"classes": classes,
                                                     "model_kwargs": {"drop_rate": 0.2}}))
    spec = f"{a.arch}={ckpt}"
    bs = a.batch_size
    workers = loader_workers(None, -(-a.images // bs), dev)
    if a.decoder == "torchvision":
        return decoder_rounds(a, spec, ckpt, folder, n_classes, workers)
    mc_workers = loader_workers(None, -(-a.mc_images // bs), dev)
    base = PredictConfig(batch_size=bs, device=dev)
    mc = PredictConfig(mode="mc_dropout", passes=30, batch_size=bs, device=dev)
    print(f"bench_predict: {a.arch} (random init, drop_rate=0.2), {a.images} + {a.mc_images} "
          f"images at 224 px, batch {bs}, device {dev}, workers {workers}/{mc_workers}, "
          f"{torch.get_num_threads()} torch threads, {os.cpu_count()} cores, load {_load()}",
          flush=True)
    uqvision_predict(spec, folder, base)  # the images are checked once per process (as a
    uqvision_predict(spec, mc_folder, mc)  # command does before its first model): warm-up
    rows = []
    for r in range(a.rounds):
        t = {}
        t["plain"], z_plain = plain_loop(a.arch, ckpt, folder, n_classes, bs, workers,
                                         device=dev)
        t["uq"], z_uq = uqvision_predict(spec, folder, base)
        t["uq_contig"], z_contig = uqvision_predict(spec, folder, PredictConfig(
            batch_size=bs, channels_last=False, device=dev))
        t["uq_cl"], z_cl = uqvision_predict(spec, folder, PredictConfig(
            batch_size=bs, channels_last=True, device=dev))
        t["plain_amp"], z_plain_amp = plain_loop(a.arch, ckpt, folder, n_classes, bs, workers,
                                                 device=dev, amp=amp_dtype)
        t["uq_amp"], z_amp = uqvision_predict(spec, folder, PredictConfig(
            batch_size=bs, amp=a.amp, device=dev))
        t["plain1_mc"], _ = plain_loop(a.arch, ckpt, mc_folder, n_classes, bs, mc_workers,
                                       device=dev)
        t["plain30"], _ = plain_loop(a.arch, ckpt, mc_folder, n_classes, bs, mc_workers,
                                     passes=30, device=dev)
        t["uq_mc30"], _ = uqvision_predict(spec, mc_folder, mc)
        t["uq_small"], _ = uqvision_predict(spec, mc_folder, base)
        t["import"] = wall([sys.executable, "-c", "import torch, timm"])
        threads = ["--threads", str(a.threads)] if a.threads else []
        t["command"] = wall([sys.executable, "-m", "uqvision", *threads, "predict", "--model", spec,
                             "--data", str(mc_folder), "--out", str(work / f"caches{r}"),
                             "--batch-size", str(bs), "--device", dev])
        row = {"predict_vs_plain": t["plain"] / t["uq"],
               "predict_cl_vs_plain": t["plain"] / t["uq_cl"],
               "predict_contiguous_vs_plain": t["plain"] / t["uq_contig"],
               "logits_contiguous_vs_plain": float(np.abs(z_contig - z_plain[0]).max()),
               "predict_amp_vs_plain_amp": t["plain_amp"] / t["uq_amp"],
               "mc30_vs_plain30": t["plain30"] / t["uq_mc30"],
               "mc30_vs_one_pass": t["uq_mc30"] / t["plain1_mc"],
               "command_overhead_s": t["command"] - t["import"] - t["uq_small"],
               "logits_uq_vs_plain": float(np.abs(z_uq - z_plain[0]).max()),
               "logits_cl_vs_contiguous": float(np.abs(z_cl - z_contig).max()),
               "logits_amp_vs_plain_amp": float(np.abs(z_amp - z_plain_amp[0]).max())}
        rows.append(row)
        print(f"round {r}: " + " ".join(f"{k}={v:.2f}s" for k, v in t.items())
              + f"  load {_load()}", flush=True)
    med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
    print(f"DETAIL predict_channels_last_vs_plain={med['predict_cl_vs_plain']:.2f} "
          f"predict_contiguous_vs_plain={med['predict_contiguous_vs_plain']:.2f} "
          f"default_channels_last={int(resolve_channels_last(_net(a.arch, n_classes, ckpt), base))} "
          f"max_logit_diff_contiguous_vs_plain="
          f"{max(r['logits_contiguous_vs_plain'] for r in rows):.2e} "
          f"max_logit_diff_vs_plain={max(r['logits_uq_vs_plain'] for r in rows):.2e} "
          f"max_logit_diff_channels_last={max(r['logits_cl_vs_contiguous'] for r in rows):.2e} "
          f"max_logit_diff_amp_vs_plain_amp={max(r['logits_amp_vs_plain_amp'] for r in rows):.2e} "
          f"workers={workers} load={_load().replace(' ', '/')}")
    print(f"RESULT predict_vs_plain={med['predict_vs_plain']:.2f} "
          f"predict_amp_vs_plain_amp={med['predict_amp_vs_plain_amp']:.2f} "
          f"predict_channels_last_vs_plain={med['predict_cl_vs_plain']:.2f} "
          f"mc30_vs_plain30={med['mc30_vs_plain30']:.2f} "
          f"mc30_vs_one_pass={med['mc30_vs_one_pass']:.2f} "
          f"command_overhead_s={med['command_overhead_s']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
