"""Figures from prediction caches, for any protocol (drawn by ``uqmetrics.report.plotting``).

- one reliability diagram per model (plain cache, softmax probabilities);
- risk–coverage curves of all models (softmax response) in one figure.

The protocols draw their own figures: :mod:`uqvision.protocols.pitfalls.plots` (metrics
and DEE vs ensemble size) and :mod:`uqvision.protocols.selective.plots` (the Selective paper's
figures).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from uqmetrics import risk_coverage_curve, softmax, softmax_response
from uqmetrics.report.plotting import (
    plot_reliability_diagram,
    plot_risk_coverage,
    save_figure,
)

from .cache import index_caches, read_cache, safe_name, select_dataset

__all__ = ["plot_caches"]


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
