"""SWAG (SWA-Gaussian) as a :class:`~uqvision.training.method.TrainingMethod` entry: a
Gaussian over the weights fitted to the SGD iterates at a constant learning rate (diagonal +
low-rank covariance), sampled around their mean.

The probabilistic model is Pitfalls' (eqs. 6-9, :mod:`uqvision.methods.bayesian`).

References
----------
.. [1] Ashukha et al. Pitfalls of in-domain uncertainty estimation and ensembling in deep
   learning. ICLR 2020, appendix B.
.. [2] Maddox et al. A simple baseline for Bayesian uncertainty in deep learning. NeurIPS 2019.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from ..training.method import (
    TRAINING_METHODS,
    HParams,
    TrainingMethod,
    TrainState,
    check_fields,
    check_k,
    epochs_to_steps,
    restoring,
    sample_seed,
    update_batchnorm,
)
from ..training.schedules import linear_decay_lr

__all__ = [
    "SWAGHParams",
    "swag_moments",
]


def _pretrain_then(step: int, pre: int, lr_init: float, after: float) -> float:
    """Eq. (10) over the ``pre`` pre-training steps, then ``after``."""
    return linear_decay_lr(step, pre, lr_init) if step < pre else after


@dataclass(frozen=True)
class SWAGHParams(HParams):
    """SWAG: pre-training with eq. (10), then SGD at a constant ``swag_lr`` collecting the
    first two moments and the last ``rank`` deviations every ``collect_epochs``.

    Samples are ``mean + sqrt(scale) (sqrt(var) z1 + D^T z2 / sqrt(K - 1))`` (the SWAG
    reference's ``sample(scale=0.5, cov=True)``; ``low_rank=False``: SWAG-diagonal). Paper:
    pre-training 160 epochs at lr_init 0.1 (Table 1), then lr 1e-2, rank 20, one collection
    per epoch (SWAG's 300-epoch budget: 140 collections). Stand-in default: pre-training
    epochs / 10, but ``swag_epochs`` = 20, not 140 / 10 = 14: one collection per epoch is kept,
    and 20 collections fill the rank-20 deviation matrix (14 would leave it rank 14).
    ``bn_update``: recompute BatchNorm statistics of each sample on the training data, as the
    reference does.
    """

    pretrain_epochs: float = 16
    lr_init: float = 0.1
    swag_epochs: float = 20
    swag_lr: float = 1e-2
    collect_epochs: float = 1
    rank: int = 20
    scale: float = 0.5
    low_rank: bool = True
    bn_update: bool = True

    def __post_init__(self):
        super().__post_init__()
        check_fields(self, positive=("lr_init", "swag_epochs", "swag_lr", "collect_epochs",
                                     "rank"),
                     nonnegative=("pretrain_epochs", "scale"))


def _swag_phases(hp: SWAGHParams, spe: int) -> tuple[int, int, int]:
    return (epochs_to_steps(hp.pretrain_epochs, spe), epochs_to_steps(hp.swag_epochs, spe),
            epochs_to_steps(hp.collect_epochs, spe))


def _swag_collect(state: TrainState) -> None:
    """Welford update of the mean and the sum of squared deviations (float64, CPU); keep the
    last ``rank`` deviations ``w - mean`` (SWAG's ``cov_mat_sqrt``, float32)."""
    w = parameters_to_vector(state.net.parameters()).detach().to("cpu", torch.float64)
    ex = state.extra
    n = int(ex["swag.n"]) + 1 if "swag.n" in ex else 1
    mean = ex.get("swag.mean", torch.zeros_like(w))
    delta = w - mean
    mean = mean + delta / n
    ex["swag.m2"] = ex.get("swag.m2", torch.zeros_like(w)) + delta * (w - mean)
    ex["swag.mean"], ex["swag.n"] = mean, torch.tensor(n)
    dev = (w - mean).float()[None]
    ex["swag.dev"] = torch.cat([ex["swag.dev"], dev])[-state.hp.rank:] if "swag.dev" in ex \
        else dev


def _swag_after_step(state: TrainState) -> None:
    pre, _, every = _swag_phases(state.hp, state.steps_per_epoch)
    done = state.step - pre
    if done >= 1 and done % every == 0:
        _swag_collect(state)


def swag_moments(state: TrainState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SWAG's fit: ``mean`` (P,) and ``var`` (P,) over the collected iterates (population
    variance, float64) and the deviation matrix ``D`` (K, P), parameters in
    ``parameters_to_vector`` order."""
    if "swag.n" not in state.extra:
        raise ValueError("SWAG has collected no iterates: swag_epochs must cover at least one "
                         "collection (collect_epochs)")
    ex = state.extra
    return ex["swag.mean"], ex["swag.m2"] / int(ex["swag.n"]), ex["swag.dev"]


def _swag_samples(state: TrainState, k: int, seed: int = 0) -> Iterator[nn.Module]:
    check_k(k)
    hp = state.hp
    mean, var, dev = swag_moments(state)
    params = list(state.net.parameters())
    with restoring(state.net) as net:
        for i in range(k):
            g = torch.Generator().manual_seed(sample_seed(seed, i))
            z = var.clamp_min(1e-30).sqrt() * torch.randn(mean.shape, generator=g,
                                                          dtype=torch.float64)
            if hp.low_rank and len(dev) > 1:
                z += dev.double().T @ torch.randn(len(dev), generator=g, dtype=torch.float64) \
                    / math.sqrt(len(dev) - 1)
            w = mean + math.sqrt(hp.scale) * z
            vector_to_parameters(w.to(params[0].device, params[0].dtype), params)
            update_batchnorm(state, hp.bn_update)
            yield net


TRAINING_METHODS.register(TrainingMethod(
    name="swag",
    description="SWA-Gaussian: diagonal + rank-20 deviations around the SWA mean "
                "(Maddox et al.)",
    hparams=SWAGHParams, paper=SWAGHParams(pretrain_epochs=160, swag_epochs=140),
    total_steps=lambda hp, spe: sum(_swag_phases(hp, spe)[:2]),
    lr_at=lambda step, spe, hp: _pretrain_then(step, _swag_phases(hp, spe)[0], hp.lr_init,
                                               hp.swag_lr),
    after_step=_swag_after_step, samples=_swag_samples))
