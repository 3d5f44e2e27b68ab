"""Ground truth the ``hierarchy`` set gives the disentanglement protocol (docs/conventions.md#v-0):
every image's exact label distribution and its entropy, the true aleatoric uncertainty
(:func:`read_label_distributions`), and nested, class-stratified training subsets for the
epistemic truth of training-set size (:func:`stratified_subset`; Mucsányi, Kirchhof & Oh 2024,
"Benchmarking Uncertainty Disentanglement: Specialized Uncertainties for Specialized Tasks",
train on 10 %, 50 % and 100 %).
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from uqmetrics import InputError

from .dataset import MIXED, SPLITS, read_hierarchy

__all__ = ["LabelDistributions", "read_label_distributions", "stratified_subset"]

#: Stream tag of :func:`stratified_subset` (``default_rng([seed, tag, class])``).
_SUBSET_STREAM = 6


@dataclass(frozen=True, eq=False)
class LabelDistributions:
    """The exact label distribution of every image of one split, in ImageFolder order.

    Attributes
    ----------
    files : tuple of str, shape (n,)
        Sample ids (``<class>/<file>.png`` relative to the split folder), sorted by class index
        then id: the order of :class:`uqvision.data.ImageFolderDataset` over the split.
    labels : numpy.ndarray of int, shape (n,)
        Class index of the folder each image is filed in (its drawn label).
    probs : numpy.ndarray of float64, shape (n, n_classes)
        Label distribution of each image; rows sum to 1. One-hot for a plain image,
        ``alpha`` and ``1 - alpha`` on ``class_a`` and ``class_b`` for a blend.
    entropy : numpy.ndarray of float64, shape (n,)
        Shannon entropy of each row of ``probs`` in nats (``0 log 0 = 0``): the true aleatoric
        uncertainty, in [0, log 2].
    """

    files: tuple[str, ...]
    labels: np.ndarray
    probs: np.ndarray
    entropy: np.ndarray

    @property
    def blended(self) -> np.ndarray:
        """Whether each image's label distribution is not one-hot, shape (n,), bool."""
        return self.entropy > 0


def _scan(folder: Path, classes: tuple[str, ...]) -> list[str]:
    """The PNG sample ids of a class-folder split in ImageFolder order (class, then id)."""
    return [f"{c}/{p.name}" for c in classes if (folder / c).is_dir()
            for p in sorted((folder / c).iterdir(), key=lambda p: p.name)
            if p.suffix == ".png" and p.is_file()]


def read_label_distributions(root: str | os.PathLike, split: str = "test") -> LabelDistributions:
    """Read the exact label distribution of every image of a split of a ``hierarchy`` set.

    A set made with ``ambiguity > 0`` records them in ``<split>/label_distributions.csv``; a set
    without that file (the default, ``ambiguity = 0``, and every set written before the option)
    has a one-hot distribution on each image's folder class. ``mixed`` reads
    ``mixed/soft_labels.csv``.

    Parameters
    ----------
    root : str or path-like
        A folder written by :func:`uqvision.hierarchy.make_hierarchy`.
    split : {"train", "val", "test", "mixed"}, default "test"

    Returns
    -------
    LabelDistributions
        ``probs`` of shape (n, n_classes) and ``entropy`` of shape (n,), aligned with
        :class:`uqvision.data.ImageFolderDataset` over ``root/<split>``.

    Raises
    ------
    uqmetrics.InputError
        ``split`` unknown, or the recorded files are not the images in the split folder.
    FileNotFoundError, ValueError
        ``root`` is not a hierarchy folder (:func:`uqvision.hierarchy.read_hierarchy`).
    """
    if split not in (*SPLITS, MIXED):
        raise InputError(f"split must be one of {', '.join((*SPLITS, MIXED))}, got {split!r}")
    info = read_hierarchy(root)
    folder = info.splits[split]
    index = {c: i for i, c in enumerate(info.classes)}
    files = _scan(folder, info.classes)
    csv_path = (folder / "soft_labels.csv" if split == MIXED
                else info.root / info.meta["label_distributions"][split]
                if "label_distributions" in info.meta else None)
    probs = np.zeros((len(files), len(info.classes)))
    rows = np.arange(len(files))
    labels = np.array([index[f.split("/", 1)[0]] for f in files], dtype=np.int64)
    if csv_path is None:
        probs[rows, labels] = 1.0
    else:
        with open(csv_path, newline="") as f:
            recorded = {r["file"]: r for r in csv.DictReader(f)}
        if set(recorded) != set(files):
            extra = sorted(set(recorded).symmetric_difference(files))
            raise InputError(f"{str(csv_path)!r} does not list exactly the images of "
                             f"{str(folder)!r}: {len(extra)} differ, e.g. {extra[0]!r}")
        rec = [recorded[f] for f in files]
        alpha = np.array([float(r["alpha"]) for r in rec])
        probs[rows, [index[r["class_a"]] for r in rec]] += alpha
        probs[rows, [index[r["class_b"]] for r in rec]] += 1.0 - alpha
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = -np.where(probs > 0, probs * np.log(probs), 0.0).sum(1)
    return LabelDistributions(tuple(files), labels, probs, entropy + 0.0)


def stratified_subset(labels, fraction: float, *, seed: int = 0) -> np.ndarray:
    """A seeded, class-stratified, nested subset of a split: the training-set sizes of the
    epistemic truth.

    Every class ``c`` draws one permutation of its samples from its own stream
    ``numpy.random.default_rng([seed, 6, c])`` and keeps its first
    ``max(1, floor(fraction * n_c + 1/2))``; the permutation does not depend on ``fraction``,
    so for one seed the subsets are nested (10 % ⊂ 50 % ⊂ 100 %, the whole split).

    Parameters
    ----------
    labels : array-like of int, shape (n,)
        Class index of every sample of the split (``ImageFolderDataset(...).targets``).
    fraction : float
        In (0, 1].
    seed : int, default 0

    Returns
    -------
    numpy.ndarray of int64, shape (m,)
        Indices into ``labels`` (the split's ImageFolder order), ascending.

    Raises
    ------
    uqmetrics.InputError
        ``fraction`` outside (0, 1], ``labels`` not a 1-d array of non-negative ints, or
        ``seed`` negative.

    Examples
    --------
    >>> y = np.repeat(np.arange(3), 10)
    >>> len(stratified_subset(y, 0.1)), len(stratified_subset(y, 0.5)), len(stratified_subset(y, 1))
    (3, 15, 30)
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float, np.integer,
                                                               np.floating)) \
            or not 0.0 < float(fraction) <= 1.0:
        raise InputError(f"fraction must be in (0, 1], got {fraction!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a non-negative int, got {seed!r}")
    y = np.asarray(labels)
    if y.ndim != 1 or (y.size and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0)):
        raise InputError(f"labels must be a 1-d array of non-negative class indices, got "
                         f"shape {y.shape} dtype {y.dtype}")
    keep = []
    for c in np.unique(y):
        members = np.flatnonzero(y == c)
        order = np.random.default_rng([int(seed), _SUBSET_STREAM, int(c)]).permutation(members)
        keep.append(order[:max(1, math.floor(float(fraction) * len(members) + 0.5))])
    return np.sort(np.concatenate(keep)).astype(np.int64) if keep else np.zeros(0, np.int64)
