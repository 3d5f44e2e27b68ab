"""Resumable sweeps of independent cells on Dask (used by uqreg and uqvision).

A sweep is a list of :class:`Cell` s, each a JSON-serialisable parameter mapping with a unique
key. :func:`run_sweep` sends every cell whose result file is not already on disk to a Dask
cluster (a ``LocalCluster`` by default, any cluster by its scheduler address); each worker
computes its cell's :class:`xarray.Dataset` and writes it atomically with
:func:`uqmetrics.io.write_dataset`. A rerun skips the complete files, so an interrupted sweep
resumes without redoing finished cells and never leaves a half-written file. A cell that raises
is reported, not fatal: the other cells still run.

Progress (:func:`progress_bar`, shared with uqreg's study loop): a tqdm bar when the stream is
a terminal; otherwise (CI logs, ``cmd > log``, a pipe) one plain line at most every
:data:`LOG_PROGRESS_INTERVAL` seconds and one at the end (:class:`LogProgress`), never a bar
redrawn for every cell.

``dask.distributed`` and ``tqdm`` are imported lazily: the rest of uqmetrics needs neither.
"""

from __future__ import annotations

import re
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .io import IncompleteResultError, read_dataset, write_dataset

__all__ = ["LOG_PROGRESS_INTERVAL", "Cell", "LogProgress", "SweepReport", "cell_path",
           "is_complete", "progress_bar", "run_sweep"]

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
        if not _KEY.match(self.key):
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


#: Seconds between progress lines when the stream is not a terminal.
LOG_PROGRESS_INTERVAL = 30.0


class LogProgress:
    """Progress for logs (a stream that is not a terminal): a line when at least ``interval``
    seconds passed since the last one, and one at :meth:`close`.

    Parameters
    ----------
    total : int
        Number of units expected.
    desc : str
        Prefix of every line.
    interval : float, default :data:`LOG_PROGRESS_INTERVAL`
        Minimum seconds between two lines before :meth:`close` (0: a line per update).
    stream : file-like, optional
        Where lines go; default ``sys.stderr`` at construction.
    unit : str, default "item"
        Unit name; lines read ``"<desc>: <n>/<total> <unit>s (<pct>%) [<postfix>], <t> s"``.
    clock : callable, default :func:`time.monotonic`
        Seconds source (a test may pass a fake clock).

    Examples
    --------
    >>> import io
    >>> out = io.StringIO()
    >>> bar = LogProgress(3, "sweep", interval=3600.0, stream=out, unit="cell", clock=lambda: 0.0)
    >>> for _ in range(3):
    ...     bar.update(1)
    >>> bar.close()
    >>> print(out.getvalue(), end="")
    sweep: 3/3 cells (100%), 0 s
    """

    def __init__(self, total: int, desc: str, interval: float = LOG_PROGRESS_INTERVAL,
                 stream=None, *, unit: str = "item", clock: Callable[[], float] = time.monotonic):
        if not interval >= 0:
            raise ValueError(f"interval must be >= 0 seconds, got {interval!r}")
        self.total, self.desc, self.interval, self.unit = total, desc, interval, unit
        self.stream = sys.stderr if stream is None else stream
        self.clock = clock
        self.n, self.postfix = 0, ""
        self.t0 = self.last = clock()
        self.lock = threading.Lock()

    def set_postfix_str(self, s: str) -> None:
        self.postfix = s

    def _line(self) -> None:
        pct = 100.0 * self.n / self.total if self.total else 100.0
        postfix = f" {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {self.n}/{self.total} {self.unit}s ({pct:.0f}%){postfix}, "
              f"{self.clock() - self.t0:.0f} s", file=self.stream, flush=True)

    def update(self, n: int = 1) -> None:
        with self.lock:
            self.n += n
            now = self.clock()
            if now - self.last >= self.interval:
                self.last = now
                self._line()

    def close(self) -> None:
        with self.lock:
            self._line()


class _NoProgress:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str, *, unit: str = "item", enabled: bool = True,
                 stream=None, interval: float = LOG_PROGRESS_INTERVAL, leave: bool = True):
    """A progress reporter with ``update(n)``, ``set_postfix_str(s)`` and ``close()``.

    Parameters
    ----------
    total : int
    desc : str
    unit : str, default "item"
    enabled : bool, default True
        False: a reporter that prints nothing.
    stream : file-like, optional
        Default ``sys.stderr`` (looked up at call time).
    interval : float, default :data:`LOG_PROGRESS_INTERVAL`
        Seconds between log lines when ``stream`` is not a terminal.
    leave : bool, default True
        Keep tqdm's bar on screen after :meth:`close` (terminals only).

    Returns
    -------
    tqdm.tqdm or LogProgress
        A tqdm bar when ``stream.isatty()``; otherwise :class:`LogProgress` (at most one line
        per ``interval`` seconds plus one at the end).
    """
    if not enabled:
        return _NoProgress()
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, leave=leave, file=stream)
    return LogProgress(total, desc, interval, stream, unit=unit)


def cell_path(out_dir, cell: Cell) -> Path:
    return Path(out_dir) / f"{cell.key}.nc"


def is_complete(path) -> bool:
    """True if ``path`` is a complete result file (written by :func:`write_dataset`)."""
    try:
        read_dataset(path).close()
        return True
    except (FileNotFoundError, IncompleteResultError, OSError, ValueError):
        return False


def _run_cell(func: Callable[..., Any], params: Mapping[str, Any], path: str) -> str:
    """Worker side: compute one cell and write it atomically (replacing an incomplete file)."""
    ds = func(**params)
    write_dataset(ds, path, overwrite=True)
    return path


def run_sweep(cells: Iterable[Cell], func: Callable[..., Any], out_dir, *, scheduler: str | None = None,
              n_workers: int = 2, threads_per_worker: int = 1, overwrite: bool = False,
              progress: bool = True, client: Any = None,
              progress_interval: float = LOG_PROGRESS_INTERVAL) -> SweepReport:
    """Run every cell not already on disk, on Dask.

    Parameters
    ----------
    cells : iterable of Cell
        Unique keys required.
    func : callable
        Top-level (picklable) function ``func(**cell.params) -> xarray.Dataset``.
    out_dir : path
        Directory of the cell files.
    scheduler : str, optional
        Address of an existing Dask scheduler (``tcp://host:8786``); default: start a
        ``LocalCluster`` with ``n_workers`` processes of ``threads_per_worker`` threads.
    overwrite : bool
        Recompute cells whose files exist.
    progress : bool
        Report progress on stderr: a bar on a terminal, otherwise a line at most every
        ``progress_interval`` seconds and one at the end (:func:`progress_bar`).
    client : dask.distributed.Client, optional
        Use this client (neither ``scheduler`` nor a new cluster).
    progress_interval : float, default :data:`LOG_PROGRESS_INTERVAL`
        Seconds between progress lines when stderr is not a terminal.

    Returns
    -------
    SweepReport
    """
    from dask.distributed import Client, LocalCluster, as_completed

    cells = list(cells)
    keys = [c.key for c in cells]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})
        raise ValueError(f"cell keys must be unique, repeated: {dup}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = SweepReport()
    todo = []
    for cell in cells:
        path = cell_path(out, cell)
        if not overwrite and is_complete(path):
            report.skipped.append(path)
        else:
            todo.append(cell)
    if not todo:
        return report

    own_cluster = None
    if client is None:
        if scheduler:
            client = Client(scheduler)
        else:
            own_cluster = LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker,
                                       processes=True, dashboard_address=":0")
            client = Client(own_cluster)
        own_client = True
    else:
        own_client = False
    try:
        futures = {client.submit(_run_cell, func, dict(c.params), str(cell_path(out, c)), key=f"cell-{c.key}",
                                 pure=False): c for c in todo}
        bar = progress_bar(len(futures), "sweep", unit="cell", enabled=progress,
                           interval=progress_interval)
        for fut in as_completed(futures):
            cell = futures[fut]
            try:
                report.computed.append(Path(fut.result()))
            except Exception as exc:  # noqa: BLE001  (a failing cell never kills the sweep)
                report.failed[cell.key] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            bar.update(1)
        bar.close()
    finally:
        if own_client:
            client.close()
        if own_cluster is not None:
            own_cluster.close()
    return report
