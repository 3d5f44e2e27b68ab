"""RBF: the logits transformed by ``exp(-z^2)`` before the softmax (Broomhead & Lowe 1988,
as UIMNET trains it), as the ``rbf`` entry of :data:`~uqvision.training.method.TRAINING_METHODS`,
on a :class:`~uqvision.methods.feature.FeatureClassifier`.

References
----------
.. [1] Broomhead & Lowe. Radial basis functions, multi-variable functional interpolation and
   adaptive networks. 1988.
"""

from __future__ import annotations

import torch
from torch import nn

from .feature import FeatureClassifier, OODRecipe, feature_classifier, register_feature_method

__all__ = ["RBFNet", "rbf_transform"]


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


register_feature_method("rbf", "logits transformed by exp(-z^2) before the softmax (Broomhead & "
                        "Lowe)", OODRecipe,
                        wrap_model=lambda model, hp: RBFNet(feature_classifier(model)))
