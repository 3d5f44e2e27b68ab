"""Cross-package: the installed ``uqreg`` CLI writes a study that plain xarray reopens and
uqmetrics re-scores to the stored numbers."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import uqmetrics
import xarray as xr


def test_uqreg_cli_study_rescored_by_uqmetrics(tmp_path):
    exe = shutil.which("uqreg")
    assert exe, "the uqreg console script must be installed"
    out = tmp_path / "study"
    res = subprocess.run([exe, "study", "--task", "sinusoid", "--complexities", "1,2", "--methods", "blr,bd,ens",
                          "--repetitions", "3", "--members", "3", "--epochs", "10", "--mc-samples", "8",
                          "--out", str(out), "--quiet"], check=False, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in (out / "plots").glob("*.png")) == [
        "bands_c1.png", "bands_c2.png", "conditional_coverage_c1.png", "conditional_coverage_c2.png",
        "conditional_vs_complexity.png", "probes_vs_complexity.png"]
    with xr.open_dataset(out / "study.nc") as ds:
        ds = ds.load()
    assert ds.attrs["complete"] == 1
    cov = uqmetrics.coverage(ds.prediction, ds.uncertainty, ds.truth, dim="repetition")
    np.testing.assert_array_equal(cov.transpose(*ds.coverage.dims).values, ds.coverage.values)
    low, high = uqmetrics.binomial_interval((cov * 3).round().astype(int).values, 3, method="wilson")
    np.testing.assert_allclose(low, ds.coverage_low.transpose(*cov.dims).values)
    np.testing.assert_allclose(high, ds.coverage_high.transpose(*cov.dims).values)
    # blr's interval is the reference's posterior predictive interval: the same exact
    # conditional coverage at every x (R.6), recomputed from the file
    np.testing.assert_allclose(
        ds.conditional_coverage.sel({"method": "blr"}).isel(recipe=0).transpose(
            *ds.reference_conditional_coverage.dims).values,
        ds.reference_conditional_coverage.values, rtol=1e-12)
    # the reference row is the exact posterior: it equals the stored reference uncertainty
    np.testing.assert_allclose(ds.uncertainty.sel({"method": "blr"}).isel(recipe=0, repetition=0).values,
                               ds.reference_uncertainty.values)
