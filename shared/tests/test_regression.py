"""Tests of uqmetrics.metrics.regression (docs/conventions.md#s-6 and R.4)."""

from __future__ import annotations

import doctest
import inspect
import math
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from hypothesis import given
from hypothesis import strategies as st
from scipy import integrate, stats

from uqmetrics import COVERAGE_Z
from uqmetrics.metrics import regression
from uqmetrics.metrics.regression import (
    binomial_interval,
    coverage,
    coverage_summary,
    crps_gaussian_loss,
    deviation,
    gaussian_nll_loss,
    interval_width,
    paper_error_bar,
    uncertainty_ratio,
)
from uqmetrics.report import plotting

P_COVER = 2 * stats.norm.cdf(COVERAGE_Z) - 1  # P(|Z| < COVERAGE_Z) = 0.95


def test_coverage_z_is_the_normal_quantile_and_the_only_one():
    assert COVERAGE_Z == stats.norm.ppf(0.975)
    assert P_COVER == pytest.approx(0.95, abs=1e-15)
    # every coverage function defaults to it; no rounded 1.96 anywhere in uqmetrics
    for f in (coverage, coverage_summary, interval_width, plotting.plot_prediction_bands):
        assert inspect.signature(f).parameters["z"].default == COVERAGE_Z, f.__name__
    src = Path(regression.__file__).parent
    hits = [f"{p.name}:{i}" for p in sorted(src.rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if "1.96" in line]
    assert not hits, f"literal 1.96 in uqmetrics: {hits}"


def test_doctests():
    res = doctest.testmod(regression, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert res.attempted > 0
    assert res.failed == 0


# ------------------------------------------------------------------------------------------
# binomial intervals


def test_wilson_matches_closed_form():
    s = np.arange(0, 21)
    n = 20
    zq = stats.norm.ppf(0.975)
    centre = (s + zq**2 / 2) / (n + zq**2)
    half = zq / (n + zq**2) * np.sqrt(s * (n - s) / n + zq**2 / 4)
    low, high = binomial_interval(s, n, method="wilson")
    np.testing.assert_allclose(low, np.clip(centre - half, 0, 1), atol=1e-12)
    np.testing.assert_allclose(high, np.clip(centre + half, 0, 1), atol=1e-12)


def test_clopper_pearson_matches_beta_quantiles():
    s = np.arange(1, 31)
    n = 30
    low, high = binomial_interval(s, n, method="beta", alpha=0.1)
    np.testing.assert_allclose(low, stats.beta.ppf(0.05, s, n - s + 1), rtol=1e-9)
    np.testing.assert_allclose(high[:-1], stats.beta.ppf(0.95, s[:-1] + 1, n - s[:-1]), rtol=1e-9)
    assert high[-1] == 1.0
    lo0, hi0 = binomial_interval(0, n, method="clopper-pearson", alpha=0.1)
    assert lo0 == 0.0 and hi0 == pytest.approx(1 - 0.05 ** (1 / n))


def test_binomial_interval_broadcasts_and_orders():
    s = np.array([[0, 5], [10, 7]])
    low, high = binomial_interval(s, np.array([10, 10]))
    assert low.shape == high.shape == (2, 2)
    p = s / 10
    assert np.all(low <= p) and np.all(p <= high) and np.all(low >= 0) and np.all(high <= 1)
    # a wider confidence level gives a wider interval
    low99, high99 = binomial_interval(s, 10, alpha=0.01)
    assert np.all(low99 <= low) and np.all(high99 >= high)
    assert np.all((high99 - low99) > (high - low))


def _exact_coverage(p: float, k: int, method: str, alpha: float = 0.05) -> float:
    """Exact coverage of the interval at p: sum of pmf over outcomes whose interval holds p."""
    s = np.arange(k + 1)
    low, high = binomial_interval(s, k, method=method, alpha=alpha)
    inside = (low <= p) & (p <= high)
    return float(stats.binom.pmf(s, k, p)[inside].sum())


CASES = [(0.95, 50), (0.5, 30), (0.8, 20), (0.99, 100), (0.3, 15)]


@pytest.mark.parametrize("p,k", CASES)
def test_clopper_pearson_covers_at_least_nominal(p, k):
    # exact (deterministic) statement of the guarantee ...
    assert _exact_coverage(p, k, "beta") >= 0.95 - 1e-12
    # ... and the same seen in simulation, tolerance from the number of simulations
    n_sim = 4000
    rng = np.random.default_rng(1234)
    s = rng.binomial(k, p, size=n_sim)
    low, high = binomial_interval(s, k, method="beta")
    rate = np.mean((low <= p) & (p <= high))
    assert rate >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / n_sim)


@pytest.mark.parametrize("p,k", CASES)
def test_wilson_simulated_coverage_matches_its_exact_coverage(p, k):
    exact = _exact_coverage(p, k, "wilson")
    assert 0.85 < exact < 1.0  # Wilson oscillates around, not far from, the nominal level
    n_sim = 4000
    rng = np.random.default_rng(4321)
    s = rng.binomial(k, p, size=n_sim)
    low, high = binomial_interval(s, k, method="wilson")
    rate = np.mean((low <= p) & (p <= high))
    # rate is a binomial proportion of n_sim draws with mean `exact`: SE sqrt(e(1 - e)/n_sim).
    # The 5 cases share one seed, so Bonferroni: two-sided normal quantile at a family-wise 1e-4,
    # norm.isf(1e-4 / (2 * 5)) = 4.26 SE (exact binomial tails: 1.2e-4 for the family).
    se = math.sqrt(exact * (1 - exact) / n_sim)
    k_se = stats.norm.isf(1e-4 / (2 * len(CASES)))
    assert abs(rate - exact) <= k_se * max(se, 1 / n_sim), (rate, exact, se)


def test_wilson_nominal_on_average_over_p():
    # averaged over p the Wilson interval is close to nominal (Brown, Cai, DasGupta 2001)
    k = 50
    ps = np.linspace(0.05, 0.95, 91)
    mean_cov = np.mean([_exact_coverage(p, k, "wilson") for p in ps])
    assert abs(mean_cov - 0.95) < 0.01


def test_paper_error_bar():
    np.testing.assert_allclose(paper_error_bar([0.0, 0.5, 0.9, 1.0], 100),
                               [0.0, 0.05, 0.03, 0.0])
    np.testing.assert_allclose(paper_error_bar(0.5, [4, 25]), [0.25, 0.1])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"successes": 11, "trials": 10}, "successes"),
        ({"successes": -1, "trials": 10}, "successes"),
        ({"successes": 1.5, "trials": 10}, "successes"),
        ({"successes": 1, "trials": 0}, "trials"),
        ({"successes": [1, 2], "trials": [3, 4, 5]}, "successes"),
        ({"successes": 1, "trials": 10, "alpha": 1.5}, "alpha"),
        ({"successes": 1, "trials": 10, "method": "agresti"}, "method"),
        ({"successes": np.nan, "trials": 10}, "successes"),
    ],
)
def test_binomial_interval_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        binomial_interval(**kwargs)


@pytest.mark.parametrize("p,k,match", [(1.2, 10, "p"), (0.5, 0, "k"), ([0.1, np.inf], 3, "p")])
def test_paper_error_bar_rejects_bad_input(p, k, match):
    with pytest.raises(ValueError, match=match):
        paper_error_bar(p, k)


# ------------------------------------------------------------------------------------------
# coverage, deviation, ratio


def test_coverage_of_correct_gaussian_predictor():
    rng = np.random.default_rng(7)
    k, n_points = 2000, 5
    truth = rng.uniform(-3, 3, size=n_points)
    s = rng.uniform(0.1, 2.0, size=n_points)
    pred = truth + s * rng.standard_normal((k, n_points))
    cov = coverage(pred, np.broadcast_to(s, pred.shape), truth)
    assert cov.shape == (n_points,)
    # each point is Binomial(k, P(|Z| < COVERAGE_Z)) / k; pooled points are independent
    se_point = math.sqrt(P_COVER * (1 - P_COVER) / k)
    assert np.all(np.abs(cov - P_COVER) < 4.5 * se_point)
    se_pooled = se_point / math.sqrt(n_points)
    assert abs(cov.mean() - P_COVER) < 4 * se_pooled


def test_coverage_hand_cases_and_strict_boundary():
    truth = np.array([0.0, 0.0, 0.0])
    unc = np.array([[1.0, 0.5, 0.0]])
    # deviation exactly z * uncertainty is NOT covered (strict <); zero uncertainty never covers
    pred = np.array([[COVERAGE_Z, COVERAGE_Z / 2, 0.0]])
    np.testing.assert_array_equal(coverage(pred, unc, truth), [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(coverage(np.nextafter(pred, 0), unc, truth), [1.0, 1.0, 0.0])
    pred = np.array([[0.0, 1.0], [0.5, 3.0], [2.0, 2.0], [-1.0, 1.5]])
    np.testing.assert_allclose(coverage(pred, np.ones_like(pred), [0.0, 1.0], z=1.0),
                               [0.5, 0.5])
    np.testing.assert_allclose(coverage(pred, np.ones_like(pred), [0.0, 1.0], z=2.0),
                               [0.75, 0.75])


def test_coverage_axis_argument():
    rng = np.random.default_rng(0)
    pred = rng.normal(size=(4, 30))
    unc = rng.uniform(0.5, 1.5, size=(4, 30))
    a = coverage(pred.T, unc.T, 0.0, axis=0)
    b = coverage(pred, unc, 0.0, axis=1)
    c = coverage(pred, unc, 0.0, axis=-1)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(b, c)
    np.testing.assert_allclose(b, np.mean(np.abs(pred) < COVERAGE_Z * unc, axis=1))


def test_coverage_xarray_reduces_named_dim():
    rng = np.random.default_rng(1)
    pred = xr.DataArray(rng.normal(size=(3, 40, 6)), dims=("method", "repetition", "point"),
                        coords={"method": ["blr", "bd", "ens"]})
    unc = xr.full_like(pred, 1.0)
    truth = xr.DataArray(np.zeros(6), dims="point")
    cov = coverage(pred, unc, truth)
    assert isinstance(cov, xr.DataArray)
    assert cov.dims == ("method", "point")
    assert list(cov["method"].values) == ["blr", "bd", "ens"]
    np.testing.assert_allclose(cov.values, coverage(pred.values, unc.values, 0.0, axis=1))
    # a differently named repetition dim
    cov2 = coverage(pred.rename(repetition="rep"), unc.rename(repetition="rep"), truth, dim="rep")
    np.testing.assert_array_equal(cov2.values, cov.values)


@given(st.integers(0, 10_000), st.floats(0.1, 3.0), st.floats(0.0, 2.0), st.floats(-5, 5))
def test_coverage_monotone_in_z_and_shift_invariant(seed, z, dz, shift):
    rng = np.random.default_rng(seed)
    pred = rng.normal(size=(20, 3))
    unc = rng.uniform(0.1, 2.0, size=(20, 3))
    truth = rng.normal(size=3)
    c1 = coverage(pred, unc, truth, z=z)
    c2 = coverage(pred, unc, truth, z=z + dz)
    assert np.all(c2 >= c1)
    # shifting prediction and truth together changes no deviation beyond rounding
    cs = coverage(pred + shift, unc, truth + shift, z=z)
    dev = np.abs(pred - truth)
    near = np.isclose(dev, z * unc, rtol=1e-9, atol=1e-12).any(axis=0)
    np.testing.assert_array_equal(cs[~near], c1[~near])


def test_deviation_and_ratio():
    np.testing.assert_array_equal(deviation([1.0, -2.0, 3.0], 1.0), [0.0, 3.0, 2.0])
    np.testing.assert_allclose(uncertainty_ratio([1.0, 3.0], [2.0, 1.5]), [0.5, 2.0])
    a = xr.DataArray([1.0, 3.0], dims="point")
    r = uncertainty_ratio(a, xr.DataArray([2.0, 1.5], dims="point"))
    assert isinstance(r, xr.DataArray) and r.dims == ("point",)
    d = deviation(xr.DataArray([[1.0, 2.0]], dims=("repetition", "point")),
                  xr.DataArray([2.0, 2.0], dims="point"))
    assert d.dims == ("repetition", "point")
    np.testing.assert_array_equal(d.values, [[1.0, 0.0]])


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: coverage([[1.0]], [[-1.0]], [0.0]), "uncertainty"),
        (lambda: coverage([[np.nan]], [[1.0]], [0.0]), "prediction"),
        (lambda: coverage([[1.0, 2.0]], [[1.0, 1.0]], [0.0, 1.0, 2.0]), "prediction"),
        (lambda: coverage([[1.0]], [[1.0]], [0.0], z=0), "z"),
        (lambda: coverage([[1.0]], [[1.0]], [0.0], axis=2), "axis"),
        (lambda: coverage(1.0, 1.0, 0.0), "prediction"),
        (lambda: coverage(xr.DataArray([[1.0]], dims=("rep", "point")), xr.DataArray(1.0), 0.0),
         "repetition"),
        (lambda: coverage(xr.DataArray([[1.0]], dims=("repetition", "point")), np.ones((1, 1)),
                          0.0), "uncertainty"),
        (lambda: coverage(["a"], [1.0], [0.0]), "prediction"),
        (lambda: uncertainty_ratio([1.0], [0.0]), "reference_uncertainty"),
        (lambda: uncertainty_ratio([-1.0], [1.0]), "uncertainty"),
        (lambda: deviation([1.0, 2.0], [1.0, 2.0, 3.0]), "prediction"),
    ],
)
def test_coverage_family_rejects_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------------------------------
# coverage_summary


def _study(seed=0, k=200, scales=(1.0, 0.5, 2.0), n_points=6, complexities=(1, 2, 3)):
    """A synthetic (method, complexity, repetition, point) study with known coverage."""
    rng = np.random.default_rng(seed)
    methods = ["blr", "bd", "ens"][: len(scales)]
    x = np.linspace(-6, 6, n_points)
    truth = xr.DataArray(np.sin(x), dims="point", coords={"x": ("point", x)})
    shape = (len(methods), len(complexities), k, n_points)
    pred = truth.values + rng.standard_normal(shape)                 # true std 1
    unc = np.broadcast_to(np.array(scales)[:, None, None, None], shape).copy()
    coords = {"method": methods, "complexity": list(complexities), "x": ("point", x)}
    dims = ("method", "complexity", "repetition", "point")
    return xr.Dataset(
        {"prediction": (dims, pred), "uncertainty": (dims, unc), "truth": truth},
        coords=coords,
        attrs={"task": "synthetic"},
    )


def test_summary_dims_variables_and_attrs():
    ds = _study()
    regions = xr.DataArray(np.abs(ds["x"].values) <= 4, dims="point")
    s = coverage_summary(ds, reference=("method", "blr"), regions=regions, method="beta",
                         alpha=0.1, z=2.0)
    per_point = ["n_repetitions", "coverage", "coverage_low", "coverage_high", "coverage_err",
                 "deviation_mean", "deviation_se", "uncertainty_mean", "uncertainty_se",
                 "uncertainty_ratio"]
    for v in per_point:
        assert s[v].dims == ("method", "complexity", "point"), v
    for v in ["region_coverage", "region_coverage_se", "region_deviation_mean",
              "region_deviation_se", "region_uncertainty_mean", "region_uncertainty_se",
              "region_uncertainty_ratio"]:
        assert s[v].dims == ("method", "complexity", "region"), v
    assert list(s["region"].values) == ["in", "out"]
    assert list(s["method"].values) == ["blr", "bd", "ens"]
    np.testing.assert_array_equal(s["x"].values, ds["x"].values)
    assert s.attrs["z"] == 2.0 and s.attrs["alpha"] == 0.1
    assert s.attrs["interval_method"] == "clopper-pearson"
    assert s.attrs["repetition_dim"] == "repetition"
    assert "strict <" in s.attrs["coverage_convention"]
    assert "blr" in s.attrs["reference"]
    assert s.attrs["task"] == "synthetic"  # input attrs kept
    assert "description" in s["coverage"].attrs


def test_summary_matches_building_blocks():
    ds = _study(k=60)
    s = coverage_summary(ds, method="wilson")
    pred = ds["prediction"].values
    unc = ds["uncertainty"].values
    truth = ds["truth"].values
    cov = coverage(pred, unc, truth, axis=2)
    np.testing.assert_allclose(s["coverage"].values, cov)
    assert np.all(s["n_repetitions"].values == 60)
    low, high = binomial_interval(np.round(cov * 60).astype(int), 60, method="wilson")
    np.testing.assert_allclose(s["coverage_low"].values, low)
    np.testing.assert_allclose(s["coverage_high"].values, high)
    np.testing.assert_allclose(s["coverage_err"].values, paper_error_bar(cov, 60))
    dev = np.abs(pred - truth)
    np.testing.assert_allclose(s["deviation_mean"].values, dev.mean(axis=2))
    np.testing.assert_allclose(s["deviation_se"].values, dev.std(axis=2, ddof=1) / np.sqrt(60))


def test_summary_standard_errors_hand_case():
    # k = 4 repetitions, one point: deviations 1, 2, 3, 6 and uncertainties 2, 2, 4, 4
    pred = xr.DataArray([[1.0], [-2.0], [3.0], [6.0]], dims=("repetition", "point"))
    unc = xr.DataArray([[2.0], [2.0], [4.0], [4.0]], dims=("repetition", "point"))
    ds = xr.Dataset({"prediction": pred, "uncertainty": unc,
                     "truth": xr.DataArray([0.0], dims="point")})
    s = coverage_summary(ds, z=1.0).squeeze("point")
    # covered: 1<2 yes, 2<2 no (strict), 3<4 yes, 6<4 no
    assert float(s["coverage"]) == 0.5
    assert float(s["coverage_err"]) == pytest.approx(math.sqrt(0.25 / 4))
    assert float(s["deviation_mean"]) == 3.0
    # sample variance of (1, 2, 3, 6): ((4 + 1 + 0 + 9) / 3) = 14/3; se = sqrt(14/3 / 4)
    assert float(s["deviation_se"]) == pytest.approx(math.sqrt(14 / 12))
    assert float(s["uncertainty_mean"]) == 3.0
    # (1 + 1 + 1 + 1) / 3 = 4/3; se = sqrt(4/3 / 4) = sqrt(1/3)
    assert float(s["uncertainty_se"]) == pytest.approx(math.sqrt(1 / 3))
    assert s["coverage"].dims == ()


def test_summary_single_repetition_has_nan_standard_error():
    ds = xr.Dataset({"prediction": (("repetition", "point"), [[0.5, 1.0]]),
                     "uncertainty": (("repetition", "point"), [[1.0, 1.0]]),
                     "truth": ("point", [0.0, 0.0])})
    s = coverage_summary(ds)
    assert np.all(np.isnan(s["deviation_se"].values))
    np.testing.assert_array_equal(s["coverage"].values, [1.0, 1.0])


def test_summary_ratio_to_reference():
    ds = _study(k=30, scales=(1.0, 0.5, 2.0))
    s = coverage_summary(ds, reference=("method", "blr"))
    ratio = s["uncertainty_ratio"]
    np.testing.assert_allclose(ratio.sel({"method": "blr"}).values, 1.0)
    np.testing.assert_allclose(ratio.sel({"method": "bd"}).values, 0.5)
    np.testing.assert_allclose(ratio.sel({"method": "ens"}).values, 2.0)
    # same result with a mapping and with an explicit DataArray of reference uncertainties
    s2 = coverage_summary(ds, reference={"method": "blr"})
    xr.testing.assert_allclose(s2["uncertainty_ratio"], ratio)
    ref = xr.DataArray(np.full(6, 4.0), dims="point")
    s3 = coverage_summary(ds, reference=ref)
    np.testing.assert_allclose(s3["uncertainty_ratio"].sel({"method": "ens"}).values, 0.5)
    # a per-repetition reference is averaged over the repetitions first
    per_rep = xr.DataArray(np.repeat([[2.0], [6.0]], 6, axis=1).repeat(15, axis=0),
                           dims=("repetition", "point"))
    s4 = coverage_summary(ds, reference=per_rep)
    np.testing.assert_allclose(s4["uncertainty_ratio"].sel({"method": "ens"}).values, 0.5)
    with pytest.raises(ValueError, match="reference"):
        coverage_summary(ds, reference=xr.DataArray(np.ones(5), dims="point"))


def test_summary_ratio_is_per_point():
    pred = xr.DataArray(np.zeros((2, 3, 2)), dims=("method", "repetition", "point"),
                        coords={"method": ["ref", "m"]})
    unc = xr.DataArray(np.array([[[1.0, 2.0]] * 3, [[3.0, 3.0]] * 3]), dims=pred.dims,
                       coords=pred.coords)
    ds = xr.Dataset({"prediction": pred, "uncertainty": unc,
                     "truth": xr.DataArray([0.0, 0.0], dims="point")})
    s = coverage_summary(ds, reference=("method", "ref"))
    np.testing.assert_allclose(s["uncertainty_ratio"].sel({"method": "m"}).values, [3.0, 1.5])


def test_summary_gaussian_coverage_statistics():
    # method scale 1 is the correct one (coverage 0.95); 0.5 under-covers at P(|Z| < COVERAGE_Z / 2)
    ds = _study(k=400, scales=(1.0, 0.5), n_points=4, complexities=(1,))
    s = coverage_summary(ds)
    n = s["coverage"].sel({"method": "blr"}).size * 400
    for m, z_eff in (("blr", COVERAGE_Z), ("bd", COVERAGE_Z / 2)):
        p = 2 * stats.norm.cdf(z_eff) - 1
        pooled = float(s["coverage"].sel({"method": m}).mean())
        assert abs(pooled - p) < 4 * math.sqrt(p * (1 - p) / n), m


def test_summary_regions():
    ds = _study(k=50, n_points=6)
    inside = np.array([False, True, True, True, True, False])
    regions = xr.DataArray(inside, dims="point")
    s = coverage_summary(ds, regions=regions, reference=("method", "blr"))
    cov = s["coverage"]
    np.testing.assert_allclose(s["region_coverage"].sel(region="in").values,
                               cov.isel(point=np.flatnonzero(inside)).mean("point").values)
    np.testing.assert_allclose(s["region_coverage"].sel(region="out").values,
                               cov.isel(point=np.flatnonzero(~inside)).mean("point").values)
    np.testing.assert_allclose(s["region_deviation_mean"].sel(region="in").values,
                               s["deviation_mean"].isel(point=np.flatnonzero(inside))
                               .mean("point").values)
    assert s["region_n_points"].sel(region="in").item() == 4
    assert s["region_n_points"].sel(region="out").item() == 2
    np.testing.assert_allclose(s["region_uncertainty_ratio"].sel({"method": "ens"}).values, 2.0)
    # region standard error: over repetitions of the per-repetition region coverage
    hit = (np.abs(ds["prediction"] - ds["truth"]) < COVERAGE_Z * ds["uncertainty"])
    per_rep = hit.isel(point=np.flatnonzero(inside)).mean("point")
    expected_se = per_rep.std("repetition", ddof=1) / math.sqrt(50)
    np.testing.assert_allclose(s["region_coverage_se"].sel(region="in").values,
                               expected_se.values)


def test_summary_regions_on_a_grid():
    rng = np.random.default_rng(3)
    g = np.linspace(-5, 5, 5)
    truth = xr.DataArray(rng.normal(size=(5, 5)), dims=("x1", "x2"), coords={"x1": g, "x2": g})
    pred = truth + xr.DataArray(rng.normal(size=(20, 5, 5)), dims=("repetition", "x1", "x2"))
    ds = xr.Dataset({"prediction": pred, "uncertainty": xr.ones_like(pred), "truth": truth})
    box = (truth.x1 >= 1) & (truth.x1 <= 4) & (truth.x2 >= 1) & (truth.x2 <= 4)
    s = coverage_summary(ds, regions=box)
    assert s["coverage"].dims == ("x1", "x2")
    assert s["region_coverage"].dims == ("region",)
    assert s["region_n_points"].sel(region="in").item() == int(box.sum())
    np.testing.assert_allclose(float(s["region_coverage"].sel(region="out")),
                               float(s["coverage"].where(~box).mean()))


def test_summary_regions_varying_with_complexity():
    ds = _study(k=30, n_points=6, complexities=(1, 2))
    inside = xr.DataArray([[False, True, True, True, True, False],
                           [False, False, True, True, False, False]],
                          dims=("complexity", "point"), coords={"complexity": [1, 2]})
    s = coverage_summary(ds, regions=inside, region_dims="point")
    assert s["region_coverage"].dims == ("method", "complexity", "region")
    np.testing.assert_array_equal(s["region_n_points"].sel(region="in").values, [4, 2])
    for i, c in enumerate((1, 2)):
        pts = np.flatnonzero(inside.values[i])
        np.testing.assert_allclose(
            s["region_coverage"].sel(complexity=c, region="in").values,
            s["coverage"].sel(complexity=c).isel(point=pts).mean("point").values)
    with pytest.raises(ValueError, match="region_dims"):
        coverage_summary(ds, regions=inside, region_dims="x1")


def test_summary_nan_raises_unless_skipna():
    ds = _study(k=10)
    ds["prediction"][0, 0, 3, 2] = np.nan
    with pytest.raises(ValueError, match="prediction.*skipna"):
        coverage_summary(ds)
    s = coverage_summary(ds, skipna=True)
    assert s["n_repetitions"].values[0, 0, 2] == 9
    assert np.all(s["n_repetitions"].values.sum() == s["n_repetitions"].size * 10 - 1)
    pred = ds["prediction"].values[0, 0, :, 2]
    unc = ds["uncertainty"].values[0, 0, :, 2]
    ok = ~np.isnan(pred)
    expected = np.mean(np.abs(pred[ok] - ds["truth"].values[2]) < COVERAGE_Z * unc[ok])
    assert s["coverage"].values[0, 0, 2] == pytest.approx(expected)
    # a cell with no valid repetition is NaN throughout, without warnings
    ds["prediction"][1, 1, :, 0] = np.nan
    s = coverage_summary(ds, skipna=True)
    assert s["n_repetitions"].values[1, 1, 0] == 0
    for v in ("coverage", "coverage_low", "coverage_high", "deviation_mean", "uncertainty_se"):
        assert np.isnan(s[v].values[1, 1, 0]), v


@pytest.mark.parametrize(
    "mutate,kwargs,match",
    [
        (lambda ds: ds.drop_vars("truth"), {}, "truth"),
        (lambda ds: ds.rename(repetition="rep"), {}, "repetition"),
        (lambda ds: ds.assign(uncertainty=-ds["uncertainty"]), {}, "uncertainty"),
        (lambda ds: ds.assign(truth=ds["truth"] * np.inf), {}, "truth"),
        (lambda ds: ds, {"reference": ("method", "nope")}, "reference"),
        (lambda ds: ds, {"reference": ("colour", "blr")}, "reference"),
        (lambda ds: ds, {"reference": "blr"}, "reference"),
        (lambda ds: ds, {"regions": np.ones(6, bool)}, "regions"),
        (lambda ds: ds, {"regions": xr.DataArray(np.ones(6), dims="point")}, "regions"),
        (lambda ds: ds, {"regions": xr.DataArray(np.ones(5, bool), dims="point")}, "regions"),
        (lambda ds: ds, {"regions": xr.DataArray(np.ones(6, bool), dims="pt")}, "regions"),
        (lambda ds: ds, {"method": "wald"}, "method"),
        (lambda ds: ds, {"alpha": 0.0}, "alpha"),
        (lambda ds: ds, {"z": -1.0}, "z"),
        (lambda ds: ds["prediction"], {}, "ds"),
    ],
)
def test_summary_rejects_bad_input(mutate, kwargs, match):
    with pytest.raises(ValueError, match=match):
        coverage_summary(mutate(_study(k=5)), **kwargs)


# ------------------------------------------------------------------------------------------
# proper scores


def _crps_numeric(y, mu, s):
    cdf = stats.norm(mu, s).cdf
    left, _ = integrate.quad(lambda t: cdf(t) ** 2, -np.inf, y)
    right, _ = integrate.quad(lambda t: (1 - cdf(t)) ** 2, y, np.inf)
    return left + right


@pytest.mark.parametrize("y,mu,s", [(0.0, 0.0, 1.0), (1.3, -0.4, 0.7), (-3.0, 2.0, 2.5),
                                    (10.0, 0.0, 0.1)])
def test_crps_matches_numerical_integration(y, mu, s):
    assert crps_gaussian_loss([y], [mu], [s]) == pytest.approx(_crps_numeric(y, mu, s), rel=1e-7,
                                                               abs=1e-9)


def test_crps_matches_monte_carlo():
    # CRPS(F, y) = E|X - y| - 0.5 E|X - X'|, X, X' ~ F independent
    rng = np.random.default_rng(11)
    y, mu, s = 0.8, -0.3, 1.7
    n = 200_000
    x, x2 = rng.normal(mu, s, size=(2, n))
    samples = np.abs(x - y) - 0.5 * np.abs(x - x2)
    est, se = samples.mean(), samples.std(ddof=1) / math.sqrt(n)
    assert abs(crps_gaussian_loss([y], [mu], [s]) - est) < 4 * se


def test_crps_is_mean_over_points_and_scales():
    y = np.array([0.1, -1.0, 2.0])
    mu = np.array([0.0, 0.5, 1.0])
    s = np.array([1.0, 0.5, 3.0])
    per_point = [_crps_numeric(*args) for args in zip(y, mu, s)]
    assert crps_gaussian_loss(y, mu, s) == pytest.approx(np.mean(per_point), rel=1e-7)
    # CRPS is in the units of y: scaling everything by c scales it by c
    assert crps_gaussian_loss(3 * y, 3 * mu, 3 * s) == pytest.approx(
        3 * crps_gaussian_loss(y, mu, s))


def test_gaussian_nll_matches_scipy():
    rng = np.random.default_rng(5)
    y = rng.normal(size=(10, 3))
    mu = rng.normal(size=(10, 3))
    s = rng.uniform(0.2, 3.0, size=(10, 3))
    assert gaussian_nll_loss(y, mu, s) == pytest.approx(-stats.norm.logpdf(y, mu, s).mean(),
                                                        rel=1e-12)


def test_scores_prefer_the_true_distribution():
    # both are proper: the expected score under y ~ N(0, 1) is lowest for the true forecast
    rng = np.random.default_rng(9)
    y = rng.standard_normal(20_000)
    ones = np.ones_like(y)
    for score in (gaussian_nll_loss, crps_gaussian_loss):
        true = score(y, 0 * y, ones)
        assert true < score(y, 0 * y, 0.5 * ones)
        assert true < score(y, 0 * y, 2.0 * ones)
        assert true < score(y, 0.5 * ones, ones)


def test_interval_width():
    assert interval_width([1.0, 3.0]) == pytest.approx(2 * COVERAGE_Z * 2.0)
    assert interval_width(np.full((2, 2), 0.5), z=1.0) == pytest.approx(1.0)


@pytest.mark.parametrize("score", [gaussian_nll_loss, crps_gaussian_loss])
@pytest.mark.parametrize(
    "args,match",
    [
        (([0.0], [0.0], [0.0]), "std"),
        (([0.0], [0.0], [-1.0]), "std"),
        (([np.nan], [0.0], [1.0]), "y"),
        (([0.0], [np.inf], [1.0]), "mean"),
        (([0.0, 1.0], [0.0], [1.0, 1.0]), "mean"),
        (([0.0, 1.0], [0.0, 1.0], [1.0]), "std"),
        (([], [], []), "y"),
        ((["a"], [0.0], [1.0]), "y"),
    ],
)
def test_scores_reject_bad_input(score, args, match):
    with pytest.raises(ValueError, match=match):
        score(*args)


@pytest.mark.parametrize("args,kwargs,match", [(([0.0],), {}, "std"), (([1.0],), {"z": 0}, "z"),
                                               (([np.nan],), {}, "std")])
def test_interval_width_rejects_bad_input(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        interval_width(*args, **kwargs)
