"""uqvision.data.folders: ImageFolderDataset's class and sample order, and its refusal of
missing or empty folders (the other layouts: tests/layouts/test_layouts_*.py)."""

import numpy as np
import pytest
from PIL import Image
from torchvision.datasets import ImageFolder

from uqvision.data import ImageFolderDataset


def _img(path, value=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8), value, np.uint8)).save(path)


def test_class_and_sample_order_match_torchvision_imagefolder(tmp_path):
    # synset-like names whose sorted order differs from creation order, nested files,
    # a non-image file and a hidden folder that must be ignored
    names = ["n09999999", "n01440764", "n02102040", "N00000001", "n01440764_b"]
    for i, n in enumerate(names):
        for j in (3, 1, 2):
            _img(tmp_path / n / f"img_{j}.png", 10 * i + j)
        _img(tmp_path / n / "sub" / "deep.JPEG", i)
        (tmp_path / n / "notes.txt").write_text("not an image")
    ours = ImageFolderDataset(tmp_path)
    ref = ImageFolder(tmp_path)
    assert ours.classes == ref.classes
    assert ours.class_to_idx == ref.class_to_idx
    assert [(str(tmp_path / p), y) for p, y in ours.samples] == ref.samples
    assert ours.targets == ref.targets


@pytest.mark.parametrize("make", [
    lambda p: p / "missing",
    lambda p: p,  # exists but no class folder
    lambda p: (p / "a").mkdir() or p,  # a class folder without images
])
def test_missing_or_empty_folders_raise(tmp_path, make):
    root = make(tmp_path)
    with pytest.raises(FileNotFoundError, match="folder"):
        ImageFolderDataset(root)
