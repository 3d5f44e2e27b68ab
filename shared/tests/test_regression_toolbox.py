"""Cross-checks of the S.6 regression scores against uncertainty-toolbox (Chung et al. 2021).

Every test here needs ``uncertainty_toolbox`` (the ``test`` extra); the core tests of the same
functions are in ``test_regression_scoring.py`` and run without it. Inputs are drawn on the
coarse grids of :func:`uqmetrics.runs.testing.strategies.gaussian_forecasts` (multiples of 1/8
and 1/64), so ``2 mean - y`` is exact and ties with interval bounds occur as in real data.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uqmetrics import (
    IsotonicRecalibrator,
    SigmaScaling,
    adversarial_group_calibration,
    calibration_curve,
    check_score_loss,
    crps_gaussian_loss,
    gaussian_nll_loss,
    interval_score_from_bounds_loss,
    interval_score_loss,
    mean_absolute_calibration_error,
    miscalibration_area_error,
    quantile_check_loss,
    root_mean_squared_calibration_error,
    sharpness,
)
from uqmetrics.runs.testing import strategies

uct = pytest.importorskip("uncertainty_toolbox")

RTOL = 1e-12
forecasts = strategies.gaussian_forecasts(min_n=2, max_n=40)


def _close(ours, theirs):
    np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=1e-15)


@settings(max_examples=8)
@given(forecasts, st.integers(2, 120))
def test_interval_calibration_curve_is_the_toolboxs(data, num_bins):
    y, m, s = data
    exp, obs = calibration_curve(y, m, s, num_bins=num_bins)
    texp, tobs = uct.get_proportion_lists_vectorized(m, s, y, num_bins=num_bins)
    np.testing.assert_array_equal(exp, texp)
    np.testing.assert_array_equal(obs, tobs)
    np.testing.assert_array_equal(obs, uct.get_proportion_lists(m, s, y, num_bins=num_bins)[1])


@settings(max_examples=8)
@given(forecasts)
def test_quantile_curve_is_the_toolboxs_of_the_reflected_targets(data):
    """Documented difference (S.6): the toolbox counts (mean - y)/std <= Phi^-1(p), i.e. targets
    at or above the 1 - p quantile; ours counts targets at or below the p quantile."""
    y, m, s = data
    obs = calibration_curve(y, m, s, prop_type="quantile")[1]
    reflected = 2 * m - y   # exact on the grid
    tobs = uct.get_proportion_lists_vectorized(m, s, reflected, prop_type="quantile")[1]
    np.testing.assert_array_equal(obs, tobs)


def test_quantile_curves_differ_for_a_biased_forecast():
    y, m, s = np.full(10, 1.0), np.zeros(10), np.ones(10)   # every target above the mean
    obs = calibration_curve(y, m, s, prop_type="quantile", num_bins=5)[1]
    tobs = uct.get_proportion_lists_vectorized(m, s, y, num_bins=5, prop_type="quantile")[1]
    np.testing.assert_array_equal(obs, [0, 0, 0, 0, 1])     # Phi^-1(0.75) < 1: only p = 1
    np.testing.assert_array_equal(tobs, [0, 1, 1, 1, 1])   # -1 <= Phi^-1(p) from p = 0.25


@settings(max_examples=8)
@given(forecasts, st.sampled_from(["interval", "quantile"]), st.integers(2, 120))
def test_average_calibration_errors_are_the_toolboxs(data, prop_type, num_bins):
    y, m, s = data
    yt = y if prop_type == "interval" else 2 * m - y   # the documented quantile difference
    kw = {"num_bins": num_bins, "prop_type": prop_type}
    _close(mean_absolute_calibration_error(y, m, s, **kw),
           uct.mean_absolute_calibration_error(m, s, yt, **kw))
    _close(root_mean_squared_calibration_error(y, m, s, **kw),
           uct.root_mean_squared_calibration_error(m, s, yt, **kw))
    _close(miscalibration_area_error(y, m, s, **kw), uct.miscalibration_area(m, s, yt, **kw))


@settings(max_examples=8)
@given(forecasts)
def test_scores_are_the_toolboxs(data):
    y, m, s = data
    _close(sharpness(y, m, s), uct.sharpness(s))
    _close(gaussian_nll_loss(y, m, s), uct.nll_gaussian(m, s, y))                  # scaled
    _close(gaussian_nll_loss(y, m, s) * y.size, uct.nll_gaussian(m, s, y, scaled=False))
    _close(crps_gaussian_loss(y, m, s), uct.crps_gaussian(m, s, y))
    _close(crps_gaussian_loss(y, m, s) * y.size, uct.crps_gaussian(m, s, y, scaled=False))
    _close(check_score_loss(y, m, s), uct.check_score(m, s, y))
    _close(interval_score_loss(y, m, s), uct.interval_score(m, s, y))


@settings(max_examples=8)
@given(forecasts, st.integers(1, 30))
def test_quantile_and_bound_scores_on_gaussian_predictions_are_the_toolboxs(data, k):
    y, m, s = data
    levels = np.linspace(0.02, 0.97, k)
    q = np.stack([uct.metrics_calibration.get_quantile(m, s, float(t)) for t in levels], 1)
    _close(quantile_check_loss(y, q, levels),
           uct.check_score(m, s, y, start_q=0.02, end_q=0.97, resolution=k))
    bounds = [uct.metrics_calibration.get_prediction_interval(m, s, float(p)) for p in levels]
    lo = np.stack([b.lower for b in bounds], 1)
    hi = np.stack([b.upper for b in bounds], 1)
    _close(interval_score_from_bounds_loss(y, lo, hi, levels),
           uct.interval_score(m, s, y, start_p=0.02, end_p=0.97, resolution=k))


@pytest.mark.parametrize("criterion,cali_type", [("mace", "mean_abs"), ("rmsce", "root_mean_sq")])
def test_adversarial_group_calibration_equals_the_toolbox_on_equal_draws(criterion, cali_type):
    rng = np.random.default_rng(3)
    n = 30
    y, m, s = rng.normal(size=n), rng.normal(size=n) * 0.3, rng.uniform(0.3, 2.0, n)
    kw = {"num_trials": 3, "num_group_draws": 4}   # fewer draws than the defaults: a cheap test
    ours = adversarial_group_calibration(y, m, s, criterion=criterion,
                                         rng=np.random.RandomState(5), **kw)
    np.random.seed(5)   # the toolbox draws from numpy's global RandomState
    theirs = uct.adversarial_group_calibration(m, s, y, cali_type=cali_type, **kw)
    np.testing.assert_array_equal(ours["group_size"], theirs.group_size)
    _close(ours["score_mean"], theirs.score_mean)
    _close(ours["score_stderr"], theirs.score_stderr)


@settings(max_examples=8)
@given(forecasts)
def test_isotonic_recalibrator_is_the_toolboxs_iso_recal(data):
    y, m, s = data
    exp, obs = uct.get_proportion_lists_vectorized(m, s, y)
    model = uct.iso_recal(exp, obs)
    rec = IsotonicRecalibrator().fit(y, m, s)
    p = np.linspace(0, 1, 257)
    _close(rec.levels(p), model.predict(p))
    _close(mean_absolute_calibration_error(y, m, s, recalibrator=rec),
           uct.mean_absolute_calibration_error(m, s, y, recal_model=model))
    _close(miscalibration_area_error(y, m, s, recalibrator=rec),
           uct.miscalibration_area(m, s, y, recal_model=model))
    lo, hi = rec.interval(m, s, 0.9)
    t = uct.metrics_calibration.get_prediction_interval(m, s, 0.9, recal_model=model)
    _close(lo, t.lower)
    _close(hi, t.upper)


@pytest.mark.parametrize("criterion,theirs", [("mace", "ma_cal"), ("rmsce", "rms_cal"),
                                              ("miscalibration_area", "miscal")])
def test_sigma_scaling_factor_is_the_toolboxs(criterion, theirs, monkeypatch):
    # the toolbox's optimiser calls its loop-per-point MACE/RMSCE (seconds); its vectorized path
    # gives the same proportions (test_interval_calibration_curve_is_the_toolboxs)
    for name in ("mean_absolute_calibration_error", "root_mean_squared_calibration_error"):
        monkeypatch.setattr(uct.metrics, name,
                            functools.partial(getattr(uct.metrics, name), vectorized=True))
    rng = np.random.default_rng(7)
    n = 25
    m, s = rng.normal(size=n), rng.uniform(0.5, 1.5, n)
    y = m + 2.5 * s * rng.normal(size=n)   # under-dispersed forecasts: the factor is near 2.5
    ours = SigmaScaling(criterion=criterion).fit(y, m, s).factor_
    assert ours == pytest.approx(uct.optimize_recalibration_ratio(m, s, y, criterion=theirs),
                                 rel=RTOL)


README = {  # the toolbox README's recalibration tables: (MACE, RMSCE, MA) before and after
    0.5: ((0.19429, 0.21753, 0.19625), (0.01124, 0.02591, 0.01117)),   # overconfident
    2.0: ((0.20692, 0.23003, 0.20901), (0.00157, 0.00205, 0.00132)),   # underconfident
}


@pytest.mark.parametrize("scale", sorted(README))
def test_readme_recalibration_example_reproduces_with_our_code(scale):
    """examples/viz_recalibrate_readme.py: seed 11, 650 points of the synthetic sine data, std
    scaled by 0.5 (2.0), isotonic recalibration fitted and scored on the same points."""
    np.random.seed(11)
    f, std, y, _ = uct.synthetic_sine_heteroscedastic(650)
    s = std * scale
    metrics = (mean_absolute_calibration_error, root_mean_squared_calibration_error,
               miscalibration_area_error)
    before = tuple(round(fn(y, f, s), 5) for fn in metrics)
    rec = IsotonicRecalibrator().fit(y, f, s)
    after = tuple(round(fn(y, f, s, recalibrator=rec), 5) for fn in metrics)
    assert (before, after) == README[scale]
