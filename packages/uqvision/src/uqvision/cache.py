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
  ``sidecar_sha256`` (of the checkpoint's sidecar, "" without one),
  ``train_data_fingerprint`` (of the folder its samples' BatchNorm statistics were recomputed
  on, SWAG and K-FAC Laplace; "" when none was read), ``n_passes``,
  ``tta_policy``, ``amp`` and ``channels_last`` (how the network ran: autocast mode, NHWC
  as 0/1), ``config`` (the prediction options, JSON) and how the labels were made:
  ``folder_classes`` (JSON list of the folder's class names, sorted), ``class_mapping`` —
  ``"name"`` (folder classes matched to the model's class names), ``"folder_order"`` (the model
  records no class names: the folder's sorted classes, as many as its outputs, are taken as
  its classes) or ``"folder"`` (no logits: the folder's own classes) — and
  ``class_names_source`` (``"sidecar"``, ``"imagenet-1k"``, ``"model_classes"``: those of its
  in-distribution folder, given with the prediction options, or ""); ``class_mapping`` is
  ``"index"`` for a folder whose classes are the model's class indices and ``"none"`` for an
  OOD folder (every label -1), by the evaluation set's class map;
- the evaluation set (:mod:`uqvision.evalsets`): ``eval_set`` (its registry name), ``role``
  (clean/shifted/ood/relabelled) and, for a member of an expanded set, ``eval_member`` and
  ``corruption``/``severity`` where it has them; a cache without them is of the generic
  ``folder`` set, role ``clean`` (:func:`uqvision.evalsets.cache_eval_set`);
- one class space per model: every cache of a model holds the same ``class`` coordinate (a
  model that records no class names takes them from its in-distribution folder, never from an
  OOD folder); scorers refuse a model's caches in two class spaces, naming both files
  (:func:`uqvision.predictors.read_cache_groups`);
- extra variables (``cache_dataset(extra=...)``, e.g. ``head_weight`` (class, feature)): data
  variables like the others, covered by the checksum and listed in the attr
  ``extra_variables`` (JSON list; absent: none). A run that needs one does not reuse a cache
  that lacks it (:func:`missing_variables`, :func:`uqvision.predict.check_caches`).

``uqvision predict`` reuses a complete cache only when its identity
(:data:`uqvision.predict.IDENTITY_FIELDS`) equals the request's; see
:func:`uqvision.predict.check_caches`.

A file without the completeness flag or whose data no longer match its checksum is rejected
(:class:`CacheError`), never scored.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from uqmetrics import IncompleteResultError, InputError, dataset_checksum, read_dataset
from uqmetrics.runs.io import READ_ERRORS, open_netcdf, safe_name, xarray_module  # xarray on use

if TYPE_CHECKING:
    import xarray as xr

from .exceptions import CacheError, SkippedCacheWarning

__all__ = [
    "CACHE_KIND",
    "EXTRA_ATTR",
    "FIXED_NAMES",
    "CacheError",
    "CacheInfo",
    "cache_dataset",
    "cache_key",
    "check_aligned",
    "check_caches",
    "check_finite_logits",
    "extra_variables",
    "find_caches",
    "incomplete_caches",
    "index_caches",
    "missing_variables",
    "read_cache",
    "safe_name",
]

CACHE_KIND = "uqvision.prediction_cache"
#: The attr listing a cache's extra variables (JSON list of names, sorted).
EXTRA_ATTR = "extra_variables"
#: The variables, coordinates and dims :func:`cache_dataset` makes itself: an extra variable
#: may not take one of these names.
FIXED_NAMES = ("logits", "label", "embedding", "uncertainty", "crop_fraction", "sample",
               "class", "in_folder", "pass", "feature")


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
                  crop_fraction=None, in_folder=None, attrs: dict | None = None,
                  extra: Mapping[str, tuple] | None = None) -> xr.Dataset:
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
        ``checksum`` are added (and :data:`EXTRA_ATTR` with ``extra``).
    extra : mapping str -> (dims, array_like), optional
        Further data variables, e.g. ``{"head_weight": (("class", "feature"), W)}``, W of
        shape (class, feature), or a per-pass variable with dims ``("pass", ...)`` in a cache
        of several passes. Names must not be one of :data:`FIXED_NAMES`; ``dims`` (a str for
        one) must be distinct, as many as the array's axes, of the cache's sizes along its
        dims (``sample``, ``class``, ``pass``, ``feature`` with an embedding) and of one size
        along a new dim. Numbers or booleans, kept in their dtype.

    Returns
    -------
    xarray.Dataset
        Ready for ``uqmetrics.write_dataset``.

    Raises
    ------
    ValueError
        Missing attrs, logits of another rank, or an extra variable that breaks a rule above
        (the message names it).
    TypeError
        ``extra`` not a mapping.
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
    attrs = dict(attrs or {})
    missing = {"model", "dataset_name", "mode", "pass_index"} - set(attrs)
    if missing:
        raise ValueError(f"attrs must name {sorted(missing)}")
    sizes = {"sample": len(coords["sample"]), "class": len(coords["class"])}
    if z.ndim == 3:
        sizes["pass"] = z.shape[0]
    if embedding is not None:
        sizes["feature"] = variables["embedding"][1].shape[-1]
    extras = _extra_variables(extra or {}, sizes)
    ds = xarray_module().Dataset({**variables, **extras}, coords=coords)
    if extras:
        attrs[EXTRA_ATTR] = json.dumps(sorted(extras))
    ds.attrs = {**attrs, "kind": CACHE_KIND, "checksum": dataset_checksum(ds)}
    return ds


def _extra_variables(extra: Mapping[str, tuple], sizes: dict[str, int]) -> dict[str, tuple]:
    """``extra`` checked (see :func:`cache_dataset`) as ``name -> (dims, ndarray)``;
    ``sizes``: the cache's dim sizes."""
    if not isinstance(extra, Mapping):
        raise TypeError(f"extra must be a mapping name -> (dims, array), got "
                         f"{type(extra).__name__}")
    sizes, out = dict(sizes), {}
    for name, value in extra.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"extra variable names must be non-empty strings, got {name!r}")
        if name in FIXED_NAMES:
            raise ValueError(f"extra variable {name!r} clashes with a cache's own variable, "
                             f"coordinate or dim ({', '.join(FIXED_NAMES)})")
        if not isinstance(value, tuple) or len(value) != 2:
            raise ValueError(f"extra variable {name!r} must be a (dims, array) pair, got "
                             f"{type(value).__name__}")
        dims, array = value
        dims = (dims,) if isinstance(dims, str) else tuple(dims)
        arr = np.asarray(array)
        if arr.dtype.kind not in "biuf":
            raise ValueError(f"extra variable {name!r} must hold numbers or booleans, got "
                             f"dtype {arr.dtype}")
        if not all(isinstance(d, str) and d for d in dims) or len(set(dims)) != len(dims):
            raise ValueError(f"extra variable {name!r}: dims must be distinct names, got "
                             f"{dims!r}")
        if arr.ndim != len(dims):
            raise ValueError(f"extra variable {name!r} has {arr.ndim} axes {arr.shape} for "
                             f"dims {dims!r}")
        for d, n in zip(dims, arr.shape, strict=True):
            if d == "pass" and "pass" not in sizes:
                raise ValueError(f"extra variable {name!r} has dim 'pass', but the cache has "
                                 "no passes (logits (sample, class))")
            if sizes.setdefault(d, n) != n:
                raise ValueError(f"extra variable {name!r} has {n} along dim {d!r}, where the "
                                 f"cache has {sizes[d]}")
        out[name] = (dims, arr)
    return out


def extra_variables(attrs: Mapping) -> tuple[str, ...]:
    """The names of a cache's extra variables (its :data:`EXTRA_ATTR`; () for a cache written
    without any, or before the attr existed)."""
    raw = attrs.get(EXTRA_ATTR)
    if raw is None:
        return ()
    names = json.loads(raw) if isinstance(raw, str) else raw
    return tuple(str(n) for n in names)


def missing_variables(cache: xr.Dataset, needed: Iterable[str]) -> list[str]:
    """The names among ``needed`` that ``cache`` lacks as data variables, in ``needed``'s
    order: a cache written before a variable existed lacks it, and is stale where it is
    needed."""
    return [n for n in needed if n not in cache.data_vars]


def read_cache(path: str | os.PathLike) -> xr.Dataset:
    """Load a cache fully, verifying completeness flag, kind, variables and checksum.

    Raises
    ------
    FileNotFoundError
    CacheError
        Partial/corrupt file, a file that is not a prediction cache, or data that do not match
        the recorded checksum (the cache's ``checksum``, or the per-variable checksums every
        result file records, :data:`uqmetrics.runs.io.CHECKSUM_ATTR`); its ``__cause__`` is the
        :class:`uqmetrics.IncompleteResultError` of an unreadable or unfinished file
        (:class:`uqmetrics.runs.io.CorruptResultError` for data that changed on disk).
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


def check_finite_logits(cache: xr.Dataset, path: str | os.PathLike) -> None:
    """Refuse a cache whose logits hold NaN or infinity (a diverged or damaged network).

    Parameters
    ----------
    cache : xarray.Dataset
        A cache with ``logits`` (sample, class) or (pass, sample, class).
    path : path
        Its file, named in the error.

    Raises
    ------
    uqmetrics.InputError
        Naming the file and counting the samples that hold one (a sample counts once, whatever
        its passes and classes), with the first of them.
    """
    z = cache["logits"].values
    bad = ~np.isfinite(z)
    if not bad.any():
        return
    rows = bad.any(axis=tuple(i for i, d in enumerate(cache["logits"].dims) if d != "sample"))
    first = str(cache["sample"].values[int(np.argmax(rows))])
    raise InputError(f"cache {str(path)!r}: the logits of {int(rows.sum())} of {rows.size} "
                     f"samples hold NaN or infinity (the first: {first!r}); predict that "
                     "cache again (a diverged or damaged network is never scored)")


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
            with open_netcdf(p) as ds:
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
        How to call them in the error (default: the file each was read from, its
        ``encoding["source"]``; a cache made in memory: its ``model`` attr).
    """
    if not caches:
        raise CacheError("no caches given")
    names = list(names) if names is not None else [
        str(c.encoding.get("source") or c.attrs.get("model", i)) for i, c in enumerate(caches)]
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


def incomplete_caches(caches: Iterable[str | os.PathLike]) -> tuple[list[Path], dict[Path, str]]:
    """The cache files among ``caches`` (files or folders) and those the index leaves out: what
    ``uqvision score NAME`` checks for every protocol before it scores.

    Only headers are read: a file that is unreadable (e.g. truncated), unfinished (no
    completeness flag) or not a uqvision prediction cache is never scored
    (:func:`uqvision.cache.index_caches` skips it with a
    :class:`~uqvision.exceptions.SkippedCacheWarning`); ``uqvision score`` refuses to score
    without it unless ``--skip-incomplete`` is given.

    Returns
    -------
    files : list of Path
        Every ``.nc`` file given or found in the folders given.
    skipped : dict
        Path -> why it would not be scored, in file order.
    """
    files = find_caches(caches)
    skipped: dict[Path, str] = {}
    for path in files:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SkippedCacheWarning)
            index_caches([path])
        for w in caught:
            if issubclass(w.category, SkippedCacheWarning):
                why = str(w.message).removeprefix("skipping ")
                skipped[path] = ("unreadable (truncated or not netCDF)" if why.startswith(
                    "unreadable") else "not a complete uqvision prediction cache")
    return files, skipped


def check_caches(option: str, caches: Iterable[str | os.PathLike], *,
                 every: bool = False) -> tuple[list[Path], dict[Path, str]]:
    """:func:`incomplete_caches` of the paths given as ``option`` (``--caches``), refusing
    before any work what a command cannot read: a path that does not exist, paths that hold
    no complete prediction cache (an empty folder, only unreadable or foreign files) and,
    with ``every``, any file among them that is not one. Each message names the option and
    the paths (files: by path, with why).

    Returns
    -------
    files, skipped
        As :func:`incomplete_caches`.

    Raises
    ------
    uqmetrics.InputError
    """
    given = [os.fspath(p) for p in caches]
    for p in given:
        if not (Path(p).exists() or Path(p).is_symlink()):
            raise InputError(f"{option} {p!r} does not exist")
    shown = " ".join(repr(p) for p in given)
    files, skipped = incomplete_caches(given)
    listed = "; ".join(f"{str(p)!r} ({why})" for p, why in skipped.items())
    if not files:
        raise InputError(f"{option} {shown}: no prediction cache found (no .nc file there; "
                         "uqvision predict writes them)")
    if len(skipped) == len(files):
        raise InputError(f"{option} {shown}: no complete prediction cache found: {listed}")
    if every and skipped:
        raise InputError(f"{option}: {len(skipped)} of {len(files)} files "
                         f"{'is' if len(skipped) == 1 else 'are'} not a complete prediction "
                         f"cache: {listed}")
    return files, skipped
