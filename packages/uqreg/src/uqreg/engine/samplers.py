"""Batch samplers: how an epoch's mini-batches are drawn from the training set, registered in
:data:`SAMPLERS`.

A sampler yields ``(x (B, n, d), y (B, n))`` batches for the networks whose bootstrap keys are
``keys (B,)``; its draws are counter based (:mod:`uqreg.rng`), so a network's batches do not
depend on the other networks of its chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from uqmetrics.metrics.registry import Registry

from .. import rng
from .config import TrainConfig

Batches = Iterator[tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Sampler:
    """A registered batch sampler.

    Attributes
    ----------
    name, description : str
    batches : callable ``(x (B, N, d), y (B, N), keys (B,), epoch, cfg) -> iterator``
    steps : callable ``cfg -> int``
        Optimiser steps per epoch (batches yielded per call).
    rows : callable ``(N, cfg) -> int``
        Rows of one batch (for the memory estimate).
    """

    name: str
    description: str
    batches: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, TrainConfig], Batches]
    steps: Callable[[TrainConfig], int]
    rows: Callable[[int, TrainConfig], int]


def full_batches(x, y, keys, epoch, cfg) -> Batches:
    """One full batch per epoch: ``x (B, N, d)``, ``y (B, N)``."""
    yield x, y


def bootstrap_batches(x, y, keys, epoch, cfg) -> Batches:
    """``cfg.bootstrap_batches`` batches of N/2 drawn with replacement per network and epoch."""
    n = y.shape[1]
    half = max(1, n // 2)
    for step in range(cfg.bootstrap_batches):
        u = rng.uniform(keys, epoch * cfg.bootstrap_batches + step, (half,), dtype=torch.float64, device=y.device)
        idx = torch.clamp((u * n).long(), max=n - 1)  # (B, N/2)
        idx_y = idx if y.ndim == 2 else idx[..., None].expand(-1, -1, y.shape[2])  # targets with row weights
        yield (torch.gather(x, 1, idx[..., None].expand(-1, -1, x.shape[2])), torch.gather(y, 1, idx_y))


SAMPLERS: Registry[Sampler] = Registry("sampler")
SAMPLERS.register(Sampler("full", "the whole training set as one batch per epoch", full_batches,
                          steps=lambda cfg: 1, rows=lambda n, cfg: n))
SAMPLERS.register(Sampler("bootstrap", "bootstrap_batches batches of N/2 drawn with replacement per epoch",
                          bootstrap_batches, steps=lambda cfg: cfg.bootstrap_batches,
                          rows=lambda n, cfg: max(1, n // 2)))

__all__ = ["SAMPLERS", "Sampler", "bootstrap_batches", "full_batches"]
