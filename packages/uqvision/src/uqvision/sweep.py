"""Zoo sweeps: many models × one image folder, one cache file per cell, on Dask.

Cells are (model × dataset × mode × pass), and for a checkpoint of a training method with
several prediction samples (snapshots, posterior draws) also × sample — an MC-dropout cell
holds all its passes, which share one data loading — run by ``uqmetrics.sweep.run_sweep``: a ``LocalCluster`` by default or
any scheduler by address; each cell writes its cache atomically, a rerun skips complete files
of the same identity (a model whose caches there were computed from other inputs is refused and
its files kept, unless ``overwrite``), and a model that raises is reported while the others go
on. Model names are checked against
the registries (with suggestions) and local weights are looked up before anything runs.

Models come from patterns and from named zoos (:data:`uqvision.zoo.ZOOS`, e.g.
``selective-paper``, ``timm-in1k``); a zoo member the installed timm does not know is a failed
model, not an error. Failed models are recorded in a failures file (``sweep_failures.json``,
written atomically as they fail, read by the next run, which retries them by default); progress
counts cells and models done and left, with an ETA.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import timm
import torch
import torchvision
import xarray as xr
from uqmetrics.sweep import (
    LOG_PROGRESS_INTERVAL,
    Cell,
    SweepReport,
    read_failures,
    run_sweep,
    write_failures,
)

from .data import ImageFolderDataset, readable_images
from .models import MODEL_SOURCES, ModelSpec, check_model_name
from .predict import PredictConfig, cache_plan, check_caches, predict
from .zoo import zoo_models

__all__ = [
    "FAILURES_FILE",
    "WEIGHT_SUFFIXES",
    "ModelSweepReport",
    "SweepPlan",
    "expand_models",
    "find_weights",
    "plan_sweep",
    "predict_cell",
    "sweep_predictions",
]

#: Name of the failures file (:func:`sweep_predictions`; ``uqvision sweep`` writes it beside
#: ``caches/``).
FAILURES_FILE = "sweep_failures.json"

#: Weight-file suffixes looked up in a weights folder, in order.
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pth.tar", ".bin")


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
    rows = [s.row for s in out]
    dup = sorted({r for r in rows if rows.count(r) > 1})
    if dup:
        raise ValueError(f"models listed twice: {dup}")
    return out


def find_weights(spec: ModelSpec, weights_dir: str | os.PathLike | None) -> ModelSpec:
    """Attach ``<weights_dir>/<name><suffix>`` (``/`` in the name -> ``+``) if present.

    The row keeps the bare model name: the file is that model's weights. A local file (this
    one, or ``NAME=FILE``) takes precedence over the name's pretrained weights in the hub
    caches (offline clusters: docs/conventions.md#v-1b).
    """
    if spec.checkpoint is not None or weights_dir is None:
        return spec
    stem = spec.name.replace("/", "+")
    for suffix in WEIGHT_SUFFIXES:
        p = Path(weights_dir) / f"{stem}{suffix}"
        if p.is_file():
            return ModelSpec(spec.name, str(p), spec.label or spec.name)
    return spec


def predict_cell(name: str, checkpoint: str | None, label: str | None, data: str,
                 dataset_name: str, config: dict, threads: int | None = None,
                 labels: str | None = None) -> xr.Dataset:
    """One sweep cell (runs on a Dask worker): :func:`uqvision.predict.predict` of one pass;
    ``labels``: the label file of a flat ``data`` (:mod:`uqvision.layouts`)."""
    if threads:
        torch.set_num_threads(threads)
    folder = ImageFolderDataset(data, labels=labels) if labels else data
    (ds,) = predict(ModelSpec(name, checkpoint, label), folder, PredictConfig(**config),
                    dataset_name=dataset_name)
    return ds


@dataclass
class SweepPlan:
    """Cells to run, and models refused before running (name -> reason)."""

    cells: list[Cell] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


def plan_sweep(specs: Sequence[ModelSpec], data: str | os.PathLike | ImageFolderDataset,
               config: PredictConfig, *, weights_dir: str | os.PathLike | None = None,
               dataset_name: str | None = None, threads: int | None = None) -> SweepPlan:
    """The cells of a sweep; unreadable images are refused up front unless
    ``config.skip_bad_images`` (:func:`uqvision.data.readable_images`). ``data``: the folder,
    or its scan.

    Each model's weights are, first that applies, its ``NAME=FILE``, the file
    ``weights_dir`` holds for it (:func:`find_weights`), random ones with
    ``config.allow_random_init``, else its pretrained weights from the Hugging Face hub /
    torch.hub caches, loaded (and downloaded when allowed) by its cells
    (:func:`uqvision.models.load_model`): a model whose weights can be had neither way is
    planned like any other, and its cells fail with the reason
    (:class:`uqvision.exceptions.WeightsUnavailableError`) while the sweep goes on."""
    folder = data if isinstance(data, ImageFolderDataset) else ImageFolderDataset(data)
    data = folder.root
    # folder and image errors before anything is submitted
    readable_images(folder, skip_bad=config.skip_bad_images)
    name = dataset_name or Path(data).resolve().name
    plan = SweepPlan()
    for spec in specs:
        spec = find_weights(spec, weights_dir)  # a local file first; else the hub cache
        if spec.source not in MODEL_SOURCES:
            plan.refused[spec.row] = f"unknown model source {spec.source!r}"
            continue
        for k, p, key in cache_plan(spec, config, name):  # a run of a training method:
            cfg = asdict(config)                           # one cell per sample and pass
            cfg.update(first_sample=k, samples=1)
            if config.mode == "tta":
                cfg.update(first_pass=p, passes=1)
            plan.cells.append(Cell(key, {
                "name": spec.name, "checkpoint": spec.checkpoint, "label": spec.label,
                "data": str(Path(data).resolve()), "dataset_name": name, "config": cfg,
                "threads": threads, "labels": None if folder.label_file is None
                else str(Path(folder.label_file.path).resolve())}))
    return plan


def _refuse_other_caches(plan: SweepPlan, folder: ImageFolderDataset, out_dir: str | os.PathLike,
                         config: PredictConfig) -> None:
    """Resume only what matches: a model with caches already in ``out_dir`` has them checked
    as ``predict`` checks them (:func:`uqvision.predict.check_caches`: full identity, not a
    cache, corrupt); a model whose caches differ is refused (its cells leave the plan, its files
    are kept, the report says why), before any cell runs. Models with no cache there are left
    to their cells."""
    models: dict[tuple, list[Cell]] = {}
    for cell in plan.cells:
        models.setdefault((cell.params["name"], cell.params["checkpoint"], cell.params["label"]),
                          []).append(cell)
    for (name, checkpoint, label), cells in models.items():
        if not any((Path(out_dir) / f"{c.key}.nc").exists() for c in cells):
            continue
        spec = ModelSpec(name, checkpoint, label)
        try:
            check_caches(spec, folder, out_dir, config, dataset_name=cells[0].params["dataset_name"])
        except (ValueError, OSError) as exc:
            plan.refused[spec.row] = " ".join(str(exc).split())
            plan.cells = [c for c in plan.cells if c not in cells]


@dataclass
class ModelSweepReport(SweepReport):
    """:class:`uqmetrics.sweep.SweepReport` with the failures by model.

    Attributes
    ----------
    failed_models : dict
        Model row -> record, as in the failures file: ``model``, ``name``, ``checkpoint``,
        ``error`` (one line), ``cells`` (the failed cell keys; empty for a model refused before
        any cell ran), ``time`` (UTC, ISO 8601), ``attempts`` (consecutive sweeps it failed in)
        and ``retried`` (False for a model ``retry_failed=False`` left out).
    failures_file : pathlib.Path or None
        Where they were written.
    """

    failed_models: dict[str, dict] = field(default_factory=dict)
    failures_file: Path | None = None


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class _FailureLog:
    """The failures file kept current while a sweep runs (written atomically on every change).

    It lists the models that failed in this sweep, and, until their cells finish in this run,
    the models a previous run recorded as failed (an interrupted rerun keeps their record);
    a model whose cells all succeed leaves it. Models no longer in the sweep are dropped.
    """

    def __init__(self, path: Path, previous: list[dict], models: Iterable[str]):
        self.path = path
        self.previous = {r["model"]: r for r in previous if isinstance(r.get("model"), str)}
        self.pending = {m: self.previous[m] for m in models if m in self.previous}
        self.current: dict[str, dict] = {}

    def fail(self, spec: ModelSpec, error: str, cell: str | None = None, *,
             retried: bool = True) -> None:
        rec = self.current.get(spec.row)
        if rec is None:
            before = self.previous.get(spec.row, {})
            rec = self.current[spec.row] = {
                "model": spec.row, "name": spec.name, "checkpoint": spec.checkpoint,
                "error": " ".join(error.split()), "cells": [], "time": _now(),
                "attempts": int(before.get("attempts", 0)) + 1, "retried": retried}
        if cell is not None:
            rec["cells"].append(cell)
        self.pending.pop(spec.row, None)
        self.write()

    def keep(self, record: dict) -> None:
        """A previous failure carried over without a retry."""
        self.current[record["model"]] = {**record, "retried": False}
        self.pending.pop(record["model"], None)

    def finished(self, row: str) -> None:
        if self.pending.pop(row, None) is not None:
            self.write()

    def write(self) -> None:
        write_failures(self.path, [*self.current.values(), *self.pending.values()])


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


def sweep_predictions(patterns: Iterable[str], data: str | os.PathLike | ImageFolderDataset,
                      out_dir: str | os.PathLike, config: PredictConfig | None = None, *,
                      zoos: Iterable[str] = (),
                      weights_dir: str | os.PathLike | None = None,
                      dataset_name: str | None = None, scheduler: str | None = None,
                      n_workers: int = 2, threads: int | None = None, overwrite: bool = False,
                      client=None, progress: bool = False,
                      failures_file: str | os.PathLike | None = None,
                      retry_failed: bool = True,
                      progress_interval: float = LOG_PROGRESS_INTERVAL) -> ModelSweepReport:
    """Cache predictions of every model in ``patterns`` and ``zoos`` on ``data`` into ``out_dir``,
    on Dask.

    Parameters
    ----------
    patterns : iterable of str
        Names, ``NAME=CHECKPOINT`` and wildcards (:func:`expand_models`; checked up front: a
        name no registry knows raises ``ValueError``).
    data : path or ImageFolderDataset
        The evaluation folder or archive, or its scan (a flat layout scanned with its label
        file, :mod:`uqvision.layouts`: the cells read the same label file).
    zoos : iterable of str
        Names of :data:`uqvision.zoo.ZOOS` (an unknown zoo raises ``ValueError`` naming the
        known ones). Their models join ``patterns``' (union, each model once); a zoo member
        the installed timm/torchvision does not know is a failed model, not an error.
    failures_file : path, optional
        Default ``<out_dir>/sweep_failures.json``. The models that failed, one record each
        (:class:`ModelSweepReport`), written atomically (:func:`uqmetrics.sweep.write_failures`)
        as failures happen; read back by the next run.
    retry_failed : bool, default True
        Recompute the models the failures file lists (OOM, a missing file, the network: most
        causes are transient or fixed between runs). False: leave them out and report them
        again with their recorded error.
    progress : bool
        Cells and models done and left, and an ETA (:func:`uqmetrics.sweep.run_sweep`): a bar
        on a terminal, else a line every ``progress_interval`` seconds and one at the end.

    Returns
    -------
    ModelSweepReport
        ``computed``/``skipped`` cache paths and ``failed`` (cell key or model -> error):
        refused models (no weights, unknown to the installed timm, caches of other inputs) and
        cells that raised; ``failed_models`` the same by model. The sweep itself never raises
        for them.
    """
    config = config or PredictConfig()
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
                      threads=threads)
    if not overwrite:
        _refuse_other_caches(plan, folder, out_dir, config)
    row_of = {c.key: ModelSpec(c.params["name"], c.params["checkpoint"], c.params["label"])
              for c in plan.cells}
    log = _FailureLog(failures_path, previous,
                      [s.row for s in specs] + list(unknown))
    if not retry_failed:
        for rec in previous:
            if rec.get("model") in {s.row for s in row_of.values()}:
                log.keep(rec)
        plan.cells = [c for c in plan.cells if row_of[c.key].row not in log.current]
    for spec, why in unknown.values():
        log.fail(spec, why)
    by_row = {s.row: s for s in specs}
    for row, why in plan.refused.items():
        log.fail(by_row.get(row, ModelSpec(row)), why)
    log.write()
    open_cells: dict[str, int] = {}
    for c in plan.cells:
        open_cells[row_of[c.key].row] = open_cells.get(row_of[c.key].row, 0) + 1

    def on_result(cell: Cell, error: str | None) -> None:
        spec = row_of[cell.key]
        if error is not None:
            log.fail(spec, error, cell.key)
        open_cells[spec.row] -= 1
        if not open_cells[spec.row] and spec.row not in log.current:
            log.finished(spec.row)

    out = ModelSweepReport(failures_file=failures_path)
    if plan.cells:
        report = run_sweep(plan.cells, predict_cell, out_dir, scheduler=scheduler,
                           n_workers=n_workers, overwrite=overwrite, progress=progress,
                           client=client, group=lambda c: row_of[c.key].row, group_unit="model",
                           on_result=on_result, progress_interval=progress_interval)
        out.computed, out.skipped, out.failed = report.computed, report.skipped, report.failed
    for row in list(log.pending):  # complete on disk from an earlier run: not failed any more
        log.finished(row)
    log.write()
    out.failed.update({row: why for row, (_, why) in unknown.items()})
    out.failed.update(plan.refused)
    out.failed.update({r: f"{rec['error']} (not retried: failed at {rec['time']})"
                       for r, rec in log.current.items() if not rec["retried"]})
    out.failed_models = dict(log.current)
    return out
