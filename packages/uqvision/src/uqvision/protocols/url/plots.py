"""URL's figures (Kirchhof et al. 2023, "URL: A Representation Learning Benchmark for
Transferable Uncertainty Estimates") from a ``transfer.nc`` score file: Fig. 1 (R-AUROC per
method), Fig. 2 (R-AUROC vs R@1), Fig. 4 left and right (upstream R-AUROC and upstream crop
consistency vs downstream R-AUROC); ``uqvision plot --transfer FILE``, the report site and
``uqvision reproduce url`` draw them."""

from __future__ import annotations

import os
from pathlib import Path

import xarray as xr
from uqmetrics import read_dataset
from uqmetrics.report.plotting import distinct_styles, save_figure, series_legend

__all__ = ["draw_figures"]


def draw_figures(ds: xr.Dataset | str | os.PathLike, folder: str | os.PathLike) -> list[Path]:
    """Fig. 1 (R-AUROC per method), Fig. 2 (R-AUROC vs R@1), Fig. 4 left (upstream vs
    downstream R-AUROC) and right (upstream crop consistency vs downstream R-AUROC) from a
    ``transfer.nc`` Dataset."""
    import matplotlib.pyplot as plt  # heavy: imported on first use (start-up time)

    ds = read_dataset(ds) if not isinstance(ds, xr.Dataset) else ds
    folder = Path(folder)
    methods = [str(m) for m in ds["method"].values]
    paths = []
    fig, ax = plt.subplots(figsize=(7, 3.5))
    r = ds["r_auroc"].mean("dataset")
    ax.bar(methods, ds["r_auroc_mean"].values, color="0.7")
    for k in range(r.sizes["seed"]):
        ax.plot(methods, r.isel(seed=k).values, "k.", ms=4)
    ax.axhline(0.5, ls=":", c="k")
    ax.set_ylabel("downstream R-AUROC")
    ax.tick_params(axis="x", rotation=60)
    paths.append(_save(fig, folder / "fig1_r_auroc.png"))
    fig, ax = plt.subplots(figsize=(4.5, 4))
    styles = distinct_styles(methods[:-1])  # matplotlib's 10 colours repeat past 10 methods
    for m in methods[:-1]:
        ax.scatter(ds["recall_at_1"].sel({"method": m}).mean("dataset"),
                   ds["r_auroc"].sel({"method": m}).mean("dataset"), label=m, s=12,
                   color=styles[m]["color"], marker=styles[m]["marker"])
    ax.set_xlabel("downstream R@1")
    ax.set_ylabel("downstream R-AUROC")
    series_legend(ax, fontsize=6, widen=True)
    paths.append(_save(fig, folder / "fig2_r_auroc_vs_recall.png"))
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.scatter(ds["all_upstream_r_auroc"].values.ravel(),
               ds["all_r_auroc"].mean("dataset").values.ravel(), s=10)
    ax.set_xlabel("upstream R-AUROC (all runs)")
    ax.set_ylabel("downstream R-AUROC")
    paths.append(_save(fig, folder / "fig4_upstream_vs_downstream.png"))
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.scatter(ds["all_upstream_crop_consistency"].values.ravel(),
               ds["all_r_auroc"].mean("dataset").values.ravel(), s=10)
    rho = float(ds["rank_correlation"].sel({"quantity": "upstream_crop_consistency"}))
    ax.set_title(f"Spearman rho = {rho:.2f}", fontsize=9)
    ax.set_xlabel("upstream crop consistency (all runs)")
    ax.set_ylabel("downstream R-AUROC")
    paths.append(_save(fig, folder / "fig4_crop_vs_downstream.png"))
    return paths


def _save(fig, path: Path) -> Path:
    """Through the one save path of every figure (:func:`uqmetrics.report.plotting.save_figure`: atomic,
    SVG under ``figure_format("svg")``), then closed."""
    import matplotlib.pyplot as plt  # heavy: imported on first use (start-up time)

    fig.tight_layout()
    path = save_figure(fig, path, dpi=120)
    plt.close(fig)
    return path
