"""Whether two image sets share images, by content: :func:`content_hashes` (the SHA-256 of every
sample's bytes, read through the folder's source, so archives and image lists are hashed as
they are read) and :func:`check_disjoint`, which refuses an OOD set holding an image of the
in-distribution set (the same bytes under any name): an ID image found in an OOD set is an
error, not a silent overlap.

Hashes may be kept on disk (``cache_dir``): one JSON file per folder, named by a key over the
folder's layout, its root and every sample's id and stamp (path or archive, size, modification
time: :meth:`uqvision.layouts.FileSource.stamp`), so a folder whose files change is hashed
again; and within a process, per scanned folder object (the ID set of a sweep is hashed once
for all its OOD sets).
"""

from __future__ import annotations

import hashlib
import os
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from uqmetrics import InputError

from ._util import read_format_json, write_format_json
from .folders import ImageFolderDataset

__all__ = ["HASHES_FORMAT", "check_disjoint", "content_hashes"]

#: The format of a file of content hashes (``cache_dir``).
HASHES_FORMAT = {"format": "uqvision.content_hashes", "version": 1}
#: Pairs an overlap error shows.
_SHOWN_PAIRS = 3
#: Content hashes of the folders hashed in this process (folder object -> id -> digest).
_HASHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _folder(folder: ImageFolderDataset | str | os.PathLike) -> ImageFolderDataset:
    return folder if isinstance(folder, ImageFolderDataset) else ImageFolderDataset(folder)


def _hash_one(source, rel: str) -> str | None:
    """The SHA-256 (hex) of sample ``rel``'s bytes; ``None`` when it cannot be read (a dangling
    link, a broken archive member: the image check reports those)."""
    try:
        return hashlib.sha256(source.read(rel)).hexdigest()
    except OSError:
        return None


def _key(ds: ImageFolderDataset) -> str | None:
    """The key of ``ds``'s hashes on disk (layout, root, every sample's id and stamp);
    ``None`` when a sample cannot be stamped (nothing is kept)."""
    h = hashlib.sha256(f"{ds.layout}\0{Path(ds.root).resolve()}\n".encode())
    for rel in ds.sample_ids:
        try:
            h.update(f"{rel}\0{ds.source.stamp(rel)!r}\n".encode())
        except OSError:
            return None
    return h.hexdigest()


def content_hashes(folder: ImageFolderDataset | str | os.PathLike, *,
                   cache_dir: str | os.PathLike | None = None,
                   threads: int | None = None) -> dict[str, str]:
    """The SHA-256 of every sample's bytes, read through the folder's source.

    Parameters
    ----------
    folder : ImageFolderDataset or path
        A scanned folder (any layout of :mod:`uqvision.layouts`), or its path.
    cache_dir : path, optional
        Keep the hashes in ``cache_dir/<key>.json`` and read them back while the folder's
        samples are unchanged (see the module's docstring).
    threads : int, optional
        Threads reading and hashing (``hashlib`` releases the GIL); default
        ``min(8, os.cpu_count())``.

    Returns
    -------
    dict str -> str, shape (n_samples,)
        Sample id -> SHA-256 (hex) of its bytes; samples that cannot be read are left out.
    """
    ds = _folder(folder)
    if ds in _HASHED:
        return _HASHED[ds]
    key = _key(ds) if cache_dir is not None else None
    file = None if key is None else Path(cache_dir) / f"{key}.json"
    if file is not None and file.is_file():
        try:
            out = dict(read_format_json(file, HASHES_FORMAT)["hashes"])
        except (ValueError, KeyError, TypeError, OSError):
            out = None  # damaged or another format: hashed again, rewritten
        if out is not None:
            _HASHED[ds] = out
            return out
    ids = ds.sample_ids
    n = threads or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=n) as pool:
        digests = list(pool.map(lambda rel: _hash_one(ds.source, rel), ids))
    out = {rel: d for rel, d in zip(ids, digests, strict=True) if d is not None}
    if file is not None:
        try:
            write_format_json({**HASHES_FORMAT, "root": str(Path(ds.root).resolve()),
                               "layout": ds.layout, "hashes": out}, file)
        except OSError:
            pass  # a cache only: the check stands without it
    _HASHED[ds] = out
    return out


def check_disjoint(id_folder: ImageFolderDataset | str | os.PathLike,
                   ood_folder: ImageFolderDataset | str | os.PathLike, *, name: str,
                   id_name: str = "--data", cache_dir: str | os.PathLike | None = None) -> int:
    """Refuse an OOD set that holds an image of the in-distribution set, by content hash.

    Every sample of both is hashed (:func:`content_hashes`, SHA-256 of its bytes), so an image
    copied under another name, into another folder or into an archive or image list is found.

    Parameters
    ----------
    id_folder : ImageFolderDataset or path
        The in-distribution set (a sweep's ``--data``).
    ood_folder : ImageFolderDataset or path
        The OOD set.
    name : str
        How the message names the OOD set (e.g. ``--ood-sets 'ninco=/data/ninco'``).
    id_name : str, default "--data"
        How the message names the ID set (followed by its root).
    cache_dir : path, optional
        Where hashes are kept (:func:`content_hashes`).

    Returns
    -------
    int
        The number of OOD images checked.

    Raises
    ------
    uqmetrics.InputError
        An OOD image has the bytes of an ID image: the message names the count and the first
        pairs (ID sample id, OOD sample id).

    Examples
    --------
    ``--ood-sets 'ninco=/d/ninco': 2 of its 40 images are images of --data '/d/val' (the same
    bytes, SHA-256): (ID 'n01440764/a.JPEG', OOD 'x/copy.jpg'), (ID ..., OOD ...); an ID
    image in an OOD set is an error, not a silent overlap: remove them from the OOD set``
    """
    ids, ood = _folder(id_folder), _folder(ood_folder)
    by_hash: dict[str, str] = {}
    for rel, digest in content_hashes(ids, cache_dir=cache_dir).items():
        by_hash.setdefault(digest, rel)
    ood_hashes = content_hashes(ood, cache_dir=cache_dir)
    pairs = [(by_hash[d], rel) for rel, d in sorted(ood_hashes.items()) if d in by_hash]
    if pairs:
        shown = ", ".join(f"(ID {i!r}, OOD {o!r})" for i, o in pairs[:_SHOWN_PAIRS])
        more = f", ... (+{len(pairs) - _SHOWN_PAIRS} more)" if len(pairs) > _SHOWN_PAIRS else ""
        raise InputError(
            f"{name}: {len(pairs)} of its {len(ood_hashes)} images are images of {id_name} "
            f"{str(ids.root)!r} (the same bytes, SHA-256): {shown}{more}; an ID image in an OOD "
            "set is an error, not a silent overlap: remove them from the OOD set")
    return len(ood_hashes)
