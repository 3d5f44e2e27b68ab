"""MC dropout whose masks depend only on (seed, pass, sample index), never on batching.

Torch's dropout modules in train mode draw one mask for the whole batch from the global RNG, so
a sample's mask depends on its batch (size, position, neighbours) and on how many processes
share the data. :class:`PerSampleDropout` keeps the model in eval mode (dropout modules are the
identity) and applies, through forward hooks on the dropout modules with ``p > 0``, a mask drawn
for each sample from its own ``torch.Generator`` seeded with ``derive_seed(seed, pass, index)``.
Successive dropout calls of one forward pass draw successively from that generator, so a
sample's masks are a pure function of (seed, pass, sample index), identical under any batch
size, torchrun sharding or worker count, on CPU and CUDA alike (the masks are drawn on the CPU),
and the global torch RNG is never read or written.

The masks reproduce torch's arithmetic exactly (``x * keep / (1 - p)``; feature dropout masks
whole channels; alpha dropout keeps SELU's mean and variance); see :func:`apply_dropout_mask`.
Functional dropout (``F.dropout`` inside a ``forward``) is not a module and stays off, as does
every other stochastic layer (stochastic depth): MC dropout is dropout only (Gal &
Ghahramani), with BatchNorm in eval mode.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..data import derive_seed
from ..models import DROPOUT_TYPES

__all__ = ["PerSampleDropout", "apply_dropout_mask", "mask_shape"]

#: Dropout types that drop whole channels of a (N, C, ...) input.
_FEATURE_TYPES = (nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.FeatureAlphaDropout)
_ALPHA_TYPES = (nn.AlphaDropout, nn.FeatureAlphaDropout)
_SELU_ALPHA = 1.7580993408473766  # -SELU's negative saturation value (torch's constant)


def mask_shape(module: nn.Module, x: torch.Tensor) -> tuple[int, ...]:
    """Shape of one sample's mask for ``module`` applied to the batch ``x`` of shape (N, ...).

    Element-wise dropout: ``x.shape[1:]``; feature dropout: ``(C, 1, ..., 1)``.
    """
    if isinstance(module, _FEATURE_TYPES):
        if x.ndim < 3:
            raise ValueError(f"{type(module).__name__} needs a batched (N, C, ...) input for "
                             f"per-sample masks, got shape {tuple(x.shape)}")
        return (x.shape[1],) + (1,) * (x.ndim - 2)
    return tuple(x.shape[1:])


def apply_dropout_mask(module: nn.Module, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``module``'s train-mode output for the given keep mask (bool, broadcastable to ``x``).

    Exactly torch's arithmetic: ``x * (keep / (1 - p))`` for dropout and feature dropout;
    for alpha dropout ``x * (a keep) + a alpha (keep - 1) + a alpha p`` with
    ``a = ((alpha^2 p + 1)(1 - p))^(-1/2)``; ``p = 1`` gives zeros.
    """
    p = float(module.p)
    if p == 1.0:
        return x * torch.zeros((), dtype=x.dtype, device=x.device)
    noise = keep.to(device=x.device, dtype=x.dtype)
    if isinstance(module, _ALPHA_TYPES):
        a = 1.0 / ((_SELU_ALPHA * _SELU_ALPHA * p + 1) * (1 - p)) ** 0.5
        b = noise.add(-1).mul_(_SELU_ALPHA * a).add_(_SELU_ALPHA * a * p)
        return x * noise.mul_(a) + b
    return x * noise.div_(1 - p)


class PerSampleDropout:
    """Context manager: MC-dropout masks drawn per sample, independent of batching.

    Parameters
    ----------
    model : torch.nn.Module
        Put in eval mode while inside; hooks are removed on exit.
    seed : int
        Mask seed; sample ``i`` in pass ``r`` uses ``derive_seed(seed, r, i)``.

    Raises
    ------
    ValueError
        ``model`` has no dropout module with ``p > 0``.

    Examples
    --------
    >>> net = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
    >>> x = torch.ones(4, 3)
    >>> with PerSampleDropout(net, seed=0) as mc, torch.no_grad():
    ...     mc.start_pass(0, [0, 1, 2, 3])
    ...     a = net(x)
    ...     mc.start_pass(0, [2, 3])
    ...     b = net(x[2:])
    >>> bool(torch.equal(a[2:], b))
    True
    """

    def __init__(self, model: nn.Module, seed: int):
        self.model = model
        self.seed = int(seed)
        self.modules = [m for m in model.modules() if isinstance(m, DROPOUT_TYPES) and m.p > 0]
        if not self.modules:
            raise ValueError("model has no dropout module with p > 0; MC dropout is not "
                             "available for it")
        self._generators: list[torch.Generator] | None = None
        self._handles: list = []

    def __enter__(self):
        self.model.eval()
        self._handles = [m.register_forward_hook(self._hook) for m in self.modules]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles, self._generators = [], None

    def start_pass(self, pass_index: int, sample_indices: Sequence[int]) -> None:
        """Seed the masks of the next forward pass: pass ``pass_index`` over these samples
        (dataset indices, in batch order)."""
        self._generators = [torch.Generator().manual_seed(derive_seed(self.seed, pass_index,
                                                                      int(i)))
                            for i in sample_indices]

    def _hook(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        if self._generators is None:
            raise RuntimeError("PerSampleDropout: call start_pass() before each forward pass")
        x = inputs[0]
        if x.shape[0] != len(self._generators):
            raise ValueError(f"{type(module).__name__} got a leading dim of {x.shape[0]} for "
                             f"{len(self._generators)} samples; per-sample MC dropout needs "
                             "batch-first inputs to the dropout modules")
        shape = mask_shape(module, x)
        keep = torch.stack([torch.rand(shape, generator=g) for g in self._generators]) \
            >= module.p  # P(keep) = 1 - p
        return apply_dropout_mask(module, x, keep)
