"""The failed models of a sweep: their kinds (:data:`FAILURE_KINDS`), the failures file kept
current while a sweep runs (:data:`FAILURES_FILE`, :class:`_FailureLog`), the log file of
their tracebacks (:data:`LOG_FILE`) and the report by model (:class:`ModelSweepReport`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from uqmetrics.runs.sweep import SweepReport, write_failures

from ..models import ModelSpec
from .weights import WeightsStatus, _line

__all__ = ["FAILURES_FILE", "FAILURE_KINDS", "LOG_FILE", "ModelSweepReport"]


#: Name of the failures file (:func:`sweep_predictions`; ``uqvision sweep`` writes it beside
#: ``caches/``).
FAILURES_FILE = "sweep_failures.json"


#: Name of the log file ``uqvision sweep`` writes beside ``caches/``: the full traceback of
#: every failed cell, and distributed's log records (``uqmetrics.runs.sweep.run_sweep``'s
#: ``log_file``).
LOG_FILE = "sweep.log"


#: Kinds of failure records (``kind`` in the failures file), each with what to do about it.
FAILURE_KINDS = {
    "failed": "a cell raised (out of memory, a corrupt file, a download): rerun the same "
              "command to retry (finished caches are kept)",
    "weights": "no weights to load (not cached and offline or the hub unreachable, or no "
               "pretrained weights): fetch them where the network is allowed, or give local "
               "files (NAME=FILE, --weights-dir)",
    "refused": "its caches in the output folder were computed from other inputs (kept): pass "
               "--overwrite to recompute them, or sweep into another --out",
    "unknown": "a name the installed timm / torchvision does not know: upgrade them, or leave "
               "the model out",
}


@dataclass
class ModelSweepReport(SweepReport):
    """:class:`uqmetrics.runs.sweep.SweepReport` with the failures by model.

    Attributes
    ----------
    failed_models : dict
        Model row -> record, as in the failures file: ``model``, ``name``, ``checkpoint``,
        ``kind`` (:data:`FAILURE_KINDS`: ``failed`` in a cell, ``weights``, ``refused``,
        ``unknown``), ``error`` (one line, complete), ``cause`` (a cause shared with other
        models, e.g. offline, or empty), ``cells`` (the failed cell keys; empty for a model that
        failed before any cell ran), ``time`` (UTC, ISO 8601), ``attempts`` (consecutive sweeps
        it failed in), ``retried`` (True when an earlier sweep had recorded it as failed and
        this one tried it again) and ``left_out`` (True for a recorded model
        ``retry_failed=False`` left out: the record is the earlier sweep's).
    failures_file : pathlib.Path or None
        Where they were written.
    failures_error : str or None
        Why the failures file could not be written (a full disk: the records are here only),
        else None.
    weights : dict
        Model row -> :class:`WeightsStatus`, as looked up before the cells ran.
    log_file : pathlib.Path or None
        Where the full tracebacks went (``log_file`` of :func:`sweep_predictions`).
    datasets : dict
        Cache file stem (cell key) -> the dataset name of its folder, for every planned cell:
        the ``--data``'s and those of the extra sets' members (``sets``).
    """

    failed_models: dict[str, dict] = field(default_factory=dict)
    failures_file: Path | None = None
    failures_error: str | None = None
    weights: dict[str, WeightsStatus] = field(default_factory=dict)
    log_file: Path | None = None
    datasets: dict[str, str] = field(default_factory=dict)

    def of_dataset(self, name: str) -> ModelSweepReport:
        """A copy whose ``computed`` and ``skipped`` are the caches of dataset ``name`` only
        (the ``--data``'s, which the sweep's protocols score); the failures are all kept."""
        def mine(paths: list[Path]) -> list[Path]:
            return [p for p in paths if self.datasets.get(Path(p).stem, name) == name]
        return dataclasses.replace(self, computed=mine(self.computed),
                                   skipped=mine(self.skipped))


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class _FailureLog:
    """The failures file kept current while a sweep runs (written atomically on every change).

    It lists the models that failed in this sweep, and, until their cells finish in this run,
    the models a previous run recorded as failed (an interrupted rerun keeps their record);
    a model whose cells all succeed leaves it. Models no longer in the sweep are dropped. A
    file that cannot be written (a full disk) is reported once, in one line on stderr; the
    sweep goes on, and the next change tries again.
    """

    def __init__(self, path: Path, previous: list[dict], models: Iterable[str]):
        self.path = path
        self.previous = {r["model"]: r for r in previous if isinstance(r.get("model"), str)}
        self.pending = {m: self.previous[m] for m in models if m in self.previous}
        self.current: dict[str, dict] = {}
        self.error: str | None = None  # why the last write failed
        self.reported = False

    def fail(self, spec: ModelSpec, error: str, cell: str | None = None, *,
             kind: str = "failed", cause: str = "", write: bool = True) -> None:
        """Record a failure of ``spec`` (of its cell ``cell``, or before any cell) and write the
        file, unless ``write`` is false: the failures found before the sweep starts (a
        thousand models without weights) are recorded first and written once, by
        :meth:`write`, instead of rewriting a growing file per model."""
        rec = self.current.get(spec.row)
        if rec is None:
            before = self.previous.get(spec.row)
            rec = self.current[spec.row] = {
                "model": spec.row, "name": spec.name, "checkpoint": spec.checkpoint,
                "kind": kind, "error": _line(error), "cause": cause, "cells": [],
                "time": _now(), "attempts": int((before or {}).get("attempts", 0)) + 1,
                "retried": before is not None, "left_out": False}
        if cell is not None:
            rec["cells"].append(cell)
        self.pending.pop(spec.row, None)
        if write:
            self.write()

    def keep(self, record: dict) -> None:
        """A previous failure carried over without a retry."""
        self.current[record["model"]] = {"kind": "failed", "cause": "", **record,
                                         "retried": False, "left_out": True}
        self.pending.pop(record["model"], None)

    def finished(self, row: str) -> None:
        if self.pending.pop(row, None) is not None:
            self.write()

    def write(self) -> None:
        try:
            write_failures(self.path, [*self.current.values(), *self.pending.values()])
        except OSError as err:
            self.error = _line(err.strerror or err)
            if not self.reported:
                self.reported = True
                print(f"uqvision sweep: cannot write the failures file {str(self.path)!r} "
                      f"({self.error}); the sweep goes on, the caches written are kept, and "
                      "the failures are listed at the end", file=sys.stderr, flush=True)
        else:
            self.error = None
