"""Quiet failures: where a sweep's log records, tracebacks and its workers' standard error go
(a log file, never the console), and Ctrl-C reaching the caller alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from pathlib import Path


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
