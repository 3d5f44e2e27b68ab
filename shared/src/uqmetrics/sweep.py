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
redrawn for every cell. Both show the units done and left and an ETA: the mean wall time per
unit finished in this run times the units left (cells found complete on disk count as done but
not in the mean; with several workers the mean is wall time per finished cell, so it already
accounts for the parallelism). :func:`run_sweep` can also count groups of cells (``group``: a
model's passes, say) and call back on every finished cell (``on_result``), e.g. to keep a
failures file (:func:`write_failures`, :func:`read_failures`) up to date while it runs.

Quiet failures (docs/conventions.md#v-1-zoos): a cell that raises returns its error to the
caller as a value (:class:`CellFailure`), so Dask's workers never log a "Compute Failed" block
with its traceback; :attr:`SweepReport.failed` holds the one-line error, and the full traceback
goes to ``log_file`` when one is given, with the log records of ``distributed`` in this process.
The workers of a cluster :func:`run_sweep` starts ignore ``SIGINT`` (a Ctrl-C in a terminal
reaches the whole process group) and, with a ``log_file``, write their standard error there:
the caller gets the ``KeyboardInterrupt`` alone and shuts the cluster down without the workers'
tracebacks or distributed's warnings on the console.

``dask.distributed`` and ``tqdm`` are imported lazily: the rest of uqmetrics needs neither.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .io import IncompleteResultError, read_dataset, temporary_beside, write_dataset

__all__ = ["FAILURES_FORMAT", "LOG_PROGRESS_INTERVAL", "Cell", "CellFailure", "LogProgress",
           "SweepReport",
           "cell_path", "format_duration", "is_complete", "progress_bar", "read_failures",
           "run_sweep", "write_failures"]

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


def format_duration(seconds: float) -> str:
    """A duration for progress lines: ``"45 s"``, ``"4 min 05 s"``, ``"2 h 03 min"``.

    Examples
    --------
    >>> format_duration(44.6), format_duration(245), format_duration(7380), format_duration(-1)
    ('45 s', '4 min 05 s', '2 h 03 min', '0 s')
    """
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    m = round(seconds / 60)
    return f"{m // 60} h {m % 60:02d} min"


class LogProgress:
    """Progress for logs (a stream that is not a terminal): a line when at least ``interval``
    seconds passed since the last one, and one at :meth:`close`.

    Each line says how many units are done and left, the time elapsed and, while units are
    left and some finished in this run, the ETA: the mean time per unit finished since the
    start (``elapsed / (n - initial)``) times the units left.

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
        Unit name; lines read ``"<desc>: <n>/<total> <unit>s (<pct>%)[ <postfix>], <left> left,
        <elapsed> elapsed[, ETA <eta>]"``.
    clock : callable, default :func:`time.monotonic`
        Seconds source (a test may pass a fake clock).
    initial : int, default 0
        Units already done before the start (a resumed sweep's complete cells): counted as done,
        left out of the mean time per unit.

    Examples
    --------
    >>> import io
    >>> out, now = io.StringIO(), [0.0]
    >>> bar = LogProgress(4, "sweep", interval=0.0, stream=out, unit="cell", clock=lambda: now[0],
    ...                   initial=1)
    >>> now[0] = 10.0
    >>> bar.update(1)
    >>> now[0] = 130.0
    >>> bar.update(2)
    >>> bar.close()
    >>> print(out.getvalue(), end="")
    sweep: 2/4 cells (50%), 2 left, 10 s elapsed, ETA 20 s
    sweep: 4/4 cells (100%), 0 left, 2 min 10 s elapsed
    sweep: 4/4 cells (100%), 0 left, 2 min 10 s elapsed
    """

    def __init__(self, total: int, desc: str, interval: float = LOG_PROGRESS_INTERVAL,
                 stream=None, *, unit: str = "item", clock: Callable[[], float] = time.monotonic,
                 initial: int = 0):
        if not interval >= 0:
            raise ValueError(f"interval must be >= 0 seconds, got {interval!r}")
        if not 0 <= initial <= total:
            raise ValueError(f"initial must be in [0, total={total}], got {initial!r}")
        self.total, self.desc, self.interval, self.unit = total, desc, interval, unit
        self.stream = sys.stderr if stream is None else stream
        self.clock = clock
        self.initial = self.n = initial
        self.postfix = ""
        self.t0 = self.last = clock()
        self.lock = threading.Lock()

    def set_postfix_str(self, s: str) -> None:
        self.postfix = s

    def eta(self) -> float | None:
        """Seconds left at the mean time per unit finished in this run (None: no unit yet)."""
        done = self.n - self.initial
        if done <= 0:
            return None
        return (self.clock() - self.t0) / done * max(self.total - self.n, 0)

    def _line(self) -> None:
        pct = 100.0 * self.n / self.total if self.total else 100.0
        postfix = f" {self.postfix}" if self.postfix else ""
        left = max(self.total - self.n, 0)
        eta = self.eta()
        eta_text = f", ETA {format_duration(eta)}" if left and eta is not None else ""
        print(f"{self.desc}: {self.n}/{self.total} {self.unit}s ({pct:.0f}%){postfix}, "
              f"{left} left, {format_duration(self.clock() - self.t0)} elapsed{eta_text}",
              file=self.stream, flush=True)

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
                 stream=None, interval: float = LOG_PROGRESS_INTERVAL, leave: bool = True,
                 initial: int = 0):
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
    initial : int, default 0
        Units already done (counted, but not in the time per unit).

    Returns
    -------
    tqdm.tqdm or LogProgress
        A tqdm bar when ``stream.isatty()`` (``smoothing=0``: its rate and remaining time are the
        mean over the units finished in this run, as :class:`LogProgress`'s ETA); otherwise
        :class:`LogProgress` (at most one line per ``interval`` seconds plus one at the end).
    """
    if not enabled:
        return _NoProgress()
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, leave=leave, file=stream, initial=initial,
                    smoothing=0)
    return LogProgress(total, desc, interval, stream, unit=unit, initial=initial)


def cell_path(out_dir, cell: Cell) -> Path:
    return Path(out_dir) / f"{cell.key}.nc"


def is_complete(path) -> bool:
    """True if ``path`` is a complete, intact result file (written by :func:`write_dataset`).

    False when it is missing, unfinished (no completeness flag), unreadable (truncated,
    metadata netCDF cannot open) or corrupt (data that do not match the checksums recorded
    when it was written, :class:`uqmetrics.io.CorruptResultError`): a sweep recomputes it. A
    file written before checksums were recorded is complete when it reads."""
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


def _guarded_cell(func: Callable[..., Any], params: Mapping[str, Any], path: str
                  ) -> str | CellFailure:
    """Worker side: :func:`_run_cell`, an exception returned as a :class:`CellFailure`.

    Dask sees a task that finished: its worker logs nothing (an exception raised out of a task
    is logged by the worker as a "Compute Failed" block with the whole traceback, on the
    console of the process that started the cluster)."""
    try:
        return _run_cell(func, params, path)
    except Exception as exc:  # noqa: BLE001  (reported by the caller, one line per cell)
        return CellFailure("".join(traceback.format_exception_only(type(exc), exc)).strip(),
                           "".join(traceback.format_exception(type(exc), exc,
                                                              exc.__traceback__)))


class _LogFile(logging.Handler):
    """Appends formatted records from WARNING on to ``path``, opened (and its folder made) on
    the first record.

    A file that cannot be written (a full disk, a read-only folder) is reported once, in one
    line on stderr, and the records after it are dropped: the log never stops a sweep."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(logging.WARNING)
        self.path = Path(path)
        self.stream = None
        self.broken = False
        self.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if self.broken:
            return
        try:
            text = self.format(record)
            if self.stream is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.stream = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
            self.stream.write(text + "\n")
            self.stream.flush()
        except OSError as err:
            self.broken = True
            print(f"sweep: cannot write the log file {str(self.path)!r} "
                  f"({err.strerror or err}); full tracebacks are not kept", file=sys.stderr,
                  flush=True)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.stream is not None:
                self.stream.close()
        self.stream = None
        super().close()

    def cell_failed(self, key: str, error: str, text: str) -> None:
        """One record: the cell's key, its one-line error and its full traceback."""
        self.handle(logging.makeLogRecord({
            "name": "uqmetrics.sweep", "levelno": logging.ERROR, "levelname": "ERROR",
            "msg": "cell %s failed: %s\n%s", "args": (key, error, text.rstrip())}))


#: Loggers of the Dask stack that carry their own handlers (``distributed`` configures them at
#: import; the others' records propagate to them).
_DASK_LOGGERS = ("distributed", "tornado", "bokeh", "asyncio")


@contextlib.contextmanager
def _dask_logs_to(handler: logging.Handler):
    """Send the records of distributed's loggers in this process (its scheduler, nannies and
    client of a ``LocalCluster``) to ``handler`` instead of the console, for the block."""
    saved = []
    for name in list(logging.root.manager.loggerDict):
        if name.split(".")[0] not in _DASK_LOGGERS:
            continue
        logger = logging.getLogger(name)
        if logger.handlers:
            saved.append((logger, list(logger.handlers), logger.propagate))
            logger.handlers = [handler]
            logger.propagate = False
    asyncio_logger = logging.getLogger("asyncio")  # "Task was destroyed but it is pending!"
    if not asyncio_logger.handlers:
        saved.append((asyncio_logger, [], asyncio_logger.propagate))
        asyncio_logger.handlers = [handler]
        asyncio_logger.propagate = False
    try:
        yield
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers = handlers
            logger.propagate = propagate


@contextlib.contextmanager
def _sigint_held(*, inherit: bool):
    """Hold Ctrl-C off for the block (in the main thread; elsewhere nothing is changed); yields
    a list that gets an entry for each Ctrl-C pressed during the block.

    With ``inherit``, ``SIGINT`` is ignored: the processes started in the block inherit the
    disposition and never see a Ctrl-C (a Ctrl-C in a terminal goes to every process of the
    foreground group), and one pressed during the block is not seen here either (the list stays
    empty). Without it, a Ctrl-C during the block is recorded, for the caller to act on once
    the block has finished (nothing half made is left to the garbage collector)."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal,
                                                                                "SIGINT"):
        yield caught
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN if inherit
                             else lambda signum, frame: caught.append(signum))
    try:
        yield caught
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _stderr_to(path: Path | None):
    """File descriptor 2 of this process appended to ``path`` for the block (the processes
    started in it inherit it: their output, a traceback at exit included, goes there for good);
    nothing when ``path`` is None or cannot be opened."""
    if path is None:
        yield
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _connect(scheduler: str | None, n_workers: int, threads_per_worker: int,
             log_file: Path | None = None) -> tuple[Any, Any]:
    """(client, cluster or None): a client of ``scheduler``, or of a ``LocalCluster`` started
    here.

    The local cluster's worker processes ignore ``SIGINT`` (:func:`_sigint_held`: they would
    each print a ``KeyboardInterrupt`` traceback while the caller shuts them down). With a
    ``log_file`` their standard error is that file (:func:`_stderr_to`: their warnings, and what
    they print while they are killed, go there) and their log records from WARNING on go to it;
    without, they print no log record below CRITICAL (``silence_logs``). A cell's error comes
    back as a value either way (:func:`_guarded_cell`). A Ctrl-C while the local cluster starts
    (seconds) is not seen; one while a client of ``scheduler`` connects is raised once it is
    connected, and closed."""
    from dask.distributed import Client, LocalCluster

    if scheduler:
        with _sigint_held(inherit=False) as caught:
            client = Client(scheduler)
        if caught:
            _close_quietly(client, None)
            raise KeyboardInterrupt
        return client, None
    with _sigint_held(inherit=True), _stderr_to(log_file):
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker,
                               processes=True, dashboard_address=":0",
                               silence_logs=logging.WARNING if log_file is not None
                               else logging.CRITICAL)
        try:
            return Client(cluster), cluster
        except BaseException:
            cluster.close()
            raise


def _close_quietly(client: Any, cluster: Any) -> None:
    """Close a client and its cluster, whatever state a Ctrl-C left them in."""
    for thing in (client, cluster):
        if thing is None:
            continue
        with contextlib.suppress(Exception):
            thing.close()


#: ``format`` of a failures file (:func:`write_failures`).
FAILURES_FORMAT = "uqmetrics.sweep_failures/1"


def write_failures(path: str | os.PathLike, failures: Sequence[Mapping[str, Any]]) -> Path:
    """Write a sweep's failures atomically as JSON (``{"format": ..., "failures": [...]}``).

    Parameters
    ----------
    path : path
        The file; written through a temporary file beside it, ``fsync`` and ``os.replace``, so a
        reader sees the old list or the new one, never half of one.
    failures : sequence of mapping
        One JSON-serialisable record per failed unit (e.g. ``{"model", "error", "time"}``).

    Returns
    -------
    pathlib.Path

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = write_failures(Path(d) / "f.json", [{"model": "m", "error": "OOM"}])
    ...     read_failures(p), sorted(q.name for q in Path(d).iterdir())
    ([{'model': 'm', 'error': 'OOM'}], ['f.json'])
    """
    path = Path(path)
    text = json.dumps({"format": FAILURES_FORMAT, "failures": [dict(f) for f in failures]},
                      indent=1, sort_keys=False) + "\n"
    with temporary_beside(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    return path


def read_failures(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a failures file (:func:`write_failures`); ``[]`` when it does not exist.

    Raises
    ------
    ValueError
        The file is not a failures file (not JSON, another format); the message names it.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"failures file {str(path)!r} is not JSON ({exc}); delete it to start "
                         "its record afresh") from None
    if (not isinstance(data, dict) or data.get("format") != FAILURES_FORMAT
            or not isinstance(data.get("failures"), list)
            or not all(isinstance(f, dict) for f in data["failures"])):
        raise ValueError(f"{str(path)!r} is not a sweep failures file (format "
                         f"{FAILURES_FORMAT!r}); delete it or give another path")
    return data["failures"]


def run_sweep(cells: Iterable[Cell], func: Callable[..., Any], out_dir, *, scheduler: str | None = None,
              n_workers: int = 2, threads_per_worker: int = 1, overwrite: bool = False,
              progress: bool = True, client: Any = None,
              progress_interval: float = LOG_PROGRESS_INTERVAL,
              group: Callable[[Cell], str] | None = None, group_unit: str = "group",
              on_result: Callable[[Cell, str | None], None] | None = None,
              log_file: str | os.PathLike | None = None) -> SweepReport:
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
        ``progress_interval`` seconds and one at the end (:func:`progress_bar`). Cells done and
        left (complete files found on disk count as done) and an ETA from the mean wall time per
        cell finished in this run.
    client : dask.distributed.Client, optional
        Use this client (neither ``scheduler`` nor a new cluster).
    progress_interval : float, default :data:`LOG_PROGRESS_INTERVAL`
        Seconds between progress lines when stderr is not a terminal.
    group : callable, optional
        ``group(cell) -> name`` (e.g. the model of a cell): the progress also counts the groups
        whose cells have all finished (computed, failed or already complete), as
        ``"<done>/<total> <group_unit>s"``.
    group_unit : str, default "group"
        What a group is, for that count.
    on_result : callable, optional
        ``on_result(cell, error)`` in the calling process as each submitted cell finishes:
        ``error`` is None when it was computed, else the one-line exception (as in
        :attr:`SweepReport.failed`). An exception it raises stops the sweep.
    log_file : path, optional
        Appended to: the full traceback of every cell that failed, and, while the sweep runs,
        the log records from WARNING on of ``distributed`` in this process (scheduler, nannies
        and client of a ``LocalCluster``: a worker restarted, a worker killed) instead of the
        console; the standard error of a ``LocalCluster``'s worker processes started here
        (their warnings, what they print when they are stopped). Without it the tracebacks are
        dropped (the one-line error is in the report), those records go where they went and
        the workers print no log record below CRITICAL.

    Returns
    -------
    SweepReport

    Notes
    -----
    A cell that raises never logs a traceback on a worker (:class:`CellFailure`). A
    ``KeyboardInterrupt`` (Ctrl-C) stops the sweep: the client and a cluster started here are
    closed with distributed's records dropped (or sent to ``log_file``), the workers of such a
    cluster ignore ``SIGINT``, and the interrupt is raised again, for the caller to report in
    one line. The complete files stay; a rerun resumes.
    """
    from dask.distributed import as_completed

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
    open_cells: dict[str, int] = {}  # group -> its cells not finished yet
    if group is not None:
        for cell in cells:
            open_cells.setdefault(group(cell), 0)
        for cell in todo:
            open_cells[group(cell)] += 1

    def groups_text() -> str:
        done = sum(1 for n in open_cells.values() if n == 0)
        return f"{done}/{len(open_cells)} {group_unit}s"

    handler = _LogFile(log_file) if log_file is not None else None
    own_client, own_cluster = client is None, None
    with contextlib.ExitStack() as stack:
        if handler is not None:
            stack.callback(handler.close)
            stack.enter_context(_dask_logs_to(handler))
        interrupted = False
        try:
            if own_client:
                client, own_cluster = _connect(scheduler, n_workers, threads_per_worker,
                                               None if log_file is None else Path(log_file))
            # a fresh task key per run: a scheduler that outlives a sweep (``scheduler=``,
            # ``client=``) still remembers the outcome of a key it ran, and would answer a
            # retry with it
            run = uuid.uuid4().hex[:8]
            futures = {client.submit(_guarded_cell, func, dict(c.params),
                                     str(cell_path(out, c)), key=f"cell-{c.key}-{run}",
                                     pure=False): c for c in todo}
            bar = progress_bar(len(cells), "sweep", unit="cell", enabled=progress,
                               interval=progress_interval, initial=len(report.skipped))
            if group is not None:
                bar.set_postfix_str(groups_text())
            # the client's own loop: it need not be the process's default client
            for fut in as_completed(futures, loop=client.loop):
                cell = futures[fut]
                error = text = None
                try:
                    result = fut.result()
                except Exception as exc:  # noqa: BLE001  (a worker that died, a lost task)
                    error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                    text = "".join(traceback.format_exception(type(exc), exc,
                                                              exc.__traceback__))
                else:
                    if isinstance(result, CellFailure):
                        error, text = result.error, result.traceback
                    else:
                        report.computed.append(Path(result))
                if error is not None:
                    report.failed[cell.key] = error
                    if handler is not None:
                        handler.cell_failed(cell.key, error, text)
                if on_result is not None:
                    on_result(cell, error)
                if group is not None:
                    open_cells[group(cell)] -= 1
                    bar.set_postfix_str(groups_text())
                bar.update(1)
            bar.close()
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            if interrupted:
                # the console gets the caller's one line: what closing a cluster in the
                # middle of its tasks logs (tasks cancelled, workers killed) goes to the log
                # file or nowhere
                with _dask_logs_to(handler or logging.NullHandler()):
                    _close_quietly(client if own_client else None, own_cluster)
            else:
                if own_client and client is not None:
                    client.close()
                if own_cluster is not None:
                    own_cluster.close()
    return report
