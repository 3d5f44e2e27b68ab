"""Checking image files: what is wrong with a damaged file in a few words (:func:`check_image`,
remembered per process), and the check of a whole folder before any work
(:func:`check_images`, :func:`readable_images`) with its one-line messages. Decoding one
(:func:`load_image`, re-exported here) is :mod:`uqvision.data.decode`.
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image

from ..exceptions import BadImageError
from .decode import _PIL_ERRORS, _problem, _to_rgb, load_image

if TYPE_CHECKING:
    from .folders import ImageFolderDataset

#: The option of ``predict``, ``sweep`` and the protocols' commands that leaves unreadable
#: images out: what the messages suggest unless a caller names another (or none).
SKIP_OPTION = "--skip-bad-images"

__all__ = [
    "bad_images_message",
    "check_image",
    "check_images",
    "label_problems_message",
    "load_image",
    "readable_images",
]


def check_image(path: str | os.PathLike | io.BytesIO) -> str | None:
    """What is wrong with an image file (a few words), or ``None`` when it reads.

    As strict as :func:`load_image` (an image it passes, the loader reads), and cheaper for a
    JPEG: the header is opened (an empty file, a file of another kind); a JPEG is decoded at
    its smallest DCT scale (``draft``: all the entropy-coded data is read, so a truncated or
    corrupt file fails, but only 1/64 of the pixels is produced); a PNG is verified (every
    chunk read and its CRC checked) and then decoded, since a chunk whose CRC holds may carry
    a damaged zlib stream, or too few rows, that only inflating finds; every other format is
    decoded. The pixels are then converted as the loader converts them (a 32-bit integer or
    floating-point image it refuses is refused here). ``path`` may be an image's bytes in
    memory (``io.BytesIO``).
    """
    try:
        with Image.open(path) as im:
            if im.format == "JPEG":
                im.draft("RGB", (1, 1))
                im.load()
                return None
            if im.format == "PNG":
                im.verify()  # the CRCs, which decoding does not check
        if isinstance(path, io.BytesIO):
            path.seek(0)
        with Image.open(path) as im:  # verify() leaves the image unusable: opened again
            _to_rgb(im, path)
    except BadImageError as err:  # its message names the file: the problem alone is kept
        return str(err).removeprefix(f"image {str(path)!r}: ")
    except _PIL_ERRORS as err:
        return _problem(path, err)
    return None


#: Results of :func:`check_image` by (path, size, modification time) — for an archive member,
#: (archive, its size and time, offset, size): a folder is checked once per process, whatever
#: the number of models run over it.
_CHECKED: dict[tuple, str | None] = {}


def _check_cached(source, rel: str) -> str | None:
    try:
        key = source.stamp(rel)
    except OSError as err:
        return _problem(source.where(rel), err)
    if key not in _CHECKED:
        try:
            _CHECKED[key] = check_image(source.open(rel))
        except OSError as err:  # an archive that changed or broke since it was listed
            _CHECKED[key] = _problem(rel, err)
    return _CHECKED[key]


def check_images(folder: ImageFolderDataset | str | os.PathLike, *,
                 threads: int | None = None) -> dict[str, str]:
    """The samples of an image folder that cannot be read, with what is wrong with each.

    Every file goes through :func:`check_image` (on ``threads`` threads, default up to 8: PIL
    decodes without the GIL); the result of a file is kept for the process, keyed by its size
    and modification time, so a folder is checked once however many models run over it. The
    cost is about one decode of a JPEG folder at 1/64 of the pixels, one full decode of a PNG
    folder.

    A flat layout's mismatches with its label file come first (:attr:`ImageFolderDataset.
    label_problems`: images listed there but absent, images without a label), then the files
    the scan found unusable (:attr:`ImageFolderDataset.scan_problems`: a name that is not
    UTF-8), then the unreadable images (a dangling symbolic link or tar link among them).

    Parameters
    ----------
    folder : ImageFolderDataset or path
    threads : int, optional

    Returns
    -------
    dict
        Relative path (the sample id) -> problem, in sample order; empty when all read.
    """
    from .folders import ImageFolderDataset  # it reads its images with this module's loader

    ds = folder if isinstance(folder, ImageFolderDataset) else ImageFolderDataset(folder)
    listed = ds.label_problems
    rels = [rel for rel, _ in ds.samples if rel not in listed]
    workers = max(1, min(threads or 8, os.cpu_count() or 1, len(rels)))
    check = functools.partial(_check_cached, ds.source)
    if workers == 1:
        problems = [check(rel) for rel in rels]
    else:
        with ThreadPoolExecutor(workers) as pool:
            problems = list(pool.map(check, rels))
    bad = {rel: why for rel, why in zip(rels, problems, strict=True) if why}
    return {**{rel: why for rel, why in listed.items() if rel not in ds.skipped},
            **{rel: why for rel, why in ds.scan_problems.items() if rel not in ds.skipped},
            **bad}


def readable_images(folder: ImageFolderDataset, *, skip_bad: bool = False,
                    skip_option: str | None = SKIP_OPTION) -> ImageFolderDataset:
    """``folder`` once its images are known to read (:func:`check_images`, before any work).

    Parameters
    ----------
    folder : ImageFolderDataset
    skip_bad : bool, default False
        Leave unreadable images out (recorded in the copy's ``skipped``) instead of raising
        (``--skip-bad-images``). Images of the label file that are absent are not unreadable:
        they are refused whatever ``skip_bad``; a folder scanned with ``subset=True``
        (``--subset``) has none.
    skip_option : str or None, default "--skip-bad-images"
        The caller's option that sets ``skip_bad``, which the message suggests; ``None`` for a
        command that has none (``uqvision train``): the message then says to fix or remove
        the images.

    Raises
    ------
    uqvision.exceptions.BadImageError
        Some images do not read and ``skip_bad`` is false, or some images of the label file are
        absent; the message names them.
    """
    bad = check_images(folder)
    samples = set(folder.sample_ids)
    absent = [rel for rel in bad if rel in folder.label_problems and rel in samples]
    if absent or (bad and not skip_bad):
        listed = {rel: why for rel, why in bad.items() if rel in folder.label_problems
                  and (rel in samples or not skip_bad)}
        if listed:
            raise BadImageError(label_problems_message(folder, listed, skip_option=skip_option),
                                folder.root)
        first = next(iter(bad))
        raise BadImageError(bad_images_message(folder.root, bad, folder.source.where,
                                               skip_option=skip_option),
                            folder.root / first if folder._folder_label is None
                            else folder.source.where(first))
    return folder.without(bad) if bad else folder


def bad_images_message(root: str | os.PathLike, bad: dict[str, str],
                       where: Callable[[str], str] | None = None, *,
                       skip_option: str | None = SKIP_OPTION, what: str | None = None) -> str:
    """One line for the bad images of a folder: how many, the first ones with their problem
    (each named ``where(relative path)``, default ``root / path``), and the option that skips
    them (``skip_option``; ``None``: the command has none). ``what`` names the folder instead
    of ``image folder 'root'`` (``--src 'root'``)."""
    where = where or (lambda rel: str(Path(root) / rel))
    shown = "; ".join(f"{where(rel)!r}: {why}" for rel, why in list(bad.items())[:3])
    more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
    skip = f", or pass {skip_option} to leave them out" if skip_option else ""
    return (f"{what or f'image folder {str(root)!r}'} has {len(bad)} unreadable image(s): "
            f"{shown}{more}; fix or remove them{skip}")


def label_problems_message(folder: ImageFolderDataset, problems: Mapping[str, str], *,
                           skip_option: str | None = SKIP_OPTION) -> str:
    """One line for the images of a flat layout that do not match its label file: how many are
    listed there but absent and how many have no label, with an example of each, and the
    option that takes each as it is (``--subset`` for the absent ones, ``skip_option`` for the
    unlabelled ones; ``None``: the command has none)."""
    samples = set(folder.sample_ids) | set(folder.skipped)
    absent = [rel for rel in problems if rel in samples]
    unlabelled = [rel for rel in problems if rel not in samples]
    parts = [f"{len(rels)} image(s) {what} (e.g. {rels[0]!r})"
             for rels, what in ((absent, "listed in the label file are absent"),
                                (unlabelled, "have no label there")) if rels]
    fixes = [fix for rels, fix in (
        (absent, (f"pass --subset (library: subset=True) to score the "
                  f"{len(samples) - len(absent)} labelled image(s) present as a subset of the "
                  "label file")),
        (unlabelled, skip_option and f"pass {skip_option} to leave the unlabelled ones out"))
        if rels and fix]
    label = folder.label_file.name if folder.label_file is not None else "?"
    return (f"image {'archive' if folder.layout.startswith('tar') else 'folder'} "
            f"{str(folder.root)!r} does not match label file {label!r}: {' and '.join(parts)}; "
            "fix the folder or the label file" + (f", or {', and '.join(fixes)}" if fixes else ""))
