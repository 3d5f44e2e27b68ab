"""The figures of a sweep beside the Selective paper's (:func:`sweep_figures`): AURC vs accuracy
and the risk-coverage curves of its plain caches.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import xarray as xr

__all__ = ["RISK_COVERAGE_MAX_MODELS", "sweep_figures"]


#: The risk-coverage figure of a sweep draws one curve per model up to this many models
#: (:func:`sweep_figures`; more would be unreadable, and each curve reads a whole cache).
RISK_COVERAGE_MAX_MODELS = 30


def sweep_figures(scores: xr.Dataset, caches: Iterable[str | os.PathLike],
                  out_dir: str | os.PathLike, *,
                  max_curves: int = RISK_COVERAGE_MAX_MODELS) -> list[Path]:
    """The figures of a sweep beside the Selective paper's (which ``uqvision sweep`` draws with
    :func:`uqvision.protocols.selective.plots.plot_selective`): AURC vs accuracy (one point per
    row of the score file, by row kind) and the risk–coverage curves of the plain caches among
    ``caches`` (softmax response), drawn when they are of at most ``max_curves`` models.

    Parameters
    ----------
    scores : xarray.Dataset
        A selective score file (:func:`~uqvision.protocols.selective.score.score_selective`).
    caches : iterable of path
        The sweep's caches (files or folders).
    out_dir : path
        Where the PNG files go (created).
    max_curves : int, default :data:`RISK_COVERAGE_MAX_MODELS`

    Returns
    -------
    list of pathlib.Path
    """
    import matplotlib.pyplot as plt  # figures: imported on use (start-up time)
    from uqmetrics import risk_coverage_curve, softmax, softmax_response
    from uqmetrics.plotting import plot_risk_coverage, save_figure

    from ..cache import index_caches, read_cache

    out_dir = Path(out_dir)
    paths = []
    n = scores.sizes["model"]
    kinds = (scores["method"].values.astype(str) if "method" in scores.coords
             else np.full(n, "softmax"))
    accuracy = 100 * scores["accuracy"].sel(calibration="none").values
    aurc = scores["aurc"].sel(calibration="none").values
    fig, ax = plt.subplots(figsize=(6.5, 5))
    for kind in sorted(set(kinds)):
        sel = kinds == kind
        ax.scatter(accuracy[sel], aurc[sel], s=24, alpha=0.8, label=kind)
    if n <= 40:
        for name, x, y in zip(scores["model"].values.astype(str), accuracy, aurc, strict=True):
            ax.annotate(name, (x, y), fontsize=5, xytext=(2, 2), textcoords="offset points")
    ax.set(xlabel="top-1 accuracy (%)", ylabel="AURC (lower is better)",
           title=f"AURC vs accuracy ({scores.attrs.get('dataset_name', '')}, no calibration)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(save_figure(fig, out_dir / "selective_aurc_vs_accuracy.png"))
    plt.close(fig)
    infos = [i for i in index_caches(caches) if i.mode == "plain"]
    if 0 < len({i.model for i in infos}) <= max_curves:
        curves = {}
        for info in sorted(infos, key=lambda i: i.model):
            ds = read_cache(info.path)
            p, y = softmax(ds["logits"].values), ds["label"].values
            curves[info.model] = risk_coverage_curve(p.argmax(1) == y, softmax_response(p))
        fig = plot_risk_coverage(curves, title="Risk-coverage (softmax response)")
        paths.append(save_figure(fig, out_dir / "risk_coverage.png"))
        plt.close(fig)
    return paths
