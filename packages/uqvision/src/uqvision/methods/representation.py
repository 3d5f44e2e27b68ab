"""The eleven URL representation learners (V.4) as :data:`TRAINING_METHODS` entries, shared:
URL (:mod:`uqvision.protocols.url`) trains all of them, other protocols those they need (HET-XL,
SNGP, loss prediction, the 10-head ensemble as classifiers).

Names as in the issue: ``ce``, ``infonce``, ``mcinfonce``, ``elk``, ``nivmf``, ``hib``,
``hetxl``, ``sngp``, ``losspred``, ``ensemble``, ``mcdropout``. Each fine-tunes a
:class:`~uqvision.methods.uncertainty_heads.URLModel` (build it with :func:`build_model` from a
backbone that maps images to embeddings; ``uqvision.training.loop.train_model`` does it through the method's
``wrap_model`` hook from a timm classifier checkpoint) with the paper's recipe shape: Lamb (``timm.optim.Lamb``), the learning
rate held low for the first epochs, warmed up, then cosine-annealed (``warmup_cosine``), and
``accumulate`` micro-batches per optimiser step (the paper: 16 x 128 = 2048; the CPU stand-in
defaults are smaller). Losses follow the paper's appendix B, equations (1)-(8); u is the
method's :data:`uqvision.methods.uncertainty_heads.U_FUNCTIONS` entry (``hp.u``).

Unsupervised methods (InfoNCE, MCInfoNCE) see two random views of each image, made inside the
model from the batch (:func:`two_views`, seeded by the run's generator).

Methods with the 3-layer uncertainty MLP (MCInfoNCE, ELK, nivMF, HIB, Losspred) have the
paper's option of "warming up" its initial value to 0.001 (appendix B; the official code's
``--unc_start_value``): ``u_start`` > 0 rescales the MLP before the first step so that its mean
uncertainty on the first training batch is ``u_start``
(:meth:`uqvision.methods.uncertainty_heads.URLModel.calibrate_u`); 0 keeps the random initialisation. Defaults
are the official code's published ResNet-50 choices: 0.001 for MCInfoNCE and nivMF, 0 for ELK,
HIB and Losspred.

Every method yields one network per run (``independent_runs``): its prediction goes through
:func:`uqvision.predict.predict` like any checkpoint, which asks the :class:`URLModel` for
``(logits, u, embedding)``.

References
----------
M. Kirchhof, B. Mucsányi, S. J. Oh, E. Kasneci, "URL: A representation learning benchmark for
transferable uncertainty estimates", NeurIPS 2023 Datasets and Benchmarks (appendix B).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from timm.optim import Lamb
from torch import nn

from ..training.method import (
    OPTIMIZERS,
    TRAINING_METHODS,
    HParams,
    TrainingMethod,
    TrainState,
    check_fields,
    check_k,
    epochs_to_steps,
)
from ..training.schedules import SCHEDULES
from .uncertainty_heads import U_FUNCTIONS, U_HEADS, URLModel
from .vmf import sample_vmf

__all__ = [
    "Accumulating",
    "URLHParams",
    "build_model",
    "hib_loss",
    "hib_match_probability",
    "infonce_loss",
    "two_views",
    "warmup_cosine_lr",
]


# -- recipe --------------------------------------------------------------------------------
def warmup_cosine_lr(step: int, total_steps: int, steps_per_epoch: int, lr: float, *,
                     fixed_epochs: float = 1 / 32, warmup_epochs: float = 5 / 32,
                     start_factor: float = 0.1) -> float:
    """URL's schedule: constant at ``start_factor * lr`` for ``fixed_epochs``, linear warm-up to
    ``lr`` over ``warmup_epochs``, then cosine annealing towards 0 at ``total_steps``.

    ``fixed_epochs`` and ``warmup_epochs`` are fractions of the run (paper: 1 and 5 of 32
    epochs). **Decision**: the paper does not give the fixed rate; 0.1 lr.

    Examples
    --------
    >>> [round(warmup_cosine_lr(s, 32, 1, 1.0), 3) for s in (0, 1, 6, 19, 32)]
    [0.1, 0.1, 1.0, 0.5, 0.0]
    """
    pos = step / max(total_steps, 1)
    if pos < fixed_epochs:
        return start_factor * lr
    if pos < fixed_epochs + warmup_epochs:
        frac = (pos - fixed_epochs) / warmup_epochs
        return lr * (start_factor + (1 - start_factor) * frac)
    rest = (pos - fixed_epochs - warmup_epochs) / max(1e-12, 1 - fixed_epochs - warmup_epochs)
    return lr * 0.5 * (1 + math.cos(math.pi * min(rest, 1.0)))


SCHEDULES.add("warmup_cosine", warmup_cosine_lr)


@OPTIMIZERS.register(name="lamb")
def _lamb(params, hp) -> torch.optim.Optimizer:
    """timm's Lamb with hp.weight_decay (URL's optimiser)."""
    return Lamb(params, lr=0.0, weight_decay=hp.weight_decay)


class Accumulating:
    """An optimiser that steps once every ``every`` calls, on the mean of their gradients.

    The loop calls ``zero_grad(); loss.backward(); step()`` per micro-batch; gradients are
    only cleared after a real step, so ``every`` micro-batches of mean losses add up and are
    divided by ``every`` before the inner step.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, every: int):
        if every < 1:
            raise ValueError(f"accumulate must be >= 1, got {every!r}")
        self.optimizer, self.every, self.pending = optimizer, int(every), 0

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.pending == 0:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        self.pending += 1
        if self.pending < self.every:
            return
        if self.every > 1:
            for g in self.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        p.grad /= self.every
        self.optimizer.step()
        self.pending = 0

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)


@dataclass(frozen=True)
class URLHParams(HParams):
    """Shared recipe (paper: 32 epochs, Lamb, lr in [1e-4, 1e-2], 16 x 128 accumulated).

    CPU stand-in defaults: 6 epochs, micro-batches of 32, 2 accumulated. ``u`` names the
    :data:`~uqvision.methods.uncertainty_heads.U_FUNCTIONS` entry used as uncertainty; ``backbone_lr_factor``
    scales the backbone's rate against the heads'.
    """

    batch_size: int = 32
    weight_decay: float = 0.01
    epochs: float = 6
    lr: float = 2e-3
    accumulate: int = 2
    optimizer: str = "lamb"
    schedule: str = "warmup_cosine"
    u: str = "class_entropy"

    def __post_init__(self):
        super().__post_init__()
        own = {f for f in ("t", "samples", "rank", "features", "ridge", "heads", "passes")
               if hasattr(self, f)}
        check_fields(self, positive=("epochs", "lr", "accumulate", *sorted(own)),
                     nonnegative=tuple(f for f in ("lam", "u_start") if hasattr(self, f)),
                     choices={"optimizer": OPTIMIZERS, "schedule": SCHEDULES,
                              "u": U_FUNCTIONS})
        if not 0 <= getattr(self, "dropout", 0) < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")


@dataclass(frozen=True)
class TemperatureHParams(URLHParams):
    """(inverse) temperature t in [8, 64] (InfoNCE, ELK)."""

    t: float = 16.0
    u: str = "inverse_norm"


@dataclass(frozen=True)
class SampledHParams(TemperatureHParams):
    """t, the Monte-Carlo samples per embedding (MCInfoNCE, nivMF: 16) and ``u_start``, the
    start value of the mean 1/kappa (0: random initialisation; official code: 0.001)."""

    samples: int = 16
    u: str = "inverse_kappa"
    u_start: float = 0.001


@dataclass(frozen=True)
class ELKHParams(TemperatureHParams):
    """ELK: t and ``u_start`` (official ResNet-50 choice: 0, random initialisation)."""

    u: str = "inverse_kappa"
    u_start: float = 0.0


@dataclass(frozen=True)
class HIBHParams(SampledHParams):
    """HIB: t in [8, 64], bias b in [-8, 8], 16 samples, ``u_start`` (official: 0)."""

    bias: float = 0.0
    u_start: float = 0.0


@dataclass(frozen=True)
class HetXLHParams(URLHParams):
    """HET-XL: covariance rank 1 (paper), MC samples; u = class entropy or covariance_logdet."""

    rank: int = 1
    samples: int = 16


@dataclass(frozen=True)
class SNGPHParams(URLHParams):
    """SNGP: random features, ridge of the precision, last-layer norm, spectral norm."""

    features: int = 256
    ridge: float = 1.0
    layer_norm: bool = True
    spectral_norm: bool = False


@dataclass(frozen=True)
class LosspredHParams(URLHParams):
    """Losspred: lambda in [0.01, 0.99]; u = the predicted loss."""

    lam: float = 0.5
    u: str = "predicted_loss"
    u_start: float = 0.0


@dataclass(frozen=True)
class EnsembleHParams(URLHParams):
    """Ensemble: 10 heads on the shared backbone (paper)."""

    heads: int = 10


@dataclass(frozen=True)
class MCDropoutHParams(URLHParams):
    """MC dropout: rate in [0.05, 0.25], 10 passes averaged."""

    dropout: float = 0.1
    passes: int = 10


# -- losses (appendix B) -------------------------------------------------------------------
def infonce_loss(e1: torch.Tensor, e2: torch.Tensor, t: float) -> torch.Tensor:
    """Eq. (1), mean over the batch (and over any leading sample axes).

    Parameters
    ----------
    e1, e2 : Tensor, shape (..., b, d)
        The two views' embeddings (normalised here); ``b >= 2``.
    t : float
        Inverse temperature.

    Notes
    -----
    ``L_i = -t e1_i.e2_i + log sum_{n in N_i} exp(t e1_i.n) + log sum_{n in N_i} exp(t e2_i.n)``
    with **Decision**: the negatives ``N_i`` of image i are both views of every other image of
    the batch (2b - 2 embeddings).
    """
    if e1.shape[-2] < 2:
        raise ValueError(f"InfoNCE needs a batch of >= 2 images, got shape {tuple(e1.shape)}")
    e1, e2 = F.normalize(e1, dim=-1), F.normalize(e2, dim=-1)
    b = e1.shape[-2]
    both = torch.cat([e1, e2], dim=-2)  # (..., 2b, d)
    eye = torch.eye(b, dtype=torch.bool, device=e1.device)
    own = torch.cat([eye, eye], dim=-1)  # row i excludes columns i and b + i
    neg = lambda e: torch.logsumexp((t * e @ both.transpose(-1, -2)).masked_fill(own, -math.inf),
                                    dim=-1)
    return (-t * (e1 * e2).sum(-1) + neg(e1) + neg(e2)).mean()


def hib_match_probability(s: torch.Tensor, t: float, bias: float) -> torch.Tensor:
    """HIB's match probability of every pair from samples: ``mean_i sigmoid(t s_ni.s_mi + b)``.

    Parameters
    ----------
    s : Tensor, shape (k, b, d)
        k samples of each of b embeddings.

    Returns
    -------
    Tensor, shape (b, b)

    Notes
    -----
    **Decision**: the paper prints a sum over the 16 samples; a probability needs the mean
    (the sum is 16 times it and makes ``log p`` positive).
    """
    return torch.sigmoid(t * s @ s.transpose(-1, -2) + bias).mean(0)


def hib_loss(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Eq. (5): ``-mean_{same} log p_nm + mean_{different} log p_nm``, self-pairs excluded."""
    same = y[:, None] == y[None, :]
    off = ~torch.eye(len(y), dtype=torch.bool, device=y.device)
    logp = p.clamp_min(1e-12).log()
    loss = p.new_zeros(())
    if (same & off).any():
        loss = loss - logp[same & off].mean()
    if (~same).any():
        loss = loss + logp[~same].mean()
    return loss


def _sampled(state: TrainState, out: dict, n: int) -> torch.Tensor:
    return sample_vmf(F.normalize(out["embedding"], dim=-1), out["scalar"], n, state.generator)


def _ce(state, out, y):
    return F.cross_entropy(out["logits"], y)


def _infonce(state, out, y):
    e1, e2 = out["embedding"].chunk(2)
    return infonce_loss(e1, e2, state.hp.t)


def _mcinfonce(state, out, y):
    s = _sampled(state, out, state.hp.samples)  # (k, 2b, d)
    e1, e2 = s.chunk(2, dim=1)
    return infonce_loss(e1, e2, state.hp.t)


def _hib(state, out, y):
    p = hib_match_probability(_sampled(state, out, state.hp.samples), state.hp.t, state.hp.bias)
    return hib_loss(p, y)


def _losspred(state, out, y):
    ce = F.cross_entropy(out["logits"], y, reduction="none")
    return ce.mean() + state.hp.lam * ((out["scalar"] - ce.detach()) ** 2).mean()


# -- the methods ---------------------------------------------------------------------------
@dataclass(frozen=True)
class _Spec:
    head: str
    views: int = 1
    scalar_u: int = -1  # the MLP's output is kappa = 1/u (-1) or u itself (1, Losspred)


_SPECS: dict[str, _Spec] = {}


def build_model(method: str, backbone: nn.Module, n_classes: int, hp=None,
                embed_dim: int | None = None) -> URLModel:
    """The :class:`URLModel` that ``method`` trains: ``backbone`` (images -> (b, d)) + its head.

    ``embed_dim`` defaults to timm's ``backbone.num_features``. SNGP with
    ``spectral_norm=True`` puts spectral normalisation on every Linear and Conv2d layer.
    """
    spec = _SPECS.get(method)
    if spec is None:
        raise ValueError(f"method must be one of {', '.join(_SPECS)}, "
                         f"got {method!r}")
    hp = hp or TRAINING_METHODS.lookup(method).hparams()
    d = embed_dim or int(backbone.num_features)
    if getattr(hp, "spectral_norm", False):
        for name, m in list(backbone.named_modules()):
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                torch.nn.utils.parametrizations.spectral_norm(m)
    model = URLModel(backbone, U_HEADS.lookup(spec.head)(d, n_classes, hp), hp.u,
                     u_start=getattr(hp, "u_start", 0.0), scalar_u=spec.scalar_u)
    model.views = spec.views
    return model


def two_views(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Two random views of each image (scale in [0.5, 1] of the side, shift, flip), (2b, ...)."""
    views = []
    b = x.shape[0]

    def r():
        return torch.rand(b, generator=generator, device=x.device)

    for _ in range(2):
        scale = 0.5 + 0.5 * r()
        flip = torch.where(r() < 0.5, -1.0, 1.0)
        tx, ty = (1 - scale) * (2 * r() - 1), (1 - scale) * (2 * r() - 1)
        theta = torch.zeros(b, 2, 3, device=x.device, dtype=x.dtype)
        theta[:, 0, 0], theta[:, 1, 1] = scale * flip, scale
        theta[:, 0, 2], theta[:, 1, 2] = tx, ty
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        views.append(F.grid_sample(x, grid, align_corners=False, padding_mode="reflection"))
    return torch.cat(views)


def _before_step(state) -> None:
    net = state.net
    net.set_generator(state.generator)
    net.views_fn = two_views if getattr(net, "views", 1) == 2 else None


def _make_optimizer(model: nn.Module, hp) -> Accumulating:
    return Accumulating(OPTIMIZERS.lookup(hp.optimizer)(model.parameters(), hp), hp.accumulate)


def _total_steps(hp, steps_per_epoch: int) -> int:
    return epochs_to_steps(hp.epochs, steps_per_epoch)


def _lr_at(step: int, steps_per_epoch: int, hp) -> float:
    total = _total_steps(hp, steps_per_epoch)
    held = step - step % hp.accumulate  # one rate per optimiser step
    return SCHEDULES.lookup(hp.schedule)(held, total, steps_per_epoch, hp.lr)


def _single(state, k: int, seed: int):
    check_k(k, 1, "network (one per run)")
    state.net.eval()
    yield state.net


@torch.no_grad()
def _sngp_post_fit(state, train_loader, val_loader) -> None:
    """Precision I * ridge + Phi^T Phi over the training set (eval mode), then invert."""
    head = state.net.head
    state.net.eval()
    head.reset_precision()
    for x, *_ in train_loader or ():
        phi = head.features(state.net.backbone(x.to(state.device)))
        head.precision += phi.T @ phi
    head.finalize()


def _wrapper(name: str):
    def wrap(model: nn.Module, hp) -> URLModel:
        """A timm classifier (or an embedding backbone) -> the method's URLModel."""
        if isinstance(model, URLModel):
            return model
        n_classes = int(model.num_classes)
        model.reset_classifier(0)
        device = next(model.parameters()).device
        return build_model(name, model, n_classes, hp).to(device)

    return wrap


def _register(name, description, hparams, head, loss, views=1, post_fit=None,
              scalar_u=-1) -> None:
    _SPECS[name] = _Spec(head, views, scalar_u)
    extra = {"post_fit": post_fit} if post_fit else {}
    TRAINING_METHODS.add(name, TrainingMethod(
        name=name, description=description, hparams=hparams, samples=_single,
        total_steps=_total_steps, lr_at=_lr_at, wrap_model=_wrapper(name),
        make_optimizer=_make_optimizer, before_step=_before_step, loss=loss,
        independent_runs=True, **extra))


_register("ce", "URL: cross-entropy, u = class entropy (eq. B.1)", URLHParams, "linear", _ce)
_register("infonce", "URL: InfoNCE on two views (eq. 1), u = 1/||e||", TemperatureHParams,
          "linear", _infonce, views=2)
_register("mcinfonce", "URL: InfoNCE on vMF samples (eq. 2), u = 1/kappa", SampledHParams,
          "linear_mlp", _mcinfonce, views=2)
_register("elk", "URL: expected likelihood kernel to vMF proxies (eq. 3), u = 1/kappa",
          ELKHParams, "elk", _ce)
_register("nivmf", "URL: MC expected likelihood to non-isotropic vMF proxies (eq. 4)",
          SampledHParams, "nivmf", _ce)
_register("hib", "URL: hedged instance embeddings, match probabilities (eq. 5), u = 1/kappa",
          HIBHParams, "linear_mlp", _hib)
_register("hetxl", "URL: HET-XL low-rank heteroscedastic softmax (eq. 6)", HetXLHParams,
          "hetxl", _ce)
_register("sngp", "URL: SNGP random-feature GP, mean-field (eq. 7)", SNGPHParams, "sngp", _ce,
          post_fit=_sngp_post_fit)
_register("losspred", "URL: CE + lambda (u - CE.detach())^2 (eq. 8)", LosspredHParams,
          "linear_mlp", _losspred, scalar_u=1)
_register("ensemble", "URL: 10 heads on one backbone, mean probability under CE (B.10)",
          EnsembleHParams, "ensemble", _ce)
_register("mcdropout", "URL: dropout before the classifier, 10 passes averaged (B.11)",
          MCDropoutHParams, "dropout", _ce)
