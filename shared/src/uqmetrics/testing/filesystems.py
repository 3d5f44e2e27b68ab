"""A real, small, full file system for the tests of every package: what a write does when the
disk fills up (no simulated ``ENOSPC``: the kernel's own)."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["full_filesystems"]


@contextmanager
def full_filesystems(parent: str | os.PathLike,
                     size: str = "1m") -> Iterator[Callable[[int], Path | None]]:
    """``make(leave) -> folder``: each call mounts a fresh tmpfs of ``size`` in a new folder of
    ``parent`` and fills it up to all but ``leave`` bytes (a file named ``filler``).

    Mounting needs root: ``make`` returns None where ``mount`` refuses (a test skips then).
    On exit every mount is detached lazily (``umount -l``): HDF5 keeps a file it could not
    close open.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d, full_filesystems(d) as make:
    ...     folder = make(4096)
    ...     folder is None or os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize <= 8192
    True
    """
    mounts: list[Path] = []

    def make(leave: int = 16384) -> Path | None:
        folder = Path(parent) / f"tmpfs{len(mounts)}"
        folder.mkdir()
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                              str(folder)], capture_output=True, text=True, check=False)
        if res.returncode != 0:
            return None
        mounts.append(folder)
        fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            for chunk in (65536, 4096, 512, 1):
                try:
                    while True:
                        os.write(fd, b"\0" * chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
            os.ftruncate(fd, os.fstat(fd).st_size - leave)
        finally:
            os.close(fd)
        return folder

    try:
        yield make
    finally:
        for folder in mounts:
            subprocess.run(["umount", "-l", str(folder)], check=False)
