"""Progress of uqvision's long work, and the one process-wide switch that turns it off.

Every progress bar and progress line of uqvision (training, prediction, the demo, the
reproductions) goes to stderr through :func:`progress_bar` (the shared
:func:`uqmetrics.runs.sweep.progress_bar`: a tqdm bar on a terminal, else a line at most every
30 s and one at the end) or :func:`progress_line`; results (paths written, tables) go to
stdout. Both print nothing once :func:`set_progress` turned progress off for the process:
``uqvision --quiet COMMAND`` does it in :func:`uqvision.cli.main`, a library caller calls
``set_progress(False)`` (and ``set_progress(True)`` to undo it). A function that takes
``progress=`` (:func:`uqvision.training.loop.train_model`, :func:`uqvision.predict.predict`)
asks for progress of that call; the switch still overrides it.

Progress never touches a random generator or the order of a computation: the results do not
depend on it. This module imports no torch (``uqvision --quiet`` sets it before a command's
imports).
"""

from __future__ import annotations

import sys

from uqmetrics.runs.sweep import LOG_PROGRESS_INTERVAL
from uqmetrics.runs.sweep import progress_bar as _progress_bar

__all__ = ["progress_bar", "progress_enabled", "progress_line", "set_progress"]

#: Whether this process shows progress (:func:`set_progress`).
_ENABLED = [True]


def set_progress(enabled: bool) -> bool:
    """Turn every uqvision progress bar and progress line of this process on or off.

    Parameters
    ----------
    enabled : bool
        False: :func:`progress_bar` and :func:`progress_line` print nothing, whatever a
        function's ``progress=`` asks (``uqvision --quiet``).

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
    previous = _ENABLED[0]
    _ENABLED[0] = bool(enabled)
    return previous


def progress_enabled(requested: bool = True) -> bool:
    """Whether progress asked for (``requested``) is shown: the process-wide switch
    (:func:`set_progress`) and ``requested``."""
    return _ENABLED[0] and bool(requested)


def progress_bar(total: int, desc: str, *, unit: str = "item", enabled: bool = True,
                 interval: float = LOG_PROGRESS_INTERVAL, leave: bool = True):
    """:func:`uqmetrics.runs.sweep.progress_bar` on stderr, off when ``enabled`` is False or
    the process-wide switch is off (:func:`progress_enabled`).

    Parameters
    ----------
    total : int
        Units expected.
    desc : str
        The bar's label (the prefix of each line in a log).
    unit : str, default "item"
    enabled : bool, default True
        The caller's wish (a function's ``progress=``).
    interval : float, default 30
        Seconds between two lines when stderr is not a terminal (one more at the end).
    leave : bool, default True
        Keep a terminal's bar on screen once closed.

    Returns
    -------
    object
        ``update(n)``, ``set_postfix_str(s)``, ``close()``.
    """
    return _progress_bar(total, desc, unit=unit, enabled=progress_enabled(enabled),
                         interval=interval, leave=leave)


def progress_line(msg: str) -> None:
    """One progress line on stderr (flushed), unless the process-wide switch is off: what the
    demo and ``uqvision reproduce`` say as they go (results go to stdout)."""
    if _ENABLED[0]:
        print(msg, file=sys.stderr, flush=True)
