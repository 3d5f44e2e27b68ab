"""Weight files: one located in a cache (:class:`PretrainedWeights`: where it came from, its
path) and the SHA-256 of a weight file (:func:`file_sha256`), hashed once per process while the
file is unchanged (:func:`_memo_sha256`).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass

__all__ = ["PretrainedWeights", "file_sha256"]


@dataclass(frozen=True)
class PretrainedWeights:
    """A model's pretrained weights as a file in a cache
    (:func:`uqvision.models.pretrained_weights`).

    Parameters
    ----------
    source : str
        ``"hf-hub"`` (timm, the Hugging Face hub cache), ``"url"`` (timm, torch.hub's
        ``checkpoints`` folder) or ``"torchvision"`` (torch.hub's ``checkpoints`` folder).
    location : str
        The hub repository (``timm/resnet50.a1_in1k``, with ``@revision`` when the tag names
        one) or the url.
    filename : str
        The file's name in the repository, or in the ``checkpoints`` folder.
    revision : str
        The hub commit the cached file belongs to (its snapshot folder); ``""`` for a url.
    path : str
        The local file.
    """

    source: str
    location: str
    filename: str
    revision: str
    path: str

    @property
    def sha256(self) -> str:
        """The file's SHA-256 (hashed once per process while the file is unchanged)."""
        return _memo_sha256(self.path)

    def attrs(self) -> dict[str, str]:
        """``weights_source``, ``weights_location``, ``weights_revision``, ``weights_file``."""
        return {"weights_source": self.source, "weights_location": self.location,
                "weights_revision": self.revision, "weights_file": self.path}


def file_sha256(path: str | os.PathLike, *, chunk: int = 1 << 20) -> str:
    """SHA-256 hex digest of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


#: ``(real path, device, inode, size, mtime_ns, ctime_ns) -> sha256`` of weight files hashed in
#: this process (:func:`_memo_sha256`).
_SHA_MEMO: dict[tuple, str] = {}

#: A file changed less than this many seconds before it was hashed is hashed again next time:
#: a rewrite within the file system's timestamp granularity could keep its stat.
_RACY_S = 2.0


def _memo_sha256(path: str | os.PathLike) -> str:
    """:func:`file_sha256` of a weight file, hashed once per process while its stat (inode,
    size, modification and change times) is unchanged, so that the checks before a run and the
    load itself read a large file once. A file modified within :data:`_RACY_S` seconds of
    being hashed is not remembered (git's "racily clean" rule)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    key = (real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key in _SHA_MEMO:
        return _SHA_MEMO[key]
    sha = file_sha256(real)
    if time.time() - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 > _RACY_S:
        _SHA_MEMO[key] = sha
    return sha
