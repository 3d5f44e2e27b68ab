"""Confidence and uncertainty functions (docs/conventions.md#s-2)."""

import doctest
import math

import numpy as np
import pytest
from hypothesis import given
from scipy.special import softmax

import uqmetrics.metrics.confidence
from uqmetrics import (
    CONFIDENCE_FUNCTIONS,
    SAMPLE_CONFIDENCE_FUNCTIONS,
    entropy,
    expected_entropy,
    get_confidence_function,
    margin,
    mutual_information,
    negative_entropy,
    predictive_entropy,
    softmax_response,
)
from uqmetrics.runs.testing import strategies

PROBS = np.array([[0.7, 0.2, 0.1], [0.25, 0.5, 0.25], [1.0, 0.0, 0.0]])


def test_hand_values():
    np.testing.assert_allclose(softmax_response(PROBS), [0.7, 0.5, 1.0])
    np.testing.assert_allclose(margin(PROBS), [0.5, 0.25, 1.0])
    h = [-(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1)),
         -(0.5 * math.log(0.25) + 0.5 * math.log(0.5)), 0.0]
    np.testing.assert_allclose(entropy(PROBS), h, rtol=1e-14)
    np.testing.assert_allclose(negative_entropy(PROBS), -np.array(h), rtol=1e-14)
    assert entropy(PROBS)[2] == 0.0 and not np.signbit(entropy(PROBS)[2])  # 0·log 0 = 0


def test_softmax_response_in_float64():
    logits = np.array([[20.0, 0.0], [25.0, 0.0]], dtype=np.float32)
    # in float32 both saturate at 1: a spurious tie in κ
    assert softmax(logits, axis=1).max(axis=1)[0] == softmax(logits, axis=1).max(axis=1)[1]
    sr = softmax_response(logits, from_logits=True)
    assert sr.dtype == np.float64
    assert sr[0] < sr[1] < 1.0
    np.testing.assert_allclose(1 - sr, [1 / (1 + np.exp(20.0)), 1 / (1 + np.exp(25.0))], rtol=1e-4)


@given(strategies.logits_and_labels())
def test_from_logits_equals_softmax_first(data):
    _, z = data
    p = softmax(z, axis=1)
    for f in (softmax_response, margin, entropy, negative_entropy):
        np.testing.assert_allclose(f(z, from_logits=True), f(p), rtol=1e-10, atol=1e-12)


@given(strategies.probs_and_labels(max_c=8))
def test_entropy_bounds(data):
    _, p = data
    h = entropy(p)
    assert np.all(h >= 0) and np.all(h <= math.log(p.shape[1]) + 1e-12)


@pytest.mark.parametrize("c", [2, 3, 10])
def test_entropy_extremes(c):
    assert entropy(np.full((1, c), 1 / c))[0] == pytest.approx(math.log(c), rel=1e-14)
    assert entropy(np.eye(c)).tolist() == [0.0] * c


@given(strategies.member_probs())
def test_mutual_information_nonnegative_and_decomposition(mp):
    mi = mutual_information(mp)
    assert mi.shape == (mp.shape[1],)
    assert np.all(mi >= 0) and np.all(mi <= math.log(mp.shape[2]) + 1e-12)
    np.testing.assert_allclose(predictive_entropy(mp), expected_entropy(mp) + mi, atol=1e-12)


@given(strategies.member_probs(min_members=2))
def test_mutual_information_zero_for_identical_members(mp):
    same = np.broadcast_to(mp[0], mp.shape)
    np.testing.assert_allclose(mutual_information(same), 0.0, atol=1e-12)
    np.testing.assert_allclose(predictive_entropy(same), entropy(mp[0]), atol=1e-12)


def test_mutual_information_hand_case():
    # two confident members that disagree: H(mean) = ln 2, mean H = 0
    mp = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])
    assert mutual_information(mp)[0] == pytest.approx(math.log(2), rel=1e-14)
    assert expected_entropy(mp)[0] == 0.0


@given(strategies.member_probs(min_members=2))
def test_sample_axis_is_averaged(mp):
    mean = mp.mean(axis=0)
    for f in (softmax_response, margin, entropy):
        np.testing.assert_allclose(f(mp), f(mean), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(entropy(mp), predictive_entropy(mp), rtol=1e-12, atol=1e-15)


# a confident sample (members agree on a peaked distribution) and an uncertain one (members
# each peaked on a different class): every confidence function must rank the first higher
MEMBERS = np.array([
    [[0.98, 0.01, 0.01], [0.6, 0.2, 0.2]],
    [[0.98, 0.01, 0.01], [0.2, 0.6, 0.2]],
    [[0.98, 0.01, 0.01], [0.2, 0.2, 0.6]],
])


@pytest.mark.parametrize("name", sorted(CONFIDENCE_FUNCTIONS))
def test_confidence_functions_higher_is_more_confident(name):
    kappa = get_confidence_function(name)(MEMBERS)
    assert kappa.shape == (2,) and kappa[0] > kappa[1]
    if name not in SAMPLE_CONFIDENCE_FUNCTIONS:  # single-distribution functions accept (n, C)
        assert get_confidence_function(name)(MEMBERS[0]).shape == (2,)


def test_sample_functions_are_registered_names():
    assert SAMPLE_CONFIDENCE_FUNCTIONS <= set(CONFIDENCE_FUNCTIONS)
    for name, f in CONFIDENCE_FUNCTIONS.items():
        assert f.__name__ == name


@pytest.mark.parametrize("name", sorted(SAMPLE_CONFIDENCE_FUNCTIONS))
def test_sample_functions_require_the_sample_axis(name):
    with pytest.raises(ValueError, match="member_probs must have shape"):
        get_confidence_function(name)(PROBS)


def test_bad_input():
    with pytest.raises(ValueError, match="name must be one of"):
        get_confidence_function("max_logit")
    with pytest.raises(ValueError, match="probs rows must sum to 1"):
        softmax_response([[0.5, 0.6]])
    with pytest.raises(ValueError, match="probs must have shape"):
        entropy([0.5, 0.5])
    with pytest.raises(ValueError, match="probs is empty"):
        margin(np.empty((0, 3)))
    with pytest.raises(ValueError, match="probs contains non-finite"):
        entropy([[np.nan, 1.0]], from_logits=True)
    with pytest.raises(ValueError, match="at least 2 classes"):
        margin([[1.0]])
    with pytest.raises(ValueError, match=r"member_probs\[1\] rows must sum to 1"):
        mutual_information([[[0.5, 0.5]], [[0.5, 0.6]]])
    with pytest.raises(ValueError, match="member_probs must have shape"):
        predictive_entropy(PROBS)
    with pytest.raises(TypeError, match="from_logits"):
        softmax_response(PROBS, from_logits="yes")


def test_doctests():
    result = doctest.testmod(uqmetrics.metrics.confidence)
    assert result.attempted > 0 and result.failed == 0
