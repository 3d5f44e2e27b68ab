"""Issue 38, items 1 and 2: RAPS Table 1's baselines and settings in uqmetrics.metrics.conformal, against
the official code's definitions (aangelopoulos/conformal_classification, ``conformal.py`` and
``experiments/table1.py``) written out here by hand: Naive (``gcq`` at ``tau = 1 - alpha``,
randomized, empty sets allowed), Top-K ("Fixed"), "Platt" temperatures fitted on each trial's
calibration draw, ``pct_paramtune = 0.33`` and the ``pick_lamda_size`` grid."""

from __future__ import annotations

import numpy as np
import pytest

from uqmetrics import InputError
from uqmetrics.metrics.calibration import fit_temperature, softmax
from uqmetrics.metrics.conformal import (
    CONFORMAL_BASELINES,
    RAPS_LAM_GRID,
    RAPS_TUNE_FRACTION,
    RankedProbs,
    aps_scores,
    calibrated_sets,
    conformal_calibrations,
    conformal_quantile,
    conformal_trials,
    coverage,
    empty_fraction,
    evaluate_calibrations,
    mean_set_size,
    prediction_sets,
    random_splits,
    rank_scores,
    topk_threshold,
    trial_temperatures,
)


def _gcq(p: np.ndarray, tau: float, u: np.ndarray | None) -> np.ndarray:
    """The official ``gcq`` (``penalties`` 0, ``allow_zero_sets=True``), one sample at a time:
    ``sizes_base`` = the classes whose cumulative mass is <= tau, plus one; randomized, the last
    of them is dropped where ``U >= V = (tau - mass before it) / its probability``."""
    sets = np.zeros(p.shape, bool)
    for i, row in enumerate(p):
        order = np.argsort(-row, kind="stable")
        ordered = row[order]
        cumsum = np.cumsum(ordered)
        size = min(int((cumsum <= tau).sum()) + 1, row.size)
        if u is not None:
            v = (tau - (cumsum[size - 1] - ordered[size - 1])) / ordered[size - 1]
            size -= int(u[i] >= v)
        sets[i, order[:size]] = True
    return sets


def _fixed(ranks_cal: np.ndarray, ranks_test: np.ndarray, alpha: float,
           u: np.ndarray) -> np.ndarray:
    """The official "Fixed" (Top-K) sizes of ``table1.trial``: ``kstar`` from the calibration
    ranks, ``rand_frac``, and size ``kstar - 1 + (rand > rand_frac)``; the true label covered
    where its rank is within the size (0-based ranks, as the official ``gt_locs``)."""
    gt_cal, gt_val = ranks_cal - 1, ranks_test - 1
    kstar = np.quantile(gt_cal, 1 - alpha, method="higher") + 1
    rand_frac = (((gt_cal <= kstar - 1).mean() - (1 - alpha))
                 / ((gt_cal <= kstar - 1).mean() - (gt_cal <= kstar - 2).mean()))
    sizes = kstar - 1 + (u > rand_frac).astype(int)
    return sizes, gt_val <= sizes - 1


def _confident(n=400, c=6, seed=0):
    """Sharp probabilities (Dirichlet 0.2) and labels drawn from them: many top classes above
    0.9, so that Naive's randomized sets are often empty at alpha = 0.1."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(c, 0.2), size=n)
    y = (rng.random(n)[:, None] > np.cumsum(p, axis=1)).sum(axis=1).clip(0, c - 1)
    return p, y


def test_table1_settings_are_the_official_ones():
    assert RAPS_TUNE_FRACTION == 0.33  # experiments/table1.py: pct_paramtune = 0.33
    assert RAPS_LAM_GRID == (0.001, 0.01, 0.1, 0.2, 0.5)  # pick_lamda_size's grid, no 0
    assert CONFORMAL_BASELINES == ("naive", "topk")


def test_naive_is_the_official_gcq_by_hand():
    p = np.array([[0.5, 0.3, 0.2], [0.95, 0.03, 0.02], [0.5, 0.3, 0.2], [0.95, 0.03, 0.02]])
    u = np.array([0.25, 0.99, 0.75, 0.5])
    cal = conformal_calibrations(p, [0, 0, 0, 0], score="naive", alpha=0.1, n_cal=1, trials=1,
                                 seed=0)
    assert cal.qhat.tolist() == [0.9] and cal.n_tune == 0  # no calibration: tau = 1 - alpha
    sets = calibrated_sets(cal, p, u[None])[0]
    # row 0: V = (0.9 - 0.8) / 0.2 = 0.5 > U = 0.25, the third class kept; row 2: U = 0.75
    # drops it; row 1: V = 0.9 / 0.95 < U = 0.99, an EMPTY set; row 3: U = 0.5 keeps the top
    assert sets.astype(int).tolist() == [[1, 1, 1], [0, 0, 0], [1, 1, 0], [1, 0, 0]]
    np.testing.assert_array_equal(sets, _gcq(p, 0.9, u))
    # not randomized: gcq(randomized=False), the class that crosses 1 - alpha kept
    det = conformal_calibrations(p, [0] * 4, score="naive", alpha=0.1, n_cal=1, trials=1, seed=0,
                                 randomized=False)
    assert not det.u.any()
    np.testing.assert_array_equal(calibrated_sets(det, p, det.u[:, :4])[0], _gcq(p, 0.9, None))
    assert calibrated_sets(det, p, det.u[:, :4])[0].astype(int).tolist() == [
        [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 0, 0]]


def test_official_naive_on_platt_temperatures_over_trials():
    """conformal_trials(score="naive", temperatures=trial_temperatures(...)): per trial the
    temperature fitted (NLL) on the trial's calibration draw, then gcq at 1 - alpha with the
    trial's uniforms on the tempered test probabilities; empty sets occur, which the
    deterministic never-empty Naive cannot give."""
    p, y = _confident()
    n_cal, trials, seed, alpha = 200, 5, 4, 0.2
    temps = trial_temperatures(p, y, n_cal=n_cal, trials=trials, seed=seed)
    out = conformal_trials(p, y, score="naive", alpha=alpha, n_cal=n_cal, trials=trials,
                           seed=seed, temperatures=temps)
    rng = np.random.default_rng(seed)
    perms = random_splits(400, n_cal, trials, rng)
    u = rng.uniform(size=(trials, 400))
    for t in range(trials):
        cal, test = perms[t, :n_cal], perms[t, n_cal:]
        assert temps[t] == fit_temperature(np.log(p[cal]), y[cal])
        q = softmax(np.log(p[test]), temperature=temps[t])
        sets = _gcq(q, 1 - alpha, u[t, test])
        assert out["coverage"][t] == coverage(sets, y[test])
        assert out["mean_set_size"][t] == mean_set_size(sets)
        assert out["empty_fraction"][t] == empty_fraction(sets)
    assert out["empty_fraction"].sum() > 0
    assert not np.allclose(temps, 1.0)  # the temperature did something
    never_empty = conformal_trials(p, y, score="naive", alpha=alpha, n_cal=n_cal, trials=trials,
                                   seed=seed, randomized=False)
    assert (never_empty["empty_fraction"] == 0).all()


def test_topk_is_the_official_fixed_set():
    # by hand: ranks 1, 1, 1, 2, 3 at alpha 0.5: k = 1, f = (3/5 - 1/2) / (3/5 - 0)
    assert topk_threshold([1, 1, 1, 2, 3], 0.5) == pytest.approx(1 - 1 / 6)
    # k = 1 + the 0.9-quantile ("higher") of the 0-based ranks = 3; F(3) = 1, F(2) = 0.7
    r = np.array([1] * 5 + [2] * 2 + [3] * 3)
    assert topk_threshold(r, 0.1) == pytest.approx(3 - (1.0 - 0.9) / (1.0 - 0.7))
    np.testing.assert_allclose(topk_threshold(np.stack([r, r[::-1]]), 0.1), [3 - 1 / 3] * 2)
    with pytest.raises(InputError, match="ranks must be 1-based"):
        topk_threshold([0, 1], 0.1)
    np.testing.assert_array_equal(rank_scores([[0.2, 0.5, 0.3]], [0], u=[0.25]), [2.75])
    # over trials, against table1.trial's fixed_bool branch with the same uniforms
    p, y = _confident(seed=1)
    n_cal, trials, seed, alpha = 150, 4, 2, 0.1
    out = conformal_trials(p, y, score="topk", alpha=alpha, n_cal=n_cal, trials=trials,
                           seed=seed)
    rng = np.random.default_rng(seed)
    perms = random_splits(400, n_cal, trials, rng)
    u = rng.uniform(size=(trials, 400))
    rank = (p > p[np.arange(400), y][:, None]).sum(axis=1) + 1  # Dirichlet: no ties
    for t in range(trials):
        cal, test = perms[t, :n_cal], perms[t, n_cal:]
        sizes, covered = _fixed(rank[cal], rank[test], alpha, u[t, test])
        assert out["coverage"][t] == covered.mean()
        assert out["mean_set_size"][t] == sizes.mean()
        assert set(np.unique(sizes)) <= {sizes.max() - 1, sizes.max()}
        assert out["top1"][t] == (rank[test] == 1).mean()
        assert out["top5"][t] == (rank[test] <= 5).mean()
    # the temperature changes no rank: Top-K is the same on tempered probabilities
    temps = np.linspace(0.5, 2.0, trials)
    same = conformal_trials(p, y, score="topk", alpha=alpha, n_cal=n_cal, trials=trials,
                            seed=seed, temperatures=temps)
    np.testing.assert_array_equal(same["coverage"], out["coverage"])


@pytest.mark.parametrize("score", ["thr", "aps", "raps"])
def test_temperatures_temper_every_sample_of_their_trial(score):
    p, y = _confident(300, 5, seed=2)
    n_cal, trials, seed = 120, 3, 5
    temps = np.array([0.7, 1.3, 2.0])
    kw = {"raps_params": (2, 0.05)} if score == "raps" else {}
    cal = conformal_calibrations(p, y, score=score, alpha=0.1, n_cal=n_cal, trials=trials,
                                 seed=seed, temperatures=temps, **kw)
    out = conformal_trials(p, y, score=score, alpha=0.1, n_cal=n_cal, trials=trials, seed=seed,
                           temperatures=temps, **kw)
    np.testing.assert_array_equal(cal.temperature, temps)
    for t in range(trials):
        q = softmax(np.log(p), temperature=temps[t])
        scaled = conformal_calibrations(q, y, score=score, alpha=0.1, n_cal=n_cal,
                                        trials=trials, seed=seed, **kw)
        assert cal.qhat[t] == pytest.approx(scaled.qhat[t], abs=1e-12)
        test = cal.test[t]
        sets = calibrated_sets(scaled, q, cal.u[:, test], np.broadcast_to(test, (3, test.size)))
        assert out["coverage"][t] == coverage(sets[t], y[test])
        assert out["mean_set_size"][t] == mean_set_size(sets[t])


def test_calibrated_sets_are_the_trials_sets_and_bad_input_is_named():
    p, y = _confident(seed=3)
    temps = trial_temperatures(p, y, n_cal=100, trials=3, seed=1)
    for score in ("naive", "topk", "aps"):
        cal = conformal_calibrations(p, y, score=score, n_cal=100, trials=3, seed=1,
                                     temperatures=temps)
        out = conformal_trials(p, y, score=score, n_cal=100, trials=3, seed=1,
                               temperatures=temps)
        sets = calibrated_sets(cal, p, np.take_along_axis(cal.u, cal.test, axis=1), cal.test)
        np.testing.assert_array_equal(coverage(sets, y[cal.test]), out["coverage"])
        again = evaluate_calibrations(cal, RankedProbs(p), y)  # calibrated once, evaluated
        for key in ("coverage", "mean_set_size", "sscv", "covgap", "top1", "qhat"):
            np.testing.assert_array_equal(again[key], out[key])
    with pytest.raises(InputError, match="probs must be the 400 samples the calibrations"):
        evaluate_calibrations(cal, p[:300], y[:300])
    with pytest.raises(InputError, match="mondrian is for the conformal scores"):
        conformal_trials(p, y, score="naive", n_cal=100, trials=3, seed=1, mondrian=True)
    with pytest.raises(InputError, match=r"temperatures must be 3 finite numbers > 0"):
        conformal_trials(p, y, score="aps", n_cal=100, trials=3, seed=1, temperatures=[1.0, -1])
    with pytest.raises(InputError, match=r"u must have shape \(3, 400\)"):
        calibrated_sets(cal, p, np.zeros((3, 2)))
    with pytest.raises(InputError, match="score must be one of"):
        conformal_trials(p, y, score="fixed", n_cal=100, trials=3, seed=1)


def test_naive_sets_are_aps_sets_at_one_minus_alpha():
    """Naive is the APS set {y: s_APS(x, y) <= 1 - alpha} (the same U): no calibration."""
    p, _ = _confident(50, 4, seed=4)
    u = np.random.default_rng(0).uniform(size=50)
    np.testing.assert_array_equal(prediction_sets(aps_scores(p, u=u), 0.8), _gcq(p, 0.8, u))
    assert conformal_quantile(np.array([0.1, 0.2]), 0.5) != 0.5  # (a quantile, unlike Naive's)


@pytest.mark.parametrize("score", ["raps", "aps", "naive"])
def test_tempered_trials_chunked_equal_the_kept_ones(score, monkeypatch):
    """Where every trial's tempered probabilities are too many to keep (ImageNet-sized pools),
    they are tempered chunk by chunk: the same numbers (here forced by a tiny chunk size)."""
    from uqmetrics.metrics import conformal

    p, y = _confident(200, 5, seed=6)
    temps = np.array([0.6, 1.4, 2.5])
    kw = {"score": score, "alpha": 0.1, "n_cal": 90, "trials": 3, "seed": 2,
          "temperatures": temps}
    kept = conformal_trials(p, y, **kw)
    monkeypatch.setattr(conformal, "_CHUNK_ELEMENTS", 50)
    chunked = conformal_trials(p, y, **kw)
    for key in ("coverage", "mean_set_size", "qhat"):
        np.testing.assert_array_equal(chunked[key], kept[key])
    if score == "raps":
        np.testing.assert_array_equal(chunked["lam"], kept["lam"])
