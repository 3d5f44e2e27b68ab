"""Reading a trained run back: :func:`load_run` rebuilds any method's state from a checkpoint
(``OUT.safetensors``), its sidecar (``OUT.json``) and its state file
(``OUT.state.safetensors``) written by :func:`uqvision.training.loop.train_model`, so that
:func:`uqvision.predict.predict` draws the method's prediction samples; :func:`run_method` and
:func:`run_ensemble` are the ``method`` and ``ensemble`` its caches record.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import safetensors.torch  # its functions looked up at call time (tests patch them)
import torch
from torch import nn
from uqmetrics import InputError

from ..data import DataConfig, eval_transform, image_view, tta_transform
from ..exceptions import UqvisionWarning
from ..models import (
    LoadedModel,
    ModelSpec,
    check_checkpoint_file,
    check_model_kwargs,
    check_model_spec,
    check_sidecar_pretrained_cfg,
    file_sha256,
    load_model,
    read_sidecar,
    sidecar_path,
    weights_sha256,
)
from ..models.spectral import spectral_normalize
from .loop import EnsembleMember, build_model, shuffled_loader
from .method import TRAINING_METHODS, TrainState, has_batchnorm

__all__ = ["SINGLE", "LoadedRun", "UndeclaredEnsembleWarning", "load_run", "run_ensemble",
           "run_matches", "run_method"]

#: The ``method`` a single network's caches record: a run of the ``deep_ensemble`` training
#: method (the conventional recipe) that ``uqvision train`` trained alone.
SINGLE = "single"


class UndeclaredEnsembleWarning(UqvisionWarning):
    """A ``deep_ensemble`` run whose sidecar predates the ``ensemble`` record: read as a
    deep-ensemble member with no ensemble id (which runs were trained together is unknown)."""


def run_ensemble(side: dict[str, Any], where: str = "sidecar") -> EnsembleMember | None:
    """The run's place among the runs trained with it (the sidecar's ``ensemble``), ``None``
    when the sidecar records none (``null``, or absent: written before the record existed).

    Raises
    ------
    uqmetrics.InputError
        The record is not ``{"id": str, "size": int, "member": int}`` with
        ``0 <= member < size`` (the message names ``where``, the sidecar).
    """
    rec = side.get("ensemble")
    if rec is None:
        return None
    try:
        if not isinstance(rec, dict) or set(rec) != {"id", "size", "member"}:
            raise TypeError(f"keys {sorted(rec) if isinstance(rec, dict) else rec!r}")
        return EnsembleMember(**rec)
    except (TypeError, ValueError) as err:
        raise InputError(f"{where}: its 'ensemble' must be null or an object with 'id' (text), "
                         f"'size' and 'member' (0 <= member < size), got {rec!r} "
                         f"({err})") from None


def run_method(side: dict[str, Any]) -> str:
    """The ``method`` a run's caches record, from its sidecar.

    - ``""`` for a checkpoint uqvision did not train (no sidecar, or one that names no
      training method, e.g. ``{"classes": [...]}`` written by hand): it joins no group;
    - :data:`SINGLE` (``"single"``) for a ``deep_ensemble`` run trained alone (an ``ensemble``
      record of size 1: ``uqvision train`` without ``--members``, or with one seed);
    - otherwise the training method's name: ``deep_ensemble`` for a member of ``uqvision train
      --members K`` (K >= 2), and for a run that records no ensemble (trained by a library call
      that declared none, or before the record existed: :func:`load_run` says so with an
      :class:`UndeclaredEnsembleWarning`).
    """
    method = str(side.get("method", ""))
    ens = run_ensemble(side)
    return SINGLE if method == "deep_ensemble" and ens is not None and ens.size == 1 else method


@dataclass
class LoadedRun:
    """A trained run rebuilt for prediction: the model (as :class:`LoadedModel`, its ``model``
    the method's network with the trained weights), the method's state, the sidecar."""

    loaded: LoadedModel
    state: TrainState | None
    sidecar: dict[str, Any]

    @property
    def method(self) -> str:
        """The method its caches record (:func:`run_method`): the training method, ``single``
        for a deep-ensemble run trained alone, ``""`` for a checkpoint uqvision did not
        train."""
        return run_method(self.sidecar)

    @property
    def ensemble(self) -> str:
        """The id of the runs it was trained with (``uqvision train --members K``, K >= 2;
        :func:`run_ensemble`), ``""`` for a run trained alone or that records none."""
        ens = run_ensemble(self.sidecar)
        return ens.id if ens is not None and ens.size > 1 else ""

    @property
    def ensemble_size(self) -> int:
        """How many runs were trained with it, itself included (1: alone); 0 where the sidecar
        records none."""
        ens = run_ensemble(self.sidecar)
        return ens.size if ens is not None else 0

    @property
    def seed(self) -> int | None:
        """The training seed (None for a checkpoint uqvision did not train)."""
        cfg = self.sidecar.get("train_config", {})
        return int(cfg["seed"]) if "seed" in cfg else None

    def samples(self, k: int, seed: int) -> Iterator[nn.Module]:
        """The run's ``k`` prediction networks (eval mode): the method's samples, or the
        model itself (``k = 1``) for a checkpoint without method state."""
        if self.state is None:
            if k != 1:
                raise ValueError(f"k={k} but {self.loaded.spec.row!r} is one network")
            self.loaded.model.eval()
            return iter([self.loaded.model])
        return self.state.method.samples(self.state, k, seed)

    def default_samples(self) -> int:
        """Snapshots taken, 1 for an independent run or a plain checkpoint, else 10."""
        if self.state is None or self.state.method.independent_runs:
            return 1
        return len(self.state.snapshots) or 10


def load_run(spec: ModelSpec | str, *, num_classes: int | None = None, device: str = "cpu",
             train_data: str | os.PathLike | None = None, bn_batch_size: int | None = None,
             allow_random_init: bool = False, seed: int = 0) -> LoadedRun:
    """Rebuild a run for prediction.

    A checkpoint whose sidecar names a training method is rebuilt through the method
    (``method.restore`` with ``OUT.state.safetensors``, then the weights). A method whose
    hyper-parameters have a true ``bn_update`` (SWAG, K-FAC Laplace: each sample's BatchNorm
    statistics are recomputed) gets a BatchNorm loader over ``train_data`` (default: the
    training folder and view the sidecar records) in a fixed order with one seeded
    augmentation per sample; no other run reads its training folder. Such a run with
    BatchNorm layers and no training folder is refused (``uqmetrics.InputError`` naming the
    folder and ``--train-data``): its samples would silently keep the final iterate's
    statistics. Anything else goes through :func:`uqvision.models.load_model` and is one
    network.

    A ``deep_ensemble`` sidecar without an ``ensemble`` entry (written before runs recorded
    one) is read as a deep-ensemble member with no ensemble id, with an
    :class:`UndeclaredEnsembleWarning`; a malformed ``ensemble`` is refused
    (``uqmetrics.InputError`` naming the sidecar), and so is a ``pretrained_cfg`` that gives
    anything but the preprocessing (a weight ``file``, an ``hf_hub_id``) or lacks a field of it
    (:func:`_run_data_config`).
    """
    spec = check_model_spec(spec)
    side = read_sidecar(spec.checkpoint) if spec.checkpoint else {}
    run_ensemble(side, f"sidecar {str(sidecar_path(spec.checkpoint))!r}" if side else "")
    if side.get("method") == "deep_ensemble" and "ensemble" not in side:
        warnings.warn(f"checkpoint {str(spec.checkpoint)!r} was trained before runs recorded "
                      "their ensemble: read as method 'deep_ensemble' with no ensemble id, so "
                      "which networks were trained with it is unknown (a run of uqvision "
                      "train now records it: single alone, deep_ensemble with --members K)",
                      UndeclaredEnsembleWarning, stacklevel=2)
    if "method" not in side:
        loaded = load_model(spec, num_classes=num_classes, device=device,
                            allow_random_init=allow_random_init, seed=seed)
        return LoadedRun(loaded, None, side)

    method = TRAINING_METHODS.lookup(side["method"])
    if num_classes is not None and side["num_classes"] != num_classes:
        raise ValueError(f"checkpoint {spec.checkpoint!r} has a {side['num_classes']}-class head "
                         f"but the dataset has {num_classes} classes")
    dcfg = _run_data_config(side["pretrained_cfg"],
                            f"sidecar {str(sidecar_path(spec.checkpoint))!r}: pretrained_cfg")
    cfg = side.get("train_config", {})
    # a sidecar is data: its timm kwargs never fetch or read weights of their own, and each
    # is one the architecture takes
    check_model_kwargs(side.get("model_kwargs", {}),
                       f"sidecar {str(sidecar_path(spec.checkpoint))!r}: model_kwargs",
                       arch=side["architecture"])
    hp = method.hparams_from(_hparams_values(side["hparams"]))
    state_file = side.get("state_file")
    if state_file:
        if not isinstance(state_file, str) or Path(state_file).name != state_file:
            raise InputError(f"sidecar {str(sidecar_path(spec.checkpoint))!r}: its 'state_file' "
                             f"must be a file name beside the checkpoint, got {state_file!r}")
        state_file = Path(spec.checkpoint).parent / state_file
        if not state_file.is_file():
            raise FileNotFoundError(f"state file {str(state_file)!r} of checkpoint "
                                    f"{str(spec.checkpoint)!r} does not exist")
        check_checkpoint_file(state_file)
    tensors = safetensors.torch.load_file(str(state_file)) if state_file else {}
    # building and wrapping initialise layers (overwritten by the checkpoint below): keep the
    # caller's global RNG out of it
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        base = build_model(side["architecture"], side["num_classes"], dcfg,
                            side.get("model_kwargs", {})).to(device)
        if cfg.get("spectral"):
            spectral_normalize(base)
        state = method.restore(base, hp, tensors, side["state_meta"])
    state.model.load_state_dict(safetensors.torch.load_file(str(spec.checkpoint),
                                                            device=str(device)))
    state.model.to(device).eval()
    folder = train_data or side.get("dataset")
    if getattr(hp, "bn_update", False) and has_batchnorm(state.net):
        if not folder or not Path(folder).is_dir():
            raise InputError(
                f"{side['method']} recomputes each sample's BatchNorm statistics on its "
                f"training folder, but {str(folder)!r} is not a folder: give it with "
                f"--train-data (or train with --set bn_update=false)")
        augment = cfg.get("augment")
        tf = tta_transform(augment, dcfg) if augment else eval_transform(dcfg)
        view = image_view(folder, tf, classes=cfg.get("classes"),  # the run's own images
                          index_file=None if train_data else cfg.get("index_file"))
        state.bn_loader = shuffled_loader(view, int(cfg.get("seed", 0)),
                                          bn_batch_size or hp.batch_size, augment=bool(augment))
    loaded = LoadedModel(state.net, spec, dcfg, eval_transform(dcfg), int(side["num_classes"]),
                         side["architecture"], side.get("tag", ""),
                         weights_sha256(spec))  # hashed once per process (the checks too)
    return LoadedRun(loaded, state, side)


#: The fields of a trained run's ``pretrained_cfg`` that :class:`~uqvision.data.DataConfig`
#: needs, each a list of numbers (``uqvision train`` writes them all).
_NEEDED = ("input_size", "mean", "std")


def _run_data_config(pretrained_cfg: Any, where: str) -> DataConfig:
    """The preprocessing a trained run's sidecar records (its ``pretrained_cfg``, as
    :meth:`~uqvision.data.DataConfig.to_dict` writes it): preprocessing fields only, never a
    field saying where weights come from (:func:`uqvision.models.check_sidecar_pretrained_cfg`,
    as for a checkpoint loaded through its source), each of its kind.

    Raises
    ------
    uqmetrics.InputError
        The message starts with ``where`` (the sidecar read) and names the field and its value.
    """
    cfg = check_sidecar_pretrained_cfg(pretrained_cfg, where)
    for key in _NEEDED:
        value = cfg.get(key)
        if not (isinstance(value, list) and value
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            raise InputError(f"{where}: {key!r} must be a list of numbers (the preprocessing "
                             f"uqvision train recorded), got {value!r:.80}")
    if len(cfg["input_size"]) != 3 or not all(isinstance(v, int) and v > 0
                                              for v in cfg["input_size"]):
        raise InputError(f"{where}: 'input_size' must be [channels, height, width], positive "
                         f"integers, got {cfg['input_size']!r:.80}")
    kinds = {"crop_pct": (int, float), "interpolation": str, "crop_mode": str}
    for key, kind in kinds.items():
        value = cfg.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise InputError(f"{where}: {key!r} = {value!r:.80} is not a "
                             f"{'number' if key == 'crop_pct' else 'string'}")
    return DataConfig.from_dict(cfg)


def run_matches(checkpoint: str | os.PathLike, config: Any, *,
                data_fingerprint: str | None = None) -> bool:
    """Whether ``checkpoint`` is the run ``config`` trains: its sidecar records that config.

    A reproduction driver retrains a run unless this holds (a rerun resumes; a changed
    setting retrains). Teachers (``config.teachers``, ``NAME=PATH`` specs of a distilled
    student) are compared by name and by the SHA-256 of their weights, which the sidecar
    records (``teachers_sha256``), not by path: a run folder moved elsewhere keeps its
    students, and a teacher retrained in place retrains them. A sidecar written before that
    record compares its teachers by path. The checkpoint a run started from
    (``config.init_checkpoint``, a fine-tuned run's) must also still hold the weights it
    started from (the sidecar's ``init_sha256``): one retrained in place retrains the runs
    fine-tuned from it.

    Parameters
    ----------
    checkpoint : path
        The run's checkpoint (``OUT.safetensors``) written by
        :func:`uqvision.training.loop.train_model`.
    config : dataclass
        The training config (:class:`uqvision.training.loop.ImageTrainConfig`), compared as its
        sidecar records it (``asdict`` through JSON).
    data_fingerprint : str, optional
        The dataset fingerprint (:func:`uqvision.data.dataset_fingerprint`) of the folder the
        run trains on now: the sidecar's ``dataset_fingerprint`` must equal it (a run trained on
        another folder, or on this one before its images changed, is not this run). The caller
        computes it once for the runs of one folder; ``None``: not compared.

    Returns
    -------
    bool
        ``False`` where the checkpoint does not exist, its sidecar's ``train_config`` differs,
        or it was trained on other data than ``data_fingerprint``.
    """
    ckpt = Path(checkpoint)
    if not ckpt.is_file():
        return False
    side, want = read_sidecar(ckpt), json.loads(json.dumps(asdict(config)))
    if data_fingerprint is not None and side.get("dataset_fingerprint") != data_fingerprint:
        return False
    init = getattr(config, "init_checkpoint", None)
    if init and side.get("init_sha256") != (file_sha256(init) if Path(init).is_file() else None):
        return False
    got, recorded = side.get("train_config"), side.get("teachers_sha256")
    teachers = list(getattr(config, "teachers", ()) or ())
    if not isinstance(got, dict) or recorded is None:  # recorded before teachers' digests
        return got == want

    def names(specs) -> list[str]:
        return [ModelSpec.parse(str(t)).name for t in specs]

    return ({**got, "teachers": None} == {**want, "teachers": None}
            and names(got.get("teachers") or ()) == names(teachers)
            and recorded == [weights_sha256(t) for t in teachers])


def _hparams_values(recorded: dict[str, Any]) -> dict[str, Any]:
    """Recorded hyper-parameters back to field values (JSON turned tuples into lists)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in recorded.items()}
