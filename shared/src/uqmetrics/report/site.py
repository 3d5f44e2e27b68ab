"""The static leaderboard site (:func:`build_site`): HTML pages from Jinja2 templates, the
sorting and filtering script and the style sheet inlined, figures as SVG ``data:`` URIs, the
tables as CSV and JSON, and ``manifest.json`` (docs/report.md)."""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..exceptions import InputError
from ..io import decode_attr, folder_replaced
from ..registry import Registry
from .leaderboard import (
    MAX_FILTER_VALUES,
    Leaderboard,
    ReportHook,
    exact_value,
    format_value,
    leaderboard,
)

__all__ = ["MANIFEST_VERSION", "REPORT_HOOKS", "SiteReport", "build_site", "read_manifest"]

#: The version of ``manifest.json``'s format (its ``manifest_version``).
MANIFEST_VERSION = 1
#: The ``generator`` of ``manifest.json``.
GENERATOR = "uqmetrics.report"
#: Protocol name -> :class:`ReportHook`; a protocol without one is read generically (any file
#: that follows the result schema). uqvision's ``report`` command registers its protocols',
#: uqreg's registers ``uqreg`` (:mod:`uqreg.report`).
REPORT_HOOKS: Registry[ReportHook] = Registry("report hook", sort=True)


@dataclass
class SiteReport:
    """What :func:`build_site` wrote.

    Attributes
    ----------
    out : Path
        The site folder.
    pages : list of Path
        ``index.html``, ``conventions.html`` and one page per protocol.
    boards : list of Leaderboard
    notes : list of str
        What went wrong without stopping the site (a figure that could not be drawn).
    """

    out: Path
    pages: list[Path] = field(default_factory=list)
    boards: list[Leaderboard] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def n_entries(self) -> int:
        """Rows over every leaderboard (the manifest's entries)."""
        return sum(len(b.rows) for b in self.boards)


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


def _environment():
    import jinja2  # the report's only third-party dependency, imported on use

    env = jinja2.Environment(
        loader=jinja2.PackageLoader(__package__, "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"], default=True),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["shown"] = format_value
    env.filters["exact"] = exact_value
    env.filters["pretty"] = _pretty
    env.filters["compact"] = lambda value: _pretty(value, None)
    return env


def _pretty(value: Any, indent: int | None = 1) -> str:
    """An attr or provenance value as text: JSON for objects and lists (one line without
    ``indent``), else ``str``."""
    value = decode_attr(value)
    if isinstance(value, (Mapping, list, tuple)):
        return json.dumps(value, indent=indent, sort_keys=True, default=str)
    return str(value)


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _csv_text(board: Leaderboard) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    cols = board.table_columns()
    writer.writerow(cols)
    for rec in board.table_rows():
        writer.writerow(["" if rec[c] is None else repr(rec[c]) if isinstance(rec[c], float)
                         else rec[c] for c in cols])
    return buf.getvalue()


def _json_text(board: Leaderboard) -> str:
    data = {"protocol": board.protocol, "result": str(board.result),
            "result_checksum": board.checksum, "dim": board.dim,
            "columns": board.table_columns(),
            "metric_columns": {c.name: {"variable": c.variable, "selection": c.selection,
                                        "metric": c.metric,
                                        "greater_is_better": c.greater_is_better,
                                        "convention": c.convention} for c in board.columns},
            "rows": [{k: _json_value(v) for k, v in r.items()} for r in board.table_rows()]}
    return json.dumps(data, indent=1, allow_nan=False) + "\n"


def _manifest(boards: Sequence[Leaderboard]) -> dict[str, Any]:
    entries = []
    for b in boards:
        for i, row in enumerate(b.rows):
            entries.append({"id": b.entry_id(row), "protocol": b.protocol,
                            "result": str(b.result), "result_checksum": b.checksum,
                            "dim": b.dim, "row": row, "metrics": b.metrics_of(i)})
    return {"generator": GENERATOR, "manifest_version": MANIFEST_VERSION, "entries": entries}


def read_manifest(site: str | os.PathLike) -> dict[str, Any]:
    """``SITE/manifest.json`` (a site folder or the manifest's path), checked.

    Raises
    ------
    FileNotFoundError
        No manifest there.
    ValueError
        Not a manifest of :func:`build_site` (its ``generator`` or ``manifest_version``).
    """
    path = Path(site)
    if path.is_dir():
        path = path / "manifest.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("generator") != GENERATOR \
            or data.get("manifest_version") != MANIFEST_VERSION:
        raise ValueError(f"{path} is not a manifest of {GENERATOR} version {MANIFEST_VERSION}")
    return data


def _svg_uri(path: Path) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _figures(board: Leaderboard, hook: ReportHook, ds: Any, folder: Path,
             notes: list[str]) -> list[tuple[str, str]]:
    """Draw the hook's figures as SVG into ``folder``; (name, data URI) each."""
    if hook.figures is None:
        return []
    from ..plotting import figure_format  # matplotlib: imported on use

    try:
        with figure_format("svg"):
            paths = hook.figures(board.result, ds, folder)
    except Exception as exc:  # noqa: BLE001  (a figure illustrates: the table still stands)
        notes.append(f"{board.protocol}: figures not drawn: {type(exc).__name__}: {exc}")
        return []
    return [(p.stem, _svg_uri(p)) for p in map(Path, paths) if p.suffix == ".svg"]


def _filters(board: Leaderboard) -> dict[str, list[str]]:
    out = {}
    for name, values in board.metadata.items():
        distinct = sorted(set(values))
        if 1 < len(distinct) <= MAX_FILTER_VALUES:
            out[name] = distinct
    return out


def _column_groups(board: Leaderboard) -> dict[str, list[Any]]:
    """Variable -> its metric columns, in column order (the column chooser's groups)."""
    out: dict[str, list[Any]] = {}
    for c in board.columns:
        out.setdefault(c.variable, []).append(c)
    return out


def _numeric(values: Iterable[Any]) -> bool:
    return all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
               for v in values)


def _check_out(out: Path, overwrite: bool) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise InputError(f"--out {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise InputError(f"--out {out} exists and is not empty (--overwrite replaces it whole)")


def build_site(results: Sequence[str | os.PathLike], out: str | os.PathLike, *,
               protocol: str | None = None, hooks: Mapping[str, ReportHook] | None = None,
               overwrite: bool = False, figures: bool = True,
               log: Callable[[str], None] | None = None) -> SiteReport:
    """Write the static leaderboard site of result files into folder ``out``.

    Parameters
    ----------
    results : sequence of path-like
        Result files, at most one per protocol.
    out : path-like
        The site folder: written whole into a temporary folder beside it, which then takes its
        place (:func:`uqmetrics.io.folder_replaced`); nothing is left half-written.
    protocol : str, optional
        The protocol of every file (uqreg's study files carry none); default each file's
        ``protocol`` attr (:func:`uqmetrics.read_result`).
    hooks : mapping, optional
        Protocol -> :class:`ReportHook` (default :data:`REPORT_HOOKS`); a protocol without
        one is read generically.
    overwrite : bool, default False
        Replace an existing non-empty ``out`` (else refused).
    figures : bool, default True
        Draw the hooks' figures (inlined as SVG).
    log : callable, optional
        Receives a line per page written (default: none).

    Returns
    -------
    SiteReport

    Raises
    ------
    InputError
        ``results`` empty, a file missing, two files of one protocol, or ``out`` not empty
        without ``overwrite`` (all before anything is written).
    ResultSchemaError
        A file without a hook that does not follow the result schema.
    """
    from ..result_schema import read_result

    hooks = REPORT_HOOKS if hooks is None else hooks
    log = log or (lambda line: None)
    if isinstance(results, (str, os.PathLike)) or not results:
        raise InputError(f"results must be a non-empty list of result files, got {results!r}")
    out = Path(out)
    _check_out(out, overwrite)
    read: list[tuple[str, Path, Any, ReportHook]] = []
    for r in results:
        path = Path(r)
        if not path.is_file():
            raise InputError(f"result file {str(path)!r} does not exist")
        if protocol is not None:
            hook = hooks.get(protocol) or ReportHook()
            ds = hook.read(path.resolve()) if hook.read else read_result(path)
            name = protocol
        else:
            ds = read_result(path)
            name = str(ds.attrs["protocol"])
            hook = hooks.get(name) or ReportHook()
            if hook.read:
                ds = hook.read(path.resolve())
        clash = [p for n, p, _, _ in read if n == name]
        if clash:
            raise InputError(f"two result files of protocol {name!r}: {clash[0]} and {path} "
                             "(one site shows one file per protocol)")
        read.append((name, path, ds, hook))

    report = SiteReport(out=out)
    env = _environment()
    assets = {"css": _asset("report.css"), "js": _asset("report.js")}
    boards = [(leaderboard(path, name, hook, ds), hook, ds) for name, path, ds, hook in read]
    report.boards = [b for b, _, _ in boards]
    pages = [(b.protocol, b.title) for b in report.boards]
    mask = os.umask(0)
    os.umask(mask)
    with folder_replaced(out) as tmp:
        tmp.chmod(0o777 & ~mask)  # a site folder as mkdir makes it (mkdtemp's is private)
        (tmp / "data").mkdir()
        for board, hook, ds in boards:
            figs = _figures(board, hook, ds, tmp / "figures" / board.protocol, report.notes) \
                if figures else []
            html = env.get_template("protocol.html.j2").render(
                board=board, figures=figs, filters=_filters(board), pages=pages,
                column_groups=_column_groups(board), headline=set(board.headline),
                numeric_extra={k: _numeric(v) for k, v in board.extra.items()},
                notes=[n for n in report.notes if n.startswith(f"{board.protocol}:")],
                **assets)
            page = tmp / f"{board.protocol}.html"
            page.write_text(html, encoding="utf-8")
            (tmp / "data" / f"{board.protocol}.csv").write_text(_csv_text(board),
                                                                 encoding="utf-8")
            (tmp / "data" / f"{board.protocol}.json").write_text(_json_text(board),
                                                                  encoding="utf-8")
            report.pages.append(out / page.name)
            log(f"wrote {out / page.name} ({len(board.rows)} rows, {len(board.columns)} metric "
                f"columns, {len(figs)} figures)")
        named: dict[str, str] = {}
        for b in report.boards:
            for k, v in b.conventions.items():
                named.setdefault(k, v)
        (tmp / "conventions.html").write_text(env.get_template("conventions.html.j2").render(
            boards=report.boards, pages=pages, named=named, **assets), encoding="utf-8")
        (tmp / "index.html").write_text(env.get_template("index.html.j2").render(
            boards=report.boards, pages=pages, notes=report.notes, **assets), encoding="utf-8")
        (tmp / "manifest.json").write_text(
            json.dumps(_manifest(report.boards), indent=1, allow_nan=False) + "\n",
            encoding="utf-8")
    report.pages[:0] = [out / "index.html", out / "conventions.html"]
    for note in report.notes:
        print(f"warning: {note}", file=sys.stderr)
    log(f"wrote {out / 'index.html'}; manifest {out / 'manifest.json'} ({report.n_entries} "
        "entries)")
    return report
