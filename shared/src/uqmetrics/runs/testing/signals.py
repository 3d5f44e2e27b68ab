"""Ctrl-C in the tests of every package, whatever shell started them.

A shell starts a background job (``cmd &``) or a ``nohup`` command with ``SIGINT`` ignored, and
every process started from it inherits the ignored disposition; Python started that way
installs no :class:`KeyboardInterrupt` handler, so a ``SIGINT`` is not seen at all. A test that
interrupts a process therefore sets that process's disposition itself:

- :func:`interruptible` for a test that signals a process it starts;
- :func:`sigint_raises` for a test that signals its own process.

:func:`sigint_ignored` starts a command as such a shell would (the test that checks the others
do not depend on how they are started).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

__all__ = ["interruptible", "sigint_ignored", "sigint_raises"]

#: Sets ``SIGINT``'s disposition ({}: a name in :mod:`signal`), then replaces itself with the
#: command (same process id).
_LAUNCHER = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.{}); "
             "os.execvp(sys.argv[1], sys.argv[1:])")


def _launched(cmd: Sequence[str], disposition: str) -> list[str]:
    return [sys.executable, "-c", _LAUNCHER.format(disposition), *(str(part) for part in cmd)]


def interruptible(cmd: Sequence[str]) -> list[str]:
    """``cmd`` started with ``SIGINT`` at its default disposition, whatever this process's is.

    The command line returned runs a small Python launcher that restores ``SIGINT``'s default
    and then executes ``cmd`` in its own place (the process id, hence a process group started
    with ``start_new_session``, is the command's). A Python program started so raises
    :class:`KeyboardInterrupt` on ``SIGINT``, as from a terminal. Nothing runs in the forked
    child before ``exec`` (unlike ``preexec_fn``, which is unsafe while threads run).

    Parameters
    ----------
    cmd : sequence of str
        The program (a path, or a name looked up on ``PATH``) and its arguments.

    Returns
    -------
    list of str
        The command line to give :class:`subprocess.Popen`.

    Examples
    --------
    >>> import subprocess
    >>> code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    >>> run = lambda cmd: subprocess.run(cmd, capture_output=True, text=True).stdout
    >>> run(sigint_ignored([sys.executable, "-c", code]))  # as `nohup` would start it
    'False\\n'
    >>> run(sigint_ignored(interruptible([sys.executable, "-c", code])))
    'True\\n'
    """
    return _launched(cmd, "SIG_DFL")


def sigint_ignored(cmd: Sequence[str]) -> list[str]:
    """``cmd`` started with ``SIGINT`` ignored, as a shell starts a background job or ``nohup``
    does (the same launcher as :func:`interruptible`).

    Parameters
    ----------
    cmd : sequence of str
        The program (a path, or a name looked up on ``PATH``) and its arguments.

    Returns
    -------
    list of str
        The command line to give :class:`subprocess.Popen`.
    """
    return _launched(cmd, "SIG_IGN")


@contextmanager
def sigint_raises() -> Iterator[None]:
    """``SIGINT`` raises :class:`KeyboardInterrupt` in this process's main thread for the block
    (:func:`signal.default_int_handler`, what Python installs when started from a terminal);
    the previous handler is put back on exit. Call it from the main thread.

    Examples
    --------
    >>> import os
    >>> previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under `nohup`
    >>> with sigint_raises():
    ...     try:
    ...         os.kill(os.getpid(), signal.SIGINT)
    ...     except KeyboardInterrupt:
    ...         print("interrupted")
    interrupted
    >>> signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    True
    >>> _ = signal.signal(signal.SIGINT, previous)
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        # None: a handler set outside Python, which cannot be put back; the default then
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
