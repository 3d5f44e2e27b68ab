"""The paper's figures, drawn from a study file alone (thin layer over :mod:`uqmetrics.plotting`).

* :func:`plot_bands` — prediction ± 1.96·std per method, with the training data and the ground
  truth (the paper's Figs. 1, 2);
* :func:`plot_probes` — deviation, uncertainty and coverage against complexity at the probe
  points (Figs. 3, 6, and 4, 5);
* :func:`plot_coverage_map` — log10 deviation, log10 uncertainty and coverage over the 2-D test
  grid per method (Fig. 7).
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg", force=False)
import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
from uqmetrics.plotting import (
    plot_coverage_vs_complexity,
    plot_heatmap,
    plot_prediction_bands,
    save_figure,
)

Z = 1.96


def _axis_coord(ds: xr.Dataset) -> str:
    """The 1-D plotting coordinate of the test points (``x``, ``lambda``...)."""
    for name in ("x", "lambda"):
        if name in ds.coords:
            return name
    return "point"


def plot_bands(ds: xr.Dataset, complexity, *, repetition=None, methods=None):
    """Prediction ± 1.96·uncertainty of one repetition, one panel per method.

    Returns
    -------
    matplotlib.figure.Figure
    """
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
        plot_prediction_bands(sub[xname].values, s.truth.values, s.prediction.values, s.uncertainty.values,
                              z=Z, ax=ax, **kw)
        ax.set_title(f"{m}")
        ax.set_xlabel(xname)
        if ax is not axes.flat[0] and ax.get_legend() is not None:
            ax.get_legend().remove()
    for ax in list(axes.flat)[len(methods):]:
        ax.set_visible(False)
    fig.suptitle(f"{ds.attrs.get('task')}: {ds.attrs.get('complexity_name', 'complexity')} = {complexity}, "
                 f"repetition {rep}")
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


def plot_probes(ds: xr.Dataset, *, probes: dict | None = None, error: str = "binomial"):
    """Deviation, uncertainty, coverage vs complexity (columns) at each probe point (rows).

    Region averages (in/out of distribution) are added as the last rows.
    """
    probes = dict(probes or probe_points(ds))
    probes.update({"region in": {"region": "in"}, "region out": {"region": "out"}})
    fig, axes = plt.subplots(len(probes), 3, figsize=(13, 3.2 * len(probes)), squeeze=False)
    cname = ds.attrs.get("complexity_name", "complexity")
    for row, (label, sel) in zip(axes, probes.items()):
        region = "region" in sel
        pre = "region_" if region else ""
        sub = ds.sel(sel)
        for ax, var in zip(row[:2], ("deviation", "uncertainty")):
            for m in ds.method.values:
                s = sub.sel({"method": m})
                ax.errorbar(ds.complexity.values, s[f"{pre}{var}_mean"].values, yerr=s[f"{pre}{var}_se"].values,
                            marker="o", capsize=2, label=str(m))
            ax.set_yscale("log")
            ax.set_title(f"{var} at {label}")
            ax.set_xlabel(cname)
        plot_coverage_vs_complexity(ds, point_selection=sel, error=error, ax=row[2],
                                    title=f"coverage at {label}")
        row[2].set_xlabel(cname)
    for ax in axes.flat:
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_coverage_map(ds: xr.Dataset, complexity=None, *, methods=None):
    """Fig. 7: log10 deviation, log10 uncertainty and coverage on the 2-D grid, a row per method."""
    if not {"x1", "x2"} <= set(ds.coords):
        raise ValueError("the coverage map needs a 2-D grid task (coordinates x1, x2)")
    complexity = ds.complexity.values[0] if complexity is None else complexity
    methods = list(methods or ds.method.values)
    sub = ds.sel(complexity=complexity).set_index(point=["x1", "x2"]).unstack("point")
    fig, axes = plt.subplots(len(methods), 3, figsize=(12, 3.4 * len(methods)), squeeze=False)
    for row, m in zip(axes, methods):
        s = sub.sel({"method": m})
        plot_heatmap(np.log10(s.deviation_mean), x="x1", y="x2", ax=row[0], title=f"{m}: log10 deviation")
        plot_heatmap(np.log10(s.uncertainty_mean), x="x1", y="x2", ax=row[1], title=f"{m}: log10 uncertainty")
        plot_heatmap(s.coverage, x="x1", y="x2", ax=row[2], title=f"{m}: coverage", vmin=0, vmax=1)
    fig.tight_layout()
    return fig


def plot_study(ds: xr.Dataset, out_dir, *, complexities=None) -> list[Path]:
    """Draw every figure a study supports into ``out_dir``; returns the PNG paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    comps = ds.complexity.values if complexities is None else complexities
    if {"x1", "x2"} <= set(ds.coords):
        for c in comps:
            fig = plot_coverage_map(ds, c)
            paths.append(save_figure(fig, out / f"coverage_map_c{c}.png"))
            plt.close(fig)
    else:
        for c in comps:
            fig = plot_bands(ds, c)
            paths.append(save_figure(fig, out / f"bands_c{c}.png"))
            plt.close(fig)
    if len(ds.complexity) > 1 or not paths:
        fig = plot_probes(ds)
        paths.append(save_figure(fig, out / "probes_vs_complexity.png"))
        plt.close(fig)
    return paths
