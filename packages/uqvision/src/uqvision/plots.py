"""Figures from prediction caches, for any protocol (drawn by ``uqmetrics.report.plotting``).

- one reliability diagram per model (plain cache, softmax probabilities);
- risk–coverage curves of all models (softmax response) in one figure.

The protocols draw their own figures: :mod:`uqvision.protocols.pitfalls.plots` (metrics
and DEE vs ensemble size) and :mod:`uqvision.protocols.selective.plots` (the Selective paper's
figures).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from uqmetrics import risk_coverage_curve, softmax, softmax_response
from uqmetrics.report.plotting import (
    plot_reliability_diagram,
    plot_risk_coverage,
    save_figure,
)
from uqmetrics.runs.io import safe_name

from .cache import index_caches, read_cache, select_dataset

__all__ = ["figure_skipped", "plot_caches", "skipped_figures"]

#: Where :func:`figure_skipped` says a figure was left out (:func:`skipped_figures`).
_SKIPPED: ContextVar[Callable[[str], None] | None] = ContextVar("uqvision_skipped_figures",
                                                                default=None)


@contextmanager
def skipped_figures(say: Callable[[str], None]) -> Iterator[None]:
    """Within the block, each figure a drawing function leaves out because the result holds
    no data for it (:func:`figure_skipped`) is said in one line through ``say`` (``uqvision
    plot`` prints it; outside such a block the figure is left out silently)."""
    token = _SKIPPED.set(say)
    try:
        yield
    finally:
        _SKIPPED.reset(token)


def figure_skipped(name: str, why: str) -> None:
    """A figure ``name`` not drawn because ``why`` (e.g. ``no near-OOD set scored``): said in
    one line (``ood_cost_near.png: not drawn (no near-OOD set scored)``) through the
    :func:`skipped_figures` block around the call, if any."""
    say = _SKIPPED.get()
    if say is not None:
        say(f"{name}: not drawn ({why})")


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
