"""Each vision protocol's report hook (:data:`uqmetrics.report.REPORT_HOOKS`), built from the
protocol registry (:data:`~uqvision.protocols.VISION_PROTOCOLS`), naming no protocol: its
page's title and description, its leaderboard (:attr:`~uqvision.protocols.Protocol.report`:
the rows, the headline columns, ...), its figures (:meth:`Plots.draw_as
<uqvision.protocols.Plots.draw_as>` as SVG, for a protocol with
:attr:`~uqvision.protocols.Protocol.plots`), the run it records (:func:`describe_run`) and the
images its numbers cover (:func:`images_covered`) and, for a file with an ``accuracy`` per
model, timm's results columns (:func:`timm_columns`, percent). ``uqvision report`` and
``uqvision evaluate``'s site register them (:func:`register_report_hooks`).
"""

from __future__ import annotations

from typing import Any

from .protocols import VISION_PROTOCOLS, Protocol

__all__ = ["TIMM_UNITS", "describe_run", "images_covered", "register_report_hooks",
           "timm_columns"]

#: The units of :func:`timm_columns` (shown in their headers).
TIMM_UNITS = {"top1": "%", "top1_err": "%", "top5": "%", "param_count": "M"}


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


def _identity(ds: Any) -> dict[str, dict]:
    """The score file's caches and what each recorded (``entries.identity``: path ->
    ``{model, dataset_name, ...}``)."""
    from uqmetrics.runs.io import decode_attr

    entries = decode_attr(ds.attrs.get("entries"))
    identity = entries.get("identity") if isinstance(entries, dict) else None
    return {str(k): v for k, v in (identity or {}).items() if isinstance(v, dict)}


def describe_run(ds: Any, rows: tuple[str, ...] = ()) -> str:
    """The run a score file records, one line (the page's subtitle): its rows (models by
    kind), the datasets of its caches (or its ``dataset_name``), its creation time.

    Parameters
    ----------
    ds : xarray.Dataset
    rows : tuple of str
        The row dims (default: ``model`` where the file has it).

    Returns
    -------
    str
        E.g. ``4 models (3 single, 1 ensemble) × 12 detectors; 4 datasets far, fit, near,
        test (12 caches); created 2026-...``.
    """
    rows = rows or (("model",) if "model" in ds.dims else ())
    parts = []
    for k, d in enumerate(rows):
        text = f"{ds.sizes[d]} {d}{'s' if ds.sizes[d] != 1 and not d.endswith('s') else ''}"
        if k == 0 and "kind" in ds.coords and ds.coords["kind"].dims == (d,):
            kinds: dict[str, int] = {}
            for v in ds.coords["kind"].values:
                kinds[str(v)] = kinds.get(str(v), 0) + 1
            text += f" ({', '.join(f'{n} {kind}' for kind, n in kinds.items())})"
        parts.append(text)
    line = " × ".join(parts) or "the result"
    identity = _identity(ds)
    names = sorted({str(v.get("dataset_name")) for v in identity.values()
                    if v.get("dataset_name")})
    if names:
        line += f"; {len(names)} dataset{'s' if len(names) > 1 else ''} {_some(names)} " \
                f"({len(identity)} caches)"
    elif ds.attrs.get("dataset_name"):
        line += f"; dataset {ds.attrs['dataset_name']}"
    if ds.attrs.get("created_utc"):
        line += f"; created {ds.attrs['created_utc']}"
    return line


def _some(names: list[str], most: int = 4) -> str:
    """``a, b, c, d and 5 more``, the shortest names first (``test`` before its corrupted
    copies ``imagenet-c-...``)."""
    names = sorted(names, key=lambda n: (len(n), n))
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most
                                       else "")


def _cache_images(identity: dict[str, dict]) -> dict[str, int | None]:
    """dataset_name -> the images of one of its caches on disk (their ``sample`` dim), None
    where none is on disk."""
    from uqmetrics.runs.io import open_netcdf

    out: dict[str, int | None] = {}
    for path, ident in sorted(identity.items()):
        name = str(ident.get("dataset_name") or "")
        if not name or out.get(name) is not None:
            continue
        out[name] = None
        try:
            with open_netcdf(path) as cache:
                out[name] = int(cache.sizes["sample"]) if "sample" in cache.sizes else None
        except (OSError, ValueError, KeyError):
            continue
    return out


def images_covered(ds: Any, text: str = "", rows: tuple[str, ...] = ("model",)) -> str:
    """Which images a score file's numbers cover: the protocol's words (``text``), then the
    images of each dataset of its caches (read from one cache each, where on disk; datasets
    of equal size together), then the counts the file records (attrs ``n_*``, count variables
    and coordinates ``n_*``: along a row dim (``rows``) their range, along another dim per
    label; sample dims).

    Returns
    -------
    str
        One line; empty when nothing is known.
    """
    import numpy as np

    parts = [text.rstrip(".")] if text else []
    by_size: dict[int | None, list[str]] = {}
    for name, n in _cache_images(_identity(ds)).items():
        by_size.setdefault(n, []).append(name)
    if by_size:
        parts.append("images per dataset (its caches): " + "; ".join(
            (f"{names[0]} {n}" if len(names) == 1 else f"{n} each: {_some(names)}")
            if n is not None else f"no cache on disk: {_some(names)}"
            for n, names in by_size.items()))
    recorded = [f"{k} = {int(v)}" for k, v in ds.attrs.items()
                if str(k).startswith("n_") and isinstance(v, (int, np.integer))]
    for name, da in {**dict(ds.coords), **dict(ds.data_vars)}.items():
        name = str(name)
        if not name.startswith("n_") or da.ndim > 1:
            continue
        values = np.asarray(da.values)
        if values.dtype.kind not in "iuf" or not np.all(np.isfinite(values)):
            continue  # not a count (or not one for every label)
        values = values.astype(np.int64)
        dim = da.dims[0] if da.ndim else None
        if dim is not None and dim not in rows and dim in ds.indexes:
            recorded.append(f"{name}: " + ", ".join(
                f"{label} {v}" for label, v in zip(ds.indexes[dim], values, strict=True)))
        elif values.size:
            lo, hi = int(values.min()), int(values.max())
            recorded.append(f"{name} = {lo}" + (f"–{hi}" if hi != lo else "")
                            + (f" per {dim}" if dim is not None else ""))
    recorded += [f"{d}: {ds.sizes[d]}" for d in map(str, ds.dims) if d.endswith("sample")]
    if recorded:
        parts.append("the file records " + "; ".join(recorded))
    return "; ".join(parts) + ("." if parts else "")


def _hook(proto: Protocol):
    from uqmetrics.report import ReportHook
    from uqmetrics.runs.result_schema import metric_variables

    figures = None
    if proto.plots is not None:
        plots = proto.plots

        def figures(path, ds, out):
            return plots.draw_as(path, out, "svg")

    table = proto.report
    metrics = None
    if table is not None and table.metrics:
        declared = dict(table.metrics)

        def metrics(ds):  # the tagged metrics and the declared ones, in the file's order
            tagged = metric_variables(ds)
            return {str(v): tagged.get(str(v)) or declared[str(v)] for v in ds.data_vars
                    if str(v) in tagged or str(v) in declared}

    rows = tuple(table.rows) if table is not None else ()
    return ReportHook(
        title=proto.name, description=proto.description, figures=figures,
        extra_columns=timm_columns, units=TIMM_UNITS, metrics=metrics, rows=rows or None,
        headline=(table.headline or None) if table is not None else None,
        means=table.means if table is not None else (),
        subtitle=lambda ds: describe_run(ds, rows),
        images=lambda ds: images_covered(ds, table.images if table is not None else "",
                                         rows or ("model",)))


def register_report_hooks() -> None:
    """Register every vision protocol's hook in :data:`uqmetrics.report.REPORT_HOOKS` (those
    not registered yet)."""
    from uqmetrics.report import REPORT_HOOKS

    for name, proto in VISION_PROTOCOLS.items():
        if name not in REPORT_HOOKS:
            REPORT_HOOKS.add(name, _hook(proto))
