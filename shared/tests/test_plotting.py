"""Tests of uqmetrics.report.plotting: every plot draws what it should and saves a PNG."""

from __future__ import annotations

import errno
import os

os.environ.setdefault("MPLBACKEND", "Agg")

import numpy as np
import pytest
import xarray as xr
from matplotlib.collections import PolyCollection, QuadMesh
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from uqmetrics.metrics.regression import coverage_summary
from uqmetrics.report.plotting import (
    plot_coverage_vs_complexity,
    plot_heatmap,
    plot_metric_vs_size,
    plot_prediction_bands,
    plot_reliability_diagram,
    plot_risk_coverage,
    save_figure,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _saved_png(fig, tmp_path, name="fig.png"):
    path = save_figure(fig, tmp_path / "plots" / name, dpi=40)
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 500
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []
    return path


def _legend_texts(ax):
    leg = ax.get_legend()
    assert leg is not None
    return [t.get_text() for t in leg.get_texts()]


def _reliability_ds():
    """A reliability Dataset of the shape uqmetrics.metrics.classification.reliability_diagram returns."""
    edges = np.linspace(0, 1, 6)
    count = np.array([0, 3, 0, 10, 20])
    acc = np.array([np.nan, 0.3, np.nan, 0.6, 0.95])
    conf = np.array([np.nan, 0.35, np.nan, 0.7, 0.9])
    return xr.Dataset(
        {"lower": ("bin", edges[:-1]), "upper": ("bin", edges[1:]), "count": ("bin", count),
         "accuracy": ("bin", acc), "confidence": ("bin", conf), "gap": ("bin", acc - conf)},
        coords={"bin": np.arange(5)},
        attrs={"ece": 0.05},
    )


def test_reliability_diagram_from_dataset(tmp_path):
    fig = plot_reliability_diagram(_reliability_ds())
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    acc_bars, gap_bars = ax.containers
    assert len(acc_bars) == 3 and len(gap_bars) == 3  # non-empty bins only
    np.testing.assert_allclose([b.get_height() for b in acc_bars], [0.3, 0.6, 0.95])
    np.testing.assert_allclose([b.get_x() for b in acc_bars], [0.2, 0.6, 0.8])
    assert len(ax.lines) == 1  # the diagonal
    assert any("ECE 0.050" in t for t in _legend_texts(ax))
    _saved_png(fig, tmp_path)


def test_reliability_diagram_from_labels_and_probs(tmp_path):
    from uqmetrics.metrics import classification

    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(3), size=200)
    labels = rng.integers(0, 3, size=200)
    fig = plot_reliability_diagram((labels, probs), n_bins=10, show_gap=False)
    rd = classification.reliability_diagram(labels, probs, n_bins=10)
    (bars,) = fig.axes[0].containers
    assert len(bars) == int((rd["count"] > 0).sum())
    _saved_png(fig, tmp_path)


def test_risk_coverage(tmp_path):
    cov = np.linspace(0.1, 1, 10)
    curves = {"model a": (cov, 0.05 * cov), "model b": (cov[::-1], (0.4 * cov)[::-1], cov),
              "model c": {"coverage": cov, "risk": 0.2 * np.ones(10)}}
    fig = plot_risk_coverage(curves)
    ax = fig.axes[0]
    assert len(ax.lines) == 3
    assert _legend_texts(ax) == ["model a", "model b", "model c"]
    # curves are drawn in increasing coverage whatever the input order
    np.testing.assert_allclose(ax.lines[1].get_xdata(), cov)
    np.testing.assert_allclose(ax.lines[1].get_ydata(), 0.4 * cov)
    _saved_png(fig, tmp_path)


@pytest.fixture(scope="module")
def summary():
    rng = np.random.default_rng(2)
    methods, comps, k = ["blr", "bd", "ens"], [1, 2, 3, 4], 40
    x = np.linspace(-6, 6, 9)
    truth = xr.DataArray(np.sin(x), dims="point", coords={"x": ("point", x)})
    shape = (3, 4, k, 9)
    dims = ("method", "complexity", "repetition", "point")
    ds = xr.Dataset(
        {"prediction": (dims, truth.values + rng.standard_normal(shape)),
         "uncertainty": (dims, np.broadcast_to([[[[1.0]]], [[[0.5]]], [[[2.0]]]], shape)),
         "truth": truth},
        coords={"method": methods, "complexity": comps, "x": ("point", x)},
    )
    ds = ds.swap_dims(point="x")
    regions = xr.DataArray(np.abs(x) <= 4, dims="x", coords={"x": x})
    return coverage_summary(ds, reference=("method", "blr"), regions=regions)


@pytest.mark.parametrize("error", ["binomial", "paper", None])
def test_coverage_vs_complexity(tmp_path, error, summary):
    s = summary
    fig = plot_coverage_vs_complexity(s, point_selection={"x": -2.38}, error=error)
    ax = fig.axes[0]
    containers = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(containers) == 3  # one per method
    assert _legend_texts(ax) == ["blr", "bd", "ens", "nominal 0.95"]
    nominal = [ln for ln in ax.lines if np.allclose(ln.get_ydata(), 0.95)]
    assert len(nominal) == 1
    # nearest test point to -2.38 is x = -3 (grid step 1.5); the blr line shows its coverage
    expected = s["coverage"].sel({"method": "blr"}).sel(x=-3.0).values
    np.testing.assert_allclose(containers[0].lines[0].get_ydata(), expected)
    np.testing.assert_allclose(containers[0].lines[0].get_xdata(), [1, 2, 3, 4])
    assert "x=-3" in ax.get_title()  # the title names the point actually selected
    has_bars = containers[0].has_yerr
    assert has_bars == (error is not None)
    if error == "binomial":
        _saved_png(fig, tmp_path)


def test_coverage_vs_complexity_on_a_non_index_coordinate(summary):
    s = summary.drop_indexes("x")  # x is then a plain coordinate, as in uqreg's study files
    assert "x" not in s.indexes
    fig = plot_coverage_vs_complexity(s, point_selection={"x": 2.9}, error="paper")
    ax = fig.axes[0]
    containers = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    np.testing.assert_allclose(containers[1].lines[0].get_ydata(),
                               summary["coverage"].sel({"method": "bd"}).sel(x=3.0).values)
    assert "x=3" in ax.get_title()


def test_coverage_vs_complexity_region(tmp_path, summary):
    s = summary
    fig = plot_coverage_vs_complexity(s, point_selection={"region": "out"}, nominal=0.9)
    ax = fig.axes[0]
    containers = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(containers) == 3 and all(c.has_yerr for c in containers)
    np.testing.assert_allclose(containers[2].lines[0].get_ydata(),
                               s["region_coverage"].sel({"method": "ens", "region": "out"}))
    assert _legend_texts(ax)[-1] == "nominal 0.9"
    _saved_png(fig, tmp_path)


def test_coverage_vs_complexity_rejects_bad_input(summary):
    s = summary
    with pytest.raises(ValueError, match="point_selection"):
        plot_coverage_vs_complexity(s, point_selection=None)  # the point dim would remain
    with pytest.raises(ValueError, match="point_selection"):
        plot_coverage_vs_complexity(s, point_selection={"lambda": 0.5})
    with pytest.raises(ValueError, match="point_selection"):
        plot_coverage_vs_complexity(s, point_selection={"region": "middle"})
    with pytest.raises(ValueError, match="error"):
        plot_coverage_vs_complexity(s, point_selection={"x": 0.0}, error="sd")
    with pytest.raises(ValueError, match="summary"):
        plot_coverage_vs_complexity(s["coverage"], point_selection={"x": 0.0})


def _sizes():
    rng = np.random.default_rng(4)
    size = np.arange(1, 9)
    base = 1.0 / np.sqrt(size)
    data = base[None, :, None] * np.array([1.0, 1.2])[:, None, None] \
        + 0.01 * rng.standard_normal((2, 8, 5))
    return xr.Dataset({"nll": (("method", "size", "order"), data),
                       "acc": (("method", "size", "order"), 1 - data)},
                      coords={"method": ["deep_ensemble", "snapshot"], "size": size})


def test_metric_vs_size(tmp_path):
    ds = _sizes()
    fig = plot_metric_vs_size(ds, variable="nll")
    ax = fig.axes[0]
    assert len(ax.lines) == 2
    assert _legend_texts(ax) == ["deep_ensemble", "snapshot"]
    assert len([c for c in ax.collections if isinstance(c, PolyCollection)]) == 2  # ± std bands
    np.testing.assert_allclose(ax.lines[0].get_ydata(),
                               ds["nll"].sel({"method": "deep_ensemble"}).mean("order"))
    np.testing.assert_allclose(ax.lines[0].get_xdata(), np.arange(1, 9))
    _saved_png(fig, tmp_path)
    # a DataArray without an order dim: lines, no bands
    fig = plot_metric_vs_size(ds["acc"].isel(order=0))
    assert len(fig.axes[0].lines) == 2 and len(fig.axes[0].collections) == 0
    with pytest.raises(ValueError, match="variable"):
        plot_metric_vs_size(ds)
    with pytest.raises(ValueError, match="size"):
        plot_metric_vs_size(ds["nll"].rename(size="k"))


def test_prediction_bands(tmp_path):
    x = np.linspace(-6, 6, 50)[::-1]  # unsorted input is sorted for drawing
    truth = np.sin(x)
    fig = plot_prediction_bands(x, truth, truth + 0.1, np.full(50, 0.2), x_train=x[:10],
                                y_train=truth[:10], z=2.0)
    ax = fig.axes[0]
    assert len(ax.lines) == 2
    assert len(ax.collections) == 2  # the band and the training points
    assert _legend_texts(ax) == ["ground truth", "prediction", "± 2 uncertainty",
                                 "training data"]
    np.testing.assert_allclose(ax.lines[1].get_xdata(), np.sort(x))
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert band.max() == pytest.approx((truth + 0.1 + 0.4).max())
    assert band.min() == pytest.approx((truth + 0.1 - 0.4).min())
    _saved_png(fig, tmp_path)
    with pytest.raises(ValueError, match="uncertainty"):
        plot_prediction_bands(x, truth, truth, -np.ones(50))
    with pytest.raises(ValueError, match="prediction"):
        plot_prediction_bands(x, truth, truth[:3], np.ones(50))
    with pytest.raises(ValueError, match="x_train"):
        plot_prediction_bands(x, truth, truth, np.ones(50), x_train=x)


def test_heatmap(tmp_path):
    g1 = np.linspace(-5, 5, 11)
    g2 = np.linspace(-5, 5, 7)
    da = xr.DataArray(np.random.default_rng(0).uniform(size=(11, 7)), dims=("x1", "x2"),
                      coords={"x1": g1, "x2": g2}, name="coverage")
    fig = plot_heatmap(da, x="x1", y="x2", vmin=0, vmax=1, box=(1, 4, 1, 4))
    ax = fig.axes[0]
    (mesh,) = [c for c in ax.collections if isinstance(c, QuadMesh)]
    # rows = y = x2 (matplotlib < 3.8 keeps the mesh's values flattened, row by row)
    np.testing.assert_array_equal(np.reshape(mesh.get_array(), (7, 11)), da.values.T)
    assert len(fig.axes) == 2  # the plot and its colour bar
    assert mesh.get_clim() == (0, 1)
    assert len([p for p in ax.patches if isinstance(p, Rectangle)]) == 1
    assert ax.get_xlabel() == "x1" and ax.get_ylabel() == "x2"
    _saved_png(fig, tmp_path)
    fig = plot_heatmap(da)  # default: first dim on the vertical axis
    assert fig.axes[0].get_ylabel() == "x1"
    with pytest.raises(ValueError, match="da"):
        plot_heatmap(da.expand_dims(method=["blr"]))
    with pytest.raises(ValueError, match="x and y"):
        plot_heatmap(da, x="x3")


def test_plots_accept_an_existing_axes(tmp_path):
    fig = Figure()
    ax1, ax2 = fig.subplots(1, 2)
    out = plot_risk_coverage({"m": ([0.5, 1.0], [0.1, 0.2])}, ax=ax1)
    out2 = plot_heatmap(xr.DataArray(np.eye(3), dims=("a", "b")), ax=ax2)
    assert out is fig and out2 is fig
    assert len(ax1.lines) == 1
    _saved_png(fig, tmp_path)
    with pytest.raises(ValueError, match="ax"):
        plot_risk_coverage({"m": ([0.5, 1.0], [0.1, 0.2])}, ax="left")


def test_save_figure_is_atomic(tmp_path, monkeypatch):
    fig = plot_risk_coverage({"m": ([0.5, 1.0], [0.1, 0.2])})
    path = _saved_png(fig, tmp_path, "r.png")
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise RuntimeError("renderer died")

    monkeypatch.setattr(fig, "savefig", boom)
    with pytest.raises(RuntimeError):
        save_figure(fig, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.png"]
    with pytest.raises(ValueError, match="path"):
        save_figure(fig, tmp_path / "r.jpg")
    with pytest.raises(ValueError, match="fig"):
        save_figure(object(), tmp_path / "r.png")


def test_bad_plot_inputs():
    with pytest.raises(ValueError, match="data"):
        plot_reliability_diagram(_reliability_ds().drop_vars("accuracy"))
    with pytest.raises(ValueError, match="curves"):
        plot_risk_coverage({})
    with pytest.raises(ValueError, match="risk"):
        plot_risk_coverage({"m": ([0.5, 1.0], [0.1])})
    with pytest.raises(ValueError, match="coverage"):
        plot_risk_coverage({"m": ([0.5, np.nan], [0.1, 0.2])})



def test_a_figure_that_cannot_be_written_names_its_path(tmp_path):
    """A full disk fails inside the open file, whose error names no file (``[Errno 28] No space
    left on device`` alone): ``save_figure`` names the figure's path, and leaves no file."""
    from uqmetrics.runs.testing.filesystems import full_filesystems

    fig = Figure()
    fig.add_subplot().plot(np.arange(1000), np.random.default_rng(0).normal(size=1000))
    with full_filesystems(tmp_path) as make:
        target = make(0) / "f.png"
        with pytest.raises(OSError) as info:
            save_figure(fig, target)
        assert info.value.filename == str(target) and info.value.errno == errno.ENOSPC
        assert sorted(p.name for p in target.parent.iterdir()) == ["filler"]


@pytest.mark.parametrize("name", ["../x.png", "a/b.png", "/tmp/x.png", "..", ".", ""])
def test_a_figure_name_that_leads_elsewhere_is_refused(tmp_path, name):
    """Figure names are built from a file's labels: one that is not a plain file name is refused
    before anything is drawn or written (labels pass through safe_name first)."""
    from uqmetrics.report.plotting import figure_path, save_figures

    drawn = []
    with pytest.raises(ValueError, match="is not one file name inside"):
        save_figures([(name, lambda: drawn.append(1))], tmp_path / "out")
    assert not drawn and not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []
    assert figure_path(tmp_path, "ok+name.png") == tmp_path / "ok+name.png"
