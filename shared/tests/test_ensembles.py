"""Tests of uqmetrics.metrics.ensembles: averaging in log space, the size curve and the deep ensemble
equivalent (docs/conventions.md#s-3)."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

from uqmetrics.metrics import ensembles
from uqmetrics.metrics.calibration import (
    calibrated_log_likelihood,
    log_softmax,
    temperature_scaled_metrics,
)
from uqmetrics.metrics.classification import accuracy_score, nll_loss
from uqmetrics.metrics.ensembles import (
    DeepEnsembleEquivalent,
    deep_ensemble_equivalent,
    deep_ensemble_equivalent_curve,
    ensemble_log_probs,
    ensemble_probs,
    ensemble_size_curve,
)
from uqmetrics.runs.testing.strategies import member_log_probs_and_labels


def _members(n_members=4, n=300, n_classes=5, noise=2.0, seed=0):
    """Members = shared signal + independent noise; labels from the signal."""
    rng = np.random.default_rng(seed)
    signal = rng.normal(0, 2.0, size=(n, n_classes))
    p = np.exp(log_softmax(signal))
    labels = (p.cumsum(1) < rng.uniform(size=(n, 1))).sum(1).clip(max=n_classes - 1)
    logits = signal[None] + rng.normal(0, noise, size=(n_members, n, n_classes))
    return log_softmax(logits), labels


# ----------------------------------------------------------------------------------------------
# Averaging
# ----------------------------------------------------------------------------------------------


def test_ensemble_log_probs_is_log_of_mean_probs():
    lp, _ = _members()
    np.testing.assert_allclose(ensemble_log_probs(lp), np.log(np.exp(lp).mean(0)), rtol=1e-12)
    np.testing.assert_allclose(ensemble_probs(lp), np.exp(lp).mean(0), rtol=1e-12)
    np.testing.assert_allclose(ensemble_probs(lp).sum(1), 1.0, rtol=1e-12)


def test_ensemble_log_probs_keeps_tiny_probabilities():
    # members with log-probabilities far below float underflow of exp
    lp = np.array([[[0.0, -2000.0]], [[0.0, -2000.0 - np.log(3)]]])
    out = ensemble_log_probs(lp)
    assert out[0, 1] == pytest.approx(-2000.0 + np.log((1 + 1 / 3) / 2), rel=1e-14)


@given(member_log_probs_and_labels(), st.integers(2, 4))
@settings(max_examples=30)
def test_ensemble_of_identical_members_is_the_member(data, k):
    _, lp = data
    member = lp[0]
    np.testing.assert_allclose(ensemble_log_probs(np.stack([member] * k)), member,
                               atol=1e-12, rtol=0)


@given(member_log_probs_and_labels())
@settings(max_examples=40)
def test_ensemble_nll_at_most_mean_member_nll(data):
    # Jensen: -log mean_k p_k <= mean_k -log p_k, per sample, hence for the mean NLL. The
    # strategy's probabilities are >= e^-16 / C, far above the 1e-12 clip.
    labels, lp = data
    ens = nll_loss(labels, ensemble_probs(lp))
    members = np.mean([nll_loss(labels, np.exp(m)) for m in lp])
    assert ens <= members + 1e-12 * (1 + abs(members))


# ----------------------------------------------------------------------------------------------
# Size curve
# ----------------------------------------------------------------------------------------------


def test_size_curve_shape_orders_and_values():
    lp, y = _members(n_members=4, n=200)
    ds = ensemble_size_curve(lp, y, metrics=("accuracy", "nll"), n_orders=3, seed=1)
    assert isinstance(ds, xr.Dataset)
    assert dict(ds["nll"].sizes) == {"order": 3, "size": 4}
    assert ds["size"].values.tolist() == [1, 2, 3, 4]
    orders = ds["member_order"].values
    assert orders[0].tolist() == [0, 1, 2, 3]
    assert all(sorted(o) == [0, 1, 2, 3] for o in orders)
    for o in range(3):
        first = orders[o][0]
        assert float(ds["nll"][o, 0]) == pytest.approx(nll_loss(y, np.exp(lp[first])), rel=1e-12)
        pair = orders[o][:2]
        assert float(ds["accuracy"][o, 1]) == accuracy_score(y, ensemble_probs(lp[pair]))
    # the full ensemble is the same set in every order
    np.testing.assert_allclose(ds["nll"].sel(size=4), nll_loss(y, ensemble_probs(lp)),
                               rtol=1e-12)
    assert ds["nll"].attrs["greater_is_better"] == 0
    assert "cll" not in ds


def test_size_curve_calibrated_adds_cll():
    lp, y = _members(n_members=3, n=200)
    ds = ensemble_size_curve(lp, y, metrics=("nll",), n_orders=2, calibrated=True,
                             n_repeats=2, seed=0, calibrated_metrics=("brier",))
    assert dict(ds["cll"].sizes) == {"order": 2, "size": 3}
    order = ds["member_order"].values[1]
    # order 1 redraws the test_cv halves: seed + 1 (docs/conventions.md#s-3)
    assert ds["split_seed"].values.tolist() == [0, 1]
    pair = ensemble_log_probs(lp[order[:2]])
    expected = calibrated_log_likelihood(pair, y, n_repeats=2, seed=1)
    assert float(ds["cll"][1, 1]) == pytest.approx(expected, rel=1e-12)
    assert ds["cll"].attrs["greater_is_better"] == 1
    ts = temperature_scaled_metrics(pair, y, protocol="test_cv", metrics=("brier",),
                                    n_repeats=2, seed=1)
    assert float(ds["calibrated_brier"][1, 1]) == pytest.approx(
        float(ts["brier"].sel(calibration="temperature")), rel=1e-12)
    assert ds["calibrated_brier"].attrs["greater_is_better"] == 0
    # the former convention (one split seed everywhere) stays available
    same = ensemble_size_curve(lp, y, metrics=("nll",), n_orders=2, calibrated=True,
                               n_repeats=2, seed=0, redraw_splits=False)
    assert same["split_seed"].values.tolist() == [0, 0]
    assert float(same["cll"][1, 1]) == pytest.approx(
        calibrated_log_likelihood(pair, y, n_repeats=2, seed=0), rel=1e-12)


def test_size_curve_spread_at_full_size_comes_from_the_redrawn_splits():
    # At full size every order holds the same members: with one split seed for all orders the
    # spread of CLL over orders is exactly 0 there (the zero-width DEE bound S.3 rules out);
    # redrawn halves give it the test_cv noise.
    lp, y = _members(n_members=3, n=300, seed=4)
    kw = {"metrics": ("nll",), "n_orders": 4, "calibrated": True, "n_repeats": 2}
    fixed = ensemble_size_curve(lp, y, redraw_splits=False, **kw)["cll"].values[:, -1]
    redrawn = ensemble_size_curve(lp, y, **kw)["cll"].values[:, -1]
    assert np.ptp(fixed) < 1e-9  # float rounding of the member order only
    assert np.std(redrawn, ddof=1) > 1e-4


def test_size_curve_orders_redraw_the_members_draws():
    lp, y = _members(n_members=3, n=150, seed=5)
    other, _ = _members(n_members=3, n=150, seed=6)
    draws = np.stack([lp, other])  # (draw, member, n, C)
    ds = ensemble_size_curve(draws, y, metrics=("nll",), n_orders=3, seed=2)
    assert ds["draw"].values.tolist() == [0, 1, 0] and ds.attrs["n_draws"] == 2
    for o in range(3):
        perm = ds["member_order"].values[o]
        for s in (1, 3):
            expected = nll_loss(y, ensemble_probs(draws[o % 2][perm[:s]]))
            assert float(ds["nll"][o, s - 1]) == pytest.approx(expected, rel=1e-12)
    # a single draw is the plain (member, n, C) case
    one = ensemble_size_curve(lp[None], y, metrics=("nll",), n_orders=3, seed=2)
    plain = ensemble_size_curve(lp, y, metrics=("nll",), n_orders=3, seed=2)
    np.testing.assert_array_equal(one["nll"].values, plain["nll"].values)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"metrics": ("cll",)}, "calibrated=True"),
        ({"metrics": ("gaussian_nll",)}, "classification metrics"),
        ({"n_orders": 0}, "n_orders"),
        ({"seed": 1.5}, "seed"),
        ({"calibrated_metrics": ("auroc",)}, "calibrated_metrics must be classification"),
    ],
)
def test_size_curve_bad_options(kwargs, match):
    lp, y = _members(n_members=2, n=20)
    with pytest.raises(ValueError, match=match):
        ensemble_size_curve(lp, y, **kwargs)


# ----------------------------------------------------------------------------------------------
# Deep ensemble equivalent
# ----------------------------------------------------------------------------------------------


def test_dee_interpolation_hand_case():
    sizes, mean, std = [1, 2, 3], [-1.0, -0.5, -0.25], [0.125] * 3
    # -0.75 is halfway between -1 (size 1) and -0.5 (size 2)
    r = deep_ensemble_equivalent(-0.75, sizes, mean, std)
    assert isinstance(r, DeepEnsembleEquivalent)
    assert (r.dee, r.lower, r.upper, r.capped, r.cap) == (1.5, 1.25, 1.75, False, 3.0)
    # between sizes 2 and 3
    assert deep_ensemble_equivalent(-0.375, sizes, mean).dee == 2.5
    # no std: bounds collapse onto the DEE
    r = deep_ensemble_equivalent(-0.375, sizes, mean)
    assert r.lower == r.dee == r.upper


def test_dee_cap_and_floor():
    sizes, mean, std = [1, 2, 3], [-1.0, -0.5, -0.25], [0.125] * 3
    above = deep_ensemble_equivalent(-0.1, sizes, mean, std)
    assert above.capped and above.dee == 3.0 and above.cap == 3.0
    assert above.lower == 3.0  # -0.1 is above mean + std everywhere as well
    below = deep_ensemble_equivalent(-5.0, sizes, mean, std)
    assert not below.capped and below.dee == below.lower == below.upper == 1.0
    # upper bound capped while the DEE is not
    r = deep_ensemble_equivalent(-0.3, sizes, mean, std)
    assert not r.capped and r.upper == 3.0 and r.dee == pytest.approx(2.8)


def test_dee_vectorised_and_first_crossing_of_non_monotone_curve():
    sizes = np.arange(1, 6)
    mean = np.array([-1.0, -0.5, -0.75, -0.25, -0.5])
    r = deep_ensemble_equivalent(np.array([-0.6, -0.3, 0.0]), sizes, mean)
    # -0.6 is first reached on (1, 2]; -0.3 only on (3, 4]
    np.testing.assert_allclose(r.dee, [1.8, 3 + 0.45 / 0.5, 5.0])
    np.testing.assert_array_equal(r.capped, [False, False, True])
    assert r.dee.shape == (3,)


def test_dee_of_a_strictly_increasing_curve_at_its_sizes_is_exact():
    sizes = np.arange(1, 11)
    mean = -1.0 / np.sqrt(sizes) - 0.3
    r = deep_ensemble_equivalent(mean, sizes, mean)
    np.testing.assert_array_equal(r.dee, sizes)
    assert not r.capped.any()


def test_dee_of_deep_ensemble_against_its_own_curve():
    # DEE(own CLL at k) = k exactly where CLL(k) exceeds all earlier values (a record of the
    # mean curve), and < k otherwise; never above k.
    lp, y = _members(n_members=5, n=300, noise=3.0, seed=2)
    ds = ensemble_size_curve(lp, y, metrics=("nll",), n_orders=3, calibrated=True, n_repeats=2)
    mean = ds["cll"].mean("order").values
    std = ds["cll"].std("order").values
    sizes = ds["size"].values
    r = deep_ensemble_equivalent(mean, sizes, mean, std)
    record = np.array([mean[k] > mean[:k].max(initial=-np.inf) for k in range(len(mean))])
    np.testing.assert_array_equal(r.dee[record], sizes[record])
    assert np.all(r.dee[~record] < sizes[~record])
    assert np.all(r.lower <= r.dee) and np.all(r.dee <= r.upper)
    # more independent members help: the 5-member ensemble beats the single network
    assert mean[-1] > mean[0]


def test_dee_of_a_loss_mirrors_the_dee_of_its_negation():
    sizes, mean, std = [1, 2, 3], [1.0, 0.5, 0.25], [0.125] * 3
    loss = deep_ensemble_equivalent(0.75, sizes, mean, std, greater_is_better=False)
    score = deep_ensemble_equivalent(-0.75, sizes, [-m for m in mean], std)
    assert (loss.dee, loss.lower, loss.upper) == (score.dee, score.lower, score.upper) \
        == (1.5, 1.25, 1.75)


def test_dee_curve_of_the_deep_ensemble_against_itself_is_its_size_with_sample_std_bounds():
    lp, y = _members(n_members=5, n=400, noise=3.0, seed=7)
    cll = ensemble_size_curve(lp, y, metrics=("nll",), n_orders=5, calibrated=True,
                              n_repeats=2)["cll"].values
    mean = cll.mean(0)
    assert np.all(np.diff(mean) > 0)  # the premise: each member raises the mean CLL
    r = deep_ensemble_equivalent_curve(cll, cll)
    np.testing.assert_array_equal(r.dee, np.arange(1, 6))
    assert r.cap == 5.0 and not r.capped.any()
    # the bounds use the sample std (ddof = 1), wider than the population std (ddof = 0)
    sizes = np.arange(1, 6)
    ref = deep_ensemble_equivalent(mean, sizes, mean, cll.std(0, ddof=1))
    np.testing.assert_array_equal(r.lower, ref.lower)
    np.testing.assert_array_equal(r.upper, ref.upper)
    narrow = deep_ensemble_equivalent_curve(cll, cll, ddof=0)
    assert np.all(narrow.upper <= r.upper) and np.all(narrow.lower >= r.lower)
    assert np.any(narrow.upper < r.upper)
    # redrawn splits: the bound has width at full size as well
    assert r.lower[-1] < 5.0


def test_dee_curve_drops_trailing_nan_sizes_and_checks_its_input():
    de = np.array([[-1.0, -0.5, -0.25], [-1.0, -0.5, -0.25]])
    method = np.array([[-0.75, np.nan, np.nan], [-0.75, np.nan, np.nan]])
    r = deep_ensemble_equivalent_curve(method, de)
    assert r.dee.tolist() == [1.5] and r.lower.tolist() == r.upper.tolist() == [1.5]
    single = deep_ensemble_equivalent_curve(method[:1], de[:1])  # one order: std taken as 0
    assert single.lower.tolist() == [1.5]
    with pytest.raises(ValueError, match="method_values must be finite for sizes 1..k"):
        deep_ensemble_equivalent_curve([[np.nan, -0.5]], de)
    with pytest.raises(ValueError, match="ddof must be >= 0"):
        deep_ensemble_equivalent_curve(method, de, ddof=-1)


@given(
    st.lists(st.floats(-3, 0, width=64), min_size=1, max_size=8),
    st.lists(st.floats(0, 1, width=64), min_size=8, max_size=8),
    st.floats(-4, 1, width=64),
)
@settings(max_examples=50)
def test_dee_bounds_are_ordered_and_within_sizes(mean, std, c):
    mean = np.array(mean)
    std = np.array(std[: len(mean)])
    sizes = np.arange(1, len(mean) + 1)
    r = deep_ensemble_equivalent(c, sizes, mean, std)
    assert 1.0 <= r.lower <= r.dee <= r.upper <= r.cap == len(mean)
    # the DEE reaches the target (unless capped) and nothing earlier does
    if not r.capped:
        assert np.interp(r.dee, sizes, mean) >= c - 1e-12
    if not r.capped and r.dee > 1:
        grid = np.linspace(1, r.dee, 50)[:-1]
        assert np.all(np.interp(grid, sizes, mean) < c + 1e-12)


@pytest.mark.parametrize(
    "args, match",
    [
        ((np.nan, [1, 2], [-1.0, -0.5]), "method_cll contains non-finite"),
        (([], [1, 2], [-1.0, -0.5]), "method_cll is empty"),
        ((-0.7, [1, 1], [-1.0, -0.5]), "de_sizes must be strictly increasing"),
        ((-0.7, [0, 1], [-1.0, -0.5]), "de_sizes must be strictly increasing and >= 1"),
        ((-0.7, [1, 2], [-1.0]), "same number of samples"),
        ((-0.7, [1, 2], [-1.0, np.inf]), "de_cll_mean contains non-finite"),
        ((-0.7, [1, 2], [-1.0, -0.5], [0.1, -0.1]), "de_cll_std must be >= 0"),
        ((-0.7, [1, 2], [-1.0, -0.5], [0.1]), "same number of samples"),
    ],
)
def test_dee_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        deep_ensemble_equivalent(*args)


# ----------------------------------------------------------------------------------------------
# Validation of member log-probabilities
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lp, match",
    [
        (np.log([[0.5, 0.5]]), r"member_log_probs must have shape \(member, n_samples"),
        (np.array([[[1.0, 2.0]]]), "member_log_probs must be normalised log-probabilities"),
        (np.array([[[np.nan, 0.0]]]), "member_log_probs contains non-finite"),
        (np.array([[[-np.inf, 0.0]]]), "member_log_probs contains non-finite"),
        (np.empty((0, 1, 2)), "member_log_probs is empty"),
        (np.zeros((1, 1, 1)), "at least 2 classes"),
    ],
)
def test_member_log_probs_validation(lp, match):
    with pytest.raises(ValueError, match=match):
        ensemble_log_probs(lp)


def test_size_curve_label_validation():
    lp = np.log(np.full((2, 3, 2), 0.5))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        ensemble_size_curve(lp, [0, 1, 2])
    with pytest.raises(ValueError, match="same number of samples"):
        ensemble_size_curve(lp, [0, 1])


def test_doctests_pass():
    result = doctest.testmod(ensembles, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
