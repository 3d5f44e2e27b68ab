"""Out-of-domain detection metrics (docs/conventions.md#s-4)."""

import doctest

import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from sklearn.metrics import roc_auc_score

import uqmetrics.metrics.ood
from uqmetrics import (
    auroc_score,
    in_as_in_score,
    ood_auroc_score,
    ood_scores,
    ood_threshold,
    out_as_out_score,
)

u_values = hnp.arrays(np.float64, st.integers(1, 60), elements=st.integers(0, 20).map(float))


def test_threshold_hand_case():
    assert ood_threshold(np.arange(101.0)) == 95.0
    assert ood_threshold(np.arange(101.0), quantile=0.5) == 50.0
    assert ood_threshold([3.0, 1.0, 2.0], quantile=1.0) == 3.0


@given(st.integers(20, 400), st.integers(0, 2**32 - 1))
def test_in_as_in_on_validation_set_is_about_095(n, seed):
    # numpy's linear quantile sits at order statistic h = 0.95 (n - 1) (0-based), so for
    # distinct u the count #{u <= θ} is floor(h) + 1, or floor(h) if θ rounds just below
    # u_(h) when h is an integer: within [h - 1, h + 1], i.e. |InAsIn - 0.95| <= 1.95 / n.
    u = np.random.default_rng(seed).permutation(n) + 0.5
    theta = ood_threshold(u)
    assert abs(in_as_in_score(u, theta) - 0.95) <= 1.95 / n


def test_in_as_in_and_out_as_out_hand_cases():
    u = [0.1, 0.5, 0.5, 0.9]
    assert in_as_in_score(u, 0.5) == 0.75  # u <= θ: the ties at θ stay in-domain
    assert out_as_out_score(u, 0.5) == 0.25  # u > θ: flagged out-domain
    assert in_as_in_score(u, 0.5) + out_as_out_score(u, 0.5) == 1.0


def test_ood_auroc_hand_cases():
    assert ood_auroc_score([0.1, 0.2], [0.3, 0.4]) == 1.0
    assert ood_auroc_score([0.3, 0.4], [0.1, 0.2]) == 0.0
    assert ood_auroc_score([0.5, 0.5], [0.5]) == 0.5
    assert ood_auroc_score([0.1, 0.3], [0.3]) == 0.75  # one win, one tie


@settings(max_examples=30)  # scikit-learn's per-call overhead dominates
@given(u_values, u_values)
def test_ood_auroc_is_the_selective_auroc(u_in, u_out):
    is_out = np.r_[np.zeros(u_in.size, bool), np.ones(u_out.size, bool)]
    u = np.r_[u_in, u_out]
    value = ood_auroc_score(u_in, u_out)
    assert value == auroc_score(is_out, u)
    assert value == pytest.approx(roc_auc_score(is_out, u), abs=1e-12)
    assert value + ood_auroc_score(u_out, u_in) == pytest.approx(1.0, abs=1e-12)


def test_ood_scores_dataset():
    rng = np.random.default_rng(1)
    u_val, u_in, u_out = rng.normal(size=200), rng.normal(size=100), rng.normal(1, 1, size=50)
    ds = ood_scores(u_val, u_in, u_out, quantile=0.9)
    assert isinstance(ds, xr.Dataset)
    assert set(ds.data_vars) == {"auroc", "threshold", "in_as_in", "out_as_out"}
    theta = ood_threshold(u_val, quantile=0.9)
    assert float(ds.threshold) == theta
    assert float(ds.auroc) == ood_auroc_score(u_in, u_out)
    assert float(ds.in_as_in) == in_as_in_score(u_in, theta)
    assert float(ds.out_as_out) == out_as_out_score(u_out, theta)
    assert ds.attrs["quantile"] == 0.9
    assert (ds.attrs["n_in_val"], ds.attrs["n_in_test"], ds.attrs["n_out_test"]) == (200, 100, 50)
    assert "out-domain positive" in ds.attrs["convention"]


@pytest.mark.parametrize("q", [0.0, -0.5, 1.5, np.nan, "high"])
def test_quantile_out_of_range(q):
    with pytest.raises(ValueError, match="quantile"):
        ood_threshold([0.1, 0.2], quantile=q)
    with pytest.raises(ValueError, match="quantile"):
        ood_scores([0.1, 0.2], [0.1], [0.3], quantile=q)


def test_bad_input():
    with pytest.raises(ValueError, match="u_in is empty"):
        ood_auroc_score([], [0.1])
    with pytest.raises(ValueError, match="u_out contains non-finite"):
        ood_auroc_score([0.1], [np.nan])
    with pytest.raises(ValueError, match=r"u_in_val must have shape \(n_samples,\)"):
        ood_threshold([[0.1, 0.2]])
    with pytest.raises(ValueError, match="threshold"):
        in_as_in_score([0.1], np.nan)
    with pytest.raises(ValueError, match="threshold"):
        out_as_out_score([0.1], "high")
    with pytest.raises(ValueError, match="u_out_test is empty"):
        ood_scores([0.1], [0.2], [])


def test_doctests():
    result = doctest.testmod(uqmetrics.metrics.ood)
    assert result.attempted > 0 and result.failed == 0
