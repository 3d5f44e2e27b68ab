"""Development datasets written as image folders: scikit-learn's digits
(:func:`make_digits_folder`), torchvision's ``FakeData`` at full resolution
(:func:`make_synthetic_folder`) and the hierarchy stand-in (:func:`uqvision.hierarchy.
make_hierarchy`), registered in :data:`DATASET_MAKERS` (``uqvision data NAME``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image
from torchvision.datasets import FakeData
from uqmetrics.io import folder_replaced
from uqmetrics.registry import Registry

from ..hierarchy import make_hierarchy
from .corruptions import make_imagenet_c_folder

__all__ = ["DATASET_MAKERS", "make_digits_folder", "make_synthetic_folder"]

#: Marks a folder written completely by a maker (its content: the maker's options, JSON).
_COMPLETE = ".uqvision-complete"


def _write_folder(root: Path, splits: dict[str, list[tuple[np.ndarray, str, str]]],
                  meta: dict, overwrite: bool) -> Path:
    """Write ``{split: [(uint8 image HxW[x3], class name, file stem)]}`` atomically."""
    root = Path(root)
    if (root / _COMPLETE).exists() and not overwrite:
        if json.loads((root / _COMPLETE).read_text()) == meta:
            return root
        raise FileExistsError(f"{str(root)!r} holds a different dataset; pass overwrite=True")
    if root.exists() and any(root.iterdir()) and not overwrite and not (root / _COMPLETE).exists():
        raise FileExistsError(f"{str(root)!r} exists and is not a uqvision dataset folder")
    with folder_replaced(root) as tmp:
        for split, items in splits.items():
            for arr, cls, stem in items:
                d = tmp / split / cls
                d.mkdir(parents=True, exist_ok=True)
                Image.fromarray(arr).save(d / f"{stem}.png")
        (tmp / _COMPLETE).write_text(json.dumps(meta))
    return root


def make_digits_folder(root: str | os.PathLike, *, test_fraction: float = 0.5, seed: int = 0,
                       max_per_class: int | None = None, overwrite: bool = False) -> Path:
    """Write scikit-learn's bundled digits (1,797 real 8×8 images, 10 classes) as image folders.

    Creates ``root/train/<digit>/*.png`` and ``root/test/<digit>/*.png`` (stratified split).
    Idempotent: an identical existing folder is reused.

    Parameters
    ----------
    root : path
    test_fraction : float, default 0.5
    seed : int, default 0
        Seed of the stratified split.
    max_per_class : int, optional
        Keep only the first images of each class (before the split): small sets for tests.
    overwrite : bool, default False

    Returns
    -------
    Path
        ``root``.
    """
    from sklearn.datasets import load_digits  # heavy: imported on first use (start-up time)
    from sklearn.model_selection import (
        train_test_split,  # heavy: imported on first use (start-up time)
    )

    d = load_digits()
    imgs = np.round(d.images * (255.0 / 16.0)).astype(np.uint8)
    idx = np.arange(len(imgs))
    if max_per_class is not None:
        idx = np.concatenate([np.flatnonzero(d.target == c)[:max_per_class] for c in range(10)])
    tr, te = train_test_split(idx, test_size=test_fraction, random_state=seed, stratify=d.target[idx])
    splits = {name: [(imgs[i], str(d.target[i]), f"{i:04d}") for i in sorted(part)]
              for name, part in (("train", tr), ("test", te))}
    meta = {"maker": "digits", "test_fraction": test_fraction, "seed": seed,
            "max_per_class": max_per_class}
    return _write_folder(Path(root), splits, meta, overwrite)


def make_synthetic_folder(root: str | os.PathLike, *, n_classes: int = 4, n_per_class: int = 8,
                          image_size: int = 224, seed: int = 0, overwrite: bool = False) -> Path:
    """Write torchvision ``FakeData`` images (random RGB, ``image_size`` px) as ``root/test``.

    For exercising the full-resolution (224 px, resize 256 + centre crop) input path; the labels
    carry no signal.
    """
    n = n_classes * n_per_class
    fake = FakeData(size=n, image_size=(3, image_size, image_size), num_classes=n_classes,
                    random_offset=seed)
    items = []
    for i in range(n):
        img, _ = fake[i]
        items.append((np.asarray(img), f"class_{i % n_classes:03d}", f"{i:05d}"))
    meta = {"maker": "synthetic", "n_classes": n_classes, "n_per_class": n_per_class,
            "image_size": image_size, "seed": seed}
    return _write_folder(Path(root), {"test": items}, meta, overwrite)


#: Development dataset makers: name -> function(root, *, seed, overwrite, **options) -> root
#: (``uqvision data NAME``; the CLI passes the options the function's signature names).
DATASET_MAKERS: Registry[Callable[..., Path]] = Registry("dataset maker")
DATASET_MAKERS.add("digits", make_digits_folder)
DATASET_MAKERS.add("synthetic", make_synthetic_folder)
DATASET_MAKERS.add("hierarchy", make_hierarchy)  # docs/conventions.md#v-0 (uqvision.hierarchy)
DATASET_MAKERS.add("imagenet-c", make_imagenet_c_folder)  # --src DIR (.corruptions)
