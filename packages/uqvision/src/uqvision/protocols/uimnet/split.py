"""The UIMNET in/out-domain class split (docs/conventions.md#v-3) and its data views.

1. :func:`class_means` — per-class mean penultimate features of a feature cache.
2. :func:`ward_split` — Ward agglomerative clustering (scipy) of the class means; the classes
   under the root's left child are in-domain, an equal number under the right child
   out-domain (:data:`SPLIT_RULE`).
3. :func:`write_split` / :func:`read_split` — a versioned JSON of class names, the feature
   source's checksum, the linkage and the rule.
4. :class:`ClassSubset` — a class-subset view of an :class:`~uqvision.data.ImageFolderDataset`
   (labels re-indexed to the subset; optional sample indices; no copies of images),
   :func:`image_view` (a folder, or its view by classes and index file: what
   :func:`uqvision.train.train_model` trains on) and :func:`make_index_files` — seeded 90/10
   in-domain train/val index files.

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

import copy
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.cluster import hierarchy as sch
from torch.utils.data import Dataset

from .data import ImageFolderDataset

__all__ = [
    "SPLIT_FORMAT",
    "SPLIT_RULE",
    "ClassSubset",
    "class_means",
    "embeddings_from_caches",
    "image_view",
    "make_index_files",
    "read_index_file",
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
INDEX_FORMAT = {"format": "uqvision.uimnet_index", "format_version": 1}


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
    from .cache import find_caches, read_cache

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


def _write_json(obj: dict[str, Any], out: str | os.PathLike) -> Path:
    """Write ``obj`` as JSON atomically (a temporary file beside ``out``, then renamed)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, out)
    return out


def _read_json(path: str | os.PathLike, fmt: dict[str, Any]) -> dict[str, Any]:
    """Read a JSON file; ``ValueError`` unless its format and version are ``fmt``'s."""
    meta = json.loads(Path(path).read_text())
    if any(meta.get(k) != v for k, v in fmt.items()):
        raise ValueError(f"{str(path)!r} is not a {fmt} file")
    return meta


def write_split(split: dict[str, Any], out: str | os.PathLike) -> Path:
    """Write a split (from :func:`ward_split`) as versioned JSON, atomically."""
    return _write_json({**SPLIT_FORMAT, **split}, out)


def read_split(path: str | os.PathLike) -> dict[str, Any]:
    """Read a split file; ``ValueError`` if it is not one of a version this code reads."""
    return _read_json(path, SPLIT_FORMAT)


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
        paths[name] = _write_json({**INDEX_FORMAT, "seed": seed, "part": name,
                                   "val_fraction": val_fraction, "classes": list(classes),
                                   "indices": idx, "samples": [ids[i] for i in idx]},
                                  Path(out_dir) / f"seed{seed}.{name}.json")
    return paths


def read_index_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read an index file of :func:`make_index_files`."""
    return _read_json(path, INDEX_FORMAT)
