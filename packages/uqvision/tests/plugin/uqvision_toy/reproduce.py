"""``uqvision reproduce toy``: the plugin's method trained on a generated digits folder, then the
trained network and the plugin's ``toy/meancolour`` model predict its test split, and the
caches are scored (:func:`~.score.score_toy`)."""

from __future__ import annotations

import os
from pathlib import Path

from uqmetrics import write_dataset

from uqvision.data import make_digits_folder
from uqvision.predict import PredictConfig, predict_to_files
from uqvision.protocols.base import Reproduction
from uqvision.training.loop import ImageTrainConfig, train_model

from . import DESCRIPTION
from .score import score_toy

#: scale -> (training epochs, images per class)
SCALES = {"smoke": (1.0, 6)}


def run(out: str | os.PathLike, *, scale: str = "smoke", data=None, arch=None, seed: int = 0,
        overwrite: bool = False, options: dict | None = None, log=print,
        device: str = "cpu") -> Path:
    """The driver; returns the path of ``toy.nc``."""
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r} of reproduce toy; valid: {list(SCALES)}")
    if options:
        raise ValueError(f"reproduce toy takes no --set options, got {sorted(options)}")
    epochs, per_class = SCALES[scale]
    out = Path(out)
    root = Path(data) if data is not None else make_digits_folder(
        out / "data", max_per_class=per_class, seed=seed, overwrite=overwrite)
    ckpt = out / "models" / "toy_label_smoothing.safetensors"
    if overwrite or not ckpt.exists():
        train_model(root / "train", ckpt, ImageTrainConfig(
            arch=arch or "test_resnet", method="toy_label_smoothing", epochs=epochs,
            batch_size=16, seed=seed, device=device))
    caches = out / "caches"
    config = PredictConfig(device=device, seed=seed, allow_random_init=True, num_workers=0)
    for spec in (f"test_resnet={ckpt}", "toy/meancolour"):
        predict_to_files(spec, root / "test", caches, config, overwrite=overwrite)
    path = write_dataset(score_toy([caches]), out / "toy.nc", overwrite=True)
    log(f"toy: {path}")
    return path


#: The driver of ``uqvision reproduce toy``.
REPRODUCTION = Reproduction("toy", DESCRIPTION, run, scales=tuple(SCALES))
