"""The conformal protocol's findings (by hand on a small result), its figures, and its smoke
run (uqvision reproduce conformal --scale smoke) read back as a result file."""

from __future__ import annotations

import numpy as np
import pytest
import uqmetrics
import xarray as xr
from uqmetrics import InputError
from uqmetrics.metrics.stats import sign_test

from uqvision.protocols.conformal.figures import (
    draw_figures,
    plot_alpha_curve,
    plot_shift_coverage,
    plot_size_vs_accuracy,
)
from uqvision.protocols.conformal.findings import (
    conformal_findings,
    format_findings,
    mondrian_notes,
)

METHODS = ["naive", "thr", "aps", "raps", "aps_mondrian"]
MODELS = ["m1", "m2", "m3"]


def _result() -> xr.Dataset:
    """3 models x 5 methods x alpha (0.1, 0.05) x calibration none; trials 4."""
    shape = (3, 5, 2, 1)
    cov = np.full(shape, 0.92)
    cov[:, :, 1] = 0.96  # every set covers 1 - alpha at 0.05 too
    cov[:, 0, :, 0] = [[0.85, 0.93], [0.80, 0.90], [0.96, 0.97]]  # Naive: 4 of 6 below 1-a
    cov[2, 3, 0, 0] = 0.80  # m3's RAPS covers far less than APS at 0.1: counts against
    cov[0, 2:4, 0, 0] = 0.85  # m1's APS and RAPS both under 1-alpha at 0.1 (a shared split
    #                           dip): equal coverage, so RAPS's smaller size counts for
    cov[0, 3, 1, 0] = 0.94  # m1's RAPS 0.02 below APS at 0.05: within 2 SE of the difference
    std = np.full(shape, 0.02)  # SE of a difference: sqrt(2) * 0.02 / 2; 2 SE = 0.028
    size = np.full(shape, 3.0)
    size[:, 3, :, 0] = 2.0  # RAPS smaller everywhere...
    size[1, 3, 1, 0] = 4.0  # ...but m2 at 0.05
    shift = np.full((3, 5, 2, 1, 2, 1), 0.97)  # corruption "fog", severities 1, 5
    shift[..., 1, :] = 0.5  # every cell below 1 - alpha at severity 5
    return xr.Dataset(
        {"coverage": (("model", "method", "alpha", "calibration"), cov),
         "coverage_std": (("model", "method", "alpha", "calibration"), std),
         "mean_set_size": (("model", "method", "alpha", "calibration"), size),
         "shift_coverage": (("model", "method", "alpha", "corruption", "severity",
                             "calibration"), shift)},
        coords={"model": MODELS, "method": METHODS, "alpha": [0.1, 0.05],
                "calibration": ["none"], "corruption": ["fog"], "severity": [1, 5]},
        attrs={"trials": 4})


def test_findings_by_hand():
    rows = {(f.claim, f.subject): f for f in conformal_findings(_result())}
    # per alpha, 3 models: at 0.1 m3 covers less than APS (0.80 < 0.92 - 0.028), m1's shared
    # dip counts for; at 0.05 m2's RAPS is larger, m1's 0.02 coverage gap is within 2 SE
    for alpha, size_raps in (("0.1", 2.0), ("0.05", 8 / 3)):
        raps = rows["RAPS smaller than APS at equal coverage", f"alpha {alpha}"]
        assert (raps.k, raps.n) == (2, 3) and raps.p_value == pytest.approx(sign_test(2, 3))
        # three models: even 3 of 3 (p = 0.125) could not reach 0.05
        assert raps.verdict == "untestable (n = 3)"
        assert raps.before == pytest.approx(3.0) and raps.after == pytest.approx(size_raps)
    naive = rows["Naive under-covers", "all models"]
    assert (naive.k, naive.n) == (4, 6)  # m1 and m2 below 1 - alpha at both levels, m3 not
    assert naive.after == pytest.approx(np.mean([0.85, 0.93, 0.80, 0.90, 0.96, 0.97]))
    sev1, sev5 = rows["coverage falls under shift", "severity 1"], \
        rows["coverage falls under shift", "severity 5"]
    # cells: 3 models x 4 conformal methods x 1 corruption x 2 alphas
    assert (sev1.k, sev1.n) == (0, 24) and sev1.verdict == "not reproduced"
    assert (sev5.k, sev5.n) == (24, 24) and sev5.verdict == "reproduced"
    text = format_findings(list(rows.values()))
    assert "| RAPS smaller than APS at equal coverage | alpha 0.1 | none |" in text


def test_naive_finding_reads_the_official_naive_not_the_deterministic_one():
    """Issue 38, item 1: the verdict is the ``naive`` row's (the official, randomized one);
    ``naive_deterministic`` (the last class always kept) covers more and is not tested."""
    ds = _result()
    det = ds.sel({"method": ["naive"]}).assign_coords(method=["naive_deterministic"])
    det["coverage"][:] = 0.99  # would be 0 of 6 below 1 - alpha
    ds = xr.concat([ds, det], dim="method")
    naive = {(f.claim, f.subject): f for f in conformal_findings(ds)}["Naive under-covers",
                                                                      "all models"]
    assert (naive.k, naive.n) == (4, 6)


def test_mondrian_notes_say_why_the_sets_are_full(tmp_path):
    """Issue 38, item 5 (V.7): Mondrian APS holds out no tuning split; a class with fewer
    than min_n_cal images in a trial's draw is in every set. The note reads the file's
    short_calibration, min_n_cal, n_cal and un-scaled mean set size."""
    ds = _result()
    ds = ds.assign_coords({"class": [f"c{i}" for i in range(48)]})
    ds["n_cal"] = ("model", [960, 960, 960])
    ds["min_n_cal"] = (("method", "alpha"), np.array([[0, 0], [9, 19], [9, 19], [14, 28],
                                                      [9, 19]]))
    short = np.zeros((3, 5, 2))
    short[:, 4] = [[0.0004, 0.32], [0.0004, 0.32], [0.0004, 0.32]]
    ds["short_calibration"] = (("model", "method", "alpha"), short)
    ds["mean_set_size"].loc[{"method": "aps_mondrian", "alpha": 0.05,
                             "calibration": "none"}] = [16.0, 16.3, 16.6]
    lines = mondrian_notes(ds)
    assert len(lines) == 2
    assert lines[1] == (
        "- aps_mondrian at alpha 0.05: no tuning split is held out, so each class calibrates "
        "on its own images among the n_cal = 960 of a trial's draw, about 20.0 images per "
        "class; 32.0% of the (trial, class) draws hold fewer than 19: the class's threshold "
        "is then infinite and the class in every set, 15.4 of the 48 classes per trial; mean "
        "set size 16.30 (un-scaled, over the predictors).")
    text = format_findings(conformal_findings(ds), ds)
    assert text.endswith("\n".join(["Mondrian (class-conditional) APS:", "", *lines]) + "\n")
    assert mondrian_notes(ds.drop_vars("short_calibration")) == []


def test_findings_refuse_a_result_of_another_protocol():
    with pytest.raises(InputError, match="coverage"):
        conformal_findings(xr.Dataset({"x": ("i", [1.0])}))
    with pytest.raises(InputError, match="naive"):
        conformal_findings(_result().sel({"method": ["aps", "raps"]}))


def test_figures_draw_the_result(tmp_path):
    ds = _result()
    ds["accuracy"] = ("model", [0.7, 0.8, 0.9])
    fig = plot_size_vs_accuracy(ds)
    pts = {a.get_gid(): a.get_offsets() for a in fig.axes[0].collections}
    assert pts["size:raps"][:, 1].tolist() == [2.0, 2.0, 2.0]
    assert pts["size:naive"][:, 0].tolist() == [0.7, 0.8, 0.9]
    fig = plot_shift_coverage(ds)
    lines = {ln.get_gid(): ln.get_ydata() for ln in fig.axes[0].lines if ln.get_gid()}
    assert list(lines["shift:0.1:m1"]) == [0.85, 0.97, 0.5]  # clean, severity 1, severity 5
    with pytest.raises(InputError, match="curve"):
        plot_alpha_curve(ds)
    with pytest.raises(InputError, match="alpha"):
        plot_size_vs_accuracy(ds, alpha=0.2)
    paths = draw_figures(ds, tmp_path / "fig")
    assert sorted(p.name for p in paths) == ["conformal_shift_coverage.png",
                                             "conformal_size_vs_accuracy.png"]
    assert all(p.stat().st_size > 0 for p in paths)


@pytest.mark.slow
def test_smoke_run_writes_a_result_figures_and_findings(smoke_run):
    out, path = smoke_run("conformal")
    ds = uqmetrics.read_result(path, protocol="conformal")
    assert "deep_ensemble[2]" in ds["model"].values
    assert ds.sizes["severity"] == 2 and ds.sizes["corruption"] == 2
    assert not np.isnan(ds["coverage"].values).any()
    assert not np.isnan(ds["shift_coverage"].values).any()
    assert ((ds["coverage"] >= 0) & (ds["coverage"] <= 1)).all()
    assert ds["class_coverage"].sizes["class"] == ds.sizes["class"] > 0
    assert sorted(p.name for p in (out / "figures").glob("*.png")) == [
        "conformal_alpha_curve.png", "conformal_class_coverage.png",
        "conformal_shift_coverage.png", "conformal_size_vs_accuracy.png"]
    text = (out / "findings.md").read_text(encoding="utf-8")
    assert "Naive under-covers" in text and "coverage falls under shift" in text
    assert "| Naive under-covers | all models | platt |" in text  # Table 1's row
    assert "- aps_mondrian at alpha 0.05: no tuning split is held out" in text
    # the pool is the test split; the temperature came from part of val
    assert (ds["n_pool"] > ds["n_cal"]).all() and (ds["n_temperature"] > 0).all()
