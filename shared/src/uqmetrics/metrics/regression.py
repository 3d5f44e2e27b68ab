"""Regression uncertainty metrics: repeated-retrain coverage and proper scores
(docs/conventions.md#s-6 and docs/conventions.md#r-4).

Two families live here.

*Coverage study* (R.4): a method is retrained ``k`` times on fresh training noise and predicts,
at each test point ``x*``, a value and an uncertainty (a standard deviation). Against the
noise-free ground truth we report, per point, the coverage (fraction of repetitions with
``|prediction - truth| < z * uncertainty``, strict ``<``), its binomial interval and the paper's
``sqrt(p(1-p)/k)`` bars, the mean deviation and uncertainty with their standard errors over
repetitions, the ratio of the uncertainty to that of an exact reference (Lemma 1 of the
regression paper) and averages over in/out-of-distribution regions. :func:`coverage_summary`
computes all of it from one ``xarray.Dataset``; the other functions are its building blocks.

*Proper scores against noisy targets* (S.6): :func:`gaussian_nll_loss`,
:func:`crps_gaussian_loss` and :func:`interval_width`; and uncertainty-toolbox's (Chung et al.
2021) scores: the calibration curve, MACE, RMSCE, miscalibration area, adversarial group
calibration, sharpness, the check and interval scores (of Gaussian forecasts and of predicted
quantiles or bounds), PIT values and histograms, and recalibration fitted on a calibration split
(:class:`IsotonicRecalibrator`, Kuleshov et al. 2018; :class:`SigmaScaling`, by default the
NLL-optimal factor of Laves et al. 2020).

Inputs may be numpy arrays, torch tensors or xarray objects. The coverage functions keep xarray
in, xarray out (reducing a named dim); numpy inputs reduce an ``axis``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np
import xarray as xr
from scipy import special

from ._validation import (
    check_broadcast,
    check_choice,
    check_counts,
    check_fraction,
    check_positive,
    check_positive_number,
    check_same_shape,
    dataarrays,
    numeric_array,
)
from .conventions import COVERAGE_Z
from .exceptions import InputError
from .registry import register_metric

__all__ = [
    "CALIBRATION_BINS",
    "INTERVAL_METHODS",
    "SCORE_LEVELS",
    "IsotonicRecalibrator",
    "SigmaScaling",
    "adversarial_group_calibration",
    "adversarial_group_calibration_error",
    "binomial_interval",
    "calibration_curve",
    "check_score_loss",
    "coverage",
    "coverage_summary",
    "crps_gaussian_loss",
    "deviation",
    "gaussian_nll_loss",
    "interval_score_from_bounds_loss",
    "interval_score_loss",
    "interval_width",
    "mean_absolute_calibration_error",
    "miscalibration_area_error",
    "paper_error_bar",
    "pit_histogram",
    "pit_ks_error",
    "pit_values",
    "quantile_check_loss",
    "root_mean_squared_calibration_error",
    "sharpness",
    "uncertainty_ratio",
]

#: Binomial interval methods: our name -> statsmodels ``proportion_confint`` method.
INTERVAL_METHODS = {"wilson": "wilson", "beta": "beta", "clopper-pearson": "beta"}

_SUMMARY_VARS = ("prediction", "uncertainty", "truth")


# --------------------------------------------------------------------------------------------
# binomial error bars


def _interval_unchecked(s: np.ndarray, n: np.ndarray, alpha: float, method: str):
    """Interval for arrays ``s <= n``; cells with ``n == 0`` give NaN."""
    from statsmodels.stats.proportion import proportion_confint

    s, n = np.broadcast_arrays(np.asarray(s, float), np.asarray(n, float))
    low = np.full(s.shape, np.nan)
    high = np.full(s.shape, np.nan)
    ok = n > 0
    if ok.any():
        lo, hi = proportion_confint(s[ok], n[ok], alpha=alpha, method=INTERVAL_METHODS[method])
        low[ok] = np.clip(lo, 0.0, 1.0)
        high[ok] = np.clip(hi, 0.0, 1.0)
    return low, high


def binomial_interval(successes, trials, *, alpha: float = 0.05, method: str = "wilson"):
    """Confidence interval for a binomial proportion, vectorised.

    Parameters
    ----------
    successes : array_like of int, any shape
        Number of successes (e.g. covered repetitions), ``0 <= successes <= trials``.
    trials : array_like of int, broadcastable with ``successes``
        Number of trials (repetitions), ``>= 1``.
    alpha : float, default 0.05
        One minus the confidence level.
    method : {"wilson", "beta", "clopper-pearson"}, default "wilson"
        Wilson score interval or the exact Clopper-Pearson ("beta") interval, both from
        :func:`statsmodels.stats.proportion.proportion_confint`.

    Returns
    -------
    low, high : numpy.ndarray
        Bounds, with the broadcast shape of the inputs (0-d arrays for scalar inputs).

    Notes
    -----
    Wilson: the set of ``p`` with ``|p_hat - p| <= z sqrt(p(1-p)/k)``; its coverage oscillates
    around ``1 - alpha``. Clopper-Pearson inverts two one-sided exact binomial tests and covers
    at least ``1 - alpha`` for every ``p`` (conservative).

    References
    ----------
    E. B. Wilson, "Probable inference, the law of succession, and statistical inference",
    JASA 22 (1927). C. J. Clopper and E. S. Pearson, Biometrika 26 (1934).

    Examples
    --------
    >>> low, high = binomial_interval([47, 50], 50)
    >>> np.round(low, 3), np.round(high, 3)
    (array([0.838, 0.929]), array([0.979, 1.   ]))
    >>> low, high = binomial_interval(50, 50, method="beta")
    >>> float(np.round(low, 4)), float(high)
    (0.9289, 1.0)
    """
    check_choice(method, "method", INTERVAL_METHODS)
    alpha = check_fraction(alpha, "alpha", closed="neither")
    s, n = check_counts(successes, trials)
    return _interval_unchecked(s, n, alpha, method)


def paper_error_bar(p, k):
    """The regression paper's coverage error bar ``sqrt(p (1 - p) / k)``.

    Parameters
    ----------
    p : array_like, any shape
        Observed coverage fractions in ``[0, 1]``.
    k : array_like, broadcastable with ``p``
        Number of repetitions, ``>= 1``.

    Returns
    -------
    numpy.ndarray
        Half-widths (one binomial standard error at the observed proportion). It is 0 at
        ``p = 0`` and ``p = 1``; prefer :func:`binomial_interval` there.

    Examples
    --------
    >>> float(paper_error_bar(0.9, 100))
    0.03
    >>> paper_error_bar([0.0, 0.5], 25)
    array([0. , 0.1])
    """
    pa = numeric_array(p, "p")
    ka = numeric_array(k, "k")
    if ((pa < 0) | (pa > 1)).any():
        raise ValueError(f"p must lie in [0, 1], got range [{pa.min():.6g}, {pa.max():.6g}]")
    if (ka < 1).any():
        raise ValueError(f"k must be >= 1, got {ka[ka < 1][0]!r}")
    return _paper_error_bar(*check_broadcast(p=pa, k=ka))


# --------------------------------------------------------------------------------------------
# per-point coverage, deviation, ratio
#
# Each public function validates its inputs and calls one kernel below; coverage_summary calls
# the same kernels on its (already validated, possibly NaN-masked) xarray objects, so every
# formula of the module is written once. The kernels work on numpy arrays and DataArrays alike.


def _paper_error_bar(p, k):
    """``sqrt(p (1 - p) / k)``."""
    return np.sqrt(p * (1 - p) / k)


def _deviation(prediction, truth):
    """``|prediction - truth|``."""
    return abs(prediction - truth)


def _covered(dev, uncertainty, z: float):
    """Whether a deviation is covered: ``dev < z * uncertainty`` (strict,
    docs/conventions.md#r-4)."""
    return dev < z * uncertainty


def _ratio(uncertainty, reference_uncertainty):
    """``uncertainty / reference_uncertainty``."""
    return uncertainty / reference_uncertainty


def coverage(prediction, uncertainty, truth, *, z: float = COVERAGE_Z, dim: Hashable = "repetition",
             axis: int = 0):
    """Fraction of repetitions whose interval ``prediction ± z·uncertainty`` contains the truth.

    Parameters
    ----------
    prediction : array_like or xarray.DataArray, shape (k, ...) along ``axis`` / with ``dim``
        Predictions of the ``k`` repetitions.
    uncertainty : same type, broadcastable with ``prediction``
        Predicted standard deviations, ``>= 0``.
    truth : same type, broadcastable with ``prediction``
        Noise-free ground truth; usually lacks the repetition axis.
    z : float, default COVERAGE_Z
        Interval half-width in units of ``uncertainty`` (the 0.975 normal quantile,
        1.959964..., by default: a central 95% Gaussian interval).
    dim : hashable, default "repetition"
        Repetition dim, used when the inputs are ``xarray.DataArray`` s.
    axis : int, default 0
        Repetition axis, used for numpy/torch inputs (after broadcasting).

    Returns
    -------
    numpy.ndarray or xarray.DataArray
        Coverage per point: the inputs' broadcast shape without the repetition axis/dim.

    Notes
    -----
    ``coverage = (1/k) sum_r 1[|prediction_r - truth| < z * uncertainty_r]`` with a strict
    inequality (docs/conventions.md#r-4): a deviation exactly equal to ``z * uncertainty`` is
    *not* covered, so a zero uncertainty never covers.

    References
    ----------
    F. Schmähling, J. Martin, C. Elster (2023), "A framework for benchmarking uncertainty in
    deep regression", Applied Intelligence; docs/conventions.md#r-4.

    Examples
    --------
    >>> pred = np.array([[0.0, 1.0], [0.5, 3.0], [2.0, 2.0]])   # (k=3 repetitions, 2 points)
    >>> coverage(pred, np.ones_like(pred), np.array([0.0, 1.0]), z=1.0)  # |2 - 1| = 1 not < 1
    array([0.66666667, 0.33333333])
    >>> import xarray as xr
    >>> da = xr.DataArray(pred, dims=("repetition", "point"))
    >>> coverage(da, xr.ones_like(da), xr.DataArray([0.0, 1.0], dims="point"), z=1.0).dims
    ('point',)
    """
    z = check_positive_number(z, "z")
    if any(isinstance(a, xr.DataArray) for a in (prediction, uncertainty, truth)):
        das = dataarrays(prediction=prediction, uncertainty=uncertainty, truth=truth)
        p, u, t = das.values()
        check_positive(u.values, "uncertainty", strict=False)
        if dim not in p.dims:
            raise ValueError(f"prediction must have the repetition dim {dim!r}, got dims {p.dims}")
        return _covered(_deviation(p, t), u, z).mean(dim)
    p = numeric_array(prediction, "prediction")
    u = check_positive(numeric_array(uncertainty, "uncertainty"), "uncertainty", strict=False)
    t = numeric_array(truth, "truth")
    p, u, t = check_broadcast(prediction=p, uncertainty=u, truth=t)
    if p.ndim == 0:
        raise ValueError("prediction must have a repetition axis, got a scalar")
    if not -p.ndim <= axis < p.ndim:
        raise ValueError(f"axis must lie in [{-p.ndim}, {p.ndim}) for broadcast shape {p.shape}, "
                         f"got {axis!r}")
    return np.mean(_covered(_deviation(p, t), u, z), axis=axis)


def deviation(prediction, truth):
    """Absolute deviation ``|prediction - truth|`` (xarray in, xarray out).

    Parameters
    ----------
    prediction : array_like or xarray.DataArray, any shape
    truth : same type, broadcastable with ``prediction``

    Returns
    -------
    numpy.ndarray or xarray.DataArray
        Broadcast shape.

    Examples
    --------
    >>> deviation([1.0, -2.0], [0.5, 0.0])
    array([0.5, 2. ])
    """
    if isinstance(prediction, xr.DataArray) or isinstance(truth, xr.DataArray):
        das = dataarrays(prediction=prediction, truth=truth)
        return _deviation(das["prediction"], das["truth"])
    p, t = check_broadcast(prediction=numeric_array(prediction, "prediction"),
                           truth=numeric_array(truth, "truth"))
    return _deviation(p, t)


def uncertainty_ratio(uncertainty, reference_uncertainty):
    """Ratio of a method's uncertainty to the exact reference's (Lemma 1 diagnostic).

    Parameters
    ----------
    uncertainty : array_like or xarray.DataArray, any shape
        Uncertainties (standard deviations), ``>= 0``.
    reference_uncertainty : same type, broadcastable
        Reference uncertainties, ``> 0``.

    Returns
    -------
    numpy.ndarray or xarray.DataArray

    Notes
    -----
    By Lemma 1 of the regression paper no unbiased estimator has a smaller standard deviation
    than the Bayesian reference (Gauss-Markov / Cramer-Rao), so a ratio below 1 means the method
    is biased or understates its error.

    Examples
    --------
    >>> uncertainty_ratio([0.5, 2.0], [1.0, 1.0])
    array([0.5, 2. ])
    """
    if isinstance(uncertainty, xr.DataArray) or isinstance(reference_uncertainty, xr.DataArray):
        das = dataarrays(uncertainty=uncertainty, reference_uncertainty=reference_uncertainty)
        check_positive(das["uncertainty"].values, "uncertainty", strict=False)
        check_positive(das["reference_uncertainty"].values, "reference_uncertainty", strict=True)
        return _ratio(das["uncertainty"], das["reference_uncertainty"])
    u = check_positive(numeric_array(uncertainty, "uncertainty"), "uncertainty", strict=False)
    r = check_positive(numeric_array(reference_uncertainty, "reference_uncertainty"),
                       "reference_uncertainty", strict=True)
    return _ratio(*check_broadcast(uncertainty=u, reference_uncertainty=r))


# --------------------------------------------------------------------------------------------
# the study summary


def _mean_se(da: xr.DataArray, valid: xr.DataArray, dim: Hashable) -> tuple[xr.DataArray, ...]:
    """Mean and standard error std(ddof=1)/sqrt(k) over ``dim`` of the valid entries."""
    k = valid.sum(dim)
    x = da.where(valid, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = x.sum(dim) / k
        mean = mean.where(k > 0)
        ss = ((da - mean) ** 2).where(valid, 0.0).sum(dim)
        var = ss / (k - 1)
        se = np.sqrt(var / k).where(k > 1)
    return mean, se


def _reference_uncertainty(reference: Any, unc_mean: xr.DataArray,
                           dim: Hashable) -> tuple[xr.DataArray, str]:
    if isinstance(reference, xr.DataArray):
        ref = reference
        desc = f"given DataArray {reference.name!r} over dims {list(reference.dims)}"
        if dim in ref.dims:  # per-repetition reference uncertainties: their mean
            ref = ref.mean(dim)
        try:
            ref = xr.align(ref, unc_mean, join="exact")[0]
        except ValueError as exc:
            raise ValueError(f"reference coordinates do not match the data: {exc}") from None
    else:
        if isinstance(reference, tuple) and len(reference) == 2:
            sel = {reference[0]: reference[1]}
        elif isinstance(reference, Mapping) and reference:
            sel = dict(reference)
        else:
            raise ValueError(
                f"reference must be a (dim, label) tuple such as ('method', 'blr'), a mapping "
                f"dim -> label, or a DataArray of reference uncertainties; got {reference!r}"
            )
        for d in sel:
            if d not in unc_mean.dims:
                raise ValueError(f"reference dim {d!r} is not a dim of the summary "
                                 f"{list(unc_mean.dims)}")
        try:
            ref = unc_mean.sel(sel)
        except KeyError:
            raise ValueError(f"reference selection {sel!r} not found in the coordinates") from None
        ref = ref.drop_vars(list(sel), errors="ignore")
        desc = json.dumps({str(k): (v if isinstance(v, (str, int, float)) else str(v))
                           for k, v in sel.items()})
    extra = set(ref.dims) - set(unc_mean.dims)
    if extra:
        raise ValueError(f"reference has dims {sorted(map(str, extra))} the summary lacks "
                         f"{list(unc_mean.dims)}")
    vals = ref.values
    if np.any(vals[np.isfinite(vals)] <= 0):
        raise ValueError("reference uncertainty must be > 0 wherever it is defined, got a value "
                         f"<= 0 ({np.nanmin(vals)!r})")
    return ref, desc


def _check_regions(regions: Any, summary_dims: tuple, sizes: Mapping) -> xr.DataArray:
    if not isinstance(regions, xr.DataArray):
        raise ValueError(f"regions must be a boolean xarray.DataArray over the point dim(s), "
                         f"got {type(regions).__name__}")
    if regions.dtype != bool:
        raise ValueError(f"regions must be boolean (True = in-distribution), got dtype "
                         f"{regions.dtype}")
    if regions.ndim == 0:
        raise ValueError("regions must have at least one dim (the point dim)")
    for d in regions.dims:
        if d not in summary_dims:
            raise ValueError(f"regions dim {d!r} is not a dim of the data {list(summary_dims)}")
        if regions.sizes[d] != sizes[d]:
            raise ValueError(f"regions has size {regions.sizes[d]} along {d!r}, the data "
                             f"{sizes[d]}")
    return regions


def _validate_study(ds: Any, dim: Hashable, skipna: bool) -> dict[str, xr.DataArray]:
    if not isinstance(ds, xr.Dataset):
        raise ValueError(f"ds must be an xarray.Dataset with variables {list(_SUMMARY_VARS)}, "
                         f"got {type(ds).__name__}")
    missing = [v for v in _SUMMARY_VARS if v not in ds.data_vars]
    if missing:
        raise ValueError(f"ds lacks data variables {missing} (has {list(ds.data_vars)})")
    out = {}
    for v in _SUMMARY_VARS:
        da = ds[v]
        if da.dtype.kind not in "biuf":
            raise ValueError(f"ds[{v!r}] must be numeric, got dtype {da.dtype}")
        vals = da.values.astype(np.float64, copy=False)
        if np.isinf(vals).any() or (not skipna and np.isnan(vals).any()):
            bad = np.argwhere(~np.isfinite(vals))[0]
            where = {d: int(i) for d, i in zip(da.dims, bad)}
            raise ValueError(
                f"ds[{v!r}] contains non-finite values (first at {where}: {vals[tuple(bad)]!r})"
                + ("" if skipna else "; pass skipna=True to treat NaN as a missing repetition")
            )
        out[v] = da.astype(np.float64)
    for v in ("prediction", "uncertainty"):
        if dim not in out[v].dims:
            raise ValueError(f"ds[{v!r}] must have the repetition dim {dim!r}, got dims "
                             f"{out[v].dims}")
    u = out["uncertainty"].values
    if np.any(u[~np.isnan(u)] < 0):
        raise ValueError(f"ds['uncertainty'] must be >= 0, got minimum {np.nanmin(u)!r}")
    return out


def coverage_summary(ds: xr.Dataset, *, dim: Hashable = "repetition", z: float = COVERAGE_Z,
                     reference: Any = None, alpha: float = 0.05, method: str = "wilson",
                     regions: xr.DataArray | None = None, region_dims: Any = None,
                     skipna: bool = False) -> xr.Dataset:
    """Per-point (and per-region) summary of a repeated-retrain coverage study
    (docs/conventions.md#r-4).

    Parameters
    ----------
    ds : xarray.Dataset
        Raw study results with data variables ``prediction`` and ``uncertainty`` over, e.g.,
        ``(method, complexity, repetition, point)`` and ``truth`` over any subset of those dims
        (usually without ``repetition`` and ``method``). Any other dims are kept as they are.
    dim : hashable, default "repetition"
        The repetition dim reduced by the summary.
    z : float, default COVERAGE_Z
        Interval half-width in units of ``uncertainty`` for the coverage (1.959964..., the
        0.975 normal quantile).
    reference : (dim, label) tuple, mapping or xarray.DataArray, optional
        The reference uncertainty for ``uncertainty_ratio``: a selection of the summary such as
        ``("method", "blr")`` (its ``uncertainty_mean``) or a DataArray of reference
        uncertainties over a subset of the summary dims (averaged over ``dim`` if it has it).
    alpha : float, default 0.05
        One minus the confidence level of the binomial interval.
    method : {"wilson", "beta", "clopper-pearson"}, default "wilson"
        Binomial interval, see :func:`binomial_interval`.
    regions : boolean xarray.DataArray, optional
        Over the point dim(s) (e.g. ``point``, or ``x1, x2`` for a grid); ``True`` marks
        in-distribution points. Adds the ``region_*`` variables over a new dim
        ``region = ["in", "out"]``. It may also vary along other dims (e.g.
        ``(complexity, point)`` when the training box changes with complexity); then name the
        point dims in ``region_dims``.
    region_dims : hashable or sequence of hashables, optional
        The dims averaged over for the regions; default all dims of ``regions``.
    skipna : bool, default False
        If True, NaN in ``prediction``, ``uncertainty`` or ``truth`` marks a missing repetition
        (e.g. a cell not computed yet) and is left out of every count; otherwise NaN raises.
        Infinite values always raise.

    Returns
    -------
    xarray.Dataset
        Over the input dims without ``dim`` (``point`` dims kept):

        ``n_repetitions`` (int): valid repetitions ``k``;
        ``coverage``, ``coverage_low``, ``coverage_high`` (binomial interval),
        ``coverage_err`` (``sqrt(p(1-p)/k)``);
        ``deviation_mean``, ``deviation_se``, ``uncertainty_mean``, ``uncertainty_se``;
        ``uncertainty_ratio`` (only with ``reference``): ``uncertainty_mean`` divided by the
        reference's ``uncertainty_mean``, per point.

        With ``regions``, over the non-point dims and ``region``: ``region_n_points``,
        ``region_coverage`` and ``region_coverage_se``, ``region_deviation_mean`` / ``_se``,
        ``region_uncertainty_mean`` / ``_se``, and ``region_uncertainty_ratio``.

        Attrs: ``z``, ``interval_method``, ``alpha``, ``repetition_dim``, ``reference``
        and the conventions (``coverage_convention`` ...). Input attrs are kept.

    Notes
    -----
    Per point with ``k`` valid repetitions ``r`` and deviation ``d_r = |prediction_r - truth|``:

    - ``coverage = (1/k) sum_r 1[d_r < z u_r]`` (strict ``<``);
    - ``*_mean = (1/k) sum_r x_r``, ``*_se = std_r(x, ddof=1) / sqrt(k)`` (NaN for ``k < 2``);
    - ``uncertainty_ratio = uncertainty_mean / reference uncertainty_mean``.

    Regions: for each repetition, average over the points of the region (the fraction of region
    points covered, the mean deviation, the mean uncertainty), then mean and standard error of
    these per-repetition averages over the repetitions (which are independent, unlike the
    points). ``region_coverage`` thus equals the mean over region points of ``coverage``;
    ``region_uncertainty_ratio`` is the mean over region points of the per-point ratio.

    References
    ----------
    F. Schmähling, J. Martin, C. Elster (2023), "A framework for benchmarking uncertainty in
    deep regression", Applied Intelligence, Secs. 4-5; docs/conventions.md#r-4.

    Examples
    --------
    >>> import xarray as xr
    >>> rng = np.random.default_rng(0)
    >>> truth = xr.DataArray(np.zeros(4), dims="point")
    >>> pred = xr.DataArray(rng.normal(size=(2, 200, 4)), dims=("method", "repetition", "point"),
    ...                     coords={"method": ["blr", "ens"]})
    >>> unc = xr.ones_like(pred) * xr.DataArray([1.0, 0.5], dims="method")
    >>> ds = xr.Dataset({"prediction": pred, "uncertainty": unc, "truth": truth})
    >>> s = coverage_summary(ds, reference=("method", "blr"),
    ...                      regions=xr.DataArray([True, True, False, False], dims="point"))
    >>> s.coverage.dims, s.region_coverage.dims
    (('method', 'point'), ('method', 'region'))
    >>> s.uncertainty_ratio.sel({"method": "ens"}).values   # not .sel(method=...): a sel keyword
    array([0.5, 0.5, 0.5, 0.5])
    >>> s.region_coverage.sel({"method": "ens"}).round(2).values
    array([0.68, 0.7 ])
    """
    z = check_positive_number(z, "z")
    alpha = check_fraction(alpha, "alpha", closed="neither")
    check_choice(method, "method", INTERVAL_METHODS)
    if not isinstance(skipna, bool):
        raise ValueError(f"skipna must be a bool, got {skipna!r}")
    v = _validate_study(ds, dim, skipna)
    try:
        pred, unc, truth = xr.align(v["prediction"], v["uncertainty"], v["truth"], join="exact")
    except ValueError as exc:
        raise ValueError(f"ds variables have conflicting coordinates: {exc}") from None
    # full broadcast shape (method, complexity, repetition, point, ...)
    pred, unc, truth = xr.broadcast(pred, unc, truth)
    order = [d for d in v["prediction"].dims] + [d for d in pred.dims
                                                   if d not in v["prediction"].dims]
    pred, unc, truth = (a.transpose(*order) for a in (pred, unc, truth))
    valid = pred.notnull() & unc.notnull() & truth.notnull()
    dev = _deviation(pred, truth)
    with np.errstate(invalid="ignore"):
        hit = _covered(dev, unc, z) & valid

    k = valid.sum(dim)
    hits = hit.sum(dim)
    with np.errstate(divide="ignore", invalid="ignore"):
        cov = (hits / k).where(k > 0)
    low, high = _interval_unchecked(hits.values, k.values, alpha, method)
    with np.errstate(invalid="ignore"):
        err = _paper_error_bar(cov, k)
    dev_mean, dev_se = _mean_se(dev, valid, dim)
    unc_mean, unc_se = _mean_se(unc, valid, dim)

    out = xr.Dataset(
        {
            "n_repetitions": k.astype(np.int64),
            "coverage": cov,
            "coverage_low": cov.copy(data=low),
            "coverage_high": cov.copy(data=high),
            "coverage_err": err,
            "deviation_mean": dev_mean,
            "deviation_se": dev_se,
            "uncertainty_mean": unc_mean,
            "uncertainty_se": unc_se,
        }
    )
    ratio = None
    ref_desc = "none"
    if reference is not None:
        ref, ref_desc = _reference_uncertainty(reference, unc_mean, dim)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = _ratio(unc_mean, ref)
        out["uncertainty_ratio"] = ratio.transpose(*unc_mean.dims)

    if regions is not None:
        reg = _check_regions(regions, tuple(unc_mean.dims), unc_mean.sizes)
        rdims = _check_region_dims(region_dims, reg)
        try:
            reg = xr.align(reg, unc_mean, join="exact")[0]
        except ValueError as exc:
            raise ValueError(f"regions coordinates do not match the data: {exc}") from None
        regional = _region_summary(reg, rdims, dim, valid, hit, dev, unc, ratio)
        out = out.merge(regional.transpose(..., "region"))

    for name, text in _DESCRIPTIONS.items():
        if name in out:
            out[name].attrs["description"] = text
    out.attrs = {**ds.attrs, **_summary_attrs(z, alpha, method, dim, ref_desc, regions)}
    return out


def _check_region_dims(region_dims: Any, reg: xr.DataArray) -> list:
    if region_dims is None:
        return list(reg.dims)
    dims = [region_dims] if isinstance(region_dims, str) or not isinstance(
        region_dims, (list, tuple)) else list(region_dims)
    bad = [d for d in dims if d not in reg.dims]
    if bad or not dims:
        raise ValueError(f"region_dims must be dims of regions {list(reg.dims)}, got "
                         f"{region_dims!r}")
    return dims


def _region_summary(reg, point_dims, dim, valid, hit, dev, unc, ratio) -> xr.Dataset:
    parts = []
    for label, mask in (("in", reg), ("out", ~reg)):
        vm = valid & mask
        n_pts = vm.sum(point_dims)                          # valid points per repetition
        rep_ok = n_pts > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            per_rep = {
                "coverage": hit.where(vm, False).sum(point_dims) / n_pts,
                "deviation": dev.where(vm, 0.0).sum(point_dims) / n_pts,
                "uncertainty": unc.where(vm, 0.0).sum(point_dims) / n_pts,
            }
        res = {"region_n_points": mask.sum(point_dims).astype(np.int64)}
        for name, x in per_rep.items():
            m, se = _mean_se(x, rep_ok, dim)
            key = "region_coverage" if name == "coverage" else f"region_{name}_mean"
            res[key] = m
            res[key.replace("_mean", "") + "_se"] = se
        if ratio is not None:
            r = ratio.where(mask.broadcast_like(ratio))
            with np.errstate(divide="ignore", invalid="ignore"):
                cnt = r.notnull().sum(point_dims)
                res["region_uncertainty_ratio"] = (r.fillna(0).sum(point_dims) / cnt).where(cnt > 0)
        parts.append(xr.Dataset(res).expand_dims(region=[label]))
    return xr.concat(parts, dim="region")


_DESCRIPTIONS = {
    "n_repetitions": "number of valid repetitions k",
    "coverage": "fraction of repetitions with |prediction - truth| < z * uncertainty",
    "coverage_low": "lower bound of the binomial confidence interval of coverage",
    "coverage_high": "upper bound of the binomial confidence interval of coverage",
    "coverage_err": "paper error bar sqrt(p (1 - p) / k)",
    "deviation_mean": "mean over repetitions of |prediction - truth|",
    "deviation_se": "standard error std(ddof=1)/sqrt(k) of deviation over repetitions",
    "uncertainty_mean": "mean over repetitions of the predicted standard deviation",
    "uncertainty_se": "standard error std(ddof=1)/sqrt(k) of uncertainty over repetitions",
    "uncertainty_ratio": "uncertainty_mean / reference uncertainty_mean, per point",
    "region_n_points": "number of points in the region",
    "region_coverage": "mean over repetitions of the fraction of region points covered",
    "region_coverage_se": "standard error over repetitions of the per-repetition region coverage",
    "region_deviation_mean": "mean over repetitions of the region-mean deviation",
    "region_deviation_se": "standard error over repetitions of the region-mean deviation",
    "region_uncertainty_mean": "mean over repetitions of the region-mean uncertainty",
    "region_uncertainty_se": "standard error over repetitions of the region-mean uncertainty",
    "region_uncertainty_ratio": "mean over region points of uncertainty_ratio",
}


def _summary_attrs(z, alpha, method, dim, ref_desc, regions) -> dict[str, Any]:
    return {
        "z": float(z),
        "alpha": float(alpha),
        "interval_method": "clopper-pearson" if INTERVAL_METHODS[method] == "beta" else "wilson",
        "repetition_dim": str(dim),
        "reference": ref_desc,
        "regions": "none" if regions is None else
        "region 'in' = regions True (in-distribution), 'out' = regions False",
        "coverage_convention": "S.6/R.4: coverage = mean_r 1[|prediction - truth| < z * "
        "uncertainty], strict <",
        "coverage_err_convention": "paper bars sqrt(p(1-p)/k), one binomial standard error",
        "se_convention": "standard error over repetitions = std(ddof=1)/sqrt(k)",
        "uncertainty_ratio_convention": "ratio of mean uncertainties per point "
        "(method / reference)",
        "region_convention": "per-repetition averages over region points, then mean and "
        "standard error over repetitions",
    }


# --------------------------------------------------------------------------------------------
# proper scores against noisy targets


def _gaussian_args(y, mean, std) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ya = numeric_array(y, "y")
    ma = numeric_array(mean, "mean")
    sa = numeric_array(std, "std")
    check_same_shape(y=ya, mean=ma, std=sa)
    if ya.size == 0:
        raise ValueError(f"y is empty (shape {ya.shape})")
    check_positive(sa, "std", strict=True)
    return ya, ma, sa


_PROPER = {"permutation_invariant", "proper_scoring_rule"}


@register_metric("gaussian_nll", kind="regression", properties=_PROPER)
def gaussian_nll_loss(y, mean, std) -> float:
    """Mean negative log-likelihood of targets under ``N(mean, std²)``.

    Parameters
    ----------
    y : array_like, shape (n, ...)
        Observed (noisy) targets.
    mean : array_like, same shape as ``y``
        Predictive means.
    std : array_like, same shape as ``y``
        Predictive standard deviations, ``> 0``.

    Returns
    -------
    float
        Lower is better; a strictly proper scoring rule.

    Notes
    -----
    ``NLL = mean_i [ 0.5 log(2 pi) + log std_i + 0.5 ((y_i - mean_i) / std_i)^2 ]``, the full
    density including the constant (PyTorch's ``GaussianNLLLoss(full=True)``).

    References
    ----------
    T. Gneiting and A. E. Raftery, "Strictly proper scoring rules, prediction, and estimation",
    JASA 102 (2007).

    Examples
    --------
    >>> round(gaussian_nll_loss([0.0], [0.0], [1.0]), 6)   # 0.5 * log(2 pi)
    0.918939
    """
    ya, ma, sa = _gaussian_args(y, mean, std)
    r = (ya - ma) / sa
    return float(np.mean(0.5 * math.log(2 * math.pi) + np.log(sa) + 0.5 * r * r))


@register_metric("crps", kind="regression", properties=_PROPER)
def crps_gaussian_loss(y, mean, std) -> float:
    """Mean continuous ranked probability score of ``N(mean, std²)`` forecasts (closed form).

    Parameters
    ----------
    y : array_like, shape (n, ...)
        Observed targets.
    mean : array_like, same shape as ``y``
        Predictive means.
    std : array_like, same shape as ``y``
        Predictive standard deviations, ``> 0``.

    Returns
    -------
    float
        Lower is better, in the units of ``y``; strictly proper.

    Notes
    -----
    ``CRPS(F, y) = int (F(t) - 1[t >= y])^2 dt``; for ``F = N(mu, s^2)`` and ``w = (y - mu)/s``,
    ``CRPS = s [ w (2 Phi(w) - 1) + 2 phi(w) - 1/sqrt(pi) ]`` (Gneiting and Raftery 2007,
    eq. 21).

    References
    ----------
    T. Gneiting and A. E. Raftery, JASA 102 (2007); Gneiting et al., Monthly Weather Review 133
    (2005).

    Examples
    --------
    >>> round(crps_gaussian_loss([0.0], [0.0], [1.0]), 6)   # (sqrt(2) - 1) / sqrt(pi)
    0.233695
    """
    ya, ma, sa = _gaussian_args(y, mean, std)
    w = (ya - ma) / sa
    cdf = special.ndtr(w)
    pdf = np.exp(-0.5 * w * w) / math.sqrt(2 * math.pi)
    return float(np.mean(sa * (w * (2 * cdf - 1) + 2 * pdf - 1 / math.sqrt(math.pi))))


def interval_width(std, *, z: float = COVERAGE_Z) -> float:
    """Mean width ``2 z std`` of the central Gaussian predictive intervals.

    Parameters
    ----------
    std : array_like, any shape
        Predictive standard deviations, ``> 0``.
    z : float, default COVERAGE_Z
        Half-width in standard deviations (the default 1.959964..., the 0.975 normal quantile,
        gives the central 95% interval).

    Returns
    -------
    float
        Lower is sharper; report it together with coverage.

    Examples
    --------
    >>> interval_width([1.0, 2.0], z=1.0)
    3.0
    """
    z = check_positive_number(z, "z")
    sa = numeric_array(std, "std")
    if sa.size == 0:
        raise ValueError(f"std is empty (shape {sa.shape})")
    check_positive(sa, "std", strict=True)
    return float(np.mean(2 * z * sa))


@register_metric("interval_width", kind="regression", properties={"permutation_invariant"},
                 greater_is_better=False)
def _interval_width_metric(y, mean, std) -> float:
    """Mean width of the central 95% interval (:func:`interval_width`; ``y``, ``mean`` unused)."""
    _, _, sa = _gaussian_args(y, mean, std)
    return interval_width(sa)


# --------------------------------------------------------------------------------------------
# average calibration, sharpness, check and interval scores, PIT, recalibration (S.6)
#
# uncertainty-toolbox parity (Chung et al. 2021): defaults and definitions follow its metrics
# (``uncertainty_toolbox.metrics_calibration`` / ``metrics_scoring_rule`` / ``recalibration``,
# version 0.1.1); docs/conventions.md#s-6 lists where they depart.

#: Default number of expected proportions of the calibration curve (``linspace(0, 1, 100)``).
CALIBRATION_BINS = 100
#: Default levels of the check score and coverages of the interval score: 0.01, 0.02, ..., 0.99.
SCORE_LEVELS = np.linspace(0.01, 0.99, 99)
PROP_TYPES = ("interval", "quantile")
CALIBRATION_CRITERIA = ("mace", "rmsce", "miscalibration_area")
#: Criteria of :class:`SigmaScaling`: the Gaussian NLL (its default), and the calibration errors.
SIGMA_SCALING_CRITERIA = ("nll", *CALIBRATION_CRITERIA)


def _check_bins(num_bins) -> int:
    if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)) or num_bins < 2:
        raise InputError(f"num_bins must be an integer >= 2, got {num_bins!r}")
    return int(num_bins)


def _check_levels(levels, name: str) -> np.ndarray:
    la = numeric_array(levels, name)
    if la.ndim != 1 or la.size == 0:
        raise InputError(f"{name} must be a non-empty 1-D array, got shape {la.shape}")
    bad = la[~((la > 0) & (la < 1))]
    if bad.size:
        raise InputError(f"{name} must lie in (0, 1), got {float(bad[0])!r}")
    return la


def _observed_proportions(ya, ma, sa, levels: np.ndarray, prop_type: str) -> np.ndarray:
    """Observed proportion of targets in the central ``levels`` intervals (``interval``) or
    below the ``levels`` quantiles (``quantile``) of ``N(mean, std^2)``; ``levels`` (m,)."""
    check_choice(prop_type, "prop_type", PROP_TYPES)
    n = ya.size
    if prop_type == "interval":
        r = ((ma - ya).reshape(-1) / sa.reshape(-1))[:, None]   # the toolbox's residual sign
        inside = (r >= special.ndtri(0.5 - levels / 2.0)) & (r <= special.ndtri(0.5 + levels / 2.0))
    else:
        r = ((ya - ma).reshape(-1) / sa.reshape(-1))[:, None]
        inside = r <= special.ndtri(levels)
    return inside.sum(axis=0) / n


def _nominal_levels(num_bins: int, recalibrator) -> tuple[np.ndarray, np.ndarray]:
    expected = np.linspace(0.0, 1.0, num_bins)
    if recalibrator is None:
        return expected, expected
    if not hasattr(recalibrator, "levels"):
        raise InputError(f"recalibrator must be a fitted IsotonicRecalibrator (an object with "
                         f"levels(p)), got {recalibrator!r}")
    return expected, np.asarray(recalibrator.levels(expected), float)


def calibration_curve(y, mean, std, *, num_bins: int = CALIBRATION_BINS,
                      prop_type: str = "interval", recalibrator=None):
    """Expected against observed proportions of Gaussian predictive intervals (or quantiles).

    Parameters
    ----------
    y : array_like, shape (n,)
        Observed targets.
    mean, std : array_like, shape (n,)
        Predictive means and standard deviations (``std > 0``).
    num_bins : int, default 100
        Number of expected proportions ``p = linspace(0, 1, num_bins)`` (uncertainty-toolbox's
        ``num_bins``).
    prop_type : {"interval", "quantile"}, default "interval"
        ``"interval"``: fraction of targets in the central ``p`` interval
        ``[mean + std Phi^-1(1/2 - p/2), mean + std Phi^-1(1/2 + p/2)]`` (closed);
        ``"quantile"``: fraction of targets ``<= mean + std Phi^-1(p)``.
    recalibrator : IsotonicRecalibrator, optional
        A fitted recalibrator: the intervals (quantiles) are taken at the recalibrated levels
        ``recalibrator.levels(p)`` while ``p`` stays the expected proportion.

    Returns
    -------
    expected, observed : numpy.ndarray, shape (num_bins,)

    Notes
    -----
    As ``uncertainty_toolbox.get_proportion_lists_vectorized`` for ``prop_type="interval"``.
    For ``"quantile"`` the toolbox counts ``(mean - y) / std <= Phi^-1(p)``, i.e. targets at or
    *above* the ``1 - p`` quantile; here it is the fraction at or below the ``p`` quantile (the
    toolbox's value is this one's at ``2 mean - y``; docs/conventions.md#s-6).

    References
    ----------
    V. Kuleshov, N. Fenner, S. Ermon, "Accurate uncertainties for deep learning using calibrated
    regression", ICML 2018; Y. Chung et al., "Uncertainty Toolbox: an open-source library for
    assessing, visualizing, and improving uncertainty quantification", arXiv:2109.10254 (2021).

    Examples
    --------
    >>> exp, obs = calibration_curve([0.0, 3.0], [0.0, 0.0], [1.0, 1.0], num_bins=3)
    >>> exp.tolist(), obs.tolist()
    ([0.0, 0.5, 1.0], [0.5, 0.5, 1.0])
    """
    ya, ma, sa = _gaussian_args(y, mean, std)
    num_bins = _check_bins(num_bins)
    check_choice(prop_type, "prop_type", PROP_TYPES)
    expected, levels = _nominal_levels(num_bins, recalibrator)
    return expected, _observed_proportions(ya, ma, sa, levels, prop_type)


def _mace(expected, observed) -> float:
    return float(np.mean(np.abs(expected - observed)))


def _rmsce(expected, observed) -> float:
    return float(np.sqrt(np.mean(np.square(expected - observed))))


def _area(expected, observed) -> float:
    """Area between the curve and the diagonal, trapezoids split where the curve crosses it
    (the toolbox's ``miscalibration_area_from_proportions``)."""
    d = observed - expected
    dl, dr = d[:-1], d[1:]
    w = np.diff(expected)
    cross = (dl * dr) < 0
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(cross, dl / (dl - dr), 0.0)            # crossing at xl + t * w
    trap = np.abs(0.5 * w * (dl + dr))
    hourglass = 0.5 * w * (np.abs(dl) * t + np.abs(dr) * (1 - t))
    return float(np.sum(np.where(cross, hourglass, trap)))


_CALIBRATION_FNS = {"mace": _mace, "rmsce": _rmsce, "miscalibration_area": _area}


@register_metric("mace", kind="regression", properties={"permutation_invariant"})
def mean_absolute_calibration_error(y, mean, std, *, num_bins: int = CALIBRATION_BINS,
                                    prop_type: str = "interval", recalibrator=None) -> float:
    """Mean absolute calibration error: mean over ``p`` of ``|observed(p) - p|``.

    Parameters
    ----------
    y, mean, std : array_like, shape (n,)
        Targets, predictive means and standard deviations (``std > 0``).
    num_bins, prop_type, recalibrator
        As :func:`calibration_curve` (100 proportions, central intervals by default).

    Returns
    -------
    float
        In [0, 1]; lower is better (0: calibrated at every level).

    Notes
    -----
    ``MACE = (1/m) sum_j |obs(p_j) - p_j|`` over ``p_j = linspace(0, 1, m)``, as
    ``uncertainty_toolbox.mean_absolute_calibration_error`` (Chung et al. 2021).

    Examples
    --------
    >>> round(mean_absolute_calibration_error([0.0, 3.0], [0.0, 0.0], [1.0, 1.0], num_bins=3), 6)
    0.166667
    """
    return _mace(*calibration_curve(y, mean, std, num_bins=num_bins, prop_type=prop_type,
                                    recalibrator=recalibrator))


@register_metric("rmsce", kind="regression", properties={"permutation_invariant"})
def root_mean_squared_calibration_error(y, mean, std, *, num_bins: int = CALIBRATION_BINS,
                                        prop_type: str = "interval",
                                        recalibrator=None) -> float:
    """Root mean squared calibration error: ``sqrt(mean_p (observed(p) - p)^2)``.

    Parameters
    ----------
    y, mean, std : array_like, shape (n,)
        Targets, predictive means and standard deviations (``std > 0``).
    num_bins, prop_type, recalibrator
        As :func:`calibration_curve`.

    Returns
    -------
    float
        In [0, 1]; lower is better.

    Examples
    --------
    >>> round(root_mean_squared_calibration_error([0.0, 3.0], [0.0, 0.0], [1.0, 1.0],
    ...                                           num_bins=3), 6)
    0.288675
    """
    return _rmsce(*calibration_curve(y, mean, std, num_bins=num_bins, prop_type=prop_type,
                                     recalibrator=recalibrator))


@register_metric("miscalibration_area", kind="regression", properties={"permutation_invariant"})
def miscalibration_area_error(y, mean, std, *, num_bins: int = CALIBRATION_BINS,
                              prop_type: str = "interval", recalibrator=None) -> float:
    """Area between the calibration curve and the diagonal.

    Parameters
    ----------
    y, mean, std : array_like, shape (n,)
        Targets, predictive means and standard deviations (``std > 0``).
    num_bins, prop_type, recalibrator
        As :func:`calibration_curve`.

    Returns
    -------
    float
        In [0, 1/2]; lower is better.

    Notes
    -----
    The curve ``(p_j, obs(p_j))`` joined by straight segments; between two neighbouring
    proportions the area is a trapezoid, or two triangles where the segment crosses the
    diagonal (``uncertainty_toolbox.miscalibration_area``). It tends to MACE as
    ``num_bins`` grows.

    Examples
    --------
    >>> round(miscalibration_area_error([0.0, 3.0], [0.0, 0.0], [1.0, 1.0], num_bins=3), 6)
    0.125
    """
    return _area(*calibration_curve(y, mean, std, num_bins=num_bins, prop_type=prop_type,
                                    recalibrator=recalibrator))


def _rng(rng):
    """``None``/int seed -> ``default_rng``; a ``Generator`` or ``RandomState`` as is."""
    if isinstance(rng, (np.random.Generator, np.random.RandomState)):
        return rng
    if rng is None or (isinstance(rng, (int, np.integer)) and not isinstance(rng, bool)
                       and rng >= 0):
        return np.random.default_rng(rng)
    raise InputError(f"rng must be a seed (int >= 0), a numpy Generator or RandomState, "
                     f"got {rng!r}")


def adversarial_group_calibration(y, mean, std, *, criterion: str = "mace",
                                  prop_type: str = "interval", num_bins: int = CALIBRATION_BINS,
                                  num_group_bins: int = 10, draw_with_replacement: bool = False,
                                  num_trials: int = 10, num_group_draws: int = 10, rng=0):
    """Worst calibration error over random groups of each size (adversarial group calibration).

    Parameters
    ----------
    y, mean, std : array_like, shape (n,)
        Targets, predictive means and standard deviations (``std > 0``).
    criterion : {"mace", "rmsce"}, default "mace"
        Calibration error within a group (the toolbox's ``cali_type`` ``"mean_abs"`` and
        ``"root_mean_sq"``).
    prop_type, num_bins
        As :func:`calibration_curve`.
    num_group_bins : int, default 10
        Group size fractions ``r = linspace(0, 1, num_group_bins)``; a group has
        ``max(round(n r), 2)`` points.
    draw_with_replacement : bool, default False
    num_trials, num_group_draws : int, default 10
        Per fraction and trial, the worst error over ``num_group_draws`` random groups; then
        mean and standard deviation (ddof 1) over ``num_trials`` trials.
    rng : int, numpy.random.Generator or numpy.random.RandomState, default 0
        Seed or generator of the groups (``rng.choice(n, size, replace=...)``). A
        ``RandomState`` in the state of ``np.random.seed(s)`` draws the toolbox's groups.

    Returns
    -------
    dict
        ``group_size`` (num_group_bins,): the fractions ``r``; ``score_mean`` and
        ``score_stderr`` (num_group_bins,): mean and standard deviation over trials of the worst
        group error (the toolbox's names, though ``score_stderr`` is a standard deviation).

    References
    ----------
    Y. Chung et al. (2021), uncertainty-toolbox ``adversarial_group_calibration``; Zhao, Ma,
    Ermon, "Individual calibration with randomized forecasting", ICML 2020.
    """
    ya, ma, sa = _gaussian_args(y, mean, std)
    check_choice(criterion, "criterion", ("mace", "rmsce"))
    check_choice(prop_type, "prop_type", PROP_TYPES)
    num_bins = _check_bins(num_bins)
    for name, v in (("num_group_bins", num_group_bins), ("num_trials", num_trials),
                    ("num_group_draws", num_group_draws)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise InputError(f"{name} must be an integer >= 1, got {v!r}")
    if num_trials < 2:
        raise InputError(f"num_trials must be >= 2 (a standard deviation), got {num_trials!r}")
    gen = _rng(rng)
    ya, ma, sa = ya.reshape(-1), ma.reshape(-1), sa.reshape(-1)
    n = ya.size
    if not draw_with_replacement and n < 2:
        raise InputError(f"y must have >= 2 points to draw groups without replacement, got {n}")
    fn = _CALIBRATION_FNS[criterion]
    expected = np.linspace(0.0, 1.0, num_bins)
    ratios = np.linspace(0, 1, num_group_bins)
    means, sds = [], []
    for r in ratios:
        size = max(round(n * r), 2)
        worst = []
        for _ in range(num_trials):
            scores = []
            for _ in range(num_group_draws):
                idx = gen.choice(n, size, replace=draw_with_replacement)
                obs = _observed_proportions(ya[idx], ma[idx], sa[idx], expected, prop_type)
                scores.append(fn(expected, obs))
            worst.append(max(scores))
        means.append(np.mean(worst))
        sds.append(np.std(worst, ddof=1))
    return {"group_size": ratios, "score_mean": np.array(means), "score_stderr": np.array(sds)}


@register_metric("adversarial_group_mace", kind="regression")
def adversarial_group_calibration_error(y, mean, std, *, rng=0) -> float:
    """Mean over group sizes of the worst-group MACE (:func:`adversarial_group_calibration`).

    Parameters
    ----------
    y, mean, std : array_like, shape (n,)
        Targets, predictive means and standard deviations (``std > 0``).
    rng : int, Generator or RandomState, default 0
        Seed of the random groups.

    Returns
    -------
    float
        ``mean(score_mean)`` over the 10 group fractions of the toolbox's defaults; lower is
        better. The toolbox reports the curve only; this one-number summary is ours.
    """
    return float(np.mean(adversarial_group_calibration(y, mean, std, rng=rng)["score_mean"]))


@register_metric("sharpness", kind="regression", properties={"permutation_invariant"},
                 greater_is_better=False)
def sharpness(y, mean, std) -> float:
    """Sharpness ``sqrt(mean(std^2))``, the root mean predictive variance (``y``, ``mean`` unused).

    Parameters
    ----------
    y, mean, std : array_like, shape (n,)
        Targets and predictive means (validated, unused) and standard deviations (``std > 0``).

    Returns
    -------
    float
        Lower is sharper; report it with a calibration error (Chung et al. 2021).

    Examples
    --------
    >>> sharpness([0.0, 0.0], [0.0, 0.0], [1.0, 7.0])
    5.0
    """
    _, _, sa = _gaussian_args(y, mean, std)
    return float(np.sqrt(np.mean(sa ** 2)))


def _pinball(ya, q, levels) -> float:
    """Mean over points and levels of ``(1[y <= q] - tau) (q - y)``; ``q`` (n, m)."""
    diff = q - ya[:, None]
    return float(np.mean(((diff >= 0).astype(float) - levels) * diff))


def _interval_score(ya, lower, upper, coverages) -> float:
    """Mean over points and coverages of the Gneiting-Raftery interval score."""
    a = 2.0 / (1.0 - coverages)
    yy = ya[:, None]
    s = (upper - lower) + a * (lower - yy) * (lower > yy) + a * (yy - upper) * (yy > upper)
    return float(np.mean(s))


def _predicted_2d(values, name: str, n: int, m: int) -> np.ndarray:
    va = numeric_array(values, name)
    if va.ndim == 1 and m == 1:
        va = va[:, None]
    if va.shape != (n, m):
        raise InputError(f"{name} must have shape (n, m) = ({n}, {m}), got {va.shape}")
    return va


def quantile_check_loss(y, quantiles, levels) -> float:
    """Check (pinball) score of predicted quantiles, averaged over points and levels.

    Parameters
    ----------
    y : array_like, shape (n,)
        Observed targets.
    quantiles : array_like, shape (n, m) (or (n,) with one level)
        Predicted quantiles of each point at each level.
    levels : array_like, shape (m,)
        Quantile levels ``tau`` in (0, 1).

    Returns
    -------
    float
        ``mean_{i,j} rho_tau_j(y_i - q_ij)`` with ``rho_tau(u) = u (tau - 1[u < 0])``; lower is
        better; proper for each quantile (Gneiting and Raftery 2007, sec. 6).

    Examples
    --------
    >>> quantile_check_loss([1.0, -1.0], [[0.0], [0.0]], [0.5])   # half the MAE
    0.5
    """
    ya = numeric_array(y, "y").reshape(-1)
    if ya.size == 0:
        raise InputError("y is empty (shape (0,))")
    la = _check_levels(levels, "levels")
    return _pinball(ya, _predicted_2d(quantiles, "quantiles", ya.size, la.size), la)


def interval_score_from_bounds_loss(y, lower, upper, coverage) -> float:
    """Interval score of predicted central intervals, averaged over points and coverages.

    Parameters
    ----------
    y : array_like, shape (n,)
        Observed targets.
    lower, upper : array_like, shape (n, m) (or (n,) with one coverage)
        Interval bounds, ``lower <= upper``.
    coverage : array_like, shape (m,)
        Nominal coverages ``p`` in (0, 1) (``alpha = 1 - p``).

    Returns
    -------
    float
        ``mean (u - l) + (2/alpha)(l - y) 1[y < l] + (2/alpha)(y - u) 1[y > u]``; lower is
        better (Gneiting and Raftery 2007, sec. 6.2).

    Examples
    --------
    >>> interval_score_from_bounds_loss([0.0, 3.0], [-1.0, -1.0], [1.0, 1.0], [0.5])  # (2 + 10)/2
    6.0
    """
    ya = numeric_array(y, "y").reshape(-1)
    if ya.size == 0:
        raise InputError("y is empty (shape (0,))")
    ca = _check_levels(coverage, "coverage")
    lo = _predicted_2d(lower, "lower", ya.size, ca.size)
    hi = _predicted_2d(upper, "upper", ya.size, ca.size)
    if (lo > hi).any():
        i = np.argwhere(lo > hi)[0]
        raise InputError(f"lower must be <= upper, got lower {float(lo[tuple(i)])!r} > upper "
                         f"{float(hi[tuple(i)])!r} at {tuple(int(k) for k in i)}")
    return _interval_score(ya, lo, hi, ca)


@register_metric("check_score", kind="regression", properties={"permutation_invariant"})
def check_score_loss(y, mean, std, *, levels=None) -> float:
    """Check (pinball) score of Gaussian predictive quantiles at levels 0.01, ..., 0.99.

    Parameters
    ----------
    y, mean, std : array_like, shape (n,)
        Targets, predictive means and standard deviations (``std > 0``).
    levels : array_like, shape (m,), optional
        Quantile levels; default :data:`SCORE_LEVELS` (``linspace(0.01, 0.99, 99)``, the
        toolbox's ``start_q``, ``end_q``, ``resolution``).

    Returns
    -------
    float
        :func:`quantile_check_loss` of the quantiles ``mean + std Phi^-1(tau)``; lower is
        better. Equals ``uncertainty_toolbox.check_score`` (``scaled=True``).

    Examples
    --------
    >>> round(check_score_loss([0.0], [0.0], [1.0]), 6)
    0.117956
    """
    ya, ma, sa = _gaussian_args(y, mean, std)
    la = SCORE_LEVELS if levels is None else _check_levels(levels, "levels")
    ya, ma, sa = ya.reshape(-1), ma.reshape(-1), sa.reshape(-1)
    q = ma[:, None] + sa[:, None] * special.ndtri(la)
    return _pinball(ya, q, la)


@register_metric("interval_score", kind="regression", properties={"permutation_invariant"})
def interval_score_loss(y, mean, std, *, coverages=None) -> float:
    """Interval score of central Gaussian predictive intervals at coverages 0.01, ..., 0.99.

    Parameters
    ----------
    y, mean, std : array_like, shape (n,)
        Targets, predictive means and standard deviations (``std > 0``).
    coverages : array_like, shape (m,), optional
        Nominal coverages ``p``; default :data:`SCORE_LEVELS` (the toolbox's ``start_p``,
        ``end_p``, ``resolution``).

    Returns
    -------
    float
        :func:`interval_score_from_bounds_loss` of ``mean + std Phi^-1(1/2 -+ p/2)``; lower is
        better. Equals ``uncertainty_toolbox.interval_score`` (``scaled=True``).

    Examples
    --------
    >>> round(interval_score_loss([0.0], [0.0], [1.0]), 6)
    1.580031
    """
    ya, ma, sa = _gaussian_args(y, mean, std)
    ca = SCORE_LEVELS if coverages is None else _check_levels(coverages, "coverages")
    ya, ma, sa = ya.reshape(-1), ma.reshape(-1), sa.reshape(-1)
    lo = ma[:, None] + sa[:, None] * special.ndtri(0.5 - ca / 2.0)
    hi = ma[:, None] + sa[:, None] * special.ndtri(0.5 + ca / 2.0)
    return _interval_score(ya, lo, hi, ca)


def pit_values(y, mean, std) -> np.ndarray:
    """Probability integral transform ``Phi((y - mean) / std)`` of each target.

    Parameters
    ----------
    y, mean, std : array_like, shape (n, ...)
        Targets, predictive means and standard deviations (``std > 0``).

    Returns
    -------
    numpy.ndarray, shape of ``y``
        In [0, 1]; uniform when the forecasts are calibrated (Dawid 1984).

    Examples
    --------
    >>> pit_values([0.0, 1.0], [0.0, 0.0], [1.0, 1.0]).round(4)
    array([0.5   , 0.8413])
    """
    ya, ma, sa = _gaussian_args(y, mean, std)
    return special.ndtr((ya - ma) / sa)


def pit_histogram(y, mean, std, *, bins: int = 10) -> dict:
    """Histogram of the PIT values in ``bins`` equal-width bins, and its chi-square uniformity test.

    Parameters
    ----------
    y, mean, std : array_like, shape (n,)
        Targets, predictive means and standard deviations (``std > 0``).
    bins : int, default 10
        Equal-width bins of [0, 1], ``[k/bins, (k+1)/bins)``, the last closed.

    Returns
    -------
    dict
        ``counts`` (bins,) int, ``edges`` (bins + 1,), ``chi2``: Pearson's statistic
        ``sum (c_k - n/bins)^2 / (n/bins)``, ``p_value``: its chi-square (bins - 1 degrees of
        freedom) upper tail, ``ks``: :func:`pit_ks_error`.

    Examples
    --------
    >>> h = pit_histogram([-1.0, 0.1, 1.0, 2.0], [0.0] * 4, [1.0] * 4, bins=2)
    >>> h["counts"].tolist(), h["chi2"]
    ([1, 3], 1.0)
    """
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 1:
        raise InputError(f"bins must be an integer >= 1, got {bins!r}")
    u = pit_values(y, mean, std).reshape(-1)
    edges = np.linspace(0.0, 1.0, bins + 1)
    counts = np.histogram(u, bins=edges)[0].astype(np.int64)
    e = u.size / bins
    chi2 = float(np.sum((counts - e) ** 2) / e)
    p = float(special.chdtrc(bins - 1, chi2)) if bins > 1 else 1.0
    return {"counts": counts, "edges": edges, "chi2": chi2, "p_value": p, "ks": _ks(u)}


def _ks(u: np.ndarray) -> float:
    u = np.sort(u)
    n = u.size
    i = np.arange(1, n + 1)
    return float(max(np.max(i / n - u), np.max(u - (i - 1) / n)))


@register_metric("pit_ks", kind="regression", properties={"permutation_invariant"})
def pit_ks_error(y, mean, std) -> float:
    """Kolmogorov-Smirnov distance of the PIT values from the uniform distribution.

    Parameters
    ----------
    y, mean, std : array_like, shape (n,)
        Targets, predictive means and standard deviations (``std > 0``).

    Returns
    -------
    float
        ``sup_u |F_n(u) - u|`` of the empirical CDF of :func:`pit_values`; in (0, 1], lower is
        better (``scipy.stats.kstest(pit, "uniform").statistic``).

    Examples
    --------
    >>> pit_ks_error([0.0], [0.0], [1.0])
    0.5
    """
    return _ks(pit_values(y, mean, std).reshape(-1))


# --------------------------------------------------------------------------------------------
# recalibration: fitted on a calibration split, applied to a test split


def _isotonic_fit(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Increasing least-squares fit of ``y`` on ``x`` (pool adjacent violators) at the distinct
    ``x``, equal ``x`` pooled first (as ``sklearn.isotonic.IsotonicRegression``)."""
    xs, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=y)
    vals, wts, sizes = [], [], []
    for s, w in zip(sums / counts, counts.astype(float)):
        vals.append(s)
        wts.append(w)
        sizes.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            w2 = wts[-2] + wts[-1]
            v2 = (vals[-2] * wts[-2] + vals[-1] * wts[-1]) / w2
            k = sizes[-2] + sizes[-1]
            del vals[-1], wts[-1], sizes[-1]
            vals[-1], wts[-1], sizes[-1] = v2, w2, k
    return xs, np.repeat(vals, sizes)


class IsotonicRecalibrator:
    """Isotonic recalibration of quantile levels (Kuleshov, Fenner & Ermon 2018).

    :meth:`fit` computes the calibration curve of a calibration split and fits an increasing
    map ``R`` from observed to expected proportions (uncertainty-toolbox's ``iso_recal``);
    the recalibrated forecast takes its ``p`` interval (or quantile) at the level ``R(p)``.

    Parameters
    ----------
    num_bins : int, default 100
        Proportions of the calibration curve fitted.
    prop_type : {"interval", "quantile"}, default "interval"
        The curve fitted; apply the recalibrator with the same ``prop_type``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> y = rng.normal(size=500)
    >>> rec = IsotonicRecalibrator().fit(y, np.zeros(500), np.full(500, 0.5))
    >>> mace = mean_absolute_calibration_error
    >>> mace(y, np.zeros(500), np.full(500, 0.5), recalibrator=rec) < 0.02
    True
    """

    def __init__(self, *, num_bins: int = CALIBRATION_BINS, prop_type: str = "interval"):
        self.num_bins = _check_bins(num_bins)
        check_choice(prop_type, "prop_type", PROP_TYPES)
        self.prop_type = prop_type
        self.x_: np.ndarray | None = None
        self.y_: np.ndarray | None = None

    def fit(self, y, mean, std) -> IsotonicRecalibrator:
        """Fit on a calibration split (targets, means, stds of shape (n,)); returns self."""
        expected, observed = calibration_curve(y, mean, std, num_bins=self.num_bins,
                                               prop_type=self.prop_type)
        self.x_, self.y_ = _isotonic_fit(observed, expected)
        return self

    def levels(self, p) -> np.ndarray:
        """Recalibrated levels ``R(p)``: linear interpolation, clipped to the fitted range."""
        if self.x_ is None:
            raise InputError("IsotonicRecalibrator is not fitted: call fit(y, mean, std) first")
        pa = numeric_array(p, "p")
        if self.x_.size == 1:
            return np.full(pa.shape, self.y_[0])
        return np.interp(pa, self.x_, self.y_)

    def quantile(self, mean, std, p) -> np.ndarray:
        """Recalibrated ``p`` quantile ``mean + std Phi^-1(R(p))`` (fit with prop_type
        "quantile"); ``p`` a float in (0, 1)."""
        p = check_fraction(p, "p", closed="neither")
        return np.asarray(mean, float) + np.asarray(std, float) * special.ndtri(self.levels(p))

    def interval(self, mean, std, p) -> tuple[np.ndarray, np.ndarray]:
        """Recalibrated central ``p`` interval: the ``1/2 -+ R(p)/2`` Gaussian quantiles."""
        p = check_fraction(p, "p", closed="neither")
        r = self.levels(p)
        m, s = np.asarray(mean, float), np.asarray(std, float)
        return m + s * special.ndtri(0.5 - r / 2.0), m + s * special.ndtri(0.5 + r / 2.0)


class SigmaScaling:
    """σ-scaling: one factor ``s`` multiplying every predictive standard deviation.

    :meth:`fit` finds ``s`` on a calibration split. By default (``criterion="nll"``) it is the
    factor that minimises the Gaussian NLL of ``(y, mean, s std)``, in closed form
    ``s = sqrt(mean_i ((y_i - mean_i) / std_i)^2)`` (Laves et al. 2020): the maximum-likelihood
    scale, a smooth function of the residuals with a unique optimum. The other criteria are
    uncertainty-toolbox's ``optimize_recalibration_ratio`` (``criterion="mace"`` is its default,
    ``"ma_cal"``): the minimiser of that calibration error of ``(y, mean, s std)`` by bounded
    Brent search (``scipy.optimize.minimize_scalar``) over ``bounds``; their objective is
    piecewise constant in ``s``, so the search finds a local minimum.

    Parameters
    ----------
    criterion : {"nll", "mace", "rmsce", "miscalibration_area"}, default "nll"
        ``"nll"``: the NLL-optimal factor (closed form, ``bounds`` unused;
        docs/conventions.md#s-6). The others reproduce the toolbox's recalibrator with its
        ``"ma_cal"``, ``"rms_cal"``, ``"miscal"``.
    bounds : (float, float), default (0.01, 100)
        Search interval of the calibration-error criteria.

    Notes
    -----
    The NLL of ``N(mean_i, s^2 std_i^2)`` is ``log s + r2 / (2 s^2)`` plus terms free of ``s``
    (``r2`` the mean squared standardised residual), stationary only at ``s^2 = r2``.

    References
    ----------
    M.-H. Laves, S. Ihler, J. F. Fast, L. A. Kahrs, T. Ortmaier, "Well-calibrated regression
    uncertainty in medical imaging with deep learning", MIDL 2020.

    Examples
    --------
    >>> rng = np.random.default_rng(1)
    >>> y = rng.normal(scale=2.0, size=2000)
    >>> round(SigmaScaling().fit(y, np.zeros(2000), np.ones(2000)).factor_, 1)
    2.0
    >>> SigmaScaling().fit([1.0, -3.0], [0.0, 0.0], [1.0, 1.0]).factor_    # sqrt((1 + 9) / 2)
    2.23606797749979
    >>> round(SigmaScaling(criterion="mace").fit(y, np.zeros(2000), np.ones(2000)).factor_, 1)
    2.0
    """

    def __init__(self, *, criterion: str = "nll", bounds: tuple[float, float] = (1e-2, 1e2)):
        check_choice(criterion, "criterion", SIGMA_SCALING_CRITERIA)
        lo, hi = (check_positive_number(b, "bounds") for b in bounds)
        if not lo < hi:
            raise InputError(f"bounds must be increasing, got {bounds!r}")
        self.criterion = criterion
        self.bounds = (lo, hi)
        self.factor_: float | None = None

    def fit(self, y, mean, std) -> SigmaScaling:
        """Fit the factor on a calibration split (shape (n,) each); returns self."""
        from scipy.optimize import minimize_scalar

        ya, ma, sa = _gaussian_args(y, mean, std)
        if self.criterion == "nll":
            factor = float(np.sqrt(np.mean(np.square((ya - ma) / sa))))
            if not factor > 0:
                raise InputError("y equals mean at every point: the NLL-optimal factor is 0 "
                                 "(no spread to scale to)")
            self.factor_ = factor
            return self
        fn = _CALIBRATION_FNS[self.criterion]
        expected = np.linspace(0.0, 1.0, CALIBRATION_BINS)

        def objective(ratio):
            return fn(expected, _observed_proportions(ya, ma, ratio * sa, expected, "interval"))

        self.factor_ = float(minimize_scalar(objective, bounds=self.bounds,
                                             method="bounded").x)
        return self

    def apply(self, std) -> np.ndarray:
        """Recalibrated standard deviations ``factor_ * std`` (of a test split)."""
        if self.factor_ is None:
            raise InputError("SigmaScaling is not fitted: call fit(y, mean, std) first")
        return self.factor_ * check_positive(numeric_array(std, "std"), "std", strict=True)
