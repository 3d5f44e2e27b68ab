"""The cells of a sweep: one independent unit of work (:class:`Cell`), where its result file
goes and whether it is there whole (:func:`cell_path`, :func:`is_complete`: the resume), and how a
worker runs one, returning its error as a value (:class:`CellFailure`).
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..io import IncompleteResultError, read_dataset, write_dataset

_KEY = re.compile(r"^[A-Za-z0-9._=+-]+$")


@dataclass(frozen=True)
class Cell:
    """One independent unit of a sweep.

    Attributes
    ----------
    key : str
        Unique file stem (letters, digits, ``._=+-``); the result goes to ``<out_dir>/<key>.nc``.
    params : mapping
        Arguments of the cell function (must pickle).
    """

    key: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not _KEY.fullmatch(self.key):  # not match: its "$" lets a final newline by
            raise ValueError(f"cell key must match {_KEY.pattern}, got {self.key!r}")


@dataclass
class SweepReport:
    """What a sweep did: paths of computed and skipped cells, and errors by cell key."""

    computed: list[Path] = field(default_factory=list)
    skipped: list[Path] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def paths(self) -> list[Path]:
        return sorted(self.computed + self.skipped)


def cell_path(out_dir, cell: Cell) -> Path:
    return Path(out_dir) / f"{cell.key}.nc"


def is_complete(path) -> bool:
    """True if ``path`` is a complete, intact result file (written by :func:`write_dataset`).

    False when it is missing, unfinished (no completeness flag), unreadable (truncated,
    metadata netCDF cannot open) or corrupt (data that do not match the checksums recorded
    when it was written, :class:`uqmetrics.runs.io.CorruptResultError`): a sweep recomputes it. A
    file written before checksums were recorded is complete when it reads."""
    try:
        read_dataset(path).close()
        return True
    except (FileNotFoundError, IncompleteResultError, OSError, ValueError):
        return False


#: The attribute by which a cell function lets its results be written behind
#: (:func:`_run_cell`): true when it reads and writes no netCDF file itself.
WRITE_BEHIND = "write_behind"

#: In this process: the sweeps (run ids) that were interrupted, whose cells write nothing more,
#: and the cell files being written, by run (:func:`_run_cell`, :func:`stop_writes`).
_STOPPED: set[str] = set()
_WRITING: dict[str, int] = {}
_WRITES = threading.Condition()


def stop_writes(run: str) -> None:
    """The sweep ``run`` was interrupted: its cells that run in this process (a cluster of
    threads, ``processes=False``) write no file from now on, and this returns once the writes
    already under way are done (whole files: none is cut). So no file of the sweep appears
    after the interrupt has reached its caller, in the caller's process. A second Ctrl-C
    stops the wait. Workers in other processes are stopped by closing or cancelling."""
    with _WRITES:
        _STOPPED.add(run)
        _WRITES.wait_for(lambda: not _WRITING.get(run))


def _leave_pool() -> bool:
    """Take this task out of its Dask worker's thread pool (``distributed.secede``), so that
    the worker starts its next cell now; False outside a Dask worker (nothing done)."""
    try:
        from distributed import get_worker, secede

        get_worker()
    except (ImportError, ValueError):
        return False
    secede()
    return True


def _run_cell(func: Callable[..., Any], params: Mapping[str, Any], path: str,
              run: str = "") -> str:
    """Worker side: compute one cell and write it atomically (replacing an incomplete file).

    When ``func`` has a true :data:`WRITE_BEHIND` attribute, the task leaves its worker's
    thread pool once the result is computed (:func:`_leave_pool`): the worker computes its next
    cell while this one writes. The task still ends only once its file is written whole, so a
    write's error is this cell's (never lost) and a cell is reported done only when it is on
    disk. The netCDF work of one process is serialised (:data:`uqmetrics.runs.io.NETCDF_LOCK`,
    which the caller's reads hold too: netCDF-C is not thread-safe). A cell holding a
    resource (``resources``, a GPU) keeps it until written, as Dask keeps a seceded task's
    resources. A cell of a sweep ``run`` interrupted meanwhile (:func:`stop_writes`) writes
    nothing and fails."""
    ds = func(**params)
    if getattr(func, WRITE_BEHIND, False):
        _leave_pool()
    with _WRITES:
        if run in _STOPPED:
            raise RuntimeError("the sweep was interrupted before this cell was written")
        _WRITING[run] = _WRITING.get(run, 0) + 1
    try:
        write_dataset(ds, path, overwrite=True)
    finally:
        with _WRITES:
            _WRITING[run] -= 1
            if not _WRITING[run]:
                del _WRITING[run]
                _WRITES.notify_all()
    return path


@dataclass(frozen=True)
class CellFailure:
    """What a cell that raised returns from its worker (:func:`run_sweep`).

    Attributes
    ----------
    error : str
        The exception as ``traceback.format_exception_only`` gives it (``"Type: message"``).
    traceback : str
        The full formatted traceback, for the log file.
    """

    error: str
    traceback: str


#: Whether this process's allocator has been given back its reuse of large blocks
#: (:func:`heap_for_arrays`).
_HEAP_SET = False


def heap_for_arrays() -> None:
    """Give the glibc allocator of a process started by Dask's nanny back its reuse of large
    blocks, once per process (every sweep cell calls it first, on its worker).

    Dask's nanny starts its workers with ``MALLOC_TRIM_THRESHOLD_=65536`` (to return freed memory
    to the system sooner; ``distributed.nanny.pre-spawn-environ``). Setting it turns off glibc's
    adaptive mmap threshold: every block over 128 KiB (each activation, batch, dropout mask and
    random draw) is then mapped and page-faulted afresh each time it is made. A uqvision predict
    cell ran at half the speed of the same call in a plain process, a uqreg paper-e1 cell 1.9 to
    2.6x slower (packages/uqreg/benchmarks/bench_worker_env.py). Here blocks up to 32 MiB
    (glibc's own adaptive maximum) come from the heap again, and at most 64 MiB free at its top is
    kept. Nothing is done in a process started without the variable, or without glibc; one
    started with it, whoever set it, is changed."""
    global _HEAP_SET
    if _HEAP_SET or "MALLOC_TRIM_THRESHOLD_" not in os.environ or not sys.platform.startswith("linux"):
        return
    _HEAP_SET = True
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
        libc.mallopt(m_mmap_threshold, 32 << 20)
        libc.mallopt(m_trim_threshold, 64 << 20)
    except (OSError, AttributeError):  # not glibc
        pass


def _guarded_cell(func: Callable[..., Any], params: Mapping[str, Any], path: str,
                  run: str = "") -> str | CellFailure:
    """Worker side: :func:`heap_for_arrays`, then :func:`_run_cell`, an exception returned as a
    :class:`CellFailure`.

    Dask sees a task that finished: its worker logs nothing (an exception raised out of a task
    is logged by the worker as a "Compute Failed" block with the whole traceback, on the
    console of the process that started the cluster)."""
    heap_for_arrays()
    try:
        return _run_cell(func, params, path, run)
    except Exception as exc:  # noqa: BLE001  (reported by the caller, one line per cell)
        return CellFailure("".join(traceback.format_exception_only(type(exc), exc)).strip(),
                           "".join(traceback.format_exception(type(exc), exc,
                                                              exc.__traceback__)))
