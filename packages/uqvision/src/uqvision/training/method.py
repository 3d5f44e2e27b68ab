"""The training-method registry: each V.2 method is one :class:`TrainingMethod` of hooks.

One training loop drives every method. The loop owns data, devices, checkpoints and timing;
a method owns what differs between methods: the model wrapper, the optimiser, the learning
rate at each step, the loss, what happens after a step (snapshots, SWAG moments, SGLD noise),
the post-training fit (K-FAC Laplace) and how K prediction samples are drawn. How a loop calls
it (all of it; the orchestration lives in :meth:`TrainingMethod.start`, :meth:`~TrainingMethod.step`,
:meth:`~TrainingMethod.end_epoch` and :meth:`~TrainingMethod.finish` so no loop re-implements it)::

    method = TRAINING_METHODS.lookup(name)
    hp = method.hparams_from(["cycles=5", "lr0=0.1"])          # --set key=value
    state = method.start(model, hp, n_train=len(ds), steps_per_epoch=len(loader), seed=seed)
    while not state.done:                                      # step-bounded, not epoch-bounded
        for x, y, *_ in loader:
            method.step(state, x.to(dev), y.to(dev))           # lr, forward, loss, update, hooks
            if state.done:
                break
        method.end_epoch(state)
    method.finish(state, train_loader, val_loader)             # post-fit; model in eval mode
    for i, net in enumerate(method.samples(state, k, seed)):  # K prediction networks
        ...                                                    # run net over the test set now

Checkpoints: save ``state.net.state_dict()`` (the wrapped model's weights) and
:func:`export_state` beside it (snapshots with their step/epoch/wall time, SWAG moments, K-FAC
factors). To predict in another process, rebuild the base model and call
``method.restore(base, hp, tensors, meta)`` (it re-applies ``wrap_model``), then load the
checkpoint into ``state.net`` and set ``state.bn_loader`` for methods that recompute
BatchNorm statistics. For DistributedDataParallel, wrap after :meth:`TrainingMethod.start`
(``state.model = DDP(state.model)``) with the same ``seed`` on every rank: the hooks work on
``state.net`` (the module inside), and the method noise drawn from ``state.generator`` is the
same everywhere.

Methods with ``independent_runs`` (deep ensembles) yield one network per run: train one run
per seed. Methods with ``stochastic_passes`` (MC dropout, VI) yield one network whose every
forward pass is a fresh draw, so a sample is one pass: a :class:`StochasticPass` whose noise is
drawn per example from its own generator, seeded by (sample seed, pass, example id), so a
pass over a data set does not depend on batching or sharding and never touches the global
torch RNG (call it as ``net(x, sample_ids)`` with the examples' data-set indices; without
them the rows of ``x`` are examples ``0..B-1``).

Under ``DistributedDataParallel`` with uneven shards the loop sets ``state.loss_scale`` to
``world_size * n_local / n_global`` for each batch, so that DDP's average of the ranks'
gradients is the gradient of the global batch's mean loss.

Hyper-parameters are frozen dataclasses with the stand-in defaults (every epoch count is the
paper's CIFAR PreResNet-110 value / 10; learning rates, batch sizes, momenta and weight decays
are the paper's); ``method.paper`` holds the paper's own values. Record
``dataclasses.asdict(hp)`` in results.

The module is one concern in more than 600 lines, the contract between the one loop and every
method: :class:`TrainingMethod` (its hooks and their orchestration, about 180 lines), the
:class:`TrainState`, hyper-parameter, recipe and optimiser classes those hooks take, the state
a checkpoint carries (:func:`export_state`, ``restore``) and the helpers the methods' hooks are
written with (snapshots, stochastic passes, BatchNorm updates), each defined against the others.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from uqmetrics.metrics.registry import Registry

from ..data import derive_seed
from .schedules import SCHEDULES

__all__ = [
    "OPTIMIZERS",
    "TRAINING_METHODS",
    "HParams",
    "OptimizerChain",
    "Snapshot",
    "StochasticPass",
    "TrainRecipe",
    "TrainState",
    "TrainingMethod",
    "check_fields",
    "epochs_to_steps",
    "export_state",
    "recipe_lr_at",
    "recipe_total_steps",
    "replace_submodule",
    "restoring",
    "snapshot",
    "snapshot_samples",
    "stochastic_passes",
    "update_batchnorm",
]

TRAINING_METHODS: Registry = Registry("training method", group="uqvision.training_methods",
                                      fill="uqvision:load_registries")
"""Every training method, in registration order (:class:`TrainingMethod` entries; plugins:
entry-point group ``uqvision.training_methods``, checked to be :class:`TrainingMethod`)."""

OPTIMIZERS: Registry = Registry("optimizer")
"""``f(param_groups, hp) -> torch.optim.Optimizer``; the learning rate is set at every step."""


@OPTIMIZERS.register(name="sgd")
def _sgd(params, hp) -> torch.optim.Optimizer:
    """SGD with hp.momentum and hp.weight_decay (Pitfalls' recipes: momentum 0.9)."""
    return torch.optim.SGD(params, lr=0.0, momentum=hp.momentum, weight_decay=hp.weight_decay)


@OPTIMIZERS.register(name="adamw")
def _adamw(params, hp) -> torch.optim.Optimizer:
    """AdamW with decoupled hp.weight_decay (uqvision's former recipe, with onecycle)."""
    return torch.optim.AdamW(params, lr=0.0, weight_decay=hp.weight_decay)


def check_fields(hp, positive=(), nonnegative=(), choices=None) -> None:
    """``ValueError`` naming the first field of ``hp`` that is not a finite number > 0 / >= 0
    or a registered choice (``choices``: field name -> Registry)."""
    for name in positive:
        if not getattr(hp, name) > 0:
            raise ValueError(f"{name} must be > 0, got {getattr(hp, name)!r}")
    for name in nonnegative:
        if not getattr(hp, name) >= 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(hp, name)!r}")
    for name in (*positive, *nonnegative):  # inf: a network of NaNs, or a run without end
        if not math.isfinite(getattr(hp, name)):
            raise ValueError(f"{name} must be a finite number, got {getattr(hp, name)!r}")
    for name, registry in (choices or {}).items():
        registry.lookup(getattr(hp, name))


@dataclass(frozen=True)
class HParams:
    """What every method has: the SGD recipe's batch size, weight decay and momentum.

    The weight decay ``wd`` is also the prior: ``p(w) = N(0, (N wd)^-1 I)`` (Pitfalls eq. 9),
    which VI, K-FAC Laplace and cyclical SGLD use explicitly.
    """

    batch_size: int = 128
    weight_decay: float = 3e-4
    momentum: float = 0.9

    def __post_init__(self):
        check_fields(self, positive=("batch_size",), nonnegative=("weight_decay", "momentum"))


@dataclass(frozen=True)
class TrainRecipe(HParams):
    """A conventional network (Pitfalls Table 1, PreResNet-110 on CIFAR; epochs / 10).

    ``optimizer`` names an entry of :data:`OPTIMIZERS`, ``schedule`` one of
    :data:`uqvision.training.schedules.SCHEDULES` (``linear_decay`` = eq. 10). Paper: 300
    epochs, lr_init 0.1, wd 3e-4, batch 128, momentum 0.9. ``optimizer="adamw",
    schedule="onecycle", lr_init=3e-3, weight_decay=0.05`` is uqvision's former recipe.
    """

    epochs: float = 30
    lr_init: float = 0.1
    optimizer: str = "sgd"
    schedule: str = "linear_decay"

    def __post_init__(self):
        super().__post_init__()
        # epochs = 0: a network started from a checkpoint is used as it is (K-FAC Laplace
        # around a conventionally trained network)
        check_fields(self, positive=("lr_init",), nonnegative=("epochs",),
                     choices={"optimizer": OPTIMIZERS, "schedule": SCHEDULES})


def epochs_to_steps(epochs: float, steps_per_epoch: int) -> int:
    """Gradient steps in ``epochs`` epochs (fractional allowed): 0 for 0, else at least 1."""
    if epochs < 0:
        raise ValueError(f"epochs must be >= 0, got {epochs!r}")
    return 0 if epochs == 0 else max(1, round(epochs * steps_per_epoch))


def recipe_total_steps(hp: TrainRecipe, steps_per_epoch: int) -> int:
    """Steps of a :class:`TrainRecipe` run: ``hp.epochs`` epochs."""
    return epochs_to_steps(hp.epochs, steps_per_epoch)


def recipe_lr_at(step: int, steps_per_epoch: int, hp: TrainRecipe) -> float:
    """``SCHEDULES[hp.schedule]`` over the run, peaking at ``hp.lr_init``."""
    return SCHEDULES.lookup(hp.schedule)(step, recipe_total_steps(hp, steps_per_epoch),
                                         steps_per_epoch, hp.lr_init)


class OptimizerChain:
    """Several optimisers stepped as one (VI: SGD for the means, Adam for the log-sigmas).

    ``param_groups`` is the concatenation of theirs, so setting a group's ``lr`` reaches the
    optimiser that owns it; a group with ``fixed_lr=True`` keeps its own learning rate.
    """

    def __init__(self, *optimizers: torch.optim.Optimizer):
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for o in self.optimizers for g in o.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def state_dict(self) -> dict:
        return {str(i): o.state_dict() for i, o in enumerate(self.optimizers)}

    def load_state_dict(self, state: dict) -> None:
        for i, o in enumerate(self.optimizers):
            o.load_state_dict(state[str(i)])


def default_optimizer(model: nn.Module, hp) -> torch.optim.Optimizer:
    """``OPTIMIZERS[hp.optimizer]`` (SGD when the hyper-parameters have no ``optimizer``)."""
    return OPTIMIZERS.lookup(getattr(hp, "optimizer", "sgd"))(model.parameters(), hp)


@dataclass
class Snapshot:
    """A copy of the network's weights taken during training (CPU tensors).

    ``step``, ``epoch`` and ``wall_s`` (seconds since :meth:`TrainingMethod.start`) say what it
    cost; ``lr`` is the learning rate of its last step.
    """

    weights: dict[str, torch.Tensor]
    step: int
    epoch: float
    lr: float
    wall_s: float = math.nan


@dataclass(eq=False)
class TrainState:
    """Everything a method's hooks see while one network trains (built by
    :meth:`TrainingMethod.start`).

    Attributes
    ----------
    model : nn.Module
        The wrapped model being trained; may be replaced by a ``DistributedDataParallel``
        wrapper (hooks use :attr:`net`, the module inside).
    nll : callable
        ``nll(output, y, reduction="mean")``, the negative log-likelihood of a batch with
        torch's ``reduction`` convention (``"mean"``, ``"sum"``, ``"none"``: per example);
        default ``F.cross_entropy`` (tests use a Gaussian one). Every hook uses it, so the
        likelihood is the same in training, the K-FAC fit and the scale tuning.
    step, epoch : int
        Gradient steps and epochs done; ``lr`` the learning rate of the last step.
    generator : torch.Generator
        The method's own noise during training (SGLD), on the model's device.
    snapshots : list of Snapshot
    extra : dict of str to Tensor
        A method's fitted quantities (SWAG moments, K-FAC factors, the tuned scale); flat, so
        :func:`export_state` can save it.
    bn_loader : iterable, optional
        Training batches for recomputing BatchNorm statistics of sampled weights (SWAG,
        Laplace); :meth:`TrainingMethod.finish` sets it.
    scaler, autocast
        Optional AMP: a ``torch.amp.GradScaler`` and a context factory for the forward pass.
    loss_scale : float
        Factor on the loss before ``backward`` (1; the loop sets it per batch under
        ``DistributedDataParallel`` with uneven shards, see the module docstring).
    started : float
        ``time.perf_counter()`` at :meth:`TrainingMethod.start` (snapshots' wall time).
    """

    method: TrainingMethod
    hp: Any
    model: nn.Module
    optimizer: Any
    n_train: int
    steps_per_epoch: int
    total_steps: int
    generator: torch.Generator
    nll: Callable = F.cross_entropy
    step: int = 0
    epoch: int = 0
    lr: float = math.nan
    snapshots: list[Snapshot] = field(default_factory=list)
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    bn_loader: Any = None
    scaler: Any = None
    autocast: Callable = contextlib.nullcontext
    loss_scale: float = 1.0
    started: float = field(default_factory=time.perf_counter)

    @property
    def net(self) -> nn.Module:
        """The module inside a ``DistributedDataParallel`` wrapper, else ``model``."""
        return getattr(self.model, "module", self.model)

    @property
    def device(self) -> torch.device:
        return next(self.net.parameters()).device

    @property
    def done(self) -> bool:
        """True once ``total_steps`` gradient steps are done."""
        return self.step >= self.total_steps

    def steps(self, epochs: float) -> int:
        """:func:`epochs_to_steps` at this run's steps per epoch."""
        return epochs_to_steps(epochs, self.steps_per_epoch)


def _identity(model: nn.Module, hp) -> nn.Module:
    return model


def _noop(*args) -> None:
    return None


def _nll_loss(state: TrainState, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return state.nll(output, y)


@dataclass(frozen=True)
class TrainingMethod:
    """One training method: a name, its hyper-parameters and the hooks the loop calls.

    Parameters
    ----------
    name, description : str
    hparams : type
        Frozen dataclass of hyper-parameters; ``hparams()`` gives the stand-in defaults.
    samples : callable
        ``(state, k, seed) -> iterator of k nn.Module`` in eval mode: members, snapshots,
        posterior samples or stochastic passes. Each yielded network is valid until the next
        is requested (the same module object may be re-loaded); the model's trained weights
        are restored when the iterator ends or is closed.
    total_steps : callable
        ``(hp, steps_per_epoch) -> int`` gradient steps of one run (default: a
        :class:`TrainRecipe`'s ``epochs``).
    lr_at : callable
        ``(step, steps_per_epoch, hp) -> float``, the learning rate of 0-based ``step``
        (default: a :class:`TrainRecipe`'s named schedule).
    paper : HParams, optional
        The paper's values (CIFAR, PreResNet-110 where the paper distinguishes).
    wrap_model : callable
        ``(model, hp) -> model``: VI swaps layers, MC dropout ensures dropout. Also applied
        when a checkpoint is rebuilt for prediction (before ``load_state_dict``).
    make_optimizer : callable
        ``(model, hp) -> optimizer`` (lr is set by :meth:`step`; groups with ``fixed_lr``
        keep theirs).
    before_step : callable
        ``(state) -> None`` before the forward pass (VI switches on weight noise after
        pre-training).
    loss : callable
        ``(state, output, y) -> scalar`` to minimise (default ``state.nll``; VI adds the KL).
    after_step : callable
        ``(state) -> None`` after the update (``state.step`` already counts it).
    after_epoch : callable
        ``(state) -> None`` at :meth:`end_epoch`. The built-in methods act at step granularity
        (their phases are fractional epochs), so a loop that stops mid-epoch loses nothing.
    post_fit : callable
        ``(state, train_loader, val_loader) -> None`` after training (K-FAC Laplace).
    independent_runs : bool
        One sample per run (deep ensembles): the ensemble is one run per seed.
    stochastic_passes : bool
        Samples are passes of one stochastic network (MC dropout, VI).
    """

    name: str
    description: str
    hparams: type
    samples: Callable[[TrainState, int, int], Iterator[nn.Module]]
    total_steps: Callable[[Any, int], int] = recipe_total_steps
    lr_at: Callable[[int, int, Any], float] = recipe_lr_at
    paper: Any = None
    wrap_model: Callable[[nn.Module, Any], nn.Module] = _identity
    make_optimizer: Callable[[nn.Module, Any], Any] = default_optimizer
    before_step: Callable[[TrainState], None] = _noop
    loss: Callable[[TrainState, torch.Tensor, torch.Tensor], torch.Tensor] = _nll_loss
    after_step: Callable[[TrainState], None] = _noop
    after_epoch: Callable[[TrainState], None] = _noop
    post_fit: Callable[[TrainState, Any, Any], None] = _noop
    independent_runs: bool = False
    stochastic_passes: bool = False

    # -- hyper-parameters ------------------------------------------------------------------
    def hparams_from(self, overrides: Mapping[str, Any] | Sequence[str] = (), /,
                     **fields: Any) -> Any:
        """The defaults with ``overrides`` (a mapping or ``"key=value"`` strings, ``--set``)
        and keyword ``fields``.

        Strings are converted to the field's type (``int``, ``float``, ``bool``, ``str``,
        tuples as comma-separated values). ``ValueError`` names an unknown key or bad value.
        """
        names = [f.name for f in dataclasses.fields(self.hparams)]
        hints = typing.get_type_hints(self.hparams)
        if not isinstance(overrides, Mapping):
            pairs = {}
            for text in overrides:
                key, sep, value = str(text).partition("=")
                if not sep:
                    raise ValueError(f"hyper-parameter override must be key=value, got {text!r}")
                pairs[key.strip()] = value.strip()
            overrides = pairs
        overrides = {**overrides, **fields}
        values = {}
        for key, value in overrides.items():
            if key not in names:
                raise ValueError(f"unknown hyper-parameter {key!r} of {self.name}; valid: "
                                 f"{', '.join(names)}")
            values[key] = _coerce(value, hints[key], key) if isinstance(value, str) else value
        return self.hparams(**values)

    # -- the loop's calls ------------------------------------------------------------------
    def start(self, model: nn.Module, hp=None, *, n_train: int, steps_per_epoch: int,
              seed: int = 0, nll: Callable | None = None) -> TrainState:
        """Wrap ``model``, build the optimiser and return the state of a fresh run.

        Parameters
        ----------
        model : nn.Module
            The base network (on its device; freshly initialised or pre-trained).
        hp : hyper-parameters, optional
            An instance of ``self.hparams`` (default: its defaults).
        n_train : int
            Training-set size N (the prior and KL scale with it).
        steps_per_epoch : int
        seed : int
            Seeds the method's own noise (``state.generator``).
        nll : callable, optional
            Mean negative log-likelihood ``nll(output, y)``; default cross-entropy.
        """
        hp = self.hparams() if hp is None else hp
        if not isinstance(hp, self.hparams):
            raise TypeError(f"hp must be a {self.hparams.__name__} for method {self.name!r}, "
                             f"got {type(hp).__name__}")
        if n_train < 1 or steps_per_epoch < 1:
            raise ValueError(f"n_train and steps_per_epoch must be >= 1, got {n_train!r}, "
                             f"{steps_per_epoch!r}")
        model = self.wrap_model(model, hp)
        device = next(model.parameters()).device
        model.train()
        return TrainState(
            method=self, hp=hp, model=model, optimizer=self.make_optimizer(model, hp),
            n_train=int(n_train), steps_per_epoch=int(steps_per_epoch),
            total_steps=int(self.total_steps(hp, steps_per_epoch)),
            generator=torch.Generator(device=device).manual_seed(int(seed)),
            nll=nll or F.cross_entropy)

    def step(self, state: TrainState, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One gradient step on the batch ``(x, y)``; returns the detached loss."""
        state.lr = float(self.lr_at(state.step, state.steps_per_epoch, state.hp))
        for group in state.optimizer.param_groups:
            if not group.get("fixed_lr", False):
                group["lr"] = state.lr
        self.before_step(state)
        state.model.train()
        with state.autocast():
            loss = self.loss(state, state.model(x), y)
        state.optimizer.zero_grad(set_to_none=True)
        scaled = loss * state.loss_scale if state.loss_scale != 1.0 else loss
        if state.scaler is not None:
            state.scaler.scale(scaled).backward()
            state.scaler.step(state.optimizer)
            state.scaler.update()
        else:
            scaled.backward()
            state.optimizer.step()
        state.step += 1
        self.after_step(state)
        return loss.detach()

    def end_epoch(self, state: TrainState) -> None:
        """Count a finished epoch and call ``after_epoch``."""
        state.epoch += 1
        self.after_epoch(state)

    def finish(self, state: TrainState, train_loader=None, val_loader=None) -> None:
        """After training: keep ``train_loader`` for BatchNorm updates, run ``post_fit``, eval."""
        state.bn_loader = train_loader
        self.post_fit(state, train_loader, val_loader)
        state.model.eval()

    def restore(self, model: nn.Module, hp, tensors: Mapping[str, torch.Tensor],
                meta: Mapping[str, Any]) -> TrainState:
        """A state for drawing samples from what :func:`export_state` saved.

        Load the run's checkpoint into ``state.model`` (the re-wrapped model) afterwards.
        """
        state = self.start(model, hp, n_train=meta["n_train"],
                           steps_per_epoch=meta["steps_per_epoch"])
        state.step, state.epoch = int(meta["step"]), int(meta["epoch"])
        state.extra = {k[len("extra/"):]: v for k, v in tensors.items() if k.startswith("extra/")}
        for i, info in enumerate(meta["snapshots"]):
            prefix = f"snapshot/{i}/"
            weights = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
            state.snapshots.append(Snapshot(weights, info["step"], info["epoch"], info["lr"],
                                            info.get("wall_s", math.nan)))
        state.model.eval()
        return state


TRAINING_METHODS.item_type = TrainingMethod  # what a plugin's entry point must give


def _coerce(text: str, hint, key: str):
    origin = typing.get_origin(hint)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    try:
        if origin is tuple:
            return tuple(_coerce(t, args[0], key) for t in text.split(",") if t.strip())
        if origin in (typing.Union, types.UnionType):
            if text.lower() in ("none", "null", ""):
                return None
            return _coerce(text, args[0], key)
        if hint is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        return hint(text)
    except (TypeError, ValueError):
        raise ValueError(f"hyper-parameter {key} expects {hint}, got {text!r}") from None


def export_state(state: TrainState) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """What :meth:`TrainingMethod.restore` needs besides the checkpoint.

    Returns
    -------
    tensors : dict of str to Tensor
        ``extra/<name>`` and ``snapshot/<i>/<state-dict key>`` (CPU, contiguous): save with
        ``safetensors``.
    meta : dict
        JSON-able: method, hyper-parameters, N, steps per epoch, steps/epochs done, and each
        snapshot's step, epoch, learning rate and wall time.
    """
    tensors = {f"extra/{k}": v.detach().cpu().contiguous() for k, v in state.extra.items()}
    for i, snap in enumerate(state.snapshots):
        tensors.update({f"snapshot/{i}/{k}": v.contiguous() for k, v in snap.weights.items()})
    meta = {"method": state.method.name, "hparams": dataclasses.asdict(state.hp),
            "n_train": state.n_train, "steps_per_epoch": state.steps_per_epoch,
            "step": state.step, "epoch": state.epoch,
            "snapshots": [{"step": s.step, "epoch": s.epoch, "lr": s.lr, "wall_s": s.wall_s}
                          for s in state.snapshots]}
    return tensors, meta


# -- helpers shared by the methods ---------------------------------------------------------
def snapshot(state: TrainState) -> None:
    """Append a CPU copy of the network's state dict (weights and buffers) to the snapshots."""
    weights = {k: v.detach().to("cpu", copy=True) for k, v in state.net.state_dict().items()}
    state.snapshots.append(Snapshot(weights, state.step, state.step / state.steps_per_epoch,
                                    state.lr, time.perf_counter() - state.started))


@contextlib.contextmanager
def restoring(model: nn.Module):
    """Give back ``model``'s weights and buffers as they were on entry (samples overwrite them)."""
    saved = copy.deepcopy(model.state_dict())
    try:
        yield model
    finally:
        model.load_state_dict(saved)
        model.eval()


def check_k(k: int, available: int | None = None, what: str = "samples") -> int:
    """Validate the number of samples asked for (``available``: at most this many exist)."""
    if not isinstance(k, (int,)) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if available is not None and k > available:
        raise ValueError(f"k={k} but this run has only {available} {what}")
    return k


def snapshot_samples(state: TrainState, k: int, seed: int = 0) -> Iterator[nn.Module]:
    """The first ``k`` snapshots, in training order, loaded into the network one at a time."""
    check_k(k, len(state.snapshots), "snapshots")
    with restoring(state.net) as net:
        for snap in state.snapshots[:k]:
            net.load_state_dict(snap.weights)
            net.eval()
            yield net


def sample_seed(seed: int, i: int) -> int:
    """The seed of sample ``i`` of a draw seeded with ``seed``."""
    return derive_seed(seed, i)


class StochasticPass(nn.Module):
    """Pass ``index`` of a stochastic network whose noise is drawn per example.

    ``noise`` is an entered context with ``start_pass(pass_index, sample_ids)`` (e.g.
    :class:`uqvision.training.dropout.PerSampleDropout`); each call seeds the noise of the examples
    ``sample_ids`` (data-set indices, in batch order) for this pass before the forward.
    """

    def __init__(self, net: nn.Module, noise: Any, index: int):
        super().__init__()
        self.net = net
        self.noise = noise
        self.index = int(index)

    def forward(self, x: torch.Tensor, sample_ids: Sequence[int] | None = None) -> torch.Tensor:
        ids = range(len(x)) if sample_ids is None else [int(i) for i in sample_ids]
        self.noise.start_pass(self.index, ids)
        return self.net(x)


def stochastic_passes(state: TrainState, k: int, seed: int,
                      noise: Callable[[nn.Module, int], Any]) -> Iterator[nn.Module]:
    """``k`` passes of one stochastic network (MC dropout, VI): :class:`StochasticPass`
    ``i = 0..k-1`` over the context ``noise(net, seed)`` (entered once; it puts the network
    in eval mode and switches its noise on, drawn per example from
    ``derive_seed(seed, i, example id)``)."""
    check_k(k)
    net = state.net
    try:
        with noise(net, seed) as source:
            for i in range(k):
                yield StochasticPass(net, source, i)
    finally:
        net.eval()


def replace_submodule(model: nn.Module, name: str, new: nn.Module) -> nn.Module:
    """Put ``new`` at dotted ``name`` inside ``model``; returns the model (``new`` for ``""``)."""
    if not name:
        return new
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)
    return model


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def update_batchnorm(state: TrainState, enabled: bool = True) -> None:
    """Recompute BatchNorm statistics of the current (sampled) weights on ``state.bn_loader``.

    SWAG's and K-FAC Laplace's reference code does this after drawing each sample
    (``torch.optim.swa_utils.update_bn``); a no-op without BatchNorm or without a loader.
    """
    if enabled and state.bn_loader is not None and has_batchnorm(state.net):
        torch.optim.swa_utils.update_bn(state.bn_loader, state.net, device=state.device)
    state.net.eval()
