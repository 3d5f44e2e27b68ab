"""ImageNet's layouts built in miniature for the tests of :mod:`uqvision.layouts`
(``tests/layouts``): three ImageNet-1k classes, eight validation images, the devkit's
``meta.mat`` and ground truth, a ``LOC_val_solution.csv``; the fixtures that build every layout
from them are in this folder's ``conftest.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.io
import torch
import xarray as xr
from PIL import Image
from timm.data import ImageNetInfo

from uqvision.data import DataConfig, eval_transform

IN1K = ImageNetInfo("imagenet-1k").label_names()
#: Three ImageNet-1k classes (timm's order: sorted WordNet ids) and the devkit's
#: ILSVRC2012_ID of each, deliberately not their position: the devkit orders classes its own way.
PICKED = [IN1K[3], IN1K[101], IN1K[950]]
ILSVRC_ID = {PICKED[0]: 449, PICKED[1]: 7, PICKED[2]: 120}
#: Class of validation image i + 1 (ILSVRC2012_val_00000001 ... _00000008).
IMAGE_CLASS = [2, 0, 1, 0, 2, 1, 0, 2]
TRANSFORM = eval_transform(DataConfig((3, 16, 16), (0.5,) * 3, (0.25,) * 3, crop_pct=1.0))


def _name(i: int) -> str:
    return f"ILSVRC2012_val_{i:08d}.JPEG"


def _jpeg(path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    h, w = 18 + seed % 5, 22 - seed % 4
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(path, "JPEG")


def _write_meta(path: Path, extra_leaf: str = "n01440764") -> None:
    """A devkit ``meta.mat``: the ``synsets`` struct array (n x 1, as in the devkit) with
    ILSVRC2012_ID, WNID, words, gloss, num_children; leaves and one inner synset."""
    rows = [(ILSVRC_ID[w], w, ImageNetInfo().label_name_to_description(w), "a leaf", 0)
            for w in PICKED]
    rows += [(1, extra_leaf, "tench, Tinca tinca", "a leaf", 0),
             (1001, "n00001740", "entity", "the root", 3)]
    dt = [("ILSVRC2012_ID", "O"), ("WNID", "O"), ("words", "O"), ("gloss", "O"),
          ("num_children", "O")]
    synsets = np.zeros((len(rows), 1), dtype=dt)
    for i, row in enumerate(rows):
        synsets[i, 0] = row
    path.parent.mkdir(parents=True, exist_ok=True)
    scipy.io.savemat(path, {"synsets": synsets})


def _write_devkit(folder: Path, classes=IMAGE_CLASS) -> Path:
    devkit = folder / "ILSVRC2012_devkit_t12"
    _write_meta(devkit / "data" / "meta.mat")
    (devkit / "data" / "ILSVRC2012_validation_ground_truth.txt").write_text(
        "".join(f"{ILSVRC_ID[PICKED[c]]}\n" for c in classes))
    return devkit


def _write_csv(path: Path, classes=IMAGE_CLASS) -> Path:
    rows = [f"{_name(i + 1)[:-5]},{PICKED[c]} 1 2 30 40 {PICKED[c]} 3 4 10 12\n"
            for i, c in enumerate(classes)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("ImageId,PredictionString\n" + "".join(rows[::-1]))  # any row order
    return path


def _tensors(ds):
    ds = ds.with_transform(TRANSFORM)
    return torch.stack([ds[i][0] for i in range(len(ds))])


def _cache(out: Path) -> xr.Dataset:
    (path,) = sorted(out.glob("*.nc"))
    with xr.open_dataset(path) as ds:
        return ds.load()

