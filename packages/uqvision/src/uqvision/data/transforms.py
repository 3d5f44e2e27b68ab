"""Per-model preprocessing and seeded augmentations: :class:`DataConfig` (timm's
pretrained-config fields) and its evaluation transform (:func:`eval_transform`); torchvision's
random steps drawing from an explicit ``torch.Generator`` (:class:`SeededAugmentation`), so
that a test-time augmentation is a pure function of (seed, sample); the policies
(:data:`TTA_POLICIES`, :func:`tta_transform`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from timm.data import create_transform
from torchvision import transforms as T
from torchvision.transforms import functional as TF
from uqmetrics.metrics.registry import Registry

__all__ = [
    "TTA_POLICIES",
    "DataConfig",
    "RandomCrop",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "SeededAugmentation",
    "cifar_augmentation",
    "crop_augmentation",
    "eval_transform",
    "imagenet_augmentation",
    "tta_transform",
]


@dataclass(frozen=True)
class DataConfig:
    """The preprocessing a model was trained with (timm's pretrained-config fields).

    ``input_size`` is (3, H, W); the evaluation transform resizes the short side to
    ``floor(H / crop_pct)`` and centre-crops (H, W).
    """

    input_size: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_pct: float = 0.875
    interpolation: str = "bilinear"
    crop_mode: str = "center"

    @classmethod
    def from_dict(cls, d: dict) -> DataConfig:
        keys = ("input_size", "mean", "std", "crop_pct", "interpolation", "crop_mode")
        kw = {k: d[k] for k in keys if k in d and d[k] is not None}
        for k in ("input_size", "mean", "std"):
            kw[k] = tuple(kw[k])
        return cls(**kw)

    def to_dict(self) -> dict:
        return {"input_size": list(self.input_size), "mean": list(self.mean),
                "std": list(self.std), "crop_pct": self.crop_pct,
                "interpolation": self.interpolation, "crop_mode": self.crop_mode}


def eval_transform(cfg: DataConfig) -> Callable:
    """timm's evaluation transform for a data config (``timm.data.create_transform``)."""
    return create_transform(**cfg.to_dict(), is_training=False)


def _interp(name: str) -> T.InterpolationMode:
    return T.InterpolationMode(name if name in {m.value for m in T.InterpolationMode}
                               else "bilinear")


def _tail(cfg: DataConfig) -> list:
    return [T.ToTensor(), T.Normalize(cfg.mean, cfg.std)]


def _central_crop_box(height: int, width: int, ratio) -> tuple[int, int, int, int]:
    """torchvision's fallback of ``RandomResizedCrop``: the largest central box within
    ``ratio``."""
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        w, h = round(height * max(ratio)), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class RandomResizedCrop(T.RandomResizedCrop):
    """torchvision's ``RandomResizedCrop`` drawing from ``generator`` (default: the global RNG).

    Its draws are torchvision's, call for call: with a generator seeded ``s`` the crop equals
    torchvision's after ``torch.manual_seed(s)``.
    """

    def forward(self, img, generator: torch.Generator | None = None):
        _, height, width = TF.get_dimensions(img)
        area = height * width
        lo, hi = (float(v) for v in torch.log(torch.tensor(self.ratio)))
        box = None
        for _ in range(10):
            target = area * torch.empty(1).uniform_(*self.scale, generator=generator).item()
            aspect = torch.exp(torch.empty(1).uniform_(lo, hi, generator=generator)).item()
            w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                box = (_randint(height - h + 1, generator), _randint(width - w + 1, generator),
                       h, w)
                break
        box = box or _central_crop_box(height, width, self.ratio)
        return TF.resized_crop(img, *box, self.size, self.interpolation, antialias=self.antialias)


class RandomCrop(T.RandomCrop):
    """torchvision's ``RandomCrop`` (padding, no ``pad_if_needed``) drawing from ``generator``."""

    def forward(self, img, generator: torch.Generator | None = None):
        if self.padding is not None:
            img = TF.pad(img, self.padding, self.fill, self.padding_mode)
        _, h, w = TF.get_dimensions(img)
        th, tw = self.size
        if h < th or w < tw:
            raise ValueError(f"crop size {(th, tw)} is larger than the image size {(h, w)}")
        if (h, w) == (th, tw):
            return img
        i, j = _randint(h - th + 1, generator), _randint(w - tw + 1, generator)
        return TF.crop(img, i, j, th, tw)


class RandomHorizontalFlip(T.RandomHorizontalFlip):
    """torchvision's ``RandomHorizontalFlip`` drawing from ``generator``."""

    def forward(self, img, generator: torch.Generator | None = None):
        return TF.hflip(img) if torch.rand(1, generator=generator) < self.p else img


def _randint(high: int, generator: torch.Generator | None) -> int:
    return int(torch.randint(0, high, size=(1,), generator=generator).item())


_SEEDED_STEPS = (RandomResizedCrop, RandomCrop, RandomHorizontalFlip)


class SeededAugmentation(T.Compose):
    """A ``Compose`` whose random steps draw from an explicit ``torch.Generator``.

    ``aug(img)`` draws from the global torch RNG exactly as the plain torchvision pipeline
    would (training); ``aug(img, generator=g)`` draws from ``g`` only (test-time augmentation:
    one generator per sample and pass, so the global RNG is never read or written).
    """

    def __call__(self, img, generator: torch.Generator | None = None):
        for step in self.transforms:
            img = step(img, generator=generator) if isinstance(step, _SEEDED_STEPS) else step(img)
        return img


def _pad_crop(cfg: DataConfig, flip: bool) -> SeededAugmentation:
    size = cfg.input_size[1:]
    pad = max(1, round(4 * size[0] / 32))  # 4 px at CIFAR's 32 px, scaled with the input
    steps = [T.Resize(size, interpolation=_interp(cfg.interpolation)),
             RandomCrop(size, padding=pad)]
    if flip:
        steps.append(RandomHorizontalFlip())
    return SeededAugmentation([*steps, *_tail(cfg)])


#: Random augmentation policies (Pitfalls, V.2): name -> builder(DataConfig) ->
#: :class:`SeededAugmentation`.
TTA_POLICIES: Registry[Callable[[DataConfig], SeededAugmentation]] = Registry("augmentation")


@TTA_POLICIES.register(name="imagenet")
def imagenet_augmentation(cfg: DataConfig) -> SeededAugmentation:
    """RandomResizedCrop + horizontal flip (ImageNet style)."""
    size = cfg.input_size[1:]
    return SeededAugmentation([RandomResizedCrop(size, interpolation=_interp(cfg.interpolation)),
                               RandomHorizontalFlip(), *_tail(cfg)])


@TTA_POLICIES.register(name="cifar")
def cifar_augmentation(cfg: DataConfig) -> SeededAugmentation:
    """Pad-4 random crop + horizontal flip (CIFAR style; the pad scales with the input)."""
    return _pad_crop(cfg, flip=True)


@TTA_POLICIES.register(name="crop")
def crop_augmentation(cfg: DataConfig) -> SeededAugmentation:
    """Pad-4 random crop, no flip (digits must not be flipped)."""
    return _pad_crop(cfg, flip=False)


def tta_transform(policy: str, cfg: DataConfig) -> SeededAugmentation:
    """The random augmentation ``policy`` (a name in :data:`TTA_POLICIES`) for a data config."""
    return TTA_POLICIES.lookup(policy)(cfg)
