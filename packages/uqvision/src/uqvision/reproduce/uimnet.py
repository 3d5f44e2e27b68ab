"""``uqvision reproduce uimnet``: the UIMNET protocol (PROTOCOLS V.3) end to end.

1. data: the ``hierarchy`` stand-in (``--data ROOT`` with ``train/`` and ``val/`` (or ``test/``)
   folders for a real image set);
2. the split: a feature extractor trained on all classes, its train-set embeddings cached in
   ``DIR/caches/extractor.train.plain-000.nc``, :func:`uqvision.split.split_from_caches` →
   ``DIR/split.json``; seeded 90/10 in-domain index files in ``DIR/index/``;
3. a Dask sweep of runs (algorithm × spectral × trial × data seed, plus one in/out oracle per
   data seed), each an atomic cell file in ``DIR/caches/runs/`` holding the run's logits,
   features, native values and TTA logits on in-domain validation, in-domain test and
   out-domain test (checkpoints in ``DIR/checkpoints/``);
4. a Dask sweep of ensemble cells (algorithm × spectral × data seed × K): the top-K trials by
   validation NLL, the temperature fitted on validation, and the Jacobian measure (a model
   pass) at τ = 1 and τ̂, in ``DIR/caches/ensembles/``;
5. scoring (:func:`uqvision.ood.score_ood`) → ``DIR/ood.nc``; Tables 2–3 analogues →
   ``DIR/tables.md``.

A rerun skips every cell already on disk. Training uses :func:`train_with_method_hooks`, the
documented minimal loop over a method's hooks (start/step/end_epoch/finish), to be replaced by
the one loop of ``uqvision.train`` when that drives the hooks.
"""

from __future__ import annotations

import json
import math
import time
import zlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import xarray as xr
from uqmetrics.calibration import fit_temperature, log_softmax
from uqmetrics.io import provenance_attrs, read_dataset, write_dataset
from uqmetrics.sweep import Cell, run_sweep

from ..data import DataConfig, ImageFolderDataset, derive_seed, eval_transform, flush_denormal
from ..measures import jacobian_norm
from ..methods import TRAINING_METHODS
from ..methods.ood import (
    SEARCH_SPACES,
    UIMNET_ALGORITHMS,
    FeatureClassifier,
    small_cnn,
    spectral_normalize,
    timm_classifier,
)
from ..ood import ensemble_log_probs
from ..split import ClassSubset, make_index_files, read_index_file, read_split, write_split
from . import REPRODUCTIONS, Reproduction

__all__ = ["UIMNET_SCALES", "UimnetScale", "run_uimnet", "train_with_method_hooks"]

SPLITS = ("in_val", "in_test", "out_test")


@dataclass(frozen=True)
class UimnetScale:
    """Sizes of one scale of the reproduction (override any field with ``--set key=value``)."""

    data_scale: str = "smoke"
    epochs: float = 1
    extractor_epochs: float = 2
    batch_size: int = 32
    width: int = 8
    trials: int = 2
    data_seeds: int = 2
    spectral: str = "0"            # comma-separated: "0", "1" or "0,1"
    algorithms: str = ",".join(UIMNET_ALGORITHMS)
    ks: str = "1,5"
    mc_passes: int = 4
    tta: int = 2
    jacobian_max: int = 64
    input_size: int = 32
    workers: int = 1


UIMNET_SCALES = {
    "smoke": UimnetScale(),
    "cpu": UimnetScale(data_scale="cpu", epochs=4, extractor_epochs=6, batch_size=64, width=8,
                       trials=2, data_seeds=2, spectral="0", mc_passes=8, tta=2,
                       jacobian_max=64, workers=2),
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
def _load(folder, classes, indices=None, size: int = 32, limit: int | None = None):
    """Images of ``classes`` (labels in their order) as a tensor (n, 3, size, size); the first
    ``limit`` of the view only, when given."""
    dcfg = DataConfig((3, size, size), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), crop_pct=1.0,
                      interpolation="bilinear")
    view = ClassSubset(ImageFolderDataset(folder, eval_transform(dcfg)), classes, indices)
    if limit is not None:
        view = ClassSubset(view.base, classes, range(min(limit, len(view))))
    x = torch.stack([view[i][0] for i in range(len(view))])
    return x, torch.as_tensor(view.targets), view.sample_ids


def _augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """CIFAR-style: random horizontal flip and a pad-4 random crop, per image."""
    n, _, h, w = x.shape
    flip = torch.rand(n, generator=gen) < 0.5
    x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    pad = torch.nn.functional.pad(x, (4, 4, 4, 4), mode="reflect")
    dx, dy = torch.randint(0, 9, (2, n), generator=gen)
    return torch.stack([pad[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(n)])


def train_with_method_hooks(method, hp, model, x, y, *, seed: int, device: str = "cpu",
                            augment: bool = True):
    """Train ``model`` with ``method``'s hooks on in-memory tensors: the documented minimal
    loop of :mod:`uqvision.methods.registry` (start, step until done, end_epoch, finish).

    Returns the finished :class:`~uqvision.methods.TrainState`.
    """
    gen = torch.Generator().manual_seed(derive_seed(seed, 1))
    torch.manual_seed(derive_seed(seed, 2))
    n, bs = len(x), min(hp.batch_size, len(x))
    steps = max(1, n // bs)
    state = method.start(model.to(device), hp, n_train=n, steps_per_epoch=steps, seed=seed)
    while not state.done:
        order = torch.randperm(n, generator=gen)
        for b in range(steps):
            idx = order[b * bs:(b + 1) * bs]
            xb = _augment(x[idx], gen) if augment else x[idx]
            method.step(state, xb.to(device), y[idx].to(device))
            if state.done:
                break
        method.end_epoch(state)
    loader = [(x[i:i + bs], y[i:i + bs]) for i in range(0, n, bs)]
    method.finish(state, loader, None)
    return state


def _build_base(arch: str | None, num_classes: int, width: int) -> FeatureClassifier:
    return timm_classifier(arch, num_classes) if arch else small_cnn(num_classes, width=width)


@torch.no_grad()
def _batched(fn, x, bs=256):
    return torch.cat([fn(x[i:i + bs]) for i in range(0, len(x), bs)])


# -- stage 1: extractor and split ----------------------------------------------------------
def _extractor(out: Path, train_dir: Path, sc: UimnetScale, arch, seed, device, log) -> Path:
    from ..cache import cache_dataset

    path = out / "caches" / "extractor.train.plain-000.nc"
    if path.exists():
        return path
    classes = ImageFolderDataset(train_dir).classes
    x, y, ids = _load(train_dir, classes, size=sc.input_size)
    method = TRAINING_METHODS.lookup("erm")
    hp = method.hparams_from(epochs=sc.extractor_epochs, batch_size=sc.batch_size)
    t0 = time.perf_counter()
    state = train_with_method_hooks(method, hp, _build_base(arch, len(classes), sc.width), x, y,
                                    seed=seed, device=device)
    net = state.net.eval()
    z = _batched(lambda b: net(b.to(device)).cpu(), x)
    feats = _batched(lambda b: net.features(b.to(device)).cpu(), x)
    log(f"uimnet: feature extractor trained on {len(classes)} classes in "
        f"{time.perf_counter() - t0:.0f} s (train accuracy {(z.argmax(1) == y).float().mean():.3f})")
    ds = cache_dataset(z.numpy(), y.numpy(), samples=ids, classes=classes, embedding=feats.numpy(),
                       attrs={"model": "uimnet_extractor", "dataset_name": "train",
                              "mode": "plain", "pass_index": 0, "arch": arch or "small_cnn"})
    write_dataset(ds, path, overwrite=True)
    return path


# -- stage 2: one run ----------------------------------------------------------------------
def _trial_hparams(algorithm: str, trial: int, sc: UimnetScale, seed: int) -> dict:
    """Trial 0: the defaults; trial t > 0: a draw of the algorithm's search space."""
    base = {"epochs": sc.epochs, "batch_size": sc.batch_size}
    if trial == 0:
        return base
    rng = np.random.default_rng(derive_seed(trial, seed, zlib.crc32(algorithm.encode())))
    return {**SEARCH_SPACES.lookup(algorithm)(rng), **base}


def _predict(net, method, x, *, device, passes, tta, seed):
    """logits (n, C) at τ = 1, features (n, d), native (n,), TTA logits (aug, n, C)."""
    dev = lambda b: b.to(device)
    if method.stochastic_passes:
        member = []
        for s in method.samples(_StateView(net), passes, seed):  # seeds each pass
            member.append(_batched(lambda b, s=s: torch.log_softmax(s(dev(b)), -1).cpu(), x))
        stacked = torch.stack(member)
        logits = torch.logsumexp(stacked, 0) - math.log(passes)
        from uqmetrics import mutual_information

        native = torch.as_tensor(mutual_information(stacked.numpy(), from_logits=True))
        net.eval()
    else:
        logits = _batched(lambda b: net(dev(b)).cpu(), x)
        native = _batched(lambda b: net.native(dev(b)).cpu(), x) if hasattr(net, "native") \
            else torch.full((len(x),), math.nan)
    feats = _batched(lambda b: net.features(dev(b)).cpu(), x)
    gen = torch.Generator().manual_seed(derive_seed(seed, 7))
    aug = torch.stack([_batched(lambda b: net(dev(b)).cpu(), _augment(x, gen))
                       for _ in range(tta)])
    return logits, feats, native, aug


class _StateView:
    """What ``method.samples`` reads of a TrainState: the network."""

    def __init__(self, net):
        self.net = net


def _run_arrays(net, method, data, *, device, passes, tta, seed) -> dict:
    variables = {}
    for split in SPLITS:
        x, y = data[split]
        logits, feats, native, aug = _predict(net, method, x, device=device, passes=passes,
                                              tta=tta, seed=seed)
        dim = f"{split}_sample"
        variables[f"{split}_logits"] = ((dim, "class"), logits.numpy().astype(np.float32))
        variables[f"{split}_features"] = ((dim, "feature"), feats.numpy().astype(np.float32))
        variables[f"{split}_native"] = (dim, native.double().numpy())
        variables[f"{split}_tta"] = (("aug", dim, "class"), aug.numpy().astype(np.float32))
        variables[f"{split}_label"] = (dim, y.numpy())
    return variables


def _cell_data(root: str, split_file: str, seed: int, size: int,
               parts=("in_train", *SPLITS), limit: int | None = None):
    """The sets ``parts`` of data seed ``seed``: (images, labels) each."""
    split = read_split(split_file)
    paths = _paths(Path(root))
    index = Path(split_file).parent / "index"
    ins, outs = split["in_classes"], split["out_classes"]
    where = {"in_train": (paths["train"], ins, "train"), "in_val": (paths["train"], ins, "val"),
             "in_test": (paths["test"], ins, None), "out_test": (paths["test"], outs, None),
             "out_train": (paths["train"], outs, None)}
    data = {}
    for part in parts:
        folder, classes, idx = where[part]
        if idx is not None:
            idx = read_index_file(index / f"seed{seed}.{idx}.json")["indices"]
            idx = idx[:limit] if limit is not None else idx
        data[part] = _load(folder, classes, idx, size, None if idx is not None else limit)[:2]
    return data, ins


def _paths(root: Path) -> dict[str, Path]:
    test = root / "test" if (root / "test").is_dir() else root / "val"
    return {"train": root / "train", "test": test}


def run_cell(*, algorithm: str, spectral: bool, trial: int, seed: int, root: str,
             split_file: str, checkpoint: str, scale: dict, arch: str | None,
             device: str) -> xr.Dataset:
    """Train one run and cache its outputs on the three evaluation sets (a sweep cell)."""
    from safetensors.torch import save_file

    sc = UimnetScale(**scale)
    torch.set_num_threads(1)  # one Dask worker = one core
    t0 = time.perf_counter()
    data, ins = _cell_data(root, split_file, seed, sc.input_size)
    method = TRAINING_METHODS.lookup(algorithm)
    overrides = _trial_hparams(algorithm, trial, sc, seed)
    hp = method.hparams_from(overrides)
    torch.manual_seed(derive_seed(seed, trial, 11))
    base = _build_base(arch, len(ins), sc.width)
    if spectral:
        spectral_normalize(base)
    x, y = data["in_train"]
    with flush_denormal():
        state = train_with_method_hooks(method, hp, base, x, y,
                                        seed=derive_seed(seed, trial), device=device)
        train_s = time.perf_counter() - t0
        net = state.net.eval()
        variables = _run_arrays(net, method, data, device=device, passes=sc.mc_passes,
                                tta=sc.tta, seed=seed)
    ckpt = Path(checkpoint)
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    tmp = ckpt.with_name(ckpt.name + ".tmp")
    save_file({k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}, str(tmp))
    tmp.replace(ckpt)
    config = {"algorithm": algorithm, "spectral": bool(spectral), "trial": trial,
              "data_seed": seed, "hparams": asdict(hp), "arch": arch or "small_cnn",
              "width": sc.width}
    return xr.Dataset(variables, attrs={
        **provenance_attrs(config=config, seed=seed), "checkpoint": str(ckpt),
        "train_s": train_s, "wall_s": time.perf_counter() - t0, "uimnet": json.dumps(config)})


def oracle_cell(*, seed: int, root: str, split_file: str, scale: dict, arch: str | None,
                device: str) -> xr.Dataset:
    """The upper reference: an ERM classifier trained to tell in-domain (0) from out-domain
    (1) training images; u = p(out) on the three evaluation sets."""
    sc = UimnetScale(**scale)
    torch.set_num_threads(1)
    data, _ = _cell_data(root, split_file, seed, sc.input_size,
                         parts=("in_train", "out_train", *SPLITS))
    (xi, _), (xo, _) = data["in_train"], data["out_train"]
    x = torch.cat([xi, xo])
    y = torch.cat([torch.zeros(len(xi), dtype=torch.long), torch.ones(len(xo), dtype=torch.long)])
    method = TRAINING_METHODS.lookup("erm")
    hp = method.hparams_from(epochs=sc.epochs, batch_size=sc.batch_size)
    torch.manual_seed(derive_seed(seed, 13))
    with flush_denormal():
        state = train_with_method_hooks(method, hp, _build_base(arch, 2, sc.width), x, y,
                                        seed=derive_seed(seed, 13), device=device)
    net = state.net.eval()
    variables = {f"{s}_u": (f"{s}_sample",
                            _batched(lambda b: torch.softmax(net(b.to(device)), -1)[:, 1].cpu(),
                                     data[s][0]).double().numpy()) for s in SPLITS}
    return xr.Dataset(variables, attrs=provenance_attrs(config={"oracle": True}, seed=seed))


# -- stage 3: ensembles (selection, temperature, Jacobian) --------------------------------
def _load_net(run: xr.Dataset, n_classes: int, device: str):
    from safetensors.torch import load_file

    cfg = json.loads(run.attrs["uimnet"])
    method = TRAINING_METHODS.lookup(cfg["algorithm"])
    hp = method.hparams(**{k: tuple(v) if isinstance(v, list) else v
                           for k, v in cfg["hparams"].items()})
    arch = None if cfg["arch"] == "small_cnn" else cfg["arch"]
    base = _build_base(arch, n_classes, cfg["width"])
    if cfg["spectral"]:
        spectral_normalize(base)
    net = method.wrap_model(base, hp)
    weights = load_file(run.attrs["checkpoint"])
    for name, value in weights.items():   # buffers filled after training (Mixup's examples)
        owner, _, leaf = name.rpartition(".")
        mod = net.get_submodule(owner) if owner else net
        if leaf in mod._buffers and mod._buffers[leaf].shape != value.shape:
            mod._buffers[leaf] = torch.empty_like(value)
    net.load_state_dict(weights)
    return net.to(device).eval()


def ensemble_logits(runs: list[xr.Dataset], split: str) -> np.ndarray:
    """Members' logits, shape (member, n, C)."""
    return np.stack([r[f"{split}_logits"].values for r in runs])


def select_runs(paths: list[Path], k: int) -> list[Path]:
    """The ``k`` runs of lowest in-domain validation NLL (ties: by path)."""
    scored = []
    for p in paths:
        ds = read_dataset(p)
        lp = log_softmax(ds["in_val_logits"].values.astype(np.float64))
        y = ds["in_val_label"].values
        scored.append((float(-lp[np.arange(len(y)), y].mean()), str(p)))
    return [Path(p) for _, p in sorted(scored)[:k]]


def ensemble_cell(*, runs: list[str], k: int, jacobian_max: int, root: str, split_file: str,
                  seed: int, input_size: int, device: str) -> xr.Dataset:
    """Top-k selection recorded, τ̂ on in-domain validation, and the Jacobian measure of the
    ensemble at τ = 1 and τ̂ on the first ``jacobian_max`` images of each evaluation set."""
    torch.set_num_threads(1)
    paths = select_runs([Path(r) for r in runs], k)
    members = [read_dataset(p) for p in paths]
    y_val = members[0]["in_val_label"].values
    tau = fit_temperature(ensemble_log_probs(ensemble_logits(members, "in_val")), y_val)
    n_classes = members[0].sizes["class"]
    nets = [_load_net(m, n_classes, device) for m in members]
    data, _ = _cell_data(root, split_file, seed, input_size, parts=SPLITS, limit=jacobian_max)
    variables = {}
    for split in SPLITS:
        x = data[split][0].to(device)
        jac = [torch.cat([jacobian_norm(nets, x[i:i + 64], temperature=t)
                          for i in range(0, len(x), 64)]).cpu().numpy() for t in (1.0, tau)]
        variables[f"{split}_jacobian"] = (("calibration", f"{split}_jsample"), np.stack(jac))
    return xr.Dataset(variables, coords={"calibration": ["none", "temperature"]}, attrs={
        "members": json.dumps([str(p) for p in paths]), "temperature": float(tau), "k": k,
        "k_requested": k})


# -- the driver ----------------------------------------------------------------------------
def run_uimnet(out, *, scale: str = "smoke", data=None, arch=None, seed: int = 0,
               overwrite: bool = False, options: dict | None = None, log=print,
               device: str = "cpu") -> Path:
    """Run (or resume) the whole chain; returns ``out / "ood.nc"``."""
    from ..hierarchy import make_hierarchy
    from ..ood import ood_tables, score_ood

    sc = _scale(scale, options)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if data is None:
        root = out / "data"
        if not (root / "classes.json").exists():
            make_hierarchy(root, scale=sc.data_scale, seed=seed, overwrite=True)
    else:
        root = Path(data)
    paths = _paths(root)
    split_file = out / "split.json"
    if overwrite or not split_file.exists():
        from ..split import split_from_caches

        cache = _extractor(out, paths["train"], sc, arch, seed, device, log)
        write_split(split_from_caches([cache]), split_file)
    split = read_split(split_file)
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
    oracle = [Cell(f"oracle.s{s}", {**common, "seed": s}) for s in seeds]
    run_dir = out / "caches" / "runs"
    for group, func in ((cells, run_cell), (oracle, oracle_cell)):
        report = run_sweep(group, func, run_dir, n_workers=sc.workers, overwrite=overwrite,
                           progress=False)
        if not report.ok:
            raise RuntimeError(f"uimnet: failed cells {report.failed}")
    log(f"uimnet: {len(cells)} runs + {len(oracle)} oracles done "
        f"({time.perf_counter() - t0:.0f} s)")
    ens = []
    for alg in _csv(sc.algorithms):
        for sp in _csv(sc.spectral, int):
            for s in seeds:
                runs = [str(run_dir / f"{alg}.sn{sp}.t{t}.s{s}.nc") for t in range(sc.trials)]
                for k in _csv(sc.ks, int):
                    ens.append(Cell(f"{alg}.sn{sp}.s{s}.k{k}", {
                        "runs": runs, "k": min(k, len(runs)), "jacobian_max": sc.jacobian_max,
                        "root": str(root), "split_file": str(split_file), "seed": s,
                        "input_size": sc.input_size, "device": device}))
    report = run_sweep(ens, ensemble_cell, out / "caches" / "ensembles", n_workers=sc.workers,
                       overwrite=overwrite, progress=False)
    if not report.ok:
        raise RuntimeError(f"uimnet: failed ensemble cells {report.failed}")
    result = score_ood(out / "caches", ks=_csv(sc.ks, int))
    result.attrs["wall_s"] = time.perf_counter() - t0
    result.attrs["scale"] = json.dumps(asdict(sc))
    path = out / "ood.nc"
    write_dataset(result, path, overwrite=True)
    (out / "tables.md").write_text(ood_tables(result))
    log(f"uimnet: wrote {path} and {out / 'tables.md'} ({time.perf_counter() - t0:.0f} s)")
    return path


REPRODUCTIONS.add("uimnet", Reproduction(
    "uimnet", "UIMNET (V.3): clustered in/out class split, ten algorithms, seven measures",
    run_uimnet))
