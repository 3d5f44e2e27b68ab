"""The headline table ``uqvision score NAME`` prints and writes beside the score file, read
from the protocol's declared leaderboard (:class:`~uqvision.protocols.base.ReportTable`: its
row dims, headline columns and mean columns), so that the table and the report site's default
view are one definition.

:func:`headline_score_table` gives the :class:`~uqvision.protocols.base.ScoreTable` of a
protocol: its ``make(args, scores)`` reads the scores through
:func:`uqmetrics.report.leaderboard.leaderboard` and returns a :class:`HeadlineTable`, one row
per label of the row dims (e.g. model × detector), the value columns in the report's names
(``coverage[alpha=0.1,calibration=none]``), sorted; ``write`` makes ``STEM.csv``.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import ReportTable, ScoreTable

__all__ = ["TERMINAL_WIDTH", "HeadlineTable", "headline_score_table"]

#: The width (characters) of a table printed to a terminal (:meth:`HeadlineTable.terminal`).
TERMINAL_WIDTH = 120


@dataclass
class HeadlineTable:
    """Rows of a protocol's headline columns.

    Attributes
    ----------
    keys : list of str
        The row dims (the first columns), e.g. ``["model", "detector"]``.
    columns : list of str
        The value columns, in the report's names (:func:`uqmetrics.report.column_name`).
    rows : list of dict
        One dict per row, keys ``keys + columns``; a value not known is NaN.
    caption : str
        The line above the header: the protocol, the rows' order, the labels every column
        shares.
    headline : list of str or None
        The declared headline columns among ``columns`` (the others: the mean columns), what
        :meth:`terminal` prints first; None: the columns in their order.
    """

    keys: list[str]
    columns: list[str]
    rows: list[dict[str, Any]]
    caption: str = ""
    headline: list[str] | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def format(self) -> str:
        """The table as aligned plain text: the caption, a header line, one line per row
        (values to 4 decimals; ``-`` where not known). The labels every column shares are said
        once in the caption, not in each header."""
        from uqmetrics.report import format_value, parse_column

        shared = _shared_labels(self.columns)
        headers = list(self.keys)
        for name in self.columns:
            variable, selection = parse_column(name)
            rest = {d: v for d, v in selection.items() if (d, v) not in shared}
            headers.append(variable + (f"[{','.join(f'{d}={v}' for d, v in rest.items())}]"
                                       if rest else ""))
        cells = [[str(r[k]) for k in self.keys]
                 + ["-" if _missing(r[c]) else format_value(r[c]) for c in self.columns]
                 for r in self.rows]
        widths = [max([len(h)] + [len(row[j]) for row in cells]) for j, h in enumerate(headers)]
        n = len(self.keys)

        def line(values: list[str]) -> str:
            return "  ".join(v.ljust(w) if j < n else v.rjust(w)
                             for j, (v, w) in enumerate(zip(values, widths, strict=True))).rstrip()

        caption = self.caption + ("; every column at " + ",".join(f"{d}={v}" for d, v in shared)
                                  if shared else "")
        return "\n".join([caption, line(headers)] + [line(row) for row in cells])

    def terminal(self, width: int = TERMINAL_WIDTH, *, full: str = "") -> str:
        """The table as printed to a terminal: the headline columns, then the others (the
        mean columns, e.g. shift's accuracy and ECE over its corruptions), each header on
        stacked lines (the variable, then one ``dim=label`` a line, the labels every column
        shares said once in the caption), as many columns, in that order, as fit in ``width``
        characters; a last line says how many are shown and where the full table is
        (``full``, the CSV beside the score file) when columns are left out."""
        from uqmetrics.report import format_value, parse_column

        first = [c for c in (self.headline if self.headline is not None else self.columns)
                 if c in self.columns]
        headline = first + [c for c in self.columns if c not in first]
        shared = _common_labels(headline)
        stacks = [[k] for k in self.keys]
        for name in headline:
            variable, selection = parse_column(name)
            stacks.append([variable] + [f"{d}={v}" for d, v in selection.items()
                                        if (d, v) not in shared])
        cells = [[str(r[k]) for k in self.keys]
                 + ["-" if _missing(r[c]) else format_value(r[c]) for c in headline]
                 for r in self.rows]
        widths = [max([len(h) for h in stack] + [len(row[j]) for row in cells])
                  for j, stack in enumerate(stacks)]
        n = len(self.keys)
        shown, used = n, sum(widths[:n]) + 2 * (n - 1)
        while shown < len(stacks) and (shown == n or used + 2 + widths[shown] <= width):
            used += 2 + widths[shown]
            shown += 1

        def line(values: list[str]) -> str:
            return "  ".join(v.ljust(w) if j < n else v.rjust(w) for j, (v, w) in
                             enumerate(zip(values[:shown], widths[:shown], strict=True))).rstrip()

        depth = max(len(stack) for stack in stacks[:shown])
        header = [line([stack[i] if i < len(stack) else "" for stack in stacks[:shown]])
                  for i in range(depth)]
        caption = self.caption + ("; every column with " + ", ".join(
            f"a {d} at {d}={v}" for d, v in shared) if shared else "")
        lines = [caption, *header, *(line(row) for row in cells)]
        left = len(self.columns) - (shown - n)
        if left:
            lines.append(f"({shown - n} of {len(self.columns)} columns shown"
                         + (f"; all {len(self.columns)}: {full}" if full else "") + ")")
        return "\n".join(lines)

    def to_csv(self) -> str:
        """The CSV text: header ``keys + columns`` (full names), floats at full precision,
        unknown values empty, a label a spreadsheet would run as a formula quoted
        (:func:`uqmetrics.report.csv_cell`)."""
        from uqmetrics.report import csv_cell

        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(self.keys + self.columns)
        for r in self.rows:
            writer.writerow([csv_cell(r[k]) for k in self.keys]
                            + [csv_cell(None if _missing(r[c]) else float(r[c])) for c in self.columns])
        return buf.getvalue()

    def write(self, folder: str | os.PathLike, stem: str, *,
              overwrite: bool = False) -> tuple[Path]:
        """Write ``folder/<stem>.csv`` atomically (:func:`uqmetrics.runs.io.write_text_file`:
        ``FileExistsError`` where it exists and ``overwrite`` is false).

        Returns
        -------
        (Path,)
            The CSV file.
        """
        from uqmetrics.runs.io import write_text_file

        path = Path(folder) / f"{stem}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_file(path, self.to_csv(), overwrite=overwrite)
        return (path,)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _shared_labels(columns: Sequence[str]) -> list[tuple[str, str]]:
    """The ``(dim, label)`` pairs every column selects (none for a single column)."""
    from uqmetrics.report import parse_column

    if len(columns) < 2:
        return []
    pairs = [set(parse_column(c)[1].items()) for c in columns]
    first = list(parse_column(columns[0])[1].items())
    return [p for p in first if all(p in s for s in pairs)]


def _common_labels(columns: Sequence[str]) -> list[tuple[str, str]]:
    """The ``(dim, label)`` pairs that every column selecting along ``dim`` selects, for dims
    that two columns or more select along (e.g. ``calibration=platt`` of every conformal
    column that has a calibration)."""
    from uqmetrics.report import parse_column

    selections = [parse_column(c)[1] for c in columns]
    labels: dict[str, set[str]] = {}
    counts: dict[str, int] = {}
    for sel in selections:
        for d, v in sel.items():
            labels.setdefault(d, set()).add(v)
            counts[d] = counts.get(d, 0) + 1
    return [(d, next(iter(v))) for d, v in labels.items() if len(v) == 1 and counts[d] > 1]


def _hook(report: ReportTable, ds: Any, columns: Sequence[str], means: Sequence[str]):
    """The :class:`uqmetrics.report.ReportHook` of the declaration, with the mean columns
    whose labels the file has (e.g. severity 5 of a file without it: left out)."""
    from uqmetrics.report import ReportHook, parse_column
    from uqmetrics.runs.result_schema import metric_variables

    def present(spec: str) -> bool:
        variable, selection = parse_column(spec)
        return variable in ds.data_vars and all(
            d in ds[variable].dims and d in ds.indexes
            and label in [str(v) for v in ds.indexes[d]] for d, label in selection.items())

    declared = dict(report.metrics)

    def metrics(ds):  # the tagged metrics and the declared ones, in the file's order
        tagged = metric_variables(ds)
        return {str(v): tagged.get(str(v)) or declared[str(v)] for v in ds.data_vars
                if str(v) in tagged or str(v) in declared}

    headline = report.headline if callable(report.headline) else \
        [*report.headline, *columns] or None
    return ReportHook(rows=tuple(report.rows), headline=headline,
                      metrics=metrics, means=[m for m in means if present(m)])


def headline_score_table(report: ReportTable, sort: Sequence[tuple[str, bool | None]], *,
                         columns: Sequence[str] = (), means: Sequence[str] = ()) -> ScoreTable:
    """The :class:`ScoreTable` of a protocol whose leaderboard is ``report``.

    Parameters
    ----------
    report : ReportTable
        The protocol's declaration: its ``rows`` are the table's rows, its ``headline``
        columns then its ``means`` (and ``means`` below) the table's columns.
    sort : sequence of (str, bool or None)
        The rows' order, most significant first: ``(column, descending)`` for a value column
        (a headline name; ``*`` matches its first column; missing values last), or ``(dim,
        None)`` for a row dim (its labels in the file's order). A column the file lacks (mCE
        without a baseline) is passed over.
    columns, means : sequence of str
        Further headline and mean columns of the table only (as ``report.headline`` and
        ``report.means``), e.g. conformal's SSCV, which RAPS's table lacks.

    Returns
    -------
    ScoreTable
        ``make(args, scores) -> HeadlineTable``; ``STEM.csv`` beside the score file.
    """

    def make(args: Any, ds: Any) -> HeadlineTable:
        from uqmetrics.report import parse_column
        from uqmetrics.report.leaderboard import leaderboard

        protocol = str(ds.attrs.get("protocol", ""))
        board = leaderboard(getattr(args, "out", "scores.nc"), protocol,
                            _hook(report, ds, columns, [*report.means, *means]), ds=ds)
        by_name = {c.name: c.values for c in board.columns}
        values = {**{n: by_name[n] for n in board.headline}, **board.extra}
        keys = [board.dim, *board.keys]
        labels = {board.dim: board.rows, **board.keys}
        rows = [{**{k: labels[k][i] for k in keys}, **{c: float(v[i]) for c, v in values.items()}}
                for i in range(len(board.rows))]
        # a row none of whose columns along every row dim is known was not scored (a member
        # detector of a single network): left out, as from the paper's table
        full = [c.name for c in board.columns if c.name in board.headline
                and set(board.keys) <= set(c.dims)] if board.keys else []
        scored = [r for r in rows if not full or not all(_missing(r[c]) for c in full)]
        left_out = len(rows) - len(scored)
        rows = scored
        order, said = [], []
        for name, descending in sort:
            if descending is None and name in keys:
                first = list(dict.fromkeys(labels[name]))
                order.append(lambda r, name=name, first=first: first.index(r[name]))
                said.append(name)
                continue
            variable, selection = parse_column(name)
            match = [c for c, (var, sel) in ((c, parse_column(c)) for c in values)
                     if var == variable and set(sel) == set(selection)
                     and all(v in ("*", sel[d]) for d, v in selection.items())]
            if not match:
                continue
            col, sign = match[0], -1.0 if descending else 1.0
            order.append(lambda r, col=col, sign=sign: (
                _missing(r[col]), 0.0 if _missing(r[col]) else sign * r[col]))
            said.append(f"{col} {'descending' if descending else 'ascending'}")
        rows.sort(key=lambda r: tuple(f(r) for f in order))
        caption = f"{protocol}: a row per {' × '.join(keys)}" + (
            f", sorted by {', then '.join(said)}" if said else "") + (
            f"; {left_out} not scored, left out" if left_out else "")
        return HeadlineTable(keys, list(values), rows, caption,
                             headline=[n for n in board.headline if n in values])

    return ScoreTable(make, suffixes=(".csv",))
