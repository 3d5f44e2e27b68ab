"""The one prediction path: :func:`predict` runs a model (each prediction sample of a training
method's run) over an image folder through its mode and returns one cache Dataset per sample
and pass, with its attrs (provenance, identity, evaluation set); sharded over torchrun's ranks
and gathered; the cache variables a config asks for, computed on each sample's network
(:func:`_cache_variables`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from uqmetrics import InputError, provenance_attrs
from uqmetrics.runs.sweep import progress_bar

from ..cache import cache_dataset
from ..data import ImageFolderDataset, derive_seed, flush_denormal, readable_images
from ..data.folders import ChangedImageError, folder_fingerprint
from ..evalsets import EVAL_SETS, check_role, eval_set_attrs
from ..models import ModelSpec, check_model_spec, recorded_class_names, sidecar_path
from ..runtime import distributed_context, gather, shard_indices
from ..training.runs import load_run
from .config import DECODERS, PredictConfig, resolve_channels_last
from .decoded import decoded_folder, decoded_key
from .loop import batch_progress
from .modes import PASS_MODES
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
from .variables import CACHE_VARIABLES

if TYPE_CHECKING:
    import torch
    import xarray as xr

__all__ = ["predict"]

#: Modes whose datasets are the model's own evaluation transform of the folder (they read a
#: decoded file, :mod:`~.decoded`, when one is given).
_DECODED_MODES = ("plain", "mc_dropout")


def _cache_variables(model: torch.nn.Module, config: PredictConfig) -> dict[str, tuple]:
    """``config.extra_variables`` of ``model`` as ``cache_dataset``'s ``extra``."""
    out = {}
    for name in config.extra_variables:
        var = CACHE_VARIABLES.lookup(name)
        out[name] = (var.dims, np.asarray(var.compute(model)))
    return out


#: The run :func:`predict` last built in this process with ``keep_model`` (a sweep's worker),
#: reused by the next call for the same network: ``[key, run, in use]`` or empty.
_KEPT: list = []
_KEPT_LOCK = threading.Lock()


def _run_key(spec: ModelSpec, head: int | None, device: str, config: PredictConfig
             ) -> tuple | None:
    """Everything a plain run's network depends on (:func:`predict`'s ``keep_model``): the
    spec, the head, the device, the weights' seed and source, the memory format asked for,
    and the checkpoint's and sidecar's size and modification time; ``None`` when a file of it
    cannot be read (then it is built afresh)."""
    stamps = []
    if spec.checkpoint:
        for path in (Path(spec.checkpoint), sidecar_path(spec.checkpoint)):
            try:
                st = os.stat(path)
            except FileNotFoundError:
                stamps.append((str(path), None))
                continue
            except OSError:
                return None
            stamps.append((str(path.resolve()), st.st_size, st.st_mtime_ns))
    return (spec.row, head, device, config.allow_random_init, config.seed,
            config.channels_last, str(config.train_data), tuple(stamps))


@contextlib.contextmanager
def _loaded_run(spec: ModelSpec, head: int | None, device: str, config: PredictConfig,
                keep: bool):
    """:func:`uqvision.training.runs.load_run` of ``spec``; with ``keep``, the run kept from
    the last call of this process for the same network (:func:`_run_key`) when it is not in
    use, and this one kept for the next when it is a plain network (no training method: its
    samples, BatchNorm updates or noise are rebuilt per call). The kept run is let go before
    another is built: one network at a time is held."""
    key = _run_key(spec, head, device, config) if keep else None
    run, mine = None, False
    if key is not None:
        with _KEPT_LOCK:
            if _KEPT and _KEPT[0] == key and not _KEPT[2]:
                run, _KEPT[2], mine = _KEPT[1], True, True
            elif _KEPT and not _KEPT[2]:
                _KEPT.clear()
    if run is None:
        run = load_run(spec, num_classes=head, device=device, train_data=config.train_data,
                       allow_random_init=config.allow_random_init, seed=config.seed)
        if key is not None and "method" not in run.sidecar:
            with _KEPT_LOCK:
                if not _KEPT:
                    _KEPT[:] = [key, run, True]
                    mine = True
    try:
        yield run
    finally:
        if mine:
            with _KEPT_LOCK:
                if _KEPT and _KEPT[1] is run:
                    _KEPT[2] = False


def release_model() -> None:
    """Let go of the network :func:`predict` keeps in this process (``keep_model``)."""
    with _KEPT_LOCK:
        if _KEPT and not _KEPT[2]:
            _KEPT.clear()


def predict(spec: ModelSpec | str, data: str | os.PathLike | ImageFolderDataset,
            config: PredictConfig | None = None, *, dataset_name: str | None = None,
            only: set[tuple[int, int]] | None = None,
            attrs: dict | None = None,
            decoded: str | os.PathLike | None = None,
            planned: tuple[str, Mapping[str, str | None]] | None = None,
            train_fingerprint: str | None = None,
            channels_last_source: str | None = None,
            keep_model: bool = False, progress: bool = False) -> list[xr.Dataset]:
    """Run ``spec`` over the image folder ``data``; return one cache Dataset per sample and pass.

    Classes are matched BY NAME (the class map of the default evaluation set,
    ``config.eval_set``; :mod:`uqvision.evalsets` for the others: by class index, or none for
    an OOD set): the folder's class names are looked up among the model's (its sidecar's
    ``classes``; the WordNet ids of an ImageNet-1k checkpoint without one), and the labels are
    indices of the model's classes. A folder may hold a subset of the model's
    classes; a class the model lacks is an error naming it. A model that records no class
    names takes the folder's sorted classes as its own, which needs as many of them
    (``class_mapping = "folder_order"`` in the cache), unless ``config.model_classes`` names
    them (its in-distribution folder's; a random network then gets as many outputs): a
    model's class space never comes from an OOD folder (refused).

    Parameters
    ----------
    spec : ModelSpec or str
        ``NAME`` or ``NAME=CHECKPOINT`` (see :class:`uqvision.models.ModelSpec`); a checkpoint
        of :func:`uqvision.training.loop.train_model` is rebuilt through its method
        (:func:`uqvision.training.runs.load_run`).
    data : path or ImageFolderDataset
        Image folder (or the folder already scanned).
    config : PredictConfig
    dataset_name : str, optional
        Name recorded in the cache (default: the folder name, e.g. ``val`` or ``test``).
    only : set of (sample, pass), optional
        Compute just these (resume).
    attrs : dict, optional
        Extra attrs recorded in every cache (a protocol's bookkeeping, e.g. URL's run seed);
        a key of the cache's own attrs (``config``, ``seed``, ``dataset``, ...) raises
        ``ValueError``: it would replace what the cache's identity is read from.
    decoded : path, optional
        The folder's images decoded once for several models (a ``.npy`` of
        :func:`uqvision.predict.decoded.decode_images`; what a sweep passes to the models of
        one preprocessing group): read instead of the image files when the model's transform
        has the file's geometry head and the file holds this folder (its fingerprint, every
        sample), else ignored. The logits are the same bit for bit; a cache that read it
        records the group's key in ``shared_decoding``.
    planned : (str, mapping str -> str or None), optional
        The folder's fingerprint and per-sample SHA-256 digests as a sweep's plan computed
        them (:func:`uqvision.data.folder_fingerprint`, :func:`uqvision.data.sample_digests`):
        the folder is not hashed up front; its scan is fingerprinted with these digests and
        must give the plan's fingerprint, and every image's bytes are checked against its
        digest as they are read for decoding (a decoded file of that fingerprint is trusted:
        its images were checked when it was made). Without it the folder is fingerprinted
        here, every byte read (docs/conventions.md#fingerprint-rules).
    train_fingerprint : str, optional
        The fingerprint of the folder the run's samples recompute their BatchNorm statistics
        on, as a sweep's plan computed it (once per model; its caches record it). Without it
        that folder is fingerprinted here, once per scan of ``data`` (the checks of
        :func:`~.files.check_caches` of the same scan hashed it already).
    channels_last_source : {"auto", "given"}, optional
        How ``config.channels_last`` was chosen, when the caller pinned it to the memory format
        of the model's caches already there (a resume): those caches' own source, recorded by
        these caches too. Without it: ``"auto"`` for ``channels_last`` ``None``, else
        ``"given"``.
    keep_model : bool, default False
        Keep the network built (and warmed up by its first batches) in this process for the
        next call of the same model, spec, head, device, seed and memory format with
        unchanged checkpoint files, and reuse the one kept by the last call (a sweep's cells
        of one model on one worker: built once). Only a plain network is kept (a checkpoint
        without a training method); one at a time; the logits are the same bit for bit.
    progress : bool, default False
        A progress bar on stderr over the forward passes of the batches (batches x passes x
        prediction samples; rank 0's shard under torchrun;
        :func:`uqmetrics.runs.sweep.progress_bar`: a line at most every 30 s in a log;
        none once ``uqvision --quiet`` or :func:`uqmetrics.runs.sweep.set_progress`
        turned progress off). ``uqvision predict`` asks for it; a sweep's cells do not. The
        caches do not depend on it.

    Returns
    -------
    list of xarray.Dataset
        ``logits`` (sample, class) — (pass, sample, class) for ``mc_dropout`` — float32 (none
        with ``logits=False``), ``label`` (sample), optional ``embedding`` (sample, feature),
        ``uncertainty`` (sample) for a network with its own u, ``crop_fraction`` (sample); the
        ``class`` coordinate holds the model's classes, ``in_folder`` (class) marks those the
        folder has; see :mod:`uqvision.cache` for the attrs (``method``, ``run``,
        ``sample_index`` name the training method, the run and the prediction sample;
        ``class_mapping``, ``folder_classes`` how the labels were made). Every rank of a
        torchrun job returns the gathered full result.

    Raises
    ------
    uqmetrics.InputError
        The folder's classes do not fit the model's (checked before the model is built when
        the checkpoint's sidecar names its classes, else right after, before any image is read),
        or the sidecar's ``model_kwargs`` name a key the model does not take (checked first,
        :func:`uqvision.models.check_model_spec`).
    uqvision.data.folders.ChangedImageError
        With ``planned``: an image (named) or the folder changed since the plan; nothing is
        returned.
    """
    config = _resolved(config or PredictConfig())
    _check_config(config)
    check_role(config.eval_set, config.role, f"role {config.role!r} (--role)")
    run_mode = PASS_MODES.lookup(config.mode)
    spec = ModelSpec.parse(spec) if isinstance(spec, str) else spec
    check_model_spec(spec)  # its checkpoint and sidecar (model_kwargs), before any image
    folder = _folder(data, config)  # validates the folder before the model is built
    member = _eval_member(folder, config)
    name = _dataset_name(dataset_name, folder, member, config)
    names = recorded_class_names(spec.checkpoint) if config.logits else None
    given = config.model_classes if config.logits else None  # its ID folder's, for a model
    if names is not None:  # a name the model lacks fails before the model is built
        _class_space(folder, names, "sidecar", None, config, spec)
    elif given is not None:
        _class_space(folder, given, "model_classes", None, config, spec)
    random_head = config.logits and names is None and not spec.checkpoint \
        and config.allow_random_init  # a random network: a head of its classes' count
    if random_head and given is None and EVAL_SETS.lookup(config.eval_set).class_map == "none":
        raise InputError(
            f"model {spec.row!r} records no class names and gets random weights: its classes "
            f"would be those of OOD folder {str(folder.root)!r} (eval set {config.eval_set!r}),"
            " which holds none of them; predict it with the classes of its in-distribution "
            "folder (PredictConfig.model_classes; uqvision sweep --ood-sets gives them its "
            "--data's), or give it a checkpoint whose sidecar names its classes")
    head = (None if not random_head and names is None  # the weights' head, their classes
            else len(names) if names is not None else len(given) if given is not None
            else len(folder.classes))
    plan = [(k, p) for k, p, _ in cache_plan(spec, config, name)
            if only is None or (k, p) in only]
    wanted = sorted({k for k, _ in plan})
    if train_fingerprint is None:  # its BatchNorm images, once per scan of the folder
        train_fingerprint = _train_data_fingerprint(spec, config, folder)
    if planned is None:
        fingerprint = _fingerprint(folder)
    else:  # a sweep's cell: the plan hashed the folder, the reads below are checked
        folder = folder.expecting(planned[1])
        fingerprint = folder_fingerprint(folder, digests=planned[1])
        if fingerprint != planned[0]:  # name the image that changed, when one did
            for rel in folder.sample_ids:
                folder.read_checked(rel)
            raise ChangedImageError(
                f"image folder {str(folder.root)!r} changed since the sweep planned (its "
                "images' names, labels or sizes differ from the plan's); nothing was "
                "written: run the sweep again")
    side_sha = _sidecar_sha256(spec)
    folder = readable_images(folder, skip_bad=config.skip_bad_images)  # before the model
    if decoded is not None and not DECODERS.lookup(config.decoder).on_device:
        folder = decoded_folder(folder, decoded, fingerprint)  # Pillow's pixels
    t0 = time.perf_counter()
    results = []
    with flush_denormal(), distributed_context(config.device) as (world, rank, device), \
            _loaded_run(spec, head, device, config, keep_model) as run, \
            contextlib.ExitStack() as stack:
        cl_source = channels_last_source or ("auto" if config.channels_last is None
                                             else "given")
        config = dataclasses.replace(  # None: by architecture and device, recorded as chosen
            config, channels_last=resolve_channels_last(run.loaded.model, config))
        space = _class_space(folder, names or run.loaded.class_names or given,
                             "sidecar" if names else run.loaded.class_names_source
                             if run.loaded.class_names else "model_classes",
                             run.loaded.num_classes, config, spec)
        labelled = folder if space.index is None else folder.relabelled(space.index)
        shared = decoded_key(folder, run.loaded.transform) \
            if config.mode in _DECODED_MODES else ""
        local = shard_indices(len(folder), world, rank)
        _, multi = _n_samples(run.sidecar, config)
        noise_seed = config.seed if run.seed is None else derive_seed(config.seed, run.seed)
        nets = (run.samples(wanted[-1] + 1, noise_seed) if multi and wanted
                else iter([run.loaded.model] if wanted else []))
        # batch passes: one per batch of the shard for each cache planned, ``passes`` of them
        # for an MC-dropout cache (its passes in one file)
        batches = -(-len(local) // config.batch_size)
        bar = progress_bar(batches * len(plan) * (config.passes if config.mode == "mc_dropout"
                                                  else 1),
                           f"predict {spec.row} {name}", unit="forward",
                           enabled=progress and rank == 0)
        stack.enter_context(contextlib.closing(bar))
        stack.enter_context(batch_progress(bar))
        for k, net in enumerate(nets):
            if k not in wanted:
                continue
            seed_k = config.seed if run.seed is None else derive_seed(config.seed, run.seed, k)
            loaded = dataclasses.replace(run.loaded, model=net)
            variables = _cache_variables(net, config)  # before the images are read
            for p in sorted(p for kk, p in plan if kk == k):
                cfg = dataclasses.replace(config, seed=seed_k, first_pass=p, passes=1) \
                    if config.mode == "tta" else dataclasses.replace(config, seed=seed_k)
                results += [(k, pp, seed_k, gather(arrays, world), variables)
                            for pp, arrays in run_mode(loaded, labelled, cfg, local, device)]
    wall = time.perf_counter() - t0
    n_samples = _n_samples(run.sidecar, config)[0]
    out = []
    for k, p, seed_k, arrays, variables in results:
        if not np.array_equal(arrays["index"], np.arange(len(folder))):
            raise RuntimeError("gathered predictions do not cover every sample exactly once")
        mc_path = arrays.pop("mc_dropout_path", None)  # one entry per rank, all alike
        logits = arrays["logits"] if config.mode == "mc_dropout" else arrays["logits"][0]
        recorded = {**asdict(config), "first_sample": k, "samples": 1}
        if config.mode == "tta":
            recorded.update(first_pass=p, passes=1)
        extra = {**run.loaded.provenance(), "model": sample_label(spec.row, k, multi),
                 "run": spec.row, "method": "mc_dropout" if config.mode == "mc_dropout"
                 else run.method, "ensemble": run.ensemble,  # training.runs.run_ensemble
                 "ensemble_size": run.ensemble_size, "sample_index": int(k),
                 "n_samples": int(n_samples),
                 "sample_seed": int(seed_k), "train_seed": -1 if run.seed is None else run.seed,
                 "sidecar_sha256": side_sha, "train_data_fingerprint": train_fingerprint,
                 "dataset": str(folder.root.resolve()),
                 "dataset_name": name, "dataset_fingerprint": fingerprint, "mode": config.mode,
                 "pass_index": int(p), "n_passes": int(logits.shape[0]) if logits.ndim == 3
                 else 1, "tta_policy": config.tta_policy if config.mode == "tta"
                 else "", "class_mapping": space.mapping, "class_names_source": space.source,
                 "folder_classes": json.dumps(list(folder.classes)), "device": device,
                 "world_size": world, "wall_time_s": wall, "amp": config.amp,
                 "channels_last": int(config.channels_last),
                 "channels_last_source": cl_source, "decoder": config.decoder,
                 **eval_set_attrs(config.eval_set, member, config.role)}
        if mc_path is not None:
            extra["mc_dropout_path"] = str(mc_path[0])
        if shared:
            extra["shared_decoding"] = shared
        if folder.skipped:  # unreadable images left out (skip_bad_images)
            extra.update(skipped_images=json.dumps(dict(folder.skipped)),
                         n_skipped_images=len(folder.skipped))
        extra.update(folder.labelling_attrs())  # label file (path, sha256), subset counts
        own = provenance_attrs(config=recorded, seed=config.seed, extra=extra)
        if attrs:  # a protocol's own keys beside the cache's, never in place of one
            clash = sorted(set(attrs) & set(own))
            if clash:
                raise ValueError(f"attrs {clash} are the cache's own (its identity and "
                                 "provenance); record a protocol's bookkeeping under other "
                                 "names")
            own = provenance_attrs(config=recorded, seed=config.seed, extra={**extra, **attrs})
        ds = cache_dataset(logits if config.logits else None, arrays["label"],
                           samples=folder.sample_ids, classes=space.classes,
                           in_folder=space.in_folder(),
                           embedding=arrays.get("embedding"),
                           uncertainty=arrays.get("uncertainty"),
                           crop_fraction=arrays.get("crop_fraction"),
                           attrs=own, extra=variables)
        out.append(ds)
    return out
