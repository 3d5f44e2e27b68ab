"""Figures from caches and score files (drawn by ``uqmetrics.plotting``).

- one reliability diagram per model (plain cache, softmax probabilities);
- risk–coverage curves of all models (softmax response) in one figure;
- every ensemble metric vs ensemble size, one line per method (the deep ensemble among them),
  mean ± std over member orders; and the DEE of every method vs its number of samples.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import xarray as xr
from uqmetrics import read_dataset, risk_coverage_curve, softmax, softmax_response
from uqmetrics.plotting import (
    plot_metric_vs_size,
    plot_reliability_diagram,
    plot_risk_coverage,
    save_figure,
)

from .cache import index_caches, read_cache, safe_name, select_dataset

__all__ = ["ENSEMBLE_PLOT_METRICS", "plot_caches", "plot_ensembles"]

#: Variables of an ensembles score file drawn against ensemble size.
ENSEMBLE_PLOT_METRICS = ("cll", "nll", "accuracy", "ece", "brier", "auroc", "aurc")


def plot_caches(caches: Iterable[str | os.PathLike], out_dir: str | os.PathLike, *,
                dataset: str | None = None, n_bins: int = 15) -> list[Path]:
    """Reliability diagrams (one per model) and one risk–coverage figure from plain caches."""
    infos = [i for i in select_dataset(index_caches(caches), dataset) if i.mode == "plain"]
    out, curves = [], {}
    for info in sorted(infos, key=lambda i: i.model):
        ds = read_cache(info.path)
        y, p = ds["label"].values, softmax(ds["logits"].values)
        fig = plot_reliability_diagram((y, p), n_bins=n_bins, title=f"{info.model}")
        out.append(save_figure(fig, Path(out_dir) / f"reliability_{safe_name(info.model)}.png"))
        curves[info.model] = risk_coverage_curve(p.argmax(1) == y, softmax_response(p))
    if curves:
        fig = plot_risk_coverage(curves, title="Risk-coverage (softmax response)")
        out.append(save_figure(fig, Path(out_dir) / "risk_coverage.png"))
    return out


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
