"""Running a sweep: :func:`sweep_predictions` (one sweep at a time per caches folder, its
cells on Dask through :func:`uqmetrics.runs.sweep.run_sweep`, the failures recorded as they happen)
and its cell, :func:`predict_cell`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import torch
import xarray as xr
from uqmetrics.runs.io import exclusive_lock, remove_stale_temporaries
from uqmetrics.runs.sweep import LOG_PROGRESS_INTERVAL, Cell, cell_path, is_complete, run_sweep
from uqmetrics.runs.sweep.cells import WRITE_BEHIND

from ..data import ImageFolderDataset
from ..models import ModelSpec
from ..predict import PredictConfig, predict
from ..predict.files import _pinned_memory_format
from .decode import (
    DECODED_DIR,
    decode_groups,
    plan_fingerprints,
    planned_content,
    preprocessing_groups,
    remove_decoded,
    remove_fingerprints,
)
from .failures import ModelSweepReport, _FailureLog
from .plan import _prepare

__all__ = ["predict_cell", "sweep_predictions"]


def predict_cell(name: str, checkpoint: str | None, label: str | None, data: str,
                 dataset_name: str, config: dict, threads: int | None = None,
                 labels: str | None = None, subset: bool = False,
                 decoded: str | None = None, fingerprint: str | None = None,
                 digests: str | None = None,
                 train_fingerprint: str | None = None,
                 channels_last_source: str | None = None) -> xr.Dataset:
    """One sweep cell (runs on a Dask worker): :func:`uqvision.predict.predict` of one pass;
    ``labels``: the label file of a flat ``data``, ``subset``: read as a subset of it
    (:mod:`uqvision.layouts`); ``decoded``: the images of its preprocessing group decoded once
    (:mod:`~.decode`); ``fingerprint`` and ``digests``: the folder's fingerprint and the file
    of its per-sample digests, as the plan computed them (:func:`~.decode.plan_fingerprints`):
    the cell checks each image as it reads it instead of hashing the folder again;
    ``train_fingerprint``: that of a SWAG or K-FAC Laplace run's BatchNorm folder, as the plan
    computed it (not hashed again; ``None``: hashed here); ``channels_last_source``: how the
    memory format its config is pinned to was chosen (:func:`_pin_memory_formats`). The
    network is kept in the worker for its model's next cell (``predict``'s ``keep_model``:
    built and warmed up once per worker), and the decoded pixels on the device for the next
    model of the group (:mod:`uqvision.predict.decoded`)."""
    if threads:
        torch.set_num_threads(threads)
    folder = ImageFolderDataset(data, labels=labels, subset=subset) if labels or subset \
        else data
    (ds,) = predict(ModelSpec(name, checkpoint, label), folder, PredictConfig(**config),
                    dataset_name=dataset_name, decoded=decoded,
                    planned=planned_content(fingerprint, digests),
                    train_fingerprint=train_fingerprint,
                    channels_last_source=channels_last_source, keep_model=True)
    return ds


#: A cell reads and writes no netCDF file: the worker computes its next cell while this one's
#: cache is written (:func:`uqmetrics.runs.sweep.cells._run_cell`).
setattr(predict_cell, WRITE_BEHIND, True)


def _pin_memory_formats(cells: list[Cell], out_dir: str | os.PathLike) -> None:
    """A model resumed with ``channels_last`` ``None`` (chosen by architecture) computes its
    missing caches in the memory format of its complete caches in ``out_dir`` (one recorded
    before the option: contiguous), as ``predict`` does (its cells' ``config`` pinned, and
    the source of that format given to them, so that a cache records the same whether or not
    its sweep was resumed)."""
    models: dict[tuple, list[Cell]] = {}
    for c in cells:
        if c.params["config"].get("channels_last") is None:
            models.setdefault((c.params["name"], c.params["checkpoint"], c.params["label"]),
                              []).append(c)
    for group in models.values():
        done = [cell_path(out_dir, c) for c in group if is_complete(cell_path(out_dir, c))]
        if not done or len(done) == len(group):
            continue
        pinned, source = _pinned_memory_format(PredictConfig(), done)
        for c in group:
            c.params["config"]["channels_last"] = pinned.channels_last
            if source is not None:  # the pinned caches' own, recorded by the new ones
                c.params["channels_last_source"] = source


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
                      probe: bool = True,
                      sets: Iterable[str | tuple[str, str | os.PathLike]] = (),
                      share_decoding: bool = True) -> ModelSweepReport:
    """Cache predictions of every model in ``patterns`` and ``zoos`` on ``data``, and on every
    member of the evaluation sets ``sets``, into ``out_dir``, on Dask.

    Parameters
    ----------
    patterns : iterable of str
        Names, ``NAME=CHECKPOINT`` and wildcards (:func:`expand_models`; checked up front: a
        name no registry knows raises ``ValueError``).
    data : path or ImageFolderDataset
        The evaluation folder or archive, or its scan (a flat layout scanned with its label
        file, :mod:`uqvision.layouts`: the cells read the same label file).
    sets : iterable of str or (str, path) or SweepTarget
        Extra evaluation sets (``uqvision sweep --sets``), ``EVALSET=PATH`` each: ``EVALSET``
        a name of :data:`uqvision.evalsets.EVAL_SETS`, ``PATH`` its folder; an expanded set
        (``imagenet-c``) stands for every member folder below ``PATH``
        (``<corruption>/<severity>/``). Every model predicts every one of them once, as
        ``uqvision predict --eval-set EVALSET [--eval-member M]`` (one cell per model,
        member, sample and pass; caches named ``<model>.<set>-<member>.<mode>-<pass>.nc``, or
        by the folder's name for a set of one folder); they are resumed and reported as the
        ``data`` cells are. A bad value, a set with no member folder, or two folders with
        one dataset name raise :class:`uqmetrics.InputError` naming the value, before any
        cell runs. (Targets of :func:`~.sets.sweep_targets` are taken as they are.)
    zoos : iterable of str
        Names of :data:`uqvision.zoo.ZOOS` (an unknown zoo raises ``ValueError`` naming the
        known ones). Their models join ``patterns``' (union, each model once); a zoo member
        the installed timm/torchvision does not know is a failed model, not an error.
    failures_file : path, optional
        Default ``<out_dir>/sweep_failures.json``. The models that failed, one record each
        (:class:`ModelSweepReport`), written atomically (:func:`uqmetrics.runs.sweep.write_failures`)
        as failures happen; read back by the next run. A file that cannot be written is
        reported in one line on stderr and the sweep goes on
        (:attr:`ModelSweepReport.failures_error`).
    retry_failed : bool, default True
        Recompute the models the failures file lists (OOM, a missing file, the network: most
        causes are transient or fixed between runs). False: leave them out and report them
        again with their recorded error.
    progress : bool
        Cells and models done and left, and an ETA (:func:`uqmetrics.runs.sweep.run_sweep`): a bar
        on a terminal, else a line every ``progress_interval`` seconds and one at the end.
    log_file : path, optional
        Where the full traceback of every failed cell goes, and distributed's log records
        while the cells run (appended, created on the first record); default: nowhere (the
        one-line errors are in the report).
    probe : bool, default True
        When some weights are not cached and the network is allowed, one request decides
        whether the hub can be reached (:func:`check_weights`); False: no request, the cells
        find out.
    share_decoding : bool, default True
        Decode each image once per preprocessing group (the models of a folder whose
        transforms resize and crop alike, :mod:`~.decode`) instead of once per model; the
        caches are the same bit for bit. False: every cell decodes the image files itself.

    Returns
    -------
    ModelSweepReport
        ``computed``/``skipped`` cache paths and ``failed`` (cell key or model -> error):
        models that failed before any cell ran (no weights, unknown to the installed timm,
        caches of other inputs) and cells that raised; ``failed_models`` the same by model.
        The sweep itself never raises for them.

    Raises
    ------
    uqmetrics.runs.io.LockedError
        Another sweep runs into ``out_dir`` (it holds ``out_dir/.sweep.lock``,
        :func:`uqmetrics.runs.io.exclusive_lock`, while it runs; a sweep holding it also removes
        the temporary files that failed or killed writes left in ``out_dir``).
    """
    config = config or PredictConfig()
    # one sweep at a time per caches folder; temporary files of writes that a killed or
    # failed sweep left there are its orphans (no other sweep writes here)
    with exclusive_lock(Path(out_dir) / ".sweep.lock",
                        advice="wait for that sweep to finish, or write to another --out"):
        remove_stale_temporaries(out_dir)
        remove_stale_temporaries(Path(out_dir) / DECODED_DIR)
        prep = _prepare(patterns, data, out_dir, config, zoos=zoos, weights_dir=weights_dir,
                        dataset_name=dataset_name, threads=threads, overwrite=overwrite,
                        failures_file=failures_file, probe=probe, sets=sets)
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
        # the failures known before any cell, written once below
        for spec, why in unknown.values():
            log.fail(spec, why, kind="unknown", write=False)
        by_row = {**{s.row: s for s in prep.specs}, **prep.model_specs}
        for row, why in plan.refused.items():
            log.fail(by_row.get(row, ModelSpec(row)), why, kind="unknown", write=False)
        weights_failed = {}
        for row, w in prep.weights.items():
            if w.kind == "unavailable":
                weights_failed[row] = w.error
                log.fail(by_row.get(row, ModelSpec(row)), w.error, kind="weights", cause=w.cause,
                         write=False)
        for row, why in prep.refused.items():
            log.fail(by_row.get(row, ModelSpec(row)), why, kind="refused", write=False)
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
                               log_file=None if log_file is None else Path(log_file),
                               datasets={c.key: c.params["dataset_name"] for c in plan.cells})
        if not overwrite:
            _pin_memory_formats(plan.cells, out_dir)
        # every folder hashed once, here: the cells check the bytes they read against it
        digest_files = plan_fingerprints(plan.cells, plan.targets, out_dir,
                                         overwrite=overwrite)
        groups = preprocessing_groups(plan.cells, plan.targets, out_dir,
                                      overwrite=overwrite) if share_decoding else []
        decode_groups(groups, out_dir)
        if plan.cells:
            report = run_sweep(plan.cells, predict_cell, out_dir, scheduler=scheduler,
                               n_workers=n_workers, overwrite=overwrite, progress=progress,
                               client=client, group=lambda c: row_of[c.key].row, group_unit="model",
                               on_result=on_result, progress_interval=progress_interval,
                               log_file=log_file)
            out.computed, out.skipped, out.failed = report.computed, report.skipped, report.failed
        remove_fingerprints(digest_files)
        remove_decoded(groups, out.failed, out_dir)
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
