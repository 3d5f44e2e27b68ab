"""Softmax, temperature scaling and its three evaluation protocols (docs/conventions.md#s-1).

Temperature scaling fits one scalar ``T > 0`` minimising the NLL of ``softmax(z / T)`` on a
calibration set, with a bounded 1-D search over ``log T``. The protocols decide which samples
the temperature is fitted on and which are scored; the un-scaled (``"none"``) and scaled
(``"temperature"``) metrics are always computed on the SAME evaluation samples:

``holdout``             fit on a given calibration split, score the given test set.
``test_cv``             (Ashukha et al., 2020) split the test set into two equal random halves,
                        fit on one half and score the other, both ways; repeat ``n_repeats``
                        times and average over the ``2 * n_repeats`` folds.
``stratified_holdout``  (Galil et al., 2023) fit on a label-stratified random subset of
                        ``n_calib`` test samples, score the rest.

The calibrated log-likelihood (CLL) is the mean log-likelihood (``-NLL``) after ``test_cv``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr
from scipy.optimize import minimize_scalar

from ._validation import (
    check_choice,
    check_labels,
    check_logits,
    check_positive_int,
    check_positive_number,
    check_same_length,
    check_seed,
    labels_logits,
    numeric_array,
)
from .conventions import CONVENTIONS
from .exceptions import InputError
from .scoring import Confidence, Scorer

__all__ = [
    "CALIBRATION_PROTOCOLS",
    "MIN_TEMPERATURE_SAMPLES",
    "TemperatureFit",
    "calibrated_log_likelihood",
    "calibration_splits",
    "fit_temperature",
    "fit_temperature_result",
    "log_softmax",
    "softmax",
    "temperature_scaled_metrics",
]

#: Default search interval for the temperature: ``log T`` in ``[log 0.01, log 100]``.
DEFAULT_BOUNDS = (0.01, 100.0)
#: The fewest samples :func:`fit_temperature` fits on with ``strict=True`` (the protocols that
#: hold out a calibration split: shift, conformal). Below it a few images decide the fit.
MIN_TEMPERATURE_SAMPLES = 5
#: Absolute tolerance of the bounded search on ``log T``.
_XATOL = 1e-6
#: An optimum closer than this (in ``log T``) to a bound counts as hitting the bound.
_BOUND_TOL = 10 * _XATOL


# --------------------------------------------------------------------------------------------
# Softmax
# --------------------------------------------------------------------------------------------


def _logits_array(logits: Any) -> np.ndarray:
    z = numeric_array(logits, "logits")
    if z.ndim < 1:
        raise ValueError(f"logits must have shape (..., n_classes), got shape {z.shape}")
    if z.shape[-1] == 0:
        raise ValueError(f"logits is empty (shape {z.shape})")
    return z


def log_softmax(logits: Any, *, temperature: float = 1.0) -> np.ndarray:
    """Log-softmax over the last axis, ``log softmax(z / T)``, in float64.

    Parameters
    ----------
    logits : array_like of float, shape (..., C)
        Finite logits (numpy, torch or xarray).
    temperature : float, default 1.0
        Temperature ``T > 0``.

    Returns
    -------
    numpy.ndarray of float64, shape (..., C)
        Log-probabilities.

    Notes
    -----
    ``log p_c = z_c/T - max(z/T) - log sum_c' exp(z_c'/T - max(z/T))`` (shifted by the row
    maximum, so it never overflows).

    Examples
    --------
    >>> log_softmax([[0.0, 0.0]])
    array([[-0.69314718, -0.69314718]])
    """
    t = check_positive_number(temperature, "temperature")
    z = _logits_array(logits) / t
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


def softmax(logits: Any, *, temperature: float = 1.0) -> np.ndarray:
    """Softmax over the last axis, ``softmax(z / T)``, in float64.

    Parameters
    ----------
    logits : array_like of float, shape (..., C)
        Finite logits (numpy, torch or xarray).
    temperature : float, default 1.0
        Temperature ``T > 0``: ``T > 1`` flattens, ``T < 1`` sharpens.

    Returns
    -------
    numpy.ndarray of float64, shape (..., C)
        Probabilities, rows summing to 1.

    Notes
    -----
    ``p_c = exp(z_c/T - m) / sum_c' exp(z_c'/T - m)`` with ``m = max_c z_c/T``.

    Examples
    --------
    >>> softmax([[1.0, 1.0, 1.0]])
    array([[0.33333333, 0.33333333, 0.33333333]])
    >>> softmax([[0.0, 1000.0]])
    array([[0., 1.]])
    """
    t = check_positive_number(temperature, "temperature")
    z = _logits_array(logits) / t
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# --------------------------------------------------------------------------------------------
# Fitting the temperature
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TemperatureFit:
    """Result of :func:`fit_temperature_result`.

    Attributes
    ----------
    temperature : float
        The fitted ``T``.
    converged : bool
        False when the optimiser failed or the optimum lies on a bound of the search interval
        (e.g. perfectly separable data drive ``T -> 0``).
    nll_before, nll_after : float
        Mean NLL (exact log-softmax, no clipping) of the fitting data at ``T = 1`` and at the
        fitted ``T``.
    n_iter : int
        Iterations of the bounded search.
    """

    temperature: float
    converged: bool
    nll_before: float
    nll_after: float
    n_iter: int


def _check_bounds(bounds: Any) -> tuple[float, float]:
    try:
        lo, hi = (float(b) for b in bounds)
    except (TypeError, ValueError):
        raise ValueError(f"bounds must be a pair (low, high), got {bounds!r}") from None
    if not (np.isfinite(lo) and np.isfinite(hi) and 0 < lo < 1 < hi):
        raise ValueError(f"bounds must satisfy 0 < low < 1 < high (finite), got {bounds!r}")
    return lo, hi


def _nll_objective(z: np.ndarray, y: np.ndarray) -> Callable[[float], float]:
    """``s = log T  ->  mean_i [logsumexp(z_i / T) - z_{i, y_i} / T]`` on row-shifted logits."""
    rows = np.arange(y.shape[0])
    top = np.argmax(z, axis=1)
    zc = z - z[rows, top][:, None]  # <= 0, exactly 0 at the (first) maximum of each row
    zy = zc[rows, y]
    buf = np.empty_like(zc)

    def nll(log_t: float) -> float:
        beta = np.exp(-log_t)
        # logsumexp(beta * zc) = log(1 + S) with S the sum over the non-maximal entries: log1p
        # keeps the NLL strictly decreasing on (nearly) separable data as T -> 0 instead of
        # rounding to a flat 0, so the search reaches the bound and reports it. One exp pass
        # per evaluation (the hot loop on ImageNet-size logits).
        np.multiply(zc, beta, out=buf)
        np.exp(buf, out=buf)
        buf[rows, top] = 0.0
        return float(np.mean(np.log1p(buf.sum(axis=1)) - beta * zy))

    return nll


def _fit(z: np.ndarray, y: np.ndarray, bounds: tuple[float, float]) -> TemperatureFit:
    nll = _nll_objective(z, y)
    lo, hi = np.log(bounds[0]), np.log(bounds[1])
    res = minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": _XATOL})
    log_t = float(res.x)
    # on a bound also where the NLL is no lower inside than there: every sample right with a
    # wide margin rounds the NLL to 0 short of the lower bound, and the search stops inside
    interior = (lo + _BOUND_TOL < log_t < hi - _BOUND_TOL
                and nll(lo) > res.fun and nll(hi) > res.fun)
    return TemperatureFit(
        temperature=float(np.exp(log_t)),
        converged=bool(res.success and interior),
        nll_before=nll(0.0),
        nll_after=float(res.fun),
        n_iter=int(getattr(res, "nit", res.nfev)),
    )


def fit_temperature_result(
    logits: Any, labels: Any, *, bounds: tuple[float, float] = DEFAULT_BOUNDS
) -> TemperatureFit:
    """Fit a temperature by minimising the NLL; report convergence and the NLL before/after.

    Parameters
    ----------
    logits : array_like of float, shape (n, C)
        Calibration-set logits (or log-probabilities, e.g. of an ensemble).
    labels : array_like of int, shape (n,)
        Calibration-set labels in ``[0, C)``.
    bounds : (float, float), default (0.01, 100)
        Search interval for ``T``; must contain 1.

    Returns
    -------
    TemperatureFit
        ``temperature``, ``converged``, ``nll_before``, ``nll_after``, ``n_iter``.

    Notes
    -----
    ``T* = argmin_T (1/n) sum_i [logsumexp(z_i / T) - z_{i, y_i} / T]``, found by bounded Brent
    search (``scipy.optimize.minimize_scalar(method="bounded")``, ``xatol=1e-6``) over
    ``log T``. The NLL is convex in ``1/T``, hence unimodal in ``log T``, so the 1-D search
    finds the global optimum in the interval. ``converged`` is False when the search stopped
    within ``1e-5`` (in ``log T``) of a bound, or the NLL at a bound is no higher than at the
    ``T`` found (it rounds to a constant there, e.g. 0 for samples all right with a wide
    margin), i.e. the unconstrained optimum is outside the interval, or when the optimiser
    reports failure.

    References
    ----------
    Guo, Pleiss, Sun, Weinberger. On calibration of modern neural networks. ICML 2017.

    Examples
    --------
    >>> fit = fit_temperature_result([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]], [0, 1, 1])
    >>> round(fit.temperature, 3), fit.converged
    (2.885, True)
    """
    lo_hi = _check_bounds(bounds)
    y, z = labels_logits(labels, logits)
    return _fit(z, y, lo_hi)


def fit_temperature(logits: Any, labels: Any, *, strict: bool = False) -> float:
    """Fit the temperature ``T > 0`` minimising the NLL of ``softmax(logits / T)``.

    Parameters
    ----------
    logits : array_like of float, shape (n, C)
        Calibration-set logits.
    labels : array_like of int, shape (n,)
        Calibration-set labels in ``[0, C)``.
    strict : bool, default False
        Refuse a fit on fewer than :data:`MIN_TEMPERATURE_SAMPLES` samples, and a fitted ``T``
        on a bound of the search (:data:`DEFAULT_BOUNDS`: the NLL has no minimum inside it,
        e.g. every sample right drives ``T`` to 0.01, every sample wrong to 100), instead of
        returning that bound.

    Returns
    -------
    float
        The fitted temperature (see :func:`fit_temperature_result` for convergence details).

    Raises
    ------
    InputError
        With ``strict``: too few samples, or ``T`` on a bound (the message names the bound
        and the number of samples).

    Examples
    --------
    >>> round(fit_temperature([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]], [0, 1, 1]), 3)
    2.885
    >>> fit_temperature([[2.0, 0.0]] * 5, [0] * 5, strict=True)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    uqmetrics.metrics.exceptions.InputError: the temperature fitted on 5 samples runs to the search's...
    """
    y, z = labels_logits(labels, logits)  # validated first: a bad input is named as such
    n = y.shape[0]
    if strict and n < MIN_TEMPERATURE_SAMPLES:
        raise InputError(f"a temperature is fitted on at least {MIN_TEMPERATURE_SAMPLES} "
                         f"samples, got {n}")
    fit = fit_temperature_result(z, y)
    if strict and not fit.converged:
        lo, hi = DEFAULT_BOUNDS
        low = fit.temperature < 1.0  # the interval holds 1: the side the optimum is on
        why = ("every sample classified right, with a margin" if low else
               "the samples are classified wrong with confidence")
        raise InputError(f"the temperature fitted on {n} samples runs to the search's "
                         f"{'lower' if low else 'upper'} bound T = {lo if low else hi:g} "
                         f"(bounds ({lo:g}, {hi:g})): the NLL has no minimum inside them ({why}); "
                         "fit it on more samples")
    return fit.temperature


# --------------------------------------------------------------------------------------------
# Protocols
# --------------------------------------------------------------------------------------------

Split = tuple[np.ndarray, np.ndarray]


def _splits_test_cv(labels: np.ndarray, rng: np.random.Generator, *, n_calib: int,
                    n_repeats: int) -> list[Split]:
    n = labels.shape[0]
    if n < 2:
        raise ValueError(f"labels must hold at least 2 samples for test_cv, got {n}")
    out: list[Split] = []
    for _ in range(n_repeats):
        perm = rng.permutation(n)
        a, b = np.sort(perm[: n // 2]), np.sort(perm[n // 2:])
        out += [(a, b), (b, a)]
    return out


def _splits_stratified(labels: np.ndarray, rng: np.random.Generator, *, n_calib: int,
                       n_repeats: int) -> list[Split]:
    n = labels.shape[0]
    if not 1 <= n_calib < n:
        raise ValueError(f"n_calib must lie in [1, {n - 1}] for {n} samples, got {n_calib}")
    classes, counts = np.unique(labels, return_counts=True)
    # Largest-remainder allocation: per-class sizes within 1 of n_c * n_calib / n, summing to
    # n_calib; remainders tied in size go to the first classes.
    quota = counts * n_calib / n
    take = np.floor(quota).astype(np.int64)
    extra = n_calib - int(take.sum())
    order = np.argsort(-(quota - take), kind="stable")
    take[order[:extra]] += 1
    calib = [rng.choice(np.flatnonzero(labels == c), size=t, replace=False)
             for c, t in zip(classes, take, strict=True)]
    calib_idx = np.sort(np.concatenate(calib))
    eval_mask = np.ones(n, dtype=bool)
    eval_mask[calib_idx] = False
    return [(calib_idx, np.flatnonzero(eval_mask))]


@dataclass(frozen=True)
class CalibrationProtocol:
    """A temperature-scaling protocol: how calibration and evaluation samples are chosen.

    ``splits(labels, rng, *, n_calib, n_repeats)`` returns ``(calib_idx, eval_idx)`` pairs
    into the test set; ``external`` protocols fit on a separately given calibration split.
    """

    name: str
    external: bool
    splits: Callable[..., list[Split]] | None
    description: str


#: Registered protocols (docs/conventions.md#s-1).
CALIBRATION_PROTOCOLS: dict[str, CalibrationProtocol] = {
    p.name: p
    for p in (
        CalibrationProtocol("holdout", True, None,
                            "fit on the given calibration split, score the given test set"),
        CalibrationProtocol("test_cv", False, _splits_test_cv,
                            "two random halves of the test set, fit on one and score the other, "
                            "both ways, n_repeats times, averaged (Ashukha et al., 2020)"),
        CalibrationProtocol("stratified_holdout", False, _splits_stratified,
                            "label-stratified random n_calib-sample calibration subset of the "
                            "test set, the rest scored (Galil et al., 2023)"),
    )
}


def calibration_splits(
    labels: Any, *, protocol: str = "test_cv", n_calib: int = 5000, n_repeats: int = 5,
    seed: int = 0,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The ``(calib_idx, eval_idx)`` index pairs a within-test-set protocol uses.

    Parameters
    ----------
    labels : array_like of int, shape (n,)
        Test-set labels (used for stratification).
    protocol : {"test_cv", "stratified_holdout"}, default "test_cv"
        The protocol (``holdout`` has no within-test-set split).
    n_calib : int, default 5000
        Calibration-subset size (``stratified_holdout``).
    n_repeats : int, default 5
        Number of random partitions (``test_cv``).
    seed : int, default 0
        Seed of ``numpy.random.default_rng``.

    Returns
    -------
    list of (numpy.ndarray, numpy.ndarray)
        Sorted, disjoint index arrays. ``test_cv``: ``2 * n_repeats`` folds, the halves having
        ``n // 2`` and ``n - n // 2`` samples; ``stratified_holdout``: one fold whose class
        counts are within 1 of ``n_c * n_calib / n``.

    Examples
    --------
    >>> folds = calibration_splits([0, 0, 1, 1, 1], protocol="test_cv", n_repeats=1)
    >>> [(len(c), len(e)) for c, e in folds]
    [(2, 3), (3, 2)]
    >>> y = [0] * 6 + [1] * 4
    >>> (calib, rest), = calibration_splits(y, protocol="stratified_holdout", n_calib=5)
    >>> np.bincount(np.asarray(y)[calib]).tolist(), len(rest)
    ([3, 2], 5)
    """
    within = {k for k, p in CALIBRATION_PROTOCOLS.items() if not p.external}
    check_choice(protocol, "protocol", within)
    y = check_labels(labels)
    spec = CALIBRATION_PROTOCOLS[protocol]
    rng = np.random.default_rng(check_seed(seed))
    return spec.splits(y, rng, n_calib=check_positive_int(n_calib, "n_calib"),
                       n_repeats=check_positive_int(n_repeats, "n_repeats"))


def temperature_scaled_metrics(
    logits: Any,
    labels: Any,
    *,
    protocol: str = "holdout",
    metrics: Sequence[str] = ("accuracy", "nll", "brier", "ece"),
    confidence: Confidence = "softmax_response",
    calib_logits: Any = None,
    calib_labels: Any = None,
    n_calib: int = 5000,
    n_repeats: int = 5,
    seed: int = 0,
    bounds: tuple[float, float] = DEFAULT_BOUNDS,
) -> xr.Dataset:
    """Metrics before and after temperature scaling, on the same evaluation samples.

    Parameters
    ----------
    logits : array_like of float, shape (n, C)
        Test-set logits (or log-probabilities).
    labels : array_like of int, shape (n,)
        Test-set labels in ``[0, C)``.
    protocol : {"holdout", "test_cv", "stratified_holdout"}, default "holdout"
        See the module docstring and :data:`CALIBRATION_PROTOCOLS`.
    metrics : sequence of str
        Names of registered classification or selective metrics
        (:func:`uqmetrics.metrics.registry.list_metrics`), scored by :func:`uqmetrics.score_metrics`.
    confidence : str or callable, default "softmax_response"
        The confidence κ of the selective metrics, computed from each fold's (scaled or
        un-scaled) probabilities; see :func:`uqmetrics.score_metrics`.
    calib_logits : array_like of float, shape (m, C), optional
        Calibration-set logits; required by ``holdout``, rejected by the other protocols.
    calib_labels : array_like of int, shape (m,), optional
        Calibration-set labels (with ``calib_logits``).
    n_calib : int, default 5000
        Calibration-subset size for ``stratified_holdout``.
    n_repeats : int, default 5
        Random partitions for ``test_cv``.
    seed : int, default 0
        Seed of the random splits.
    bounds : (float, float), default (0.01, 100)
        Search interval for the temperature.

    Returns
    -------
    xarray.Dataset
        One variable per metric over dim ``calibration`` (``"none"``, ``"temperature"``): the
        mean over folds of the metric on each fold's evaluation samples. ``per_fold``
        ``(metric, calibration, fold)`` holds the fold values; ``temperature``, ``converged``,
        ``n_calib`` and ``n_eval`` are over ``fold``. Attrs: ``protocol`` and its options.

    Notes
    -----
    For every fold ``f`` with calibration indices ``C_f`` and evaluation indices ``E_f``:
    ``T_f = argmin_T NLL(softmax(z[C_f] / T), y[C_f])``, then each metric ``m`` is computed on
    ``softmax(z[E_f])`` ("none") and ``softmax(z[E_f] / T_f)`` ("temperature") by
    :func:`uqmetrics.score_metrics` (selective metrics with ``correct = argmax p = y`` and
    ``κ = confidence(p)``); reported values are ``mean_f m_f``. Un-scaled and scaled numbers thus always share their samples.
    Temperature scaling never changes top-k accuracy: a metric that depends on the probabilities
    only through the order of the classes (property ``temperature_invariant``: ``accuracy``,
    ``top5_accuracy``) is scored once, from ``softmax(z[E_f])``, for both rows. Scoring it again
    from ``softmax(z[E_f] / T_f)`` could change it at a small T, where the probabilities of the
    classes far below the top underflow to exactly 0 and tie.

    References
    ----------
    Ashukha, Lyzhov, Molchanov, Vetrov. Pitfalls of in-domain uncertainty estimation and
    ensembling in deep learning. ICLR 2020 (``test_cv``).
    Galil, Dabbah, El-Yaniv. What can we learn from the selective prediction and uncertainty
    estimation performance of 523 ImageNet classifiers? ICLR 2023 (``stratified_holdout``).

    Examples
    --------
    >>> z = [[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [1.0, 0.0]]
    >>> ds = temperature_scaled_metrics(z, [0, 1, 1, 0], protocol="test_cv", metrics=("nll",),
    ...                                 n_repeats=1)
    >>> ds["nll"].sizes["calibration"], ds.sizes["fold"]
    (2, 2)
    """
    check_choice(protocol, "protocol", CALIBRATION_PROTOCOLS)
    spec = CALIBRATION_PROTOCOLS[protocol]
    scorer = Scorer.build(metrics, confidence)
    lo_hi = _check_bounds(bounds)
    n_calib = check_positive_int(n_calib, "n_calib")
    n_repeats = check_positive_int(n_repeats, "n_repeats")
    seed = check_seed(seed)
    y, z = labels_logits(labels, logits)

    if spec.external:
        if calib_logits is None or calib_labels is None:
            raise ValueError(f"protocol={protocol!r} needs calib_logits and calib_labels")
        zc = check_logits(calib_logits, "calib_logits")
        if zc.shape[1] != z.shape[1]:
            raise ValueError(
                f"calib_logits must have {z.shape[1]} classes like logits, got shape {zc.shape}"
            )
        yc = check_labels(calib_labels, z.shape[1], "calib_labels")
        check_same_length(calib_labels=yc, calib_logits=zc)
        folds = [((zc, yc), (z, y))]
    else:
        if calib_logits is not None or calib_labels is not None:
            raise ValueError(
                f"protocol={protocol!r} splits the test set itself; calib_logits/calib_labels "
                "must be None (use protocol='holdout')"
            )
        rng = np.random.default_rng(seed)
        folds = [((z[c], y[c]), (z[e], y[e]))
                 for c, e in spec.splits(y, rng, n_calib=n_calib, n_repeats=n_repeats)]

    n_f = len(folds)
    values = np.empty((len(scorer.specs), 2, n_f))
    temps, conv = np.empty(n_f), np.empty(n_f, dtype=bool)
    n_c, n_e = np.empty(n_f, dtype=np.int64), np.empty(n_f, dtype=np.int64)
    for f, ((z_cal, y_cal), (z_ev, y_ev)) in enumerate(folds):
        fit = _fit(z_cal, y_cal, lo_hi)
        temps[f], conv[f], n_c[f], n_e[f] = fit.temperature, fit.converged, len(y_cal), len(y_ev)
        unscaled = scorer(y_ev, softmax(z_ev))
        scaled = scorer(y_ev, softmax(z_ev, temperature=fit.temperature), unscaled=unscaled)
        values[:, 0, f], values[:, 1, f] = list(unscaled.values()), list(scaled.values())

    data = {
        s.name: xr.Variable("calibration", values[i].mean(axis=1), attrs=scorer.metric_attrs(s))
        for i, s in enumerate(scorer.specs)
    }
    data.update(
        per_fold=(("metric", "calibration", "fold"), values),
        temperature=("fold", temps),
        converged=("fold", conv),
        n_calib=("fold", n_c),
        n_eval=("fold", n_e),
    )
    return xr.Dataset(
        data,
        coords={"calibration": ["none", "temperature"], "fold": np.arange(n_f),
                "metric": scorer.names},
        attrs={
            "protocol": protocol,
            "protocol_description": spec.description,
            "seed": seed,
            "n_repeats": n_repeats if protocol == "test_cv" else 0,
            "n_calib_requested": n_calib if protocol == "stratified_holdout" else 0,
            "temperature_bounds": list(lo_hi),
            "convention": CONVENTIONS["temperature_scaling"],
            **scorer.attrs,
        },
    )


def calibrated_log_likelihood(
    logits: Any, labels: Any, *, n_repeats: int = 5, seed: int = 0
) -> float:
    """Calibrated log-likelihood (CLL): mean log-likelihood after ``test_cv`` temperature scaling.

    Parameters
    ----------
    logits : array_like of float, shape (n, C)
        Test-set logits, or an ensemble's log-probabilities.
    labels : array_like of int, shape (n,)
        Test-set labels in ``[0, C)``.
    n_repeats : int, default 5
        Random half/half partitions.
    seed : int, default 0
        Seed of the partitions.

    Returns
    -------
    float
        ``CLL = -NLL`` averaged over the ``2 * n_repeats`` folds of ``test_cv``; higher is
        better (the Pitfalls paper reports ``-CLL``).

    Notes
    -----
    ``CLL = (1/F) sum_f (1/|E_f|) sum_{i in E_f} log softmax(z_i / T_f)_{y_i}`` with ``T_f``
    fitted on the complementary half (docs/conventions.md#s-1; NLL clipped at 1e-12 as ``nll``).

    References
    ----------
    Ashukha, Lyzhov, Molchanov, Vetrov. Pitfalls of in-domain uncertainty estimation and
    ensembling in deep learning. ICLR 2020, Section 3.5.

    Examples
    --------
    >>> z = [[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [1.0, 0.0]]
    >>> cll = calibrated_log_likelihood(z, [0, 1, 1, 0], n_repeats=1)
    >>> cll < 0
    True
    """
    ds = temperature_scaled_metrics(logits, labels, protocol="test_cv", metrics=("nll",),
                                    n_repeats=n_repeats, seed=seed)
    return -float(ds["nll"].sel(calibration="temperature"))
