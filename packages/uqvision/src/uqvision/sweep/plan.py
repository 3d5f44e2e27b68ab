"""A sweep planned and checked before anything runs: the models of patterns and zoos
(:func:`expand_models`), their cells (:func:`plan_sweep`, :class:`SweepPlan`) and everything
:func:`_prepare` checks before the first cell (failures file, images, weights, the caches
already there), which :func:`uqvision.sweep.sweep_predictions` and
:func:`uqvision.sweep.dry_run_sweep` share.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import timm
import torchvision
from uqmetrics.runs.sweep import Cell, read_failures

from ..data import ImageFolderDataset, readable_images
from ..models import MODEL_SOURCES, ModelSpec, check_model_name
from ..predict import PredictConfig, cache_plan, check_caches
from ..predict.plan import _resolved, _train_data_fingerprint
from ..zoo import zoo_models
from .failures import FAILURES_FILE
from .sets import SweepTarget, sweep_targets
from .weights import WeightsStatus, _line, check_weights, find_weights

__all__ = ["SweepPlan", "expand_models", "plan_sweep"]


def expand_models(patterns: Iterable[str]) -> list[ModelSpec]:
    """Names, ``NAME=CHECKPOINT`` and wildcards (``resnet*``, ``vit_*.augreg*``) -> specs.

    A wildcard with a ``.`` matches pretrained tags (``timm.list_pretrained``), otherwise
    architectures (``timm.list_models``); ``tv/<pattern>`` matches torchvision names. Exact names
    are validated (``ValueError`` with close names); a wildcard that matches nothing raises.
    """
    out: list[ModelSpec] = []
    for pat in patterns:
        if "=" in pat:
            spec = ModelSpec.parse(pat)
            check_model_name(spec.name)
            out.append(spec)
        elif any(ch in pat for ch in "*?["):
            if pat.startswith("tv/"):
                names = ["tv/" + n for n in fnmatch.filter(torchvision.models.list_models(),
                                                           pat[3:])]
            elif "." in pat:
                names = timm.list_pretrained(pat)
            else:
                names = timm.list_models(pat)
            if not names:
                raise ValueError(f"pattern {pat!r} matches no model")
            out.extend(ModelSpec(n) for n in names)
        else:
            check_model_name(pat)
            out.append(ModelSpec(pat))
    by_row: dict[str, list[ModelSpec]] = {}
    for s in out:
        by_row.setdefault(s.row, []).append(s)
    dup = [_twice(row, specs) for row, specs in sorted(by_row.items()) if len(specs) > 1]
    if dup:
        raise ValueError(f"models listed twice: {'; '.join(dup)}")
    return out


def _twice(row: str, specs: Sequence[ModelSpec]) -> str:
    """What a result row named by several listed models is: the row, and, where they are
    different files, which (their row is ``NAME@<file stem>``: two files of one stem)."""
    files = sorted({str(s.checkpoint) for s in specs if s.checkpoint is not None})
    if len(files) < 2:
        return repr(row)
    return (f"{row!r} names {len(files)} files ({', '.join(files)}): a checkpoint's result row "
            "is NAME@<file stem>; rename one file")


@dataclass
class SweepPlan:
    """Cells to run, models refused before running (name -> reason), and the folders the cells
    predict (the ``--data`` first, then every member of the extra sets)."""

    cells: list[Cell] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    targets: list[SweepTarget] = field(default_factory=list)


def _target_cells(spec: ModelSpec, target: SweepTarget, threads: int | None) -> list[Cell]:
    """The cells of one model on one target: one per prediction sample and pass (a run of a
    training method has several; :func:`uqvision.predict.cache_plan`)."""
    folder, config = target.folder, target.config
    cells = []
    for k, p, key in cache_plan(spec, config, target.dataset_name):
        cfg = asdict(config)
        cfg.update(first_sample=k, samples=1)
        if config.mode == "tta":
            cfg.update(first_pass=p, passes=1)
        cells.append(Cell(key, {
            "name": spec.name, "checkpoint": spec.checkpoint, "label": spec.label,
            "data": str(Path(folder.root).resolve()), "dataset_name": target.dataset_name,
            "config": cfg, "threads": threads, "labels": None if folder.label_file is None
            else str(Path(folder.label_file.path).resolve()),
            "subset": folder.subset is not None}))
    return cells


def plan_sweep(specs: Sequence[ModelSpec], data: str | os.PathLike | ImageFolderDataset,
               config: PredictConfig, *, weights_dir: str | os.PathLike | None = None,
               dataset_name: str | None = None, threads: int | None = None,
               sets: Iterable[str | tuple[str, str | os.PathLike]] = ()) -> SweepPlan:
    """The cells of a sweep; unreadable images are refused up front unless
    ``config.skip_bad_images`` (:func:`uqvision.data.readable_images`). ``data``: the folder,
    or its scan; ``sets``: extra evaluation sets, ``EVALSET=PATH`` each
    (:func:`~.sets.sweep_targets`: every member of an expanded set), each model predicting
    every one of them once, as ``uqvision predict --eval-set EVALSET [--eval-member M]``
    would (one cell per model, member, sample and pass, after the model's cells of ``data``).

    Each model's weights are, first that applies, its ``NAME=FILE``, the file
    ``weights_dir`` holds for it (:func:`find_weights`), random ones with
    ``config.allow_random_init``, else its pretrained weights from the Hugging Face hub /
    torch.hub caches, loaded (and downloaded when allowed) by its cells
    (:func:`uqvision.models.load_model`). The plan does not look them up:
    :func:`sweep_predictions` does, for every model at once, before submitting a cell
    (:func:`check_weights`). A ``weights_dir`` that is not a folder is a ``ValueError``
    (a mistyped one would else load every model's pretrained weights instead)."""
    if weights_dir is not None and not Path(weights_dir).is_dir():
        raise ValueError(f"weights_dir {str(weights_dir)!r} is not a folder (the folder of the "
                         "models' <name>.safetensors/.pth files)")
    folder = data if isinstance(data, ImageFolderDataset) else ImageFolderDataset(data)
    targets = sweep_targets(folder, config, sets, dataset_name=dataset_name)
    # folder and image errors before anything is submitted
    for target in targets:
        readable_images(target.folder, skip_bad=config.skip_bad_images)
    plan = SweepPlan(targets=targets)
    for spec in specs:
        spec = find_weights(spec, weights_dir)  # a local file first; else the hub cache
        if spec.source not in MODEL_SOURCES:
            plan.refused[spec.row] = f"unknown model source {spec.source!r}"
            continue
        for target in targets:
            plan.cells.extend(_target_cells(spec, target, threads))
    return plan


def _models_of(cells: Iterable[Cell]) -> dict[str, tuple[ModelSpec, list[Cell]]]:
    """Model row -> (its spec, its cells), in plan order."""
    models: dict[str, tuple[ModelSpec, list[Cell]]] = {}
    for cell in cells:
        spec = ModelSpec(cell.params["name"], cell.params["checkpoint"], cell.params["label"])
        models.setdefault(spec.row, (spec, []))[1].append(cell)
    return models


def _id_classes(cells: list[Cell], folder: ImageFolderDataset, dataset_name: str) -> None:
    """A model that gets random weights and records no class names takes the ``--data``
    folder's sorted classes as its own: its cells of every other folder (an OOD set, a subset
    of the classes) are given them (``PredictConfig.model_classes``), so that its class space
    never comes from that folder (docs/conventions.md#v-6)."""
    classes = list(folder.classes)
    for c in cells:
        cfg = c.params["config"]
        if (c.params["dataset_name"] != dataset_name and cfg.get("allow_random_init")
                and not c.params["checkpoint"] and cfg.get("logits", True)):
            cfg["model_classes"] = classes


def _train_fingerprint(spec: ModelSpec, targets: Sequence[SweepTarget]) -> str:
    """The fingerprint of the folder ``spec``'s samples recompute their BatchNorm statistics
    on (``""``: none; :func:`uqvision.predict.plan._train_data_fingerprint`), hashed once per
    sweep: its scan is kept with the scan of the ``--data`` (``targets[0]``), which the plan's
    checks and the cells' fingerprints share (:func:`~.decode.plan_fingerprints`)."""
    first = targets[0]
    return _train_data_fingerprint(spec, _resolved(first.config), first.folder)


def _refuse_other_caches(plan: SweepPlan, out_dir: str | os.PathLike, *,
                         skip: Iterable[str] = ()) -> dict[str, str]:
    """Resume only what matches: a model with caches already in ``out_dir`` has them checked,
    target by target (the ``--data`` and each member of the extra sets), as ``predict`` checks
    them (:func:`uqvision.predict.check_caches`: full identity, not a cache, corrupt); a model
    whose caches differ is refused (its cells leave the plan, its files are kept, the report
    says why), before any cell runs. Models with no cache there, and the rows in ``skip``, are
    left to their cells. A model's BatchNorm folder (SWAG, K-FAC Laplace) is hashed once for
    all its targets (:func:`_train_fingerprint`). Returns the refused rows -> why."""
    refused, skip = {}, set(skip)
    by_name = {t.dataset_name: t for t in plan.targets}
    for row, (spec, cells) in _models_of(plan.cells).items():
        if row in skip:
            continue
        on_disk = {c.params["dataset_name"] for c in cells
                   if (Path(out_dir) / f"{c.key}.nc").exists()}
        try:
            train = _train_fingerprint(spec, plan.targets) if on_disk else ""
            for name in on_disk:
                target = by_name[name]
                given = next(c.params["config"].get("model_classes") for c in cells
                             if c.params["dataset_name"] == name)  # its cells' (_id_classes)
                config = target.config if given is None else replace(
                    target.config, model_classes=tuple(given))
                check_caches(spec, target.folder, out_dir, config, dataset_name=name,
                             train_fingerprint=train)
        except (ValueError, OSError) as exc:
            refused[row] = _line(exc)
            plan.cells = [c for c in plan.cells if c not in cells]
    return refused


def _zoo_specs(zoos: Iterable[str], seen: set[str]
               ) -> tuple[list[ModelSpec], dict[str, tuple[ModelSpec, str]]]:
    """The models of ``zoos`` not in ``seen``; names the installed timm/torchvision do not
    know are returned as refusals (row -> (spec, reason)), not raised."""
    specs, refused = [], {}
    for entry in zoo_models(zoos):
        spec = ModelSpec.parse(entry)  # a zoo may list local weights as NAME=CHECKPOINT
        if spec.row in seen or (spec.checkpoint is None and spec.name in seen):
            continue
        seen.add(spec.row)
        try:
            check_model_name(spec.name)
        except ValueError as exc:
            why = (f"{' '.join(str(exc).split())} (timm {timm.__version__}, torchvision "
                   f"{torchvision.__version__})")
            refused[spec.row] = (spec, why)
            continue
        specs.append(spec)
    return specs, refused


@dataclass
class _Prepared:
    """A sweep planned and checked, nothing run or written yet (:func:`_prepare`)."""

    specs: list[ModelSpec]
    unknown: dict[str, tuple[ModelSpec, str]]
    plan: SweepPlan
    model_specs: dict[str, ModelSpec]
    weights: dict[str, WeightsStatus]
    refused: dict[str, str]
    previous: list[dict]
    failures_path: Path
    folder: ImageFolderDataset
    dataset_name: str
    targets: list[SweepTarget]


def _prepare(patterns: Iterable[str], data: str | os.PathLike | ImageFolderDataset,
             out_dir: str | os.PathLike, config: PredictConfig, *, zoos: Iterable[str],
             weights_dir: str | os.PathLike | None, dataset_name: str | None,
             threads: int | None, overwrite: bool, failures_file: str | os.PathLike | None,
             probe: bool, dry_run: bool = False,
             sets: Iterable[str | tuple[str, str | os.PathLike]] = ()) -> _Prepared:
    """Everything before the first cell: models expanded (unknown zoo members set aside),
    the failures file read, images checked, the cells planned (a random model's cells of the
    other folders given the ``--data`` classes, :func:`_id_classes`), every model's weights
    looked up (:func:`check_weights`: the unavailable ones leave the plan) and, unless
    ``overwrite``, the caches already there checked, with the config their cells run with
    (other inputs: the model leaves the plan). Writes nothing;
    ``dry_run`` also downloads nothing (models whose weights are not cached are not
    identity-checked: that hashes the weights)."""
    patterns, zoos = list(patterns), list(zoos)
    if not patterns and not zoos:
        raise ValueError("sweep_predictions: give models (patterns) and/or zoos, got neither")
    specs = expand_models(patterns) if patterns else []
    zoo_specs, unknown = _zoo_specs(zoos, {s.row for s in specs} | {s.name for s in specs})
    specs += zoo_specs
    failures_path = Path(failures_file) if failures_file is not None else \
        Path(out_dir) / FAILURES_FILE
    previous = read_failures(failures_path)  # a damaged file stops the sweep before any work
    # scanned once for the plan and the cache checks (or given scanned: a label file, uqvision.
    # layouts)
    folder = data if isinstance(data, ImageFolderDataset) else ImageFolderDataset(data)
    plan = plan_sweep(specs, folder, config, weights_dir=weights_dir, dataset_name=dataset_name,
                      threads=threads, sets=sets)
    _id_classes(plan.cells, folder, plan.targets[0].dataset_name)
    models = _models_of(plan.cells)
    weights = check_weights([spec for spec, _ in models.values()], config, probe=probe)
    gone = {row for row, w in weights.items() if w.kind == "unavailable"}
    plan.cells = [c for c in plan.cells if ModelSpec(c.params["name"], c.params["checkpoint"],
                                                     c.params["label"]).row not in gone]
    refused = {} if overwrite else _refuse_other_caches(
        plan, out_dir,
        skip=[r for r, w in weights.items() if w.kind == "download"] if dry_run else ())
    return _Prepared(specs, unknown, plan, {row: spec for row, (spec, _) in models.items()},
                     weights, refused, previous, failures_path, folder,
                     plan.targets[0].dataset_name, plan.targets)
