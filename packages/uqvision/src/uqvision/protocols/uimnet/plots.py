"""Figures of the UIMNET protocol (V.3; Belghazi & Lopez-Paz, 2021, "What classifiers know
what they don't know?") from an ``ood.nc`` score file (:mod:`~.score`):

- ``uimnet_<metric>.png`` for ``auc``, ``in_as_in`` and ``out_as_out``: the paper's out-domain
  table as heat maps, algorithm × measure, the mean over data seeds annotated in each cell, one
  panel per (K, calibration, spectral) cell of the file, the oracle's value in the title;
- ``uimnet_histograms.png``: histograms of u of one measure on in-domain test vs out-domain test
  images, one panel per algorithm. The score file holds no per-image u; they are recomputed
  from the ensemble cells and run caches the file names (attr ``caches``), as
  :func:`~.score.score_ood` computes them, for the smallest K, no spectral normalisation, no
  calibration and the first data seed, and the measure of the highest mean AUC there over the
  algorithms (among the measures defined for every algorithm). The figure is left out when
  those caches are no longer on disk.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import xarray as xr
from matplotlib.figure import Figure
from uqmetrics import read_dataset
from uqmetrics.report.plotting import figure_grid, save_figures

from ...provenance import recorded_caches, recorded_config
from .measures import measures_for, reference_split
from .score import _ENS, OUT_DOMAIN_METRICS, _inputs

__all__ = ["draw_figures", "histogram_selection", "metric_heatmaps", "uncertainty_histograms"]

def _dataset(scores: str | os.PathLike | xr.Dataset) -> xr.Dataset:
    ds = scores if isinstance(scores, xr.Dataset) else read_dataset(scores)
    missing = [v for v in ("auc", "in_as_in", "out_as_out") if v not in ds]
    if missing or "measure" not in ds.dims:
        raise ValueError(f"scores is not a uimnet score file (uqvision score uimnet): it lacks "
                         f"{missing or ['dim measure']}")
    return ds


def metric_heatmaps(scores: str | os.PathLike | xr.Dataset, metric: str = "auc") -> Figure:
    """The paper's out-domain table as heat maps: ``metric`` over algorithm × measure.

    Parameters
    ----------
    scores : path or xarray.Dataset
        A uimnet score file: ``metric`` over (algorithm, measure, k, calibration, spectral,
        stat).
    metric : {"auc", "in_as_in", "out_as_out"}, default "auc"

    Returns
    -------
    matplotlib.figure.Figure
        One panel per (k, calibration, spectral), rows ``k``, columns (calibration, spectral);
        each panel's image is the (algorithm, measure) array of the mean over data seeds (NaN
        masked, annotated ``—``), colour limits [0, 1].
    """
    if metric not in OUT_DOMAIN_METRICS:
        raise ValueError(f"metric must be one of {list(OUT_DOMAIN_METRICS)}, got {metric!r}")
    ds = _dataset(scores)
    mean = ds[metric].sel(stat="mean")
    algs = [str(a) for a in ds.algorithm.values]
    meas = [str(m) for m in ds.measure.values]
    cols = [(c, sp) for c in ds.calibration.values for sp in ds.spectral.values]
    fig, axes = figure_grid(ds.sizes["k"], len(cols),
                            panel=(0.55 * len(meas) + 1.6, 0.4 * len(algs) + 1.4))
    image = None
    for i, k in enumerate(ds.k.values):
        for j, (cal, sp) in enumerate(cols):
            ax = axes[i, j]
            arr = mean.sel(k=k, calibration=cal, spectral=sp).transpose(
                "algorithm", "measure").values.astype(float)
            image = ax.imshow(np.ma.masked_invalid(arr), vmin=0.0, vmax=1.0, cmap="viridis",
                              aspect="auto")
            for a in range(arr.shape[0]):
                for m in range(arr.shape[1]):
                    v = arr[a, m]
                    ax.text(m, a, "—" if np.isnan(v) else f"{v:.2f}", ha="center",
                            va="center", fontsize=7,
                            color="k" if np.isfinite(v) and v > 0.6 else "w")
            ax.set_xticks(range(len(meas)), meas, rotation=45, ha="right", fontsize=7)
            ax.set_yticks(range(len(algs)), algs, fontsize=7)
            ax.set_title(f"K={int(k)}, calibration={cal}, spectral={bool(sp)}", fontsize=8)
    oracle = f"oracle_{metric}"
    tail = ""
    if oracle in ds and np.isfinite(float(ds[oracle].sel(stat="mean"))):
        tail = f" (oracle {float(ds[oracle].sel(stat='mean')):.3f})"
    fig.suptitle(f"UIMNET out-domain {metric}, mean over {ds.attrs.get('n_data_seeds', '?')} "
                 f"data seed(s){tail}", fontsize=9)
    fig.colorbar(image, ax=axes, label=metric, shrink=0.8)
    return fig


def histogram_selection(scores: str | os.PathLike | xr.Dataset) -> dict | None:
    """Where :func:`uncertainty_histograms` reads its u: the ensemble cell of every algorithm
    at the smallest K, no spectral normalisation (else the first value), the first data seed,
    and the measure of the highest mean AUC over the algorithms at that K, spectral and no
    calibration (among the measures with a finite AUC for every algorithm).

    Returns
    -------
    dict or None
        ``{"measure", "k", "spectral", "data_seed", "cells": {algorithm: Path}}``; None when
        the file names no ensemble cells, no measure qualifies, or a cell is not on disk.
    """
    ds = _dataset(scores)
    try:
        paths = [Path(p) for p in recorded_caches(ds)]
    except ValueError:
        return None
    k = int(ds.k.values.min())
    spectral = [bool(v) for v in ds.spectral.values]
    sp = False if False in spectral else spectral[0]
    auc = ds["auc"].sel(stat="mean", k=k, calibration="none", spectral=sp)
    finite = np.isfinite(auc).all("algorithm")
    if not bool(finite.any()):
        return None
    measure = str(auc.where(finite).mean("algorithm").idxmax("measure").item())
    cells: dict[str, dict[int, Path]] = {}
    for p in paths:
        m = _ENS.match(p.stem)
        if p.parent.name == "ensembles" and m and int(m["k"]) == k and bool(int(m["sp"])) == sp:
            cells.setdefault(m["alg"], {})[int(m["seed"])] = p
    algs = [str(a) for a in ds.algorithm.values]
    seeds = set.intersection(*(set(cells.get(a, {})) for a in algs))
    if not seeds:
        return None
    seed = min(seeds)
    chosen = {a: cells[a][seed] for a in algs}
    if not all(p.exists() for p in chosen.values()):
        return None
    return {"measure": measure, "k": k, "spectral": bool(sp), "data_seed": seed,
            "cells": chosen}


def _uncertainties(cell: Path, measure: str, cfg: dict) -> dict[str, np.ndarray]:
    """u of ``measure`` on in-domain and out-domain test images of one ensemble cell, at no
    calibration, as :func:`~.score.score_ood` computes it."""
    ens = read_dataset(cell)
    members = [read_dataset(p) for p in json.loads(ens.attrs["members"])]
    tau = float(ens.attrs["temperature"])
    meas = measures_for(cfg.get("gmm_fit") or "official")[measure]
    sets = {s: _inputs(members, ens, s, "none", tau) for s in ("in_val", "in_test", "out_test")}
    ref = sets["in_val"]
    if meas.fitted:
        fit, _ = reference_split(ref.labels, fit_fraction=cfg.get("fit_fraction", 0.5),
                                 seed=cfg.get("split_seed", 0))
        ref = ref.subset(fit)
    return {s: np.asarray(meas(sets[s], ref), float) for s in ("in_test", "out_test")}


def uncertainty_histograms(scores: str | os.PathLike | xr.Dataset) -> Figure | None:
    """Histograms of u on in-domain vs out-domain test images, one panel per algorithm
    (:func:`histogram_selection` says which cells and measure).

    Returns
    -------
    matplotlib.figure.Figure or None
        Per panel two step histograms on shared bins (density), ``in-domain`` then
        ``out-domain``; None where :func:`histogram_selection` is None.
    """
    ds = _dataset(scores)
    sel = histogram_selection(ds)
    if sel is None:
        return None
    try:
        cfg = recorded_config(ds)
    except TypeError:
        cfg = {}
    cells = sel["cells"]
    fig, axes = figure_grid(1, len(cells), panel=(3.2, 2.6))
    for ax, (alg, cell) in zip(axes[0], cells.items(), strict=True):
        u = _uncertainties(cell, sel["measure"], cfg)
        both = np.concatenate([u["in_test"], u["out_test"]])
        both = both[np.isfinite(both)]
        bins = np.histogram_bin_edges(both, bins=20) if both.size else 20
        for name, label in (("in_test", "in-domain"), ("out_test", "out-domain")):
            v = u[name][np.isfinite(u[name])]
            ax.hist(v, bins=bins, density=True, histtype="step", linewidth=1.4,
                    label=f"{label} (n={v.size})")
        auc = float(ds["auc"].sel(stat="mean", algorithm=alg, measure=sel["measure"],
                                  k=sel["k"], calibration="none", spectral=sel["spectral"]))
        ax.set(title=f"{alg} (AUC {auc:.3f}, mean over seeds)", xlabel=f"u = {sel['measure']}",
               ylabel="density")
        ax.title.set_fontsize(8)
        ax.locator_params(axis="x", nbins=4)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7)
    fig.suptitle(f"UIMNET u on in- vs out-domain test: K={sel['k']}, spectral="
                 f"{sel['spectral']}, no calibration, data seed {sel['data_seed']}",
                 fontsize=9)
    return fig


def draw_figures(score_file: str | os.PathLike, out: str | os.PathLike) -> list[Path]:
    """``uqvision plot --uimnet FILE``: the heat maps of ``auc``, ``in_as_in``,
    ``out_as_out`` and, when the file's caches are on disk, the in/out-domain histograms.

    Parameters
    ----------
    score_file : path
        A uimnet score file (``uqvision score uimnet``, ``uqvision reproduce uimnet``).
    out : path
        The folder the figures are written into (created).

    Returns
    -------
    list of Path
        ``uimnet_auc.png``, ``uimnet_in_as_in.png``, ``uimnet_out_as_out.png`` and
        ``uimnet_histograms.png`` (if drawn), through :func:`uqmetrics.report.plotting.save_figures`
        (``.svg`` under :func:`uqmetrics.report.plotting.figure_format`).
    """
    ds = _dataset(score_file)
    figures = [(f"uimnet_{m}.png", lambda m=m: metric_heatmaps(ds, m))
               for m in OUT_DOMAIN_METRICS]
    paths = save_figures(figures, out)
    hist = uncertainty_histograms(ds)
    if hist is not None:
        paths += save_figures([("uimnet_histograms.png", lambda: hist)], out)
    return paths
