"""Development datasets written as image folders: scikit-learn's digits
(:func:`make_digits_folder`), torchvision's ``FakeData`` at full resolution
(:func:`make_synthetic_folder`) and the hierarchy stand-in (:func:`uqvision.hierarchy.
make_hierarchy`), and a seeded per-class subset of any image folder (:func:`make_subset_folder`:
the fit data of the feature-based OOD detectors), registered in :data:`DATASET_MAKERS`
(``uqvision data NAME``).
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image
from uqmetrics import InputError
from uqmetrics.metrics.registry import Registry
from uqmetrics.runs.io import check_apart, folder_replaced
from uqmetrics.runs.run_config import CONFIG_SUFFIX

from ..exceptions import BadImageError
from ..hierarchy import make_hierarchy
from .corruptions import make_imagenet_c_folder

__all__ = ["DATASET_MAKERS", "digits_split", "make_digits_folder", "make_subset_folder",
           "make_synthetic_folder"]

#: Marks a folder written completely by a maker (its content: the maker's options, JSON).
_COMPLETE = ".uqvision-complete"
#: The writer the makers' folders record (:func:`uqmetrics.runs.io.folder_replaced`): ``--overwrite``
#: replaces only a folder of theirs, holding nothing but what they wrote and ``uqvision data``'s
#: own configuration file (:data:`_ALSO`).
WRITER = "uqvision data"
_ALSO = (f"data{CONFIG_SUFFIX}",)


def _kept(root: Path, meta: dict, overwrite: bool,
          same: Callable[[dict], bool] | None = None) -> bool:
    """Whether ``root`` already holds the dataset ``meta`` describes (a rerun keeps it);
    ``FileExistsError`` for a folder that is another dataset (without ``overwrite``) or no
    dataset of the makers at all (even with ``overwrite``: nothing of someone else's is
    replaced). ``same``: whether the folder's record (its :data:`_COMPLETE` JSON) is the
    dataset asked for, when that is more than ``record == meta`` (it may raise its own
    ``FileExistsError``)."""
    if (root / _COMPLETE).is_file() and not root.is_symlink():
        if overwrite:
            return False
        record = json.loads((root / _COMPLETE).read_text())
        if same(record) if same is not None else record == meta:
            return True
        raise FileExistsError(f"--out {str(root)!r} holds a different dataset; pass "
                              "overwrite=True (--overwrite) to replace it")
    if root.is_symlink() or (root.exists() and (not root.is_dir() or any(root.iterdir()))):
        raise FileExistsError(f"--out {str(root)!r} exists and is not a uqvision dataset folder "
                              f"(no {_COMPLETE}); --overwrite replaces only a dataset folder "
                              "uqvision wrote: choose another --out")
    return False


def _check_count(name: str, value: object) -> None:
    """Refuse a ``value`` of parameter ``name`` that is not an integer >= 1
    (:class:`~uqmetrics.InputError` naming the parameter and the value; ``uqvision data``
    refuses it first, naming the option)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"{name} must be an integer >= 1, got {value!r}")


def _write_folder(root: Path, splits: dict[str, list[tuple[np.ndarray, str, str]]],
                  meta: dict, overwrite: bool) -> Path:
    """Write ``{split: [(uint8 image HxW[x3], class name, file stem)]}`` atomically."""
    root = Path(root)
    if _kept(root, meta, overwrite):
        return root
    with folder_replaced(root, writer=WRITER, also=_ALSO) as tmp:
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
        The folder written: ``root/train/<digit>/*.png`` and ``root/test/<digit>/*.png``.
    test_fraction : float, default 0.5
        The fraction of the images in ``test`` (the split is stratified by class).
    seed : int, default 0
        Seed of the stratified split.
    max_per_class : int, optional
        Keep only the first images of each class (before the split): small sets for tests.
    overwrite : bool, default False
        Replace a dataset folder of the makers (one of other options); a folder that is not
        one, or that holds files they did not write, is refused.

    Returns
    -------
    Path
        ``root``.

    Raises
    ------
    uqmetrics.InputError
        ``test_fraction`` not in (0, 1), ``max_per_class`` below 1, ``seed`` not in
        [0, 2**32), or ``test_fraction`` and ``max_per_class`` leaving a class without an
        image in ``train`` or ``test`` (:func:`digits_split`), before anything is written.
    """
    from sklearn.datasets import load_digits  # heavy: imported on first use (start-up time)

    tr, te = digits_split(test_fraction, seed, max_per_class)
    d = load_digits()
    imgs = np.round(d.images * (255.0 / 16.0)).astype(np.uint8)
    splits = {name: [(imgs[i], str(d.target[i]), f"{i:04d}") for i in sorted(part)]
              for name, part in (("train", tr), ("test", te))}
    meta = {"maker": "digits", "test_fraction": test_fraction, "seed": seed,
            "max_per_class": max_per_class}
    return _write_folder(Path(root), splits, meta, overwrite)


def digits_split(test_fraction: float = 0.5, seed: int = 0,
                 max_per_class: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The images of :func:`make_digits_folder`'s ``train`` and ``test``: indices into
    ``sklearn.datasets.load_digits()``, split stratified by class.

    Parameters
    ----------
    test_fraction, seed, max_per_class
        As :func:`make_digits_folder`.

    Returns
    -------
    train, test : ndarray of int
        The indices of each part (in the order ``train_test_split`` gives them).

    Raises
    ------
    uqmetrics.InputError
        ``test_fraction`` not a number in (0, 1), ``max_per_class`` not an integer >= 1,
        ``seed`` not in [0, 2**32), or ``test_fraction`` and ``max_per_class`` leaving too few
        images to put every class in both parts (the message names both, with scikit-learn's
        reason).
    """
    from sklearn.datasets import load_digits  # heavy: imported on first use (start-up time)
    from sklearn.model_selection import (
        train_test_split,  # heavy: imported on first use (start-up time)
    )

    if (isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float, np.number))
            or not 0 < test_fraction < 1):
        raise InputError(f"test_fraction must be a fraction in (0, 1), got {test_fraction!r}")
    if max_per_class is not None:
        _check_count("max_per_class", max_per_class)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) \
            or not 0 <= seed < 2**32:
        raise InputError(f"seed must be an integer in [0, 2**32) (scikit-learn's random_state), "
                         f"got {seed!r}")
    target = load_digits().target
    idx = np.arange(len(target))
    if max_per_class is not None:
        idx = np.concatenate([np.flatnonzero(target == c)[:max_per_class] for c in range(10)])
    try:
        return tuple(train_test_split(idx, test_size=test_fraction, random_state=seed,
                                      stratify=target[idx]))
    except ValueError as exc:
        raise InputError(
            f"test_fraction (--test-fraction) {test_fraction} with max_per_class "
            f"(--max-per-class) {max_per_class}: the {idx.size} images cannot be split with "
            f"every one of the 10 classes in both train and test ({' '.join(str(exc).split())})"
        ) from None


def make_synthetic_folder(root: str | os.PathLike, *, n_classes: int = 4, n_per_class: int = 8,
                          image_size: int = 224, seed: int = 0, overwrite: bool = False) -> Path:
    """Write torchvision ``FakeData`` images (random RGB, ``image_size`` px) as ``root/test``.

    For exercising the full-resolution (224 px, resize 256 + centre crop) input path; the labels
    carry no signal.

    Parameters
    ----------
    root : path
        The folder written: ``root/test/class_<k>/*.png``.
    n_classes : int, default 4
        Classes (folders ``class_000`` ...).
    n_per_class : int, default 8
        Images of each class.
    image_size : int, default 224
        The side of the square images, in pixels.
    seed : int, default 0
        Where FakeData's random images start (its ``random_offset``).
    overwrite : bool, default False
        Replace a dataset folder of the makers (one of other options); a folder that is not
        one, or that holds files they did not write, is refused.

    Returns
    -------
    Path
        ``root``.

    Raises
    ------
    uqmetrics.InputError
        ``n_classes``, ``n_per_class`` or ``image_size`` not an integer >= 1, before anything
        is written.
    """
    for name, value in (("n_classes", n_classes), ("n_per_class", n_per_class),
                        ("image_size", image_size)):
        _check_count(name, value)
    from torchvision.datasets import FakeData  # torch: imported on use (uqvision data -h)

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
def subset_choice(classes: list[str], samples: list[tuple[str, int]], per_class: int,
                  seed: int = 0) -> list[int]:
    """The sample indices of a seeded subset of ``per_class`` samples of every class.

    Each class draws from its own stream, ``numpy.random.default_rng([seed,
    crc32(class name)])``, without replacement, over its samples in folder order, so a class's
    choice depends on nothing but ``(seed, class, its samples)``.

    Parameters
    ----------
    classes : list of str, shape (n_classes,)
    samples : list of (str, int), shape (n_samples,)
        ``(sample id, class index)`` (:attr:`uqvision.data.ImageFolderDataset.samples`).
    per_class : int
    seed : int

    Returns
    -------
    list of int
        Indices into ``samples``, in folder order.

    Raises
    ------
    uqmetrics.InputError
        ``per_class`` below 1 or above a class's sample count (naming the class).
    """
    if int(per_class) < 1:
        raise InputError(f"per_class must be at least 1, got {per_class!r}")
    by_class: dict[int, list[int]] = {}
    for i, (_, y) in enumerate(samples):
        by_class.setdefault(int(y), []).append(i)
    chosen = []
    for c, name in enumerate(classes):
        rows = by_class.get(c, [])
        if per_class > len(rows):
            raise InputError(f"per_class {per_class} exceeds the {len(rows)} images of class "
                             f"{name!r}")
        rng = np.random.default_rng([seed, zlib.crc32(name.encode("utf-8"))])
        chosen += [rows[j] for j in rng.choice(len(rows), size=per_class, replace=False)]
    return sorted(chosen)


def make_subset_folder(root: str | os.PathLike, *, src: str | os.PathLike, n_per_class: int = 10,
                       seed: int = 0, overwrite: bool = False) -> Path:
    """Write ``n_per_class`` seeded images of every class of the image folder ``src`` (any layout
    uqvision reads: class folders, a flat folder with its label file, a tar, an image list) as
    class folders ``root/<class>/<file>``, their bytes copied unchanged.

    The choice is :func:`subset_choice`; ``root/subset.json`` records the source, ``n_per_class``,
    ``seed``, every chosen sample id and ``fingerprint``: the dataset fingerprint of the chosen
    images of ``src`` (:func:`uqvision.data.folder_fingerprint` of ``src`` restricted to them:
    its class list, layout and label file, and every chosen image's id, label, size and the
    SHA-256 of the very bytes copied). The folder is written atomically. A complete one of the
    same options is kept (a rerun writes nothing) only while the chosen images of ``src`` still
    have that fingerprint (every one of them is read and hashed at each rerun, nothing else of
    ``src``): an image changed or replaced in place (same path, other bytes) refuses the rerun,
    naming the folder and such an image, unless ``overwrite``, which copies the current images.
    One of other options is refused without ``overwrite``. The feature-based OOD detectors fit
    on such a subset of the training set (``uqvision score ood --fit-data``;
    docs/conventions.md#v-6).

    A subset written before the fingerprint was recorded (no ``fingerprint`` in its record) is
    checked against its own copies, which are byte copies of the source images: it is kept
    when every copy still has the SHA-256 of its source image now (its record is left as it
    is, so the next rerun checks it again), and refused as a changed one otherwise
    (``overwrite`` writes it anew, fingerprint recorded).

    Parameters
    ----------
    root : path
        The folder written: ``root/<class>/<file>``, ``root/subset.json``.
    src : path
        The image folder the images are drawn from (required).
    n_per_class : int, default 10
        Images drawn from every class.
    seed : int, default 0
        Seed of the draw (each class draws from its own stream: :func:`subset_choice`).
    overwrite : bool, default False
        Replace a subset folder of other options, or of source images that changed since.

    Returns
    -------
    Path
        ``root``.

    Raises
    ------
    uqmetrics.InputError
        Bad ``n_per_class`` (:func:`subset_choice`); a chosen image that does not read
        (:class:`~uqvision.exceptions.BadImageError`, naming ``--src`` and the image:
        :func:`uqvision.data.check_images`); two chosen images of one class with the
        same file name; ``root`` holds ``src`` or lies inside it; with ``overwrite``, ``root``
        holds files the makers did not write (:func:`uqmetrics.runs.io.folder_replaced`).
    FileExistsError
        ``root`` holds another dataset, or a subset of these options whose source images
        changed since it was made, and ``overwrite`` is False; or ``root`` is not a dataset
        folder of the makers.
    """
    from .folders import ImageFolderDataset, folder_fingerprint, sample_digests
    from .images import bad_images_message, check_images

    root = Path(root)
    check_apart(root, {"--src": src})  # replacing root would delete the source images
    ds = ImageFolderDataset(src)
    try:
        chosen = subset_choice(list(ds.classes), list(ds.samples), n_per_class, seed)
    except InputError as exc:  # its parameter is per_class
        raise InputError(f"n_per_class (--per-class): {exc}") from None
    ids = [ds.samples[i][0] for i in chosen]
    meta = {"maker": "subset", "src": str(Path(src).resolve()), "per_class": int(n_per_class),
            "seed": int(seed), "samples": ids}
    keep = set(ids)
    view = ds.without([rel for rel in ds.sample_ids if rel not in keep])  # only these are read
    bad = check_images(view)  # a copy of an image that does not read would be read later
    if bad:
        raise BadImageError(bad_images_message(src, bad, ds.source.where, skip_option=None,
                                               what=f"--src {str(src)!r}"), src)

    def copy_of(rel: str, y: int) -> Path:
        return root / ds.classes[y] / Path(rel).name

    def same(record: dict) -> bool:
        """The record is of this request and the chosen images are those it was made from."""
        if {k: v for k, v in record.items() if k != "fingerprint"} != meta:
            return False
        recorded = record.get("fingerprint")
        now = folder_fingerprint(view) if recorded is not None else None
        if recorded is not None and recorded == now:
            return True
        digests = sample_digests(view)  # those the fingerprint read (a legacy record: now)
        changed = [rel for rel, y in view.samples
                   if _file_sha256(copy_of(rel, y)) != digests[rel]]
        if recorded is None and not changed:
            return True  # recorded before the fingerprint: its byte copies are the images now
        what = (f"{len(changed)} of its {len(view)} copies differ from the image they were "
                f"copied from, e.g. {ds.source.where(changed[0])!r}" if changed else
                f"the chosen images' fingerprint is {now}, the folder records {recorded}")
        legacy = ("; it was made before subsets recorded their images' fingerprint"
                  if recorded is None else "")
        raise FileExistsError(
            f"--out {str(root)!r} holds a subset of --src {str(src)!r} made from other images "
            f"than --src holds now ({what}{legacy}): a rerun would keep the old copies; pass "
            "overwrite=True (--overwrite) to copy the current images")

    if _kept(root, meta, overwrite, same):
        return root
    digests: dict[str, str | None] = {}
    with folder_replaced(root, writer=WRITER, also=_ALSO) as tmp:
        for i in chosen:
            rel, y = ds.samples[i]
            target = Path(tmp) / ds.classes[y] / Path(rel).name
            if target.exists():
                raise InputError(f"two chosen images of class {ds.classes[y]!r} are named "
                                 f"{target.name!r}: {src!r} cannot be written as class folders")
            target.parent.mkdir(parents=True, exist_ok=True)
            data = ds.source.read(rel)
            target.write_bytes(data)
            digests[rel] = hashlib.sha256(data).hexdigest()
        # the fingerprint of the bytes copied (not read again: an image changed meanwhile
        # cannot slip in under the fingerprint of another)
        record = {**meta, "fingerprint": folder_fingerprint(view, digests=digests)}
        (Path(tmp) / "subset.json").write_text(json.dumps(record, indent=1) + "\n")
        (Path(tmp) / _COMPLETE).write_text(json.dumps(record))
    return root


def _file_sha256(path: Path) -> str | None:
    """The SHA-256 (hex) of a file's bytes; ``None`` when it cannot be read."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


DATASET_MAKERS: Registry[Callable[..., Path]] = Registry("dataset maker")
DATASET_MAKERS.add("digits", make_digits_folder)
DATASET_MAKERS.add("synthetic", make_synthetic_folder)
DATASET_MAKERS.add("hierarchy", make_hierarchy)  # docs/conventions.md#v-0 (uqvision.hierarchy)
DATASET_MAKERS.add("imagenet-c", make_imagenet_c_folder)  # --src DIR (.corruptions)
DATASET_MAKERS.add("subset", make_subset_folder)  # --src DIR --per-class N --seed S
