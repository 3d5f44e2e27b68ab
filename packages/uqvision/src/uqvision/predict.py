"""Run a model over an image folder once and cache per-sample logits (one file per pass).

Modes (:data:`PASS_MODES`):

- ``plain``: the model's own evaluation preprocessing, one pass;
- ``tta``: one random augmentation per pass (policy of :data:`uqvision.data.TTA_POLICIES`);
  pass ``p`` of sample ``i`` is a pure function of ``(seed, p, i)``;
- ``mc_dropout``: dropout masks drawn per sample (:class:`uqvision.training.dropout.PerSampleDropout`;
  the rest of the model, BatchNorm included, in eval mode), ``passes`` forward passes per
  batch sharing one data loading; one file with logits (pass, sample, class). Pass ``r`` of
  sample ``i`` is a pure function of ``(seed, r, i)``;
- and the modes a protocol registers (``crop``: URL's crop intervention,
  :mod:`uqvision.protocols.url.crop`); a mode is a runner that calls :func:`run_loader`.

A network that gives its own uncertainty declares it: ``model.predicts_uncertainty = True``
(:data:`OWN_UNCERTAINTY`) and a method ``predict(x, ids, seed) -> (logits, u, embedding)``
(the URL heads, :class:`uqvision.protocols.url.heads.URLModel`, V.4): its caches also hold ``uncertainty``
(sample) and, with ``embeddings``, its embedding; the noise of its stochastic heads is drawn
per sample from ``(seed, sample index)``. With ``logits=False`` a cache keeps no logits and
the folder's classes need not be the model's (zero-shot embeddings of unseen classes).

ONE path from a training method's prediction samples to caches: a checkpoint trained by
:func:`uqvision.training.loop.train_model` is rebuilt through its method
(:func:`uqvision.training.runs.load_run`), and each of its K samples — deep-ensemble member,
snapshot, posterior draw or stochastic pass (noise drawn per sample, like the MC-dropout
masks) — goes through the mode as one network, one cache per sample and pass (attrs
``method``, ``run``, ``sample_index``). A network without a method is one sample.

No mode reads or writes the global torch RNG: a cache does not depend on the batch size, the
number of torchrun processes or DataLoader workers, nor on what the caller did with the RNG
(up to the float rounding of batched kernels, the same as for ``plain``).

Multi-process: under ``torchrun`` (``RANK``/``WORLD_SIZE`` set) each rank runs a contiguous
shard of the samples (``numpy.array_split``: exact, no padded duplicates) and the logits are
gathered onto every rank in sample order before anything is written (rank 0 writes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Subset
from uqmetrics import IncompleteResultError, InputError, provenance_attrs, write_dataset
from uqmetrics.io import CorruptResultError, decode_attr, exclusive_lock
from uqmetrics.registry import Registry

from .cache import CacheError, cache_dataset, cache_key, read_cache
from .data import (
    TTA_POLICIES,
    ImageFolderDataset,
    derive_seed,
    flush_denormal,
    folder_fingerprint,
    match_classes,
    readable_images,
    tta_transform,
)
from .models import (
    LoadedModel,
    ModelSpec,
    check_pretrained,
    file_sha256,
    read_sidecar,
    recorded_class_names,
    sidecar_path,
    weights_sha256,
)
from .runtime import distributed_context, gather, loader_workers, shard_indices
from .training.dropout import PerSampleDropout
from .training.method import TRAINING_METHODS, StochasticPass
from .training.runs import load_run

if TYPE_CHECKING:
    import xarray as xr

__all__ = [
    "AMP_MODES",
    "DEFAULT_PASSES",
    "IDENTITY_FIELDS",
    "MC_DROPOUT_PATHS",
    "OWN_UNCERTAINTY",
    "PASS_MODES",
    "REFERENCE_EXECUTION",
    "PredictConfig",
    "cache_identity",
    "check_caches",
    "head_only_dropout",
    "predict",
    "predict_to_files",
    "run_loader",
]


@dataclass
class PredictConfig:
    """Options of :func:`predict` (recorded in every cache's ``config`` attr).

    ``passes`` counts TTA augmentations or MC-dropout passes (ignored for ``plain``); ``None``
    (the default) means :data:`DEFAULT_PASSES` of the mode (MC dropout: the Selective paper's
    30); ``first_pass`` offsets the TTA pass indices (pass ``p`` uses seed ``derive_seed(seed, p)``),
    so a member ``k`` of an ensemble can run its own pass ``k``; ``seed`` also seeds the
    MC-dropout masks (sample ``i`` in pass ``r``: ``derive_seed(seed, r, i)``).

    A checkpoint trained by :func:`uqvision.training.loop.train_model` yields its method's prediction
    samples (snapshots, posterior draws, stochastic passes; one network for a deep-ensemble
    member): ``samples`` of them from ``first_sample`` on (``None``: every snapshot, 10
    posterior draws or passes, the network itself), one cache per sample and pass. Sample
    ``k`` of a run trained with seed ``s`` draws its weights / noise from
    ``derive_seed(seed, s)`` and its TTA pass ``p`` from ``derive_seed(derive_seed(seed, s,
    k), p)``, so members and samples never share an augmentation. ``train_data`` is the
    folder the BatchNorm statistics of sampled weights are recomputed on (SWAG, K-FAC
    Laplace; default: the run's training folder). ``logits=False`` (with ``embeddings``): no
    logits are kept and the folder may have other classes than the model (zero-shot, V.4).
    The folder's images are checked before the model is built
    (:func:`uqvision.data.readable_images`): an unreadable one is an error naming it, or with
    ``skip_bad_images`` is left out and recorded in the caches' attrs (``skipped_images``,
    JSON relative path -> why, and ``n_skipped_images``).

    How the network runs (docs/conventions.md#v-predict-speed): ``channels_last`` runs it on
    NHWC tensors and weights (faster for most convolutional networks on CPU and with AMP on
    GPU; logits equal to float rounding, within 1e-7 on the networks measured); ``amp`` is
    autocast (:data:`AMP_MODES`: ``"off"``, ``"fp16"`` on CUDA only, ``"bf16"``; ``True`` and
    ``False`` of earlier versions mean fp16 on CUDA / bf16 on CPU, and off). Both are part of
    a cache's identity. ``num_workers`` ``None`` picks the DataLoader workers from the machine
    (:func:`uqvision.runtime.loader_workers`); the logits do not depend on it.
    """

    mode: str = "plain"
    passes: int | None = None
    first_pass: int = 0
    tta_policy: str = "imagenet"
    seed: int = 0
    batch_size: int = 64
    num_workers: int | None = None
    device: str = "cpu"
    amp: str = "off"
    channels_last: bool = False
    embeddings: bool = False
    allow_random_init: bool = False
    samples: int | None = None
    first_sample: int = 0
    train_data: str | None = None
    logits: bool = True
    skip_bad_images: bool = False

    def __post_init__(self):
        if self.passes is None:
            self.passes = DEFAULT_PASSES.get(self.mode, 1)
        self.amp = amp_mode(self.amp, self.device)
        if not self.logits and not self.embeddings:
            raise ValueError("logits=False needs embeddings=True (a cache without logits "
                             "holds embeddings)")


#: Passes of a mode when ``PredictConfig.passes`` is not given (1 for the others).
DEFAULT_PASSES: dict[str, int] = {"mc_dropout": 30}

#: How the reproduction drivers (:mod:`uqvision.protocols`) and ``uqvision demo`` run their
#: networks, pinned whatever the defaults of :class:`PredictConfig`: contiguous tensors, no
#: autocast, images decoded in the main process, as when their published numbers were
#: computed (``PredictConfig(..., **REFERENCE_EXECUTION)``).
REFERENCE_EXECUTION: dict[str, Any] = {"channels_last": False, "amp": "off", "num_workers": 0}

#: Autocast modes of ``PredictConfig.amp``: name -> dtype (``None``: full precision).
AMP_MODES: dict[str, torch.dtype | None] = {"off": None, "fp16": torch.float16,
                                            "bf16": torch.bfloat16}


def amp_mode(value: Any, device: Any = "cpu") -> str:
    """``PredictConfig.amp`` as a name of :data:`AMP_MODES`: the booleans of earlier versions
    (and of old caches' ``config``) mean ``"off"`` and autocast's dtype on ``device`` (fp16 on
    CUDA, bf16 on CPU); ``None`` (a cache from before the option) is ``"off"``; other values
    are returned as they are (checked by :func:`predict`)."""
    if value is None or value is False:
        return "off"
    if value is True:
        return "fp16" if str(device).startswith("cuda") else "bf16"
    return value


def _batches(dataset, indices: np.ndarray, cfg: PredictConfig):
    # the loader draws its workers' base seed from `generator` (the global RNG otherwise);
    # nothing random happens in the workers: augmentations carry their own generators
    workers = loader_workers(cfg.num_workers, -(-len(indices) // cfg.batch_size), cfg.device)
    loader = DataLoader(Subset(dataset, indices.tolist()), batch_size=cfg.batch_size,
                        shuffle=False, num_workers=workers,
                        pin_memory=cfg.device.startswith("cuda"),
                        generator=torch.Generator().manual_seed(cfg.seed))
    yield from loader


def _autocast(cfg: PredictConfig, device: str):
    dtype = AMP_MODES[cfg.amp]
    return torch.autocast(torch.device(device).type, dtype=dtype, enabled=dtype is not None)


def _to_input(x: torch.Tensor, cfg: PredictConfig, device: str) -> torch.Tensor:
    """A batch on ``device``, NHWC when ``cfg.channels_last`` (a 4-D image batch)."""
    x = x.to(device, non_blocking=True)
    if cfg.channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def _set_memory_format(model: torch.nn.Module, cfg: PredictConfig) -> None:
    """The network's 4-D weights in NHWC with ``cfg.channels_last`` (in place; a no-op for
    weights already so); without it the network is left as it is."""
    if cfg.channels_last:
        model.to(memory_format=torch.channels_last)


#: The capability attribute of a network that gives its own uncertainty: when true,
#: ``model.predict(x, ids, seed)`` returns ``(logits, u, embedding)`` of a batch (``ids``: the
#: samples' data-set indices, for per-sample noise), and its caches hold ``uncertainty``.
OWN_UNCERTAINTY = "predicts_uncertainty"


def _forward(model: torch.nn.Module, x: torch.Tensor, embeddings: bool, ids=None,
             seed: int = 0):
    """``(logits, embedding or None, u or None)`` of a batch; ``ids`` are the samples' data-set
    indices (per-sample noise)."""
    if isinstance(model, StochasticPass):  # noise drawn per sample: (seed, pass, sample id)
        if embeddings:
            raise ValueError("embeddings of stochastic passes are not supported")
        return model(x, ids), None, None
    if getattr(model, OWN_UNCERTAINTY, False):  # the network gives (logits, u, embedding)
        ids = range(len(x)) if ids is None else ids
        z, u, emb = model.predict(x, ids, seed)
        return z, (emb if embeddings else None), u
    if not embeddings:
        return model(x), None, None
    if not hasattr(model, "forward_head"):
        raise ValueError("embeddings need a timm model (forward_features/forward_head)")
    emb = model.forward_head(model.forward_features(x), pre_logits=True)
    return model.get_classifier()(emb), emb, None


def run_loader(loaded: LoadedModel, dataset, indices: np.ndarray, cfg: PredictConfig,
               device: str, passes: int = 1, dropout: PerSampleDropout | None = None, *,
               features_once: bool = False) -> dict[str, np.ndarray]:
    """Logits (passes, n_local, C), labels, sample indices, embeddings and the network's own
    u (of the first pass) of one loader pass.

    With ``dropout``, every pass ``r`` of a batch starts ``dropout.start_pass(r, indices)``.
    With ``features_once`` (every dropout module in the head: :func:`head_only_dropout`), a
    batch's ``forward_features`` runs once and ``forward_head`` once per pass: the same masks,
    the same logits, the backbone not recomputed.
    """
    logits, labels, idx, embs, us = [], [], [], [], []
    model = loaded.model
    _set_memory_format(model, cfg)
    with torch.inference_mode():
        for x, y, i in _batches(dataset, indices, cfg):
            x = _to_input(x, cfg, device)
            outs, feats = [], None
            for r in range(passes):
                if dropout is not None:
                    dropout.start_pass(r, i.tolist())
                with _autocast(cfg, device):
                    if features_once:
                        feats = model.forward_features(x) if feats is None else feats
                        z, e, u = model.forward_head(feats), None, None
                    else:
                        z, e, u = _forward(model, x, cfg.embeddings and r == 0, i.tolist(),
                                           cfg.seed)
                outs.append(z.float().cpu().numpy())
                if e is not None:
                    embs.append(e.float().cpu().numpy())
                if u is not None and r == 0:
                    us.append(u.float().cpu().numpy())
            logits.append(np.stack(outs))
            labels.append(y.numpy())
            idx.append(i.numpy())
    c = loaded.num_classes
    out = {"logits": np.concatenate(logits, axis=1) if logits else np.empty((passes, 0, c),
                                                                             np.float32),
           "label": np.concatenate(labels) if labels else np.empty(0, np.int64),
           "index": np.concatenate(idx) if idx else np.empty(0, np.int64)}
    if cfg.embeddings:
        out["embedding"] = np.concatenate(embs) if embs else np.empty((0, 0), np.float32)
    if us or getattr(loaded.model, OWN_UNCERTAINTY, False):
        out["uncertainty"] = np.concatenate(us) if us else np.empty(0, np.float32)
    return out


#: Prediction modes: name -> runner(loaded, folder, config, local indices, device) ->
#: [(pass_index, arrays)] (``uqvision predict --mode NAME``); ``folder`` is the scanned
#: :class:`~uqvision.data.ImageFolderDataset`, its labels already in the model's class space
#: (set its transform with ``folder.with_transform``).
PASS_MODES: Registry[Callable] = Registry("prediction mode")


@PASS_MODES.register(name="plain")
def _plain(loaded, folder, cfg, idx, device):
    """The model's own evaluation preprocessing, one pass."""
    ds = folder.with_transform(loaded.transform)
    return [(0, run_loader(loaded, ds, idx, cfg, device))]


@PASS_MODES.register(name="tta")
def _tta(loaded, folder, cfg, idx, device):
    """One random augmentation (--tta-policy) per pass, one file per pass."""
    transform = tta_transform(cfg.tta_policy, loaded.data_config)
    out = []
    for p in range(cfg.first_pass, cfg.first_pass + cfg.passes):
        ds = folder.with_transform(transform, derive_seed(cfg.seed, p))
        out.append((p, run_loader(loaded, ds, idx, cfg, device)))
    return out


#: How an MC-dropout cache was computed (its ``mc_dropout_path`` attribute): the backbone once
#: per batch and the head once per pass (every dropout module in the head), or the whole
#: network once per pass. Both give the same logits bit for bit.
MC_DROPOUT_PATHS = ("features_once", "full_passes")


def head_only_dropout(loaded: LoadedModel, dataset, index: int, cfg: PredictConfig, device: str,
                      dropout: PerSampleDropout) -> bool:
    """Whether MC dropout may compute ``forward_features`` once per batch: checked on sample
    ``index`` of ``dataset`` inside ``dropout``'s context.

    True when the network has timm's ``forward_features``/``forward_head`` split (and no
    embeddings, own uncertainty or per-sample noise are asked for), none of ``dropout``'s
    modules runs inside ``forward_features``, and ``forward_head(forward_features(x))`` equals
    ``model(x)`` bit for bit under the same masks. The check is made on the module tree as it
    runs, so dropout inside the body (e.g. timm's ``proj_drop_rate``) gives False.
    """
    model = loaded.model
    if (cfg.embeddings or getattr(model, OWN_UNCERTAINTY, False)
            or isinstance(model, StochasticPass)
            or not (hasattr(model, "forward_features") and hasattr(model, "forward_head"))):
        return False
    x = _to_input(dataset[int(index)][0][None], cfg, device)
    _set_memory_format(model, cfg)
    calls: list[int] = []
    handles = [m.register_forward_hook(lambda *_: calls.append(1)) for m in dropout.modules]
    try:
        with torch.inference_mode(), _autocast(cfg, device):
            dropout.start_pass(0, [int(index)])
            feats = model.forward_features(x)
            in_body = bool(calls)
            split = model.forward_head(feats)
            dropout.start_pass(0, [int(index)])
            whole = model(x)
    finally:
        for h in handles:
            h.remove()
    return not in_body and bool(calls) and torch.equal(split, whole)


@PASS_MODES.register(name="mc_dropout")
def _mc_dropout(loaded, folder, cfg, idx, device):
    """Dropout masks per sample and pass, all passes in one file (pass, sample, class); the
    backbone runs once per batch when every dropout module is in the head."""
    try:
        dropout = PerSampleDropout(loaded.model, cfg.seed)
    except ValueError:
        raise ValueError(f"model {loaded.spec.row!r} has no dropout module with p > 0; "
                         "MC dropout is not available for it") from None
    with dropout:
        ds = folder.with_transform(loaded.transform)
        once = len(idx) > 0 and head_only_dropout(loaded, ds, idx[0], cfg, device, dropout)
        arrays = run_loader(loaded, ds, idx, cfg, device, cfg.passes, dropout, features_once=once)
    arrays["mc_dropout_path"] = np.array([MC_DROPOUT_PATHS[0 if once else 1]])
    return [(0, arrays)]


def _n_samples(side: dict, config: PredictConfig) -> tuple[int, bool]:
    """(number of samples asked for, whether the run has several) from a sidecar alone."""
    if "method" not in side or config.mode == "mc_dropout":
        return 1, False
    if TRAINING_METHODS.lookup(side["method"]).independent_runs:
        return 1, False
    default = len(side.get("state_meta", {}).get("snapshots", [])) or 10
    return (default if config.samples is None else config.samples), True


def cache_plan(spec: ModelSpec | str, config: PredictConfig,
               dataset_name: str) -> list[tuple[int, int, str]]:
    """``(sample, pass, cache key)`` of every cache :func:`predict_to_files` writes for
    ``spec`` (read from the checkpoint's sidecar; the model is not loaded)."""
    spec = ModelSpec.parse(spec) if isinstance(spec, str) else spec
    side = read_sidecar(spec.checkpoint) if spec.checkpoint else {}
    n, multi = _n_samples(side, config)
    if n < 1 or config.first_sample < 0:
        raise ValueError(f"samples must be >= 1 and first_sample >= 0, got {config.samples}, "
                         f"{config.first_sample}")
    first = config.first_sample if multi else 0
    passes = (range(config.first_pass, config.first_pass + config.passes)
              if config.mode == "tta" else [0])
    return [(k, p, cache_key(sample_label(spec.row, k, multi), dataset_name, config.mode, p))
            for k in range(first, first + n) for p in passes]


def sample_label(row: str, k: int, multi: bool) -> str:
    """The ``model`` name of sample ``k`` of a run (``row:00k`` for a run of several)."""
    return f"{row}:{k:03d}" if multi else row


@dataclass(frozen=True)
class _ClassSpace:
    """How an image folder's classes map onto a model's outputs.

    ``classes`` (shape (n_class,)) is a cache's ``class`` coordinate; ``index`` (shape
    (n_folder_classes,)) the model class of each folder class, ``None`` when the labels are the
    folder's own indices; ``mapping`` is ``"name"`` (matched by name), ``"folder_order"`` (the
    model records no names: the folder's sorted classes are taken as its outputs, counts equal)
    or ``"folder"`` (no logits: zero-shot); ``source`` says where the names come from.
    """

    classes: list[str]
    index: np.ndarray | None
    mapping: str
    source: str = ""

    def in_folder(self) -> np.ndarray:
        """1 for each class of ``classes`` the folder has, else 0, shape (n_class,), int8."""
        if self.index is None:
            return np.ones(len(self.classes), np.int8)
        return np.isin(np.arange(len(self.classes)), self.index).astype(np.int8)


def _class_space(folder: ImageFolderDataset, names, source: str, n_outputs: int | None,
                 config: PredictConfig, spec: ModelSpec) -> _ClassSpace:
    """Map the folder's classes onto the model's outputs (:class:`_ClassSpace`); raise
    :class:`uqmetrics.InputError` naming the folder and the model when they do not fit."""
    if not config.logits:
        return _ClassSpace(list(folder.classes), None, "folder")
    if names is not None:
        if n_outputs is not None and len(names) != n_outputs:
            raise InputError(f"model {spec.row!r} names {len(names)} classes ({source}) but has "
                             f"a {n_outputs}-class head")
        index = match_classes(folder.classes, names, folder=str(folder.root), model=spec.row)
        return _ClassSpace(list(names), index, "name", source)
    if n_outputs is not None and n_outputs != len(folder.classes):
        where = (f"name them in its sidecar {str(sidecar_path(spec.checkpoint))!r} "
                 "({\"classes\": [...]})" if spec.checkpoint else "give it a checkpoint")
        raise InputError(
            f"model {spec.row!r} records no class names and has a {n_outputs}-class head, but "
            f"image folder {str(folder.root)!r} has {len(folder.classes)} classes; without "
            f"names the folder's sorted classes are taken as the model's, which needs as many "
            f"(to evaluate a subset of its classes, {where})")
    return _ClassSpace(list(folder.classes), None, "folder_order")


def _check_config(config: PredictConfig) -> None:
    """Refuse an unknown mode or policy and non-positive counts (before anything runs)."""
    PASS_MODES.lookup(config.mode)
    if config.mode == "tta":
        TTA_POLICIES.lookup(config.tta_policy)
    if config.passes < 1 or config.batch_size < 1:
        raise ValueError(f"passes and batch_size must be >= 1, got {config.passes}, "
                         f"{config.batch_size}")
    if config.num_workers is not None and config.num_workers < 0:
        raise ValueError(f"num_workers must be >= 0 or None (from the machine), got "
                         f"{config.num_workers}")
    if config.amp not in AMP_MODES:
        raise ValueError(f"amp must be one of {list(AMP_MODES)}, got {config.amp!r}")
    if config.amp == "fp16" and not config.device.startswith("cuda"):
        raise ValueError(f"amp='fp16' needs a CUDA device, got device={config.device!r}: "
                         "float16 autocast on the CPU is slower than float32; use amp='bf16' "
                         "(faster on CPUs with bfloat16 instructions) or 'off'")


def _resolved(config: PredictConfig) -> PredictConfig:
    """``config`` with ``train_data`` an absolute path (recorded, compared across runs)."""
    if config.train_data is None:
        return config
    return dataclasses.replace(config, train_data=str(Path(config.train_data).resolve()))


def _folder(data) -> ImageFolderDataset:
    return data if isinstance(data, ImageFolderDataset) else ImageFolderDataset(data)


#: :func:`uqvision.data.folder_fingerprint` of each scanned folder object, computed once (the
#: checks of a command and its predictions share the scan, and a scan is a snapshot).
_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _fingerprint(folder: ImageFolderDataset) -> str:
    """The dataset fingerprint of a scanned folder (a stat of each file), once per object."""
    if folder not in _FINGERPRINTS:
        _FINGERPRINTS[folder] = folder_fingerprint(folder)
    return _FINGERPRINTS[folder]


def _sidecar_sha256(spec: ModelSpec) -> str:
    side = sidecar_path(spec.checkpoint) if spec.checkpoint else None
    return file_sha256(side) if side is not None and side.is_file() else ""


def predict(spec: ModelSpec | str, data: str | os.PathLike | ImageFolderDataset,
            config: PredictConfig | None = None, *, dataset_name: str | None = None,
            only: set[tuple[int, int]] | None = None,
            attrs: dict | None = None) -> list[xr.Dataset]:
    """Run ``spec`` over the image folder ``data``; return one cache Dataset per sample and pass.

    Classes are matched BY NAME: the folder's class names are looked up among the model's
    (its sidecar's ``classes``; the WordNet ids of an ImageNet-1k checkpoint without one), and
    the labels are indices of the model's classes. A folder may hold a subset of the model's
    classes; a class the model lacks is an error naming it. A model that records no class
    names takes the folder's sorted classes as its own, which needs as many of them
    (``class_mapping = "folder_order"`` in the cache).

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
        Extra attrs recorded in every cache (a protocol's bookkeeping, e.g. URL's run seed).

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
        the checkpoint's sidecar names its classes, else right after, before any image is read).
    """
    config = _resolved(config or PredictConfig())
    _check_config(config)
    run_mode = PASS_MODES.lookup(config.mode)
    spec = ModelSpec.parse(spec) if isinstance(spec, str) else spec
    folder = _folder(data)  # validates the folder before the model is built
    name = dataset_name or folder.root.resolve().name
    names = recorded_class_names(spec.checkpoint) if config.logits else None
    if names is not None:  # a name the model lacks fails before the model is built
        _class_space(folder, names, "sidecar", None, config, spec)
    head = (None if not config.logits or (names is None and (
        spec.checkpoint or not config.allow_random_init))  # the weights' head, their classes
            else len(names) if names is not None else len(folder.classes))
    plan = [(k, p) for k, p, _ in cache_plan(spec, config, name)
            if only is None or (k, p) in only]
    wanted = sorted({k for k, _ in plan})
    fingerprint = _fingerprint(folder)
    side_sha = _sidecar_sha256(spec)
    folder = readable_images(folder, skip_bad=config.skip_bad_images)  # before the model
    t0 = time.perf_counter()
    results = []
    with flush_denormal(), distributed_context(config.device) as (world, rank, device):
        run = load_run(spec, num_classes=head, device=device,
                       train_data=config.train_data, allow_random_init=config.allow_random_init,
                       seed=config.seed)
        space = _class_space(folder, names or run.loaded.class_names,
                             "sidecar" if names else run.loaded.class_names_source,
                             run.loaded.num_classes, config, spec)
        labelled = folder if space.index is None else folder.relabelled(space.index)
        local = shard_indices(len(folder), world, rank)
        _, multi = _n_samples(run.sidecar, config)
        noise_seed = config.seed if run.seed is None else derive_seed(config.seed, run.seed)
        nets = (run.samples(wanted[-1] + 1, noise_seed) if multi and wanted
                else iter([run.loaded.model] if wanted else []))
        for k, net in enumerate(nets):
            if k not in wanted:
                continue
            seed_k = config.seed if run.seed is None else derive_seed(config.seed, run.seed, k)
            loaded = dataclasses.replace(run.loaded, model=net)
            for p in sorted(p for kk, p in plan if kk == k):
                cfg = dataclasses.replace(config, seed=seed_k, first_pass=p, passes=1) \
                    if config.mode == "tta" else dataclasses.replace(config, seed=seed_k)
                results += [(k, pp, seed_k, gather(arrays, world))
                            for pp, arrays in run_mode(loaded, labelled, cfg, local, device)]
    wall = time.perf_counter() - t0
    n_samples = _n_samples(run.sidecar, config)[0]
    out = []
    for k, p, seed_k, arrays in results:
        if not np.array_equal(arrays["index"], np.arange(len(folder))):
            raise RuntimeError("gathered predictions do not cover every sample exactly once")
        mc_path = arrays.pop("mc_dropout_path", None)  # one entry per rank, all alike
        logits = arrays["logits"] if config.mode == "mc_dropout" else arrays["logits"][0]
        recorded = {**asdict(config), "first_sample": k, "samples": 1}
        if config.mode == "tta":
            recorded.update(first_pass=p, passes=1)
        extra = {**run.loaded.provenance(), "model": sample_label(spec.row, k, multi),
                 "run": spec.row, "method": "mc_dropout" if config.mode == "mc_dropout"
                 else run.method, "sample_index": int(k), "n_samples": int(n_samples),
                 "sample_seed": int(seed_k), "train_seed": -1 if run.seed is None else run.seed,
                 "sidecar_sha256": side_sha, "dataset": str(folder.root.resolve()),
                 "dataset_name": name, "dataset_fingerprint": fingerprint, "mode": config.mode,
                 "pass_index": int(p), "n_passes": int(logits.shape[0]) if logits.ndim == 3
                 else 1, "tta_policy": config.tta_policy if config.mode == "tta"
                 else "", "class_mapping": space.mapping, "class_names_source": space.source,
                 "folder_classes": json.dumps(list(folder.classes)), "device": device,
                 "world_size": world, "wall_time_s": wall, "amp": config.amp,
                 "channels_last": int(config.channels_last), **dict(attrs or {})}
        if mc_path is not None:
            extra["mc_dropout_path"] = str(mc_path[0])
        if folder.skipped:  # unreadable images left out (skip_bad_images)
            extra.update(skipped_images=json.dumps(dict(folder.skipped)),
                         n_skipped_images=len(folder.skipped))
        extra.update(folder.labelling_attrs())  # label file (path, sha256), subset counts
        ds = cache_dataset(logits if config.logits else None, arrays["label"],
                           samples=folder.sample_ids, classes=space.classes,
                           in_folder=space.in_folder(),
                           embedding=arrays.get("embedding"),
                           uncertainty=arrays.get("uncertainty"),
                           crop_fraction=arrays.get("crop_fraction"),
                           attrs=provenance_attrs(config=recorded, seed=config.seed, extra=extra))
        out.append(ds)
    return out


#: What a cache's identity is made of: a complete cache is reused only when every field equals
#: the request's (:func:`check_caches`). Batch size, workers and device are not part of it
#: (they change the logits by float rounding only); ``amp`` and ``channels_last`` are (a
#: cache recorded before them was computed without autocast, contiguous). ``skipped_images``
#: (how many unreadable images a cache left out) must be 0 unless the request allows skipping
#: them.
IDENTITY_FIELDS = ("model", "model_name", "checkpoint_sha256", "sidecar_sha256", "dataset",
                   "mode", "tta_policy", "seed", "passes", "embeddings", "logits", "amp",
                   "channels_last", "train_data", "sample_index", "pass_index",
                   "skipped_images")


def cache_identity(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The identity (:data:`IDENTITY_FIELDS`) a cache records in its attrs; ``None`` for a
    field it does not record. ``dataset`` is the dataset fingerprint (relative paths, class
    folders and file sizes; :func:`uqvision.data.dataset_fingerprint`)."""
    a = {k: decode_attr(v) for k, v in attrs.items()}
    cfg = a.get("config") if isinstance(a.get("config"), dict) else {}
    return {"model": a.get("model"), "model_name": a.get("model_name"),
            "checkpoint_sha256": a.get("checkpoint_sha256"),
            "sidecar_sha256": a.get("sidecar_sha256"), "dataset": a.get("dataset_fingerprint"),
            "mode": a.get("mode"), "tta_policy": a.get("tta_policy"), "seed": cfg.get("seed"),
            "passes": a.get("n_passes"), "embeddings": cfg.get("embeddings"),
            "logits": cfg.get("logits"), "amp": amp_mode(cfg.get("amp"), a.get("device")),
            "channels_last": bool(cfg.get("channels_last", False)),
            "train_data": cfg.get("train_data"), "sample_index": a.get("sample_index"),
            "pass_index": a.get("pass_index"),
            "skipped_images": int(a.get("n_skipped_images", 0))}


def _show(field: str, value: Any, attrs: Mapping[str, Any] | None, folder: str) -> str:
    """One identity value for a message (a fingerprint shortened, with the folder it is of)."""
    if value is None:
        return "(not recorded)"
    if field == "dataset":
        where = decode_attr(attrs.get("dataset", "?")) if attrs is not None else folder
        return f"{where!r} ({str(value)[:17]}...)"
    if field in ("checkpoint_sha256", "sidecar_sha256"):
        return repr(str(value)[:12] + "..." if value else "")
    return repr(value)


def check_caches(spec: ModelSpec | str, data: str | os.PathLike | ImageFolderDataset,
                 out_dir: str | os.PathLike, config: PredictConfig | None = None, *,
                 dataset_name: str | None = None,
                 overwrite: bool = False) -> tuple[dict[tuple[int, int], Path], set]:
    """Plan ``spec``'s caches of ``data`` in ``out_dir`` and check, before anything is
    computed, the inputs and every cache already there.

    A complete cache is reused only when its identity (:data:`IDENTITY_FIELDS`: model and
    checkpoint and sidecar hashes, dataset fingerprint, mode, policy, seed, passes, ...) equals
    the request's; a different one is an error naming each field that differs (cached vs now)
    unless ``overwrite``. A file that is not a uqvision cache, or whose data fail its checksum
    (the cache's ``checksum`` or the file's :data:`uqmetrics.io.CHECKSUM_ATTR`), is an error too
    (never replaced without ``overwrite``: the message says to delete it or pass
    ``--overwrite``); an unreadable file (truncated, damaged metadata such as an attribute
    netCDF cannot open) or an unfinished one (no completeness flag) is recomputed: in the
    returned ``missing``, never an error.

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
    folder = _folder(data)
    name = dataset_name or folder.root.resolve().name
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
        want = {"model": sample_label(spec.row, k, multi), "model_name": spec.name,
                "checkpoint_sha256": sha, "sidecar_sha256": _sidecar_sha256(spec),
                "dataset": fingerprint, "mode": config.mode,
                "tta_policy": config.tta_policy if config.mode == "tta" else "",
                "seed": config.seed,
                "passes": config.passes if config.mode == "mc_dropout" else 1,
                "embeddings": config.embeddings, "logits": config.logits, "amp": config.amp,
                "channels_last": config.channels_last,
                "train_data": config.train_data, "sample_index": k, "pass_index": p,
                "skipped_images": have["skipped_images"] if config.skip_bad_images else 0}
        diff = [f"{f} {_show(f, have[f], cached.attrs, '')} vs "
                f"{_show(f, want[f], None, str(folder.root.resolve()))}"
                for f in IDENTITY_FIELDS if have[f] != want[f]]
        if diff:
            problems.append(f"cache {str(path)!r} was computed from other inputs (cached vs "
                            f"now): {'; '.join(diff)}; it is kept: pass --overwrite to "
                            "recompute it, or write to another --out")
    if problems:
        more = f" ({len(problems) - 1} more cache(s) of this plan too)" if len(problems) > 1 \
            else ""
        raise InputError(problems[0] + more)
    return paths, missing


def predict_to_files(spec: ModelSpec | str, data: str | os.PathLike | ImageFolderDataset,
                     out_dir: str | os.PathLike, config: PredictConfig | None = None, *,
                     dataset_name: str | None = None, overwrite: bool = False,
                     attrs: dict | None = None,
                     checked: tuple[dict[tuple[int, int], Path], set] | None = None
                     ) -> list[Path]:
    """:func:`predict` and write each sample and pass to ``out_dir/<cache_key>.nc`` (rank 0
    writes); ``attrs`` as for :func:`predict`.

    The inputs and the caches already there are checked first (:func:`check_caches`): a
    complete cache of the same identity is kept (resume: the model runs only for the missing
    ones, and is not even loaded when none is missing); one of another identity is an error
    naming what differs, before anything is computed, unless ``overwrite`` (then every cache
    is recomputed). ``checked`` is what :func:`check_caches` answered for these same
    arguments, when the caller has checked them already (``uqvision predict`` checks every
    model before the first runs): the caches are then not read a second time.

    Two runs never compute the same cache at once: the writing process (rank 0) holds an
    exclusive lock (:func:`uqmetrics.io.exclusive_lock`, ``.<cache file>.lock`` beside it) on
    every cache it computes, from before the model runs until the cache is written; a run
    that finds one of them locked is refused (:class:`uqmetrics.io.LockedError`, naming the
    lock and the process that holds it) before it computes anything. Once it holds the locks,
    a cache that appeared since the check (written by a run that has just finished) is
    checked again, so that a cache of other inputs is never silently replaced.
    """
    config = _resolved(config or PredictConfig())
    spec = ModelSpec.parse(spec) if isinstance(spec, str) else spec
    folder = _folder(data)
    name = dataset_name or folder.root.resolve().name
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
            for ds in predict(spec, folder, config, dataset_name=name, only=missing,
                              attrs=attrs):
                if writer:
                    kp = (int(ds.attrs["sample_index"]), int(ds.attrs["pass_index"]))
                    write_dataset(ds, paths[kp], overwrite=True)
    return list(paths.values())
