"""The S.1-S.6 defaults and edge-case decisions that no other test pins (docs/conventions.md#s).

Each test fails if its decision changes: a default is checked against the decided value on data
where a neighbouring value gives another result (asserted, so the data cannot lose that
power unnoticed), and an edge case against the behaviour the conventions state.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from uqmetrics import (
    adaptive_calibration_error,
    aurc_c_loss,
    calibrated_log_likelihood,
    calibration_splits,
    confidence_calibration_error,
    eaurc_c_loss,
    ensemble_size_curve,
    expected_calibration_error,
    maximum_calibration_error,
    static_calibration_error,
    temperature_scaled_metrics,
)
from uqmetrics.metrics.calibration import log_softmax
from uqmetrics.metrics.confidence import expected_entropy, mutual_information, predictive_entropy
from uqmetrics.metrics.ood import ood_scores, ood_threshold
from uqmetrics.metrics.registry import get_metric
from uqmetrics.metrics.regression import (
    IsotonicRecalibrator,
    adversarial_group_calibration,
    binomial_interval,
    coverage_summary,
    pit_histogram,
)


def _labels_probs(seed: int = 0, n: int = 400, n_classes: int = 10, conc: float = 0.3):
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(n_classes, conc), size=n)
    # labels drawn from a sharpened copy: miscalibrated, so every binned error is non-zero
    sharp = probs**2 / (probs**2).sum(axis=1, keepdims=True)
    labels = np.array([rng.choice(n_classes, p=row) for row in sharp])
    return labels, probs


# ------------------------------------------------------------------------------------- S.1


def _top1(labels, probs):
    return probs.argmax(axis=1) == labels, probs.max(axis=1)


BINNED = {
    "ece": expected_calibration_error,
    "mce": maximum_calibration_error,
    "sce": static_calibration_error,
    "ace": adaptive_calibration_error,
    "confidence_ece": lambda y, p, **kw: confidence_calibration_error(*_top1(y, p), **kw),
}


@pytest.mark.parametrize("name", sorted(BINNED))
def test_binned_calibration_errors_use_15_bins_by_default(name):
    labels, probs = _labels_probs()
    f = BINNED[name]
    at_15 = f(labels, probs, n_bins=15)
    assert f(labels, probs) == at_15
    assert at_15 not in (f(labels, probs, n_bins=10), f(labels, probs, n_bins=20))


def test_registered_ece_quantile_is_15_equal_mass_bins():
    labels, probs = _labels_probs()
    ece_q = get_metric("ece_quantile").func(labels, probs)
    assert ece_q == expected_calibration_error(labels, probs, n_bins=15, strategy="quantile")
    assert ece_q != expected_calibration_error(labels, probs, n_bins=15)


def test_registered_tace_thresholds_at_1e_3():
    labels, probs = _labels_probs()
    assert ((probs > 1e-4) & (probs <= 1e-2)).any()  # predictions the threshold decides on
    tace = get_metric("tace").func(labels, probs)
    assert tace == adaptive_calibration_error(labels, probs, threshold=1e-3, weighting="all")
    assert tace not in (adaptive_calibration_error(labels, probs, threshold=t)
                        for t in (0.0, 1e-4, 1e-2))
    assert get_metric("ace").func(labels, probs) == adaptive_calibration_error(
        labels, probs, threshold=0.0, weighting="all")


def _logits_labels(seed: int = 1, n: int = 120, n_classes: int = 4):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_classes, size=n)
    z = rng.normal(size=(n, n_classes))
    z[np.arange(n), labels] += 1.5
    return 2.5 * z, labels  # over-confident logits: the fitted T differs from 1


def test_test_cv_repeats_five_times_by_default():
    z, y = _logits_labels()
    assert len(calibration_splits(y)) == 10  # 5 repeats, both ways
    assert temperature_scaled_metrics(z, y, protocol="test_cv", metrics=("nll",)).sizes[
        "fold"] == 10
    cll = calibrated_log_likelihood(z, y)
    assert cll == calibrated_log_likelihood(z, y, n_repeats=5)
    assert cll != calibrated_log_likelihood(z, y, n_repeats=4)


def test_stratified_holdout_calibrates_on_5000_samples_by_default():
    rng = np.random.default_rng(2)
    n = 5200
    y = rng.integers(0, 3, size=n)
    z = rng.normal(size=(n, 3))
    ((calib, rest),) = calibration_splits(y, protocol="stratified_holdout")
    assert (calib.size, rest.size) == (5000, 200)
    ds = temperature_scaled_metrics(z, y, protocol="stratified_holdout", metrics=("nll",))
    assert ds["n_calib"].values.tolist() == [5000]
    assert ds["n_eval"].values.tolist() == [200]


# ------------------------------------------------------------------------------------- S.2


def test_registered_aurc_c_covers_coverages_up_to_one_half():
    rng = np.random.default_rng(3)
    k = rng.uniform(size=200)
    c = rng.uniform(size=200) < k  # informative, imperfect confidence
    for name, f in (("aurc_c", aurc_c_loss), ("eaurc_c", eaurc_c_loss)):
        value = get_metric(name).func(c, k)
        assert value == f(c, k, coverage=(0.0, 0.5))
        assert value not in (f(c, k, coverage=(0.0, 0.4)), f(c, k, coverage=(0.0, 0.6)))


def test_mutual_information_is_clipped_at_zero():
    # identical members: H(mean p) - mean H(p) is 0 up to rounding, which falls on both sides
    rng = np.random.default_rng(0)
    members = np.stack([rng.dirichlet(np.ones(7), size=200)] * 3)
    raw = predictive_entropy(members) - expected_entropy(members)
    assert (raw < 0).any()
    mi = mutual_information(members)
    assert (mi >= 0).all()
    np.testing.assert_array_equal(mi, np.maximum(raw, 0.0))


# ------------------------------------------------------------------------------------- S.3


def test_ensemble_size_curve_defaults_five_orders_identity_first_five_test_cv_repeats():
    rng = np.random.default_rng(4)
    n, n_members, n_classes = 60, 3, 3
    y = rng.integers(0, n_classes, size=n)
    z = 2.0 * rng.normal(size=(n_members, n, n_classes))
    z[:, np.arange(n), y] += 1.0
    lp = log_softmax(z)
    ds = ensemble_size_curve(lp, y, metrics=("accuracy",), calibrated=True)
    assert ds.sizes["order"] == 5
    np.testing.assert_array_equal(ds["member_order"].values[0], np.arange(n_members))
    # size 1 of order o is member member_order[o, 0] alone, its CLL from test_cv with seed o
    for o in range(5):
        first = int(ds["member_order"].values[o, 0])
        want = calibrated_log_likelihood(lp[first], y, n_repeats=5, seed=o)
        assert float(ds["cll"].sel(order=o, size=1)) == want
    assert float(ds["cll"].sel(order=0, size=1)) != calibrated_log_likelihood(
        lp[0], y, n_repeats=4, seed=0)


# ------------------------------------------------------------------------------------- S.4


def test_ood_threshold_is_numpys_linear_quantile():
    u = [0.0, 1.0, 2.0, 3.0]
    assert ood_threshold(u) == pytest.approx(2.85, abs=1e-12)  # 'higher' or 'nearest' give 3
    ds = ood_scores(u, [2.9, 2.8], [2.86, 2.84])
    assert float(ds["in_as_in"]) == 0.5 and float(ds["out_as_out"]) == 0.5


# ------------------------------------------------------------------------------------- S.6


def test_coverage_summary_interval_is_wilson_at_95_percent_by_default():
    rng = np.random.default_rng(5)
    pred = xr.DataArray(rng.normal(size=(30, 4)), dims=("repetition", "point"))
    ds = xr.Dataset({"prediction": pred, "uncertainty": xr.ones_like(pred),
                     "truth": xr.DataArray(np.zeros(4), dims="point")})
    s = coverage_summary(ds)
    hits = np.round(s["coverage"].values * 30)
    low, high = binomial_interval(hits, 30, alpha=0.05, method="wilson")
    np.testing.assert_array_equal(s["coverage_low"].values, low)
    np.testing.assert_array_equal(s["coverage_high"].values, high)
    beta_low, _ = binomial_interval(hits, 30, alpha=0.05, method="beta")
    assert not np.array_equal(low, beta_low)
    assert s.attrs["interval_method"] == "wilson" and s.attrs["alpha"] == 0.05


def test_pit_histogram_has_ten_bins_by_default():
    rng = np.random.default_rng(6)
    y = rng.normal(size=50)
    h = pit_histogram(y, np.zeros(50), np.ones(50))
    assert h["counts"].shape == (10,) and h["counts"].sum() == 50
    np.testing.assert_array_equal(h["edges"], np.linspace(0.0, 1.0, 11))


def test_registered_adversarial_group_mace_is_the_mean_of_the_curve():
    rng = np.random.default_rng(7)
    y, m, s = rng.normal(size=40), np.zeros(40), np.full(40, 0.6)
    curve = adversarial_group_calibration(y, m, s, rng=0)["score_mean"]
    value = get_metric("adversarial_group_mace").func(y, m, s)
    assert value == float(np.mean(curve))
    assert value != float(np.max(curve))


def test_isotonic_levels_are_clipped_to_the_fitted_range():
    # half the targets equal their mean, the others lie 50 sigma away: every interval but the
    # infinite p = 1 one holds exactly half of them, so the fitted observed proportions are 0.5
    # (mapped to the mean of the expected p < 1) and 1; below 0.5 R stays at that value
    rng = np.random.default_rng(8)
    m = rng.normal(size=200)
    y = np.where(np.arange(200) < 100, m, m + 50.0 * rng.choice([-1.0, 1.0], size=200))
    rec = IsotonicRecalibrator().fit(y, m, np.ones(200))
    np.testing.assert_array_equal(rec.x_, [0.5, 1.0])
    assert rec.y_[0] == pytest.approx(np.linspace(0, 1, 100)[:-1].mean(), rel=1e-12)
    np.testing.assert_array_equal(rec.levels([0.0, 0.25, 0.5]), np.full(3, rec.y_[0]))

