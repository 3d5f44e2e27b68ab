"""Image sources of a scan: what opens a sample, knows its size and a key that changes when its
bytes may have: files under a folder (:class:`FileSource`) or members of an uncompressed tar
archive read in place (:class:`TarSource`).
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "FileSource",
    "TarSource",
    "UnreadableFileError",
]


class UnreadableFileError(FileNotFoundError):
    """A sample with no bytes to read (a tar link whose target the archive lacks); ``why``
    says why in a few words (the image check records it as the problem)."""

    def __init__(self, message: str, why: str):
        super().__init__(message)
        self.why = why


class FileSource:
    """Images as files under ``root``; a sample id is the path relative to ``root``."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def open(self, rel: str) -> Path:
        """What PIL opens for sample ``rel`` (the file's path)."""
        return self.root / rel

    def where(self, rel: str) -> str:
        """How a message names sample ``rel``."""
        return str(self.root / rel)

    def size(self, rel: str) -> int:
        """Bytes of sample ``rel``; -1 when the file does not exist or cannot be stat'ed (a
        dangling symbolic link, a loop of them)."""
        try:
            return (self.root / rel).stat().st_size
        except OSError:
            return -1

    def read(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()

    def stamp(self, rel: str) -> tuple:
        """``(path, size, modification time)``; ``OSError`` when the file cannot be stat'ed."""
        p = self.root / rel
        st = p.stat()
        return (str(p), st.st_size, st.st_mtime_ns)


class TarSource:
    """Images as members of an uncompressed tar archive (or of a ``.tar`` member of it), read in
    place with ``os.pread`` at their offset: no extraction, no shared file position (safe in
    threads, forked DataLoader workers get their own descriptor).

    Parameters
    ----------
    path : Path
        The archive.
    members : mapping str -> (str, int, int)
        Sample id -> (member name for messages, offset of its data, size in bytes). A link
        member is listed with its target's data (as extraction would write it).
    broken : mapping str -> (str, str), optional
        Sample ids with no data (a link whose target the archive lacks, a member that is not a
        file) -> (member name, why): reading one raises :class:`UnreadableFileError`.
    """

    def __init__(self, path: Path, members: Mapping[str, tuple[str, int, int]],
                 broken: Mapping[str, tuple[str, str]] | None = None):
        self.root = Path(path)
        self.members = members
        self.broken = dict(broken or {})
        st = self.root.stat()
        self._stat = (str(self.root), st.st_size, st.st_mtime_ns)
        self._file: tuple[int, Any] | None = None
        self._lock = (os.getpid(), threading.Lock())

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_file"], state["_lock"] = None, None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = (os.getpid(), threading.Lock())

    def _process_lock(self) -> threading.Lock:
        """This process's lock: a child forked while a thread of its parent held the parent's
        (opening the file) has a copy held for ever, by a thread it does not have; it makes
        its own (a forked DataLoader worker starts with one thread)."""
        pid, lock = self._lock
        if pid != os.getpid():
            lock = threading.Lock()
            self._lock = (os.getpid(), lock)
        return lock

    def _fd(self) -> int:
        file = self._file
        if file is None or file[0] != os.getpid():
            with self._process_lock():
                file = self._file
                if file is None or file[0] != os.getpid():
                    file = self._file = (os.getpid(), open(self.root, "rb"))  # noqa: SIM115
        return file[1].fileno()

    def read(self, rel: str) -> bytes:
        """The bytes of sample ``rel``; ``FileNotFoundError`` when the archive lacks it."""
        if rel in self.broken:
            raise UnreadableFileError(f"{self.where(rel)}: {self.broken[rel][1]}",
                                      self.broken[rel][1])
        try:
            _, offset, size = self.members[rel]
        except KeyError:
            raise FileNotFoundError(f"{self.where(rel)} is not in the archive") from None
        if hasattr(os, "pread"):
            data = os.pread(self._fd(), size, offset)
        else:  # pragma: no cover (no pread: one reader at a time)
            with self._process_lock():
                f = open(self.root, "rb")  # noqa: SIM115
                with f:
                    f.seek(offset)
                    data = f.read(size)
        if len(data) != size:
            raise OSError(f"archive {str(self.root)!r} ends inside member {self.where(rel)}")
        return data

    def open(self, rel: str) -> io.BytesIO:
        """What PIL opens for sample ``rel`` (its bytes in memory)."""
        return io.BytesIO(self.read(rel))

    def where(self, rel: str) -> str:
        member = (self.members[rel][0] if rel in self.members
                  else self.broken[rel][0] if rel in self.broken else rel)
        return f"{self.root}:{member}"

    def size(self, rel: str) -> int:
        return self.members[rel][2] if rel in self.members else -1

    def stamp(self, rel: str) -> tuple:
        if rel in self.broken:
            raise UnreadableFileError(f"{self.where(rel)}: {self.broken[rel][1]}",
                                      self.broken[rel][1])
        if rel not in self.members:
            raise FileNotFoundError(f"{self.where(rel)} is not in the archive")
        return (*self._stat, *self.members[rel][1:])

