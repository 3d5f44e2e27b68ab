"""The disentanglement protocol's figures (``uqvision plot --disentangle FILE``): untangle's
estimator x task heat map (Mucsányi, Kirchhof & Oh 2024) and each estimate against the true
label entropy of the test images."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..base import draw_protocol_figures
from .score import TASKS, read_scores

__all__ = ["draw_figures"]


def _heatmap(ds: Any):
    import matplotlib.pyplot as plt

    names = [str(e) for e in ds["estimator"].values]
    tasks = [v for v, _ in TASKS if v in ds]
    values = np.array([[np.nanmean(ds[v].sel(estimator=e).values)
                        if np.isfinite(ds[v].sel(estimator=e).values).any() else np.nan
                        for v in tasks] for e in names])
    fig, ax = plt.subplots(figsize=(1.2 * len(tasks) + 3, 0.45 * len(names) + 1.5))
    im = ax.imshow(values, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(tasks)), tasks, rotation=30, ha="right")
    ax.set_yticks(range(len(names)),
                  [f"{e} ({ds['estimates'].sel(estimator=e).item()})" for e in names])
    for i in range(len(names)):
        for j in range(len(tasks)):
            if np.isfinite(values[i, j]):
                ax.text(j, i, f"{values[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="w")
    fig.colorbar(im, ax=ax)
    ax.set_title("estimator x task (mean over the predictors that have the estimate)")
    fig.tight_layout()
    return fig


def _scatter(ds: Any):
    import matplotlib.pyplot as plt

    members = ds["members"].values
    model = str(ds["model"].values[int(np.argmax(members))])
    names = [str(e) for e in ds["estimator"].values
             if np.isfinite(ds["estimate"].sel(model=model, estimator=e).values).any()]
    h = ds["true_entropy"].values
    cols = min(4, max(1, len(names)))
    rows = max(1, -(-len(names) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 2.8 * rows), squeeze=False)
    for ax in axes.ravel()[len(names):]:
        ax.set_axis_off()
    for ax, e in zip(axes.ravel(), names, strict=False):
        u = ds["estimate"].sel(model=model, estimator=e).values
        if np.isfinite(h).any():
            ax.scatter(h, u, s=6, alpha=0.6)
        rho = ds["aleatoric_spearman"].sel(model=model, estimator=e).item()
        # rho on a line of its own: beside a long estimator's name it ran past the panel
        ax.set(title=f"{e}\n(rho {rho:.2f})", xlabel="true label entropy", ylabel="estimate")
    fig.suptitle(f"estimates of {model} against the truth")
    fig.tight_layout()
    return fig


def draw_figures(result: Any, out_dir: str | os.PathLike) -> list[Path]:
    """``estimator_task_heatmap.png`` and ``estimates_vs_truth.png`` into ``out_dir``."""
    return draw_protocol_figures(result, out_dir, read_scores, lambda ds: [
        ("estimator_task_heatmap.png", lambda: _heatmap(ds)),
        ("estimates_vs_truth.png", lambda: _scatter(ds))])
