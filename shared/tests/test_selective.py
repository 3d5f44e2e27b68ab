"""Selective-prediction metrics (docs/conventions.md#s-2): golden values, hand cases,
cross-checks."""

import doctest
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from sklearn.metrics import average_precision_score, roc_auc_score

import uqmetrics.metrics.selective
from uqmetrics import (
    UndefinedMetricWarning,
    aupr_score,
    aurc_c_loss,
    aurc_loss,
    auroc_score,
    eaurc_c_loss,
    eaurc_loss,
    oracle_aurc,
    risk_coverage_curve,
    sac_score,
)
from uqmetrics.metrics.registry import get_metric
from uqmetrics.runs.testing import examples, strategies


# --------------------------------------------------------------------------- golden (S.2)
def test_model_a_golden():
    _, _, c, k = examples.model_a()
    assert auroc_score(c, k) == 0.5
    assert round(aurc_loss(c, k), 3) == 0.05
    assert sac_score(c, k, accuracy=0.96) == 0.0


def test_model_b_golden():
    _, _, c, k = examples.model_b()
    assert auroc_score(c, k) == 1.0
    assert eaurc_loss(c, k) == 0.0
    assert sac_score(c, k, accuracy=0.96) == 0.4


@pytest.mark.parametrize(
    "accuracy, aurc, oracle, eaurc", [(0.2, 0.8, 0.482, 0.318), (0.8, 0.2, 0.022, 0.178)]
)
def test_flat_kappa_golden(accuracy, aurc, oracle, eaurc):
    """Selective paper, Appendix C: flat κ, N = 100, values printed to 3 decimals."""
    _, _, c, k = examples.flat(accuracy)
    assert round(aurc_loss(c, k), 3) == aurc
    assert round(oracle_aurc(c), 3) == oracle
    assert round(eaurc_loss(c, k), 3) == eaurc


# --------------------------------------------------------------------------- hand cases
def test_aurc_without_ties_hand_case():
    # top-i errors e_i = 0, 1, 1, 2  ->  (0/1 + 1/2 + 1/3 + 2/4) / 4
    c = [True, False, True, False]
    k = [0.9, 0.7, 0.5, 0.2]
    assert aurc_loss(c, k) == pytest.approx((0 + 1 / 2 + 1 / 3 + 2 / 4) / 4, abs=1e-15)


def test_aurc_ties_hand_case():
    # blocks (κ desc): {0.9: 2 samples, 1 error}, {0.5: 3 samples, 1 error}, {0.1: 1, 0}
    # spread errors: e = 1/2, 1, 1 + 1/3, 1 + 2/3, 2, 2
    c = [True, False, True, False, True, True]
    k = [0.9, 0.9, 0.5, 0.5, 0.5, 0.1]
    e = [Fraction(1, 2), 1, Fraction(4, 3), Fraction(5, 3), 2, 2]
    expected = sum(Fraction(ei) / i for i, ei in enumerate(e, start=1)) / 6
    assert aurc_loss(c, k) == pytest.approx(float(expected), abs=1e-15)
    # the order of the samples inside the input does not matter
    perm = [5, 3, 1, 4, 0, 2]
    assert aurc_loss(np.array(c)[perm], np.array(k)[perm]) == aurc_loss(c, k)


def test_constant_confidence_aurc_is_error_rate():
    c = np.array([True] * 7 + [False] * 3)
    assert aurc_loss(c, np.full(10, 0.3)) == pytest.approx(0.3, abs=1e-15)


def _expected_aurc_brute_force(c, k):
    """Mean AURC over every arrangement of the errors inside each tied block (exact)."""
    c, k = np.asarray(c, bool), np.asarray(k, float)
    n = c.size
    order = np.argsort(-k, kind="stable")
    ks, cs = k[order], c[order]
    total = Fraction(0)
    start = 0
    errors_before = 0
    while start < n:
        stop = start + int(np.sum(ks == ks[start]))
        b, w = stop - start, int(np.sum(~cs[start:stop]))
        arrangements = list(itertools.combinations(range(b), w))
        block = Fraction(0)
        for errs in arrangements:
            e = errors_before
            for j in range(b):
                e += j in errs
                block += Fraction(e, start + j + 1)
        total += block / len(arrangements)
        errors_before += w
        start = stop
    return float(total / n)


@given(strategies.correct_and_confidence(max_n=12, both_classes=False))
def test_aurc_equals_mean_over_tie_orders(data):
    c, k = data
    assert aurc_loss(c, k) == pytest.approx(_expected_aurc_brute_force(c, k), abs=1e-12)


@given(strategies.correct_and_confidence(max_n=40, both_classes=False, ties=False))
def test_aurc_matches_plain_estimator_without_ties(data):
    c, k = data
    assume(np.unique(k).size == k.size)  # the plain sum needs distinct κ (ties=False draws them)
    order = np.argsort(-k)
    e = np.cumsum(~c[order])
    plain = np.mean(e / np.arange(1, c.size + 1))
    assert aurc_loss(c, k) == pytest.approx(plain, abs=1e-12)


def test_risk_coverage_curve_hand_case():
    cov, risk, thr = risk_coverage_curve([1, 0, 1, 1, 0], [0.2, 0.9, 0.9, 0.5, 0.2])
    np.testing.assert_array_equal(thr, [0.9, 0.5, 0.2])
    np.testing.assert_allclose(cov, [0.4, 0.6, 1.0])
    np.testing.assert_allclose(risk, [1 / 2, 1 / 3, 2 / 5])


@given(strategies.correct_and_confidence(both_classes=False))
def test_risk_coverage_curve_consistency(data):
    c, k = data
    cov, risk, thr = risk_coverage_curve(c, k)
    assert cov[-1] == 1.0 and np.all(np.diff(cov) > 0) and np.all(np.diff(thr) < 0)
    assert risk[-1] == pytest.approx(1 - c.mean(), abs=1e-12)
    for cv, r, t in zip(cov, risk, thr):
        kept = k >= t
        assert cv == pytest.approx(kept.mean()) and r == pytest.approx((~c[kept]).mean())


@pytest.mark.parametrize(
    "correct, conf, alpha, expected",
    [
        # boundaries at k = 1 (acc 1), 3 (2/3), 4 (3/4): the tie at 0.8 forbids k = 2
        ([1, 1, 0, 1], [0.9, 0.8, 0.8, 0.7], 1.0, 0.25),
        ([1, 1, 0, 1], [0.9, 0.8, 0.8, 0.7], 0.75, 1.0),  # exactly alpha at full coverage
        ([1, 1, 0, 1], [0.9, 0.8, 0.8, 0.7], 0.7, 1.0),
        ([1, 1, 0, 0], [0.9, 0.8, 0.7, 0.6], 0.6, 0.75),  # best coverage in the middle
        ([1, 1, 0, 0], [0.9, 0.8, 0.7, 0.6], 0.5, 1.0),
        ([0, 1], [0.9, 0.1], 0.99, 0.0),  # holds at no coverage
        ([1, 1, 0], [0.5, 0.5, 0.5], 0.7, 0.0),  # constant κ: only full coverage is a boundary
        ([1, 1, 0], [0.5, 0.5, 0.5], 0.6, 1.0),
        ([True] * 19 + [False], np.linspace(1, 0, 20), 0.95, 1.0),  # 19/20 meets 0.95 exactly
    ],
)
def test_sac_hand_cases(correct, conf, alpha, expected):
    assert sac_score(correct, conf, accuracy=alpha) == expected


@given(strategies.correct_and_confidence(both_classes=False), st.floats(0.01, 1.0))
def test_sac_matches_definition(data, alpha):
    c, k = data
    cov, risk, _ = risk_coverage_curve(c, k)
    n_kept = np.rint(cov * c.size).astype(int)
    n_right = np.rint((1 - risk) * n_kept).astype(int)
    ok = [kk / c.size for kk, r in zip(n_kept, n_right) if r / kk >= alpha]
    assert sac_score(c, k, accuracy=alpha) == (max(ok) if ok else 0.0)


# --------------------------------------------------------------------------- AURC_C
@given(strategies.correct_and_confidence(both_classes=False))
def test_aurc_c_at_full_coverage_is_aurc(data):
    c, k = data
    assert aurc_c_loss(c, k, coverage=(0.0, 1.0)) == pytest.approx(aurc_loss(c, k), abs=1e-12)
    assert eaurc_c_loss(c, k, coverage=(0.0, 1.0)) == pytest.approx(eaurc_loss(c, k), abs=1e-12)


def test_aurc_c_hand_case_partial_coverage():
    # N = 5, κ descending: right, wrong, right, right, wrong -> e_i = 0, 1, 1, 1, 2;
    # risks e_i/i = 0, 1/2, 1/3, 1/4, 2/5. Coverages in [0.3, 0.8]: i = 2, 3, 4.
    c = [True, False, True, True, False]
    k = [0.9, 0.8, 0.7, 0.6, 0.5]
    expected = Fraction(1, 2) + Fraction(1, 3) + Fraction(1, 4)
    assert aurc_c_loss(c, k, coverage=(0.3, 0.8)) == pytest.approx(float(expected / 3), abs=1e-15)
    # the oracle (right, right, right, wrong, wrong) has risks 0, 0, 0, 1/4, 2/5
    oracle = Fraction(0) + Fraction(0) + Fraction(1, 4)
    assert eaurc_c_loss(c, k, coverage=(0.3, 0.8)) == pytest.approx(
        float((expected - oracle) / 3), abs=1e-15)
    # coverage 0.4 = 2/5 exactly is inside [0.4, 0.4 + eps] (no float rounding excludes it)
    assert aurc_c_loss(c, k, coverage=(0.4, 0.5)) == 0.5


def test_aurc_c_spreads_ties():
    # one tied block of 4 with 2 errors: expected errors among the top i are i/2, risk 1/2
    c, k = [1, 0, 1, 0], [0.5] * 4
    assert aurc_c_loss(c, k, coverage=(0.0, 0.5)) == 0.5
    # the order of the tied samples is irrelevant
    assert aurc_c_loss([0, 1, 0, 1], k, coverage=(0.5, 1.0)) == 0.5


@given(strategies.correct_and_confidence(both_classes=False))
def test_eaurc_c_equals_aurc_c_below_accuracy(data):
    """The oracle's risk is 0 at coverages up to the accuracy."""
    c, k = data
    n_right = int(np.sum(c))
    assume(n_right >= 1)
    high = n_right / c.size
    assert eaurc_c_loss(c, k, coverage=(0.0, high)) == pytest.approx(
        aurc_c_loss(c, k, coverage=(0.0, high)), abs=1e-12)


@pytest.mark.parametrize("coverage", [(0.5, 0.5), (0.6, 0.4), (-0.1, 0.5), (0.0, 1.1), (0.5,),
                                      "ab", (0.51, 0.59)])
def test_aurc_c_bad_coverage(coverage):
    with pytest.raises(ValueError, match="coverage"):
        aurc_c_loss([True, False, True, False, True], [0.9, 0.8, 0.7, 0.6, 0.5],
                    coverage=coverage)


def test_registered_aurc_c_range():
    c = [True, False, True, True, False, True, False, False]
    k = np.linspace(1, 0, 8)
    assert get_metric("aurc_c").func(c, k) == aurc_c_loss(c, k, coverage=(0.0, 0.5))
    assert get_metric("eaurc_c").func(c, k) == eaurc_c_loss(c, k, coverage=(0.0, 0.5))


# --------------------------------------------------------------------------- SAC first_drop
def _official_first_drop(correct_sorted, accuracy, start_index=200):
    """``coverage_for_desired_accuracy`` of the Selective paper's official code, in numpy
    (samples already sorted by confidence, descending)."""
    cumsum = np.cumsum(np.asarray(correct_sorted, dtype=np.float64))
    num_samples = cumsum.shape[0] + 1
    cummean = cumsum / np.arange(1, num_samples)
    coverage = np.argmax(cummean < accuracy).item()
    nonstrict = np.argmax(cummean[start_index:] < accuracy).item() + start_index
    if nonstrict > start_index:
        coverage = nonstrict
    return coverage / num_samples


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("alpha", [0.95, 0.99])
def test_sac_first_drop_matches_official_code(seed, alpha):
    rng = np.random.default_rng(seed)
    n = 3000
    k = rng.permutation(n) / n  # distinct κ
    # accuracy falls with decreasing κ: near 1 at the top, about 0.7 overall
    c = rng.random(n) < 1.0 - 0.6 * (1.0 - k) ** 1.5
    order = np.argsort(-k)
    expected = _official_first_drop(c[order], alpha)
    assert sac_score(c, k, accuracy=alpha, rule="first_drop") == expected
    # the two rules differ (docs/conventions.md#s-2 gives the difference at ImageNet scale)
    assert sac_score(c, k, accuracy=alpha) != expected


@pytest.mark.parametrize(
    "correct, alpha, burn_in, expected",
    [
        # first drop below 0.75 at 0-based index 2 (acc 2/3), after a burn-in of 1: 2 / 6
        ([1, 1, 0, 1, 0], 0.75, 1, 2 / 6),
        # burn-in 2: searched from index 2, the drop is AT the burn-in -> the strict index 2
        ([1, 1, 0, 1, 0], 0.75, 2, 2 / 6),
        # a drop inside the burn-in is ignored: accuracies 1, 1/2, 2/3, 3/4, 4/5, 5/6, 5/7, 5/8
        # first fall below 0.75 at index 1; from index 3 on, at index 6 -> 6 / 9
        ([1, 0, 1, 1, 1, 1, 0, 0], 0.75, 3, 6 / 9),
        # accuracy never drops below alpha: the official argmax of an all-false array is 0
        ([1, 1, 1, 1], 0.9, 1, 0.0),
        # N <= burn_in: only the strict index (the official code would raise)
        ([1, 1, 0, 0], 0.9, 200, 2 / 5),
    ],
)
def test_sac_first_drop_hand_cases(correct, alpha, burn_in, expected):
    k = np.linspace(1, 0, len(correct))
    assert sac_score(correct, k, accuracy=alpha, rule="first_drop", burn_in=burn_in) == expected


def test_sac_first_drop_spreads_ties():
    # a tied block of 4 with 2 right after one right sample: spread accuracies 1, 3/4, 2/3, 5/8,
    # 3/5, the first below 0.7 at index 2 (whatever order a sort would give the block)
    c = [1, 1, 0, 1, 0]
    k = [0.9, 0.5, 0.5, 0.5, 0.5]
    assert sac_score(c, k, accuracy=0.7, rule="first_drop", burn_in=0) == 2 / 6
    assert sac_score([1, 0, 0, 1, 1], k, accuracy=0.7, rule="first_drop", burn_in=0) == 2 / 6


def test_sac_rule_and_burn_in_validation():
    with pytest.raises(ValueError, match="rule"):
        sac_score([1, 0], [0.9, 0.1], accuracy=0.9, rule="official")
    with pytest.raises(ValueError, match="burn_in"):
        sac_score([1, 0], [0.9, 0.1], accuracy=0.9, rule="first_drop", burn_in=-1)


def test_registered_first_drop_wrappers():
    rng = np.random.default_rng(0)
    c, k = rng.random(500) < 0.9, rng.random(500)
    assert get_metric("sac_99_first_drop").func(c, k) == sac_score(c, k, accuracy=0.99,
                                                                   rule="first_drop")
    assert get_metric("sac_95_first_drop").func.__name__ == "sac_95_first_drop_score"


def test_aupr_hand_case():
    c = [1, 0, 1, 0, 1]
    k = [0.9, 0.8, 0.7, 0.1, 0.05]
    assert aupr_score(c, k) == pytest.approx((1 + 2 / 3 + 3 / 5) / 3)
    # errors as positives, ranked by -κ: 0.05 (right), 0.1 (error, P=1/2), ..., 0.8 (P=2/4)
    assert aupr_score(c, k, positive="wrong") == pytest.approx((1 / 2 + 2 / 4) / 2)


def test_auroc_ties_hand_case():
    # pairs (correct, wrong): (0.9, 0.5) 1, (0.9, 0.1) 1, (0.5, 0.5) 1/2, (0.5, 0.1) 1
    assert auroc_score([1, 1, 0, 0], [0.9, 0.5, 0.5, 0.1]) == 3.5 / 4


def test_eaurc_analytic_oracle_edges():
    all_right = np.ones(10, bool)
    all_wrong = np.zeros(10, bool)
    k = np.linspace(0, 1, 10)
    assert oracle_aurc(all_right, method="analytic") == 0.0
    assert oracle_aurc(all_wrong, method="analytic") == 1.0
    assert eaurc_loss(all_right, k, oracle="analytic") == 0.0
    assert eaurc_loss(all_wrong, k, oracle="analytic") == 0.0
    assert eaurc_loss(all_wrong, k) == 0.0


@pytest.mark.parametrize("n", [100, 1000, 10000])
@pytest.mark.parametrize("accuracy", [0.2, 0.5, 0.8])
def test_analytic_oracle_approximates_empirical(n, accuracy):
    # (1/N) Σ_{i>n_c} (1 - n_c/i) = r - (1-r)(H_N - H_{n_c}) and H_N - H_{n_c} = ln(N/n_c) + O(1/n_c),
    # so the two oracles differ by O(1/N); the bound 1/N covers the constant (≈ 1/2).
    c = np.arange(n) < round(accuracy * n)
    diff = oracle_aurc(c) - oracle_aurc(c, method="analytic")
    assert abs(diff) <= 1 / n


# --------------------------------------------------------------------------- cross-checks
@given(strategies.correct_and_confidence())
def test_auroc_matches_sklearn(data):
    c, k = data
    assert auroc_score(c, k) == pytest.approx(roc_auc_score(c, k), abs=1e-12)


@given(strategies.correct_and_confidence())
def test_aupr_matches_sklearn(data):
    c, k = data
    assert aupr_score(c, k) == pytest.approx(average_precision_score(c, k), abs=1e-12)
    assert aupr_score(c, k, positive="wrong") == pytest.approx(
        average_precision_score(~c, -k), abs=1e-12
    )


def test_auroc_large_random_matches_sklearn():
    rng = np.random.default_rng(0)
    c = rng.random(20000) < 0.7
    k = np.round(rng.random(20000) + 0.3 * c, 2)  # many ties
    assert auroc_score(c, k) == pytest.approx(roc_auc_score(c, k), abs=1e-12)


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("func", [auroc_score, aurc_loss, eaurc_loss, aupr_score,
                                  lambda c, k: sac_score(c, k, accuracy=0.9)])
def test_bad_input_raises(func):
    with pytest.raises(ValueError, match="correct is empty"):
        func([], [])
    with pytest.raises(ValueError, match="confidence contains non-finite"):
        func([True, False], [0.5, np.nan])
    with pytest.raises(ValueError, match="same number of samples"):
        func([True, False, True], [0.5, 0.2])
    with pytest.raises(ValueError, match="correct must be boolean"):
        func([0, 2], [0.5, 0.2])
    with pytest.raises(ValueError, match=r"confidence must have shape \(n_samples,\)"):
        func([True, False], [[0.5, 0.2]])


@pytest.mark.parametrize("alpha", [0.0, -0.1, 1.0000001, 2, np.nan, "high"])
def test_sac_accuracy_out_of_range(alpha):
    with pytest.raises(ValueError, match="accuracy"):
        sac_score([True, False], [0.9, 0.1], accuracy=alpha)


def test_invalid_choices_name_the_argument():
    with pytest.raises(ValueError, match="positive"):
        aupr_score([True, False], [0.9, 0.1], positive="right")
    with pytest.raises(ValueError, match="oracle"):
        eaurc_loss([True, False], [0.9, 0.1], oracle="exact")
    with pytest.raises(ValueError, match="method"):
        oracle_aurc([True, False], method="exact")


@pytest.mark.parametrize("correct", [[True, True, True], [False, False]])
def test_auroc_single_class_warns_and_returns_nan(correct):
    with pytest.warns(UndefinedMetricWarning, match="AUROC is undefined"):
        value = auroc_score(correct, np.linspace(0, 1, len(correct)))
    assert math.isnan(value)


def test_aupr_without_positives_warns_and_returns_nan():
    with pytest.warns(UndefinedMetricWarning, match="no wrong predictions"):
        assert math.isnan(aupr_score([True, True], [0.2, 0.3], positive="wrong"))
    with pytest.warns(UndefinedMetricWarning, match="no correct predictions"):
        assert math.isnan(aupr_score([False, False], [0.2, 0.3]))
    assert aupr_score([True, True], [0.2, 0.3]) == 1.0  # no negatives: precision is always 1


def test_undefined_metric_warning_is_a_user_warning():
    assert issubclass(UndefinedMetricWarning, UserWarning)


# --------------------------------------------------------------------------- registry, docs
@pytest.mark.parametrize(
    "name, greater_is_better",
    [("auroc", True), ("aupr", True), ("aupr_wrong", True), ("aurc", False), ("eaurc", False),
     ("sac_95", True), ("sac_99", True), ("sac_95_first_drop", True),
     ("sac_99_first_drop", True), ("aurc_c", False), ("eaurc_c", False)],
)
def test_registered(name, greater_is_better):
    spec = get_metric(name)
    assert spec.kind == "selective"
    assert {"permutation_invariant", "monotone_invariant"} <= spec.properties
    assert spec.greater_is_better is greater_is_better


def test_registered_sac_wrappers():
    _, _, c, k = examples.model_b()
    assert get_metric("sac_95").func.__name__ == "sac_95_score"
    assert get_metric("sac_95").func(c, k) == sac_score(c, k, accuracy=0.95) == 0.4
    assert get_metric("sac_99").func(c, k) == 0.4
    assert get_metric("aupr_wrong").func(c, k) == aupr_score(c, k, positive="wrong")


def test_registered_sac_wrappers_use_their_own_level():
    # model_b above gives 0.4 at both levels, so it cannot tell 0.95 from 0.99. Here, N = 200
    # ranked by κ descending without ties, the top-i correct count C_i is: i for i <= 100,
    # 100 at i = 101 (error), i - 1 for i = 102..130, 129 at i = 131 (error), i - 2 for
    # i = 132..160, then 158 for i = 161..200 (40 errors); accuracy a_i = C_i / i.
    c = [1] * 100 + [0] + [1] * 29 + [0] + [1] * 29 + [0] * 40
    k = np.linspace(1, 0, 200)
    # "largest" (max k/N with a_k >= α):
    #   α = 0.95: a_160 = 158/160, and past it 158/i >= 0.95 iff i <= 166.3: a_166 = 0.9518,
    #             a_167 = 0.9461                                         -> 166/200 = 0.83
    #   α = 0.99: a_101 = 100/101 = 0.990099 >= 0.99, (i-1)/i >= 0.99 for i >= 100 up to
    #             a_130 = 129/130; a_131 = 129/131 = 0.9847 and (i-2)/i < 0.99 for i < 200,
    #             158/160 = 0.9875 < 0.99, a_i decreasing after 160      -> 130/200 = 0.65
    # "first_drop" with the default burn_in = 200 = N: only j_0, the 0-based index of the
    # first a_i < α, counts, and the result is j_0 / (N + 1):
    #   α = 0.95: first a_i < 0.95 is a_167 (a_101, a_131 >= 0.95) -> j_0 = 166 -> 166/201
    #   α = 0.99: first a_i < 0.99 is a_131 (a_101 = 0.990099)     -> j_0 = 130 -> 130/201
    sac = {name: get_metric(name).func(c, k) for name in
           ("sac_95", "sac_99", "sac_95_first_drop", "sac_99_first_drop")}
    assert sac == {"sac_95": 166 / 200, "sac_99": 130 / 200,
                   "sac_95_first_drop": 166 / 201, "sac_99_first_drop": 130 / 201}
    assert sac["sac_95"] == sac_score(c, k, accuracy=0.95) == 0.83
    assert sac["sac_99"] == sac_score(c, k, accuracy=0.99) == 0.65


def test_doctests():
    result = doctest.testmod(uqmetrics.metrics.selective)
    assert result.attempted > 0 and result.failed == 0
