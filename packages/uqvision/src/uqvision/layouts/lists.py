"""The ``image_list`` layout: a text file listing images, one ``<relative path> <label>`` per
line, read as OpenOOD ships its benchmarks (``benchmark_imglist/imagenet/test_ninco.txt``,
``test_imagenet.txt``, ...); registered in :data:`~uqvision.layouts.LAYOUTS` after the tar
layouts.

A line is the image's path relative to the list's data root, a space and an integer label
(OpenOOD's ``ImglistDataset`` reads ``line.split(' ', 1)``; here the label is the last token,
so a path with spaces reads too): ``-1`` for every line of an OOD list (its one class is
named ``-1``; an OOD evaluation set's class map ``none`` labels it -1), or a class index for an
in-distribution list (its classes are the indices, named ``0``, ``1``, ..., ordered by value,
mapped to the model's classes by index as ``by_index`` does). A list mixing both, a line with
no label or one that is not an integer, an absolute path or one through ``..``, a path listed
twice, a file that is not UTF-8: refused, naming the line. Paths are normalised before they are
compared (``./far/f1.png`` and ``far//f1.png`` are ``far/f1.png``, the sample's id): an image
listed twice however it is written would be scored twice. Every listed image must exist (a
dangling symbolic link is a sample that the image check finds unreadable): one that does not is
refused naming its line. Blank lines are skipped.

The data root (:func:`image_list_root`) is, in this order: the folder given as ``labels``
(``--labels DIR``: an image list has no label file, the option names its root instead); else
OpenOOD's, ``<list folder>/../../images_largescale`` (its repository's
``data/benchmark_imglist/imagenet/test_ninco.txt`` lists paths under
``data/images_largescale/``, the ``data_dir`` of its configs), where that folder exists; else
the list's own folder. A sample's id is its listed path, normalised; it is read as a file
under the root (:class:`~uqvision.layouts.FileSource`).
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

from uqmetrics import InputError

from .base import LAYOUTS, UNLABELLED, Layout, Scan
from .sources import FileSource

__all__ = ["IMAGE_LIST_ROOT", "image_list_root"]

#: OpenOOD's data root relative to the folder of one of its image lists
#: (``data/benchmark_imglist/imagenet/`` -> ``data/images_largescale/``).
IMAGE_LIST_ROOT = "../../images_largescale"


def image_list_root(path: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """The folder an image list's paths are relative to (see the module's docstring).

    Parameters
    ----------
    path : path
        The image list (``.txt``).
    root : path, optional
        The data root given (``--labels DIR``); must be a folder.

    Raises
    ------
    uqmetrics.InputError
        ``root`` given but not a folder.

    Examples
    --------
    >>> str(image_list_root("/nonexistent/data/benchmark_imglist/imagenet/test_ninco.txt"))
    '/nonexistent/data/benchmark_imglist/imagenet'
    """
    path = Path(path)
    if root is not None:
        if not Path(root).is_dir():
            raise InputError(f"labels: image list {str(path)!r} takes the folder its paths are "
                             f"relative to (its data root), got {str(root)!r}, not a folder")
        return Path(root)
    openood = Path(os.path.normpath(path.parent / IMAGE_LIST_ROOT))
    return openood if openood.is_dir() else path.parent


def _bad_line(path: Path, line_no: int, why: str) -> InputError:
    return InputError(f"image list {str(path)!r} line {line_no}: {why} (a line is "
                      "'<path relative to the data root> <integer label>', -1 for OOD)")


def _read_lines(path: Path) -> dict[str, tuple[int, int]]:
    """Sample id -> (label, line number) of every line, checked."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        line_no = path.read_bytes()[:err.start].count(b"\n") + 1
        raise _bad_line(path, line_no, f"not valid UTF-8 ({err.reason})") from None
    listed: dict[str, tuple[int, int]] = {}
    written: dict[str, str] = {}  # normalised path -> as its first line writes it
    for line_no, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        parts = line.rsplit(None, 1)
        if len(parts) != 2:
            raise _bad_line(path, line_no, f"{line!r} has no label")
        rel, label = parts
        try:
            value = int(label)
        except ValueError:
            raise _bad_line(path, line_no, f"label {label!r} of {rel!r} is not an "
                                           "integer") from None
        if value < -1:
            raise _bad_line(path, line_no, f"label {label!r} of {rel!r} is neither -1 nor a "
                                           "class index")
        norm = posixpath.normpath(rel)  # ./far/f1.png, far//f1.png: far/f1.png
        if rel.startswith("/") or ".." in rel.split("/") or norm == ".":
            raise _bad_line(path, line_no, f"{rel!r} is not a path inside the data root")
        if norm in listed:
            shown = repr(rel) if rel == norm else f"{rel!r} (that is {norm!r})"
            first = written[norm]
            raise _bad_line(path, line_no, f"{shown} is listed again (first on line "
                            f"{listed[norm][1]}" + ("" if first == norm else f" as {first!r}")
                            + "); each image once (it would be scored once per line)")
        listed[norm], written[norm] = (value, line_no), rel
    if not listed:
        raise InputError(f"image list {str(path)!r} lists no image")
    return listed


def _scan_image_list(path: Path, labels: Path | None) -> Scan:
    """An image list: its samples under its data root, labelled -1 (one class ``-1``) or by
    class index (classes named by the indices, ordered by value)."""
    root = image_list_root(path, labels)
    listed = _read_lines(path)
    ood = [(rel, n) for rel, (y, n) in listed.items() if y == -1]
    if ood and len(ood) < len(listed):
        rel, n = next((rel, n) for rel, (y, n) in listed.items() if y != -1)
        raise _bad_line(path, max(n, ood[0][1]),
                        f"the list mixes OOD lines (label -1, e.g. line {ood[0][1]}) and class "
                        f"indices (e.g. line {n}, {rel!r}); an image list is one or the other")
    missing = [(n, rel) for rel, (_, n) in listed.items()
               if not os.path.lexists(root / rel)]
    if missing:
        n, rel = min(missing)
        raise InputError(
            f"image list {str(path)!r} line {n}: {rel!r} is not in its data root "
            f"{str(root)!r} ({len(missing)} of its {len(listed)} images are missing); the "
            f"root is --labels DIR (library: labels=), else {IMAGE_LIST_ROOT!r} from the list's "
            "folder (OpenOOD's images_largescale/) where it exists, else the list's folder")
    values = sorted({y for y, _ in listed.values()})
    index = {y: i for i, y in enumerate(values)}
    samples = sorted(((rel, index[y]) for rel, (y, _) in listed.items()),
                     key=lambda s: (s[1], s[0]))
    classes = [UNLABELLED if y == -1 else str(y) for y in values]
    return Scan(path, "image_list", classes, samples, FileSource(root))


LAYOUTS.add("image_list", Layout(
    "image_list", "a .txt image list, '<relative path> <label>' per line (OpenOOD's "
                  "benchmark_imglist/imagenet/test_*.txt: label -1 for OOD, a class index "
                  "for ID), under its data root: --labels DIR, else OpenOOD's "
                  "../../images_largescale from the list's folder, else the list's folder",
    lambda p: p.is_file() and p.suffix.lower() == ".txt", _scan_image_list))
