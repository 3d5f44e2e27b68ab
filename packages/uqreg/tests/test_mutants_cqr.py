"""CQR's cases that the coverage and MAPIE tests of ``test_cqr.py`` do not pin down
(docs/conventions.md#r-6-cqr): a negative conformal quantile, which narrows an interval that is
too wide, and the rearrangement of quantile averages that cross.
"""

from __future__ import annotations

import numpy as np

from uqreg.conformal import cqr_calibrate
from uqreg.engine import TrainConfig
from uqreg.methods import Method, get_method
from uqreg.tasks import get_task


def test_a_negative_conformal_quantile_narrows_intervals_that_are_too_wide():
    """Romano et al.'s score ``max(q_lo − y, y − q_hi)`` is minus the distance to the nearer
    end inside the interval, so q may be negative. Hand case, exact in float64 (multiples of
    1/8): every calibration interval is [−10, 10] and ``|y_i| = i/8``, i = 1..9, so the scores
    are ``−10 + i/8``; α = 0.2 and n = 9 give the rank ⌈10 · 0.8⌉ = 8, q = −10 + 1 = −9, and
    the test interval [−10, 10] becomes [−1, 1]."""
    y = np.arange(1, 10) / 8.0 * np.array([1, -1, 1, -1, 1, -1, 1, -1, 1])
    low, high = np.full((1, 9), -10.0), np.full((1, 9), 10.0)
    t_low, t_high, q = cqr_calibrate(y[None], low, high, np.full((1, 2), -10.0),
                                     np.full((1, 2), 10.0), 0.2)
    assert q.tolist() == [-9.0]
    assert t_low.tolist() == [[-1.0, -1.0]] and t_high.tolist() == [[1.0, 1.0]]


def test_crossing_quantile_averages_are_sorted():
    """``<method>+qr`` sorts its two averaged quantiles where they cross (the monotone
    rearrangement of Chernozhukov et al. 2010), so ``q_lo <= q_hi`` everywhere, at the test and
    the calibration points. After one epoch the networks are near their initialisation, where
    the two output layers are independent draws: the raw averages cross at some of the points
    (asserted, so the test is not empty)."""
    alpha = 0.1
    inst = get_task("sinusoid").instance(1, 0, n_train=12)
    reps = np.arange(2)
    y = inst.targets(reps)
    x_cal, _ = inst.calibration(reps, 30)
    cfg = TrainConfig(members=2, epochs=1, hidden=(8,), dtype="float64")
    method = get_method("ens+qr")
    raw = Method.train_predict(method, inst, y, reps, cfg, x_cal=x_cal, alpha=alpha)
    res = method.train_predict(inst, y, reps, cfg, x_cal=x_cal, alpha=alpha)
    for lo, hi, got_lo, got_hi in (
            (raw.prediction, raw.aleatoric_variance, res.quantile_low, res.quantile_high),
            (raw.cal_prediction, raw.cal_aleatoric_variance, res.cal_quantile_low,
             res.cal_quantile_high)):
        assert (lo > hi).any() and (lo < hi).any()
        np.testing.assert_array_equal(got_lo, np.minimum(lo, hi))
        np.testing.assert_array_equal(got_hi, np.maximum(lo, hi))
