"""Zoo sweeps: many models × one image folder, one cache file per cell, on Dask.

Cells are (model × dataset × mode × pass), and for a checkpoint of a training method with
several prediction samples (snapshots, posterior draws) also × sample — an MC-dropout cell
holds all its passes, which share one data loading — run by ``uqmetrics.sweep.run_sweep``: a ``LocalCluster`` by default or
any scheduler by address; each cell writes its cache atomically, a rerun skips complete files
of the same identity (a model whose caches there were computed from other inputs is refused and
its files kept, unless ``overwrite``), and a model that raises is reported while the others go
on. Model names are checked against
the registries (with suggestions) and local weights are looked up before anything runs.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import timm
import torch
import torchvision
import xarray as xr
from uqmetrics.sweep import Cell, SweepReport, run_sweep

from .data import ImageFolderDataset, readable_images
from .models import MODEL_SOURCES, ModelSpec, check_model_name
from .predict import PredictConfig, cache_plan, check_caches, predict

__all__ = [
    "WEIGHT_SUFFIXES",
    "SweepPlan",
    "expand_models",
    "find_weights",
    "plan_sweep",
    "predict_cell",
    "sweep_predictions",
]

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
                 dataset_name: str, config: dict, threads: int | None = None) -> xr.Dataset:
    """One sweep cell (runs on a Dask worker): :func:`uqvision.predict.predict` of one pass."""
    if threads:
        torch.set_num_threads(threads)
    (ds,) = predict(ModelSpec(name, checkpoint, label), data, PredictConfig(**config),
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
                "threads": threads}))
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


def sweep_predictions(patterns: Iterable[str], data: str | os.PathLike,
                      out_dir: str | os.PathLike, config: PredictConfig | None = None, *,
                      weights_dir: str | os.PathLike | None = None,
                      dataset_name: str | None = None, scheduler: str | None = None,
                      n_workers: int = 2, threads: int | None = None, overwrite: bool = False,
                      client=None, progress: bool = False) -> SweepReport:
    """Cache predictions of every model in ``patterns`` on ``data`` into ``out_dir``, on Dask.

    Returns
    -------
    uqmetrics.sweep.SweepReport
        ``computed``/``skipped`` cache paths and ``failed`` (cell key or model -> error):
        refused models (no weights) and cells that raised; the sweep itself never raises for
        them.
    """
    config = config or PredictConfig()
    specs = expand_models(patterns)
    folder = ImageFolderDataset(data)  # scanned once for the plan and the cache checks
    plan = plan_sweep(specs, folder, config, weights_dir=weights_dir, dataset_name=dataset_name,
                      threads=threads)
    if not overwrite:
        _refuse_other_caches(plan, folder, out_dir, config)
    report = (run_sweep(plan.cells, predict_cell, out_dir, scheduler=scheduler,
                        n_workers=n_workers, overwrite=overwrite, progress=progress, client=client)
              if plan.cells else SweepReport())
    report.failed.update(plan.refused)
    return report
