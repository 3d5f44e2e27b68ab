"""Cases of the disentanglement study's scores and findings (docs/conventions.md#r-7-study) that
``test_disentangle.py`` does not pin down: the epistemic band at width 0 (strict, as R.4), and the
findings' geometric-mean ratio and two-sided sign test, on a hand-made study whose ratios and
p-values are known.
"""

from __future__ import annotations

import re

import numpy as np
import xarray as xr
from scipy.stats import binomtest
from uqmetrics import coverage

from uqreg.disentangle import ORACLE, findings, score_arrays, scores

Z95 = 1.959963984540054  # the normal quantile at 0.975, written out


def test_a_zero_width_epistemic_band_covers_nothing_as_in_the_coverage_study():
    """The truth band is R.4's (docs/conventions.md#r-4, ``uqmetrics.coverage``): strict,
    ``|μ − f(x)| < z·sqrt(epi)``, so where a method's epistemic estimate is 0 (its members agree)
    it covers nothing, not even an exact prediction: the oracle's row and a method's are scored
    by one definition of coverage. Points: μ − f = 0, 0 at epi = 0 (not covered), 0.5 at epi = 1
    (inside z = 1.96), 3 at epi = 1 (outside); a NaN estimate (a diverged network) covers nothing."""
    truth = np.array([0.5, -1.0, 2.0, 0.0])
    mean = (truth + [0.0, 0.0, 0.5, 3.0])[None]
    epi = np.array([[0.0, 0.0, 1.0, 1.0]])
    ones = np.ones(4)
    with np.errstate(divide="ignore"):  # log10 of the zero ratios: -inf, not scored here
        got = score_arrays(mean, epi, ones[None], truth, ones, ones, mean, np.ones(4, bool))
    assert got["truth_coverage"].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert got["region_truth_coverage"][0, 0] == 0.25
    np.testing.assert_array_equal(got["truth_coverage"], coverage(mean, np.sqrt(epi), truth, z=Z95))
    nan_mean = mean.copy()
    nan_mean[0, 2] = np.nan
    with np.errstate(divide="ignore"):
        got = score_arrays(nan_mean, epi, ones[None], truth, ones, ones, mean, np.ones(4, bool))
    assert got["truth_coverage"].tolist() == [0.0, 0.0, 0.0, 0.0]


# the hand-made study: per repetition r, the method's aleatoric estimate is the exact σ²(x) times
# 10^F[r] inside the box and 10^-F[r] outside; its epistemic estimate is exact
F = np.array([0.2, 0.4, 0.6, 0.8, 1.0])


def _study():
    t_epi, t_ale = np.array([1.0, 2.0, 3.0, 4.0]), np.array([4.0, 1.0, 3.0, 2.0])
    inside = np.array([True, True, False, False])
    r, t = F.size, t_epi.size
    scale = 10.0 ** np.where(inside, F[:, None], -F[:, None])  # (R, T)
    ale = np.stack([np.broadcast_to(t_ale, (r, t)), t_ale * scale])[:, None]  # (method, c, R, T)
    epi = np.broadcast_to(t_epi, (2, 1, r, t))
    dims = ("method", "complexity", "repetition", "point")
    raw = xr.Dataset({"prediction": (dims, np.zeros((2, 1, r, t))),
                      "epistemic_variance": (dims, epi.copy()),
                      "aleatoric_variance": (dims, ale),
                      "truth": (("complexity", "point"), np.zeros((1, t))),
                      "exact_epistemic_variance": (("complexity", "point"), t_epi[None]),
                      "exact_aleatoric_variance": (("complexity", "point"), t_ale[None]),
                      "in_distribution": (("complexity", "point"), inside[None]),
                      "new_targets": (("complexity", "repetition", "point"), np.zeros((1, r, t)))},
                     coords={"method": [ORACLE, "ens+mv"], "complexity": [1],
                             "repetition": np.arange(r), "point": np.arange(t)},
                     attrs={"alpha": 0.05})
    return {"toy": scores(raw)}


def _ratio_row(rows, part, where):
    (row,) = [r for r in rows if r[1] == "ens+mv" and r[2].startswith(f"{part} estimate")
              and where in r[2]]
    g, word = re.search(r"is (\S+)× the exact value .* \((.*) 1\)", row[2]).groups()
    p, n = re.search(r"p = (\S+) over (\d+)", row[3]).groups()
    return g, word, float(p), int(n)


def test_findings_state_the_geometric_mean_ratio_and_a_two_sided_sign_test():
    """Inside the box the five (repetition, complexity) cells have log10 ratios F, all above 0:
    the geometric mean is 10^mean(F) = 10^0.6 (3.98, printed "4"; the arithmetic mean of the
    ratios would be 4.88), and the two-sided sign test of 5 of 5 above gives p = 2/32 = 0.0625
    (scipy's two-sided binomial test), not below 0.05: no claim "above" from five cells (the
    one-sided 1/32 would make one). Outside, the ratios are 10^-F: 10^-0.6 and the same p. The
    epistemic estimates are exact: ratio 1, no cell above, p = 0.0625."""
    rows = findings(_study())
    p_two_sided = binomtest(5, 5, 0.5, alternative="two-sided").pvalue
    for where, sign in (("inside the box", 1), ("outside the box", -1)):
        g, word, p, n = _ratio_row(rows, "aleatoric", where)
        assert g == f"{10 ** (sign * F.mean()):.2g}" and n == F.size
        assert p == float(f"{p_two_sided:.2g}") and word == "not distinguishable from"
        g, word, p, n = _ratio_row(rows, "epistemic", where)
        assert g == "1" and p == float(f"{p_two_sided:.2g}") and word == "not distinguishable from"
