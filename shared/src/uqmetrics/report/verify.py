"""Verify a result: recompute its entries from the caches it names and compare (``uqvision
verify``, ``uqreg verify``).

A *target* is a result file (``.nc``: every entry, one per value of its row dimension), a
report site folder (``site/manifest.json``: every entry of the manifest) or ``SITE#ENTRY_ID``
(one entry of a site, e.g. ``site#selective:resnet50``). For every result file concerned,
:func:`verify` checks:

1. **the caches**: each cache the result records (attr ``caches``: ``{path: checksum}``; for
   an entry, the caches its row was computed from, ``entries.provenance[row].caches``) exists,
   reads intact (:func:`uqmetrics.read_dataset` checks the data against the checksums recorded
   when it was written), its checksum (:func:`uqmetrics.input_checksum`; for a cache that
   records a ``checksum`` attr, that attr must also equal the checksum of its data) equals the
   one the result recorded, and it still records the identity the result recorded for it
   (``entries.identity[path]``: model, dataset, checkpoint hash, dataset fingerprint);
2. **the metrics**: the protocol's rescorer (``rescore(result, path) -> xarray.Dataset``,
   registered by the package that knows the protocol) recomputes the result from those caches
   with the configuration the result records, and every metric variable of the entry's row is
   compared, value by value, with the recorded one: ``|recorded - recomputed| <= atol + rtol *
   |recomputed|`` (NaN agrees only with NaN);
3. **a site entry**: the result file's :func:`uqmetrics.dataset_checksum` still equals the
   manifest's ``result_checksum``, and each metric value of the manifest equals the file's.

Recomputation is the same code on the same caches, so the values agree exactly up to float
rounding (summation order of a BLAS on another host): the default tolerance
(:data:`DEFAULT_RTOL`, :data:`DEFAULT_ATOL`) is far above that rounding and far below what a
changed input moves a metric by.

:func:`verify` prints one line per compared value (``agree|disagree  <column>  recorded=<v>
recomputed=<v> |diff|=<d> tolerance: rtol=<r>, atol=<a>``), one per cache checked, a verdict per
entry and a summary, and returns 0 when everything agrees, 1 otherwise. A protocol without a
rescorer is never claimed to agree: ``cannot recompute: protocol X records no rescoring``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..metrics.exceptions import InputError
from ..runs.io import IncompleteResultError, decode_attr, read_dataset
from ..runs.result_schema import (
    check_result,
    dataset_checksum,
    input_checksum,
    metric_variables,
)
from .leaderboard import column_name  # the site's column names: one definition

if TYPE_CHECKING:
    import xarray as xr

__all__ = ["DEFAULT_ATOL", "DEFAULT_RTOL", "MANIFEST", "TOOLS", "Entry", "Rescorer", "check_cache",
           "column_name", "entries_of", "resolve_target", "tolerance", "verify"]

#: Default relative tolerance: recomputation runs the same code on the same caches, so only float
#: rounding (another summation order, another host's BLAS) separates the values.
DEFAULT_RTOL = 1e-9
#: Default absolute tolerance, for values at or near 0.
DEFAULT_ATOL = 1e-12
#: A report site's manifest (``site/manifest.json``).
MANIFEST = "manifest.json"
#: A variable with more values than this per row is reported in one line (its worst value).
_MAX_LINES = 24
#: How a netCDF file begins: classic (``CDF\x01``, ``\x02``, ``\x05``) or netCDF-4 (HDF5).
_NETCDF_MAGIC = (b"CDF\x01", b"CDF\x02", b"CDF\x05", b"\x89HDF\r\n\x1a\n")
#: The command-line tools that verify results, each its own (``verify(..., tool=...)``).
TOOLS = ("uqreg", "uqvision")

#: ``rescore(result, result_path) -> recomputed result``.
Rescorer = Callable[["xr.Dataset", Path], "xr.Dataset"]


def tolerance(text: str) -> float:
    """argparse type of ``--rtol`` and ``--atol`` (``uqvision verify``, ``uqreg verify``): a
    finite number >= 0; argparse's error names the option (``argument --rtol: must be a finite
    number >= 0, got -1``).

    Examples
    --------
    >>> tolerance("1e-6")
    1e-06
    """
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


@dataclass
class Entry:
    """One entry to verify: a row of a result file.

    Attributes
    ----------
    result : Path
        The result file.
    row : str or None
        The row's value along the row dimension; None: every row of the file.
    manifest : dict or None
        The site manifest's entry (``id``, ``protocol``, ``result_checksum``, ``dim``, ``row``,
        ``metrics``), for a site target.
    """

    result: Path
    row: str | None = None
    manifest: dict | None = None

    @property
    def label(self) -> str:
        return self.manifest["id"] if self.manifest else (
            f"{self.result.name}" + (f"[{self.row}]" if self.row is not None else ""))


def _read_manifest(site: Path) -> list[dict]:
    path = site / MANIFEST
    if not path.is_file():
        raise InputError(f"target {str(site)!r} is a folder without {MANIFEST}: not a report site "
                         "(uqvision report RESULTS... --out SITE)")
    try:
        manifest = json.loads(path.read_text())
        entries = manifest["entries"]
        if not isinstance(entries, list):
            raise TypeError("entries is not a list")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:  # Recursion: nested JSON
        raise InputError(f"{path}: not a report manifest ({exc})") from exc
    return entries


def resolve_target(target: str | os.PathLike) -> list[Entry]:
    """The entries a target names.

    Parameters
    ----------
    target : str or path-like
        A result file, a site folder (with ``manifest.json``) or ``SITE#ENTRY_ID``.

    Returns
    -------
    list of Entry

    Raises
    ------
    uqmetrics.InputError
        A path that does not exist, a file that is not netCDF, a folder that is not a site, a
        damaged manifest, an entry id the manifest lacks (the message lists some it has).
    """
    text = os.fspath(target)
    path = Path(text)
    entry_id = None
    if not path.exists() and "#" in text:
        site, entry_id = text.rsplit("#", 1)
        path = Path(site)
    if not path.exists():
        raise InputError(f"target {text!r} does not exist (a result .nc, a report site folder, "
                         "or SITE#ENTRY_ID)")
    if path.is_file():
        if entry_id is not None:
            raise InputError(f"target {text!r}: #ENTRY_ID needs a site folder, not a file")
        if not _is_netcdf(path):
            raise InputError(f"target {text!r} is not a netCDF file (a result .nc, a report "
                             "site folder, or SITE#ENTRY_ID)")
        return [Entry(path.resolve())]
    entries = _read_manifest(path)
    picked = [e for e in entries if entry_id is None or e.get("id") == entry_id]
    if not picked:
        known = ", ".join(repr(e.get("id")) for e in entries[:8])
        raise InputError(f"target {text!r}: " + (f"no entry {entry_id!r} in {path / MANIFEST}; "
                                                 f"entries: {known}" if entry_id is not None
                                                 else f"{path / MANIFEST} lists no entry"))
    out = []
    for e in picked:
        if not isinstance(e, dict) or "result" not in e or "row" not in e:
            raise InputError(f"{path / MANIFEST}: entry {e!r} lacks 'result' or 'row'")
        # a site names its result files relative to itself (absolute: --paths absolute)
        out.append(Entry(Path(os.path.normpath(path / e["result"])), str(e["row"]), e))
    return out


def _is_netcdf(path: Path) -> bool:
    """Whether ``path`` begins as a netCDF file does (a damaged one still does)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return False
    return any(head.startswith(magic) for magic in _NETCDF_MAGIC)


def _writer(path: Path) -> str | None:
    """The tool (of :data:`TOOLS`) whose command wrote the result file ``path``, by the run it
    records (``run_config``); None when it records none, or cannot be read."""
    from ..runs.io import READ_ERRORS, open_netcdf
    from ..runs.run_config import RUN_CONFIG_ATTR

    try:
        with open_netcdf(path) as ds:
            raw = ds.attrs.get(RUN_CONFIG_ATTR)
        command = json.loads(raw)["command"]
    except (*READ_ERRORS, TypeError, ValueError, KeyError):
        return None
    tool = str(command).split()[0] if str(command).split() else None
    return tool if tool in TOOLS else None


def entries_of(ds: xr.Dataset) -> dict:
    """A result's ``entries`` attr decoded (``{}`` when it records none)."""
    raw = decode_attr(ds.attrs.get("entries"))
    return raw if isinstance(raw, dict) else {}


def _row_dim(ds: xr.Dataset, entries: dict, manifest: dict | None) -> str:
    for dim in (entries.get("dim"), (manifest or {}).get("dim")):
        if isinstance(dim, str) and dim in ds.dims:
            return dim
    for name in metric_variables(ds) or ds.data_vars:
        if ds[name].dims:
            return str(ds[name].dims[0])
    raise InputError("the result has no variable with a dimension: nothing to verify")


def _row_index(ds: xr.Dataset, dim: str, row: str) -> int | None:
    values = [str(v) for v in (ds[dim].values if dim in ds.coords else range(ds.sizes[dim]))]
    return values.index(row) if row in values else None


def _labels(da: xr.DataArray) -> list[dict[str, Any]]:
    """The labels ``{dim: value}`` of every element of ``da`` (C order)."""
    axes = [[_py(v) for v in (da[d].values if d in da.coords else range(da.sizes[d]))]
            for d in da.dims]
    out = [{}]
    for d, values in zip(da.dims, axes, strict=True):
        out = [{**o, str(d): v} for o in out for v in values]
    return out


def _py(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def _value_at(ds: xr.Dataset, variable: str, dim: str, row: str, labels: Mapping) -> float | None:
    """``ds[variable]`` at the row and ``labels`` (matched as strings), or None."""
    if variable not in ds.data_vars:
        return None
    i = _row_index(ds, dim, row)
    if i is None:
        return None
    da = ds[variable].isel({dim: i}) if dim in ds[variable].dims else ds[variable]
    sel = {}
    for d, v in labels.items():
        if d not in da.dims:
            return None
        j = _row_index(da.to_dataset(name="_v"), d, str(v))
        if j is None:
            return None
        sel[d] = j
    da = da.isel(sel)
    if da.ndim:
        return None
    return float(np.asarray(da.values, dtype=np.float64))


def _parse_column(name: str) -> tuple[str, dict[str, str]]:
    """``var[d=v,…]`` -> (``var``, ``{d: v}``)."""
    if not name.endswith("]") or "[" not in name:
        return name, {}
    var, inner = name[:-1].split("[", 1)
    labels = {}
    for part in inner.split(","):
        d, _, v = part.partition("=")
        labels[d] = v
    return var, labels


def _fmt(v: float | None) -> str:
    return "missing" if v is None else repr(float(v))


def _agree(a: float | None, b: float | None, rtol: float, atol: float) -> tuple[bool, float]:
    if a is None or b is None:
        return False, math.nan
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b), 0.0 if math.isnan(a) and math.isnan(b) \
            else math.nan
    if math.isinf(a) or math.isinf(b):
        return a == b, 0.0 if a == b else math.inf
    d = abs(a - b)
    return d <= atol + rtol * abs(b), d


@dataclass
class _Cache:
    """What the cache checks found for one cache."""

    path: str
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"cache ok        {self.path}" if not self.problems else
                f"cache disagree  {self.path}: {'; '.join(self.problems)}")


def check_cache(path: str, recorded: str | None, identity: Mapping | None) -> _Cache:
    """Check one cache: it exists, reads intact, its checksum equals ``recorded`` (and its own
    ``checksum`` attr, where it records one, equals its data's), it records ``identity``."""
    out = _Cache(path)
    try:
        ds = read_dataset(path)
    except FileNotFoundError:
        out.problems.append("missing")
        return out
    except IncompleteResultError as exc:
        out.problems.append(f"does not read intact ({exc.detail or exc})")
        return out
    actual = dataset_checksum(ds)
    own = ds.attrs.get("checksum")
    if isinstance(own, str) and own != actual:
        out.problems.append(f"its data do not match its own checksum attr ({own[:12]}... vs the "
                            f"data's {actual[:12]}...)")
    now = input_checksum(ds)
    if recorded is None:
        out.problems.append("the result records no checksum for it")
    elif now != recorded:
        out.problems.append(f"checksum {now[:12]}... differs from the recorded {recorded[:12]}..."
                            " (the cache changed since the result was scored)")
    for attr, want in (identity or {}).items():
        have = decode_attr(ds.attrs.get(attr))
        have = _py(have) if not isinstance(have, (list, dict)) else have
        if json.dumps(have, sort_keys=True, default=str) != json.dumps(want, sort_keys=True,
                                                                       default=str):
            out.problems.append(f"identity: {attr} is {have!r}, the result recorded {want!r}")
    return out


def _compared(recorded: xr.Dataset, recomputed: xr.Dataset, dim: str) -> list[str]:
    """The variables compared: the metric variables (of either file), or, where the
    recomputed result tags none (a uqreg study), its numeric variables along ``dim``."""
    tagged = list(dict.fromkeys([*metric_variables(recorded), *metric_variables(recomputed)]))
    if metric_variables(recomputed):
        return tagged
    return [str(n) for n, v in recomputed.data_vars.items()
            if dim in v.dims and v.dtype.kind in "biuf"]


def _dim_labels(da: xr.DataArray, d: str) -> list:
    return [_py(v) for v in (da[d].values if d in da.coords else range(da.sizes[d]))]


def _row_slice(ds: xr.Dataset, var: str, dim: str, row: str) -> xr.DataArray:
    da = ds[var]
    return da.isel({dim: _row_index(ds, dim, row)}) if dim in da.dims else da


def _aligned(rec: xr.DataArray, new: xr.DataArray) -> tuple[np.ndarray, np.ndarray] | None:
    """``new``'s values at each of ``rec``'s labels (matched as strings), NaN where it has
    none, and where it has them; None when the two have other dims."""
    if set(rec.dims) != set(new.dims):
        return None
    new = new.transpose(*rec.dims)
    index, present = [], np.ones(rec.shape, dtype=bool)
    for axis, d in enumerate(rec.dims):
        where = {str(v): i for i, v in enumerate(_dim_labels(new, d))}
        pos = np.array([where.get(str(v), -1) for v in _dim_labels(rec, d)], dtype=np.int64)
        shape = [1] * rec.ndim
        shape[axis] = -1
        present &= (pos >= 0).reshape(shape)
        index.append(np.maximum(pos, 0))
    values = np.asarray(new.values, dtype=np.float64)
    taken = values[np.ix_(*index)] if rec.ndim else values
    return np.where(present, taken, np.nan), present


def _line(cols: tuple, i: int, head: str) -> str:
    """The line of value ``i`` (flat index) of a compared variable; ``cols``: (variable, its
    recorded row, the labels of its values or None, recorded, recomputed, present, |diff|,
    tolerance text)."""
    var, rec, labels, a, b, present, diff, tol = cols
    lab = labels[i] if labels is not None else {
        d: _dim_labels(rec, d)[j]
        for d, j in zip(rec.dims, np.unravel_index(i, rec.shape), strict=True)}
    new = float(b[i]) if present[i] else None
    return (f"  {head}  {column_name(var, lab)}  recorded={_fmt(float(a[i]))} "
            f"recomputed={_fmt(new)} |diff|={float(diff[i]):.3g} {tol}")


def _compare_row(recorded: xr.Dataset, recomputed: xr.Dataset, dim: str, row: str,
                 rtol: float, atol: float, out: Callable[[str], None]) -> tuple[int, int]:
    """Compare one row; print its lines; (values agreeing, values compared)."""
    tol = f"tolerance: rtol={rtol:g}, atol={atol:g}"
    ok = n = 0
    if _row_index(recomputed, dim, row) is None:
        out(f"  disagree  {dim}={row}  not recomputed: the caches give no such row "
            f"(rows recomputed: {', '.join(str(v) for v in recomputed[dim].values[:8])})")
        return 0, 1
    for var in _compared(recorded, recomputed, dim):
        if var not in recorded.data_vars or var not in recomputed.data_vars:
            where = "the result file" if var not in recorded.data_vars else "the recomputation"
            out(f"  disagree  {var}  missing from {where}")
            n += 1
            continue
        rec = _row_slice(recorded, var, dim, row)
        got = _aligned(rec, _row_slice(recomputed, var, dim, row))
        if got is None:
            out(f"  disagree  {var}  dims {rec.dims} recorded, "
                f"{_row_slice(recomputed, var, dim, row).dims} recomputed")
            n += 1
            continue
        a = np.asarray(rec.values, dtype=np.float64).ravel()
        b, present = got[0].ravel(), got[1].ravel()
        with np.errstate(invalid="ignore"):
            diff = np.abs(a - b)
            good = present & ((a == b) | (np.isnan(a) & np.isnan(b))
                              | (diff <= atol + rtol * np.abs(b)))
        diff = np.where(np.isnan(a) & np.isnan(b) & present, 0.0, diff)
        diff = np.where((a == b) & present, 0.0, diff)
        n += a.size
        ok += int(good.sum())
        small = a.size <= _MAX_LINES
        labels = _labels(rec) if small else None
        cols = (var, rec, labels, a, b, present, diff, tol)
        if small:
            for i in range(a.size):
                out(_line(cols, i, "agree   " if good[i] else "disagree"))
        else:
            bad = np.flatnonzero(~good)
            key = np.where(np.isnan(diff), np.inf, diff)
            worst = int(bad[np.argmax(key[bad])]) if bad.size else int(np.argmax(key))
            text = _line(cols, worst, "agree   " if not bad.size else "disagree")
            name = text.split("  ")[2]
            out(text.replace(f"  {name}  ", f"  {var}[{a.size} values, {bad.size} disagree; "
                             f"{'worst' if bad.size else 'largest |diff|'}: {name}]  ", 1))
    return ok, n


def _site_checks(ds: xr.Dataset, entry: Entry, dim: str, out: Callable[[str], None]) -> int:
    """The manifest's checks of a site entry; the number of problems."""
    m = entry.manifest or {}
    bad = 0
    want, have = m.get("result_checksum"), dataset_checksum(ds)
    if want != have:
        out(f"  disagree  result_checksum  manifest={want} file={have} (the result file changed "
            "since the site was built)")
        bad += 1
    else:
        out(f"  agree     result_checksum  {have}")
    metrics = m.get("metrics") or {}
    mismatched = []
    for name, value in metrics.items():
        var, labels = _parse_column(name)
        file_value = _value_at(ds, var, dim, str(m.get("row")), labels)
        shown = None if value is None else float(value)
        # JSON has no NaN or infinity: the manifest writes every non-finite value as null
        same = (file_value is not None and (
            (shown is None and not math.isfinite(file_value)) or (shown is not None and (
                shown == file_value or (math.isnan(shown) and math.isnan(file_value))))))
        if not same:
            mismatched.append(f"{name} manifest={shown!r} file={_fmt(file_value)}")
    if mismatched:
        out(f"  disagree  manifest metrics: {len(mismatched)} of {len(metrics)} differ from the "
            f"file: {'; '.join(mismatched[:6])}")
        bad += 1
    else:
        out(f"  agree     manifest metrics: {len(metrics)} values equal the file's")
    return bad


def _records_problem(caches: Any, entries: Mapping) -> str | None:
    """What is wrong with a result's records of its caches, or None: attr ``caches`` (``{path:
    checksum}``) and, in attr ``entries``, ``identity`` (``{path: {attr: value}}``) and
    ``provenance`` (``{row: {"caches": [path, ...]}}``). An edited or damaged record is
    reported, never used."""
    if isinstance(caches, dict) and not all(isinstance(v, str) for v in caches.values()):
        return "attr 'caches' is not a JSON object of cache paths -> checksums"
    identity = entries.get("identity")
    if identity is not None and not (isinstance(identity, dict) and all(
            isinstance(v, dict) for v in identity.values())):
        return "attr 'entries': its 'identity' is not an object of cache paths -> {attr: value}"
    prov = entries.get("provenance")
    rows_ok = isinstance(prov, dict) and all(
        v is None or (isinstance(v, dict) and (v.get("caches") is None or (
            isinstance(v["caches"], list) and all(isinstance(c, str) for c in v["caches"]))))
        for v in prov.values())
    if prov is not None and not rows_ok:
        return ("attr 'entries': its 'provenance' is not an object of rows -> {'caches': "
                "[path, ...]}")
    return None


def _row_caches(recorded: Mapping[str, str], entries: dict, row: str | None) -> list[str]:
    """The caches of a row (every cache for None, or a row without its own list)."""
    prov = (entries.get("provenance") or {}).get(row) if row is not None else None
    listed = (prov or {}).get("caches")
    return list(listed) if isinstance(listed, list) else list(recorded)


def verify(target: str | os.PathLike | Iterable[Entry],
           rescorer: Callable[[str], Rescorer | None], *, rtol: float = DEFAULT_RTOL,
           atol: float = DEFAULT_ATOL, protocol_of: Callable[[xr.Dataset], str] | None = None,
           out: Callable[[str], None] = print, tool: str | None = None) -> int:
    """Verify a target's entries (see the module docstring); print the report.

    Parameters
    ----------
    target : str, path-like or iterable of Entry
        A result file, a site folder, ``SITE#ENTRY_ID`` (:func:`resolve_target`), or entries.
    rescorer : callable
        ``rescorer(protocol) -> rescore or None``: the protocol's rescoring,
        ``rescore(result, result_path) -> xarray.Dataset`` (the result recomputed from the
        caches it records, with its recorded configuration); None for a protocol without one.
    rtol, atol : float
        The tolerance: ``|recorded - recomputed| <= atol + rtol * |recomputed|``; >= 0.
    protocol_of : callable, optional
        ``protocol_of(result) -> name``; default its ``protocol`` attr (a site entry's
        ``protocol`` first).
    out : callable, default print
        Receives each line.
    tool : str, optional
        The command-line tool verifying (one of :data:`TOOLS`): an entry whose result file
        records a run of another tool is refused, naming the tool that verifies it.

    Returns
    -------
    int
        0 when every cache is intact and every value agrees, 1 otherwise.

    Raises
    ------
    uqmetrics.InputError
        A bad target (:func:`resolve_target`), a negative or non-finite tolerance, a result
        file that does not exist or cannot be read (truncated, damaged: a target given itself;
        a site entry's file that cannot be read disagrees), a result of another tool than
        ``tool``.
    uqmetrics.ResultSchemaError
        (a :class:`ValueError`) A target file that is not a result (no ``protocol`` attr, as
        a prediction cache) when ``protocol_of`` is not given (:func:`check_result`).
    """
    for name, value in (("rtol", rtol), ("atol", atol)):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise InputError(f"{name} must be a finite number >= 0, got {value!r}")
    entries = resolve_target(target) if isinstance(target, (str, os.PathLike)) else list(target)
    by_file: dict[Path, list[Entry]] = {}
    for e in entries:
        by_file.setdefault(Path(e.result), []).append(e)
    for path, group in by_file.items():
        writer = _writer(path) if tool is not None else None
        if writer is not None and writer != tool:
            raise InputError(f"{group[0].label}: {str(path)!r} is a result of {writer}, not of "
                             f"{tool}: verify it with {writer} verify")
    verdicts: list[tuple[str, bool]] = []
    for path, group in by_file.items():
        given = len(by_file) == 1 and group[0].manifest is None  # the target itself
        if not path.is_file() and given:
            raise InputError(f"result file {str(path)!r} does not exist")
        try:
            ds = read_dataset(path)
        except (FileNotFoundError, IncompleteResultError) as exc:
            if given:  # bad input, not a disagreement: nothing was recorded to compare with
                raise InputError(f"result file {' '.join(str(exc).split())}") from None
            out(f"result {path}")
            out(f"  disagree  the result file cannot be read: {' '.join(str(exc).split())}")
            verdicts += [(e.label, False) for e in group]
            continue
        if given and protocol_of is None and "protocol" not in ds.attrs:
            check_result(ds, path=path)  # not a result of a protocol (a cache?): named, refused
        out(f"result {path}")
        info = entries_of(ds)
        recorded_caches = decode_attr(ds.attrs.get("caches"))
        damaged = _records_problem(recorded_caches, info)
        if damaged is not None:
            out(f"  disagree  the result file's {damaged} (edited or damaged): cannot verify")
            verdicts += [(e.label, False) for e in group]
            continue
        recorded_caches = recorded_caches if isinstance(recorded_caches, dict) else {}
        identity = info.get("identity") or {}
        manifest = group[0].manifest
        protocol = (manifest or {}).get("protocol") or (
            protocol_of(ds) if protocol_of else str(decode_attr(ds.attrs.get("protocol", ""))))
        dim = _row_dim(ds, info, manifest)
        rows: list[tuple[Entry, str]] = []
        for e in group:
            if e.row is not None:
                rows.append((e, e.row))
            else:
                rows += [(Entry(e.result, str(_py(v))), str(_py(v))) for v in (
                    ds[dim].values if dim in ds.coords else range(ds.sizes[dim]))]
        checked = {p: check_cache(p, recorded_caches.get(p), identity.get(p))
                   for p in dict.fromkeys(p for _, r in rows
                                          for p in _row_caches(recorded_caches, info, r))}
        rescore = rescorer(protocol) if protocol else None
        recomputed, why = None, ""
        if rescore is None:
            why = f"cannot recompute: protocol {protocol or '(unnamed)'} records no rescoring"
        else:
            try:
                recomputed = rescore(ds, path)
            except Exception as exc:  # noqa: BLE001 -- any failure is reported, never agreement
                why = f"cannot recompute: {type(exc).__name__}: {' '.join(str(exc).split())}"
        for e, row in rows:
            label = e.manifest["id"] if e.manifest else f"{protocol}:{row}"
            out(f"entry {label}  ({dim}={row})")
            bad = 0
            if _row_index(ds, dim, row) is None:
                out(f"  disagree  the result file has no {dim} {row!r}")
                verdicts.append((label, False))
                continue
            if e.manifest is not None:
                bad += _site_checks(ds, e, dim, out)
            caches = _row_caches(recorded_caches, info, row)
            if not caches:
                out("  (the result records no caches: it is recomputed from what it holds)")
            for p in caches:
                out("  " + checked[p].line())
                bad += bool(checked[p].problems)
            if recomputed is None:
                out(f"  disagree  {why}")
                bad += 1
                n_ok = n = 0
            else:
                n_ok, n = _compare_row(ds, recomputed, dim, row, rtol, atol, out)
                bad += n - n_ok
            intact = sum(not checked[p].problems for p in caches)
            good = bad == 0
            out(f"  {'agree' if good else 'DISAGREE'}: {n_ok} of {n} values agree, {intact} of "
                f"{len(caches)} caches intact")
            verdicts.append((label, good))
    n_good = sum(g for _, g in verdicts)
    entries_word = "entry" if len(verdicts) == 1 else "entries"
    out(f"summary: {len(verdicts)} {entries_word}: {n_good} agree, {len(verdicts) - n_good} "
        "disagree"
        + ("" if n_good == len(verdicts) else
           f" ({', '.join(label for label, g in verdicts if not g)[:500]})")
        + f"; tolerance: rtol={rtol:g}, atol={atol:g}")
    return 0 if verdicts and n_good == len(verdicts) else 1
