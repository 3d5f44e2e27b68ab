"""The real-data study's recalibration is fitted on the calibration part and applied to the test
part (docs/conventions.md#r-9, step 5): checked where the two parts differ, so that a fit on the
wrong part gives other numbers."""

from __future__ import annotations

import numpy as np
from scipy.special import ndtri
from uqmetrics.metrics.regression import (
    IsotonicRecalibrator,
    SigmaScaling,
    calibration_curve,
    mean_absolute_calibration_error,
)

from uqreg.real import recalibrated


def test_recalibrations_are_fitted_on_the_calibration_part_only():
    """Calibration part: N(0, 1) targets under a predictive 3× too wide; test part: N(0, 9)
    targets under the same predictive, calibrated there. Each recalibration of
    :func:`recalibrated` equals the uqmetrics recalibrator fitted on the calibration part and
    applied to the test part (the same deterministic computations: equal bit for bit), and a fit
    on the test part would differ (asserted, so the check is not empty)."""
    n, alpha = 500, 0.05
    rng = np.random.default_rng(3)
    y_cal, y = rng.standard_normal(n), 3.0 * rng.standard_normal(n)
    mean, std = np.zeros(n), np.full(n, 3.0)
    res = recalibrated(y_cal, mean, std, y, mean, std, alpha=alpha)

    iso = IsotonicRecalibrator().fit(y_cal, mean, std)
    wrong_iso = IsotonicRecalibrator().fit(y, mean, std)
    mace = mean_absolute_calibration_error(y, mean, std, recalibrator=iso)
    assert res["scores"]["isotonic"]["mace"] == mace
    assert mean_absolute_calibration_error(y, mean, std, recalibrator=wrong_iso) != mace
    np.testing.assert_array_equal(res["curve"]["isotonic"],
                                  calibration_curve(y, mean, std, recalibrator=iso)[1])
    lo, hi = iso.interval(mean, std, 1 - alpha)
    assert res["coverage"]["isotonic"] == np.mean((lo <= y) & (y <= hi))

    factor = SigmaScaling().fit(y_cal, mean, std).factor_
    assert res["sigma_scaling_factor"] == factor
    assert SigmaScaling().fit(y, mean, std).factor_ != factor
    z = ndtri(1 - alpha / 2)
    assert res["coverage"]["sigma_scaling"] == np.mean(np.abs(y - mean) <= z * factor * std)
