"""Prediction caches: one netCDF file per (model × dataset × mode × pass).

File contract (readable with plain ``xarray.open_dataset``):

- ``logits`` (sample, class), float32 — or (pass, sample, class) for an MC-dropout cache, whose
  passes share one data loading;
- ``label`` (sample), int64; optional ``embedding`` (sample, feature), ``uncertainty`` (sample)
  (a model's own u, V.4) and ``crop_fraction`` (sample) (the ``crop`` mode's per-sample
  fractions); a zero-shot cache (embeddings of classes the model never saw, V.4) has no
  ``logits``;
- coords ``sample`` (the relative image paths, i.e. the fixed test order), ``class`` (the
  model's classes, the columns of ``logits``: ``label`` indexes them) and, in a cache written by
  ``uqvision predict``, ``in_folder`` (class), int8: 1 for the classes the image folder has (a
  folder may hold a subset of the model's classes, e.g. ImageNet-R's 200 of 1,000);
- attrs: ``kind = "uqvision.prediction_cache"``, ``model``, ``architecture``, ``tag``,
  ``checkpoint_sha256``, ``data_config``, ``dataset``, ``dataset_name``, ``dataset_fingerprint``,
  ``mode`` (plain/tta/mc_dropout/crop), ``pass_index``, ``checksum`` (``uqmetrics.dataset_checksum``
  of the data) and ``complete = 1`` (``uqmetrics.write_dataset``); a cache written by
  ``uqvision predict`` also has ``method`` (the training method of its run, from the
  checkpoint's sidecar; "" for a network uqvision did not train; ``mc_dropout`` for MC-dropout
  passes), ``run`` (the checkpoint's row name), ``sample_index`` (which of the run's
  prediction samples: member, snapshot, posterior draw or stochastic pass; one cache each),
  ``sidecar_sha256`` (of the checkpoint's sidecar, "" without one), ``n_passes``,
  ``tta_policy``, ``amp`` and ``channels_last`` (how the network ran: autocast mode, NHWC
  as 0/1), ``config`` (the prediction options, JSON) and how the labels were made:
  ``folder_classes`` (JSON list of the folder's class names, sorted), ``class_mapping`` —
  ``"name"`` (folder classes matched to the model's class names), ``"folder_order"`` (the model
  records no class names: the folder's sorted classes, as many as its outputs, are taken as
  its classes) or ``"folder"`` (no logits: the folder's own classes) — and
  ``class_names_source`` (``"sidecar"``, ``"imagenet-1k"`` or "").

``uqvision predict`` reuses a complete cache only when its identity
(:data:`uqvision.predict.IDENTITY_FIELDS`) equals the request's; see
:func:`uqvision.predict.check_caches`.

A file without the completeness flag or whose data no longer match its checksum is rejected
(:class:`CacheError`), never scored.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from uqmetrics import IncompleteResultError, dataset_checksum, read_dataset
from uqmetrics.io import READ_ERRORS, xarray_module  # xarray imported on use

if TYPE_CHECKING:
    import xarray as xr

from .exceptions import CacheError, SkippedCacheWarning

__all__ = [
    "CACHE_KIND",
    "CacheError",
    "CacheInfo",
    "cache_dataset",
    "cache_key",
    "check_aligned",
    "find_caches",
    "index_caches",
    "read_cache",
    "safe_name",
]

CACHE_KIND = "uqvision.prediction_cache"
_SAFE = re.compile(r"[^A-Za-z0-9._+-]")


def safe_name(name: str) -> str:
    """``name`` with every character but letters, digits and ``._+-`` replaced by ``+``."""
    return _SAFE.sub("+", name)


def cache_key(model: str, dataset_name: str, mode: str, pass_index: int) -> str:
    """File stem of a cache, e.g. ``resnet50.a1_in1k.val.plain-000``.

    Characters other than letters, digits and ``._+-`` become ``+`` (``tv/x@ckpt`` ->
    ``tv+x+ckpt``); the file itself records the exact names in its attrs.

    Examples
    --------
    >>> cache_key("tv/mobilenet_v3_small@m0", "val", "tta", 3)
    'tv+mobilenet_v3_small+m0.val.tta-003'
    """
    return f"{safe_name(model)}.{safe_name(dataset_name)}.{mode}-{int(pass_index):03d}"


def cache_dataset(logits, labels, *, samples, classes, embedding=None, uncertainty=None,
                  crop_fraction=None, in_folder=None, attrs: dict | None = None) -> xr.Dataset:
    """Build a cache Dataset from arrays (also for logits computed elsewhere).

    Parameters
    ----------
    logits : array_like of float, shape (sample, class) or (pass, sample, class), or None
        None only with an ``embedding`` (zero-shot caches).
    labels : array_like of int, shape (sample,)
    samples : sequence of str, shape (sample,)
        Sample ids in the fixed test order (relative image paths).
    classes : sequence of str, shape (class,)
        The model's classes (``labels`` index them).
    embedding : array_like of float, shape (sample, feature), optional
    uncertainty : array_like of float, shape (sample,), optional
        The model's own uncertainty u (higher = more uncertain).
    crop_fraction : array_like of float, shape (sample,), optional
        Crop fraction of each sample (``crop`` mode).
    in_folder : array_like of int, shape (class,), optional
        1 for each class the image folder has (coordinate ``in_folder``).
    attrs : dict, optional
        Must name at least ``model``, ``dataset_name``, ``mode`` and ``pass_index``; ``kind`` and
        ``checksum`` are added.

    Returns
    -------
    xarray.Dataset
        Ready for ``uqmetrics.write_dataset``.
    """
    if logits is None and embedding is None:
        raise ValueError("logits may be None only when an embedding is given")
    z = np.zeros((0, 0), np.float32) if logits is None else np.asarray(logits, np.float32)
    dims = ("sample", "class") if z.ndim == 2 else ("pass", "sample", "class")
    if z.ndim not in (2, 3):
        raise ValueError(f"logits must have shape (sample, class) or (pass, sample, class), "
                         f"got {z.shape}")
    variables = {"label": ("sample", np.asarray(labels, dtype=np.int64))}
    if logits is not None:
        variables["logits"] = (dims, z)
    if embedding is not None:
        variables["embedding"] = (("sample", "feature"), np.asarray(embedding, np.float32))
    for key, value in (("uncertainty", uncertainty), ("crop_fraction", crop_fraction)):
        if value is not None:
            variables[key] = ("sample", np.asarray(value, np.float32))
    coords = {"sample": np.array(list(samples), dtype=object),
              "class": np.array(list(classes), dtype=object)}
    if in_folder is not None:
        coords["in_folder"] = ("class", np.asarray(in_folder, dtype=np.int8))
    if z.ndim == 3:
        coords["pass"] = np.arange(z.shape[0])
    ds = xarray_module().Dataset(variables, coords=coords)
    attrs = dict(attrs or {})
    missing = {"model", "dataset_name", "mode", "pass_index"} - set(attrs)
    if missing:
        raise ValueError(f"attrs must name {sorted(missing)}")
    ds.attrs = {**attrs, "kind": CACHE_KIND, "checksum": dataset_checksum(ds)}
    return ds


def read_cache(path: str | os.PathLike) -> xr.Dataset:
    """Load a cache fully, verifying completeness flag, kind, variables and checksum.

    Raises
    ------
    FileNotFoundError
    CacheError
        Partial/corrupt file, a file that is not a prediction cache, or data that do not match
        the recorded checksum (the cache's ``checksum``, or the per-variable checksums every
        result file records, :data:`uqmetrics.io.CHECKSUM_ATTR`); its ``__cause__`` is the
        :class:`uqmetrics.IncompleteResultError` of an unreadable or unfinished file
        (:class:`uqmetrics.io.CorruptResultError` for data that changed on disk).
    """
    try:
        ds = read_dataset(path)
    except IncompleteResultError as exc:
        raise CacheError(str(exc)) from exc
    if ds.attrs.get("kind") != CACHE_KIND:
        raise CacheError(f"{path} is not a uqvision prediction cache (kind="
                         f"{ds.attrs.get('kind')!r})")
    missing = [v for v in ("label",) if v not in ds] + (
        [] if "logits" in ds or "embedding" in ds else ["logits"])
    if missing:
        raise CacheError(f"{path} lacks variables {missing}")
    recorded = ds.attrs.get("checksum")
    if recorded is None or dataset_checksum(ds) != recorded:
        raise CacheError(f"{path}: data do not match the recorded checksum (corrupt cache); "
                         "to recompute it, delete the file or pass --overwrite (a plain rerun "
                         "keeps it)")
    return ds


@dataclass(frozen=True)
class CacheInfo:
    """What an index knows about a cache without loading its arrays."""

    path: Path
    model: str
    dataset_name: str
    mode: str
    pass_index: int
    n_passes: int
    method: str = ""
    run: str = ""
    sample_index: int = 0


def find_caches(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Expand files and directories (``*.nc`` inside, sorted) into a list of files."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(q for q in p.glob("*.nc") if not q.name.startswith(".")))
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"cache path {str(p)!r} does not exist")
    return out


def index_caches(paths: Iterable[str | os.PathLike]) -> list[CacheInfo]:
    """Index cache files by their attrs; partial or foreign files are skipped with a
    :class:`~uqvision.exceptions.SkippedCacheWarning`.

    Only the headers are read (arrays are loaded later by :func:`read_cache`, which also checks
    the checksum).
    """
    infos = []
    for p in find_caches(paths):
        try:
            with xarray_module().open_dataset(p, engine="netcdf4") as ds:
                a = dict(ds.attrs)
                n_passes = int(ds.sizes.get("pass", 1))
        except READ_ERRORS as exc:  # an attribute netCDF cannot open: AttributeError
            warnings.warn(f"skipping unreadable cache {p}: {' '.join(str(exc).split())}",
                          SkippedCacheWarning, stacklevel=2)
            continue
        try:  # attrs damaged on disk (a flipped byte in a name or a number) read as absent
            info = None
            if a.get("kind") == CACHE_KIND and int(a.get("complete", 0)) == 1:
                info = CacheInfo(p, str(a["model"]), str(a["dataset_name"]), str(a["mode"]),
                                 int(a["pass_index"]), n_passes, str(a.get("method", "")),
                                 str(a.get("run", a["model"])), int(a.get("sample_index", 0)))
        except (KeyError, TypeError, ValueError):
            info = None
        if info is None:
            warnings.warn(f"skipping {p}: not a complete uqvision prediction cache",
                          SkippedCacheWarning, stacklevel=2)
            continue
        infos.append(info)
    return infos


def check_aligned(caches: Sequence[xr.Dataset], names: Sequence[str] | None = None) -> None:
    """Raise :class:`CacheError` unless all caches share classes, sample order and labels.

    Parameters
    ----------
    caches : sequence of xarray.Dataset
        Loaded caches (e.g. ensemble members).
    names : sequence of str, optional
        How to call them in the error (default: their ``model`` attr).
    """
    if not caches:
        raise CacheError("no caches given")
    names = list(names) if names is not None else [str(c.attrs.get("model", i))
                                                   for i, c in enumerate(caches)]
    ref, ref_name = caches[0], names[0]
    for c, name in zip(caches[1:], names[1:], strict=True):
        if c.sizes["class"] != ref.sizes["class"] or not np.array_equal(c["class"].values,
                                                                        ref["class"].values):
            raise CacheError(f"cache {name!r} has {c.sizes['class']} classes, {ref_name!r} has "
                             f"{ref.sizes['class']} (or a different class order)")
        if c.sizes["sample"] != ref.sizes["sample"] or not np.array_equal(
                c["sample"].values, ref["sample"].values):
            raise CacheError(f"cache {name!r} has a different sample order or count "
                             f"({c.sizes['sample']}) than {ref_name!r} ({ref.sizes['sample']})")
        if not np.array_equal(c["label"].values, ref["label"].values):
            raise CacheError(f"cache {name!r} has different labels than {ref_name!r}")


def select_dataset(infos: list[CacheInfo], dataset: str | None) -> list[CacheInfo]:
    """The caches of one dataset (``dataset`` required when several are present)."""
    names = sorted({i.dataset_name for i in infos})
    if not names:
        raise ValueError("no complete prediction cache found")
    if dataset is None:
        if len(names) > 1:
            raise ValueError(f"caches of several datasets {names}; choose one (--dataset)")
        dataset = names[0]
    if dataset not in names:
        raise ValueError(f"no cache of dataset {dataset!r}; found {names}")
    return [i for i in infos if i.dataset_name == dataset]
