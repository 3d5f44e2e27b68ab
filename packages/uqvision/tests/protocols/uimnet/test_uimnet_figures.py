"""UIMNET figures (``uqvision plot --uimnet FILE``) from the smoke run's ``ood.nc`` (V.3)."""

import json

import numpy as np
import pytest
from uqmetrics import read_dataset
from uqmetrics.metrics.ood import ood_auroc_score
from uqmetrics.report.plotting import figure_format
from uqmetrics.runs.io import write_dataset

from uqvision.cli import main
from uqvision.protocols import VISION_PROTOCOLS
from uqvision.protocols.uimnet.plots import (
    _uncertainties,
    draw_figures,
    histogram_selection,
    metric_heatmaps,
    uncertainty_histograms,
)
from uqvision.provenance import recorded_caches, recorded_config

pytestmark = pytest.mark.slow

NAMES = ["uimnet_auc", "uimnet_in_as_in", "uimnet_out_as_out", "uimnet_histograms"]


@pytest.fixture(scope="module")
def uimnet(smoke_run):
    return smoke_run("uimnet")


@pytest.mark.parametrize("metric", ["auc", "out_as_out"])
def test_heatmap_images_are_the_score_files_means(uimnet, metric):
    _, path = uimnet
    ds = read_dataset(path)
    fig = metric_heatmaps(path, metric)
    cols = [(c, sp) for c in ds.calibration.values for sp in ds.spectral.values]
    axes = fig.axes[:-1]  # the last is the colour bar
    assert len(axes) == ds.sizes["k"] * len(cols) == 8
    for n, ax in enumerate(axes):
        k = ds.k.values[n // len(cols)]
        cal, sp = cols[n % len(cols)]
        want = ds[metric].sel(stat="mean", k=k, calibration=cal, spectral=sp).transpose(
            "algorithm", "measure").values
        got = np.ma.filled(ax.images[0].get_array().astype(float), np.nan)
        np.testing.assert_array_equal(got, want)
        assert [t.get_text() for t in ax.get_yticklabels()] == ds.algorithm.values.tolist()
        assert [t.get_text() for t in ax.get_xticklabels()] == ds.measure.values.tolist()
        # one annotation per cell; the NaN cells (jacobian of ensembles, erm's native) as —
        texts = [t.get_text() for t in ax.texts]
        assert len(texts) == want.size and texts.count("—") == np.isnan(want).sum() > 0


def test_bad_metric_and_a_file_that_is_not_uimnet_are_refused(uimnet):
    _, path = uimnet
    with pytest.raises(ValueError, match="metric.*'acc1'"):
        metric_heatmaps(path, "acc1")
    with pytest.raises(ValueError, match="not a uimnet score file"):
        metric_heatmaps(read_dataset(path).drop_vars("auc"))


def test_histograms_recompute_the_u_the_file_scored(uimnet):
    """The histogram's u, recomputed from the caches, give per seed the AUROC whose mean over
    data seeds the file holds (up to float summation order)."""
    _, path = uimnet
    ds = read_dataset(path)
    sel = histogram_selection(ds)
    assert sel is not None and sel["k"] == 1 and sel["spectral"] is False
    auc = ds["auc"].sel(stat="mean", k=1, calibration="none", spectral=False)
    assert np.isfinite(auc.sel(measure=sel["measure"])).all()
    assert float(auc.sel(measure=sel["measure"]).mean()) == float(
        auc.where(np.isfinite(auc).all("algorithm")).mean("algorithm").max())
    cfg = recorded_config(ds)
    cells = [p for p in recorded_caches(ds) if "/ensembles/" in p and p.endswith(".k1.nc")
             and ".sn0." in p]
    for alg in ds.algorithm.values:
        own = [p for p in cells if p.split("/")[-1].startswith(f"{alg}.sn0.")]
        assert len(own) == ds.attrs["n_data_seeds"] == 2
        per_seed = []
        for p in own:
            u = _uncertainties(p, sel["measure"], cfg)
            per_seed.append(ood_auroc_score(u["in_test"], u["out_test"]))
        assert np.mean(per_seed) == pytest.approx(float(auc.sel(algorithm=alg,
                                                                 measure=sel["measure"])),
                                                  abs=1e-12)
    fig = uncertainty_histograms(ds)
    axes = fig.axes
    assert [a.get_title().split(" ")[0] for a in axes] == ds.algorithm.values.tolist()
    for ax in axes:  # two step histograms, in-domain then out-domain
        assert [t.get_text().split(" ")[0] for t in ax.get_legend().get_texts()] == [
            "in-domain", "out-domain"]


def test_draw_figures_writes_them_and_skips_histograms_without_caches(uimnet, tmp_path):
    _, path = uimnet
    paths = draw_figures(path, tmp_path / "png")
    assert [p.name for p in paths] == [f"{n}.png" for n in NAMES]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000
    # the report's switch: every figure through save_figure, so all become SVG
    with figure_format("svg"):
        svgs = VISION_PROTOCOLS.lookup("uimnet").plots.draw(path, tmp_path / "svg")
    assert [p.name for p in svgs] == [f"{n}.svg" for n in NAMES]
    assert all(p.read_text().lstrip().startswith("<?xml") for p in svgs)
    # a score file whose caches are gone: the heat maps only
    ds = read_dataset(path)
    ds.attrs["caches"] = json.dumps({str(tmp_path / "gone" / "ensembles" / p.split("/")[-1]): v
                                     for p, v in json.loads(ds.attrs["caches"]).items()})
    moved = write_dataset(ds, tmp_path / "moved.nc")
    assert [p.name for p in draw_figures(moved, tmp_path / "moved")] == [
        f"{n}.png" for n in NAMES[:3]]


def test_plot_command_writes_the_figures(uimnet, tmp_path, capsys):
    _, path = uimnet
    out = tmp_path / "fig"
    assert main(["plot", "--uimnet", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{n}.png" for n in NAMES)
    assert [p.split("/")[-1] for p in printed] == [f"{n}.png" for n in NAMES]
