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
    "alike_legend_entries",
    "distinct_styles",
    "figure_format",
    "figure_grid",
    "figure_path",
    "fitted_suptitle",
    "label_points",
    "overlapping_text",
    "plot_coverage_vs_complexity",
    "plot_heatmap",
    "plot_metric_vs_size",
    "plot_prediction_bands",
    "plot_reliability_diagram",
    "plot_risk_coverage",
    "save_figure",
    "save_figures",
    "series_legend",
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


# --------------------------------------------------------------------------------------------
# legibility


#: Two boxes closer than this (pixels at the figure's dpi) in either direction do not overlap:
#: text and legends that merely touch are legible, and layouts round to a pixel.
_OVERLAP_TOLERANCE_PX = 1.0
#: Characters of a text kept in the name of an element (:func:`overlapping_text`).
_NAME_CHARS = 28


def _quoted(text: str) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= _NAME_CHARS else text[:_NAME_CHARS - 1].rstrip() + "…")


def _drawn_axes(ax: Axes) -> bool:
    """Whether ``ax`` shows anything: visible, with its axis on or some artist (a panel turned
    off to leave a grid cell empty is blank space a legend may use)."""
    if not ax.get_visible():
        return False
    return ax.axison or any(a.get_visible() for a in (*ax.lines, *ax.collections, *ax.images,
                                                       *ax.patches, *ax.texts))


def overlapping_text(fig: Figure) -> list[tuple[str, str]]:
    """The pairs of a figure's titles, labels, legends and panels that overlap once drawn.

    The figure is drawn first (constrained and tight layouts place everything at draw time;
    a Figure without a canvas gets an Agg one). Checked, among the visible and non-empty
    elements:

    - every pair of texts among the suptitle, ``supxlabel``, ``supylabel`` and every drawn
      axes' titles (centre, left, right) and x and y axis labels;
    - every legend (the figure's and each axes') against each of those texts, including its
      own axes' (a legend taller than its panel runs over the title), and against every other
      legend;
    - each axes' legend, title and labels against the area of every other drawn axes (a twin
      shares its area and is not another axes), the figure's legends and texts against the
      area of every drawn axes;
    - every text and legend against the figure's edge (a part of it outside the figure is not
      saved).

    Parameters
    ----------
    fig : matplotlib.figure.Figure

    Returns
    -------
    list of tuple of (str, str)
        One ``(element, element)`` pair per overlap, in the order of ``fig.axes`` (figure-level
        elements first); empty for a legible figure. An element is named by what it is and,
        for an axes', its panel (``fig.axes`` position, from 1; a colour bar says so) and
        its text, shortened: ``"suptitle 'coverage at x=3'"``, ``"panel 2 title 'accuracy
        (a box: over the c…'"``, ``"panel 1 xlabel 'severity'"``, ``"panel 1 legend"``,
        ``"figure legend"``, ``"panel 3 (colour bar)"`` (an axes' area), ``"figure edge"``.

    Examples
    --------
    >>> fig, axes = figure_grid(1, 2, panel=(3, 2))
    >>> _ = axes[0, 0].plot([0, 1], label="a line"), axes[0, 0].set_title("left")
    >>> overlapping_text(fig)
    []
    >>> _ = fig.legend(loc="center")  # between the panels, over both
    >>> overlapping_text(fig)
    [('figure legend', 'panel 1'), ('figure legend', 'panel 2')]
    """
    if not isinstance(fig, Figure):
        raise ValueError(f"fig must be a matplotlib Figure, got {type(fig).__name__}")
    renderer = _renderer(fig, draw=True)
    # (name, box, kind, owner): kind "text", "legend" or "axes"; owner the axes (None: figure)
    elements: list[tuple[str, Any, str, Axes | None]] = []
    for attr in ("_suptitle", "_supxlabel", "_supylabel"):
        text = getattr(fig, attr, None)
        if text is not None and text.get_visible() and text.get_text():
            elements.append((f"{attr[1:]} {_quoted(text.get_text())}",
                             text.get_window_extent(renderer), "text", None))
    for k, legend in enumerate(fig.legends):
        if legend.get_visible():
            name = "figure legend" + (f" {k + 1}" if len(fig.legends) > 1 else "")
            elements.append((name, legend.get_window_extent(renderer), "legend", None))
    for i, ax in enumerate(fig.axes):
        if not _drawn_axes(ax):
            continue
        panel = f"panel {i + 1}"
        texts = [(f"{side} title " if side != "centre" else "title ", t) for side, t in
                 (("centre", ax.title), ("left", ax._left_title), ("right", ax._right_title))]
        if ax.axison:
            texts += [("xlabel ", ax.xaxis.label), ("ylabel ", ax.yaxis.label)]
        for what, text in texts:
            if text.get_visible() and text.get_text():
                elements.append((f"{panel} {what}{_quoted(text.get_text())}",
                                 text.get_window_extent(renderer), "text", ax))
        legend = ax.get_legend()
        if legend is not None and legend.get_visible():
            elements.append((f"{panel} legend", legend.get_window_extent(renderer), "legend", ax))
        colourbar = " (colour bar)" if getattr(ax, "_colorbar", None) is not None else ""
        elements.append((panel + colourbar, ax.get_window_extent(renderer), "axes", ax))
    pairs = []
    for j, (name_a, box_a, kind_a, owner_a) in enumerate(elements):
        for name_b, box_b, kind_b, owner_b in elements[j + 1:]:
            if kind_a == kind_b == "axes":
                continue  # panels are the layout's to place
            if "axes" in (kind_a, kind_b):
                owner, area = (owner_a, owner_b) if kind_b == "axes" else (owner_b, owner_a)
                if owner is area or owner in _twins(area):
                    continue  # an axes' legend stands inside its own panel, its labels beside
            if _overlap(box_a, box_b):
                pairs.append((name_a, name_b))
    edge = fig.bbox
    for name, box, kind, _ in elements:
        if kind != "axes" and _outside(box, edge):
            pairs.append((name, "figure edge"))
    return pairs


def _renderer(fig: Figure, *, draw: bool = False) -> Any:
    """``fig``'s renderer, an Agg canvas given to a Figure without one (a bare Figure's canvas
    draws nothing); the figure drawn first if ``draw`` (layouts place everything at draw time)."""
    if not hasattr(fig.canvas, "get_renderer"):
        FigureCanvasAgg(fig)
    if draw:
        fig.canvas.draw()
    return fig.canvas.get_renderer()


def _twins(ax: Axes) -> list[Axes]:
    """The axes that share ``ax``'s area as its twins (``twinx``/``twiny``), itself left out."""
    twinned = getattr(ax, "_twinned_axes", None)
    return [] if twinned is None else [a for a in twinned.get_siblings(ax) if a is not ax]


def _overlap(a: Any, b: Any) -> bool:
    width = min(a.x1, b.x1) - max(a.x0, b.x0)
    height = min(a.y1, b.y1) - max(a.y0, b.y0)
    return width > _OVERLAP_TOLERANCE_PX and height > _OVERLAP_TOLERANCE_PX


def _outside(box: Any, edge: Any) -> bool:
    return (box.x0 < edge.x0 - _OVERLAP_TOLERANCE_PX or box.y0 < edge.y0 - _OVERLAP_TOLERANCE_PX
            or box.x1 > edge.x1 + _OVERLAP_TOLERANCE_PX or box.y1 > edge.y1 + _OVERLAP_TOLERANCE_PX)


def _look(handle: Any) -> tuple:
    """What a legend's handle looks like: its kind, colours (with alpha), line style, marker
    and marker size or hatch; two handles alike here are one to the eye."""
    from matplotlib.collections import Collection
    from matplotlib.colors import to_hex
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    def colours(values: Any) -> tuple[str, ...]:
        rgba = np.atleast_2d(np.asarray(values, float)) if len(np.shape(values)) else ()
        return tuple(to_hex(c, keep_alpha=True) for c in rgba)

    if isinstance(handle, Line2D):
        return ("line", to_hex(handle.get_color(), keep_alpha=True), str(handle.get_linestyle()),
                str(handle.get_marker()), round(float(handle.get_markersize()), 1),
                to_hex(handle.get_markerfacecolor(), keep_alpha=True))
    if isinstance(handle, Patch):
        return ("patch", to_hex(handle.get_facecolor(), keep_alpha=True),
                to_hex(handle.get_edgecolor(), keep_alpha=True), handle.get_hatch(),
                str(handle.get_linestyle()), handle.get_fill())
    if isinstance(handle, Collection):
        paths = tuple(np.round(p.vertices, 3).tobytes() for p in handle.get_paths()[:1])
        return ("collection", colours(handle.get_facecolor()), colours(handle.get_edgecolor()),
                tuple(np.round(np.asarray(getattr(handle, "get_sizes", list)(), float), 1)), paths,
                str(handle.get_linestyle()))
    return (type(handle).__name__, id(handle))  # an unknown kind: never alike


def alike_legend_entries(fig: Figure) -> list[tuple[str, str]]:
    """The pairs of entries of one legend of ``fig`` that look alike: two series a reader
    cannot tell apart.

    Each legend of the figure (the figure's and every visible axes') is read as drawn: two of
    its entries are alike when every artist of their keys is: same kind and colour (with
    alpha), and line style, marker and marker size (a line), edge colour, hatch and line style
    (a patch: bars, histograms) or edge colours, sizes and marker (a collection: scatter
    points, error bars). Entries of different legends are never compared (each panel may
    repeat a key).

    Parameters
    ----------
    fig : matplotlib.figure.Figure

    Returns
    -------
    list of tuple of (str, str)
        One ``(entry, entry)`` pair per two entries alike, named by their legend (as
        :func:`overlapping_text` names it) and label, e.g. ``("panel 1 legend 'msp'",
        "panel 1 legend 'ash'")``; empty when every series is distinguishable.

    Examples
    --------
    >>> fig, axes = figure_grid(1, 1, panel=(3, 2))
    >>> for i in range(11):  # matplotlib's default colours: the 11th is the 1st's
    ...     _ = axes[0, 0].plot([0, 1], [i, i], label=f"m{i}")
    >>> _ = axes[0, 0].legend()
    >>> alike_legend_entries(fig)
    [("panel 1 legend 'm0'", "panel 1 legend 'm10'")]
    """
    if not isinstance(fig, Figure):
        raise ValueError(f"fig must be a matplotlib Figure, got {type(fig).__name__}")
    from matplotlib.offsetbox import DrawingArea

    legends = [("figure legend" + (f" {k + 1}" if len(fig.legends) > 1 else ""), legend)
               for k, legend in enumerate(fig.legends)]
    legends += [(f"panel {i + 1} legend", ax.get_legend()) for i, ax in enumerate(fig.axes)
                if ax.get_visible() and ax.get_legend() is not None]
    pairs = []
    for name, legend in legends:
        # each entry's key as drawn: every artist of its box (an error bar's line, marker and
        # bars; legend_handles holds only the first of them)
        keys = [box for box in legend.findobj(DrawingArea) if box is not legend]
        entries = [(f"{name} {_quoted(t.get_text())}", tuple(_look(a) for a in box.get_children()))
                   for t, box in zip(legend.get_texts(), keys, strict=True)]
        for j, (a, look) in enumerate(entries):
            pairs += [(a, b) for b, other in entries[j + 1:] if other == look]
    return pairs


def series_legend(owner: Axes | Figure, handles: list | None = None, labels: list | None = None,
                  *, inside: int = 8, rows: int = 18, beside: str = "axes", widen: bool = False,
                  **kwargs: Any) -> Any:
    """A legend that stays clear of the panels and titles however many series it names.

    On an Axes, up to ``inside`` entries: its ordinary legend (``kwargs``: ``loc``,
    ``fontsize``...). Past that, or on a Figure: beside the panels, on the right (upper
    corner), in columns of up to ``rows`` entries, where constrained or tight layout makes room
    for it; inside, a legend of many series runs over the lines, the title and the panels
    below.

    Parameters
    ----------
    owner : matplotlib Axes or Figure
        Whose legend: an axes' or the figure's (beside all the panels).
    handles, labels : list, optional
        As :meth:`matplotlib.axes.Axes.legend`; default the owner's labelled artists (for a
        Figure: of all its axes, a label once).
    inside : int, default 8
        Entries an axes' legend may hold inside its panel.
    rows : int, default 18
        Entries per column beside the panels.
    beside : {"axes", "figure"}, default "axes"
        Past ``inside`` entries, an axes' legend stands beside its own panel, or (``"figure"``:
        for a panel among others) becomes the figure's legend, beside all of them. The
        figure's legend needs constrained layout.
    widen : bool, default False
        Widen the figure by the width of a legend put beside, so the panels keep their size
        (for a figure drawn for this legend alone: not where other panels share the figure).
    **kwargs
        Passed on to the legend (``loc`` and ``bbox_to_anchor`` only inside).

    Returns
    -------
    matplotlib.legend.Legend or None
        None where there is no labelled artist (no legend drawn, no warning).
    """
    if handles is None:
        axes = [owner] if isinstance(owner, Axes) else owner.axes
        found: dict[str, Any] = {}
        for ax in axes:
            for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
                found.setdefault(label, h)
        handles, labels = list(found.values()), list(found)
    elif labels is None:
        labels = [h.get_label() for h in handles]
    if not handles:
        return None
    if beside not in ("axes", "figure"):
        raise ValueError(f"beside must be 'axes' or 'figure', got {beside!r}")
    if isinstance(owner, Axes) and len(handles) <= inside:
        return owner.legend(handles, labels, **kwargs)
    kwargs = {k: v for k, v in kwargs.items() if k not in ("loc", "bbox_to_anchor", "ncols",
                                                            "ncol")}
    ncols = -(-len(handles) // rows)
    if isinstance(owner, Axes) and beside == "figure":
        owner = owner.figure
    if isinstance(owner, Axes):
        legend = owner.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                              borderaxespad=0.0, ncols=ncols, **kwargs)
        fig = owner.figure
    else:
        legend = owner.legend(handles, labels, loc="outside right upper", ncols=ncols,
                              **kwargs)
        fig = owner
    if widen:
        width = legend.get_window_extent(_renderer(fig)).width / fig.dpi
        fig.set_size_inches(fig.get_figwidth() + width + 0.1, fig.get_figheight())
    return legend


def fitted_suptitle(fig: Figure, text: str, **kwargs: Any) -> Any:
    """The figure's suptitle, broken at spaces onto as many lines as it takes to fit within the
    figure's width (a long title over a narrow figure ran past both edges).

    Parameters
    ----------
    fig : matplotlib.figure.Figure
        Under constrained layout, which makes room for every line (a fixed ``tight_layout``
        ``rect`` does not).
    text : str
    **kwargs
        Passed on to :meth:`matplotlib.figure.Figure.suptitle` (``x``, ``ha``, ``fontsize``...).

    Returns
    -------
    matplotlib.text.Text
    """
    import textwrap

    title = fig.suptitle(text, **kwargs)
    renderer = _renderer(fig)
    room = fig.bbox.width - 2 * _OVERLAP_TOLERANCE_PX - 0.02 * fig.bbox.width  # the x margins
    chars = len(text)
    while chars > 10:
        box = title.get_window_extent(renderer)
        # within the figure, and within its edges however the title is aligned
        if box.width <= room and box.x0 >= 0 and box.x1 <= fig.bbox.width:
            break
        chars = max(10, int(chars * min(0.95, room / max(box.width, 1.0))))
        title.set_text(textwrap.fill(text, chars, break_long_words=False))
    return title


def label_points(ax: Axes, x: Any, y: Any, names: Iterable[Any], *, fontsize: float = 5,
                 offset: float = 3.0, **kwargs: Any) -> list[Any]:
    """Name each point of a scatter beside it, on the side toward the panel's centre.

    A label stands ``offset`` points from its point: to the right of a point in the left half
    of what the panel holds so far and to the left in its right half, above a point in the
    lower half and below in the upper half. It then neither covers its own point nor runs past
    the panel's edge (a name at the edge of a panel was cut off, or ran over the next panel).
    Call it after the points are drawn: it reads the extent of the panel's data (not its
    limits, which it leaves to be autoscaled, on whatever scale is set afterwards).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    x, y : array_like, shape (n,)
        In data coordinates; a point with a non-finite coordinate is not named.
    names : iterable, length n
        Shown as ``str(name)``.
    fontsize : float
    offset : float
        Points between a point and its label.
    **kwargs
        Passed on to :meth:`matplotlib.axes.Axes.annotate` (``alpha``, ``color``...).

    Returns
    -------
    list of matplotlib.text.Annotation
        One per named point, in order.
    """
    x, y, names = np.asarray(x, dtype=float), np.asarray(y, dtype=float), list(names)
    if not x.shape == y.shape == (len(names),):
        raise ValueError(f"x, y and names must have one entry per point, got shapes {x.shape}, "
                         f"{y.shape} and {len(names)} names")
    ok = np.isfinite(x) & np.isfinite(y)
    extent = ax.dataLim  # what the panel's artists hold; reading it leaves the limits unset
    if not ok.any():
        return []
    if extent.width > 0 and np.isfinite([extent.x0, extent.x1]).all():
        mid_x = 0.5 * (extent.x0 + extent.x1)
    else:
        mid_x = 0.5 * (x[ok].min() + x[ok].max())
    if extent.height > 0 and np.isfinite([extent.y0, extent.y1]).all():
        mid_y = 0.5 * (extent.y0 + extent.y1)
    else:
        mid_y = 0.5 * (y[ok].min() + y[ok].max())
    labels = []
    for xi, yi, name, named in zip(x, y, names, ok, strict=True):
        if not named:
            continue
        right, up = xi <= mid_x, yi <= mid_y
        labels.append(ax.annotate(
            str(name), (xi, yi), xytext=(offset if right else -offset, offset if up else -offset),
            textcoords="offset points", ha="left" if right else "right",
            va="bottom" if up else "top", fontsize=fontsize, **kwargs))
    return labels


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
        One step line per model, each its own style (:func:`distinct_styles`), the legend
        beside the panel past 8 models (:func:`series_legend`).
    """
    if not isinstance(curves, Mapping) or not curves:
        raise ValueError(f"curves must be a non-empty mapping name -> (coverage, risk), got "
                         f"{type(curves).__name__}")
    new = ax is None
    fig, ax = _figure_axes(ax)
    styles = distinct_styles(curves)
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
        ax.plot(c[order], r[order], drawstyle="steps-post", label=str(name), markersize=3,
                markevery=max(1, c.size // 8), **styles[str(name)])
    ax.set(xlim=(0, 1), xlabel="coverage", ylabel="selective risk",
           title=title or "Risk-coverage")
    ax.set_ylim(bottom=0)
    series_legend(ax, fontsize="small", widen=new)
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
        One errorbar line per method, each its own style (:func:`distinct_styles`), plus the
        nominal line; the legend beside the panel past 8 entries (:func:`series_legend`).
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
    new = ax is None
    fig, ax = _figure_axes(ax)
    methods = cov[method_dim].values if method_dim in cov.dims else [None]
    labels = [str(m) if m is not None else var for m in methods]
    styles = distinct_styles(labels)
    x = np.asarray(cov[complexity_dim].values) if complexity_dim in cov.coords \
        else np.arange(cov.sizes[complexity_dim])
    for m, label in zip(methods, labels, strict=True):
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
        ax.errorbar(x, y, yerr=yerr, markersize=3, capsize=2, label=label, **styles[label])
    handles = list(ax.containers[-len(methods):])
    handles.append(ax.axhline(nominal, color="k", linestyle="--", linewidth=1,
                              label=f"nominal {nominal:g}"))
    sel_desc = ", ".join(f"{k}={_label(sub, k, v)}" for k, v in (point_selection or {}).items())
    if np.issubdtype(np.asarray(x).dtype, np.integer):
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel=str(complexity_dim), ylabel="coverage", ylim=(-0.02, 1.02),
           title=title or (f"Coverage at {sel_desc}" if sel_desc else "Coverage"))
    series_legend(ax, handles, fontsize="small", widen=new)
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


#: Line styles and markers of :func:`distinct_styles`: a family's variants take the line styles
#: in turn, the further cycles of colours (past the colour map's size) the markers.
_LINESTYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "D", "v", "P", "X", "*", "^", "<", ">", "p", "h")


def distinct_styles(names: Iterable[Hashable], *,
                    family: Callable[[str], tuple[Hashable, int]] | None = None
                    ) -> dict[str, dict[str, str]]:
    """A ``{color, linestyle, marker}`` per series, no two alike: what tells the lines of a
    figure apart past matplotlib's 10 default colours.

    One colour per family of series (tab10, or tab20 past 10 families); the series of a family
    told apart by line style (its variant: 0 solid, 1 dashed, 2 dotted, 3 dash-dotted), the
    families of the further cycles of colours by marker (``o`` first). Without ``family``,
    every series is a family of its own: up to 10 series, the default colours with solid lines
    and circles. No two series share all three up to 48 cycles of colours over the number of
    variants (960 families of one variant, 480 of two); past that the styles repeat.

    Parameters
    ----------
    names : iterable of hashable
        The series, in drawing order (their ``str`` is the key); no two alike.
    family : callable, optional
        ``family(name) -> (key, variant)``: the series of one key share a colour, ``variant``
        (int in 0..3) picks the line style, e.g. ``NAME`` and ``NAME_tta`` one colour, plain
        solid and under test-time augmentation dashed. No two series may have the same pair.

    Returns
    -------
    dict
        ``str(name) -> {"color": "#rrggbb", "linestyle": str, "marker": str}``, in the order of
        ``names``: keyword arguments of :meth:`matplotlib.axes.Axes.plot`.

    Raises
    ------
    ValueError
        Two names alike, a variant out of 0..3, two series of one family and variant.

    Examples
    --------
    >>> styles = distinct_styles([f"m{i}" for i in range(11)])
    >>> styles["m0"], styles["m10"]["color"] != styles["m0"]["color"]
    ({'color': '#1f77b4', 'linestyle': '-', 'marker': 'o'}, True)
    >>> tta = distinct_styles(["a", "a_tta"], family=lambda n: (n.removesuffix("_tta"),
    ...                                                          int(n.endswith("_tta"))))
    >>> tta["a"]["color"] == tta["a_tta"]["color"], tta["a_tta"]["linestyle"]
    (True, '--')
    """
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    labels = [str(n) for n in names]
    if len(set(labels)) != len(labels):
        twice = sorted({n for n in labels if labels.count(n) > 1})
        raise ValueError(f"names must be distinct, got {twice} more than once")
    keys = {n: (n, 0) if family is None else family(n) for n in labels}
    for n, (_, variant) in keys.items():
        if not isinstance(variant, (int, np.integer)) or not 0 <= variant < len(_LINESTYLES):
            raise ValueError(f"family({n!r}) must give a variant in 0..{len(_LINESTYLES) - 1}, "
                             f"got {variant!r}")
    if len(set(keys.values())) != len(keys):
        seen: dict[tuple, str] = {}
        a, b = next((seen[k], n) for n, k in keys.items() if seen.setdefault(k, n) != n)
        raise ValueError(f"family must give each name its own (key, variant) pair, got "
                         f"{keys[a]!r} for both {a!r} and {b!r}")
    families = list(dict.fromkeys(k for k, _ in keys.values()))
    n_variants = 1 + max((int(v) for _, v in keys.values()), default=0)
    cmap = colormaps["tab10" if len(families) <= 10 else "tab20"]
    styles = {}
    for n in labels:
        key, variant = keys[n]
        i = families.index(key)
        # one slot per (cycle of colours, variant): the slot picks the marker, and the line
        # style past the markers (12 divides by every number of variants: no two slots alike)
        slot = (i // cmap.N) * n_variants + int(variant)
        styles[n] = {"color": to_hex(cmap(i % cmap.N)),
                     "linestyle": _LINESTYLES[(int(variant) + slot // len(_MARKERS))
                                              % len(_LINESTYLES)],
                     "marker": _MARKERS[slot % len(_MARKERS)]}
    return styles


def plot_metric_vs_size(data: xr.Dataset | xr.DataArray, *, variable: str | None = None,
                        size_dim: Hashable = "size", order_dim: Hashable = "order",
                        method_dim: Hashable | None = "method",
                        styles: Mapping[str, Mapping[str, Any]] | None = None,
                        ax: Axes | None = None, ylabel: str | None = None,
                        title: str | None = None) -> Figure:
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
    styles : mapping str -> mapping, optional
        Per series (its label: the method's ``str``), keyword arguments of the line
        (``color``, ``linestyle``, ``marker``...); its band takes its colour. Default
        :func:`distinct_styles` of the series: no two alike, however many.
    ax : matplotlib Axes, optional
    ylabel, title : str, optional

    Returns
    -------
    matplotlib.figure.Figure
        One line per method, each with a ± std band over orders; the legend inside the panel
        up to 8 series, past that beside it (:func:`series_legend`; a new figure is widened
        for it).
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
    methods = da[method_dim].values if method_dim is not None and method_dim in da.dims \
        else [None]
    labels = [str(m) if m is not None else str(da.name or "") for m in methods]
    style = distinct_styles(labels)
    if styles is not None:
        style = {n: {**style[n], **styles.get(n, {})} for n in labels}
    new = ax is None
    fig, ax = _figure_axes(ax)
    for m, label in zip(methods, labels, strict=True):
        sel = {} if m is None else {method_dim: m}
        y = np.asarray(mean.sel(sel).transpose(size_dim).values, float)
        (line,) = ax.plot(x, y, markersize=3, label=label, **style[label])
        if std is not None:
            s = np.asarray(std.sel(sel).transpose(size_dim).values, float)
            ax.fill_between(x, y - s, y + s, color=line.get_color(), alpha=0.2)
    ax.set(xlabel="ensemble size", ylabel=ylabel or str(da.name or variable or ""),
           title=title or "")
    if methods[0] is not None or da.name:
        series_legend(ax, fontsize="small", widen=new)
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


def figure_path(out_dir: str | os.PathLike, name: str) -> Path:
    """``out_dir / name``, where ``name`` must be one plain file name: no folder part, not
    ``.`` or ``..``. Figure names are built from labels a result file gives (a model, a
    recipe, a task: pass those through :func:`uqmetrics.runs.io.safe_name`); a name that
    would lead elsewhere is a bug, refused here rather than written outside ``out_dir``.

    Raises
    ------
    ValueError
        ``name`` is not one plain file name, naming it.
    """
    if not isinstance(name, str) or name in ("", "..") or Path(name).name != name or "\\" in name:
        raise ValueError(f"figure name {name!r} is not one file name inside {str(out_dir)!r}")
    return Path(out_dir) / name


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
    written = []
    for name, draw in figures:
        path = figure_path(out_dir, name)  # before drawing: a bad name costs no figure
        written.append(save_figure(draw(), path, dpi=dpi))
    return written
