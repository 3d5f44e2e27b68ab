"""uqvision's CUDA paths, checked and timed in one process (an item of ``benchmarks/gpu_check.sh``).

Run from the repository root on a machine with CUDA (packages from the source tree)::

    PYTHONPATH=shared/src:packages/uqvision/src python3 benchmarks/device/cuda_checks.py \
        [--work DIR] [--images 1024] [--arch resnet18]

On a generated folder (:func:`uqvision.data.make_synthetic_folder`: 224-px random RGB images,
``--images`` of them in 8 classes) it prints one ``RESULT`` line per claim the project makes
about results on CUDA, each with the measured number it rests on:

- ``train_epoch``: one epoch of :func:`uqvision.training.loop.train_model` (``--arch``, 224 px,
  batch 64) on CUDA: wall seconds and images/s; the same run repeated with the same seed: the
  largest weight difference (0 means training is bit-reproducible on this GPU);
- ``train_torchrun``: the same epoch under a one-process ``torchrun`` (DistributedDataParallel
  over one rank): wall seconds and the largest weight difference against the plain run;
- ``predict``: :func:`uqvision.predict.predict` on CUDA: the largest logit difference between
  batch sizes 16 and 64 (results must not depend on batch size), CUDA against CPU, bf16
  autocast and channels_last against the default;
- ``predict_torchrun``: ``uqvision predict`` under a one-process ``torchrun``: the largest logit
  difference against the in-process run;
- ``mc_dropout``: 10 MC-dropout passes on CUDA against the CPU (the masks are drawn on the CPU,
  so the passes must agree to float rounding) and between batch sizes 16 and 64.

It exits 0 without CUDA, saying so. Timings are this machine's, one run: a statement of what
was measured, not a benchmark ratio.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import safetensors.torch
import torch


def _maxdiff(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max()) if a.shape == b.shape else float("inf")


def _weights_diff(p: Path, q: Path) -> float:
    a, b = safetensors.torch.load_file(str(p)), safetensors.torch.load_file(str(q))
    if a.keys() != b.keys():
        return float("inf")
    return max(float((a[k].double() - b[k].double()).abs().max()) if a[k].numel() else 0.0
               for k in a)


def _logits(caches) -> np.ndarray:
    """(pass, sample, class) logits of every cache (a pass dim of a cache unrolled)."""
    z = np.stack([c["logits"].values for c in caches])
    return z.reshape(-1, *z.shape[-2:])


def _env() -> dict[str, str]:
    """This process's environment (its PYTHONPATH reaches the source tree)."""
    return dict(os.environ)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default=None, help="working folder (default: a temporary one)")
    ap.add_argument("--images", type=int, default=1024, help="images of the generated folder")
    ap.add_argument("--arch", default="resnet18", help="timm architecture trained and predicted")
    ap.add_argument("--device", default="cuda",
                    help="cuda; cpu runs the same steps on the CPU (the script's own check)")
    ap.add_argument("--image-size", type=int, default=224, help="input size of training")
    a = ap.parse_args(argv)
    dev = a.device
    if dev.startswith("cuda") and not torch.cuda.is_available():
        print("cuda_checks: no CUDA device; nothing to check")
        return 0
    from uqvision.data import make_synthetic_folder
    from uqvision.predict import PredictConfig, predict
    from uqvision.training.loop import ImageTrainConfig, train_model

    work = Path(a.work or tempfile.mkdtemp(prefix="cuda_checks_"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    folder = make_synthetic_folder(work / "data", n_classes=8, n_per_class=a.images // 8,
                                   overwrite=True) / "test"
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    name = torch.cuda.get_device_name(0) if dev.startswith("cuda") else "cpu"
    print(f"cuda_checks: {name}, torch {torch.__version__}, "
          f"{a.images} images generated in {time.perf_counter() - t0:.1f} s", flush=True)

    # training: one epoch, repeated, and under a one-process torchrun
    cfg = ImageTrainConfig(arch=a.arch, method="deep_ensemble", epochs=1.0, batch_size=64,
                           input_size=a.image_size, augment=None, seed=0, device=dev)
    ckpt = {k: work / f"{k}.safetensors" for k in ("a", "b", "torchrun")}
    train_model(folder, work / "warmup.safetensors", cfg)  # cuDNN autotuning, CUDA context
    sync()
    t0 = time.perf_counter()
    train_model(folder, ckpt["a"], cfg)
    sync()
    epoch_s = time.perf_counter() - t0
    train_model(folder, ckpt["b"], cfg)
    print(f"RESULT train_epoch_s={epoch_s:.2f} train_images_per_s={a.images / epoch_s:.0f} "
          f"train_repeat_max_weight_diff={_weights_diff(ckpt['a'], ckpt['b']):.3g} "
          f"arch={a.arch}", flush=True)
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]
    t0 = time.perf_counter()
    p = subprocess.run(run + ["-m", "uqvision", "train", "--arch", a.arch, "--data", str(folder),
                              "--out", str(ckpt["torchrun"]), "--epochs", "1", "--batch-size",
                              "64", "--input-size", str(a.image_size), "--augment", "none",
                              "--overwrite", "--device", dev],
                       check=False, capture_output=True, text=True, env=_env())
    torchrun_s = time.perf_counter() - t0
    if p.returncode:
        print(f"RESULT train_torchrun=failed rc={p.returncode}\n{p.stderr[-1500:]}", flush=True)
    else:
        print(f"RESULT train_torchrun_s={torchrun_s:.2f} train_torchrun_max_weight_diff="
              f"{_weights_diff(ckpt['a'], ckpt['torchrun']):.3g} (against the plain run)",
              flush=True)

    # prediction: batch size, device, AMP, channels_last, torchrun
    spec = f"{a.arch}={ckpt['a']}"
    base = {"seed": 0}
    z = {}
    for name, kw in {"b16": {"batch_size": 16}, "b64": {"batch_size": 64},
                     "cpu": {"batch_size": 64, "device": "cpu"},
                     "bf16": {"batch_size": 64, "amp": "bf16"},
                     "cl": {"batch_size": 64, "channels_last": True}}.items():
        kw.setdefault("device", dev)
        t0 = time.perf_counter()
        z[name] = _logits(predict(spec, folder, PredictConfig(**base, **kw)))
        print(f"  predict {name}: {time.perf_counter() - t0:.2f} s", flush=True)
    print(f"RESULT predict_batch16_vs_64={_maxdiff(z['b16'], z['b64']):.3g} "
          f"predict_cuda_vs_cpu={_maxdiff(z['b64'], z['cpu']):.3g} "
          f"predict_bf16_vs_fp32={_maxdiff(z['bf16'], z['b64']):.3g} "
          f"predict_channels_last_vs_contiguous={_maxdiff(z['cl'], z['b64']):.3g} "
          f"logit_scale={float(np.abs(z['b64']).max()):.3g}", flush=True)
    out = work / "torchrun_caches"
    p = subprocess.run(run + ["-m", "uqvision", "predict", "--model", spec, "--data", str(folder),
                              "--out", str(out), "--batch-size", "64", "--device", dev,
                              "--overwrite"],
                       check=False, capture_output=True, text=True, env=_env())
    if p.returncode:
        print(f"RESULT predict_torchrun=failed rc={p.returncode}\n{p.stderr[-1500:]}", flush=True)
    else:
        import xarray as xr

        files = sorted(out.glob("*.nc"))
        with xr.open_dataset(files[0]) as ds:
            zt = ds["logits"].values[None]
        print(f"RESULT predict_torchrun_vs_inprocess={_maxdiff(zt, z['b64']):.3g} "
              f"caches={len(files)}", flush=True)

    # MC dropout: masks drawn on the CPU, so CUDA passes equal the CPU ones to float rounding
    drop = work / "dropout.safetensors"
    train_model(folder, drop, ImageTrainConfig(
        arch=a.arch, method="mc_dropout", epochs=0.25, batch_size=64, input_size=a.image_size,
        augment=None, seed=0, device=dev))
    mc = {}
    for name, kw in {"b16": {"batch_size": 16}, "b64": {"batch_size": 64},
                     "cpu": {"batch_size": 64, "device": "cpu"}}.items():
        kw.setdefault("device", dev)
        mc[name] = _logits(predict(f"{a.arch}={drop}", folder, PredictConfig(
            mode="mc_dropout", passes=10, **base, **kw)))
    print(f"RESULT mc_dropout_batch16_vs_64={_maxdiff(mc['b16'], mc['b64']):.3g} "
          f"mc_dropout_cuda_vs_cpu={_maxdiff(mc['b64'], mc['cpu']):.3g} "
          f"mc_passes={mc['b64'].shape[0]} "
          f"mc_pass_spread={float(mc['b64'].std(axis=0).mean()):.3g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
