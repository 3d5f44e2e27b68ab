"""One-sided spectral normalisation of a featurizer (UIMNET's ablation, docs/conventions.md#v-3).

Used by the one training loop (``ImageTrainConfig.spectral``) for any method, so it lives with the
networks rather than with the UIMNET protocol that introduced it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

__all__ = ["spectral_normalize"]


# -- spectral normalisation ----------------------------------------------------------------
class _OneSidedSpectralNorm(nn.Module):
    """``W / max(1, σ(W) / coeff)`` with σ from one power iteration per training forward
    (Miyato et al.; one-sided as in DUE and UIMNET, coeff 5). Conv weights are flattened to
    (out, in·k·k)."""

    def __init__(self, weight: torch.Tensor, coeff: float):
        super().__init__()
        self.coeff = float(coeff)
        mat = weight.detach().flatten(1)
        gen = torch.Generator().manual_seed(0)
        self.register_buffer("u", F.normalize(torch.randn(mat.shape[0], generator=gen), dim=0))
        self.register_buffer("v", F.normalize(torch.randn(mat.shape[1], generator=gen), dim=0))

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        mat = weight.flatten(1)
        if self.training:
            with torch.no_grad():
                self.v.copy_(F.normalize(mat.t() @ self.u, dim=0))
                self.u.copy_(F.normalize(mat @ self.v, dim=0))
        sigma = torch.dot(self.u, mat @ self.v)
        return weight / torch.clamp(sigma / self.coeff, min=1.0)


class _BatchNormLipschitz(nn.Module):
    """``γ / max(1, max_c |γ_c| / sqrt(σ²_c + ε) / coeff)``: the (eval-mode) Lipschitz constant
    of a BatchNorm layer, ``max_c |γ_c| / sqrt(σ²_c + ε)`` with σ² its running variance,
    bounded by ``coeff`` (Gouk et al. 2021; DUE's spectral batch norm)."""

    def __init__(self, bn: nn.modules.batchnorm._BatchNorm, coeff: float):
        super().__init__()
        self.coeff = float(coeff)
        object.__setattr__(self, "_bn", bn)  # read its running variance; not a submodule

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        bn = self._bn
        lipschitz = (weight.abs() * (bn.running_var + bn.eps).rsqrt()).max().detach()
        return weight / torch.clamp(lipschitz / self.coeff, min=1.0)


def spectral_normalize(model: nn.Module, coeff: float = 5.0) -> nn.Module:
    """One-sided spectral normalisation of the featurizer (``model.backbone`` for a
    :class:`FeatureClassifier`, else the whole model), in place, as the paper's ablation: every
    Conv/Linear weight to spectral norm at most ``coeff`` (Miyato et al.), and every BatchNorm
    layer with running statistics to Lipschitz constant at most ``coeff`` (Gouk et al.).

    The BatchNorm bound is what makes the ablation bite in conv-BN networks: a BatchNorm after
    a convolution undoes any rescaling of the convolution's weight. The classifier of a timm
    model (``get_classifier()``) is not the featurizer's and is left as it is.
    """
    target = getattr(model, "backbone", model)
    head = target.get_classifier() if hasattr(target, "get_classifier") else None
    skip = {id(m) for m in head.modules()} if isinstance(head, nn.Module) else set()
    for m in list(target.modules()):
        if id(m) in skip:
            continue
        if parametrize.is_parametrized(m, "weight"):
            continue
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            parametrize.register_parametrization(m, "weight",
                                                 _OneSidedSpectralNorm(m.weight, coeff))
        elif isinstance(m, nn.modules.batchnorm._BatchNorm) and m.affine \
                and m.track_running_stats:
            parametrize.register_parametrization(m, "weight", _BatchNormLipschitz(m, coeff))
    return model
