"""The layouts of a folder: class folders (``class_folders``: ``root/<class>/.../<image>``) and
a flat folder of images labelled by a label file (``flat``), registered in
:data:`~uqvision.layouts.LAYOUTS` in this order. A flat folder with no label file is read as
unlabelled images, one class :data:`~uqvision.layouts.UNLABELLED`, where its labels are not
needed (an OOD set: ``scan_layout(..., unlabelled=True)``).

Both read a folder as torchvision's ImageFolder does, links to folders followed, with one
difference said where it matters: hidden names (``.``) are never read, and a hidden folder
beside the class folders that holds images, which torchvision would count as a class, is
refused rather than dropped (docs/conventions.md#v-data).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from uqmetrics import InputError

from .base import (
    LAYOUTS,
    UNLABELLED,
    Layout,
    Scan,
    _hidden_class,
    _label_flat,
    _mixed,
    _refuse_labels,
)
from .labels import _labels_for, find_label_files
from .names import (
    IMG_EXTENSIONS,
    _hidden,
    _is_image,
    _not_utf8,
    _refuse_class_name,
    _shown,
    _utf8,
    list_classes,
)
from .sources import FileSource

__all__: list[str] = []


# -- class folders ----------------------------------------------------------------------------

def _folder_key(path: str | os.PathLike) -> tuple[int, int]:
    """(device, inode) of a folder, links followed: what a folder met twice on one path
    shares."""
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _ancestors(root: Path) -> tuple:
    """Every folder on the path from / to ``root`` (their :func:`_folder_key`): a link to any
    of them is a loop (:func:`_images_below`)."""
    resolved = root.resolve()
    return tuple(_folder_key(p) for p in (resolved, *resolved.parents))


def _images_below(root: Path, top: str, start: tuple, *, hidden: bool = False) -> list[str]:
    """The image files below ``root/top``, as paths relative to ``root`` (posix, unsorted).

    Links to folders are followed, as torchvision's ImageFolder follows them
    (``os.walk(followlinks=True)``); an image file that is a dangling link is listed (the
    image check finds it unreadable). Hidden names (:func:`~.names._hidden`) are skipped at
    every depth unless ``hidden`` (what torchvision would read below a hidden folder).

    Raises
    ------
    uqmetrics.InputError
        A folder link that leads back to a folder holding it (``root`` or above it included),
        which would be followed for ever; a folder that cannot be listed (permission).
    """
    # start: :func:`_ancestors` of root, computed once per scan; a link to any is a loop
    stack = [(top, (*start, _folder_key(root / top)))]
    found: list[str] = []
    while stack:
        rel, above = stack.pop()
        try:
            with os.scandir(root / rel) as it:
                entries = list(it)
        except OSError as err:
            raise InputError(f"image folder {str(root)!r}: folder {_shown(rel)!r} cannot be "
                             f"listed ({err.strerror or err})") from None
        for e in entries:
            if _hidden(e.name) and not hidden:
                continue
            sub = f"{rel}/{e.name}"
            if e.is_dir():  # a link to a folder too
                key = _folder_key(e.path)
                if key in above:
                    raise InputError(
                        f"image folder {str(root)!r}: {_shown(sub)!r} is a link to "
                        f"{_shown(os.path.realpath(e.path))!r}, a folder that holds it: it "
                        "would be followed for ever (torchvision's ImageFolder, which follows "
                        "folder links, would loop too); remove the link")
                stack.append((sub, (*above, key)))
            elif _is_image(e.name) and (e.is_file() or e.is_symlink()):
                found.append(sub)
    return found


def _refuse_hidden_classes(root: Path, classes: list[str], start: tuple) -> None:
    """Refuse a hidden folder beside the class folders that holds images
    (:func:`~.base._hidden_class`); one without images (``.ipynb_checkpoints``) is ignored."""
    with os.scandir(root) as entries:
        hidden = sorted(e.name for e in entries if _hidden(e.name) and e.is_dir())
    for name in hidden:
        images = sorted(_images_below(root, name, start, hidden=True))
        if images:
            raise _hidden_class(root, "image folder", name, images, classes)


def _scan_class_folders(root: Path, labels: Path | None) -> Scan:
    """Class folders: the image files below each, links to folders followed, hidden names
    skipped (:func:`_images_below`); an image file that is a dangling symbolic link is a
    sample (the image check finds it unreadable), one whose name is not UTF-8 a problem;
    images directly in ``root`` beside the class folders are refused (:func:`_mixed`), and so
    is a hidden folder there that holds images (:func:`_refuse_hidden_classes`)."""
    _refuse_labels(root, labels, "class-folder")
    classes = list_classes(root)
    for c in classes:
        _refuse_class_name(root, c)
    start = _ancestors(root)
    _refuse_hidden_classes(root, classes, start)
    samples: list[tuple[str, int]] = []
    problems: dict[str, str] = {}
    empty = []
    for i, c in enumerate(classes):
        files = sorted(_images_below(root, c, start))
        if not files:
            empty.append(c)
        samples.extend((f, i) for f in files if _utf8(f))
        problems.update({_shown(f): _not_utf8(f) for f in files if not _utf8(f)})
    flat = _flat_names(root)
    if flat:
        raise _mixed(root, "image folder", flat, classes, len(samples) + len(problems))
    if empty:
        raise FileNotFoundError(
            f"image folder {str(root)!r}: class folder(s) {empty[:5]} contain no image "
            f"({', '.join(IMG_EXTENSIONS)})")
    return Scan(root, "class_folders", classes, samples, FileSource(root), problems=problems)


LAYOUTS.add("class_folders", Layout(
    "class_folders", "a folder with one sub-folder per class: root/<class>/.../<image>",
    lambda p: p.is_dir() and bool(list_classes(p)), _scan_class_folders))


# -- flat folder --------------------------------------------------------------------------------

def _image_entry(e: os.DirEntry) -> bool:
    """An image file, or a symbolic link named as one (dangling ones included: the image check
    reports them, they are not dropped)."""
    return not _hidden(e.name) and _is_image(e.name) and (e.is_file() or e.is_symlink())


def _flat_names(root: Path) -> list[str]:
    with os.scandir(root) as entries:
        return sorted(e.name for e in entries if _image_entry(e))


def _scan_flat(root: Path, labels: Path | None) -> Scan:
    names = _flat_names(root)
    label_file, others = _labels_for(root, labels, "image folder")
    scan = _label_flat(root, "flat", [n for n in names if _utf8(n)], FileSource(root),
                       label_file, "folder")
    return replace(scan, problems={_shown(n): _not_utf8(n) for n in names if not _utf8(n)},
                   label_others=others, label_found=labels is None)


def _scan_flat_unlabelled(root: Path) -> Scan | None:
    """A flat folder's images as one class :data:`~uqvision.layouts.UNLABELLED` (sorted by
    name), when no label file is found for it; ``None`` when one is (it labels them)."""
    if find_label_files(root):
        return None
    names = _flat_names(root)
    return Scan(root, "flat", [UNLABELLED], [(n, 0) for n in names if _utf8(n)],
                FileSource(root), problems={_shown(n): _not_utf8(n) for n in names
                                            if not _utf8(n)})


def _holds_images(root: Path) -> bool:
    with os.scandir(root) as entries:  # stops at the first image
        return any(_image_entry(e) for e in entries)


LAYOUTS.add("flat", Layout(
    "flat", "a folder of images (no class sub-folder) with a label file: the devkit's ground "
            "truth or LOC_val_solution.csv; without one, unlabelled images (an OOD set)",
    lambda p: p.is_dir() and not list_classes(p) and _holds_images(p), _scan_flat,
    _scan_flat_unlabelled))

