"""Distribution-shift metrics: corruption errors, ReaL accuracy, masked accuracy
(docs/conventions.md#s-7)."""

import doctest
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import uqmetrics.metrics.shift
from uqmetrics import (
    UndefinedMetricWarning,
    corruption_error,
    masked_accuracy,
    mean_corruption_error,
    real_accuracy,
    relative_mean_corruption_error,
)
from uqmetrics.metrics.registry import list_metrics

# 2 corruptions x 5 severities, worked by hand:
#   corruption 0: sum E = 0.1+0.2+0.3+0.4+0.5 = 1.5, sum E_base = 0.3+...+0.7 = 2.5, CE = 0.6
#   corruption 1: sum E = 5 x 0.2 = 1.0,              sum E_base = 5 x 0.5 = 2.5,    CE = 0.4
#   mCE = (0.6 + 0.4) / 2 = 0.5
ERR = np.array([[0.1, 0.2, 0.3, 0.4, 0.5], [0.2, 0.2, 0.2, 0.2, 0.2]])
BASE = np.array([[0.3, 0.4, 0.5, 0.6, 0.7], [0.5, 0.5, 0.5, 0.5, 0.5]])


def test_doctests():
    result = doctest.testmod(uqmetrics.metrics.shift)
    assert result.attempted >= 5 and result.failed == 0


def test_module_is_exported_and_not_registered():
    assert "shift" in uqmetrics.metrics.METRIC_MODULES
    assert set(uqmetrics.metrics.shift.__all__) <= set(uqmetrics.__all__)
    for name in uqmetrics.metrics.shift.__all__:
        assert name not in list_metrics()
        assert uqmetrics.CONVENTIONS[name].startswith("S.7: ")


# ------------------------------------------------------------------------ corruption errors


def test_corruption_error_hand_case():
    assert corruption_error(ERR[0], BASE[0]) == pytest.approx(0.6)
    assert corruption_error(ERR[1], BASE[1]) == pytest.approx(0.4)


def test_mean_corruption_error_hand_case():
    assert mean_corruption_error(ERR, BASE) == pytest.approx(0.5)
    # normalised per corruption, not a ratio of grand totals (2.5 / 5.0 = 0.5 here too, so
    # check a case where they differ): CE = 0.1/0.2 = 0.5 and 0.9/0.9 = 1 -> 0.75, not 1/1.1
    assert mean_corruption_error([[0.1], [0.9]], [[0.2], [0.9]]) == pytest.approx(0.75)


def test_relative_mean_corruption_error_hand_case():
    # clean 0.1, baseline clean 0.3:
    #   corruption 0: (1.5 - 5 x 0.1) / (2.5 - 5 x 0.3) = 1.0 / 1.0 = 1.0
    #   corruption 1: (1.0 - 0.5) / (2.5 - 1.5) = 0.5
    assert relative_mean_corruption_error(ERR, 0.1, BASE, 0.3) == pytest.approx(0.75)
    # a model that gets better under corruption has a negative relative CE
    assert relative_mean_corruption_error([[0.1]], 0.2, [[0.5]], 0.3) == pytest.approx(-0.5)


@pytest.mark.parametrize("baseline_errors", [
    [[0.6] * 5, [0.5] * 5],  # corruption 1 adds nothing to the baseline's clean error 0.5
    [[0.6] * 5, [0.4, 0.4, 0.6, 0.5, 0.5]],  # nor on the sum: -0.1 -0.1 +0.1 0 0 = -0.1
])
def test_relative_mce_is_nan_with_a_warning_when_the_baseline_is_not_degraded(
        baseline_errors):
    with pytest.warns(UndefinedMetricWarning, match=r"relative mCE is undefined: "
                                                     r"baseline_errors of corruption 1 do not "
                                                     r"exceed baseline_clean_error 0.5"):
        value = relative_mean_corruption_error(ERR, 0.1, baseline_errors, 0.5)
    assert np.isnan(value)
    # the plain mCE of the same errors is still defined
    assert np.isfinite(mean_corruption_error(ERR, baseline_errors))


def test_relative_mce_is_defined_when_every_denominator_is_positive():
    # corruption 1 of the case above with one more error at one severity: (0.6 - 0.5) > 0
    # model: corruption 0 (1.5 - 0.5) / (3.0 - 2.5) = 2.0, corruption 1 (1.0 - 0.5) / 0.1 = 5.0
    base = [[0.6] * 5, [0.5, 0.5, 0.5, 0.5, 0.6]]
    assert relative_mean_corruption_error(ERR, 0.1, base, 0.5) == pytest.approx(3.5)


def test_corruption_errors_accept_torch_like_inputs():
    assert mean_corruption_error(ERR.tolist(), BASE.astype(np.float32)) == pytest.approx(0.5)


error_tables = st.tuples(st.integers(1, 6), st.integers(1, 5)).flatmap(
    lambda shape: st.tuples(
        hnp.arrays(np.float64, shape, elements=st.floats(0.0, 0.5)),
        hnp.arrays(np.float64, shape, elements=st.floats(0.01, 1.0)),
    ))


@given(error_tables)
def test_mce_of_the_baseline_against_itself_is_one(tables):
    _, base = tables
    assert mean_corruption_error(base, base) == pytest.approx(1.0, rel=1e-12)
    assert corruption_error(base[0], base[0]) == pytest.approx(1.0, rel=1e-12)


@given(error_tables, st.randoms(use_true_random=False))
def test_mce_is_invariant_to_permuting_corruptions(tables, rnd):
    err, base = tables
    perm = list(range(err.shape[0]))
    rnd.shuffle(perm)
    assert mean_corruption_error(err[perm], base[perm]) == pytest.approx(
        mean_corruption_error(err, base), rel=1e-12, abs=1e-15)


@given(error_tables, st.floats(0.0, 2.0))
def test_scaling_errors_scales_ce(tables, factor):
    err, base = tables  # err <= 0.5, so factor * err stays in [0, 1]
    assert corruption_error(factor * err[0], base[0]) == pytest.approx(
        factor * corruption_error(err[0], base[0]), rel=1e-12, abs=1e-15)
    assert mean_corruption_error(factor * err, base) == pytest.approx(
        factor * mean_corruption_error(err, base), rel=1e-12, abs=1e-15)


@given(error_tables)
def test_relative_mce_with_zero_clean_errors_is_mce(tables):
    err, base = tables
    assert relative_mean_corruption_error(err, 0.0, base, 0.0) == pytest.approx(
        mean_corruption_error(err, base), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(("call", "match"), [
    (lambda: corruption_error(ERR[0], BASE[0, :4]),
     r"baseline_errors must have the same shape as errors \(5,\)"),
    (lambda: corruption_error(ERR, BASE), r"errors must have shape \(n_severities,\)"),
    (lambda: corruption_error([0.1, 1.2], [0.5, 0.5]), r"errors must be error rates in \[0, 1\]"),
    (lambda: corruption_error([0.1, 0.2], [0.5, -0.1]),
     r"baseline_errors must be error rates in \[0, 1\], got -0.1 at index \(1,\)"),
    (lambda: corruption_error([0.1, 0.2], [0.0, 0.0]),
     r"baseline_errors of corruption 0 must have a positive sum"),
    (lambda: corruption_error([0.1, np.nan], [0.5, 0.5]), r"errors contains non-finite"),
    (lambda: corruption_error([], []), r"errors is empty"),
    (lambda: mean_corruption_error(ERR[0], BASE[0]),
     r"errors must have shape \(n_corruptions, n_severities\)"),
    (lambda: mean_corruption_error(ERR, BASE[:, :3]),
     r"baseline_errors must have the same shape as errors \(2, 5\)"),
    (lambda: mean_corruption_error(ERR, np.vstack([BASE[0], np.zeros(5)])),
     r"baseline_errors of corruption 1 must have a positive sum"),
    (lambda: mean_corruption_error(ERR, [["a"] * 5] * 2), r"baseline_errors must be numeric"),
    (lambda: relative_mean_corruption_error(ERR, 1.5, BASE, 0.3),
     r"clean_error must lie in \[0.0, 1.0\]"),
    (lambda: relative_mean_corruption_error(ERR, 0.1, BASE, None),
     r"baseline_clean_error must be a number"),
    (lambda: relative_mean_corruption_error(ERR, 0.1, BASE[:1], 0.3),
     r"baseline_errors must have the same shape as errors"),
    (lambda: relative_mean_corruption_error(-ERR, 0.1, BASE, 0.3),
     r"errors must be error rates in \[0, 1\]"),
])
def test_corruption_errors_refuse_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---------------------------------------------------------------------------- ReaL accuracy

# 5 images, 4 classes; image 2 has no valid label and is left out:
#   image 0: {0},    predicted 0 -> right
#   image 1: {1, 2}, predicted 2 -> right
#   image 2: {},     predicted 1 -> left out
#   image 3: {3},    predicted 0 -> wrong
#   image 4: {0, 3}, predicted 3 -> right          ReaL accuracy = 3 / 4
SETS = np.array([[1, 0, 0, 0], [0, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 1], [1, 0, 0, 1]],
                dtype=bool)
PREDS = np.array([0, 2, 1, 0, 3])


def test_real_accuracy_hand_case():
    assert real_accuracy(PREDS, SETS) == 0.75
    assert real_accuracy(PREDS, SETS.astype(int)) == 0.75


def test_real_accuracy_from_scores_takes_the_first_maximum():
    probs = np.full((5, 4), 0.1)
    probs[np.arange(5), PREDS] = 0.7
    assert real_accuracy(probs, SETS) == 0.75
    # a tie between classes 0 and 3 goes to class 0: image 3 ({3}) stays wrong
    probs[3] = [0.5, 0.0, 0.0, 0.5]
    assert real_accuracy(probs, SETS) == 0.75
    assert real_accuracy(np.log(probs + 1e-9), SETS) == 0.75  # logits: same arg-max


def test_real_accuracy_with_no_label_is_nan_with_warning():
    with pytest.warns(UndefinedMetricWarning, match="none of the 2 images has a valid label"):
        assert math.isnan(real_accuracy([0, 1], np.zeros((2, 3), dtype=bool)))


@given(hnp.arrays(bool, st.tuples(st.integers(1, 30), st.integers(2, 6))), st.data())
def test_real_accuracy_equals_the_reference_loop(sets, data):
    n, c = sets.shape
    preds = data.draw(hnp.arrays(np.int64, n, elements=st.integers(0, c - 1)))
    kept = [bool(sets[i, p]) for i, p in enumerate(preds) if sets[i].any()]
    if not kept:
        with pytest.warns(UndefinedMetricWarning):
            assert math.isnan(real_accuracy(preds, sets))
    else:
        assert real_accuracy(preds, sets) == pytest.approx(np.mean(kept))
        # with single-label sets and no empty set it is the ordinary accuracy
        assert real_accuracy(preds, np.eye(c, dtype=bool)[preds]) == 1.0


@pytest.mark.parametrize(("call", "match"), [
    (lambda: real_accuracy(PREDS[:4], SETS), r"predictions has 4, label_sets has 5"),
    (lambda: real_accuracy([0, 1, 4, 0, 0], SETS), r"predictions must lie in \[0, 4\), got 4"),
    (lambda: real_accuracy([0.5, 1, 2, 0, 0], SETS), r"predictions must be integers"),
    (lambda: real_accuracy(np.zeros((5, 3)), SETS), r"predictions must have 4 classes"),
    (lambda: real_accuracy(np.zeros((5, 4, 1)), SETS), r"predictions must have shape"),
    (lambda: real_accuracy(PREDS, SETS[0]), r"label_sets must have shape \(n_samples, n_classes\)"),
    (lambda: real_accuracy(PREDS, SETS * 2), r"label_sets must be boolean \(or 0/1\)"),
    (lambda: real_accuracy(PREDS, None), r"label_sets must be an array, got None"),
    (lambda: real_accuracy(np.full((5, 4), np.nan), SETS), r"predictions contains non-finite"),
])
def test_real_accuracy_refuses_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# -------------------------------------------------------------------------- masked accuracy

# 4 classes, the mask keeps classes 1 and 2:
#   sample 0: logits [9, 1, 2, 0], label 2: unmasked arg-max 0 (outside), masked 2 -> right
#   sample 1: logits [0, 1, 0, 8], label 1: unmasked arg-max 3 (outside), masked 1 -> right
#   sample 2: logits [0, 3, 4, 0], label 1: masked arg-max 2 -> wrong   accuracy = 2 / 3
LOGITS = np.array([[9.0, 1.0, 2.0, 0.0], [0.0, 1.0, 0.0, 8.0], [0.0, 3.0, 4.0, 0.0]])
LABELS = np.array([2, 1, 1])
MASK = np.array([False, True, True, False])


def test_masked_accuracy_hand_case():
    assert masked_accuracy(LABELS, LOGITS, MASK) == pytest.approx(2 / 3)
    assert masked_accuracy(LABELS, LOGITS, np.ones(4, dtype=bool)) == 0.0  # unmasked
    probs = np.exp(LOGITS) / np.exp(LOGITS).sum(axis=1, keepdims=True)
    assert masked_accuracy(LABELS, probs, MASK.astype(int)) == pytest.approx(2 / 3)


def test_masked_accuracy_ties_go_to_the_lowest_masked_class():
    z = np.array([[5.0, 1.0, 1.0, 5.0]])
    assert masked_accuracy([1], z, MASK) == 1.0
    assert masked_accuracy([2], z, MASK) == 0.0


@given(st.integers(2, 8), st.data())
def test_masked_accuracy_equals_argmax_over_the_subset(c, data):
    mask = data.draw(hnp.arrays(bool, c).filter(lambda m: m.any()))
    classes = np.flatnonzero(mask)
    n = data.draw(st.integers(1, 20))
    z = data.draw(hnp.arrays(np.float64, (n, c), elements=st.floats(-5, 5)))
    sub = data.draw(hnp.arrays(np.int64, n, elements=st.integers(0, classes.size - 1)))
    expected = np.mean(np.argmax(z[:, classes], axis=1) == sub)  # subset-numbered labels
    assert masked_accuracy(classes[sub], z, mask) == pytest.approx(expected)


@pytest.mark.parametrize(("call", "match"), [
    (lambda: masked_accuracy([2, 1, 0], LOGITS, MASK),
     r"labels must lie inside mask: sample 2 has label 0, which mask excludes \(1 such"),
    (lambda: masked_accuracy([2, 3, 0], LOGITS, MASK),
     r"labels must lie inside mask: sample 1 has label 3"),
    (lambda: masked_accuracy([2, 1, 4], LOGITS, MASK), r"labels must lie in \[0, 4\), got 4"),
    (lambda: masked_accuracy([2, 1], LOGITS, MASK), r"labels has 2, logits_or_probs has 3"),
    (lambda: masked_accuracy(LABELS, LOGITS, MASK[:3]),
     r"mask must have one entry per class of logits_or_probs \(4\), got shape \(3,\)"),
    (lambda: masked_accuracy(LABELS, LOGITS, np.zeros(4, dtype=bool)),
     r"mask must select at least one class"),
    (lambda: masked_accuracy(LABELS, LOGITS, [0, 2, 1, 0]), r"mask must be boolean"),
    (lambda: masked_accuracy(LABELS, LOGITS, MASK[None]), r"mask must have shape \(n_classes,\)"),
    (lambda: masked_accuracy(LABELS, LOGITS[0], MASK), r"logits_or_probs must have shape"),
    (lambda: masked_accuracy(LABELS, np.full((3, 4), np.inf), MASK),
     r"logits_or_probs contains non-finite"),
])
def test_masked_accuracy_refuses_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
