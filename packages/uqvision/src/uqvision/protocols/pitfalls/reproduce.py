"""``uqvision reproduce pitfalls``: the Pitfalls paper's study of ensembles
(docs/conventions.md#v-2).

Every method of the paper is trained on one data set with one architecture, predicted plain
(centre crop) and with test-time augmentation (one random augmentation per member and draw),
scored by calibrated log-likelihood against the number of samples, and compared with a deep
ensemble of the same networks by the Deep Ensemble Equivalent (DEE), without and with TTA.
On the generated ``hierarchy`` stand-in (``--scale smoke|cpu``) or a real image folder
(``--data ROOT --arch NAME``: ``ROOT/train``, ``ROOT/val``, ``ROOT/test``), one code path.

Runs (:func:`plan_runs`): ``members`` deep-ensemble members (one seed each), MC dropout, SSE
and cSGLD trained from scratch; FGE, SWAG, VI and K-FAC Laplace start from deep-ensemble
member 0 (the paper's "pre-trained conventional network"; its epochs are counted in their
cumulated cost). Hyper-parameters are the paper's appendix B values with the epoch counts
scaled to the scale's conventional budget (:data:`PITFALLS_SCALES`); all are in the sidecars
and in ``ensembles.nc``'s attrs.

Steps, each skipped when its output is already complete (a rerun resumes)::

    OUT/data/                 make_hierarchy (not with --data)
    OUT/models/<run>.*        uqvision.training.loop.train_model (one process per worker)
    OUT/caches/*.nc           uqvision.predict: per run, K samples x (plain + `draws` TTA)
    OUT/ensembles.nc          uqvision.protocols.pitfalls.score.score_ensembles (method coordinate)
    OUT/figures/*.png         CLL and DEE vs number of samples, plain and TTA
    OUT/summary.md            the table of DEE at the largest size and the cost per method
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr
from uqmetrics import read_dataset, write_dataset
from uqmetrics.metrics.registry import Registry
from uqmetrics.report.plotting import save_figure
from uqmetrics.runs.io import open_netcdf, record_written, remove_written
from uqmetrics.runs.sweep import progress_enabled

from ...cache import find_caches
from ...data import check_split_classes, dataset_fingerprint
from ...hierarchy import ensure_hierarchy
from ...methods import GENERAL_METHODS
from ...models import read_sidecar
from ...predict import REFERENCE_EXECUTION, PredictConfig, predict_to_files
from ...training.loop import ImageTrainConfig, checkpoint_files, train_model
from ...training.runs import run_matches
from ..base import DriverScale, Reproduction
from . import DESCRIPTION
from .score import EnsembleConfig, score_ensembles

__all__ = [
    "PITFALLS_METHODS",
    "PITFALLS_SCALES",
    "REPRODUCTION",
    "PitfallsResult",
    "PitfallsScale",
    "RunJob",
    "plan_runs",
    "reproduce_pitfalls",
    "run",
]

#: The paper's methods, in its order (names of :data:`uqvision.training.method.TRAINING_METHODS`).
PITFALLS_METHODS = GENERAL_METHODS
#: Methods that start from deep-ensemble member 0 instead of from scratch.
_FROM_MEMBER = ("fge", "swag", "vi", "kfac_laplace")


@dataclass(frozen=True)
class PitfallsScale(DriverScale):
    """Size of a reproduction run.

    ``epochs`` is the conventional network's budget (deep-ensemble members, MC dropout, and
    the pre-trained base of FGE/SWAG/VI/Laplace); ``hparams`` holds each method's overrides
    (the paper's values with epochs scaled); ``samples`` the prediction samples per run of each
    method (deep ensemble: 1 per member); ``draws`` the TTA augmentations per sample (= the
    member orders of the size curves, so every order redraws the augmentations).
    """

    arch: str
    epochs: float
    members: int
    batch_size: int
    hparams: dict[str, dict[str, Any]]
    samples: dict[str, int]
    draws: int
    n_orders: int
    n_repeats: int = 5
    augment: str = "crop"
    input_size: int = 32
    model_kwargs: dict[str, Any] = field(default_factory=dict)


#: Scales: name -> :class:`PitfallsScale`.
PITFALLS_SCALES: Registry[PitfallsScale] = Registry("pitfalls scale")
PITFALLS_SCALES.register(PitfallsScale(
    "smoke", "tests: the smoke hierarchy (18 classes, 16 train images each), a half-width timm "
             "test_resnet, 3 members, 3 samples per method (about a minute)",
    hierarchy="smoke", arch="test_resnet", epochs=3, members=3, batch_size=32,
    model_kwargs={"channels": [16, 24, 24, 48]},
    hparams={
        "mc_dropout": {"p": 0.3},
        "sse": {"cycles": 3, "cycle_epochs": 1.0, "lr0": 0.2},
        "csgld": {"cycles": 2, "cycle_epochs": 1.5, "lr0": 0.5, "noise_epochs": 0.5,
                  "samples_per_cycle": 2, "sample_gap_epochs": 0.2},
        "fge": {"pretrain_epochs": 0, "cycles": 3, "cycle_epochs": 0.5},
        "swag": {"pretrain_epochs": 0, "swag_epochs": 2, "collect_epochs": 0.5, "rank": 4},
        "vi": {"pretrain_epochs": 0, "epochs": 1},
        "kfac_laplace": {"epochs": 0, "scales": (0.03, 0.3, 1.0), "tune_samples": 2},
    },
    samples={"mc_dropout": 3, "sse": 3, "csgld": 3, "fge": 3, "swag": 3, "vi": 3,
             "kfac_laplace": 3},
    draws=2, n_orders=2, n_repeats=2))
PITFALLS_SCALES.register(PitfallsScale(
    "cpu", "the cpu hierarchy (48 classes, 100 train images each), timm test_resnet, 15-epoch "
           "conventional networks, 8 members, 10 samples per method (under an hour on 2 cores)",
    hierarchy="cpu", arch="test_resnet", epochs=15, members=8, batch_size=128,
    hparams={
        # paper (CIFAR): conventional 300 epochs; scaled by 15/300 except where a count of
        # cycles or collections has to fit the run
        "mc_dropout": {"p": 0.3},
        "sse": {"cycles": 10, "cycle_epochs": 3.0, "lr0": 0.2},
        "csgld": {"cycles": 4, "cycle_epochs": 5.0, "lr0": 0.5, "noise_epochs": 0.6,
                  "samples_per_cycle": 3, "sample_gap_epochs": 0.2},
        "fge": {"pretrain_epochs": 0, "cycles": 10, "cycle_epochs": 1.0},
        "swag": {"pretrain_epochs": 0, "swag_epochs": 10, "collect_epochs": 0.5, "rank": 20},
        "vi": {"pretrain_epochs": 0, "epochs": 5},
        "kfac_laplace": {"epochs": 0, "scales": (0.01, 0.03, 0.1, 0.3, 1.0, 3.0),
                         "tune_samples": 5},
    },
    samples={"mc_dropout": 10, "sse": 10, "csgld": 10, "fge": 10, "swag": 10, "vi": 10,
             "kfac_laplace": 10},
    draws=5, n_orders=5, n_repeats=5))


@dataclass(frozen=True)
class RunJob:
    """One training run and its predictions."""

    name: str
    method: str
    seed: int
    config: Any  # uqvision.training.loop.ImageTrainConfig
    samples: int
    after: str | None = None  # the run whose checkpoint this one starts from


@dataclass
class PitfallsResult:
    out: Path
    ensembles: Path
    summary: Path
    figures: list[Path] = field(default_factory=list)
    wall_time_s: float = 0.0


def plan_runs(sc: PitfallsScale, *, seed: int, models: Path, train: Path, val: Path | None,
              device: str = "cpu") -> list[RunJob]:
    """The runs of a scale, in submission order (member 0 first: others start from it)."""
    base = {"arch": sc.arch, "input_size": sc.input_size, "augment": sc.augment,
            "model_kwargs": dict(sc.model_kwargs), "device": device}
    jobs = []
    for j in range(sc.members):
        s = seed * 1000 + j
        jobs.append(RunJob(f"deep_ensemble_s{s}", "deep_ensemble", s, ImageTrainConfig(
            method="deep_ensemble", epochs=sc.epochs, batch_size=sc.batch_size, seed=s,
            tag=f"pitfalls_deep_ensemble_s{s}", **base), 1))
    member0 = jobs[0].name
    for i, m in enumerate(PITFALLS_METHODS[1:], start=1):
        s = seed * 1000 + 100 * i
        hp = {k: (",".join(map(str, v)) if isinstance(v, (tuple, list)) else v)
              for k, v in sc.hparams.get(m, {}).items()}
        kw: dict[str, Any] = {"batch_size": sc.batch_size} if m not in ("sse", "csgld") else {}
        if m == "mc_dropout":
            kw["epochs"] = sc.epochs
        after = member0 if m in _FROM_MEMBER else None
        if after:
            kw["init_checkpoint"] = str(models / f"{after}.safetensors")
        if m == "kfac_laplace" and val is not None:
            kw["val_data"] = str(val)
        jobs.append(RunJob(f"{m}_s{s}", m, s, ImageTrainConfig(
            method=m, hparams=hp, seed=s, tag=f"pitfalls_{m}_s{s}", **kw, **base),
            sc.samples[m], after))
    return jobs


#: The writer of the study's record of its files (``--overwrite`` deletes those only).
WRITER = "uqvision reproduce pitfalls"


def _run_job(job: RunJob, train: str, test: str, models: str, caches: str, draws: int,
             predict_seed: int, threads: int, redo: bool = False,
             train_fingerprint: str | None = None, progress: bool = False) -> dict[str, Any]:
    """Train (unless its checkpoint is this run on ``train``'s images, of fingerprint
    ``train_fingerprint``, and not ``redo``; its progress bar with ``progress``) and predict
    one run (top level: runs in a worker process); returns what it did and the files it wrote
    (``files``)."""
    torch.set_num_threads(threads)
    ckpt = Path(models) / f"{job.name}.safetensors"
    t0 = time.perf_counter()
    trained = redo or not run_matches(ckpt, job.config, data_fingerprint=train_fingerprint)
    if trained:
        train_model(train, ckpt, job.config, progress=progress)
    t1 = time.perf_counter()
    spec = f"{job.config.arch}={ckpt}"
    # REFERENCE_EXECUTION pins contiguous tensors, no AMP and no loader workers: the
    # published numbers do not move with PredictConfig's defaults
    base = {"batch_size": 256, "device": job.config.device, "seed": predict_seed,
            "samples": job.samples, "tta_policy": job.config.augment or "crop",
            **REFERENCE_EXECUTION}
    # a run trained now replaces the caches of the checkpoint it replaced
    written = predict_to_files(spec, test, caches, PredictConfig(mode="plain", **base),
                               overwrite=trained)
    written += predict_to_files(spec, test, caches, PredictConfig(mode="tta", passes=draws,
                                                                  **base), overwrite=trained)
    return {"run": job.name, "trained": trained, "train_s": t1 - t0,
            "predict_s": time.perf_counter() - t1, "caches": len(written),
            "files": [str(p) for p in (*checkpoint_files(ckpt), *written)]}


def _execute(jobs: list[RunJob], args: tuple, workers: int, log,
             record: Callable[[list[str]], None] = lambda files: None) -> None:
    """Run the jobs, ``workers`` at a time; a job starts after the run it starts from;
    ``record`` receives the files of each job done."""
    done: set[str] = set()

    def report(r):
        record(r["files"])
        done.add(r["run"])
        log(f"  {r['run']}: {'trained' if r['trained'] else 'reused'} "
            f"({r['train_s']:.0f} s), {r['caches']} caches ({r['predict_s']:.0f} s)")

    if workers <= 1:  # one run at a time: its training's progress bar (none under --quiet)
        for job in jobs:
            report(_run_job(job, *args, progress=progress_enabled()))
        return

    pending = list(jobs)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as ex:
        running: dict[Future, RunJob] = {}
        while pending or running:
            for job in [j for j in pending if j.after is None or j.after in done]:
                if len(running) >= workers:
                    break
                pending.remove(job)
                running[ex.submit(_run_job, job, *args)] = job
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for f in finished:
                running.pop(f)
                report(f.result())


def reproduce_pitfalls(out: str | os.PathLike, *, scale: str = "smoke", data=None, arch=None,
                       seed: int = 0, workers: int = 1, threads: int = 1, device: str = "cpu",
                       overrides: dict[str, str] | None = None, overwrite: bool = False,
                       log: Callable[[str], None] = print) -> PitfallsResult:
    """Train, predict, score and draw the Pitfalls study under ``out`` (see the module doc).

    Parameters
    ----------
    out : path
    scale : str
        A name in :data:`PITFALLS_SCALES` (its sizes; with ``data`` its recipe only).
    data : path, optional
        A real image folder with ``train/``, ``test/`` and (for K-FAC Laplace's noise scale)
        ``val/``; default: the ``hierarchy`` stand-in of the scale, written to ``out/data``.
        Classes are matched by folder name: ``test/`` may hold a subset of the training
        classes, ``val/`` exactly them; any other class is an error before anything trains.
    arch : str, optional
        timm architecture (default: the scale's); with ``data`` the model kwargs are dropped.
    workers, threads : int
        Runs trained at once (processes) and torch threads per process.
    overrides : dict, optional
        ``epochs``, ``members``, ``batch_size``, ``input_size``, ``augment``, ``draws``,
        ``n_orders`` (strings, the CLI's ``--set``).
    overwrite : bool
        Retrain and repredict everything (otherwise complete outputs are reused); the files
        earlier runs recorded (``out/.uqmetrics-written.json``: checkpoints, caches, scores,
        figures, summary) are deleted first, and nothing else.
    """
    t0 = time.perf_counter()
    sc = _scale(scale, arch, data, overrides or {})
    out = Path(out)
    if data is None:
        root = out / "data"
        ensure_hierarchy(root, scale=sc.hierarchy, seed=seed, overwrite=overwrite)
    else:
        root = Path(data)
    train, test, val = root / "train", root / "test", root / "val"
    for p in (train, test):
        if not p.is_dir():
            raise FileNotFoundError(f"{str(p)!r} does not exist (need ROOT/train and ROOT/test)")
    val = val if val.is_dir() else None

    # by name, before anything trains: the test folder may hold a subset of the training
    # classes (scored in the models' class space); K-FAC Laplace reads val/ in folder order
    check_split_classes(train, {"test": test, **({"val": val} if val else {})}, same=("val",))
    if val is None and len(sc.hparams["kfac_laplace"].get("scales", ())) != 1:
        raise ValueError(f"{str(root)!r} has no val/ folder for K-FAC Laplace's noise scale; "
                         "add one, or fix the scale with --set laplace_scale=S")
    models, caches = out / "models", out / "caches"
    if overwrite:  # the files earlier runs recorded, nothing else (docs/conventions.md)
        remove_written(out, WRITER)
    models.mkdir(parents=True, exist_ok=True)
    jobs = plan_runs(sc, seed=seed, models=models, train=train, val=val, device=device)
    log(f"pitfalls {sc.name}: {len(jobs)} runs of {sc.arch} on {root} ({workers} worker(s), "
        f"{threads} thread(s) each)")
    fingerprint = None if overwrite else dataset_fingerprint(train)  # once, for every run
    _execute(jobs, (str(train), str(test), str(models), str(caches), sc.draws, seed, threads,
                    overwrite, fingerprint), workers, log,
             lambda files: record_written(out, WRITER, files))
    names = [m + t for m in PITFALLS_METHODS for t in ("", "_tta")] + ["single_tta"]
    config = EnsembleConfig(methods=tuple(names), n_orders=sc.n_orders, n_repeats=sc.n_repeats,
                            seed=seed)
    path = out / "ensembles.nc"
    ds = _current_scores(path, caches, config)
    if ds is None:
        ds = score_ensembles([caches], config)
        ds.attrs.update(_study_attrs(sc, jobs, models, root, data is None, workers, threads,
                                     time.perf_counter() - t0, device))
        path = write_dataset(ds, path, overwrite=True)
    else:
        log(f"scores up to date: {path}")
    figures = plot_pitfalls(ds, out / "figures")
    summary = out / "summary.md"
    summary.write_text(summary_table(ds))
    record_written(out, WRITER, [path, summary, *figures])
    log(f"ensembles: {path}; figures: {len(figures)}; summary: {summary}")
    return PitfallsResult(out, path, summary, figures, time.perf_counter() - t0)


def _current_scores(path: Path, caches: Path, config) -> xr.Dataset | None:
    """The score file if it was computed from exactly these caches (its ``input_checksums``)
    with this config, else None (a file written before the result-file schema is rescored)."""
    if not path.is_file():
        return None
    ds = read_dataset(path)
    sums = []
    for p in find_caches([caches]):
        with open_netcdf(p) as c:
            sums.append(str(c.attrs.get("checksum")))
    same_config = json.loads(ds.attrs.get("config", "{}")) == json.loads(json.dumps(
        asdict(config), default=list))
    recorded = json.loads(ds.attrs.get("input_checksums", "[]"))
    return ds if same_config and recorded == sorted(set(sums)) else None


def _scale(name: str, arch: str | None, data, over: dict[str, str]) -> PitfallsScale:
    sc = PITFALLS_SCALES.lookup(name)
    over = dict(over)
    kw: dict[str, Any] = {}
    for key, kind in (("epochs", float), ("members", int), ("batch_size", int),
                      ("input_size", int), ("augment", str), ("draws", int), ("n_orders", int)):
        if key in over:
            try:
                kw[key] = kind(over.pop(key))
            except ValueError:
                raise ValueError(f"--set {key} expects {kind.__name__}") from None
    if "laplace_scale" in over:
        hp = {**sc.hparams, "kfac_laplace": {**sc.hparams["kfac_laplace"],
                                              "scales": (float(over.pop("laplace_scale")),)}}
        kw["hparams"] = hp
    if over:
        raise ValueError(f"unknown options {sorted(over)} of reproduce pitfalls; valid: workers, "
                         "threads, epochs, members, batch_size, input_size, augment, "
                         "draws, n_orders, laplace_scale")
    if arch is not None:
        kw["arch"] = arch
        kw["model_kwargs"] = {}
    elif data is not None:
        raise ValueError("--data needs --arch (a timm architecture for the real images)")
    return replace(sc, **kw)


def _study_attrs(sc: PitfallsScale, jobs: list[RunJob], models: Path, root: Path,
                 stand_in: bool, workers: int, threads: int, wall: float,
                 device: str) -> dict[str, Any]:
    runs = {}
    for j in jobs:
        side = read_sidecar(models / f"{j.name}.safetensors")
        runs[j.name] = {"method": j.method, "seed": j.seed, "samples": j.samples,
                        "hparams": side.get("hparams"), "cost": side.get("cost"),
                        "init_checkpoint": Path(side.get("init_checkpoint") or "").name}
    return {"study": "pitfalls", "scale": sc.name, "architecture": sc.arch,
            "data": str(root), "stand_in": int(stand_in), "scale_config": json.dumps(
                asdict(sc), default=list), "runs": json.dumps(runs),
            "workers": workers, "threads": threads, "device": device,
            "study_wall_time_s": wall}


# --------------------------------------------------------------------------------------------
# figures and summary

def _label(method: str) -> str:
    return method.replace("_tta", " + TTA")


def _colour(ds: xr.Dataset, method: str) -> str:
    """One colour per training method in every panel (``single_tta``: its own)."""
    if method == "single_tta":
        return "k"
    tm = str(ds["training_method"].sel({"method": method}).values)
    i = PITFALLS_METHODS.index(tm) if tm in PITFALLS_METHODS else len(PITFALLS_METHODS)
    return f"C{i % 10}"


def plot_pitfalls(ds: xr.Dataset, out_dir: str | os.PathLike) -> list[Path]:
    """The paper's figures from an ``ensembles.nc``: negative CLL vs number of samples (Fig. 5,
    plain and TTA), DEE vs number of samples with its bounds (Fig. 3; TTA methods against the
    plain and the TTA deep ensemble), and DEE on the other metrics (appendix C)."""
    import matplotlib.pyplot as plt  # heavy: imported on first use (start-up time)
    from matplotlib.ticker import (  # heavy: imported on first use (start-up time)
        NullFormatter,
        ScalarFormatter,
    )

    out, paths = Path(out_dir), []
    tta = ds["tta"].values.astype(bool)
    methods = ds["method"].values
    plain_m = [m for m, t in zip(methods, tta, strict=True) if not t]
    tta_m = [m for m, t in zip(methods, tta, strict=True) if t]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, group, title in ((axes[0], plain_m, "central crop"),
                             (axes[1], tta_m, "test-time augmentation")):
        for m in group:
            v = -ds["cll"].sel({"method": m})
            mean, std = v.mean("order"), v.std("order", ddof=1)
            ok = np.isfinite(mean.values)
            x = ds["size"].values[ok]
            ax.plot(x, mean.values[ok], marker="o", ms=3, color=_colour(ds, m), label=_label(m))
            ax.fill_between(x, (mean - std).values[ok], (mean + std).values[ok],
                            color=_colour(ds, m), alpha=0.15)
        ax.set(xscale="log", xlabel="number of samples", title=title)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.legend(fontsize=7)
    axes[0].set_ylabel("negative calibrated log-likelihood (lower is better)")
    paths.append(save_figure(fig, out / "cll_vs_samples.png"))
    plt.close(fig)

    panels = [("deep_ensemble", plain_m, "plain methods vs deep ensemble"),
              ("deep_ensemble", tta_m, "TTA methods vs deep ensemble"),
              ("deep_ensemble_tta", tta_m, "TTA methods vs deep ensemble + TTA")]
    panels = [p for p in panels if p[0] in ds["reference"].values]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, (ref, group, title) in zip(axes[0], panels, strict=True):
        _dee_panel(ax, ds, ref, "cll", [m for m in group if m != ref], title)
    paths.append(save_figure(fig, out / "dee_vs_samples.png"))
    plt.close(fig)

    metrics = list(ds["dee_metric"].values)
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        _dee_panel(ax, ds, "deep_ensemble", metric,
                   [m for m in plain_m if m != "deep_ensemble"], f"DEE on {metric}")
    paths.append(save_figure(fig, out / "dee_other_metrics.png"))
    plt.close(fig)
    return paths


def _dee_panel(ax, ds: xr.Dataset, ref: str, metric: str, group: list[str], title: str):
    sel = {"reference": ref, "dee_metric": metric}
    for m in group:
        eq = ds["equivalent"].sel({**sel, "method": m}).values
        lo = ds["equivalent_lower"].sel({**sel, "method": m}).values
        hi = ds["equivalent_upper"].sel({**sel, "method": m}).values
        ok = np.isfinite(eq)
        x = ds["size"].values[ok]
        ax.plot(x, eq[ok], marker="o", ms=3, color=_colour(ds, m), label=_label(m))
        ax.fill_between(x, lo[ok], hi[ok], color=_colour(ds, m), alpha=0.15)
    cap = float(ds["n_members"].sel({"method": ref}))
    ax.axhline(cap, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="number of samples", ylabel=f"DEE (cap {cap:g} members)", title=title)
    ax.legend(fontsize=7)


def summary_table(ds: xr.Dataset) -> str:
    """Markdown: per method its samples, cumulated training cost, accuracy and negative CLL
    at 1 and at its largest size, and its DEE there with the bounds (against the plain deep
    ensemble; TTA methods also against the deep ensemble with TTA)."""
    runs = json.loads(ds.attrs.get("runs", "{}"))
    cost: dict[str, float] = {}
    for r in runs.values():
        c = r.get("cost") or {}
        cost[r["method"]] = cost.get(r["method"], 0.0) + float(c.get("total_epochs", math.nan))
    lines = [(f"Scale `{ds.attrs.get('scale', '?')}`, {ds.attrs.get('architecture', '?')}, "
             f"data `{ds.attrs.get('data', '?')}`; {int(ds.sizes['order'])} member orders, "
             f"test_cv; DEE capped at {ds.attrs.get('dee_cap')} members."), "",
             ("| method | samples | training epochs | accuracy (1 → K) | −CLL (1 → K) | "
             "DEE at K [bounds] | DEE vs DE+TTA at K |"), "|---|---|---|---|---|---|---|"]
    for m in ds["method"].values:
        k = int(ds["n_members"].sel({"method": m}))
        acc = ds["accuracy"].sel({"method": m}).mean("order").values
        cll = ds["cll"].sel({"method": m}).mean("order").values
        head = ds[["dee", "dee_lower", "dee_upper", "dee_capped"]].sel({"method": m})
        dee = [float(head[v].values[k - 1]) for v in ("dee", "dee_lower", "dee_upper")]
        capped = "≥" if head["dee_capped"].values[k - 1] == 1 else ""
        tta = "—"
        if "deep_ensemble_tta" in ds["reference"].values:
            v = float(ds["equivalent"].sel({"reference": "deep_ensemble_tta",
                                            "dee_metric": "cll", "method": m}).values[k - 1])
            tta = "—" if not np.isfinite(v) else f"{v:.2f}"
        train = cost.get(str(ds["training_method"].sel({"method": m}).values), math.nan)
        if m == "single_tta":  # one member
            train /= int(ds["n_members"].sel({"method": "deep_ensemble"}))
        lines.append(f"| {_label(str(m))} | {k} | {train:.1f} | {acc[0]:.3f} → {acc[k - 1]:.3f} | "
                     f"{-cll[0]:.3f} → {-cll[k - 1]:.3f} | {capped}{dee[0]:.2f} "
                     f"[{dee[1]:.2f}, {dee[2]:.2f}] | {tta} |")
    return "\n".join(lines) + "\n"


def run(out: str | os.PathLike, *, scale: str = "smoke", data=None, arch=None, seed: int = 0,
        overwrite: bool = False, options: dict[str, str] | None = None,
        log: Callable[[str], None] = print, device: str = "cpu") -> Path:
    """The driver of ``uqvision reproduce pitfalls`` (:data:`REPRODUCTION`):
    :func:`reproduce_pitfalls`.

    Options (``--set key=value``): ``workers`` (runs at once, default 1), ``threads`` (torch
    threads per process, default 1; these two only from the command line, never from a
    ``--config`` file) and the scale overrides of :func:`reproduce_pitfalls`.
    Returns the path of ``ensembles.nc``.
    """
    opts = dict(options or {})
    try:
        workers, threads = int(opts.pop("workers", 1)), int(opts.pop("threads", 1))
    except ValueError as exc:
        raise ValueError(f"--set workers=N / threads=N need integers: {exc}") from None
    return reproduce_pitfalls(out, scale=scale, data=data, arch=arch, seed=seed,
                              workers=workers, threads=threads, device=device, overrides=opts,
                              overwrite=overwrite, log=log).ensembles


#: This protocol's ``uqvision reproduce`` driver (:attr:`Protocol.reproduce`).
REPRODUCTION = Reproduction("pitfalls", DESCRIPTION, run, scales=tuple(PITFALLS_SCALES.names()))
