"""UIMNET's 90/10 in-domain split as index files (V.3): :func:`make_index_files` writes, per
data seed, the training and validation positions of the in-domain classes of a training
folder; nothing is copied. Their format (:data:`uqvision.data.INDEX_FORMAT`) and reader
(:func:`uqvision.data.read_index_file`, :func:`uqvision.data.image_view`) are data machinery,
read by any training run (``uqvision train --index-file``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ...data import INDEX_FORMAT, ClassSubset, ImageFolderDataset, write_format_json

__all__ = ["make_index_files"]


def make_index_files(root: str | os.PathLike | ImageFolderDataset, classes: Sequence[str],
                     out_dir: str | os.PathLike, *, seed: int, val_fraction: float = 0.1
                     ) -> dict[str, Path]:
    """Seeded train/val index files of the in-domain part of a training folder.

    Per class, ``round(val_fraction * n_c)`` (at least 1) images go to validation, the rest
    to training, chosen by ``numpy.random.default_rng(seed)``. Files hold sample ids and their
    positions in ``ClassSubset(ImageFolderDataset(root), classes)``; nothing is copied.
    ``root`` may be the folder already scanned (an :class:`~uqvision.data.ImageFolderDataset`).

    Returns
    -------
    dict
        ``{"train": path, "val": path}`` (``<out_dir>/seed<seed>.{train,val}.json``).
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}")
    base = root if isinstance(root, ImageFolderDataset) else ImageFolderDataset(root)
    view = ClassSubset(base, classes)
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
