"""Tests of uqmetrics.metrics.classification: golden values (docs/conventions.md#s-2), hand-computed bin
cases, scikit-learn cross-checks, properties and input validation."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from sklearn import metrics as sk

from uqmetrics.metrics import classification
from uqmetrics.metrics.classification import (
    accuracy_score,
    adaptive_calibration_error,
    assign_bins,
    bin_edges,
    brier_loss,
    confidence_calibration_error,
    expected_calibration_error,
    maximum_calibration_error,
    nll_loss,
    reliability_diagram,
    static_calibration_error,
    top_k_accuracy_score,
)
from uqmetrics.metrics.registry import get_metric
from uqmetrics.runs.testing import examples
from uqmetrics.runs.testing.strategies import probs_and_labels

# ----------------------------------------------------------------------------------------------
# Golden values: the worked examples of docs/conventions.md#s-2 (Selective paper, Appendix C)
# ----------------------------------------------------------------------------------------------


def test_model_a_golden_values():
    labels, probs, _, _ = examples.model_a()
    # NLL = -(0.95 log 0.95 + 0.05 log 0.025), printed 0.23
    assert round(nll_loss(labels, probs), 2) == 0.23
    assert nll_loss(labels, probs) == pytest.approx(0.233173, abs=1e-6)
    # Brier = 0.95 * (0.05^2 + 2 * 0.025^2) + 0.05 * (0.95^2 + 0.975^2 + 0.025^2) = 0.09625
    assert round(brier_loss(labels, probs), 3) == 0.096
    assert brier_loss(labels, probs) == pytest.approx(0.09625, abs=1e-12)
    # a single bin with accuracy 0.95 and confidence 0.95
    assert expected_calibration_error(labels, probs) == pytest.approx(0.0, abs=1e-12)
    assert accuracy_score(labels, probs) == pytest.approx(0.95)


def test_model_b_golden_values():
    labels, probs, _, _ = examples.model_b()
    # NLL = -(0.4 log 0.6 + 0.6 log 0.3), printed 0.93
    assert round(nll_loss(labels, probs), 2) == 0.93
    assert nll_loss(labels, probs) == pytest.approx(0.926714, abs=1e-6)
    # Brier = 0.4 * (0.4^2 + 2 * 0.2^2) + 0.6 * (0.4^2 + 0.7^2 + 0.3^2) = 0.54
    assert brier_loss(labels, probs) == pytest.approx(0.54, abs=1e-12)
    # bins (8/15, 9/15] (acc 1, conf 0.6, weight 0.4) and (5/15, 6/15] (acc 0, conf 0.4, 0.6)
    assert expected_calibration_error(labels, probs) == pytest.approx(0.4, abs=1e-12)
    assert maximum_calibration_error(labels, probs) == pytest.approx(0.4, abs=1e-12)
    assert accuracy_score(labels, probs) == pytest.approx(0.40)


def test_brier_normalize_divides_by_classes():
    labels, probs, _, _ = examples.model_b()
    assert brier_loss(labels, probs, normalize=True) == pytest.approx(0.54 / 3, abs=1e-12)


def test_nll_clips_at_eps():
    probs = np.array([[1.0, 0.0], [0.5, 0.5]])
    # -(log 1e-12 + log 0.5) / 2
    assert nll_loss([1, 0], probs) == pytest.approx(-(np.log(1e-12) + np.log(0.5)) / 2)
    assert nll_loss([1, 0], probs, eps=1e-3) == pytest.approx(-(np.log(1e-3) + np.log(0.5)) / 2)


# ----------------------------------------------------------------------------------------------
# Bins: left-open, right-closed; 0 in the first bin, 1.0 in the last
# ----------------------------------------------------------------------------------------------


def test_bin_assignment_edges_15_bins():
    e = bin_edges([0.5], n_bins=15)
    assert e[0] == 0.0 and e[-1] == 1.0 and e.shape == (16,)
    # 0 -> first bin, 1/15 closes the first bin, 0.6 == 9/15 closes bin 8, 1.0 -> last bin
    vals = [0.0, 1 / 15, np.nextafter(1 / 15, 1), 0.6, np.nextafter(0.6, 1), 1.0]
    assert assign_bins(vals, e).tolist() == [0, 0, 1, 8, 9, 14]


def test_ece_confidence_exactly_zero_and_one():
    # correct = [T, F, F], confidence = [0.0, 0.5, 1.0], M = 2 bins (0, 0.5], (0.5, 1]:
    # bin 0 holds 0.0 and 0.5 (right-closed): acc 1/2, conf 1/4 -> 1/4 * 2/3 = 1/6
    # bin 1 holds 1.0: acc 0, conf 1 -> 1 * 1/3. ECE = 1/2.
    # (Left-closed bins would give 1/3 + 3/4 * 2/3 = 5/6; dropping 0 would give another value.)
    correct, conf = [True, False, False], [0.0, 0.5, 1.0]
    assert confidence_calibration_error(correct, conf, n_bins=2) == pytest.approx(0.5, abs=1e-15)
    assert confidence_calibration_error(correct, conf, n_bins=2, norm="max") == pytest.approx(1.0)
    # l2: sqrt(2/3 * 1/16 + 1/3 * 1)
    assert confidence_calibration_error(correct, conf, n_bins=2, norm="l2") == pytest.approx(
        np.sqrt(2 / 3 / 16 + 1 / 3))


def test_ece_with_an_empty_bin_is_skipped():
    # Same data, M = 4: 0.0 -> bin 0, 0.5 -> bin 1 ((0.25, 0.5]), bin 2 empty, 1.0 -> bin 3.
    # ECE = 1/3 * |1 - 0| + 1/3 * |0 - 0.5| + 1/3 * |0 - 1| = 5/6
    correct, conf = [True, False, False], [0.0, 0.5, 1.0]
    assert confidence_calibration_error(correct, conf, n_bins=4) == pytest.approx(5 / 6)


def test_reliability_diagram_hand_case():
    # rows: tie [0.5, 0.5] -> predicted class 0 (first max), label 1 -> wrong, conf 0.5;
    # [1, 0] label 0 -> right, conf 1.0; [0.3, 0.7] label 1 -> right, conf 0.7.
    probs = np.array([[0.5, 0.5], [1.0, 0.0], [0.3, 0.7]])
    labels = np.array([1, 0, 1])
    rd = reliability_diagram(labels, probs, n_bins=4)
    assert isinstance(rd, xr.Dataset) and rd.sizes == {"bin": 4}
    np.testing.assert_array_equal(rd["count"].values, [0, 1, 1, 1])
    np.testing.assert_array_equal(rd["lower"].values, [0, 0.25, 0.5, 0.75])
    np.testing.assert_array_equal(rd["upper"].values, [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(rd["accuracy"].values, [np.nan, 0, 1, 1])
    np.testing.assert_allclose(rd["confidence"].values, [np.nan, 0.5, 0.7, 1.0])
    ece = (0.5 + 0.3 + 0.0) / 3
    assert rd.attrs["ece"] == pytest.approx(ece)
    assert expected_calibration_error(labels, probs, n_bins=4) == pytest.approx(ece)
    assert maximum_calibration_error(labels, probs, n_bins=4) == pytest.approx(0.5)
    assert rd.attrs["mce"] == pytest.approx(0.5)


def test_argmax_ties_pick_first_class():
    probs = np.array([[0.5, 0.5, 0.0], [0.25, 0.375, 0.375]])
    assert accuracy_score([0, 1], probs) == 1.0
    assert accuracy_score([1, 2], probs) == 0.0
    assert top_k_accuracy_score([1, 2], probs, k=2) == 1.0
    assert top_k_accuracy_score([2, 0], probs, k=2) == 0.0


def test_equal_mass_ece_hand_case():
    # confidences 0.6 (wrong), 0.7, 0.8, 0.9 (right); 2 equal-mass bins split at 0.75:
    # {0.6, 0.7}: acc 1/2, conf 0.65 -> 0.15; {0.8, 0.9}: acc 1, conf 0.85 -> 0.15. ECE = 0.15.
    # Equal-width bins put everything into (0.5, 1]: acc 0.75 = conf 0.75 -> ECE 0.
    probs = np.array([[0.6, 0.4], [0.7, 0.3], [0.2, 0.8], [0.9, 0.1]])
    labels = np.array([1, 0, 1, 0])
    np.testing.assert_allclose(bin_edges(probs.max(1), n_bins=2, strategy="quantile"),
                               [0, 0.75, 1])
    assert expected_calibration_error(labels, probs, n_bins=2, strategy="quantile") == \
        pytest.approx(0.15)
    assert expected_calibration_error(labels, probs, n_bins=2) == pytest.approx(0.0, abs=1e-12)
    assert maximum_calibration_error(labels, probs, n_bins=2, strategy="quantile") == \
        pytest.approx(0.15)
    rd = reliability_diagram(labels, probs, n_bins=2, strategy="quantile")
    np.testing.assert_array_equal(rd["count"].values, [2, 2])


def test_equal_mass_bins_have_equal_counts():
    rng = np.random.default_rng(0)
    v = rng.uniform(size=60)
    e = bin_edges(v, n_bins=6, strategy="quantile")
    assert np.bincount(assign_bins(v, e), minlength=6).tolist() == [10] * 6


# Three-class hand case for the classwise errors (M = 2 bins, edges 0, 0.5, 1).
_LABELS3 = np.array([0, 1, 2])
_PROBS3 = np.array([[0.6, 0.4, 0.0], [0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])


def test_sce_hand_case():
    # class 0: p = .6 (label) | .2, .1 -> (|1 - .6| + |0 - .3|) / 3 = 0.7 / 3
    # class 1: p = .4, .3 (label), .1 all in (0, .5]: |1 - .8| / 3 = 0.2 / 3
    # class 2: p = 0 (first bin), .5 (right-closed: first bin) | .8 (label): (.5 + .2) / 3
    # SCE = mean over classes = (0.7 + 0.2 + 0.7) / 9
    assert static_calibration_error(_LABELS3, _PROBS3, n_bins=2) == pytest.approx(1.6 / 9)


def test_ace_and_tace_hand_case():
    # ACE, 2 equal-count index bins per class over the p > 0: floor(n_k / 2) sorted predictions,
    # the rest in the last bin (3 -> 1 + 2; 2 -> 1 + 1):
    # class 0: {.1} acc 0 (w 1/3), {.2, .6} acc 1/2 conf .4 (w 2/3): (.1 + .2) / 3 = 3/30
    # class 1: {.1} acc 0 (w 1/3), {.3, .4} acc 1/2 conf .35 (w 2/3): (.1 + .3) / 3 = 4/30
    # class 2: p = 0 is not > 0; {.5} acc 0, {.8} acc 1, each w 1/3: (.5 + .2) / 3 = 7/30
    assert adaptive_calibration_error(_LABELS3, _PROBS3, n_bins=2) == pytest.approx(14 / 90)
    # TACE (p > 1e-3) selects the same predictions here, and the mean over the C = 3 classes
    tace = adaptive_calibration_error(_LABELS3, _PROBS3, n_bins=2, threshold=1e-3)
    assert tace == pytest.approx(14 / 90)
    # per-class weights |B|/n_k (n_2 = 2): class 2 gives (.5 + .2) / 2 = 10.5/30
    per_class = adaptive_calibration_error(_LABELS3, _PROBS3, n_bins=2, threshold=1e-3,
                                           weighting="class")
    assert per_class == pytest.approx(17.5 / 90)
    # the quantile (median) split 2 + 1 of the former convention gave 24/90
    # where every class selects all n predictions (no p = 0) the two weightings agree
    p = np.random.default_rng(0).dirichlet(np.ones(3), size=20)
    y = np.arange(20) % 3
    assert adaptive_calibration_error(y, p, n_bins=4, weighting="class") == pytest.approx(
        adaptive_calibration_error(y, p, n_bins=4), rel=1e-12)
    assert get_metric("tace").func(_LABELS3, _PROBS3) == pytest.approx(
        adaptive_calibration_error(_LABELS3, _PROBS3, threshold=1e-3))
    assert get_metric("ace").func(_LABELS3, _PROBS3) == pytest.approx(
        adaptive_calibration_error(_LABELS3, _PROBS3))


def official_index_binning(labels, probs, n_bins=15, threshold=1e-3):
    """Ashukha et al.'s TACE/ACE binning (pytorch-ensembles ``metrics.get_tace``; ``get_ace`` is
    the same at threshold 0), restated here as a reference: for each class, keep the
    predictions strictly above the threshold, sort them (ties: other classes' labels first,
    uqmetrics' order for ties), give each of the first R - 1 bins floor(n_k / R) consecutive
    predictions and the last bin all the rest; add |B| |acc - conf| / (n C) for every
    non-empty bin."""
    n, c = probs.shape
    total = 0.0
    for k in range(c):
        kept = sorted((float(probs[i, k]), bool(labels[i] == k)) for i in range(n)
                      if probs[i, k] > threshold)
        size = len(kept) // n_bins
        for r in range(n_bins):
            chunk = kept[r * size:(r + 1) * size] if r < n_bins - 1 else kept[r * size:]
            if chunk:
                conf = sum(v for v, _ in chunk) / len(chunk)
                acc = sum(h for _, h in chunk) / len(chunk)
                total += len(chunk) * abs(acc - conf) / (n * c)
    return total


@st.composite
def tied_probs_and_labels(draw):
    """Probabilities on a coarse grid (many exact ties and zeros) and labels."""
    n = draw(st.integers(1, 60))
    c = draw(st.integers(2, 5))
    weights = draw(hnp.arrays(np.int64, (n, c), elements=st.integers(0, 3)))
    weights[:, 0] += weights.sum(axis=1) == 0  # no all-zero row
    labels = draw(hnp.arrays(np.int64, (n,), elements=st.integers(0, c - 1)))
    return labels, weights / weights.sum(axis=1, keepdims=True)


@given(data=st.one_of(probs_and_labels(), tied_probs_and_labels()), n_bins=st.integers(1, 20),
       threshold=st.sampled_from([0.0, 1e-3, 0.25]))
@settings(max_examples=200, deadline=None)
def test_ace_is_the_official_index_binning(data, n_bins, threshold):
    """ACE/TACE bin like Ashukha et al.'s code (index bins of floor(n_k/R), the remainder in
    the last, p > threshold strictly), on distinct and on tied predictions."""
    labels, probs = data
    if not (probs > threshold).any():
        return
    assert adaptive_calibration_error(labels, probs, n_bins=n_bins, threshold=threshold) == \
        pytest.approx(official_index_binning(labels, probs, n_bins, threshold), rel=1e-9,
                      abs=1e-15)


def test_ace_index_bins_split_ties_and_take_the_remainder_last():
    """Fixed cases where the former quantile edges differed: 10 predictions in R = 3 bins are
    3 + 3 + 4 by position (quantile edges: 4 + 3 + 3 here), 9 are 3 + 3 + 3; a tie of 4 equal
    predictions across a bin boundary is cut by position (quantile edges keep it in one bin);
    exact zeros (ACE) and predictions equal to the threshold (TACE) are left out. Each bin
    adds |B| |acc - conf| / (n C) = |hits - sum of p| / (n C)."""
    p1 = np.arange(10) / 10  # row i: p1 = i / 10 (row 0: p1 = 0, not selected by ACE)
    probs = np.column_stack([1 - p1, p1])
    labels = np.array([1, 1, 1, 0, 0, 0, 0, 0, 0, 1])
    # class 0 (10 selected), ascending rows 9-7 | 6-4 | 3-0: hits 2, 3, 1 against sums 0.6,
    # 1.5, 3.4; class 1 (9 selected), rows 1-3 | 4-6 | 7-9: hits 2, 0, 1 against 0.6, 1.5, 2.4
    gaps = 1.4 + 1.5 + 2.4 + 1.4 + 1.5 + 1.4
    assert adaptive_calibration_error(labels, probs, n_bins=3) == pytest.approx(gaps / 20,
                                                                                  rel=1e-12)
    assert official_index_binning(labels, probs, 3, 0.0) == pytest.approx(gaps / 20, rel=1e-12)
    # a tie of four 0.3's (class 1) and of four 0.7's (class 0) cut 2 + 2 at position 3 of 6
    p1 = np.array([0.1, 0.3, 0.3, 0.3, 0.3, 0.9])
    probs, labels = np.column_stack([1 - p1, p1]), np.array([0, 1, 0, 1, 0, 1])
    # class 1 sorted, misses first in the tie: .1 .3 .3 (0 hits, sum .7) | .3 .3 .9 (3, 1.5)
    # class 0: .1 .7 .7 (0 hits, sum 1.5) | .7 .7 .9 (3 hits, sum 2.3)
    gaps = 0.7 + 1.5 + 1.5 + 0.7
    assert adaptive_calibration_error(labels, probs, n_bins=2) == pytest.approx(gaps / 12,
                                                                                  rel=1e-12)
    assert official_index_binning(labels, probs, 2, 0.0) == pytest.approx(gaps / 12, rel=1e-12)
    # strict thresholds: p = 0 is not in ACE, p = 1e-3 is not in TACE (one bin each)
    probs = np.array([[1.0, 0.0], [0.5, 0.5], [1e-3, 1 - 1e-3]])
    labels = np.array([0, 1, 1])
    # ACE: class 0 {1, .5, .001}: 1 hit against 1.501; class 1 {.5, .999}: 2 against 1.499
    assert adaptive_calibration_error(labels, probs, n_bins=1) == pytest.approx(
        (0.501 + 0.501) / 6, rel=1e-12)
    # TACE leaves out class 0's 1e-3: {1, .5}: 1 hit against 1.5
    assert adaptive_calibration_error(labels, probs, n_bins=1, threshold=1e-3) == \
        pytest.approx((0.5 + 0.501) / 6, rel=1e-12)


def test_ace_with_fewer_predictions_than_bins_uses_the_last_bin():
    """n_k < R: floor(n_k/R) = 0, every prediction in the last bin (the other bins are empty
    and skipped; Ashukha et al.'s code would average an empty bin and return NaN)."""
    labels, probs = np.array([0, 1, 1]), np.array([[0.9, 0.1], [0.4, 0.6], [0.5, 0.5]])
    # class 0 {.9, .4, .5}: 1 hit against 1.8; class 1 {.1, .6, .5}: 2 against 1.2
    assert adaptive_calibration_error(labels, probs, n_bins=15) == pytest.approx(1.6 / 6)
    assert adaptive_calibration_error(labels, probs, n_bins=1) == pytest.approx(1.6 / 6)


def test_tace_is_ashukha_et_al_eq_2_as_their_code_computes_it():
    """TACE = (1/C) Σ_k Σ_r |B_rk|/n·|acc − conf| over the predictions > 1e-3 (Ashukha et al.
    2020, the code behind their figures). With one bin per class the bin holds every
    prediction > 1e-3, so the reference below is that formula written out; at C = 100 most of
    a class's predictions fall under the threshold, where per-class weights |B|/n_k would give
    n/n_k times the weight."""
    rng = np.random.default_rng(3)
    n, c = 400, 100
    p = rng.dirichlet(np.full(c, 0.05), size=n)
    y = np.array([rng.choice(c, p=row) for row in p])
    ref = 0.0
    for k in range(c):
        sel = p[:, k] > 1e-3
        if sel.any():
            ref += sel.sum() / n * abs(np.mean(y[sel] == k) - p[sel, k].mean()) / c
    assert adaptive_calibration_error(y, p, n_bins=1, threshold=1e-3) == pytest.approx(ref, rel=1e-12)
    per_class = adaptive_calibration_error(y, p, n_bins=1, threshold=1e-3, weighting="class")
    assert per_class > 2 * ref  # the per-class variant is not TACE


def test_ace_with_one_bin_per_class_equals_sce_with_one_bin():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(4), size=50)
    y = rng.integers(0, 4, size=50)
    assert adaptive_calibration_error(y, p, n_bins=1) == pytest.approx(
        static_calibration_error(y, p, n_bins=1))


def test_registered_metrics_and_properties():
    for name in ("nll", "brier"):
        assert {"proper_scoring_rule", "permutation_invariant"} <= get_metric(name).properties
        assert get_metric(name).greater_is_better is False
    for name in ("ece", "ece_quantile", "mce", "sce", "ace", "tace"):
        spec = get_metric(name)
        assert spec.kind == "classification" and not spec.greater_is_better
        assert "permutation_invariant" in spec.properties
        assert "proper_scoring_rule" not in spec.properties
    for name in ("accuracy", "top5_accuracy"):
        assert get_metric(name).greater_is_better
    assert get_metric("confidence_ece").kind == "selective"


# ----------------------------------------------------------------------------------------------
# Cross-checks against scikit-learn
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_classes", [2, 3, 7])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_sklearn(n_classes, seed):
    rng = np.random.default_rng(seed)
    n = 200
    probs = rng.dirichlet(np.full(n_classes, 0.7), size=n)
    labels = rng.integers(0, n_classes, size=n)
    classes = np.arange(n_classes)
    assert nll_loss(labels, probs) == pytest.approx(sk.log_loss(labels, probs, labels=classes),
                                                    rel=1e-12)
    assert accuracy_score(labels, probs) == sk.accuracy_score(labels, probs.argmax(1))
    if n_classes == 2:
        assert brier_loss(labels, probs) == pytest.approx(
            2 * sk.brier_score_loss(labels, probs[:, 1]), rel=1e-12)
    else:
        for k in range(1, n_classes):
            assert top_k_accuracy_score(labels, probs, k=k) == sk.top_k_accuracy_score(
                labels, probs, k=k, labels=classes)


def test_top_k_at_least_classes_is_one():
    labels, probs, _, _ = examples.model_b()
    assert top_k_accuracy_score(labels, probs, k=3) == 1.0
    assert top_k_accuracy_score(labels, probs, k=10) == 1.0
    assert get_metric("top5_accuracy").func(labels, probs) == 1.0


# ----------------------------------------------------------------------------------------------
# Properties
# ----------------------------------------------------------------------------------------------


@given(probs_and_labels())
@settings(max_examples=30)
def test_top_k_monotone_in_k_and_top1_is_accuracy(data):
    labels, probs = data
    accs = [top_k_accuracy_score(labels, probs, k=k) for k in range(1, probs.shape[1] + 1)]
    assert accs[0] == accuracy_score(labels, probs)
    assert np.all(np.diff(accs) >= 0) and accs[-1] == 1.0


@given(probs_and_labels(), st.randoms(use_true_random=False))
@settings(max_examples=30)
def test_equal_mass_ece_permutation_invariant(data, rnd):
    labels, probs = data
    perm = np.array(rnd.sample(range(len(labels)), len(labels)))
    for strategy in ("uniform", "quantile"):
        a = expected_calibration_error(labels, probs, n_bins=4, strategy=strategy)
        b = expected_calibration_error(labels[perm], probs[perm], n_bins=4, strategy=strategy)
        assert a == pytest.approx(b, abs=1e-12)
    assert adaptive_calibration_error(labels, probs, n_bins=3) == pytest.approx(
        adaptive_calibration_error(labels[perm], probs[perm], n_bins=3), abs=1e-12)


@given(probs_and_labels())
@settings(max_examples=30)
def test_calibration_errors_in_unit_interval_and_ordered(data):
    labels, probs = data
    ece = expected_calibration_error(labels, probs)
    mce = maximum_calibration_error(labels, probs)
    assert 0.0 <= ece <= mce + 1e-12 <= 1.0 + 1e-12
    for f in (static_calibration_error, adaptive_calibration_error):
        assert 0.0 <= f(labels, probs) <= 1.0
    rd = reliability_diagram(labels, probs)
    assert int(rd["count"].sum()) == len(labels)
    assert rd.attrs["ece"] == pytest.approx(ece, abs=1e-12)


# ----------------------------------------------------------------------------------------------
# Inputs: torch / xarray, and validation
# ----------------------------------------------------------------------------------------------

_METRICS = [accuracy_score, nll_loss, brier_loss, expected_calibration_error,
            maximum_calibration_error, static_calibration_error, adaptive_calibration_error,
            top_k_accuracy_score, reliability_diagram]


def test_xarray_inputs_agree_with_numpy():
    # torch tensors: tests/test_uqmetrics_torch.py (integration env, which has torch)
    labels, probs, _, _ = examples.model_b()
    ref = nll_loss(labels, probs)
    assert nll_loss(xr.DataArray(labels, dims="sample"),
                    xr.DataArray(probs, dims=("sample", "class"))) == ref


_GOOD_P = np.array([[0.7, 0.3], [0.4, 0.6]])
_GOOD_Y = np.array([0, 1])


@pytest.mark.parametrize("metric", _METRICS, ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    "labels, probs, match",
    [
        (_GOOD_Y, _GOOD_P[0], r"probs must have shape \(n_samples, n_classes\)"),
        (_GOOD_Y, np.array([[0.7, np.nan], [0.4, 0.6]]), "probs contains non-finite"),
        (_GOOD_Y, np.array([[0.7, np.inf], [0.4, 0.6]]), "probs contains non-finite"),
        (_GOOD_Y, np.array([[0.7, 0.2], [0.4, 0.6]]), "probs rows must sum to 1"),
        (_GOOD_Y, np.array([[1.5, -0.5], [0.4, 0.6]]), r"probs must lie in \[0, 1\]"),
        (np.array([0, 2]), _GOOD_P, r"labels must lie in \[0, 2\)"),
        (np.array([0, -1]), _GOOD_P, r"labels must lie in \[0, 2\)"),
        (np.array([0.5, 1.0]), _GOOD_P, "labels must be integers"),
        (np.array([0]), _GOOD_P, "same number of samples"),
        (_GOOD_Y.reshape(2, 1), _GOOD_P, r"labels must have shape \(n_samples,\)"),
        (np.array([], dtype=int), np.empty((0, 2)), "probs is empty"),
    ],
)
def test_bad_input_raises_naming_the_argument(metric, labels, probs, match):
    with pytest.raises(ValueError, match=match):
        metric(labels, probs)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: top_k_accuracy_score(_GOOD_Y, _GOOD_P, k=0), "k must be an integer >= 1"),
        (lambda: nll_loss(_GOOD_Y, _GOOD_P, eps=0.0), "eps must lie in"),
        (lambda: expected_calibration_error(_GOOD_Y, _GOOD_P, n_bins=0), "n_bins"),
        (lambda: expected_calibration_error(_GOOD_Y, _GOOD_P, strategy="kmeans"), "strategy"),
        (lambda: maximum_calibration_error(_GOOD_Y, _GOOD_P, n_bins=1.5), "n_bins"),
        (lambda: static_calibration_error(_GOOD_Y, _GOOD_P, n_bins=-1), "n_bins"),
        (lambda: adaptive_calibration_error(_GOOD_Y, _GOOD_P, threshold=2.0), "threshold"),
        (lambda: adaptive_calibration_error(_GOOD_Y, _GOOD_P, threshold=0.99), "threshold"),
        (lambda: adaptive_calibration_error(_GOOD_Y, _GOOD_P, weighting="bins"), "weighting"),
        (lambda: reliability_diagram(_GOOD_Y, _GOOD_P, strategy="x"), "strategy"),
        (lambda: confidence_calibration_error([True], [1.2]), r"confidence must lie in \[0, 1\]"),
        (lambda: confidence_calibration_error([True], [0.5], norm="l3"), "norm"),
        (lambda: confidence_calibration_error([True, False], [0.5]), "same number of samples"),
        (lambda: bin_edges([0.5, -0.1]), r"values must lie in \[0, 1\]"),
    ],
)
def test_bad_options_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_doctests_pass():
    result = doctest.testmod(classification, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
