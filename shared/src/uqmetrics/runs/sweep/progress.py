"""Progress of a long loop: a tqdm bar on a terminal, else plain lines at most every
:data:`LOG_PROGRESS_INTERVAL` seconds (:class:`LogProgress`), with the units done and left and an
ETA (:func:`progress_bar`, shared with uqreg's study loop and uqvision's training, prediction and
sweeps), and :func:`progress_line` for a step's one line.

One process-wide switch turns every bar and line off (:func:`set_progress`: ``uqvision
--quiet``, or a library caller); a function's own ``progress=`` asks for progress of that call,
and the switch overrides it. Progress goes to stderr, results to stdout; it never touches a
random generator or the order of a computation.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

#: Seconds between progress lines when the stream is not a terminal.
LOG_PROGRESS_INTERVAL = 30.0

#: Whether this process shows progress (:func:`set_progress`).
_SHOWN = [True]


def set_progress(shown: bool) -> bool:
    """Turn every progress bar (:func:`progress_bar`) and progress line (:func:`progress_line`)
    of this process on or off.

    Parameters
    ----------
    shown : bool
        False: nothing is printed, whatever a function's ``progress=`` asks (``uqvision
        --quiet``).

    Returns
    -------
    bool
        The previous setting (to restore it).

    Examples
    --------
    >>> before = set_progress(False)
    >>> progress_enabled(), progress_enabled(True)
    (False, False)
    >>> _ = set_progress(before)
    """
    previous = _SHOWN[0]
    _SHOWN[0] = bool(shown)
    return previous


def progress_enabled(requested: bool = True) -> bool:
    """Whether progress asked for (``requested``) is shown: the process-wide switch
    (:func:`set_progress`) and ``requested``."""
    return _SHOWN[0] and bool(requested)


def progress_line(msg: str, stream=None) -> None:
    """One progress line (flushed) on ``stream`` (default ``sys.stderr``), unless the
    process-wide switch is off (:func:`set_progress`)."""
    if _SHOWN[0]:
        print(msg, file=sys.stderr if stream is None else stream, flush=True)


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
        False: a reporter that prints nothing; so is it while the process-wide switch is off
        (:func:`set_progress`).
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
    if not progress_enabled(enabled):
        return _NoProgress()
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, leave=leave, file=stream, initial=initial,
                    smoothing=0)
    return LogProgress(total, desc, interval, stream, unit=unit, initial=initial)
