"""The presenting and checking layer of uqmetrics: the static leaderboard site of result files
(:mod:`~uqmetrics.report.leaderboard`, :mod:`~uqmetrics.report.site`; ``uqvision report``,
``uqreg report``; docs/report.md), the figures (:mod:`~uqmetrics.report.plotting`) and the
check of a site against its result files (:mod:`~uqmetrics.report.verify`). The top layer: it
may import :mod:`uqmetrics.runs` and :mod:`uqmetrics.metrics`, which never import it. This face
exports the site's names; :mod:`~uqmetrics.report.plotting` (matplotlib) and
:mod:`~uqmetrics.report.verify` are imported by their paths.

:func:`build_site` reads result files (any file that follows the result schema, or what a
protocol's :class:`ReportHook` in :data:`REPORT_HOOKS` reads) and writes a folder that opens
from disk with no network: ``index.html``, ``<protocol>.html`` per protocol (a sortable,
filterable leaderboard, one row per model or method (or per model and detector, ..., where
the protocol stacks dims into its rows), every metric column linked to its convention, the
headline columns shown and the others behind a column chooser; each row's provenance in an
expandable panel, a row whose caches disagree flagged; the protocol's figures inlined as SVG;
several files of one protocol get a page each, ``<protocol>-<dataset>.html``),
``conventions.html``, ``data/<page>.csv`` and ``.json`` (the tables) and ``manifest.json``
(every entry's metric values, the result file and its checksum: what ``verify`` checks). The
site names no folder of the machine that built it unless ``paths="absolute"``.

uqmetrics imports neither uqvision nor uqreg: they register their hooks here. Jinja2 renders
the pages (imported on use); the script and the style sheet are package data, inlined.
"""

from .leaderboard import (
    HEADLINE_COLUMNS,
    Leaderboard,
    MetricColumn,
    PublishedRows,
    ReportHook,
    column_name,
    column_values,
    csv_cell,
    exact_value,
    format_value,
    headline_columns,
    leaderboard,
    parse_column,
)
from .site import (
    GENERATOR,
    MANIFEST_VERSION,
    PATHS,
    REPORT_HOOKS,
    SiteReport,
    build_site,
    read_manifest,
    shown_path,
)

__all__ = ["GENERATOR", "HEADLINE_COLUMNS", "MANIFEST_VERSION", "PATHS", "REPORT_HOOKS",
           "Leaderboard", "MetricColumn", "PublishedRows", "ReportHook", "SiteReport", "build_site",
           "column_name", "column_values", "csv_cell", "exact_value", "format_value",
           "headline_columns", "leaderboard", "parse_column", "read_manifest", "shown_path"]
