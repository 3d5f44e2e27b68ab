"""The augmentations of UIMNET's ``tta`` measure (docs/conventions.md#v-3).

UIMNET's released code (``uimnet/measures/augmentation.py`` of github.com/facebookresearch/uimnet)
averages the softmax of 10 random augmentations of each image, each drawn from

    RandomResizedCrop(224, scale=(0.7, 1.0)) → RandomHorizontalFlip() →
    ColorJitter(0.3, 0.3, 0.3, 0.3) → RandomGrayscale()   (p = 0.1)

:data:`UIMNET_TTA_POLICIES` holds that policy (``uimnet``: on a real image folder), its
stand-in variant (``uimnet_standin``: the generated ``hierarchy`` set, whose classes a mirror
image can turn into another class) and the project's former policy (``cifar``: pad-crop and
flip, 2 augmentations; kept to compare). Each is a :class:`UimnetAugmentation`, a
:class:`uqvision.data.SeededAugmentation` whose every random step draws from the per-image
generator the dataset passes (so an augmentation depends on (seed, augmentation, image) only).

Differences from the released code, on purpose:

- the crop size is the model's input size (``DataConfig.input_size``), not a fixed 224;
- the crop is taken from the evaluation view of the image (resize of the short side to
  ``floor(size / crop_pct)``, centre crop), as the released code crops the evaluation tensor;
- the released code transforms a whole *batch of normalised tensors* at once: one draw of the
  random parameters per batch, and ColorJitter's clamping to [0, 1] acting on normalised
  values. Here each image gets its own draw, and the colour steps act on the image before
  normalisation (their intended domain).

Examples
--------
>>> from uqvision.data import DataConfig
>>> cfg = DataConfig((3, 32, 32), (0.5,) * 3, (0.25,) * 3)
>>> [type(s).__name__ for s in uimnet_tta_transform("uimnet", cfg).transforms][2:6]
['RandomResizedCrop', 'RandomHorizontalFlip', 'SeededColorJitter', 'SeededRandomGrayscale']
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torchvision.transforms as T
import torchvision.transforms.functional as TF
from uqmetrics.metrics.registry import Registry

from ...data import (
    DataConfig,
    RandomHorizontalFlip,
    RandomResizedCrop,
    SeededAugmentation,
    tta_transform,
)

__all__ = ["OFFICIAL_TTA_COUNT", "UIMNET_TTA_POLICIES", "RandomHalfTurn", "SeededColorJitter",
           "SeededRandomGrayscale", "UimnetAugmentation", "resolve_tta_policy",
           "uimnet_tta_transform"]

#: Augmentations per image of the released code (``self.m = 10``).
OFFICIAL_TTA_COUNT = 10
#: The released code's crop scale range and colour jitter strengths.
CROP_SCALE = (0.7, 1.0)
JITTER = 0.3


class SeededColorJitter(T.ColorJitter):
    """torchvision's ``ColorJitter`` drawing from ``generator`` (default: the global RNG).

    The draws follow torchvision's order (a permutation of the four steps, then brightness,
    contrast, saturation and hue factors), so with a generator seeded ``s`` the output equals
    torchvision's after ``torch.manual_seed(s)``.
    """

    def forward(self, img, generator: torch.Generator | None = None):
        order = torch.randperm(4, generator=generator).tolist()
        factors = [None if r is None else
                   float(torch.empty(1).uniform_(r[0], r[1], generator=generator))
                   for r in (self.brightness, self.contrast, self.saturation, self.hue)]
        adjust = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue)
        for i in order:
            if factors[i] is not None:
                img = adjust[i](img, factors[i])
        return img


class SeededRandomGrayscale(T.RandomGrayscale):
    """torchvision's ``RandomGrayscale`` (probability ``p``, default 0.1; the channel count is
    kept) drawing from ``generator``."""

    def forward(self, img, generator: torch.Generator | None = None):
        channels = TF.get_dimensions(img)[0]
        if torch.rand(1, generator=generator) < self.p:
            return TF.rgb_to_grayscale(img, num_output_channels=channels)
        return img


class RandomHalfTurn(torch.nn.Module):
    """Rotate the image by 180 degrees with probability ``p`` (default 0.5), drawing from
    ``generator``: the stand-in's replacement of the horizontal flip (see
    :func:`standin_policy`)."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        self.p = p

    def forward(self, img, generator: torch.Generator | None = None):
        return TF.rotate(img, 180.0) if torch.rand(1, generator=generator) < self.p else img

    def __repr__(self) -> str:
        return f"{type(self).__name__}(p={self.p})"


_SEEDED = (RandomResizedCrop, RandomHorizontalFlip, SeededColorJitter, SeededRandomGrayscale,
           RandomHalfTurn)


class UimnetAugmentation(SeededAugmentation):
    """A :class:`uqvision.data.SeededAugmentation` whose colour and half-turn steps also draw
    from the generator passed to ``aug(img, generator=g)``."""

    def __call__(self, img, generator: torch.Generator | None = None):
        for step in self.transforms:
            img = step(img, generator=generator) if isinstance(step, _SEEDED) else step(img)
        return img


def _interpolation(cfg: DataConfig) -> T.InterpolationMode:
    modes = {m.value for m in T.InterpolationMode}
    return T.InterpolationMode(cfg.interpolation if cfg.interpolation in modes else "bilinear")


def _official(cfg: DataConfig, symmetry: torch.nn.Module) -> UimnetAugmentation:
    size = tuple(cfg.input_size[1:])
    interp = _interpolation(cfg)
    return UimnetAugmentation([
        T.Resize(math.floor(size[0] / cfg.crop_pct), interpolation=interp),
        T.CenterCrop(size),
        RandomResizedCrop(size, scale=CROP_SCALE, interpolation=interp),
        symmetry,
        SeededColorJitter(JITTER, JITTER, JITTER, JITTER),
        SeededRandomGrayscale(),
        T.ToTensor(), T.Normalize(cfg.mean, cfg.std)])


def official_policy(cfg: DataConfig) -> UimnetAugmentation:
    """The released code's policy: crop of 70–100 % of the area resized to the input size,
    horizontal flip, ColorJitter(0.3, 0.3, 0.3, 0.3), grayscale with p = 0.1."""
    return _official(cfg, RandomHorizontalFlip())


def standin_policy(cfg: DataConfig) -> UimnetAugmentation:
    """The released policy with the horizontal flip replaced by a 180° turn (p = 0.5).

    The ``hierarchy`` stand-in has classes that a mirror image maps onto *another* class:
    the orientation of ``gratings`` and ``strokes`` (θ → 180° − θ) and the handedness of
    ``spirals``. A half turn maps every class of every family onto itself (an orientation is
    defined modulo 180°, a spiral keeps its handedness, counts and sizes are unchanged), so
    it keeps the flip's role, a label-preserving discrete symmetry drawn with p = 0.5.
    """
    return _official(cfg, RandomHalfTurn())


#: ``tta`` augmentation policies of the UIMNET protocol: name -> builder(DataConfig).
UIMNET_TTA_POLICIES: Registry[Callable[[DataConfig], SeededAugmentation]] = Registry(
    "UIMNET augmentation")
UIMNET_TTA_POLICIES.add("uimnet", official_policy)
UIMNET_TTA_POLICIES.add("uimnet_standin", standin_policy)
UIMNET_TTA_POLICIES.add("cifar", lambda cfg: tta_transform("cifar", cfg))


def uimnet_tta_transform(policy: str, cfg: DataConfig) -> SeededAugmentation:
    """The augmentation ``policy`` (a name in :data:`UIMNET_TTA_POLICIES`) for a data config."""
    return UIMNET_TTA_POLICIES.lookup(policy)(cfg)


def resolve_tta_policy(policy: str, *, real_data: bool) -> str:
    """``auto`` -> ``uimnet`` on a real image folder (``--data``), ``uimnet_standin`` on the
    generated stand-in; any other name is checked and returned.

    Examples
    --------
    >>> resolve_tta_policy("auto", real_data=True), resolve_tta_policy("auto", real_data=False)
    ('uimnet', 'uimnet_standin')
    """
    if policy == "auto":
        return "uimnet" if real_data else "uimnet_standin"
    UIMNET_TTA_POLICIES.lookup(policy)
    return policy
