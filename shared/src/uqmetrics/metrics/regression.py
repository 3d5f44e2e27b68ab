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
:func:`crps_gaussian_loss` and :func:`interval_width`.

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
from .registry import register_metric

__all__ = [
    "INTERVAL_METHODS",
    "binomial_interval",
    "coverage",
    "coverage_summary",
    "crps_gaussian_loss",
    "deviation",
    "gaussian_nll_loss",
    "interval_width",
    "paper_error_bar",
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
