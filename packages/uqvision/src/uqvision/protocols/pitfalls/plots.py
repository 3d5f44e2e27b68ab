"""Figures of the Pitfalls protocol (V.2) from an ensembles score file: every ensemble metric vs
ensemble size, one line per method (the deep ensemble among them), mean ± std over member
orders; and the DEE of every method vs its number of samples."""

from __future__ import annotations

import os
from pathlib import Path

import xarray as xr
from uqmetrics import read_dataset
from uqmetrics.report.plotting import plot_metric_vs_size, save_figure

__all__ = ["ENSEMBLE_PLOT_METRICS", "ensemble_figure", "plot_ensembles", "series_styles"]


#: Variables of an ensembles score file drawn against ensemble size.
ENSEMBLE_PLOT_METRICS = ("cll", "nll", "accuracy", "ece", "brier", "auroc", "aurc")

_TTA = "_tta"
#: Markers (plain, under TTA) of each cycle of colours (more methods than colours).
_MARKERS = (("o", "s"), ("D", "v"), ("P", "X"), ("*", "^"))


def series_styles(names: list[str]) -> dict[str, dict[str, str]]:
    """A distinct ``{color, linestyle, marker}`` per series of ``names``: one colour per
    method (``NAME`` and ``NAME_tta`` share it), solid with circles plain and dashed with
    squares under TTA; tab10, or tab20 past 10 methods, then other markers per further cycle
    of colours. No two series share all three (up to 80 methods)."""
    from matplotlib import colormaps  # figures: imported on use

    bases = list(dict.fromkeys(n.removesuffix(_TTA) or n for n in names))
    cmap = colormaps["tab10" if len(bases) <= 10 else "tab20"]
    styles = {}
    for name in names:
        base = name.removesuffix(_TTA) or name
        tta = base != name
        i = bases.index(base)
        styles[name] = {"color": _hex(cmap(i % cmap.N)), "linestyle": "--" if tta else "-",
                        "marker": _MARKERS[(i // cmap.N) % len(_MARKERS)][tta]}
    return styles


def _hex(rgba) -> str:
    from matplotlib.colors import to_hex

    return to_hex(rgba)


def _restyle(fig, names: list[str]) -> None:
    """The lines (and their ± std bands) of :func:`~uqmetrics.report.plotting.
    plot_metric_vs_size` given the styles of :func:`series_styles`; the legend redrawn."""
    ax = fig.axes[0]
    styles = series_styles(names)
    bands = list(ax.collections)
    for k, (line, name) in enumerate(zip(ax.lines, names, strict=True)):
        style = styles[name]
        line.set(color=style["color"], linestyle=style["linestyle"], marker=style["marker"])
        if len(bands) == len(names):
            bands[k].set_color(style["color"])
    if ax.get_legend() is not None:
        ax.legend(fontsize="x-small", ncol=2 if len(names) > 8 else 1)


def ensemble_figure(ds: xr.Dataset, var: str):
    """The Figure of variable ``var`` (a metric, or ``dee``) of an ensembles score file vs
    ensemble size: one line per method, each distinguishable (:func:`series_styles`)."""
    if var == "dee":
        fig = plot_metric_vs_size(ds["dee"], ylabel="deep ensemble equivalent",
                                  title="DEE vs number of samples")
    else:
        fig = plot_metric_vs_size(ds[var], ylabel=var,
                                  title=f"{var} vs ensemble size "
                                        f"(reference: {ds.attrs.get('reference', '')})")
    if "method" in ds[var].dims:
        _restyle(fig, [str(m) for m in ds[var]["method"].values])
    return fig


def plot_ensembles(scores: str | os.PathLike | xr.Dataset, out_dir: str | os.PathLike) -> list[Path]:
    """Each metric of an ensembles score file vs ensemble size, and DEE vs size."""
    ds = read_dataset(scores) if not isinstance(scores, xr.Dataset) else scores
    out = []
    for var in (*ENSEMBLE_PLOT_METRICS, "dee"):
        if var in ds:
            out.append(save_figure(ensemble_figure(ds, var), Path(out_dir) / f"ensemble_{var}.png"))
    return out
