"""``uqvision reproduce selective``: the Selective paper's comparisons on a zoo trained locally.

No ImageNet and no pretrained weights exist here, so the paper's 523-model zoo is replaced by a
small zoo trained on the generated ``hierarchy`` set (docs/conventions.md#v-0) with *controlled*
regimes, which the paper could only compare through whatever pairs the model hubs happened to offer:

- several architectures and widths (:data:`ZOO_ARCHS`), each trained plainly;
- for the student architectures, the same architecture and seed trained with knowledge
  distillation from an ensemble teacher (the mean probabilities of ``teacher_members``
  independently trained networks; Hinton et al.'s loss) and with label smoothing;
- the teacher ensemble itself as a row (the paper's Figure 5: teachers vs students);
- a prototype classifier (:mod:`uqvision.models.prototype`: the encoder of a plain model with its
  linear head replaced by cosine similarity to the embedding of each class's clean prototype
  image, CLIP's zero-shot head);
- MC dropout (``mc_passes`` passes) for the plain models with dropout modules.

Steps, each skipped when its output is already complete (a rerun resumes)::

    OUT/data/              make_hierarchy(scale=<the zoo scale's hierarchy scale>, seed)
    OUT/models/<tag>.safetensors   uqvision.training.loop.train_model (one process per worker)
    OUT/caches/*.nc        uqvision.predict (plain; MC dropout) and the teacher ensemble
    OUT/metadata.csv       the zoo's metadata table (uqvision.protocols.selective.metadata)
    OUT/scores/selective.nc        uqvision.protocols.selective.score.score_selective + metadata + replicate
    OUT/analysis.json      uqvision.protocols.selective.analysis (pairs, temperature effect, correlations, ...)
    OUT/figures/*.png      uqvision.protocols.selective.plots.plot_selective
    OUT/summary.md         tables and findings (copied into docs/reproduction-vision.md)

The module is one concern in more than 600 lines, this reproduction's driver: the zoo's plan
(architectures, regimes, scales), each step above with its resume check, and the analysis and
summary of its outputs form one pipeline whose steps share the plan and the layout of ``OUT``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from uqmetrics import ensemble_log_probs, log_softmax, read_dataset, write_dataset
from uqmetrics.metrics.registry import Registry
from uqmetrics.runs.io import record_written, remove_written
from uqmetrics.runs.sweep import progress_enabled

from ...cache import cache_dataset, check_aligned, read_cache
from ...data import ImageFolderDataset, dataset_fingerprint
from ...hierarchy import class_prototypes, ensure_hierarchy
from ...models import load_model, sidecar_path
from ...models.prototype import (
    CosineHead,
    PrototypeClassifier,
    class_embeddings,
    fit_logit_scale,
    save_prototype_classifier,
)
from ...predict import REFERENCE_EXECUTION, PredictConfig, predict_to_files
from ...training.loop import ADAMW_RECIPE, ImageTrainConfig, checkpoint_files, train_model
from ...training.runs import run_matches
from ..base import DriverScale, Reproduction
from . import DESCRIPTION
from .analysis import (
    family_correlations,
    improvements,
    metric_disagreement,
    paired_comparisons,
    summarize_temperature_effect,
    teacher_comparisons,
    temperature_effect,
)
from .metadata import ModelMetadata, metadata_key, write_metadata
from .plots import plot_selective
from .score import SelectiveConfig, score_selective

__all__ = [
    "OUTPUTS",
    "REGIMES",
    "REPRODUCTION",
    "ZOO_ARCHS",
    "ZOO_SCALES",
    "ReproduceResult",
    "ZooArch",
    "ZooJob",
    "ZooScale",
    "plan_zoo",
    "reproduce_selective",
    "run",
]


@dataclass(frozen=True)
class ZooArch:
    """One architecture/width of the zoo.

    ``model_kwargs`` go to ``timm.create_model`` (a width is a ``channels`` tuple);
    ``mc_dropout``: its dropout is a module (MC dropout applies).
    """

    name: str
    arch: str
    family: str
    description: str
    model_kwargs: tuple[tuple[str, Any], ...] = ()
    mc_dropout: bool = False

    @property
    def kwargs(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.model_kwargs}


#: Architectures and widths: name -> :class:`ZooArch`.
ZOO_ARCHS: Registry[ZooArch] = Registry("zoo architecture")
for _a in (
    ZooArch("resnet_w05", "test_resnet", "ResNet", "timm test_resnet at half width",
            (("channels", (16, 24, 24, 48)),)),
    ZooArch("resnet_w1", "test_resnet", "ResNet", "timm test_resnet (channels 32-48-48-96)"),
    ZooArch("resnet_w2", "test_resnet", "ResNet", "timm test_resnet at double width",
            (("channels", (64, 96, 96, 192)),)),
    ZooArch("convnext", "test_convnext", "ConvNeXt", "timm test_convnext", mc_dropout=True),
    ZooArch("vit_p8", "test_vit", "ViT", "timm test_vit, 8-px patches on 32-px images",
            (("img_size", 32), ("patch_size", 8)), mc_dropout=True),
):
    ZOO_ARCHS.register(_a)
del _a


@dataclass(frozen=True)
class Regime:
    """How a zoo model is trained: ``ImageTrainConfig`` overrides and its metadata values."""

    name: str
    description: str
    distillation: str = "no"
    label_smoothing: str = "no"


#: Training regimes of the students: name -> :class:`Regime`.
REGIMES: Registry[Regime] = Registry("training regime")
for _r in (Regime("plain", "cross-entropy"),
           Regime("label_smoothing", "cross-entropy with label smoothing", label_smoothing="yes"),
           Regime("distill", "knowledge distillation from the teacher ensemble",
                  distillation="yes")):
    REGIMES.register(_r)
del _r


@dataclass(frozen=True)
class ZooScale(DriverScale):
    """Size of a reproduction run.

    ``archs`` are trained plainly (``replicates`` seeds each); ``students`` also with every
    other regime; ``teacher`` names the architecture of the ``teacher_members`` ensemble.
    """

    epochs: int
    replicates: int
    archs: tuple[str, ...]
    students: tuple[str, ...]
    teacher: str
    teacher_members: int
    mc_passes: int
    calibration_size: float
    prototype_encoder: str
    prototype_fit_images: int
    label_smoothing: float = 0.1
    distill_alpha: float = 0.9
    distill_temperature: float = 4.0
    drop_rate: float = 0.1
    batch_size: int = 64
    lr: float = 3e-3


#: Scales: name -> :class:`ZooScale`.
ZOO_SCALES: Registry[ZooScale] = Registry("zoo scale")
ZOO_SCALES.register(ZooScale(
    "smoke", "tests: the smoke hierarchy (18 classes), 3 epochs, one replicate (about a minute)",
    hierarchy="smoke", epochs=3, replicates=1, archs=("resnet_w05", "resnet_w1", "convnext"),
    students=("resnet_w05", "convnext"), teacher="resnet_w1", teacher_members=2, mc_passes=30,
    calibration_size=0.34, prototype_encoder="resnet_w1", prototype_fit_images=200))
ZOO_SCALES.register(ZooScale(
    "cpu", "the cpu hierarchy (48 classes, 100 train images each), 10 epochs, 2 replicates",
    hierarchy="cpu", epochs=10, replicates=2,
    archs=("resnet_w05", "resnet_w1", "resnet_w2", "convnext", "vit_p8"),
    students=("resnet_w05", "convnext", "vit_p8"), teacher="resnet_w1", teacher_members=3,
    mc_passes=30, calibration_size=0.25, prototype_encoder="resnet_w1",
    prototype_fit_images=2000))


@dataclass(frozen=True)
class ZooJob:
    """One network to train."""

    arch: ZooArch
    regime: str
    replicate: int
    seed: int
    teacher_member: bool = False

    @property
    def tag(self) -> str:
        kind = "teacher" if self.teacher_member else self.regime
        return f"hier_{self.arch.name}_{kind}_r{self.replicate}"

    @property
    def key(self) -> str:
        return f"{self.arch.arch}.{self.tag}"


def plan_zoo(scale: str | ZooScale, seed: int = 0) -> tuple[list[ZooJob], list[ZooJob]]:
    """The teacher members and the other networks of a zoo scale (in training order).

    Replicate ``r`` of every regime starts from the same seed ``seed * 1000 + r`` (the same
    initialisation and batch order), so a distilled or label-smoothed student and its plain twin
    differ only in the loss; teacher member ``k`` uses ``seed * 1000 + 500 + k``.
    """
    sc = ZOO_SCALES.lookup(scale) if isinstance(scale, str) else scale
    teachers = [ZooJob(ZOO_ARCHS.lookup(sc.teacher), "plain", k, seed * 1000 + 500 + k, True)
                for k in range(sc.teacher_members)]
    jobs = []
    for r in range(sc.replicates):
        for name in sc.archs:
            regimes = REGIMES.names() if name in sc.students else ["plain"]
            jobs += [ZooJob(ZOO_ARCHS.lookup(name), g, r, seed * 1000 + r) for g in regimes]
    return teachers, jobs


@dataclass
class ReproduceResult:
    out: Path
    selective: Path
    analysis: Path
    summary: Path
    figures: list[Path] = field(default_factory=list)
    wall_time_s: float = 0.0


def _train_config(job: ZooJob, sc: ZooScale, teachers: tuple[str, ...], device: str):
    return ImageTrainConfig(
        arch=job.arch.arch, hparams=dict(ADAMW_RECIPE), epochs=sc.epochs, device=device,
        batch_size=sc.batch_size, lr=sc.lr,
        input_size=32, augment="cifar", drop_rate=sc.drop_rate, seed=job.seed, tag=job.tag,
        model_kwargs=job.arch.kwargs,
        label_smoothing=sc.label_smoothing if job.regime == "label_smoothing" else 0.0,
        teachers=teachers if job.regime == "distill" else (),
        distill_alpha=sc.distill_alpha, distill_temperature=sc.distill_temperature)


def _train_one(data: str, out: str, config, threads: int, progress: bool = False) -> str:
    """One training run (top level: runs in a worker process); its progress bar with
    ``progress``."""
    torch.set_num_threads(threads)
    return str(train_model(data, out, config, progress=progress).checkpoint)


def _stale(path: Path, config, fingerprint: str | None) -> bool:
    """Whether the checkpoint ``path`` is not the run ``config`` trains on the training images
    of ``fingerprint`` (:func:`uqvision.training.runs.run_matches`)."""
    return not run_matches(path, config, data_fingerprint=fingerprint)


def _train_all(jobs, configs, data: Path, models: Path, workers: int, threads: int,
               log, redo: bool = False, fingerprint: str | None = None) -> dict[str, Path]:
    todo = [(j, c) for j, c in zip(jobs, configs, strict=True)
            if redo or _stale(models / f"{j.tag}.safetensors", c, fingerprint)]
    log(f"training {len(todo)} of {len(jobs)} networks ({workers} worker(s))")
    args = [(str(data / "train"), str(models / f"{j.tag}.safetensors"), c, threads)
            for j, c in todo]
    if workers > 1 and len(todo) > 1:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as ex:
            for (job, _), path in zip(todo, ex.map(_train_one, *zip(*args, strict=True)),
                                      strict=True):
                log(f"  trained {job.tag}: {path}")
    else:
        for (job, _), a in zip(todo, args, strict=True):  # one at a time: its progress bar
            log(f"  trained {job.tag}: {_train_one(*a, progress=progress_enabled())}")
    return {j.tag: models / f"{j.tag}.safetensors" for j in jobs}


def _ensemble_cache(member_caches: list[Path], name: str, arch: str, tag: str) -> Any:
    """A plain cache of the teacher ensemble: log of the mean member probabilities."""
    members = [read_cache(p) for p in member_caches]
    check_aligned(members)
    z = ensemble_log_probs(np.stack([log_softmax(m["logits"].values.astype(np.float64))
                                     for m in members]))
    ref = members[0]
    attrs = {**ref.attrs, "model": name, "model_name": name, "source": "ens",
             "architecture": arch, "tag": tag, "checkpoint": "",
             "checkpoint_sha256": ",".join(m.attrs["checkpoint_sha256"] for m in members),
             "num_params": sum(int(m.attrs["num_params"]) for m in members),
             "members": json.dumps([m.attrs["model"] for m in members])}
    for k in ("checksum", "complete"):
        attrs.pop(k, None)
    return cache_dataset(z, ref["label"].values, samples=ref["sample"].values,
                         classes=ref["class"].values, attrs=attrs)


def ensure_ensemble_cache(member_caches: list[Path], path: Path, name: str, arch: str,
                          tag: str) -> bool:
    """Write the ensemble cache of ``member_caches`` to ``path`` unless the one there was made
    from exactly these members (its ``checkpoint_sha256`` lists theirs); True when written.

    A rerun after a member was retrained rebuilds it (before, an existing file was kept
    whatever its members).
    """
    # the members' attributes only (their data are read once, by _ensemble_cache, if needed)
    want = ",".join(read_dataset(p, variables=[]).attrs["checkpoint_sha256"] for p in member_caches)
    if path.is_file() and read_cache(path).attrs.get("checkpoint_sha256") == want:
        return False
    write_dataset(_ensemble_cache(member_caches, name, arch, tag), path, overwrite=True)
    return True


def _prototype(encoder_ckpt: Path, job: ZooJob, info, sc: ZooScale, out: Path, *,
               rebuild: bool = False) -> Path:
    """The prototype classifier on the encoder of a plain model (see the module docstring);
    an existing one is kept unless ``rebuild`` (its encoder was retrained)."""
    if out.is_file() and not rebuild:
        return out
    loaded = load_model(f"{job.arch.arch}={encoder_ckpt}", num_classes=len(info.classes))
    net = loaded.model
    net.reset_classifier(0)
    protos = class_prototypes(info.scale, seed=info.seed)
    images = torch.stack([loaded.transform(Image.fromarray(np.uint8(np.round(255 * p))))
                          for p in protos])
    model = PrototypeClassifier(net, CosineHead(class_embeddings(
        net, images, torch.arange(len(protos)), len(protos))))
    train = ImageFolderDataset(info.splits["train"], loaded.transform)
    pick = np.random.default_rng(0).permutation(len(train))[:sc.prototype_fit_images]
    xs, ys = zip(*[train[int(i)][:2] for i in pick], strict=True)
    scale, converged = fit_logit_scale(model, torch.stack(xs), np.array(ys))
    return save_prototype_classifier(
        model, out, arch=job.arch.arch, pretrained_cfg=loaded.data_config.to_dict(),
        classes=list(info.classes), tag=out.stem, model_kwargs=job.arch.kwargs,
        info={"encoder": str(encoder_ckpt), "class_embeddings": "encoder embedding of each "
              "class's clean prototype image (hierarchy.class_prototypes)",
              "logit_scale": scale, "logit_scale_converged": converged,
              "logit_scale_fit_images": len(pick)})


def _metadata_rows(teachers, jobs, ens_key: str, proto_key: str, sc: ZooScale) -> list:
    """The zoo's metadata (parameter counts are measured from the models, in the caches)."""
    def row(key, arch: ZooArch, **kw):
        return ModelMetadata(key, arch.family, arch.name, None, 32,
                             **{"pretraining_data": "none", "adversarial_training": "no",
                                "supervision": "supervised", **kw})

    out = []
    for j in teachers + jobs:
        reg = REGIMES[j.regime]
        teacher = ens_key if j.regime == "distill" else ""
        note = "teacher ensemble member" if j.teacher_member else reg.description
        out.append(row(j.key, j.arch, distillation=reg.distillation, teacher=teacher,
                       label_smoothing=reg.label_smoothing, notes=note))
    t = ZOO_ARCHS[sc.teacher]
    out.append(row(ens_key, t, distillation="no", label_smoothing="no",
                   notes=f"mean probabilities of {sc.teacher_members} {t.name} networks"))
    e = ZOO_ARCHS[sc.prototype_encoder]
    out.append(ModelMetadata(proto_key, "Prototype", f"{e.name}_proto", None,
                             32, "no", "", "none", "no", "supervised", "no",
                             f"cosine head on the plain {e.name} encoder, class embeddings "
                             "from clean class prototypes"))
    return out


#: What a run writes under its folder.
OUTPUTS = ("data", "models", "caches", "scores", "figures", "metadata.csv", "analysis.json",
           "summary.md")
#: The writer of a run's record of the files it wrote (``overwrite=True`` deletes those only).
WRITER = "uqvision reproduce selective"


def reproduce_selective(out: str | os.PathLike, *, scale: str = "cpu", seed: int = 0,
                        workers: int = 1, threads: int = 1, overwrite: bool = False,
                        log: Callable[[str], None] | None = None,
                        device: str = "cpu") -> ReproduceResult:
    """Train, predict, score and analyse the zoo of ``scale`` under ``out`` (see module doc).

    Parameters
    ----------
    out : path
    scale : str
        A name in :data:`ZOO_SCALES`.
    seed : int
        Seeds the data set and every network.
    workers : int
        Networks trained at the same time (processes).
    threads : int
        torch threads per training process and for prediction.
    overwrite : bool
        Retrain, repredict and rescore everything, first deleting the files earlier runs
        recorded (``out/.uqmetrics-written.json``: their checkpoints, caches, scores, figures
        and tables) and nothing else; a stand-in data set of other options in ``out/data``
        is replaced when the dataset makers wrote it. Otherwise complete checkpoints and
        caches are reused (an interrupted run resumes).
    log : callable, optional
        Receives one line per step.
    device : str
        Where the networks train and predict (``cpu``, ``cuda``, ``cuda:N``).
    """
    t0 = time.perf_counter()
    sc = ZOO_SCALES.lookup(scale)
    log = log or (lambda _msg: None)
    out = Path(out)
    if workers < 1 or threads < 1:
        raise ValueError(f"workers and threads must be >= 1, got {workers!r}, {threads!r}")
    if overwrite:  # the files earlier runs recorded, nothing else (docs/conventions.md)
        remove_written(out, WRITER)

    def record(*paths) -> None:
        record_written(out, WRITER, [p for p in paths if p is not None])

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        data = out / "data"
        info = ensure_hierarchy(data, scale=sc.hierarchy, seed=seed, overwrite=overwrite)
        log(f"data: {data} ({len(info.classes)} classes)")
        teachers, jobs = plan_zoo(sc, seed)
        models = out / "models"
        # the students wait for their teachers; everything else trains alongside the teachers
        teacher_specs = tuple(f"{j.arch.arch}={models / f'{j.tag}.safetensors'}"
                              for j in teachers)
        first = teachers + [j for j in jobs if j.regime != "distill"]
        second = [j for j in jobs if j.regime == "distill"]
        ckpts, fresh = {}, set()
        fingerprint = None if overwrite else dataset_fingerprint(data / "train")  # once
        for stage in (first, second):
            configs = [_train_config(j, sc, teacher_specs, device) for j in stage]
            fresh |= {j.tag for j, c in zip(stage, configs, strict=True)
                      if overwrite or _stale(models / f"{j.tag}.safetensors", c, fingerprint)}
            record(*(f for j in stage for f in checkpoint_files(models / f"{j.tag}.safetensors")))
            ckpts |= _train_all(stage, configs, data, models, workers, threads, log,
                                redo=overwrite, fingerprint=fingerprint)

        caches = out / "caches"
        test = info.splits["test"]
        # REFERENCE_EXECUTION pins contiguous tensors, no AMP and no loader workers: the
        # published numbers do not move with PredictConfig's defaults
        pred = PredictConfig(batch_size=256, device=device, **REFERENCE_EXECUTION)
        paths: dict[str, Path] = {}
        for j in teachers + jobs:  # a network trained now replaces its predecessor's caches
            (paths[j.key],) = predict_to_files(f"{j.arch.arch}={ckpts[j.tag]}",
                                               test, caches, pred, dataset_name="test",
                                               overwrite=j.tag in fresh)
            record(paths[j.key])
            if j.arch.mc_dropout and j.regime == "plain" and not j.teacher_member:
                record(*predict_to_files(f"{j.arch.arch}={ckpts[j.tag]}", test, caches,
                                         PredictConfig(mode="mc_dropout", passes=sc.mc_passes,
                                                       batch_size=256, seed=seed,
                                                       device=device, **REFERENCE_EXECUTION),
                                         dataset_name="test", overwrite=j.tag in fresh))
        t_arch = ZOO_ARCHS[sc.teacher]
        ens_name = f"ens/{t_arch.arch}.hier_{t_arch.name}_ensemble"
        ens_path = caches / "teacher_ensemble.test.plain-000.nc"
        record(ens_path)
        if ensure_ensemble_cache([paths[j.key] for j in teachers], ens_path, ens_name, t_arch.arch,
                                 f"hier_{t_arch.name}_ensemble"):
            log(f"teacher ensemble: {ens_path}")
        enc_job = next(j for j in jobs if j.arch.name == sc.prototype_encoder
                       and j.regime == "plain" and j.replicate == 0)
        retrained = enc_job.tag in fresh  # a new encoder makes a new prototype classifier
        proto_ckpt = _prototype(ckpts[enc_job.tag], enc_job, info, sc,
                                models / f"hier_{enc_job.arch.name}_proto.safetensors",
                                rebuild=retrained)
        proto_name = f"proto/{enc_job.arch.arch}"
        (paths[proto_name],) = predict_to_files(f"{proto_name}={proto_ckpt}", test, caches, pred,
                                                dataset_name="test", overwrite=retrained)
        record(proto_ckpt, sidecar_path(proto_ckpt), paths[proto_name])
        log(f"caches: {caches}")

        proto_key = metadata_key("proto", enc_job.arch.arch, proto_ckpt.stem)
        record(out / "metadata.csv", out / "scores" / "selective.nc", out / "analysis.json",
               out / "summary.md")
        table = write_metadata(_metadata_rows(teachers, jobs, ens_name, proto_key, sc),
                               out / "metadata.csv")
        ds = score_selective([caches], SelectiveConfig(
            calibration_size=sc.calibration_size, seed=seed, test="test", metadata=(table,),
            mc_passes=sc.mc_passes))
        replicate = {j.key: j.replicate for j in teachers + jobs}
        regime = {j.key: ("teacher_member" if j.teacher_member else j.regime)
                  for j in teachers + jobs}
        keys = [str(k) for k in ds["metadata_key"].values]
        ds = ds.assign_coords(
            replicate=("model", np.array([replicate.get(k, -1) for k in keys])),
            regime=("model", np.array([regime.get(k, "ensemble" if k == ens_name else "prototype")
                                       for k in keys], dtype=object)))
        ds.attrs.update(reproduce=json.dumps({"scale": asdict(sc), "seed": seed,
                                              "workers": workers, "threads": threads,
                                              "device": device}))
        selective = write_dataset(ds, out / "scores" / "selective.nc", overwrite=True)
        ds = read_dataset(selective)
        log(f"scores: {selective}")

        analysis = _analyse(ds, improvements, metric_disagreement)
        analysis_path = out / "analysis.json"
        analysis_path.write_text(json.dumps(analysis, indent=1, default=_json_default) + "\n")
        figures = plot_selective(ds, out / "figures")
        record(*figures)
        wall = time.perf_counter() - t0
        summary = out / "summary.md"
        summary.write_text(render_summary(ds, analysis, sc, wall))
        log(f"analysis: {analysis_path}; summary: {summary}; {len(figures)} figures")
        return ReproduceResult(out, selective, analysis_path, summary, figures, wall)
    finally:
        torch.set_num_threads(previous)


def _json_default(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.bool_):
        return bool(x)
    raise TypeError(type(x))


def _mean_se(v: np.ndarray) -> dict[str, float]:
    v = v[np.isfinite(v)]
    se = float(np.std(v, ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("nan")
    return {"n": int(v.size), "mean": float(np.mean(v)) if v.size else float("nan"),
            "se": se, "n_positive": int(np.sum(v > 0))}


def _analyse(ds, improvements, metric_disagreement) -> dict:
    """Everything the summary reports, JSON-able."""
    metrics = ("auroc", "ece", "aurc", "sac_95", "accuracy")
    out: dict[str, Any] = {}
    table = improvements(ds, metrics=metrics)
    out["improvements"] = {
        t: {m: _mean_se(table[f"improvement_{m}"].values[table["technique"].values == t])
            for m in metrics}
        for t in dict.fromkeys(table["technique"].values)}
    for regime in ("distillation", "label_smoothing"):
        pairs = paired_comparisons(ds, regime, metrics=metrics)
        out[f"pairs_{regime}"] = [
            {"treated": str(pairs["treated"].values[i]), "baseline": str(pairs["baseline"].values[i]),
             **{f"delta_{m}": float(pairs[f"delta_{m}"].values[i]) for m in metrics}}
            for i in range(pairs.sizes["pair"])]
    students = teacher_comparisons(ds, metrics=metrics)
    out["students_vs_teacher"] = [
        {"student": str(students["treated"].values[i]), "teacher": str(students["baseline"].values[i]),
         **{f"delta_{m}": float(students[f"delta_{m}"].values[i]) for m in metrics}}
        for i in range(students.sizes["pair"])]
    out["temperature"] = summarize_temperature_effect(temperature_effect(ds, metrics=("auroc",
                                                                                      "ece")))
    corr = family_correlations(ds)
    out["correlations"] = {str(g): {str(p): {"spearman": float(corr["spearman"].sel(group=g,
                                                                                     pair=p)),
                                             "pvalue": float(corr["pvalue"].sel(group=g, pair=p)),
                                             "n": int(corr["n"].sel(group=g, pair=p))}
                                    for p in corr["pair"].values} for g in corr["group"].values}
    out["disagreement"] = {c: metric_disagreement(ds, "auroc", "ece", calibration=c)
                           for c in ("none", "temperature")}
    return out


def _fmt(x: float, digits: int = 3) -> str:
    return "nan" if not np.isfinite(x) else f"{x:.{digits}f}"


def render_summary(ds, analysis: dict, sc: ZooScale, wall_s: float) -> str:
    """The Markdown summary of a run (per-model table, pair statistics, findings)."""
    lines = [f"# Selective zoo on the `{sc.hierarchy}` hierarchy (scale `{sc.name}`)", "",
             (f"{ds.sizes['model']} rows; {ds.attrs.get('n_images', '?')} test samples: "
              f"the columns with TS are over the {ds.attrs.get('n_eval', '?')} outside the "
              f"{ds.attrs.get('n_calib', '?')} calibration samples, those without TS over "
              + ("all of them (Galil et al.'s official code)"
                 if "all" in ds["sample_set"].values.tolist() else "the same ones")
              + "; the temperature-scaling improvements below compare both on those held-out "
              f"samples. Wall time {wall_s / 60:.1f} min."), "",
             ("| model | regime | family | params | accuracy | AUROC | AUROC (TS) | ECE | "
             "ECE (TS) | AURC | SAC@95 | T |"), "|" + "---|" * 12]
    order = np.argsort(-np.nan_to_num(ds["auroc"].sel(calibration="none").values, nan=-1))
    for i in order:
        r = ds.isel(model=int(i))
        v = lambda name, cal="none", r=r: float(r[name].sel(calibration=cal))
        lines.append(
            f"| {r['model'].item()} | {r['regime'].item()} | {r['family'].item()} | "
            f"{int(r['params'].item()) if np.isfinite(r['params'].item()) else '?'} | "
            f"{_fmt(v('accuracy'))} | {_fmt(v('auroc'))} | {_fmt(v('auroc', 'temperature'))} | "
            f"{_fmt(v('ece'))} | {_fmt(v('ece', 'temperature'))} | {_fmt(v('aurc'))} | "
            f"{_fmt(v('sac_95'))} | {_fmt(v('temperature', 'temperature'), 2)} |")
    lines += ["", ("Improvements (positive = better; mean ± standard error over pairs, "
              "n pairs, n improved):"), "",
              "| technique | AUROC | ECE | AURC | SAC@95 | accuracy |", "|" + "---|" * 6]
    for tech, per in analysis["improvements"].items():
        cells = [f"{_fmt(per[m]['mean'], 4)} ± {_fmt(per[m]['se'], 4)} "
                 f"({per[m]['n_positive']}/{per[m]['n']})" for m in
                 ("auroc", "ece", "aurc", "sac_95", "accuracy")]
        lines.append(f"| {tech} | " + " | ".join(cells) + " |")
    t = analysis["temperature"]
    lines += ["", ("Temperature scaling: AUROC improved for "
              f"{_fmt(t['auroc']['fraction_improved'], 2)} of models (T < 1: "
              f"{_fmt(t['auroc']['fraction_improved_t_below_1'], 2)}, T > 1: "
              f"{_fmt(t['auroc']['fraction_improved_t_above_1'], 2)}; Spearman(T, ΔAUROC) = "
              f"{_fmt(t['auroc']['spearman_t'], 2)}); ECE improved for "
              f"{_fmt(t['ece']['fraction_improved'], 2)} (Spearman(T, ΔECE) = "
              f"{_fmt(t['ece']['spearman_t'], 2)})."), ""]
    for cal, d in analysis["disagreement"].items():
        lines.append(f"AUROC vs ECE ({cal}): Spearman of the model orders {_fmt(d['spearman'], 2)}"
                     f", {_fmt(d['discordant_fraction'], 2)} of model pairs ordered oppositely; "
                     f"best by AUROC {d['best_auroc']}, by ECE {d['best_ece']}.")
    corr = analysis["correlations"]
    lines += ["", ("Spearman correlations (raw values; ECE lower is better; p: two-sided, "
                   "scipy's t approximation, rows taken as independent):"), "",
              "| group | " + " | ".join(next(iter(corr.values()))) + " |",
              "|" + "---|" * (1 + len(next(iter(corr.values()))))]
    for g, per in corr.items():
        lines.append(f"| {g} | " + " | ".join(
            f"{_fmt(c['spearman'], 2)} (n={c['n']}, p={_fmt(c.get('pvalue', np.nan), 3)})"
            for c in per.values()) + " |")
    return "\n".join(lines) + "\n"


def run(out: str | os.PathLike, *, scale: str = "smoke", data=None, arch=None, seed: int = 0,
        overwrite: bool = False, options: dict[str, str] | None = None,
        log: Callable[[str], None] = print, device: str = "cpu") -> Path:
    """The driver of ``uqvision reproduce selective`` (:data:`REPRODUCTION`):
    :func:`reproduce_selective`.

    Options (``--set key=value``): ``workers`` (networks trained at once, default 1) and
    ``threads`` (torch threads per process, default 1), launcher options that only the command
    line gives (never a ``--config`` file). Returns the summary's path.
    """
    if data is not None or arch is not None:
        raise ValueError("the selective reproduction trains its own zoo on the hierarchy "
                         "stand-in; --data/--arch do not apply (score a zoo of real models with "
                         "uqvision sweep)")
    opts = dict(options or {})
    try:
        workers, threads = int(opts.pop("workers", 1)), int(opts.pop("threads", 1))
    except ValueError as exc:
        raise ValueError(f"--set workers=N / threads=N need integers: {exc}") from None
    if opts:
        raise ValueError(f"unknown options {sorted(opts)} of reproduce selective; valid: "
                         "workers, threads")
    return reproduce_selective(out, scale=scale, seed=seed, workers=workers, threads=threads,
                               overwrite=overwrite, log=log, device=device).summary


#: This protocol's ``uqvision reproduce`` driver (:attr:`Protocol.reproduce`).
REPRODUCTION = Reproduction("selective", DESCRIPTION, run, scales=tuple(ZOO_SCALES.names()))
