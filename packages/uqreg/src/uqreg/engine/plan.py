"""The execution plan: the ONE owner of how a method's networks are run.

A :class:`~uqreg.methods.Method` only declares what to train (a :class:`TrainJob`); this module
decides how: the memory one network needs, the chunk boundaries of the network axis, how many
chunks run at once, and the torch threads of each chunk.

Results must not depend on how they were executed (a study, a Dask sweep on any cluster, any
``--max-memory``), so:

* chunk boundaries come from the configuration only (``chunk_networks`` and the memory budget,
  never the number of cores, workers or threads);
* every chunk's kernels run with ONE torch intra-op thread, everywhere; concurrency is only
  across chunks (threads, each single-threaded);
* a network's arithmetic does not depend on the other networks of its chunk nor on its place
  among them: the engine's kernels are per network, and every network's block of every operand
  of a product starts at a 64-byte boundary (:func:`~uqreg.engine.network.aligned_blocks`;
  MKL rounds differently with an operand's 16-byte alignment). Tests check the predictions bit
  for bit in float32, also under forced instruction sets;
* no chunk has ONE network: a chunk of one is computed as two copies of its network (the copy
  is dropped). BLAS libraries treat a batched product of batch size 1 as a plain product and
  may pick another kernel for it than for the same product in a larger batch (measured on
  MKL: a one-row product of a batch of one rounds differently from the same product in a batch
  of 40, while batches of 2 and 40 agree), so a network that ended up alone in its chunk (the
  last network of a job, or ``chunk_networks=1``) would round differently. The memory budget
  must therefore hold two networks.

The chunk and the concurrent chunks are fixed by the configuration (``chunk_networks``, 64
by default: tuned on 2 CPU cores) or, with ``"auto"``, measured on the device once and recorded
(:mod:`uqreg.engine.autoplan`; the command line's default on CUDA). On CUDA, concurrent chunks
run on one CUDA stream each (:func:`map_chunks`): the same kernels on the same shapes, so the
same bits as one after another.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, replace

import numpy as np

from .chunks import (
    MIN_BATCH,
    available_cores,
    chunk_size,
    map_chunks,
    physical_memory,
    single_threaded,
)
from .config import TrainConfig, is_auto
from .heads import HEADS
from .network import NetworkBatch
from .objectives import OBJECTIVES
from .samplers import SAMPLERS
from .train import predict_batched, predict_decomposed, train_batched


@dataclass(frozen=True, eq=False)
class TrainJob:
    """What a method declares: train ``nets`` on one task instance and predict at its test inputs.

    Attributes
    ----------
    x_train : ndarray, shape (N, d)
    y : ndarray, shape (R, N)
        Targets indexed by repetition number (network i uses row ``nets.repetition[i]``).
    x_test : ndarray, shape (T, d)
    nets : NetworkBatch
    seed : int
        Task seed.
    sigma : float
        The task's noise std.
    head, sampler : str
        Registered head and sampler.
    adversarial : bool
    cfg : TrainConfig
    epochs : int
    x_cal : ndarray, shape (R, C, d), optional
        Calibration inputs indexed by repetition number (network i predicts at
        ``x_cal[nets.repetition[i]]``), for split-conformal methods; None: no calibration.
    objective : str
        Training objective (:data:`~uqreg.engine.objectives.OBJECTIVES`): ``"mse"``, or
        ``"gaussian_nll"`` for mean–variance networks.
    noise_weights : ndarray, shape (N,), optional
        Weights of the training points' squared errors (σ²/σ(x_n)², the known-noise heads on a
        heteroscedastic task); None: unweighted.
    alpha : float, optional
        The α of an objective that uses one (``"pinball"``: quantile networks at the levels
        α/2, 1 − α/2); None for the others.
    """

    x_train: np.ndarray
    y: np.ndarray
    x_test: np.ndarray
    nets: NetworkBatch
    seed: int
    sigma: float
    head: str
    sampler: str
    adversarial: bool
    cfg: TrainConfig
    epochs: int
    x_cal: np.ndarray | None = None
    objective: str = "mse"
    noise_weights: np.ndarray | None = None
    alpha: float | None = None


def bytes_per_network(n_rows: int, n_test: int, input_dim: int, cfg: TrainConfig, *, adversarial: bool,
                      mc: bool, outputs: int = 1) -> int:
    """Upper estimate of the memory one network needs during training and prediction.

    Parameters: weights, gradients and two Adam moments; activations saved for backward (input,
    pre-activation and activation of every layer, twice under FGSM plus the input gradient);
    prediction activations and, for MC heads, the (S, T) passes (of each of the ``outputs``:
    2 for a mean–variance network, whose variance output layer adds k + 1 parameters).
    """
    widths = (input_dim, *cfg.hidden, 1)
    n_params = sum(a * b + b for a, b in itertools.pairwise(widths)) + (outputs - 1) * (widths[-2] + 1)
    itemsize = 4 if cfg.dtype == "float32" else 8
    act = n_rows * (2 * input_dim + 3 * sum(widths[1:]) + 3 * (outputs - 1))
    train = 4 * n_params + act * (2.2 if adversarial else 1.0) * 1.5
    predict = n_test * (input_dim + 2 * sum(widths[1:])) + (2 * outputs * cfg.mc_samples * n_test if mc else 0)
    return int(itemsize * (train + predict)) + 4096


def job_bytes_per_network(n_train: int, n_test: int, input_dim: int, cfg: TrainConfig, *, head: str,
                          sampler: str, adversarial: bool, objective: str = "mse") -> int:
    """:func:`bytes_per_network` of a method's networks: the rows of its sampler's batches, and
    predictions at the test AND training inputs (the latter for the collapse diagnostic)."""
    rows = SAMPLERS.lookup(sampler).rows(n_train, cfg)
    return bytes_per_network(rows, n_test + n_train, input_dim, cfg, adversarial=adversarial,
                             mc=HEADS.lookup(head).stochastic, outputs=OBJECTIVES.lookup(objective).outputs)


def padded(chunk: NetworkBatch) -> NetworkBatch:
    """``chunk``, its last network repeated up to :data:`MIN_BATCH` networks (the copies are the
    same network: its keys come from its repetition and member)."""
    missing = MIN_BATCH - len(chunk)
    if missing <= 0:
        return chunk
    return NetworkBatch(np.concatenate([chunk.repetition, np.repeat(chunk.repetition[-1:], missing)]),
                        np.concatenate([chunk.member, np.repeat(chunk.member[-1:], missing)]))


@dataclass(frozen=True)
class ExecutionPlan:
    """How a job runs.

    Attributes
    ----------
    per_network : int
        Bytes one network needs.
    chunk : int
        Networks per chunk (from the configuration, or measured for ``"auto"``).
    n_chunks : int
    workers : int
        Chunks run at once (each with one torch thread; on CUDA each on its own stream);
        bounded by the cores (or ``cfg.parallel_chunks``; 1 on CUDA) and by the memory budget
        they share.
    source : str
        Where chunk and workers come from: ``"fixed"`` (the configuration), ``"measured"`` (by
        this process) or ``"recorded"`` (an earlier measurement: :mod:`uqreg.engine.autoplan`).
    """

    per_network: int
    chunk: int
    n_chunks: int
    workers: int
    source: str = "fixed"

    def chunks(self, nets: NetworkBatch) -> list[NetworkBatch]:
        return list(nets.chunks(self.chunk))

    def to_dict(self) -> dict:
        """The plan as a JSON-able dict (execution only: no result depends on it)."""
        return asdict(self)


#: The plans :func:`make_plan` measured or read from the record inside :func:`recording_plans`.
_recorded: ContextVar[list | None] = ContextVar("uqreg_engine_plans", default=None)


@contextmanager
def recording_plans() -> Iterator[list[dict]]:
    """Collect, into the yielded list, every measured plan (``"auto"``) :func:`make_plan` gives
    inside the block, once per shape class: ``{"shape": ..., "device": ..., "chunk": ...,
    "workers": ...}`` (what a study records in its ``engine_plans`` attr)."""
    plans: list[dict] = []
    token = _recorded.set(plans)
    try:
        yield plans
    finally:
        _recorded.reset(token)


def make_plan(job: TrainJob) -> ExecutionPlan:
    """The execution plan of ``job`` (raises ValueError if one network exceeds the budget).
    ``"auto"`` settings are measured once per device and shape class, or read from the record
    (:func:`uqreg.engine.autoplan.resolve`)."""
    cfg = job.cfg
    n, d = job.x_train.shape
    per_net = job_bytes_per_network(n, job.x_test.shape[0], d, cfg, head=job.head, sampler=job.sampler,
                                    adversarial=job.adversarial, objective=job.objective)
    source = "fixed"
    workers = cfg.parallel_chunks
    if is_auto(cfg.chunk_networks) or is_auto(workers):
        from . import autoplan

        chunk_size(per_net, cfg)  # one network above the budget: the message before any measurement
        measured = autoplan.resolve(job, per_net)
        source = measured.source
        if is_auto(cfg.chunk_networks):
            cfg = replace(cfg, chunk_networks=measured.chunk)
        if is_auto(workers):
            workers = measured.workers
        seen = _recorded.get()
        if seen is not None:
            entry = {"shape": autoplan.shape_class(job), "device": measured.device, "chunk": cfg.chunk_networks,
                     "workers": workers}
            if entry not in seen:
                seen.append(entry)
    chunk = chunk_size(per_net, cfg)
    n_chunks = -(-len(job.nets) // chunk)
    if workers is None:
        workers = 1 if cfg.device.startswith("cuda") else available_cores()
    fit = max(1, int(cfg.memory_budget() // (max(chunk, MIN_BATCH) * per_net)))  # concurrent chunks share the budget
    return ExecutionPlan(per_net, chunk, n_chunks, max(1, min(workers, fit, n_chunks)), source)


@dataclass(frozen=True)
class JobResult:
    """Per-network predictions of a job, in ``job.nets`` order.

    Attributes
    ----------
    mean : ndarray, shape (B, T)
        Output (deterministic head) or mean over the MC passes, at the test inputs.
    std : ndarray, shape (B, T) or None
        Std over the MC passes (stochastic heads).
    fit : ndarray, shape (B, N)
        The same mean prediction at the training inputs.
    cal_mean, cal_std : ndarray, shape (B, C), optional
        Mean (and MC std) at each network's calibration inputs (``job.x_cal``); None without.
    aleatoric, cal_aleatoric : ndarray, shape (B, T) and (B, C), optional
        A mean–variance network's predicted σ²(x) (mean over its MC passes) at the test and
        calibration inputs; a quantile network's upper quantile ``q_hi`` likewise (``mean`` and
        ``cal_mean`` are then its lower quantile ``q_lo``, and ``fit`` the midpoint
        (q_lo + q_hi)/2); None for mean-only networks (and without calibration inputs).
    """

    mean: np.ndarray
    std: np.ndarray | None
    fit: np.ndarray
    cal_mean: np.ndarray | None = None
    cal_std: np.ndarray | None = None
    aleatoric: np.ndarray | None = None
    cal_aleatoric: np.ndarray | None = None


def execute(job: TrainJob, plan: ExecutionPlan | None = None, *,
            progress: Callable[[int], None] | None = None) -> JobResult:
    """Train and predict every network of ``job`` by its plan; ``progress`` receives finished
    epochs (one call per chunk and epoch)."""
    plan = make_plan(job) if plan is None else plan

    def run(chunk: NetworkBatch):
        n = len(chunk)
        nets = padded(chunk)
        model = train_batched(job.x_train, job.y, nets, seed=job.seed, head=job.head, sampler=job.sampler,
                              adversarial=job.adversarial, cfg=job.cfg, epochs=job.epochs, sigma=job.sigma,
                              progress=progress, objective=job.objective, noise_weights=job.noise_weights,
                              alpha=job.alpha)
        mean, std, ale = predict_decomposed(model, job.x_test, nets, seed=job.seed, cfg=job.cfg)
        if model.objective.uses_alpha:  # a quantile network: its point prediction is the midpoint
            low, _, high = predict_decomposed(model, job.x_train, nets, seed=job.seed, cfg=job.cfg)
            fit = 0.5 * (low + high)
        else:
            fit = predict_batched(model, job.x_train, nets, seed=job.seed, cfg=job.cfg)[0]
        cal = (None, None, None)
        if job.x_cal is not None:
            cal = predict_decomposed(model, job.x_cal[nets.repetition], nets, seed=job.seed, cfg=job.cfg,
                                     purpose="mc_calibration")

        def first(a):
            return None if a is None else a[:n]

        return first(mean), first(std), first(fit), first(cal[0]), first(cal[1]), first(ale), first(cal[2])

    with single_threaded():
        results = map_chunks(run, plan.chunks(job.nets), plan.workers, job.cfg.device)

    def cat(i):
        return None if results[0][i] is None else np.concatenate([r[i] for r in results])

    return JobResult(*(cat(i) for i in range(7)))


__all__ = [
    "MIN_BATCH",
    "ExecutionPlan",
    "JobResult",
    "TrainJob",
    "available_cores",
    "bytes_per_network",
    "chunk_size",
    "execute",
    "job_bytes_per_network",
    "make_plan",
    "map_chunks",
    "padded",
    "physical_memory",
    "recording_plans",
    "single_threaded",
]
