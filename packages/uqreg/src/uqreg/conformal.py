"""Split-conformal intervals and their exact conditional coverage (docs/conventions.md#r-6).

A *conformal score* (:data:`SCORES`) turns a method's mean and standard deviation at the
calibration points into nonconformity scores, and a quantile ``q`` of those scores back into an
interval at the test points:

* ``cp_abs``: ``s = |y − mean|``, interval ``mean ± q``;
* ``cp_std``: ``s = |y − mean| / std``, interval ``mean ± q·std``.

``q`` is the ⌈(n_cal + 1)(1 − α)⌉-th smallest score (+inf when that rank exceeds n_cal),
:func:`uqmetrics.metrics.conformal.conformal_quantile`. Every registered method gets a split-conformal
version per score, named ``<method>+<score>`` (``ens+cp_abs``), see
:func:`uqreg.methods.get_method`; registering a score here gives every method a new version.

CQR, conformalized quantile regression (Romano, Patterson & Candès 2019), calibrates the
interval ``[q_lo(x), q_hi(x)]`` of a method that predicts the α/2 and 1 − α/2 quantiles (the
quantile versions ``<method>+qr``): scores ``s = max(q_lo − y, y − q_hi)`` at the calibration
points, ``q`` their ⌈(n_cal + 1)(1 − α)⌉-th smallest, interval ``[q_lo − q, q_hi + q]``
(:func:`cqr_scores`, :func:`cqr_calibrate`; the methods ``<method>+cqr``). It reads two
quantiles, not a mean and a std, so it is not one of the :data:`SCORES`.

The exact reference gives the *conditional* coverage of any interval ``[l, u]`` at x: a new
observation is ``y ~ N(f(x), σ²)``, so ``P(y ∈ [l, u] | x) = Φ((u − f)/σ) − Φ((l − f)/σ)``
(:func:`conditional_coverage`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr, ndtri
from uqmetrics.metrics.conformal import conformal_quantile
from uqmetrics.metrics.exceptions import InputError
from uqmetrics.metrics.registry import Registry


def interval_z(alpha: float) -> float:
    """``z_{1−α/2}``, the half-width of the central 1 − α interval of a standard normal."""
    return float(ndtri(1 - alpha / 2))


def check_alpha(alpha, name: str = "alpha") -> float:
    """``alpha`` as a float in (0, 1); :class:`~uqmetrics.InputError` naming ``name`` otherwise."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)) \
            or not np.isfinite(alpha) or not 0 < alpha < 1:
        raise InputError(f"{name} must be a number in (0, 1), got {alpha!r}")
    return float(alpha)


@dataclass(frozen=True)
class ConformalScore:
    """A split-conformal nonconformity score.

    Attributes
    ----------
    name, description : str
    score : callable ``(y (..., C), mean (..., C), std (..., C)) -> s (..., C)``
        Scores at the calibration points.
    interval : callable ``(mean (..., T), std (..., T), q (...)) -> (low, high) (..., T)``
        The interval at the test points for the quantile ``q`` of the scores.
    """

    name: str
    description: str
    score: Callable
    interval: Callable


def _std_score(y, mean, std):
    r = np.abs(y - mean)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = r / std
    return np.where(std > 0, s, np.where(r > 0, np.inf, 0.0))  # std 0: exact fit scores 0, else inf


def _std_interval(mean, std, q):
    q = np.asarray(q)[..., None]
    with np.errstate(invalid="ignore"):
        half = np.where(np.isinf(q) & (std == 0), np.inf, q * std)  # inf·0: no finite interval
    return mean - half, mean + half


SCORES: Registry[ConformalScore] = Registry("conformal score")
register_score = SCORES.register
get_score = SCORES.lookup

register_score(ConformalScore(
    "cp_abs", "split conformal, absolute residual: mean ± q, q from |y − mean|",
    score=lambda y, mean, std: np.abs(y - mean),
    interval=lambda mean, std, q: (mean - np.asarray(q)[..., None], mean + np.asarray(q)[..., None]),
))
register_score(ConformalScore(
    "cp_std", "split conformal, residual normalised by the method's std: mean ± q·std, q from |y − mean|/std",
    score=_std_score, interval=_std_interval,
))


def _quantile(scores, alpha: float) -> np.ndarray:
    """The conformal quantile of each repetition's scores (R, C) -> (R,): NaN for a repetition
    with a NaN score (a diverged network gets no interval rather than failing the study)."""
    alpha = check_alpha(alpha)
    scores = np.atleast_2d(np.asarray(scores, dtype=np.float64))
    bad = np.isnan(scores).any(axis=-1)
    q = np.full(scores.shape[:-1], np.nan)
    if not bad.all():
        q[~bad] = conformal_quantile(scores[~bad], alpha)
    return q


def calibrate(score: ConformalScore, y_cal, cal_mean, cal_std, mean, std, alpha: float):
    """Split-conformal intervals at the test points from a method's calibration predictions.

    Parameters
    ----------
    score : ConformalScore
    y_cal, cal_mean, cal_std : ndarray, shape (R, C)
        Calibration targets, and the method's mean and std at the calibration points.
    mean, std : ndarray, shape (R, T)
        The method's mean and std at the test points.
    alpha : float
        Miscoverage level in (0, 1).

    Returns
    -------
    low, high : ndarray, shape (R, T)
    q : ndarray, shape (R,)
        The conformal quantile of each repetition's scores (+inf when
        ⌈(n_cal + 1)(1 − α)⌉ > n_cal; NaN, and NaN bounds, where a score is NaN).
    """
    q = _quantile(score.score(np.asarray(y_cal), np.asarray(cal_mean), np.asarray(cal_std)), alpha)
    low, high = score.interval(np.asarray(mean), np.asarray(std), q)
    return low, high, q


def cqr_scores(y, low, high) -> np.ndarray:
    """CQR's nonconformity scores ``s = max(q_lo − y, y − q_hi)`` (Romano, Patterson & Candès
    2019, eq. 6): negative inside the interval (minus the distance to the nearer end), positive
    outside (the distance to it). Arrays of one shape (or broadcastable), that shape out."""
    y, low, high = np.asarray(y, np.float64), np.asarray(low, np.float64), np.asarray(high, np.float64)
    return np.maximum(low - y, y - high)


def cqr_calibrate(y_cal, cal_low, cal_high, low, high, alpha: float):
    """Conformalized quantile regression: the interval ``[q_lo − q, q_hi + q]`` at the test points.

    Parameters
    ----------
    y_cal, cal_low, cal_high : ndarray, shape (R, C)
        Calibration targets, and the method's α/2 and 1 − α/2 quantiles at the calibration points.
    low, high : ndarray, shape (R, T)
        The method's two quantiles at the test points.
    alpha : float
        Miscoverage level in (0, 1).

    Returns
    -------
    low, high : ndarray, shape (R, T)
    q : ndarray, shape (R,)
        The ⌈(n_cal + 1)(1 − α)⌉-th smallest of each repetition's :func:`cqr_scores` (+inf when
        that rank exceeds n_cal; NaN, and NaN bounds, where a score is NaN). It may be negative:
        the interval then shrinks.
    """
    q = _quantile(cqr_scores(y_cal, cal_low, cal_high), alpha)
    qq = q[..., None]
    return np.asarray(low, np.float64) - qq, np.asarray(high, np.float64) + qq, q


def gaussian_interval(mean, std, sigma: float, alpha: float):
    """The Gaussian predictive interval ``mean ± z_{1−α/2}·sqrt(std² + σ²)``, shape of ``mean``:
    what a method that is not conformalised reports for a new observation (for ``blr`` the exact
    posterior predictive interval). ``sigma``: a number or σ(x) per point (R.7)."""
    half = interval_z(alpha) * np.sqrt(np.asarray(std) ** 2 + sigma**2)
    return mean - half, mean + half


def conditional_coverage(low, high, truth, sigma: float):
    """Exact conditional coverage ``P(y ∈ [l, u] | x)`` of ``y ~ N(f(x), σ²)``.

    Parameters
    ----------
    low, high : array_like, shape (..., T)
        Interval bounds at the T points (±inf allowed).
    truth : array_like, shape (T,) or broadcastable
        ``f(x)``, the noise-free truth.
    sigma : float or array_like, broadcastable
        Noise standard deviation (> 0): a number, or σ(x) per point (R.7).

    Returns
    -------
    ndarray, shape of ``low``
        ``Φ((u − f)/σ) − Φ((l − f)/σ)``, 0 for an empty interval (u < l); NaN where a bound is NaN.

    Examples
    --------
    >>> float(conditional_coverage(-1.959963984540054, 1.959963984540054, 0.0, 1.0))  # doctest: +ELLIPSIS
    0.9500...
    """
    if not np.all(np.isfinite(sigma) & (np.asarray(sigma) > 0)):  # a number, or σ(x) per point (R.7)
        raise InputError(f"sigma must be a positive number, got {sigma!r}")
    low, high, truth = np.asarray(low, float), np.asarray(high, float), np.asarray(truth, float)
    cov = ndtr((high - truth) / sigma) - ndtr((low - truth) / sigma)
    return np.where(np.isnan(cov), np.nan, np.maximum(cov, 0.0))


__all__ = ["SCORES", "ConformalScore", "calibrate", "check_alpha", "conditional_coverage", "conformal_quantile",
           "cqr_calibrate", "cqr_scores", "gaussian_interval", "get_score", "interval_z", "register_score"]
