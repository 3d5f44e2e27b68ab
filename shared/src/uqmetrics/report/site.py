"""The static leaderboard site (:func:`build_site`): HTML pages from Jinja2 templates, the
sorting and filtering script and the style sheet inlined, figures as SVG ``data:`` URIs, the
tables as CSV and JSON, and ``manifest.json`` (docs/report.md)."""

from __future__ import annotations

import base64
import csv
import io
import itertools
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..metrics.exceptions import InputError
from ..metrics.registry import Registry
from ..runs.io import (
    check_apart,
    check_replaceable,
    check_writable,
    decode_attr,
    folder_replaced,
)
from .leaderboard import (
    MAX_FILTER_VALUES,
    Leaderboard,
    ReportHook,
    csv_cell,
    exact_value,
    format_value,
    leaderboard,
    parse_column,
)

__all__ = ["MANIFEST_VERSION", "PATHS", "REPORT_HOOKS", "SiteReport", "build_site",
           "read_manifest", "shown_path"]

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
    env.filters["split_column"] = _split_column
    return env


def _split_column(name: str) -> tuple[str, str]:
    """A header's two lines: the variable, and its labels (``dim=label, ...``) or ``""``."""
    try:
        variable, selection = parse_column(name)
    except ValueError:
        return name, ""
    return variable, ", ".join(f"{d}={v}" for d, v in selection.items())


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
        writer.writerow([csv_cell(rec[c]) for c in cols])
    return buf.getvalue()


def _json_text(board: Leaderboard) -> str:
    data = {"protocol": board.protocol, "page": board.page, "result": board.source,
            "result_checksum": board.checksum, "dim": board.dim,
            "columns": board.table_columns(),
            "metric_columns": {c.name: {"variable": c.variable, "selection": c.selection,
                                        "metric": c.metric,
                                        "greater_is_better": c.greater_is_better,
                                        "convention": c.convention} for c in board.columns},
            "rows": [{k: _json_value(v) for k, v in r.items()} for r in board.table_rows()]}
    if board.published:  # beside the rows, cited; never in the manifest (not re-verifiable)
        data["published"] = [{"title": p.title, "columns": list(p.columns),
                              "rows": [[_json_value(v) for v in row] for row in p.rows],
                              "citations": list(p.citations), "note": p.note}
                             for p in board.published]
    return json.dumps(data, indent=1, allow_nan=False) + "\n"


def _manifest(boards: Sequence[Leaderboard]) -> dict[str, Any]:
    entries = []
    for b in boards:
        for i, row in enumerate(b.rows):
            entry = {"id": b.entry_id(i), "protocol": b.protocol, "page": b.page,
                     "result": b.source, "result_checksum": b.checksum, "dim": b.dim,
                     "row": row, "metrics": b.manifest_metrics(i)}
            if b.keys:
                entry["keys"] = {d: v[i] for d, v in b.keys.items()}
            entries.append(entry)
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
    from .plotting import figure_format  # matplotlib: imported on use

    try:
        with figure_format("svg"):
            paths = hook.figures(board.result, ds, folder)
    except Exception as exc:  # noqa: BLE001  (a figure illustrates: the table still stands)
        notes.append(f"{board.page}: figures not drawn: {type(exc).__name__}: {exc}")
        return []
    return [(p.stem, _svg_uri(p)) for p in map(Path, paths) if p.suffix == ".svg"]


def _filters(board: Leaderboard) -> dict[str, list[str]]:
    out = {}
    for name, values in {**board.keys, **board.metadata}.items():
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


#: ``--paths``: how the site names the files of the machine that built it.
PATHS = ("relative", "absolute")
#: An absolute path inside a text (a word beginning with ``/``).
_ABSOLUTE = re.compile(r"(?<![\w.~:/\\-])/[^\s\"'<>,;()]+")


def shown_path(path: str, base: Path) -> str:
    """How the site shows an absolute path of the machine that built it (``--paths
    relative``): relative to ``base`` (the result file's folder) where it lies under the
    folder above it (``caches/a.nc``, ``../caches/a.nc``), else its name alone (``…/a.nc``).

    Examples
    --------
    >>> shown_path("/runs/zoo/caches/a.nc", Path("/runs/zoo/scores"))
    '../caches/a.nc'
    >>> shown_path("/home/me/models/w.safetensors", Path("/runs/zoo"))
    '…/w.safetensors'
    """
    rel = os.path.relpath(os.path.normpath(path), base)
    ups = sum(1 for _ in itertools.takewhile(lambda part: part == "..", Path(rel).parts))
    return rel if ups <= 1 else "…/" + Path(path).name


def _relative(value: Any, base: Path) -> Any:
    """``value`` (strings, lists, dicts: keys too) with every absolute path shown by
    :func:`shown_path`."""
    if isinstance(value, str):
        if os.path.isabs(value) and "\n" not in value:
            return shown_path(value, base)
        return _ABSOLUTE.sub(lambda m: shown_path(m[0].rstrip(".:"), base)
                             + m[0][len(m[0].rstrip(".:")):], value)
    if isinstance(value, Mapping):
        return {_relative(k, base): _relative(v, base) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_relative(v, base) for v in value]
    return value


def _hide_paths(board: Leaderboard, site: Path) -> None:
    """``--paths relative``: the board's result named relative to the site, every other
    absolute path of its provenance, metadata and attrs by :func:`shown_path`."""
    base = board.result.parent
    board.source = os.path.relpath(board.result, site)
    for name in ("provenance", "conflicts", "metadata", "hidden_metadata", "file_provenance",
                 "attrs"):
        setattr(board, name, _relative(getattr(board, name), base))


def _page_names(boards: Sequence[Leaderboard]) -> None:
    """Each board's page: its protocol, or, where the site holds several files of one
    protocol, ``<protocol>-<dataset>`` (the file's ``dataset_name`` attr, else its name),
    made distinct."""
    taken: set[str] = set()
    for b in boards:
        if sum(o.protocol == b.protocol for o in boards) == 1:
            name = b.protocol
        else:
            tag = b.attrs.get("dataset_name") or b.result.stem
            name = f"{b.protocol}-{re.sub(r'[^A-Za-z0-9._-]+', '_', str(tag))}"
        page, k = name, 1
        while page in taken:
            k += 1
            page = f"{name}-{k}"
        taken.add(page)
        b.page = page
        if name != b.protocol:
            b.title = f"{b.title} ({tag})"


#: The writer a site folder's record names (:func:`uqmetrics.runs.io.folder_replaced`).
WRITER = "uqmetrics report"


def _check_out(out: Path, results: Sequence[str | os.PathLike], overwrite: bool) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise InputError(f"--out {out} exists and is not a folder")
    check_apart(out, {"result file": results})
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise InputError(f"--out {out} exists and is not empty (--overwrite replaces a site "
                             "this command wrote)")
        check_replaceable(out, WRITER)
    # the site is written beside ``out`` and then takes its place (renaming an existing folder
    # needs write permission on it too): both checked before anything is read or written
    for folder in (out.parent, out) if out.is_dir() else (out.parent,):
        try:
            check_writable(folder)
        except OSError as err:
            at = "" if Path(err.filename) == out else f": {str(err.filename)!r}"
            raise InputError(f"--out {str(out)!r}{at} {err.strerror}") from None


def build_site(results: Sequence[str | os.PathLike], out: str | os.PathLike, *,
               protocol: str | None = None, hooks: Mapping[str, ReportHook] | None = None,
               overwrite: bool = False, figures: bool = True, paths: str = "relative",
               log: Callable[[str], None] | None = None) -> SiteReport:
    """Write the static leaderboard site of result files into folder ``out``.

    Parameters
    ----------
    results : sequence of path-like
        Result files. Each has its page (``<protocol>.html``; several files of one protocol:
        ``<protocol>-<dataset>.html``, the file's ``dataset_name`` attr, else its name).
    out : path-like
        The site folder: written whole into a temporary folder beside it, which then takes its
        place (:func:`uqmetrics.runs.io.folder_replaced`); nothing is left half-written.
    protocol : str, optional
        The protocol of every file (uqreg's study files carry none); default each file's
        ``protocol`` attr (:func:`uqmetrics.read_result`).
    hooks : mapping, optional
        Protocol -> :class:`ReportHook` (default :data:`REPORT_HOOKS`); a protocol without
        one is read generically.
    overwrite : bool, default False
        Replace an existing non-empty ``out`` (else refused): only a site this function wrote
        (its record of files, :func:`uqmetrics.runs.io.folder_replaced`) holding nothing else.
    figures : bool, default True
        Draw the hooks' figures (inlined as SVG).
    paths : {"relative", "absolute"}, default "relative"
        ``relative``: the site holds no absolute path of this machine. The manifest and the
        pages name each result file relative to ``out`` (``verify`` finds it from there);
        every other absolute path (caches, weights, folders in the provenance and attrs) is
        shown relative to the result file's folder where it lies under the folder above it,
        else by its name alone (:func:`shown_path`). ``absolute``: as the files record them.
    log : callable, optional
        Receives a line per page written (default: none).

    Returns
    -------
    SiteReport

    Raises
    ------
    InputError
        ``results`` empty, a file missing, a folder or given twice, a bad ``paths``, a result
        file inside ``out``, ``out`` (or the folder it is written in) not writable, ``out`` not
        empty without ``overwrite``, or, with it, not a site written here or holding other
        files (all before anything is written).
    ResultSchemaError
        A file without a hook that does not follow the result schema.
    """
    from ..runs.result_schema import read_result

    hooks = REPORT_HOOKS if hooks is None else hooks
    log = log or (lambda line: None)
    if isinstance(results, (str, os.PathLike)) or not results:
        raise InputError(f"results must be a non-empty list of result files, got {results!r}")
    if paths not in PATHS:
        raise InputError(f"--paths must be one of {', '.join(PATHS)}, got {paths!r}")
    out = Path(out)
    _check_out(out, results, overwrite)
    read: list[tuple[str, Path, Any, ReportHook]] = []
    for r in results:
        path = Path(r)
        if path.is_dir():
            raise InputError(f"result {str(path)!r} is a folder, not a result file: give the "
                             "result files (.nc) in it")
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
        clash = [p for _, p, _, _ in read if p.resolve() == path.resolve()]
        if clash:
            raise InputError(f"result file {str(path)!r} is given twice")
        read.append((name, path, ds, hook))

    report = SiteReport(out=out)
    env = _environment()
    assets = {"css": _asset("report.css"), "js": _asset("report.js")}
    boards = [(leaderboard(path, name, hook, ds), hook, ds) for name, path, ds, hook in read]
    report.boards = [b for b, _, _ in boards]
    _page_names(report.boards)
    pages = [(b.page, b.title) for b in report.boards]
    with folder_replaced(out, writer=WRITER) as tmp:
        (tmp / "data").mkdir()
        for board, hook, ds in boards:
            figs = _figures(board, hook, ds, tmp / "figures" / board.page, report.notes) \
                if figures else []
            if paths == "relative":
                _hide_paths(board, out.resolve())
                report.notes = [_relative(n, board.result.parent) for n in report.notes]
            html = env.get_template("protocol.html.j2").render(
                board=board, figures=figs, filters=_filters(board), pages=pages,
                column_groups=_column_groups(board), headline=set(board.headline),
                numeric_extra={k: _numeric(v) for k, v in board.extra.items()},
                notes=[n for n in report.notes if n.startswith(f"{board.page}:")],
                **assets)
            page = tmp / f"{board.page}.html"
            page.write_text(html, encoding="utf-8")
            (tmp / "data" / f"{board.page}.csv").write_text(_csv_text(board), encoding="utf-8")
            (tmp / "data" / f"{board.page}.json").write_text(_json_text(board),
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
