"""Figures of the distribution-shift protocol (Ovadia et al. 2019, Fig. 2 style;
docs/conventions.md#v-5) from a shift result (:func:`~.score.score_shift`, ``shift.nc``).

- :func:`plot_shift_boxes`: accuracy, ECE and Brier per shift intensity (``clean``, then every
  severity), each box over the corruptions, one box per (model, calibration) side by side;
- :func:`plot_shift_heatmap`: a corruption x severity heat map per model, one row per
  (metric, calibration);
- :func:`plot_shift_acc_vs_ece`: accuracy against ECE, one point per (corruption, severity) and
  model, coloured by model, sized by severity, the clean point starred (natural shift sets,
  ``set_<metric>``, as diamonds where present), one panel per calibration;
- :func:`draw_figures`: all three into a folder (``uqvision plot --shift FILE``).

Rows of ``model`` may be models or UQ methods (``deep_ensemble``); every figure draws the rows
present. A missing member (NaN) is left out of its box, blank in its heat map and not drawn in
the scatter, never drawn as 0. Every figure is a :class:`matplotlib.figure.Figure` on an Agg
canvas (no pyplot, no global state); matplotlib is imported on first use. Each drawn artist
carries a ``gid`` naming what it shows (``median:<metric>:<calibration>:<model>:<group>``,
``box:...``, ``heatmap:<metric>:<calibration>:<model>``, ``shifted:<calibration>:<model>``,
``clean:<calibration>:<model>``, ``set:<calibration>:<model>``), so that tests and callers can
read the drawn numbers back.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import xarray as xr
from uqmetrics import InputError

from ..base import draw_protocol_figures, protocol_result
from .score import CALIBRATIONS

if TYPE_CHECKING:  # matplotlib is imported on first use
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["BOX_METRICS", "HEATMAP_ROWS", "draw_figures", "plot_shift_acc_vs_ece",
           "plot_shift_boxes", "plot_shift_heatmap"]

#: The metrics of the box plots (Ovadia et al. 2019, Fig. 2: accuracy, ECE, Brier).
BOX_METRICS = ("accuracy", "ece", "brier")
#: The rows of the heat map: (metric, calibration); temperature scaling never moves accuracy.
HEATMAP_ROWS = (("accuracy", "none"), ("ece", "none"), ("ece", "temperature"))
#: Axis labels of the metrics drawn.
_LABELS = {"accuracy": "accuracy", "ece": "ECE", "brier": "Brier score", "nll": "NLL",
           "aurc": "AURC", "auroc": "AUROC"}
_CALIBRATION_LABELS = {"none": "un-scaled", "temperature": "temperature-scaled"}


# ---------------------------------------------------------------------------------------------
# inputs


def _result(result: xr.Dataset | str | os.PathLike) -> xr.Dataset:
    """The shift result ``result`` (a Dataset or a ``shift.nc``), checked to be one."""
    return protocol_result(result, "shift", ("model",))


def _models(ds: xr.Dataset) -> list[str]:
    return [str(m) for m in ds["model"].values]


def _at(ds: xr.Dataset, var: str, calibration: str) -> xr.DataArray | None:
    """``ds[var]`` at ``calibration`` (a variable without the calibration dim counts as
    un-scaled); None where the variable or that calibration is absent."""
    if var not in ds:
        return None
    da = ds[var]
    if "calibration" not in da.dims:
        return da if calibration == "none" else None
    if calibration not in ds["calibration"].values:
        return None
    return da.sel(calibration=calibration)


def _check_choice(name: str, value: str, known: Sequence[str]) -> None:
    if value not in known:
        raise InputError(f"{name} must be one of {list(known)}, got {value!r}")


def _check_calibrations(name: str, calibrations: Sequence[str]) -> tuple[str, ...]:
    calibrations = (calibrations,) if isinstance(calibrations, str) else tuple(calibrations)
    if not calibrations:
        raise InputError(f"{name} must name at least one calibration of {list(CALIBRATIONS)}, "
                         "got none")
    for c in calibrations:
        _check_choice(name, c, CALIBRATIONS)
    return calibrations


def _shift_dims(da: xr.DataArray, var: str) -> xr.DataArray:
    """``da`` (a metric at one calibration) as (model, corruption, severity)."""
    want = ("model", "corruption", "severity")
    if set(da.dims) != set(want):
        raise InputError(f"result variable {var!r} must have dims {list(want)} (beside "
                         f"calibration), got {list(da.dims)}")
    return da.transpose(*want)


def _corrupted(ds: xr.Dataset) -> bool:
    """Whether ``ds`` has corrupted members (a result of natural shift sets only has an empty
    corruption x severity grid)."""
    return all(ds.sizes.get(d, 0) > 0 for d in ("corruption", "severity"))


# ---------------------------------------------------------------------------------------------
# matplotlib


def _figure(nrows: int, ncols: int, *, panel: tuple[float, float]) -> tuple[Figure, np.ndarray]:
    """A Figure on an Agg canvas with ``nrows x ncols`` axes of ``panel`` inches each."""
    from uqmetrics.report.plotting import figure_grid  # matplotlib: imported on use

    return figure_grid(nrows, ncols, panel=panel)


def _colours(models: Sequence[str]) -> dict[str, tuple]:
    """A colour per model, no two alike: tab10, tab20, then past 20 models evenly spaced hues
    of ``turbo`` (a box and a point have only their colour to tell the models apart: shapes
    already mean severity, clean and natural sets)."""
    from matplotlib import colormaps  # heavy: imported on use

    if len(models) > 20:
        cmap = colormaps["turbo"]
        return {m: cmap(0.05 + 0.9 * i / (len(models) - 1)) for i, m in enumerate(models)}
    cmap = colormaps["tab10" if len(models) <= 10 else "tab20"]
    return {m: cmap(i % cmap.N) for i, m in enumerate(models)}


# ---------------------------------------------------------------------------------------------
# box plots


def _box_groups(ds: xr.Dataset, metric: str, calibration: str, model: str,
                severities: Sequence) -> list[np.ndarray]:
    """The values of one box series: ``[clean, severity 1, ...]``, each an (n,) array of the
    finite values (clean: n <= 1; a severity: n <= n_corruptions, over the corruptions)."""
    clean = _at(ds, f"clean_{metric}", calibration)
    groups = [np.atleast_1d(clean.sel(model=model).values.astype(float)) if clean is not None
              else np.empty(0)]
    shifted = _shift_dims(_at(ds, metric, calibration), metric).sel(model=model)
    groups += [shifted.sel(severity=s).values.astype(float) for s in severities]
    return [g[np.isfinite(g)] for g in groups]


def _series_label(ds: xr.Dataset, model: str, calibration: str, calibrations: Sequence[str]
                  ) -> str:
    label = model + (" + TS" if calibration == "temperature" and len(calibrations) > 1 else "")
    if calibration == "none" and "mean_corruption_error" in ds:
        mce = float(ds["mean_corruption_error"].sel(model=model))
        label += f" (mCE {mce:.3f})" if np.isfinite(mce) else ""  # 1.002, never "1"
    return label


def plot_shift_boxes(result: xr.Dataset | str | os.PathLike, *,
                     metrics: Sequence[str] = BOX_METRICS,
                     calibrations: Sequence[str] = CALIBRATIONS) -> Figure:
    """Box plots of metrics per shift intensity (Ovadia et al. 2019, Fig. 2).

    One panel per metric of ``metrics`` present in ``result``. The x axis has the groups
    ``clean``, then every severity of ``result`` (1..5 for ImageNet-C); in each group one box
    per series, side by side, the series being every (model, calibration) of ``models x
    calibrations`` (Ovadia's "Vanilla" and "Temp Scaling" are a model's ``none`` and
    ``temperature`` series: label ``MODEL + TS``, hatched). A severity's box is over the
    corruptions (their finite values: a missing member is left out); the clean box is the single
    ``clean_<metric>`` value (a line; no box where that variable is absent). With
    ``mean_corruption_error`` in ``result`` the legend gives each model's mCE.

    Parameters
    ----------
    result : xarray.Dataset or path
        A shift result: ``<metric>`` (model, corruption, severity, calibration), optionally
        ``clean_<metric>`` (model, calibration) and ``mean_corruption_error`` (model).
    metrics : sequence of str, default :data:`BOX_METRICS`
        The panels (metrics absent from ``result`` are skipped).
    calibrations : sequence of str, default ``("none", "temperature")``
        The calibrations drawn, each a series per model (those absent from ``result`` are
        skipped).

    Returns
    -------
    matplotlib.figure.Figure
        ``n_metrics x 1`` panels (one above the other); the median line of a box has gid
        ``median:<metric>:<calibration>:<model>:<group>`` (group ``clean`` or the severity),
        its box ``box:...`` alike.

    Raises
    ------
    uqmetrics.InputError
        No metric of ``metrics`` in ``result``, an unknown calibration.
    """
    ds = _result(result)
    calibrations = _check_calibrations("calibrations", calibrations)
    drawn = [m for m in metrics if m in ds]
    if not drawn:
        raise InputError(f"metrics {list(metrics)}: none is a variable of result (variables: "
                         f"{sorted(map(str, ds.data_vars))})")
    models = _models(ds)
    colours = _colours(models)
    severities = list(ds["severity"].values)
    groups = ["clean"] + [str(s) for s in severities]
    n_series = len(models) * len(calibrations)
    fig, axes = _figure(len(drawn), 1,
                        panel=(float(np.clip(0.22 * len(groups) * n_series, 5.0, 14.0)), 3.0))
    handles: dict[str, object] = {}  # legend label -> a box of the series
    for ax, metric in zip(axes[:, 0], drawn, strict=True):
        series = [(m, c) for m in models for c in calibrations
                  if _at(ds, metric, c) is not None]
        width = 0.8 / max(len(series), 1)
        for k, (model, cal) in enumerate(series):
            offset = (k - (len(series) - 1) / 2) * width
            values = _box_groups(ds, metric, cal, model, severities)
            keep = [g for g, v in enumerate(values) if v.size]
            if not keep:
                continue
            parts = ax.boxplot([values[g] for g in keep],
                               positions=[g + offset for g in keep],
                               widths=0.9 * width, patch_artist=True, manage_ticks=False,
                               showfliers=True, flierprops={"markersize": 2})
            for g, box, median in zip(keep, parts["boxes"], parts["medians"], strict=True):
                box.set(facecolor=colours[model], alpha=0.75, edgecolor="k", linewidth=0.6,
                        hatch="///" if cal == "temperature" else None,
                        gid=f"box:{metric}:{cal}:{model}:{groups[g]}")
                median.set(color="k", gid=f"median:{metric}:{cal}:{model}:{groups[g]}")
            handles.setdefault(_series_label(ds, model, cal, calibrations), parts["boxes"][0])
        ax.set_xticks(range(len(groups)), groups)
        ax.set(xlabel="shift intensity (severity)", ylabel=_LABELS.get(metric, metric),
               title=f"{_LABELS.get(metric, metric)} (a box: over the corruptions)")
        ax.set_xlim(-0.6, len(groups) - 0.4)
        ax.grid(axis="y", alpha=0.3)
    # a few series above the panels, where constrained layout keeps it clear of the first
    # title (to their right, a title wider than its panel ran under the legend); many beside
    if len(handles) <= 8:
        fig.legend(list(handles.values()), list(handles), fontsize=7, loc="outside upper center",
                   ncols=min(len(handles), 2))
    else:
        from uqmetrics.report.plotting import series_legend  # matplotlib: imported on use

        series_legend(fig, list(handles.values()), list(handles), fontsize=7)
    return fig


# ---------------------------------------------------------------------------------------------
# heat map


def plot_shift_heatmap(result: xr.Dataset | str | os.PathLike, *,
                       rows: Sequence[tuple[str, str]] = HEATMAP_ROWS) -> Figure:
    """Corruption x severity heat maps: one column per model, one row per (metric,
    calibration) of ``rows`` present in ``result``.

    Each cell is ``result[metric]`` at (model, corruption, severity, calibration), written in
    the cell; a missing member (NaN) is a blank (grey) cell without a number. A row's panels
    share one colour scale (its colour bar); a panel's title gives the model's clean value
    where ``clean_<metric>`` is present.

    Parameters
    ----------
    result : xarray.Dataset or path
        A shift result (:func:`plot_shift_boxes`).
    rows : sequence of (str, str), default :data:`HEATMAP_ROWS`
        (metric, calibration) pairs, e.g. ``(("accuracy", "none"), ("ece", "temperature"))``.

    Returns
    -------
    matplotlib.figure.Figure
        ``n_rows x n_models`` panels; the image of a panel has gid
        ``heatmap:<metric>:<calibration>:<model>`` and its array is (n_corruptions,
        n_severities), masked where NaN.

    Raises
    ------
    uqmetrics.InputError
        No pair of ``rows`` in ``result``, an unknown calibration.
    """
    import matplotlib as mpl  # heavy: imported on use

    ds = _result(result)
    for _, cal in rows:
        _check_choice("rows' calibration", cal, CALIBRATIONS)
    if not _corrupted(ds):
        raise InputError(f"result has no corrupted members (corruption x severity is "
                         f"{ds.sizes.get('corruption', 0)} x {ds.sizes.get('severity', 0)}): "
                         "no heat map to draw")
    drawn = [(m, c) for m, c in rows if _at(ds, m, c) is not None]
    if not drawn:
        raise InputError(f"rows {list(rows)}: none is in result (variables: "
                         f"{sorted(map(str, ds.data_vars))}, calibrations: "
                         f"{list(ds['calibration'].values) if 'calibration' in ds else []})")
    models = _models(ds)
    corruptions = [str(c) for c in ds["corruption"].values]
    severities = [str(s) for s in ds["severity"].values]
    fig, axes = _figure(len(drawn), len(models),
                        panel=(1.2 + 0.55 * len(severities), 1.2 + 0.3 * len(corruptions)))
    cmap = mpl.colormaps["viridis"].with_extremes(bad="lightgrey")
    for row, (metric, cal) in zip(axes, drawn, strict=True):
        values = _shift_dims(_at(ds, metric, cal), metric).values.astype(float)
        finite = values[np.isfinite(values)]
        lo, hi = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
        clean = _at(ds, f"clean_{metric}", cal)
        image = None
        for i, (ax, model) in enumerate(zip(row, models, strict=True)):
            cells = np.ma.masked_invalid(values[i])
            image = ax.imshow(cells, cmap=cmap, vmin=lo, vmax=hi if hi > lo else lo + 1e-12,
                              aspect="auto", interpolation="nearest")
            image.set_gid(f"heatmap:{metric}:{cal}:{model}")
            for (c, s), v in np.ndenumerate(values[i]):
                if np.isfinite(v):
                    ax.text(s, c, f"{v:.2f}", ha="center", va="center", fontsize=6,
                            color="w" if v < (lo + hi) / 2 else "k")
            ax.set_xticks(range(len(severities)), severities)
            ax.set_yticks(range(len(corruptions)), corruptions if i == 0 else [])
            title = f"{model}:\n{_LABELS.get(metric, metric)} ({_CALIBRATION_LABELS[cal]})"
            if clean is not None and np.isfinite(float(clean.sel(model=model))):
                title += f"\nclean {float(clean.sel(model=model)):.3f}"
            ax.set(xlabel="severity", title=title)
            ax.title.set_fontsize(7)
        fig.colorbar(image, ax=list(row), shrink=0.8, label=_LABELS.get(metric, metric))
    return fig


# ---------------------------------------------------------------------------------------------
# accuracy vs ECE


def _set_points(ds: xr.Dataset, cal: str, model: str) -> tuple[np.ndarray, list[str]]:
    """(n, 2) finite (accuracy, ECE) of ``model`` on the natural shift sets and their names;
    none where ``set_accuracy``/``set_ece`` are absent."""
    acc, ece = _at(ds, "set_accuracy", cal), _at(ds, "set_ece", cal)
    if acc is None or ece is None or "shift_set" not in acc.dims:
        return np.empty((0, 2)), []
    xy = np.stack([acc.sel(model=model).transpose("shift_set").values,
                   ece.sel(model=model).transpose("shift_set").values], axis=1).astype(float)
    ok = np.isfinite(xy).all(axis=1)
    return xy[ok], [str(s) for s in acc["shift_set"].values[ok]]


def plot_shift_acc_vs_ece(result: xr.Dataset | str | os.PathLike, *,
                          calibrations: Sequence[str] = CALIBRATIONS) -> Figure:
    """Accuracy against ECE under shift: one panel per calibration of ``calibrations`` present.

    One point per (corruption, severity) of each model where both are finite (a missing member
    is not drawn), coloured by model, its area growing with the severity; the model's clean
    (accuracy, ECE) a large star with a black edge (where ``clean_accuracy`` and ``clean_ece``
    are present); a natural shift set (``set_accuracy``, ``set_ece`` over ``shift_set``, where
    present) a diamond named by its set. On the temperature panel the legend gives each model's
    temperature where ``temperature`` is present.

    Parameters
    ----------
    result : xarray.Dataset or path
        A shift result with ``accuracy`` and ``ece`` (:func:`plot_shift_boxes`).
    calibrations : sequence of str, default ``("none", "temperature")``

    Returns
    -------
    matplotlib.figure.Figure
        ``1 x n_calibrations`` panels; the collections have gids ``shifted:<calibration>:
        <model>`` (offsets (n, 2): (accuracy, ECE) over (corruption, severity) in C order, the
        NaN pairs left out), ``clean:<calibration>:<model>`` and ``set:<calibration>:<model>``.

    Raises
    ------
    uqmetrics.InputError
        ``accuracy`` or ``ece`` absent, no calibration of ``calibrations`` in ``result``.
    """
    ds = _result(result)
    calibrations = _check_calibrations("calibrations", calibrations)
    for var in ("accuracy", "ece"):
        if var not in ds:
            raise InputError(f"result has no variable {var!r}: accuracy vs ECE needs accuracy "
                             "and ece")
    drawn = [c for c in calibrations
             if _at(ds, "accuracy", c) is not None and _at(ds, "ece", c) is not None]
    if not drawn:
        raise InputError(f"calibrations {list(calibrations)}: none is in result")
    from uqmetrics.report.plotting import label_points  # matplotlib: imported on use

    models = _models(ds)
    colours = _colours(models)
    severities = ds["severity"].values
    rank = np.argsort(np.argsort(severities))  # 0 for the mildest severity
    fig, axes = _figure(1, len(drawn), panel=(5.0, 4.2))
    for ax, cal in zip(axes[0], drawn, strict=True):
        acc = _shift_dims(_at(ds, "accuracy", cal), "accuracy").values.astype(float)
        ece = _shift_dims(_at(ds, "ece", cal), "ece").values.astype(float)
        size = np.broadcast_to(12.0 + 14.0 * rank, acc.shape[1:])
        clean_acc, clean_ece = _at(ds, "clean_accuracy", cal), _at(ds, "clean_ece", cal)
        set_points = []  # named once every point is drawn (label_points reads the limits)
        for i, model in enumerate(models):
            ok = np.isfinite(acc[i]) & np.isfinite(ece[i])
            label = model
            if cal == "temperature" and "temperature" in ds:
                label += f" (T={float(ds['temperature'].sel(model=model)):.2f})"
            points = ax.scatter(acc[i][ok], ece[i][ok], s=size[ok], color=colours[model],
                                alpha=0.7, edgecolors="none", label=label)
            points.set_gid(f"shifted:{cal}:{model}")
            if clean_acc is not None and clean_ece is not None:
                xy = np.array([float(clean_acc.sel(model=model)),
                               float(clean_ece.sel(model=model))])
                if np.isfinite(xy).all():
                    star = ax.scatter(xy[:1], xy[1:], s=180, marker="*", color=colours[model],
                                      edgecolors="k", linewidths=0.8, zorder=3)
                    star.set_gid(f"clean:{cal}:{model}")
            xy, names = _set_points(ds, cal, model)
            if names:
                sets = ax.scatter(xy[:, 0], xy[:, 1], s=60, marker="D", color=colours[model],
                                  edgecolors="k", linewidths=0.6, zorder=3)
                sets.set_gid(f"set:{cal}:{model}")
                set_points.append((xy, names))
        for xy, names in set_points:
            label_points(ax, xy[:, 0], xy[:, 1], names)
        _size_legend(ax, severities, rank, sets=any(_set_points(ds, cal, m)[1] for m in models))
        ax.set(xlabel="accuracy", ylabel="ECE",
               title=f"Accuracy vs ECE under shift ({_CALIBRATION_LABELS[cal]})")
        ax.grid(alpha=0.3)
    return fig


def _size_legend(ax: Axes, severities: np.ndarray, rank: np.ndarray, *, sets: bool) -> None:
    """The models' legend (the axes' labelled artists) and the markers' key: area by
    severity, star = clean, diamond = natural shift set."""
    from matplotlib.lines import Line2D  # heavy: imported on use
    from uqmetrics.report.plotting import series_legend

    handles, _ = ax.get_legend_handles_labels()
    key = [Line2D([], [], ls="", marker="o", color="grey", markersize=np.sqrt(12.0 + 14.0 * r),
                  label=f"severity {s}") for s, r in zip(severities, rank, strict=True)]
    key.append(Line2D([], [], ls="", marker="*", color="grey", markeredgecolor="k",
                      markersize=10, label="clean"))
    if sets:
        key.append(Line2D([], [], ls="", marker="D", color="grey", markeredgecolor="k",
                          markersize=6, label="natural shift set"))
    series_legend(ax, handles + key, [h.get_label() for h in handles + key], fontsize=6, loc="best",
                  widen=True)


# ---------------------------------------------------------------------------------------------
# all of them


def _figures(ds: xr.Dataset) -> list[tuple[str, Callable[[], Figure]]]:
    """The figures ``ds`` allows: (file name, make) pairs (:func:`draw_figures`)."""
    figures: list[tuple[str, Callable[[], Figure]]] = []
    if _corrupted(ds) and any(m in ds for m in BOX_METRICS):
        figures.append(("shift_boxes.png", lambda: plot_shift_boxes(ds)))
    if _corrupted(ds) and any(_at(ds, m, c) is not None for m, c in HEATMAP_ROWS):
        figures.append(("shift_heatmap.png", lambda: plot_shift_heatmap(ds)))
    if "accuracy" in ds and "ece" in ds:
        figures.append(("shift_acc_vs_ece.png", lambda: plot_shift_acc_vs_ece(ds)))
    return figures


def draw_figures(result: xr.Dataset | str | os.PathLike,
                 out_dir: str | os.PathLike) -> list[Path]:
    """The shift protocol's figures into ``out_dir`` (``uqvision plot --shift FILE``).

    - ``shift_boxes.png``: :func:`plot_shift_boxes` of accuracy, ECE and Brier, un-scaled and
      temperature-scaled series side by side;
    - ``shift_heatmap.png``: :func:`plot_shift_heatmap` of accuracy, un-scaled ECE and
      temperature-scaled ECE;
    - ``shift_acc_vs_ece.png``: :func:`plot_shift_acc_vs_ece`, un-scaled and temperature-scaled
      panels.

    A figure whose variables are all absent from ``result`` is skipped, and so are the boxes
    and the heat map of a result without corrupted members (natural shift sets only: the
    scatter still shows the clean points and the sets).

    Parameters and returns: as :func:`~uqvision.protocols.base.draw_protocol_figures`
    (``result``: a shift result, ``shift.nc``).
    """
    return draw_protocol_figures(result, out_dir, _result, _figures)
