"""MIMO (Havasi et al. 2021): M sub-networks in one network, as the ``mimo`` entry of
:data:`~uqvision.training.method.TRAINING_METHODS` (trained by UIMNET, V.3, and any protocol
that needs it), on a :class:`~uqvision.methods.feature.FeatureClassifier`.

References
----------
.. [1] Havasi et al. Training independent subnetworks for robust prediction. ICLR 2021.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..training.method import TrainState
from .feature import FeatureClassifier, OODRecipe, feature_classifier, register_feature_method

__all__ = ["MIMOHParams", "MIMONet", "mimo_batch"]


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


register_feature_method("mimo", "M sub-networks in one (Havasi et al.)", MIMOHParams,
                        wrap_model=lambda model, hp: MIMONet(feature_classifier(model),
                                                             hp.members),
                        loss=_mimo_loss)
