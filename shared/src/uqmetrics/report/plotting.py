"""Plots of uqmetrics results (matplotlib, headless-safe).

Every function draws on the given ``ax`` or, without one, on a new
:class:`matplotlib.figure.Figure` with an Agg canvas (no pyplot, no global state: safe in
sweeps, workers and tests), and returns the Figure. :func:`save_figure` writes it atomically.

This module is not star-imported by ``uqmetrics`` (so that importing the metrics does not import
matplotlib); use ``from uqmetrics import plotting``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..metrics._validation import as_numpy, check_positive_number
from ..metrics.conventions import COVERAGE_Z
from ..runs.io import temporary_beside

__all__ = [
    "figure_format",
    "figure_grid",
    "plot_coverage_vs_complexity",
    "plot_heatmap",
    "plot_metric_vs_size",
    "plot_prediction_bands",
    "plot_reliability_diagram",
    "plot_risk_coverage",
    "save_figure",
    "save_figures",
]

_FORMATS = {".png": "png", ".pdf": "pdf", ".svg": "svg"}
#: The format :func:`figure_format` imposes on every :func:`save_figure` (None: the suffix's).
_FORMAT_OVERRIDE: ContextVar[str | None] = ContextVar("uqmetrics_figure_format", default=None)


@contextmanager
def figure_format(fmt: str) -> Iterator[None]:
    """Within the block, :func:`save_figure` (hence :func:`save_figures` and every plotting
    function of the packages, which all save through it) writes ``fmt``: the path's suffix is
    replaced by ``.<fmt>`` (``out/risk.png`` -> ``out/risk.svg``) and the returned path says so.

    The one switch from PNG (the default everywhere) to vector output, e.g. for the inline
    figures of :func:`uqmetrics.report.build_site`. Context-local (:mod:`contextvars`): other
    threads and tasks keep their own format.

    Parameters
    ----------
    fmt : {"png", "pdf", "svg"}

    Examples
    --------
    >>> import tempfile
    >>> fig, _ = figure_grid(1, 1, panel=(2, 2))
    >>> with tempfile.TemporaryDirectory() as d, figure_format("svg"):
    ...     save_figure(fig, Path(d) / "a.png").name
    'a.svg'
    """
    if fmt not in _FORMATS.values():
        raise ValueError(f"fmt must be one of {sorted(_FORMATS.values())}, got {fmt!r}")
    token = _FORMAT_OVERRIDE.set(fmt)
    try:
        yield
    finally:
        _FORMAT_OVERRIDE.reset(token)


def figure_grid(nrows: int, ncols: int, *, panel: tuple[float, float]) -> tuple[Figure, np.ndarray]:
    """A Figure on an Agg canvas with ``nrows x ncols`` axes of ``panel`` inches each.

    Parameters
    ----------
    nrows, ncols : int
    panel : tuple of float
        ``(width, height)`` of one panel in inches; the figure is ``ncols`` panels wide and
        ``nrows`` high (constrained layout).

    Returns
    -------
    fig : matplotlib.figure.Figure
    axes : numpy.ndarray
        (nrows, ncols) of :class:`matplotlib.axes.Axes`, always 2-d.
    """
    fig = Figure(figsize=(panel[0] * ncols, panel[1] * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, np.asarray(fig.subplots(nrows, ncols, squeeze=False))


def _figure_axes(ax: Axes | None, figsize: tuple[float, float] = (5.0, 4.0)) -> tuple[Figure, Axes]:
    if ax is None:
        fig = Figure(figsize=figsize, layout="constrained")
        FigureCanvasAgg(fig)
        return fig, fig.add_subplot()
    if not isinstance(ax, Axes):
        raise ValueError(f"ax must be a matplotlib Axes, got {type(ax).__name__}")
    return ax.figure, ax


def _vector(x: Any, name: str, *, allow_nan: bool = False) -> np.ndarray:
    arr = as_numpy(x, name)
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must have shape (n,) with n >= 1, got shape {arr.shape}")
    bad = np.isinf(arr) if allow_nan else ~np.isfinite(arr)
    if bad.any():
        raise ValueError(f"{name} contains non-finite values (first at index "
                         f"{int(np.argmax(bad))})")
    return arr


def _sel(obj: Any, selection: Mapping | None, name: str) -> Any:
    """Select by label: exact on labels, nearest on numeric coordinates.

    Works for indexed dims and for 1-D non-index coordinates (e.g. ``x`` along ``point``).
    """
    if not selection:
        return obj
    if not isinstance(selection, Mapping):
        raise ValueError(f"{name} must be a mapping dim -> label, got {selection!r}")
    for d, label in selection.items():
        if d not in obj.coords and d not in obj.dims:
            raise ValueError(f"{name} key {d!r} is neither a dim nor a coordinate of the data "
                             f"(dims {list(obj.dims)}, coords {list(obj.coords)})")
        numeric = np.isscalar(label) and not isinstance(label, str)
        if d in obj.indexes:
            coord = obj.indexes[d]
            try:
                if numeric and coord.dtype.kind in "iuf":
                    obj = obj.sel({d: label}, method="nearest")
                else:
                    obj = obj.sel({d: label})
            except KeyError:
                raise ValueError(f"{name} {d}={label!r} not found in the coordinate") from None
            continue
        coord = obj.coords.get(d)
        if coord is None or coord.ndim != 1:
            raise ValueError(f"{name} key {d!r} must be a 1-D coordinate")
        values = np.asarray(coord.values)
        if numeric and values.dtype.kind in "iuf":
            pos = int(np.argmin(np.abs(values - label)))
        else:
            hits = np.flatnonzero(values == label)
            if hits.size == 0:
                raise ValueError(f"{name} {d}={label!r} not found in the coordinate")
            pos = int(hits[0])
        obj = obj.isel({coord.dims[0]: pos})
    return obj


def _label(selected: Any, dim: Hashable, requested: Any) -> str:
    """The coordinate value actually selected along ``dim`` (nearest match), for titles."""
    coord = selected.coords.get(dim)
    if coord is not None and coord.ndim == 0:
        value = coord.item()
        return f"{value:.4g}" if isinstance(value, float) else str(value)
    return str(requested)


# --------------------------------------------------------------------------------------------
# classification


def plot_reliability_diagram(data: Any, *, n_bins: int = 15, ax: Axes | None = None,
                             title: str | None = None, show_gap: bool = True) -> Figure:
    """Reliability diagram: per-bin accuracy against the diagonal of perfect calibration.

    Parameters
    ----------
    data : xarray.Dataset or tuple (labels, probs)
        The Dataset of :func:`uqmetrics.metrics.classification.reliability_diagram` (dim ``bin``,
        variables ``lower``, ``upper``, ``count``, ``accuracy``, ``confidence``; attr ``ece``),
        or ``(labels (n,), probs (n, C))`` from which it is computed with ``n_bins``.
    n_bins : int, default 15
        Bins, used only with ``(labels, probs)``.
    ax : matplotlib Axes, optional
    title : str, optional
    show_gap : bool, default True
        Shade the gap between each bin's accuracy and its mean confidence.

    Returns
    -------
    matplotlib.figure.Figure
        One bar per non-empty bin (accuracy), the diagonal as a line, and the ECE in the legend
        when the Dataset records it.
    """
    if isinstance(data, tuple) and len(data) == 2:
        from ..metrics.classification import reliability_diagram

        data = reliability_diagram(*data, n_bins=n_bins)
    if not isinstance(data, xr.Dataset):
        raise ValueError("data must be the Dataset of uqmetrics.reliability_diagram or a "
                         f"(labels, probs) tuple, got {type(data).__name__}")
    missing = [v for v in ("count", "accuracy", "confidence") if v not in data]
    if missing or "bin" not in data.dims:
        raise ValueError(f"data must have dim 'bin' and variables count, accuracy, confidence; "
                         f"missing {missing}, dims {list(data.dims)}")
    nb = data.sizes["bin"]
    if "lower" in data and "upper" in data:
        lower = np.asarray(data["lower"].values, float)
        upper = np.asarray(data["upper"].values, float)
    else:
        edges = np.linspace(0.0, 1.0, nb + 1)
        lower, upper = edges[:-1], edges[1:]
    count = np.asarray(data["count"].values)
    acc = np.asarray(data["accuracy"].values, float)
    conf = np.asarray(data["confidence"].values, float)
    keep = count > 0
    fig, ax = _figure_axes(ax)
    width = (upper - lower)[keep]
    ax.bar(lower[keep], acc[keep], width=width, align="edge", color="C0", edgecolor="k",
           linewidth=0.5, label="accuracy")
    if show_gap:
        ax.bar(lower[keep], conf[keep] - acc[keep], bottom=acc[keep], width=width, align="edge",
               color="C3", alpha=0.3, edgecolor="C3", linewidth=0.5, label="gap to confidence")
    diag_label = "perfect calibration"
    if "ece" in data.attrs:
        diag_label += f" (ECE {float(data.attrs['ece']):.3f})"
    ax.plot([0, 1], [0, 1], "k--", linewidth=1, label=diag_label)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy",
           title=title or "Reliability diagram")
    ax.legend(loc="upper left", fontsize="small")
    return fig


def plot_risk_coverage(curves: Mapping[str, Any], *, ax: Axes | None = None,
                       title: str | None = None) -> Figure:
    """Risk-coverage curves of selective prediction, one line per model.

    Parameters
    ----------
    curves : mapping name -> (coverage (n,), risk (n,)[, ...])
        E.g. ``{name: uqmetrics.risk_coverage_curve(correct, confidence)}``: the first two
        entries are used (further ones, such as thresholds, are ignored). A mapping with keys
        ``"coverage"`` and ``"risk"`` (or a Dataset with those variables) works too.
    ax : matplotlib Axes, optional
    title : str, optional

    Returns
    -------
    matplotlib.figure.Figure
    """
    if not isinstance(curves, Mapping) or not curves:
        raise ValueError(f"curves must be a non-empty mapping name -> (coverage, risk), got "
                         f"{type(curves).__name__}")
    fig, ax = _figure_axes(ax)
    for name, curve in curves.items():
        if isinstance(curve, (Mapping, xr.Dataset)) and "coverage" in curve and "risk" in curve:
            cov, risk = curve["coverage"], curve["risk"]
        elif isinstance(curve, (tuple, list)) and len(curve) >= 2:
            cov, risk = curve[0], curve[1]
        else:
            raise ValueError(f"curves[{name!r}] must be (coverage, risk) or have keys "
                             f"'coverage' and 'risk', got {type(curve).__name__}")
        c = _vector(cov, f"curves[{name!r}] coverage")
        r = _vector(risk, f"curves[{name!r}] risk")
        if c.shape != r.shape:
            raise ValueError(f"curves[{name!r}]: coverage has shape {c.shape}, risk {r.shape}")
        order = np.argsort(c, kind="stable")
        ax.plot(c[order], r[order], drawstyle="steps-post", label=str(name))
    ax.set(xlim=(0, 1), xlabel="coverage", ylabel="selective risk",
           title=title or "Risk-coverage")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    return fig


# --------------------------------------------------------------------------------------------
# regression


def plot_coverage_vs_complexity(summary: xr.Dataset, *, point_selection: Mapping | None,
                                error: str | None = "binomial", method_dim: Hashable = "method",
                                complexity_dim: Hashable = "complexity", nominal: float = 0.95,
                                ax: Axes | None = None, title: str | None = None) -> Figure:
    """Coverage against complexity at one test point (or region), one line per method.

    Parameters
    ----------
    summary : xarray.Dataset
        The output of :func:`uqmetrics.coverage_summary`.
    point_selection : mapping dim -> label
        Selects one point, e.g. ``{"x": -2.38}`` (nearest on numeric coordinates),
        ``{"point": 17}`` or, for region averages, ``{"region": "in"}`` (then the
        ``region_coverage`` variables are used). After selection only ``method_dim`` and
        ``complexity_dim`` may remain.
    error : {"binomial", "paper", None}, default "binomial"
        Error bars: the binomial interval ``coverage_low``/``coverage_high``, the paper's
        ``coverage_err`` (``sqrt(p(1-p)/k)``) or none. For regions, one standard error over
        repetitions (``region_coverage_se``) whenever ``error`` is not None.
    method_dim, complexity_dim : hashable
        Dim names.
    nominal : float, default 0.95
        Level of the horizontal reference line.
    ax : matplotlib Axes, optional
    title : str, optional

    Returns
    -------
    matplotlib.figure.Figure
        One errorbar line per method plus the nominal line.
    """
    if not isinstance(summary, xr.Dataset):
        raise ValueError(f"summary must be an xarray.Dataset, got {type(summary).__name__}")
    if error not in (None, "binomial", "paper"):
        raise ValueError(f"error must be 'binomial', 'paper' or None, got {error!r}")
    region = bool(point_selection) and "region" in point_selection
    var = "region_coverage" if region else "coverage"
    if var not in summary:
        raise ValueError(f"summary lacks {var!r} (has {list(summary.data_vars)})")
    names = [var]
    if error is not None:
        names += [f"{var}_se"] if region else (
            ["coverage_low", "coverage_high"] if error == "binomial" else ["coverage_err"])
    missing = [n for n in names if n not in summary]
    if missing:
        raise ValueError(f"summary lacks {missing} needed for error={error!r}")
    sub = _sel(summary[names], point_selection, "point_selection")
    cov = sub[var]
    if complexity_dim not in cov.dims:
        raise ValueError(f"summary has no complexity dim {complexity_dim!r}: dims {list(cov.dims)}")
    extra = [d for d in cov.dims if d not in (method_dim, complexity_dim)]
    if extra:
        raise ValueError(f"point_selection must reduce the data to ({method_dim!r}, "
                         f"{complexity_dim!r}); dims {extra} remain")
    fig, ax = _figure_axes(ax)
    methods = cov[method_dim].values if method_dim in cov.dims else [None]
    x = np.asarray(cov[complexity_dim].values) if complexity_dim in cov.coords \
        else np.arange(cov.sizes[complexity_dim])
    for m in methods:
        one = sub if m is None else sub.sel({method_dim: m})
        y = np.asarray(one[var].values, float)
        if error is None:
            yerr = None
        elif region:
            yerr = np.asarray(one[f"{var}_se"].values, float)
        elif error == "binomial":
            yerr = np.stack([y - one["coverage_low"].values, one["coverage_high"].values - y])
            yerr = np.clip(yerr, 0, None)
        else:
            yerr = np.asarray(one["coverage_err"].values, float)
        ax.errorbar(x, y, yerr=yerr, marker="o", markersize=3, capsize=2,
                    label=str(m) if m is not None else var)
    handles = list(ax.containers[-len(methods):])
    handles.append(ax.axhline(nominal, color="k", linestyle="--", linewidth=1,
                              label=f"nominal {nominal:g}"))
    sel_desc = ", ".join(f"{k}={_label(sub, k, v)}" for k, v in (point_selection or {}).items())
    if np.issubdtype(np.asarray(x).dtype, np.integer):
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel=str(complexity_dim), ylabel="coverage", ylim=(-0.02, 1.02),
           title=title or (f"Coverage at {sel_desc}" if sel_desc else "Coverage"))
    ax.legend(handles=handles, fontsize="small")
    return fig


def plot_prediction_bands(x: Any, truth: Any, prediction: Any, uncertainty: Any, *,
                          x_train: Any = None, y_train: Any = None, z: float = COVERAGE_Z,
                          label: str = "prediction", ax: Axes | None = None,
                          title: str | None = None) -> Figure:
    """1-D regression: ground truth, prediction and its ``± z·uncertainty`` band.

    Parameters
    ----------
    x : array_like, shape (n,)
        Test inputs.
    truth, prediction, uncertainty : array_like, shape (n,)
        Ground truth, predictive mean and standard deviation (``>= 0``) at ``x``.
    x_train, y_train : array_like, shape (N,), optional
        Training data, drawn as points.
    z : float, default COVERAGE_Z
        Band half-width in units of ``uncertainty`` (the 0.975 normal quantile: 95% band).
    label : str, default "prediction"
    ax : matplotlib Axes, optional
    title : str, optional

    Returns
    -------
    matplotlib.figure.Figure
        Two lines (truth, prediction), one band and, optionally, the training points.
    """
    xs = _vector(x, "x")
    t = _vector(truth, "truth")
    p = _vector(prediction, "prediction")
    u = _vector(uncertainty, "uncertainty")
    for name, a in (("truth", t), ("prediction", p), ("uncertainty", u)):
        if a.shape != xs.shape:
            raise ValueError(f"{name} must have the shape of x {xs.shape}, got {a.shape}")
    if (u < 0).any():
        raise ValueError(f"uncertainty must be >= 0, got {u.min()!r}")
    zf = check_positive_number(z, "z")
    if (x_train is None) != (y_train is None):
        raise ValueError("x_train and y_train must be given together")
    order = np.argsort(xs, kind="stable")
    xs, t, p, u = xs[order], t[order], p[order], u[order]
    fig, ax = _figure_axes(ax, figsize=(6.0, 4.0))
    ax.plot(xs, t, color="k", linewidth=1, label="ground truth")
    ax.plot(xs, p, color="C0", linewidth=1.2, label=label)
    ax.fill_between(xs, p - zf * u, p + zf * u, color="C0", alpha=0.25,
                    label=f"± {zf:g} uncertainty")
    if x_train is not None:
        xt = _vector(x_train, "x_train")
        yt = _vector(y_train, "y_train")
        if xt.shape != yt.shape:
            raise ValueError(f"y_train must have the shape of x_train {xt.shape}, got {yt.shape}")
        ax.scatter(xt, yt, s=8, color="C1", zorder=3, label="training data")
    ax.set(xlabel="x", ylabel="y", title=title or "Prediction bands")
    ax.legend(fontsize="small")
    return fig


def plot_heatmap(da: xr.DataArray, *, x: Hashable | None = None, y: Hashable | None = None,
                 cmap: str = "viridis", vmin: float | None = None, vmax: float | None = None,
                 box: tuple[float, float, float, float] | None = None,
                 colorbar_label: str | None = None, ax: Axes | None = None,
                 title: str | None = None) -> Figure:
    """2-D map of a quantity, e.g. coverage over the polynomial task's test grid.

    Parameters
    ----------
    da : xarray.DataArray, 2-D
        Values over two dims (e.g. ``x1``, ``x2``); their coordinates give the axes.
    x, y : hashable, optional
        Dims on the horizontal / vertical axis (default: ``da.dims[1]``, ``da.dims[0]``).
    cmap : str, default "viridis"
    vmin, vmax : float, optional
        Colour limits (e.g. 0 and 1 for coverage).
    box : (x_low, x_high, y_low, y_high), optional
        A rectangle to outline, e.g. the training box ``(1, 4, 1, 4)``.
    colorbar_label : str, optional
        Default: the DataArray's name.
    ax : matplotlib Axes, optional
    title : str, optional

    Returns
    -------
    matplotlib.figure.Figure
        One mesh with a colour bar (and one rectangle patch with ``box``).
    """
    if not isinstance(da, xr.DataArray):
        raise ValueError(f"da must be a 2-D xarray.DataArray, got {type(da).__name__}")
    if da.ndim != 2:
        raise ValueError(f"da must be 2-D, got dims {da.dims} (select or average the others)")
    if da.dtype.kind not in "biuf":
        raise ValueError(f"da must be numeric, got dtype {da.dtype}")
    d0, d1 = da.dims
    if x is None and y is None:
        ydim, xdim = d0, d1
    elif x is None:
        ydim, xdim = y, (d1 if y == d0 else d0)
    else:
        xdim, ydim = x, (y if y is not None else (d1 if x == d0 else d0))
    if {xdim, ydim} != {d0, d1}:
        raise ValueError(f"x and y must be the two dims of da {da.dims}, got x={xdim!r}, "
                         f"y={ydim!r}")
    arr = da.transpose(ydim, xdim)
    xc = np.asarray(arr[xdim].values, float) if xdim in arr.coords \
        else np.arange(arr.sizes[xdim], dtype=float)
    yc = np.asarray(arr[ydim].values, float) if ydim in arr.coords \
        else np.arange(arr.sizes[ydim], dtype=float)
    fig, ax = _figure_axes(ax, figsize=(5.5, 4.5))
    mesh = ax.pcolormesh(xc, yc, np.ma.masked_invalid(arr.values.astype(float)), cmap=cmap,
                         vmin=vmin, vmax=vmax, shading="nearest")
    fig.colorbar(mesh, ax=ax, label=colorbar_label if colorbar_label is not None
                 else (str(da.name) if da.name is not None else ""))
    if box is not None:
        if len(box) != 4:
            raise ValueError(f"box must be (x_low, x_high, y_low, y_high), got {box!r}")
        from matplotlib.patches import Rectangle

        x0, x1, y0, y1 = map(float, box)
        ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor="w",
                               linestyle="--", linewidth=1.2))
    ax.set(xlabel=str(xdim), ylabel=str(ydim), title=title or (str(da.name) if da.name else ""))
    return fig


# --------------------------------------------------------------------------------------------
# ensembles


def plot_metric_vs_size(data: xr.Dataset | xr.DataArray, *, variable: str | None = None,
                        size_dim: Hashable = "size", order_dim: Hashable = "order",
                        method_dim: Hashable | None = "method", ax: Axes | None = None,
                        ylabel: str | None = None, title: str | None = None) -> Figure:
    """A metric against ensemble size: mean ± std over random member orders, one line per method.

    Parameters
    ----------
    data : xarray.Dataset or xarray.DataArray
        Over ``(size, order)`` and optionally ``method``; a Dataset needs ``variable`` unless it
        has a single data variable.
    variable : str, optional
        The metric to plot from a Dataset (e.g. ``"nll"``).
    size_dim, order_dim : hashable, default "size", "order"
        Ensemble-size dim (its coordinate is the x axis) and member-order dim (averaged; may
        be absent, then no band).
    method_dim : hashable or None, default "method"
        One line per entry when this dim exists.
    ax : matplotlib Axes, optional
    ylabel, title : str, optional

    Returns
    -------
    matplotlib.figure.Figure
        One line per method, each with a ± std band over orders.
    """
    if isinstance(data, xr.Dataset):
        if variable is None:
            if len(data.data_vars) != 1:
                raise ValueError(f"variable must name one of {list(data.data_vars)}")
            variable = next(iter(data.data_vars))
        if variable not in data:
            raise ValueError(f"variable {variable!r} not in the Dataset ({list(data.data_vars)})")
        da = data[variable]
    elif isinstance(data, xr.DataArray):
        da = data
    else:
        raise ValueError(f"data must be an xarray Dataset or DataArray, got {type(data).__name__}")
    if size_dim not in da.dims:
        raise ValueError(f"data has no size dim {size_dim!r}: dims {list(da.dims)}")
    allowed = {size_dim, order_dim, method_dim}
    extra = [d for d in da.dims if d not in allowed]
    if extra:
        raise ValueError(f"data has dims {extra} besides {sorted(map(str, allowed - {None}))}; "
                         f"select them first")
    if da.dtype.kind not in "biuf":
        raise ValueError(f"data must be numeric, got dtype {da.dtype}")
    has_order = order_dim in da.dims
    with np.errstate(invalid="ignore"):
        mean = da.mean(order_dim) if has_order else da
        std = da.std(order_dim) if has_order and da.sizes[order_dim] > 1 else None
    x = np.asarray(da[size_dim].values, float) if size_dim in da.coords \
        else np.arange(1, da.sizes[size_dim] + 1, dtype=float)
    fig, ax = _figure_axes(ax)
    methods = da[method_dim].values if method_dim is not None and method_dim in da.dims \
        else [None]
    for i, m in enumerate(methods):
        sel = {} if m is None else {method_dim: m}
        y = np.asarray(mean.sel(sel).transpose(size_dim).values, float)
        color = f"C{i % 10}"
        ax.plot(x, y, marker="o", markersize=3, color=color,
                label=str(m) if m is not None else str(da.name or ""))
        if std is not None:
            s = np.asarray(std.sel(sel).transpose(size_dim).values, float)
            ax.fill_between(x, y - s, y + s, color=color, alpha=0.2)
    ax.set(xlabel="ensemble size", ylabel=ylabel or str(da.name or variable or ""),
           title=title or "")
    if methods[0] is not None or da.name:
        ax.legend(fontsize="small")
    return fig


# --------------------------------------------------------------------------------------------
# files


def save_figure(fig: Figure, path: str | os.PathLike, *, dpi: int = 150) -> Path:
    """Save a Figure atomically (temporary file in the same directory, then ``os.replace``).

    Parameters
    ----------
    fig : matplotlib.figure.Figure
    path : str or path-like
        Target; the format follows the suffix (``.png`` default, ``.pdf``, ``.svg``), unless
        inside :func:`figure_format`, whose format replaces the suffix. Parent directories are
        created; an existing file is replaced.
    dpi : int, default 150

    Returns
    -------
    pathlib.Path
        The file written (its suffix the format's under :func:`figure_format`). An SVG records
        no creation date (the same figure gives the same bytes).
    """
    if not isinstance(fig, Figure):
        raise ValueError(f"fig must be a matplotlib Figure, got {type(fig).__name__}")
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix and suffix not in _FORMATS:
        raise ValueError(f"path must end in one of {sorted(_FORMATS)} (or have no suffix), "
                         f"got {str(path)!r}")
    fmt = _FORMATS.get(suffix, "png")
    override = _FORMAT_OVERRIDE.get()
    if override is not None and override != fmt:
        fmt = override
        path = path.with_suffix(f".{fmt}") if suffix else path.with_name(f"{path.name}.{fmt}")
    if fig.canvas is None or not hasattr(fig.canvas, "print_figure"):
        FigureCanvasAgg(fig)
    try:
        with temporary_beside(path) as tmp:
            with open(tmp, "wb") as fh:
                fig.savefig(fh, format=fmt, dpi=dpi,
                            **({"metadata": {"Date": None}} if fmt == "svg" else {}))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
    except OSError as exc:
        if exc.filename is not None:
            raise
        # a write into the open file (a full disk) names no file: name the figure's
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    return path


def save_figures(figures: Iterable[tuple[str, Callable[[], Figure]]], out_dir: str | os.PathLike,
                 *, dpi: int = 150) -> list[Path]:
    """Draw figures one at a time and save each into a folder (:func:`save_figure`).

    Parameters
    ----------
    figures : iterable of (str, callable)
        ``(file name, draw)`` pairs, ``draw()`` returning the Figure; each is drawn and saved
        before the next is drawn.
    out_dir : str or path-like
        The folder (created).
    dpi : int, default 150

    Returns
    -------
    list of pathlib.Path
        The files written, in order.
    """
    out = Path(out_dir)
    return [save_figure(draw(), out / name, dpi=dpi) for name, draw in figures]
