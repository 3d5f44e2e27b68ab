"""What a sweep would do, without doing it (``uqvision sweep --dry-run``): :func:`dry_run_sweep`
and its listing, :class:`SweepDryRun` (models, cells to compute or skip, cost and time).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from uqmetrics.runs.io import open_netcdf
from uqmetrics.runs.sweep import format_duration, is_complete

from ..data import ImageFolderDataset, readable_images
from ..predict import PredictConfig
from .plan import _models_of, _prepare
from .weights import _line

__all__ = ["SweepDryRun", "dry_run_sweep"]


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
    sets : list of dict
        One per folder of the extra evaluation sets (``sets``; the members of an expanded
        set each): ``set`` (its ``EVALSET=PATH``), ``eval_set``, ``member`` (or ``None``),
        ``dataset_name``, ``data`` (the folder), ``n_images``, ``compute`` and ``complete``
        (how many of its cells, over the models).
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
    sets: list[dict] = field(default_factory=list)

    @property
    def cells_to_compute(self) -> int:
        return sum(len(m["compute"]) for m in self.models)

    @property
    def image_cells(self) -> int:
        """Images the cells to compute predict, summed over cells (a set's folder has its own
        image count)."""
        return (self.n_images * (self.cells_to_compute - sum(s["compute"] for s in self.sets))
                + sum(s["n_images"] * s["compute"] for s in self.sets))

    @property
    def cells_complete(self) -> int:
        return sum(len(m["complete"]) for m in self.models)

    def estimate_s(self) -> float | None:
        """Seconds of cell time the cells to compute would take (None: unknown)."""
        if self.seconds_per_image is None:
            return None
        return self.seconds_per_image * self.image_cells

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
        by_set: dict[str, list[dict]] = {}
        for t in self.sets:
            by_set.setdefault(t["set"], []).append(t)
        for value, members in by_set.items():
            n = {t["n_images"] for t in members}
            images = (f"{n.pop()} images" if len(n) == 1 else
                      f"{min(n)}-{max(n)} images") + (" each" if len(members) > 1 else "")
            what = (f"{len(members)} member(s) ({', '.join(t['member'] for t in members[:4])}"
                    + (", ..." if len(members) > 4 else "") + f"), {images}"
                    if members[0]["member"] is not None else images)
            out.append(f"  set {value}: {what}; {sum(t['compute'] for t in members)} cell(s) "
                       f"to compute, {sum(t['complete'] for t in members)} complete (skipped)")
        failing = sum(m["fails"] is not None for m in self.models)
        out.append(f"cells: {self.cells_to_compute} to compute, {self.cells_complete} complete "
                   f"on disk (skipped); {failing} model(s) would fail before any cell runs")
        per_cell = f" (each cell {self.passes} passes)" if self.passes > 1 else ""
        if self.sets:
            of_sets = sum(t["compute"] for t in self.sets)
            cost = (f"cost: {self.cells_to_compute} cell(s) = {self.image_cells} image-cells "
                    f"({self.cells_to_compute - of_sets} × {self.n_images} images of the data, "
                    f"{of_sets} of the sets){per_cell}; ")
        else:
            cost = (f"cost: {self.cells_to_compute} cell(s) × {self.n_images} images = "
                    f"{self.image_cells} image-cells{per_cell}; ")
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
            with open_netcdf(path) as ds:
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
                  probe: bool = True,
                  sets: Iterable[str | tuple[str, str | os.PathLike]] = (),
                  recompute: Iterable[str | os.PathLike] = ()) -> SweepDryRun:
    """What :func:`sweep_predictions` with the same arguments would do, without doing it.
    ``recompute``: caches the caller sets aside before the sweep (``uqvision evaluate``'s
    caches that lack a variable or record another role), counted as cells to compute.

    The same checks run (models, images, the extra ``sets``, failures file, weights, the
    identity of the caches
    already there, except for models whose weights are not cached: comparing needs their
    hash), and nothing is computed, downloaded or written; the one request of
    :func:`check_weights` is made when some weights are not cached (``probe=False``: none).

    Returns
    -------
    SweepDryRun
        The models with their weights and cells to compute or skip (those of the extra sets'
        members included, and listed by set), and the cost: cells × images, and a time when caches of earlier runs in ``out_dir`` record their wall time.
    """
    config = config or PredictConfig()
    aside = {Path(p).resolve() for p in recompute}
    prep = _prepare(patterns, data, out_dir, config, zoos=zoos, weights_dir=weights_dir,
                    dataset_name=dataset_name, threads=threads, overwrite=overwrite,
                    failures_file=failures_file, probe=probe, dry_run=True, sets=sets)
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
                path = Path(out_dir) / f"{cell.key}.nc"
                done = not overwrite and path.resolve() not in aside and is_complete(path)
                entry["complete" if done else "compute"].append(cell.key)
        rows.append(entry)
    n_images = len(readable_images(prep.folder, skip_bad=config.skip_bad_images))
    rate, timed = _recorded_seconds_per_image(out_dir, config.mode)
    state = {key: kind for m in rows for kind in ("compute", "complete") for key in m[kind]}
    sets = []
    for t in prep.targets[1:]:
        keys = [c.key for c in prep.plan.cells if c.params["dataset_name"] == t.dataset_name]
        sets.append({"set": t.source, "eval_set": t.config.eval_set, "member": t.member,
                     "dataset_name": t.dataset_name, "data": str(t.folder.root),
                     "n_images": len(readable_images(t.folder,
                                                     skip_bad=config.skip_bad_images)),
                     "compute": sum(state.get(k) == "compute" for k in keys),
                     "complete": sum(state.get(k) == "complete" for k in keys)})
    return SweepDryRun(rows, str(prep.folder.root), n_images, prep.dataset_name, config.mode,
                       int(config.passes) if config.mode == "mc_dropout" else 1, n_workers,
                       rate, timed, str(out_dir), sets)
