"""The paper's figures, drawn from a study file alone (thin layer over :mod:`uqmetrics.report.plotting`).

* :func:`plot_bands` — prediction ± z·std (z = :data:`uqmetrics.COVERAGE_Z`) per method, with the
  training data and the ground truth (the paper's Figs. 1, 2); each panel's title gives the
  method's collapsed fraction and R² of its fit;
* :func:`plot_probes` — deviation, uncertainty and coverage against complexity at the probe
  points (Figs. 3, 6, and 4, 5), with a last row of collapse diagnostics (collapsed fraction,
  R² of the fit, training loss relative to the best constant's);
* :func:`plot_coverage_map` — log10 deviation, log10 uncertainty and coverage over the 2-D test
  grid per method (Fig. 7);
* :func:`plot_conditional_coverage` — the exact conditional coverage of each method's 1 − α
  interval against x, in and out of the training range, the mean over noise draws with the band of
  their central 80 %, beside the reference's (R.6); on a 2-D grid a map per method;
* :func:`plot_conditional_vs_complexity` — the same per region against complexity, with the
  interval width relative to the reference's;
* :func:`plot_variances` — a disentanglement study's (:mod:`uqreg.disentangle`) two estimated
  variances against x per method, bands over repetitions, over the exact ones;
* :func:`plot_leakage` — its leakage and untangle's measure against complexity, in and out of the
  training box, beside the exact oracle's;
* :func:`plot_real_calibration`, :func:`plot_real_scores` — a real-data study's
  (:mod:`uqreg.real`) calibration curves and scores, before and after recalibration;
* :func:`plot_reference` — the exact posterior of ``uqreg reference --out``: its predictive band
  and the two parts of its variance against x.

A study with several recipes gets each figure once per recipe (``recipe=``).

One dispatch from a result file to its figures: :data:`RESULT_KINDS` (kind -> the dims and
variables that recognise it, and its ``draw``), :func:`result_kind` and :func:`plot_result`, used by
``uqreg plot``, ``uqreg report``, ``uqreg study``/``sweep`` and ``uqreg real``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg", force=False)
import matplotlib.pyplot as plt
import numpy as np
import uqmetrics
import xarray as xr
from matplotlib.ticker import MaxNLocator
from uqmetrics.metrics.registry import Registry
from uqmetrics.report.plotting import (
    distinct_styles,
    figure_path,
    fitted_suptitle,
    plot_coverage_vs_complexity,
    plot_heatmap,
    plot_prediction_bands,
    save_figure,
)
from uqmetrics.runs.io import safe_name

#: The dims and variables :func:`plot_study` draws from: those of every study file ``uqreg study``
#: and ``uqreg sweep`` write (the collapse diagnostics are drawn when present).
STUDY_DIMS = ("method", "complexity", "repetition", "point", "region")
STUDY_VARIABLES = ("prediction", "uncertainty", "truth", "x_train", "y_train", "n_train", "input_size", "coverage",
                   "coverage_low", "coverage_high", "deviation_mean", "deviation_se", "uncertainty_mean",
                   "uncertainty_se", "region_coverage", "region_coverage_se", "region_deviation_mean",
                   "region_deviation_se", "region_uncertainty_mean", "region_uncertainty_se")


def check_study(ds: xr.Dataset, source=None) -> None:
    """Raise :class:`uqmetrics.InputError` unless ``ds`` is a study :func:`plot_study` can draw
    (it has :data:`STUDY_DIMS` and :data:`STUDY_VARIABLES`); the message names ``source`` (the
    file read) and what is missing.

    Examples
    --------
    >>> check_study(xr.Dataset({"logits": (("n", "class"), [[0.0, 1.0]])}), "cache.nc")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    uqmetrics.metrics.exceptions.InputError: cache.nc is not a uqreg study (written by uqreg study or uqreg sweep): it lacks the dims method, complexity, repetition, point, region and 20 of its 20 variables (prediction, uncertainty, truth, x_train, ...)
    """
    dims = [d for d in STUDY_DIMS if d not in ds.dims]
    variables = [v for v in STUDY_VARIABLES if v not in ds.data_vars]
    if not dims and not variables:
        return
    lacks = []
    if dims:
        lacks.append(f"the dims {', '.join(dims)}")
    if variables:
        lacks.append(f"{len(variables)} of its {len(STUDY_VARIABLES)} variables ({', '.join(variables[:4])}"
                     f"{', ...' if len(variables) > 4 else ''})")
    what = "the dataset" if source is None else str(source)
    raise uqmetrics.InputError(f"{what} is not a uqreg study (written by uqreg study or uqreg sweep): it lacks "
                               f"{' and '.join(lacks)}")


def train_box(ds: xr.Dataset) -> tuple[float, float] | None:
    """The training box ``(low, high)`` of every input coordinate from the file's ``train_box``
    attr, or None where it has none.

    In memory the attr is a list; read back from netCDF it is its JSON text (``"[1.0, 4.0]"``),
    which is decoded here, the one place that reads it.

    Raises
    ------
    ValueError
        For an attr that is not two numbers.

    Examples
    --------
    >>> train_box(xr.Dataset(attrs={"train_box": "[1.0, 4.0]"}))
    (1.0, 4.0)
    >>> train_box(xr.Dataset(attrs={"train_box": [-2, 2]}))
    (-2.0, 2.0)
    """
    value = ds.attrs.get("train_box")
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(f"train_box attr must be two numbers (JSON), got {value!r}") from None
    box = np.asarray(value, dtype=float).ravel() if np.ndim(value) else np.array([])
    if box.size != 2:
        raise ValueError(f"train_box attr must be two numbers (low, high), got {value!r}")
    return float(box[0]), float(box[1])


#: Up to this many complexity levels are each a tick of their own (categorical axis).
MAX_LEVEL_TICKS = 12


def _level_ticks(ax, levels) -> None:
    """Ticks at the complexity levels present (integers, none between them; a single level is
    one tick), or integer ticks chosen by matplotlib past :data:`MAX_LEVEL_TICKS` levels."""
    levels = np.asarray(levels)
    if levels.size <= MAX_LEVEL_TICKS:
        ax.set_xticks(levels, [str(int(v)) if float(v).is_integer() else f"{v:g}" for v in levels])
        if levels.size == 1:
            ax.set_xlim(float(levels[0]) - 0.5, float(levels[0]) + 0.5)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _axis_coord(ds: xr.Dataset) -> str:
    """The 1-D plotting coordinate of the test points (``x``, ``lambda``...)."""
    for name in ("x", "lambda"):
        if name in ds.coords:
            return name
    return "point"


def _recipe(ds: xr.Dataset, recipe=None) -> tuple[xr.Dataset, str]:
    """The study restricted to one recipe (default: the first) and its name."""
    if "recipe" not in ds.dims:
        return ds, ds.attrs.get("recipe", "")
    r = ds.recipe.values[0] if recipe is None else recipe
    return ds.sel(recipe=r), str(r)


def _collapse_label(sub: xr.Dataset) -> str:
    """``"40% collapsed, R² 0.12"`` over whatever dims ``sub`` has left (mean)."""
    if "collapsed_fraction" not in sub or "fit_r2" not in sub:
        return ""
    return f"{float(sub['collapsed_fraction'].mean()):.0%} collapsed, R² {float(sub['fit_r2'].mean()):.2f}"


def plot_bands(ds: xr.Dataset, complexity, *, repetition=None, methods=None, recipe=None):
    """Prediction ± z·uncertainty of one repetition, one panel per method (z =
    :data:`uqmetrics.COVERAGE_Z`); titles name each method's collapsed fraction and R²; the
    panel of a method whose networks diverged in that repetition (``diverged``) says so.

    Returns
    -------
    matplotlib.figure.Figure
    """
    ds, rname = _recipe(ds, recipe)
    methods = list(methods or ds.method.values)
    rep = ds.repetition.values[0] if repetition is None else repetition
    sub = ds.sel(complexity=complexity, repetition=rep)
    xname = _axis_coord(ds)
    ncol = min(4, len(methods))
    nrow = -(-len(methods) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4 * ncol, 3 * nrow), squeeze=False, sharey=True)
    one_d = int(sub.input_size) == 1 and xname == "x"
    n = int(sub.n_train)
    for ax, m in zip(axes.flat, methods):
        s = sub.sel({"method": m})
        kw = {}
        if one_d:
            kw = {"x_train": sub.x_train.values[:n, 0], "y_train": sub.y_train.values[:n]}
        if "diverged" in s and bool(s["diverged"]):  # no band to draw: say so in the panel
            ax.text(0.5, 0.5, "diverged:\nprediction or uncertainty\nnot finite", ha="center", va="center",
                    transform=ax.transAxes, fontsize=9)
        else:
            plot_prediction_bands(sub[xname].values, s.truth.values, s.prediction.values, s.uncertainty.values,
                                  z=uqmetrics.COVERAGE_Z, ax=ax, **kw)
        label = _collapse_label(ds.sel({"method": m, "complexity": complexity}))
        ax.set_title(f"{m}" + (f"\n{label}" if label else ""), fontsize=9)
        ax.set_xlabel(xname)
        if ax is not axes.flat[0] and ax.get_legend() is not None:
            ax.get_legend().remove()
    for ax in list(axes.flat)[len(methods):]:
        ax.set_visible(False)
    fig.suptitle(f"{ds.attrs.get('task')}: {ds.attrs.get('complexity_name', 'complexity')} = {complexity}, "
                 f"repetition {rep}" + (f", recipe {rname}" if rname else ""))
    fig.tight_layout()
    return fig


def probe_points(ds: xr.Dataset) -> dict[str, dict]:
    """The task's probe points as ``{label: point selection}`` (nearest test point)."""
    probes = json.loads(ds.attrs.get("probes", "{}"))
    xname = _axis_coord(ds)
    if xname == "point":
        return {}
    coord = ds[xname].values
    return {f"{xname}={value}": {"point": int(np.argmin(np.abs(coord - value)))} for value in probes.values()}


def _plot_collapse_row(ds: xr.Dataset, row, cname: str) -> None:
    """Collapsed fraction, R² of the fit and training loss ÷ the best constant's vs complexity."""
    panels = (
        (ds["collapsed_fraction"], "collapsed fraction of networks"),
        (ds["fit_r2"], "R² of the fit (in distribution)"),
        (ds["train_loss"] / ds["constant_loss"], "training loss ÷ best constant's"),
    )
    styles = distinct_styles(ds.method.values)  # matplotlib's 10 colours repeat past 10 methods
    for ax, (da, title) in zip(row, panels):
        for m in ds.method.values:
            s = da.sel({"method": m})
            ax.errorbar(ds.complexity.values, s.mean("repetition").values,
                        yerr=(s.std("repetition", ddof=1) / np.sqrt(s.sizes["repetition"])).values
                        if s.sizes["repetition"] > 1 else None, capsize=2, label=str(m), **styles[str(m)])
        ax.set_title(title)
        ax.set_xlabel(cname)
        _level_ticks(ax, ds.complexity.values)
    row[2].axhline(0.95, color="k", linestyle="--", linewidth=1)  # the collapse threshold (R.3b)


def plot_probes(ds: xr.Dataset, *, probes: dict | None = None, error: str = "binomial", recipe=None):
    """Deviation, uncertainty, coverage vs complexity (columns) at each probe point (rows).

    Region averages (in/out of distribution) follow as rows, and a last row shows the collapse
    diagnostics (R.3b) beside them.
    """
    ds, rname = _recipe(ds, recipe)
    probes = dict(probes or probe_points(ds))
    probes.update({"region in": {"region": "in"}, "region out": {"region": "out"}})
    collapse = "collapsed_fraction" in ds and "fit_r2" in ds
    nrows = len(probes) + int(collapse)
    fig, axes = plt.subplots(nrows, 3, figsize=(13, 3.2 * nrows), squeeze=False)
    cname = ds.attrs.get("complexity_name", "complexity")
    styles = distinct_styles(ds.method.values)  # matplotlib's 10 colours repeat past 10 methods
    for row, (label, sel) in zip(axes, probes.items()):
        region = "region" in sel
        pre = "region_" if region else ""
        sub = ds.sel(sel)
        for ax, var in zip(row[:2], ("deviation", "uncertainty")):
            for m in ds.method.values:
                s = sub.sel({"method": m})
                ax.errorbar(ds.complexity.values, s[f"{pre}{var}_mean"].values, yerr=s[f"{pre}{var}_se"].values,
                            capsize=2, label=str(m), **styles[str(m)])
            ax.set_yscale("log")
            ax.set_title(f"{var} at {label}")
            ax.set_xlabel(cname)
        plot_coverage_vs_complexity(ds, point_selection=sel, error=error, ax=row[2],
                                    title=f"coverage at {label}")
        row[2].set_xlabel(cname)
        for ax in row:
            _level_ticks(ax, ds.complexity.values)
    if collapse:
        _plot_collapse_row(ds, axes[-1], cname)
    for ax in axes.flat:
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    axes[0, 0].legend(fontsize=7)
    if rname:
        fig.suptitle(f"recipe {rname}")
    fig.tight_layout(rect=(0, 0, 1, 0.98) if rname else None)
    return fig


def plot_coverage_map(ds: xr.Dataset, complexity=None, *, methods=None, recipe=None):
    """Fig. 7: log10 deviation, log10 uncertainty and coverage on the 2-D grid, a row per method."""
    if not {"x1", "x2"} <= set(ds.coords):
        raise ValueError("the coverage map needs a 2-D grid task (coordinates x1, x2)")
    ds, rname = _recipe(ds, recipe)
    complexity = ds.complexity.values[0] if complexity is None else complexity
    methods = list(methods or ds.method.values)
    sub = ds.sel(complexity=complexity).set_index(point=["x1", "x2"]).unstack("point")
    fig, axes = plt.subplots(len(methods), 3, figsize=(12, 3.4 * len(methods)), squeeze=False)
    for row, m in zip(axes, methods):
        s = sub.sel({"method": m})
        label = _collapse_label(ds.sel({"method": m, "complexity": complexity}))
        plot_heatmap(np.log10(s.deviation_mean), x="x1", y="x2", ax=row[0], title=f"{m}: log10 deviation")
        plot_heatmap(np.log10(s.uncertainty_mean), x="x1", y="x2", ax=row[1], title=f"{m}: log10 uncertainty")
        # the collapse diagnostics on a line of their own: beside the name they ran past the panel
        plot_heatmap(s.coverage, x="x1", y="x2", ax=row[2], title=f"{m}: coverage\n({label})" if label
                     else f"{m}: coverage", vmin=0, vmax=1)
    if rname:
        fig.suptitle(f"recipe {rname}")
    fig.tight_layout(rect=(0, 0, 1, 0.98) if rname else None)
    return fig


def plot_recipes(ds: xr.Dataset, *, methods=None):
    """Recipe sensitivity: a column per method; rows in-distribution coverage, out-of-distribution
    coverage, collapsed fraction and R² of the fit against complexity; a line per recipe."""
    if "recipe" not in ds.dims:
        raise ValueError("plot_recipes needs a study with a recipe dim")
    methods = list(methods or ds.method.values)
    rows = (
        (ds.region_coverage.sel(region="in"), "coverage in distribution"),
        (ds.region_coverage.sel(region="out"), "coverage out of distribution"),
        (ds.collapsed_fraction.mean("repetition"), "collapsed fraction"),
        (ds.fit_r2.mean("repetition"), "R² of the fit"),
    )
    fig, axes = plt.subplots(len(rows), len(methods), figsize=(2.6 * len(methods), 2.3 * len(rows)),
                             squeeze=False, sharex=True, sharey="row", layout="constrained")
    cname = ds.attrs.get("complexity_name", "complexity")
    for i, (da, label) in enumerate(rows):
        for j, m in enumerate(methods):
            ax = axes[i, j]
            for r in ds.recipe.values:
                ax.plot(ds.complexity.values, da.sel({"recipe": r, "method": m}).values, marker="o", label=str(r))
            if i < 2:
                ax.axhline(0.95, color="k", linestyle="--", linewidth=1)
            if i == 0:
                ax.set_title(str(m))
            if j == 0:
                ax.set_ylabel(label, fontsize=8)
            if i == len(rows) - 1:
                ax.set_xlabel(cname)
            _level_ticks(ax, ds.complexity.values)
    axes[0, 0].legend(fontsize=7)
    fitted_suptitle(fig, f"{ds.attrs.get('task')}: recipe sensitivity (k={ds.sizes['repetition']})")
    return fig


#: The central share of the noise draws the conditional-coverage bands span (10th to 90th percentile).
BAND_QUANTILES = (0.1, 0.9)


def _band(ax, x, da: xr.DataArray, *, color=None, label=None, linestyle="-", marker=None):
    """Mean over ``repetition`` as a line (with ``marker`` at each x) and the 10th–90th percentile
    over it as a band (none where every repetition diverged: NaN)."""
    with warnings.catch_warnings():  # diverged in every repetition (``diverged``): nothing to draw
        warnings.filterwarnings("ignore", "All-NaN slice|Mean of empty slice", RuntimeWarning)
        lo, hi = (da.quantile(q, dim="repetition").values for q in BAND_QUANTILES)
        mean = da.mean("repetition").values
    (line,) = ax.plot(x, mean, color=color, label=label, linestyle=linestyle, marker=marker, markersize=3,
                      linewidth=1.2)
    ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    return line


def _nominal(ds: xr.Dataset) -> float:
    return 1 - float(ds.attrs.get("alpha", 0.05))


def plot_conditional_coverage(ds: xr.Dataset, complexity, *, methods=None, recipe=None):
    """Exact conditional coverage ``P(y ∈ interval | x)`` against x, a panel per method (R.6).

    Each panel shows the method's mean over noise draws and the band of their central 80 %, the
    reference's posterior predictive interval in grey, the nominal 1 − α (dashed) and the
    out-of-distribution test points shaded. On a 2-D grid task: a map of the mean per method.

    Returns
    -------
    matplotlib.figure.Figure
    """
    ds, rname = _recipe(ds, recipe)
    methods = list(methods or ds.method.values)
    sub = ds.sel(complexity=complexity)
    nominal = _nominal(ds)
    title = (f"{ds.attrs.get('task')}: conditional coverage of the {nominal:.0%} intervals, "
             f"{ds.attrs.get('complexity_name', 'complexity')} = {complexity}" + (f", recipe {rname}" if rname else ""))
    if {"x1", "x2"} <= set(ds.coords):
        grid = sub.set_index(point=["x1", "x2"]).unstack("point")
        panels = [("reference (blr predictive)", grid.reference_conditional_coverage)]
        panels += [(str(m), grid.conditional_coverage.sel({"method": m})) for m in methods]
        ncol = min(4, len(panels))
        nrow = -(-len(panels) // ncol)
        fig, axes = plt.subplots(nrow, ncol, figsize=(4 * ncol, 3.4 * nrow), squeeze=False, layout="constrained")
        lo_hi = train_box(ds)
        box = None if lo_hi is None else (*lo_hi, *lo_hi)
        for ax, (name, da) in zip(axes.flat, panels):
            plot_heatmap(da.mean("repetition"), x="x1", y="x2", ax=ax, vmin=0, vmax=1, box=box, title=name)
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        fitted_suptitle(fig, title)
        return fig
    xname = _axis_coord(ds)
    x = sub[xname].values
    out = ~sub.in_distribution.values.astype(bool)
    ncol = min(4, len(methods))
    nrow = -(-len(methods) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4 * ncol, 3 * nrow), squeeze=False, sharey=True,
                             layout="constrained")
    for ax, m in zip(axes.flat, methods):
        _band(ax, x, sub.reference_conditional_coverage, color="0.5", label="reference", linestyle="--")
        _band(ax, x, sub.conditional_coverage.sel({"method": m}), color="C0", label=str(m))
        ax.axhline(nominal, color="k", linestyle=":", linewidth=1, label=f"1 − α = {nominal:g}")
        ax.fill_between(x, 0, 1, where=out, color="0.9", zorder=0, linewidth=0, label="out of distribution")
        ratio = float(sub.width_ratio.sel({"method": m}).where(~out).mean())
        ax.set_title(f"{m}\nwidth / reference's in distribution: {ratio:.2f}", fontsize=9)
        ax.set_xlabel(xname)
        ax.set_ylim(0, 1.02)
    axes[0, 0].set_ylabel("P(y ∈ interval | x)")
    axes[0, 0].legend(fontsize=7, loc="lower left")
    for ax in list(axes.flat)[len(methods):]:
        ax.set_visible(False)
    fitted_suptitle(fig, title)
    return fig


def plot_conditional_vs_complexity(ds: xr.Dataset, *, methods=None, recipe=None):
    """Conditional coverage (mean over the region's points) and interval width relative to the
    reference's, in and out of distribution, against complexity: a line per method with the band
    of the central 80 % of noise draws, the reference dashed grey, 1 − α dotted (R.6)."""
    ds, rname = _recipe(ds, recipe)
    methods = list(methods or ds.method.values)
    c = ds.complexity.values
    inside = ds.in_distribution.astype(bool)
    width = {"in": ds.width_ratio.where(inside).mean("point"), "out": ds.width_ratio.where(~inside).mean("point")}
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), squeeze=False, sharex=True)
    styles = distinct_styles(methods)  # matplotlib's 10 colours repeat past 10 methods
    for j, region in enumerate(("in", "out")):
        ax = axes[0, j]
        _band(ax, c, ds.region_reference_conditional_coverage.sel(region=region), color="0.5", label="reference",
              linestyle="--")
        for m in methods:
            _band(ax, c, ds.region_conditional_coverage.sel({"region": region, "method": m}), label=str(m),
                  **styles[str(m)])
            _band(axes[1, j], c, width[region].sel({"method": m}), label=str(m), **styles[str(m)])
        ax.axhline(_nominal(ds), color="k", linestyle=":", linewidth=1)
        ax.set_title(f"{'in' if region == 'in' else 'out of'} distribution")
        axes[1, j].axhline(1.0, color="0.5", linestyle="--", linewidth=1)
        axes[1, j].set_yscale("log")
        axes[1, j].set_xlabel(ds.attrs.get("complexity_name", "complexity"))
        _level_ticks(axes[1, j], c)
    axes[0, 0].set_ylabel("conditional coverage\n(mean over points)")
    axes[1, 0].set_ylabel("interval width / reference's")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"{ds.attrs.get('task')}: conditional coverage of the {_nominal(ds):.0%} intervals "
                 f"(k={ds.sizes['repetition']})" + (f", recipe {rname}" if rname else ""))
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    return fig


def _line(ds: xr.Dataset) -> tuple[xr.Dataset, str]:
    """A 1-D cut of the test points to plot against: the plotting coordinate, or on a 2-D grid
    the diagonal x1 = x2 (plotted against x1)."""
    if {"x1", "x2"} <= set(ds.coords):
        keep = np.isclose(ds.x1.values, ds.x2.values)
        return ds.isel(point=np.flatnonzero(keep)), "x1"
    return ds, _axis_coord(ds)


def plot_variances(ds: xr.Dataset, complexity=None, *, methods=None):
    """A disentanglement study's estimated aleatoric and epistemic variances against x, a panel
    per method (the exact oracle first): each estimate's mean over repetitions with the band of
    their central 80 %, the exact values dashed black, points outside the training box shaded
    (docs/conventions.md#r-7-study). ``complexity`` defaults to the largest; a 2-D grid is cut
    along its diagonal. The log axis spans from two decades below the smallest exact value to a
    decade above the largest value drawn.

    Returns
    -------
    matplotlib.figure.Figure
    """
    c = ds.complexity.values[-1] if complexity is None else complexity
    sub, xname = _line(ds.sel(complexity=c))
    methods = list(methods or sub.method.values)
    x = sub[xname].values
    order = np.argsort(x)
    sub, x = sub.isel(point=order), x[order]
    out = ~sub.in_distribution.values.astype(bool)
    exact = np.concatenate([sub.exact_aleatoric_variance.values, sub.exact_epistemic_variance.values])
    means = np.concatenate([sub[v].mean("repetition").values.ravel() for v in ("aleatoric_variance",
                                                                             "epistemic_variance")])
    lo = np.nanmin(exact) / 100  # two decades below the smallest exact value: estimates near 0 are cut
    hi = 10 * max(np.nanmax(exact), np.nanmax(means[np.isfinite(means)], initial=0.0))
    ncol = min(4, len(methods))
    nrow = -(-len(methods) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4 * ncol, 3.2 * nrow), squeeze=False, sharey=True)
    for ax, m in zip(axes.flat, methods):
        s = sub.sel({"method": m})
        _band(ax, x, s.aleatoric_variance, color="C1", label="aleatoric (estimate)")
        _band(ax, x, s.epistemic_variance, color="C0", label="epistemic (estimate)")
        ax.plot(x, sub.exact_aleatoric_variance.values, color="k", linestyle="--", linewidth=1, label="σ²(x) (true)")
        ax.plot(x, sub.exact_epistemic_variance.values, color="k", linestyle=":", linewidth=1,
                label="epistemic (exact)")
        ax.set_yscale("log")
        ax.fill_between(x, lo, hi, where=out, color="0.9", zorder=0, linewidth=0, label="outside the box")
        ax.set_ylim(lo, hi)
        ax.set_title(str(m), fontsize=9)
        ax.set_xlabel(xname + (" = x2" if xname == "x1" else ""))
    axes[0, 0].set_ylabel("variance")
    axes[0, 0].legend(fontsize=6, loc="best")
    for ax in list(axes.flat)[len(methods):]:
        ax.set_visible(False)
    fig.suptitle(f"{ds.attrs.get('task')}: estimated and exact variances, "
                 f"{ds.attrs.get('complexity_name', 'complexity')} = {c} (k={ds.sizes['repetition']})")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig


def plot_leakage(ds: xr.Dataset, *, methods=None):
    """Leakage against complexity, in and out of the training box: per method the Spearman of
    its epistemic estimate with σ²(x) (top row) and untangle's measure, the Spearman between its
    two estimates (bottom row), the median over repetitions with a bar over their central 80 %; the
    exact oracle's values (the rank correlation of the two true parts) dashed grey
    (docs/conventions.md#r-7-study).

    Returns
    -------
    matplotlib.figure.Figure
    """
    methods = [m for m in (methods or ds.method.values) if m != ds.attrs.get("oracle", "blr")]
    oracle = ds.attrs.get("oracle", "blr")
    c = ds.complexity.values
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), squeeze=False, sharex=True, sharey=True)
    styles = distinct_styles(methods)  # matplotlib's 10 colours repeat past 10 methods
    rows = (("epistemic_leakage", "leakage: ρ(est. epistemic, σ²(x))"),
            ("estimates_spearman", "untangle: ρ(est. epistemic, est. aleatoric)"))
    for i, (var, label) in enumerate(rows):
        for j, region in enumerate(("in", "out")):
            ax = axes[i, j]
            da = ds[var].sel(region=region)
            lines = [(oracle, {"color": "0.5", "linestyle": "--", "marker": "o"})]
            lines += [(m, styles[str(m)]) for m in methods]
            for k, (m, style) in enumerate(lines):
                lo, hi = (da.sel({"method": m}).quantile(q, dim="repetition").values for q in BAND_QUANTILES)
                mid = da.sel({"method": m}).median("repetition").values
                shift = 0.06 * (k - len(methods) / 2)  # side by side at each level
                ax.errorbar(c + shift, mid, yerr=[mid - lo, hi - mid], markersize=3, capsize=2, linewidth=1,
                            label="exact oracle" if m == oracle else str(m), **style)
            ax.axhline(0.0, color="k", linestyle=":", linewidth=1)
            ax.set_title(f"{'in' if region == 'in' else 'outside'} the training box", fontsize=9)
            ax.set_ylim(-1.05, 1.05)
            _level_ticks(ax, c)
            if j == 0:
                ax.set_ylabel(label, fontsize=8)
            if i == 1:
                ax.set_xlabel(ds.attrs.get("complexity_name", "complexity"))
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"{ds.attrs.get('task')}: leakage between the two parts (k={ds.sizes['repetition']})")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig


def _saver(out: Path, drawn: list, saved=None):
    """``save(fig, name)``: write ``fig`` to ``out/name`` (:func:`save_figure`), close it, append
    the path to ``drawn`` and tell ``saved(path)`` at once (a figure's path is known as it is
    written, not after the last one)."""
    def save(fig, name: str) -> Path:
        try:
            path = save_figure(fig, figure_path(out, name))
        finally:
            plt.close(fig)
        drawn.append(path)
        if saved is not None:
            saved(path)
        return path

    return save


def plot_study(ds: xr.Dataset, out_dir, *, complexities=None, saved=None) -> list[Path]:
    """Draw every figure a study supports into ``out_dir``; returns the PNG paths. With several
    recipes every file name gets a ``_<recipe>`` suffix. A dataset that is not a study is refused
    (:func:`check_study`) before ``out_dir`` is created.

    Parameters
    ----------
    ds : xarray.Dataset
        A study (:mod:`uqreg.study`), in memory or read back from its file.
    out_dir : path-like
    complexities : sequence, optional
        The levels whose per-level figures are drawn (default every level).
    saved : callable, optional
        ``saved(path)``, called as each figure is written (e.g. to print it).

    Returns
    -------
    list of pathlib.Path
    """
    check_study(ds)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    save = _saver(out, paths, saved)
    comps = ds.complexity.values if complexities is None else complexities
    recipes = list(ds.recipe.values) if "recipe" in ds.dims else [None]
    for r in recipes:
        tag = f"_{safe_name(r)}" if len(recipes) > 1 else ""
        before = len(paths)
        if {"x1", "x2"} <= set(ds.coords):
            for c in comps:
                save(plot_coverage_map(ds, c, recipe=r), f"coverage_map_c{safe_name(c)}{tag}.png")
        else:
            for c in comps:
                save(plot_bands(ds, c, recipe=r), f"bands_c{safe_name(c)}{tag}.png")
        if len(ds.complexity) > 1 or len(paths) == before:
            save(plot_probes(ds, recipe=r), f"probes_vs_complexity{tag}.png")
        if "conditional_coverage" in ds.data_vars:  # R.6; files written before it have none
            for c in comps:
                save(plot_conditional_coverage(ds, c, recipe=r), f"conditional_coverage_c{safe_name(c)}{tag}.png")
            save(plot_conditional_vs_complexity(ds, recipe=r), f"conditional_vs_complexity{tag}.png")
    return paths


# --- real-data studies (docs/conventions.md#r-9) ----------------------------------------------------
_RECAL_STYLE = {"none": ("C0", "-", "before"), "isotonic": ("C1", "--", "isotonic"),
                "sigma_scaling": ("C2", ":", "σ-scaling")}


def plot_real_calibration(ds: xr.Dataset, *, methods=None):
    """A real-data study's (:mod:`uqreg.real`) calibration curves, a panel per method: the
    observed proportion in the central interval of each expected level, mean over splits,
    before recalibration and after isotonic recalibration and σ-scaling (fitted on each split's
    calibration part), over the diagonal; the legend gives each curve's MACE (mean over splits).

    Returns
    -------
    matplotlib.figure.Figure
    """
    methods = list(methods or ds.method.values)
    ncol = min(4, len(methods))
    nrow = -(-len(methods) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.4 * ncol, 3.2 * nrow), squeeze=False, sharex=True, sharey=True,
                             layout="constrained")
    p = ds.level.values
    for ax, m in zip(axes.flat, methods):
        ax.plot([0, 1], [0, 1], color="k", linewidth=0.8)
        for rc, (color, ls, label) in _RECAL_STYLE.items():
            obs = ds.calibration_observed.sel({"method": m, "recal": rc})
            if not bool(obs.notnull().any()):
                continue
            mace = float(ds.score_mace_mean.sel({"method": m, "recal": rc}))
            ax.plot(p, obs.mean("split").values, color=color, linestyle=ls, label=f"{label} (MACE {mace:.3f})")
        ax.set_title(str(m), fontsize=9)
        ax.legend(fontsize=6, loc="upper left")
    for ax in axes[-1]:
        ax.set_xlabel("expected proportion")
    for ax in axes[:, 0]:
        ax.set_ylabel("observed proportion")
    for ax in list(axes.flat)[len(methods):]:
        ax.set_visible(False)
    fitted_suptitle(fig, f"{ds.attrs.get('dataset')}: calibration on held-out targets, "
                         f"{ds.attrs.get('split_kind')} splits (mean over {ds.sizes['split']})")
    return fig


def plot_real_scores(ds: xr.Dataset, *, scores=("coverage", "mace", "nll", "crps"), methods=None):
    """A real-data study's score table as bars: per score a panel, per method a group of bars
    (before, isotonic, σ-scaling; a score a recalibration does not give is left out), mean over
    splits with ±1 s.e.; coverage with the nominal 1 − α dashed.

    Returns
    -------
    matplotlib.figure.Figure
    """
    methods = list(methods or ds.method.values)
    fig, axes = plt.subplots(1, len(scores), figsize=(max(4.0, 0.5 * len(methods)) * len(scores) / 1.6, 3.4),
                             squeeze=False, layout="constrained")
    x = np.arange(len(methods))
    width = 0.8 / len(_RECAL_STYLE)
    for ax, score in zip(axes[0], scores):
        var = "coverage" if score == "coverage" else f"score_{score}"
        for q, (rc, (color, _, label)) in enumerate(_RECAL_STYLE.items()):
            mean = ds[f"{var}_mean"].sel({"method": methods, "recal": rc}).values
            se = ds[f"{var}_se"].sel({"method": methods, "recal": rc}).values
            ax.bar(x + (q - 1) * width, mean, width, yerr=np.nan_to_num(se), color=color, label=label,
                   error_kw={"linewidth": 0.8})
        if score == "coverage":
            ax.axhline(1 - float(ds.attrs.get("alpha", 0.05)), color="k", linestyle="--", linewidth=0.8)
        ax.set_xticks(x)
        ax.set_xticklabels(methods, rotation=60, fontsize=7)
        ax.set_title(score, fontsize=9)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    # below the panels: top right, it ran over the suptitle of a figure of one or two scores
    fig.legend(handles, labels, fontsize=7, ncols=len(labels), loc="outside lower center")
    fitted_suptitle(fig, f"{ds.attrs.get('dataset')}, {ds.attrs.get('split_kind')} splits: mean ± s.e. over "
                         f"{ds.sizes['split']} splits", x=0.02, ha="left")
    return fig


# --- the exact reference (uqreg reference --out) -----------------------------------------------------
def _outside(ds: xr.Dataset) -> np.ndarray | None:
    """Which test points lie outside the training box: the file's ``in_distribution``, else its
    ``train_box`` attr against ``x_test``; None when the file says neither."""
    if "in_distribution" in ds.data_vars:
        return ~ds.in_distribution.values.astype(bool)
    box = train_box(ds)
    if box is None or "x_test" not in ds.data_vars:
        return None
    x = ds.x_test.values
    return ~np.all((x >= box[0]) & (x <= box[1]), axis=-1)


def plot_reference(ds: xr.Dataset, *, repetition=None):
    """The exact posterior of ``uqreg reference --out FILE``: left, one noise draw's posterior
    mean with its predictive band ± z·sqrt(predictive variance) (a new observation) and, inside
    it, ± z·sqrt(epistemic variance) (the noise-free f(x)), over the truth (z =
    :data:`uqmetrics.COVERAGE_Z`); right, the two parts of the predictive variance, aleatoric
    σ²(x) and epistemic, and their sum against x (log scale). Points outside the training box are
    shaded; a 2-D grid is cut along its diagonal x1 = x2.

    Parameters
    ----------
    ds : xarray.Dataset
        The file :func:`uqreg.reference.reference_dataset` builds.
    repetition : optional
        The noise draw whose posterior mean is drawn (default the first).

    Returns
    -------
    matplotlib.figure.Figure
    """
    rep = ds.repetition.values[0] if repetition is None else repetition
    sub, xname = _line(ds)
    x = sub[xname].values
    order = np.argsort(x)
    sub, x = sub.isel(point=order), x[order]
    out = _outside(sub)
    z = uqmetrics.COVERAGE_Z
    mean = sub.prediction.sel(repetition=rep).values
    ale, epi, pred = (sub[v].values for v in ("aleatoric_variance", "epistemic_variance", "predictive_variance"))
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 3.8))
    ax0.fill_between(x, mean - z * np.sqrt(pred), mean + z * np.sqrt(pred), color="C1", alpha=0.25, linewidth=0,
                     label="± z·sqrt(predictive var.): new observation")
    ax0.fill_between(x, mean - z * np.sqrt(epi), mean + z * np.sqrt(epi), color="C0", alpha=0.4, linewidth=0,
                     label="± z·sqrt(epistemic var.): f(x)")
    ax0.plot(x, mean, color="C0", linewidth=1.2, label=f"posterior mean (draw {rep})")
    ax0.plot(x, sub.truth.values, color="k", linestyle="--", linewidth=1, label="truth f(x)")
    ax0.set_title(f"exact predictive band (z = {z:.2f})", fontsize=9)
    ax1.plot(x, ale, color="C1", label="aleatoric σ²(x)")
    ax1.plot(x, epi, color="C0", label="epistemic")
    ax1.plot(x, pred, color="k", linestyle=":", label="predictive (sum)")
    ax1.set_yscale("log")
    ax1.set_title("the two parts of the predictive variance", fontsize=9)
    ax1.set_ylabel("variance")
    for ax in (ax0, ax1):
        if out is not None and out.any():
            ax.fill_between(x, 0, 1, where=out, color="0.9", zorder=0, linewidth=0,
                            transform=ax.get_xaxis_transform(), label="outside the box")
        ax.set_xlabel(xname + (" = x2" if xname == "x1" else ""))
        ax.legend(fontsize=7)
    fig.suptitle(f"{ds.attrs.get('task')}: exact posterior, {ds.attrs.get('complexity_name', 'complexity')} = "
                 f"{ds.attrs.get('complexity')} ({ds.sizes['repetition']} noise draws)")
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return fig


# --- one dispatch from a result file to its figures ---------------------------------------------------
def _draw_real(ds: xr.Dataset, out: Path, saved=None) -> list[Path]:
    """A real-data study's figures, as ``uqreg real`` draws them: ``real_calibration.png``
    (:func:`plot_real_calibration`) and ``real_scores.png`` (:func:`plot_real_scores`)."""
    paths: list[Path] = []
    save = _saver(out, paths, saved)
    save(plot_real_calibration(ds), "real_calibration.png")
    save(plot_real_scores(ds), "real_scores.png")
    return paths


def _draw_disentangle(ds: xr.Dataset, out: Path, saved=None) -> list[Path]:
    """A disentanglement study's figures, named as ``uqreg reproduce disentangle`` names them:
    ``disentangle_<task>_variances.png`` (:func:`plot_variances`) and
    ``disentangle_<task>_leakage.png`` (:func:`plot_leakage`)."""
    paths: list[Path] = []
    save = _saver(out, paths, saved)
    task = safe_name(ds.attrs.get("task", "study"))  # a label from the file: never a path
    save(plot_variances(ds), f"disentangle_{task}_variances.png")
    save(plot_leakage(ds), f"disentangle_{task}_leakage.png")
    return paths


def _draw_reference(ds: xr.Dataset, out: Path, saved=None) -> list[Path]:
    """The exact reference's figure, ``reference.png`` (:func:`plot_reference`)."""
    paths: list[Path] = []
    _saver(out, paths, saved)(plot_reference(ds), "reference.png")
    return paths


def _draw_study(ds: xr.Dataset, out: Path, saved=None) -> list[Path]:
    return plot_study(ds, out, saved=saved)


@dataclass(frozen=True)
class ResultKind:
    """A kind of result file uqreg writes, and how its figures are drawn.

    Attributes
    ----------
    name : str
    description : str
        The commands that write it.
    dims, variables : tuple of str
        What a file of this kind holds (its detector: every one present).
    draw : callable
        ``draw(ds, out_dir, saved=None) -> list of Path``: every figure of the file, each path
        passed to ``saved`` as it is written.
    leaderboard : bool
        Whether ``uqreg report`` makes a leaderboard of it (its summary variables per method).
    """

    name: str
    description: str
    dims: tuple[str, ...]
    variables: tuple[str, ...]
    draw: Callable[..., list[Path]]
    leaderboard: bool = True

    def lacks(self, ds: xr.Dataset) -> tuple[list[str], list[str]]:
        """The dims and the variables of this kind ``ds`` lacks."""
        return ([d for d in self.dims if d not in ds.dims], [v for v in self.variables if v not in ds.data_vars])

    def matches(self, ds: xr.Dataset) -> bool:
        """Whether ``ds`` is a result of this kind (it lacks none of :attr:`dims` and :attr:`variables`)."""
        return not any(self.lacks(ds))


#: The result files uqreg writes, in the order they are recognised: name -> :class:`ResultKind`.
#: ``uqreg plot`` and ``uqreg report`` draw a file's figures through :func:`plot_result`.
RESULT_KINDS: Registry[ResultKind] = Registry("result kind")
RESULT_KINDS.register(ResultKind("study", "uqreg study, sweep or reproduce (paper)", STUDY_DIMS, STUDY_VARIABLES,
                                 _draw_study))
RESULT_KINDS.register(ResultKind(
    "real", "uqreg real or reproduce real", ("method", "split", "recal", "level"),
    ("calibration_observed", "coverage_mean", "coverage_se", "score_mace_mean", "score_mace_se", "score_nll_mean",
     "score_nll_se", "score_crps_mean", "score_crps_se"), _draw_real))
RESULT_KINDS.register(ResultKind(
    "disentangle", "uqreg reproduce disentangle", ("method", "complexity", "repetition", "point", "region"),
    ("aleatoric_variance", "epistemic_variance", "exact_aleatoric_variance", "exact_epistemic_variance",
     "in_distribution", "epistemic_leakage", "estimates_spearman"), _draw_disentangle, leaderboard=False))
RESULT_KINDS.register(ResultKind(
    "reference", "uqreg reference --out", ("repetition", "point"),
    ("prediction", "truth", "aleatoric_variance", "epistemic_variance", "predictive_variance"), _draw_reference,
    leaderboard=False))


def result_kind(ds: xr.Dataset, source=None) -> ResultKind:
    """The first of :data:`RESULT_KINDS` that ``ds`` is a result of.

    Raises
    ------
    uqmetrics.InputError
        For a dataset of no kind; the message names ``source`` (the file read), the commands
        whose files are drawn, and what it lacks as a study (:func:`check_study`).
    """
    for kind in RESULT_KINDS.values():
        if kind.matches(ds):
            return kind
    try:
        check_study(ds, source)
    except uqmetrics.InputError as exc:
        what = "the dataset" if source is None else str(source)
        lacks = str(exc).split(": it lacks ", 1)[1]
        writers = "; ".join(k.description for k in RESULT_KINDS.values())
        raise uqmetrics.InputError(f"{what} is not a uqreg study or result file (written by {writers}): as a "
                                   f"study it lacks {lacks}") from None
    raise AssertionError("a study that check_study accepts is of the kind study")  # pragma: no cover


def plot_result(ds: xr.Dataset, out_dir, *, kind: ResultKind | None = None, saved=None, source=None) -> list[Path]:
    """Draw every figure of a uqreg result file into ``out_dir`` (created), through its kind's
    ``draw`` (:data:`RESULT_KINDS`).

    Parameters
    ----------
    ds : xarray.Dataset
        A study, real-data study, disentanglement study or reference, in memory or read back.
    out_dir : path-like
    kind : ResultKind, optional
        Its kind (default :func:`result_kind`).
    saved : callable, optional
        ``saved(path)``, called as each figure is written.
    source : path-like, optional
        The file ``ds`` was read from, named in the error for a dataset of no kind.

    Returns
    -------
    list of pathlib.Path
        The figures written, in order.

    Raises
    ------
    uqmetrics.InputError
        A dataset of no kind (:func:`result_kind`), before ``out_dir`` is created.
    """
    kind = result_kind(ds, source) if kind is None else kind
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return kind.draw(ds, out, saved)
