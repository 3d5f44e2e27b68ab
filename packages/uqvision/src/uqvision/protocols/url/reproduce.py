"""``uqvision reproduce url``: the URL transfer benchmark (docs/conventions.md#v-4) end to end.

Steps (each resumable: a finished file is never recomputed):

1. data: the ``hierarchy`` set at the scale's size (``DIR/data/hierarchy``) viewed as an
   upstream root and one root per downstream group (:func:`uqvision.protocols.url.score.hierarchy_layout`)
   — or real folders: ``--upstream ROOT --downstream ROOT1 ROOT2 --arch NAME`` (the same as
   ``--set upstream=ROOT --set downstream=ROOT1,ROOT2``; upstream with ``train/val/test``, each
   downstream with ``val/test``); both give a :class:`~uqvision.protocols.url.score.TransferLayout` and
   everything after this step is the same code; each downstream dataset's classes are then
   split into disjoint validation and test classes (seeded by ``--set split_seed=N``, default
   ``--seed``; :func:`uqvision.protocols.url.score.split_downstream`, views in
   ``DIR/data/split``): selection sees only validation classes;
2. the backbone checkpoint: ``--set backbone=FILE`` (a timm checkpoint of ``--arch``), else a
   CE model trained on the upstream training classes (``DIR/backbone.safetensors``);
3. every method x configuration x seed fine-tunes the backbone with its loss
   (:mod:`uqvision.methods.representation`) through the one training loop
   (:func:`uqvision.training.loop.train_model`, checkpoints in ``DIR/runs/``; a checkpoint whose
   sidecar records this run's training config is reused, :func:`uqvision.training.runs.run_matches`,
   any other retrained, and every run retrained after its backbone was), then the one prediction path (:func:`uqvision.predict.predict_to_files`, modes
   ``plain`` and ``crop``) writes caches of embeddings and u for the upstream test set (with
   logits) in ``plain`` and ``crop`` mode, each downstream ``val``/``test`` (plain) and
   ``test`` (crop), and the soft-label set, into ``DIR/caches/`` (a cache of the same inputs
   is kept; one of other inputs, say of another class split, is refused without
   ``--overwrite``, and a retrained run's caches are written again);
4. :func:`uqvision.protocols.url.score.score_transfer` -> ``DIR/transfer.nc`` (with the
   rank correlations of the paper's Fig. 4 over every run); figures in ``DIR/figures/`` (the
   paper's Fig. 1, 2 and 4 left and right).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from uqmetrics import read_dataset, write_dataset
from uqmetrics.metrics.registry import Registry

from ...cache import cache_key
from ...data import check_split_classes, dataset_fingerprint, flush_denormal
from ...hierarchy import ensure_hierarchy
from ...methods import TRAINING_METHODS
from ...models import ModelSpec
from ...predict import REFERENCE_EXECUTION, PredictConfig, predict_to_files
from ...training.loop import ImageTrainConfig, train_model
from ...training.runs import run_matches
from ..base import DriverScale, Reproduction
from . import DESCRIPTION
from .methods import REPRESENTATION_METHODS
from .plots import draw_figures
from .score import TransferLayout, hierarchy_layout, score_transfer, split_downstream

__all__ = ["REPRODUCTION", "URL_SCALES", "URLScale", "reproduce_url"]


@dataclass(frozen=True)
class URLScale(DriverScale):
    """Sizes of one scale: the hierarchy scale, backbone pre-training, the runs."""

    backbone_epochs: int
    epochs: float
    seeds: tuple[int, ...]
    lrs: tuple[float, ...]
    batch_size: int = 32
    accumulate: int = 2


URL_SCALES: Registry[URLScale] = Registry("url scale")
URL_SCALES.add("smoke", URLScale("smoke", "tests: smoke hierarchy, 1 epoch per method, 1 seed",
                                 "smoke", backbone_epochs=2, epochs=1, seeds=(0,), lrs=(2e-3,),
                                 batch_size=16))
URL_SCALES.add("cpu", URLScale("cpu", "cpu hierarchy (24 upstream classes), 2 epochs, 2 seeds, "
                               "2 learning rates", "cpu", backbone_epochs=8, epochs=2,
                               seeds=(0, 1), lrs=(1e-3, 4e-3)))


#: ``--set`` options of the driver (besides ``<method>.<field>`` hyper-parameters).
OPTIONS = ("methods", "upstream", "downstream", "backbone", "input_size", "batch_size",
           "split_seed")


def _layout(out: Path, scale: URLScale, seed: int, options: dict, overwrite: bool
            ) -> TransferLayout:
    if "upstream" in options or "downstream" in options:
        roots = [Path(p) for p in options.get("downstream", "").split(",") if p]
        if "upstream" not in options or not roots:
            raise ValueError("real folders need both --upstream ROOT and --downstream ROOT "
                             f"[ROOT ...], got upstream={options.get('upstream')!r}, "
                             f"downstream={options.get('downstream')!r}")
        names = [p.name for p in roots]
        if len(set(names)) != len(names) or {"upstream", "mixed"} & set(names):
            raise ValueError(f"downstream roots need distinct folder names other than "
                             f"'upstream' and 'mixed', got {names}")
        for root, splits in [(Path(options["upstream"]), ("train", "val", "test")),
                             *[(r, ("val", "test")) for r in roots]]:
            missing = [sp for sp in splits if not (root / sp).is_dir()]
            if missing:
                raise ValueError(f"data root {str(root)!r} lacks the split folders {missing}")
        up = Path(options["upstream"])  # by name: val/test may hold a subset of train's classes
        check_split_classes(up / "train", {"val": up / "val", "test": up / "test"})
        return TransferLayout(up, {p.name: p for p in roots})
    root = out / "data" / "hierarchy"
    ensure_hierarchy(root, scale=scale.hierarchy, seed=seed, overwrite=overwrite)
    return hierarchy_layout(root, out / "data" / "views")


def _backbone(out: Path, layout: TransferLayout, arch: str, scale: URLScale, seed: int,
              options: dict, device: str, log, overwrite: bool,
              fingerprint: str | None) -> tuple[Path, bool]:
    """The backbone checkpoint and whether it was trained now (``--set backbone=FILE``: that
    file, never trained); ``fingerprint``: the upstream training folder's (a checkpoint
    trained on other images is trained again)."""
    if "backbone" in options:
        return Path(options["backbone"]), False
    ckpt = out / "backbone.safetensors"
    cfg = ImageTrainConfig(arch=arch, epochs=scale.backbone_epochs, seed=seed, device=device,
                           input_size=int(options.get("input_size", 32)), tag="url_backbone")
    if not overwrite and run_matches(ckpt, cfg, data_fingerprint=fingerprint):
        return ckpt, False
    log(f"url: training the {arch} backbone on the upstream classes")
    train_model(layout.upstream / "train", ckpt, cfg)
    return ckpt, True


def _run_caches(out: Path, layout: TransferLayout, run: str) -> dict:
    """``(dataset, split, mode) -> (image folder, cache path)`` of one run."""
    paths = {("upstream", "test", "plain"): layout.upstream / "test",
             ("upstream", "test", "crop"): layout.upstream / "test"}
    for name, root in layout.downstream.items():
        paths[(name, "val", "plain")] = root / "val"
        paths[(name, "test", "plain")] = root / "test"
        paths[(name, "test", "crop")] = root / "test"
    if layout.mixed is not None:
        paths[("mixed", "test", "plain")] = layout.mixed
    return {k: (src, out / "caches" / f"{cache_key(run, f'{k[0]}-{k[1]}', k[2], 0)}.nc")
            for k, src in paths.items()}


def reproduce_url(out: str | os.PathLike, *, scale: str = "smoke", arch: str | None = None,
                  seed: int = 0, methods=None, options: dict | None = None,
                  device: str = "cpu", log=print, overwrite: bool = False) -> Path:
    """Run the URL benchmark into ``out``; returns ``out/transfer.nc``. See the module doc.

    ``overwrite``: make the stand-in again if ``out`` holds one of another scale or seed,
    retrain the backbone and every run, and write every cache again."""
    sc = URL_SCALES.lookup(scale)
    options = dict(options or {})
    unknown = sorted(k for k in options if k not in OPTIONS and "." not in k)
    if unknown:
        raise ValueError(f"unknown options {unknown} of reproduce url; valid: "
                         f"{', '.join(OPTIONS)}, <method>.<field>")
    methods = list(methods) if methods else options.pop(
        "methods", ",".join(REPRESENTATION_METHODS)).split(",")
    for m in methods:
        if m not in REPRESENTATION_METHODS:
            TRAINING_METHODS.lookup(m)
            raise ValueError(f"method {m!r} is not a URL method; choose from "
                             f"{', '.join(REPRESENTATION_METHODS)}")
    arch = arch or "test_resnet"
    out = Path(out)
    (out / "caches").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with flush_denormal():
        split_seed = int(options.get("split_seed", seed))
        layout = split_downstream(_layout(out, sc, seed, options, overwrite),
                                  out / "data" / "split", split_seed)
        # the upstream training images' fingerprint, once: a run trained on others is retrained
        fingerprint = None if overwrite else dataset_fingerprint(layout.upstream / "train")
        ckpt, retrain = _backbone(out, layout, arch, sc, seed, options, device, log, overwrite,
                                  fingerprint)
        retrain = retrain or overwrite  # the runs fine-tune the backbone: retrained with it
        runs: dict = {}
        for s in sc.seeds:  # seed-major: a cut-short run has every method at seed 0
            for method in methods:
                for c, lr in enumerate(sc.lrs):
                    name = f"{method}-c{c}-s{s}"
                    caches = _run_caches(out, layout, name)
                    runs[(method, c, s)] = {k: dst for k, (_, dst) in caches.items()}
                    t1 = time.perf_counter()
                    run_ckpt, trained = _train(method, ckpt, arch, layout, out, name, sc, lr, s,
                                               options, device, retrain, fingerprint)
                    spec = ModelSpec(arch, str(run_ckpt), label=name)
                    attrs = {"url_config": c, "run_seed": s, "lr": lr, "backbone": str(ckpt)}
                    for (ds, split, mode), (src, dst) in caches.items():
                        extra = ({"soft_labels_root": str(layout.soft_labels_root)}
                                 if ds == "mixed" and layout.soft_labels_root else {})
                        # REFERENCE_EXECUTION pins contiguous tensors, no AMP and no loader
                        # workers: the published numbers do not move with PredictConfig's
                        # defaults
                        cfg = PredictConfig(mode=mode, embeddings=True, logits=ds == "upstream",
                                            device=device,
                                            batch_size=int(options.get("batch_size", 64)),
                                            **REFERENCE_EXECUTION)
                        # a cache of these inputs is kept, one of others refused (overwrite:
                        # the run was retrained, its caches are written again)
                        (path,) = predict_to_files(spec, src, dst.parent, cfg,
                                                   dataset_name=f"{ds}-{split}",
                                                   attrs={**attrs, **extra}, overwrite=trained)
                        if path != dst:
                            raise RuntimeError(f"cache written to {path}, expected {dst}")
                    log(f"url: {name} {'trained' if trained else 'reused'}, caches in "
                        f"{time.perf_counter() - t1:.0f} s")
    result = score_transfer(runs, list(layout.downstream), soft_labels=layout.soft_labels,
                            attrs={"scale": scale, "architecture": arch,
                                   "wall_time_s": time.perf_counter() - t0, "device": device,
                                   "lrs": list(sc.lrs), "epochs": sc.epochs,
                                   "class_split_seed": split_seed})
    path = write_dataset(result, out / "transfer.nc", overwrite=True)
    draw_figures(read_dataset(path), out / "figures")
    return path


def _train(method, ckpt, arch, layout, out: Path, name: str, sc: URLScale, lr, seed, options,
           device, overwrite: bool, fingerprint: str | None) -> tuple[Path, bool]:
    """Fine-tune the backbone checkpoint with ``method`` through the one training loop: the
    run's checkpoint and whether it was trained now (kept when its sidecar records this
    config and ``fingerprint``, the upstream training folder's: resume;
    :func:`uqvision.training.runs.run_matches`)."""
    path = out / "runs" / f"{name}.safetensors"
    sets = {k[len(method) + 1:]: v for k, v in options.items() if k.startswith(method + ".")}
    cfg = ImageTrainConfig(arch=arch, method=method, hparams={"accumulate": sc.accumulate, **sets},
                      epochs=sc.epochs, batch_size=sc.batch_size, lr=lr, seed=seed,
                      device=device, init_checkpoint=str(ckpt), tag=name,
                      input_size=int(options.get("input_size", 32)))
    if not overwrite and run_matches(path, cfg, data_fingerprint=fingerprint):
        return path, False
    return train_model(layout.upstream / "train", path, cfg).checkpoint, True


def run(out: str | os.PathLike, *, scale: str = "smoke", data=None, arch=None, seed: int = 0,
        overwrite: bool = False, options: dict | None = None, log=print,
        device: str = "cpu") -> Path:
    """The driver of ``uqvision reproduce url`` (:data:`REPRODUCTION`).
    ``--upstream ROOT`` (or ``--data ROOT``) is the
    upstream root; the downstream roots come from ``--downstream ROOT1 ROOT2`` (or ``--set
    downstream=ROOT1,ROOT2``); ``--set methods=ce,elk`` limits the
    methods; ``--set <method>.<field>=value`` sets a method's hyper-parameter; ``--set
    input_size=224`` the square input side (default 32, the stand-in's); ``--set
    batch_size=N`` the prediction batch size (default 64); ``--set split_seed=N`` the seed of
    the downstream validation/test class split (default ``--seed``)."""
    options = dict(options or {})
    if data is not None:
        options.setdefault("upstream", str(data))
    return reproduce_url(out, scale=scale, arch=arch, seed=seed, options=options,
                         device=device, log=log, overwrite=overwrite)


#: This protocol's ``uqvision reproduce`` driver (:attr:`Protocol.reproduce`).
REPRODUCTION = Reproduction("url", DESCRIPTION, run, scales=tuple(URL_SCALES.names()))
