"""The Selective paper's figures (V.1) from a selective score file (:func:`plot_selective`, the
numbers from :mod:`uqvision.protocols.selective.analysis`): AUROC vs -log ECE per model without
and with temperature scaling (Figures 1, 8, 13; marker area ~ log parameters, distilled models
ringed, teachers marked), the improvement of every paired comparison by technique (Figure 4),
the change of AUROC and ECE under temperature scaling vs the fitted T (Figures 6, 14), SAC@95 vs
accuracy (Figure 7) and AUROC vs parameters (Figure 9); and AURC vs accuracy and the
risk–coverage curves (softmax response) of the single models whose plain caches the file names
(attr ``caches``), where those caches are still on disk."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import xarray as xr
from uqmetrics import read_dataset, risk_coverage_curve, softmax, softmax_response
from uqmetrics.report.plotting import (
    distinct_styles,
    plot_risk_coverage,
    save_figure,
    series_legend,
)
from uqmetrics.report.plotting import label_points as name_points  # `label_points`: a parameter
from uqmetrics.runs.io import decode_attr

from ...cache import index_caches, read_cache
from .analysis import improvements, temperature_effect

__all__ = ["RISK_COVERAGE_MAX_MODELS", "plot_selective"]

#: The risk-coverage figure draws one curve per model up to this many models (more would be
#: unreadable, and each curve reads a whole cache): ``uqvision plot --caches FILES`` draws a
#: chosen subset.
RISK_COVERAGE_MAX_MODELS = 30


def _softmax_rows(ds: xr.Dataset) -> xr.Dataset:
    if "method" not in ds.coords:
        return ds
    return ds.isel(model=np.flatnonzero(ds["method"].values == "softmax"))


def _family_styles(families) -> dict[str, dict[str, str]]:
    """A distinct colour and marker per family, in sorted order (past tab20's 20 colours the
    markers differ: :func:`uqmetrics.report.plotting.distinct_styles`)."""
    return distinct_styles(sorted(set(map(str, families))))


def _scatter_models(ds: xr.Dataset, x: np.ndarray, y: np.ndarray, ax, *, label_points: bool):
    """One marker per model: colour = family, area ~ log(params), ring = distilled, star =
    a teacher of another row."""
    fam = ds["family"].values.astype(str) if "family" in ds.coords else np.full(x.size, "?")
    styles = _family_styles(fam)
    params = ds["params"].values.astype(float) if "params" in ds.coords else np.full(x.size,
                                                                                  np.nan)
    size = np.where(np.isfinite(params), 12 * np.log10(np.maximum(params, 10)), 40.0)
    distilled = (ds["distillation"].values.astype(str) == "yes") if "distillation" in ds.coords \
        else np.zeros(x.size, bool)
    teachers = set(ds["teacher"].values.astype(str)) if "teacher" in ds.coords else set()
    keys = ds["metadata_key"].values.astype(str) if "metadata_key" in ds.coords else []
    for f, style in styles.items():
        sel = fam == f
        ax.scatter(x[sel], y[sel], s=size[sel], color=style["color"], marker=style["marker"],
                   alpha=0.75, label=f, edgecolors="none")
    if distilled.any():
        ax.scatter(x[distilled], y[distilled], s=size[distilled] * 1.8, facecolors="none",
                   edgecolors="k", linewidths=1.2, label="distilled")
    is_teacher = np.array([k in teachers for k in keys], dtype=bool)
    if is_teacher.any():
        ax.scatter(x[is_teacher], y[is_teacher], s=120, marker="*", color="gold",
                   edgecolors="k", linewidths=0.6, label="teacher")
    if label_points:
        name_points(ax, x, y, ds["model"].values, alpha=0.7, offset=2.0)
    series_legend(ax, fontsize=6, loc="best", markerscale=0.6, widen=True)


def plot_selective(scores: str | os.PathLike | xr.Dataset,
                   out_dir: str | os.PathLike) -> list[Path]:
    """The Selective paper's figures from a selective score file with metadata coords.

    The figures without temperature scaling are over the samples of the file's ``none`` row
    (the held-out samples, or every test sample under ``--none-samples all``), those after it
    over the held-out samples (the file's ``sample_set`` coord says which);
    the change under temperature scaling is measured on the held-out samples before and after
    (:func:`~.analysis.temperature_effect`, ``paired=True``).

    Returns the paths of the figures written (figures whose inputs are absent, e.g. paired
    comparisons without pairs, are skipped).
    """
    import matplotlib.pyplot as plt  # heavy: imported on first use (start-up time)
    from matplotlib.patches import Patch  # heavy: imported on first use (start-up time)


    ds = read_dataset(scores) if not isinstance(scores, xr.Dataset) else scores
    soft = _softmax_rows(ds)
    out_dir = Path(out_dir)
    paths = []
    label_points = soft.sizes["model"] <= 40
    for cal in ("none", "temperature"):
        auroc = 100 * soft["auroc"].sel(calibration=cal).values
        ece = soft["ece"].sel(calibration=cal).values
        fig, ax = plt.subplots(figsize=(6.5, 5))
        _scatter_models(soft, auroc, -np.log(np.maximum(ece, 1e-6)), ax,
                        label_points=label_points)
        ax.set(xlabel="AUROC x 100 (higher is better)", ylabel="-log ECE (higher is better)",
               title="Ranking vs calibration" + (" after temperature scaling" if cal != "none"
                                                 else ""))
        fig.tight_layout()
        paths.append(save_figure(fig, out_dir / f"selective_auroc_vs_ece_{cal}.png"))
        plt.close(fig)
    table = improvements(ds, metrics=("auroc", "ece"))
    if table.sizes["entry"]:
        for metric in ("auroc", "ece"):
            v = table[f"improvement_{metric}"].values
            ok = np.isfinite(v)
            tech = table["technique"].values.astype(str)[ok]
            names = list(dict.fromkeys(tech))
            fig, ax = plt.subplots(figsize=(max(5, 0.25 * ok.sum() + 2), 5.5))
            colours = {t: style["color"] for t, style in _family_styles(names).items()}
            ax.bar(np.arange(ok.sum()), v[ok], color=[colours[t] for t in tech])
            ax.axhline(0, color="k", lw=0.8)
            ax.set_xticks(np.arange(ok.sum()), table["treated"].values[ok], rotation=90,
                          fontsize=5)
            ax.set(ylabel=f"improvement in {metric.upper()} (positive = better)",
                   title=f"Paired comparisons: {metric.upper()}")
            ax.legend(handles=[Patch(color=colours[t], label=f"{t} ({int((tech == t).sum())})")
                               for t in names], fontsize=6)
            fig.tight_layout()
            paths.append(save_figure(fig, out_dir / f"selective_improvement_{metric}.png"))
            plt.close(fig)
    effect = temperature_effect(ds, metrics=("auroc", "ece"))
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for ax, metric in zip(axes, ("auroc", "ece"), strict=True):
        t, v = effect["temperature"].values, effect[f"improvement_{metric}"].values
        ax.scatter(t, v, s=18, c=np.where(v > 0, "tab:green", "tab:red"))
        ax.axhline(0, color="k", lw=0.8)
        ax.axvline(1, color="grey", lw=0.8, ls="--")
        ax.set(xscale="log", xlabel="fitted temperature T",
               ylabel=f"improvement in {metric.upper()} by TS",
               title=f"Temperature scaling and {metric.upper()}")
    fig.tight_layout()
    paths.append(save_figure(fig, out_dir / "selective_temperature_effect.png"))
    plt.close(fig)
    for x, y, xl, yl, name in (
            ("accuracy", "sac_95", "accuracy", "coverage at SAC 95 %", "sac95_vs_accuracy"),
            ("params", "auroc", "parameters", "AUROC", "auroc_vs_params"),
            ("accuracy", "aurc", "accuracy", "AURC (lower is better)", "aurc_vs_accuracy")):
        if x not in soft.variables or y not in soft.variables:
            continue
        xv = soft[x].sel(calibration="none").values if "calibration" in soft[x].dims \
            else soft[x].values.astype(float)
        fig, ax = plt.subplots(figsize=(6, 4.5))
        _scatter_models(soft, xv, soft[y].sel(calibration="none").values, ax,
                        label_points=label_points)
        if x == "params":
            ax.set_xscale("log")
        ax.set(xlabel=xl, ylabel=yl)
        fig.tight_layout()
        paths.append(save_figure(fig, out_dir / f"selective_{name}.png"))
        plt.close(fig)
    curves = _risk_coverage_curves(ds)
    if curves:
        fig = plot_risk_coverage(curves, title="Risk-coverage (softmax response)")
        paths.append(save_figure(fig, out_dir / "selective_risk_coverage.png"))
        plt.close(fig)
    return paths


def _risk_coverage_curves(ds: xr.Dataset) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Risk–coverage curves (:func:`uqmetrics.risk_coverage_curve`, softmax response) of the
    single models whose plain caches of the scored dataset the file names (attr ``caches``)
    and are still on disk, by model; ``{}`` when none is (a file read away from its caches)
    or when they are of more than :data:`RISK_COVERAGE_MAX_MODELS` models."""
    named = [Path(p) for p in (decode_attr(ds.attrs.get("caches")) or {})]
    dataset = ds.attrs.get("dataset_name")
    infos = [i for i in index_caches([p for p in named if p.is_file()])
             if i.mode == "plain" and not (dataset and i.dataset_name != dataset)]
    if len({i.model for i in infos}) > RISK_COVERAGE_MAX_MODELS:
        return {}
    curves = {}
    for info in sorted(infos, key=lambda i: i.model):
        cache = read_cache(info.path)
        y, p = cache["label"].values, softmax(cache["logits"].values)
        curves[info.model] = risk_coverage_curve(p.argmax(1) == y, softmax_response(p))
    return curves
