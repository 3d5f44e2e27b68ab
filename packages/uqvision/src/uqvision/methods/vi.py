"""Variational inference as a :class:`~uqvision.training.method.TrainingMethod` entry: a fully
factorised Gaussian over the weights of every ``nn.Linear`` and ``nn.Conv2d`` (the VI layers
:class:`VILinear`, :class:`VIConv2d`), trained after a conventional pre-training, and its
per-example prediction noise (:class:`PerSampleVINoise`).

The probabilistic model is Pitfalls' (eqs. 6-9, :mod:`uqvision.methods.bayesian`).

References
----------
.. [1] Ashukha et al. Pitfalls of in-domain uncertainty estimation and ensembling in deep
   learning. ICLR 2020, appendix B.
.. [2] Kingma, Salimans, Welling. Variational dropout and the local reparameterization trick.
   NeurIPS 2015.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..data import derive_seed
from ..training.method import (
    TRAINING_METHODS,
    HParams,
    OptimizerChain,
    TrainingMethod,
    TrainState,
    check_fields,
    epochs_to_steps,
    replace_submodule,
    stochastic_passes,
)
from ..training.schedules import linear_decay_lr

__all__ = [
    "PerSampleVINoise",
    "VIConv2d",
    "VIHParams",
    "VILinear",
    "variational_layers",
]


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
