"""Whether two image sets share images, by their pixels: :func:`image_hashes` (every sample
decoded as the models see it, 8-bit RGB, read through the folder's source, so archives and
image lists are hashed as they are read) and :func:`check_disjoint`, which refuses an OOD set
holding an image of the in-distribution set (the same pixels under any name or file format: a
JPEG re-saved as PNG is the same image) and reports its near duplicates (a perceptual hash
within :data:`NEAR_DUPLICATE_DISTANCE` bits: a re-encoded or resized image).

Two hashes per image: the SHA-256 of its decoded pixels (width, height and RGB bytes: exact
duplicates) and ``imagehash.phash`` (64 bits from the DCT of its 32x32 grey image: near
duplicates; PyPI's ImageHash, the reference implementation of the perceptual hash of Zauner,
2010). Both need a full decode, the cost of the check.

Hashes may be kept on disk (``cache_dir``): one JSON file per folder (named by its layout and
root), mapping the SHA-256 of an image file's bytes to the two hashes of its pixels. The key is
the content itself, read at every check (:func:`uqvision.data.sample_digests`): a file whose
bytes changed is decoded again whatever its size and modification time, and only the decode
is saved. The file records the Pillow and ImageHash versions that made it; another version's
is not read. Within a process the hashes are kept per scanned folder object (the ID set of a
sweep is hashed once for all its OOD sets).
"""

from __future__ import annotations

import hashlib
import io
import os
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from uqmetrics import InputError

from ..exceptions import BadImageError, UqvisionWarning
from ._util import read_format_json, write_format_json
from .decode import _load
from .folders import ImageFolderDataset, sample_digests

__all__ = ["HASHES_FORMAT", "NEAR_DUPLICATE_DISTANCE", "NearDuplicateWarning", "check_disjoint",
           "content_hashes", "image_hashes"]

#: The format of a file of image hashes (``cache_dir``). Version 1 held hashes of the bytes,
#: keyed by the files' sizes and times: not read.
HASHES_FORMAT = {"format": "uqvision.image_hashes", "version": 2}
#: Two images whose perceptual hashes (64 bits) differ in at most this many bits are near
#: duplicates: a JPEG re-encoded at quality 30 to 95, or resized by half or double, stays
#: within 4 bits of its source, two different photographs differ in about 32
#: (docs/conventions.md#fingerprint-rules gives the measurement).
NEAR_DUPLICATE_DISTANCE = 8
#: Pairs an overlap error or report shows.
_SHOWN_PAIRS = 3
#: Hashes of the folders hashed in this process (folder object -> id -> (pixels, phash)).
_HASHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class NearDuplicateWarning(UqvisionWarning):
    """An OOD set holds images whose perceptual hash is within
    :data:`NEAR_DUPLICATE_DISTANCE` bits of an in-distribution image's (a re-encoded or resized
    copy, or a very similar picture): reported, not refused; the message names the pairs."""


def _folder(folder: ImageFolderDataset | str | os.PathLike) -> ImageFolderDataset:
    return folder if isinstance(folder, ImageFolderDataset) else ImageFolderDataset(folder)


def _versions() -> dict[str, str]:
    """The versions that decide the hashes: Pillow (decoding) and ImageHash (the phash)."""
    import imagehash  # deferred: scipy, PyWavelets (no prediction command loads them)
    import PIL

    return {"pillow": PIL.__version__, "imagehash": imagehash.__version__}


def _hash_sample(source, rel: str) -> tuple[str, tuple[str, str]] | None:
    """``(SHA-256 of the bytes, (SHA-256 of the pixels, phash))`` of sample ``rel``, from one
    read of its bytes; ``None`` when it cannot be read or decoded (the image check reports
    those)."""
    import imagehash  # deferred, see _versions

    try:
        data = source.read(rel)
        img = _load(io.BytesIO(data), source.where(rel))
    except (OSError, BadImageError):
        return None
    pixels = hashlib.sha256(f"{img.width} {img.height}\n".encode())
    pixels.update(img.tobytes())
    return (hashlib.sha256(data).hexdigest(),
            (pixels.hexdigest(), str(imagehash.phash(img))))


def _cache_file(ds: ImageFolderDataset, cache_dir: str | os.PathLike) -> Path:
    key = hashlib.sha256(f"{ds.layout}\0{Path(ds.root).resolve()}".encode()).hexdigest()
    return Path(cache_dir) / f"pixels-{key[:32]}.json"


def _read_kept(file: Path, versions: dict[str, str]) -> dict[str, tuple[str, str]]:
    """The hashes kept in ``file`` (bytes digest -> (pixels, phash)); empty when it is absent,
    damaged, of another format or made by other versions (decoded again, rewritten)."""
    try:
        meta = read_format_json(file, HASHES_FORMAT)
        if meta.get("versions") != versions:
            return {}
        return {k: (str(v[0]), str(v[1])) for k, v in meta["hashes"].items()}
    except (ValueError, KeyError, TypeError, IndexError, OSError):
        return {}


def image_hashes(folder: ImageFolderDataset | str | os.PathLike, *,
                 cache_dir: str | os.PathLike | None = None,
                 threads: int | None = None) -> dict[str, tuple[str, str]]:
    """The two hashes of every sample's pixels, decoded as the models see them (8-bit RGB).

    Parameters
    ----------
    folder : ImageFolderDataset or path
        A scanned folder (any layout of :mod:`uqvision.layouts`), or its path.
    cache_dir : path, optional
        Keep the hashes in ``cache_dir/pixels-<key>.json``, keyed by the SHA-256 of each file's
        bytes (every byte is read at every call; only the decode is saved: see the module's
        docstring).
    threads : int, optional
        Threads reading, decoding and hashing (Pillow and ``hashlib`` release the GIL);
        default ``min(8, os.cpu_count())``.

    Returns
    -------
    dict str -> (str, str), shape (n_samples,)
        Sample id -> (SHA-256 (hex) of its width, height and RGB bytes, its ``imagehash.phash``
        as 16 hex digits); samples that cannot be read or decoded are left out.
    """
    ds = _folder(folder)
    if ds in _HASHED:
        return _HASHED[ds]
    versions = _versions()
    file = None if cache_dir is None else _cache_file(ds, cache_dir)
    kept = {} if file is None else _read_kept(file, versions)
    digests = sample_digests(ds, threads=threads) if kept else {}
    out = {rel: kept[digests[rel]] for rel in ds.sample_ids if digests.get(rel) in kept}
    todo = [rel for rel in ds.sample_ids if rel not in out]
    workers = max(1, min(threads or 8, os.cpu_count() or 1, len(todo)))
    with ThreadPoolExecutor(workers) as pool:
        done = list(pool.map(lambda rel: _hash_sample(ds.source, rel), todo))
    fresh = {}
    for rel, got in zip(todo, done, strict=True):
        if got is not None:
            fresh[got[0]] = out[rel] = got[1]
    if file is not None and fresh:
        keep = {d: kept[d] for d in digests.values() if d in kept}  # this folder's only
        try:
            write_format_json({**HASHES_FORMAT, "root": str(Path(ds.root).resolve()),
                               "layout": ds.layout, "versions": versions,
                               "hashes": {**keep, **fresh}}, file)
        except OSError:
            pass  # a cache only: the check stands without it
    out = {rel: out[rel] for rel in ds.sample_ids if rel in out}
    _HASHED[ds] = out
    return out


def content_hashes(folder: ImageFolderDataset | str | os.PathLike, *,
                   cache_dir: str | os.PathLike | None = None,
                   threads: int | None = None) -> dict[str, str]:
    """The SHA-256 of every sample's decoded pixels (:func:`image_hashes`' first hash): two
    samples have the same one when a model sees the same image, whatever the file format.

    Returns
    -------
    dict str -> str, shape (n_samples,)
        Sample id -> hex digest; samples that cannot be read or decoded are left out.
    """
    return {rel: px for rel, (px, _) in image_hashes(folder, cache_dir=cache_dir,
                                                     threads=threads).items()}


def _popcount(x: np.ndarray) -> np.ndarray:
    """Set bits of each element of a uint64 array."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return np.bitwise_count(x)
    table = np.array([i.bit_count() for i in range(256)], dtype=np.uint8)
    return table[x[..., None].view(np.uint8)].sum(axis=-1)


def _nearest(ids: dict[str, tuple[str, str]], ood: dict[str, tuple[str, str]],
             limit: int) -> list[tuple[str, str, int]]:
    """``(ID id, OOD id, distance)`` of every OOD sample whose phash is within ``limit`` bits
    of an ID sample's (its nearest, the first in sample order at a tie), in OOD id order."""
    if not ids or not ood:
        return []
    id_rels = list(ids)
    id_bits = np.array([int(ph, 16) for _, ph in ids.values()], dtype=np.uint64)
    ood_rels = sorted(ood)
    ood_bits = np.array([int(ood[rel][1], 16) for rel in ood_rels], dtype=np.uint64)
    out = []
    step = max(1, 4_000_000 // len(id_bits))  # about 32 MB of uint64 at a time
    for lo in range(0, len(ood_bits), step):
        dist = _popcount(ood_bits[lo:lo + step, None] ^ id_bits[None, :])
        best = dist.argmin(axis=1)
        for j, i in enumerate(best):
            if dist[j, i] <= limit:
                out.append((id_rels[i], ood_rels[lo + j], int(dist[j, i])))
    return out


def check_disjoint(id_folder: ImageFolderDataset | str | os.PathLike,
                   ood_folder: ImageFolderDataset | str | os.PathLike, *, name: str,
                   id_name: str = "--data", cache_dir: str | os.PathLike | None = None,
                   near_distance: int | None = NEAR_DUPLICATE_DISTANCE) -> int:
    """Refuse an OOD set that holds an image of the in-distribution set, by its pixels; report
    its near duplicates.

    Every sample of both is decoded and hashed (:func:`image_hashes`), so an image copied
    under another name, re-saved in another lossless format (a JPEG as PNG) or into an archive
    or image list is found; one re-encoded (another JPEG quality) or resized is a near
    duplicate, reported as a :class:`NearDuplicateWarning`.

    Parameters
    ----------
    id_folder : ImageFolderDataset or path
        The in-distribution set (a sweep's ``--data``).
    ood_folder : ImageFolderDataset or path
        The OOD set.
    name : str
        How the messages name the OOD set (e.g. ``--ood-sets 'ninco=/data/ninco'``).
    id_name : str, default "--data"
        How the messages name the ID set (followed by its root).
    cache_dir : path, optional
        Where hashes are kept (:func:`image_hashes`).
    near_distance : int or None, default NEAR_DUPLICATE_DISTANCE
        Perceptual hashes that differ in at most this many of their 64 bits are near
        duplicates; ``None``: not looked for.

    Returns
    -------
    int
        The number of OOD images checked.

    Raises
    ------
    uqmetrics.InputError
        An OOD image has the pixels of an ID image: the message names the count and the first
        pairs (ID sample id, OOD sample id).

    Warns
    -----
    NearDuplicateWarning
        OOD images within ``near_distance`` bits of an ID image (and none the same): one line
        naming the count, the threshold and the first pairs with their distance.

    Examples
    --------
    ``--ood-sets 'ninco=/d/ninco': 2 of its 40 images are images of --data '/d/val' (the same
    pixels, SHA-256 of the decoded RGB, whatever the file format): (ID 'n01440764/a.JPEG', OOD
    'x/copy.png'), (ID ..., OOD ...); an ID image in an OOD set is an error, not a silent
    overlap: remove them from the OOD set``
    """
    ids, ood = _folder(id_folder), _folder(ood_folder)
    id_hashes = image_hashes(ids, cache_dir=cache_dir)
    by_pixels: dict[str, str] = {}
    for rel, (px, _) in id_hashes.items():
        by_pixels.setdefault(px, rel)
    ood_hashes = image_hashes(ood, cache_dir=cache_dir)
    pairs = [(by_pixels[px], rel) for rel, (px, _) in sorted(ood_hashes.items())
             if px in by_pixels]
    if pairs:
        shown = ", ".join(f"(ID {i!r}, OOD {o!r})" for i, o in pairs[:_SHOWN_PAIRS])
        more = f", ... (+{len(pairs) - _SHOWN_PAIRS} more)" if len(pairs) > _SHOWN_PAIRS else ""
        raise InputError(
            f"{name}: {len(pairs)} of its {len(ood_hashes)} images are images of {id_name} "
            f"{str(ids.root)!r} (the same pixels, SHA-256 of the decoded RGB, whatever the file "
            f"format): {shown}{more}; an ID image in an OOD set is an error, not a silent "
            "overlap: remove them from the OOD set")
    near = [] if near_distance is None else _nearest(id_hashes, ood_hashes, near_distance)
    if near:
        shown = ", ".join(f"(ID {i!r}, OOD {o!r}, {d} bits)" for i, o, d in near[:_SHOWN_PAIRS])
        more = f", ... (+{len(near) - _SHOWN_PAIRS} more)" if len(near) > _SHOWN_PAIRS else ""
        warnings.warn(
            f"{name}: {len(near)} of its {len(ood_hashes)} images are near duplicates of images "
            f"of {id_name} {str(ids.root)!r} (perceptual hash within {near_distance} of 64 "
            f"bits: re-encoded, resized or very similar): {shown}{more}; they are scored as "
            "OOD: look at them, and remove the copies from the OOD set",
            NearDuplicateWarning, stacklevel=2)
    return len(ood_hashes)
