"""Warnings and exceptions raised by uqmetrics.

Every warning uqmetrics raises is a :class:`UqmetricsWarning`, so that one filter selects them
all, whichever module the warning is attributed to. Test configurations turn them into errors
by category, not by module::

    filterwarnings = ["error::uqmetrics.metrics.exceptions.UqmetricsWarning"]

(a module filter such as ``error::UserWarning:uqmetrics.*`` misses every warning raised with
``stacklevel > 1``, which Python attributes to the caller's module).
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable

__all__ = ["USAGE_ERRORS", "InputError", "UndefinedMetricWarning", "UqmetricsWarning", "error_line",
           "run_command"]


class UqmetricsWarning(UserWarning):
    """Base class of every warning raised by uqmetrics (a :class:`UserWarning` subclass)."""


class UndefinedMetricWarning(UqmetricsWarning):
    """A metric is undefined for the given input and NaN is returned.

    Raised, for example, by :func:`uqmetrics.auroc_score` when only correct (or only wrong)
    predictions are present, so that the Mann-Whitney estimate has an empty class. Like
    scikit-learn's warning of the same name, it is a :class:`UserWarning` subclass and the metric
    returns ``nan`` instead of raising.
    """


class InputError(ValueError):
    """A user's input is wrong (a bad option value, a file that does not match what it must
    match). The message names the input and the problem; command-line tools print it as one
    line and exit with code 2. A :class:`ValueError` subclass, so library callers that catch
    ``ValueError`` keep working."""


#: What the command-line tools report as a user's mistake (one line, exit code 2): the packages'
#: own input errors, ``ValueError`` (argument validation) and the OS errors a user causes (a
#: missing file, an existing output, a folder that cannot be written). Anything else is a bug in
#: the project and keeps its traceback.
USAGE_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError)


def error_line(exc: BaseException) -> str:
    """The one line a command-line tool prints for ``exc``.

    An OS error names its file and says what is wrong with it in words (``[Errno 17] File
    exists`` alone names neither); any other message is joined onto one line.

    Examples
    --------
    >>> error_line(FileNotFoundError(2, "No such file or directory", "a.nc"))
    'a.nc: does not exist'
    """
    if isinstance(exc, OSError) and exc.filename is not None and not isinstance(exc, InputError):
        what = {errno.EEXIST: "already exists (pass --overwrite to replace it)",
                errno.EACCES: "is not writable (permission denied)",
                errno.EROFS: "is on a read-only file system",
                errno.ENOENT: "does not exist",
                errno.ENOSPC: "cannot be written: no space left on the device",
                errno.ENOTDIR: "has a file where a folder is expected",
                errno.EISDIR: "is a folder where a file is expected"}.get(exc.errno, exc.strerror or str(exc))
        if exc.errno == errno.ENOSPC and exc.strerror and exc.strerror != os.strerror(errno.ENOSPC):
            what = f"cannot be written: {exc.strerror}"  # with the sizes (uqmetrics.write_dataset)
        return f"{exc.filename}: {' '.join(what.split())}"
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())  # one line


def run_command(prog: str, command: str, fn: Callable[[], int],
                errors: tuple[type[BaseException], ...] = USAGE_ERRORS) -> int:
    """Run one command of a command-line tool under the project's error policy.

    Parameters
    ----------
    prog, command : str
        The tool and its command, for the message (``"uqreg study: error: ..."``).
    fn : callable
        The command; returns its exit code.
    errors : tuple of exception classes
        What counts as a user's mistake: printed as ONE line on stderr, exit code 2.

    Returns
    -------
    int
        ``fn``'s exit code, 2 for a user's mistake, 130 on Ctrl-C. Any other exception
        propagates with its traceback (a bug in the project).
    """
    try:
        return fn()
    except KeyboardInterrupt:
        print(f"{prog} {command}: interrupted", file=sys.stderr)
        return 130
    except errors as exc:
        print(f"{prog} {command}: error: {error_line(exc)}", file=sys.stderr)
        return 2
