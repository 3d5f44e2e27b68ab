"""``uqvision report RESULTS... --out SITE``: the static leaderboard site of score files, a thin
layer over :func:`uqmetrics.report.build_site` (docs/report.md), with each protocol's report
hook (:mod:`uqvision.report_hooks`, whose names are re-exported here) and the published tables
shown beside the score files (``--published``).
"""

from __future__ import annotations

import argparse

from ..report_hooks import (  # noqa: F401  (re-exported: _hook for tests)
    TIMM_UNITS,
    _hook,
    describe_run,
    images_covered,
    register_report_hooks,
    timm_columns,
)
from .base import _print

__all__ = ["TIMM_UNITS", "describe_run", "images_covered", "register_report_hooks",
           "timm_columns"]


def _published_names() -> list[str]:
    from ..published import names  # the data folder only

    return names()


def _published_hooks(tables: list[str]):
    """The registered hooks, those of the protocols of ``tables`` showing their published
    rows (:func:`uqvision.published.report_blocks`); None without tables."""
    if not tables:
        return None
    import dataclasses

    from uqmetrics.report import REPORT_HOOKS

    from ..published import load, report_blocks

    protocols = {load(t).protocol for t in tables}
    return {name: dataclasses.replace(hook, published=lambda ds: report_blocks(ds, tables))
            if name in protocols else hook for name, hook in REPORT_HOOKS.items()}


def _check_published(tables: list[str], results: list[str]) -> None:
    """Refuse a ``--published`` table of a protocol no result file is of (naming theirs)."""
    from uqmetrics import InputError
    from uqmetrics.runs.io import open_netcdf

    from ..published import load

    protocols = set()
    for path in results if tables else ():
        try:
            with open_netcdf(path) as ds:
                protocols.add(str(ds.attrs.get("protocol", "")))
        except (OSError, ValueError):
            return  # the site's reading says what is wrong with the file
    for t in tables:
        if load(t).protocol not in protocols:
            raise InputError(f"--published {t}: no result file is of its protocol "
                             f"{load(t).protocol!r} (theirs: {', '.join(sorted(protocols))})")


def _args_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", metavar="RESULT",
                   help="score files, as `uqvision score NAME` writes them (several of one "
                   "protocol: a page each, named after its dataset)")
    p.add_argument("--out", required=True, help="the site folder (index.html, one page per "
                   "score file, data/, manifest.json); refused when not empty")
    p.add_argument("--overwrite", action="store_true", help="replace a site this command wrote (nothing else in it)")
    p.add_argument("--no-figures", action="store_true", help="leave the figures out")
    p.add_argument("--published", action="append", default=[], metavar="NAME",
                   choices=_published_names(),
                   help="show a published table's rows beside the rows of each score file of "
                        "its protocol that hold its checkpoints, cited and marked published "
                        "(repeatable): %(choices)s (uqvision compare)")
    p.add_argument("--paths", choices=("relative", "absolute"), default="relative",
                   help="how the site names files of this machine: relative (default; the "
                   "result files relative to the site, other paths relative to the result "
                   "file or by name) or absolute (as recorded)")


def _cmd_report(a: argparse.Namespace) -> int:
    from uqmetrics import InputError
    from uqmetrics.report import build_site  # Jinja2 and the readers: imported on use

    from .score import other_tool

    register_report_hooks()
    for path in a.results:  # a result of another tool (a uqreg study): its own report
        tool = other_tool(path)
        if tool is not None:
            raise InputError(f"{str(path)!r} is a result of {tool} (its attrs say so), not a "
                             f"uqvision score file: build its site with {tool} report")
    _check_published(a.published, a.results)
    report = build_site(a.results, a.out, overwrite=a.overwrite, figures=not a.no_figures,
                        paths=a.paths, log=_print, hooks=_published_hooks(a.published))
    _print(f"{report.out / 'index.html'}")
    return 0
