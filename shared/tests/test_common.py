"""Generic property tests over every registered metric (like scikit-learn's test_common.py).

The tests iterate :mod:`uqmetrics.metrics.registry`, so a metric is checked for every property it
declares as soon as it is registered, whatever its kind (classification, selective, regression,
ood, retrieval); nothing here names individual metrics except the S.2 properties specific to
AUROC, AURC and E-AURC at the end.

Properties (:data:`uqmetrics.metrics.registry.PROPERTIES`):

- ``permutation_invariant``: permuting the samples (jointly across the arguments; the two
  unpaired samples of an ood metric each on its own) leaves the value unchanged.
- ``monotone_invariant``: a strictly increasing transform of the confidence/uncertainty
  arguments (:data:`MONOTONE_ARGS`) leaves the value unchanged.
- ``temperature_invariant``: a classification metric scores ``softmax(z / T)`` as
  ``softmax(z)`` for every T > 0 (on logits whose scaled probabilities neither tie nor
  underflow).
- ``proper_scoring_rule``: under a known true distribution the expected score is best for the
  true distribution. The expectation is exact, not sampled: a sum over the C classes for
  classification, Gauss-Hermite quadrature for Gaussian regression forecasts (with its error
  estimated from two node counts).
"""

import math
import warnings

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from numpy.polynomial.hermite_e import hermegauss

from uqmetrics import CONVENTIONS, UndefinedMetricWarning, aurc_loss, auroc_score, eaurc_loss
from uqmetrics.metrics.registry import (
    FAMILIES,
    KINDS,
    METRICS,
    PROPERTIES,
    get_metric,
    list_metrics,
)
from uqmetrics.runs.testing import strategies

#: Inputs of each metric kind, in its positional order (see ``uqmetrics.metrics.registry.METRIC_KINDS``).
INPUTS = {
    "classification": strategies.probs_and_labels(),
    "selective": strategies.correct_and_confidence(both_classes=False),
    "regression": strategies.gaussian_forecasts(),
    "ood": strategies.ood_uncertainties(),
    "retrieval": strategies.retrieval_inputs(),
}
#: Positions of the confidence/uncertainty arguments that a monotone transform acts on.
MONOTONE_ARGS = {"selective": (1,), "ood": (0, 1), "retrieval": (2,)}
#: Kinds whose arguments are independent samples (permuted each on its own).
UNPAIRED = {"ood"}

ALL = list_metrics()
PERMUTATION = list_metrics(prop="permutation_invariant")
MONOTONE = list_metrics(prop="monotone_invariant")
PROPER = list_metrics(prop="proper_scoring_rule")
TEMPERATURE = list_metrics(prop="temperature_invariant")


def _call(func, *args):
    """Evaluate a metric, allowing the documented NaN-with-warning outcome."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        return func(*args)


def _assert_same(a, b, name):
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        assert math.isnan(a) and math.isnan(b), f"{name}: {a} vs {b}"
    else:
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), f"{name}: {a} vs {b}"


# ------------------------------------------------------------------------------ the registry


@pytest.mark.parametrize("kind", KINDS)
def test_registry_has_metrics_of_every_kind(kind):
    assert list_metrics(kind=kind), f"no {kind} metric is registered"


@pytest.mark.parametrize("family", FAMILIES)
def test_registry_covers_every_family(family):
    assert list_metrics(family=family), f"no {family} metric is registered"


@pytest.mark.parametrize("name", ALL)
def test_every_metric_has_its_convention(name):
    assert CONVENTIONS.get(name, "").strip(), f"{name} has no entry in CONVENTIONS"


@pytest.mark.parametrize("name", ALL)
def test_every_declared_property_is_checked_here(name):
    spec = get_metric(name)
    assert spec.kind in INPUTS, f"{name}: no input strategy for kind {spec.kind!r}"
    assert spec.properties <= set(PROPERTIES)
    if "monotone_invariant" in spec.properties:
        assert spec.kind in MONOTONE_ARGS, f"{name}: kind {spec.kind!r} has no confidence arg"
    if "proper_scoring_rule" in spec.properties:
        assert spec.kind in EXPECTED_SCORE, f"{name}: no exact expectation for {spec.kind!r}"
    if "temperature_invariant" in spec.properties:
        assert spec.kind == "classification", f"{name}: takes no probabilities"


def test_registry_is_the_shared_registry_class():
    from uqmetrics.metrics.registry import Registry

    assert isinstance(METRICS, Registry)
    with pytest.raises(ValueError, match="unknown metric 'nope'; valid metrics: accuracy"):
        get_metric("nope")
    assert METRICS.describe().splitlines()[0].startswith("accuracy: Top-1 accuracy")


# ------------------------------------------------------------------ permutation, monotone


@pytest.mark.parametrize("name", PERMUTATION)
@settings(max_examples=20)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_permutation_invariance(name, data, seed):
    spec = get_metric(name)
    args = data.draw(INPUTS[spec.kind])
    rng = np.random.default_rng(seed)
    if spec.kind in UNPAIRED:
        permuted = tuple(a[rng.permutation(a.shape[0])] for a in args)
    else:
        perm = rng.permutation(args[0].shape[0])
        permuted = tuple(a[perm] for a in args)
    _assert_same(_call(spec.func, *permuted), _call(spec.func, *args), name)


@pytest.mark.parametrize("name", MONOTONE)
@settings(max_examples=20)
@given(data=st.data(), transform=strategies.strictly_increasing_transforms)
def test_monotone_invariance(name, data, transform):
    spec = get_metric(name)
    args = data.draw(INPUTS[spec.kind])
    _, f = transform
    moved = tuple(f(a) if i in MONOTONE_ARGS[spec.kind] else a for i, a in enumerate(args))
    _assert_same(_call(spec.func, *moved), _call(spec.func, *args), name)


@pytest.mark.parametrize("name", TEMPERATURE)
@settings(max_examples=20)
@given(data=strategies.grid_logits_and_labels(), t=st.floats(0.05, 20.0))
def test_temperature_invariance(name, data, t):
    from uqmetrics import softmax

    # logits on a 0.25 grid in [-8, 8]: for T in [0.05, 20] distinct logits keep distinct,
    # non-underflowing probabilities
    labels, z = data
    func = get_metric(name).func
    _assert_same(_call(func, labels, softmax(z, temperature=t)), _call(func, labels, softmax(z)),
                 name)


# ---------------------------------------------------------------------- proper scoring rules


def _expected_classification(func, p: np.ndarray, q: np.ndarray) -> tuple[float, float]:
    """``E_{y ~ p} S(q, y) = sum_c p_c S(q, c)``, exact (one single-sample score per class)."""
    scores = [func(np.array([c]), q[None, :]) for c in range(p.size)]
    return float(np.dot(p, scores)), 0.0


def _expected_regression(func, truth: tuple[float, float], forecast: tuple[float, float],
                         nodes: tuple[int, int] = (60, 120)) -> tuple[float, float]:
    """``E_{y ~ N(mu, s^2)} S(N(m, t^2), y)`` by Gauss-Hermite quadrature with ``nodes[1]``
    nodes, and the quadrature error estimated as the change from ``nodes[0]`` nodes."""
    (mu, s), (m, t) = truth, forecast
    values = []
    for n in nodes:
        x, w = hermegauss(n)  # integrates f(x) exp(-x^2 / 2)
        scores = [func(np.array([mu + s * xi]), np.array([m]), np.array([t])) for xi in x]
        values.append(float(np.dot(w, scores)) / math.sqrt(2 * math.pi))
    return values[1], abs(values[1] - values[0])


@st.composite
def _classification_truth_and_forecast(draw):
    c = draw(st.integers(2, 6))
    z = draw(st.lists(st.lists(st.floats(-4, 4), min_size=c, max_size=c), min_size=2,
                      max_size=2))
    p, q = (np.exp(np.array(v)) / np.exp(np.array(v)).sum() for v in z)
    assume(np.abs(p - q).max() > 1e-3)
    return p, q


@st.composite
def _regression_truth_and_forecast(draw):
    mu = draw(st.floats(-5, 5))
    s = draw(st.floats(0.25, 4.0))
    shift = draw(st.floats(-3, 3))       # forecast mean mu + shift * s
    log_ratio = draw(st.floats(math.log(0.25), math.log(4.0)))  # forecast std s * exp(.)
    assume(abs(shift) > 1e-3 or abs(log_ratio) > 1e-3)
    return (mu, s), (mu + shift * s, s * math.exp(log_ratio))


#: kind -> (strategy of (truth, forecast), exact expected score (func, truth, forecast)).
EXPECTED_SCORE = {
    "classification": (_classification_truth_and_forecast(), _expected_classification),
    "regression": (_regression_truth_and_forecast(), _expected_regression),
}


def _assert_truth_scores_best(func, greater_is_better, expected, truth, forecast, name):
    e_true, err_true = expected(func, truth, truth)
    e_other, err_other = expected(func, truth, forecast)
    margin = (e_true - e_other) if greater_is_better else (e_other - e_true)
    assert margin > 4 * (err_true + err_other), (
        f"{name}: expected score of the truth {e_true!r} is not better than that of "
        f"{forecast!r}: {e_other!r} (quadrature error {err_true + err_other:.2g})")


@pytest.mark.parametrize("name", PROPER)
@settings(max_examples=30)
@given(data=st.data())
def test_proper_scoring_rule(name, data):
    spec = get_metric(name)
    strategy, expected = EXPECTED_SCORE[spec.kind]
    truth, forecast = data.draw(strategy)
    _assert_truth_scores_best(spec.func, spec.greater_is_better, expected, truth, forecast, name)


def test_proper_scoring_check_catches_an_improper_score():
    """The linear score ``-q_y`` rewards over-confidence; the generic check must reject it."""
    def linear_loss(labels, probs):
        return float(-np.mean(probs[np.arange(labels.size), labels]))

    p, q = np.array([0.6, 0.4]), np.array([1.0, 0.0])
    with pytest.raises(AssertionError, match="is not better"):
        _assert_truth_scores_best(linear_loss, False, _expected_classification, p, q, "linear")

    def absolute_error(y, mean, std):  # ignores std entirely: no forecast std is preferred
        return float(np.mean(np.abs(y - mean)))

    with pytest.raises(AssertionError, match="is not better"):
        _assert_truth_scores_best(absolute_error, False, _expected_regression, (0.0, 1.0),
                                  (0.0, 2.0), "absolute_error")


# ------------------------------------------------------------------ S.2: AUROC, AURC, E-AURC


@given(strategies.correct_and_confidence(ties=False))
def test_auroc_of_perfect_ranking_is_one(data):
    c, _ = data
    perfect = c + np.linspace(0, 0.5, c.size)  # any κ with every correct above every wrong
    assert auroc_score(c, perfect) == 1.0
    assert auroc_score(c, -perfect) == 0.0


@given(strategies.correct_and_confidence(), st.floats(-10, 10))
def test_auroc_of_constant_confidence_is_half(data, value):
    c, _ = data
    assert auroc_score(c, np.full(c.size, value)) == 0.5


@given(strategies.correct_and_confidence(both_classes=False))
def test_eaurc_nonnegative(data):
    c, k = data
    assert eaurc_loss(c, k) >= -1e-12


@given(strategies.correct_and_confidence(both_classes=False))
def test_eaurc_zero_for_perfect_ranking(data):
    c, k = data
    perfect = np.where(c, 2.0 + k, k)  # k in [0, 1]: correct strictly above wrong, ties kept
    assert eaurc_loss(c, perfect) == pytest.approx(0.0, abs=1e-12)


@given(strategies.correct_and_confidence(both_classes=False), st.integers(0, 2**32 - 1))
def test_aurc_independent_of_tie_order(data, seed):
    """Reordering the samples inside each tied block gives exactly the same AURC."""
    c, k = data
    rng = np.random.default_rng(seed)
    order = np.lexsort((rng.random(c.size), k))  # sorted by κ, ties in random order
    assert aurc_loss(c[order], k[order]) == aurc_loss(c, k)
    # errors first vs errors last inside every tied block
    first = np.lexsort((c, k))
    last = np.lexsort((~c, k))
    assert aurc_loss(c[first], k[first]) == aurc_loss(c[last], k[last])
