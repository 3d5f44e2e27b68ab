"""What a request is before anything runs: its checks (:func:`_check_config`), the caches it
plans (:func:`cache_plan`, one per prediction sample and pass), how the folder's classes map
onto the model's outputs (:class:`_ClassSpace`), the folder's evaluation-set member and
dataset name, and the fingerprints and hashes a cache's identity records.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from uqmetrics import InputError

from ..cache import cache_key
from ..data import TTA_POLICIES, ImageFolderDataset, folder_fingerprint, match_classes
from ..evalsets import EVAL_SETS, EvalMember, map_classes, member_dataset_name, resolve_member
from ..models import ModelSpec, file_sha256, read_sidecar, sidecar_path
from ..training.method import TRAINING_METHODS
from ..training.runs import _hparams_values
from .config import AMP_MODES, DECODERS, DEVICE_DECODING_MODES, PredictConfig
from .modes import PASS_MODES
from .variables import CACHE_VARIABLES

__all__ = ["cache_plan", "sample_label"]


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
    (n_folder_classes,)) the model class of each folder class (-1: none, an OOD folder),
    ``None`` when the labels are the folder's own indices; ``mapping`` is ``"name"`` (matched
    by name), ``"folder_order"`` (the model records no names: the folder's sorted classes are
    taken as its outputs, counts equal), ``"index"`` (folders named by class index, an
    evaluation set's ``by_index`` map), ``"none"`` (every label -1, its ``none`` map) or
    ``"folder"`` (no logits: zero-shot); ``source`` says where the names come from.
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
    """Map the folder's classes onto the model's outputs (:class:`_ClassSpace`) by the class
    map of ``config.eval_set`` (:func:`uqvision.evalsets.map_classes`); raise
    :class:`uqmetrics.InputError` naming the folder and the model when they do not fit.
    ``n_outputs`` ``None``: the model is not built yet (checks by its recorded ``names``)."""
    class_map = EVAL_SETS.lookup(config.eval_set).class_map
    if not config.logits:
        if class_map == "none":  # zero-shot embeddings of an OOD folder: no labels
            return _ClassSpace(list(folder.classes), np.full(len(folder.classes), -1),
                               "none")
        return _ClassSpace(list(folder.classes), None, "folder")
    if names is not None and n_outputs is not None and len(names) != n_outputs:
        raise InputError(f"model {spec.row!r} names {len(names)} classes ({source}) but has "
                         f"a {n_outputs}-class head")
    if class_map != "by_name":  # by the model's class index: its names, or 0 ... C-1
        index = map_classes(config.eval_set, folder.classes,
                            n_outputs if names is None else names,
                            folder=str(folder.root), model=spec.row)
        classes = (list(names) if names is not None
                   else [str(i) for i in range(n_outputs or 0)])
        return _ClassSpace(classes, index, "index" if class_map == "by_index" else "none",
                           source if names is not None else "")
    if names is not None:
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
    if DECODERS.lookup(config.decoder).on_device and config.mode not in DEVICE_DECODING_MODES:
        raise ValueError(f"decoder {config.decoder!r} decodes for the modes "
                         f"{list(DEVICE_DECODING_MODES)} (the model's evaluation transform), "
                         f"not mode {config.mode!r}, whose images are transformed as Pillow "
                         "images: use decoder 'pil'")
    EVAL_SETS.lookup(config.eval_set)
    for name in config.extra_variables:
        CACHE_VARIABLES.lookup(name)
    if config.extra_variables and not config.logits:
        raise ValueError(f"extra_variables {list(config.extra_variables)} need logits (their "
                         "class dim is the model's outputs); got logits=False")
    if config.amp == "fp16" and not config.device.startswith("cuda"):
        raise ValueError(f"amp='fp16' needs a CUDA device, got device={config.device!r}: "
                         "float16 autocast on the CPU is slower than float32; use amp='bf16' "
                         "(faster on CPUs with bfloat16 instructions) or 'off'")


def _resolved(config: PredictConfig) -> PredictConfig:
    """``config`` with ``train_data`` an absolute path (recorded, compared across runs)."""
    if config.train_data is None:
        return config
    return dataclasses.replace(config, train_data=str(Path(config.train_data).resolve()))


def _folder(data, config: PredictConfig) -> ImageFolderDataset:
    """``data`` scanned (as it is when given scanned); a flat folder without a label file is
    read unlabelled for an evaluation set whose class map labels nothing (an OOD set)."""
    if isinstance(data, ImageFolderDataset):
        return data
    return ImageFolderDataset(data, unlabelled=EVAL_SETS.lookup(config.eval_set).class_map
                              == "none")


def _eval_member(folder: ImageFolderDataset, config: PredictConfig) -> EvalMember | None:
    """The member of ``config.eval_set`` that ``folder`` is (``None``: a set of one folder);
    :class:`uqmetrics.InputError` when it is none of them."""
    return resolve_member(config.eval_set, config.eval_member, folder.root)


def _dataset_name(dataset_name: str | None, folder: ImageFolderDataset,
                  member: EvalMember | None, config: PredictConfig) -> str:
    """``dataset_name``, else the folder's name (``<set>-<member>`` for a member of an
    expanded set: :func:`uqvision.evalsets.member_dataset_name`)."""
    return dataset_name or member_dataset_name(config.eval_set, member, folder.root)


#: :func:`uqvision.data.folder_fingerprint` of each scanned folder object, computed once (the
#: checks of a command and its predictions share the scan, and a scan is a snapshot).
_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _fingerprint(folder: ImageFolderDataset) -> str:
    """The dataset fingerprint of a scanned folder, once per object: of its content (every
    sample's bytes hashed, read once per scan and process), so a cache of images that changed
    is refused on resume whatever their sizes (docs/conventions.md#fingerprint-rules)."""
    if folder not in _FINGERPRINTS:
        _FINGERPRINTS[folder] = folder_fingerprint(folder)
    return _FINGERPRINTS[folder]


#: The scan of each BatchNorm folder (:func:`_train_data_fingerprint`; resolved path ->
#: :class:`~uqvision.data.ImageFolderDataset`) per scan of the folder a command predicts: the
#: checks of a command and its predictions share the scan (and so hash its images once, by
#: :func:`_fingerprint`), and the next command, which scans its folder afresh, scans the
#: BatchNorm folder afresh too (an image changed in place in between is seen).
_TRAIN_SCANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _train_data_fingerprint(spec: ModelSpec, config: PredictConfig,
                            folder: ImageFolderDataset) -> str:
    """The dataset fingerprint of the folder a run's prediction samples recompute their
    BatchNorm statistics on (SWAG, K-FAC Laplace with ``bn_update``: ``config.train_data``,
    else the training folder its sidecar records, with the SHA-256 of the index file its
    view reads if any; :func:`uqvision.training.runs.load_run`),
    ``""`` for a request that reads no such folder (no training method, one network or MC
    dropout, ``bn_update`` off, no folder there). Its images make the samples' logits, so a
    cache records it (``train_data_fingerprint``) as part of its identity: the folder's images
    changed in place refuse its caches (docs/conventions.md#fingerprint-rules).

    ``folder`` is the scan of the folder the command predicts: the BatchNorm folder is scanned
    once per scan of it (:data:`_TRAIN_SCANS`), so that a command's checks and predictions
    (and the models of one command trained on one folder) hash its images once."""
    side = read_sidecar(spec.checkpoint) if spec.checkpoint else {}
    if not _n_samples(side, config)[1]:
        return ""
    hp = TRAINING_METHODS.lookup(side["method"]).hparams_from(
        _hparams_values(side.get("hparams", {})))
    train = config.train_data or side.get("dataset")
    if not getattr(hp, "bn_update", False) or not train or not Path(train).is_dir():
        return ""
    scans = _TRAIN_SCANS.setdefault(folder, {})
    root = str(Path(train).resolve())
    if root not in scans:
        scans[root] = ImageFolderDataset(train)
    fingerprint = _fingerprint(scans[root])
    # the run's own view of its folder (not with --train-data): an index file's positions
    index = None if config.train_data else side.get("train_config", {}).get("index_file")
    if index and Path(index).is_file():
        fingerprint += f"+index:{file_sha256(Path(index))[:16]}"
    return fingerprint


def _sidecar_sha256(spec: ModelSpec) -> str:
    side = sidecar_path(spec.checkpoint) if spec.checkpoint else None
    return file_sha256(side) if side is not None and side.is_file() else ""
