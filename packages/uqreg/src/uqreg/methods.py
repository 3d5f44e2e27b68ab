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

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from .engine import (
    HEADS,
    SAMPLERS,
    NetworkBatch,
    TrainConfig,
    bytes_per_network,
    chunk_size,
    predict_batched,
    torch_threads,
    train_batched,
)
from .reference import reference_prediction
from .registry import Registry
from .tasks import TaskInstance


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
        ``(instance, y (R, N), cfg) -> (mean (R, T), std (R, T))`` for methods that need no
        training (the reference).
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
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {sorted(HEADS)}, got {self.head!r}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {sorted(SAMPLERS)}, got {self.sampler!r}")

    def networks(self, repetitions, cfg: TrainConfig) -> NetworkBatch:
        """The (repetition, member) pairs this method trains, repetition-major."""
        reps = np.asarray(repetitions, dtype=np.int64)
        m = cfg.members if self.ensemble else 1
        return NetworkBatch(np.repeat(reps, m), np.tile(np.arange(m, dtype=np.int64), len(reps)))

    def run(self, instance: TaskInstance, y: np.ndarray, repetitions, cfg: TrainConfig, *,
            epochs: int | None = None, progress=None) -> tuple[np.ndarray, np.ndarray]:
        """Train on every repetition and predict at ``instance.x_test``.

        Parameters
        ----------
        instance : TaskInstance
        y : ndarray, shape (R, N)
            Training targets of the repetitions ``repetitions`` (row i ↔ repetitions[i]).
        repetitions : array_like of int, shape (R,)
        cfg : TrainConfig
        epochs : int, optional
            Defaults to ``cfg.epochs`` or 300·c.

        Returns
        -------
        prediction, uncertainty : ndarray, shape (R, T)
        """
        cfg = replace(cfg, **self.overrides)
        reps = np.asarray(repetitions, dtype=np.int64)
        if self.closed_form is not None:
            return self.closed_form(instance, y, cfg)
        epochs = epochs or cfg.epochs or instance.epochs
        # y rows are indexed by repetition number inside the engine
        y_full = np.zeros((int(reps.max()) + 1, y.shape[1]))
        y_full[reps] = y
        nets = self.networks(reps, cfg)
        chunks = list(nets.chunks(self.chunk(instance, cfg, len(nets))))

        def train_predict(chunk: NetworkBatch):
            model = train_batched(instance.x_train, y_full, chunk, seed=instance.seed, head=self.head,
                                  sampler=self.sampler, adversarial=self.adversarial, cfg=cfg,
                                  epochs=epochs, progress=progress)
            return predict_batched(model, instance.x_test, chunk, seed=instance.seed, cfg=cfg)

        threads = min(cfg.threads, len(chunks))
        if threads > 1:  # concurrent chunks, single-threaded kernels (ATen ops release the GIL)
            with torch_threads(1), ThreadPoolExecutor(threads) as pool:
                results = list(pool.map(train_predict, chunks))
        else:
            results = [train_predict(c) for c in chunks]
        means = [r[0] for r in results]
        stds = [r[1] for r in results]
        mean = np.concatenate(means)  # (R·M, T) or (R, T)
        if not self.ensemble:
            return mean, np.concatenate(stds)
        mean = mean.reshape(len(reps), cfg.members, -1)
        return mean.mean(axis=1), mean.std(axis=1, ddof=cfg.std_ddof)

    def chunk(self, instance: TaskInstance, cfg: TrainConfig, n_networks: int) -> int:
        """Networks per chunk: within the memory budget, and split over ``cfg.threads``."""
        n, d = instance.x_train.shape
        rows = n // 2 if self.sampler == "bootstrap" else n
        per_net = bytes_per_network(rows, instance.x_test.shape[0], d, cfg,
                                    adversarial=self.adversarial, mc=not self.ensemble)
        return min(chunk_size(per_net, cfg), -(-n_networks // cfg.threads))

    def n_epochs_total(self, instance: TaskInstance, cfg: TrainConfig, n_reps: int,
                       epochs: int | None = None) -> int:
        """Epochs the progress bar counts for this method (chunks × epochs)."""
        if self.closed_form is not None:
            return 0
        cfg = replace(cfg, **self.overrides)
        epochs = epochs or cfg.epochs or instance.epochs
        n_nets = n_reps * (cfg.members if self.ensemble else 1)
        return epochs * -(-n_nets // self.chunk(instance, cfg, n_nets))


def _blr(instance: TaskInstance, y: np.ndarray, cfg: TrainConfig):
    mean, std = reference_prediction(instance, y)
    return mean, np.broadcast_to(std, mean.shape).copy()


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

