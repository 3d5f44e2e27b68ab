"""Figures of the conformal-prediction protocol (Angelopoulos et al. 2021;
docs/conventions.md#v-7) from a ``conformal`` result (:func:`~.score.score_conformal`,
``conformal.nc``).

- :func:`plot_size_vs_accuracy`: mean set size against top-1 accuracy, one point per model and
  method (the paper's model-zoo table as a scatter);
- :func:`plot_alpha_curve`: coverage and mean set size against the level ``alpha``
  (``curve_<stat>``), the target ``1 - alpha`` dashed;
- :func:`plot_class_coverage`: the coverage of each class (``class_coverage``, APS at 0.1),
  sorted, per model: how far from conditional coverage the marginal guarantee leaves it;
- :func:`plot_shift_coverage`: coverage against severity (mean over the corruptions, clean at
  severity 0) per model and level;
- :func:`draw_figures`: those the result allows, into a folder (``uqvision plot --conformal
  FILE``).

Every figure is a :class:`matplotlib.figure.Figure` on an Agg canvas (matplotlib imported on
first use). Drawn artists carry a ``gid`` (``size:<method>``, ``curve:<stat>:<method>:<model>``,
``class:<model>``, ``shift:<alpha>:<model>``), so tests can read the drawn numbers back. NaN
values are not drawn.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import xarray as xr
from uqmetrics import InputError

from ..base import draw_protocol_figures, protocol_result
from .score import CALIBRATIONS, CLASS_ALPHA, CLASS_METHOD

if TYPE_CHECKING:  # matplotlib is imported on first use
    from matplotlib.figure import Figure

__all__ = ["draw_figures", "plot_alpha_curve", "plot_class_coverage", "plot_shift_coverage",
           "plot_size_vs_accuracy"]

_LABELS = {"coverage": "coverage", "mean_set_size": "mean set size"}


def _result(result: xr.Dataset | str | os.PathLike) -> xr.Dataset:
    """The conformal result ``result`` (a Dataset or a ``conformal.nc``), checked to be one."""
    return protocol_result(result, "conformal", ("model",))


def _figure(nrows: int, ncols: int, *, panel: tuple[float, float]) -> tuple[Figure, np.ndarray]:
    """A Figure on an Agg canvas with ``nrows x ncols`` axes of ``panel`` inches each."""
    from uqmetrics.report.plotting import figure_grid  # matplotlib: imported on use

    return figure_grid(nrows, ncols, panel=panel)


def _models(ds: xr.Dataset) -> list[str]:
    return [str(m) for m in ds["model"].values]


def _choice(name: str, value, known) -> None:
    known = [v.item() if hasattr(v, "item") else v for v in known]
    if value not in known:
        raise InputError(f"{name} must be one of {known}, got {value!r}")


def plot_size_vs_accuracy(result: xr.Dataset | str | os.PathLike, *, alpha: float = 0.1,
                          calibration: str = "none",
                          methods: tuple[str, ...] = ("naive", "aps", "raps")) -> Figure:
    """Mean set size against top-1 accuracy at ``alpha``: one point per (model, method).

    Raises
    ------
    uqmetrics.InputError
        Not a conformal result; an ``alpha``, ``calibration`` or method it lacks.
    """
    ds = _result(result)
    _choice("alpha", alpha, ds["alpha"].values)
    _choice("calibration", calibration, CALIBRATIONS)
    for m in methods:
        _choice("method", m, ds["method"].values)
    from uqmetrics.report.plotting import label_points  # matplotlib: imported on use

    fig, axes = _figure(1, 1, panel=(5.0, 3.6))
    ax = axes[0, 0]
    acc = ds["accuracy"].values
    for m in methods:
        size = ds["mean_set_size"].sel({"method": m, "alpha": alpha,
                                          "calibration": calibration}).values
        ok = ~(np.isnan(size) | np.isnan(acc))
        pts = ax.scatter(acc[ok], size[ok], label=m, alpha=0.85)
        pts.set_gid(f"size:{m}")
    label_points(ax, acc, ds["mean_set_size"].sel({"method": methods[-1], "alpha": alpha,
                                                   "calibration": calibration}).values,
                 _models(ds), alpha=0.7)
    ax.set_xlabel("top-1 accuracy")
    ax.set_ylabel(f"mean set size (alpha = {alpha:g})")
    ax.set_title(f"{calibration} calibration", fontsize=8)
    ax.legend(fontsize=7)
    return fig


def plot_alpha_curve(result: xr.Dataset | str | os.PathLike, *,
                     models: list[str] | None = None) -> Figure:
    """Coverage and mean set size against ``alpha`` (un-scaled, ``curve_<stat>``): one line
    per (model, curve method); the target ``1 - alpha`` dashed.

    Raises
    ------
    uqmetrics.InputError
        Not a conformal result, one without the curve, an unknown model.
    """
    ds = _result(result)
    if "curve_coverage" not in ds:
        raise InputError("result has no curve_coverage (coverage against alpha): rescore it")
    models = _models(ds) if models is None else list(models)
    for m in models:
        _choice("model", m, _models(ds))
    from uqmetrics.report.plotting import distinct_styles, series_legend  # matplotlib: on use

    grid = ds["curve_alpha"].values
    methods = [str(x) for x in ds["curve_method"].values]
    # a colour per model, a line style per curve method (CURVE_METHODS: 3)
    keys = {f"{m}: {method}": (m, k) for m in models for k, method in enumerate(methods)}
    styles = distinct_styles(keys, family=keys.get)
    fig, axes = _figure(1, 2, panel=(4.2, 3.4))
    for ax, stat in zip(axes[0], ("coverage", "mean_set_size"), strict=True):
        for model in models:
            for method in methods:
                y = ds[f"curve_{stat}"].sel(model=model, curve_method=method).values
                ok = ~np.isnan(y)
                if ok.any():
                    label = f"{model}: {method}"
                    (line,) = ax.plot(grid[ok], y[ok], markersize=3, label=label, linewidth=1,
                                      **styles[label])
                    line.set_gid(f"curve:{stat}:{method}:{model}")
        if stat == "coverage":
            ax.plot(grid, 1.0 - grid, "k--", linewidth=0.8, label="1 - alpha")
        ax.set_xlabel("alpha")
        ax.set_ylabel(_LABELS[stat])
    series_legend(axes[0, 0], fontsize=6, beside="figure", widen=True)
    return fig


def plot_class_coverage(result: xr.Dataset | str | os.PathLike) -> Figure:
    """Each class's coverage (``class_coverage``: APS at 0.1, un-scaled), sorted ascending, one
    line per model; the target dashed.

    Raises
    ------
    uqmetrics.InputError
        Not a conformal result, or one without ``class_coverage``.
    """
    ds = _result(result)
    if "class_coverage" not in ds:
        raise InputError("result has no class_coverage: rescore it")
    from uqmetrics.report.plotting import distinct_styles, series_legend  # matplotlib: on use

    fig, axes = _figure(1, 1, panel=(5.0, 3.4))
    ax = axes[0, 0]
    styles = distinct_styles(_models(ds))
    for model in _models(ds):
        cov = ds["class_coverage"].sel(model=model).values
        cov = np.sort(cov[~np.isnan(cov)])
        if cov.size:
            (line,) = ax.plot(np.arange(cov.size), cov, label=model, linewidth=1, markersize=3,
                              markevery=max(1, cov.size // 10), **styles[model])
            line.set_gid(f"class:{model}")
    ax.axhline(1.0 - CLASS_ALPHA, color="k", linestyle="--", linewidth=0.8)
    ax.set_xlabel("class (sorted by coverage)")
    ax.set_ylabel(f"coverage ({CLASS_METHOD.upper()}, alpha = {CLASS_ALPHA:g})")
    series_legend(ax, fontsize=6, widen=True)
    return fig


def plot_shift_coverage(result: xr.Dataset | str | os.PathLike, *, method: str = "aps",
                        calibration: str = "none") -> Figure:
    """Coverage against severity (mean over the corruptions, the clean coverage at severity
    0) per model and level, one panel per level; the target dashed.

    Raises
    ------
    uqmetrics.InputError
        Not a conformal result, one without corrupted members, an unknown method or
        calibration.
    """
    ds = _result(result)
    if "shift_coverage" not in ds or not ds.sizes.get("severity", 0):
        raise InputError("result has no corrupted members (shift_coverage over severities)")
    _choice("method", method, ds["method"].values)
    _choice("calibration", calibration, CALIBRATIONS)
    from uqmetrics.report.plotting import distinct_styles, series_legend  # matplotlib: on use

    alphas = ds["alpha"].values.tolist()
    styles = distinct_styles(_models(ds))
    fig, axes = _figure(1, len(alphas), panel=(4.0, 3.2))
    x = np.concatenate([[0], ds["severity"].values])
    for ax, alpha in zip(axes[0], alphas, strict=True):
        for model in _models(ds):
            at = {"model": model, "method": method, "alpha": alpha,
                  "calibration": calibration}
            shift = ds["shift_coverage"].sel(at)
            clean = float(ds["coverage"].sel(at))
            per = shift.mean("corruption", skipna=True).values if shift.sizes["corruption"] \
                else np.full(x.size - 1, np.nan)
            y = np.concatenate([[clean], per])
            ok = ~np.isnan(y)
            (line,) = ax.plot(x[ok], y[ok], markersize=3, label=model, linewidth=1,
                              **styles[model])
            line.set_gid(f"shift:{alpha:g}:{model}")
        ax.axhline(1.0 - alpha, color="k", linestyle="--", linewidth=0.8)
        ax.set_xlabel("severity (0: clean)")
        ax.set_ylabel(f"{method} coverage")
        ax.set_title(f"alpha = {alpha:g}, {calibration} calibration", fontsize=8)
    series_legend(axes[0, 0], fontsize=6, beside="figure", widen=True)
    return fig


def _figures(ds: xr.Dataset) -> list[tuple[str, Callable[[], Figure]]]:
    """The figures ``ds`` allows: (file name, make) pairs (:func:`draw_figures`)."""
    alpha = float(ds["alpha"].values[0])
    figures = [("conformal_size_vs_accuracy.png",
                lambda: plot_size_vs_accuracy(ds, alpha=alpha))]
    if "curve_coverage" in ds:
        figures.append(("conformal_alpha_curve.png", lambda: plot_alpha_curve(ds)))
    if "class_coverage" in ds:
        figures.append(("conformal_class_coverage.png", lambda: plot_class_coverage(ds)))
    if "shift_coverage" in ds and ds.sizes.get("severity", 0):
        figures.append(("conformal_shift_coverage.png", lambda: plot_shift_coverage(ds)))
    return figures


def draw_figures(result: xr.Dataset | str | os.PathLike,
                 out_dir: str | os.PathLike) -> list[Path]:
    """The conformal protocol's figures into ``out_dir`` (``uqvision plot --conformal FILE``).

    - ``conformal_size_vs_accuracy.png``: :func:`plot_size_vs_accuracy` at the result's first
      level (0.1 by default);
    - ``conformal_alpha_curve.png``: :func:`plot_alpha_curve`;
    - ``conformal_class_coverage.png``: :func:`plot_class_coverage`;
    - ``conformal_shift_coverage.png``: :func:`plot_shift_coverage` (with corrupted members).

    Parameters and returns: as :func:`~uqvision.protocols.base.draw_protocol_figures`
    (``result``: a conformal result, ``conformal.nc``).
    """
    return draw_protocol_figures(result, out_dir, _result, _figures)
