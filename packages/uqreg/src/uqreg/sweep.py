"""Coverage studies as resumable Dask sweeps (``uqreg sweep``).

A study is cut into independent cells — recipe × complexity × method × repetition chunk — each
computed by
:func:`run_cell` (a :func:`uqreg.study.run_raw` of that slice) and written to its own file by
:func:`uqmetrics.runs.sweep.run_sweep`. Every random stream is keyed by (seed, repetition, member), so a
cell computes exactly what the same slice of a single :func:`~uqreg.study.run_study` computes;
:func:`combine_cells` joins the cells and adds the same summary, giving the dataset
``uqreg study`` writes for the same configuration.

A cell file is taken as done only when it reads back intact: complete, and its data equal to
the checksums recorded when it was written (:func:`uqmetrics.read_dataset`). A cell whose data
changed on disk (a flipped bit) is recomputed, with a one-line note naming it, instead of
being combined into a wrong study. A sweep holds a lock on its cells folder
(``cells/.sweep.lock``) while it runs: a second sweep into the same folder is refused, and the
temporary files that failed writes of earlier runs left there are removed.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import uqmetrics
import xarray as xr
from uqmetrics.runs.io import (
    CHECKSUM_ATTR,
    IncompleteResultError,
    exclusive_lock,
    refuse_links,
    remove_stale_temporaries,
)
from uqmetrics.runs.sweep import Cell, SweepReport, cell_path, run_sweep, undone_if_refused

from .engine import RECIPES
from .engine.config import is_int
from .study import (
    EXECUTION_ONLY_TRAIN_FIELDS,
    RAW_VARS,
    StudyConfig,
    execution_only_train_fields,
    run_raw,
    study_entries,
    summarize,
)


def _digest(params: dict, left_out) -> str:
    """The sha256 (10 hex digits) of a cell's config, but for the training fields ``left_out``,
    and of its methods' revisions that are not 0."""
    from .methods import method_revisions  # torch: imported on use

    train = {k: v for k, v in params["train"].items() if k not in left_out}
    payload = dict(params, train=train)
    revisions = method_revisions(params.get("methods", ()))
    if revisions:
        payload["method_revisions"] = revisions
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:10]


def cell_digest(params: dict) -> str:
    """The digest of a cell's full config (a rerun with other settings never reuses the cell),
    but for its execution-only training fields (:func:`uqreg.study.execution_only_train_fields`:
    ``cuda_graphs``, and on the CPU ``max_memory``, ``chunk_networks`` and ``parallel_chunks``,
    so a rerun with another ``--max-memory`` reuses the cells), and of its methods' revisions
    that are not 0 (:func:`uqreg.methods.method_revisions`: a cell computed before a fix of its
    method is never reused, and the digest of a cell whose methods are all at revision 0 is
    what it always was)."""
    return _digest(params, execution_only_train_fields(params["train"]))


def legacy_cell_digest(params: dict) -> str:
    """The digest a cell had before its chunking fields (:data:`uqreg.study.CHUNKING_TRAIN_FIELDS`)
    were left out of :func:`cell_digest`: every training field but
    :data:`uqreg.study.EXECUTION_ONLY_TRAIN_FIELDS` (``cuda_graphs``). A cell file on disk under
    this digest is the same cell (:func:`plan_cells` finds it); where no chunking field is left
    out (on CUDA), it is :func:`cell_digest`."""
    return _digest(params, EXECUTION_ONLY_TRAIN_FIELDS)


def plan_cells(config: StudyConfig, *, chunk_repetitions: int = 10, cells_dir=None) -> list[Cell]:
    """The cells of a study: one per (recipe, complexity, method, chunk of repetitions), keyed
    ``<task>_<recipe>_c<complexity>_<method>_r<first>-<last>_<digest>`` (:func:`cell_digest`).

    ``cells_dir``: the folder of the sweep's cell files. A cell whose file is there only under
    its key of before (:func:`legacy_cell_digest`: a sweep written before the chunking fields
    left the digest, possibly with other values of them) keeps that key, so that the sweep reads
    the file there (:func:`uqmetrics.runs.sweep.run_sweep` skips a cell whose file is complete,
    and recomputes one that is not, in its place): the cell is neither recomputed nor renamed."""
    cfg = config.resolved()
    if not is_int(chunk_repetitions) or chunk_repetitions < 1:
        raise ValueError(f"chunk_repetitions must be an integer >= 1, got {chunk_repetitions!r}")
    base = cfg.to_dict()
    cells = []
    reps = cfg.repetition_index
    for r in cfg.recipes:
        for c in cfg.complexities:
            for m in cfg.methods:
                for start in range(0, len(reps), chunk_repetitions):
                    chunk = reps[start:start + chunk_repetitions]
                    params = dict(base, complexities=[int(c)], methods=[m], recipes=[r], repetitions=len(chunk),
                                  first_repetition=int(chunk[0]))
                    stem = f"{cfg.task}_{r}_c{c}_{m}_r{chunk[0]:04d}-{chunk[-1]:04d}_"
                    cell = Cell(stem + cell_digest(params), {"config": params})
                    if cells_dir is not None and not cell_path(cells_dir, cell).exists():
                        legacy = Cell(stem + legacy_cell_digest(params), cell.params)
                        if legacy.key != cell.key and cell_path(cells_dir, legacy).is_file():
                            cell = legacy
                    cells.append(cell)
    return cells


def run_cell(config: dict) -> xr.Dataset:
    """Worker entry point: the raw dataset of one cell (no progress bar)."""
    return run_raw(StudyConfig.from_dict(config), progress=False)


#: Dims a cell file is one slice of; every other coordinate must be the same in all cells.
_CELL_DIMS = ("recipe", "method", "complexity", "repetition")


def _check_cells_agree(paths, parts: list[xr.Dataset], cfg: StudyConfig) -> None:
    """Raise ``ValueError`` naming the cell file whose coordinates cannot be those of its
    study (damaged on disk before checksums were recorded, or written by other code): a
    repetition outside the study's, or a shared coordinate (``x``, ``point``, ...) that
    differs from the first cell's of the same complexity, which ``combine_by_coords`` would
    otherwise join into a wrong, larger study."""
    reps = set(np.asarray(cfg.repetition_index).tolist())
    first: dict[int, tuple] = {}
    for path, part in zip(paths, parts, strict=True):
        rep = part["repetition"].values
        bad = None
        if not set(rep.tolist()) <= reps or np.any(np.diff(rep) <= 0):
            bad = "repetition"
        else:
            c = int(part["complexity"].values[0])
            ref_path, ref = first.setdefault(c, (path, part))
            for name, coord in part.coords.items():
                if name in _CELL_DIMS or name not in ref.coords:
                    continue
                if not np.array_equal(coord.values, ref[name].values,
                                      equal_nan=coord.dtype.kind in "fc"):
                    bad = f"{name} (differs from {ref_path})"
                    break
        if bad is not None:
            raise ValueError(f"cell file {path}: its coordinate {bad} cannot be the study's "
                             f"(damaged or written by other code); delete it and rerun to "
                             f"recompute it")


def combine_cells(paths, config: StudyConfig) -> xr.Dataset:
    """Join cell files into the raw dataset of the whole study, in the config's order; its attr
    ``caches`` records every cell (``{absolute path: checksum}``, :func:`uqmetrics.input_checksum`).

    ``ValueError`` names a cell file that cannot be read intact, or whose coordinates cannot
    be its study's."""
    cfg = config.resolved()
    paths = list(paths)
    parts = [uqmetrics.read_dataset(p) for p in paths]
    _check_cells_agree(paths, parts, cfg)
    raw = xr.combine_by_coords([p[list(RAW_VARS)] for p in parts], combine_attrs="drop")
    by_complexity: dict[int, list[xr.Dataset]] = {}
    for p in parts:  # the task data is the same for every recipe and method: take the first one's cells
        if p.method.values[0] == cfg.methods[0] and p.recipe.values[0] == cfg.recipes[0]:
            by_complexity.setdefault(int(p.complexity.values[0]), []).append(p)
    static = []
    for c in cfg.complexities:
        chunks = sorted(by_complexity[c], key=lambda p: int(p.repetition.values[0]))
        per_rep = [v for v in ("y_train", "y_test") if v in chunks[0].data_vars]  # cells before R.8: no y_test
        s = chunks[0].drop_vars([*RAW_VARS, *per_rep, "recipe", "method", "repetition"])
        for v in per_rep:
            s[v] = xr.concat([q[v] for q in chunks], dim="repetition")
        static.append(s)
    out = xr.merge([raw, xr.concat(static, dim="complexity", join="outer")], compat="override", join="outer",
                   combine_attrs="drop")
    out = out.reindex({"recipe": list(cfg.recipes), "method": list(cfg.methods),
                       "complexity": list(cfg.complexities)})
    out.attrs = {k: v for k, v in parts[0].attrs.items()
                 if k not in ("wall_time_s", "complete", CHECKSUM_ATTR)}
    wall: dict = {}
    for p in parts:
        for k, v in json.loads(p.attrs.get("wall_time_s", "{}")).items():
            wall[k] = wall.get(k, 0.0) + v
    out.attrs["wall_time_s"] = json.dumps(wall)
    plans = []  # the measured engine plans of every cell (execution only), each once
    for p in parts:
        plans += [q for q in json.loads(p.attrs.get("engine_plans", "[]")) if q not in plans]
    out.attrs.pop("engine_plans", None)
    if plans:
        out.attrs["engine_plans"] = json.dumps(plans)
    out.attrs["recipes"] = json.dumps({r: RECIPES.lookup(r).to_dict() for r in cfg.recipes})
    # the cells are the study's caches: {absolute path: checksum} (uqreg verify re-combines them)
    out.attrs["caches"] = json.dumps({str(Path(p).resolve()): uqmetrics.input_checksum(part)
                                      for p, part in zip(paths, parts, strict=True)})
    return out


def _note_damaged_cells(cells_dir: Path, cells: list[Cell]) -> list[Path]:
    """One line on stderr for each cell file on disk that does not read back intact (the
    sweep then recomputes it); returns them."""
    damaged = []
    for cell in cells:
        path = cell_path(cells_dir, cell)
        if not path.is_file():
            continue
        try:
            uqmetrics.read_dataset(path).close()
        except IncompleteResultError as exc:
            damaged.append(path)
            print(f"uqreg sweep: {path}: {exc.detail or exc}; recomputing it", file=sys.stderr,
                  flush=True)
    return damaged


def sweep_config(config: StudyConfig) -> StudyConfig:
    """The configuration :func:`run_study_sweep` runs ``config`` with, and records: resolved, and on
    the CPU one chunk at a time inside each cell where ``parallel_chunks`` is not given (the
    workers are the parallelism)."""
    cfg = config.resolved()
    if cfg.train.parallel_chunks is None and not cfg.train.device.startswith("cuda"):
        cfg = replace(cfg, train=replace(cfg.train, parallel_chunks=1))
    return cfg


#: What a sweep writes into inside its output folder besides the study's file: the cells and
#: their lock (and the log, where it lies there); no link may stand there (refuse_links).
CELL_WRITES = ("cells", "cells/.sweep.lock")


def run_study_sweep(config: StudyConfig, out_dir, *, chunk_repetitions: int = 10, scheduler: str | None = None,
                    n_workers: int = 2, threads_per_worker: int = 1, overwrite: bool = False,
                    progress: bool = True, client=None, log_file=None,
                    option: str = "--out") -> tuple[xr.Dataset | None, SweepReport]:
    """Run a study as a sweep of cells under ``out_dir/cells`` and combine them.

    Returns the combined, summarised dataset (None if a cell failed) and the sweep report.
    ``n_workers`` and ``threads_per_worker`` (integers >= 1) size the ``LocalCluster`` started
    when neither ``scheduler`` nor ``client`` is given; ``ValueError`` before any work otherwise
    (a cluster of no worker would wait for ever). ``log_file``: where failed cells' full
    tracebacks and the Dask workers' own output go (:func:`uqmetrics.runs.sweep.run_sweep`; the
    console then shows one line per failed cell, and one line on Ctrl-C).

    The sweep holds ``out_dir/cells/.sweep.lock`` (:func:`uqmetrics.runs.io.exclusive_lock`) while it
    runs: a second sweep into the same folder is refused (:class:`uqmetrics.runs.io.LockedError`,
    naming the process that holds it) before any work. Holding it, the sweep removes the
    temporary files earlier runs' failed writes left in ``cells/``
    (:func:`uqmetrics.runs.io.remove_stale_temporaries`), and notes on stderr, one line each, the
    cell files on disk that are not intact (data that do not match their recorded checksums,
    an unreadable or unfinished file): they are recomputed. A sweep refused before any work (a
    queue that refuses its jobs: ``ValueError``) leaves none of the folders it made, nor its log
    (:func:`uqmetrics.runs.sweep.undone_if_refused`).

    A symbolic link at ``out_dir/cells``, at its lock or at the log file in ``out_dir`` is
    refused before any work (:func:`uqmetrics.runs.io.refuse_links`, its message naming
    ``option``, the link and where it points): an ``out_dir`` received from someone else
    could otherwise have the cells written, and files removed, where it points.
    """
    for name, value in (("n_workers", n_workers), ("threads_per_worker", threads_per_worker)):
        if scheduler is None and client is None and (not is_int(value) or value < 1):
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    cfg = sweep_config(config)
    cells_dir = Path(out_dir) / "cells"
    # an --out received from someone else: a link there would have the cells written, stale
    # temporaries removed, the lock truncated and the log appended to where it points
    inside = list(CELL_WRITES)
    if log_file is not None and Path(log_file).parent.absolute() == Path(out_dir).absolute():
        inside.append(Path(log_file).name)
    refuse_links(option, out_dir, inside)
    cells = plan_cells(cfg, chunk_repetitions=chunk_repetitions, cells_dir=cells_dir)  # legacy keys found
    t0 = time.perf_counter()
    # a refusal before any work (a queue that refuses its jobs) leaves no folder it made: the
    # lock's cells/ and --out (run_sweep undoes its own log file)
    with undone_if_refused(cells_dir), exclusive_lock(
            Path(out_dir) / CELL_WRITES[1], advice="wait for that sweep to finish, or write to another --out"):
        remove_stale_temporaries(cells_dir)  # no other sweep writes here: they are orphans
        if not overwrite:
            _note_damaged_cells(cells_dir, cells)
        report = run_sweep(cells, run_cell, cells_dir, scheduler=scheduler, n_workers=n_workers,
                           threads_per_worker=threads_per_worker, overwrite=overwrite,
                           progress=progress, client=client, log_file=log_file)
        if not report.ok:
            return None, report
        ds = summarize(combine_cells(report.paths, cfg))
    by_method: dict[str, list[str]] = {}  # the cells of each method (its entry's caches)
    for cell in cells:
        by_method.setdefault(cell.params["config"]["methods"][0], []).append(
            str(cell_path(cells_dir, cell).resolve()))
    ds.attrs.update(uqmetrics.provenance_attrs(
        config=cfg.to_dict(), seed=cfg.seed,
        extra={"sweep_cells": len(cells), "sweep_computed": len(report.computed), "sweep_skipped": len(report.skipped),
               "sweep_wall_time_s": time.perf_counter() - t0, "chunk_repetitions": chunk_repetitions,
               **study_entries(ds, cfg, by_method)}))
    return ds, report
