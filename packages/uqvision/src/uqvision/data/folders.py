"""Image folders: :class:`ImageFolderDataset` (the ImageNet folder convention of timm and
torchvision, or ImageNet's other layouts scanned by :mod:`uqvision.layouts`), how a folder is
labelled (:func:`describe_labels`), its classes matched to a model's or to the training split's
(:func:`match_classes`, :func:`check_split_classes`), its fingerprints by content
(:func:`dataset_fingerprint`, :func:`folder_fingerprint`, over :func:`sample_digests`) and the
refusal of an output folder inside it (:func:`check_output_outside`).
"""

from __future__ import annotations

import collections
import copy
import hashlib
import json
import os
import unicodedata
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from uqmetrics import InputError

from ..layouts import list_classes, read_label_file, scan_layout, wnid_description
from ._util import derive_seed
from .decode import _load_sample, load_image
from .transforms import SeededAugmentation

__all__ = [
    "EARLIER_FINGERPRINTS",
    "FINGERPRINT_PREFIX",
    "ChangedImageError",
    "ImageFolderDataset",
    "check_output_outside",
    "check_split_classes",
    "dataset_fingerprint",
    "describe_labels",
    "earlier_fingerprint",
    "folder_fingerprint",
    "match_classes",
    "sample_digests",
]


class ChangedImageError(InputError):
    """An image whose bytes are not those a sweep fingerprinted when it planned (its SHA-256
    differs from the plan's, :meth:`ImageFolderDataset.expecting`), or a folder whose scan
    differs from the plan's: the cell fails, nothing of it is written."""


def _named_by(exc: InputError | OSError, option: str, root: str | os.PathLike
              ) -> InputError | OSError:
    """``exc`` (a folder's scan error) with its message after ``option`` (and ``root`` where
    the message does not name it): the same exception, its type and attributes kept, when its
    message is its one argument; else an :class:`~uqmetrics.InputError` saying it."""
    text = " ".join(str(exc).split())
    shown = str(root)
    said = f"{option}: {text}" if repr(shown) in text or not shown else \
        f"{option} {shown!r}: {text}"
    plain = len(exc.args) == 1 and isinstance(exc.args[0], str) and not (
        isinstance(exc, OSError) and (exc.errno is not None or exc.filename is not None))
    if plain:
        exc.args = (said,)
        return exc
    return InputError(said)


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
    unlabelled : bool, default False
        The images need no labels (an OOD set's): a flat folder with no label file is read as
        its images, one class ``-1`` (:data:`uqvision.layouts.UNLABELLED`), which an
        evaluation set of class map ``none`` labels -1; without it, such a folder is refused.
    option : str, optional
        How the caller's user gave ``root`` (``"--data"``, ``"--val-data"``): the scan's
        errors then begin with it (``--data: image folder 'x' does not exist``), their types
        kept.

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
        or a flat folder has no label file (the message names the files looked for) and
        ``unlabelled`` is False.
    uqmetrics.InputError
        A label file given for class folders, a malformed label file, a compressed or
        truncated archive, images both directly in ``root`` and in class folders.
    """

    def __init__(self, root: str | os.PathLike, transform: Callable | None = None, *,
                 augment_seed: int | None = None, labels: str | os.PathLike | None = None,
                 subset: bool = False, unlabelled: bool = False, option: str | None = None):
        try:
            scan = scan_layout(root, labels, subset=subset, unlabelled=unlabelled)
        except (InputError, OSError) as exc:
            if option is None:
                raise
            raise _named_by(exc, option, root) from None
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
    #: The SHA-256 each sample's bytes must have when read (:meth:`expecting`), ``None``: any.
    expected_digests: Mapping[str, str | None] | None = None

    def expecting(self, digests: Mapping[str, str | None]) -> ImageFolderDataset:
        """A copy (the folder is not scanned again) that checks every image's bytes as it
        reads them (``__getitem__``, a shared decode) against ``digests`` (sample id -> hex
        SHA-256, :func:`sample_digests` of the sweep's plan) and raises
        :class:`ChangedImageError` naming the image on a mismatch: a sweep cell hashes what
        it decodes instead of reading the folder twice (docs/conventions.md#fingerprint-rules).
        """
        ds = copy.copy(self)
        ds.expected_digests = digests
        return ds

    def read_checked(self, rel: str) -> bytes | None:
        """The bytes of sample ``rel`` checked against :attr:`expected_digests` (``None`` when
        there are none, or the sample was and is unreadable: the loader reads the file itself
        and says why).

        Raises
        ------
        ChangedImageError
            The bytes' SHA-256 is not the expected one, or the file cannot be read any more.
        """
        if self.expected_digests is None:
            return None
        want = self.expected_digests.get(rel)
        try:
            data = self.source.read(rel)
        except OSError:
            data = None
        HASH_READS[self.source.where(rel)] += 1
        got = None if data is None else hashlib.sha256(data).hexdigest()
        if got != want:
            raise ChangedImageError(
                f"image {self.source.where(rel)!r} changed since the sweep planned (SHA-256 "
                f"{(got or 'none: unreadable')[:12]}, planned {(want or 'none: unreadable')[:12]}"
                "); nothing of this cell was written: run the sweep again")
        return data  # None: unreadable then and now, the loader says why

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
        content = self.read_checked(rel)
        img = (load_image(self.root / rel, content=content) if self._folder_label is None
               else _load_sample(self.source, rel, content=content))
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


def _nfc(name: str) -> str:
    """A class name as it is compared (:func:`match_classes`, :func:`check_split_classes`): in
    Unicode's NFC form, so that a folder named on macOS or unpacked from a zip (decomposed,
    NFD: ``e`` + combining acute) is the class a sidecar names composed (``é``)."""
    return unicodedata.normalize("NFC", name)


def match_classes(folder_classes: Sequence[str], model_classes: Sequence[str], *,
                  folder: str, model: str) -> np.ndarray:
    """The index of each folder class among a model's classes, matched by name.

    A folder may hold a subset of the model's classes (ImageNet-A/R/O hold 200 of the 1,000
    ImageNet classes, by WordNet id): its labels become indices of the model's classes. Names
    are compared in Unicode's NFC form (:func:`_nfc`): a folder name and a recorded name that
    differ only in their normalisation are one class. In the error, a folder class that is a
    WordNet id is followed by its lemmas (timm's ``ImageNetInfo``).

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
        The position among ``model_classes`` of each folder class's name.

    Raises
    ------
    uqmetrics.InputError
        A folder class the model does not have (the message lists the unknown names and the
        model's), a model whose class names repeat, or two folder classes that are one name in
        two normalisations (both would take that class's label).

    Examples
    --------
    >>> match_classes(["cat", "dog"], ["ant", "cat", "dog"], folder="f", model="m").tolist()
    [1, 2]
    >>> match_classes(["cafe\\u0301"], ["caf\\xe9"], folder="f", model="m").tolist()
    [0]
    """
    model_classes = [str(c) for c in model_classes]
    position = {_nfc(c): i for i, c in enumerate(model_classes)}
    if len(position) != len(model_classes):
        count = collections.Counter(map(_nfc, model_classes))
        twice = sorted({c for c in model_classes if count[_nfc(c)] > 1})
        raise InputError(f"model {model!r} records a class name more than once (names compared "
                         f"in Unicode NFC form): {_some(twice)}")
    by_name: dict[str, list[str]] = {}
    for c in folder_classes:
        by_name.setdefault(_nfc(c), []).append(c)
    same = next((names for names in by_name.values() if len(names) > 1), None)
    if same:
        raise InputError(
            f"image folder {folder!r} has class folders that are one name in two Unicode "
            f"normalisations: {', '.join(map(ascii, same))}; classes are matched by name to "
            f"those of model {model!r}, where both would be one class: merge or rename them")
    unknown = [c for c in folder_classes if _nfc(c) not in position]
    if unknown:
        raise InputError(
            f"image folder {folder!r} has {len(unknown)} class(es) that model {model!r} does "
            f"not have: {_some(unknown, describe=True)}; the model's classes are "
            f"{_some(model_classes)} "
            "(classes are matched by folder name)")
    return np.array([position[_nfc(c)] for c in folder_classes], dtype=np.int64)


def check_split_classes(train: str | os.PathLike, others: Mapping[str, str | os.PathLike], *,
                        same: Collection[str] = ()) -> list[str]:
    """Check, by name and before anything runs, that the other splits of a data root have
    only classes of its training split (names compared in Unicode NFC form, as
    :func:`match_classes` compares them).

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
        lacks some training classes (named), or whose names, normalised otherwise, sort in
        another order.
    FileNotFoundError
        A folder that does not exist.
    """
    classes = list_classes(train)
    known = {_nfc(c) for c in classes}
    for name, folder in others.items():
        have = list_classes(folder)
        extra = [c for c in have if _nfc(c) not in known]
        if extra:
            raise InputError(
                f"{name} folder {str(folder)!r} has {len(extra)} class(es) that the train "
                f"folder {str(train)!r} lacks: {_some(extra)}; the train classes are "
                f"{_some(classes)} (classes are matched by folder name)")
        there = {_nfc(c) for c in have}
        missing = [c for c in classes if _nfc(c) not in there]
        if name in same and missing:
            raise InputError(
                f"{name} folder {str(folder)!r} lacks {len(missing)} class(es) of the train "
                f"folder {str(train)!r}: {_some(missing)}; it must hold the same classes")
        if name in same and [_nfc(c) for c in have] != [_nfc(c) for c in classes]:
            # read in its own folder order: names normalised otherwise may sort otherwise
            first = next(c for c, t in zip(have, classes, strict=True) if _nfc(c) != _nfc(t))
            raise InputError(
                f"{name} folder {str(folder)!r} holds the classes of the train folder "
                f"{str(train)!r} in another Unicode normalisation, which sorts them in another "
                f"order (e.g. {first!a} is class {have.index(first)} there); give both "
                "folders' names one normalisation (NFC)")
    return classes


#: The prefix of a dataset fingerprint (:func:`folder_fingerprint`): its scheme. ``content2``
#: hashes every sample's bytes; the values of an earlier scheme (:data:`EARLIER_FINGERPRINTS`)
#: never equal one of this scheme, so a cache that records one is refused on resume.
FINGERPRINT_PREFIX = "content2:"
#: The schemes of earlier dataset fingerprints (prefix -> what they covered): ``size:`` (the
#: default before uqvision fingerprinted content: the names, labels and byte sizes only, so an
#: image whose pixels changed but not its size kept its fingerprint) and ``content:`` (an
#: opt-in hash of content in another arrangement).
EARLIER_FINGERPRINTS = {
    "size:": "names, labels and file sizes only, not the images' content",
    "content:": "an earlier arrangement of the content hash",
}
#: The SHA-256 of every sample's bytes, per image source read in this process (source ->
#: sample id -> hex digest, ``None`` when it cannot be read): a scan is a snapshot, so its
#: fingerprint, the caches' checks and the ID/OOD overlap check read each file once.
_DIGESTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: How many times this process read each sample's bytes to hash them (``source.where(rel)``
#: -> count: the fingerprint's reads, :func:`sample_digests`, and the checks of
#: :meth:`ImageFolderDataset.read_checked`); what tells a sweep's reads per image.
HASH_READS: collections.Counter = collections.Counter()


def _digest(source, rel: str) -> str | None:
    """The SHA-256 (hex) of sample ``rel``'s bytes; ``None`` when it cannot be read (a dangling
    link, an absent or broken archive member, a file it may not read: the image check reports
    those)."""
    HASH_READS[source.where(rel)] += 1
    try:
        return hashlib.sha256(source.read(rel)).hexdigest()
    except OSError:
        return None


def sample_digests(ds: ImageFolderDataset, *, threads: int | None = None
                   ) -> dict[str, str | None]:
    """The SHA-256 of every sample's bytes, read through the folder's source (a file, an
    archive member read in place, a file an image list names), on ``threads`` threads
    (``hashlib`` and the reads release the GIL; default ``min(8, os.cpu_count())``).

    Every byte is read at the first call for a scan; the copies of a scan
    (:meth:`ImageFolderDataset.without`, :meth:`~ImageFolderDataset.relabelled`) share its
    digests for the process. Nothing is kept on disk: a file rewritten in place with its size
    and modification time restored is read again, never taken for the old one.

    Parameters
    ----------
    ds : ImageFolderDataset
    threads : int, optional

    Returns
    -------
    dict str -> str or None, shape (n_samples,)
        Sample id -> hex digest (``None``: the sample cannot be read), in sample order.
    """
    have = _DIGESTS.setdefault(ds.source, {})
    todo = [rel for rel in ds.sample_ids if rel not in have]
    workers = max(1, min(threads or 8, os.cpu_count() or 1, len(todo)))
    if workers == 1:
        have.update((rel, _digest(ds.source, rel)) for rel in todo)
    else:
        with ThreadPoolExecutor(workers) as pool:
            have.update(zip(todo, pool.map(lambda r: _digest(ds.source, r), todo),
                            strict=True))
    return {rel: have[rel] for rel in ds.sample_ids}


def earlier_fingerprint(value: object) -> str | None:
    """What an earlier scheme's fingerprint covered (:data:`EARLIER_FINGERPRINTS`), ``None``
    for a fingerprint of this scheme or a value that is none.

    Examples
    --------
    >>> earlier_fingerprint("size:0123")
    "names, labels and file sizes only, not the images' content"
    >>> earlier_fingerprint(FINGERPRINT_PREFIX + "0123") is None
    True
    """
    text = str(value)
    return next((what for prefix, what in EARLIER_FINGERPRINTS.items()
                 if text.startswith(prefix)), None)


def dataset_fingerprint(root: str | os.PathLike, *, labels: str | os.PathLike | None = None,
                        subset: bool = False, threads: int | None = None) -> str:
    """:func:`folder_fingerprint` of the folder or archive ``root`` (scanned here).

    Parameters
    ----------
    root : path
        An image folder or archive (see :class:`ImageFolderDataset`).
    labels : path, optional
        The label file of a flat layout (as for :class:`ImageFolderDataset`).
    subset : bool, default False
        Read the folder as a subset of its label file (as for :class:`ImageFolderDataset`).
    threads : int, optional
        Threads reading and hashing (:func:`sample_digests`).
    """
    return folder_fingerprint(ImageFolderDataset(root, labels=labels, subset=subset),
                              threads=threads)


def folder_fingerprint(ds: ImageFolderDataset, *, threads: int | None = None,
                       digests: Mapping[str, str | None] | None = None) -> str:
    """The identity of a scanned folder's data: ``content2:`` and the SHA-256 over its class
    list, its layout (``class_folders``, ``flat``, ``tar/class_tars``, ``image_list``, ...),
    its label file's kind and content hash, its subset (:attr:`ImageFolderDataset.subset`:
    counts and hash), and every sample's id, folder label, size and the SHA-256 of its bytes
    (:func:`sample_digests`: every byte is read, once per scan and process).

    Any change of an image's content changes it, whatever its size and modification time; so
    does another layout, labelling or subset of the same images. A sample listed in the label
    file but absent, or a dangling symbolic link, enters with size -1 and no digest. A
    fingerprint of an earlier scheme (:data:`EARLIER_FINGERPRINTS`: ``size:`` covered names,
    labels and sizes only) never equals one of this scheme.

    Parameters
    ----------
    ds : ImageFolderDataset
        Its folder labels count (whatever a :meth:`ImageFolderDataset.relabelled` copy
        carries).
    threads : int, optional
        Threads reading and hashing (:func:`sample_digests`).
    digests : mapping str -> str or None, optional
        The samples' digests as a sweep's plan read them (nothing is read here: a sweep
        cell, whose reads are checked against them, :meth:`ImageFolderDataset.expecting`).

    Returns
    -------
    str
        ``content2:`` and 64 hex digits.

    Raises
    ------
    ChangedImageError
        A sample of ``ds`` that ``digests`` lacks (the folder gained it since).
    """
    if digests is None:
        digests = sample_digests(ds, threads=threads)
    else:
        new = [rel for rel in ds.sample_ids if rel not in digests]
        if new:
            raise ChangedImageError(
                f"image folder {str(ds.root)!r} changed since the sweep planned: "
                f"{len(new)} image(s) appeared (e.g. {ds.source.where(new[0])!r}); nothing "
                "was written: run the sweep again")
    label_file = ds.label_file
    head = {"layout": ds.layout, "label_file": None if label_file is None
            else {"kind": label_file.kind, "sha256": label_file.sha256}}
    if getattr(ds, "subset", None) is not None:
        head["subset"] = ds.subset.attrs()
    h = hashlib.sha256(json.dumps(ds.classes).encode())
    h.update(json.dumps(head, sort_keys=True).encode())
    by_folder = {c: i for i, c in enumerate(ds.classes)}
    for rel, _ in ds.samples:
        label = (by_folder[rel.split("/", 1)[0]] if ds._folder_label is None
                 else ds._folder_label[rel])
        h.update(f"{rel}\0{label}\0{ds.source.size(rel)}\0{digests[rel] or '-'}\n".encode())
    return FINGERPRINT_PREFIX + h.hexdigest()
