"""A result file as a leaderboard: one row per model or method, one column per metric value.

:func:`leaderboard` reads one result file through its protocol's :class:`ReportHook` (a
generic one for any file that follows the result schema) and returns a :class:`Leaderboard`:
the rows (the values of the row dimension), their metadata (the result's coordinates along
that dimension: architecture, regime, ...), the metric columns (exactly the file's values),
the per-entry provenance of the file's ``entries`` attr and the file-level provenance.

Column names (:func:`column_name`) are ``<variable>`` for a metric variable with only the row
dimension, and ``<variable>[<dim>=<label>,...]`` for one with further dimensions, one column
per combination of their labels (e.g. ``ece[calibration=temperature]``); :func:`column_values`
reads a column back from a Dataset.

A hook may stack several dimensions into one row key (``rows``, e.g. ``("model",
"detector")``: one row per model and detector, OpenOOD's table): the first is the *primary*
dimension (the result's ``entries``, provenance and ``verify`` go by its labels), the others
become key columns beside it; a variable that lacks a key dimension repeats its value along it.
Column names then leave the row dimensions out (``auroc[ood_set=near]``); the manifest names a
value with every label (:meth:`Leaderboard.manifest_metrics`, ``auroc[detector=msp,ood_set=near]``)
so that it reads back from the file along the primary dimension alone.

The page shows the *headline* columns (the hook's ``headline``, else :func:`headline_columns`:
the generic rule, for a protocol that declares none) and hides the others behind its column
chooser; every column stays in the page, the CSV/JSON and the manifest.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..runs.io import dataset_checksum, decode_attr

if TYPE_CHECKING:
    import xarray as xr

__all__ = ["FORMULA_STARTS", "HEADLINE_COLUMNS", "Leaderboard", "PublishedRows", "ReportHook",
           "column_name", "column_values", "csv_cell", "format_value", "headline_columns", "leaderboard", "parse_column"]

#: Row dims preferred, in order, when a hook names none and several dims qualify.
_PREFERRED_DIMS = ("model", "method", "detector", "entry")
#: Metadata columns with at most this many distinct values get a filter.
MAX_FILTER_VALUES = 40
#: File attrs shown as the file's provenance (besides every ``<dist>_version``).
FILE_FIELDS = ("protocol", "git_commit", "git_dirty", "created_utc", "hostname", "seed",
               "wall_time_s", "study_wall_time_s", "device", "dataset_name", "config")
#: At most this many metric columns are shown by default (:func:`headline_columns`).
HEADLINE_COLUMNS = 16
_COLUMN = re.compile(r"^(?P<var>[^\[\]]+)(?:\[(?P<sel>[^\[\]]*)\])?\Z")


@dataclass(frozen=True)
class ReportHook:
    """What a protocol brings to the report (registered in
    :data:`uqmetrics.report.REPORT_HOOKS` under the protocol's name; every field optional).

    Attributes
    ----------
    title : str
        The page's heading (default: the protocol's name).
    row_dim : str or None
        The dimension whose values are the rows (default: the dim of the file's ``entries``
        attr, else the dim most metric variables have, ``model`` or ``method`` first);
        ``rows=(row_dim,)``.
    rows : sequence of str or None
        Dimensions stacked into one row key, the primary one first (e.g. ``("model",
        "detector")``: a row per model and detector); overrides ``row_dim`` (which, when also
        given, must be its first).
    metadata : sequence of str or None
        The coordinates along the row dim shown as columns and filters, in order (default:
        those that group rows: more than one distinct value, at most half the rows); the others
        go to each row's provenance panel.
    read : callable or None
        ``read(path) -> xarray.Dataset`` (default :func:`uqmetrics.read_result`: a file that
        does not follow the result schema is refused).
    metrics : callable or None
        ``metrics(ds) -> {variable: (metric, greater_is_better or None)}``: the variables
        that become columns (default :func:`uqmetrics.runs.result_schema.metric_variables`).
    extra_columns : callable or None
        ``extra_columns(ds, row_dim) -> {column: values (row,)}``: derived columns shown before
        the metadata and written to the CSV/JSON (e.g. timm's ``top1``); never in the
        manifest, whose metrics are the file's values.
    figures : callable or None
        ``figures(path, ds, out) -> list of Path``: writes the page's figures into folder
        ``out`` (called inside :func:`uqmetrics.report.plotting.figure_format` ``("svg")``).
    conventions : callable or None
        ``conventions(ds) -> {variable: one line}``: the convention of each metric variable
        (default: its ``convention`` attr, else the file's ``conventions`` entry of its metric,
        else :data:`uqmetrics.CONVENTIONS`).
    row_provenance : callable or None
        ``row_provenance(ds) -> {row: {field: value}}``: provenance fields known without the
        ``entries`` attr (e.g. a per-method wall time); ``entries`` wins where both say.
    headline : callable, sequence of str or None
        The metric columns shown by default (the others are hidden behind the page's column
        chooser, still in the page, the CSV/JSON and the manifest): column names
        (:func:`column_name`), or ``headline(ds) -> list of str`` (default
        :func:`headline_columns`). A label ``*`` stands for every label of its dim
        (``coverage[alpha=*,calibration=none]``). A name the file lacks is left out (one
        protocol's files differ: mCE only where a baseline was given); a headline none of
        whose names is a column is refused.
    means : sequence of str
        Derived columns: the mean of a variable at the given labels over the dims the name
        leaves free (row dims aside), e.g. ``accuracy[calibration=none]`` of a variable along
        ``corruption`` and ``severity`` gives the column
        ``accuracy[calibration=none,corruption=mean,severity=mean]`` (NaN where any value is;
        shown after the hook's ``extra_columns``, written to the CSV/JSON, never in the
        manifest).
    units : mapping
        Column -> its unit, shown in the column's header (e.g. ``{"top1": "%"}``).
    subtitle : callable or None
        ``subtitle(ds) -> str``: the run the file records, one line under the heading (default:
        its rows and the ``dataset_name`` attr, where it has one).
    images : callable, str or None
        Which images (samples) each number covers: a line, or ``images(ds) -> str``.
    description : str
        What the protocol is (a line, shown below the run's).
    published : callable or None
        ``published(ds) -> list of PublishedRows``: published numbers shown beside the file's
        rows, each block a table of its own marked *published*, with its citations; in the
        page and the JSON, never in the manifest (no cache stands behind them: not
        re-verifiable).
    """

    title: str = ""
    row_dim: str | None = None
    metadata: Sequence[str] | None = None
    read: Callable[[Path], xr.Dataset] | None = None
    metrics: Callable[[xr.Dataset], Mapping[str, tuple[str, bool | None]]] | None = None
    extra_columns: Callable[[xr.Dataset, str], Mapping[str, Sequence[Any]]] | None = None
    figures: Callable[[Path, xr.Dataset, Path], list[Path]] | None = None
    conventions: Callable[[xr.Dataset], Mapping[str, str]] | None = None
    row_provenance: Callable[[xr.Dataset], Mapping[str, Mapping[str, Any]]] | None = None
    description: str = ""
    headline: Callable[[xr.Dataset], Sequence[str]] | Sequence[str] | None = None
    rows: Sequence[str] | None = None
    means: Sequence[str] = ()
    units: Mapping[str, str] = field(default_factory=dict)
    subtitle: Callable[[xr.Dataset], str] | None = None
    images: Callable[[xr.Dataset], str] | str | None = None
    published: Callable[[xr.Dataset], Sequence[PublishedRows]] | None = None


@dataclass(frozen=True)
class PublishedRows:
    """Published numbers beside a leaderboard (:attr:`ReportHook.published`): cited, not
    re-verifiable.

    Attributes
    ----------
    title : str
    columns : tuple of str
    rows : tuple of tuple
        Each: one value per column, shape (row, column).
    citations : tuple of str
        Every source the rows cite, one line each.
    note : str
        How the numbers were made, what was not compared (a line).
    """

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    citations: tuple[str, ...]
    note: str = ""


@dataclass(frozen=True)
class MetricColumn:
    """One metric column: its name, the variable and labels it reads, the metric, the direction
    (None: neither), the convention (one line) and its tag (``S.2``), its values (row,) and
    the variable's dims other than the primary row dim, in its order (``dims``)."""

    name: str
    variable: str
    selection: dict[str, str]
    metric: str
    greater_is_better: bool | None
    convention: str
    tag: str
    values: np.ndarray
    dims: tuple[str, ...] = ()


@dataclass
class Leaderboard:
    """A result file as a table (see the module's docstring).

    Attributes
    ----------
    protocol : str
    result : Path
        The result file (absolute).
    checksum : str
        :func:`uqmetrics.dataset_checksum` of its Dataset.
    dim : str
        The (primary) row dimension.
    rows : list of str
        Its label on each row, shape (row,) (repeated where further dims are stacked).
    keys : dict
        Each further stacked row dim -> its label on each row (row,) (hook's ``rows``).
    metadata : dict
        Column -> list of str (row,): coordinates shown as columns.
    hidden_metadata : dict
        Column -> list of str (row,): the other coordinates along ``dim`` (provenance panels).
    extra : dict
        Column -> list (row,): the hook's derived columns.
    columns : list of MetricColumn
    headline : list of str
        The names of the columns shown by default, in column order (the others are hidden
        behind the page's column chooser).
    provenance, conflicts : dict
        Row -> {field: value} and row -> {field: [distinct values]} (the ``entries`` attr,
        completed by the hook's ``row_provenance``).
    entries_recorded : bool
        Whether the file has an ``entries`` attr.
    file_provenance : dict
        Field -> value (decoded): versions, git commit, created time, config, seed, ...
    attrs : dict
        Every file attr, decoded.
    conventions : dict
        The file's ``conventions`` attr (name -> one line).
    skipped : list of str
        Metric variables without the row dimension (not in the table).
    title, description, subtitle, images : str
    units : dict
        Column -> unit shown in its header.
    page : str
        The page's name on the site (``<page>.html``, ``data/<page>.csv``, entry ids): the
        protocol, or ``<protocol>-<dataset>`` where a site holds several files of it
        (:func:`uqmetrics.report.build_site` sets it).
    source : str
        How the site names the result file (relative to the site unless ``--paths absolute``;
        set by :func:`uqmetrics.report.build_site`; default the absolute path).
    """

    protocol: str
    result: Path
    checksum: str
    dim: str
    rows: list[str]
    metadata: dict[str, list[str]] = field(default_factory=dict)
    hidden_metadata: dict[str, list[str]] = field(default_factory=dict)
    extra: dict[str, list[Any]] = field(default_factory=dict)
    columns: list[MetricColumn] = field(default_factory=list)
    headline: list[str] = field(default_factory=list)
    provenance: dict[str, dict[str, Any]] = field(default_factory=dict)
    conflicts: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    entries_recorded: bool = False
    file_provenance: dict[str, Any] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    conventions: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    title: str = ""
    description: str = ""
    keys: dict[str, list[str]] = field(default_factory=dict)
    subtitle: str = ""
    images: str = ""
    units: dict[str, str] = field(default_factory=dict)
    page: str = ""
    source: str = ""
    published: list[PublishedRows] = field(default_factory=list)

    def label(self, i: int) -> str:
        """Row ``i``'s name: its primary label, then each stacked key's, joined by ``/``."""
        return "/".join([self.rows[i], *(v[i] for v in self.keys.values())])

    def entry_id(self, i: int) -> str:
        """``<page>:<label>``, the manifest's id of row ``i``."""
        return f"{self.page or self.protocol}:{self.label(i)}"

    def table_columns(self) -> list[str]:
        """The CSV/JSON columns: the row dims, the derived columns, the metadata, the
        metrics."""
        return [self.dim, *self.keys, *self.extra, *self.metadata,
                *(c.name for c in self.columns)]

    def table_rows(self) -> list[dict[str, Any]]:
        """One dict per row, keys :meth:`table_columns`; a NaN float is None."""
        out = []
        for i, row in enumerate(self.rows):
            rec: dict[str, Any] = {self.dim: row}
            rec.update({d: v[i] for d, v in self.keys.items()})
            for name, values in self.extra.items():
                rec[name] = _plain(values[i])
            for name, values in self.metadata.items():
                rec[name] = values[i]
            for c in self.columns:
                rec[c.name] = _plain(c.values[i])
            out.append(rec)
        return out

    def metrics_of(self, i: int) -> dict[str, float | None]:
        """Row ``i``'s metric columns: name -> the file's float64 value (None for NaN)."""
        return {c.name: _plain(c.values[i]) for c in self.columns}

    def manifest_metrics(self, i: int) -> dict[str, float | None]:
        """Row ``i``'s metric values keyed by their full names: every label of the
        variable's dims but the primary row dim, in the variable's order (the stacked keys'
        too: ``auroc[detector=msp,ood_set=near]``), so that each reads back from the file at
        the row's primary label (:func:`column_values`); the column names where nothing is
        stacked."""
        out = {}
        for c in self.columns:
            labels = {d: self.keys[d][i] if d in self.keys else c.selection[d] for d in c.dims}
            out[column_name(c.variable, labels)] = _plain(c.values[i])
        return out


def _plain(value: Any) -> Any:
    """A JSON-ready scalar: numpy scalars to Python, NaN and inf to None."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


#: The first characters that make a spreadsheet read a text cell as a formula (OWASP's list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A table value as a CSV cell for a spreadsheet: floats at full precision (``repr``),
    empty for a missing value (None, NaN), numbers as they are; text that a spreadsheet would
    run as a formula (a label from a received file such as ``=HYPERLINK(...)``: starting with
    one of :data:`FORMULA_STARTS`) prefixed with ``'``, which spreadsheets show as text. The
    JSON tables beside the CSVs keep every label as it is.

    Examples
    --------
    >>> [csv_cell(v) for v in (0.1, float("nan"), None, 3, -0.5, "resnet50", "=1+1", "-x")]
    ['0.1', '', '', 3, '-0.5', 'resnet50', "'=1+1", "'-x"]
    """
    if value is None:
        return ""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def format_value(value: Any) -> str:
    """A cell's shown text: 4 decimals, scientific notation outside [1e-3, 1e4), ``–`` for a
    missing value (NaN, None), ``∞`` and ``−∞`` for the infinities (a value, not a missing
    one: an infinite NLL is a prediction that gave the label probability 0); integers and
    strings as they are.

    Examples
    --------
    >>> format_value(0.123456), format_value(2.5e-05), format_value(float("nan")), format_value(3)
    ('0.1235', '2.500e-05', '–', '3')
    >>> format_value(float("inf")), format_value(float("-inf"))
    ('∞', '−∞')
    """
    if value is None:
        return "–"
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (bool, int, str)):
        return str(value)
    value = float(value)
    if math.isinf(value):
        return "∞" if value > 0 else "−∞"
    if math.isnan(value):
        return "–"
    if value != 0 and not 1e-3 <= abs(value) < 1e4:
        return f"{value:.3e}"
    return f"{value:.4f}"


def exact_value(value: Any) -> str:
    """A float as the shortest text that reads back to the same float64 (``repr``), ``NaN``
    for a missing one, ``Infinity`` and ``-Infinity`` for the infinities (what both the page's
    ``parseFloat`` and Python's ``float`` read; ``repr``'s ``inf`` reads as NaN in the page,
    which sorted it with the missing values): the ``data-value`` of a cell.

    Examples
    --------
    >>> exact_value(0.1), exact_value(None), exact_value(float("-inf"))
    ('0.1', 'NaN', '-Infinity')
    """
    if value is None:
        return "NaN"
    value = float(value)
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return "NaN" if math.isnan(value) else repr(value)


def column_name(variable: str, selection: Mapping[str, Any]) -> str:
    """``variable`` or ``variable[dim=label,...]`` (labels as ``str``)."""
    if not selection:
        return variable
    return f"{variable}[{','.join(f'{d}={v}' for d, v in selection.items())}]"


def parse_column(name: str) -> tuple[str, dict[str, str]]:
    """The variable and the ``{dim: label}`` selection of a column name (:func:`column_name`).

    Examples
    --------
    >>> parse_column("ece[calibration=temperature]")
    ('ece', {'calibration': 'temperature'})
    """
    m = _COLUMN.match(name) if isinstance(name, str) else None
    if m is None:
        raise ValueError(f"column name must be 'variable' or 'variable[dim=label,...]', got "
                         f"{name!r}")
    selection = {}
    for part in filter(None, (m["sel"] or "").split(",")):
        dim, eq, label = part.partition("=")
        if not eq or not dim:
            raise ValueError(f"column name {name!r}: {part!r} is not dim=label")
        selection[dim] = label
    return m["var"], selection


def _labels(ds: xr.Dataset, dim: str) -> list[str]:
    """The labels of ``dim`` as text: its index's values, else positions."""
    if dim in ds.indexes:
        return [str(v) for v in ds.indexes[dim]]
    return [str(i) for i in range(ds.sizes[dim])]


def column_values(ds: xr.Dataset, name: str, dim: str) -> np.ndarray:
    """A column's values, shape (row,) along ``dim``, float64, read from ``ds``.

    Parameters
    ----------
    ds : xarray.Dataset
    name : str
        A column name (:func:`column_name`).
    dim : str
        The row dimension.

    Raises
    ------
    ValueError
        The variable, a dim or a label is not in ``ds``, or dims other than ``dim`` remain.
    """
    variable, selection = parse_column(name)
    if variable not in ds.data_vars:
        raise ValueError(f"column {name!r}: no variable {variable!r} in the dataset")
    da = ds[variable]
    for d, label in selection.items():
        if d not in da.dims:
            raise ValueError(f"column {name!r}: {variable!r} has no dim {d!r} (dims "
                             f"{list(da.dims)})")
        labels = _labels(ds, d)
        if label not in labels:
            raise ValueError(f"column {name!r}: label {label!r} not among {d!r}'s {labels}")
        da = da.isel({d: labels.index(label)})
    if da.dims != (dim,):
        raise ValueError(f"column {name!r}: dims {list(da.dims)} remain, expected ({dim!r},)")
    return np.asarray(da.values, dtype=np.float64)


def headline_columns(columns: Sequence[MetricColumn],
                     limit: int = HEADLINE_COLUMNS) -> list[str]:
    """The metric columns a leaderboard shows by default: at most ``limit``, every metric
    variable at the first label of each of its other dims, then dims expanded greedily.

    Start from one column per variable (the first label of each of its other dims; the first
    ``limit`` variables if there are more). Then take the other dims in order of their number
    of labels (fewest first, ties in order of appearance) and show every label of a dim,
    for every variable that has it, where the total stays at most ``limit`` (else the dim
    stays at its first label). E.g. 7 variables along ``calibration`` (``none``,
    ``temperature``) give 14 columns; a variable along 15 corruptions and 5 severities gives
    its 5 severities at the first corruption.

    Parameters
    ----------
    columns : sequence of MetricColumn
        The leaderboard's metric columns, shape (column,).
    limit : int, default HEADLINE_COLUMNS
        At most this many columns (at least 1).

    Returns
    -------
    list of str
        Column names, in the order of ``columns``.

    Raises
    ------
    ValueError
        ``limit`` is not a positive integer.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    first: dict[str, dict[str, str]] = {}  # variable -> {dim: its first label}
    labels: dict[str, list[str]] = {}  # dim -> its labels, in order
    for c in columns:
        first.setdefault(c.variable, dict(c.selection))
        for d, v in c.selection.items():
            if v not in labels.setdefault(d, []):
                labels[d].append(v)
    variables = list(first)[:limit]

    def shown(expanded: set[str]) -> list[str]:
        return [c.name for c in columns if c.variable in variables and all(
            d in expanded or v == first[c.variable][d] for d, v in c.selection.items())]

    expanded: set[str] = set()
    for d in sorted(labels, key=lambda d: len(labels[d])):  # stable: ties in order of appearance
        if len(shown(expanded | {d})) <= limit:
            expanded.add(d)
    return shown(expanded)


def _matches(pattern: str, column: MetricColumn) -> bool:
    """Whether a headline name (``*``: any label of its dim) names ``column``."""
    variable, selection = parse_column(pattern)
    return variable == column.variable and set(selection) == set(column.selection) and all(
        v in ("*", column.selection[d]) for d, v in selection.items())


def _headline(hook: ReportHook, ds: xr.Dataset, columns: Sequence[MetricColumn]) -> list[str]:
    """The hook's headline (checked), else :func:`headline_columns`; in column order."""
    if hook.headline is None:
        return headline_columns(columns)
    chosen = hook.headline(ds) if callable(hook.headline) else hook.headline
    if isinstance(chosen, str) or not all(isinstance(n, str) for n in chosen):
        raise ValueError(f"the report hook's headline must be a list of column names, got "
                         f"{chosen!r}")
    names = [c.name for c in columns]
    shown = [c.name for c in columns if any(_matches(n, c) for n in chosen)]
    if not shown:
        raise ValueError(f"the report hook's headline names {list(chosen)}, which are not "
                         f"metric columns (those are {names})")
    return shown


def _row_dim(ds: xr.Dataset, variables: Sequence[str]) -> str:
    counts: dict[str, int] = {}
    for v in variables:
        for d in ds[v].dims:
            counts[str(d)] = counts.get(str(d), 0) + 1
    if not counts:
        raise ValueError("the result has no metric variable with a dimension (nothing to rank)")
    best = max(counts.values())
    tied = [d for d, n in counts.items() if n == best]
    for d in _PREFERRED_DIMS:
        if d in tied:
            return d
    return tied[0]


def _convention_tag(text: str) -> str:
    """``S.2`` of ``S.2: ...`` (the convention's section), else ``""``."""
    head, sep, _ = text.partition(":")
    return head.strip() if sep and len(head) <= 12 and " " not in head.strip() else ""


def _text(value: Any) -> str:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return ""
    return str(value)


def _groups(values: np.ndarray) -> bool:
    """Whether a coordinate groups rows (default metadata columns): more than one distinct
    value, at most half as many as the rows (identifiers and constants go to the provenance
    panels)."""
    n = len({_text(v) for v in values})
    return 1 < n <= max(2, len(values) // 2)


def _entries(attrs: Mapping[str, Any], dim: str, rows: Sequence[str], path: Path) -> tuple[
        bool, dict[str, dict[str, Any]], dict[str, dict[str, list[Any]]]]:
    """The ``entries`` attr (contract: ``{"dim", "provenance", "conflicts"}``), per row;
    ``ValueError`` naming the file ``path`` for one of another shape (edited or damaged)."""
    entries = decode_attr(attrs.get("entries"))
    if not isinstance(entries, Mapping):
        return False, {}, {}
    prov = entries.get("provenance") or {}
    conf = entries.get("conflicts") or {}
    if entries.get("dim") not in (None, dim):
        raise ValueError(f"the result's entries attr is along {entries.get('dim')!r}, but the "
                         f"report's rows are along {dim!r}")
    for name, table, kind in (("provenance", prov, "{field: value}"),
                              ("conflicts", conf, "{field: [values]}")):
        if not isinstance(table, Mapping) or not all(
                isinstance(v, Mapping) and (name != "conflicts" or all(
                    isinstance(x, list) for x in v.values())) for v in table.values() if v):
            raise ValueError(f"{path}: the entries attr's {name!r} is {table!r:.70}, not an "
                             f"object of rows -> {kind} (edited or damaged); rescore it")
    provenance = {r: dict(prov.get(r) or {}) for r in rows}
    conflicts = {r: {k: list(v) for k, v in (conf.get(r) or {}).items()} for r in rows}
    return True, provenance, conflicts


def _row_dims(hook: ReportHook, ds: xr.Dataset, metrics: Sequence[str], path: Path) -> list[str]:
    """The row dims: the hook's ``rows`` (or ``row_dim``), else the generic choice."""
    if hook.rows is not None:
        dims = [hook.rows] if isinstance(hook.rows, str) else list(hook.rows)
        if not dims or (hook.row_dim is not None and hook.row_dim != dims[0]):
            raise ValueError(f"the report hook's rows {dims!r} must be non-empty and begin with "
                             f"its row_dim {hook.row_dim!r}")
    else:
        entries = decode_attr(ds.attrs.get("entries"))
        recorded = entries.get("dim") if isinstance(entries, Mapping) else None
        dims = [hook.row_dim or (recorded if recorded in ds.dims else _row_dim(ds, metrics))]
    missing = [d for d in dims if d not in ds.dims]
    if missing or len(set(dims)) != len(dims):
        raise ValueError(f"{path}: row dims {dims} are not distinct dimensions of the result "
                         f"(dims {list(ds.dims)})")
    return dims


def _cells(da: xr.DataArray, dims: Sequence[str], index: np.ndarray) -> np.ndarray:
    """``da`` (along a subset of the row dims, nothing else) at every row: shape (row,),
    float64; ``index`` (row, len(dims)) the rows' positions along ``dims``."""
    have = [d for d in dims if d in da.dims]
    values = np.asarray(da.transpose(*have).values, dtype=np.float64)
    return values[tuple(index[:, dims.index(d)] for d in have)] if have else \
        np.full(len(index), float(values))


def _means(hook: ReportHook, ds: xr.Dataset, dims: Sequence[str],
           index: np.ndarray) -> dict[str, list[float]]:
    """The hook's derived mean columns (:class:`ReportHook` ``means``)."""
    out = {}
    for spec in hook.means:
        variable, selection = parse_column(spec)
        if variable not in ds.data_vars or dims[0] not in ds[variable].dims:
            raise ValueError(f"the report hook's mean {spec!r}: no variable {variable!r} along "
                             f"{dims[0]!r}")
        da = ds[variable]
        for d, label in selection.items():
            labels = _labels(ds, d) if d in da.dims else []
            if label not in labels:
                raise ValueError(f"the report hook's mean {spec!r}: {variable!r} has no "
                                 f"{d}={label}")
            da = da.isel({d: labels.index(label)})
        free = [str(d) for d in da.dims if d not in dims]
        name = column_name(variable, {**selection, **{d: "mean" for d in free}})
        out[name] = list(_cells(da.mean(free, skipna=False) if free else da, dims, index))
    return out


def leaderboard(path: str | os.PathLike, protocol: str, hook: ReportHook | None = None,
                ds: xr.Dataset | None = None) -> Leaderboard:
    """The leaderboard of one result file.

    Parameters
    ----------
    path : str or path-like
        The result file.
    protocol : str
        Its protocol (the page's name, the manifest's ids).
    hook : ReportHook, optional
        The protocol's (default: the generic reading of a result-schema file).
    ds : xarray.Dataset, optional
        The file's Dataset when already read (else ``hook.read(path)``).

    Returns
    -------
    Leaderboard
        Without figures (:func:`uqmetrics.report.build_site` draws them).

    Raises
    ------
    ValueError
        The file has no metric variable along a dimension, or the hook's row dims, metadata,
        headline or means name a dimension, coordinate or column the file lacks.
    """
    from ..metrics.conventions import CONVENTIONS
    from ..runs.result_schema import metric_variables, read_result

    hook = hook or ReportHook()
    path = Path(path).resolve()
    if ds is None:
        ds = hook.read(path) if hook.read else read_result(path)
    metrics = dict(hook.metrics(ds) if hook.metrics else metric_variables(ds))
    if not metrics:
        raise ValueError(f"{path}: no metric variable (variables with attrs 'metric' and "
                         "'greater_is_better'); nothing to put on a leaderboard")
    dims = _row_dims(hook, ds, list(metrics), path)
    dim = dims[0]
    primary = _labels(ds, dim)
    index = np.array(list(itertools.product(*(range(ds.sizes[d]) for d in dims))),
                     dtype=np.int64).reshape(-1, len(dims))
    rows = [primary[k] for k in index[:, 0]]
    keys = {d: [_labels(ds, d)[k] for k in index[:, j]] for j, d in enumerate(dims) if j}
    attrs = {k: decode_attr(v) for k, v in ds.attrs.items()}
    conventions = attrs.get("conventions") if isinstance(attrs.get("conventions"), Mapping) \
        else dict(CONVENTIONS)
    own = dict(hook.conventions(ds)) if hook.conventions else {}

    def per_row(values: Sequence[Any]) -> list[Any]:  # per primary label -> per row
        return [values[k] for k in index[:, 0]]

    along = [str(n) for n, c in ds.coords.items() if c.dims == (dim,) and n != dim]
    shown = list(hook.metadata) if hook.metadata is not None else \
        [m for m in along if _groups(ds.coords[m].values)]
    missing = [m for m in shown if m not in along]
    if missing:
        raise ValueError(f"{path}: metadata {missing} are not coordinates along {dim!r} "
                         f"(those are {along})")
    metadata = {m: per_row([_text(v) for v in ds.coords[m].values]) for m in shown}
    hidden = {m: per_row([_text(v) for v in ds.coords[m].values]) for m in along
              if m not in shown}

    columns, skipped = [], []
    for var, (metric, better) in metrics.items():
        da = ds[var]
        if dim not in da.dims:
            skipped.append(var)
            continue
        convention = own.get(var) or _text(decode_attr(da.attrs.get("convention", ""))) or \
            str(conventions.get(metric, "") or CONVENTIONS.get(metric, ""))
        others = [str(d) for d in da.dims if d not in dims]
        for combo in itertools.product(*(_labels(ds, d) for d in others)):
            selection = dict(zip(others, combo, strict=True))
            cell = da.isel({d: _labels(ds, d).index(v) for d, v in selection.items()})
            columns.append(MetricColumn(column_name(var, selection), var, selection, metric,
                                        better, convention, _convention_tag(convention),
                                        _cells(cell, dims, index),
                                        tuple(str(d) for d in da.dims if d != dim)))

    extra = {k: list(v) for k, v in (hook.extra_columns(ds, dim) if hook.extra_columns
                                      else {}).items()}
    for k, v in extra.items():
        if len(v) != len(primary):
            raise ValueError(f"extra column {k!r} has {len(v)} values for {len(primary)} "
                             f"labels of {dim!r}")
        extra[k] = per_row(v)
    extra.update(_means(hook, ds, dims, index))
    recorded, provenance, conflicts = _entries(attrs, dim, primary, path)
    if hook.row_provenance:
        for r, fields in hook.row_provenance(ds).items():
            known = provenance.setdefault(str(r), {})
            for k, v in fields.items():
                if k not in conflicts.get(str(r), {}):
                    known.setdefault(k, v)
    file_provenance = {k: v for k, v in attrs.items() if k.endswith("_version")}
    file_provenance.update({k: attrs[k] for k in FILE_FIELDS if k in attrs})
    for k in ("caches", "input_checksums"):
        if isinstance(attrs.get(k), (Mapping, list)):
            file_provenance[f"{k} (count)"] = len(attrs[k])
    images = hook.images(ds) if callable(hook.images) else hook.images
    board = Leaderboard(
        protocol=protocol, result=path, checksum=dataset_checksum(ds), dim=dim, rows=rows,
        keys=keys, metadata=metadata, hidden_metadata=hidden, extra=extra, columns=columns,
        headline=_headline(hook, ds, columns),
        provenance=provenance, conflicts={r: c for r, c in conflicts.items() if c},
        entries_recorded=recorded, file_provenance=file_provenance, attrs=attrs,
        conventions={str(k): str(v) for k, v in conventions.items()}, skipped=skipped,
        title=hook.title or protocol, description=hook.description,
        subtitle=hook.subtitle(ds) if hook.subtitle else _subtitle(ds, dims, attrs),
        images=str(images or ""), units=dict(hook.units), source=str(path),
        published=list(hook.published(ds)) if hook.published else [])
    labels = [board.label(i) for i in range(len(rows))]
    if len(set(labels)) != len(labels):
        raise ValueError(f"{path}: the rows' names (labels of {dims} joined by '/') are not "
                         "distinct")
    return board


def _subtitle(ds: xr.Dataset, dims: Sequence[str], attrs: Mapping[str, Any]) -> str:
    """The generic line on the run: its rows along each row dim, and its ``dataset_name``."""
    line = " × ".join(f"{ds.sizes[d]} {d}" + ("s" if ds.sizes[d] != 1 and not d.endswith("s")
                                               else "") for d in dims)
    name = attrs.get("dataset_name")
    return line + (f" on dataset {name}" if isinstance(name, str) and name else "")
