"""Fixtures of the layout tests (``tests/layouts``): the same eight validation images in every
layout (:func:`sets`) and a 1,000-class ImageNet-1k checkpoint (:func:`in1k_checkpoint`)."""

from __future__ import annotations

import io
import shutil
import tarfile

import pytest
import timm
import torch
from layouts_support import IMAGE_CLASS, PICKED, _jpeg, _name, _write_csv, _write_devkit


@pytest.fixture
def sets(tmp_path):
    """The same 8 validation images in every layout."""
    cf = tmp_path / "folders" / "val"
    flat = tmp_path / "imagenet" / "val"
    for i, c in enumerate(IMAGE_CLASS):
        _jpeg(flat / _name(i + 1), i)
        (cf / PICKED[c]).mkdir(parents=True, exist_ok=True)
        shutil.copy(flat / _name(i + 1), cf / PICKED[c] / _name(i + 1))
    devkit = _write_devkit(tmp_path / "imagenet")
    csv = _write_csv(tmp_path / "kaggle" / "LOC_val_solution.csv")
    with tarfile.open(tmp_path / "imagenet" / "ILSVRC2012_img_val.tar", "w") as tf:
        for i in range(len(IMAGE_CLASS)):
            tf.add(flat / _name(i + 1), arcname=_name(i + 1))
    with tarfile.open(tmp_path / "val_folders.tar", "w") as tf:
        tf.add(cf, arcname="val")  # one top folder, class folders in it
    with tarfile.open(tmp_path / "train_like.tar", "w") as outer:
        for w in PICKED:  # one <wnid>.tar per class, flat images inside, as ILSVRC2012_img_train
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as inner:
                for f in sorted((cf / w).iterdir()):
                    inner.add(f, arcname=f.name)
            ti = tarfile.TarInfo(f"{w}.tar")
            ti.size = len(buf.getvalue())
            outer.addfile(ti, io.BytesIO(buf.getvalue()))
    return {"folders": cf, "flat": flat, "devkit": devkit, "csv": csv,
            "tar_flat": tmp_path / "imagenet" / "ILSVRC2012_img_val.tar",
            "tar_folders": tmp_path / "val_folders.tar", "tar_tars": tmp_path / "train_like.tar"}


@pytest.fixture(scope="module")
def in1k_checkpoint(tmp_path_factory):
    """A 1,000-class ImageNet-1k timm checkpoint without a sidecar: its classes are the WordNet
    ids in timm's order (random weights: only the label space is checked)."""
    from safetensors.torch import save_file

    path = tmp_path_factory.mktemp("in1k") / "r.safetensors"
    torch.manual_seed(0)
    save_file(timm.create_model("test_resnet.r160_in1k").state_dict(), str(path))
    return f"test_resnet.r160_in1k={path}"

