"""``uqvision reproduce uimnet``: the UIMNET protocol (docs/conventions.md#v-3) end to end.

1. data: the ``hierarchy`` stand-in (``--data ROOT`` with ``train/`` and ``val/`` (or ``test/``)
   folders for a real image set);
2. the split: a feature extractor trained on all classes, its train-set embeddings cached in
   ``DIR/caches/extractor.train.plain-000.nc``, :func:`uqvision.protocols.uimnet.split.split_from_caches` →
   ``DIR/split.json``; seeded 90/10 in-domain index files in ``DIR/index/``;
3. a Dask sweep of runs (algorithm × spectral × trial × data seed, plus one in/out oracle per
   data seed), each an atomic cell file in ``DIR/caches/runs/`` holding the run's logits,
   features, native values, TTA logits (``tta`` augmentations of ``tta_policy``,
   :mod:`~uqvision.protocols.uimnet.augment`) and the values of the two training-split GMM
   fits (class Gaussians of the run's training-split features, Ledoit–Wolf and the released
   sample covariance + 0.1 I: :data:`~uqvision.protocols.uimnet.measures.GMM_TRAIN_FITS`) on
   in-domain validation, in-domain test and out-domain test (checkpoints in
   ``DIR/checkpoints/``);
4. a Dask sweep of ensemble cells (algorithm × spectral × data seed × K): the top-K trials by
   validation NLL averaged over data seeds (:func:`select_trials`; each trial's configuration
   is drawn once and shared by the data seeds), the temperature fitted on validation, and the
   two Jacobian measures (model passes: UIMNET's, of the τ-scaled logits, and the calibrated
   predictor's) at τ = 1 and τ̂ on a seeded, class-stratified subset of each set, in
   ``DIR/caches/ensembles/``;
5. scoring (:func:`uqvision.protocols.uimnet.score.score_ood`) → ``DIR/ood.nc``; Tables 2–3 analogues →
   ``DIR/tables.md``.

A rerun skips every cell already on disk; one whose run caches cannot give the chosen GMM
fit's values (written before that fit, :func:`~.score.check_gmm_run`) is refused before
anything trains. Every network (extractor, runs, oracles) trains in
the one loop of :func:`uqvision.training.loop.train_model`, on class-subset views of the training
folder (:func:`uqvision.data.image_view`: the seed's 90/10 index file, nothing copied or
loaded into memory); the extractor's embeddings come from the one prediction path
(:func:`uqvision.predict.predict_to_files`); the run caches are computed batch by batch from
views of the folders, so ``--data ROOT --arch NAME`` runs an ImageNet-sized folder.

The small CNN of the stand-in is timm's ``uqvision_cnn`` (:mod:`uqvision.models.archs`). ERM, RND,
OC and DeepAE share one classifier when their trial seeds and hyper-parameters agree: the
students of RND/OC/DeepAE learn on detached features (their paper's post-hoc modules), so
they differ from ERM only in their native measure.
"""

from __future__ import annotations

import functools
import json
import math
import time
import zlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import xarray as xr
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset
from uqmetrics import InputError, mutual_information
from uqmetrics.metrics.calibration import fit_temperature, log_softmax
from uqmetrics.runs.io import provenance_attrs, read_dataset, write_dataset
from uqmetrics.runs.sweep import Cell, cell_path, is_complete, progress_enabled, run_sweep

from ...data import (
    INDEX_FORMAT,
    ClassSubset,
    DataConfig,
    ImageFolderDataset,
    check_split_classes,
    dataset_fingerprint,
    derive_seed,
    eval_transform,
    flush_denormal,
    image_view,
    read_index_file,
    write_format_json,
)
from ...hierarchy import ensure_hierarchy, read_hierarchy
from ...methods import TRAINING_METHODS, TrainState
from ...models import ModelSpec, read_sidecar
from ...predict import REFERENCE_EXECUTION, PredictConfig, predict_to_files
from ...runtime import cpu_threads
from ...training.loop import ImageTrainConfig, train_model
from ...training.runs import load_run, run_matches
from ..base import Reproduction
from . import DEFAULT_GMM_FIT, DESCRIPTION
from .augment import OFFICIAL_TTA_COUNT, resolve_tta_policy, uimnet_tta_transform
from .index import make_index_files
from .measures import (
    GMM_COVARIANCE,
    GMM_FITS,
    GMM_TRAIN_FITS,
    gmm_train_uncertainty,
    jacobian_logits,
    jacobian_norm,
    stratified_subset,
)
from .methods import SEARCH_SPACES, UIMNET_ALGORITHMS
from .score import check_gmm_run, ensemble_log_probs, ood_tables, score_ood
from .split import read_split, split_from_caches, write_split

__all__ = ["REPRODUCTION", "UIMNET_SCALES", "UimnetScale", "oracle_index_file", "run_uimnet",
           "select_trials"]

SPLITS = ("in_val", "in_test", "out_test")


@dataclass(frozen=True)
class UimnetScale:
    """Sizes of one scale of the reproduction (override any field with ``--set key=value``)."""

    data_scale: str = "smoke"
    epochs: float = 1
    extractor_epochs: float = 2
    batch_size: int = 32
    width: int = 8
    extractor_width: int = 8
    trials: int = 2
    data_seeds: int = 2
    spectral: str = "0"            # comma-separated: "0", "1" or "0,1"
    algorithms: str = ",".join(UIMNET_ALGORITHMS)
    ks: str = "1,5"
    mc_passes: int = 4
    tta: int = OFFICIAL_TTA_COUNT
    #: ``auto``: ``uimnet`` (the released policy) on ``--data``, ``uimnet_standin`` on the
    #: generated stand-in (:mod:`~uqvision.protocols.uimnet.augment`)
    tta_policy: str = "auto"
    #: the ``gmm`` measure's fit (:data:`~uqvision.protocols.uimnet.measures.GMM_FITS`)
    gmm_fit: str = DEFAULT_GMM_FIT
    jacobian_max: int = 64
    input_size: int = 32
    workers: int = 1


UIMNET_SCALES = {
    "smoke": UimnetScale(),
    "cpu": UimnetScale(data_scale="cpu", epochs=8, extractor_epochs=6, batch_size=64, width=8,
                       trials=6, data_seeds=2, spectral="0,1", mc_passes=8,
                       tta=OFFICIAL_TTA_COUNT, jacobian_max=64, workers=2),
}


def _scale(name: str, options: dict | None) -> UimnetScale:
    if name not in UIMNET_SCALES:
        raise ValueError(f"scale must be one of {sorted(UIMNET_SCALES)}, got {name!r}")
    sc = UIMNET_SCALES[name]
    fields = asdict(sc)
    updates = {}
    for key, value in (options or {}).items():
        if key not in fields:
            raise ValueError(f"unknown uimnet option {key!r}; valid: {', '.join(fields)}")
        updates[key] = type(fields[key])(value)
    return replace(sc, **updates)


def _csv(text: str, kind=str) -> list:
    return [kind(t) for t in str(text).split(",") if t.strip()]


# -- data ----------------------------------------------------------------------------------
def _paths(root: Path) -> dict[str, Path]:
    test = root / "test" if (root / "test").is_dir() else root / "val"
    return {"train": root / "train", "test": test}


def _is_standin(root) -> bool:
    """Whether ``root`` is the generated ``hierarchy`` stand-in (its ``classes.json``)."""
    try:
        read_hierarchy(root)
    except (FileNotFoundError, ValueError):
        return False
    return True


def _views(root: str, split_file: str, seed: int, transform=None) -> dict[str, Dataset]:
    """The evaluation sets of data seed ``seed`` as class-subset views (nothing loaded): in-domain
    validation (the seed's 10 % of the training folder), in-domain and out-domain test."""
    split = read_split(split_file)
    paths = _paths(Path(root))
    index = Path(split_file).parent / "index"
    ins, outs = split["in_classes"], split["out_classes"]
    test = ImageFolderDataset(paths["test"], transform)  # one scan for both test views
    return {"in_val": image_view(paths["train"], transform, classes=ins,
                                 index_file=index / f"seed{seed}.val.json"),
            "in_test": ClassSubset(test, ins), "out_test": ClassSubset(test, outs)}


def _gmm_fit_view(root: str, split_file: str, seed: int, transform) -> tuple[Dataset, Path]:
    """The images the training-split GMM fits read, and their index file: data seed ``seed``'s
    in-domain training split (``index/seed<seed>.train.json``, the runs' 90 %), under
    ``transform`` (the evaluation transform, as UIMNET's ``workers/mog.py`` puts its data
    node in eval mode)."""
    split = read_split(split_file)
    index = Path(split_file).parent / "index" / f"seed{seed}.train.json"
    return image_view(_paths(Path(root))["train"], transform, classes=split["in_classes"],
                      index_file=index), index


def _train_config(scale: UimnetScale, arch: str | None, device: str, *,
                  width: int | None = None, **fields) -> ImageTrainConfig:
    """The one loop's configuration of a UIMNET run: CIFAR-style augmentation (pad-crop +
    flip), the scale's input size; ``uqvision_cnn`` of ``width`` (default: the scale's) without
    ``--arch``."""
    width = scale.width if width is None else width
    return ImageTrainConfig(arch=arch or "uqvision_cnn", input_size=scale.input_size,
                       augment="cifar", model_kwargs={} if arch else {"width": width},
                       device=device, **fields)


@torch.no_grad()
def _outputs(fn, view: Dataset, *, batch_size: int, device: str):
    """``fn(x, ids)`` over ``view`` in order (one pass over the images), concatenated on the
    CPU; a tuple of tensors when ``fn`` returns one."""
    loader = DataLoader(view, batch_size=batch_size)
    outs = [fn(x.to(device), ids.tolist()) for x, _, ids in loader]
    if isinstance(outs[0], tuple):
        return tuple(torch.cat([o[i] for o in outs]).cpu() for i in range(len(outs[0])))
    return torch.cat(outs).cpu()


def _features(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """φ(x): a timm-style model's pooled pre-logits (a :class:`FeatureClassifier` is one),
    else a UIMNET wrapper's ``features``."""
    if hasattr(net, "forward_head"):
        return net.forward_head(net.forward_features(x), pre_logits=True)
    return net.features(x)


def _native(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return net.native(x) if hasattr(net, "native") else torch.full((len(x),), math.nan)


def _run_arrays(state: TrainState, views: dict[str, Dataset], tta_views, *, passes: int,
                seed: int, batch_size: int, device: str) -> dict:
    """Per evaluation set: logits at τ = 1 (the log of the mean softmax over ``passes``
    stochastic passes for MC dropout, whose native measure is then the mutual information),
    features, native measure, and the logits of each TTA view."""
    net, method = state.net.eval(), state.method
    run = functools.partial(_outputs, batch_size=batch_size, device=device)
    variables = {}
    for split, view in views.items():
        if method.stochastic_passes:  # noise per (seed, pass, sample id): batching-free
            stacked = torch.stack([run(lambda x, ids, s=s: torch.log_softmax(s(x, ids), -1), view)
                                   for s in method.samples(state, passes, seed)])
            logits = torch.logsumexp(stacked, 0) - math.log(passes)
            native = torch.as_tensor(mutual_information(stacked.numpy(), from_logits=True))
            net.eval()
            feats = run(lambda x, ids: _features(net, x), view)
        else:
            logits, native, feats = run(
                lambda x, ids: (net(x), _native(net, x), _features(net, x)), view)
        aug = torch.stack([run(lambda x, ids: net(x), t[split]) for t in tta_views])
        dim = f"{split}_sample"
        variables[f"{split}_logits"] = ((dim, "class"), logits.numpy().astype(np.float32))
        variables[f"{split}_features"] = ((dim, "feature"), feats.numpy().astype(np.float32))
        variables[f"{split}_native"] = (dim, native.double().numpy())
        variables[f"{split}_tta"] = (("aug", dim, "class"), aug.numpy().astype(np.float32))
        variables[f"{split}_label"] = (dim, np.asarray(view.targets))
    return variables


# -- stage 1: extractor and split ----------------------------------------------------------
def _extractor_config(sc: UimnetScale, arch, seed, device):
    """The feature extractor's training configuration."""
    return _train_config(sc, arch, device, width=sc.extractor_width, method="erm",
                         epochs=sc.extractor_epochs, batch_size=sc.batch_size, seed=seed,
                         tag="uimnet_extractor")


def _extractor(out: Path, train_dir: Path, sc: UimnetScale, arch, seed, device, log, *,
               fingerprint: str | None = None, overwrite: bool = False) -> Path:
    """ERM on every class (the paper's pre-trained ResNet-18), its train-set embeddings cached
    through the one prediction path. Its width is ``extractor_width``, not the runs' ``width``:
    the class split stays the same when the model-size ablation changes the runs' width, as
    the paper's split comes from one ResNet-18 whatever the runs' architecture. A checkpoint
    of this configuration on the training images of ``fingerprint`` is reused
    (:func:`uqvision.training.runs.run_matches`), unless ``overwrite``."""
    ckpt = out / "checkpoints" / "extractor.safetensors"
    config = _extractor_config(sc, arch, seed, device)
    trained = overwrite or not run_matches(ckpt, config, data_fingerprint=fingerprint)
    if trained:
        # on one CPU thread, as every run cell: the split must not depend on --threads (with
        # 2 threads the cpu-scale extractor's rounding differs and the Ward tree's top split
        # flips, from 6/6 to 18/18 classes; docs/conventions.md#v-3)
        with cpu_threads(1, device):
            result = train_model(train_dir, ckpt, config)
        log(f"uimnet: feature extractor trained on {result.model.num_classes} classes in "
            f"{result.wall_time_s:.0f} s")
    spec = ModelSpec(arch or "uqvision_cnn", str(ckpt), label="extractor")
    # REFERENCE_EXECUTION pins contiguous tensors, no AMP and no loader workers: the
    # published numbers do not move with PredictConfig's defaults
    (path,) = predict_to_files(spec, train_dir, out / "caches", PredictConfig(
        embeddings=True, batch_size=256, device=device, **REFERENCE_EXECUTION),
        dataset_name="train",
        overwrite=trained)  # a new extractor replaces its predecessor's cache
    return path


# -- stage 2: one run ----------------------------------------------------------------------
def _trial_hparams(algorithm: str, trial: int, sc: UimnetScale) -> dict:
    """Trial 0: the defaults; trial t > 0: a draw of the algorithm's search space, drawn once
    per (algorithm, trial) and shared by every data seed (the paper's protocol: a trial is one
    configuration, trained on each data seed)."""
    base = {"epochs": sc.epochs, "batch_size": sc.batch_size}
    if trial == 0:
        return base
    rng = np.random.default_rng(derive_seed(trial, zlib.crc32(algorithm.encode())))
    return {**SEARCH_SPACES.lookup(algorithm)(rng), **base}


def _eval_transforms(sidecar: dict, tta: int, seed: int, policy: str = "uimnet"):
    """The run's evaluation transform and ``tta`` augmentations of ``policy`` (a name in
    :data:`~uqvision.protocols.uimnet.augment.UIMNET_TTA_POLICIES`), each with its seed."""
    dcfg = DataConfig.from_dict(sidecar["pretrained_cfg"])
    aug = uimnet_tta_transform(policy, dcfg)
    return eval_transform(dcfg), [(aug, derive_seed(seed, 7, a)) for a in range(tta)]


def run_cell(*, algorithm: str, spectral: bool, trial: int, seed: int, root: str,
             split_file: str, checkpoint: str, scale: dict, arch: str | None,
             device: str) -> xr.Dataset:
    """Train one run with the one loop (:func:`uqvision.training.loop.train_model` on the seed's
    in-domain training view) and cache its outputs on the three evaluation sets (a cell),
    with the GMM measure of each training-split fit (:func:`~.measures.gmm_train_uncertainty`:
    class Gaussians of the run's features of its training split, :func:`_gmm_fit_view`) as
    ``<set>_<field>`` (:data:`~.measures.GMM_TRAIN_FITS`: ``<set>_gmm_train_ledoit_wolf``,
    ``<set>_gmm_train``), each variable's estimator recorded in the attr ``uimnet``
    (``gmm_train.covariance``)."""
    sc = UimnetScale(**scale)
    torch.set_num_threads(1)  # one Dask worker = one core
    t0 = time.perf_counter()
    split = read_split(split_file)
    index = Path(split_file).parent / "index" / f"seed{seed}.train.json"
    config = _train_config(sc, arch, device, method=algorithm, seed=derive_seed(seed, trial),
                           hparams=_trial_hparams(algorithm, trial, sc),
                           classes=tuple(split["in_classes"]), index_file=str(index),
                           spectral=bool(spectral), tag=Path(checkpoint).stem)
    # a sweep's cell: the sweep's bar counts the cells
    result = train_model(_paths(Path(root))["train"], checkpoint, config, progress=False)
    sidecar = read_sidecar(result.checkpoint)
    policy = resolve_tta_policy(sc.tta_policy, real_data=not _is_standin(root))
    plain, tta = _eval_transforms(sidecar, sc.tta, seed, policy)
    views = _views(root, split_file, seed, plain)
    tta_views = [{k: v.with_transform(t, s) for k, v in views.items()} for t, s in tta]
    fit_view, fit_index = _gmm_fit_view(root, split_file, seed, plain)
    with flush_denormal():
        variables = _run_arrays(result.state, views, tta_views, passes=sc.mc_passes, seed=seed,
                                batch_size=256, device=device)
        net = result.state.net.eval()
        fit_feats = _outputs(lambda x, ids: _features(net, x), fit_view, batch_size=256,
                             device=device).numpy().astype(np.float32)
    for fit, (field, _) in GMM_TRAIN_FITS.items():
        gmm = gmm_train_uncertainty(fit_feats, np.asarray(fit_view.targets),
                                    {s: variables[f"{s}_features"][1] for s in SPLITS}, fit=fit)
        for s, u in gmm.items():
            variables[f"{s}_{field}"] = (f"{s}_sample", u)
    cfg = {"algorithm": algorithm, "spectral": bool(spectral), "trial": trial,
           "data_seed": seed, "hparams": sidecar["hparams"], "arch": sidecar["architecture"],
           "width": sc.width, "tta_policy": policy, "tta": sc.tta,
           "gmm_train": {"index_file": fit_index.name, "n_fit": len(fit_feats),
                         "covariance": {field: GMM_COVARIANCE[fit]
                                        for fit, (field, _) in GMM_TRAIN_FITS.items()}}}
    return xr.Dataset(variables, attrs={
        **provenance_attrs(config=cfg, seed=seed), "checkpoint": str(result.checkpoint),
        "train_s": result.wall_time_s, "wall_s": time.perf_counter() - t0,
        "uimnet": json.dumps(cfg)})


def oracle_index_file(train_dir, split_file, seed: int) -> Path:
    """The oracle's training index file of data seed ``seed``: the runs' in-domain training
    images (``index/seed<seed>.train.json``, by sample id) and every out-domain training
    image, as positions in the in + out class view of the training folder; written (once,
    atomically) as ``index/seed<seed>.oracle.json`` beside the runs' files.

    The in-domain validation images (``seed<seed>.val.json``), on which θ of every measure,
    the oracle's included, is set, are not in it: the oracle does not train on them.
    """
    split = read_split(split_file)
    folder = Path(split_file).parent / "index"
    path = folder / f"seed{seed}.oracle.json"
    classes = list(split["in_classes"]) + list(split["out_classes"])
    runs = read_index_file(folder / f"seed{seed}.train.json")
    if list(runs["classes"]) != list(split["in_classes"]):
        raise ValueError(f"{str(folder / f'seed{seed}.train.json')!r} indexes other classes "
                         "than the split's in-domain classes")
    keep_in = set(runs["samples"])
    outs = set(split["out_classes"])
    view = ClassSubset(ImageFolderDataset(train_dir), classes)
    ids, names = view.sample_ids, view.folder_classes
    idx = [i for i, (sid, y) in enumerate(zip(ids, view.targets, strict=True))
           if sid in keep_in or names[y] in outs]
    return write_format_json({**INDEX_FORMAT, "seed": seed, "part": "oracle",
                              "classes": classes, "indices": idx,
                              "samples": [ids[i] for i in idx]}, path)


def oracle_cell(*, seed: int, root: str, split_file: str, scale: dict, arch: str | None,
                device: str, checkpoint: str) -> xr.Dataset:
    """The upper reference: ERM trained (the one loop) to tell in-domain from out-domain
    training images (a two-label view of the training folder, on the positions of
    :func:`oracle_index_file`: the runs' in-domain training images and the out-domain ones,
    never the in-domain validation images its θ is set on); u = p(out) on the three
    evaluation sets."""
    sc = UimnetScale(**scale)
    torch.set_num_threads(1)
    split = read_split(split_file)
    groups = {**dict.fromkeys(split["in_classes"], "in"),
              **dict.fromkeys(split["out_classes"], "out")}
    index = oracle_index_file(_paths(Path(root))["train"], split_file, seed)
    config = _train_config(sc, arch, device, method="erm", epochs=sc.epochs,
                           batch_size=sc.batch_size, seed=derive_seed(seed, 13), classes=groups,
                           index_file=str(index), tag=Path(checkpoint).stem)
    result = train_model(_paths(Path(root))["train"], checkpoint, config,
                         progress=False)  # a sweep's cell: the sweep's bar counts the cells
    net = result.model.eval()
    plain, _ = _eval_transforms(read_sidecar(result.checkpoint), 0, seed)
    with flush_denormal():
        variables = {f"{s}_u": (f"{s}_sample", _outputs(
            lambda x, ids: torch.softmax(net(x), -1)[:, 1], view, batch_size=256,
            device=device).double().numpy())
            for s, view in _views(root, split_file, seed, plain).items()}
    return xr.Dataset(variables, attrs=provenance_attrs(config={"oracle": True}, seed=seed))


# -- stage 3: ensembles (selection, temperature, Jacobian) --------------------------------
def ensemble_logits(runs: list[xr.Dataset], split: str) -> np.ndarray:
    """Members' logits, shape (member, n, C)."""
    return np.stack([r[f"{split}_logits"].values for r in runs])


def _val_nll(ds: xr.Dataset) -> float:
    lp = log_softmax(ds["in_val_logits"].values.astype(np.float64))
    y = ds["in_val_label"].values
    return float(-lp[np.arange(len(y)), y].mean())


def select_runs(paths: list[Path], k: int) -> list[tuple[Path, xr.Dataset]]:
    """The ``k`` runs of lowest in-domain validation NLL (ties: by path), each with its
    in-domain validation logits and labels (and the run's attrs): nothing else of a run's cache
    is read."""
    scored = []
    for p in paths:
        ds = read_dataset(p, variables=("in_val_logits", "in_val_label"))
        scored.append((_val_nll(ds), str(p), ds))
    return [(Path(p), ds) for _, p, ds in sorted(scored, key=lambda t: t[:2])[:k]]


def select_trials(runs_by_seed: dict[int, list], k: int) -> tuple[list[int], list[float]]:
    """The ``k`` trials of lowest in-domain validation NLL averaged over data seeds (the
    paper's selection: one set of configurations for every data seed).

    Parameters
    ----------
    runs_by_seed : dict
        Data seed -> the run caches of trials 0, 1, … of that seed (the same count for every
        seed; trial t is one configuration, :func:`_trial_hparams`).
    k : int >= 1

    Returns
    -------
    trials : list of int
        The selected trial indices, best first (ties: the lower trial).
    mean_nll : list of float
        Every trial's validation NLL averaged over data seeds.
    """
    counts = {len(v) for v in runs_by_seed.values()}
    if len(counts) != 1 or k < 1:
        raise ValueError(f"every data seed needs the same number of trials and k >= 1, got "
                         f"{ {s: len(v) for s, v in runs_by_seed.items()} } and k={k!r}")
    nll = np.array([[_val_nll(read_dataset(p, variables=("in_val_logits", "in_val_label")))
                     for p in paths] for paths in runs_by_seed.values()]).mean(axis=0)
    order = sorted(range(len(nll)), key=lambda t: (nll[t], t))
    return order[:k], nll.tolist()


def ensemble_cell(*, runs: list[str], k: int, jacobian_max: int, root: str, split_file: str,
                  seed: int, device: str, selection: dict | None = None) -> xr.Dataset:
    """The ensemble of the ``runs`` (this data seed's runs of the trials :func:`select_trials`
    chose; ``k`` of them), τ̂ on in-domain validation, and the two Jacobian measures at τ = 1
    and τ̂ on a seeded class-stratified subset of ``jacobian_max`` images of each evaluation
    set (:func:`~.measures.stratified_subset`; the positions kept as ``<set>_jindex``):
    ``<set>_jacobian``, UIMNET's (:func:`~.measures.jacobian_logits`; NaN for K > 1 or MC
    dropout, attr ``jacobian_valid`` = 0), and ``<set>_jacobian_softmax``, of the calibrated
    predictor (:func:`~.measures.jacobian_norm`); the members rebuilt by
    :func:`uqvision.training.runs.load_run`. ``selection`` (the chosen trials and the NLLs
    they were chosen by) is recorded in the attrs."""
    torch.set_num_threads(1)
    paths, members = zip(*select_runs([Path(r) for r in runs], k), strict=True)
    y_val = members[0]["in_val_label"].values
    tau = fit_temperature(ensemble_log_probs(ensemble_logits(members, "in_val")), y_val)
    n_classes = members[0].sizes["class"]
    runs_ = [load_run(ModelSpec(json.loads(m.attrs["uimnet"])["arch"], m.attrs["checkpoint"]),
                      num_classes=n_classes, device=device) for m in members]
    nets = [r.loaded.model.eval() for r in runs_]
    plain = runs_[0].loaded.transform
    # UIMNET's code marks its Jacobian invalid for ensembles and MC dropout (NaN)
    stochastic = any(TRAINING_METHODS.lookup(json.loads(m.attrs["uimnet"])["algorithm"])
                     .stochastic_passes for m in members)
    measures = {"jacobian": functools.partial(jacobian_logits, stochastic=stochastic),
                "jacobian_softmax": jacobian_norm}
    variables = {}
    for split, view in _views(root, split_file, seed, plain).items():
        keep = stratified_subset(view.targets, jacobian_max, seed=derive_seed(seed, 17))
        loader = DataLoader(Subset(view, keep.tolist()), batch_size=64)
        for name, func in measures.items():
            jac = [torch.cat([func(nets, x.to(device), temperature=t) for x, *_ in loader])
                   .cpu().double().numpy() for t in (1.0, tau)]
            variables[f"{split}_{name}"] = (("calibration", f"{split}_jsample"), np.stack(jac))
        variables[f"{split}_jindex"] = (f"{split}_jsample", keep.astype(np.int64))
    return xr.Dataset(variables, coords={"calibration": ["none", "temperature"]}, attrs={
        "members": json.dumps([str(p) for p in paths]), "temperature": float(tau), "k": k,
        "selection": json.dumps(selection or {}),
        "jacobian_valid": int(len(nets) == 1 and not stochastic)})


# -- the driver ----------------------------------------------------------------------------
def _check_run_caches(paths, gmm_fit: str) -> None:
    """Refuse, before anything trains, the complete run caches among ``paths`` (which the
    sweep would skip) that cannot give ``gmm_fit``'s values (:func:`~.score.check_gmm_run`:
    written before that fit, or under another estimator); absent or incomplete ones are
    recomputed by the sweep. Reads only the fit's variables of each file."""
    if gmm_fit not in GMM_TRAIN_FITS:
        return
    wanted = [f"{s}_{GMM_TRAIN_FITS[gmm_fit][0]}" for s in SPLITS]
    for p in paths:
        if not p.exists():
            continue
        try:
            run = read_dataset(p, variables=wanted)
        except KeyError:
            if is_complete(p):
                check_gmm_run(xr.Dataset(), p, gmm_fit)  # raises: the variables are missing
            continue
        except (OSError, ValueError):  # partial or corrupt: the sweep recomputes it
            continue
        check_gmm_run(run, p, gmm_fit)


def run_uimnet(out, *, scale: str = "smoke", data=None, arch=None, seed: int = 0,
               overwrite: bool = False, options: dict | None = None, log=print,
               device: str = "cpu") -> Path:
    """Run (or resume) the whole chain; returns ``out / "ood.nc"``."""
    sc = _scale(scale, options)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if data is None:
        root = out / "data"
        ensure_hierarchy(root, scale=sc.data_scale, seed=seed, overwrite=overwrite)
    else:
        root = Path(data)
    paths = _paths(root)
    # the TTA policy, recorded resolved in every run and in ood.nc
    sc = replace(sc, tta_policy=resolve_tta_policy(sc.tta_policy,
                                                   real_data=not _is_standin(root)))
    GMM_FITS.lookup(sc.gmm_fit)
    # by name, before anything trains: the in/out test views need every training class
    check_split_classes(paths["train"], {paths["test"].name: paths["test"]},
                        same=(paths["test"].name,))
    split_file = out / "split.json"
    # the split (and every run on it) is this run's only if its extractor is: checked first
    fingerprint = dataset_fingerprint(paths["train"])
    extractor = out / "checkpoints" / "extractor.safetensors"
    if split_file.exists() and not overwrite and not run_matches(
            extractor, _extractor_config(sc, arch, seed, device), data_fingerprint=fingerprint):
        raise InputError(f"{str(split_file)!r} was made from a feature extractor ({extractor}) "
                         "of another configuration or other training images than this run's "
                         "(--arch, --seed, --device, --set extractor_epochs/extractor_width/"
                         "batch_size, or --data); pass --overwrite to recompute the split and "
                         "every run on it, or choose another --out")
    if overwrite or not split_file.exists():
        cache = _extractor(out, paths["train"], sc, arch, seed, device, log,
                           fingerprint=fingerprint, overwrite=overwrite)
        write_split(split_from_caches([cache]), split_file)
    split = read_split(split_file)
    if len(split["in_classes"]) < 2:
        raise ValueError(f"the Ward split of {paths['train']} has {len(split['in_classes'])} "
                         f"in-domain class(es) ({split['in_classes']}): the root's smaller child "
                         "is one outlying class, and UIMNET needs at least 2 (more classes, or "
                         "a better feature extractor: --set extractor_epochs=...)")
    seeds = list(range(sc.data_seeds))
    for s in seeds:
        if not (out / "index" / f"seed{s}.val.json").exists():
            make_index_files(paths["train"], split["in_classes"], out / "index", seed=s)
    log(f"uimnet: {len(split['in_classes'])} in-domain / {len(split['out_classes'])} "
        f"out-domain classes")
    common = {"root": str(root), "split_file": str(split_file), "arch": arch, "device": device,
              "scale": asdict(sc)}
    cells = []
    for alg in _csv(sc.algorithms):
        TRAINING_METHODS.lookup(alg)
        for sp in _csv(sc.spectral, int):
            for trial in range(sc.trials):
                for s in seeds:
                    key = f"{alg}.sn{sp}.t{trial}.s{s}"
                    cells.append(Cell(key, {**common, "algorithm": alg, "spectral": bool(sp),
                                            "trial": trial, "seed": s, "checkpoint": str(
                                                out / "checkpoints" / f"{key}.safetensors")}))
    oracle = [Cell(f"oracle.s{s}", {**common, "seed": s, "checkpoint": str(
        out / "checkpoints" / f"oracle.s{s}.safetensors")}) for s in seeds]
    run_dir = out / "caches" / "runs"
    if not overwrite:
        _check_run_caches([cell_path(run_dir, c) for c in cells], sc.gmm_fit)
    for group, func in ((cells, run_cell), (oracle, oracle_cell)):
        # the cells done and left on stderr (none under uqvision --quiet); a cell trains silently
        report = run_sweep(group, func, run_dir, n_workers=sc.workers, overwrite=overwrite,
                           progress=progress_enabled())
        if not report.ok:
            raise RuntimeError(f"uimnet: failed cells {report.failed}")
    log(f"uimnet: {len(cells)} runs + {len(oracle)} oracles done "
        f"({time.perf_counter() - t0:.0f} s)")
    ens = []
    for alg in _csv(sc.algorithms):
        for sp in _csv(sc.spectral, int):
            runs = {s: [str(run_dir / f"{alg}.sn{sp}.t{t}.s{s}.nc") for t in range(sc.trials)]
                    for s in seeds}
            for k in _csv(sc.ks, int):
                # the top-k trials by validation NLL averaged over data seeds, the same
                # configurations for every seed
                trials, nll = select_trials(runs, min(k, sc.trials))
                selection = {"rule": "top-k trials by in_val NLL averaged over data seeds",
                             "trials": trials, "mean_val_nll": nll}
                for s in seeds:
                    ens.append(Cell(f"{alg}.sn{sp}.s{s}.k{k}", {
                        "runs": [runs[s][t] for t in trials], "k": len(trials),
                        "jacobian_max": sc.jacobian_max, "root": str(root),
                        "split_file": str(split_file), "seed": s, "device": device,
                        "selection": selection}))
    report = run_sweep(ens, ensemble_cell, out / "caches" / "ensembles", n_workers=sc.workers,
                       overwrite=overwrite, progress=progress_enabled())
    if not report.ok:
        raise RuntimeError(f"uimnet: failed ensemble cells {report.failed}")
    result = score_ood(out / "caches", ks=_csv(sc.ks, int), gmm_fit=sc.gmm_fit)
    result.attrs["wall_s"] = time.perf_counter() - t0
    result.attrs["scale"] = json.dumps(asdict(sc))
    result.attrs["device"] = device
    path = out / "ood.nc"
    write_dataset(result, path, overwrite=True)
    (out / "tables.md").write_text(ood_tables(result))
    log(f"uimnet: wrote {path} and {out / 'tables.md'} ({time.perf_counter() - t0:.0f} s)")
    return path


#: This protocol's ``uqvision reproduce`` driver (:attr:`Protocol.reproduce`).
REPRODUCTION = Reproduction("uimnet", DESCRIPTION, run_uimnet)
