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

A *quantile* network (objective ``pinball``, ``outputs == 2``) reads its two outputs as the
``α/2`` and ``1 − α/2`` conditional quantiles ``q_lo`` and ``q_hi`` of y, both linear (no link),
and trains on the sum of their pinball (check) losses (Koenker & Bassett 1978); its α is bound
when the network is built (:meth:`Objective.bound`), see docs/conventions.md#r-6.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

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


def pinball(q: torch.Tensor, y: torch.Tensor, tau: float) -> torch.Tensor:
    """The pinball (check) loss of the τ-quantile ``q`` for ``y``, elementwise:
    ``ρ_τ(y − q) = (y − q)·(τ − 1[y < q])`` (Koenker & Bassett 1978), ≥ 0, minimised in
    expectation by the τ-quantile of y."""
    r = y - q
    return r * (tau - (r < 0).to(r.dtype))


def quantile_levels(alpha: float) -> tuple[float, float]:
    """``(α/2, 1 − α/2)``: the levels of a quantile network's two outputs."""
    return alpha / 2, 1.0 - alpha / 2


def pinball_pair(low: torch.Tensor, high: torch.Tensor, y: torch.Tensor, cfg: TrainConfig, *,
                 alpha: float) -> torch.Tensor:
    """Per-network loss of a quantile network, shape (B,):
    ``mean_n [ρ_{α/2}(y_n − q_lo,n) + ρ_{1−α/2}(y_n − q_hi,n)]``, ``low``/``high`` the two
    outputs (B, n)."""
    t_lo, t_hi = quantile_levels(alpha)
    return (pinball(low, y, t_lo) + pinball(high, y, t_hi)).mean(dim=1)


def pinball_pair_grad(low, high, y, cfg, *, alpha: float):
    """``(dJ/dq_lo, dJ/dq_hi)`` of :func:`pinball_pair`, by hand: ``(1[y < q] − τ)/n`` for each
    output at its level τ (at ``y = q`` the derivative from below in q, −τ/n, as the autograd of
    :func:`pinball`)."""
    n = y.shape[1]
    t_lo, t_hi = quantile_levels(alpha)
    g_lo = torch.lt(y, low).to(low.dtype).sub_(t_lo).mul_(1.0 / n)
    g_hi = torch.lt(y, high).to(high.dtype).sub_(t_hi).mul_(1.0 / n)
    return g_lo, g_hi


def _identity(raw: torch.Tensor) -> torch.Tensor:
    return raw


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
    second_output : callable, optional
        What prediction reports of the second output's raw value (``outputs == 2``): the variance
        :func:`variance` of a mean–variance network, the raw value itself (the upper quantile)
        of a quantile network.
    uses_alpha : bool
        True: ``loss`` and ``grad`` take a keyword ``alpha`` (the quantile networks' α), bound by
        :meth:`bound` when the network is built.
    sigma_scaled : bool
        True: the loss is the per-sample Gaussian negative log-likelihood of the task's known σ
        times σ² (½·MSE), so a head's KL/N regulariser enters times σ² as well
        (docs/conventions.md#r-3); False: the loss is itself a per-sample negative
        log-likelihood with its own learned variance (the mean–variance networks' NLL), and the
        KL/N enters unscaled (docs/conventions.md#r-7). :attr:`BatchedMLP.regulariser_sigma
        <uqreg.engine.network.BatchedMLP.regulariser_sigma>` reads it.
    """

    name: str
    description: str
    outputs: int
    loss: Callable
    grad: Callable
    second_output: Callable | None = None
    uses_alpha: bool = False
    sigma_scaled: bool = False

    @property
    def mean_variance(self) -> bool:
        """True for a network with a second output layer (a mean–variance or a quantile network:
        the engine treats both alike, only the objective reads the outputs differently)."""
        return self.outputs == 2

    def bound(self, alpha: float | None) -> Objective:
        """This objective with its α bound into ``loss`` and ``grad`` (itself when it takes none).

        Raises
        ------
        ValueError
            ``alpha`` not in (0, 1) for an objective that uses it.
        """
        if not self.uses_alpha:
            return self
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
            raise ValueError(f"alpha must be a number in (0, 1) for the objective {self.name!r}, got {alpha!r}")
        return replace(self, loss=partial(self.loss, alpha=float(alpha)), grad=partial(self.grad, alpha=float(alpha)))

    def to_dict(self) -> dict:
        return {"description": self.description, "outputs": self.outputs}


OBJECTIVES: Registry[Objective] = Registry("objective")
OBJECTIVES.register(Objective("mse", "0.5 * mean squared error of the mean", 1,
                              lambda mean, raw, y, cfg: half_mse(mean, y), half_mse_grad, sigma_scaled=True))
OBJECTIVES.register(Objective(
    "gaussian_nll", "beta-NLL (Seitzer et al. 2022) of N(mu, softplus(s) + 1e-6); beta = nll_beta, 0: Gaussian NLL",
    2, gaussian_nll, gaussian_nll_grad, second_output=variance))
OBJECTIVES.register(Objective(
    "pinball", "pinball (check) losses of the alpha/2 and 1 - alpha/2 quantiles, two linear outputs q_lo, q_hi",
    2, pinball_pair, pinball_pair_grad, second_output=_identity, uses_alpha=True))

__all__ = ["OBJECTIVES", "VARIANCE_FLOOR", "Objective", "beta_weight", "gaussian_nll", "gaussian_nll_grad",
           "half_mse", "half_mse_grad", "pinball", "pinball_pair", "pinball_pair_grad", "quantile_levels", "softplus",
           "variance"]
