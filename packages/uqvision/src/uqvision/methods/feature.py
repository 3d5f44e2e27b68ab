"""Featurizer + linear classifier: the base network of the single-network methods that wrap
a timm classifier (UIMNET's algorithms, V.3, and the methods other protocols share with it:
:mod:`~uqvision.methods.mimo`, :mod:`~uqvision.methods.rbf`, :mod:`~uqvision.methods.due`),
their shared recipe, and the registration of such a method.

Every such method wraps a :class:`FeatureClassifier` (featurizer φ + linear classifier w) and
returns a module whose eval-mode forward gives logits of shape (n, C), with ``features(x)`` →
φ(x) of shape (n, d) and ``native(x)`` → the method's own uncertainty, shape (n,) (NaN when
it has none). Training-mode behaviour that needs the batch (MIMO's multi-input batch) happens
inside the wrapper's forward, so the one loop's ``step`` drives every method unchanged.

Hyper-parameters: :class:`OODRecipe` (SGD, momentum 0.9, lr 0.1, wd 1e-4 as UIMNET's ImageNet
recipe; ``linear_decay`` schedule, and the epoch count of the scale).

References
----------
.. [1] Bouchacourt et al. UIMNET, 2021 (Section 3: the algorithms and their recipe).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import timm
import torch
from torch import nn

from ..models import archs  # noqa: F401  (registers the architecture)
from ..training.method import TRAINING_METHODS, TrainingMethod, TrainRecipe
from .ensembling import single_network

__all__ = [
    "FeatureClassifier",
    "OODRecipe",
    "feature_classifier",
    "register_feature_method",
    "small_cnn",
]


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


def register_feature_method(name: str, description: str, hparams: type, **hooks) -> None:
    """Register ``name`` in :data:`~uqvision.training.method.TRAINING_METHODS`: one network
    per run (``samples``: :func:`~uqvision.methods.ensembling.single_network`, independent
    runs), ``hooks`` (``wrap_model``, ``loss``, ``post_fit``) as given."""
    TRAINING_METHODS.register(TrainingMethod(
        name=name, description=description, hparams=hparams, samples=single_network,
        independent_runs=True, **hooks))
