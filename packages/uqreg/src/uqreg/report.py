"""uqreg's part of the report site (``uqreg report STUDY.nc --out SITE``; docs/report.md): the
``uqreg`` hook of :data:`uqmetrics.report.REPORT_HOOKS` (registered on import).

A study file (:mod:`uqreg.study`) is not a result-schema file: it holds the raw per-repetition
variables and their summary. Its leaderboard has one row per method and, as columns, summary
variables the file holds (so that every value on the site is the file's, which ``verify``
reads back): per recipe, complexity and region (``in``/``out`` of the training box),

- ``region_coverage``: mean over repetitions of the fraction of the region's points covered
  (the file's ``coverage_convention`` and ``region_convention``; nominal: the file's
  ``1 - alpha``, neither higher nor lower is better);
- ``region_deviation_mean``: mean over repetitions of the region-mean ``|prediction -
  truth|`` (lower is better);
- ``region_uncertainty_ratio``: mean over the region's points of the method's mean
  uncertainty over the exact reference's (1 is the reference; neither direction is better);
- ``score_mace_mean`` and ``score_crps_mean``: the user's view (R.8), per recipe and complexity:
  the mean over repetitions of the method's mean absolute calibration error and CRPS against new
  noisy targets (lower is better; the exact reference's attainable values are the file's
  ``reference_score_mace_mean`` and ``reference_score_crps_mean``, named in the column's
  convention).

Its figures are those ``uqreg plot`` draws of the file (:func:`uqreg.plots.plot_result`, one
dispatch over :data:`uqreg.plots.RESULT_KINDS`: a study's coverage vs complexity with bands, ..., a
real-data study's calibration and scores), as SVG.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from uqmetrics.report import REPORT_HOOKS, ReportHook
from uqmetrics.runs.io import decode_attr

__all__ = ["COLUMNS", "HOOK", "PROTOCOL", "cmd_report"]

#: The protocol name of a study on the site and in its manifest.
PROTOCOL = "uqreg"
#: The leaderboard's variables: variable -> (metric name, greater_is_better or None).
COLUMNS: dict[str, tuple[str, bool | None]] = {
    "region_coverage": ("coverage", None),
    "region_deviation_mean": ("deviation", False),
    "region_uncertainty_ratio": ("uncertainty_ratio", None),
    "score_mace_mean": ("mace", False),
    "score_crps_mean": ("crps", False),
}
#: The file attrs that state each variable's convention.
_CONVENTION_ATTRS = {
    "region_coverage": ("coverage_convention", "region_convention"),
    "region_deviation_mean": ("region_convention",),
    "region_uncertainty_ratio": ("uncertainty_ratio_convention", "region_convention"),
    "score_mace_mean": ("score_convention",),
    "score_crps_mean": ("score_convention",),
}


def _read(path: Path):
    """The result file at ``path``; refused (:class:`uqmetrics.InputError`, naming it) unless it
    is of a kind :func:`uqreg.plots.result_kind` recognises that has a leaderboard (a study, a
    real-data study; a disentanglement study or a reference is drawn by ``uqreg plot``)."""
    from uqmetrics import InputError, read_dataset

    from .plots import result_kind

    ds = read_dataset(path)
    kind = result_kind(ds, path)
    if not kind.leaderboard:
        raise InputError(f"{path} is a {kind.name} result ({kind.description}), which has no leaderboard; "
                         f"draw its figures with uqreg plot {path}")
    return ds


def _metrics(ds) -> dict[str, tuple[str, bool | None]]:
    return {v: m for v, m in COLUMNS.items() if v in ds.data_vars}


def _conventions(ds) -> dict[str, str]:
    out = {}
    for var, attrs in _CONVENTION_ATTRS.items():
        parts = [str(ds.attrs[a]) for a in attrs if a in ds.attrs]
        if var in ds.data_vars and "description" in ds[var].attrs:
            parts.append(str(ds[var].attrs["description"]))
        out[var] = "; ".join(parts)
    return out


def _row_provenance(ds) -> dict[str, dict[str, Any]]:
    """Per method: its wall time (the study's ``wall_time_s`` attr), the study's seed."""
    wall = decode_attr(ds.attrs.get("wall_time_s"))
    out: dict[str, dict[str, Any]] = {}
    for m in map(str, ds.indexes["method"]):
        fields: dict[str, Any] = {}
        if isinstance(wall, dict) and m in wall:
            fields["wall_time_s"] = wall[m]
        if "seed" in ds.attrs:
            fields["seeds"] = decode_attr(ds.attrs["seed"])
        out[m] = fields
    return out


def _figures(path: Path, ds, out: Path) -> list[Path]:
    """The figures ``uqreg plot`` draws of the file (:func:`uqreg.plots.plot_result`: one dispatch
    for both commands)."""
    from .plots import plot_result

    return plot_result(ds, out, source=path)


#: The hook of a study file.
HOOK = ReportHook(
    title="uqreg", row_dim="method", read=_read, metrics=_metrics, conventions=_conventions,
    row_provenance=_row_provenance, figures=_figures,
    description="Deep-regression UQ against the exact Bayesian reference: per method, the "
                "coverage, deviation and uncertainty ratio in and out of the training box, and the "
                "MACE and CRPS against new noisy targets, per recipe and complexity (the study's "
                "summary).")

if PROTOCOL not in REPORT_HOOKS:
    REPORT_HOOKS.add(PROTOCOL, HOOK)


def cmd_report(a: argparse.Namespace) -> int:
    """``uqreg report FILE --out SITE [--overwrite] [--no-figures] [--paths absolute]``."""
    from uqmetrics.report import build_site

    path = Path(a.file)
    if path.is_dir():
        path = path / "study.nc"
    report = build_site([path], a.out, protocol=PROTOCOL, overwrite=a.overwrite,
                        figures=not a.no_figures, paths=getattr(a, "paths", "relative"),
                        log=print)
    print(report.out / "index.html")
    return 0
