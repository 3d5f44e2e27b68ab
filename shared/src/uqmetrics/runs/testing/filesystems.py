"""Real file-system faults for the tests of every package: a small full file system (what a
write does when the disk fills up: the kernel's own ``ENOSPC``, nothing simulated) and an
append-only folder (files can be created in it, none removed or renamed). Both need root, as
the project's CI runs; elsewhere they raise :class:`RuntimeError` saying so (never a skip).
And a received folder's planted link (:func:`planted_link`)."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["append_only", "full_filesystems", "not_writable", "planted_link"]


@contextmanager
def full_filesystems(parent: str | os.PathLike,
                     size: str = "1m") -> Iterator[Callable[[int], Path]]:
    """``make(leave) -> folder``: each call mounts a fresh tmpfs of ``size`` in a new folder of
    ``parent`` and fills it up to all but ``leave`` bytes (a file named ``filler``).

    Mounting needs root: ``make`` raises :class:`RuntimeError` with ``mount``'s message where
    it refuses. On exit every mount is detached lazily (``umount -l``): HDF5 keeps a file it could not
    close open.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d, full_filesystems(d) as make:
    ...     folder = make(4096)  # doctest: +SKIP
    ...     os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize <= 8192  # doctest: +SKIP
    True
    """
    mounts: list[Path] = []

    def make(leave: int = 16384) -> Path:
        folder = Path(parent) / f"tmpfs{len(mounts)}"
        folder.mkdir()
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                              str(folder)], capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"cannot mount a {size} tmpfs on {folder} (it needs root, as the "
                               f"project's CI has): {res.stderr.strip()}")
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


@contextmanager
def append_only(folder: str | os.PathLike) -> Iterator[Path]:
    """``folder`` append-only for the block (``chattr +a``: files can be created in it, none
    removed or renamed, by root too), as a folder that turned read-only in the middle of a
    write; restored on exit. Needs root and a file system with the attribute:
    :class:`RuntimeError` with ``chattr``'s message otherwise."""
    folder = Path(folder)
    res = subprocess.run(["chattr", "+a", str(folder)], capture_output=True, text=True,
                         check=False)
    if res.returncode != 0:
        raise RuntimeError(f"cannot make {folder} append-only (chattr +a needs root and a file "
                           f"system with the attribute): {res.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["chattr", "-a", str(folder)], check=False)


def not_writable(monkeypatch, folder: str | os.PathLike) -> None:
    """Make ``os.access(folder, W_OK)`` answer False for ``folder`` alone (the other answers are
    the system's), for the rest of a test: the answer a user gets after ``chmod a-w``, which
    root (who runs the tests here) writes through. ``monkeypatch``: pytest's fixture."""
    folder, access = Path(folder), os.access
    monkeypatch.setattr(os, "access", lambda path, mode, *a, **k: False
                        if Path(path) == folder and mode & os.W_OK
                        else access(path, mode, *a, **k))


def planted_link(folder: str | os.PathLike, name: str, outside: str | os.PathLike, *,
                 to_file: bool) -> tuple[Path, Path, Path]:
    """A link planted in a folder received from someone else: ``outside`` made, holding one file
    of someone's (``notes.txt``, text ``someone's``), and ``folder/name`` (its parents made) a
    symbolic link to that file (``to_file``: where a command writes a file, a log or a lock) or
    to ``outside`` (where it writes a folder).

    Returns
    -------
    (link, target, victim) : tuple of Path
        The link, where it points, and the file of someone's.
    """
    outside = Path(outside)
    outside.mkdir()
    victim = outside / "notes.txt"
    victim.write_text("someone's")
    link = Path(folder) / name
    link.parent.mkdir(parents=True, exist_ok=True)
    target = victim if to_file else outside
    link.symlink_to(target)
    return link, target, victim
