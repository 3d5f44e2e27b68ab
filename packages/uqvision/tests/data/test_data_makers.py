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


def test_subset_folder_copies_a_seeded_choice_per_class(tmp_path):
    """``uqvision data subset``: n images of every class, chosen by the class's own seeded
    stream (adding a class changes no other class's choice), bytes copied unchanged, the
    choice recorded; a rerun keeps the folder, other options are refused."""
    import json

    from uqmetrics import InputError

    from uqvision.data import (
        ImageFolderDataset,
        make_digits_folder,
        make_subset_folder,
        subset_choice,
    )

    src = make_digits_folder(tmp_path / "d", max_per_class=20) / "train"
    ds = ImageFolderDataset(src)
    out = make_subset_folder(tmp_path / "fit", src=src, n_per_class=3, seed=7)
    fit = ImageFolderDataset(out)
    assert fit.classes == ds.classes and len(fit) == 3 * len(ds.classes)
    recorded = json.loads((out / "subset.json").read_text())
    assert (recorded["per_class"], recorded["seed"]) == (3, 7)
    for rel in recorded["samples"]:
        assert (out / rel).read_bytes() == (src / rel).read_bytes()
    # the class's own stream: the choice of class "3" without classes 0-2 is the same
    rows = [(rel, y) for rel, y in ds.samples if ds.classes[y] == "3"]
    alone = subset_choice(["3"], [(rel, 0) for rel, _ in rows], 3, seed=7)
    assert sorted(rows[i][0] for i in alone) == sorted(
        r for r in recorded["samples"] if r.startswith("3/"))
    assert subset_choice(ds.classes, ds.samples, 3, seed=8) != subset_choice(
        ds.classes, ds.samples, 3, seed=7)
    mtime = (out / "subset.json").stat().st_mtime_ns
    assert make_subset_folder(tmp_path / "fit", src=src, n_per_class=3, seed=7) == out
    assert (out / "subset.json").stat().st_mtime_ns == mtime  # kept, not rewritten
    with pytest.raises(FileExistsError, match="different dataset"):
        make_subset_folder(tmp_path / "fit", src=src, n_per_class=4, seed=7)
    with pytest.raises(InputError, match="per_class 11 exceeds the 10 images of class '0'"):
        make_subset_folder(tmp_path / "fit2", src=src, n_per_class=11)
    with pytest.raises(InputError, match="per_class must be at least 1"):
        subset_choice(ds.classes, ds.samples, 0)
