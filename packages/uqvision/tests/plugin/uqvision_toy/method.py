"""A training method from a plugin: label smoothing (Szegedy et al. 2016, "Rethinking the
Inception architecture for computer vision"), one network per run."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from uqvision.training.method import TrainingMethod, TrainRecipe, TrainState, check_k


@dataclass(frozen=True)
class LabelSmoothingHParams(TrainRecipe):
    """The conventional recipe with a smoothed target: ``smoothing`` of the mass spread evenly
    over the classes."""

    smoothing: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= self.smoothing < 1:
            raise ValueError(f"smoothing must be in [0, 1), got {self.smoothing!r}")


def _loss(state: TrainState, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output, y, label_smoothing=state.hp.smoothing)


def _samples(state: TrainState, k: int, seed: int = 0) -> Iterator[nn.Module]:
    check_k(k, 1, "network")
    state.net.eval()
    yield state.net


METHOD = TrainingMethod(name="toy_label_smoothing",
                        description="label-smoothed cross-entropy, one network per run (plugin)",
                        hparams=LabelSmoothingHParams, samples=_samples, loss=_loss,
                        independent_runs=True)
