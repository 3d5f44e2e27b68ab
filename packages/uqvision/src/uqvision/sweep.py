"""Zoo sweeps: many models × one image folder, one cache file per cell, on Dask.

Cells are (model × dataset × mode × pass), and for a checkpoint of a training method with
several prediction samples (snapshots, posterior draws) also × sample — an MC-dropout cell
holds all its passes, which share one data loading — run by ``uqmetrics.sweep.run_sweep``: a
``LocalCluster`` by default or any scheduler by address; each cell writes its cache atomically,
a rerun skips complete files of the same identity (a model whose caches there were computed from
other inputs is refused and its files kept, unless ``overwrite``), and a model that raises is
reported while the others go on. Model names are checked against the registries (with
suggestions) before anything runs.

Before the first cell is submitted, every model's weights are looked up in one pass, with no
network (:func:`check_weights`): a local file, random weights, or the hub / torch.hub caches
(:func:`uqvision.models.locate_pretrained`). Offline, a model whose weights are not cached
fails there, one record and no cell; online, one short request (:func:`probe_hub`) decides
whether the missing ones can be downloaded, and when the hub cannot be reached they all fail
at once, instead of each cell spending huggingface_hub's retries (docs/conventions.md#v-1-zoos).

Models come from patterns and from named zoos (:data:`uqvision.zoo.ZOOS`, e.g.
``selective-paper``, ``timm-in1k``); a zoo member the installed timm does not know is a failed
model, not an error. Failed models are recorded in a failures file (``sweep_failures.json``,
written atomically as they fail, read by the next run, which retries them by default; a file
that cannot be written is reported in one line and the sweep goes on), each with its kind
(:data:`FAILURE_KINDS`): what to do about it differs. Full tracebacks go to a log file
(``log_file``; ``uqvision sweep`` writes ``sweep.log``), never to the console. Progress counts
cells and models done and left, with an ETA. :func:`dry_run_sweep` says what a sweep would do
without doing it.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import os
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import timm
import torch
import torchvision
import xarray as xr
from huggingface_hub import constants as hf_constants
from uqmetrics.io import exclusive_lock, remove_stale_temporaries
from uqmetrics.sweep import (
    LOG_PROGRESS_INTERVAL,
    Cell,
    SweepReport,
    format_duration,
    is_complete,
    read_failures,
    run_sweep,
    write_failures,
)

from .data import ImageFolderDataset, readable_images
from .models import (
    MODEL_SOURCES,
    ModelSpec,
    check_model_name,
    hub_cache_dir,
    locate_pretrained,
    pretrained_weights,
    torch_hub_checkpoints,
    weights_offline,
)
from .predict import PredictConfig, cache_plan, check_caches, predict
from .zoo import zoo_models

__all__ = [
    "FAILURES_FILE",
    "FAILURE_KINDS",
    "LOG_FILE",
    "PROBE_TIMEOUT",
    "RISK_COVERAGE_MAX_MODELS",
    "WEIGHT_SUFFIXES",
    "ModelSweepReport",
    "SweepDryRun",
    "SweepPlan",
    "WeightsStatus",
    "check_weights",
    "dry_run_sweep",
    "expand_models",
    "find_weights",
    "plan_sweep",
    "predict_cell",
    "probe_hub",
    "sweep_figures",
    "sweep_predictions",
    "weights_status",
]

#: Name of the failures file (:func:`sweep_predictions`; ``uqvision sweep`` writes it beside
#: ``caches/``).
FAILURES_FILE = "sweep_failures.json"

#: Name of the log file ``uqvision sweep`` writes beside ``caches/``: the full traceback of
#: every failed cell, and distributed's log records (``uqmetrics.sweep.run_sweep``'s
#: ``log_file``).
LOG_FILE = "sweep.log"

#: Seconds the one network probe of a sweep waits for the hub (:func:`probe_hub`).
PROBE_TIMEOUT = 5.0

#: Kinds of failure records (``kind`` in the failures file), each with what to do about it.
FAILURE_KINDS = {
    "failed": "a cell raised (out of memory, a corrupt file, a download): rerun the same "
              "command to retry (finished caches are kept)",
    "weights": "no weights to load (not cached and offline or the hub unreachable, or no "
               "pretrained weights): fetch them where the network is allowed, or give local "
               "files (NAME=FILE, --weights-dir)",
    "refused": "its caches in the output folder were computed from other inputs (kept): pass "
               "--overwrite to recompute them, or sweep into another --out",
    "unknown": "a name the installed timm / torchvision does not know: upgrade them, or leave "
               "the model out",
}

#: The risk-coverage figure of a sweep draws one curve per model up to this many models
#: (:func:`sweep_figures`; more would be unreadable, and each curve reads a whole cache).
RISK_COVERAGE_MAX_MODELS = 30

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


def _line(text: object) -> str:
    return " ".join(str(text).split())


@dataclass(frozen=True)
class WeightsStatus:
    """Where a model's weights come from, as seen before a sweep runs (:func:`weights_status`).

    Attributes
    ----------
    kind : str
        ``"file"`` (a local checkpoint: ``NAME=FILE`` or ``--weights-dir``), ``"random-init"``,
        ``"cached"`` (the pretrained file is in the hub cache or torch.hub's), ``"download"``
        (not cached: its cell downloads it, the network being allowed) or ``"unavailable"``
        (the model fails before any cell runs).
    where : str
        The file (local or cached); empty otherwise.
    error : str
        Why ``"unavailable"``, one line naming the model.
    cause : str
        A cause several models share (offline, the hub unreachable), for one line about
        them all; empty for a model's own reason.
    """

    kind: str
    where: str = ""
    error: str = ""
    cause: str = ""

    def describe(self) -> str:
        """A few words for a listing (``uqvision sweep --dry-run``)."""
        return {"file": f"local file {self.where}" if self.where else "given by its source",
                "random-init": "random init",
                "cached": f"cached {self.where}",
                "download": "not cached: downloaded by its cell",
                }.get(self.kind, f"MISSING: {self.cause or self.error}")


def _caches_text() -> str:
    return f"hub cache {hub_cache_dir()!r}, torch.hub cache {str(torch_hub_checkpoints())!r}"


def weights_status(spec: ModelSpec, config: PredictConfig) -> WeightsStatus:
    """Where the weights of ``spec`` would come from, from the caches alone (no network).

    A checkpoint (checked when its cell loads it), random weights with
    ``config.allow_random_init``, else the name's pretrained file
    (:func:`uqvision.models.locate_pretrained`): cached, or not cached — to be downloaded
    when the network is allowed, unavailable when ``HF_HUB_OFFLINE`` is set (with the error
    loading it would raise). A name without pretrained weights is unavailable."""
    if spec.checkpoint is not None:
        return WeightsStatus("file", spec.checkpoint)
    if config.allow_random_init:
        return WeightsStatus("random-init")
    if spec.source not in MODEL_SOURCES:
        return WeightsStatus("unavailable", error=f"unknown model source {spec.source!r}")
    if not hasattr(MODEL_SOURCES[spec.source], "pretrained"):
        return WeightsStatus("file")  # its source says what it needs when it loads
    try:
        found = locate_pretrained(spec)
    except ValueError as exc:  # WeightsUnavailableError (an InputError): no pretrained weights
        return WeightsStatus("unavailable", error=_line(exc))
    if found is not None:
        return WeightsStatus("cached", found.path)
    if not weights_offline():
        return WeightsStatus("download")
    try:  # offline and not cached: the error loading the model would raise
        pretrained_weights(spec, download=False)
        error = f"model {spec.name!r}: its pretrained weights are not cached"
    except ValueError as exc:
        error = _line(exc)
    return WeightsStatus("unavailable", error=error,
                         cause=f"pretrained weights not cached ({_caches_text()}) and "
                               "HF_HUB_OFFLINE is set")


def probe_hub(timeout: float = PROBE_TIMEOUT) -> tuple[bool, str]:
    """One ``HEAD`` request to the Hugging Face hub (``huggingface_hub``'s endpoint,
    ``HF_ENDPOINT``): can weights be downloaded at all?

    Parameters
    ----------
    timeout : float, default :data:`PROBE_TIMEOUT`
        Seconds to wait for an answer.

    Returns
    -------
    reachable : bool
        Any HTTP answer below 500 (a redirect or a 4xx still means the hub answers).
    why : str
        What went wrong, one line; empty when reachable.
    """
    url = hf_constants.ENDPOINT
    answer: list[tuple[bool, str]] = []

    def head() -> None:
        request = urllib.request.Request(url, method="HEAD")
        try:
            with urllib.request.urlopen(request, timeout=timeout):
                answer.append((True, ""))
        except urllib.error.HTTPError as err:
            answer.append((err.code < 500, f"HEAD {url}: HTTP {err.code}"))
        except (OSError, ValueError) as err:  # URLError, a timeout, a refused connection
            why = getattr(err, "reason", None) or err
            answer.append((False, f"HEAD {url}: {_line(why) or type(err).__name__}"))

    # in a thread: the name lookup before the connection has no timeout of its own
    thread = threading.Thread(target=head, name="uqvision-probe-hub", daemon=True)
    thread.start()
    thread.join(timeout)
    return answer[0] if answer else (False, f"HEAD {url}: no answer in {timeout:g} s")


def check_weights(specs: Iterable[ModelSpec], config: PredictConfig, *,
                  probe: bool = True) -> dict[str, WeightsStatus]:
    """The weights of every model, looked up before anything runs (:func:`weights_status`).

    When some are not cached and the network is allowed, one request (:func:`probe_hub`)
    decides whether they can be downloaded: when the hub cannot be reached, they are all
    ``"unavailable"`` with that reason, instead of each cell spending huggingface_hub's
    retries and timeouts (about 50 s a model) to find out.

    Parameters
    ----------
    specs : iterable of ModelSpec
        With their local files already attached (:func:`find_weights`).
    config : PredictConfig
    probe : bool, default True
        False: no network at all; the missing weights stay ``"download"``.

    Returns
    -------
    dict
        Model row -> :class:`WeightsStatus`, in the order given.
    """
    status = {spec.row: weights_status(spec, config) for spec in specs}
    missing = [row for row, w in status.items() if w.kind == "download"]
    if missing and probe:
        reachable, why = probe_hub()
        if not reachable:
            cause = (f"pretrained weights not cached ({_caches_text()}) and the hub is "
                     f"unreachable ({why})")
            for row in missing:
                status[row] = WeightsStatus(
                    "unavailable", cause=cause,
                    error=f"model {row!r}: its {cause}; fetch them where the network is "
                          "allowed (or point HF_HUB_CACHE / TORCH_HOME at a cache that holds "
                          "them), or give a local file as NAME=FILE or with --weights-dir")
    return status


def predict_cell(name: str, checkpoint: str | None, label: str | None, data: str,
                 dataset_name: str, config: dict, threads: int | None = None,
                 labels: str | None = None, subset: bool = False) -> xr.Dataset:
    """One sweep cell (runs on a Dask worker): :func:`uqvision.predict.predict` of one pass;
    ``labels``: the label file of a flat ``data``, ``subset``: read as a subset of it
    (:mod:`uqvision.layouts`)."""
    if threads:
        torch.set_num_threads(threads)
    folder = ImageFolderDataset(data, labels=labels, subset=subset) if labels or subset \
        else data
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
    (:func:`uqvision.models.load_model`). The plan does not look them up:
    :func:`sweep_predictions` does, for every model at once, before submitting a cell
    (:func:`check_weights`)."""
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
                else str(Path(folder.label_file.path).resolve()),
                "subset": folder.subset is not None}))
    return plan


def _models_of(cells: Iterable[Cell]) -> dict[str, tuple[ModelSpec, list[Cell]]]:
    """Model row -> (its spec, its cells), in plan order."""
    models: dict[str, tuple[ModelSpec, list[Cell]]] = {}
    for cell in cells:
        spec = ModelSpec(cell.params["name"], cell.params["checkpoint"], cell.params["label"])
        models.setdefault(spec.row, (spec, []))[1].append(cell)
    return models


def _refuse_other_caches(plan: SweepPlan, folder: ImageFolderDataset, out_dir: str | os.PathLike,
                         config: PredictConfig, *, skip: Iterable[str] = ()) -> dict[str, str]:
    """Resume only what matches: a model with caches already in ``out_dir`` has them checked
    as ``predict`` checks them (:func:`uqvision.predict.check_caches`: full identity, not a
    cache, corrupt); a model whose caches differ is refused (its cells leave the plan, its files
    are kept, the report says why), before any cell runs. Models with no cache there, and the
    rows in ``skip``, are left to their cells. Returns the refused rows -> why."""
    refused, skip = {}, set(skip)
    for row, (spec, cells) in _models_of(plan.cells).items():
        if row in skip or not any((Path(out_dir) / f"{c.key}.nc").exists() for c in cells):
            continue
        try:
            check_caches(spec, folder, out_dir, config, dataset_name=cells[0].params["dataset_name"])
        except (ValueError, OSError) as exc:
            refused[row] = _line(exc)
            plan.cells = [c for c in plan.cells if c not in cells]
    return refused


@dataclass
class ModelSweepReport(SweepReport):
    """:class:`uqmetrics.sweep.SweepReport` with the failures by model.

    Attributes
    ----------
    failed_models : dict
        Model row -> record, as in the failures file: ``model``, ``name``, ``checkpoint``,
        ``kind`` (:data:`FAILURE_KINDS`: ``failed`` in a cell, ``weights``, ``refused``,
        ``unknown``), ``error`` (one line, complete), ``cause`` (a cause shared with other
        models, e.g. offline, or empty), ``cells`` (the failed cell keys; empty for a model that
        failed before any cell ran), ``time`` (UTC, ISO 8601), ``attempts`` (consecutive sweeps
        it failed in), ``retried`` (True when an earlier sweep had recorded it as failed and
        this one tried it again) and ``left_out`` (True for a recorded model
        ``retry_failed=False`` left out: the record is the earlier sweep's).
    failures_file : pathlib.Path or None
        Where they were written.
    failures_error : str or None
        Why the failures file could not be written (a full disk: the records are here only),
        else None.
    weights : dict
        Model row -> :class:`WeightsStatus`, as looked up before the cells ran.
    log_file : pathlib.Path or None
        Where the full tracebacks went (``log_file`` of :func:`sweep_predictions`).
    """

    failed_models: dict[str, dict] = field(default_factory=dict)
    failures_file: Path | None = None
    failures_error: str | None = None
    weights: dict[str, WeightsStatus] = field(default_factory=dict)
    log_file: Path | None = None


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class _FailureLog:
    """The failures file kept current while a sweep runs (written atomically on every change).

    It lists the models that failed in this sweep, and, until their cells finish in this run,
    the models a previous run recorded as failed (an interrupted rerun keeps their record);
    a model whose cells all succeed leaves it. Models no longer in the sweep are dropped. A
    file that cannot be written (a full disk) is reported once, in one line on stderr; the
    sweep goes on, and the next change tries again.
    """

    def __init__(self, path: Path, previous: list[dict], models: Iterable[str]):
        self.path = path
        self.previous = {r["model"]: r for r in previous if isinstance(r.get("model"), str)}
        self.pending = {m: self.previous[m] for m in models if m in self.previous}
        self.current: dict[str, dict] = {}
        self.error: str | None = None  # why the last write failed
        self.reported = False

    def fail(self, spec: ModelSpec, error: str, cell: str | None = None, *,
             kind: str = "failed", cause: str = "") -> None:
        rec = self.current.get(spec.row)
        if rec is None:
            before = self.previous.get(spec.row)
            rec = self.current[spec.row] = {
                "model": spec.row, "name": spec.name, "checkpoint": spec.checkpoint,
                "kind": kind, "error": _line(error), "cause": cause, "cells": [],
                "time": _now(), "attempts": int((before or {}).get("attempts", 0)) + 1,
                "retried": before is not None, "left_out": False}
        if cell is not None:
            rec["cells"].append(cell)
        self.pending.pop(spec.row, None)
        self.write()

    def keep(self, record: dict) -> None:
        """A previous failure carried over without a retry."""
        self.current[record["model"]] = {"kind": "failed", "cause": "", **record,
                                         "retried": False, "left_out": True}
        self.pending.pop(record["model"], None)

    def finished(self, row: str) -> None:
        if self.pending.pop(row, None) is not None:
            self.write()

    def write(self) -> None:
        try:
            write_failures(self.path, [*self.current.values(), *self.pending.values()])
        except OSError as err:
            self.error = _line(err.strerror or err)
            if not self.reported:
                self.reported = True
                print(f"uqvision sweep: cannot write the failures file {str(self.path)!r} "
                      f"({self.error}); the sweep goes on, the caches written are kept, and "
                      "the failures are listed at the end", file=sys.stderr, flush=True)
        else:
            self.error = None


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


def _prepare(patterns: Iterable[str], data: str | os.PathLike | ImageFolderDataset,
             out_dir: str | os.PathLike, config: PredictConfig, *, zoos: Iterable[str],
             weights_dir: str | os.PathLike | None, dataset_name: str | None,
             threads: int | None, overwrite: bool, failures_file: str | os.PathLike | None,
             probe: bool, dry_run: bool = False) -> _Prepared:
    """Everything before the first cell: models expanded (unknown zoo members set aside),
    the failures file read, images checked, the cells planned, every model's weights looked up
    (:func:`check_weights`: the unavailable ones leave the plan) and, unless ``overwrite``, the
    caches already there checked (other inputs: the model leaves the plan). Writes nothing;
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
                      threads=threads)
    models = _models_of(plan.cells)
    weights = check_weights([spec for spec, _ in models.values()], config, probe=probe)
    gone = {row for row, w in weights.items() if w.kind == "unavailable"}
    plan.cells = [c for c in plan.cells if ModelSpec(c.params["name"], c.params["checkpoint"],
                                                     c.params["label"]).row not in gone]
    refused = {} if overwrite else _refuse_other_caches(
        plan, folder, out_dir, config,
        skip=[r for r, w in weights.items() if w.kind == "download"] if dry_run else ())
    name = dataset_name or Path(folder.root).resolve().name
    return _Prepared(specs, unknown, plan, {row: spec for row, (spec, _) in models.items()},
                     weights, refused, previous, failures_path, folder, name)


def sweep_predictions(patterns: Iterable[str], data: str | os.PathLike | ImageFolderDataset,
                      out_dir: str | os.PathLike, config: PredictConfig | None = None, *,
                      zoos: Iterable[str] = (),
                      weights_dir: str | os.PathLike | None = None,
                      dataset_name: str | None = None, scheduler: str | None = None,
                      n_workers: int = 2, threads: int | None = None, overwrite: bool = False,
                      client=None, progress: bool = False,
                      failures_file: str | os.PathLike | None = None,
                      retry_failed: bool = True,
                      progress_interval: float = LOG_PROGRESS_INTERVAL,
                      log_file: str | os.PathLike | None = None,
                      probe: bool = True) -> ModelSweepReport:
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
        as failures happen; read back by the next run. A file that cannot be written is
        reported in one line on stderr and the sweep goes on
        (:attr:`ModelSweepReport.failures_error`).
    retry_failed : bool, default True
        Recompute the models the failures file lists (OOM, a missing file, the network: most
        causes are transient or fixed between runs). False: leave them out and report them
        again with their recorded error.
    progress : bool
        Cells and models done and left, and an ETA (:func:`uqmetrics.sweep.run_sweep`): a bar
        on a terminal, else a line every ``progress_interval`` seconds and one at the end.
    log_file : path, optional
        Where the full traceback of every failed cell goes, and distributed's log records
        while the cells run (appended, created on the first record); default: nowhere (the
        one-line errors are in the report).
    probe : bool, default True
        When some weights are not cached and the network is allowed, one request decides
        whether the hub can be reached (:func:`check_weights`); False: no request, the cells
        find out.

    Returns
    -------
    ModelSweepReport
        ``computed``/``skipped`` cache paths and ``failed`` (cell key or model -> error):
        models that failed before any cell ran (no weights, unknown to the installed timm,
        caches of other inputs) and cells that raised; ``failed_models`` the same by model.
        The sweep itself never raises for them.

    Raises
    ------
    uqmetrics.io.LockedError
        Another sweep runs into ``out_dir`` (it holds ``out_dir/.sweep.lock``,
        :func:`uqmetrics.io.exclusive_lock`, while it runs; a sweep holding it also removes
        the temporary files that failed or killed writes left in ``out_dir``).
    """
    config = config or PredictConfig()
    # one sweep at a time per caches folder; temporary files of writes that a killed or
    # failed sweep left there are its orphans (no other sweep writes here)
    with exclusive_lock(Path(out_dir) / ".sweep.lock",
                        advice="wait for that sweep to finish, or write to another --out"):
        remove_stale_temporaries(out_dir)
        prep = _prepare(patterns, data, out_dir, config, zoos=zoos, weights_dir=weights_dir,
                        dataset_name=dataset_name, threads=threads, overwrite=overwrite,
                        failures_file=failures_file, probe=probe)
        plan, unknown = prep.plan, prep.unknown
        row_of = {c.key: ModelSpec(c.params["name"], c.params["checkpoint"], c.params["label"])
                  for c in plan.cells}
        log = _FailureLog(prep.failures_path, prep.previous,
                          [s.row for s in prep.specs] + list(unknown))
        if not retry_failed:
            for rec in prep.previous:
                if rec.get("model") in {s.row for s in row_of.values()}:
                    log.keep(rec)
            plan.cells = [c for c in plan.cells if row_of[c.key].row not in log.current]
        for spec, why in unknown.values():
            log.fail(spec, why, kind="unknown")
        by_row = {**{s.row: s for s in prep.specs}, **prep.model_specs}
        for row, why in plan.refused.items():
            log.fail(by_row.get(row, ModelSpec(row)), why, kind="unknown")
        weights_failed = {}
        for row, w in prep.weights.items():
            if w.kind == "unavailable":
                weights_failed[row] = w.error
                log.fail(by_row.get(row, ModelSpec(row)), w.error, kind="weights", cause=w.cause)
        for row, why in prep.refused.items():
            log.fail(by_row.get(row, ModelSpec(row)), why, kind="refused")
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

        out = ModelSweepReport(failures_file=prep.failures_path, weights=dict(prep.weights),
                               log_file=None if log_file is None else Path(log_file))
        if plan.cells:
            report = run_sweep(plan.cells, predict_cell, out_dir, scheduler=scheduler,
                               n_workers=n_workers, overwrite=overwrite, progress=progress,
                               client=client, group=lambda c: row_of[c.key].row, group_unit="model",
                               on_result=on_result, progress_interval=progress_interval,
                               log_file=log_file)
            out.computed, out.skipped, out.failed = report.computed, report.skipped, report.failed
        for row in list(log.pending):  # complete on disk from an earlier run: not failed any more
            log.finished(row)
        log.write()
        out.failed.update({row: why for row, (_, why) in unknown.items()})
        out.failed.update(plan.refused)
        out.failed.update(weights_failed)
        out.failed.update(prep.refused)
        out.failed.update({r: f"{rec['error']} (not retried: failed at {rec['time']})"
                           for r, rec in log.current.items() if rec.get("left_out")})
        out.failed_models = dict(log.current)
        out.failures_error = log.error
        return out


# --------------------------------------------------------------------------------------------
# what a sweep would do (uqvision sweep --dry-run)


@dataclass
class SweepDryRun:
    """What a sweep would do (:func:`dry_run_sweep`): nothing computed, downloaded or written.

    Attributes
    ----------
    models : list of dict
        One per model, in sweep order: ``model`` (row), ``weights`` (:class:`WeightsStatus`,
        ``None`` for a model that fails before its weights are looked up), ``compute`` and
        ``complete`` (cell keys to compute, and found complete on disk: skipped), ``fails``
        (``(kind, error)`` for a model that would fail before any cell runs,
        :data:`FAILURE_KINDS`; ``None`` otherwise) and ``left_out`` (the recorded error of a
        model ``retry_failed=False`` leaves out, else ``None``).
    data : str
        The image folder.
    n_images : int
        Images a cell predicts (unreadable ones left out with ``skip_bad_images``).
    dataset_name, mode : str
    passes : int
        Passes of one MC-dropout cell (1 for the other modes: a TTA cell is one pass).
    n_workers : int
    seconds_per_image : float or None
        Mean wall time per image and cell of the caches of the same mode already in the
        output folder (their ``wall_time_s`` attr), None when none records one.
    timed_caches : int
        How many caches that mean comes from.
    out_dir : str
    """

    models: list[dict]
    data: str
    n_images: int
    dataset_name: str
    mode: str
    passes: int
    n_workers: int
    seconds_per_image: float | None
    timed_caches: int
    out_dir: str

    @property
    def cells_to_compute(self) -> int:
        return sum(len(m["compute"]) for m in self.models)

    @property
    def cells_complete(self) -> int:
        return sum(len(m["complete"]) for m in self.models)

    def estimate_s(self) -> float | None:
        """Seconds of cell time the cells to compute would take (None: unknown)."""
        if self.seconds_per_image is None:
            return None
        return self.seconds_per_image * self.n_images * self.cells_to_compute

    def lines(self) -> list[str]:
        """The listing ``uqvision sweep --dry-run`` prints."""
        out = [(f"sweep plan (dry run: nothing is computed, downloaded or written): "
                f"{len(self.models)} model(s) on {self.data!r} ({self.n_images} images), "
                f"dataset {self.dataset_name!r}, mode {self.mode}, caches in "
                f"{self.out_dir!r}")]
        for m in self.models:
            if m["fails"] is not None:
                kind, error = m["fails"]
                out.append(f"  {m['model']}: FAILS before any cell ({kind}): {error}")
                continue
            if m["left_out"] is not None:
                out.append(f"  {m['model']}: left out (--skip-failed), recorded error: "
                           f"{m['left_out']}")
                continue
            out.append(f"  {m['model']}: weights {m['weights'].describe()}; "
                       f"{len(m['compute'])} cell(s) to compute, {len(m['complete'])} "
                       "complete (skipped)")
        failing = sum(m["fails"] is not None for m in self.models)
        out.append(f"cells: {self.cells_to_compute} to compute, {self.cells_complete} complete "
                   f"on disk (skipped); {failing} model(s) would fail before any cell runs")
        per_cell = f" (each cell {self.passes} passes)" if self.passes > 1 else ""
        cost = (f"cost: {self.cells_to_compute} cell(s) × {self.n_images} images = "
                f"{self.cells_to_compute * self.n_images} image-cells{per_cell}; ")
        est = self.estimate_s()
        if est is None:
            cost += (f"time unknown: no cache of mode {self.mode} in {self.out_dir!r} records "
                     "a wall_time_s to estimate it from")
        else:
            cost += (f"time ≈ {format_duration(est)} of cell time, ≈ "
                     f"{format_duration(est / max(1, self.n_workers))} on {self.n_workers} "
                     f"worker(s) ({self.seconds_per_image:.3g} s per image and cell: the mean "
                     f"of {self.timed_caches} earlier cache(s); models of other sizes differ)")
        out.append(cost)
        return out


def _recorded_seconds_per_image(out_dir: str | os.PathLike, mode: str
                                ) -> tuple[float | None, int]:
    """Mean ``wall_time_s`` per image of the complete caches of ``mode`` in ``out_dir``
    (headers only), and how many there are."""
    rates = []
    for path in sorted(Path(out_dir).glob("*.nc")) if Path(out_dir).is_dir() else ():
        try:
            with xr.open_dataset(path, engine="netcdf4") as ds:
                attrs, n = dict(ds.attrs), int(ds.sizes.get("sample", 0))
        except (OSError, ValueError, KeyError, AttributeError):
            continue
        try:
            wall = float(attrs["wall_time_s"])
        except (KeyError, TypeError, ValueError):
            continue
        if attrs.get("mode") == mode and n > 0 and int(attrs.get("complete", 0)) == 1 \
                and np.isfinite(wall) and wall > 0:
            rates.append(wall / n)
    return (float(np.mean(rates)) if rates else None), len(rates)


def dry_run_sweep(patterns: Iterable[str], data: str | os.PathLike | ImageFolderDataset,
                  out_dir: str | os.PathLike, config: PredictConfig | None = None, *,
                  zoos: Iterable[str] = (), weights_dir: str | os.PathLike | None = None,
                  dataset_name: str | None = None, n_workers: int = 2,
                  threads: int | None = None, overwrite: bool = False,
                  failures_file: str | os.PathLike | None = None, retry_failed: bool = True,
                  probe: bool = True) -> SweepDryRun:
    """What :func:`sweep_predictions` with the same arguments would do, without doing it.

    The same checks run (models, images, failures file, weights, the identity of the caches
    already there, except for models whose weights are not cached: comparing needs their
    hash), and nothing is computed, downloaded or written; the one request of
    :func:`check_weights` is made when some weights are not cached (``probe=False``: none).

    Returns
    -------
    SweepDryRun
        The models with their weights and cells to compute or skip, and the cost: cells ×
        images, and a time when caches of earlier runs in ``out_dir`` record their wall time.
    """
    config = config or PredictConfig()
    prep = _prepare(patterns, data, out_dir, config, zoos=zoos, weights_dir=weights_dir,
                    dataset_name=dataset_name, threads=threads, overwrite=overwrite,
                    failures_file=failures_file, probe=probe, dry_run=True)
    models = _models_of(prep.plan.cells)
    recorded = {r["model"]: r for r in prep.previous if isinstance(r.get("model"), str)}
    rows = []
    for row, (spec, why) in prep.unknown.items():
        rows.append({"model": row, "weights": None, "compute": [], "complete": [],
                     "fails": ("unknown", why), "left_out": None})
    for row, why in prep.plan.refused.items():
        rows.append({"model": row, "weights": None, "compute": [], "complete": [],
                     "fails": ("unknown", why), "left_out": None})
    for row, weights in prep.weights.items():
        entry = {"model": row, "weights": weights, "compute": [], "complete": [],
                 "fails": None, "left_out": None}
        if weights.kind == "unavailable":
            entry["fails"] = ("weights", weights.error)
        elif row in prep.refused:
            entry["fails"] = ("refused", prep.refused[row])
        elif not retry_failed and row in recorded:
            entry["left_out"] = _line(recorded[row].get("error", ""))
        else:
            for cell in models[row][1]:
                done = not overwrite and is_complete(Path(out_dir) / f"{cell.key}.nc")
                entry["complete" if done else "compute"].append(cell.key)
        rows.append(entry)
    n_images = len(readable_images(prep.folder, skip_bad=config.skip_bad_images))
    rate, timed = _recorded_seconds_per_image(out_dir, config.mode)
    return SweepDryRun(rows, str(prep.folder.root), n_images, prep.dataset_name, config.mode,
                       int(config.passes) if config.mode == "mc_dropout" else 1, n_workers,
                       rate, timed, str(out_dir))


# --------------------------------------------------------------------------------------------
# figures


def sweep_figures(scores: xr.Dataset, caches: Iterable[str | os.PathLike],
                  out_dir: str | os.PathLike, *,
                  max_curves: int = RISK_COVERAGE_MAX_MODELS) -> list[Path]:
    """The figures of a sweep beside the Selective paper's (which ``uqvision sweep`` draws with
    :func:`uqvision.protocols.selective.plots.plot_selective`): AURC vs accuracy (one point per
    row of the score file, by row kind) and the risk–coverage curves of the plain caches among
    ``caches`` (softmax response), drawn when they are of at most ``max_curves`` models.

    Parameters
    ----------
    scores : xarray.Dataset
        A selective score file (:func:`~uqvision.protocols.selective.score.score_selective`).
    caches : iterable of path
        The sweep's caches (files or folders).
    out_dir : path
        Where the PNG files go (created).
    max_curves : int, default :data:`RISK_COVERAGE_MAX_MODELS`

    Returns
    -------
    list of pathlib.Path
    """
    import matplotlib.pyplot as plt  # figures: imported on use (start-up time)
    from uqmetrics import risk_coverage_curve, softmax, softmax_response
    from uqmetrics.plotting import plot_risk_coverage, save_figure

    from .cache import index_caches, read_cache

    out_dir = Path(out_dir)
    paths = []
    n = scores.sizes["model"]
    kinds = (scores["method"].values.astype(str) if "method" in scores.coords
             else np.full(n, "softmax"))
    accuracy = 100 * scores["accuracy"].sel(calibration="none").values
    aurc = scores["aurc"].sel(calibration="none").values
    fig, ax = plt.subplots(figsize=(6.5, 5))
    for kind in sorted(set(kinds)):
        sel = kinds == kind
        ax.scatter(accuracy[sel], aurc[sel], s=24, alpha=0.8, label=kind)
    if n <= 40:
        for name, x, y in zip(scores["model"].values.astype(str), accuracy, aurc, strict=True):
            ax.annotate(name, (x, y), fontsize=5, xytext=(2, 2), textcoords="offset points")
    ax.set(xlabel="top-1 accuracy (%)", ylabel="AURC (lower is better)",
           title=f"AURC vs accuracy ({scores.attrs.get('dataset_name', '')}, no calibration)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(save_figure(fig, out_dir / "selective_aurc_vs_accuracy.png"))
    plt.close(fig)
    infos = [i for i in index_caches(caches) if i.mode == "plain"]
    if 0 < len({i.model for i in infos}) <= max_curves:
        curves = {}
        for info in sorted(infos, key=lambda i: i.model):
            ds = read_cache(info.path)
            p, y = softmax(ds["logits"].values), ds["label"].values
            curves[info.model] = risk_coverage_curve(p.argmax(1) == y, softmax_response(p))
        fig = plot_risk_coverage(curves, title="Risk-coverage (softmax response)")
        paths.append(save_figure(fig, out_dir / "risk_coverage.png"))
        plt.close(fig)
    return paths
