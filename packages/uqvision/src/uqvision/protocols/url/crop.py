"""URL's crop intervention (S.5): a centre crop to a per-sample random fraction, resized back,
and the ``crop`` prediction mode that applies it (registered in
:data:`uqvision.predict.PASS_MODES` when this module is imported).

The fraction of sample ``i`` is drawn once from ``derive_seed(seed, i)`` (``i`` the sample's
index in its image folder), uniformly in ``[low, high]`` = [0.1, 0.75] of the short side: a pure
function of (seed, sample), independent of batching, workers and sharding.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torchvision.transforms.functional as TF

from ...data import SeededAugmentation, derive_seed
from ...predict import PASS_MODES, run_loader

__all__ = ["CROP_RANGE", "CentreFractionCrop", "crop_fractions", "crop_transform"]

#: URL's range of crop fractions of the short side.
CROP_RANGE = (0.1, 0.75)


def _fraction(generator: torch.Generator, low: float, high: float) -> float:
    return low + (high - low) * float(torch.rand(1, generator=generator).item())


def crop_fractions(seed: int, indices, low: float = CROP_RANGE[0],
                   high: float = CROP_RANGE[1]) -> np.ndarray:
    """The crop fraction of each sample index, shape (n,) (what :func:`crop_transform` uses).

    Examples
    --------
    >>> f = crop_fractions(0, [0, 1, 2])
    >>> bool(((f >= 0.1) & (f <= 0.75)).all()), bool(crop_fractions(0, [2])[0] == f[2])
    (True, True)
    """
    return np.array([_fraction(torch.Generator().manual_seed(derive_seed(seed, int(i))), low, high)
                     for i in np.asarray(indices).ravel()])


class CentreFractionCrop:
    """Centre-crop a PIL image to a square of ``f * short side`` and resize it back."""

    def __init__(self, low: float = CROP_RANGE[0], high: float = CROP_RANGE[1]):
        if not 0 < low <= high <= 1:
            raise ValueError(f"need 0 < low <= high <= 1, got low={low!r}, high={high!r}")
        self.low, self.high = low, high

    def __call__(self, img, generator: torch.Generator):
        w, h = img.size
        side = max(1, round(_fraction(generator, self.low, self.high) * min(w, h)))
        return TF.resize(TF.center_crop(img, [side, side]), [h, w], antialias=True)

    def __repr__(self) -> str:
        return f"CentreFractionCrop(low={self.low}, high={self.high})"


class _CropThen(SeededAugmentation):
    def __call__(self, img, generator: torch.Generator | None = None):
        crop, rest = self.transforms
        return rest(crop(img, generator))


def crop_transform(base: Callable, low: float = CROP_RANGE[0],
                   high: float = CROP_RANGE[1]) -> SeededAugmentation:
    """The crop, then the model's own evaluation transform ``base``.

    Use with ``ImageFolderDataset(root, crop_transform(t), augment_seed=seed)``.
    """
    return _CropThen([CentreFractionCrop(low, high), base])


@PASS_MODES.register(name="crop")
def _crop(loaded, folder, cfg, idx, device):
    """URL's crop: centre crop to a per-sample fraction in [0.1, 0.75], resized back (S.5)."""
    ds = folder.with_transform(crop_transform(loaded.transform), cfg.seed)
    out = run_loader(loaded, ds, idx, cfg, device)
    out["crop_fraction"] = crop_fractions(cfg.seed, out["index"])
    return [(0, out)]
