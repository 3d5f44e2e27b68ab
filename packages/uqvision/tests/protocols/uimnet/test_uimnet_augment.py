"""The ``tta`` measure's augmentations (V.3): UIMNET's released policy on real data, 10 draws;
the stand-in's variant; every random step seeded per image."""

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image

from uqvision.data import DataConfig, RandomHorizontalFlip, RandomResizedCrop
from uqvision.protocols.uimnet import reproduce
from uqvision.protocols.uimnet.augment import (
    OFFICIAL_TTA_COUNT,
    UIMNET_TTA_POLICIES,
    RandomHalfTurn,
    SeededColorJitter,
    SeededRandomGrayscale,
    UimnetAugmentation,
    resolve_tta_policy,
    uimnet_tta_transform,
)

CFG = DataConfig((3, 48, 48), (0.5, 0.4, 0.3), (0.2, 0.25, 0.3), crop_pct=0.875)


def image(seed=0, size=(40, 56)):
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((*size, 3)) * 255).astype(np.uint8))


def _steps(aug):
    return [type(s) for s in aug.transforms]


def test_the_real_data_policy_is_the_released_composition_with_10_augmentations():
    """uimnet/measures/augmentation.py: RandomResizedCrop(224, scale=(0.7, 1.0)),
    RandomHorizontalFlip(), ColorJitter(0.3, 0.3, 0.3, 0.3), RandomGrayscale(), m = 10; the
    crop size is the model's input size, taken from its evaluation view."""
    assert resolve_tta_policy("auto", real_data=True) == "uimnet"
    aug = uimnet_tta_transform("uimnet", CFG)
    assert isinstance(aug, UimnetAugmentation)
    assert _steps(aug) == [T.Resize, T.CenterCrop, RandomResizedCrop, RandomHorizontalFlip,
                           SeededColorJitter, SeededRandomGrayscale, T.ToTensor, T.Normalize]
    resize, centre, crop, flip, jitter, gray, _, norm = aug.transforms
    assert resize.size == 54 and tuple(centre.size) == (48, 48)  # floor(48 / 0.875)
    assert tuple(crop.size) == (48, 48) and crop.scale == (0.7, 1.0)
    assert crop.ratio == pytest.approx((3 / 4, 4 / 3))
    assert flip.p == 0.5 and gray.p == 0.1
    assert jitter.brightness == jitter.contrast == jitter.saturation == pytest.approx((0.7, 1.3))
    assert jitter.hue == pytest.approx((-0.3, 0.3))
    assert tuple(norm.mean) == CFG.mean and tuple(norm.std) == CFG.std
    # 10 augmentations per image, at every scale and through the driver's transforms
    assert OFFICIAL_TTA_COUNT == 10
    assert reproduce.UimnetScale().tta == 10 and reproduce.UIMNET_SCALES["cpu"].tta == 10
    side = {"pretrained_cfg": CFG.to_dict()}
    _, augs = reproduce._eval_transforms(side, reproduce.UIMNET_SCALES["cpu"].tta, 0, "uimnet")
    assert len(augs) == 10 and len({s for _, s in augs}) == 10
    assert all(_steps(a) == _steps(aug) for a, _ in augs)
    assert reproduce.UimnetScale().tta_policy == "auto"


def test_the_standin_policy_replaces_the_flip_by_a_half_turn():
    assert resolve_tta_policy("auto", real_data=False) == "uimnet_standin"
    official = _steps(uimnet_tta_transform("uimnet", CFG))
    standin = _steps(uimnet_tta_transform("uimnet_standin", CFG))
    assert standin == [RandomHalfTurn if s is RandomHorizontalFlip else s for s in official]
    assert resolve_tta_policy("cifar", real_data=True) == "cifar"
    with pytest.raises(ValueError, match="unknown UIMNET augmentation"):
        resolve_tta_policy("flip", real_data=True)
    assert UIMNET_TTA_POLICIES.names() == ["uimnet", "uimnet_standin", "cifar"]


def test_a_flip_maps_standin_classes_onto_other_classes_a_half_turn_does_not():
    """The stand-in's gratings (orientation θ = 180° k / n): a mirror image of class k is
    class n - k, pixel for pixel; a half turn keeps each class nearest to itself."""
    from uqvision.hierarchy import class_prototypes

    protos = class_prototypes("cpu", seed=0)[:6]  # 00-gratings-00 .. 05
    for k in range(1, 6):
        np.testing.assert_allclose(protos[k][:, ::-1], protos[6 - k], atol=1e-6)
        turned = protos[k][::-1, ::-1]
        assert np.argmin(((turned[None] - protos) ** 2).sum((1, 2, 3))) == k


def test_every_random_step_draws_from_the_per_image_generator():
    """With a generator seeded s, each seeded step equals torchvision's after
    torch.manual_seed(s); the global RNG is not touched; the same seed gives the same
    augmentation."""
    img = image()
    for ours, theirs in ((SeededColorJitter(0.3, 0.3, 0.3, 0.3), T.ColorJitter(0.3, 0.3, 0.3, 0.3)),
                         (SeededRandomGrayscale(p=0.5), T.RandomGrayscale(p=0.5))):
        for s in range(6):
            torch.manual_seed(s)
            want = np.asarray(theirs(img))
            torch.manual_seed(1234)
            state = torch.get_rng_state()
            got = np.asarray(ours(img, generator=torch.Generator().manual_seed(s)))
            assert torch.equal(torch.get_rng_state(), state)
            np.testing.assert_array_equal(got, want)
    turned = np.asarray(RandomHalfTurn(p=1.0)(img, generator=torch.Generator()))
    np.testing.assert_array_equal(turned, np.asarray(img)[::-1, ::-1])
    aug = uimnet_tta_transform("uimnet", CFG)
    a = aug(img, generator=torch.Generator().manual_seed(3))
    b = aug(img, generator=torch.Generator().manual_seed(3))
    c = aug(img, generator=torch.Generator().manual_seed(4))
    assert a.shape == (3, 48, 48) and torch.equal(a, b) and not torch.equal(a, c)
