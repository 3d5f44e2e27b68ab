"""Core tests of the S.6 regression scores: average calibration, adversarial group calibration,
sharpness, check and interval scores, PIT and recalibration (docs/conventions.md#s-6).

Cross-checks against uncertainty-toolbox are in ``test_regression_toolbox.py``; nothing here
needs it.

Tolerances of the calibration properties come from the Dvoretzky-Kiefer-Wolfowitz inequality:
for a calibrated Gaussian forecast the interval statistic ``|2 PIT - 1|`` is uniform, the
observed proportions of the interval curve are its empirical CDF at ``p``, and
``P(sup_p |obs(p) - p| > eps) <= 2 exp(-2 n eps^2)``; MACE, RMSCE and the miscalibration area
are at most that supremum. With ``eps = sqrt(log(2 / 1e-9) / (2 n))`` a property fails with
probability below 1e-9 per example.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from uqmetrics import (
    CONVENTIONS,
    IsotonicRecalibrator,
    SigmaScaling,
    adversarial_group_calibration,
    adversarial_group_calibration_error,
    calibration_curve,
    check_score_loss,
    gaussian_nll_loss,
    interval_score_from_bounds_loss,
    interval_score_loss,
    mean_absolute_calibration_error,
    miscalibration_area_error,
    pit_histogram,
    pit_ks_error,
    pit_values,
    quantile_check_loss,
    root_mean_squared_calibration_error,
    sharpness,
)
from uqmetrics.metrics.registry import get_metric
from uqmetrics.runs.testing import strategies

CALIBRATION = (mean_absolute_calibration_error, root_mean_squared_calibration_error,
               miscalibration_area_error)


def dkw(n: int, delta: float = 1e-9) -> float:
    return math.sqrt(math.log(2 / delta) / (2 * n))


def gaussian_sample(seed: int, n: int, scale: float = 1.0):
    rng = np.random.default_rng(seed)
    m = rng.normal(size=n)
    s = rng.uniform(0.2, 3.0, n)
    y = m + scale * s * rng.normal(size=n)
    return y, m, s


# ------------------------------------------------------------------------ average calibration


@settings(max_examples=15)
@given(st.integers(0, 2**32 - 1), st.integers(50, 2000), st.sampled_from(["interval", "quantile"]))
def test_calibrated_gaussian_sample_is_calibrated_within_dkw(seed, n, prop_type):
    y, m, s = gaussian_sample(seed, n)
    for fn in CALIBRATION:
        assert fn(y, m, s, prop_type=prop_type) <= dkw(n), fn.__name__


@settings(max_examples=10)
@given(st.integers(0, 2**32 - 1), st.sampled_from([0.3, 0.5, 2.0, 3.0]))
def test_sigma_scaling_by_the_true_factor_restores_calibration(seed, factor):
    n = 1000
    y, m, s = gaussian_sample(seed, n, scale=factor)
    # far from calibrated: |2 Phi(z / factor) - 1| against p differs by more than 0.1 somewhere
    assert mean_absolute_calibration_error(y, m, s) > 0.1 - dkw(n)
    for fn in CALIBRATION:
        assert fn(y, m, factor * s) <= dkw(n), fn.__name__


def test_sigma_scaling_fits_the_factor_on_a_calibration_split():
    n = 2000
    y, m, s = gaussian_sample(0, 2 * n, scale=2.0)
    # The calibration-error minimisers have no closed-form variance. Their relative SD is
    # c / sqrt(n) with c = 0.88, measured over 10,000 seeds of gaussian_sample(seed, 4000, 2.0)
    # (SD of factor_/2 - 1 at n = 2000: 0.0197 for both criteria; Gaussian tails: 25-28, 6-7, 1
    # seeds beyond 3, 3.5, 4 SD against 27, 4.7, 0.6 expected; the NLL factor's c would be
    # 1/sqrt(2) = 0.71). The criteria correlate at 0.998: 4 SE (two-sided 6.3e-5) for both.
    rel = 4 * 0.88 / math.sqrt(n)
    rec = SigmaScaling(criterion="mace").fit(y[:n], m[:n], s[:n])
    assert rec.factor_ == pytest.approx(2.0, rel=rel)
    assert mean_absolute_calibration_error(y[n:], m[n:], rec.apply(s[n:])) <= dkw(n)
    area = SigmaScaling(criterion="miscalibration_area").fit(y[:n], m[:n], s[:n])
    assert area.factor_ == pytest.approx(2.0, rel=rel)


def test_nll_sigma_scaling_is_the_nll_optimal_factor():
    # S.6b: sigma-scaling by the NLL-optimal factor. The NLL of (y, m, f s) is
    # log f + r2 / (2 f^2) + const, so its minimiser is f = sqrt(r2) exactly: the fitted factor
    # is a stationary point of gaussian_nll_loss and beats its neighbours on both sides.
    y, m, s = gaussian_sample(3, 500, scale=1.7)
    f = SigmaScaling(criterion="nll").fit(y, m, s).factor_
    assert f == pytest.approx(math.sqrt(np.mean(((y - m) / s) ** 2)), rel=1e-15)
    nll = [gaussian_nll_loss(y, m, g * s) for g in (f * (1 - 1e-3), f, f * (1 + 1e-3))]
    assert nll[1] < nll[0] and nll[1] < nll[2]
    h = 1e-5 * f
    slope = (gaussian_nll_loss(y, m, (f + h) * s) - gaussian_nll_loss(y, m, (f - h) * s)) / (2 * h)
    assert abs(slope) < 1e-6


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_nll_sigma_scaling_recovers_the_true_factor_within_its_standard_error(factor):
    # y = m + factor * s * eps: the fitted factor is factor * sqrt(mean eps^2), whose standard
    # error is factor / sqrt(2 n) to first order (var eps^2 = 2); 6 of them.
    n = 2000
    y, m, s = gaussian_sample(4, 2 * n, scale=factor)
    f = SigmaScaling(criterion="nll").fit(y[:n], m[:n], s[:n]).factor_
    assert abs(f - factor) < 6 * factor / math.sqrt(2 * n)


def test_sigma_scaling_defaults_to_the_nll_optimal_factor():
    # S.6b decides sigma-scaling by the NLL-optimal factor: the default criterion is "nll", and
    # its factor is sqrt(mean ((y - m) / s)^2) exactly. Heavy-tailed residuals (Student t with 3
    # degrees of freedom, variance 3) separate it from the MACE minimiser, the toolbox's default:
    # the NLL factor follows the variance (sqrt 3 = 1.73), MACE the quantiles (the t's quartile
    # is 0.765, the normal's 0.674). On this fixed sample they are 1.75 and 1.16; the last
    # assertion only checks that the sample tells the two criteria apart (the test is not empty).
    rng = np.random.default_rng(5)
    n = 4000
    m, s = rng.normal(size=n), rng.uniform(0.5, 2.0, n)
    y = m + s * rng.standard_t(3, size=n)
    default = SigmaScaling()
    assert default.criterion == "nll"
    f = default.fit(y, m, s).factor_
    assert f == pytest.approx(math.sqrt(np.mean(((y - m) / s) ** 2)), rel=1e-15)
    assert f == SigmaScaling(criterion="nll").fit(y, m, s).factor_
    mace = SigmaScaling(criterion="mace").fit(y, m, s).factor_
    assert f - mace > 0.3, (f, mace)


def test_nll_sigma_scaling_refuses_a_zero_spread():
    with pytest.raises(ValueError, match="NLL-optimal factor is 0"):
        SigmaScaling(criterion="nll").fit([1.0, 2.0], [1.0, 2.0], [1.0, 1.0])


@pytest.mark.parametrize("scale", [0.5, 2.0])
def test_isotonic_recalibration_fitted_on_calibration_split_calibrates_the_test_split(scale):
    y, m, s = gaussian_sample(1, 4000, scale=scale)
    cal, test = slice(0, 2000), slice(2000, None)
    before = mean_absolute_calibration_error(y[test], m[test], s[test])
    rec = IsotonicRecalibrator().fit(y[cal], m[cal], s[cal])
    after = mean_absolute_calibration_error(y[test], m[test], s[test], recalibrator=rec)
    assert before > 0.1
    assert after <= dkw(2000) + dkw(2000)   # calibration-split and test-split fluctuations
    lo, hi = rec.interval(m[test], s[test], 0.9)
    inside = np.mean((y[test] >= lo) & (y[test] <= hi))
    assert abs(inside - 0.9) <= 2 * dkw(2000)


def test_isotonic_quantile_recalibration():
    y, m, s = gaussian_sample(2, 4000)
    y = y + 0.5 * s    # biased: every quantile too low
    rec = IsotonicRecalibrator(prop_type="quantile").fit(y[:2000], m[:2000], s[:2000])
    q = rec.quantile(m[2000:], s[2000:], 0.8)
    assert abs(np.mean(y[2000:] <= q) - 0.8) <= 2 * dkw(2000)
    assert mean_absolute_calibration_error(y[2000:], m[2000:], s[2000:], prop_type="quantile",
                                           recalibrator=rec) <= 2 * dkw(2000)


@settings(max_examples=20)
@given(strategies.gaussian_forecasts(min_n=1))
def test_calibration_curve_shape_and_bounds(data):
    y, m, s = data
    exp, obs = calibration_curve(y, m, s)
    assert exp.shape == obs.shape == (100,)
    np.testing.assert_array_equal(exp, np.linspace(0, 1, 100))
    assert np.all(np.diff(obs) >= 0) and obs[-1] == 1.0
    mace = mean_absolute_calibration_error(y, m, s)
    rmsce = root_mean_squared_calibration_error(y, m, s)
    area = miscalibration_area_error(y, m, s)
    assert 0 <= mace <= rmsce <= 1          # power-mean inequality
    assert 0 <= area <= 0.5 + 1e-12


def test_miscalibration_area_splits_crossing_segments():
    # curve (0, 0), (1/2, 1), (1, 1): d = 0, 1/2, 0 -> area 2 * (1/2 * 1/2 * 1/2) = 1/4
    y = np.array([0.2, 0.1, -0.1, 0.05])
    assert miscalibration_area_error(y, np.zeros(4), np.full(4, 100.0), num_bins=3) == \
        pytest.approx(0.25)
    # a curve crossing the diagonal between two proportions: two triangles, not |trapezoid|
    from uqmetrics.metrics.regression import _area
    assert _area(np.array([0.0, 1.0]), np.array([0.5, 0.5])) == pytest.approx(0.25)


# -------------------------------------------------------------------------- group calibration


def test_adversarial_group_calibration_is_seeded():
    y, m, s = gaussian_sample(3, 40, scale=0.5)
    a = adversarial_group_calibration(y, m, s, rng=4, num_trials=3, num_group_draws=3)
    b = adversarial_group_calibration(y, m, s, rng=np.random.default_rng(4), num_trials=3,
                                      num_group_draws=3)
    assert set(a) == {"group_size", "score_mean", "score_stderr"}
    np.testing.assert_array_equal(a["score_mean"], b["score_mean"])
    np.testing.assert_array_equal(a["group_size"], np.linspace(0, 1, 10))
    # the whole data set as the only group of the last fraction: every draw is the full set
    assert a["score_mean"][-1] == pytest.approx(mean_absolute_calibration_error(y, m, s))
    assert a["score_stderr"][-1] == pytest.approx(0.0, abs=1e-15)
    assert adversarial_group_calibration_error(y, m, s, rng=1) == \
        adversarial_group_calibration_error(y, m, s, rng=1)


# --------------------------------------------------------------------- sharpness and scores


@given(strategies.gaussian_forecasts())
def test_sharpness_is_root_mean_variance(data):
    y, m, s = data
    assert sharpness(y, m, s) == pytest.approx(math.sqrt(np.mean(s ** 2)), rel=1e-12)
    assert min(s) - 1e-12 <= sharpness(y, m, s) <= max(s) + 1e-12


@given(strategies.gaussian_forecasts())
def test_check_score_of_the_median_is_half_the_mae(data):
    y, m, s = data
    mae = float(np.mean(np.abs(y - m)))
    assert check_score_loss(y, m, s, levels=[0.5]) == pytest.approx(mae / 2, rel=1e-12, abs=1e-15)
    assert quantile_check_loss(y, m, [0.5]) == pytest.approx(mae / 2, rel=1e-12, abs=1e-15)


@given(strategies.gaussian_forecasts())
def test_gaussian_scores_equal_the_scores_of_their_quantiles_and_bounds(data):
    y, m, s = data
    from scipy.special import ndtri
    tau = np.linspace(0.01, 0.99, 99)
    q = m[:, None] + s[:, None] * ndtri(tau)
    assert check_score_loss(y, m, s) == pytest.approx(quantile_check_loss(y, q, tau), rel=1e-12)
    lo = m[:, None] + s[:, None] * ndtri(0.5 - tau / 2)
    hi = m[:, None] + s[:, None] * ndtri(0.5 + tau / 2)
    assert interval_score_loss(y, m, s) == pytest.approx(
        interval_score_from_bounds_loss(y, lo, hi, tau), rel=1e-12)


def test_interval_score_is_width_plus_penalties():
    y = np.array([0.0, 3.0, -2.0])
    lo, hi = np.full(3, -1.0), np.full(3, 1.0)
    # alpha = 0.2: widths 2, penalties 0, (2/0.2) 2 = 20, (2/0.2) 1 = 10
    assert interval_score_from_bounds_loss(y, lo, hi, [0.8]) == pytest.approx((2 + 22 + 12) / 3)


def test_check_score_approaches_crps_over_two():
    # the mean pinball loss over all levels is CRPS / 2 (Gneiting and Raftery 2007, sec. 6)
    from uqmetrics import crps_gaussian_loss
    y, m, s = gaussian_sample(5, 50)
    tau = (np.arange(2000) + 0.5) / 2000
    assert check_score_loss(y, m, s, levels=tau) == pytest.approx(
        crps_gaussian_loss(y, m, s) / 2, rel=1e-3)


# ---------------------------------------------------------------------------------------- PIT


@given(strategies.gaussian_forecasts(min_n=1), st.integers(1, 20))
def test_pit_histogram_counts_and_statistics(data, bins):
    y, m, s = data
    u = pit_values(y, m, s)
    np.testing.assert_allclose(u, stats.norm.cdf(y, m, s), rtol=1e-12, atol=1e-300)
    h = pit_histogram(y, m, s, bins=bins)
    assert h["counts"].sum() == y.size and h["counts"].shape == (bins,)
    np.testing.assert_array_equal(h["counts"], np.histogram(u, bins=bins, range=(0, 1))[0])
    assert h["ks"] == pytest.approx(stats.kstest(u, "uniform").statistic, rel=1e-12)
    assert pit_ks_error(y, m, s) == h["ks"]
    if bins > 1:
        ref = stats.chisquare(h["counts"])
        assert h["chi2"] == pytest.approx(ref.statistic, rel=1e-12, abs=1e-12)
        assert h["p_value"] == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-300)


@settings(max_examples=10)
@given(st.integers(0, 2**32 - 1), st.integers(50, 2000))
def test_pit_of_calibrated_forecast_is_uniform_within_dkw(seed, n):
    y, m, s = gaussian_sample(seed, n)
    assert pit_ks_error(y, m, s) <= dkw(n)


# ----------------------------------------------------------------- registry and validation


@pytest.mark.parametrize("name", ["mace", "rmsce", "miscalibration_area", "adversarial_group_mace",
                                  "sharpness", "check_score", "interval_score", "pit_ks"])
def test_new_metrics_are_registered_lower_is_better_with_a_convention(name):
    spec = get_metric(name)
    assert spec.kind == "regression" and not spec.greater_is_better
    assert CONVENTIONS[name].startswith("S.6: ")


@pytest.mark.parametrize("call,match", [
    (lambda: calibration_curve([0.0], [0.0], [1.0], prop_type="quantiles"), "prop_type"),
    (lambda: calibration_curve([0.0], [0.0], [1.0], num_bins=1), "num_bins must be .* got 1"),
    (lambda: calibration_curve([0.0], [0.0], [0.0]), "std"),
    (lambda: check_score_loss([0.0], [0.0], [1.0], levels=[0.0, 0.5]), "levels .* got 0.0"),
    (lambda: interval_score_from_bounds_loss([0.0], [1.0], [0.0], [0.5]), "lower must be <= upper"),
    (lambda: quantile_check_loss([0.0, 1.0], [[0.0, 1.0]], [0.5]), "quantiles must have shape"),
    (lambda: IsotonicRecalibrator().levels([0.5]), "not fitted"),
    (lambda: SigmaScaling().apply([1.0]), "not fitted"),
    (lambda: SigmaScaling(criterion="crps"), "criterion"),
    (lambda: mean_absolute_calibration_error([0.0], [0.0], [1.0], recalibrator=2.0),
     "recalibrator"),
    (lambda: adversarial_group_calibration([0.0, 1.0], [0.0, 0.0], [1.0, 1.0], rng=-1), "rng"),
    (lambda: pit_histogram([0.0], [0.0], [1.0], bins=0), "bins"),
])
def test_bad_input_raises_one_line_naming_the_argument(call, match):
    with pytest.raises(ValueError, match=match) as info:  # InputError or the helpers' ValueError
        call()
    assert "\n" not in str(info.value)
