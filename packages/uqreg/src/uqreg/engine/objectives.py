"""Training objectives (the data term of the loss), registered in :data:`OBJECTIVES`.

A network predicts either a mean only (``outputs == 1``) or a mean μ and a raw second output s
that gives the variance ``σ² = softplus(s) + VARIANCE_FLOOR`` (``outputs == 2``, a mean–variance
network, docs/conventions.md#r-7). Each objective is written once as a per-network loss of tensors
(``loss``, used by the autograd path and the tests) and once as its hand-written gradient
(``grad``, used by the fused path); ``tests/test_fused.py`` and ``tests/test_meanvar.py`` check the
two against each other. Shapes: ``B`` networks, ``n`` rows; ``mean``, ``raw``, ``y`` (B, n).

Why softplus and not exp: with ``σ² = exp(s)`` the NLL's gradient in s is ``½(1 − r²e^{−s})``,
which explodes where an early residual r is large and s small, and ``exp`` overflows float32 at
s ≈ 88; softplus grows linearly, its gradient is a logistic in (0, 1), and the floor keeps σ²
away from 0 where a network fits a point exactly (Lakshminarayanan et al. 2017 use the same
softplus + 1e-6).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from uqmetrics.metrics.registry import Registry

from .config import TrainConfig

#: The variance never falls below this (added to the softplus).
VARIANCE_FLOOR = 1e-6


def _softplus_parts(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(softplus(s), logistic(s))`` from ONE ``e = exp(−|s|)``: ``max(s, 0) + log1p(e)`` and
    ``(s ≥ 0 ? 1 : e)/(1 + e)`` (no overflow; only ops whose rounding does not depend on an
    element's position in its tensor, as :func:`~uqreg.engine.heads.sigmoid`, which the second
    equals bit for bit)."""
    e = torch.exp(-s.abs())
    return torch.log1p(e).add_(torch.clamp(s, min=0.0)), torch.where(s >= 0, 1.0, e).div_(e + 1.0)


class _Softplus(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s):
        value, slope = _softplus_parts(s)
        ctx.save_for_backward(slope)
        return value

    @staticmethod
    def backward(ctx, grad):
        (slope,) = ctx.saved_tensors
        return grad * slope


def softplus(s: torch.Tensor) -> torch.Tensor:
    """``log(1 + e^s)``, with the logistic as its derivative (:func:`_softplus_parts`)."""
    return _Softplus.apply(s)


def variance(raw: torch.Tensor) -> torch.Tensor:
    """The predicted variance ``σ² = softplus(raw) + VARIANCE_FLOOR`` of a mean–variance network."""
    return softplus(raw) + VARIANCE_FLOOR


def half_mse(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-network loss ½·mean (y − ŷ)², shape (B,); ``y (B, n, 2)`` holds targets and row
    weights w: ½·mean w·(y − ŷ)² (the known-noise heads on a heteroscedastic task)."""
    if y.ndim == 3:
        return 0.5 * (y[..., 1] * (pred - y[..., 0]).pow(2)).mean(dim=1)
    return 0.5 * (pred - y).pow(2).mean(dim=1)


def half_mse_grad(mean, raw, y, cfg):
    """``(dJ/dμ, None)`` of :func:`half_mse` (unweighted): ``(μ − y)/n``."""
    return (mean - y) / y.shape[1], None


def beta_weight(var: torch.Tensor, beta: float) -> torch.Tensor | float:
    """``σ^{2β}``, the β-NLL weight (Seitzer et al. 2022), WITHOUT its gradient (the stop-gradient
    of the definition): 1 for β = 0, σ² itself for β = 1, ``exp(β·log σ²)`` between."""
    if beta == 0:
        return 1.0
    var = var.detach()
    return var if beta == 1 else torch.exp(beta * torch.log(var))


def gaussian_nll(mean: torch.Tensor, raw: torch.Tensor, y: torch.Tensor, cfg: TrainConfig) -> torch.Tensor:
    """Per-network β-NLL, shape (B,): ``mean_n ⌊σ_n^{2β}⌋·(½ log σ_n² + (y_n − μ_n)²/(2σ_n²))``,
    ``σ² = variance(raw)``, β = ``cfg.nll_beta`` and ⌊·⌋ the stop-gradient. β = 0 is the Gaussian
    negative log-likelihood (without ½ log 2π), Lakshminarayanan et al. (2017) and Kendall & Gal
    (2017); β = 1 gives μ the gradient of ½·MSE."""
    var = variance(raw)
    nll = 0.5 * torch.log(var) + 0.5 * (y - mean).pow(2) / var
    return (beta_weight(var, cfg.nll_beta) * nll).mean(dim=1)


def gaussian_nll_grad(mean, raw, y, cfg):
    """``(dJ/dμ, dJ/draw)`` of :func:`gaussian_nll`, by hand: with ``r = μ − y``, ``w = σ^{2β}``,
    ``dJ/dμ = w·r/(n σ²)``, ``dJ/dσ² = w·(1/σ² − r²/σ⁴)/(2n)``, ``dσ²/draw = logistic(raw)``."""
    n = y.shape[1]
    var, slope = _softplus_parts(raw)
    var.add_(VARIANCE_FLOOR)
    r = torch.sub(mean, y)
    g_mean = torch.div(r, var)  # r/σ²
    g_raw = r.mul_(g_mean).neg_().add_(1.0).div_(var).mul_(slope)  # (1 − r²/σ²)/σ² · logistic(s)
    w = beta_weight(var, cfg.nll_beta)
    if not isinstance(w, float):
        g_mean.mul_(w)
        g_raw.mul_(w)
    return g_mean.mul_(1.0 / n), g_raw.mul_(0.5 / n)


@dataclass(frozen=True)
class Objective:
    """A registered training objective.

    Attributes
    ----------
    name, description : str
    outputs : int
        1: the network predicts a mean; 2: a mean and a variance (a second output layer).
    loss : callable ``(mean, raw, y, cfg) -> (B,)``
        Per-network loss (``raw`` is None when ``outputs == 1``).
    grad : callable ``(mean, raw, y, cfg) -> (dJ/dmean, dJ/draw or None)``
        Its gradient, each of the shape of ``mean``.
    """

    name: str
    description: str
    outputs: int
    loss: Callable
    grad: Callable

    @property
    def mean_variance(self) -> bool:
        return self.outputs == 2

    def to_dict(self) -> dict:
        return {"description": self.description, "outputs": self.outputs}


OBJECTIVES: Registry[Objective] = Registry("objective")
OBJECTIVES.register(Objective("mse", "0.5 * mean squared error of the mean", 1,
                              lambda mean, raw, y, cfg: half_mse(mean, y), half_mse_grad))
OBJECTIVES.register(Objective(
    "gaussian_nll", "beta-NLL (Seitzer et al. 2022) of N(mu, softplus(s) + 1e-6); beta = nll_beta, 0: Gaussian NLL",
    2, gaussian_nll, gaussian_nll_grad))

__all__ = ["OBJECTIVES", "VARIANCE_FLOOR", "Objective", "beta_weight", "gaussian_nll", "gaussian_nll_grad",
           "half_mse", "half_mse_grad", "softplus", "variance"]
