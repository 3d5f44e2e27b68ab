"""The OpenOOD v1.5 detection metrics: FPR@95, AUPR-In, AUPR-Out (docs/conventions.md#s-4).

Hand-computed values with ties, scikit-learn agreement on random and heavily tied scores, and
the properties every rank metric has (sample order, monotone transforms, swapping the sets).
"""

import doctest
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from sklearn.metrics import (
    auc,
    average_precision_score,
    precision_recall_curve,
    roc_auc_score,
    roc_curve,
)

import uqmetrics.metrics.ood
from uqmetrics import (
    CONVENTIONS,
    aupr_in,
    aupr_out,
    fpr_at_95_tpr,
    ood_auroc_score,
    ood_detection_scores,
)
from uqmetrics.metrics.registry import get_metric

#: Heavily tied scores: few distinct values.
tied = hnp.arrays(np.float64, st.integers(1, 50), elements=st.integers(0, 6).map(float))
#: Mostly distinct scores.
spread = hnp.arrays(np.float64, st.integers(1, 50),
                    elements=st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False))
scores = st.one_of(tied, spread)

METRICS = {"ood_auroc": ood_auroc_score, "aupr_in": aupr_in, "aupr_out": aupr_out,
           "fpr_at_95_tpr": fpr_at_95_tpr}


def _labels(u_in, u_out):
    return np.r_[np.zeros(len(u_in), int), np.ones(len(u_out), int)], np.r_[u_in, u_out]


def sk_fpr(u_in, u_out, tpr=0.95, drop_intermediate=False):
    """OpenOOD's ``auc_and_fpr_recall`` FPR (out-domain positive, score u)."""
    is_out, u = _labels(u_in, u_out)
    fpr, tpr_curve, _ = roc_curve(is_out, u, drop_intermediate=drop_intermediate)
    return fpr[np.argmax(tpr_curve >= tpr)]


# -------------------------------------------------------------------------------- by hand


def test_fpr_at_95_tpr_hand_cases_with_ties():
    # u descending: 3 (out) | 2 (in) | 1 (in, in, out) | 0 (in). Out-domain TPR reaches 1 only
    # at the tied block at 1, which enters whole: 3 of the 4 in-domain samples are flagged.
    assert fpr_at_95_tpr([0.0, 1.0, 1.0, 2.0], [1.0, 3.0]) == 0.75
    # in-domain positive, -u descending: 0 (in) | -1 (in, in, out) | -2 (in) | -3 (out): the
    # in-domain TPR reaches 1 at -2, where the out-domain sample at u = 1 is accepted: 1/2.
    assert fpr_at_95_tpr([0.0, 1.0, 1.0, 2.0], [1.0, 3.0], positive="in") == 0.5
    assert fpr_at_95_tpr([0.0, 1.0], [2.0, 3.0]) == 0.0  # perfect separation
    assert fpr_at_95_tpr([2.0, 3.0], [0.0, 1.0]) == 1.0  # reversed
    assert fpr_at_95_tpr([0.5, 0.5], [0.5]) == 1.0  # one tied block: all at once


def test_fpr_at_95_tpr_threshold_rule_is_the_first_point_reaching_the_rate():
    # 20 OOD samples at u = 100..119, ID at u = 0..9 and 100.5: TPR = 19/20 = 0.95 exactly at
    # u = 101 (>= 0.95 holds in floating point, as in scikit-learn), above every ID sample
    u_out = np.arange(100.0, 120.0)
    u_in = np.r_[np.arange(10.0), 100.5]
    assert fpr_at_95_tpr(u_in, u_out) == 0.0
    assert fpr_at_95_tpr(u_in, u_out, tpr=1.0) == 1 / 11  # down to u = 100: ID 100.5 too
    assert fpr_at_95_tpr(u_in, u_out, tpr=0.0) == 0.0  # the curve's first point (0, 0)
    # 21 OOD samples at u = 99..119: 19/21 < 0.95 <= 20/21, so the threshold moves down to
    # u = 100, below the ID sample at 100.5
    assert fpr_at_95_tpr(u_in, np.arange(99.0, 120.0)) == 1 / 11


def test_aupr_hand_cases_with_ties():
    u_in, u_out = [0.0, 1.0, 1.0, 2.0], [1.0, 3.0]
    # AUPR-Out, u descending in tied blocks: {3: 1 out}, {2: in}, {1: in, in, out}, {0: in}:
    # precision 1/1 at the first OOD, 2/5 at the tied block -> (1 + 2/5) / 2
    assert aupr_out(u_in, u_out) == pytest.approx(0.7, abs=1e-15)
    # AUPR-In, -u descending: {0: in}, {-1: in, in, out}, {-2: in}, {-3: out}:
    # (1 * 1 + 2 * 3/4 + 1 * 4/5) / 4
    assert aupr_in(u_in, u_out) == pytest.approx(0.825, abs=1e-15)
    # trapezoids through (0, 1), (1/2, 1), (1/2, 1/2), (1, 2/5), (1, 1/3)
    assert aupr_out(u_in, u_out, curve="trapezoid") == pytest.approx(0.725, abs=1e-15)
    assert aupr_out([0.5, 0.5], [0.5, 0.5]) == 0.5
    assert aupr_out([0.5, 0.5], [0.5, 0.5], curve="trapezoid") == 0.75  # (1 + 1/2) / 2
    assert aupr_in([0.0], [1.0]) == aupr_out([0.0], [1.0]) == 1.0


def test_detection_scores_are_the_registered_metrics():
    rng = np.random.default_rng(0)
    u_in, u_out = rng.normal(size=50), rng.normal(1.0, size=30)
    scores_ = ood_detection_scores(u_in, u_out)
    assert scores_ == {name: f(u_in, u_out) for name, f in METRICS.items()}
    for name in METRICS:
        spec = get_metric(name)
        assert spec.kind == spec.family == "ood"
        assert CONVENTIONS[name].startswith("S.4: ")
        assert {"permutation_invariant", "monotone_invariant"} <= spec.properties
    assert get_metric("fpr_at_95_tpr").greater_is_better is False
    assert get_metric("aupr_in").greater_is_better and get_metric("aupr_out").greater_is_better
    trap = ood_detection_scores(u_in, u_out, curve="trapezoid", positive="in")
    assert trap["aupr_in"] == aupr_in(u_in, u_out, curve="trapezoid")
    assert trap["fpr_at_95_tpr"] == fpr_at_95_tpr(u_in, u_out, positive="in")


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="curve must be one of"):
        aupr_in([0.0], [1.0], curve="interpolated")
    with pytest.raises(ValueError, match="positive must be one of"):
        fpr_at_95_tpr([0.0], [1.0], positive="ood")
    with pytest.raises(ValueError, match="tpr must lie in"):
        fpr_at_95_tpr([0.0], [1.0], tpr=1.5)
    with pytest.raises(ValueError, match="u_out"):
        aupr_out([0.0], [])
    with pytest.raises(ValueError, match="u_in"):
        fpr_at_95_tpr([np.nan], [1.0])


# ---------------------------------------------------------------------- scikit-learn agreement


@settings(max_examples=60, deadline=None)
@given(scores, scores)
def test_agrees_with_scikit_learn(u_in, u_out):
    is_out, u = _labels(u_in, u_out)
    assert ood_auroc_score(u_in, u_out) == pytest.approx(roc_auc_score(is_out, u), abs=1e-12)
    assert aupr_out(u_in, u_out) == pytest.approx(average_precision_score(is_out, u),
                                                  abs=1e-12)
    assert aupr_in(u_in, u_out) == pytest.approx(average_precision_score(1 - is_out, -u),
                                                 abs=1e-12)
    p, r, _ = precision_recall_curve(is_out, u)
    assert aupr_out(u_in, u_out, curve="trapezoid") == pytest.approx(auc(r, p), abs=1e-12)
    p, r, _ = precision_recall_curve(1 - is_out, -u)
    assert aupr_in(u_in, u_out, curve="trapezoid") == pytest.approx(auc(r, p), abs=1e-12)
    for tpr in (0.95, 0.5, 0.8, 1.0):
        assert fpr_at_95_tpr(u_in, u_out, tpr=tpr) == sk_fpr(u_in, u_out, tpr)
    # the in-domain-positive variant: roc_curve of the in-domain samples scored by -u
    fpr, tpr_curve, _ = roc_curve(1 - is_out, -u, drop_intermediate=False)
    assert fpr_at_95_tpr(u_in, u_out, positive="in") == fpr[np.argmax(tpr_curve >= 0.95)]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 400), st.integers(2, 400))
def test_openood_drop_intermediate_changes_nothing_without_ties(seed, n_in, n_out):
    rng = np.random.default_rng(seed)
    u_in, u_out = rng.normal(size=n_in), rng.normal(0.7, 1.3, size=n_out)
    assert fpr_at_95_tpr(u_in, u_out) == sk_fpr(u_in, u_out, drop_intermediate=True)


def test_openood_drop_intermediate_can_overstate_fpr_with_ties():
    # 20 tied blocks of one ID and one OOD sample each: the ROC curve is one straight line;
    # scikit-learn's default drop_intermediate=True keeps only its ends, so OpenOOD's rule
    # jumps from TPR 0 to 1 and reports FPR 1 where the exact curve reaches TPR 0.95 at 0.95.
    u = np.arange(20.0)
    assert fpr_at_95_tpr(u, u) == 0.95
    assert sk_fpr(u, u) == 0.95
    assert sk_fpr(u, u, drop_intermediate=True) == 1.0


# -------------------------------------------------------------------------------- properties


@settings(max_examples=60, deadline=None)
@given(scores, scores, st.randoms(use_true_random=False))
def test_invariant_to_sample_order(u_in, u_out, random):
    pi, po = list(range(u_in.size)), list(range(u_out.size))
    random.shuffle(pi)
    random.shuffle(po)
    for name, f in METRICS.items():
        assert f(u_in[pi], u_out[po]) == pytest.approx(f(u_in, u_out), abs=1e-12), name


@settings(max_examples=60, deadline=None)
@given(tied, tied)
def test_invariant_to_strictly_increasing_transforms(u_in, u_out):
    # on the integer grid 0..6 these transforms are exact and keep every tie and every order
    transforms = (lambda u: 3 * u - 7, np.exp, lambda u: u**3, lambda u: np.arctan(u - 3))
    for name, f in METRICS.items():
        for g in transforms:
            for curve_kw in ({},) if name in ("ood_auroc", "fpr_at_95_tpr") else \
                    ({}, {"curve": "trapezoid"}):
                assert f(g(u_in), g(u_out), **curve_kw) == f(u_in, u_out, **curve_kw), name


@settings(max_examples=60, deadline=None)
@given(scores, scores)
def test_swapping_the_sets(u_in, u_out):
    assert ood_auroc_score(u_in, u_out) + ood_auroc_score(u_out, u_in) == \
        pytest.approx(1.0, abs=1e-12)
    # AUPR-Out of (in, out) ranks the out-domain samples by u; AUPR-In of (out, in) ranks the
    # same samples, now called in-domain, by -u: negating u swaps the two
    assert aupr_out(u_in, u_out) == pytest.approx(aupr_in(-u_out, -u_in), abs=1e-12)
    # FPR@95 with out-domain positive = in-domain-positive FPR@95 of the swapped, negated sets
    assert fpr_at_95_tpr(u_in, u_out) == fpr_at_95_tpr(-u_out, -u_in, positive="in")
    for positive in ("out", "in"):
        assert 0.0 <= fpr_at_95_tpr(u_in, u_out, positive=positive) <= 1.0
    for f in (aupr_in, aupr_out):
        assert 0.0 <= f(u_in, u_out) <= 1.0
        assert 0.0 <= f(u_in, u_out, curve="trapezoid") <= 1.0


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_constant_u_is_uninformative(seed):
    rng = np.random.default_rng(seed)
    n_in, n_out = rng.integers(1, 40, size=2)
    u_in, u_out = np.full(n_in, 0.3), np.full(n_out, 0.3)
    assert ood_auroc_score(u_in, u_out) == 0.5
    assert fpr_at_95_tpr(u_in, u_out) == 1.0
    assert math.isclose(aupr_out(u_in, u_out), n_out / (n_in + n_out))
    assert math.isclose(aupr_in(u_in, u_out), n_in / (n_in + n_out))


def test_doctests_pass():
    result = doctest.testmod(uqmetrics.metrics.ood, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
