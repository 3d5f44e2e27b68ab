"""uqvision.data.transforms: seeded augmentations (a function of seed and sample, draw for
draw torchvision's), the policies and their refusals."""

import pytest
import torch
from torchvision import transforms as T

from uqvision.data import (
    TTA_POLICIES,
    DataConfig,
    ImageFolderDataset,
    eval_transform,
    tta_transform,
)


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
