"""Legible figures: :func:`~uqmetrics.report.plotting.overlapping_text` finds a legend over a
title, a title over another, a legend over a panel and a text past the figure's edge, and
passes a clean figure; :func:`~uqmetrics.report.plotting.alike_legend_entries` finds two series
drawn alike; :func:`~uqmetrics.report.plotting.label_points` names points inside their panel;
:func:`~uqmetrics.report.plotting.distinct_styles` gives any number of series
pairwise distinct styles; every plotting function of uqmetrics draws a legible figure with few
and with many series (:func:`~uqmetrics.report.plotting.series_legend`)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import xarray as xr

from uqmetrics.metrics.regression import coverage_summary
from uqmetrics.report.plotting import (
    alike_legend_entries,
    distinct_styles,
    figure_grid,
    fitted_suptitle,
    label_points,
    overlapping_text,
    plot_coverage_vs_complexity,
    plot_heatmap,
    plot_metric_vs_size,
    plot_prediction_bands,
    plot_reliability_diagram,
    plot_risk_coverage,
    series_legend,
)

# ---------------------------------------------------------------------------------------------
# overlapping_text


def _two_panels():
    fig, axes = figure_grid(1, 2, panel=(3.0, 2.5))
    for k, ax in enumerate(axes[0]):
        ax.plot([0, 1], [0, 1], label=f"series {k}")
        ax.set(title=f"panel {k}", xlabel="x", ylabel="y")
    return fig, axes[0]


def test_a_clean_figure_has_no_overlap():
    fig, axes = _two_panels()
    axes[0].legend(loc="lower right")
    fig.suptitle("two panels")
    assert overlapping_text(fig) == []


def test_a_legend_over_a_title_is_found():
    fig, axes = _two_panels()
    # anchored just above the first panel, left out of the layout: over its title
    axes[0].legend(loc="lower center", bbox_to_anchor=(0.5, 0.98)).set_in_layout(False)
    assert ("panel 1 title 'panel 0'", "panel 1 legend") in overlapping_text(fig)


def test_a_legend_over_another_panel_and_its_labels_is_found():
    fig, axes = _two_panels()
    # left out of the layout (as a fixed tight_layout rect leaves it): into the next panel
    axes[0].legend(loc="center left", bbox_to_anchor=(0.9, 0.5), fontsize=14).set_in_layout(False)
    found = overlapping_text(fig)
    assert ("panel 1 legend", "panel 2") in found
    assert ("panel 1 legend", "panel 2 ylabel 'y'") in found


def test_a_figure_legend_over_the_panels_and_the_suptitle_is_found():
    fig, _ = _two_panels()
    fig.suptitle("a suptitle")
    fig.legend(loc="center")
    found = overlapping_text(fig)
    assert ("figure legend", "panel 1") in found
    assert ("figure legend", "panel 2 ylabel 'y'") in found
    fig.legend(loc="upper center", fontsize=20)  # over the suptitle
    assert ("suptitle 'a suptitle'", "figure legend 2") in overlapping_text(fig)


def test_a_title_over_another_and_past_the_edge_is_found():
    fig, axes = _two_panels()
    axes[0].set_title("a title far wider than its panel, over the next panel's " * 2)
    found = overlapping_text(fig)
    assert ("panel 1 title 'a title far wider than its…'", "panel 2 title 'panel 1'") in found
    assert ("panel 1 title 'a title far wider than its…'", "figure edge") in found


def test_a_legend_in_its_own_panel_or_a_twins_is_no_overlap():
    fig, axes = figure_grid(1, 1, panel=(4.0, 3.0))
    ax = axes[0, 0]
    twin = ax.twinx()
    ax.plot([0, 1], label="left")
    twin.plot([1, 0], color="C1", label="right")
    twin.set_ylabel("right axis")
    ax.legend(loc="center")
    twin.legend(loc="upper center")
    assert overlapping_text(fig) == []


def test_a_bare_figure_is_drawn_on_an_agg_canvas():
    from matplotlib.figure import Figure

    fig = Figure()
    fig.add_subplot().set_title("t")
    assert overlapping_text(fig) == []
    with pytest.raises(ValueError, match="Figure"):
        overlapping_text("not a figure")


# ---------------------------------------------------------------------------------------------
# distinct_styles, alike_legend_entries


def _triples(styles):
    return [(s["color"], s["linestyle"], s["marker"]) for s in styles.values()]


@pytest.mark.parametrize("n", [1, 10, 17, 46, 240, 960])
def test_any_number_of_series_get_pairwise_distinct_styles(n):
    triples = _triples(distinct_styles([f"method_{i}" for i in range(n)]))
    assert len(triples) == n and len(set(triples)) == n


def test_up_to_ten_series_keep_matplotlibs_default_look():
    from matplotlib import rcParams
    from matplotlib.colors import to_hex

    defaults = [to_hex(c) for c in rcParams["axes.prop_cycle"].by_key()["color"]]
    styles = distinct_styles(range(10))
    assert [s["color"] for s in styles.values()] == defaults
    assert {(s["linestyle"], s["marker"]) for s in styles.values()} == {("-", "o")}


@pytest.mark.parametrize("n", [17, 46])
def test_families_share_a_colour_and_differ_in_line_style(n):
    names = [f"m{i // 2}" + ("_tta" if i % 2 else "") for i in range(n)]
    styles = distinct_styles(names, family=lambda s: (s.removesuffix("_tta"), int(s.endswith("_tta"))))
    assert len(set(_triples(styles))) == n
    for plain, tta in itertools.pairwise(names):
        if tta == f"{plain}_tta":
            assert styles[plain]["color"] == styles[tta]["color"]
            assert styles[plain]["linestyle"] != styles[tta]["linestyle"]


def test_distinct_styles_refuses_what_cannot_be_told_apart():
    with pytest.raises(ValueError, match="distinct"):
        distinct_styles(["a", "a"])
    with pytest.raises(ValueError, match="variant"):
        distinct_styles(["a"], family=lambda s: (s, 4))
    with pytest.raises(ValueError, match="own"):
        distinct_styles(["a", "b"], family=lambda s: ("one", 0))


def test_alike_legend_entries_finds_repeated_default_colours():
    fig, axes = figure_grid(1, 1, panel=(4.0, 3.0))
    for i in range(11):
        axes[0, 0].scatter([i], [i], label=f"s{i}")
    axes[0, 0].legend()
    assert alike_legend_entries(fig) == [("panel 1 legend 's0'", "panel 1 legend 's10'")]
    fig, axes = figure_grid(1, 1, panel=(4.0, 3.0))
    for name, style in distinct_styles([f"s{i}" for i in range(11)]).items():
        axes[0, 0].plot([0, 1], label=name, **style)
    axes[0, 0].legend()
    assert alike_legend_entries(fig) == []


# ---------------------------------------------------------------------------------------------
# series_legend, fitted_suptitle


def test_a_legend_of_many_series_stands_beside_the_panel_in_columns():
    fig, axes = figure_grid(1, 1, panel=(4.0, 3.0))
    ax = axes[0, 0]
    for i in range(40):
        ax.plot([0, 1], [i, i], label=f"series {i}")
    width = fig.get_figwidth()
    legend = series_legend(ax, fontsize="x-small", widen=True)
    assert legend is ax.get_legend() and legend._ncols == 3  # 18 entries a column
    assert fig.get_figwidth() > width  # widened: the panel keeps its size
    assert overlapping_text(fig) == []
    assert series_legend(figure_grid(1, 1, panel=(2, 2))[1][0, 0]) is None  # nothing labelled
    with pytest.raises(ValueError, match="beside"):
        series_legend(ax, beside="left")


def test_a_long_suptitle_is_broken_to_fit_the_figure():
    fig, _ = figure_grid(1, 1, panel=(2.5, 2.0))
    text = "a suptitle far longer than a figure of one narrow panel is wide"
    title = fitted_suptitle(fig, text)
    assert "\n" in title.get_text() and title.get_text().replace("\n", " ") == text
    assert overlapping_text(fig) == []
    assert fitted_suptitle(fig, "short").get_text() == "short"


# ---------------------------------------------------------------------------------------------
# every plotting function of uqmetrics


def _summary(methods):
    rng = np.random.default_rng(2)
    comps, k = [1, 2, 3], 10
    x = np.linspace(-6, 6, 7)
    shape = (len(methods), len(comps), k, x.size)
    dims = ("method", "complexity", "repetition", "point")
    ds = xr.Dataset({"prediction": (dims, np.sin(x) + rng.standard_normal(shape)),
                     "uncertainty": (dims, np.ones(shape)), "truth": ("point", np.sin(x))},
                    coords={"method": methods, "complexity": comps, "x": ("point", x)})
    ds = ds.swap_dims(point="x")
    return coverage_summary(ds, reference=("method", methods[0]),
                            regions=xr.DataArray(np.abs(x) <= 4, dims="x", coords={"x": x}))


def _sizes(methods):
    rng = np.random.default_rng(4)
    return xr.DataArray(rng.random((len(methods), 6, 3)), dims=("method", "size", "order"),
                        coords={"method": methods, "size": np.arange(1, 7)}, name="nll")


def _curves(n):
    cov = np.linspace(0.05, 1, 50)
    return {f"resnet50_model_{i}": (cov, (0.02 + 0.01 * i) * cov) for i in range(n)}


def _names(n):
    return ["deep_ensemble", *[f"variational_method_{i}" for i in range(n - 1)]]


DRAWN = {
    "reliability": lambda n: plot_reliability_diagram(
        (np.arange(200) % 3, np.random.default_rng(0).dirichlet(np.ones(3), 200))),
    "risk_coverage": lambda n: plot_risk_coverage(_curves(n)),
    "coverage_vs_complexity": lambda n: plot_coverage_vs_complexity(
        _summary(_names(n)), point_selection={"x": 2.0}),
    "coverage_vs_complexity_region": lambda n: plot_coverage_vs_complexity(
        _summary(_names(n)), point_selection={"region": "out"}),
    "prediction_bands": lambda n: plot_prediction_bands(
        np.linspace(-3, 3, 40), np.sin(np.linspace(-3, 3, 40)), np.zeros(40), np.ones(40),
        x_train=np.zeros(5), y_train=np.ones(5)),
    "heatmap": lambda n: plot_heatmap(xr.DataArray(np.eye(4), dims=("x1", "x2"), name="coverage"),
                                      box=(0, 1, 0, 1)),
    "metric_vs_size": lambda n: plot_metric_vs_size(_sizes(_names(n)), title="nll vs ensemble size"),
}


@pytest.mark.parametrize("n", [2, 17, 46])
@pytest.mark.parametrize("name", DRAWN)
def test_every_plotting_function_draws_a_legible_figure(name, n):
    fig = DRAWN[name](n)
    assert overlapping_text(fig) == []
    assert alike_legend_entries(fig) == []


@pytest.mark.parametrize("n", [17, 46])
def test_the_series_of_metric_vs_size_are_pairwise_distinct(n):
    names = _names(n)
    ax = plot_metric_vs_size(_sizes(names)).axes[0]
    styles = [(line.get_color(), line.get_linestyle(), line.get_marker()) for line in ax.lines]
    assert len(set(styles)) == n
    # a style given per series overrides the distinct one
    given = plot_metric_vs_size(_sizes(names), styles={names[0]: {"color": "k", "marker": "x"}})
    assert (given.axes[0].lines[0].get_color(), given.axes[0].lines[0].get_marker()) == ("k", "x")


# ---------------------------------------------------------------------------------------------
# label_points


def test_label_points_stay_inside_the_panel_and_off_their_points():
    """Points at the four corners of a panel and at its centre, named with long names: every
    name lies inside the panel, beside its point, not over it (before, a name started at its
    point and ran to the right: past the panel's right edge, and over the marker). A point
    with a NaN is not named."""
    fig, axes = figure_grid(1, 2, panel=(3.0, 2.5))
    ax = axes[0, 0]
    x = np.array([0.0, 1.0, 0.0, 1.0, 0.5, np.nan])
    y = np.array([0.0, 0.0, 1.0, 1.0, 0.5, 0.3])
    names = [f"a rather long model name {k}" for k in range(6)]
    ax.scatter(x, y)
    ax.set_xlim(-0.05, 1.05)
    ax.set_ylim(-0.05, 1.05)
    labels = label_points(ax, x, y, names, fontsize=6)
    assert [t.get_text() for t in labels] == names[:5]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    panel = ax.get_window_extent(renderer)
    for label, xi, yi in zip(labels, x, y, strict=False):
        box = label.get_window_extent(renderer)
        assert panel.x0 <= box.x0 and box.x1 <= panel.x1, label.get_text()
        assert panel.y0 <= box.y0 and box.y1 <= panel.y1, label.get_text()
        px, py = ax.transData.transform((xi, yi))
        assert not (box.x0 < px < box.x1 and box.y0 < py < box.y1), label.get_text()
    assert overlapping_text(fig) == []
    with pytest.raises(ValueError, match="one entry per point"):
        label_points(ax, x, y, names[:2])


def test_label_points_leave_the_limits_to_the_scale_set_afterwards():
    """The figure that sets a log scale after naming its points (selective's AUROC against
    parameters) still draws, and autoscales on the log scale: ``label_points`` read the
    panel's limits before, which froze them on the linear scale (x from 0), and drawing then
    failed with 'Data cannot be log-scaled'. Points with a NaN are neither named nor drawn."""
    fig, axes = figure_grid(1, 1, panel=(3.0, 2.5))
    ax = axes[0, 0]
    x, y = np.array([1e3, 1e5, 1e7]), np.array([np.nan, np.nan, np.nan])
    ax.scatter(x, y)
    assert label_points(ax, x, y, ["a", "b", "c"]) == []
    ax.set_xscale("log")
    fig.canvas.draw()
    x, y = np.array([1e3, 1e5, 1e7]), np.array([0.2, 0.5, 0.9])
    ax.scatter(x, y)
    labels = label_points(ax, x, y, ["a", "b", "c"])
    ax.set_xscale("log")
    fig.canvas.draw()
    assert ax.get_xlim()[0] > 0
    assert [t.get_horizontalalignment() for t in labels] == ["left", "left", "right"]
