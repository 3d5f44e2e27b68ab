"""Tests of uqmetrics.metrics.calibration: softmax, temperature fitting (recovery of a known T within
k standard errors), convergence flags, the three protocols and the calibrated log-likelihood."""

from __future__ import annotations

import dataclasses
import doctest

import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import softmax as scipy_softmax

from uqmetrics import InputError
from uqmetrics.metrics import calibration
from uqmetrics.metrics.calibration import (
    CALIBRATION_PROTOCOLS,
    calibrated_log_likelihood,
    calibration_splits,
    fit_temperature,
    fit_temperature_result,
    log_softmax,
    softmax,
    temperature_scaled_metrics,
)
from uqmetrics.metrics.classification import accuracy_score, nll_loss, top_k_accuracy_score
from uqmetrics.runs.testing.strategies import grid_logits_and_labels

K_SE = 4.0  # tolerance in standard errors for the statistical tests


def _sample(n, n_classes, temperature, seed, scale=2.0):
    """Logits z ~ N(0, scale^2) and labels drawn from softmax(z / temperature)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, scale, size=(n, n_classes))
    p = softmax(z, temperature=temperature)
    u = rng.uniform(size=(n, 1))
    labels = np.minimum((p.cumsum(axis=1) < u).sum(axis=1), n_classes - 1)
    return z, labels


# ----------------------------------------------------------------------------------------------
# softmax / log_softmax
# ----------------------------------------------------------------------------------------------


def test_softmax_matches_scipy_and_is_stable():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(5, 4)) * 10
    np.testing.assert_allclose(softmax(z), scipy_softmax(z, axis=-1), rtol=1e-12)
    np.testing.assert_allclose(softmax(z, temperature=3.0), scipy_softmax(z / 3, axis=-1),
                               rtol=1e-12)
    np.testing.assert_allclose(np.exp(log_softmax(z, temperature=0.5)),
                               softmax(z, temperature=0.5), rtol=1e-12)
    big = np.array([[1e4, 0.0, -1e4]])
    assert np.all(np.isfinite(log_softmax(big)))
    np.testing.assert_array_equal(softmax(big), [[1.0, 0.0, 0.0]])
    assert log_softmax(big)[0, 1] == -1e4
    assert softmax(np.float32([[1, 2]])).dtype == np.float64
    # works over the last axis of any shape (e.g. (member, n, C))
    assert softmax(rng.normal(size=(2, 3, 4))).sum(-1) == pytest.approx(np.ones((2, 3)))


@pytest.mark.parametrize("bad, match", [(0.0, "temperature"), (-1.0, "temperature"),
                                        (np.inf, "temperature"), ("x", "temperature")])
def test_softmax_rejects_bad_temperature(bad, match):
    with pytest.raises(ValueError, match=match):
        softmax([[0.0, 1.0]], temperature=bad)


@pytest.mark.parametrize("bad, match", [([[np.nan, 1.0]], "logits contains non-finite"),
                                        ([[np.inf, 1.0]], "logits contains non-finite"),
                                        (np.empty((0, 3)), "logits is empty"),
                                        (3.0, "logits must have shape")])
def test_softmax_rejects_bad_logits(bad, match):
    with pytest.raises(ValueError, match=match):
        log_softmax(bad)


# ----------------------------------------------------------------------------------------------
# fit_temperature
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("t_true", [0.5, 1.0, 3.0])
def test_fit_temperature_recovers_known_temperature(t_true):
    """|T_hat - T_true| <= 4 SE, SE from the Fisher information of the 1-D NLL.

    Per sample, l_i(b) = b z_{i,y} - logsumexp(b z_i) with b = 1/T. Its second derivative is
    -Var_{p_i(b)}(z_i), the variance of the logits under p_i = softmax(b z_i); it does not depend
    on y, so observed and expected information coincide: I_b = mean_i Var_{p_i}(z_i). With
    s = log T, b = exp(-s) and the score vanishing at the MLE, I_s = b^2 I_b. Hence
    SE(log T_hat) = 1 / sqrt(n I_s) and, by the delta method, SE(T_hat) = T_hat SE(log T_hat).
    Everything is evaluated at the fit.
    """
    n = 3000
    z, y = _sample(n, 8, t_true, seed=int(t_true * 10))
    fit = fit_temperature_result(z, y)
    assert fit.converged
    b = 1.0 / fit.temperature
    p = softmax(z, temperature=fit.temperature)
    var = (p * z**2).sum(1) - (p * z).sum(1) ** 2
    info_s = b**2 * var.mean()
    se_t = fit.temperature / np.sqrt(n * info_s)
    assert abs(fit.temperature - t_true) <= K_SE * se_t
    assert fit_temperature(z, y) == fit.temperature


def test_fit_is_a_stationary_point_and_lowers_nll():
    z, y = _sample(500, 4, 2.0, seed=3)
    fit = fit_temperature_result(z, y)
    assert fit.nll_after <= fit.nll_before
    assert fit.nll_before == pytest.approx(nll_loss(y, softmax(z)), rel=1e-10)
    assert fit.nll_after == pytest.approx(nll_loss(y, softmax(z, temperature=fit.temperature)),
                                          rel=1e-10)
    # d NLL / d b = mean_i (E_p[z_i] - z_{i,y}) vanishes at the optimum (up to xatol = 1e-6 in
    # log T times the curvature).
    p = softmax(z, temperature=fit.temperature)
    grad_b = np.mean((p * z).sum(1) - z[np.arange(len(y)), y])
    curv_b = np.mean((p * z**2).sum(1) - (p * z).sum(1) ** 2)
    assert abs(grad_b) <= 10 * 1e-6 * curv_b / fit.temperature
    assert fit.n_iter > 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        fit.temperature = 1.0  # type: ignore[misc]


def test_converged_false_at_bounds():
    # Perfectly separable: every label is the argmax -> NLL decreases as T -> 0 (lower bound).
    z = np.array([[3.0, 0.0, -1.0], [0.0, 2.0, 1.0], [-1.0, 0.0, 1.0]] * 10)
    y = z.argmax(1)
    fit = fit_temperature_result(z, y)
    assert not fit.converged
    assert fit.temperature == pytest.approx(0.01, rel=1e-4)
    # Every label is the argmin -> NLL decreases as T -> infinity (upper bound).
    fit = fit_temperature_result(z, z.argmin(1), bounds=(0.1, 10.0))
    assert not fit.converged
    assert fit.temperature == pytest.approx(10.0, rel=1e-4)


def test_fit_temperature_accepts_xarray():
    # torch tensors: tests/test_uqmetrics_torch.py (integration env, which has torch)
    z, y = _sample(200, 3, 1.5, seed=4)
    ref = fit_temperature(z, y)
    assert fit_temperature(xr.DataArray(z, dims=("sample", "class")), xr.DataArray(y)) == ref


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: fit_temperature([[0.0, 1.0]], [2]), r"labels must lie in \[0, 2\)"),
        (lambda: fit_temperature([[0.0, np.nan]], [0]), "logits contains non-finite"),
        (lambda: fit_temperature([0.0, 1.0], [0, 1]), r"logits must have shape"),
        (lambda: fit_temperature([[0.0, 1.0]], [0, 1]), "same number of samples"),
        (lambda: fit_temperature(np.empty((0, 2)), []), "logits is empty"),
        # strict counts the samples of validated labels, never len() of the raw argument
        (lambda: fit_temperature(np.zeros((3, 2)), 3, strict=True), r"labels must have shape"),
        (lambda: fit_temperature(np.zeros((6, 2)), [[0, 1, 0, 1, 1, 0]], strict=True),
         r"labels must have shape \(n_samples,\), got shape \(1, 6\)"),
        (lambda: fit_temperature_result([[0.0, 1.0]], [0], bounds=(2.0, 3.0)), "bounds"),
        (lambda: fit_temperature_result([[0.0, 1.0]], [0], bounds=(0.0, 3.0)), "bounds"),
    ],
)
def test_fit_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ----------------------------------------------------------------------------------------------
# Temperature scaling never changes top-k accuracy
# ----------------------------------------------------------------------------------------------


@given(grid_logits_and_labels(), st.floats(0.05, 20.0))
def test_temperature_never_changes_top_k_accuracy(data, t):
    # Logits on a 0.25 grid in [-8, 8]: for T in [0.05, 20] distinct logits keep distinct,
    # non-underflowing probabilities, so ties cannot appear by rounding.
    labels, z = data
    for k in range(1, z.shape[1] + 1):
        assert top_k_accuracy_score(labels, softmax(z), k=k) == \
            top_k_accuracy_score(labels, softmax(z, temperature=t), k=k)


@given(grid_logits_and_labels(min_n=4))
@settings(max_examples=25)
def test_fitted_temperature_never_changes_accuracy(data):
    labels, z = data
    ds = temperature_scaled_metrics(z, labels, protocol="test_cv", n_repeats=1,
                                    metrics=("accuracy",))
    per_fold = ds["per_fold"].sel(metric="accuracy")
    np.testing.assert_array_equal(per_fold.sel(calibration="none"),
                                  per_fold.sel(calibration="temperature"))


def test_top_k_is_kept_where_a_small_temperature_underflows_the_probabilities():
    """A calibration set all right by a wide margin gives a small T (about 0.04). There, the
    probabilities of the classes 35-40 logits below the top underflow to exactly 0 and tie.
    The label, third by its logit but the last class, would then rank 9th by probability
    (ties go to the smaller class index) and count as a top-5 miss: top-k is scored from the
    unscaled probabilities for both rows, and stays a hit."""
    calib = np.tile(np.r_[30.0, np.zeros(9)], (20, 1))
    z = np.array([[40.0, 38.0, 0, 0, 0, 0, 0, 0, 0, 5.0]] * 4)
    y = np.full(4, 9)
    ds = temperature_scaled_metrics(z, y, protocol="holdout", calib_logits=calib,
                                    calib_labels=np.zeros(20, dtype=int),
                                    metrics=("accuracy", "top5_accuracy", "brier"))
    t = float(ds["temperature"][0])
    scaled = softmax(z, temperature=t)
    assert t < 0.05 and scaled[0, 9] == 0.0 and scaled[0, 1] > 0  # the mechanism
    assert top_k_accuracy_score(y, scaled, k=5) == 0.0
    assert ds["top5_accuracy"].values.tolist() == [1.0, 1.0]
    assert ds["accuracy"].values.tolist() == [0.0, 0.0]
    assert float(ds["brier"].sel(calibration="temperature")) > float(
        ds["brier"].sel(calibration="none"))  # the other metrics are of the scaled probabilities


# ----------------------------------------------------------------------------------------------
# Protocols
# ----------------------------------------------------------------------------------------------


def test_protocol_registry():
    assert set(CALIBRATION_PROTOCOLS) == {"holdout", "test_cv", "stratified_holdout"}
    assert CALIBRATION_PROTOCOLS["holdout"].external


@pytest.mark.parametrize("n", [10, 11])
def test_test_cv_splits_are_swapped_halves(n):
    labels = np.arange(n) % 3
    folds = calibration_splits(labels, protocol="test_cv", n_repeats=3, seed=5)
    assert len(folds) == 6
    for r in range(3):
        (a, b), (c, d) = folds[2 * r], folds[2 * r + 1]
        np.testing.assert_array_equal(a, d)
        np.testing.assert_array_equal(b, c)
        assert len(a) == n // 2 and len(b) == n - n // 2
        np.testing.assert_array_equal(np.sort(np.concatenate([a, b])), np.arange(n))
    # the repeats are different random partitions
    assert len({tuple(f[0]) for f in folds[::2]}) > 1
    # reproducible from the seed
    again = calibration_splits(labels, protocol="test_cv", n_repeats=3, seed=5)
    assert all(np.array_equal(x[0], y[0]) for x, y in zip(folds, again, strict=True))


def test_stratified_holdout_keeps_label_proportions():
    labels = np.repeat([0, 1, 2, 3], [700, 200, 97, 3])
    n_calib = 250
    ((calib, rest),) = calibration_splits(labels, protocol="stratified_holdout",
                                          n_calib=n_calib, seed=1)
    assert len(calib) == n_calib and len(rest) == len(labels) - n_calib
    assert np.intersect1d(calib, rest).size == 0
    counts = np.bincount(labels[calib], minlength=4)
    quota = np.bincount(labels) * n_calib / len(labels)
    assert np.all(np.abs(counts - quota) < 1)
    np.testing.assert_array_equal(counts, [175, 50, 24, 1])


def test_stratified_holdout_scores_scaled_and_unscaled_on_the_same_rest():
    z, y = _sample(600, 4, 2.0, seed=6)
    ds = temperature_scaled_metrics(z, y, protocol="stratified_holdout", n_calib=200, seed=2,
                                    metrics=("nll", "accuracy", "ece"))
    ((calib, rest),) = calibration_splits(y, protocol="stratified_holdout", n_calib=200, seed=2)
    t = fit_temperature(z[calib], y[calib])
    assert float(ds["temperature"][0]) == t
    assert int(ds["n_calib"][0]) == 200 and int(ds["n_eval"][0]) == 400
    assert float(ds["nll"].sel(calibration="none")) == nll_loss(y[rest], softmax(z[rest]))
    assert float(ds["nll"].sel(calibration="temperature")) == nll_loss(
        y[rest], softmax(z[rest], temperature=t))
    assert float(ds["accuracy"].sel(calibration="none")) == accuracy_score(y[rest],
                                                                          softmax(z[rest]))
    # T_true = 2: the logits are over-confident, so scaling helps on the held-out rest
    assert ds["nll"].sel(calibration="temperature") < ds["nll"].sel(calibration="none")
    assert ds.attrs["protocol"] == "stratified_holdout"


def test_test_cv_averages_folds_on_the_same_halves():
    z, y = _sample(300, 3, 1.5, seed=7)
    ds = temperature_scaled_metrics(z, y, protocol="test_cv", n_repeats=2, seed=3,
                                    metrics=("nll",))
    folds = calibration_splits(y, protocol="test_cv", n_repeats=2, seed=3)
    assert ds.sizes["fold"] == 4
    before, after = [], []
    for f, (c, e) in enumerate(folds):
        t = fit_temperature(z[c], y[c])
        assert float(ds["temperature"][f]) == t
        before.append(nll_loss(y[e], softmax(z[e])))
        after.append(nll_loss(y[e], softmax(z[e], temperature=t)))
    assert float(ds["nll"].sel(calibration="none")) == pytest.approx(np.mean(before), rel=1e-14)
    assert float(ds["nll"].sel(calibration="temperature")) == pytest.approx(np.mean(after),
                                                                            rel=1e-14)
    # the un-scaled mean over swapped equal halves is the full-set value
    assert float(ds["nll"].sel(calibration="none")) == pytest.approx(nll_loss(y, softmax(z)))
    assert bool(ds["converged"].all())


def test_holdout_fits_on_the_calibration_split():
    z, y = _sample(400, 5, 0.7, seed=8)
    zc, yc = _sample(300, 5, 0.7, seed=9)
    ds = temperature_scaled_metrics(z, y, protocol="holdout", calib_logits=zc, calib_labels=yc)
    t = fit_temperature(zc, yc)
    assert float(ds["temperature"][0]) == t
    assert float(ds["brier"].sel(calibration="none")) == pytest.approx(
        float(ds["per_fold"].sel(metric="brier", calibration="none", fold=0)))
    assert float(ds["nll"].sel(calibration="temperature")) == nll_loss(
        y, softmax(z, temperature=t))
    assert list(ds["calibration"].values) == ["none", "temperature"]
    assert ds["nll"].attrs["greater_is_better"] == 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"protocol": "holdout"}, "calib_logits"),
        ({"protocol": "test_cv", "calib_logits": np.zeros((2, 2)), "calib_labels": [0, 1]},
         "calib_logits"),
        ({"protocol": "platt"}, "protocol"),
        ({"protocol": "test_cv", "metrics": ("ood_auroc",)}, "classification metrics"),
        ({"protocol": "test_cv", "metrics": ("auroc",), "confidence": "negative_mutual_information"},
         "member probabilities"),
        ({"protocol": "test_cv", "metrics": ("nope",)}, "unknown metric"),
        ({"protocol": "test_cv", "metrics": "nll"}, "metrics must be a non-empty sequence"),
        ({"protocol": "test_cv", "n_repeats": 0}, "n_repeats"),
        ({"protocol": "test_cv", "seed": -1}, "seed"),
        ({"protocol": "stratified_holdout", "n_calib": 4}, "n_calib"),
        ({"protocol": "holdout", "calib_logits": np.zeros((2, 3)), "calib_labels": [0, 1]},
         "calib_logits must have 2 classes"),
        ({"protocol": "holdout", "calib_logits": np.zeros((2, 2)), "calib_labels": [0, 5]},
         r"calib_labels must lie in \[0, 2\)"),
        ({"protocol": "holdout", "calib_logits": np.zeros((2, 2)), "calib_labels": [0]},
         "same number of samples"),
    ],
)
def test_temperature_scaled_metrics_bad_input(kwargs, match):
    z = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.0], [0.0, 2.0]])
    with pytest.raises(ValueError, match=match):
        temperature_scaled_metrics(z, [0, 1, 1, 0], **kwargs)


# ----------------------------------------------------------------------------------------------
# Calibrated log-likelihood
# ----------------------------------------------------------------------------------------------


def test_cll_of_well_calibrated_data_is_minus_nll():
    """CLL ~ -NLL when T_true = 1, within a tolerance derived from the half size n_h.

    Per fold, the change of the eval-half NLL from T = 1 to the fitted T_f (log T_f = d, the
    fitting error, |d| <= k / sqrt(n_h I)) is g d + I d^2 / 2, where g, the eval-half score at
    T = 1, satisfies |g| <= k sqrt(I / n_h). So |CLL + NLL| <= k^2 / n_h + k^2 / (2 n_h), whatever
    I is; the un-scaled fold means average exactly to the full-set NLL (swapped equal halves).
    """
    n = 4000
    z, y = _sample(n, 6, 1.0, seed=11)
    cll = calibrated_log_likelihood(z, y, n_repeats=5, seed=0)
    n_half = n // 2
    assert abs(cll + nll_loss(y, softmax(z))) <= 1.5 * K_SE**2 / n_half


def test_cll_improves_on_miscalibrated_logits():
    z, y = _sample(2000, 6, 3.0, seed=12)  # logits 3x too confident
    cll = calibrated_log_likelihood(z, y, n_repeats=2)
    assert cll > -nll_loss(y, softmax(z))
    ds = temperature_scaled_metrics(z, y, protocol="test_cv", n_repeats=2, metrics=("nll",))
    assert cll == -float(ds["nll"].sel(calibration="temperature"))


def test_doctests_pass():
    result = doctest.testmod(calibration, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


# --------------------------------------------------------------------------------------------
# issue 36, row 18: a temperature on too few samples or on the search's bound


def test_a_fit_whose_nll_rounds_to_zero_inside_the_interval_is_on_the_bound():
    """Every sample right with a margin of 9: the NLL rounds to 0 at T = 0.012, short of the
    lower bound, where the search stopped and called the fit converged."""
    z, y = 9.0 * np.eye(4)[np.arange(20) % 4], np.arange(20) % 4
    fit = fit_temperature_result(z, y)
    assert fit.temperature < 0.02 and not fit.converged
    assert fit_temperature_result([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]], [0, 1, 1]).converged


def test_a_strict_fit_refuses_too_few_samples_and_the_bounds():
    right = [[2.0, 0.0]] * 5
    assert calibration.MIN_TEMPERATURE_SAMPLES == 5
    with pytest.raises(InputError, match=r"^a temperature is fitted on at least 5 samples, "
                                         r"got 4$"):
        fit_temperature(right[:4], [0, 0, 1, 0], strict=True)
    with pytest.raises(InputError, match=(
            r"^the temperature fitted on 5 samples runs to the search's lower bound T = 0.01 "
            r"\(bounds \(0.01, 100\)\): the NLL has no minimum inside them \(every sample "
            r"classified right, with a margin\)")):
        fit_temperature(right, [0] * 5, strict=True)
    with pytest.raises(InputError, match=r"runs to the search's upper bound T = 100 "):
        fit_temperature(right, [1] * 5, strict=True)
    # an interior optimum is returned as without strict; without strict the bound is returned
    mixed = [0, 0, 0, 0, 1]
    assert fit_temperature(right, mixed, strict=True) == fit_temperature(right, mixed)
    assert fit_temperature(right, [0] * 5) == pytest.approx(0.01, rel=1e-5)
