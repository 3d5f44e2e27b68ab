"""The OOD findings (OpenOOD v1.5's claims as sign tests) checked by hand on a synthetic
result, and the figures written from it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr
from scipy.stats import binom
from uqmetrics import InputError

from uqvision.protocols.ood.figures import (
    draw_figures,
    plot_ood_bars,
    plot_ood_cost,
    plot_ood_histograms,
)
from uqvision.protocols.ood.findings import format_findings, ood_findings

MODELS = ["a", "b", "c", "d", "ens[2]"]
DETS = ["msp", "energy", "knn", "ensemble_entropy"]
SETS = ["n1", "f1", "f2"]


def _result() -> xr.Dataset:
    rng = np.random.default_rng(0)
    auroc = 0.6 + 0.01 * rng.random((len(MODELS), len(DETS), len(SETS)))
    auroc[:, 2, 1:] += 0.2  # knn: a far gain, no near gain
    auroc[:, 0, 0] += 0.05  # msp: best on near
    auroc[:4, 3] = np.nan  # member detector: the ensemble only
    auroc[4, 3] = 0.95  # ... and better than every post-hoc detector of member a
    near, far = auroc[..., 0], auroc[..., 1:].mean(axis=-1)
    ds = xr.Dataset(
        {"auroc": (("model", "detector", "ood_set"), auroc),
         "fpr_at_95_tpr": (("model", "detector", "ood_set"), 1 - auroc),
         "near_auroc": (("model", "detector"), near), "far_auroc": (("model", "detector"), far),
         "near_fpr_at_95_tpr": (("model", "detector"), 1 - near),
         "far_fpr_at_95_tpr": (("model", "detector"), 1 - far),
         "forward_passes": ("model", [1, 1, 1, 1, 2]),
         "u_id": (("model", "detector", "id_sample"), rng.random((5, 4, 20))),
         "u_ood": (("model", "detector", "ood_sample"), 1 + rng.random((5, 4, 30)))},
        coords={"model": MODELS, "detector": DETS, "ood_set": SETS,
                "ood_split": ("ood_set", ["near", "far", "far"]),
                "ood_sample_set": ("ood_sample", ["n1"] * 10 + ["f1"] * 10 + ["f2"] * 10)},
        attrs={"protocol": "ood", "ensemble_members": json.dumps({"ens[2]": ["a", "b"]})})
    return ds


def test_findings_by_hand():
    rows = {(r.claim, r.subject): r for r in ood_findings(_result())}
    knn = rows["feature-based detectors help far-OOD more than near-OOD", "knn"]
    assert (knn.k, knn.n) == (5, 5)
    assert knn.p_value == pytest.approx(1 - binom.cdf(4, 5, 0.5))
    assert knn.verdict == "reproduced"
    msp = rows["MSP is a strong baseline on near-OOD", "msp"]
    # msp against energy and knn on 5 models, and against the ensemble's member detector
    assert (msp.k, msp.n) == (10, 11)
    uq = rows["UQ methods vs post-hoc detectors at equal cost", "ens[2]"]
    assert (uq.k, uq.n) == (3, 3) and uq.after == pytest.approx(0.95)
    assert "| knn |" in format_findings(list(rows.values()))


def test_a_claim_over_too_few_cells_is_untestable_never_not_reproduced():
    """The UQ claim over one near and one far set (the stand-in's): 0 of 2 has p = 1 and even
    2 of 2 only 0.25, so it is untestable with 2 sets; the feature claim over 4 predictors
    likewise (2 ** -4 > 0.05), over 5 it is testable."""
    ds = _result().sel(ood_set=["n1", "f1"])
    ds["auroc"].loc[{"model": "ens[2]", "detector": "ensemble_entropy"}] = 0.1  # UQ loses
    ds["far_auroc"] = ds["auroc"].sel(ood_set="f1", drop=True)
    rows = {(r.claim, r.subject): r for r in ood_findings(ds)}
    uq = rows["UQ methods vs post-hoc detectors at equal cost", "ens[2]"]
    assert (uq.k, uq.n, uq.p_value) == (0, 2, 1.0)
    assert uq.verdict == "untestable with 2 sets"
    rows = {(r.claim, r.subject): r for r in ood_findings(ds.sel(model=MODELS[:4]))}
    knn = rows["feature-based detectors help far-OOD more than near-OOD", "knn"]
    assert (knn.k, knn.n, knn.verdict) == (4, 4, "untestable with 4 predictors")
    assert "| untestable with 2 sets |" in format_findings(list(ood_findings(ds)))


def test_findings_refuse_a_result_without_msp():
    with pytest.raises(InputError, match="msp"):
        ood_findings(_result().sel(detector=["energy", "knn"]))


def test_figures_written(tmp_path):
    paths = draw_figures(_result(), tmp_path / "fig")
    assert sorted(p.name for p in paths) == ["ood_bars.png", "ood_cost_far.png",
                                             "ood_cost_near.png", "ood_heatmap.png",
                                             "ood_histograms.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    fig = plot_ood_bars(_result(), model="a", metrics=("auroc",))
    bars = {a.get_gid(): a.get_height() for a in fig.axes[0].patches}
    assert bars["bar:auroc:far:knn"] == pytest.approx(float(_result()["far_auroc"].sel(
        model="a", detector="knn")))
    with pytest.raises(InputError, match="keep"):
        plot_ood_histograms(_result().drop_vars(["u_id", "u_ood"]))


def test_a_split_without_sets_draws_a_panel_saying_so_without_a_warning(recwarn):
    """A result with far-OOD sets only (as ``uqvision evaluate examples/standin.toml``): its
    near cost panel says that no near set was scored; matplotlib warned of an empty legend."""
    ds = _result()
    ds["near_auroc"] = ds["near_auroc"] * np.nan
    fig = plot_ood_cost(ds, split="near")
    assert fig.axes[0].get_legend() is None and not fig.legends
    assert [t.get_text() for t in fig.axes[0].texts] == ["no near-OOD set scored"]
    assert not [w for w in recwarn if "legend" in str(w.message)]
    far = plot_ood_cost(ds, split="far")  # its legend stands beside the axes, not over points
    assert far.axes[0].get_legend() is None and len(far.legends) == 1
