"""Image folders, per-model preprocessing, test-time augmentation and development datasets.

The reader follows the ImageNet folder convention that timm and torchvision use: one
sub-folder per class, class index = position of the folder name in sorted order (for ImageNet
the sorted WordNet synsets, which is the class order of every ImageNet-1k checkpoint), samples
sorted by class and then by relative path. Every sample has a stable id, its relative path, so
prediction caches of different models can be checked to be in the same order. The other
layouts ImageNet ships in (a flat folder with the devkit's or Kaggle's label file, a tar
archive of either) are scanned by :mod:`uqvision.layouts` into the same classes and samples.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import io
import json
import math
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
from PIL import Image
from timm.data import create_transform
from torch.utils.data import Dataset
from torchvision import transforms as T
from torchvision.datasets import FakeData
from torchvision.transforms import functional as TF
from uqmetrics import InputError
from uqmetrics.io import folder_replaced
from uqmetrics.registry import Registry

from .exceptions import BadImageError
from .hierarchy import make_hierarchy
from .layouts import (
    IMG_EXTENSIONS,
    LAYOUTS,
    list_classes,
    read_label_file,
    scan_layout,
    wnid_description,
)

__all__ = [
    "DATASET_MAKERS",
    "IMG_EXTENSIONS",
    "INDEX_FORMAT",
    "LAYOUTS",
    "TTA_POLICIES",
    "ClassSubset",
    "DataConfig",
    "ImageFolderDataset",
    "SeededAugmentation",
    "check_images",
    "check_output_outside",
    "check_split_classes",
    "dataset_fingerprint",
    "derive_seed",
    "describe_labels",
    "eval_transform",
    "flush_denormal",
    "folder_fingerprint",
    "image_view",
    "list_classes",
    "load_image",
    "make_digits_folder",
    "make_index_files",
    "make_synthetic_folder",
    "match_classes",
    "read_format_json",
    "read_index_file",
    "tta_transform",
    "write_format_json",
]

_COMPLETE = ".uqvision-complete"


def derive_seed(*keys: int) -> int:
    """A 63-bit seed derived from integer keys (``numpy.random.SeedSequence``).

    Used for per-pass and per-sample augmentation seeds so that an augmentation depends only on
    (seed, pass, sample index) — not on batch size, worker count or process sharding.

    Examples
    --------
    >>> derive_seed(0, 1) == derive_seed(0, 1) != derive_seed(0, 2)
    True
    """
    state = np.random.SeedSequence([int(k) for k in keys]).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 31 ^ int(state[1])


@contextlib.contextmanager
def flush_denormal():
    """Flush subnormal floats to zero on CPU while inside (restores PyTorch's default after).

    Small grey-level images (zero padding, near-constant inputs) produce subnormal activations
    and gradients that slow CPU convolutions and BatchNorm several-fold.
    """
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


# --------------------------------------------------------------------------------------------
# reading and checking image files

#: Integer pixel modes wider than 8 bits: grey levels scaled 65535 -> 255 (PIL's ``convert``
#: clips them at 255 instead). ``I`` (32-bit) is how PIL has opened 16-bit PNGs.
_WIDE_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def _to_rgb(im: Image.Image, path: str | os.PathLike) -> Image.Image:
    """An opened image as 8-bit RGB; 16-bit grey levels scaled, not clipped."""
    if im.mode == "F":
        raise BadImageError(f"image {str(path)!r}: floating-point pixels (mode F) have no "
                            "defined range; convert the file to 8 or 16 bits", path)
    if im.mode not in _WIDE_MODES:
        return im.convert("RGB")
    a = np.asarray(im).astype(np.int64)
    if a.size and (a.min() < 0 or a.max() > 65535):
        raise BadImageError(f"image {str(path)!r}: integer pixel values outside [0, 65535] "
                            f"(mode {im.mode}, range {a.min()}..{a.max()})", path)
    grey = ((a * 255 + 32767) // 65535).astype(np.uint8)  # round(v * 255 / 65535)
    return Image.fromarray(grey).convert("RGB")


def _problem(path: str | os.PathLike | io.BytesIO, err: BaseException) -> str:
    """What an error of PIL says about an image file (or its bytes), in a few words."""
    if isinstance(err, FileNotFoundError):
        if getattr(err, "why", None):  # uqvision.layouts.UnreadableFileError: a tar link
            return err.why
        if isinstance(path, str | os.PathLike) and os.path.islink(path):
            return f"a symbolic link to {os.readlink(path)!r}, which does not exist"
        return "does not exist"
    if isinstance(err, Image.UnidentifiedImageError):
        try:
            empty = (path.getbuffer().nbytes if isinstance(path, io.BytesIO)
                     else os.path.getsize(path)) == 0
        except OSError:
            empty = False
        return "empty file (0 bytes)" if empty else "not an image file (PIL cannot identify it)"
    if isinstance(err, Image.DecompressionBombError):
        return f"too many pixels ({err})"
    text = " ".join(str(err).split()) or type(err).__name__
    return f"truncated or corrupt ({text})"


#: What reading a damaged image file raises in PIL.
_PIL_ERRORS = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)


def load_image(path: str | os.PathLike) -> Image.Image:
    """Read an image file as 8-bit RGB (the loader of :class:`ImageFolderDataset`).

    16-bit grey images (PNG mode ``I;16``) are scaled, 65535 -> 255 rounded, where PIL's
    ``convert("RGB")`` saturates every value above 255; floating-point images are refused.

    Raises
    ------
    uqvision.exceptions.BadImageError
        The file is missing, empty, not an image, truncated or corrupt; the message names it.
    """
    return _load(path, path)


def _load(src: str | os.PathLike | io.BytesIO, where: str | os.PathLike) -> Image.Image:
    """:func:`load_image` of a path or of bytes in memory (an archive member), named ``where``
    in messages."""
    try:
        with Image.open(src) as im:
            return _to_rgb(im, where)
    except BadImageError:
        raise
    except _PIL_ERRORS as err:
        raise BadImageError(f"image {str(where)!r}: {_problem(src, err)}", where) from None


def _load_sample(source, rel: str) -> Image.Image:
    """Sample ``rel`` of an image source (:mod:`uqvision.layouts`) as 8-bit RGB."""
    try:
        src = source.open(rel)
    except OSError as err:
        raise BadImageError(f"image {source.where(rel)!r}: {_problem(source.where(rel), err)}",
                            source.where(rel)) from None
    return _load(src, source.where(rel))


def check_image(path: str | os.PathLike | io.BytesIO) -> str | None:
    """What is wrong with an image file (a few words), or ``None`` when it reads.

    Cheaper than :func:`load_image` and as strict for the damage files suffer: the header is
    opened (an empty file, a file of another kind); a JPEG is decoded at its smallest DCT scale
    (``draft``: all the entropy-coded data is read, so a truncated or corrupt file fails, but
    only 1/64 of the pixels is produced); a PNG is verified (every chunk read and its CRC
    checked, nothing inflated); another format is decoded. ``path`` may be an image's bytes in
    memory (``io.BytesIO``).
    """
    try:
        with Image.open(path) as im:
            if im.mode == "F":
                _to_rgb(im, path)
            if im.format == "JPEG":
                im.draft("RGB", (1, 1))
                im.load()
            elif im.format == "PNG":
                im.verify()
            else:
                im.load()
    except BadImageError as err:
        return str(err).split(": ", 1)[-1]
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
    cost is about one decode of the folder at 1/64 of the pixels.

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


def readable_images(folder: ImageFolderDataset, *,
                    skip_bad: bool = False) -> ImageFolderDataset:
    """``folder`` once its images are known to read (:func:`check_images`, before any work).

    Parameters
    ----------
    folder : ImageFolderDataset
    skip_bad : bool, default False
        Leave unreadable images out (recorded in the copy's ``skipped``) instead of raising
        (``--skip-bad-images``). Images of the label file that are absent are not unreadable:
        they are refused whatever ``skip_bad``; a folder scanned with ``subset=True``
        (``--subset``) has none.

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
            raise BadImageError(label_problems_message(folder, listed), folder.root)
        first = next(iter(bad))
        raise BadImageError(bad_images_message(folder.root, bad, folder.source.where),
                            folder.root / first if folder._folder_label is None
                            else folder.source.where(first))
    return folder.without(bad) if bad else folder


def bad_images_message(root: str | os.PathLike, bad: dict[str, str],
                       where: Callable[[str], str] | None = None) -> str:
    """One line for the bad images of a folder: how many, the first ones with their problem
    (each named ``where(relative path)``, default ``root / path``), and the option that skips
    them."""
    where = where or (lambda rel: str(Path(root) / rel))
    shown = "; ".join(f"{where(rel)!r}: {why}" for rel, why in list(bad.items())[:3])
    more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
    return (f"image folder {str(root)!r} has {len(bad)} unreadable image(s): {shown}{more}; "
            "fix or remove them, or pass --skip-bad-images to leave them out")


def label_problems_message(folder: ImageFolderDataset, problems: Mapping[str, str]) -> str:
    """One line for the images of a flat layout that do not match its label file: how many are
    listed there but absent and how many have no label, with an example of each, and the
    option that takes each as it is (``--subset`` for the absent ones, ``--skip-bad-images``
    for the unlabelled ones)."""
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
        (unlabelled, "pass --skip-bad-images to leave the unlabelled ones out")) if rels]
    label = folder.label_file.name if folder.label_file is not None else "?"
    return (f"image {'archive' if folder.layout.startswith('tar') else 'folder'} "
            f"{str(folder.root)!r} does not match label file {label!r}: {' and '.join(parts)}; "
            f"fix the folder or the label file, or {', and '.join(fixes)}")


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


# --------------------------------------------------------------------------------------------
# preprocessing

@dataclass(frozen=True)
class DataConfig:
    """The preprocessing a model was trained with (timm's pretrained-config fields).

    ``input_size`` is (3, H, W); the evaluation transform resizes the short side to
    ``floor(H / crop_pct)`` and centre-crops (H, W).
    """

    input_size: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_pct: float = 0.875
    interpolation: str = "bilinear"
    crop_mode: str = "center"

    @classmethod
    def from_dict(cls, d: dict) -> DataConfig:
        keys = ("input_size", "mean", "std", "crop_pct", "interpolation", "crop_mode")
        kw = {k: d[k] for k in keys if k in d and d[k] is not None}
        for k in ("input_size", "mean", "std"):
            kw[k] = tuple(kw[k])
        return cls(**kw)

    def to_dict(self) -> dict:
        return {"input_size": list(self.input_size), "mean": list(self.mean),
                "std": list(self.std), "crop_pct": self.crop_pct,
                "interpolation": self.interpolation, "crop_mode": self.crop_mode}


def eval_transform(cfg: DataConfig) -> Callable:
    """timm's evaluation transform for a data config (``timm.data.create_transform``)."""
    return create_transform(**cfg.to_dict(), is_training=False)


def _interp(name: str) -> T.InterpolationMode:
    return T.InterpolationMode(name if name in {m.value for m in T.InterpolationMode}
                               else "bilinear")


def _tail(cfg: DataConfig) -> list:
    return [T.ToTensor(), T.Normalize(cfg.mean, cfg.std)]


def _central_crop_box(height: int, width: int, ratio) -> tuple[int, int, int, int]:
    """torchvision's fallback of ``RandomResizedCrop``: the largest central box within
    ``ratio``."""
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        w, h = round(height * max(ratio)), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class RandomResizedCrop(T.RandomResizedCrop):
    """torchvision's ``RandomResizedCrop`` drawing from ``generator`` (default: the global RNG).

    Its draws are torchvision's, call for call: with a generator seeded ``s`` the crop equals
    torchvision's after ``torch.manual_seed(s)``.
    """

    def forward(self, img, generator: torch.Generator | None = None):
        _, height, width = TF.get_dimensions(img)
        area = height * width
        lo, hi = (float(v) for v in torch.log(torch.tensor(self.ratio)))
        box = None
        for _ in range(10):
            target = area * torch.empty(1).uniform_(*self.scale, generator=generator).item()
            aspect = torch.exp(torch.empty(1).uniform_(lo, hi, generator=generator)).item()
            w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                box = (_randint(height - h + 1, generator), _randint(width - w + 1, generator),
                       h, w)
                break
        box = box or _central_crop_box(height, width, self.ratio)
        return TF.resized_crop(img, *box, self.size, self.interpolation, antialias=self.antialias)


class RandomCrop(T.RandomCrop):
    """torchvision's ``RandomCrop`` (padding, no ``pad_if_needed``) drawing from ``generator``."""

    def forward(self, img, generator: torch.Generator | None = None):
        if self.padding is not None:
            img = TF.pad(img, self.padding, self.fill, self.padding_mode)
        _, h, w = TF.get_dimensions(img)
        th, tw = self.size
        if h < th or w < tw:
            raise ValueError(f"crop size {(th, tw)} is larger than the image size {(h, w)}")
        if (h, w) == (th, tw):
            return img
        i, j = _randint(h - th + 1, generator), _randint(w - tw + 1, generator)
        return TF.crop(img, i, j, th, tw)


class RandomHorizontalFlip(T.RandomHorizontalFlip):
    """torchvision's ``RandomHorizontalFlip`` drawing from ``generator``."""

    def forward(self, img, generator: torch.Generator | None = None):
        return TF.hflip(img) if torch.rand(1, generator=generator) < self.p else img


def _randint(high: int, generator: torch.Generator | None) -> int:
    return int(torch.randint(0, high, size=(1,), generator=generator).item())


_SEEDED_STEPS = (RandomResizedCrop, RandomCrop, RandomHorizontalFlip)


class SeededAugmentation(T.Compose):
    """A ``Compose`` whose random steps draw from an explicit ``torch.Generator``.

    ``aug(img)`` draws from the global torch RNG exactly as the plain torchvision pipeline
    would (training); ``aug(img, generator=g)`` draws from ``g`` only (test-time augmentation:
    one generator per sample and pass, so the global RNG is never read or written).
    """

    def __call__(self, img, generator: torch.Generator | None = None):
        for step in self.transforms:
            img = step(img, generator=generator) if isinstance(step, _SEEDED_STEPS) else step(img)
        return img


def _pad_crop(cfg: DataConfig, flip: bool) -> SeededAugmentation:
    size = cfg.input_size[1:]
    pad = max(1, round(4 * size[0] / 32))  # 4 px at CIFAR's 32 px, scaled with the input
    steps = [T.Resize(size, interpolation=_interp(cfg.interpolation)),
             RandomCrop(size, padding=pad)]
    if flip:
        steps.append(RandomHorizontalFlip())
    return SeededAugmentation([*steps, *_tail(cfg)])


#: Random augmentation policies (Pitfalls, V.2): name -> builder(DataConfig) ->
#: :class:`SeededAugmentation`.
TTA_POLICIES: Registry[Callable[[DataConfig], SeededAugmentation]] = Registry("augmentation")


@TTA_POLICIES.register(name="imagenet")
def imagenet_augmentation(cfg: DataConfig) -> SeededAugmentation:
    """RandomResizedCrop + horizontal flip (ImageNet style)."""
    size = cfg.input_size[1:]
    return SeededAugmentation([RandomResizedCrop(size, interpolation=_interp(cfg.interpolation)),
                               RandomHorizontalFlip(), *_tail(cfg)])


@TTA_POLICIES.register(name="cifar")
def cifar_augmentation(cfg: DataConfig) -> SeededAugmentation:
    """Pad-4 random crop + horizontal flip (CIFAR style; the pad scales with the input)."""
    return _pad_crop(cfg, flip=True)


@TTA_POLICIES.register(name="crop")
def crop_augmentation(cfg: DataConfig) -> SeededAugmentation:
    """Pad-4 random crop, no flip (digits must not be flipped)."""
    return _pad_crop(cfg, flip=False)


def tta_transform(policy: str, cfg: DataConfig) -> SeededAugmentation:
    """The random augmentation ``policy`` (a name in :data:`TTA_POLICIES`) for a data config."""
    return TTA_POLICIES.lookup(policy)(cfg)

# --------------------------------------------------------------------------------------------
# development datasets

def _write_folder(root: Path, splits: dict[str, list[tuple[np.ndarray, str, str]]],
                  meta: dict, overwrite: bool) -> Path:
    """Write ``{split: [(uint8 image HxW[x3], class name, file stem)]}`` atomically."""
    root = Path(root)
    if (root / _COMPLETE).exists() and not overwrite:
        if json.loads((root / _COMPLETE).read_text()) == meta:
            return root
        raise FileExistsError(f"{str(root)!r} holds a different dataset; pass overwrite=True")
    if root.exists() and any(root.iterdir()) and not overwrite and not (root / _COMPLETE).exists():
        raise FileExistsError(f"{str(root)!r} exists and is not a uqvision dataset folder")
    with folder_replaced(root) as tmp:
        for split, items in splits.items():
            for arr, cls, stem in items:
                d = tmp / split / cls
                d.mkdir(parents=True, exist_ok=True)
                Image.fromarray(arr).save(d / f"{stem}.png")
        (tmp / _COMPLETE).write_text(json.dumps(meta))
    return root


def make_digits_folder(root: str | os.PathLike, *, test_fraction: float = 0.5, seed: int = 0,
                       max_per_class: int | None = None, overwrite: bool = False) -> Path:
    """Write scikit-learn's bundled digits (1,797 real 8×8 images, 10 classes) as image folders.

    Creates ``root/train/<digit>/*.png`` and ``root/test/<digit>/*.png`` (stratified split).
    Idempotent: an identical existing folder is reused.

    Parameters
    ----------
    root : path
    test_fraction : float, default 0.5
    seed : int, default 0
        Seed of the stratified split.
    max_per_class : int, optional
        Keep only the first images of each class (before the split): small sets for tests.
    overwrite : bool, default False

    Returns
    -------
    Path
        ``root``.
    """
    from sklearn.datasets import load_digits  # heavy: imported on first use (start-up time)
    from sklearn.model_selection import (
        train_test_split,  # heavy: imported on first use (start-up time)
    )

    d = load_digits()
    imgs = np.round(d.images * (255.0 / 16.0)).astype(np.uint8)
    idx = np.arange(len(imgs))
    if max_per_class is not None:
        idx = np.concatenate([np.flatnonzero(d.target == c)[:max_per_class] for c in range(10)])
    tr, te = train_test_split(idx, test_size=test_fraction, random_state=seed, stratify=d.target[idx])
    splits = {name: [(imgs[i], str(d.target[i]), f"{i:04d}") for i in sorted(part)]
              for name, part in (("train", tr), ("test", te))}
    meta = {"maker": "digits", "test_fraction": test_fraction, "seed": seed,
            "max_per_class": max_per_class}
    return _write_folder(Path(root), splits, meta, overwrite)


def make_synthetic_folder(root: str | os.PathLike, *, n_classes: int = 4, n_per_class: int = 8,
                          image_size: int = 224, seed: int = 0, overwrite: bool = False) -> Path:
    """Write torchvision ``FakeData`` images (random RGB, ``image_size`` px) as ``root/test``.

    For exercising the full-resolution (224 px, resize 256 + centre crop) input path; the labels
    carry no signal.
    """
    n = n_classes * n_per_class
    fake = FakeData(size=n, image_size=(3, image_size, image_size), num_classes=n_classes,
                    random_offset=seed)
    items = []
    for i in range(n):
        img, _ = fake[i]
        items.append((np.asarray(img), f"class_{i % n_classes:03d}", f"{i:05d}"))
    meta = {"maker": "synthetic", "n_classes": n_classes, "n_per_class": n_per_class,
            "image_size": image_size, "seed": seed}
    return _write_folder(Path(root), {"test": items}, meta, overwrite)


#: Development dataset makers: name -> function(root, *, seed, overwrite, **options) -> root
#: (``uqvision data NAME``; the CLI passes the options the function's signature names).
DATASET_MAKERS: Registry[Callable[..., Path]] = Registry("dataset maker")
DATASET_MAKERS.add("digits", make_digits_folder)
DATASET_MAKERS.add("synthetic", make_synthetic_folder)
DATASET_MAKERS.add("hierarchy", make_hierarchy)  # docs/conventions.md#v-0 (uqvision.hierarchy)


# --------------------------------------------------------------------------------------------
# class-subset views and index files (UIMNET's 90/10 in-domain split, and any training view)

#: Format of the index files of :func:`make_index_files`.
INDEX_FORMAT = {"format": "uqvision.uimnet_index", "format_version": 1}


def write_format_json(obj: dict[str, Any], out: str | os.PathLike) -> Path:
    """Write ``obj`` as JSON atomically (a temporary file beside ``out``, then renamed)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, out)
    return out


def read_format_json(path: str | os.PathLike, fmt: dict[str, Any]) -> dict[str, Any]:
    """Read a JSON file; ``ValueError`` unless its format and version are ``fmt``'s."""
    meta = json.loads(Path(path).read_text())
    if any(meta.get(k) != v for k, v in fmt.items()):
        raise ValueError(f"{str(path)!r} is not a {fmt} file")
    return meta


class ClassSubset(Dataset):
    """A class-subset view of an image folder, labels re-indexed to ``classes``' order.

    Parameters
    ----------
    base : ImageFolderDataset
    classes : sequence of str, or mapping str -> str
        The folder classes kept; label ``i`` is ``classes[i]``. A mapping sends each kept
        folder class to a label name (several to one: e.g. in- vs out-domain), the labels
        ordered by first appearance.
    indices : sequence of int, optional
        Positions in the view (after the class filter, in the folder's sample order) to keep,
        e.g. an index file's.

    Items are ``(image, label, index)`` with ``index`` the position in this view. The base's
    ``transform`` and ``augment_seed`` are the view's (augmentations are seeded by the base
    sample index, so a view draws what the whole folder would for the same image).
    """

    def __init__(self, base: ImageFolderDataset, classes: Sequence[str] | Mapping[str, str],
                 indices: Sequence[int] | None = None):
        mapping = dict(classes) if isinstance(classes, Mapping) else {c: c for c in classes}
        if not isinstance(classes, Mapping) and len(mapping) != len(classes):
            raise ValueError(f"classes has duplicates: {list(classes)[:10]}")
        missing = [c for c in mapping if c not in base.class_to_idx]
        if missing:
            raise ValueError(f"classes not in {str(base.root)!r}: {missing[:5]}")
        self.base = base
        self.folder_classes = list(mapping)
        self.classes = list(dict.fromkeys(mapping.values()))
        label = {name: i for i, name in enumerate(self.classes)}
        remap = {base.class_to_idx[c]: label[v] for c, v in mapping.items()}
        keep = [(j, remap[y]) for j, (_, y) in enumerate(base.samples) if y in remap]
        if indices is not None:
            bad = [int(i) for i in indices if not 0 <= int(i) < len(keep)]
            if bad:
                raise ValueError(f"indices out of range for a view of {len(keep)} samples: "
                                 f"{bad[:5]}")
            keep = [keep[int(i)] for i in indices]
        self._rows = keep

    @property
    def root(self):
        return self.base.root

    @property
    def transform(self):
        return self.base.transform

    @property
    def augment_seed(self) -> int | None:
        return self.base.augment_seed

    @augment_seed.setter
    def augment_seed(self, seed: int | None) -> None:
        self.base.augment_seed = seed

    def with_augment_seed(self, seed: int | None) -> ClassSubset:
        """A copy of the view (sharing the sample lists) with its own augmentation seed."""
        return self.with_transform(self.transform, seed)

    def with_transform(self, transform, augment_seed: int | None = None) -> ClassSubset:
        """A copy of the view (sharing the sample lists) with another transform and seed."""
        view = copy.copy(self)
        view.base = self.base.with_transform(transform, augment_seed)
        return view

    @property
    def targets(self) -> list[int]:
        return [y for _, y in self._rows]

    @property
    def sample_ids(self) -> list[str]:
        return [self.base.samples[j][0] for j, _ in self._rows]

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index: int):
        j, y = self._rows[index]
        img, _, _ = self.base[j]
        return img, y, index


def image_view(root: str | os.PathLike, transform=None, *,
               classes: Sequence[str] | Mapping[str, str] | None = None,
               index_file: str | os.PathLike | None = None):
    """The image folder ``root``, or its class-subset view (``classes``) restricted to the
    positions of an index file of :func:`make_index_files` (whose classes must be the view's
    folder classes, in order).

    Returns
    -------
    ImageFolderDataset or ClassSubset
    """
    base = ImageFolderDataset(root, transform)
    if not classes and index_file is None:
        return base
    if not classes:
        raise ValueError(f"index_file={str(index_file)!r} needs the classes it indexes")
    indices = None
    if index_file is not None:
        index = read_index_file(index_file)
        if list(index["classes"]) != list(classes):
            raise ValueError(f"index_file {str(index_file)!r} indexes classes "
                             f"{index['classes'][:5]}..., not the view's {list(classes)[:5]}...")
        indices = index["indices"]
    return ClassSubset(base, classes, indices)


def make_index_files(root: str | os.PathLike, classes: Sequence[str], out_dir: str | os.PathLike,
                     *, seed: int, val_fraction: float = 0.1) -> dict[str, Path]:
    """Seeded train/val index files of the in-domain part of a training folder.

    Per class, ``round(val_fraction * n_c)`` (at least 1) images go to validation, the rest
    to training, chosen by ``numpy.random.default_rng(seed)``. Files hold sample ids and their
    positions in ``ClassSubset(ImageFolderDataset(root), classes)``; nothing is copied.

    Returns
    -------
    dict
        ``{"train": path, "val": path}`` (``<out_dir>/seed<seed>.{train,val}.json``).
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}")
    view = ClassSubset(ImageFolderDataset(root), classes)
    rng = np.random.default_rng(seed)
    y = np.asarray(view.targets)
    parts: dict[str, list[int]] = {"train": [], "val": []}
    for c in range(len(classes)):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_val = max(1, round(val_fraction * len(idx)))
        parts["val"] += idx[:n_val].tolist()
        parts["train"] += idx[n_val:].tolist()
    ids = view.sample_ids
    paths = {}
    for name, idx in parts.items():
        idx = sorted(idx)
        paths[name] = write_format_json({**INDEX_FORMAT, "seed": seed, "part": name,
                                   "val_fraction": val_fraction, "classes": list(classes),
                                   "indices": idx, "samples": [ids[i] for i in idx]},
                                  Path(out_dir) / f"seed{seed}.{name}.json")
    return paths


def read_index_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read an index file of :func:`make_index_files`."""
    return read_format_json(path, INDEX_FORMAT)
