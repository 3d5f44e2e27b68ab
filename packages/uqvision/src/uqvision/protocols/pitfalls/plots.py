"""Figures of the Pitfalls protocol (V.2) from an ensembles score file: every ensemble metric vs
ensemble size, one line per method (the deep ensemble among them), mean ± std over member
orders; and the DEE of every method vs its number of samples."""

from __future__ import annotations

import os
from pathlib import Path

import xarray as xr
from uqmetrics import read_dataset
from uqmetrics.report.plotting import distinct_styles, plot_metric_vs_size, save_figure

__all__ = ["ENSEMBLE_PLOT_METRICS", "ensemble_figure", "plot_ensembles", "series_styles"]


#: Variables of an ensembles score file drawn against ensemble size.
ENSEMBLE_PLOT_METRICS = ("cll", "nll", "accuracy", "ece", "brier", "auroc", "aurc")

_TTA = "_tta"


def _tta_family(name: str) -> tuple[str, int]:
    """``NAME`` and ``NAME_tta``: one family (one colour), variant 1 (dashed) under TTA."""
    base = name.removesuffix(_TTA) or name
    return base, int(base != name)


def series_styles(names: list[str]) -> dict[str, dict[str, str]]:
    """A distinct ``{color, linestyle, marker}`` per series of ``names``: one colour per
    method (``NAME`` and ``NAME_tta`` share it), solid plain and dashed under TTA, other
    markers past the colour map's colours (:func:`uqmetrics.report.plotting.distinct_styles`:
    no two series alike)."""
    return distinct_styles(names, family=_tta_family)


def ensemble_figure(ds: xr.Dataset, var: str):
    """The Figure of variable ``var`` (a metric, or ``dee``) of an ensembles score file vs
    ensemble size: one line per method, each distinguishable (:func:`series_styles`)."""
    styles = series_styles([str(m) for m in ds[var]["method"].values]) \
        if "method" in ds[var].dims else None
    if var == "dee":
        return plot_metric_vs_size(ds["dee"], styles=styles, ylabel="deep ensemble equivalent",
                                   title="DEE vs number of samples")
    # the reference on a line of its own: on one, the title ran past a 5-inch figure's edges
    return plot_metric_vs_size(ds[var], styles=styles, ylabel=var,
                               title=f"{var} vs ensemble size\n"
                                     f"(reference: {ds.attrs.get('reference', '')})")


def plot_ensembles(scores: str | os.PathLike | xr.Dataset, out_dir: str | os.PathLike) -> list[Path]:
    """Each metric of an ensembles score file vs ensemble size, and DEE vs size."""
    ds = read_dataset(scores) if not isinstance(scores, xr.Dataset) else scores
    out = []
    for var in (*ENSEMBLE_PLOT_METRICS, "dee"):
        if var in ds:
            out.append(save_figure(ensemble_figure(ds, var), Path(out_dir) / f"ensemble_{var}.png"))
    return out
