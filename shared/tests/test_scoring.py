"""The one scoring path: score_metrics and the protocols scoring through it."""

import doctest
import warnings

import numpy as np
import pytest
from hypothesis import given, settings

from uqmetrics import (
    UndefinedMetricWarning,
    calibration_splits,
    ensemble_size_curve,
    entropy,
    fit_temperature_result,
    get_confidence_function,
    log_softmax,
    score_metrics,
    softmax,
    temperature_scaled_metrics,
)
from uqmetrics.metrics import scoring
from uqmetrics.metrics.registry import get_metric, list_metrics
from uqmetrics.runs.testing import strategies

SCORABLE = list_metrics(kind="classification") + list_metrics(kind="selective")


def _direct(name, labels, probs, kappa):
    spec = get_metric(name)
    if spec.kind == "classification":
        return spec.func(labels, probs)
    return spec.func(np.argmax(probs, axis=1) == labels, kappa)


def _same(a, b):
    return (np.isnan(a) and np.isnan(b)) or a == b


def test_doctests():
    res = doctest.testmod(scoring)
    assert res.attempted > 0 and res.failed == 0


@settings(max_examples=20)
@given(strategies.probs_and_labels(min_n=4))
def test_score_metrics_is_each_metric_on_its_own_signature(data):
    labels, probs = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        got = score_metrics(labels, probs, metrics=SCORABLE)
        by_name = score_metrics(labels, probs, metrics=SCORABLE, confidence="margin")
        # a callable κ in [0, 1] (confidence_ece bins κ on [0, 1])
        def normalised_negative_entropy(p):
            return np.clip(1 - entropy(p) / np.log(p.shape[1]), 0.0, 1.0)

        normalised = normalised_negative_entropy(probs)
        by_callable = score_metrics(labels, probs, metrics=SCORABLE,
                                    confidence=normalised_negative_entropy)
        for name in SCORABLE:
            assert _same(got[name], _direct(name, labels, probs, probs.max(axis=1))), name
            margin = get_confidence_function("margin")(probs)
            assert _same(by_name[name], _direct(name, labels, probs, margin)), name
            assert _same(by_callable[name], _direct(name, labels, probs, normalised)), name
    assert list(got) == SCORABLE


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"metrics": ()}, "non-empty sequence"),
        ({"metrics": "nll"}, "non-empty sequence"),
        ({"metrics": ("nll", "nll")}, "duplicates"),
        ({"metrics": ("nope",)}, "unknown metric 'nope'"),
        ({"metrics": ("crps",)}, "'crps' is 'regression'"),
        ({"metrics": ("auroc",), "confidence": "negative_mutual_information"},
         "member probabilities"),
        ({"metrics": ("auroc",), "confidence": "nope"}, "name must be one of"),
        ({"metrics": ("auroc",), "confidence": lambda p: p[:2, 0]}, r"shape \(3,\)"),
    ],
)
def test_score_metrics_rejects_bad_input(kwargs, match):
    probs = np.array([[0.7, 0.3], [0.2, 0.8], [0.6, 0.4]])
    with pytest.raises(ValueError, match=match):
        score_metrics([0, 1, 1], probs, **kwargs)


def _logits(seed, n=300, c=4):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, c, n)
    z = rng.normal(size=(n, c)) * 2.0
    z[np.arange(n), labels] += rng.uniform(0, 3, n)  # informative, miscalibrated
    return labels, z


@pytest.mark.parametrize("confidence", ["softmax_response", "negative_entropy"])
def test_temperature_scaled_selective_metrics_are_fit_then_score(confidence):
    """What uqvision's selective protocol computes by hand: fit T on a stratified subset, score
    the rest at T = 1 and T, selective metrics on (argmax p = y, κ(p))."""
    y, z = _logits(0)
    metrics = ("accuracy", "auroc", "aurc", "eaurc", "sac_95", "ece", "nll")
    ds = temperature_scaled_metrics(z, y, protocol="stratified_holdout", n_calib=100, seed=3,
                                    metrics=metrics, confidence=confidence)
    (calib, rest), = calibration_splits(y, protocol="stratified_holdout", n_calib=100, seed=3)
    fit = fit_temperature_result(z[calib], y[calib])
    assert float(ds["temperature"][0]) == fit.temperature
    kappa_fn = get_confidence_function(confidence)
    for cal, t in (("none", 1.0), ("temperature", fit.temperature)):
        p = softmax(z[rest], temperature=t)
        for name in metrics:
            expected = _direct(name, y[rest], p, kappa_fn(p))
            assert float(ds[name].sel(calibration=cal)) == expected, (name, cal)
    assert ds.attrs["confidence"] == confidence
    # temperature scaling keeps the argmax: accuracy and the softmax-response ranking metrics
    # do not move (they would if κ were not recomputed from the scaled probabilities)
    assert float(ds["accuracy"][0]) == float(ds["accuracy"][1])


def test_classification_only_results_carry_no_confidence_attr():
    y, z = _logits(1, n=60)
    ds = temperature_scaled_metrics(z, y, protocol="test_cv", n_repeats=1, metrics=("nll",))
    assert "confidence" not in ds.attrs


def test_ensemble_size_curve_selective_metrics_are_prefix_ensembles():
    """What uqvision's ensembles protocol computes by hand on every (order, size) prefix."""
    rng = np.random.default_rng(2)
    k, n, c = 4, 80, 3
    y = rng.integers(0, c, n)
    lp = log_softmax(rng.normal(size=(k, n, c)) * 2 + 2.0 * np.eye(c)[y])
    metrics = ("accuracy", "nll", "auroc", "aurc", "eaurc")
    ds = ensemble_size_curve(lp, y, metrics=metrics, n_orders=3, seed=5)
    for o, perm in enumerate(ds["member_order"].values):
        for s in range(1, k + 1):
            running = lp[perm[0]]
            for j in perm[1:s]:
                running = np.logaddexp(running, lp[j])
            p = np.exp(running - np.log(s))
            for name in metrics:
                expected = _direct(name, y, p, p.max(axis=1))
                assert ds[name].values[o, s - 1] == expected, (name, o, s)
    assert ds.attrs["confidence"] == "softmax_response"
