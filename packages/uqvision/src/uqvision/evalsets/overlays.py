"""Label overlays, applied at scoring time: relabellings (ImageNet ReaL) are not folders but
overlays on a cache, keyed by sample id (a cache's ``sample`` coordinate, the relative image
path). :class:`Overlay` holds each sample's set of valid labels (possibly empty: no valid
label), :func:`read_overlay` reads it from a JSON file (:data:`OVERLAY_KIND`,
:func:`write_overlay` writes it), :func:`real_overlay` from ReaL's ``real.json``,
:func:`apply_overlay` adds it to a cache as ``label_set`` (sample, class) and
:func:`overlay_correct` says which top-1 predictions it counts as correct. The evaluation set
of such a folder has the role ``relabelled`` (:mod:`uqvision.evalsets.sets`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np
from uqmetrics import InputError, dataset_checksum

from .sets import _some

if TYPE_CHECKING:
    import xarray as xr

__all__ = [
    "OVERLAY_KIND",
    "Overlay",
    "apply_overlay",
    "overlay_correct",
    "read_overlay",
    "real_overlay",
    "write_overlay",
]

#: The ``kind`` of an overlay file (:func:`read_overlay`).
OVERLAY_KIND = "uqvision.label_overlay"


def _label_tuple(value: Any, where: str) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise TypeError(f"{where} must be a list of class indices, got {value!r}")
    out = []
    for v in value:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{where} must hold class indices (integers >= 0), got {v!r}")
        out.append(int(v))
    return tuple(sorted(set(out)))


@dataclass(frozen=True)
class Overlay:
    """Labels that replace a cache's at scoring time: each sample's set of valid classes.

    Attributes
    ----------
    name : str
        E.g. ``imagenet-real`` (recorded by :func:`apply_overlay`).
    labels : mapping str -> tuple of int
        Sample id (a cache's ``sample`` coordinate) -> the indices of its valid classes among
        the cache's classes, sorted, without repeats; empty: the sample has no valid label.
    classes : tuple of str or None
        The class names the indices refer to, checked against the cache's ``class``
        coordinate (``None``: not checked).
    """

    name: str
    labels: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    classes: tuple[str, ...] | None = None

    def __post_init__(self):
        if not isinstance(self.labels, Mapping):
            raise TypeError(f"labels must be a mapping sample id -> class indices, got "
                             f"{type(self.labels).__name__}")
        labels = {str(k): _label_tuple(v, f"labels[{k!r}]") for k, v in self.labels.items()}
        object.__setattr__(self, "labels", MappingProxyType(labels))
        if self.classes is not None:
            object.__setattr__(self, "classes", tuple(str(c) for c in self.classes))


def read_overlay(path: str | os.PathLike) -> Overlay:
    """Read an overlay file: JSON ``{"kind": "uqvision.label_overlay", "name": ...,
    "classes": [...] or null, "labels": {sample id: [class index, ...]}}``
    (:func:`write_overlay`).

    Raises
    ------
    FileNotFoundError
    uqmetrics.InputError
        Not JSON, another kind, or a malformed entry (the message names the file and it).
    """
    p = Path(path)
    data = _json(p, "overlay file")
    if not isinstance(data, dict) or data.get("kind") != OVERLAY_KIND:
        got = data.get("kind") if isinstance(data, dict) else type(data).__name__
        raise InputError(f"overlay file {str(p)!r} is not a label overlay (kind must be "
                         f"{OVERLAY_KIND!r}, got {got!r})")
    name = data.get("name", p.stem)
    if not isinstance(name, str) or not name:
        raise InputError(f"overlay file {str(p)!r}: name must be a non-empty string, got "
                         f"{name!r}")
    try:
        return Overlay(name, data.get("labels"), data.get("classes"))
    except (TypeError, ValueError) as exc:
        raise InputError(f"overlay file {str(p)!r}: {exc}") from None


def _json(path: Path, what: str) -> Any:
    """The JSON value of file ``path``; :class:`uqmetrics.InputError` naming ``what`` and the
    file for anything else (not UTF-8, malformed or nested too deep to decode)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError, JSONDecodeError
        why = "nested too deeply" if isinstance(exc, RecursionError) else " ".join(
            str(exc).split())
        raise InputError(f"{what} {str(path)!r} is not JSON: {why}") from None


def write_overlay(overlay: Overlay, path: str | os.PathLike) -> Path:
    """Write ``overlay`` as the JSON :func:`read_overlay` reads; returns the path."""
    p = Path(path)
    p.write_text(json.dumps({
        "kind": OVERLAY_KIND, "name": overlay.name,
        "classes": None if overlay.classes is None else list(overlay.classes),
        "labels": {k: list(v) for k, v in overlay.labels.items()}}), encoding="utf-8")
    return p


def real_overlay(path: str | os.PathLike, sample_ids: Sequence[str], *,
                 name: str = "imagenet-real") -> Overlay:
    """The ReaL labels (Beyer et al. 2020) of ``sample_ids`` from ReaL's ``real.json``.

    ``real.json`` is a list of 50,000 lists of ImageNet-1k class indices (empty: no valid
    label), entry ``i`` for ``ILSVRC2012_val_<i+1, 8 digits>.JPEG``; each sample id is matched
    by its file name (``n01440764/ILSVRC2012_val_00000293.JPEG`` or the flat name). Sample ids
    that name no validation image are left out (:func:`apply_overlay` then refuses them).

    Parameters
    ----------
    path : path
        ``real.json``.
    sample_ids : sequence of str, shape (n_samples,)
        A cache's ``sample`` coordinate.
    name : str
        The overlay's name.

    Raises
    ------
    uqmetrics.InputError
        A file that is not a JSON list of lists of class indices, or that labels none of
        ``sample_ids`` (the message names the file).
    """
    p = Path(path)
    data = _json(p, "ReaL file")
    if not isinstance(data, list):
        raise InputError(f"ReaL file {str(p)!r} must hold a list of label lists, got "
                         f"{type(data).__name__}")
    labels = {}
    for sid in sample_ids:
        stem = PurePosixPath(str(sid)).name
        prefix, _, number = stem.partition("ILSVRC2012_val_")
        digits = number.split(".")[0]
        if prefix or len(digits) != 8 or not digits.isdigit():
            continue
        i = int(digits) - 1
        if 0 <= i < len(data):
            try:
                labels[str(sid)] = _label_tuple(data[i], f"entry {i} of {str(p)!r}")
            except (TypeError, ValueError) as exc:
                raise InputError(f"ReaL file: {exc}") from None
    if sample_ids and not labels:
        raise InputError(f"ReaL file {str(p)!r} ({len(data)} entries) labels none of the "
                         f"{len(sample_ids)} samples (ImageNet validation images are named "
                         f"ILSVRC2012_val_<8 digits>; e.g. {str(sample_ids[0])!r}): it is not "
                         "their ReaL labels")
    return Overlay(name, labels)


def apply_overlay(cache: xr.Dataset, overlay: Overlay, *,
                  drop_missing: bool = False) -> xr.Dataset:
    """``cache`` with the overlay's labels as ``label_set`` (sample, class), bool.

    Parameters
    ----------
    cache : xarray.Dataset
        A prediction cache (``sample`` and ``class`` coordinates).
    overlay : Overlay
    drop_missing : bool
        Leave out the samples the overlay has no entry for (counted in the attr
        ``overlay_n_dropped``); without it they are an error.

    Returns
    -------
    xarray.Dataset
        A copy (of the samples kept) with ``label_set``: True where the class is a valid label
        of the sample (a row of False: no valid label); attrs ``overlay``,
        ``overlay_n_dropped``, ``overlay_n_unlabelled`` added and ``checksum`` recomputed.

    Raises
    ------
    uqmetrics.InputError
        Samples the overlay lacks (named, without ``drop_missing``), an overlay whose
        ``classes`` are not the cache's, or a class index beyond the cache's classes.
    """
    samples = [str(s) for s in cache["sample"].values]
    classes = [str(c) for c in cache["class"].values]
    if overlay.classes is not None and list(overlay.classes) != classes:
        raise InputError(f"overlay {overlay.name!r} is of {len(overlay.classes)} classes "
                         f"{_some(overlay.classes, 4)} but the cache has {len(classes)} "
                         f"{_some(classes, 4)} (or another order)")
    missing = [s for s in samples if s not in overlay.labels]
    if missing and not drop_missing:
        raise InputError(f"overlay {overlay.name!r} has no labels for {len(missing)} of the "
                         f"cache's {len(samples)} samples: {_some(missing, 5)}; pass "
                         "drop_missing=True to leave them out")
    keep = [s for s in samples if s in overlay.labels]
    out = cache.sel(sample=keep) if missing else cache.copy()
    mask = np.zeros((len(keep), len(classes)), dtype=bool)
    for i, s in enumerate(keep):
        idx = overlay.labels[s]
        if idx and idx[-1] >= len(classes):
            raise InputError(f"overlay {overlay.name!r} gives sample {s!r} class index "
                             f"{idx[-1]}, but the cache has {len(classes)} classes")
        mask[i, list(idx)] = True
    out["label_set"] = (("sample", "class"), mask)
    out.attrs = {**cache.attrs, "overlay": overlay.name, "overlay_n_dropped": len(missing),
                 "overlay_n_unlabelled": int((~mask.any(axis=1)).sum())}
    out.attrs["checksum"] = dataset_checksum(out)
    return out


def overlay_correct(cache: xr.Dataset,
                    predicted: Sequence[int] | np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Top-1 correctness under an overlay (:func:`apply_overlay`).

    Parameters
    ----------
    cache : xarray.Dataset
        With ``label_set`` (sample, class).
    predicted : array_like of int, shape (sample,), optional
        Predicted class indices (default: the argmax of ``logits`` (sample, class); a cache of
        several passes needs them given).

    Returns
    -------
    correct : ndarray of bool, shape (sample,)
        The prediction is one of the sample's valid labels (False without any).
    labelled : ndarray of bool, shape (sample,)
        The sample has at least one valid label (ReaL accuracy is the mean of ``correct``
        over these).

    Raises
    ------
    ValueError
        No ``label_set``; no ``predicted`` for a cache without 2-D logits; a predicted index
        out of range or of another length.
    """
    if "label_set" not in cache:
        raise ValueError("cache has no label_set: apply an overlay first (apply_overlay)")
    mask = np.asarray(cache["label_set"].values, dtype=bool)
    if predicted is None:
        if "logits" not in cache or cache["logits"].dims != ("sample", "class"):
            raise ValueError("predicted is needed for a cache without logits (sample, class)")
        predicted = np.asarray(cache["logits"].values).argmax(axis=1)
    pred = np.asarray(predicted)
    if pred.shape != (mask.shape[0],) or pred.dtype.kind not in "iu" or (
            pred.size and not (0 <= pred.min() and pred.max() < mask.shape[1])):
        raise ValueError(f"predicted must be {mask.shape[0]} class indices in [0, "
                         f"{mask.shape[1]}), got shape {pred.shape}, dtype {pred.dtype}")
    correct = mask[np.arange(mask.shape[0]), pred]
    return correct, mask.any(axis=1)
