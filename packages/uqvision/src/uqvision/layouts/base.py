"""What a scan of a layout finds (:class:`Scan`, :class:`Subset`), the registry of layouts
(:data:`LAYOUTS`: each claims the paths it reads) and :func:`scan_layout`, which reads a path in
the first layout that claims it; and what the layouts share: ordering the samples, labelling
flat images by a label file (:func:`_label_flat`), reading a scan as a subset, refusing a mixed
layout or a label file that does not apply.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from uqmetrics import InputError
from uqmetrics.metrics.registry import Registry

from .labels import LabelFile
from .names import _shown

__all__ = [
    "LAYOUTS",
    "UNLABELLED",
    "Layout",
    "Scan",
    "Subset",
    "scan_layout",
]

#: The one class of images read without labels (an OOD set's flat folder, an OOD image list):
#: an evaluation set of class map ``none`` labels it -1.
UNLABELLED = "-1"
#: The extension a sample listed in a label file but absent is named with (ImageNet's).
_LISTED_SUFFIX = ".JPEG"


@dataclass(frozen=True)
class Scan:
    """What a layout found: classes, samples in order, how to read them, how they are labelled.

    Attributes
    ----------
    root : Path
        The folder or archive given.
    layout : str
        The layout, with the arrangement inside an archive: ``class_folders``, ``flat``,
        ``tar/class_folders``, ``tar/class_tars``, ``tar/flat``; for a folder inside an
        archive, followed by ``:`` and the folder (``tar/class_folders:defocus_blur/3``).
    classes : list of str, shape (n_classes,)
        Sorted class names (folder names, per-class tar names or WordNet ids of a label file).
    samples : list of (str, int), shape (n_samples,)
        Sample id and class index, sorted by class and then by id.
    source : FileSource or TarSource
    label_file : LabelFile, optional
        The label file of a flat layout.
    label_problems : mapping str -> str
        Images listed in the label file but absent (samples, whose ids are the listed names)
        and images without a label (not samples) -> why.
    problems : mapping str -> str
        Image files found that cannot be samples (a name that is not valid UTF-8, keyed by the
        name with its undecodable bytes as ``\\xNN``) -> why: unreadable images.
    subset : Subset, optional
        Set when the scan was asked for a subset (``subset=True``) and some images of the label
        file are absent: they are left out (not samples, not problems).
    label_others : tuple of Path
        Label files found by the search but not read (the first found wins; empty when the
        label file was given).
    label_found : bool
        Whether the label file was found by the search (not given).
    """

    root: Path
    layout: str
    classes: list[str]
    samples: list[tuple[str, int]]
    source: Any
    label_file: LabelFile | None = None
    label_problems: Mapping[str, str] = field(default_factory=dict)
    problems: Mapping[str, str] = field(default_factory=dict)
    subset: Subset | None = None
    label_others: tuple[Path, ...] = ()
    label_found: bool = False


@dataclass(frozen=True)
class Subset:
    """A layout with a label file read as a subset of it (``subset=True``, ``--subset``): the
    label file's images that are absent are left out, and recorded by counts and a hash (not
    listed: a 40-image subset of ImageNet's validation set would list 49,960 names).

    Attributes
    ----------
    n_labelled : int
        Images the label file labels.
    n_present : int
        Those present (the samples).
    sha256 : str
        SHA-256 of the sorted sample ids, one per line (UTF-8, ``\\n`` after each).
    """

    n_labelled: int
    n_present: int
    sha256: str

    def attrs(self) -> dict[str, Any]:
        """The cache attrs that record the subset: ``subset_n_labelled``, ``subset_n_present``,
        ``subset_sha256``."""
        return {"subset_n_labelled": self.n_labelled, "subset_n_present": self.n_present,
                "subset_sha256": self.sha256}


@dataclass(frozen=True)
class Layout:
    """A data layout: ``claims(path)`` whether ``path`` is in it (:data:`LAYOUTS` asks each in
    order), ``scan(path, labels)`` -> :class:`Scan`; ``unlabelled(path)``, for a layout whose
    labels come from a label file: the :class:`Scan` of ``path``'s images as one class
    :data:`UNLABELLED` when no label file is found for it (``None`` when one is: ``scan``
    reads it), what :func:`scan_layout` reads with ``unlabelled=True``."""

    name: str
    description: str
    claims: Callable[[Path], bool]
    scan: Callable[[Path, Path | None], Scan]
    unlabelled: Callable[[Path], Scan | None] | None = None


#: Data layouts: name -> :class:`Layout`; a path is read in the first that claims it.
LAYOUTS: Registry[Layout] = Registry("data layout")


def _ordered(root: Path, layout: str, labelled: Sequence[tuple[str, str]], source,
             label_file: LabelFile | None = None,
             problems: Mapping[str, str] | None = None) -> Scan:
    """A :class:`Scan` from ``(sample id, class name)`` pairs: classes sorted, samples sorted by
    class and then by id."""
    classes = sorted({c for _, c in labelled})
    index = {c: i for i, c in enumerate(classes)}
    samples = sorted(((rel, index[c]) for rel, c in labelled), key=lambda s: (s[1], s[0]))
    return Scan(root, layout, classes, samples, source, label_file, dict(problems or {}))



def _label_flat(root: Path, layout: str, names: Sequence[str], source,
                label_file: LabelFile, where: str) -> Scan:
    """Label flat images by their file name without extension; record the listed images that
    are absent (as samples named ``<stem>.JPEG``) and the images without a label."""
    labels = label_file.labels
    stems = {os.path.splitext(n)[0] for n in names}
    labelled = [(n, labels[os.path.splitext(n)[0]]) for n in names
                if os.path.splitext(n)[0] in labels]
    missing = [(stem + _LISTED_SUFFIX, w) for stem, w in labels.items() if stem not in stems]
    problems = {rel: f"listed in {label_file.name!r} but not in the {where}" for rel, _ in missing}
    problems.update({n: f"no label in {label_file.name!r}" for n in names
                     if os.path.splitext(n)[0] not in labels})
    if not labelled:
        example = f" (e.g. {names[0]!r} is not; it lists {next(iter(labels))!r}, ...)" \
            if names else ""
        raise InputError(f"{where} {str(root)!r}: none of its {len(names)} images is listed in "
                         f"label file {label_file.name!r}{example}")
    return _ordered(root, layout, labelled + missing, source, label_file, problems)


def _as_subset(scan: Scan) -> Scan:
    """``scan`` without the label file's images that are absent (:class:`Subset`)."""
    if scan.label_file is None:
        raise InputError(f"subset: {str(scan.root)!r} is in the {scan.layout} layout (no label "
                         "file), so --subset (library: subset=True) does not apply: a subset "
                         "leaves out the images a label file lists but the folder lacks")
    ids = {rel for rel, _ in scan.samples}
    absent = {rel for rel in scan.label_problems if rel in ids}
    if not absent:
        return scan
    kept = [(rel, scan.classes[y]) for rel, y in scan.samples if rel not in absent]
    present = sorted(rel for rel, _ in kept)
    digest = hashlib.sha256("".join(f"{rel}\n" for rel in present).encode()).hexdigest()
    problems = {rel: why for rel, why in scan.label_problems.items() if rel not in absent}
    out = _ordered(scan.root, scan.layout, kept, scan.source, scan.label_file, problems)
    return replace(out, problems=scan.problems, label_others=scan.label_others,
                   label_found=scan.label_found,
                   subset=Subset(len(scan.label_file.labels), len(kept), digest))


def _mixed(root: Path, what: str, flat: Sequence[str], classes: Sequence[str],
           n_in_classes: int) -> InputError:
    """The error of a folder or archive that holds images both directly and in class
    folders."""
    shown = ", ".join(repr(_shown(c)) for c in classes[:5]) + (", ..." if len(classes) > 5
                                                               else "")
    return InputError(
        f"{what} {str(root)!r} mixes two layouts: {len(flat)} image(s) directly in it (flat, "
        f"e.g. {_shown(flat[0])!r}) and {len(classes)} class folder(s) holding {n_in_classes} "
        f"image(s) ([{shown}]); it is read in one layout only, class folders "
        "(<class>/<image>) or flat images with a label file: move the images into their class "
        "folders, or out of the class folders beside the others")


def _hidden_class(root: Path, what: str, name: str, images: Sequence[str],
                  classes: Sequence[str]) -> InputError:
    """The error of a hidden folder (:func:`~uqvision.layouts.names._hidden`) beside the class
    folders that holds ``images``: uqvision reads no hidden name, but torchvision's ImageFolder
    and timm's folder reader take it for a class, and it would shift the class indices after
    it (under folder order, the only mapping of a model that records no class names)."""
    index = sorted([*classes, name]).index(name)  # torchvision's order: the names sorted
    after = len(classes) - index
    shift = (f"the indices of the {after} class(es) after it ({_shown(classes[index])!r}, ...) "
             "would be off by one against a model trained with it" if after else
             "a model trained with it would have one class more")
    return InputError(
        f"{what} {str(root)!r}: hidden folder {_shown(name)!r} holds {len(images)} image(s) "
        f"(e.g. {_shown(images[0])!r}) beside the class folders; uqvision reads no name that "
        "starts with '.', but torchvision's ImageFolder (and timm's folder reader) takes it "
        f"for a class, class {index} here, so {shift}; move it out of {str(root)!r} (or "
        "rename it without the dot if it is a class)")


def _refuse_labels(data: Path, labels: Path | None, layout: str) -> None:
    if labels is not None:
        raise InputError(f"labels: {str(data)!r} is in the {layout} layout (its classes are its "
                         f"folders), so label file {str(labels)!r} does not apply; a label file "
                         "labels a flat folder or archive of images")


def scan_layout(root: str | os.PathLike, labels: str | os.PathLike | None = None, *,
                subset: bool = False, unlabelled: bool = False) -> Scan:
    """Scan ``root`` in the first layout of :data:`LAYOUTS` that claims it.

    Parameters
    ----------
    root : path
        A folder, a ``.tar`` archive or a folder inside one (``ARCHIVE.tar/<inner>/<dir>``).
    labels : path, optional
        The label file of a flat folder or archive (default: looked for, see
        :mod:`uqvision.layouts`); refused for class folders.
    subset : bool, default False
        Read a layout with a label file as a subset of it: the images the label file lists but
        ``root`` lacks are left out (:class:`Subset`) instead of being samples that the image
        check refuses. Refused for a layout without a label file.
    unlabelled : bool, default False
        The images need no labels (an OOD set's, every one labelled -1): a flat folder with no
        label file (none given, none found) is read as its images, one class
        :data:`UNLABELLED`; without it, such a folder is refused (a labelled set needs class
        folders or a label file).

    Raises
    ------
    FileNotFoundError
        ``root`` does not exist (nor, for a path through an archive, its folder in the
        archive), holds no class folder and no image, a class folder holds no image, or a flat
        folder has no label file and ``unlabelled`` is False (the message names the files
        looked for).
    uqmetrics.InputError
        A label file that does not apply or is malformed, a compressed, truncated or
        unreadable archive, a folder or archive with images both directly in it and in class
        folders, a class folder whose name is not UTF-8, ``subset`` without a label file.
    """
    root = Path(root)
    labels = None if labels is None else Path(labels)
    if labels is not None and not labels.exists():
        raise FileNotFoundError(f"label file {str(labels)!r} does not exist")
    for layout in LAYOUTS.values():
        if layout.claims(root):
            scan = (layout.unlabelled(root) if unlabelled and labels is None
                    and layout.unlabelled is not None else None) or layout.scan(root, labels)
            return _as_subset(scan) if subset else scan
    if not root.exists():
        raise FileNotFoundError(f"image folder {str(root)!r} does not exist")
    if root.is_file():
        raise FileNotFoundError(f"{str(root)!r} is a file, neither an image folder nor a .tar "
                                "archive")
    raise FileNotFoundError(f"image folder {str(root)!r} has no class sub-folder and no image")
