"""Approximate Bayesian methods: SWAG, cyclical SGLD, variational inference and K-FAC Laplace,
as :class:`~uqvision.training.method.TrainingMethod` entries.

All four share Pitfalls' probabilistic model (eqs. 6-9): the softmax likelihood and the prior
``N(0, (N wd)^-1 I)`` implied by the weight decay ``wd`` on ``N`` training examples. Epoch
counts are the paper's CIFAR values / 10 (``method.paper`` has the paper's own).

References
----------
.. [1] Ashukha et al. Pitfalls of in-domain uncertainty estimation and ensembling in deep
   learning. ICLR 2020, appendix B.
.. [2] Maddox et al. A simple baseline for Bayesian uncertainty in deep learning. NeurIPS 2019.
.. [3] Zhang et al. Cyclical stochastic gradient MCMC for Bayesian deep learning. ICLR 2020.
.. [4] Kingma, Salimans, Welling. Variational dropout and the local reparameterization trick.
   NeurIPS 2015.
.. [5] Ritter, Botev, Barber. A scalable Laplace approximation for neural networks. ICLR 2018.
.. [6] Martens, Grosse. Optimizing neural networks with Kronecker-factored approximate
   curvature. ICML 2015 (the pi-corrected damping, section 6.3).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from ..data import derive_seed
from ..training.method import (
    TRAINING_METHODS,
    HParams,
    OptimizerChain,
    TrainingMethod,
    TrainRecipe,
    TrainState,
    check_fields,
    check_k,
    epochs_to_steps,
    replace_submodule,
    restoring,
    sample_seed,
    snapshot,
    snapshot_samples,
    stochastic_passes,
    update_batchnorm,
)
from ..training.schedules import cosine_cycle_lr, linear_decay_lr

logger = logging.getLogger(__name__)

__all__ = [
    "CSGLD_TEMPERATURE_RULES",
    "CSGLDHParams",
    "LaplaceHParams",
    "PerSampleVINoise",
    "SWAGHParams",
    "VIConv2d",
    "VIHParams",
    "VILinear",
    "csgld_temperature",
    "kfac_factors",
    "search_scale",
    "swag_moments",
    "variational_layers",
]


def _pretrain_then(step: int, pre: int, lr_init: float, after: float) -> float:
    """Eq. (10) over the ``pre`` pre-training steps, then ``after``."""
    return linear_decay_lr(step, pre, lr_init) if step < pre else after


# -- SWAG ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SWAGHParams(HParams):
    """SWAG: pre-training with eq. (10), then SGD at a constant ``swag_lr`` collecting the
    first two moments and the last ``rank`` deviations every ``collect_epochs``.

    Samples are ``mean + sqrt(scale) (sqrt(var) z1 + D^T z2 / sqrt(K - 1))`` (the SWAG
    reference's ``sample(scale=0.5, cov=True)``; ``low_rank=False``: SWAG-diagonal). Paper:
    pre-training 160 epochs at lr_init 0.1 (Table 1), then lr 1e-2, rank 20, one collection
    per epoch (SWAG's 300-epoch budget: 140 collections). ``bn_update``: recompute BatchNorm
    statistics of each sample on the training data, as the reference does.
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


# -- cyclical SGLD -------------------------------------------------------------------------
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


# -- variational inference -----------------------------------------------------------------
class _Variational:
    """Mixin: a fully factorised Gaussian over ``weight`` (the mean) with ``log_sigma``
    (:class:`VILinear`: the local reparameterisation; :class:`VIConv2d`: sampled kernels).

    ``stochastic`` off (the default, and after training): the mean network. On, the noise
    comes from the global torch RNG (training), or, inside :class:`PerSampleVINoise`, from
    one generator per example (prediction).
    """

    stochastic: bool
    noise_generators: list[torch.Generator] | None

    def _init_variational(self, log_sigma_init: float) -> None:
        self.log_sigma = nn.Parameter(torch.full_like(self.weight, float(log_sigma_init)))
        self.stochastic = False
        self.noise_generators = None

    def _sample(self, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        gens = self.noise_generators
        if gens is None:
            eps = torch.randn_like(mean)
        else:
            if len(gens) != mean.shape[0]:
                raise ValueError(f"{type(self).__name__} got a batch of {mean.shape[0]} for "
                                 f"{len(gens)} per-example generators")
            eps = torch.stack([torch.randn(mean.shape[1:], generator=g) for g in gens]).to(
                device=mean.device, dtype=mean.dtype)
        return mean + torch.sqrt(var + 1e-16) * eps

    def kl_terms(self, prior_precision: float) -> torch.Tensor:
        """``sum(prior_precision sigma^2 / 2 - log sigma)``: KL(q || N(0, 1/prior_precision))
        without its ``mu^2`` part (weight decay) and constants."""
        return (prior_precision * torch.exp(2 * self.log_sigma) / 2 - self.log_sigma).sum()


class VILinear(_Variational, nn.Linear):
    """``nn.Linear`` whose weight has a factorised Gaussian posterior (``weight`` = mean).

    With ``stochastic`` on, ``out ~ N(x mu^T + b, x^2 sigma^2^T)`` per example (local
    reparameterisation); off, the mean network.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 log_sigma_init: float = -5.0, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self._init_variational(log_sigma_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = F.linear(x, self.weight, self.bias)
        if not self.stochastic:
            return mean
        return self._sample(mean, F.linear(x * x, torch.exp(2 * self.log_sigma)))


class VIConv2d(_Variational, nn.Conv2d):
    """``nn.Conv2d`` with a factorised Gaussian kernel whose stochastic forward samples the
    kernel itself (no local reparameterisation).

    Pitfalls' code applies the local reparameterisation to fully connected layers only: on a
    convolution it would draw independent noise per output position, dropping the spatial
    correlation that one kernel draw induces (the pooled output's variance is then far
    smaller, with the same mean). In training one kernel is drawn per batch (the reference
    code's weight-sampling path); inside :class:`PerSampleVINoise` one kernel per example from
    that example's generator (a grouped convolution), so an example's output does not depend
    on its batch.
    """

    def __init__(self, *args, log_sigma_init: float = -5.0, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_variational(log_sigma_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.stochastic:
            return self._conv_forward(x, self.weight, self.bias)
        sigma = torch.exp(self.log_sigma)
        gens = self.noise_generators
        if gens is None:  # training: one kernel draw for the batch
            return self._conv_forward(x, self.weight + sigma * torch.randn_like(self.weight),
                                      self.bias)
        b = x.shape[0]
        if len(gens) != b:
            raise ValueError(f"{type(self).__name__} got a batch of {b} for {len(gens)} "
                             "per-example generators")
        eps = torch.stack([torch.randn(self.weight.shape, generator=g) for g in gens]).to(
            device=x.device, dtype=x.dtype)
        kernels = (self.weight[None] + sigma[None] * eps).flatten(0, 1)  # (b * out, in/g, kh, kw)
        padding = self.padding
        if self.padding_mode != "zeros":
            x, padding = F.pad(x, self._reversed_padding_repeated_twice,
                               mode=self.padding_mode), 0
        bias = None if self.bias is None else self.bias.repeat(b)
        out = F.conv2d(x.reshape(1, -1, *x.shape[2:]), kernels, bias, self.stride, padding,
                       self.dilation, self.groups * b)
        return out.reshape(b, self.out_channels, *out.shape[2:])


def _to_variational(module: nn.Module, log_sigma_init: float) -> nn.Module:
    w = module.weight
    kw = {"log_sigma_init": log_sigma_init, "device": w.device, "dtype": w.dtype}
    if type(module) is nn.Linear:
        new = VILinear(module.in_features, module.out_features, module.bias is not None, **kw)
    else:
        new = VIConv2d(module.in_channels, module.out_channels, module.kernel_size,
                       module.stride, module.padding, module.dilation, module.groups,
                       module.bias is not None, module.padding_mode, **kw)
    new.weight, new.bias = module.weight, module.bias
    return new


def variational_layers(model: nn.Module) -> list[VILinear | VIConv2d]:
    """The VI layers of ``model``."""
    return [m for m in model.modules() if isinstance(m, _Variational)]


@dataclass(frozen=True)
class VIHParams(HParams):
    """VI with a fully factorised Gaussian posterior over the weights of every ``nn.Linear``
    and ``nn.Conv2d`` (local reparameterisation on the linear layers, sampled kernels on the
    convolutions, :class:`VIConv2d`; biases and BatchNorm stay point estimates).

    Pre-training is a conventional run (eq. 10 at ``pretrain_lr``; the means start from its
    weights, log-sigma from ``log_sigma_init``), then ``epochs`` of VI: the means by SGD with
    eq. (10) at ``lr_init``, log-sigma by Adam at the constant ``log_sigma_lr``, loss
    ``NLL + kl_weight * KL / N`` with the KL's ``mu^2`` part as the weight decay. Paper
    (CIFAR): 300 pre-training epochs, 100 VI epochs, lr_init 1e-3, Adam 1e-3, log-sigma -5,
    KL weight 1e-4 (WideResNet 1e-5; ImageNet: 1e-3, lr 0.01, -6, 45 epochs).
    """

    pretrain_epochs: float = 30
    pretrain_lr: float = 0.1
    epochs: float = 10
    lr_init: float = 1e-3
    log_sigma_lr: float = 1e-3
    log_sigma_init: float = -5.0
    kl_weight: float = 1e-4

    def __post_init__(self):
        super().__post_init__()
        check_fields(self, positive=("pretrain_lr", "epochs", "lr_init", "log_sigma_lr"),
                     nonnegative=("pretrain_epochs", "kl_weight"))


def _vi_wrap(model: nn.Module, hp: VIHParams) -> nn.Module:
    names = [n for n, m in model.named_modules() if type(m) in (nn.Linear, nn.Conv2d)]
    if not names:
        raise ValueError(f"vi needs nn.Linear or nn.Conv2d layers; {type(model).__name__} "
                         "has none")
    for name in names:
        model = replace_submodule(model, name, _to_variational(model.get_submodule(name),
                                                               hp.log_sigma_init))
    return model


def _vi_optimizer(model: nn.Module, hp: VIHParams) -> OptimizerChain:
    sigmas = [m.log_sigma for m in variational_layers(model)]
    ids = {id(p) for p in sigmas}
    means = [p for p in model.parameters() if id(p) not in ids]
    return OptimizerChain(
        torch.optim.SGD(means, lr=0.0, momentum=hp.momentum, weight_decay=hp.weight_decay),
        torch.optim.Adam([{"params": sigmas, "fixed_lr": True}], lr=hp.log_sigma_lr))


def _vi_phases(hp: VIHParams, spe: int) -> tuple[int, int]:
    return epochs_to_steps(hp.pretrain_epochs, spe), epochs_to_steps(hp.epochs, spe)


def _vi_lr_at(step: int, spe: int, hp: VIHParams) -> float:
    pre, n = _vi_phases(hp, spe)
    if step < pre:
        return linear_decay_lr(step, pre, hp.pretrain_lr)
    return linear_decay_lr(step - pre, n, hp.lr_init)


def _vi_before_step(state: TrainState) -> None:
    on = state.step >= _vi_phases(state.hp, state.steps_per_epoch)[0]
    for m in variational_layers(state.net):
        m.stochastic = on


def _vi_loss(state: TrainState, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    nll = state.nll(output, y)
    hp = state.hp
    if state.step < _vi_phases(hp, state.steps_per_epoch)[0] or hp.kl_weight == 0:
        return nll
    prior_precision = state.n_train * hp.weight_decay
    kl = sum(m.kl_terms(prior_precision) for m in variational_layers(state.net))
    return nll + hp.kl_weight * kl / state.n_train


class PerSampleVINoise:
    """Context manager: the VI layers' local-reparameterisation noise drawn per example.

    Inside, every VI layer of ``model`` is stochastic (the model in eval mode) and
    :meth:`start_pass` gives each example of the next forward pass its own generator seeded
    with ``derive_seed(seed, pass_index, example id)``; successive VI layers draw successively
    from it. An example's output is thus a pure function of (seed, pass, example id), whatever
    the batch, and the global torch RNG is never read. On exit the layers return to the mean
    network.
    """

    def __init__(self, model: nn.Module, seed: int):
        self.model, self.seed = model, int(seed)
        self.layers = variational_layers(model)
        if not self.layers:
            raise ValueError(f"{type(model).__name__} has no VI layer")

    def __enter__(self):
        self.model.eval()
        for m in self.layers:
            m.stochastic, m.noise_generators = True, None
        return self

    def __exit__(self, *exc) -> None:
        for m in self.layers:
            m.stochastic, m.noise_generators = False, None

    def start_pass(self, pass_index: int, sample_ids) -> None:
        gens = [torch.Generator().manual_seed(derive_seed(self.seed, pass_index, int(i)))
                for i in sample_ids]
        for m in self.layers:
            m.noise_generators = gens


def _vi_post_fit(state: TrainState, train_loader, val_loader) -> None:
    for m in variational_layers(state.net):  # predictions of the trained net: the means
        m.stochastic = False


TRAINING_METHODS.register(TrainingMethod(
    name="vi",
    description="variational inference: factorised Gaussian, local reparameterisation, KL "
                "weight (Blundell et al.; Kingma et al.)",
    hparams=VIHParams, paper=VIHParams(pretrain_epochs=300, epochs=100),
    wrap_model=_vi_wrap, make_optimizer=_vi_optimizer,
    total_steps=lambda hp, spe: sum(_vi_phases(hp, spe)),
    lr_at=_vi_lr_at,
    before_step=_vi_before_step, loss=_vi_loss, post_fit=_vi_post_fit,
    samples=lambda state, k, seed=0: stochastic_passes(state, k, seed, PerSampleVINoise),
    stochastic_passes=True))


# -- K-FAC Laplace -------------------------------------------------------------------------
@dataclass(frozen=True)
class LaplaceHParams(TrainRecipe):
    """K-FAC Laplace around a conventionally trained network (the MAP of eq. 7).

    Per ``nn.Linear``/``nn.Conv2d`` layer (bias as an extra input column) the empirical
    Fisher of the whole training set is ``N (A ⊗ G)`` (Kronecker factors of the inputs and of
    the per-example output gradients, Grosse & Martens' KFC for convolutions); the prior
    precision ``tau`` (default ``N wd``, eq. 9) is added with Martens & Grosse's pi-corrected
    damping, ``N (A + pi sqrt(eps) I) ⊗ (G + sqrt(eps)/pi I)`` with ``eps = tau / N`` and
    ``pi = sqrt((tr A / dim A) / (tr G / dim G))``. Samples are ``w_MAP + scale *
    N^(-1/2) L_G^-T Z L_A^-1``; ``scale`` is chosen from ``scales`` by the validation NLL of a
    ``tune_samples`` ensemble (Ritter et al.; Pitfalls Table 2 reports the chosen scales in
    their code's own normalisation). A single scale skips the tuning. An optimum on an edge
    of the grid extends it by the grid's own ratio there, up to ``max_scale_extensions``
    points (:func:`search_scale`); one still on an edge is flagged (``state.extra
    ["laplace.scale_at_edge"]`` and a log warning). Other layers stay at the MAP;
    ``bn_update`` recomputes BatchNorm statistics for each sample.
    """

    scales: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
    tune_samples: int = 5
    prior_precision: float | None = None
    bn_update: bool = True
    max_scale_extensions: int = 4

    def __post_init__(self):
        super().__post_init__()
        check_fields(self, positive=("tune_samples",),
                     nonnegative=("max_scale_extensions",))
        if not self.scales or any(not s >= 0 for s in self.scales):
            raise ValueError(f"scales must be non-negative numbers, got {self.scales!r}")
        if self.prior_precision is not None and not self.prior_precision >= 0:
            raise ValueError(f"prior_precision must be >= 0, got {self.prior_precision!r}")


def _kfac_layers(net: nn.Module) -> dict[str, nn.Module]:
    """Layers K-FAC covers: plain Linear, and plain ungrouped Conv2d with numeric padding."""
    return {n: m for n, m in net.named_modules()
            if type(m) is nn.Linear or (type(m) is nn.Conv2d and m.groups == 1
                                        and not isinstance(m.padding, str)
                                        and m.padding_mode == "zeros")}


def _layer_rows(module: nn.Module, x: torch.Tensor, g: torch.Tensor):
    """Input rows (with a ones column for the bias) and output-gradient rows, one per
    (example, location)."""
    if isinstance(module, nn.Conv2d):
        x = F.unfold(x, module.kernel_size, module.dilation, module.padding, module.stride)
        x = x.transpose(1, 2).reshape(-1, x.shape[1])
        g = g.flatten(2).transpose(1, 2).reshape(-1, g.shape[1])
    else:
        x, g = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
    if module.bias is not None:
        x = torch.cat([x, torch.ones_like(x[:, :1])], 1)
    return x.double(), g.double()


def kfac_factors(state: TrainState, loader) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The empirical-Fisher Kronecker factors ``(A, G)`` of every K-FAC layer over ``loader``.

    ``A = mean over examples and locations of a a^T`` (a: the layer input, with a 1 for the
    bias), ``G = (1/N) sum over examples and locations of g g^T`` (g: the gradient of the
    example's NLL w.r.t. the layer output), so that the layer's Fisher is ``N (A ⊗ G)``.
    The network runs in eval mode (BatchNorm statistics as at prediction). Stored in
    ``state.extra`` as ``kfac.<layer>.A`` / ``.G`` and ``kfac.n`` (N).
    """
    net, layers = state.net, _kfac_layers(state.net)
    if not layers:
        raise ValueError(f"kfac_laplace needs nn.Linear or nn.Conv2d layers; "
                         f"{type(net).__name__} has none")
    inputs, outputs = {}, {}
    sums = {n: [0.0, 0.0, 0] for n in layers}  # A sum, G sum, rows
    def keep(name):
        def hook(module, args, out):
            inputs[name], outputs[name] = args[0].detach(), out
        return hook

    hooks = [m.register_forward_hook(keep(n)) for n, m in layers.items()]
    n_examples = 0
    net.eval()
    try:
        for batch in loader:
            x, y = batch[0].to(state.device), batch[1].to(state.device)
            inputs.clear()
            outputs.clear()
            loss = state.nll(net(x), y, reduction="sum")
            names = list(outputs)
            grads = torch.autograd.grad(loss, [outputs[n] for n in names], allow_unused=True)
            for name, g in zip(names, grads):
                if g is None:
                    continue
                a, g = _layer_rows(layers[name], inputs[name], g.detach())
                s = sums[name]
                s[0], s[1], s[2] = s[0] + a.T @ a, s[1] + g.T @ g, s[2] + len(a)
            n_examples += len(y)
    finally:
        for h in hooks:
            h.remove()
    state.extra["kfac.n"] = torch.tensor(n_examples)
    factors = {}
    for name, (a_sum, g_sum, rows) in sums.items():
        if rows:
            factors[name] = (a_sum / rows, g_sum / n_examples)
            state.extra[f"kfac.{name}.A"], state.extra[f"kfac.{name}.G"] = factors[name]
    return factors


def _inverse_cholesky(m: torch.Tensor, what: str) -> torch.Tensor:
    chol, info = torch.linalg.cholesky_ex(m)
    if int(info):
        raise ValueError(f"K-FAC factor {what} is not positive definite; use a prior "
                         "precision > 0 (weight_decay or prior_precision)")
    return torch.linalg.solve_triangular(chol, torch.eye(len(m), dtype=m.dtype,
                                                         device=m.device), upper=False)


def _kfac_posterior(state: TrainState) -> list[tuple[nn.Module, torch.Tensor, torch.Tensor]]:
    """Per layer: (module, L_G^-T, L_A^-1) of the damped factors (scale 1 / sqrt(N) not in)."""
    hp, ex = state.hp, state.extra
    n = int(ex["kfac.n"])
    tau = n * hp.weight_decay if hp.prior_precision is None else hp.prior_precision
    eps = tau / n
    out = []
    for name, module in _kfac_layers(state.net).items():
        if f"kfac.{name}.A" not in ex:
            continue
        a, g = ex[f"kfac.{name}.A"], ex[f"kfac.{name}.G"]
        ta, tg = torch.trace(a) / len(a), torch.trace(g) / len(g)
        if not (ta > 0 and tg > 0):
            continue  # a layer the loss does not reach stays at the MAP
        pi = torch.sqrt(ta / tg)
        ia = _inverse_cholesky(a + pi * math.sqrt(eps) * torch.eye(len(a), dtype=a.dtype,
                                                                    device=a.device), name)
        ig = _inverse_cholesky(g + math.sqrt(eps) / pi * torch.eye(len(g), dtype=g.dtype,
                                                                    device=g.device), name)
        out.append((module, ig.T, ia))
    return out


def _kfac_draws(state: TrainState, scale: float, k: int, seed: int) -> Iterator[nn.Module]:
    """``k`` networks ``w_MAP + scale N^-1/2 L_G^-T Z L_A^-1`` (weights restored after)."""
    layers = _kfac_posterior(state)
    n = int(state.extra["kfac.n"])
    with restoring(state.net) as net:
        maps = [(m.weight.detach().clone(), None if m.bias is None else m.bias.detach().clone())
                for m, _, _ in layers]
        for i in range(k):
            g = torch.Generator().manual_seed(sample_seed(seed, i))
            with torch.no_grad():
                for (module, left, right), (w0, b0) in zip(layers, maps):
                    z = torch.randn(len(left), len(right), generator=g, dtype=left.dtype)
                    delta = (scale / math.sqrt(n)) * (left @ z.to(left.device) @ right)
                    delta = delta.to(w0.dtype)
                    cols = w0[0].numel()
                    module.weight.copy_(w0 + delta[:, :cols].reshape(w0.shape))
                    if b0 is not None:
                        module.bias.copy_(b0 + delta[:, cols])
            update_batchnorm(state, state.hp.bn_update)
            yield net


def _validation_nll(state: TrainState, nets: Iterator[nn.Module], loader) -> float:
    """NLL of the equal-weight mixture of the networks' predictives on ``loader``."""
    batches = [(b[0].to(state.device), b[1].to(state.device)) for b in loader]
    logliks = []
    with torch.no_grad():
        for net in nets:
            logliks.append(torch.cat([-state.nll(net(x), y, reduction="none").double()
                                      for x, y in batches]))
    stacked = torch.stack(logliks)
    return float(-(torch.logsumexp(stacked, 0) - math.log(len(stacked))).mean())


def search_scale(scales, objective, max_extensions: int) -> tuple[list[float], list[float],
                                                                   float, bool]:
    """Minimise ``objective`` over the grid ``scales``, extending it past an edge optimum.

    While the best scale is the grid's smallest (and positive) or its largest, one point is
    added beyond that edge at the grid's ratio there (its two outer points; 10 for a
    one-point grid), at most ``max_extensions`` times. Scale 0 (the MAP) is a true lower
    bound and never extended.

    Returns
    -------
    grid : list of float
        Every scale evaluated, ascending.
    values : list of float
        ``objective`` at each.
    best : float
        The minimiser.
    at_edge : bool
        ``best`` is still an extendable edge of the grid (the search ran out of extensions).
    """
    grid = sorted({float(s) for s in scales})
    values = {s: float(objective(s)) for s in grid}

    def edge() -> float | None:
        best = min(grid, key=values.__getitem__)
        if len(grid) > 1 and best == grid[0] and best > 0:
            return best * best / grid[1] if grid[1] > 0 else best / 10
        if best == grid[-1] and (best > 0 or len(grid) == 1):
            ratio = best / grid[-2] if len(grid) > 1 and grid[-2] > 0 else 10.0
            return best * ratio if best > 0 else 1e-2
        return None

    for _ in range(int(max_extensions)):
        new = edge()
        if new is None:
            break
        values[new] = float(objective(new))
        grid = sorted(values)
    best = min(grid, key=values.__getitem__)
    return grid, [values[s] for s in grid], best, edge() is not None


def _laplace_post_fit(state: TrainState, train_loader, val_loader) -> None:
    hp = state.hp
    if train_loader is None:
        raise ValueError("kfac_laplace needs the training data (train_loader) after training")
    kfac_factors(state, train_loader)
    if len(hp.scales) == 1:
        scale = hp.scales[0]
    else:
        if val_loader is None:
            raise ValueError("kfac_laplace tunes its noise scale on validation data: pass "
                             "val_loader, or give a single scale (scales=(s,))")
        grid, nlls, scale, at_edge = search_scale(
            hp.scales, lambda s: _validation_nll(state, _kfac_draws(state, s, hp.tune_samples,
                                                                    seed=0), val_loader),
            hp.max_scale_extensions)
        state.extra["laplace.scales"] = torch.tensor(grid, dtype=torch.float64)
        state.extra["laplace.validation_nll"] = torch.tensor(nlls, dtype=torch.float64)
        state.extra["laplace.scale_at_edge"] = torch.tensor(int(at_edge))
        if at_edge:
            logger.warning("kfac_laplace: the best noise scale %g is on the edge of the "
                           "searched grid %s after %d extensions (validation NLL still "
                           "falling): recorded as laplace.scale_at_edge", scale, grid,
                           hp.max_scale_extensions)
    state.extra["laplace.scale"] = torch.tensor(float(scale), dtype=torch.float64)


def _laplace_samples(state: TrainState, k: int, seed: int = 0) -> Iterator[nn.Module]:
    check_k(k)
    if "laplace.scale" not in state.extra:
        raise ValueError("kfac_laplace has no fitted posterior: call method.finish(state, "
                         "train_loader, val_loader) after training")
    return _kfac_draws(state, float(state.extra["laplace.scale"]), k, seed)


TRAINING_METHODS.register(TrainingMethod(
    name="kfac_laplace",
    description="K-FAC Laplace: empirical Fisher, pi-corrected damping, noise scale tuned on "
                "validation (Ritter et al.)",
    hparams=LaplaceHParams, paper=LaplaceHParams(epochs=300),
    post_fit=_laplace_post_fit, samples=_laplace_samples))
