"""The UIMNET in/out-domain class split (docs/conventions.md#v-3) and its data views.

1. :func:`class_means` — per-class mean penultimate features of a feature cache.
2. :func:`ward_split` — Ward agglomerative clustering (scipy) of the class means; the classes
   under the root's left child are in-domain, an equal number under the right child
   out-domain (:data:`SPLIT_RULE`).
3. :func:`write_split` / :func:`read_split` — a versioned JSON of class names, the feature
   source's checksum, the linkage and the rule.
The class-subset views and the index files' reader (:class:`~uqvision.data.ClassSubset`,
:func:`~uqvision.data.image_view`, :func:`~uqvision.data.read_index_file`) are data machinery
shared by the training loop (:mod:`uqvision.data.views`); the 90/10 index files themselves are
written by :func:`~.index.make_index_files`.

Examples
--------
>>> split = ward_split([[0.0], [0.1], [5.0], [5.2], [5.1]], ["a", "b", "c", "d", "e"])
>>> split["left_size"], split["right_size"], split["in_classes"], split["out_classes"]
(2, 3, ['a', 'b'], ['d', 'c'])

References
----------
.. [1] Bouchacourt et al. UIMNET: Uncertainty in ImageNet, "ImageNot" split, Section 2.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.cluster import hierarchy as sch

from ...cache import find_caches, read_cache
from ...data import read_format_json, write_format_json

__all__ = [
    "SPLIT_FORMAT",
    "SPLIT_RULE",
    "class_means",
    "embeddings_from_caches",
    "read_split",
    "split_from_caches",
    "ward_split",
    "write_split",
]

SPLIT_FORMAT = {"format": "uqvision.uimnet_split", "format_version": 1}
SPLIT_RULE = (
    "Ward linkage (scipy.cluster.hierarchy.linkage, method='ward', Euclidean) of per-class mean "
    "features; left/right = the root's children as scipy.cluster.hierarchy.to_tree orders them; "
    "leaves of each child in pre-order (dendrogram order); n = min(|left|, |right|); in-domain = "
    "the first n leaves of the left child, out-domain = the first n leaves of the right child "
    "(when the right child is the smaller one, in-domain is truncated to its size, so the two "
    "sets always have equal counts and are disjoint)")


def class_means(embeddings: Any, labels: Any, n_classes: int) -> np.ndarray:
    """Mean feature of each class.

    Parameters
    ----------
    embeddings : array_like of float, shape (n_samples, n_features)
    labels : array_like of int, shape (n_samples,)
    n_classes : int

    Returns
    -------
    numpy.ndarray, shape (n_classes, n_features)

    Raises
    ------
    ValueError
        A class has no sample, or the shapes disagree.
    """
    x = np.asarray(embeddings, dtype=np.float64)
    y = np.asarray(labels)
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise ValueError(f"embeddings must be (n_samples, n_features) and labels (n_samples,), "
                         f"got {x.shape} and {y.shape}")
    counts = np.bincount(y, minlength=n_classes)
    if len(counts) != n_classes or (counts == 0).any():
        raise ValueError(f"labels must cover every class in [0, {n_classes}); counts {counts}")
    sums = np.zeros((n_classes, x.shape[1]))
    np.add.at(sums, y, x)
    return sums / counts[:, None]


def ward_split(means: Any, classes: Sequence[str]) -> dict[str, Any]:
    """The in/out class split of :data:`SPLIT_RULE`.

    Parameters
    ----------
    means : array_like of float, shape (n_classes, n_features)
        Per-class mean features (:func:`class_means`).
    classes : sequence of str, shape (n_classes,)

    Returns
    -------
    dict
        ``in_classes``, ``out_classes`` (names), ``linkage`` (the scipy linkage matrix as a
        list of rows), ``left_size``/``right_size`` (leaves under each child of the root) and
        ``rule``.
    """
    m = np.asarray(means, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != len(classes) or m.shape[0] < 2:
        raise ValueError(f"means must be (n_classes >= 2, n_features) matching {len(classes)} "
                         f"classes, got shape {m.shape}")
    z = sch.linkage(m, method="ward")
    root = sch.to_tree(z)
    left, right = root.get_left().pre_order(), root.get_right().pre_order()
    n = min(len(left), len(right))
    return {
        "in_classes": [classes[i] for i in left[:n]],
        "out_classes": [classes[i] for i in right[:n]],
        "left_size": len(left),
        "right_size": len(right),
        "linkage": z.tolist(),
        "rule": SPLIT_RULE,
    }


def embeddings_from_caches(paths: Sequence[str | os.PathLike]):
    """Embeddings, labels, class names and a checksum of the feature source.

    Parameters
    ----------
    paths : sequence of path
        Prediction caches (:func:`uqvision.cache.read_cache`) holding an ``embedding`` variable
        (concatenated in the order given; their class lists must agree).

    Returns
    -------
    embeddings : numpy.ndarray, shape (n_samples, n_features)
    labels : numpy.ndarray of int, shape (n_samples,)
    classes : list of str
    checksum : str
        sha256 over the caches' recorded checksums, in order.
    """
    files = find_caches(paths)
    if not files:
        raise ValueError(f"embeddings: no prediction cache found in {list(map(str, paths))}")
    xs, ys, classes, digest = [], [], None, hashlib.sha256()
    for f in files:
        ds = read_cache(f)
        if "embedding" not in ds:
            raise ValueError(f"embeddings: cache {str(f)!r} has no 'embedding' variable "
                             "(predict with embeddings)")
        names = [str(c) for c in ds["class"].values]
        if classes is not None and names != classes:
            raise ValueError(f"embeddings: cache {str(f)!r} has other classes than the first")
        classes = names
        xs.append(ds["embedding"].values)
        ys.append(ds["label"].values)
        digest.update(str(ds.attrs["checksum"]).encode())
    return np.concatenate(xs), np.concatenate(ys), classes, digest.hexdigest()


def split_from_caches(paths: Sequence[str | os.PathLike]) -> dict[str, Any]:
    """:func:`ward_split` of the class means of the caches' embeddings, with the source
    recorded (``feature_checksum``, ``feature_caches``, ``classes``)."""
    x, y, classes, checksum = embeddings_from_caches(paths)
    split = ward_split(class_means(x, y, len(classes)), classes)
    return {**split, "classes": classes, "feature_checksum": checksum,
            "feature_caches": [str(p) for p in paths]}


def write_split(split: dict[str, Any], out: str | os.PathLike) -> Path:
    """Write a split (from :func:`ward_split`) as versioned JSON, atomically."""
    return write_format_json({**SPLIT_FORMAT, **split}, out)


def read_split(path: str | os.PathLike) -> dict[str, Any]:
    """Read a split file; ``ValueError`` if it is not one of a version this code reads."""
    return read_format_json(path, SPLIT_FORMAT)


