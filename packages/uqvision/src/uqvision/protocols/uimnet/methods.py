"""The UIMNET algorithms (docs/conventions.md#v-3) as
:class:`~uqvision.training.method.TrainingMethod` entries: ``erm``, ``mixup``,
``soft_labeler``, ``mimo``, ``rbf``, ``rnd``, ``oc``, ``deep_ae`` and ``due`` (``mc_dropout``
is the entry of :mod:`~uqvision.methods.ensembling`).

Every algorithm wraps a :class:`FeatureClassifier` (featurizer φ + linear classifier w) and
returns a module whose eval-mode forward gives logits of shape (n, C), with ``features(x)`` →
φ(x) of shape (n, d) and ``native(x)`` → the algorithm's own uncertainty, shape (n,) (NaN when
it has none). Training-mode behaviour that needs the batch (Mixup's pairs, MIMO's multi-input
batch) happens inside the wrapper's forward, so the one loop's ``step`` drives every algorithm
unchanged. Spectral normalisation is an option of every algorithm, applied to the base model
before ``method.start`` (:func:`uqvision.models.spectral.spectral_normalize`; DUE always applies it).

Hyper-parameters: :class:`OODRecipe` (SGD, momentum 0.9, lr 0.1, wd 1e-4 as the paper's
ImageNet recipe; ``linear_decay`` schedule in place of its ÷10 every 30 of 100 epochs, and the
epoch count of the scale). :data:`SEARCH_SPACES` draws the random trials; trial 0 is the
default configuration. The seed text has no appendix grids, so the ranges are stand-ins chosen
around each method's authors' defaults (recorded with every result).

References
----------
.. [1] Bouchacourt et al. UIMNET, Section 3 and Section 4 (native measures).
.. [2] Zhang et al. mixup, 2017. .. [3] Havasi et al. MIMO, ICLR 2021.
.. [4] Burda et al. RND, 2018. .. [5] Tagasovska & Lopez-Paz. Orthogonal certificates, 2018.
.. [6] van Amersfoort et al. DUE, 2021. .. [7] Miyato et al. Spectral normalization, 2018.

The module is one concern in more than 600 lines, the paper's set of algorithms: each of the
nine is a few dozen lines (hyper-parameters, wrapper network, loss, search space) registered
through the shared :class:`FeatureClassifier`, :class:`OODRecipe` and ``_register``, and
:data:`UIMNET_ALGORITHMS` and :data:`SEARCH_SPACES` are complete only with all of them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import timm
import torch
import torch.nn.functional as F
from torch import nn
from uqmetrics.metrics.registry import Registry

from ...methods.ensembling import single_network
from ...models import archs  # noqa: F401  (registers the architecture)
from ...models.spectral import spectral_normalize
from ...training.method import (
    TRAINING_METHODS,
    TrainingMethod,
    TrainRecipe,
    TrainState,
    check_fields,
)
from . import UIMNET_ALGORITHMS

__all__ = [
    "SEARCH_SPACES",
    "UIMNET_ALGORITHMS",
    "FeatureClassifier",
    "OODRecipe",
    "feature_classifier",
    "mimo_batch",
    "mixup_loss",
    "oc_penalty",
    "rbf_transform",
    "small_cnn",
    "soft_targets",
    "spectral_normalize",
    "student_width",
]

#: name -> ``f(rng: numpy.random.Generator) -> dict`` of hyper-parameter overrides (a trial).
SEARCH_SPACES: Registry[Callable[[np.random.Generator], dict]] = Registry("search space")


# -- the base network ----------------------------------------------------------------------
class FeatureClassifier(nn.Module):
    """``w(φ(x))``: a featurizer ``backbone`` (x -> (n, d)) and a linear ``classifier``.

    It has timm's classifier interface (``forward_features`` gives φ(x), ``forward_head(f,
    pre_logits=True)`` gives ``f`` back, ``get_classifier``), so the one prediction path
    caches its embeddings like a timm model's.
    """

    def __init__(self, backbone: nn.Module, num_features: int, num_classes: int):
        super().__init__()
        self.backbone = backbone
        self.num_features, self.num_classes = int(num_features), int(num_classes)
        self.classifier = nn.Linear(num_features, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))

    def native(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full((x.shape[0],), math.nan, device=x.device)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return x if pre_logits else self.classifier(x)

    def get_classifier(self) -> nn.Module:
        return self.classifier


def feature_classifier(model: nn.Module) -> FeatureClassifier:
    """A timm classifier as featurizer + linear head: its pooled pre-logits features
    (``reset_classifier(0)``, in place) and a new ``nn.Linear`` of its class count. A
    :class:`FeatureClassifier` is returned as it is."""
    if isinstance(model, FeatureClassifier):
        return model
    if not (hasattr(model, "reset_classifier") and hasattr(model, "num_features")):
        raise TypeError("UIMNET algorithms wrap a featurizer + linear classifier: a timm "
                        f"classifier or a FeatureClassifier, got {type(model).__name__}")
    num_classes = int(model.num_classes)
    model.reset_classifier(0)
    return FeatureClassifier(model, model.num_features, num_classes)


def small_cnn(num_classes: int, *, width: int = 32, in_chans: int = 3) -> FeatureClassifier:
    """timm's ``uqvision_cnn`` (:mod:`uqvision.models.archs`) as a :class:`FeatureClassifier`
    (features of size ``4 * width``): the stand-in for the paper's ResNet-18/50."""
    return feature_classifier(timm.create_model("uqvision_cnn", num_classes=num_classes,
                                                width=width, in_chans=in_chans))


# -- hyper-parameters ----------------------------------------------------------------------
@dataclass(frozen=True)
class OODRecipe(TrainRecipe):
    """ERM's recipe, shared by every UIMNET algorithm (epochs set by the scale)."""

    batch_size: int = 64
    epochs: float = 10
    lr_init: float = 0.1
    weight_decay: float = 1e-4


def _recipe_space(rng: np.random.Generator) -> dict:
    return {"lr_init": float(10 ** rng.uniform(-2, -0.5)),
            "weight_decay": float(10 ** rng.uniform(-5, -3))}


def _register(name: str, description: str, hparams: type, space: Callable | None = None,
              **hooks) -> None:
    TRAINING_METHODS.register(TrainingMethod(
        name=name, description=description, hparams=hparams, samples=single_network,
        independent_runs=True, **hooks))
    SEARCH_SPACES.add(name, lambda rng: {**_recipe_space(rng), **(space(rng) if space else {})})


# -- ERM -----------------------------------------------------------------------------------
_register("erm", "empirical risk minimisation (cross-entropy)", OODRecipe,
          wrap_model=lambda model, hp: feature_classifier(model))


# -- Mixup ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class MixupHParams(OODRecipe):
    """``alpha``: λ ~ Beta(α, α); ``native_refs``: training examples kept for the native
    measure."""

    alpha: float = 0.3
    native_refs: int = 8

    def __post_init__(self):
        super().__post_init__()
        check_fields(self, positive=("alpha", "native_refs"))


def mixup_loss(logits: torch.Tensor, y: torch.Tensor, perm: torch.Tensor,
               lam: float) -> torch.Tensor:
    """``λ·CE(f(x̃), y) + (1 − λ)·CE(f(x̃), y[perm])`` = CE against the mixed one-hot target
    ``λ y + (1 − λ) y[perm]`` (x̃ = λ x + (1 − λ) x[perm])."""
    return lam * F.cross_entropy(logits, y) + (1 - lam) * F.cross_entropy(logits, y[perm])


class MixupNet(nn.Module):
    """Training forward: mixes the batch with a random permutation (global torch RNG) and
    keeps ``(perm, lam)`` for the loss. ``native``: the Mixup criterion against saved
    training examples (set by ``post_fit``)."""

    def __init__(self, base: FeatureClassifier, alpha: float, native_refs: int):
        super().__init__()
        self.base, self.alpha, self.native_refs = base, float(alpha), int(native_refs)
        self.mixed: tuple[torch.Tensor, float] | None = None
        self.register_buffer("ref_x", torch.empty(0))
        self.register_buffer("ref_y", torch.empty(0))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # the saved training examples are sized by post_fit: take the checkpoint's sizes
        for name in ("ref_x", "ref_y"):
            if prefix + name in state_dict:
                setattr(self, name, torch.empty_like(state_dict[prefix + name]))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def features(self, x):
        return self.base.features(x)

    def forward(self, x):
        if self.training:
            lam = float(np.random.default_rng(int(torch.randint(2**31, ()))).beta(self.alpha,
                                                                                 self.alpha))
            perm = torch.randperm(x.shape[0], device=x.device)
            self.mixed = (perm, lam)
            x = lam * x + (1 - lam) * x[perm]
        return self.base(x)

    @torch.no_grad()
    def native(self, x):
        """``mean_k ||λ f(x) + (1−λ) ȳ_k − f(λ x + (1−λ) x̄_k)||²`` with f the softmax, λ ~
        Beta(α, α) from a fixed seed (the same λ's for every call)."""
        if self.ref_x.numel() == 0:
            raise RuntimeError("mixup native measure needs the saved training examples "
                               "(finish() with a train_loader)")
        lams = np.random.default_rng(0).beta(self.alpha, self.alpha, len(self.ref_x))
        p = torch.softmax(self.base(x), -1)
        total = torch.zeros(x.shape[0], device=x.device)
        for lam, rx, ry in zip(lams, self.ref_x, self.ref_y, strict=True):
            yk = F.one_hot(ry, p.shape[1]).to(p)
            pm = torch.softmax(self.base(lam * x + (1 - lam) * rx), -1)
            total += ((lam * p + (1 - lam) * yk - pm) ** 2).sum(-1)
        return total / len(lams)


def _mixup_loss(state: TrainState, out, y):
    perm, lam = state.net.mixed
    return mixup_loss(out, y, perm, lam)


def _mixup_post_fit(state: TrainState, train_loader, val_loader):
    net = state.net
    if train_loader is None:
        return
    xs, ys = [], []
    for x, y, *_ in train_loader:
        xs.append(x)
        ys.append(y)
        if sum(len(t) for t in xs) >= net.native_refs:
            break
    net.ref_x = torch.cat(xs)[:net.native_refs].to(state.device)
    net.ref_y = torch.cat(ys)[:net.native_refs].to(state.device)


_register("mixup", "ERM on mixed examples (Zhang et al.); native: the Mixup criterion",
          MixupHParams, lambda rng: {"alpha": float(rng.uniform(0.1, 1.0))},
          wrap_model=lambda model, hp: MixupNet(feature_classifier(model), hp.alpha, hp.native_refs),
          loss=_mixup_loss, post_fit=_mixup_post_fit)


# -- soft labeler --------------------------------------------------------------------------
@dataclass(frozen=True)
class SoftLabelHParams(OODRecipe):
    """``smoothing`` ε: targets ``ℓ_max = 1 − ε + ε/C`` and ``ℓ_min = ε/C``."""

    smoothing: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.smoothing < 1:
            raise ValueError(f"smoothing must be in (0, 1), got {self.smoothing!r}")


def soft_targets(y: torch.Tensor, num_classes: int, smoothing: float) -> torch.Tensor:
    """One-hot labels with every zero raised to ``ε/C`` and the one lowered to
    ``1 − ε + ε/C``, shape (n, C)."""
    low = smoothing / num_classes
    return F.one_hot(y, num_classes).to(torch.float32) * (1 - smoothing) + low


class SoftLabelNet(nn.Module):
    def __init__(self, base: FeatureClassifier, smoothing: float):
        super().__init__()
        self.base, self.smoothing = base, float(smoothing)

    def features(self, x):
        return self.base.features(x)

    def forward(self, x):
        return self.base(x)

    @torch.no_grad()
    def native(self, x):
        """Over-shoot ``(s_(1) − ℓ_max)²``."""
        p = torch.softmax(self.base(x), -1)
        l_max = 1 - self.smoothing + self.smoothing / p.shape[1]
        return (p.max(-1).values - l_max) ** 2


def _soft_loss(state: TrainState, out, y):
    t = soft_targets(y, out.shape[1], state.hp.smoothing)
    return -(t * F.log_softmax(out, -1)).sum(-1).mean()


_register("soft_labeler", "cross-entropy to smoothed labels; native: soft-label over-shoot",
          SoftLabelHParams, lambda rng: {"smoothing": float(rng.uniform(0.05, 0.5))},
          wrap_model=lambda model, hp: SoftLabelNet(feature_classifier(model), hp.smoothing), loss=_soft_loss)
SEARCH_SPACES.add("mc_dropout", lambda rng: {**_recipe_space(rng),
                                             "p": float(rng.uniform(0.05, 0.5))})


# -- MIMO ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class MIMOHParams(OODRecipe):
    """``members`` M sub-networks sharing one featurizer (M images in, M predictions out)."""

    members: int = 3

    def __post_init__(self):
        super().__post_init__()
        if self.members < 1:
            raise ValueError(f"members must be >= 1, got {self.members!r}")


def mimo_batch(x: torch.Tensor, perms: torch.Tensor) -> torch.Tensor:
    """The multi-input batch: image ``i`` of the result stacks ``x[perms[m, i]]`` for each
    member m along channels, shape (n, M·channels, H, W)."""
    return torch.cat([x[p] for p in perms], dim=1)


class MIMONet(nn.Module):
    """A 1×1 convolution mixes the M stacked images into the featurizer's input; one head
    gives M sets of logits. Eval: the image replicated M times, log of the mean softmax."""

    def __init__(self, base: FeatureClassifier, members: int, in_chans: int = 3):
        super().__init__()
        self.base, self.members = base, int(members)
        self.stem = nn.Conv2d(members * in_chans, in_chans, 1)
        self.head = nn.Linear(base.num_features, members * base.num_classes)
        self.perms: torch.Tensor | None = None

    def member_logits(self, x):
        """Logits of each member, shape (n, M, C), for a multi-input batch x."""
        z = self.head(self.base.features(self.stem(x)))
        return z.view(x.shape[0], self.members, -1)

    def features(self, x):
        return self.base.features(self.stem(x.repeat(1, self.members, 1, 1)))

    def forward(self, x):
        if self.training:
            self.perms = torch.stack([torch.randperm(x.shape[0], device=x.device)
                                      for _ in range(self.members)])
            return self.member_logits(mimo_batch(x, self.perms))
        z = self.member_logits(x.repeat(1, self.members, 1, 1))
        return torch.logsumexp(torch.log_softmax(z, -1), 1) - math.log(self.members)

    def native(self, x):
        return self.base.native(x)


def _mimo_loss(state: TrainState, out, y):
    """``Σ_m CE(member m's logits, y[perm_m])`` (mean over the batch)."""
    perms = state.net.perms
    return sum(F.cross_entropy(out[:, m], y[p]) for m, p in enumerate(perms))


_register("mimo", "M sub-networks in one (Havasi et al.)", MIMOHParams,
          lambda rng: {"members": int(rng.integers(2, 5))},
          wrap_model=lambda model, hp: MIMONet(feature_classifier(model), hp.members), loss=_mimo_loss)


# -- RBF -----------------------------------------------------------------------------------
def rbf_transform(z: torch.Tensor) -> torch.Tensor:
    """``z ↦ exp(−z²)`` applied to the logits before the softmax."""
    return torch.exp(-z ** 2)


class RBFNet(nn.Module):
    def __init__(self, base: FeatureClassifier):
        super().__init__()
        self.base = base

    def features(self, x):
        return self.base.features(x)

    def forward(self, x):
        return rbf_transform(self.base(x))

    def native(self, x):
        return self.base.native(x)


_register("rbf", "logits transformed by exp(-z^2) before the softmax (Broomhead & Lowe)",
          OODRecipe, wrap_model=lambda model, hp: RBFNet(feature_classifier(model)))


# -- RND, OC, DeepAE: a student on the (detached) features --------------------------------
@dataclass(frozen=True)
class StudentHParams(OODRecipe):
    """``width``: the student's output size (RND, OC: certificates k; DeepAE: bottleneck),
    ``0`` = derived from the feature size d by :func:`student_width`; ``width_ratio``: the
    ratio of that rule; ``aux_weight``: weight of the student's loss; ``layers``: Linear
    layers of the student (RND, OC); ``ortho``: OC's orthogonality weight."""

    width: int = 0
    width_ratio: float = 0.5
    aux_weight: float = 1.0
    layers: int = 1
    ortho: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        check_fields(self, positive=("layers",), nonnegative=("width", "aux_weight", "ortho"))
        if not 0 < self.width_ratio < 1:
            raise ValueError(f"width_ratio must lie in (0, 1), got {self.width_ratio!r}")


def student_width(kind: str, d: int, hp: StudentHParams) -> int:
    """The student's output size for features of size ``d``.

    ``hp.width = 0`` derives it: ``max(1, floor(width_ratio · d))``, below d for every ratio
    in (0, 1) (d ≥ 2). An explicit width must fit d: OC has at most d orthonormal
    certificates in ℝ^d (``width <= d``); DeepAE's bottleneck must be narrower than d
    (``width < d``), or the auto-encoder can learn the identity. RND's width is free.

    Raises
    ------
    ValueError
        An explicit ``width`` that does not fit d, or a DeepAE on d = 1 (no bottleneck
        narrower than one feature).

    Examples
    --------
    >>> student_width("oc", 32, StudentHParams()), student_width("deep_ae", 32, StudentHParams())
    (16, 16)
    """
    width = hp.width or max(1, math.floor(hp.width_ratio * d))
    if kind == "oc" and width > d:
        raise ValueError(f"oc: option 'width' = {width} orthonormal certificates do not exist "
                         f"in R^{d} (features of size d = {d}): set width <= {d}, or width=0 "
                         "to derive it from d (width_ratio)")
    if kind == "deep_ae" and width >= d:
        raise ValueError(f"deep_ae: option 'width' = {width} is no bottleneck for features of "
                         f"size d = {d} (the auto-encoder could learn the identity): set "
                         f"width < {d}, or width=0 to derive it from d (width_ratio)")
    return width


def _mlp(d_in: int, d_out: int, layers: int) -> nn.Sequential:
    mods: list[nn.Module] = []
    for i in range(layers):
        mods.append(nn.Linear(d_in if i == 0 else d_out, d_out))
        if i + 1 < layers:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


class StudentNet(nn.Module):
    """ERM classifier plus a student ``s(φ(x))`` trained to match a teacher ``t(φ(x))``:
    RND: a fixed random network; OC: zero; DeepAE: φ(x) itself (the student has a bottleneck).
    ``native(x) = ||s(φ̂(x)) − t(φ̂(x))||²`` (mean over output coordinates; see
    :meth:`disagreement`)."""

    def __init__(self, base: FeatureClassifier, kind: str, hp: StudentHParams):
        super().__init__()
        self.base, self.kind = base, kind
        d = base.num_features
        width = student_width(kind, d, hp)
        self.norm = nn.BatchNorm1d(d, affine=False)
        if kind == "deep_ae":
            self.student = nn.Sequential(nn.Linear(d, width), nn.ReLU(), nn.Linear(width, d))
        else:
            self.student = _mlp(d, width, hp.layers)
        self.teacher = _mlp(d, width, hp.layers) if kind == "rnd" else None
        if self.teacher is not None:
            self.teacher.requires_grad_(False)

    def features(self, x):
        return self.base.features(x)

    def forward(self, x):
        phi = self.base.features(x)
        if self.training:
            self.phi = phi
        return self.base.classifier(phi)

    def disagreement(self, phi: torch.Tensor) -> torch.Tensor:
        """``mean_j (s(φ̂) − t(φ̂))_j²`` per image, φ̂ = the detached features standardised
        by a non-affine BatchNorm (so the student's scale does not follow the featurizer's)."""
        phi = self.norm(phi.detach())
        if self.kind == "rnd":
            target = self.teacher(phi)
        elif self.kind == "oc":
            target = torch.zeros(phi.shape[0], self.student[-1].out_features, device=phi.device)
        else:
            target = phi
        return ((self.student(phi) - target) ** 2).mean(-1)

    @torch.no_grad()
    def native(self, x):
        return self.disagreement(self.base.features(x))


def oc_penalty(student: nn.Module) -> torch.Tensor:
    """``Σ_layers ||W Wᵀ − I||_F²`` over the student's Linear layers (W of shape (out, in):
    orthonormal certificates)."""
    terms = [((m.weight @ m.weight.t() - torch.eye(m.out_features, device=m.weight.device))
              ** 2).sum() for m in student.modules() if isinstance(m, nn.Linear)]
    return sum(terms)


def _student_loss(state: TrainState, out, y):
    net, hp = state.net, state.hp
    loss = state.nll(out, y) + hp.aux_weight * net.disagreement(net.phi).mean()
    if net.kind == "oc":
        loss = loss + hp.ortho * oc_penalty(net.student)
    return loss


def _student_space(rng):
    """The width as a ratio of d (every draw fits any feature size; :func:`student_width`)."""
    return {"width_ratio": float(rng.choice([0.125, 0.25, 0.5, 0.75])),
            "aux_weight": float(10 ** rng.uniform(-1, 1))}


for _kind, _text in (("rnd", "student matching a fixed random teacher on φ (Burda et al.)"),
                     ("oc", "orthogonal certificates mapping φ to zero (Tagasovska & Lopez-Paz)"),
                     ("deep_ae", "auto-encoder of φ with a bottleneck (Vincent et al.)")):
    _register(_kind, _text + "; native: student-teacher disagreement", StudentHParams,
              (lambda rng: {**_student_space(rng), "ortho": float(10 ** rng.uniform(-2, 1))})
              if _kind == "oc" else _student_space,
              wrap_model=lambda model, hp, k=_kind: StudentNet(feature_classifier(model), k, hp),
              loss=_student_loss)


# -- DUE -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DUEHParams(OODRecipe):
    """``inducing``: inducing points of the sparse variational GP; ``coeff``: the featurizer's
    spectral-norm bound; ``likelihood_samples``: Monte-Carlo samples of the softmax likelihood
    at prediction."""

    inducing: int = 20
    coeff: float = 5.0
    likelihood_samples: int = 32
    lr_init: float = 0.05

    def __post_init__(self):
        super().__post_init__()
        check_fields(self, positive=("inducing", "coeff", "likelihood_samples"))


def _gpytorch():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import gpytorch  # heavy: imported on first use (start-up time)
    return gpytorch


def _gp_class():
    gpytorch = _gpytorch()

    class _GP(gpytorch.models.ApproximateGP):
        """One independent sparse variational GP per class over the features (DUE's GP)."""

        def __init__(self, num_features: int, num_classes: int, inducing: int):
            batch = torch.Size([num_classes])
            dist = gpytorch.variational.CholeskyVariationalDistribution(inducing,
                                                                        batch_shape=batch)
            strategy = gpytorch.variational.IndependentMultitaskVariationalStrategy(
                gpytorch.variational.VariationalStrategy(
                    self, torch.randn(inducing, num_features), dist,
                    learn_inducing_locations=True),
                num_tasks=num_classes)
            super().__init__(strategy)
            self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
            self.covar_module = gpytorch.kernels.ScaleKernel(
                gpytorch.kernels.RBFKernel(batch_shape=batch), batch_shape=batch)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x),
                                                             self.covar_module(x))

    return _GP


class DUENet(nn.Module):
    """Spectral-normalised featurizer + sparse variational GP head with a softmax likelihood
    (gpytorch). Training forward returns the GP's distribution (the loss is −ELBO); eval
    forward returns ``log E[softmax(f)]`` (:meth:`predictive`). ``native``: the GP's predictive
    variance summed over classes. The inducing points start at the features of the first
    training batch (DUE initialises them by k-means of training features)."""

    def __init__(self, base: FeatureClassifier, hp: DUEHParams):
        super().__init__()
        gpytorch = _gpytorch()
        self.base = spectral_normalize(base, hp.coeff)
        self.gp = _gp_class()(base.num_features, base.num_classes, hp.inducing)
        self.likelihood = gpytorch.likelihoods.SoftmaxLikelihood(
            num_classes=base.num_classes, mixing_weights=False)
        self.register_buffer("initialised", torch.tensor(False))
        self.samples = hp.likelihood_samples

    def features(self, x):
        return self.base.features(x)

    def _init_inducing(self, phi: torch.Tensor) -> None:
        strategy = self.gp.variational_strategy.base_variational_strategy
        n = strategy.inducing_points.shape[0]
        idx = torch.arange(n, device=phi.device) % phi.shape[0]
        with torch.no_grad():
            pts = phi.detach()[idx] + 1e-3 * torch.randn(n, phi.shape[1], device=phi.device)
            strategy.inducing_points.copy_(pts)
            scale = torch.cdist(phi.detach(), phi.detach()).mean().clamp(min=1e-3)
            self.gp.covar_module.base_kernel.lengthscale = scale
        self.initialised.fill_(True)

    def forward(self, x):
        phi = self.base.features(x)
        if self.training:
            if not bool(self.initialised):
                self._init_inducing(phi)
            return self.gp(phi)
        return torch.log(self.predictive(phi).clamp_min(1e-12))

    def predictive(self, phi: torch.Tensor) -> torch.Tensor:
        """``E[softmax(f)]``, shape (n, C), f ~ the GP's marginal N(μ(φ), σ²(φ)) per class
        (independent GPs, no mixing weights: what gpytorch's ``SoftmaxLikelihood`` samples),
        by Monte Carlo over ``samples`` standard-normal draws fixed once and shared by every
        image (common random numbers): an image's prediction depends on nothing but the image,
        whatever the batch, the process or the global RNG."""
        dist = self.gp(phi)
        mu, sd = dist.mean, dist.variance.sqrt()
        gen = torch.Generator().manual_seed(0)
        eps = torch.randn(self.samples, mu.shape[-1], generator=gen).to(mu)
        return torch.softmax(mu + sd * eps[:, None, :], -1).mean(0)

    @torch.no_grad()
    def native(self, x):
        return self.gp(self.base.features(x)).variance.sum(-1)


def _due_loss(state: TrainState, out, y):
    gpytorch = _gpytorch()
    net = state.net
    elbo = gpytorch.mlls.VariationalELBO(net.likelihood, net.gp, num_data=state.n_train)
    return -elbo(out, y)


_register("due", "spectral-normalised featurizer + sparse variational GP head (gpytorch); "
                 "native: GP predictive variance", DUEHParams,
          lambda rng: {"inducing": int(rng.choice([10, 20, 50]))},
          wrap_model=lambda model, hp: DUENet(feature_classifier(model), hp), loss=_due_loss)
