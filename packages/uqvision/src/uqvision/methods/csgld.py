"""Cyclical SGLD as a :class:`~uqvision.training.method.TrainingMethod` entry: cyclical
learning-rate cycles (eq. 16) with Langevin noise and several snapshots late in each cycle, at a
temperature given as a number or as a named rule (:data:`CSGLD_TEMPERATURE_RULES`).

The probabilistic model is Pitfalls' (eqs. 6-9, :mod:`uqvision.methods.bayesian`).

References
----------
.. [1] Ashukha et al. Pitfalls of in-domain uncertainty estimation and ensembling in deep
   learning. ICLR 2020, appendix B.
.. [2] Zhang et al. Cyclical stochastic gradient MCMC for Bayesian deep learning. ICLR 2020.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..training.method import (
    TRAINING_METHODS,
    HParams,
    TrainingMethod,
    TrainState,
    check_fields,
    epochs_to_steps,
    snapshot,
    snapshot_samples,
)
from ..training.schedules import cosine_cycle_lr

__all__ = [
    "CSGLD_TEMPERATURE_RULES",
    "CSGLDHParams",
    "csgld_temperature",
]


def _pytorch_ensembles_temperature(n_train: int, n_batches: int) -> float:
    """``N / n_b**2``: pytorch-ensembles' noise ``sqrt(2 lr) xi / n_b`` read as SGLD."""
    return n_train / n_batches**2


#: Named temperature rules of cyclical SGLD: name -> ``T(n_train, n_batches)``, ``n_batches``
#: the run's gradient steps per epoch. ``pytorch-ensembles``: the noise of Ashukha et al.'s
#: code (``noise_loss(lr, alpha) / len(trainloader)``), the SGLD update at ``T = N / n_b**2``
#: (about ``batch_size**2 / N``; docs/conventions.md#v-2 derives it).
CSGLD_TEMPERATURE_RULES: dict[str, Callable[[int, int], float]] = {
    "pytorch-ensembles": _pytorch_ensembles_temperature,
}


def csgld_temperature(hp: CSGLDHParams, n_train: int, n_batches: int) -> float:
    """The temperature ``T`` of a cSGLD run: ``hp.temperature`` itself when it is a number, else
    its rule in :data:`CSGLD_TEMPERATURE_RULES` at this run's ``N`` and batches per epoch.

    Parameters
    ----------
    hp : CSGLDHParams
    n_train : int
        Training examples ``N``.
    n_batches : int
        Gradient steps per epoch ``n_b``.

    Returns
    -------
    float
        ``T > 0``; the update adds ``sqrt(2 lr T / N)`` standard Gaussian noise per weight.

    Examples
    --------
    >>> round(csgld_temperature(CSGLDHParams(), 50_000, 782), 5)  # CIFAR, batch 64
    0.08176
    >>> csgld_temperature(CSGLDHParams(temperature=1 / 50_000), 50_000, 782)  # Zhang's default
    2e-05
    """
    if isinstance(hp.temperature, str):
        return float(CSGLD_TEMPERATURE_RULES[hp.temperature](int(n_train), int(n_batches)))
    return float(hp.temperature)


@dataclass(frozen=True)
class CSGLDHParams(HParams):
    """Cyclical SGLD: eq. (16) cycles; Langevin noise in the last ``noise_epochs`` of each
    cycle and ``samples_per_cycle`` snapshots ``sample_gap_epochs`` apart ending at the cycle's
    end, all inside the noise phase (``noise_epochs=0``: no noise, snapshots anywhere).

    The update is ``w <- w - lr grad(L_mean + wd |w|^2 / 2) + sqrt(2 lr T / N) xi`` (Zhang et
    al.'s update with ``alpha = 1``: no momentum), i.e. SGLD on the posterior of eq. (7) at
    temperature ``T``. ``temperature`` is a number ``T > 0`` or the name of a rule in
    :data:`CSGLD_TEMPERATURE_RULES` (default ``"pytorch-ensembles"``: ``T = N / n_b**2``, the
    temperature of the paper's code); :func:`csgld_temperature` resolves it, and the run
    records the resolved value as ``state.extra["csgld.temperature"]``. Zhang et al.'s code
    defaults to ``T = 1/50000``; the untempered posterior is ``temperature=1``. Paper: cycle
    50 epochs, lr0 0.5, batch 64, noise in the last 3 epochs, 3 snapshots per cycle (one per
    epoch).
    """

    batch_size: int = 64
    momentum: float = 0.0
    cycles: int = 10
    cycle_epochs: float = 5
    lr0: float = 0.5
    noise_epochs: float = 0.3
    samples_per_cycle: int = 3
    sample_gap_epochs: float = 0.1
    temperature: str | float = "pytorch-ensembles"

    def __post_init__(self):
        super().__post_init__()
        check_fields(self, positive=("cycles", "cycle_epochs", "lr0", "samples_per_cycle",
                                     "sample_gap_epochs"),
                     nonnegative=("noise_epochs",))
        t = self.temperature
        if isinstance(t, str) and t not in CSGLD_TEMPERATURE_RULES:
            try:  # a number given as text (--set temperature=2e-5)
                t = float(t)
            except ValueError:
                t = None
        if not (isinstance(t, str) or (isinstance(t, (int, float)) and not isinstance(t, bool)
                                       and math.isfinite(t) and t > 0)):
            raise ValueError(f"temperature must be a number > 0 or one of "
                             f"{', '.join(CSGLD_TEMPERATURE_RULES)}, got {self.temperature!r}")
        object.__setattr__(self, "temperature", t if isinstance(t, str) else float(t))


def _csgld_phases(hp: CSGLDHParams, spe: int) -> tuple[int, int, int]:
    cycle = epochs_to_steps(hp.cycle_epochs, spe)
    noise, gap = epochs_to_steps(hp.noise_epochs, spe), epochs_to_steps(hp.sample_gap_epochs, spe)
    span = (hp.samples_per_cycle - 1) * gap
    if noise > cycle or span >= cycle or (noise and span >= noise):
        raise ValueError(f"cSGLD phases do not fit a cycle of {cycle} steps: noise {noise} "
                         f"steps, {hp.samples_per_cycle} snapshots {gap} steps apart (all "
                         "within the noise phase)")
    return cycle, noise, gap


def _csgld_after_step(state: TrainState) -> None:
    hp = state.hp
    cycle, noise, gap = _csgld_phases(hp, state.steps_per_epoch)
    t = state.step  # 1-based index of the step just taken
    temperature = csgld_temperature(hp, state.n_train, state.steps_per_epoch)
    if "csgld.temperature" not in state.extra:  # the resolved T, saved with the run
        state.extra["csgld.temperature"] = torch.tensor(temperature, dtype=torch.float64)
    if (t - 1) % cycle >= cycle - noise:
        std = math.sqrt(2 * state.lr * temperature / state.n_train)
        with torch.no_grad():
            for p in state.net.parameters():
                p.add_(torch.randn(p.shape, generator=state.generator, device=p.device,
                                   dtype=p.dtype), alpha=std)
    remaining = -t % cycle  # steps left in this cycle
    if remaining % gap == 0 and remaining // gap < hp.samples_per_cycle:
        snapshot(state)


TRAINING_METHODS.register(TrainingMethod(
    name="csgld",
    description="cyclical SGLD: eq. (16) cycles, noise and several snapshots late in each "
                "cycle (Zhang et al.)",
    hparams=CSGLDHParams, paper=CSGLDHParams(cycle_epochs=50, noise_epochs=3,
                                             sample_gap_epochs=1, cycles=33),
    total_steps=lambda hp, spe: hp.cycles * _csgld_phases(hp, spe)[0],
    lr_at=lambda step, spe, hp: cosine_cycle_lr(
        step + 1, hp.cycles * _csgld_phases(hp, spe)[0], hp.cycles, hp.lr0),
    after_step=_csgld_after_step, samples=snapshot_samples))
