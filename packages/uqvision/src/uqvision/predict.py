"""Run a model over an image folder once and cache per-sample logits (one file per pass).

Modes (:data:`PASS_MODES`):

- ``plain``: the model's own evaluation preprocessing, one pass;
- ``tta``: one random augmentation per pass (policy of :data:`uqvision.data.TTA_POLICIES`);
  pass ``p`` of sample ``i`` is a pure function of ``(seed, p, i)``;
- ``mc_dropout``: dropout masks drawn per sample (:class:`uqvision.dropout.PerSampleDropout`;
  the rest of the model, BatchNorm included, in eval mode), ``passes`` forward passes per
  batch sharing one data loading; one file with logits (pass, sample, class). Pass ``r`` of
  sample ``i`` is a pure function of ``(seed, r, i)``;
- ``crop``: URL's centre crop to a per-sample fraction in [0.1, 0.75] of the short side, drawn
  once from ``derive_seed(seed, i)`` (:mod:`uqvision.crop`), recorded as ``crop_fraction``.

A network that gives its own uncertainty — a :class:`uqvision.uheads.URLModel` (the URL
methods, V.4) — returns ``(logits, u, embedding)``: its caches also hold ``uncertainty``
(sample) and, with ``embeddings``, its embedding; the noise of its stochastic heads is drawn
per sample from ``(seed, sample index)``. With ``logits=False`` a cache keeps no logits and
the folder's classes need not be the model's (zero-shot embeddings of unseen classes).

ONE path from a training method's prediction samples to caches: a checkpoint trained by
:func:`uqvision.train.train_model` is rebuilt through its method
(:func:`uqvision.train.load_run`), and each of its K samples — deep-ensemble member,
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

import atexit
import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import xarray as xr
from torch.utils.data import DataLoader, Subset
from uqmetrics import provenance_attrs, write_dataset
from uqmetrics.registry import Registry

from .cache import cache_dataset, cache_key, read_cache
from .crop import crop_fractions, crop_transform
from .data import (
    TTA_POLICIES,
    ImageFolderDataset,
    dataset_fingerprint,
    derive_seed,
    flush_denormal,
    tta_transform,
)
from .dropout import PerSampleDropout
from .methods.registry import TRAINING_METHODS, StochasticPass
from .models import LoadedModel, ModelSpec, file_sha256, read_sidecar
from .uheads import URLModel

__all__ = [
    "DEFAULT_PASSES",
    "PASS_MODES",
    "PredictConfig",
    "distributed_context",
    "predict",
    "predict_to_files",
    "shard_indices",
]


@dataclass
class PredictConfig:
    """Options of :func:`predict` (recorded in every cache's ``config`` attr).

    ``passes`` counts TTA augmentations or MC-dropout passes (ignored for ``plain``); ``None``
    (the default) means :data:`DEFAULT_PASSES` of the mode (MC dropout: the Selective paper's
    30); ``first_pass`` offsets the TTA pass indices (pass ``p`` uses seed ``derive_seed(seed, p)``),
    so a member ``k`` of an ensemble can run its own pass ``k``; ``seed`` also seeds the
    MC-dropout masks (sample ``i`` in pass ``r``: ``derive_seed(seed, r, i)``).

    A checkpoint trained by :func:`uqvision.train.train_model` yields its method's prediction
    samples (snapshots, posterior draws, stochastic passes; one network for a deep-ensemble
    member): ``samples`` of them from ``first_sample`` on (``None``: every snapshot, 10
    posterior draws or passes, the network itself), one cache per sample and pass. Sample
    ``k`` of a run trained with seed ``s`` draws its weights / noise from
    ``derive_seed(seed, s)`` and its TTA pass ``p`` from ``derive_seed(derive_seed(seed, s,
    k), p)``, so members and samples never share an augmentation. ``train_data`` is the
    folder the BatchNorm statistics of sampled weights are recomputed on (SWAG, K-FAC
    Laplace; default: the run's training folder). ``logits=False`` (with ``embeddings``): no
    logits are kept and the folder may have other classes than the model (zero-shot, V.4).
    """

    mode: str = "plain"
    passes: int | None = None
    first_pass: int = 0
    tta_policy: str = "imagenet"
    seed: int = 0
    batch_size: int = 64
    num_workers: int = 0
    device: str = "cpu"
    amp: bool = False
    embeddings: bool = False
    allow_random_init: bool = False
    samples: int | None = None
    first_sample: int = 0
    train_data: str | None = None
    logits: bool = True

    def __post_init__(self):
        if self.passes is None:
            self.passes = DEFAULT_PASSES.get(self.mode, 1)
        if not self.logits and not self.embeddings:
            raise ValueError("logits=False needs embeddings=True (a cache without logits "
                             "holds embeddings)")


#: Passes of a mode when ``PredictConfig.passes`` is not given (1 for the others).
DEFAULT_PASSES: dict[str, int] = {"mc_dropout": 30}


def shard_indices(n: int, world_size: int, rank: int) -> np.ndarray:
    """Contiguous shard ``rank`` of ``range(n)`` over ``world_size`` ranks (sizes differ by ≤ 1).

    Examples
    --------
    >>> [shard_indices(5, 2, r).tolist() for r in range(2)]
    [[0, 1, 2], [3, 4]]
    """
    return np.array_split(np.arange(n), world_size)[rank]


@contextlib.contextmanager
def distributed_context(device: str):
    """Initialise ``torch.distributed`` from torchrun's environment, if present.

    Yields ``(world_size, rank, device)``; the backend is NCCL on CUDA, gloo otherwise; the
    device becomes ``cuda:LOCAL_RANK`` for a CUDA run. Without ``WORLD_SIZE > 1`` in the
    environment and no initialised group, yields ``(1, 0, device)``.

    The process group is initialised once per process and kept until the process exits: a
    torchrun job cannot re-initialise its group (the second group finds the first one's stale
    addresses in torchrun's store), and every TTA pass and every model of ``uqvision predict``
    enters this context.
    """
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    ready = dist.is_available() and dist.is_initialized()
    if not ready and (world <= 1 or not dist.is_available()):
        yield 1, 0, device
        return
    if device.startswith("cuda") and "LOCAL_RANK" in os.environ:
        local = int(os.environ["LOCAL_RANK"])
        device = f"cuda:{local}"
        torch.cuda.set_device(local)
    if not ready:
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
        atexit.register(_destroy_process_group)
    yield dist.get_world_size(), dist.get_rank(), device


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _gather(local: dict[str, np.ndarray], world: int) -> dict[str, np.ndarray]:
    """Concatenate every rank's arrays along the sample axis in rank order (all ranks)."""
    if world == 1:
        return local
    import torch.distributed as dist

    parts: list = [None] * world
    dist.all_gather_object(parts, local)
    return {k: np.concatenate([p[k] for p in parts], axis=-2 if k == "logits" else 0)
            for k in local}


def _batches(dataset, indices: np.ndarray, cfg: PredictConfig):
    # the loader draws its workers' base seed from `generator` (the global RNG otherwise);
    # nothing random happens in the workers: augmentations carry their own generators
    loader = DataLoader(Subset(dataset, indices.tolist()), batch_size=cfg.batch_size,
                        shuffle=False, num_workers=cfg.num_workers,
                        pin_memory=cfg.device.startswith("cuda"),
                        generator=torch.Generator().manual_seed(cfg.seed))
    yield from loader


def _autocast(cfg: PredictConfig, device: str):
    dev = torch.device(device).type
    return torch.autocast(dev, dtype=torch.float16 if dev == "cuda" else torch.bfloat16,
                          enabled=cfg.amp)


def _forward(model: torch.nn.Module, x: torch.Tensor, embeddings: bool, ids=None,
             seed: int = 0):
    """``(logits, embedding or None, u or None)`` of a batch; ``ids`` are the samples' data-set
    indices (per-sample noise)."""
    if isinstance(model, StochasticPass):  # noise drawn per sample: (seed, pass, sample id)
        if embeddings:
            raise ValueError("embeddings of stochastic passes are not supported")
        return model(x, ids), None, None
    if isinstance(model, URLModel):  # the network gives (logits, u, embedding)
        ids = range(len(x)) if ids is None else ids
        z, u, emb = model.predict(x, ids, seed)
        return z, (emb if embeddings else None), u
    if not embeddings:
        return model(x), None, None
    if not hasattr(model, "forward_head"):
        raise ValueError("embeddings need a timm model (forward_features/forward_head)")
    emb = model.forward_head(model.forward_features(x), pre_logits=True)
    return model.get_classifier()(emb), emb, None


def _run(loaded: LoadedModel, dataset, indices: np.ndarray, cfg: PredictConfig, device: str,
         passes: int = 1, dropout: PerSampleDropout | None = None) -> dict[str, np.ndarray]:
    """Logits (passes, n_local, C), labels, sample indices, embeddings and the network's own
    u (of the first pass) of one loader pass.

    With ``dropout``, every pass ``r`` of a batch starts ``dropout.start_pass(r, indices)``.
    """
    logits, labels, idx, embs, us = [], [], [], [], []
    with torch.inference_mode():
        for x, y, i in _batches(dataset, indices, cfg):
            x = x.to(device, non_blocking=True)
            outs = []
            for r in range(passes):
                if dropout is not None:
                    dropout.start_pass(r, i.tolist())
                with _autocast(cfg, device):
                    z, e, u = _forward(loaded.model, x, cfg.embeddings and r == 0, i.tolist(),
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
    if us or isinstance(loaded.model, URLModel):
        out["uncertainty"] = np.concatenate(us) if us else np.empty(0, np.float32)
    return out


#: Prediction modes: name -> runner(loaded, data, config, local indices, device) ->
#: [(pass_index, arrays)] (``uqvision predict --mode NAME``).
PASS_MODES: Registry[Callable] = Registry("prediction mode")


@PASS_MODES.register(name="plain")
def _plain(loaded, data, cfg, idx, device):
    """The model's own evaluation preprocessing, one pass."""
    ds = ImageFolderDataset(data, loaded.transform)
    return [(0, _run(loaded, ds, idx, cfg, device))]


@PASS_MODES.register(name="tta")
def _tta(loaded, data, cfg, idx, device):
    """One random augmentation (--tta-policy) per pass, one file per pass."""
    transform = tta_transform(cfg.tta_policy, loaded.data_config)
    out = []
    for p in range(cfg.first_pass, cfg.first_pass + cfg.passes):
        ds = ImageFolderDataset(data, transform, augment_seed=derive_seed(cfg.seed, p))
        out.append((p, _run(loaded, ds, idx, cfg, device)))
    return out


@PASS_MODES.register(name="mc_dropout")
def _mc_dropout(loaded, data, cfg, idx, device):
    """Dropout masks per sample and pass, all passes in one file (pass, sample, class)."""
    try:
        dropout = PerSampleDropout(loaded.model, cfg.seed)
    except ValueError:
        raise ValueError(f"model {loaded.spec.row!r} has no dropout module with p > 0; "
                         "MC dropout is not available for it") from None
    with dropout:
        ds = ImageFolderDataset(data, loaded.transform)
        return [(0, _run(loaded, ds, idx, cfg, device, cfg.passes, dropout))]


@PASS_MODES.register(name="crop")
def _crop(loaded, data, cfg, idx, device):
    """URL's crop: centre crop to a per-sample fraction in [0.1, 0.75], resized back (S.5)."""
    ds = ImageFolderDataset(data, crop_transform(loaded.transform), augment_seed=cfg.seed)
    out = _run(loaded, ds, idx, cfg, device)
    out["crop_fraction"] = crop_fractions(cfg.seed, out["index"])
    return [(0, out)]


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


def predict(spec: ModelSpec | str, data: str | os.PathLike, config: PredictConfig | None = None,
            *, dataset_name: str | None = None,
            only: set[tuple[int, int]] | None = None,
            attrs: dict | None = None) -> list[xr.Dataset]:
    """Run ``spec`` over the image folder ``data``; return one cache Dataset per sample and pass.

    Parameters
    ----------
    spec : ModelSpec or str
        ``NAME`` or ``NAME=CHECKPOINT`` (see :class:`uqvision.models.ModelSpec`); a checkpoint
        of :func:`uqvision.train.train_model` is rebuilt through its method
        (:func:`uqvision.train.load_run`).
    data : path
        Image folder; its class count must match the checkpoint's head.
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
        ``uncertainty`` (sample) for a network with its own u, ``crop_fraction`` (sample); see
        :mod:`uqvision.cache` for the attrs (``method``, ``run``, ``sample_index`` name the
        training method, the run and the prediction sample). Every rank of a torchrun job
        returns the gathered full result.
    """
    from .train import load_run

    config = config or PredictConfig()
    run_mode = PASS_MODES.lookup(config.mode)
    if config.mode == "tta":
        TTA_POLICIES.lookup(config.tta_policy)
    if config.passes < 1 or config.batch_size < 1:
        raise ValueError(f"passes and batch_size must be >= 1, got {config.passes}, "
                         f"{config.batch_size}")
    spec = ModelSpec.parse(spec) if isinstance(spec, str) else spec
    folder = ImageFolderDataset(data)  # validates the folder before the model is built
    name = dataset_name or Path(data).resolve().name
    plan = [(k, p) for k, p, _ in cache_plan(spec, config, name)
            if only is None or (k, p) in only]
    wanted = sorted({k for k, _ in plan})
    t0 = time.perf_counter()
    results = []
    with flush_denormal(), distributed_context(config.device) as (world, rank, device):
        run = load_run(spec, num_classes=len(folder.classes) if config.logits else None,
                       device=device,
                       train_data=config.train_data, allow_random_init=config.allow_random_init,
                       seed=config.seed)
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
                results += [(k, pp, seed_k, _gather(arrays, world))
                            for pp, arrays in run_mode(loaded, data, cfg, local, device)]
    wall = time.perf_counter() - t0
    fingerprint = dataset_fingerprint(data)
    n_samples = _n_samples(run.sidecar, config)[0]
    out = []
    for k, p, seed_k, arrays in results:
        if not np.array_equal(arrays["index"], np.arange(len(folder))):
            raise RuntimeError("gathered predictions do not cover every sample exactly once")
        logits = arrays["logits"] if config.mode == "mc_dropout" else arrays["logits"][0]
        recorded = {**asdict(config), "first_sample": k, "samples": 1}
        if config.mode == "tta":
            recorded.update(first_pass=p, passes=1)
        extra = {**run.loaded.provenance(), "model": sample_label(spec.row, k, multi),
                 "run": spec.row, "method": "mc_dropout" if config.mode == "mc_dropout"
                 else run.method, "sample_index": int(k), "n_samples": int(n_samples),
                 "sample_seed": int(seed_k), "train_seed": -1 if run.seed is None else run.seed,
                 "dataset": str(Path(data).resolve()),
                 "dataset_name": name, "dataset_fingerprint": fingerprint, "mode": config.mode,
                 "pass_index": int(p), "n_passes": int(logits.shape[0]) if logits.ndim == 3
                 else 1, "tta_policy": config.tta_policy if config.mode == "tta"
                 else "", "device": device, "world_size": world, "wall_time_s": wall,
                 **dict(attrs or {})}
        ds = cache_dataset(logits if config.logits else None, arrays["label"],
                           samples=folder.sample_ids, classes=folder.classes,
                           embedding=arrays.get("embedding"),
                           uncertainty=arrays.get("uncertainty"),
                           crop_fraction=arrays.get("crop_fraction"),
                           attrs=provenance_attrs(config=recorded, seed=config.seed, extra=extra))
        out.append(ds)
    return out


def predict_to_files(spec: ModelSpec | str, data: str | os.PathLike, out_dir: str | os.PathLike,
                     config: PredictConfig | None = None, *, dataset_name: str | None = None,
                     overwrite: bool = False, attrs: dict | None = None) -> list[Path]:
    """:func:`predict` and write each sample and pass to ``out_dir/<cache_key>.nc`` (rank 0
    writes); ``attrs`` as for :func:`predict`.

    Caches whose complete file is already there, computed from the same checkpoint file
    (SHA-256), are skipped (resume): the model runs only for the missing ones, and is not even
    loaded when none is missing.
    """
    config = config or PredictConfig()
    spec = ModelSpec.parse(spec) if isinstance(spec, str) else spec
    name = dataset_name or Path(data).resolve().name
    plan = cache_plan(spec, config, name)
    paths = {(k, p): Path(out_dir) / f"{key}.nc" for k, p, key in plan}
    sha = file_sha256(spec.checkpoint) if spec.checkpoint and Path(
        spec.checkpoint).is_file() else None

    def done(path: Path) -> bool:
        try:
            ds = read_cache(path)
        except (FileNotFoundError, ValueError):
            return False
        return sha is None or ds.attrs.get("checkpoint_sha256") == sha

    missing = {kp for kp, path in paths.items() if overwrite or not done(path)}
    if missing:
        for ds in predict(spec, data, config, dataset_name=name, only=missing, attrs=attrs):
            if int(os.environ.get("RANK", "0")) == 0:
                kp = (int(ds.attrs["sample_index"]), int(ds.attrs["pass_index"]))
                write_dataset(ds, paths[kp], overwrite=True)
    return list(paths.values())
