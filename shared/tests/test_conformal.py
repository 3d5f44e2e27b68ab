"""Tests of uqmetrics.metrics.conformal: split conformal prediction sets (docs/conventions.md#s-8)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from uqmetrics import CONVENTIONS, InputError
from uqmetrics.metrics.conformal import (
    CONFORMAL_SCORES,
    RAPS_TUNE_FRACTION,
    SSCV_SIZE_BINS,
    aps_scores,
    choose_raps_params,
    conformal_calibrations,
    conformal_quantile,
    conformal_quantile_by_class,
    conformal_trials,
    coverage,
    covgap,
    empty_fraction,
    mean_set_size,
    median_set_size,
    min_calibration_size,
    prediction_sets,
    random_splits,
    raps_scores,
    set_sizes,
    sscv,
    thr_scores,
)


def _dirichlet(n, c, seed, conc=0.5):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(c, conc), size=n)
    y = (rng.random(n)[:, None] > np.cumsum(p, axis=1)).sum(axis=1).clip(0, c - 1)
    return p, y


# --------------------------------------------------------------------------------------------
# by hand


def test_thr_scores_by_hand():
    p = [[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]
    np.testing.assert_allclose(thr_scores(p, [1, 2]), [0.8, 0.2])
    np.testing.assert_allclose(thr_scores(p), [[0.3, 0.8, 0.9], [0.9, 0.9, 0.2]])


def test_aps_scores_by_hand_ties_by_class_index():
    p = [[0.4, 0.4, 0.2]]  # classes 0 and 1 tie: class 0 ranks first
    np.testing.assert_allclose(aps_scores(p), [[0.4, 0.8, 1.0]])
    np.testing.assert_allclose(aps_scores(p, u=[0.5]), [[0.2, 0.6, 0.9]])
    np.testing.assert_allclose(aps_scores(p, [1], u=[0.5]), [0.6])
    np.testing.assert_allclose(aps_scores(p, [2]), [1.0])


def test_aps_randomized_uses_one_uniform_per_sample_from_rng():
    p, _ = _dirichlet(6, 4, 0)
    u = np.random.default_rng(3).uniform(size=6)
    got = aps_scores(p, randomized=True, rng=np.random.default_rng(3))
    np.testing.assert_allclose(got, aps_scores(p, u=u))
    with pytest.raises(InputError, match="rng"):
        aps_scores(p, randomized=True)


def test_raps_scores_by_hand():
    p = [[0.5, 0.3, 0.2]]
    # ranks 1, 2, 3; penalty lam * max(0, rank - k_reg)
    np.testing.assert_allclose(raps_scores(p, k_reg=1, lam=0.1), [[0.5, 0.9, 1.2]])
    np.testing.assert_allclose(raps_scores(p, [2], k_reg=1, lam=0.1, u=[0.5]), [0.9 + 0.2])
    np.testing.assert_allclose(raps_scores(p, k_reg=0, lam=0.0), aps_scores(p))


def test_score_registry():
    assert CONFORMAL_SCORES.names() == ["thr", "aps", "raps"]
    assert CONFORMAL_SCORES.lookup("aps") is aps_scores
    with pytest.raises(ValueError, match="valid conformal scores: thr, aps, raps"):
        CONFORMAL_SCORES.lookup("naive")


@pytest.mark.parametrize(("n", "alpha", "k"), [(5, 0.4, 4), (9, 0.1, 9), (99, 0.1, 90),
                                               (19, 0.05, 19), (999, 0.1, 900)])
def test_conformal_quantile_index(n, alpha, k):
    scores = np.random.default_rng(n).permutation(np.arange(1, n + 1)) / n  # k-th smallest k/n
    assert conformal_quantile(scores, alpha) == pytest.approx(k / n)


def test_conformal_quantile_by_hand_and_inf():
    assert conformal_quantile([0.5, 0.1, 0.4, 0.2, 0.3], 0.4) == 0.4
    assert conformal_quantile([0.5, 0.1], 0.1) == math.inf  # k = ceil(2.7) = 3 > 2
    s = np.array([[0.5, 0.1, 0.4, 0.2, 0.3], [1, 2, 3, 4, 5]])
    np.testing.assert_array_equal(conformal_quantile(s, 0.4), [0.4, 4])
    assert conformal_quantile(np.zeros((2, 3, 4)), 0.5).shape == (2, 3)
    # infinite scores (-log 0) are ordered as any other: k = ceil(5 * 0.6) = 3, then 4
    assert conformal_quantile([0.1, math.inf, 0.3, 0.2], 0.4) == 0.3
    assert conformal_quantile([0.1, math.inf, 0.3, 0.2], 0.2) == math.inf
    assert conformal_quantile([-math.inf, 0.3, 0.2, 0.1], 0.4) == 0.2


def test_conformal_quantile_by_class_by_hand():
    q = conformal_quantile_by_class([0.1, 0.2, 0.3, 0.9, 0.5], [0, 0, 0, 1, 0], 0.5, 3)
    # class 0: 4 scores, k = ceil(5 * 0.5) = 3 -> 0.3; class 1: k = 1 -> 0.9; class 2: empty
    np.testing.assert_array_equal(q, [0.3, 0.9, np.inf])
    s = np.array([[0.1, 0.2, 0.3, 0.9, 0.5], [0.9, 0.8, 0.7, 0.6, 0.5]])
    y = np.array([[0, 0, 0, 1, 0], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(conformal_quantile_by_class(s, y, 0.5, 2),
                                  [[0.3, 0.9], [np.inf, 0.7]])


def test_prediction_sets_marginal_classwise_and_trials():
    s = np.array([[0.1, 0.5, 0.9], [0.6, 0.2, 0.5]])
    np.testing.assert_array_equal(prediction_sets(s, 0.5), [[1, 1, 0], [0, 1, 1]])
    np.testing.assert_array_equal(prediction_sets(s, [0.6, 0.1, 1.0]), [[1, 0, 1], [1, 0, 1]])
    s3 = np.stack([s, s])
    np.testing.assert_array_equal(prediction_sets(s3, [0.0, 1.0]),
                                  [np.zeros((2, 3)), np.ones((2, 3))])
    with pytest.raises(InputError, match="qhat must have shape"):
        prediction_sets(s, [0.1, 0.2])


def test_set_metrics_by_hand():
    sets = np.array([[1, 0, 0], [1, 1, 0], [0, 1, 1], [0, 0, 0]], dtype=bool)
    y = np.array([1, 0, 0, 2])
    assert coverage(sets, y) == 0.25
    np.testing.assert_array_equal(set_sizes(sets), [1, 2, 2, 0])
    assert mean_set_size(sets) == 1.25
    assert median_set_size(sets) == 1.5
    assert empty_fraction(sets) == 0.25
    # strata 0-1: samples 0, 3, none covered -> |0 - 0.9|; 2-3: samples 1, 2, 1/2 -> 0.4
    assert sscv(sets, y, 0.1) == pytest.approx(0.9)
    assert sscv(sets, y, 0.1, size_bins=((2, 3),)) == pytest.approx(0.4)
    assert math.isnan(sscv(sets, y, 0.1, size_bins=((5, 6),)))
    # class 0: 1/2 covered, class 1: 0/1, class 2: 0/1 -> mean |c - 0.9| = (0.4 + 0.9 + 0.9) / 3
    assert covgap(sets, y, 0.1, 3) == pytest.approx(2.2 / 3)
    # a class absent from the labels is left out of the mean
    assert covgap(sets[:3], y[:3], 0.1, 3) == pytest.approx((0.4 + 0.9) / 2)
    both = np.stack([sets, sets])
    np.testing.assert_allclose(coverage(both, np.stack([y, y])), [0.25, 0.25])


def test_sscv_default_bins_are_the_official_code_strata():
    assert SSCV_SIZE_BINS == ((0, 1), (2, 3), (4, 6), (7, 10), (11, 100), (101, 1000))


def test_choose_raps_params_kreg_and_lam_by_brute_force():
    p, y = _dirichlet(300, 10, 5)
    u = np.random.default_rng(6).uniform(size=300)
    k_reg, lam = choose_raps_params(p, y, 0.1, u=u)
    rank0 = (p > p[np.arange(300), y][:, None]).sum(axis=1)  # Dirichlet: no ties
    assert k_reg == int(np.quantile(rank0, 0.9, method="higher")) + 1
    sizes = []
    for g in (1e-3, 1e-2, 1e-1, 0.2, 0.5):  # the official pick_lamda_size grid
        q = conformal_quantile(raps_scores(p, y, k_reg=k_reg, lam=g, u=u), 0.1)
        sizes.append(prediction_sets(raps_scores(p, k_reg=k_reg, lam=g, u=u), q).sum(1).mean())
    assert lam == (1e-3, 1e-2, 1e-1, 0.2, 0.5)[int(np.argmin(sizes))]
    assert choose_raps_params(p, y, 0.1, u=u, kreg_quantile=0.5)[0] == int(
        np.quantile(rank0, 0.5, method="higher")) + 1


def test_random_splits_are_seeded_permutations():
    a = random_splits(10, 4, 3, 7)
    b = random_splits(10, 4, 3, np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    assert a.shape == (3, 10)
    np.testing.assert_array_equal(np.sort(a, axis=1), np.tile(np.arange(10), (3, 1)))
    with pytest.raises(InputError, match="n_cal must be < n = 10"):
        random_splits(10, 10, 3, 0)


@pytest.mark.parametrize("score", ["thr", "aps", "raps"])
@pytest.mark.parametrize("mondrian", [False, True])
def test_conformal_trials_matches_the_public_functions(score, mondrian):
    p, y = _dirichlet(400, 5, 1)
    n_cal, trials, seed = 150, 4, 11
    out = conformal_trials(p, y, score=score, alpha=0.2, n_cal=n_cal, trials=trials,
                           seed=seed, mondrian=mondrian)
    rng = np.random.default_rng(seed)
    perms = random_splits(400, n_cal, trials, rng)
    u = rng.uniform(size=(trials, 400)) if score != "thr" else None
    n_tune = math.ceil(RAPS_TUNE_FRACTION * n_cal) if score == "raps" else 0
    for t in range(trials):
        tune, cal, test = perms[t, :n_tune], perms[t, n_tune:n_cal], perms[t, n_cal:]
        kw = {}
        if score == "raps":
            k, lam = choose_raps_params(p[tune], y[tune], 0.2, u=u[t, tune])
            assert (out["k_reg"][t], out["lam"][t]) == (k, lam)
            kw = {"k_reg": k, "lam": lam}
        f = CONFORMAL_SCORES.lookup(score)
        s_cal = f(p[cal], y[cal], u=None if u is None else u[t, cal], **kw)
        q = (conformal_quantile_by_class(s_cal, y[cal], 0.2, 5) if mondrian
             else conformal_quantile(s_cal, 0.2))
        np.testing.assert_array_equal(out["qhat"][t], q)
        sets = prediction_sets(f(p[test], u=None if u is None else u[t, test], **kw), q)
        assert out["coverage"][t] == coverage(sets, y[test])
        assert out["mean_set_size"][t] == mean_set_size(sets)
        assert out["median_set_size"][t] == median_set_size(sets)
        assert out["sscv"][t] == sscv(sets, y[test], 0.2)
        assert out["covgap"][t] == pytest.approx(covgap(sets, y[test], 0.2, 5), abs=1e-15)
        assert out["empty_fraction"][t] == empty_fraction(sets)


@pytest.mark.parametrize(("score", "mondrian", "randomized"), [
    ("thr", False, True), ("aps", False, True), ("aps", False, False), ("raps", False, True),
    ("aps", True, True)])
def test_conformal_calibrations_are_those_of_conformal_trials(score, mondrian, randomized):
    """The splits, uniforms, RAPS parameters and thresholds conformal_trials evaluates, by the
    public functions; its test sets reproduce conformal_trials' coverage and sizes."""
    p, y = _dirichlet(300, 5, 3)
    n_cal, trials, seed = 120, 4, 7
    cal = conformal_calibrations(p, y, score=score, alpha=0.1, n_cal=n_cal, trials=trials,
                                 seed=seed, mondrian=mondrian, randomized=randomized)
    out = conformal_trials(p, y, score=score, alpha=0.1, n_cal=n_cal, trials=trials, seed=seed,
                           mondrian=mondrian, randomized=randomized)
    rng = np.random.default_rng(seed)
    perms = random_splits(300, n_cal, trials, rng)
    u = (rng.uniform(size=(trials, 300)) if randomized and score != "thr"
         else np.ones((trials, 300)))
    n_tune = math.ceil(RAPS_TUNE_FRACTION * n_cal) if score == "raps" else 0
    np.testing.assert_array_equal(cal.perms, perms)
    np.testing.assert_array_equal(cal.u, u)
    assert (cal.score, cal.mondrian, cal.n_cal, cal.n_tune) == (score, mondrian, n_cal, n_tune)
    np.testing.assert_array_equal(cal.tune, perms[:, :n_tune])
    np.testing.assert_array_equal(cal.calibration, perms[:, n_tune:n_cal])
    np.testing.assert_array_equal(cal.test, perms[:, n_cal:])
    np.testing.assert_array_equal(cal.qhat, out["qhat"])
    assert cal.qhat.shape == ((trials, 5) if mondrian else (trials,))
    if score == "raps":
        np.testing.assert_array_equal(cal.k_reg, out["k_reg"])
        np.testing.assert_array_equal(cal.lam, out["lam"])
    else:
        assert not cal.k_reg.any() and not cal.lam.any()
    f = CONFORMAL_SCORES.lookup(score)
    for t in range(trials):
        kw = {"k_reg": int(cal.k_reg[t]), "lam": float(cal.lam[t])} if score == "raps" else {}
        if score == "raps":
            assert (cal.k_reg[t], cal.lam[t]) == choose_raps_params(
                p[cal.tune[t]], y[cal.tune[t]], 0.1, u=u[t, cal.tune[t]])
        c_idx, t_idx = cal.calibration[t], cal.test[t]
        s_cal = f(p[c_idx], y[c_idx], u=u[t, c_idx], **kw)
        q = (conformal_quantile_by_class(s_cal, y[c_idx], 0.1, 5) if mondrian
             else conformal_quantile(s_cal, 0.1))
        np.testing.assert_array_equal(cal.qhat[t], q)
        sets = prediction_sets(f(p[t_idx], u=u[t, t_idx], **kw), cal.qhat[t])
        assert out["coverage"][t] == coverage(sets, y[t_idx])
        assert out["mean_set_size"][t] == mean_set_size(sets)
    with pytest.raises(InputError, match="n_tune must be < n_cal = 50"):
        conformal_calibrations(p, y, score="raps", n_cal=50, trials=3, seed=0, n_tune=50)
    with pytest.raises(InputError, match="raps_params is only for score='raps'"):
        conformal_calibrations(p, y, score="aps", n_cal=50, trials=3, seed=0, raps_params=(1, 0.1))


def test_conformal_trials_fixed_raps_params_and_errors():
    p, y = _dirichlet(100, 4, 2)
    out = conformal_trials(p, y, score="raps", n_cal=50, trials=3, seed=0, raps_params=(2, 0.1))
    np.testing.assert_array_equal(out["k_reg"], [2, 2, 2])
    with pytest.raises(InputError, match="score must be one of"):
        conformal_trials(p, y, score="lac", n_cal=50, trials=3, seed=0)
    with pytest.raises(InputError, match="n_tune must be < n_cal = 50"):
        conformal_trials(p, y, score="raps", n_cal=50, trials=3, seed=0, n_tune=50)
    with pytest.raises(InputError, match="alpha must lie in"):
        conformal_quantile([1.0, 2.0], 1.0)
    with pytest.raises(InputError, match="probs rows must sum to 1"):
        aps_scores([[0.5, 0.6]])
    with pytest.raises(InputError, match=r"u must have shape \(1,\)"):
        aps_scores([[0.5, 0.5]], u=[0.1, 0.2])


def test_conventions_entries():
    for name in ("conformal_scores", "conformal_quantile", "conformal_sets", "raps_tuning",
                 "conformal_coverage", "mean_set_size", "median_set_size", "sscv", "covgap",
                 "empty_fraction", "conformal_trials"):
        assert CONVENTIONS[name].startswith("S.8: "), name


# --------------------------------------------------------------------------------------------
# properties


def _expected_coverage_and_se(n_pool, n_cal, alpha, trials):
    """Exact mean and standard error of the mean test coverage over ``trials`` random splits.

    Conditionally on the pool of ``n_pool`` samples with distinct scores, a uniformly random
    split makes ``qhat`` the ``k``-th smallest of ``n_cal`` scores drawn without replacement,
    ``k = ceil((n_cal + 1)(1 - alpha))``; its rank ``R`` in the pool is negative
    hypergeometric, and the covered test samples number ``R - k``. With ``m = n_pool - n_cal``
    test samples::

        E[R] = k (n_pool + 1) / (n_cal + 1)  =>  E[coverage] = k / (n_cal + 1) >= 1 - alpha
        Var[R] = k (n_cal + 1 - k) (n_pool + 1) m / ((n_cal + 1)^2 (n_cal + 2))
        Var[coverage] = Var[R] / m^2

    (the exact split-conformal guarantee, here with equality). The trials are independent
    given the pool, so the mean over ``trials`` has standard error ``sqrt(Var / trials)``; the
    tests allow Z = 5 standard errors either side (two-sided false-alarm probability about
    6e-7 under the normal approximation of a mean of 200 independent terms): a fixed
    statistical tolerance, not a tuned one.
    """
    k = math.ceil(round((n_cal + 1) * (1 - alpha), 10))
    m = n_pool - n_cal
    var_r = k * (n_cal + 1 - k) * (n_pool + 1) * m / ((n_cal + 1) ** 2 * (n_cal + 2))
    return k / (n_cal + 1), math.sqrt(var_r / m**2 / trials)


Z = 5.0


@given(seed=st.integers(0, 2**31 - 1), alpha=st.sampled_from([0.05, 0.1, 0.2, 0.3]),
       n_cal=st.integers(20, 200), score=st.sampled_from(["thr", "aps", "raps"]))
def test_coverage_guarantee_over_random_splits(seed, alpha, n_cal, score):
    n_pool, trials = 500, 200
    p, y = _dirichlet(n_pool, 6, seed)
    kw = {"raps_params": (2, 0.05)} if score == "raps" else {}
    out = conformal_trials(p, y, score=score, alpha=alpha, n_cal=n_cal, trials=trials,
                           seed=seed, **kw)
    mean, se = _expected_coverage_and_se(n_pool, n_cal, alpha, trials)
    if mean > 1:  # k > n_cal: every set is full
        assert np.all(out["coverage"] == 1)
        return
    assert mean >= 1 - alpha
    assert abs(out["coverage"].mean() - mean) <= Z * se


@given(seed=st.integers(0, 2**31 - 1), alpha=st.sampled_from([0.1, 0.2]))
def test_coverage_guarantee_with_raps_tuning_split(seed, alpha):
    """As above with RAPS tuned per trial on ``n_tune`` calibration samples: given the tuning
    samples, the rest is a uniform random split of ``n_pool - n_tune`` samples into
    ``n_cal - n_tune`` calibration and the test samples, so the same exact mean and variance
    hold with those sizes."""
    n_pool, n_cal, n_tune, trials = 400, 150, 45, 200
    p, y = _dirichlet(n_pool, 6, seed)
    out = conformal_trials(p, y, score="raps", alpha=alpha, n_cal=n_cal, trials=trials,
                           seed=seed, n_tune=n_tune)
    mean, se = _expected_coverage_and_se(n_pool - n_tune, n_cal - n_tune, alpha, trials)
    assert abs(out["coverage"].mean() - mean) <= Z * se


@given(seed=st.integers(0, 2**31 - 1), a1=st.floats(0.01, 0.5), a2=st.floats(0.01, 0.5),
       score=st.sampled_from(["thr", "aps", "raps"]), n=st.integers(5, 60))
def test_sets_nested_in_alpha(seed, a1, a2, score, n):
    a1, a2 = min(a1, a2), max(a1, a2)
    p, y = _dirichlet(n, 5, seed)
    u = np.random.default_rng(seed).uniform(size=n)
    kw = {"k_reg": 1, "lam": 0.1} if score == "raps" else {}
    f = CONFORMAL_SCORES.lookup(score)
    s_all = f(p, u=u, **kw)
    s_cal = f(p, y, u=u, **kw)
    big = prediction_sets(s_all, conformal_quantile(s_cal, a1))
    small = prediction_sets(s_all, conformal_quantile(s_cal, a2))
    assert np.all(small <= big)
    big_c = prediction_sets(s_all, conformal_quantile_by_class(s_cal, y, a1, 5))
    small_c = prediction_sets(s_all, conformal_quantile_by_class(s_cal, y, a2, 5))
    assert np.all(small_c <= big_c)


@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 80),
       score=st.sampled_from(["thr", "aps", "raps"]))
def test_permutation_invariance(seed, n, score):
    p, y = _dirichlet(n, 4, seed)
    rng = np.random.default_rng(seed)
    u = rng.uniform(size=n)
    perm = rng.permutation(n)
    kw = {"k_reg": 1, "lam": 0.2} if score == "raps" else {}
    f = CONFORMAL_SCORES.lookup(score)
    s_all, s_y = f(p, u=u, **kw), f(p, y, u=u, **kw)
    # scores are per sample: permuting the samples permutes the scores
    np.testing.assert_array_equal(f(p[perm], u=u[perm], **kw), s_all[perm])
    np.testing.assert_array_equal(f(p[perm], y[perm], u=u[perm], **kw), s_y[perm])
    # the quantiles do not depend on the order
    assert conformal_quantile(s_y[perm], 0.2) == conformal_quantile(s_y, 0.2)
    np.testing.assert_array_equal(conformal_quantile_by_class(s_y[perm], y[perm], 0.2, 4),
                                  conformal_quantile_by_class(s_y, y, 0.2, 4))
    # the metrics of fixed sets do not depend on the order
    sets = prediction_sets(s_all, conformal_quantile(s_y, 0.3))
    for metric in (coverage, lambda s, yy: sscv(s, yy, 0.3), lambda s, yy: covgap(s, yy, 0.3, 4)):
        assert metric(sets[perm], y[perm]) == pytest.approx(metric(sets, y), abs=1e-12,
                                                            nan_ok=True)
    for metric in (mean_set_size, median_set_size, empty_fraction):
        assert metric(sets[perm]) == metric(sets)


# --------------------------------------------------------------------------------------------
# issue 36, row 19: the fewest calibration samples that reach a level


@pytest.mark.parametrize("alpha", [0.5, 0.3, 0.2, 0.15, 0.1, 0.05, 0.02, 0.01, 0.001, 1 / 3])
def test_min_calibration_size_is_the_fewest_samples_with_a_finite_threshold(alpha):
    n = min_calibration_size(alpha)
    assert np.isfinite(conformal_quantile(np.linspace(0, 1, n), alpha))
    if n > 1:
        assert conformal_quantile(np.linspace(0, 1, n - 1), alpha) == np.inf
    # Mondrian: per class
    q = conformal_quantile_by_class(np.linspace(0, 1, 2 * n - 1), np.repeat([0, 1], [n, n - 1]),
                                    alpha, 2)
    assert np.isfinite(q[0]) and (n == 1 or q[1] == np.inf)


def test_min_calibration_size_by_hand():
    assert [min_calibration_size(a) for a in (0.1, 0.05, 0.01)] == [9, 19, 99]
    with pytest.raises(InputError, match="alpha"):
        min_calibration_size(1.0)
