"""ONE training loop for every training method, saving checkpoints timm reloads.

:func:`train_model` trains a timm architecture on an image folder with a method of
:data:`uqvision.training.method.TRAINING_METHODS` (``uqvision train --method NAME --set key=value``):
the loop owns the data, the device, the process group, the checkpoint and the timing; the
method's hooks own the model wrapper, the optimiser, the learning rate at every step, the loss,
the snapshots and any post-training fit (see :mod:`uqvision.training.method`).

Data. Each epoch is a permutation of the training set seeded by ``(seed, epoch)``, cut into
global batches of ``batch_size`` (the last incomplete batch dropped when the set has more
than one batch); sample ``i`` of epoch ``e`` gets its random augmentation from its own
generator seeded by ``(seed, e, i)``. A run is therefore a pure function of the seed, whatever
``num_workers``, and never reads the caller's global torch RNG (which it leaves as it was).

Processes. Under ``torchrun`` the same loop runs with ``DistributedDataParallel``: every global
batch is split into contiguous shards (``numpy.array_split``: exact, sizes differ by at most
one, nothing padded or repeated) and each rank's loss is weighted by its share
(``state.loss_scale``), so the averaged gradient is that of the global batch's mean loss and
the weights match a one-process run with the same global batch to float rounding. BatchNorm
statistics are per rank on CPU (gloo has no ``SyncBatchNorm``); on CUDA BatchNorm layers become
``SyncBatchNorm`` (global-batch statistics). Rank 0 writes the files.

Files. ``OUT.safetensors`` holds the trained network's state dict (head included; for a
method that wraps the model, e.g. VI's ``log_sigma``, the wrapped one); ``OUT.json`` (sidecar)
the preprocessing (``pretrained_cfg``), the timm kwargs, the classes, the full config, the
method and its hyper-parameters, the cost: epochs, gradient steps and wall time, of this
run and cumulated over the checkpoint it started from (``init_checkpoint``), and, for a run
trained as part of a declared group, its :class:`EnsembleMember` (``ensemble``). What a method
fitted besides the weights (snapshots, SWAG moments, K-FAC factors; ``export_state``) goes to
``OUT.state.safetensors``. A checkpoint of a method that keeps the model's keys reloads
through timm's own pretrained-file mechanism (``timm.create_model(arch, pretrained=True,
pretrained_cfg_overlay=dict(file=ckpt, ...))``); :func:`uqvision.training.runs.load_run`
rebuilds any method's state to draw its prediction samples.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch  # its functions looked up at call time (tests patch them)
import timm
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from uqmetrics import provenance_attrs
from uqmetrics.runs.io import temporary_beside
from uqmetrics.runs.sweep import progress_bar

from ..data import (
    DataConfig,
    ImageFolderDataset,
    dataset_fingerprint,
    derive_seed,
    eval_transform,
    flush_denormal,
    image_view,
    readable_images,
    tta_transform,
)
from ..exceptions import worker_errors
from ..models import (
    LoadedModel,
    check_checkpoint_file,
    check_model_kwargs,
    check_model_name,
    file_sha256,
    load_model,
    read_sidecar,
    read_state_dict,
    sidecar_path,
    weights_sha256,
    write_checkpoint,
)
from ..models.spectral import spectral_normalize
from ..runtime import distributed_context
from .config import ADAMW_RECIPE, ImageTrainConfig, TrainConfig
from .method import TRAINING_METHODS, TrainState, export_state

__all__ = [
    "ADAMW_RECIPE",
    "CHECKPOINT_FORMAT",
    "EnsembleMember",
    "ImageTrainConfig",
    "TrainConfig",
    "TrainResult",
    "build_model",
    "checkpoint_files",
    "epoch_batches",
    "new_ensemble_id",
    "shuffled_loader",
    "state_path",
    "train_model",
]

#: Sidecar format written by :func:`train_model` (``/2``: with the method and the cost).
CHECKPOINT_FORMAT = "uqvision.checkpoint/2"

@dataclass(frozen=True)
class EnsembleMember:
    """A run's place among the runs of one ``uqvision train`` command (the sidecar's
    ``ensemble``).

    ``id`` names the command's runs: the same on each of them, another for every command
    (:func:`new_ensemble_id`), so that only networks trained together are averaged. ``size``
    is their number: 1 is a single model, and a run of the ``deep_ensemble`` method with
    ``size >= 2`` is a member of a deep ensemble. ``member`` is this run's position among them
    (0-based, in the order of the seeds).
    """

    id: str
    size: int
    member: int

    def __post_init__(self):
        if not (isinstance(self.id, str) and self.id and isinstance(self.size, int)
                and isinstance(self.member, int) and 0 <= self.member < self.size):
            raise ValueError(f"an ensemble member needs an id, size >= 1 and 0 <= member < "
                             f"size, got id={self.id!r}, size={self.size!r}, "
                             f"member={self.member!r}")


def new_ensemble_id() -> str:
    """A new ensemble id: the UTC time and 8 random hex digits (``20250102T030405-1a2b3c4d``),
    unique to one ``uqvision train`` command."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + secrets.token_hex(4)




@dataclass
class TrainResult:
    """Paths written, the trained model (eval mode), the method's state, the cost.

    ``losses``: per-epoch mean training loss (the method's objective; rank 0's shard under
    torchrun). ``epochs``/``steps``/``wall_time_s``: this run's cost.
    """

    checkpoint: Path
    sidecar: Path
    model: nn.Module
    state: TrainState
    losses: list[float] = field(default_factory=list)
    epochs: float = 0.0
    steps: int = 0
    wall_time_s: float = 0.0
    state_file: Path | None = None


def state_path(checkpoint: str | os.PathLike) -> Path:
    """``m.safetensors`` -> ``m.state.safetensors`` (a method's fitted state, if any)."""
    return Path(checkpoint).with_suffix(".state.safetensors")


def epoch_batches(n: int, batch_size: int, seed: int, epoch: int, *,
                  drop_last: bool | None = None) -> list[np.ndarray]:
    """The global batches of an epoch: a permutation seeded by ``(seed, epoch)`` cut into
    batches of ``batch_size`` (``drop_last``: default when ``n > batch_size``).

    Examples
    --------
    >>> [len(b) for b in epoch_batches(10, 4, 0, 0)]
    [4, 4]
    >>> sorted(np.concatenate(epoch_batches(10, 4, 0, 0, drop_last=False)).tolist()) == list(range(10))
    True
    """
    drop_last = n > batch_size if drop_last is None else drop_last
    gen = torch.Generator().manual_seed(derive_seed(seed, 0x5EED, epoch))
    perm = torch.randperm(n, generator=gen).numpy()
    count = n // batch_size if drop_last else math.ceil(n / batch_size)
    return [perm[b * batch_size:(b + 1) * batch_size] for b in range(count)]


class _Objective:
    """The negative log-likelihood the method's hooks see, ``nll(output, y, reduction)``:
    cross-entropy with label smoothing, or distillation from a teacher ensemble (whose soft
    targets :meth:`batch` computes for the next training batch)."""

    def __init__(self, config: ImageTrainConfig, classes: list[str], dcfg: DataConfig, device: str):
        if not 0 <= config.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got "
                             f"{config.label_smoothing!r}")
        self.smoothing = config.label_smoothing
        self.alpha, self.temperature = config.distill_alpha, config.distill_temperature
        self.teachers: list[LoadedModel] = []
        self.target: torch.Tensor | None = None
        if config.teachers:
            if not (0 <= self.alpha <= 1 and self.temperature > 0):
                raise ValueError(f"distill_alpha must be in [0, 1] and distill_temperature > 0, "
                                 f"got {self.alpha!r}, {self.temperature!r}")
            self.teachers = [load_model(t, num_classes=len(classes), device=device)
                             for t in config.teachers]
        for spec, t in zip(config.teachers, self.teachers, strict=True):
            if t.spec.checkpoint and read_sidecar(t.spec.checkpoint).get("classes",
                                                                          classes) != classes:
                raise ValueError(f"teacher {spec!r} was trained on other classes")
            if (t.data_config.input_size, t.data_config.mean, t.data_config.std) != (
                    dcfg.input_size, dcfg.mean, dcfg.std):
                raise ValueError(f"teacher {spec!r} expects input {t.data_config.input_size} "
                                 f"normalised by {t.data_config.mean}/{t.data_config.std}; the "
                                 f"student sees {dcfg.input_size}, {dcfg.mean}/{dcfg.std}")

    def batch(self, x: torch.Tensor) -> None:
        if self.teachers:
            with torch.no_grad():
                self.target = torch.stack([torch.softmax(t.model(x) / self.temperature, 1)
                                           for t in self.teachers]).mean(0)

    def __call__(self, output: torch.Tensor, y: torch.Tensor,
                 reduction: str = "mean") -> torch.Tensor:
        ce = F.cross_entropy(output, y, label_smoothing=self.smoothing, reduction=reduction)
        if not self.teachers or self.target is None:  # outside training steps: the likelihood
            return ce
        t = self.temperature
        kd = F.kl_div(F.log_softmax(output / t, 1), self.target, reduction="none").sum(1)
        kd = {"mean": kd.mean(), "sum": kd.sum(), "none": kd}[reduction]
        return (1 - self.alpha) * ce + self.alpha * t * t * kd


def _loss_function(config: ImageTrainConfig, classes: list[str], dcfg: DataConfig,
                   device: str = "cpu"):
    """``loss(logits, y, x)``: the training objective of ``config`` on one batch ``x``."""
    objective = _Objective(config, classes, dcfg, device)

    def loss(logits: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        objective.batch(x)
        return objective(logits, y)

    return loss


def _data_config(config: ImageTrainConfig) -> DataConfig:
    s = int(config.input_size)
    return DataConfig((3, s, s), tuple(config.mean), tuple(config.std), crop_pct=1.0,
                      interpolation="bilinear")


def build_model(arch: str, n_classes: int, dcfg: DataConfig, model_kwargs: dict) -> nn.Module:
    check_model_kwargs(model_kwargs)
    return timm.create_model(arch, num_classes=n_classes, pretrained_cfg_overlay=dcfg.to_dict(),
                             **model_kwargs)


def _load_weights(model: nn.Module, checkpoint: str | os.PathLike) -> None:
    """``init_checkpoint``'s weights into ``model``: tensors only (a pickled file from someone
    else never runs code, whatever timm's version), a file that does not load named."""
    if not Path(checkpoint).is_file():
        raise FileNotFoundError(f"checkpoint {str(checkpoint)!r} does not exist")
    model.load_state_dict(read_state_dict(checkpoint))


def _checkpoint_path(out: str | os.PathLike) -> Path:
    out = Path(out)
    if out.suffix == ".safetensors":
        return out
    return out.with_suffix(out.suffix + ".safetensors") if out.suffix else out.with_suffix(
        ".safetensors")


@contextlib.contextmanager
def _own_rng(seed: int, device: str):
    """Seed the global torch RNG (initialisation, training-time dropout and VI noise) and give
    the caller's state back afterwards."""
    devices = [torch.device(device).index or 0] if device.startswith("cuda") else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def checkpoint_files(out: str | os.PathLike) -> tuple[Path, Path, Path]:
    """The files :func:`train_model` writes for ``out``: the checkpoint (``.safetensors``
    appended when ``out`` has another suffix), its sidecar and the method's state file."""
    ckpt = _checkpoint_path(out)
    return ckpt, sidecar_path(ckpt), state_path(ckpt)


def train_model(data: str | os.PathLike, out: str | os.PathLike,
                config: ImageTrainConfig | None = None, *, overwrite: bool = True,
                ensemble: EnsembleMember | None = None, progress: bool = True) -> TrainResult:
    """Train ``config.arch`` with ``config.method`` on the image folder ``data``; save to ``out``.

    Parameters
    ----------
    data : path
        Training image folder (one sub-folder per class).
    out : path
        Checkpoint path; ``.safetensors`` is appended when it has another suffix. The sidecar is
        ``out`` with suffix ``.json``, the method's state ``out.state.safetensors``.
    config : ImageTrainConfig
    overwrite : bool, default True
        ``False``: an existing checkpoint, sidecar or state file (:func:`checkpoint_files`) is
        refused before anything is trained (``uqvision train`` without ``--overwrite``).
        ``True``: an earlier checkpoint and state file at ``out`` are deleted once training
        ends, before this run's files are written (a kill meanwhile leaves no checkpoint).
    ensemble : EnsembleMember, optional
        The run's place among the runs trained together (``uqvision train`` gives it to every
        run: ``size`` 1 for one run, which its caches then mark ``method = "single"``),
        recorded in the sidecar as ``ensemble``. ``None`` records ``null``: the run is read as
        its training method's, with no ensemble id (a caller that trains several runs groups
        them itself), as a sidecar written before this record existed is (which
        :func:`uqvision.training.runs.load_run` notes).
    progress : bool, default True
        A progress bar over the gradient steps on stderr, the epochs done and the last one's
        mean loss beside it (rank 0 only; :func:`uqmetrics.runs.sweep.progress_bar`: a line
        at most every 30 s in a log; none once ``uqvision --quiet`` or
        :func:`uqmetrics.runs.sweep.set_progress` turned progress off). The run does not
        depend on it.

    Returns
    -------
    TrainResult
        Paths, the trained model and state, per-epoch mean loss, the cost. Under ``torchrun``
        every rank returns it (rank 0 wrote the files).

    Raises
    ------
    FileExistsError
        ``overwrite=False`` and a file of ``out`` exists.
    uqvision.exceptions.BadImageError
        An image of ``data`` (of the view ``config.classes`` / ``config.index_file`` makes)
        or of ``config.val_data`` that does not read, named before anything is built; one that
        breaks during the run, in the same one line whatever ``config.num_workers``.
    """
    config = config or ImageTrainConfig()
    check_model_name(config.arch)
    if "." in config.arch:
        raise ValueError("train from an architecture name without a pretrained tag, "
                         f"got {config.arch!r}")
    method = TRAINING_METHODS.lookup(config.method)
    hp = config.method_hparams()
    check_model_kwargs(config.model_kwargs, "model_kwargs", arch=config.arch)
    t0 = time.perf_counter()
    out = _checkpoint_path(out)
    if not overwrite:
        for path in checkpoint_files(out):
            if path.exists():
                raise FileExistsError(f"{str(path)!r} already exists; pass overwrite=True "
                                      "(--overwrite) to replace it")
    if config.init_checkpoint:
        check_checkpoint_file(config.init_checkpoint)
    dcfg = _data_config(config)
    train_tf = tta_transform(config.augment, dcfg) if config.augment else eval_transform(dcfg)
    ds = image_view(data, train_tf, classes=config.classes, index_file=config.index_file)
    init_side = read_sidecar(config.init_checkpoint) if config.init_checkpoint else {}
    if init_side.get("classes", ds.classes) != ds.classes:
        raise ValueError(f"init_checkpoint {config.init_checkpoint!r} was trained on other "
                         "classes")
    val = ImageFolderDataset(config.val_data, eval_transform(dcfg)) if config.val_data else None
    for images in (ds, val):  # before anything is built, as predict checks its folder
        _check_images(images)
    model_kwargs = {"drop_rate": config.drop_rate, **config.model_kwargs}
    with (_own_rng(config.seed, config.device), flush_denormal(), worker_errors(),
          distributed_context(config.device) as (world, rank, device)):
        if hp.batch_size < world:
            raise ValueError(f"batch_size {hp.batch_size} is smaller than the {world} "
                             "processes")
        model = build_model(config.arch, len(ds.classes), dcfg, model_kwargs)
        if config.init_checkpoint:
            _load_weights(model, config.init_checkpoint)
        if config.spectral:
            spectral_normalize(model)
        model.to(device)
        objective = _Objective(config, ds.classes, dcfg, device)
        if world > 1 and device.startswith("cuda"):
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        n_batches = len(epoch_batches(len(ds), hp.batch_size, config.seed, 0))
        state = method.start(model, hp, n_train=len(ds), steps_per_epoch=n_batches,
                             seed=config.seed, nll=objective)
        if config.amp:
            dev = torch.device(device).type
            state.autocast = functools.partial(
                torch.autocast, dev, dtype=torch.float16 if dev == "cuda" else torch.bfloat16)
            if dev == "cuda":
                state.scaler = torch.amp.GradScaler("cuda")
        if world > 1:
            state.model = DistributedDataParallel(
                state.model, device_ids=[torch.device(device).index] if device.startswith(
                    "cuda") else None, find_unused_parameters=True)
        bar = progress_bar(state.total_steps, f"train {config.tag or config.arch} "
                           f"s{config.seed}", unit="step", enabled=progress and rank == 0)
        try:
            losses = _fit(state, ds, objective, config, hp.batch_size, world, rank, device, bar)
        finally:
            bar.close()
        post = _post_fit_loader(ds, config, hp.batch_size, device)
        val_loader = (DataLoader(val, batch_size=hp.batch_size, num_workers=config.num_workers)
                      if val is not None else None)
        method.finish(state, post, val_loader)
        state.model = state.net  # unwrap DDP for saving and prediction
    wall = time.perf_counter() - t0
    sidecar = _sidecar(config, hp, ds, data, dcfg, model_kwargs, state, losses, wall, world,
                       init_side)
    sidecar["ensemble"] = asdict(ensemble) if ensemble is not None else None
    state_file = None
    if rank == 0:
        # an earlier run's weights and state (overwrite) go first: a kill while this run's files
        # are written leaves no checkpoint, never the earlier weights under this run's sidecar
        for path in (out, state_path(out)):
            path.unlink(missing_ok=True)
        tensors, _ = export_state(state)
        if tensors:
            state_file = state_path(out)
            _save_tensors(tensors, state_file)
        sidecar["state_file"] = state_file.name if state_file else None
        write_checkpoint(state.net, out, sidecar)
    return TrainResult(out, sidecar_path(out), state.net, state, losses,
                       state.step / state.steps_per_epoch, state.step, wall, state_file)


def _check_images(ds) -> None:
    """Refuse a training or validation set (an image folder or a view of one, ``None``: none)
    with an image that does not read (:func:`uqvision.data.readable_images`, checked once per
    process), naming it, before anything is built: else the run would stop at the first batch
    holding it, an epoch or more later. Only the view's images are checked."""
    if ds is None:
        return
    folder = getattr(ds, "base", ds)  # a ClassSubset's folder
    used = set(ds.sample_ids)
    readable_images(folder.without([rel for rel in folder.sample_ids if rel not in used]),
                    skip_option=None)  # train leaves no image out


def _save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    with temporary_beside(path) as tmp:
        safetensors.torch.save_file(tensors, str(tmp))
        os.replace(tmp, path)


def _train_loader(ds: ImageFolderDataset, config: ImageTrainConfig, batch_size: int, epoch: int,
                  world: int, rank: int) -> tuple[DataLoader, list[tuple[int, int]]]:
    """This rank's shard of every global batch of ``epoch`` (augmentation seeded per sample),
    and each batch's (local, global) sizes."""
    batches = epoch_batches(len(ds), batch_size, config.seed, epoch)
    shards = [np.array_split(b, world)[rank] for b in batches]
    if ds.transform is not None and config.augment:
        ds.augment_seed = derive_seed(config.seed, epoch)
    loader = DataLoader(ds, batch_sampler=[s.tolist() for s in shards],
                        num_workers=config.num_workers,
                        pin_memory=config.device.startswith("cuda"))
    return loader, [(len(s), len(b)) for s, b in zip(shards, batches, strict=True)]


def _fit(state: TrainState, ds: ImageFolderDataset, objective: _Objective, config: ImageTrainConfig,
         batch_size: int, world: int, rank: int, device: str, bar) -> list[float]:
    """The epoch loop of :mod:`uqvision.training.method`; per-epoch mean loss. ``bar``
    (:func:`~uqmetrics.runs.sweep.progress_bar`) advances by one per gradient step, the
    epochs done and the last one's mean loss beside it."""
    method, losses, epoch = state.method, [], 0
    epochs = math.ceil(state.total_steps / max(state.steps_per_epoch, 1))
    while not state.done:
        loader, sizes = _train_loader(ds, config, batch_size, epoch, world, rank)
        total, n = 0.0, 0
        for (x, y, _idx), (local, glob) in zip(loader, sizes, strict=False):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            state.loss_scale = world * local / glob
            objective.batch(x)
            loss = method.step(state, x, y)
            objective.target = None  # teacher targets belong to this batch only
            total += float(loss) * local
            n += local
            bar.update(1)
            if state.done:
                break
        method.end_epoch(state)
        losses.append(total / max(n, 1))
        epoch += 1
        bar.set_postfix_str(f"epoch {epoch}/{epochs} loss {losses[-1]:.4f}")
    state.loss_scale = 1.0
    return losses


def _post_fit_loader(ds, config: ImageTrainConfig, batch_size: int, device: str) -> DataLoader:
    """What post-fits (K-FAC) and BatchNorm updates of sampled weights see: the training set
    with one seeded augmentation per sample, the same in every process."""
    return shuffled_loader(ds, config.seed, batch_size, augment=bool(config.augment),
                           num_workers=config.num_workers, pin_memory=device.startswith("cuda"))


def shuffled_loader(dataset, seed: int, batch_size: int, *, augment: bool,
                    **loader_options) -> DataLoader:
    """All of ``dataset`` (an image folder or a view of one) in one fixed random order (seeded),
    in ``ceil(n / batch_size)`` batches of nearly equal size, one seeded augmentation per
    sample when ``augment`` (the dataset's transform must then be a ``SeededAugmentation``).

    Random batches matter for BatchNorm statistics: an average of within-batch variances over
    class-sorted batches misses the variance between classes (it halved the first layer's
    variance of a hierarchy network, and cost it 10 points of accuracy).
    """
    key = derive_seed(seed, 0xB4)
    data = dataset.with_augment_seed(key if augment else None)
    perm = np.concatenate(epoch_batches(len(data), batch_size, key, 0, drop_last=False))
    # every sample once, in batches of (nearly) equal size: no batch of one for BatchNorm
    batches = np.array_split(perm, math.ceil(len(data) / batch_size))
    return DataLoader(data, batch_sampler=[b.tolist() for b in batches], **loader_options)


def _sidecar(config, hp, ds, data, dcfg, model_kwargs, state, losses, wall, world,
             init_side) -> dict[str, Any]:
    cfg = asdict(config)
    cfg["teachers"] = list(config.teachers)
    cfg["classes"] = (dict(config.classes) if isinstance(config.classes, dict)
                      else list(config.classes) if config.classes else None)
    _, meta = export_state(state)
    prior = init_side.get("cost", {})
    cost = {"epochs": state.step / state.steps_per_epoch, "steps": state.step,
            "wall_time_s": wall, "world_size": world,
            "total_epochs": prior.get("total_epochs", 0.0) + state.step / state.steps_per_epoch,
            "total_steps": prior.get("total_steps", 0) + state.step,
            "total_wall_time_s": prior.get("total_wall_time_s", 0.0) + wall}
    default_tag = Path(data).resolve().parent.name + (
        "" if config.method == "deep_ensemble" else f"_{config.method}") + f"_s{config.seed}"
    return {
        "format": CHECKPOINT_FORMAT,
        "architecture": config.arch,
        "tag": config.tag or default_tag,
        "num_classes": len(ds.classes),
        "classes": ds.classes,
        "pretrained_cfg": dcfg.to_dict(),
        "model_kwargs": model_kwargs,
        "train_config": cfg,
        # the teachers by content (uqvision.training.runs.run_matches), not by path
        "teachers_sha256": [weights_sha256(t) for t in config.teachers],
        "method": config.method,
        "hparams": dataclasses.asdict(hp),
        "state_meta": meta,
        "cost": cost,
        "init_checkpoint": str(config.init_checkpoint or ""),
        "init_sha256": file_sha256(config.init_checkpoint) if config.init_checkpoint else "",
        "dataset": str(Path(data).resolve()),
        "dataset_fingerprint": dataset_fingerprint(data),
        "train_losses": losses,
        "provenance": provenance_attrs(config=cfg, seed=config.seed),
    }
