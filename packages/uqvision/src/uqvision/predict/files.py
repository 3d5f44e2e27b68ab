"""Caches on disk: a cache's identity (:data:`IDENTITY_FIELDS`, :func:`cache_identity`), the
checks before anything is computed (:func:`check_caches`: reuse, refusal, recompute) and
:func:`predict_to_files` (resume, the locks on the caches being computed, rank 0 writes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from uqmetrics import IncompleteResultError, InputError, write_dataset
from uqmetrics.runs.io import CorruptResultError, decode_attr, exclusive_lock

from ..cache import CacheError, missing_variables, read_cache
from ..data import ImageFolderDataset, earlier_fingerprint
from ..evalsets import cache_eval_set
from ..models import (
    ModelSpec,
    check_pretrained,
    read_sidecar,
    recorded_class_names,
    weights_sha256,
)
from .config import PredictConfig, amp_mode
from .core import predict
from .plan import (
    _check_config,
    _class_space,
    _dataset_name,
    _eval_member,
    _fingerprint,
    _folder,
    _n_samples,
    _resolved,
    _sidecar_sha256,
    _train_data_fingerprint,
    cache_plan,
    sample_label,
)

__all__ = ["IDENTITY_FIELDS", "cache_identity", "check_caches", "predict_to_files"]


#: What a cache's identity is made of: a complete cache is reused only when every field equals
#: the request's (:func:`check_caches`). Batch size, workers and device are not part of it
#: (they change the logits by float rounding only); ``amp`` and ``channels_last`` are (a
#: cache recorded before them was computed without autocast, contiguous). A request whose
#: ``channels_last`` is ``None`` (chosen by architecture) takes a cache of either memory
#: format, and computes the missing caches of a model in the format of its caches already
#: there (:func:`predict_to_files`), so that one model's caches never mix formats. ``skipped_images``
#: (how many unreadable images a cache left out) must be 0 unless the request allows skipping
#: them. ``eval_set`` and ``eval_member`` are the evaluation set (its class map made the
#: labels; a cache recorded before them is of the generic ``folder`` set, no member).
#: ``decoder`` is how the images were decoded (``PredictConfig.decoder``: its pixels differ
#: from Pillow's, so caches of two decoders are never mixed; a cache recorded before the
#: option was decoded by Pillow, ``"pil"``). ``train_data_fingerprint`` is the dataset
#: fingerprint of the folder a run's samples recompute their BatchNorm statistics on
#: (:func:`~.plan._train_data_fingerprint`; ``""`` when none is read, and for a cache recorded
#: before it, so that such a cache of a SWAG or K-FAC Laplace sample is refused).
#: ``model_classes`` is ``PredictConfig.model_classes`` as the request gives it: the classes of
#: a model that records none (random weights, a checkpoint whose sidecar names none), which
#: make its head's size and its labels, so that a cache of one class space is never reused for
#: another; a cache recorded before the option took its classes from its folder or its
#: weights, and reads as ``None``, the value it had. Beyond the identity, a cache must hold
#: every variable of the request's ``extra_variables``.
IDENTITY_FIELDS = ("model", "model_name", "checkpoint_sha256", "sidecar_sha256", "dataset",
                   "mode", "tta_policy", "seed", "passes", "embeddings", "logits", "amp",
                   "channels_last", "train_data", "train_data_fingerprint", "sample_index",
                   "pass_index", "skipped_images", "eval_set", "eval_member", "decoder",
                   "model_classes")


def cache_identity(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The identity (:data:`IDENTITY_FIELDS`) a cache records in its attrs; ``None`` for a
    field it does not record. ``dataset`` is the dataset fingerprint (relative paths, class
    folders, file sizes and contents; :func:`uqvision.data.dataset_fingerprint`); ``eval_set`` and
    ``eval_member`` are ``"folder"`` and ``""`` for a cache recorded before evaluation sets
    (:func:`uqvision.evalsets.cache_eval_set`); ``decoder`` is ``"pil"`` for a cache recorded
    before decoders; ``train_data_fingerprint`` is ``""`` for a cache recorded before it;
    ``model_classes`` is a tuple of str, ``None`` for a cache recorded without (or before)
    the option."""
    a = {k: decode_attr(v) for k, v in attrs.items()}
    cfg = a.get("config") if isinstance(a.get("config"), dict) else {}
    evals = cache_eval_set(attrs)
    classes = cfg.get("model_classes")
    return {"model": a.get("model"), "model_name": a.get("model_name"),
            "checkpoint_sha256": a.get("checkpoint_sha256"),
            "sidecar_sha256": a.get("sidecar_sha256"), "dataset": a.get("dataset_fingerprint"),
            "mode": a.get("mode"), "tta_policy": a.get("tta_policy"), "seed": cfg.get("seed"),
            "passes": a.get("n_passes"), "embeddings": cfg.get("embeddings"),
            "logits": cfg.get("logits"), "amp": amp_mode(cfg.get("amp"), a.get("device")),
            "channels_last": bool(cfg.get("channels_last", False)),
            "train_data": cfg.get("train_data"),
            "train_data_fingerprint": a.get("train_data_fingerprint", ""),
            "sample_index": a.get("sample_index"),
            "pass_index": a.get("pass_index"),
            "skipped_images": int(a.get("n_skipped_images", 0)),
            "eval_set": evals["eval_set"], "eval_member": evals["eval_member"],
            "decoder": cfg.get("decoder") or "pil",
            "model_classes": None if classes is None else tuple(str(c) for c in classes)}


def _show(field: str, value: Any, attrs: Mapping[str, Any] | None, folder: str) -> str:
    """One identity value for a message (a fingerprint shortened, with the folder it is of)."""
    if field == "model_classes" and value is None:
        return "None (the folder's or the weights' own)"
    if value is None:
        return "(not recorded)"
    if field == "dataset":
        where = decode_attr(attrs.get("dataset", "?")) if attrs is not None else folder
        earlier = earlier_fingerprint(value)  # an earlier identity: never equal to today's
        return f"{where!r} ({str(value)[:17]}..." + (
            f", an earlier fingerprint, of {earlier})" if earlier else ")")
    if field == "train_data_fingerprint" and value:  # the folder's, then its index file's
        head, plus, index = str(value).partition("+")
        return repr(head[:17] + "..." + plus + index)
    if field in ("checkpoint_sha256", "sidecar_sha256"):
        return repr(str(value)[:12] + "..." if value else "")
    if field == "model_classes" and len(value) > 4:  # the first ones, their count and hash
        digest = hashlib.sha256(json.dumps(list(value)).encode()).hexdigest()[:12]
        return f"({', '.join(map(repr, value[:3]))}, ... {len(value)} classes, {digest})"
    return repr(value)


def check_caches(spec: ModelSpec | str, data: str | os.PathLike | ImageFolderDataset,
                 out_dir: str | os.PathLike, config: PredictConfig | None = None, *,
                 dataset_name: str | None = None, overwrite: bool = False,
                 train_fingerprint: str | None = None
                 ) -> tuple[dict[tuple[int, int], Path], set]:
    """Plan ``spec``'s caches of ``data`` in ``out_dir`` and check, before anything is
    computed, the inputs and every cache already there.

    A complete cache is reused only when its identity (:data:`IDENTITY_FIELDS`: model and
    checkpoint and sidecar hashes, dataset fingerprint, mode, policy, seed, passes, evaluation
    set, ...) equals the request's and it holds every variable of ``config.extra_variables``;
    a different one, or one written before a needed variable was recorded, is an error naming
    each field that differs (cached vs now) or each variable it lacks unless ``overwrite``. A
    file that is not a uqvision cache, or whose data fail its checksum (the cache's
    ``checksum`` or the file's :data:`uqmetrics.runs.io.CHECKSUM_ATTR`), is an error too
    (never replaced without ``overwrite``: the message says to delete it or pass
    ``--overwrite``); an unreadable file (truncated, damaged metadata such as an attribute
    netCDF cannot open) or an unfinished one (no completeness flag) is recomputed: in the
    returned ``missing``, never an error. ``train_fingerprint`` is the fingerprint of the
    run's BatchNorm folder as the caller computed it (a sweep's plan, once per model:
    :func:`~.plan._train_data_fingerprint`); ``None``: computed here when a cache is there,
    once per scan of ``data`` (the prediction of the same scan does not hash it again).

    Returns
    -------
    paths : dict
        ``(sample, pass) -> path`` of every planned cache.
    missing : set of (sample, pass)
        The caches to compute (every one with ``overwrite``).

    Raises
    ------
    uqmetrics.InputError
        A cache with another identity, a foreign or corrupt file, or a folder whose classes do
        not fit the model's (when its sidecar names them).
    """
    config = _resolved(config or PredictConfig())
    _check_config(config)
    spec = ModelSpec.parse(spec) if isinstance(spec, str) else spec
    folder = _folder(data, config)
    member = _eval_member(folder, config)
    name = _dataset_name(dataset_name, folder, member, config)
    names = recorded_class_names(spec.checkpoint) if config.logits else None
    if names is not None:
        _class_space(folder, names, "sidecar", None, config, spec)
    plan = cache_plan(spec, config, name)
    paths = {(k, p): Path(out_dir) / f"{key}.nc" for k, p, key in plan}
    check_pretrained(spec, allow_random_init=config.allow_random_init)  # offline, not cached
    if overwrite:
        return paths, set(paths)
    multi = _n_samples(read_sidecar(spec.checkpoint) if spec.checkpoint else {}, config)[1]
    cached_any = any(p.exists() for p in paths.values())
    # the weights the model would load: hashed (pretrained ones fetched, as loading would)
    # only when there is a cache to compare them with
    sha = weights_sha256(spec, allow_random_init=config.allow_random_init) if cached_any else ""
    fingerprint = _fingerprint(folder) if cached_any else ""
    if train_fingerprint is None:
        train_fingerprint = _train_data_fingerprint(spec, config, folder) if cached_any else ""
    missing, problems = set(), []
    for (k, p), path in paths.items():
        try:
            cached = read_cache(path)
        except FileNotFoundError:
            missing.add((k, p))
            continue
        except CacheError as exc:
            if isinstance(exc.__cause__, IncompleteResultError) and not isinstance(
                    exc.__cause__, CorruptResultError):
                missing.add((k, p))  # unreadable or unfinished: nothing to lose
                continue
            text = " ".join(str(exc).split())  # a corrupt cache's says how to recompute it
            problems.append(text if "--overwrite" in text else
                            f"{text}; it is left as it is (pass --overwrite to replace it)")
            continue
        have = cache_identity(cached.attrs)
        _FORMATS[_stamp(path)] = _memory_format(cached.attrs)
        want = {"model": sample_label(spec.row, k, multi), "model_name": spec.name,
                "checkpoint_sha256": sha, "sidecar_sha256": _sidecar_sha256(spec),
                "dataset": fingerprint, "mode": config.mode,
                "tta_policy": config.tta_policy if config.mode == "tta" else "",
                "seed": config.seed,
                "passes": config.passes if config.mode == "mc_dropout" else 1,
                "embeddings": config.embeddings, "logits": config.logits, "amp": config.amp,
                "channels_last": have["channels_last"] if config.channels_last is None
                else config.channels_last,
                "train_data": config.train_data,
                "train_data_fingerprint": train_fingerprint, "sample_index": k, "pass_index": p,
                "skipped_images": have["skipped_images"] if config.skip_bad_images else 0,
                "eval_set": config.eval_set,
                "eval_member": "" if member is None else member.name,
                "decoder": config.decoder, "model_classes": config.model_classes}
        diff = [f"{f} {_show(f, have[f], cached.attrs, '')} vs "
                f"{_show(f, want[f], None, str(folder.root.resolve()))}"
                for f in IDENTITY_FIELDS if have[f] != want[f]]
        if diff:
            problems.append(f"cache {str(path)!r} was computed from other inputs (cached vs "
                            f"now): {'; '.join(diff)}; it is kept: pass --overwrite to "
                            "recompute it, or write to another --out")
        elif lacking := missing_variables(cached, config.extra_variables):
            problems.append(f"cache {str(path)!r} lacks the variable(s) {lacking} this run "
                            "records (extra_variables; it was written without them); it is "
                            "kept: pass --overwrite to recompute it, or write to another --out")
    if problems:
        more = f" ({len(problems) - 1} more cache(s) of this plan too)" if len(problems) > 1 \
            else ""
        raise InputError(problems[0] + more)
    return paths, missing


#: The memory format (``channels_last``) of each cache :func:`check_caches` read, and how it
#: was chosen (``channels_last_source``), by (path, size, modification time): what
#: :func:`_pinned_memory_format` needs without reading the cache a second time.
_FORMATS: dict[tuple, tuple[bool, str]] = {}


def _stamp(path: Path) -> tuple:
    st = os.stat(path)
    return str(Path(path).resolve()), st.st_size, st.st_mtime_ns


def _memory_format(attrs: Mapping[str, Any]) -> tuple[bool, str]:
    """A cache's memory format and how it was chosen (``"given"`` for a cache recorded
    before the choice was: contiguous, as every run was then)."""
    return (cache_identity(attrs)["channels_last"],
            str(attrs.get("channels_last_source", "given")))


def _pinned_memory_format(config: PredictConfig,
                          complete: list[Path]) -> tuple[PredictConfig, str | None]:
    """``config`` with the ``channels_last`` of the first of a model's ``complete`` caches
    when it is ``None`` (chosen by architecture): a resumed model's caches share one memory
    format (a cache recorded before the option: contiguous); and how that cache's format was
    chosen (its ``channels_last_source``, ``"auto"`` or ``"given"``), which the new caches
    record as theirs, so that a cache records the same whether or not its run was resumed
    (``None``: nothing pinned)."""
    if config.channels_last is not None:
        return config, None
    for path in complete:
        try:
            stamp = _stamp(path)
            if stamp not in _FORMATS:
                _FORMATS[stamp] = _memory_format(read_cache(path).attrs)
        except (OSError, CacheError):
            continue
        channels_last, source = _FORMATS[stamp]
        return dataclasses.replace(config, channels_last=channels_last), source
    return config, None


def predict_to_files(spec: ModelSpec | str, data: str | os.PathLike | ImageFolderDataset,
                     out_dir: str | os.PathLike, config: PredictConfig | None = None, *,
                     dataset_name: str | None = None, overwrite: bool = False,
                     attrs: dict | None = None,
                     checked: tuple[dict[tuple[int, int], Path], set] | None = None,
                     progress: bool = False) -> list[Path]:
    """:func:`predict` and write each sample and pass to ``out_dir/<cache_key>.nc`` (rank 0
    writes); ``attrs`` and ``progress`` as for :func:`predict`.

    The inputs and the caches already there are checked first (:func:`check_caches`): a
    complete cache of the same identity is kept (resume: the model runs only for the missing
    ones, and is not even loaded when none is missing); one of another identity is an error
    naming what differs, before anything is computed, unless ``overwrite`` (then every cache
    is recomputed). ``checked`` is what :func:`check_caches` answered for these same
    arguments, when the caller has checked them already (``uqvision predict`` checks every
    model before the first runs): the caches are then not read a second time.

    Two runs never compute the same cache at once: the writing process (rank 0) holds an
    exclusive lock (:func:`uqmetrics.runs.io.exclusive_lock`, ``.<cache file>.lock`` beside it) on
    every cache it computes, from before the model runs until the cache is written; a run
    that finds one of them locked is refused (:class:`uqmetrics.runs.io.LockedError`, naming the
    lock and the process that holds it) before it computes anything. Once it holds the locks,
    a cache that appeared since the check (written by a run that has just finished) is
    checked again, so that a cache of other inputs is never silently replaced.
    """
    config = _resolved(config or PredictConfig())
    spec = ModelSpec.parse(spec) if isinstance(spec, str) else spec
    folder = _folder(data, config)
    name = _dataset_name(dataset_name, folder, _eval_member(folder, config), config)
    paths, missing = checked if checked is not None else check_caches(
        spec, folder, out_dir, config, dataset_name=name, overwrite=overwrite)
    writer = int(os.environ.get("RANK", "0")) == 0
    with contextlib.ExitStack() as locks:
        if missing and writer:
            for kp in sorted(missing):
                locks.enter_context(exclusive_lock(
                    paths[kp].with_name(f".{paths[kp].name}.lock"),
                    advice="wait for it to finish, or write to another --out"))
        if missing and not overwrite and any(paths[kp].exists() for kp in missing):
            # written by another run since the check: its identity is checked again
            paths, missing = check_caches(spec, folder, out_dir, config, dataset_name=name)
        if missing:
            config, source = _pinned_memory_format(config, [paths[kp] for kp in paths
                                                            if kp not in missing])
            for ds in predict(spec, folder, config, dataset_name=name, only=missing,
                              attrs=attrs, channels_last_source=source, progress=progress):
                if writer:
                    kp = (int(ds.attrs["sample_index"]), int(ds.attrs["pass_index"]))
                    write_dataset(ds, paths[kp], overwrite=True)
    return list(paths.values())
