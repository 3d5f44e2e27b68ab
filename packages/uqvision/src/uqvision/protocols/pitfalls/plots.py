"""Figures of the Pitfalls protocol (V.2) from an ensembles score file: every ensemble metric vs
ensemble size, one line per method (the deep ensemble among them), mean ± std over member
orders; and the DEE of every method vs its number of samples."""

from __future__ import annotations

import os
from pathlib import Path

import xarray as xr
from uqmetrics import read_dataset
from uqmetrics.report.plotting import plot_metric_vs_size, save_figure

__all__ = ["ENSEMBLE_PLOT_METRICS", "plot_ensembles"]


#: Variables of an ensembles score file drawn against ensemble size.
ENSEMBLE_PLOT_METRICS = ("cll", "nll", "accuracy", "ece", "brier", "auroc", "aurc")


def plot_ensembles(scores: str | os.PathLike | xr.Dataset, out_dir: str | os.PathLike) -> list[Path]:
    """Each metric of an ensembles score file vs ensemble size, and DEE vs size."""
    ds = read_dataset(scores) if not isinstance(scores, xr.Dataset) else scores
    out = []
    for var in ENSEMBLE_PLOT_METRICS:
        if var in ds:
            fig = plot_metric_vs_size(ds[var], ylabel=var,
                                      title=f"{var} vs ensemble size "
                                            f"(reference: {ds.attrs.get('reference', '')})")
            out.append(save_figure(fig, Path(out_dir) / f"ensemble_{var}.png"))
    if "dee" in ds:
        fig = plot_metric_vs_size(ds["dee"], ylabel="deep ensemble equivalent",
                                  title="DEE vs number of samples")
        out.append(save_figure(fig, Path(out_dir) / "ensemble_dee.png"))
    return out
