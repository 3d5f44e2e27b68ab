"""Figures of the OOD-detection protocol (OpenOOD v1.5; docs/conventions.md#v-6) from an ``ood``
result (:func:`~.score.score_ood`, ``ood.nc``).

- :func:`plot_ood_bars`: per detector, the near and far means of AUROC and FPR@95TPR of one
  predictor (bars side by side);
- :func:`plot_ood_heatmap`: detector x model heat map of a split's mean AUROC;
- :func:`plot_ood_histograms`: the ID and OOD score histograms of one (model, detector), from
  the per-image ``u`` a result keeps (``keep_scores``);
- :func:`plot_ood_cost`: AUROC against forward passes per image, UQ measures (member
  detectors) and post-hoc detectors marked apart;
- :func:`draw_figures`: all of them into a folder (``uqvision plot --ood FILE``).

Every figure is a :class:`matplotlib.figure.Figure` on an Agg canvas (matplotlib imported on
first use). Drawn artists carry a ``gid`` naming what they show (``bar:<metric>:<split>:
<detector>``, ``heatmap:<split>``, ``hist:<set>``, ``cost:<model>:<detector>``), so tests can
read the drawn numbers back. NaN values are not drawn.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import xarray as xr
from uqmetrics import InputError

from ..base import draw_protocol_figures, protocol_result
from .score import MEMBER_DETECTORS, OOD_SPLITS

if TYPE_CHECKING:  # matplotlib is imported on first use
    from matplotlib.figure import Figure

__all__ = ["draw_figures", "plot_ood_bars", "plot_ood_cost", "plot_ood_heatmap",
           "plot_ood_histograms"]

_LABELS = {"auroc": "AUROC", "fpr_at_95_tpr": "FPR@95TPR", "aupr_in": "AUPR-In",
           "aupr_out": "AUPR-Out"}


def _result(result: xr.Dataset | str | os.PathLike) -> xr.Dataset:
    """The ood result ``result`` (a Dataset or a ``ood.nc``), checked to be one."""
    return protocol_result(result, "ood", ("model", "detector"))


def _figure(nrows: int, ncols: int, *, panel: tuple[float, float]) -> tuple[Figure, np.ndarray]:
    """A Figure on an Agg canvas with ``nrows x ncols`` axes of ``panel`` inches each."""
    from uqmetrics.report.plotting import figure_grid  # matplotlib: imported on use

    return figure_grid(nrows, ncols, panel=panel)


def _model(ds: xr.Dataset, model: str | None) -> str:
    models = [str(m) for m in ds["model"].values]
    if model is None:
        return models[0]
    if model not in models:
        raise InputError(f"model {model!r} is not a row of the result; rows: {models}")
    return model


def plot_ood_bars(result: xr.Dataset | str | os.PathLike, *, model: str | None = None,
                  metrics: tuple[str, ...] = ("auroc", "fpr_at_95_tpr")) -> Figure:
    """Per detector, the near and far means of each metric of ``model`` (default the first
    row), one panel per metric.

    Raises
    ------
    uqmetrics.InputError
        Not an ood result, an unknown model, a metric without ``near_``/``far_`` variables.
    """
    ds = _result(result)
    model = _model(ds, model)
    dets = [str(d) for d in ds["detector"].values]
    fig, axes = _figure(1, len(metrics), panel=(max(3.0, 0.5 * len(dets) + 1.5), 3.0))
    x = np.arange(len(dets))
    for ax, metric in zip(axes[0], metrics, strict=True):
        if f"near_{metric}" not in ds:
            raise InputError(f"result has no near_{metric}: metrics {list(_LABELS)}")
        for j, split in enumerate(OOD_SPLITS):
            vals = ds[f"{split}_{metric}"].sel(model=model).values
            if np.isnan(vals).all():  # no set of this split scored: no bars, no legend entry
                continue
            bars = ax.bar(x + (j - 0.5) * 0.4, np.nan_to_num(vals, nan=0.0), 0.4,
                          label=f"{split}-OOD")
            for b, d, v in zip(bars, dets, vals, strict=True):
                b.set_gid(f"bar:{metric}:{split}:{d}")
                b.set_visible(not np.isnan(v))
        ax.set_xticks(x, dets, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel(_LABELS.get(metric, metric))
        ax.set_title(f"{model}", fontsize=8)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return fig


def plot_ood_heatmap(result: xr.Dataset | str | os.PathLike, *,
                     splits: tuple[str, ...] = OOD_SPLITS) -> Figure:
    """Detector x model heat maps of the mean AUROC, one panel per split (NaN blank)."""
    ds = _result(result)
    models = [str(m) for m in ds["model"].values]
    dets = [str(d) for d in ds["detector"].values]
    fig, axes = _figure(1, len(splits), panel=(0.7 * len(models) + 2.5, 0.35 * len(dets) + 1.5))
    for ax, split in zip(axes[0], splits, strict=True):
        vals = ds[f"{split}_auroc"].transpose("detector", "model").values
        im = ax.imshow(np.ma.masked_invalid(vals), vmin=0.5, vmax=1.0, cmap="viridis",
                       aspect="auto")
        im.set_gid(f"heatmap:{split}")
        ax.set_xticks(np.arange(len(models)), models, rotation=45, ha="right", fontsize=6)
        ax.set_yticks(np.arange(len(dets)), dets, fontsize=7)
        ax.set_title(f"{split}-OOD AUROC", fontsize=9)
        for (i, j), v in np.ndenumerate(vals):
            if not np.isnan(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6,
                        color="k" if v > 0.8 else "w")  # dark on the light end of viridis
        fig.colorbar(im, ax=ax)
    return fig


def plot_ood_histograms(result: xr.Dataset | str | os.PathLike, *, model: str | None = None,
                        detector: str = "msp", bins: int = 30) -> Figure:
    """Histograms of ``u`` of the ID test images and of each OOD set for one (model,
    detector), from a result with ``u_id`` and ``u_ood`` (``keep_scores``).

    Raises
    ------
    uqmetrics.InputError
        A result without per-image scores, an unknown model or detector.
    """
    ds = _result(result)
    if "u_id" not in ds or "u_ood" not in ds:
        raise InputError("result keeps no per-image scores: score with keep_scores "
                         "(uqvision score ood --keep-scores)")
    model = _model(ds, model)
    if detector not in ds["detector"].values:
        raise InputError(f"detector {detector!r} is not in the result: "
                         f"{[str(d) for d in ds['detector'].values]}")
    u_id = ds["u_id"].sel(model=model, detector=detector).values
    u_ood = ds["u_ood"].sel(model=model, detector=detector).values
    sets = np.asarray(ds["ood_sample_set"].values).astype(str)
    fig, axes = _figure(1, 1, panel=(5.0, 3.2))
    ax = axes[0, 0]
    finite = np.concatenate([u_id, u_ood])
    finite = finite[np.isfinite(finite)]
    edges = np.histogram_bin_edges(finite if finite.size else [0.0, 1.0], bins=bins)
    groups = [("ID test", u_id)] + [(str(s), u_ood[sets == s]) for s in dict.fromkeys(sets)]
    for name, u in groups:
        u = u[np.isfinite(u)]
        if u.size:
            _, _, patches = ax.hist(u, bins=edges, density=True, histtype="step",
                                    label=name, linewidth=1.2)
            for p in patches:
                p.set_gid(f"hist:{name}")
    ax.set_xlabel(f"u ({detector}; higher = more likely OOD)")
    ax.set_ylabel("density")
    ax.set_title(model, fontsize=8)
    ax.legend(fontsize=7)
    return fig


def plot_ood_cost(result: xr.Dataset | str | os.PathLike, *, split: str = "far") -> Figure:
    """AUROC (mean over a split's sets) against forward passes per image: one point per
    (model, detector), circles for post-hoc detectors, triangles for the UQ measures of
    several members (:data:`~.score.MEMBER_DETECTORS`); a colour per detector (hollow markers
    past the colour map's 20), the legend beside the panel."""
    from uqmetrics.report.plotting import distinct_styles, series_legend  # matplotlib: on use

    ds = _result(result)
    if "forward_passes" not in ds:
        raise InputError("result has no forward_passes (cost accounting): rescore it")
    fig, axes = _figure(1, 1, panel=(5.0, 3.5))
    ax = axes[0, 0]
    passes = ds["forward_passes"].values.astype(float)
    dets = [str(x) for x in ds["detector"].values]
    styles = distinct_styles(dets)
    for j, d in enumerate(dets):
        vals = ds[f"{split}_auroc"].isel(detector=j).values
        ok = ~np.isnan(vals)
        if not ok.any():
            continue
        marker = "^" if d in MEMBER_DETECTORS else "o"
        colour = styles[d]["color"]
        # the marker's shape says UQ measure or detector: past the colour map's colours
        # (another marker from distinct_styles), the points are hollow instead
        hollow = styles[d]["marker"] != styles[dets[0]]["marker"]
        pts = ax.scatter(passes[ok], vals[ok], marker=marker, label=d, alpha=0.8,
                         facecolors="none" if hollow else colour, edgecolors=colour)
        pts.set_gid(f"cost:{split}:{d}")
    ax.set_xscale("log")
    ax.set_xlabel("forward passes per image")
    ax.set_ylabel(f"{split}-OOD AUROC")
    ax.set_title("UQ measures (triangles) vs post-hoc detectors (circles)", fontsize=8)
    if ax.collections:  # beside the axes: inside, it hid points of the ensembles' column;
        # in columns that fit the figure's height, the figure widened so the title still fits
        series_legend(fig, fontsize=6, widen=True)
    else:  # a result without sets of this split (e.g. far-OOD sets only)
        ax.text(0.5, 0.5, f"no {split}-OOD set scored", ha="center", va="center",
                transform=ax.transAxes)
    return fig


def _scored_splits(ds: xr.Dataset) -> tuple[str, ...]:
    """The splits of :data:`~.score.OOD_SPLITS` with a set scored (a mean AUROC known)."""
    return tuple(s for s in OOD_SPLITS
                 if f"{s}_auroc" in ds and not np.isnan(ds[f"{s}_auroc"].values).all())


def _figures(ds: xr.Dataset) -> list[tuple[str, Callable[[], Figure]]]:
    """The figures ``ds`` allows: (file name, make) pairs (:func:`draw_figures`). A figure of
    a split without a set scored (a result of far-OOD sets only) is left out, and said
    (:func:`uqvision.plots.figure_skipped`)."""
    from ...plots import figure_skipped

    figures: list[tuple[str, Callable[[], Figure]]] = []
    splits = _scored_splits(ds)
    metrics = tuple(m for m in ("auroc", "fpr_at_95_tpr") if f"near_{m}" in ds)
    if metrics and splits:
        figures.append(("ood_bars.png", lambda: plot_ood_bars(ds, metrics=metrics)))
    if "near_auroc" in ds and splits:
        figures.append(("ood_heatmap.png", lambda: plot_ood_heatmap(ds, splits=splits)))
    if "u_id" in ds and "msp" in ds["detector"].values:
        figures.append(("ood_histograms.png", lambda: plot_ood_histograms(ds)))
    if "near_auroc" in ds and "forward_passes" in ds:
        for split in OOD_SPLITS:
            if split in splits:
                figures.append((f"ood_cost_{split}.png",
                                lambda split=split: plot_ood_cost(ds, split=split)))
            else:
                figure_skipped(f"ood_cost_{split}.png", f"no {split}-OOD set scored")
    if "near_auroc" in ds and not splits:
        figure_skipped("ood_bars.png, ood_heatmap.png", "no OOD set scored")
    return figures


def draw_figures(result: xr.Dataset | str | os.PathLike,
                 out_dir: str | os.PathLike) -> list[Path]:
    """The OOD protocol's figures into ``out_dir`` (``uqvision plot --ood FILE``).

    - ``ood_bars.png``: :func:`plot_ood_bars` of the first single model (AUROC, FPR@95TPR);
    - ``ood_heatmap.png``: :func:`plot_ood_heatmap`, near and far;
    - ``ood_histograms.png``: :func:`plot_ood_histograms` of that model and ``msp`` (with
      per-image scores only);
    - ``ood_cost_<split>.png``: :func:`plot_ood_cost`, near and far.

    A split without a set scored has no figure, bars or heat-map panel (said in one line
    through :func:`uqvision.plots.skipped_figures`).

    Parameters and returns: as :func:`~uqvision.protocols.base.draw_protocol_figures`
    (``result``: an ood result, ``ood.nc``).
    """
    return draw_protocol_figures(result, out_dir, _result, _figures)
