"""``uqvision report RESULTS... --out SITE``: the static leaderboard site of score files, a thin
layer over :func:`uqmetrics.report.build_site` (docs/report.md).

Each protocol's report hook is built from the protocol registry
(:data:`~uqvision.protocols.VISION_PROTOCOLS`), naming no protocol: its page's title and
description, its figures (:meth:`Plots.draw_as <uqvision.protocols.Plots.draw_as>` as SVG,
for a protocol with :attr:`~uqvision.protocols.Protocol.plots`) and, for a file with an
``accuracy`` per model, timm's results columns (:func:`timm_columns`).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..protocols import VISION_PROTOCOLS, Protocol
from .base import _print

__all__ = ["register_report_hooks", "timm_columns"]


def timm_columns(ds: Any, dim: str) -> dict[str, list[Any]]:
    """timm's results-CSV columns of a result, as far as the file holds them (shape (row,)
    each): ``top1`` and ``top1_err`` (percent, from ``accuracy``, before calibration where the
    file has a ``calibration`` dim), ``top5`` (from ``top5_accuracy``), ``param_count``
    (millions, coordinate ``params`` or ``num_params``), ``img_size`` (coordinate
    ``input_size`` or ``img_size``), ``crop_pct`` and ``interpolation`` (coordinates).

    Parameters
    ----------
    ds : xarray.Dataset
    dim : str
        The row dimension.

    Returns
    -------
    dict
        Column -> values, in timm's order; empty without an ``accuracy`` along ``dim``.
    """
    import numpy as np

    def one(name: str):
        if name not in ds.data_vars or dim not in ds[name].dims:
            return None
        da = ds[name]
        if "calibration" in da.dims and "calibration" in ds.indexes \
                and "none" in list(ds.indexes["calibration"]):
            da = da.sel(calibration="none")
        return np.asarray(da.values, float) if da.dims == (dim,) else None

    def coord(*names: str):
        for n in names:
            if n in ds.coords and ds.coords[n].dims == (dim,):
                return ds.coords[n].values
        return None

    top1 = one("accuracy")
    if top1 is None:
        return {}
    out: dict[str, list[Any]] = {"top1": list(100 * top1), "top1_err": list(100 - 100 * top1)}
    top5 = one("top5_accuracy")
    if top5 is not None:
        out["top5"] = list(100 * top5)
    params = coord("params", "num_params")
    if params is not None and np.asarray(params).dtype.kind in "iuf":
        out["param_count"] = list(np.asarray(params, float) / 1e6)
    size = coord("img_size", "input_size")
    if size is not None and np.asarray(size).dtype.kind in "iuf":
        out["img_size"] = [None if not np.isfinite(v) else int(v) for v in np.asarray(size, float)]
    crop = coord("crop_pct")
    if crop is not None and np.asarray(crop).dtype.kind in "iuf":
        out["crop_pct"] = list(np.asarray(crop, float))
    interp = coord("interpolation")
    if interp is not None:
        out["interpolation"] = [str(v) for v in interp]
    return out


def _hook(proto: Protocol):
    from uqmetrics.report import ReportHook

    figures = None
    if proto.plots is not None:
        plots = proto.plots

        def figures(path, ds, out):
            return plots.draw_as(path, out, "svg")

    return ReportHook(title=proto.name, description=proto.description, figures=figures,
                      extra_columns=timm_columns)


def register_report_hooks() -> None:
    """Register every vision protocol's hook in :data:`uqmetrics.report.REPORT_HOOKS` (those
    not registered yet)."""
    from uqmetrics.report import REPORT_HOOKS

    for name, proto in VISION_PROTOCOLS.items():
        if name not in REPORT_HOOKS:
            REPORT_HOOKS.add(name, _hook(proto))


def _args_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", metavar="RESULT",
                   help="score files (one per protocol, as `uqvision score NAME` writes them)")
    p.add_argument("--out", required=True, help="the site folder (index.html, one page per "
                   "protocol, data/, manifest.json); refused when not empty")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out whole")
    p.add_argument("--no-figures", action="store_true", help="leave the figures out")


def _cmd_report(a: argparse.Namespace) -> int:
    from uqmetrics.report import build_site  # Jinja2 and the readers: imported on use

    register_report_hooks()
    report = build_site(a.results, a.out, overwrite=a.overwrite, figures=not a.no_figures,
                        log=_print)
    _print(f"{report.out / 'index.html'}")
    return 0
