"""What a training run is: :class:`TrainConfig` (network, optimiser and method hyper-parameters,
docs/conventions.md#r-3 defaults) and the training :class:`Recipe` s (loss and L2 convention,
docs/conventions.md#r-3b)."""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
from uqmetrics import InputError
from uqmetrics.metrics.registry import Registry

if TYPE_CHECKING:
    import torch

#: How a recipe applies its L2 penalty λ to the weights (biases are never penalised):
#: ``coupled``: gradient += λ·w (PyTorch Adam ``weight_decay``); ``sum``: gradient += (λ/N)·w, the
#: same penalty against a summed loss; ``decoupled``: w ← w − lr·λ·w per step (AdamW); ``none``.
L2_MODES = ("coupled", "sum", "decoupled", "none")
#: Floating-point types a network may train in (``TrainConfig.dtype``).
DTYPES = ("float32", "float64")
#: Adam's ε (PyTorch's default, as the autograd path), of the fused and the triton backends.
ADAM_EPS = 1e-8
#: Training-step implementations (``TrainConfig.backend``).
BACKENDS = ("fused", "autograd", "triton")
#: The value of ``TrainConfig.chunk_networks`` / ``parallel_chunks`` that asks the engine to
#: measure the fastest setting on the device once and record it (:mod:`uqreg.engine.autoplan`).
AUTO = "auto"
#: The memory budget on the CPU, and of ``max_memory="auto"`` there (bytes).
DEFAULT_MAX_MEMORY = 4e9
#: ``max_memory="auto"`` on CUDA: this fraction of the device's total memory (the rest is left to
#: the data, the predictions, cuBLAS's workspaces and other processes on the GPU).
CUDA_MEMORY_FRACTION = 0.5


class ConfigError(InputError):
    """A configuration field holds a value it cannot take.

    The message is ``"<field> <requirement>, got <value>"``; :attr:`field`, :attr:`requirement`
    and :attr:`value` let a caller restate it under its own name for the field (the command line
    names its option: :meth:`restated`). An :class:`uqmetrics.InputError`, so a
    :class:`ValueError`.

    Examples
    --------
    >>> err = ConfigError("weight_decay", "must be a finite number >= 0", float("inf"))
    >>> str(err)
    'weight_decay must be a finite number >= 0, got inf'
    >>> err.restated("--weight-decay", "inf")
    '--weight-decay must be a finite number >= 0, got inf'
    """

    def __init__(self, field: str, requirement: str, value):
        self.field, self.requirement, self.value = field, requirement, value
        super().__init__(self.restated(field, repr(value)))

    def restated(self, name: str, value: str) -> str:
        """The message with the field called ``name`` and its value written as ``value``."""
        return f"{name} {self.requirement}, got {value}"


def registered(field: str, value, lookup, name=None, *, what: str):
    """``lookup(name)`` (default ``lookup(value)``): a registry's entry, its unknown-name error
    (a ``ValueError`` listing the valid names) restated as the :class:`ConfigError` of
    ``field`` holding ``value``, so that the command line names the option (and the file the
    value came from) as it does for any field.

    Examples
    --------
    >>> registered("recipes", ("sum",), RECIPES.lookup, "sum", what="registered recipes").name
    'sum'
    >>> try:
    ...     registered("recipes", ("sum", "nope"), RECIPES.lookup, "nope", what="registered recipes")
    ... except ConfigError as err:
    ...     print(err.restated("--recipes", "sum,nope")[:61])
    --recipes must name registered recipes (unknown recipe 'nope'
    """
    try:
        return lookup(value if name is None else name)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(field, f"must name {what} ({' '.join(str(exc).split())})",
                          value) from None


def is_int(value) -> bool:
    """True for a Python or numpy integer (not a bool)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_auto(value) -> bool:
    """True for :data:`AUTO` (``"auto"``)."""
    return isinstance(value, str) and value == AUTO


def is_finite(value) -> bool:
    """True for a finite real number (not a bool)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)) \
        and math.isfinite(value)


@dataclass(frozen=True)
class Recipe:
    """A training recipe (docs/conventions.md#r-3b): the loss is ½·mean squared error; the
    recipe fixes how the L2 penalty λ (default 1/N) acts.

    Attributes
    ----------
    name, description : str
    l2_mode : str
        One of :data:`L2_MODES`.
    lam : float, optional
        The recipe's own λ (default: ``TrainConfig.weight_decay`` or 1/N).

    Examples
    --------
    >>> RECIPES.lookup("sum").weight_decay(50)
    0.0004
    >>> RECIPES.lookup("decoupled").decoupled
    True
    """

    name: str
    description: str
    l2_mode: str
    lam: float | None = None

    def __post_init__(self):
        if self.l2_mode not in L2_MODES:
            raise ValueError(f"l2_mode must be one of {', '.join(L2_MODES)}, got {self.l2_mode!r}")
        if self.lam is not None and not self.lam >= 0:
            raise ValueError(f"lam must be >= 0, got {self.lam!r}")

    def weight_decay(self, n_train: int, lam: float | None = None) -> float:
        """The factor the optimiser applies to the weights for a training set of ``n_train``:
        coupled (``gradient += f·w``) unless :attr:`decoupled` (``w ← w − lr·f·w``).

        ``lam`` (e.g. ``TrainConfig.weight_decay``) overrides the recipe's λ; default 1/N.
        """
        lam = (self.lam if self.lam is not None else 1.0 / n_train) if lam is None else lam
        return {"coupled": lam, "sum": lam / n_train, "decoupled": lam, "none": 0.0}[self.l2_mode]

    @property
    def decoupled(self) -> bool:
        """True: the decay is applied to the weights directly (AdamW), not to the gradient."""
        return self.l2_mode == "decoupled"

    def to_dict(self) -> dict:
        """The definition written into a study's attrs."""
        return {"description": self.description, "l2_mode": self.l2_mode, "lam": self.lam,
                "loss": "0.5 * mean squared error"}


RECIPES: Registry[Recipe] = Registry("recipe")
for _r in (
    Recipe("paper", "the paper's literal recipe: coupled L2, gradient += λ·w, λ = 1/N (PyTorch Adam weight_decay)",
           "coupled"),
    Recipe("sum", "the same penalty against a summed loss: gradient += (λ/N)·w, λ = 1/N", "sum"),
    Recipe("decoupled", "AdamW-style decay lr·λ·w per step, λ = 1/N", "decoupled"),
    Recipe("none", "no L2 penalty", "none"),
):
    RECIPES.register(_r)
del _r


@dataclass(frozen=True)
class TrainConfig:
    """Network, optimiser and method hyper-parameters (R.3 defaults; every value overridable).

    Attributes
    ----------
    hidden : tuple of int
        Hidden widths; the paper's network is d→128→64→32→1. ``()`` gives a linear model.
    negative_slope : float
        Leaky-ReLU slope after every hidden layer.
    lr, betas : float, (float, float)
        Adam learning rate and moments.
    recipe : str
        Training recipe (:data:`RECIPES`): how the L2 penalty λ acts on the weights.
    weight_decay : float or None
        The L2 factor λ of the recipe (biases unregularised); ``None`` means the recipe's
        default, 1/N.
    epochs : int or None
        Training epochs; ``None`` means 300·c.
    members : int
        Ensemble members per repetition (ensemble methods).
    dropout : float
        Bernoulli dropout rate of ``bd`` and the initial rate of ``cd``/``vd``.
    mc_samples : int
        Stochastic forward passes T at prediction for the dropout methods.
    concrete_temperature : float
        Temperature of the concrete relaxation (``cd``).
    concrete_length_scale : float
        Prior length scale l of ``cd`` (see :func:`~uqreg.engine.heads.concrete_regulariser`).
    adversarial_epsilon : float
        FGSM step as a fraction of the training-input range per dimension (``ens_adv``).
    bootstrap_batches : int
        Mini-batches of N/2 drawn with replacement per epoch (``ens_bs``).
    std_ddof : int
        Delta degrees of freedom of the std over members / passes (1: sample std).
    nll_beta : float
        β of the β-NLL objective of the mean–variance methods (``<method>+mv``; Seitzer et al.
        2022), in [0, 1]: each point's Gaussian NLL is weighted by its predicted σ^{2β} without
        gradient; 0 (default) is the plain NLL. Unused by mean-only methods.
    dtype : str
        ``"float32"`` or ``"float64"``.
    device : str
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    max_memory : float or "auto"
        Memory budget in bytes for the networks trained at once (concurrent chunks share it); the
        network axis is chunked to it. ``"auto"`` (the command line's default on CUDA) is
        resolved where the work runs (:meth:`memory_budget`): :data:`CUDA_MEMORY_FRACTION` of the
        CUDA device's memory, or :data:`DEFAULT_MAX_MEMORY` on the CPU.
    chunk_networks : int, "auto" or None
        Networks trained together in one chunk (bounded by the memory budget). ``None``: only the
        memory budget bounds the chunk. ``"auto"``: the fastest chunk on this device, measured
        once by a short calibration and recorded (:mod:`uqreg.engine.autoplan`; the command
        line's default on CUDA). Results do not depend on the chunk (bit for bit on the CPU;
        docs/conventions.md#r-5). A chunk of one network is computed as two copies of it
        (:data:`uqreg.engine.plan.MIN_BATCH`), so that its rounding is that of any larger chunk.
    adam : str
        ``"foreach"`` (multi-tensor) or ``"fused"`` Adam implementation of PyTorch. (PyTorch's
        fused CPU Adam rounds differently in its vectorised body and its scalar tail, so a
        network's result would depend on its position in the chunk; ``foreach`` does not.)
    backend : str
        Training step (:data:`BACKENDS`): ``"fused"``, the hand-written forward/backward with one
        fused Adam call over one flat buffer (:mod:`uqreg.engine.fused`), or ``"autograd"``,
        autograd and ``torch.optim`` (``adam`` selects its Adam). Both train the same networks.
        ``"triton"`` (CUDA; needs ``uqreg[triton]``): the fused backend with a whole step of
        the ensembles' networks as ONE Triton kernel (:mod:`uqreg.engine.triton_step`: the
        deterministic head, ½·MSE, three hidden layers, float32), the fused ops for every other
        step; the same networks within float32 rounding, a network's bits independent of its
        chunk.
    parallel_chunks : int, "auto" or None
        Chunks trained concurrently by threads, each with ONE torch intra-op thread (on CUDA,
        each on its own CUDA stream); ``None``: the number of available cores on the CPU, 1 on
        CUDA; ``"auto"``: measured with the chunk (as ``chunk_networks="auto"``). The memory
        budget is shared by the concurrent chunks. Execution only: results do not depend on it.
    cuda_graphs : bool
        On CUDA, train each chunk's epochs after the first as replays of one captured CUDA graph
        of an epoch (:func:`uqreg.engine.fused.train_graphed`; the fused backend only): one
        launch instead of hundreds of small kernels per epoch. Execution only: a replay runs the
        eager epoch's kernels on the same buffers, so results do not change (bit for bit,
        checked on CUDA); ignored on the CPU. Off by default until measured on a GPU
        (``bench_engine.py --cuda-graphs``).
    """

    hidden: tuple[int, ...] = (128, 64, 32)
    negative_slope: float = 0.01
    lr: float = 1e-2
    betas: tuple[float, float] = (0.9, 0.999)
    recipe: str = "paper"
    weight_decay: float | None = None
    epochs: int | None = None
    members: int = 120
    dropout: float = 0.1
    mc_samples: int = 200
    concrete_temperature: float = 0.1
    concrete_length_scale: float = 1e-4
    adversarial_epsilon: float = 0.01
    bootstrap_batches: int = 2
    std_ddof: int = 1
    nll_beta: float = 0.0
    dtype: str = "float32"
    device: str = "cpu"
    max_memory: float | str = DEFAULT_MAX_MEMORY
    chunk_networks: int | str | None = 64
    adam: str = "foreach"
    backend: str = "fused"
    parallel_chunks: int | str | None = None
    cuda_graphs: bool = False

    def __post_init__(self):
        def int_at_least(low, optional=False):
            return lambda v: (optional and v is None) or (is_int(v) and v >= low)

        int_req = "must be an integer >= {}".format
        checks = (  # field, test, requirement
            ("hidden", lambda v: isinstance(v, tuple) and all(is_int(h) and h >= 1 for h in v),
             "must be a tuple of integers >= 1"),
            ("negative_slope", is_finite, "must be a finite number"),
            ("lr", lambda v: is_finite(v) and v > 0, "must be a finite number > 0"),
            ("betas", lambda v: isinstance(v, tuple) and len(v) == 2 and all(is_finite(b) and 0 <= b < 1 for b in v),
             "must be two numbers in [0, 1)"),
            ("weight_decay", lambda v: v is None or (is_finite(v) and v >= 0), "must be a finite number >= 0"),
            ("epochs", int_at_least(1, optional=True), int_req(1)),
            ("members", int_at_least(1), int_req(1)),
            ("dropout", lambda v: is_finite(v) and 0 < v < 1, "must be a number in (0, 1)"),
            ("mc_samples", int_at_least(2), int_req(2) + " (the spread of one pass is undefined)"),
            ("concrete_temperature", lambda v: is_finite(v) and v > 0, "must be a finite number > 0"),
            ("concrete_length_scale", lambda v: is_finite(v) and v > 0, "must be a finite number > 0"),
            ("adversarial_epsilon", lambda v: is_finite(v) and v >= 0, "must be a finite number >= 0"),
            ("bootstrap_batches", int_at_least(1), int_req(1)),
            ("std_ddof", lambda v: is_int(v) and v in (0, 1), "must be 0 or 1"),
            ("nll_beta", lambda v: is_finite(v) and 0 <= v <= 1, "must be a number in [0, 1]"),
            ("dtype", lambda v: v in DTYPES, f"must be one of {', '.join(DTYPES)}"),
            ("max_memory", lambda v: is_auto(v) or (is_finite(v) and v > 0), "must be a finite number > 0 or auto"),
            ("chunk_networks", lambda v: is_auto(v) or int_at_least(1, optional=True)(v),
             int_req(1) + " or auto"),
            ("adam", lambda v: v in ("foreach", "fused"), "must be foreach or fused"),
            ("backend", lambda v: v in BACKENDS, f"must be one of {', '.join(BACKENDS)}"),
            ("parallel_chunks", lambda v: is_auto(v) or int_at_least(1, optional=True)(v),
             int_req(1) + " or auto"),
            ("cuda_graphs", lambda v: isinstance(v, bool), "must be true or false"),
        )
        for name, ok, requirement in checks:
            if not ok(getattr(self, name)):
                raise ConfigError(name, requirement, getattr(self, name))
        if not (isinstance(self.device, str) and re.fullmatch(r"(cpu|cuda)(:\d+)?", self.device)):
            raise ConfigError("device", "must be cpu, cuda or cuda:N", self.device)
        RECIPES.lookup(self.recipe)

    def torch_device(self) -> torch.device:
        """``device`` where the networks are placed; ``ValueError`` if it is not on this machine
        (checked where the work runs: a config may be written for a cluster's GPU workers)."""
        import torch  # where the work runs (a configuration imports no torch)

        device = torch.device(self.device)
        if device.type == "cuda":
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if (device.index or 0) >= count:
                raise ValueError(f"device {self.device!r} is not available here ({count} CUDA "
                                 f"devices; torch {torch.__version__})")
        return device

    def memory_budget(self) -> float:
        """The memory budget in bytes: ``max_memory``, or for ``"auto"``
        :data:`CUDA_MEMORY_FRACTION` of the total memory of the CUDA device (read where the work
        runs: :meth:`torch_device`), :data:`DEFAULT_MAX_MEMORY` on the CPU. The total, not the
        free memory, so that the budget, and the engine plan recorded under it, is the same at
        every run on a device."""
        if not is_auto(self.max_memory):
            return float(self.max_memory)
        device = self.torch_device()
        if device.type != "cuda":
            return DEFAULT_MAX_MEMORY
        import torch  # where the work runs (a configuration imports no torch)

        return CUDA_MEMORY_FRACTION * torch.cuda.get_device_properties(device).total_memory

    @property
    def recipe_spec(self) -> Recipe:
        return RECIPES.lookup(self.recipe)

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch  # where the work runs (a configuration imports no torch)

        return getattr(torch, self.dtype)


#: The fields ``"auto"`` applies to (:func:`cuda_plan_defaults`).
PLAN_FIELDS = ("chunk_networks", "parallel_chunks", "max_memory")


def cuda_plan_defaults(cfg: TrainConfig, given: Collection[str] = ()) -> TrainConfig:
    """``cfg`` with ``"auto"`` chunk, concurrency and memory budget on CUDA, except the fields in
    ``given`` (set by the user): the command line's default there, since the CPU's 64 networks
    one chunk at a time, within 4 GB, leave a GPU mostly idle. On the CPU ``cfg`` is returned
    unchanged (its defaults, results and speed stay as they were).

    Examples
    --------
    >>> cuda_plan_defaults(TrainConfig(device="cuda"), given={"parallel_chunks"}).chunk_networks
    'auto'
    >>> cuda_plan_defaults(TrainConfig()).chunk_networks
    64
    """
    if not cfg.device.startswith("cuda"):
        return cfg
    return replace(cfg, **{f: AUTO for f in PLAN_FIELDS if f not in given})


def int_or_auto(text: str) -> int | str:
    """Parse a command-line value: ``"auto"`` or an integer."""
    return AUTO if text.strip() == AUTO else int(text)


def float_or_auto(text: str) -> float | str:
    """Parse a command-line value: ``"auto"`` or a number."""
    return AUTO if text.strip() == AUTO else float(text)
