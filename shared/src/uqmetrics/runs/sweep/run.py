"""The driver of a sweep: :func:`run_sweep` sends every cell whose file is not complete to a
cluster, resumes, reports progress and failures (:class:`~uqmetrics.runs.sweep.cells.SweepReport`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .cells import (
    Cell,
    CellFailure,
    SweepReport,
    _guarded_cell,
    cell_path,
    is_complete,
    stop_writes,
)
from .launch import (
    _as_spec,
    _close_quietly,
    _cluster_config,
    _connect,
    _dashboard_link,
)
from .logs import _dask_logs_to, _LogFile
from .options import (
    ClusterSpec,
)
from .progress import LOG_PROGRESS_INTERVAL, progress_bar

#: What a sweep refused before any work raises (a user's mistake, exit code 2 on the command
#: line: :data:`uqmetrics.metrics.exceptions.USAGE_ERRORS`): a queue that refuses its jobs, a
#: bad cluster option, an output folder that cannot be written.
REFUSALS: tuple[type[BaseException], ...] = (ValueError, OSError)


def _lexists(path: Path) -> bool:
    return os.path.lexists(path)


class _Refusal:
    """What :func:`undone_if_refused` yields: :meth:`kept` once the work has begun."""

    def __init__(self) -> None:
        self.undo = True

    def kept(self) -> None:
        """From now on nothing is undone: the block's work has begun."""
        self.undo = False


@contextlib.contextmanager
def undone_if_refused(*paths: str | os.PathLike | None,
                      errors: tuple[type[BaseException], ...] = REFUSALS):
    """Undo what the block created at ``paths`` if it raises one of ``errors`` before any work
    (a cluster that refuses to start): a refused command leaves no empty folder, no log of its
    own, nothing changed of what was there before.

    Each path (a folder or a file the block may create; None is passed over) and its missing
    parents are noted before the block. When it raises one of ``errors``, and the folders it
    created hold nothing but what ``paths`` name (no result was written), the files it created
    are removed, a file that was there is cut back to its length before the block (a log the
    refusal appended to), and the folders it created are removed, deepest first. Otherwise
    (anything else in them) nothing is touched; nor once the block has called ``kept()`` on
    what this yields (its work has begun: a cluster started). The exception is raised again.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     out = Path(d) / "out"
    ...     try:
    ...         with undone_if_refused(out / "cells", out / "sweep.log"):
    ...             (out / "cells").mkdir(parents=True)
    ...             _ = (out / "sweep.log").write_text("refused")
    ...             raise ValueError("the queue refused a job")
    ...     except ValueError:
    ...         pass
    ...     out.exists()
    False
    """
    named = [Path(p).absolute() for p in paths if p is not None]
    new: set[Path] = set()  # the paths named and their parents that are not there yet
    sizes: dict[Path, tuple[int, int]] = {}  # a regular file there: (inode, size)
    for path in named:
        if _lexists(path):
            if path.is_file() and not path.is_symlink():
                st = path.stat()
                sizes[path] = (st.st_ino, st.st_size)
            continue
        new.add(path)
        parent = path.parent
        while parent != parent.parent and not _lexists(parent):
            new.add(parent)
            parent = parent.parent
    refusal = _Refusal()
    try:
        yield refusal
    except errors:
        if refusal.undo:
            _undo(new, sizes, set(named))
        raise


def _undo(new: set[Path], sizes: dict[Path, tuple[int, int]], named: set[Path]) -> None:
    """:func:`undone_if_refused`'s undoing (best effort: what cannot be undone is left)."""
    known = new | named
    made = [p for p in new if _lexists(p)]
    folders = [p for p in made if p.is_dir() and not p.is_symlink()]
    try:
        if any(child not in known for folder in folders for child in folder.iterdir()):
            return  # something else was written there: not a refusal before any work
    except OSError:
        return
    with contextlib.suppress(OSError):
        for path, (inode, size) in sizes.items():
            st = path.stat()
            if st.st_ino == inode and st.st_size > size:
                os.truncate(path, size)
    for path in made:
        if path not in folders:
            with contextlib.suppress(OSError):
                path.unlink()
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):  # not empty: kept
            folder.rmdir()


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
    one line. The complete files stay; a rerun resumes. The cells of a ``client`` given are
    cancelled; those running in this process (a cluster of threads) write nothing more, and
    the interrupt is raised once the files they were writing are whole
    (:func:`~uqmetrics.runs.sweep.cells.stop_writes`): no file of the sweep appears later.

    With progress on, the link of the dashboard of a cluster started here (or of the running
    scheduler) is printed once, on stderr. A worker that dies (its job preempted, killed, past
    its walltime) hands its cells back to the scheduler, which runs them on the other workers;
    a cluster started here submits a job (starts a worker) in its place
    (:data:`WORKER_CHECK_INTERVAL`). A cell whose workers died
    ``distributed.scheduler.allowed-failures`` + 1 times is reported failed (``KilledWorker``)
    and a rerun computes it; a cell file is written atomically, so one a killed worker was
    writing is not there, and is computed again.
    """
    cells = list(cells)
    keys = [c.key for c in cells]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})
        raise ValueError(f"cell keys must be unique, repeated: {dup}")
    with undone_if_refused(out_dir, log_file) as refusal:  # a cluster refusing to start: nothing left
        return _run_sweep(cells, func, out_dir, refusal, scheduler=scheduler, n_workers=n_workers,
                          threads_per_worker=threads_per_worker, overwrite=overwrite,
                          progress=progress, client=client, progress_interval=progress_interval,
                          group=group, group_unit=group_unit, on_result=on_result,
                          log_file=log_file, resources=resources)


def _run_sweep(cells: list[Cell], func: Callable[..., Any], out_dir, refusal: _Refusal, *,
               scheduler: str | ClusterSpec | None, n_workers: int, threads_per_worker: int,
               overwrite: bool, progress: bool, client: Any, progress_interval: float,
               group: Callable[[Cell], str] | None, group_unit: str,
               on_result: Callable[[Cell, str | None], None] | None,
               log_file: str | os.PathLike | None,
               resources: Mapping[str, float] | None) -> SweepReport:
    """:func:`run_sweep`, its cells checked unique; ``refusal.kept()`` once the cluster runs."""
    from dask.distributed import as_completed

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
    # a fresh task key per run: a scheduler that outlives a sweep (``scheduler=``,
    # ``client=``) still remembers the outcome of a key it ran, and would answer a retry with
    # it; the run's cells in this process write nothing once it is interrupted (stop_writes)
    run = uuid.uuid4().hex[:8]
    futures: dict = {}
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
            refusal.kept()  # the cluster runs: what follows is the sweep's, never undone
            futures = {client.submit(_guarded_cell, func, dict(c.params),
                                     str(cell_path(out, c)), run, key=f"cell-{c.key}-{run}",
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
                    if not own_client and futures:  # a borrowed cluster computes no more of it
                        with contextlib.suppress(Exception):
                            client.cancel(list(futures))
                    stop_writes(run)  # whole files only, and none after this returns
                    _close_quietly(client if own_client else None, own_cluster)
            else:
                if own_client and client is not None:
                    client.close()
                if own_cluster is not None:
                    own_cluster.close()
    return report
