"""Work done once per test run and shared by pytest-xdist's workers (:func:`once_per_run`).

A session-scoped fixture runs once per *process*: under ``pytest -n 2`` each worker that needs
an expensive, deterministic output (a smoke reproduction, say) makes it again. Here the first
worker to need it makes it under an exclusive lock in the workers' common temporary folder,
and the others wait for it and read it.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any


def shared_root(basetemp: str | os.PathLike) -> Path:
    """The folder every worker of this test run shares: the parent of a pytest-xdist worker's
    temporary root (``.../pytest-N/popen-gw0`` → ``.../pytest-N``), else ``basetemp`` itself."""
    base = Path(basetemp)
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once_per_run(root: str | os.PathLike, name: str, make: Callable[[Path], Any]) -> Any:
    """``make(folder)``'s JSON-able return value, ``make`` called at most once per test run.

    Parameters
    ----------
    root : path
        :func:`shared_root` of the session's ``tmp_path_factory.getbasetemp()``.
    name : str
        The work's name: its folder is ``root/name``, its lock ``root/name.lock``.
    make : callable
        ``make(folder) -> value``; writes its output under ``folder`` (created empty for it).
        The value is recorded in ``root/name.done``, which marks the work complete.

    Returns
    -------
    object
        The recorded value, read back from JSON (a path comes back as a ``str``).

    Notes
    -----
    The lock (``flock``) is held only while one work is made, never while another is asked
    for, so workers cannot deadlock. A ``make`` that raises leaves no ``.done``: the next
    worker to ask makes it again, from an empty folder, and fails as well.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    folder, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            value = make(folder)
            done.write_text(json.dumps(value))
    return json.loads(done.read_text())


__all__ = ["once_per_run", "shared_root"]
