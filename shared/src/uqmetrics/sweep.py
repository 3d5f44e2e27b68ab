"""Resumable sweeps of independent cells on Dask (used by uqreg and uqvision).

A sweep is a list of :class:`Cell` s, each a JSON-serialisable parameter mapping with a unique
key. :func:`run_sweep` sends every cell whose result file is not already on disk to a Dask
cluster (a ``LocalCluster`` by default, any cluster by its scheduler address, or workers in
jobs of a queue); each worker
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

Where the cells run (:class:`ClusterSpec`, the options of :func:`add_cluster_options` that every
sweep command shares): a ``LocalCluster`` of this machine (default), the scheduler of a running
cluster (``--scheduler``), or Dask workers started inside jobs of an HPC queue by dask-jobqueue
(``--cluster slurm|pbs|lsf|sge``, ``--cluster-option KEY=VALUE``, ``--cluster-config FILE``,
``--jobs N``; ``jobqueue-local`` runs the same job scripts as local processes). Jobs survive
preemption through the resume: a cell file is written atomically, so it is there whole or not
at all; the cells of a job that ended are run again by the other workers, on a job submitted in
its place (:data:`WORKER_CHECK_INTERVAL`), or by a rerun. ``--gpus-per-job 1`` gives each job's
worker the Dask resource ``GPU=1`` and, for cells on cuda, each cell asks for it: one model per
GPU at a time. The dashboard of a cluster started here listens on 127.0.0.1 unless
``--dashboard`` says otherwise (a queue's scheduler itself binds where dask-jobqueue puts it, an
interface the workers of other nodes reach); its link is printed once.

``dask.distributed``, ``tqdm`` and ``dask_jobqueue`` (the optional extra ``uqmetrics[hpc]``) are
imported lazily: the rest of uqmetrics needs none of them.
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

from .config_options import mark_launcher
from .io import IncompleteResultError, read_dataset, temporary_beside, write_dataset

__all__ = ["CLUSTER_KINDS", "DEFAULT_DASHBOARD", "FAILURES_FORMAT", "HPC_EXTRA",
           "LOG_PROGRESS_INTERVAL", "QUEUE_CLUSTERS", "WORKER_CHECK_INTERVAL", "Cell",
           "CellFailure", "ClusterSpec", "LogProgress", "SweepReport", "add_cluster_options",
           "cell_path", "format_duration", "is_complete", "open_client", "parse_cluster_options", "positive_int",
           "progress_bar", "read_cluster_config", "read_failures", "run_sweep", "write_failures"]

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


#: ``--cluster`` kinds that start the workers inside jobs of a queue, each by its dask-jobqueue
#: class (module attribute path); ``jobqueue-local`` runs the same job scripts as local processes
#: (``dask_jobqueue.local.LocalCluster``): a queue setup tried without a queue.
QUEUE_CLUSTERS = {"slurm": "SLURMCluster", "pbs": "PBSCluster", "lsf": "LSFCluster",
                  "sge": "SGECluster", "jobqueue-local": "local.LocalCluster"}
#: Every ``--cluster`` kind; ``local`` (the default) is a ``LocalCluster`` of this machine.
CLUSTER_KINDS = ("local", *QUEUE_CLUSTERS)
#: Where a dashboard started here listens unless ``--dashboard`` says otherwise: this machine
#: only (loopback), a free port.
DEFAULT_DASHBOARD = "127.0.0.1:0"
#: The optional dependency that brings dask-jobqueue.
HPC_EXTRA = "uqmetrics[hpc]"
#: Seconds between two checks that a cluster started here still has all its workers (jobs): a
#: job that ended (preempted, past its walltime, killed) is submitted again.
WORKER_CHECK_INTERVAL = 10.0

#: ``--cluster-option`` keys every queue kind takes (dask-jobqueue's job keywords), by type;
#: ``list`` keys add one entry per ``--cluster-option``.
_JOB_OPTIONS: dict[str, type] = {
    "cores": int, "processes": int, "memory": str, "python": str, "job_name": str,
    "interface": str, "death_timeout": int, "local_directory": str, "log_directory": str,
    "shared_temp_directory": str, "shebang": str, "nanny": bool, "worker_command": str,
    "job_extra_directives": list, "worker_extra_args": list, "job_script_prologue": list,
    "job_directives_skip": list}
#: The keys of one queue kind only.
_KIND_OPTIONS: dict[str, dict[str, type]] = {
    "slurm": {"queue": str, "account": str, "walltime": str, "job_cpu": int, "job_mem": str},
    "pbs": {"queue": str, "account": str, "walltime": str, "resource_spec": str},
    "lsf": {"queue": str, "project": str, "walltime": str, "ncpus": int, "mem": int,
            "lsf_units": str, "use_stdin": bool},
    "sge": {"queue": str, "project": str, "walltime": str, "resource_spec": str},
    "jobqueue-local": {}}
#: The job directive asking the queue for ``n`` GPUs (``--gpus-per-job``), where one spelling
#: is standard; elsewhere the user gives it (``--cluster-option job_extra_directives=...``).
_GPU_DIRECTIVES = {"slurm": "--gres=gpu:{n}", "lsf": '-gpu "num={n}"'}
_BOOLS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
_DASHBOARD = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]*):(?P<port>\d{1,5})$")


def _cluster_option_value(kind: str, name: str, value: Any, item: str) -> Any:
    """One ``--cluster-option`` value checked (and, from a string, converted) by its key."""
    allowed = {**_JOB_OPTIONS, **_KIND_OPTIONS[kind]}
    if name not in allowed:
        raise ValueError(f"--cluster-option {item!r}: {name!r} is not an option of --cluster "
                         f"{kind}; known: {', '.join(sorted(allowed))}")
    typ = allowed[name]
    if typ is list:
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, (list, tuple)) or not all(isinstance(v, str) for v in values):
            raise ValueError(f"--cluster-option {item!r}: {name} takes strings (repeat the "
                             f"option for several), got {value!r}")
        return list(values)
    if typ is int:
        try:
            number = int(value) if isinstance(value, (str, int)) and not isinstance(value, bool) \
                else None
        except ValueError:
            number = None
        if number is None or number < 1:
            raise ValueError(f"--cluster-option {item!r}: {name} must be an integer >= 1, got "
                             f"{value!r}")
        return number
    if typ is bool:
        if isinstance(value, bool):
            return value
        if str(value).strip().lower() not in _BOOLS:
            raise ValueError(f"--cluster-option {item!r}: {name} must be true or false, got "
                             f"{value!r}")
        return _BOOLS[str(value).strip().lower()]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"--cluster-option {item!r}: {name} must be a non-empty string, got "
                         f"{value!r}")
    return value


def parse_cluster_options(items: Iterable[str], kind: str) -> dict[str, Any]:
    """``--cluster-option KEY=VALUE`` strings as keyword arguments of the cluster class.

    Parameters
    ----------
    items : iterable of str
        ``KEY=VALUE`` each; ``KEY`` a keyword of dask-jobqueue's cluster class (``cores``,
        ``memory``, ``processes``, ``queue``, ``account``, ``walltime``,
        ``job_extra_directives``, ``worker_extra_args``, ``local_directory``, ...; ``-`` and
        ``_`` alike). Integers (``cores``, ``processes``, ...) are converted; a list keyword
        (``job_extra_directives``, ``worker_extra_args``, ``job_script_prologue``,
        ``job_directives_skip``) gets one entry per item; any other key given once.
    kind : str
        A queue kind of :data:`QUEUE_CLUSTERS`.

    Returns
    -------
    dict

    Raises
    ------
    ValueError
        Naming the item: not ``KEY=VALUE``, a key the kind does not take, a bad value, a key
        given twice, or a ``kind`` that is not a queue.

    Examples
    --------
    >>> parse_cluster_options(["cores=8", "job-extra-directives=--gres=gpu:1",
    ...                        "job_extra_directives=--exclusive", "queue=gpu"], "slurm")
    {'cores': 8, 'job_extra_directives': ['--gres=gpu:1', '--exclusive'], 'queue': 'gpu'}
    """
    items = list(items)
    if items and kind not in QUEUE_CLUSTERS:
        raise ValueError(f"--cluster-option {items[0]!r}: options apply to a job-queue cluster "
                         f"(--cluster {'|'.join(QUEUE_CLUSTERS)}), not --cluster {kind}")
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        name = key.strip().replace("-", "_")
        if not sep or not name:
            raise ValueError(f"--cluster-option {item!r}: give KEY=VALUE (e.g. queue=gpu, "
                             "walltime=04:00:00)")
        value = _cluster_option_value(kind, name, value, item)
        if isinstance(value, list):
            out.setdefault(name, []).extend(value)
        elif name in out:
            raise ValueError(f"--cluster-option {item!r}: {name} is given twice")
        else:
            out[name] = value
    return out


def _flat(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys (``{"jobqueue.slurm.cores": 8}``): what
    ``dask.config.set`` merges key by key, leaving the other defaults in place."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_flat(value, name + "."))
        else:
            out[name] = value
    return out


def read_cluster_config(path: str | os.PathLike) -> dict[str, Any]:
    """A dask configuration file (YAML, as dask-jobqueue documents ``jobqueue.yaml``:
    ``jobqueue: {slurm: {cores: 8, memory: 32GB, ...}}``) as dotted keys for
    ``dask.config.set``.

    Raises
    ------
    ValueError
        The file cannot be read, is not YAML, or is not a mapping (the message names it).
    """
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"--cluster-config {str(path)!r}: cannot read it "
                         f"({err.strerror or err})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"--cluster-config {str(path)!r} is not YAML ({err})") from None
    if not isinstance(data, Mapping) or not all(isinstance(k, str) for k in data):
        raise ValueError(f"--cluster-config {str(path)!r} must hold a mapping of dask "
                         f"settings (e.g. 'jobqueue: {{slurm: {{cores: 8}}}}'), got "
                         f"{type(data).__name__}")
    return _flat(data)


def _jobqueue():
    """The ``dask_jobqueue`` module; a clear error naming the extra when it is missing."""
    try:
        import dask_jobqueue
        import dask_jobqueue.local  # the jobqueue-local kind
    except ImportError as err:
        raise ImportError(f"a job-queue --cluster needs dask-jobqueue ({err}): install it with "
                          f"pip install '{HPC_EXTRA}'") from None
    return dask_jobqueue


@dataclass(frozen=True)
class ClusterSpec:
    """Where a sweep's cells run: a ``LocalCluster`` of this machine, the scheduler of a
    running cluster, or workers started in jobs of a queue by dask-jobqueue.

    Built from the command-line options of :func:`add_cluster_options` by :meth:`from_args`, or
    directly; checked on construction (``ValueError`` naming the option and the value).

    Attributes
    ----------
    kind : str, default "local"
        One of :data:`CLUSTER_KINDS` (``--cluster``).
    address : str, optional
        The scheduler of a running cluster (``--scheduler``, ``tcp://host:8786``); kind local.
    options : mapping
        Keyword arguments of the queue's cluster class (:func:`parse_cluster_options`,
        ``--cluster-option``).
    config_file : str, optional
        A dask configuration file (YAML, ``jobqueue: {slurm: {...}}``; ``--cluster-config``)
        in force while the cluster runs: its settings are the defaults ``options`` override.
    jobs : int, default 1
        Jobs to keep running (``--jobs``); a job that ends is submitted again.
    gpus_per_job : int, default 0
        GPUs each job asks for (``--gpus-per-job``, 0 or 1): its worker (one process) gets the
        Dask resource ``GPU=1`` and, for slurm and lsf, the job its GPU directive.
    dashboard : str, optional
        ``--dashboard``: ``HOST:PORT`` of the scheduler's dashboard, ``none`` for none;
        default :data:`DEFAULT_DASHBOARD` (loopback; a config file's
        ``scheduler-options: {dashboard_address: ...}`` for a queue kind).
    resources : mapping, optional
        Dask resources every cell asks for (``{"GPU": 1}``: one cell per GPU at a time); set by
        :meth:`from_args` with ``gpu_cells`` when jobs have GPUs.
    """

    kind: str = "local"
    address: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    config_file: str | None = None
    jobs: int = 1
    gpus_per_job: int = 0
    dashboard: str | None = None
    resources: Mapping[str, float] | None = None

    def __post_init__(self):
        if self.kind not in CLUSTER_KINDS:
            raise ValueError(f"--cluster must be one of {', '.join(CLUSTER_KINDS)}, got "
                             f"{self.kind!r}")
        if self.address is not None:
            if not isinstance(self.address, str) or not self.address.strip():
                raise ValueError(f"--scheduler: give a Dask scheduler address "
                                 f"(tcp://host:8786), got {self.address!r}")
            if self.kind != "local":
                raise ValueError(f"--scheduler {self.address!r} and --cluster {self.kind}: give "
                                 "one (the scheduler of a running cluster, or a cluster to "
                                 "start)")
        queue_only = [f"{flag} {value!r}" for flag, value, unset in (
            ("--cluster-option", dict(self.options), {}),
            ("--cluster-config", self.config_file, None), ("--jobs", self.jobs, 1),
            ("--gpus-per-job", self.gpus_per_job, 0)) if value != unset]
        if queue_only and not self.queue:
            raise ValueError(f"{queue_only[0]}: applies to a job-queue cluster (--cluster "
                             f"{'|'.join(QUEUE_CLUSTERS)}), not "
                             + (f"--scheduler {self.address!r}" if self.address
                                else f"--cluster {self.kind}"))
        if self.queue:
            for name, value in self.options.items():
                _cluster_option_value(self.kind, name, value, f"{name}={value}")
        if isinstance(self.jobs, bool) or not isinstance(self.jobs, int) or self.jobs < 1:
            raise ValueError(f"--jobs must be an integer >= 1, got {self.jobs!r}")
        if self.gpus_per_job not in (0, 1) or isinstance(self.gpus_per_job, bool):
            raise ValueError(f"--gpus-per-job must be 0 or 1, got {self.gpus_per_job!r}: a "
                             "cell runs on its worker's first GPU, so a job of several GPUs "
                             "would stack its cells on one; ask for more --jobs instead")
        if self.gpus_per_job and self.options.get("processes", 1) != 1:
            raise ValueError(f"--cluster-option processes={self.options['processes']} with "
                             "--gpus-per-job: a GPU job runs one worker process "
                             "(processes=1)")
        if self.config_file is not None:
            read_cluster_config(self.config_file)
        if self.dashboard is not None and self.dashboard != "none":
            m = _DASHBOARD.match(str(self.dashboard))
            if m is None or int(m["port"]) > 65535:
                raise ValueError(f"--dashboard must be HOST:PORT (127.0.0.1:8787, :0 for any "
                                 f"interface and a free port) or none, got {self.dashboard!r}")
        if self.resources is not None and (
                not isinstance(self.resources, Mapping)
                or not all(isinstance(k, str) and isinstance(v, (int, float))
                           and not isinstance(v, bool) and v > 0
                           for k, v in self.resources.items())):
            raise ValueError(f"resources must map resource names to positive amounts, got "
                             f"{self.resources!r}")

    @property
    def queue(self) -> bool:
        """True for a job-queue kind (workers in jobs, dask-jobqueue)."""
        return self.kind in QUEUE_CLUSTERS

    @property
    def local_default(self) -> bool:
        """True when nothing but a ``LocalCluster`` of this machine was asked for."""
        return self.kind == "local" and self.address is None

    def describe(self) -> str:
        """One phrase for messages: ``"the Dask scheduler at tcp://..."``, ``"4 slurm
        job(s)"``, ``"a LocalCluster"``."""
        if self.address is not None:
            return f"the Dask scheduler at {self.address}"
        if self.queue:
            return f"{self.jobs} {self.kind} job(s)"
        return "a LocalCluster"

    @classmethod
    def from_args(cls, args: Any, *, gpu_cells: bool = False) -> ClusterSpec:
        """The spec of the options :func:`add_cluster_options` added, from parsed ``args``.

        Parameters
        ----------
        args : argparse.Namespace
        gpu_cells : bool, default False
            The cells run on a GPU (``--device cuda``): with ``--gpus-per-job``, each asks for
            the resource ``GPU=1`` (one model per GPU at a time).

        Raises
        ------
        ValueError
            A bad option value or combination, or a queue kind without dask-jobqueue installed
            (naming the extra to install), before anything starts.
        """
        kind = getattr(args, "cluster", "local") or "local"
        options = parse_cluster_options(getattr(args, "cluster_option", None) or (), kind)
        gpus = getattr(args, "gpus_per_job", 0) or 0
        spec = cls(kind=kind, address=getattr(args, "scheduler", None), options=options,
                   config_file=getattr(args, "cluster_config", None),
                   jobs=getattr(args, "jobs", 1) or 1, gpus_per_job=gpus,
                   dashboard=getattr(args, "dashboard", None),
                   resources={"GPU": 1} if gpu_cells and gpus else None)
        if spec.queue:
            try:
                _jobqueue()
            except ImportError as err:
                raise ValueError(f"--cluster {kind}: {err}") from None
        return spec


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (worker, job and chunk counts: none of them would
    wait for ever); ``argparse.ArgumentTypeError`` naming the value otherwise."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def add_cluster_options(parser: Any, *, workers: str | None = "--workers",
                        workers_default: int = 2, local: str = "a LocalCluster here") -> Any:
    """Add the options of where a sweep runs to an ``argparse`` parser (one group):
    ``--scheduler``, ``--cluster``, ``--cluster-option``, ``--cluster-config``, ``--jobs``,
    ``--gpus-per-job``, ``--dashboard`` and (``workers``) the local worker count. Read them
    back with :meth:`ClusterSpec.from_args`. All are launcher options
    (:func:`uqmetrics.config_options.mark_launcher`): a result file never gives them.

    Parameters
    ----------
    parser : argparse.ArgumentParser
    workers : str or None, default "--workers"
        The flag of the ``LocalCluster``'s worker processes (destination: the flag without
        dashes, ``-`` as ``_``); None: not added (the command has its own).
    workers_default : int, default 2
    local : str, default "a LocalCluster here"
        What runs the cells when no cluster is asked for (the help's words).

    Returns
    -------
    argparse._ArgumentGroup
        The group.
    """
    g = parser.add_argument_group(
        "cluster", f"where the cells run: {local} (default), a running scheduler "
                   "(--scheduler), or Dask workers in jobs of a queue (--cluster slurm|pbs|"
                   "lsf|sge, with dask-jobqueue: pip install '" + HPC_EXTRA + "')")
    g.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help=f"address of an existing Dask scheduler (default: {local})")
    if workers is not None:
        g.add_argument(workers, dest=workers.lstrip("-").replace("-", "_"), type=positive_int,
                       default=workers_default, metavar="N",
                       help=f"LocalCluster worker processes (default {workers_default})")
    g.add_argument("--cluster", choices=CLUSTER_KINDS, default="local",
                   help=f"local: {local} (default); slurm, pbs, lsf, "
                        "sge: Dask workers started in jobs of that queue (dask-jobqueue's "
                        "job scripts); jobqueue-local: the same job scripts run as local "
                        "processes, to try a queue setup without a queue")
    g.add_argument("--cluster-option", dest="cluster_option", action="append", default=None,
                   metavar="KEY=VALUE",
                   help="a keyword of the queue's dask-jobqueue cluster (repeatable): cores=8, "
                        "memory=32GB, processes=1, queue=gpu, account=proj, "
                        "walltime=04:00:00, local_directory=/tmp, "
                        "job_extra_directives=--exclusive (one entry per option), "
                        "worker_extra_args=..., job_script_prologue='module load cuda', ...")
    g.add_argument("--cluster-config", dest="cluster_config", default=None, metavar="FILE",
                   help="a dask config file in force while the cluster runs (YAML, as "
                        "dask-jobqueue's jobqueue.yaml: 'jobqueue: {slurm: {cores: 8, "
                        "memory: 32GB}}'); --cluster-option overrides it")
    g.add_argument("--jobs", type=positive_int, default=1, metavar="N",
                   help="queue jobs to keep running (default 1; a job that ends is "
                        "submitted again while the sweep runs)")
    g.add_argument("--gpus-per-job", dest="gpus_per_job", type=int, choices=(0, 1), default=0,
                   help="1: each job asks for a GPU (slurm --gres=gpu:1, lsf -gpu num=1; "
                        "other queues: give the directive with --cluster-option "
                        "job_extra_directives=...) and, with --device cuda, runs one cell on "
                        "it at a time (Dask resource GPU=1)")
    g.add_argument("--dashboard", default=None, metavar="ADDRESS",
                   help="HOST:PORT of the scheduler's dashboard started here, or none "
                        f"(default {DEFAULT_DASHBOARD}: this machine only, a free port; "
                        "reach it from elsewhere through ssh -L); its link is printed once")
    mark_launcher(g)  # never taken from a result file (uqmetrics.run_config)
    return g


def _dashboard_option(spec: ClusterSpec, config_name: str | None = None) -> str | None:
    """The dashboard address to bind (None: no dashboard): ``--dashboard``, else for a queue
    kind the config's ``scheduler-options``, else :data:`DEFAULT_DASHBOARD`."""
    if spec.dashboard == "none":
        return None
    if spec.dashboard is not None:
        return spec.dashboard
    if config_name is not None:
        import dask

        configured = (dask.config.get(f"jobqueue.{config_name}.scheduler-options", {}) or {}
                      ).get("dashboard_address")
        if configured:
            return configured
    return DEFAULT_DASHBOARD


def _queue_cluster_args(spec: ClusterSpec) -> tuple[type, dict[str, Any]]:
    """(dask-jobqueue's cluster class, its keyword arguments) for ``spec``, with its config
    file already in force: the options, ``--gpus-per-job``'s worker resource and job directive,
    and ``scheduler_options`` (the config file's, with the dashboard of
    :func:`_dashboard_option`)."""
    import dask

    jq = _jobqueue()
    cls = jq
    for part in QUEUE_CLUSTERS[spec.kind].split("."):
        cls = getattr(cls, part)
    config_name = cls.job_cls.default_config_name()
    kwargs = {k: list(v) if isinstance(v, list) else v for k, v in spec.options.items()}

    def setting(name: str) -> list:  # a list keyword: the option's, else the config file's
        key = name.replace("_", "-")
        return list(kwargs.get(name, dask.config.get(f"jobqueue.{config_name}.{key}", None)
                                or []))

    if spec.gpus_per_job:
        kwargs["processes"] = 1
        kwargs["worker_extra_args"] = [*setting("worker_extra_args"), "--resources",
                                       f"GPU={spec.gpus_per_job}"]
        directive = _GPU_DIRECTIVES.get(spec.kind)
        directives = setting("job_extra_directives")
        if directive and not any("gpu" in d.lower() or "gres" in d.lower() for d in directives):
            kwargs["job_extra_directives"] = [*directives,
                                              directive.format(n=spec.gpus_per_job)]
    scheduler_options = dict(dask.config.get(f"jobqueue.{config_name}.scheduler-options", {})
                             or {})
    dashboard = _dashboard_option(spec, config_name)
    if dashboard is None:  # no dashboard; the HTTP server left (health routes) on loopback
        scheduler_options.update(dashboard=False, dashboard_address=DEFAULT_DASHBOARD)
    else:
        scheduler_options["dashboard_address"] = dashboard
    return cls, {**kwargs, "scheduler_options": scheduler_options}


async def _submitted(cluster: Any) -> None:
    """Wait until ``cluster`` (a dask-jobqueue cluster just scaled) has submitted its jobs. A
    job whose submission failed is kept by the cluster as if it were running (its error only
    logged) and never replaced: awaiting it again submits it again, and raises the queue's
    error if the queue refuses it again; the jobs never submitted are then marked failed, for
    the cluster to close."""
    from distributed.core import Status

    await cluster._correct_state()
    try:
        for job in list(cluster.workers.values()):
            await job
    except BaseException:
        for job in cluster.workers.values():
            if job.status == Status.created:
                job.status = Status.failed
        raise


def _queue_cluster(spec: ClusterSpec, silence: int) -> Any:
    """Start dask-jobqueue's cluster of ``spec`` (its config file already in force) and ask for
    ``spec.jobs`` jobs. The scheduler binds as dask-jobqueue does (the interface the workers of
    other nodes reach; ``scheduler-options: {host: ...}`` in the config file); its dashboard
    binds to :func:`_dashboard_option` (loopback by default)."""
    cls, kwargs = _queue_cluster_args(spec)
    try:
        cluster = cls(silence_logs=silence, **kwargs)
    except ValueError as err:  # e.g. no cores or memory given
        raise ValueError(f"--cluster {spec.kind}: {err} (--cluster-option KEY=VALUE or "
                         "--cluster-config FILE)") from None
    try:
        cluster.scale(jobs=spec.jobs)
        # wait for the submissions (not for the jobs to start): a queue that refuses a job (an
        # unknown partition or account, a bad directive) says so here, not in a log while the
        # sweep waits for ever for workers
        cluster.sync(_submitted, cluster)
    except Exception as err:  # noqa: BLE001  (sbatch's RuntimeError, OSError, a bare Exception)
        _close_refused(cluster)
        raise ValueError(f"--cluster {spec.kind}: the queue refused a job: "
                         f"{' '.join(str(err).split()) or type(err).__name__} (check "
                         "--cluster-option and --cluster-config)") from None
    except BaseException:
        _close_refused(cluster)
        raise
    return cluster


def _close_refused(cluster: Any) -> None:
    """Close a queue cluster whose jobs were not all submitted: a job without a job id (its
    submission failed: the queue refused it, or its command could not start) is dropped
    first, as dask-jobqueue would try to cancel it by an id it never had (``kill None``,
    ``scancel None``) and raise while closing; what closing still raises is dropped, the
    submission's error being the one to report."""
    for name, job in list(getattr(cluster, "workers", {}).items()):
        if getattr(job, "job_id", None) is None:
            del cluster.workers[name]
    with contextlib.suppress(Exception):
        cluster.close()


def _keep_workers(cluster: Any, n: int, interval: float | None = None) -> None:
    """Every ``interval`` seconds, scale ``cluster`` (started here) back to ``n`` jobs or
    workers, on its event loop, until it closes: a worker whose job ended (preempted, killed,
    past its walltime) is forgotten by the cluster after ``distributed.deploy.
    lost-worker-timeout`` and submitted again here. Its cells were handed to the other workers
    by the scheduler (or wait for the new one); one that killed its workers
    ``distributed.scheduler.allowed-failures`` + 1 times fails (``KilledWorker``), reported as
    any failed cell."""
    from tornado.ioloop import PeriodicCallback

    interval = WORKER_CHECK_INTERVAL if interval is None else interval
    queue = hasattr(cluster, "job_cls")

    async def rescale():
        if cluster.status.name not in ("running", "created"):
            return
        if not queue:
            cluster.scale(n)
            return
        # a job the queue refused stays in the cluster's list, never replaced: dropped here,
        # the next check submits it again
        for name, job in list(cluster.workers.items()):
            if job.status.name == "failed":
                del cluster.workers[name]
        cluster.scale(jobs=n)
        with contextlib.suppress(Exception):  # refused again: logged, tried at the next check
            await _submitted(cluster)

    pc = PeriodicCallback(rescale, interval * 1000)
    cluster.periodic_callbacks["uqmetrics-keep-workers"] = pc  # stopped when it closes
    cluster.loop.add_callback(pc.start)


def _dashboard_link(client: Any, cluster: Any) -> str | None:
    """The link of the dashboard of a cluster started here, by the address its HTTP server
    really bound (``cluster.dashboard_link`` names the scheduler's host, which a dashboard on
    loopback is not on); a running scheduler's link as the client gives it."""
    from distributed.utils import format_dashboard_link

    if cluster is None:
        return getattr(client, "dashboard_link", None) or None
    server = getattr(getattr(cluster, "scheduler", None), "http_server", None)
    if server is None or getattr(server, "port", None) is None:
        return None
    host = server.address
    if host in ("0.0.0.0", "::", ""):
        import socket

        host = socket.gethostname()
    return format_dashboard_link(host, server.port)


def _as_spec(scheduler: str | ClusterSpec | None) -> ClusterSpec:
    if isinstance(scheduler, ClusterSpec):
        return scheduler
    if scheduler is None or isinstance(scheduler, str):
        return ClusterSpec(address=scheduler)
    raise ValueError(f"scheduler must be a scheduler address (str), a ClusterSpec or None, got "
                     f"{type(scheduler).__name__}")


def _connect(spec: ClusterSpec, n_workers: int, threads_per_worker: int,
             log_file: Path | None = None, resources: Mapping[str, float] | None = None
             ) -> tuple[Any, Any]:
    """(client, cluster or None): a client of ``spec``'s scheduler, or of a cluster started
    here (a ``LocalCluster``, or a queue's, :func:`_queue_cluster`; its config file must be in
    force, :func:`_cluster_config`).

    The local cluster's worker processes ignore ``SIGINT`` (:func:`_sigint_held`: they would
    each print a ``KeyboardInterrupt`` traceback while the caller shuts them down). With a
    ``log_file`` their standard error is that file (:func:`_stderr_to`: their warnings, and what
    they print while they are killed, go there) and their log records from WARNING on go to it;
    without, they print no log record below CRITICAL (``silence_logs``). A cell's error comes
    back as a value either way (:func:`_guarded_cell`). A Ctrl-C while the local cluster starts
    (seconds) is not seen; one while a client of ``scheduler`` connects is raised once it is
    connected, and closed. The local cluster's workers get ``resources`` (the cells ask for
    them; without, they would wait for ever); its dashboard binds to :data:`DEFAULT_DASHBOARD`
    unless ``spec.dashboard`` says otherwise. A cluster started here is kept at its size
    (:func:`_keep_workers`)."""
    from dask.distributed import Client, LocalCluster

    if spec.address is not None:
        with _sigint_held(inherit=False) as caught:
            client = Client(spec.address)
        if caught:
            _close_quietly(client, None)
            raise KeyboardInterrupt
        return client, None
    silence = logging.WARNING if log_file is not None else logging.CRITICAL
    with _sigint_held(inherit=True), _stderr_to(log_file):
        if spec.queue:
            cluster = _queue_cluster(spec, silence)
            size = spec.jobs
        else:
            cluster = LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker,
                                   processes=True, dashboard_address=_dashboard_option(spec),
                                   silence_logs=silence,
                                   resources=dict(resources) if resources else None)
            size = n_workers
        try:
            _keep_workers(cluster, size)
            return Client(cluster), cluster
        except BaseException:
            cluster.close()
            raise


@contextlib.contextmanager
def _children_allowed():
    """Worker processes started in the block (and restarted while it lasts) are not daemonic.

    A daemonic process may not start children, so a cell that asks for DataLoader workers
    (``uqvision sweep --workers N``) would fail in every worker of a ``LocalCluster``
    (``distributed.worker.daemon``, ``True`` in Dask's defaults; the nanny still ends its
    worker when it closes)."""
    import dask

    with dask.config.set({"distributed.worker.daemon": False}):
        yield


@contextlib.contextmanager
def _cluster_config(spec: ClusterSpec):
    """``spec``'s config file in force for the block (the jobs submitted again while the
    cluster runs read it too)."""
    if spec.config_file is None:
        yield
        return
    import dask

    with dask.config.set(read_cluster_config(spec.config_file)):
        yield


@contextlib.contextmanager
def open_client(scheduler: str | ClusterSpec, *, n_workers: int = 2,
                threads_per_worker: int = 1, log_file: str | os.PathLike | None = None):
    """A ``dask.distributed.Client`` of ``scheduler`` for the block: a running scheduler's
    address, or a :class:`ClusterSpec` (a cluster started here, closed at the end).

    Parameters
    ----------
    scheduler : str or ClusterSpec
    n_workers, threads_per_worker : int
        Of a ``LocalCluster`` started here.
    log_file : path, optional
        The standard error of the worker processes started here.

    Yields
    ------
    dask.distributed.Client
    """
    spec = _as_spec(scheduler)
    with _cluster_config(spec), _children_allowed():
        client, cluster = _connect(spec, n_workers, threads_per_worker,
                                   None if log_file is None else Path(log_file), spec.resources)
        try:
            yield client
        finally:
            _close_quietly(client, cluster)


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


def run_sweep(cells: Iterable[Cell], func: Callable[..., Any], out_dir, *,
              scheduler: str | ClusterSpec | None = None,
              n_workers: int = 2, threads_per_worker: int = 1, overwrite: bool = False,
              progress: bool = True, client: Any = None,
              progress_interval: float = LOG_PROGRESS_INTERVAL,
              group: Callable[[Cell], str] | None = None, group_unit: str = "group",
              on_result: Callable[[Cell, str | None], None] | None = None,
              log_file: str | os.PathLike | None = None,
              resources: Mapping[str, float] | None = None) -> SweepReport:
    """Run every cell not already on disk, on Dask.

    Parameters
    ----------
    cells : iterable of Cell
        Unique keys required.
    func : callable
        Top-level (picklable) function ``func(**cell.params) -> xarray.Dataset``.
    out_dir : path
        Directory of the cell files.
    scheduler : str or ClusterSpec, optional
        Address of an existing Dask scheduler (``tcp://host:8786``), or a :class:`ClusterSpec`
        (:func:`add_cluster_options`: a ``LocalCluster``, a running scheduler, or workers in
        jobs of a queue through dask-jobqueue, started here and closed at the end); default:
        start a ``LocalCluster`` with ``n_workers`` processes of ``threads_per_worker``
        threads, its dashboard on :data:`DEFAULT_DASHBOARD` (loopback).
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
    resources : mapping, optional
        Dask resources each cell asks for (``{"GPU": 1}``: one cell at a time on a worker that
        has one GPU); default the :class:`ClusterSpec`'s (``--gpus-per-job`` with cells on
        cuda). A ``LocalCluster`` started here gives each worker these resources; the workers
        of a queue cluster started here must have them (``--gpus-per-job`` gives ``GPU``);
        those of a running scheduler are the caller's business (a cell no worker can take
        waits).

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

    With progress on, the link of the dashboard of a cluster started here (or of the running
    scheduler) is printed once, on stderr. A worker that dies (its job preempted, killed, past
    its walltime) hands its cells back to the scheduler, which runs them on the other workers;
    a cluster started here submits a job (starts a worker) in its place
    (:data:`WORKER_CHECK_INTERVAL`). A cell whose workers died
    ``distributed.scheduler.allowed-failures`` + 1 times is reported failed (``KilledWorker``)
    and a rerun computes it; a cell file is written atomically, so one a killed worker was
    writing is not there, and is computed again.
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
    spec = _as_spec(scheduler)
    if resources is None:
        resources = spec.resources
    if resources is not None:
        resources = ClusterSpec(resources=resources).resources  # checked
        if client is None and spec.queue and set(resources) - ({"GPU"} if spec.gpus_per_job
                                                               else set()):
            raise ValueError(f"resources {dict(resources)!r}: the workers of --cluster "
                             f"{spec.kind} have none of them (GPU needs --gpus-per-job 1); the "
                             "cells would wait for ever")
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
                stack.enter_context(_cluster_config(spec))
                client, own_cluster = _connect(spec, n_workers, threads_per_worker,
                                               None if log_file is None else Path(log_file),
                                               resources)
                link = (_dashboard_link(client, own_cluster)
                        if progress and spec.dashboard != "none" else None)
                if link:
                    print(f"sweep: dashboard {link}"
                          + (f" ({spec.describe()} asked for)" if spec.queue else ""),
                          file=sys.stderr, flush=True)
            # a fresh task key per run: a scheduler that outlives a sweep (``scheduler=``,
            # ``client=``) still remembers the outcome of a key it ran, and would answer a
            # retry with it
            run = uuid.uuid4().hex[:8]
            futures = {client.submit(_guarded_cell, func, dict(c.params),
                                     str(cell_path(out, c)), key=f"cell-{c.key}-{run}",
                                     pure=False, resources=dict(resources) if resources else None
                                     ): c for c in todo}
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
