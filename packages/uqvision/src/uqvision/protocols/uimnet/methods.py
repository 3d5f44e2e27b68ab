"""The UIMNET algorithms (docs/conventions.md#v-3) as
:class:`~uqvision.training.method.TrainingMethod` entries: ``erm``, ``mixup``,
``soft_labeler``, ``mimo``, ``rbf``, ``rnd``, ``oc``, ``deep_ae`` and ``due`` (``mc_dropout``
is the entry of :mod:`~uqvision.methods.ensembling`). MIMO, RBF and DUE, which other protocols
train too, are defined and registered in :mod:`uqvision.methods.mimo`, :mod:`~uqvision.methods.rbf`
and :mod:`~uqvision.methods.due` (moved there, issue 41), on the base network and recipe of
:mod:`uqvision.methods.feature`; this module imports them where the paper lists them (so the
registry keeps its order) and adds their search spaces.

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

The module is one concern, the paper's set of algorithms: each is a few dozen lines
(hyper-parameters, wrapper network, loss, search space) registered through the shared
:class:`FeatureClassifier`, :class:`OODRecipe` and ``_register``, and
:data:`UIMNET_ALGORITHMS` and :data:`SEARCH_SPACES` are complete only with all of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from uqmetrics.metrics.registry import Registry

from ...methods.feature import (
    FeatureClassifier,
    OODRecipe,
    feature_classifier,
    register_feature_method,
    small_cnn,
)
from ...models.spectral import spectral_normalize
from ...training.method import TrainState, check_fields
from . import UIMNET_ALGORITHMS

__all__ = [
    "SEARCH_SPACES",
    "UIMNET_ALGORITHMS",
    "DUEHParams",
    "DUENet",
    "FeatureClassifier",
    "MIMOHParams",
    "MIMONet",
    "OODRecipe",
    "RBFNet",
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


def _recipe_space(rng: np.random.Generator) -> dict:
    return {"lr_init": float(10 ** rng.uniform(-2, -0.5)),
            "weight_decay": float(10 ** rng.uniform(-5, -3))}


def _search(name: str, space: Callable | None = None) -> None:
    """``name``'s trials: the recipe's draws, then ``space``'s (the method's own)."""
    SEARCH_SPACES.add(name, lambda rng: {**_recipe_space(rng), **(space(rng) if space else {})})


def _register(name: str, description: str, hparams: type, space: Callable | None = None,
              **hooks) -> None:
    register_feature_method(name, description, hparams, **hooks)
    _search(name, space)


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


# -- MIMO, RBF: uqvision.methods.mimo and .rbf, registered on import (here: the paper's order) --
from ...methods.mimo import MIMOHParams, MIMONet, mimo_batch
from ...methods.rbf import RBFNet, rbf_transform

_search("mimo", lambda rng: {"members": int(rng.integers(2, 5))})
_search("rbf")


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


# -- DUE: uqvision.methods.due, registered on import (here: the paper's order) --------------
from ...methods.due import DUEHParams, DUENet

_search("due", lambda rng: {"inducing": int(rng.choice([10, 20, 50]))})
