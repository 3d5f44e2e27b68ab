import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.datasets import ImageFolder

import uqvision.data
from uqvision.data import (
    TTA_POLICIES,
    DataConfig,
    ImageFolderDataset,
    dataset_fingerprint,
    eval_transform,
    make_synthetic_folder,
    tta_transform,
)


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


@pytest.mark.parametrize("make", [
    lambda p: p / "missing",
    lambda p: p,  # exists but no class folder
    lambda p: (p / "a").mkdir() or p,  # a class folder without images
])
def test_missing_or_empty_folders_raise(tmp_path, make):
    root = make(tmp_path)
    with pytest.raises(FileNotFoundError, match="folder"):
        ImageFolderDataset(root)


@pytest.mark.parametrize("policy", TTA_POLICIES.names())
def test_augmentation_is_a_function_of_seed_and_sample(digits, policy):
    cfg = DataConfig((3, 16, 16), (0.5,) * 3, (0.5,) * 3, crop_pct=1.0)
    t = tta_transform(policy, cfg)
    a = ImageFolderDataset(digits / "test", t, augment_seed=1)
    b = ImageFolderDataset(digits / "test", t, augment_seed=1)
    c = ImageFolderDataset(digits / "test", t, augment_seed=2)
    torch.manual_seed(123)  # the global RNG must not matter
    xa = torch.stack([a[i][0] for i in range(20)])
    torch.manual_seed(456)
    xb = torch.stack([b[i][0] for i in reversed(range(20))]).flip(0)
    xc = torch.stack([c[i][0] for i in range(20)])
    assert torch.equal(xa, xb)
    assert not torch.equal(xa, xc)
    assert xa.shape == (20, 3, 16, 16)


def test_unknown_policy_raises():
    with pytest.raises(ValueError, match="unknown augmentation 'mixup'; valid augmentations: "
                                         "imagenet, cifar, crop"):
        tta_transform("mixup", DataConfig((3, 8, 8), (0.5,) * 3, (0.5,) * 3))


@pytest.mark.parametrize("policy", TTA_POLICIES.names())
@pytest.mark.parametrize("size", [6, 16, 40])
def test_seeded_augmentation_draws_exactly_what_torchvision_draws(digits, policy, size):
    """With a generator seeded s, each random step equals its torchvision class after
    torch.manual_seed(s) (so TTA caches keep their values), and the global RNG is untouched."""
    aug = tta_transform(policy, DataConfig((3, size, size), (0.5,) * 3, (0.5,) * 3))
    img = ImageFolderDataset(digits / "test")[0][0].resize((12, 9))  # not square: fallbacks
    for seed in range(25):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            ref = img
            for step in aug.transforms:  # the plain torchvision implementation of each step
                base = getattr(T, type(step).__name__)
                ref = base.forward(step, ref) if base is not type(step) else step(ref)
        torch.manual_seed(1000 + seed)
        state = torch.get_rng_state()
        ours = aug(img, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(torch.get_rng_state(), state)
        assert torch.equal(ours, ref), seed


def test_augment_seed_needs_a_seeded_augmentation(digits):
    cfg = DataConfig((3, 8, 8), (0.5,) * 3, (0.5,) * 3)
    with pytest.raises(ValueError, match="SeededAugmentation"):
        ImageFolderDataset(digits / "test", eval_transform(cfg), augment_seed=0)


def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(Image.Image, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        make_synthetic_folder(tmp_path / "fake", n_classes=2, n_per_class=1, image_size=8)
    assert list(tmp_path.iterdir()) == []
