"""Ensembles of networks: deep ensembles, MC dropout, snapshot ensembles (SSE) and fast
geometric ensembling (FGE), as :class:`~uqvision.training.method.TrainingMethod` entries.

Epoch counts are the paper's CIFAR values / 10 (``method.paper`` has the paper's own).

References
----------
.. [1] Ashukha et al. Pitfalls of in-domain uncertainty estimation and ensembling in deep
   learning. ICLR 2020, appendix B.
.. [2] Lakshminarayanan, Pritzel, Blundell. Simple and scalable predictive uncertainty
   estimation using deep ensembles. NeurIPS 2017.
.. [3] Gal, Ghahramani. Dropout as a Bayesian approximation. ICML 2016.
.. [4] Huang et al. Snapshot ensembles: train 1, get M for free. ICLR 2017.
.. [5] Garipov et al. Loss surfaces, mode connectivity, and fast ensembling of DNNs.
   NeurIPS 2018.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..models import has_dropout
from ..training.dropout import PerSampleDropout
from ..training.method import (
    TRAINING_METHODS,
    HParams,
    TrainingMethod,
    TrainRecipe,
    TrainState,
    check_fields,
    check_k,
    epochs_to_steps,
    replace_submodule,
    snapshot,
    snapshot_samples,
    stochastic_passes,
)
from ..training.schedules import cosine_cycle_lr, fge_cycle_position, fge_lr, linear_decay_lr

__all__ = ["DropoutHParams", "DropoutLinear", "FGEHParams", "SSEHParams", "ensure_dropout"]


def single_network(state: TrainState, k: int, seed: int = 0) -> Iterator[nn.Module]:
    """The trained network itself: one member per run (``k`` must be 1)."""
    check_k(k, 1, "network (a deep ensemble has one member per run: train one run per seed)")
    state.net.eval()
    yield state.net


TRAINING_METHODS.register(TrainingMethod(
    name="deep_ensemble",
    description="independently trained networks, one per seed (Lakshminarayanan et al.)",
    hparams=TrainRecipe, paper=TrainRecipe(epochs=300), samples=single_network, independent_runs=True))


# -- MC dropout ----------------------------------------------------------------------------
@dataclass(frozen=True)
class DropoutHParams(TrainRecipe):
    """MC dropout: a conventional network trained with dropout and predicted with it on.

    Paper: WideResNet p = 0.3 trained 400 epochs (VGG: p = 0.5 before its fully connected
    layers); otherwise the conventional recipe. ``p`` is used when the network has no dropout
    module of its own (:func:`ensure_dropout`).
    """

    epochs: float = 40
    p: float = 0.3

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.p < 1:
            raise ValueError(f"p must be in (0, 1), got {self.p!r}")


class DropoutLinear(nn.Linear):
    """``nn.Linear`` with dropout on its input (a ``dropout`` child module).

    Its parameters keep ``nn.Linear``'s names, so checkpoints load either way.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 p: float = 0.5, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.dropout = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.dropout(x), self.weight, self.bias)


def ensure_dropout(model: nn.Module, p: float) -> nn.Module:
    """``model`` unchanged if it has a dropout module with p > 0; else its last ``nn.Linear``
    (the classifier) becomes a :class:`DropoutLinear` with rate ``p`` sharing its parameters.
    """
    if has_dropout(model):
        return model
    linears = [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear]
    if not linears:
        raise ValueError("mc_dropout needs a dropout module or an nn.Linear classifier to put "
                         f"dropout before; {type(model).__name__} has neither")
    name, old = linears[-1]
    new = DropoutLinear(old.in_features, old.out_features, old.bias is not None, p=p,
                        device=old.weight.device, dtype=old.weight.dtype)
    new.weight = old.weight
    new.bias = old.bias
    return replace_submodule(model, name, new)


TRAINING_METHODS.register(TrainingMethod(
    name="mc_dropout",
    description="dropout kept on at test time, one pass per sample (Gal & Ghahramani)",
    hparams=DropoutHParams, paper=DropoutHParams(epochs=400),
    wrap_model=lambda model, hp: ensure_dropout(model, hp.p),
    samples=lambda state, k, seed=0: stochastic_passes(state, k, seed, PerSampleDropout),
    stochastic_passes=True))


# -- snapshot ensembles --------------------------------------------------------------------
@dataclass(frozen=True)
class SSEHParams(HParams):
    """Snapshot ensembles: ``cycles`` cosine cycles (eq. 16), a snapshot at each cycle's end.

    Paper (CIFAR): cycle 40 epochs, lr0 0.2, batch 64 (ImageNet: 45 epochs, 0.1, 256).
    """

    batch_size: int = 64
    cycles: int = 10
    cycle_epochs: float = 4
    lr0: float = 0.2

    def __post_init__(self):
        super().__post_init__()
        check_fields(self, positive=("cycles", "cycle_epochs", "lr0"))


def _sse_cycle(hp: SSEHParams, spe: int) -> int:
    return epochs_to_steps(hp.cycle_epochs, spe)


def _sse_after_step(state: TrainState) -> None:
    if state.step % _sse_cycle(state.hp, state.steps_per_epoch) == 0:
        snapshot(state)


TRAINING_METHODS.register(TrainingMethod(
    name="sse",
    description="snapshot ensemble: cosine cycles (eq. 16), one snapshot per cycle (Huang et al.)",
    hparams=SSEHParams, paper=SSEHParams(cycle_epochs=40, cycles=100),
    total_steps=lambda hp, spe: hp.cycles * _sse_cycle(hp, spe),
    lr_at=lambda step, spe, hp: cosine_cycle_lr(step + 1, hp.cycles * _sse_cycle(hp, spe),
                                                hp.cycles, hp.lr0),
    after_step=_sse_after_step, samples=snapshot_samples))


# -- fast geometric ensembling -------------------------------------------------------------
@dataclass(frozen=True)
class FGEHParams(HParams):
    """FGE: pre-training with eq. (10), then cycles of eq. (17), a snapshot at each mid-cycle.

    Paper (PreResNet/WideResNet): pre-training 160 epochs at lr_init 0.1, cycles of 4 epochs
    with alpha1 = 5e-2, alpha2 = 5e-4, batch 128 (VGG: 2 epochs, 1e-2, 5e-4). The snapshot is
    taken where the learning rate is ``alpha2`` (t = 1/2), as Garipov et al.'s code does.
    """

    pretrain_epochs: float = 16
    lr_init: float = 0.1
    cycles: int = 10
    cycle_epochs: float = 0.4
    alpha1: float = 5e-2
    alpha2: float = 5e-4

    def __post_init__(self):
        super().__post_init__()
        check_fields(self, positive=("cycles", "cycle_epochs", "lr_init", "alpha1", "alpha2"),
               nonnegative=("pretrain_epochs",))


def _fge_phases(hp: FGEHParams, spe: int) -> tuple[int, int]:
    pre, cycle = epochs_to_steps(hp.pretrain_epochs, spe), epochs_to_steps(hp.cycle_epochs, spe)
    if cycle < 2:
        raise ValueError(f"an FGE cycle needs >= 2 steps; cycle_epochs={hp.cycle_epochs!r} at "
                         f"{spe} steps per epoch gives {cycle}")
    return pre, cycle


def _fge_total_steps(hp: FGEHParams, spe: int) -> int:
    pre, cycle = _fge_phases(hp, spe)
    return pre + hp.cycles * cycle


def _fge_lr_at(step: int, spe: int, hp: FGEHParams) -> float:
    pre, cycle = _fge_phases(hp, spe)
    if step < pre:
        return linear_decay_lr(step, pre, hp.lr_init)
    return fge_lr(fge_cycle_position(step - pre + 1, cycle), hp.alpha1, hp.alpha2)


def _fge_after_step(state: TrainState) -> None:
    pre, cycle = _fge_phases(state.hp, state.steps_per_epoch)
    i = state.step - pre  # 1-based FGE iteration just done
    if i >= 1 and (i - 1) % cycle + 1 == cycle // 2:
        snapshot(state)


TRAINING_METHODS.register(TrainingMethod(
    name="fge",
    description="fast geometric ensembling: eq. (10) pre-training, eq. (17) cycles "
                "(Garipov et al.)",
    hparams=FGEHParams, paper=FGEHParams(pretrain_epochs=160, cycle_epochs=4, cycles=100),
    total_steps=_fge_total_steps,
    lr_at=_fge_lr_at, after_step=_fge_after_step, samples=snapshot_samples))
