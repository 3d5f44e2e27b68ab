"""The UQ methods under test (R.3), registered by name.

A method is a small declarative :class:`Method`: which stochastic head the network has, how
batches are drawn, whether FGSM inputs are added, and whether a repetition trains an ensemble
of ``members`` networks or a single network predicted by Monte-Carlo passes. The same batched
engine (:mod:`uqreg.engine`) trains all of them; ``blr`` is the exact reference (R.2).

Register a new method with::

    register_method(Method("ens_wide", "ensemble of wider nets", head="deterministic",
                           ensemble=True, overrides={"hidden": (256, 128, 64)}))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
from uqmetrics.registry import Registry

from .diagnostics import collapsed, constant_loss, half_mse
from .engine import HEADS, SAMPLERS, NetworkBatch, TrainConfig, TrainJob, execute, make_plan
from .reference import fit_reference
from .tasks import TaskInstance


@dataclass(frozen=True)
class MethodResult:
    """What a method returns for R repetitions.

    Attributes
    ----------
    prediction, uncertainty : ndarray, shape (R, T)
        Mean and epistemic std at the test inputs.
    train_loss : ndarray, shape (R,)
        Final ½·MSE on the training set (of each network's mean prediction; ensemble members
        averaged).
    collapsed_fraction : ndarray, shape (R,)
        Fraction of the repetition's networks that are collapsed (:mod:`uqreg.diagnostics`).
    """

    prediction: np.ndarray
    uncertainty: np.ndarray
    train_loss: np.ndarray
    collapsed_fraction: np.ndarray

    @classmethod
    def from_networks(cls, prediction, uncertainty, fit: np.ndarray, y: np.ndarray) -> MethodResult:
        """Diagnostics from the networks' fits ``fit (R, M, N)`` to the targets ``y (R, N)``."""
        loss = half_mse(fit, y[:, None, :])  # (R, M)
        bad = collapsed(loss, constant_loss(y)[:, None])
        return cls(prediction, uncertainty, loss.mean(axis=1), bad.mean(axis=1))


@dataclass(frozen=True)
class Method:
    """A registered UQ method.

    Attributes
    ----------
    name, description : str
    head : str
        Stochastic head of the network (:data:`uqreg.engine.HEADS`).
    ensemble : bool
        True: ``members`` networks per repetition, predicted by mean/std over members.
        False: one network per repetition, predicted by mean/std over MC passes.
    sampler : str
        Batch sampler (:data:`uqreg.engine.SAMPLERS`).
    adversarial : bool
        Add FGSM inputs to the loss.
    closed_form : callable, optional
        ``(instance, y (R, N), cfg) -> (mean (R, T), std (R, T), fit (R, N))`` for methods that
        need no training (the reference); ``fit`` is the prediction at the training inputs.
    overrides : dict
        TrainConfig fields this method changes.
    """

    name: str
    description: str
    head: str = "deterministic"
    ensemble: bool = False
    sampler: str = "full"
    adversarial: bool = False
    closed_form: Callable | None = None
    overrides: dict = field(default_factory=dict)

    def __post_init__(self):
        HEADS.lookup(self.head)
        SAMPLERS.lookup(self.sampler)

    def networks(self, repetitions, cfg: TrainConfig) -> NetworkBatch:
        """The (repetition, member) pairs this method trains, repetition-major."""
        reps = np.asarray(repetitions, dtype=np.int64)
        m = cfg.members if self.ensemble else 1
        return NetworkBatch(np.repeat(reps, m), np.tile(np.arange(m, dtype=np.int64), len(reps)))

    def job(self, instance: TaskInstance, y: np.ndarray, repetitions, cfg: TrainConfig, *,
            epochs: int | None = None) -> TrainJob:
        """What this method trains on ``instance`` (the engine's plan decides how).

        Parameters
        ----------
        instance : TaskInstance
        y : ndarray, shape (R, N)
            Training targets of the repetitions ``repetitions`` (row i ↔ repetitions[i]).
        repetitions : array_like of int, shape (R,)
        cfg : TrainConfig
            Before this method's overrides.
        epochs : int, optional
            Defaults to ``cfg.epochs`` or 300·c.
        """
        cfg = replace(cfg, **self.overrides)
        reps = np.asarray(repetitions, dtype=np.int64)
        y_full = np.zeros((int(reps.max()) + 1, y.shape[1]))  # rows indexed by repetition number
        y_full[reps] = y
        return TrainJob(x_train=instance.x_train, y=y_full, x_test=instance.x_test, nets=self.networks(reps, cfg),
                        seed=instance.seed, sigma=instance.sigma, head=self.head, sampler=self.sampler,
                        adversarial=self.adversarial, cfg=cfg, epochs=epochs or cfg.epochs or instance.epochs)

    def run(self, instance: TaskInstance, y: np.ndarray, repetitions, cfg: TrainConfig, *,
            epochs: int | None = None, progress=None) -> MethodResult:
        """Train on every repetition and predict at ``instance.x_test``.

        Parameters are those of :meth:`job`; ``progress`` receives finished epochs.
        """
        y = np.asarray(y, dtype=np.float64)
        r = y.shape[0]
        if self.closed_form is not None:
            mean, std, fit = self.closed_form(instance, y, replace(cfg, **self.overrides))
            return MethodResult.from_networks(mean, std, fit[:, None, :], y)
        job = self.job(instance, y, repetitions, cfg, epochs=epochs)
        result = execute(job, progress=progress)
        fit = result.fit.reshape(r, -1, result.fit.shape[1])  # (R, M, N), M = 1 without an ensemble
        if not self.ensemble:
            return MethodResult.from_networks(result.mean, result.std, fit, y)
        members = result.mean.reshape(r, job.cfg.members, -1)  # (R, M, T)
        return MethodResult.from_networks(members.mean(axis=1), members.std(axis=1, ddof=job.cfg.std_ddof), fit, y)

    def n_epochs_total(self, instance: TaskInstance, cfg: TrainConfig, n_reps: int,
                       epochs: int | None = None) -> int:
        """Epochs the progress bar counts for this method (chunks × epochs)."""
        if self.closed_form is not None:
            return 0
        job = self.job(instance, np.zeros((n_reps, instance.x_train.shape[0])), range(n_reps), cfg, epochs=epochs)
        return job.epochs * make_plan(job).n_chunks


def _blr(instance: TaskInstance, y: np.ndarray, cfg: TrainConfig):
    post = fit_reference(instance.features(instance.x_train), y, instance.sigma)
    mean, std = post.predict(instance.features(instance.x_test))
    return mean, np.broadcast_to(std, mean.shape).copy(), post.predict(instance.features(instance.x_train))[0]


METHODS: Registry[Method] = Registry("method")
register_method = METHODS.register
get_method = METHODS.lookup
list_methods = METHODS.names


for _m in (
    Method("blr", "exact Bayesian linear regression, flat prior (reference, R.2)", closed_form=_blr),
    Method("bd", "Bernoulli (MC) dropout on the last hidden layer", head="bernoulli"),
    Method("cd", "concrete dropout, learned rate (Gal et al. 2017)", head="concrete"),
    Method("vd", "variational Gaussian dropout, local reparameterisation (Kingma et al. 2015)", head="variational"),
    Method("ens", "deep ensemble", ensemble=True),
    Method("ens_adv", "deep ensemble with FGSM adversarial training", ensemble=True, adversarial=True),
    Method("ens_bs", "bootstrap ensemble: two N/2 batches with replacement per epoch", ensemble=True, sampler="bootstrap"),
):
    register_method(_m)
del _m

