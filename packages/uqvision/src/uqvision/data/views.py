"""Views over an image folder without copies: :class:`ClassSubset` (a class subset, labels
re-indexed or grouped, optionally restricted to the positions of an index file) and
:func:`image_view`; the index files' format (:data:`INDEX_FORMAT`) and reader
(:func:`read_index_file`). The files are written by UIMNET's 90/10 in-domain split
(:func:`uqvision.protocols.uimnet.index.make_index_files`); any training run reads them
(``uqvision train --index-file``).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from typing import Any

from torch.utils.data import Dataset

from ._util import read_format_json
from .folders import ImageFolderDataset

__all__ = ["INDEX_FORMAT", "ClassSubset", "image_view", "read_index_file"]

#: Format of the index files of :func:`uqvision.protocols.uimnet.index.make_index_files`.
INDEX_FORMAT = {"format": "uqvision.uimnet_index", "format_version": 1}


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
    positions of an index file of :func:`uqvision.protocols.uimnet.index.make_index_files`
    (whose classes must be the view's folder classes, in order).

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


def read_index_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read an index file of :func:`uqvision.protocols.uimnet.index.make_index_files`."""
    return read_format_json(path, INDEX_FORMAT)
