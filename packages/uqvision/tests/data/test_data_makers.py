"""uqvision.data.makers: the development datasets (digits, synthetic) and their atomic write."""

import numpy as np
import pytest
from PIL import Image

import uqvision.data
from uqvision.data import (
    DataConfig,
    ImageFolderDataset,
    dataset_fingerprint,
    eval_transform,
    make_synthetic_folder,
)


def test_digits_folder_has_real_images_and_is_idempotent(digits):
    train, test = ImageFolderDataset(digits / "train"), ImageFolderDataset(digits / "test")
    assert train.classes == test.classes == [str(d) for d in range(10)]
    assert len(train) + len(test) == 130
    assert not set(train.sample_ids) & set(test.sample_ids)
    img, label, idx = test[0]
    assert img.size == (8, 8) and label == 0 and idx == 0
    assert len(np.unique(np.asarray(img))) > 2  # a real digit, not a constant image
    before = dataset_fingerprint(digits / "test")
    uqvision.data.make_digits_folder(digits, max_per_class=13)  # reused, not rewritten
    assert dataset_fingerprint(digits / "test") == before
    with pytest.raises(FileExistsError):
        uqvision.data.make_digits_folder(digits, max_per_class=12)


def test_synthetic_folder_feeds_the_224px_path(tmp_path):
    root = make_synthetic_folder(tmp_path / "fake", n_classes=3, n_per_class=2, image_size=64)
    ds = ImageFolderDataset(root / "test", eval_transform(DataConfig(
        (3, 224, 224), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), crop_pct=0.875)))
    assert len(ds.classes) == 3 and len(ds) == 6
    assert ds[0][0].shape == (3, 224, 224)


def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(Image.Image, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        make_synthetic_folder(tmp_path / "fake", n_classes=2, n_per_class=1, image_size=8)
    assert list(tmp_path.iterdir()) == []
