"""Image folders: :class:`ImageFolderDataset` (the ImageNet folder convention of timm and
torchvision, or ImageNet's other layouts scanned by :mod:`uqvision.layouts`), how a folder is
labelled (:func:`describe_labels`), its classes matched to a model's or to the training split's
(:func:`match_classes`, :func:`check_split_classes`), its fingerprints
(:func:`dataset_fingerprint`, :func:`folder_fingerprint`) and the refusal of an output folder
inside it (:func:`check_output_outside`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from uqmetrics import InputError

from ..layouts import list_classes, read_label_file, scan_layout, wnid_description
from ._util import derive_seed
from .images import _load_sample, load_image
from .transforms import SeededAugmentation

__all__ = [
    "ImageFolderDataset",
    "check_output_outside",
    "check_split_classes",
    "dataset_fingerprint",
    "describe_labels",
    "folder_fingerprint",
    "match_classes",
]


def check_output_outside(data: str | os.PathLike, out: str | os.PathLike | None,
                         option: str = "--out") -> None:
    """Refuse an output folder that is ``data`` or inside it, before anything is scanned or
    written: a folder in ``data`` is taken for a class folder at the next scan (and one in a
    flat folder makes it a mixed layout), so the next run over ``data`` would fail.

    Parameters
    ----------
    data : path
        The image folder (an archive holds no folder: nothing to check).
    out : path or None
        The output folder (``None``: nothing to check).
    option : str, default "--out"
        How the message names ``out``.

    Raises
    ------
    uqmetrics.InputError
        ``out`` is ``data`` or inside it (symbolic links resolved).
    """
    if out is None:
        return
    root, target = Path(data).resolve(), Path(out).resolve()
    if root.is_dir() and (target == root or root in target.parents):
        raise InputError(f"{option} {str(out)!r} is inside --data {str(data)!r}: a folder there "
                         "would be read as a class folder of the data by the next run; write "
                         "the output outside the data folder")


def describe_labels(folder: ImageFolderDataset) -> str | None:
    """One line saying how ``folder`` is labelled, ``None`` for class folders: the label file
    read (path, kind, the start of its content hash, whether given or found), the label files
    found but passed over (the first found wins: the folder holding the data before the one
    above, and in a folder the devkit before ``LOC_val_solution.csv``) with whether they agree
    on the images present, and the subset (:attr:`ImageFolderDataset.subset`).

    Parameters
    ----------
    folder : ImageFolderDataset

    Returns
    -------
    str or None
        The line (no newline), ``None`` when ``folder`` has no label file.

    Examples
    --------
    ``labels of '/in/val': devkit '/in/ILSVRC2012_devkit_t12' (sha256 3f2a9c41d0be..., found
    by the search); also found '/in/LOC_val_solution.csv', not read: the devkit comes first
    (pass --labels FILE to choose), and it labels 2 of the 40 images present otherwise
    (e.g. 'ILSVRC2012_val_00000003.JPEG': n01440764 here, n01443537 there)``
    """
    lf = folder.label_file
    if lf is None:
        return None
    how = "found by the search" if folder.label_found else "given by --labels"
    parts = [(f"labels of {str(folder.root)!r}: {lf.kind} {lf.name!r} (sha256 "
              f"{lf.sha256[:12]}..., {how})")]
    for other in folder.label_others:
        text = f"also found {str(other)!r}, not read: the {lf.kind} comes first (pass " \
               "--labels FILE to choose)"
        try:
            theirs = read_label_file(other).labels
        except (ValueError, OSError) as err:
            parts.append(f"{text}; it cannot be read ({' '.join(str(err).split())})")
            continue
        differ = []
        for rel in folder.sample_ids:
            stem = os.path.splitext(rel)[0]
            if lf.labels.get(stem) != theirs.get(stem):
                differ.append((rel, lf.labels.get(stem), theirs.get(stem)))
        if differ:
            rel, ours, them = differ[0]
            text += (f", and it labels {len(differ)} of the {len(folder)} images present "
                     f"otherwise (e.g. {rel!r}: {ours} here, {them or 'no label'} there)")
        else:
            text += f", and it agrees on the {len(folder)} images present"
        parts.append(text)
    if folder.subset is not None:
        parts.append(f"subset: {folder.subset.n_present} of the {folder.subset.n_labelled} "
                     "images of the label file are present, the others left out (--subset)")
    return "; ".join(parts)


class ImageFolderDataset(Dataset):
    """An ImageNet-style folder: ``root/<class>/<...>/<image>``, or ImageNet in another layout
    it ships in (:data:`uqvision.layouts.LAYOUTS`: a flat folder with a label file, a tar).

    Parameters
    ----------
    root : path
        Folder with one sub-folder per class (class index = sorted folder order); or a flat
        folder of images with a label file; or an uncompressed ``.tar`` of either, or of one
        ``<class>.tar`` per class (read in place). See :mod:`uqvision.layouts`.
    transform : callable, optional
        PIL image -> tensor of shape (3, H, W).
    augment_seed : int, optional
        When given, ``transform`` must be a :class:`SeededAugmentation`; sample ``index`` draws
        its augmentation from its own ``torch.Generator`` seeded with
        ``derive_seed(augment_seed, index)``: a random augmentation is a pure function of
        (seed, sample), reproducible under any batching, worker count, sharding or thread, and
        the global torch RNG is never touched.
    labels : path, optional
        The label file of a flat folder or archive (the devkit — its folder, ground-truth
        file or ``.tar.gz`` — or ``LOC_val_solution.csv``); default: looked for next to
        ``root`` (:func:`uqvision.layouts.find_label_file`). Refused for class folders.
    subset : bool, default False
        Read a flat folder or archive as a subset of its label file (``--subset``): the
        images the label file lists but ``root`` lacks are left out, recorded as counts and a
        hash (:attr:`subset`); without it they are refused (:func:`readable_images`).
        Refused for class folders.

    Attributes
    ----------
    classes : list of str, shape (n_classes,)
    samples : list of (str, int), shape (n_samples,)
        Relative posix path (the sample id; in an archive, the member's path, ``<class>/
        <member>`` inside a per-class ``.tar``) and class index, sorted by class then id.
    layout : str
        ``class_folders``, ``flat``, ``tar/class_folders``, ``tar/class_tars`` or ``tar/flat``.
    source : uqvision.layouts.FileSource or uqvision.layouts.TarSource
        Opens a sample.
    label_file : uqvision.layouts.LabelFile or None
        The label file of a flat layout (its content hash enters the fingerprint).
    label_problems : mapping str -> str
        A flat layout's images listed in its label file but absent (samples named as listed;
        always refused by :func:`readable_images`: pass ``subset``) and images without a label
        (not samples; refused, or left out as unreadable images are).
    scan_problems : mapping str -> str
        Image files the scan found but cannot take as samples (a name that is not valid
        UTF-8, keyed by the name with its undecodable bytes as ``\\xNN``): reported by
        :func:`check_images` as unreadable images.
    subset : uqvision.layouts.Subset or None
        Set when ``subset`` left absent images out: how many the label file labels, how many
        are present, the SHA-256 of the present ids (part of the fingerprint).
    label_others : tuple of Path
        Label files found beside ``root`` but not read (the first found wins).

    Raises
    ------
    FileNotFoundError
        ``root`` does not exist, has no class folder (nor images), a class folder has no image,
        or a flat folder has no label file (the message names the files looked for).
    uqmetrics.InputError
        A label file given for class folders, a malformed label file, a compressed or
        truncated archive, images both directly in ``root`` and in class folders.
    """

    def __init__(self, root: str | os.PathLike, transform: Callable | None = None, *,
                 augment_seed: int | None = None, labels: str | os.PathLike | None = None,
                 subset: bool = False):
        scan = scan_layout(root, labels, subset=subset)
        if augment_seed is not None and not isinstance(transform, SeededAugmentation):
            raise ValueError("augment_seed needs a SeededAugmentation transform (see "
                             f"tta_transform), got transform={transform!r}")
        self.root = Path(root)
        self.classes = scan.classes
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples = scan.samples
        self.layout = scan.layout
        self.source = scan.source
        self.label_file = scan.label_file
        self.label_problems = scan.label_problems
        self.scan_problems = scan.problems
        self.subset = scan.subset
        self.label_others = scan.label_others
        self.label_found = scan.label_found
        self._folder_label = (None if scan.layout == "class_folders"
                              else dict(scan.samples))  # the fingerprint's labels
        self.transform = transform
        self.augment_seed = augment_seed

    @property
    def targets(self) -> list[int]:
        """Class index of every sample, shape (n_samples,)."""
        return [y for _, y in self.samples]

    def labelling_attrs(self) -> dict[str, Any]:
        """What a cache records of how the folder was labelled (empty for class folders): the
        label file (``label_file``: its path, resolved; ``label_file_kind``;
        ``label_file_sha256``: its content hash, :attr:`uqvision.layouts.LabelFile.sha256`)
        and, for a subset (:attr:`subset`), ``subset_n_labelled``, ``subset_n_present`` and
        ``subset_sha256``.

        Returns
        -------
        dict
            Attr name -> str or int.
        """
        out: dict[str, Any] = {}
        if self.label_file is not None:
            out.update(label_file=str(Path(self.label_file.path).resolve()),
                       label_file_kind=self.label_file.kind,
                       label_file_sha256=self.label_file.sha256)
        if self.subset is not None:
            out.update(self.subset.attrs())
        return out

    @property
    def sample_ids(self) -> list[str]:
        """Relative path of every sample, shape (n_samples,)."""
        return [s for s, _ in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def with_augment_seed(self, seed: int | None) -> ImageFolderDataset:
        """A copy (sharing the sample list) whose augmentations are seeded by ``seed``."""
        return self.with_transform(self.transform, seed)

    def relabelled(self, class_index: Sequence[int]) -> ImageFolderDataset:
        """A copy (the folder is not scanned again) whose samples of folder class ``j`` carry
        the label ``class_index[j]``, e.g. that class's index among a model's classes
        (:func:`match_classes`); ``classes`` stays the folder's.

        Parameters
        ----------
        class_index : sequence of int, shape (n_classes,)
        """
        index = [int(i) for i in class_index]
        if len(index) != len(self.classes):
            raise ValueError(f"class_index has {len(index)} entries for the "
                             f"{len(self.classes)} classes of {str(self.root)!r}")
        ds = copy.copy(self)
        ds.samples = [(rel, index[y]) for rel, y in self.samples]
        return ds

    #: Samples left out of the folder (relative path -> why; :meth:`without`).
    skipped: Mapping[str, str] = MappingProxyType({})

    def without(self, rel_paths: Collection[str] | Mapping[str, str]) -> ImageFolderDataset:
        """A copy without the samples ``rel_paths`` (relative paths, e.g. the bad images
        :func:`check_images` found, a mapping to why), recorded in its ``skipped``; the
        classes and the other samples' labels are unchanged."""
        why = dict(rel_paths) if isinstance(rel_paths, Mapping) else dict.fromkeys(rel_paths, "")
        ds = copy.copy(self)
        ds.samples = [s for s in self.samples if s[0] not in why]
        ds.skipped = MappingProxyType({**self.skipped, **why})
        return ds

    def __getstate__(self) -> dict:  # picklable for spawned DataLoader workers
        state = dict(self.__dict__)
        if "skipped" in state:
            state["skipped"] = dict(state["skipped"])
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if "skipped" in state:
            self.skipped = MappingProxyType(state["skipped"])

    def with_transform(self, transform: Callable | None,
                       augment_seed: int | None = None) -> ImageFolderDataset:
        """A copy (sharing the sample list, the folder is not scanned again) with another
        ``transform`` and ``augment_seed``."""
        if augment_seed is not None and not isinstance(transform, SeededAugmentation):
            raise ValueError("augment_seed needs a SeededAugmentation transform (see "
                             f"tta_transform), got transform={transform!r}")
        ds = copy.copy(self)
        ds.transform, ds.augment_seed = transform, augment_seed
        return ds

    def __getitem__(self, index: int) -> tuple[Any, int, int]:
        """Return ``(image, label, index)``; ``image`` is transformed when a transform is set."""
        rel, label = self.samples[index]
        img = (load_image(self.root / rel) if self._folder_label is None
               else _load_sample(self.source, rel))
        if self.augment_seed is not None:
            gen = torch.Generator().manual_seed(derive_seed(self.augment_seed, index))
            img = self.transform(img, generator=gen)
        elif self.transform is not None:
            img = self.transform(img)
        return img, label, index


def _some(names: Sequence[str], limit: int = 12, *, describe: bool = False) -> str:
    """``names`` for a one-line message: at most ``limit`` of them, and how many in all; with
    ``describe``, a WordNet id is followed by its lemmas (``'n01440764' (tench, Tinca tinca)``)."""
    names = list(names)

    def show(name: str) -> str:
        text = wnid_description(name) if describe else None
        return f"{name!r} ({text})" if text else repr(name)

    shown = ", ".join(map(show, names[:limit]))
    return f"[{shown}, ... ({len(names)} in all)]" if len(names) > limit else f"[{shown}]"


def match_classes(folder_classes: Sequence[str], model_classes: Sequence[str], *,
                  folder: str, model: str) -> np.ndarray:
    """The index of each folder class among a model's classes, matched by name.

    A folder may hold a subset of the model's classes (ImageNet-A/R/O hold 200 of the 1,000
    ImageNet classes, by WordNet id): its labels become indices of the model's classes. In the
    error, a folder class that is a WordNet id is followed by its lemmas (timm's
    ``ImageNetInfo``).

    Parameters
    ----------
    folder_classes : sequence of str, shape (n_folder_classes,)
        The evaluation folder's class names (:func:`list_classes`).
    model_classes : sequence of str, shape (n_model_classes,)
        The model's class names, in the order of its outputs.
    folder, model : str
        How the error message names the folder and the model.

    Returns
    -------
    ndarray of int64, shape (n_folder_classes,)
        ``model_classes.index(c)`` of each folder class ``c``.

    Raises
    ------
    uqmetrics.InputError
        A folder class the model does not have (the message lists the unknown names and the
        model's), or a model whose class names repeat.

    Examples
    --------
    >>> match_classes(["cat", "dog"], ["ant", "cat", "dog"], folder="f", model="m").tolist()
    [1, 2]
    """
    model_classes = [str(c) for c in model_classes]
    position = {c: i for i, c in enumerate(model_classes)}
    if len(position) != len(model_classes):
        twice = sorted({c for c in model_classes if model_classes.count(c) > 1})
        raise InputError(f"model {model!r} records a class name more than once: {_some(twice)}")
    unknown = [c for c in folder_classes if c not in position]
    if unknown:
        raise InputError(
            f"image folder {folder!r} has {len(unknown)} class(es) that model {model!r} does "
            f"not have: {_some(unknown, describe=True)}; the model's classes are "
            f"{_some(model_classes)} "
            "(classes are matched by folder name)")
    return np.array([position[c] for c in folder_classes], dtype=np.int64)


def check_split_classes(train: str | os.PathLike, others: Mapping[str, str | os.PathLike], *,
                        same: Collection[str] = ()) -> list[str]:
    """Check, by name and before anything runs, that the other splits of a data root have
    only classes of its training split.

    Parameters
    ----------
    train : path
        The training image folder.
    others : mapping str -> path
        Split name -> image folder (e.g. ``{"val": root/"val", "test": root/"test"}``); a
        split may hold a subset of the training classes (its labels are mapped into the
        model's classes by name).
    same : collection of str
        Splits that must hold exactly the training classes (e.g. a validation folder read
        with its own folder order).

    Returns
    -------
    list of str, shape (n_classes,)
        The training classes (sorted).

    Raises
    ------
    uqmetrics.InputError
        A split with classes the training split lacks (named), or a split of ``same`` that
        lacks some training classes (named).
    FileNotFoundError
        A folder that does not exist.
    """
    classes = list_classes(train)
    known = set(classes)
    for name, folder in others.items():
        have = list_classes(folder)
        extra = [c for c in have if c not in known]
        if extra:
            raise InputError(
                f"{name} folder {str(folder)!r} has {len(extra)} class(es) that the train "
                f"folder {str(train)!r} lacks: {_some(extra)}; the train classes are "
                f"{_some(classes)} (classes are matched by folder name)")
        missing = [c for c in classes if c not in set(have)]
        if name in same and missing:
            raise InputError(
                f"{name} folder {str(folder)!r} lacks {len(missing)} class(es) of the train "
                f"folder {str(train)!r}: {_some(missing)}; it must hold the same classes")
    return classes


def dataset_fingerprint(root: str | os.PathLike, *, content: bool = False,
                        labels: str | os.PathLike | None = None, subset: bool = False) -> str:
    """SHA-256 over the class list, the sample ids and file sizes (or file contents); for a
    layout other than class folders also over the layout and the label file's content hash.

    Parameters
    ----------
    root : path
        An image folder or archive (see :class:`ImageFolderDataset`).
    content : bool, default False
        Hash file contents too (slow on ImageNet; sizes already catch truncated copies).
    labels : path, optional
        The label file of a flat layout (as for :class:`ImageFolderDataset`).
    subset : bool, default False
        Read the folder as a subset of its label file (as for :class:`ImageFolderDataset`).
    """
    return folder_fingerprint(ImageFolderDataset(root, labels=labels, subset=subset),
                              content=content)


def folder_fingerprint(ds: ImageFolderDataset, *, content: bool = False) -> str:
    """:func:`dataset_fingerprint` of an already scanned folder (its folder labels, whatever
    a :meth:`ImageFolderDataset.relabelled` copy carries).

    The class-folder layout's fingerprint is what it always was (caches stay valid). Another
    layout's starts from its name (``flat``, ``tar/class_tars``, ...) and its label file's
    content hash, so a cache of another layout or labelling is refused on resume; a sample
    listed in the label file but absent, or a dangling symbolic link, enters with size -1.
    A subset (:attr:`ImageFolderDataset.subset`) adds its counts and hash, so its caches are
    never taken for those of the whole label file.

    Parameters
    ----------
    ds : ImageFolderDataset
    content : bool, default False
    """
    h = hashlib.sha256(json.dumps(ds.classes).encode())
    if ds._folder_label is not None:
        label_file = ds.label_file
        head = {"layout": ds.layout, "label_file": None if label_file is None
                else {"kind": label_file.kind, "sha256": label_file.sha256}}
        if getattr(ds, "subset", None) is not None:  # only then: earlier caches stay valid
            head["subset"] = ds.subset.attrs()
        h.update(json.dumps(head, sort_keys=True).encode())
        for rel, _ in ds.samples:
            h.update(f"{rel}\0{ds._folder_label[rel]}\0{ds.source.size(rel)}\n".encode())
            if content and ds.source.size(rel) >= 0:
                h.update(hashlib.sha256(ds.source.read(rel)).digest())
        return ("content:" if content else "size:") + h.hexdigest()
    folder_label = {c: i for i, c in enumerate(ds.classes)}
    for rel, _ in ds.samples:
        p = ds.root / rel
        label = folder_label[rel.split("/", 1)[0]]
        size = ds.source.size(rel)
        h.update(f"{rel}\0{label}\0{size}\n".encode())
        if content and size >= 0:
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return ("content:" if content else "size:") + h.hexdigest()
