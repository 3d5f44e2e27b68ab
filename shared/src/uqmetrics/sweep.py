"""Resumable sweeps of independent cells on Dask (used by uqreg and uqvision).

A sweep is a list of :class:`Cell` s, each a JSON-serialisable parameter mapping with a unique
key. :func:`run_sweep` sends every cell whose result file is not already on disk to a Dask
cluster (a ``LocalCluster`` by default, any cluster by its scheduler address); each worker
computes its cell's :class:`xarray.Dataset` and writes it atomically with
:func:`uqmetrics.io.write_dataset`. A rerun skips the complete files, so an interrupted sweep
resumes without redoing finished cells and never leaves a half-written file. A cell that raises
is reported, not fatal: the other cells still run.

``dask.distributed`` is imported lazily: the rest of uqmetrics does not need it.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .io import IncompleteResultError, read_dataset, write_dataset

__all__ = ["Cell", "SweepReport", "cell_path", "is_complete", "run_sweep"]

_KEY = re.compile(r"^[A-Za-z0-9._=+-]+$")


@dataclass(frozen=True)
class Cell:
    """One independent unit of a sweep.

    Attributes
    ----------
    key : str
        Unique file stem (letters, digits, ``._=+-``); the result goes to ``<out_dir>/<key>.nc``.
    params : mapping
        Arguments of the cell function (must pickle).
    """

    key: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not _KEY.match(self.key):
            raise ValueError(f"cell key must match {_KEY.pattern}, got {self.key!r}")


@dataclass
class SweepReport:
    """What a sweep did: paths of computed and skipped cells, and errors by cell key."""

    computed: list[Path] = field(default_factory=list)
    skipped: list[Path] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def paths(self) -> list[Path]:
        return sorted(self.computed + self.skipped)


def cell_path(out_dir, cell: Cell) -> Path:
    return Path(out_dir) / f"{cell.key}.nc"


def is_complete(path) -> bool:
    """True if ``path`` is a complete result file (written by :func:`write_dataset`)."""
    try:
        read_dataset(path).close()
        return True
    except (FileNotFoundError, IncompleteResultError, OSError, ValueError):
        return False


def _run_cell(func: Callable[..., Any], params: Mapping[str, Any], path: str) -> str:
    """Worker side: compute one cell and write it atomically (replacing an incomplete file)."""
    ds = func(**params)
    write_dataset(ds, path, overwrite=True)
    return path


def run_sweep(cells: Iterable[Cell], func: Callable[..., Any], out_dir, *, scheduler: str | None = None,
              n_workers: int = 2, threads_per_worker: int = 1, overwrite: bool = False,
              progress: bool = True, client: Any = None) -> SweepReport:
    """Run every cell not already on disk, on Dask.

    Parameters
    ----------
    cells : iterable of Cell
        Unique keys required.
    func : callable
        Top-level (picklable) function ``func(**cell.params) -> xarray.Dataset``.
    out_dir : path
        Directory of the cell files.
    scheduler : str, optional
        Address of an existing Dask scheduler (``tcp://host:8786``); default: start a
        ``LocalCluster`` with ``n_workers`` processes of ``threads_per_worker`` threads.
    overwrite : bool
        Recompute cells whose files exist.
    progress : bool
        Show a progress bar.
    client : dask.distributed.Client, optional
        Use this client (neither ``scheduler`` nor a new cluster).

    Returns
    -------
    SweepReport
    """
    from dask.distributed import Client, LocalCluster, as_completed
    from tqdm.auto import tqdm

    cells = list(cells)
    keys = [c.key for c in cells]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})
        raise ValueError(f"cell keys must be unique, repeated: {dup}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = SweepReport()
    todo = []
    for cell in cells:
        path = cell_path(out, cell)
        if not overwrite and is_complete(path):
            report.skipped.append(path)
        else:
            todo.append(cell)
    if not todo:
        return report

    own_cluster = None
    if client is None:
        if scheduler:
            client = Client(scheduler)
        else:
            own_cluster = LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker,
                                       processes=True, dashboard_address=":0")
            client = Client(own_cluster)
        own_client = True
    else:
        own_client = False
    try:
        futures = {client.submit(_run_cell, func, dict(c.params), str(cell_path(out, c)), key=f"cell-{c.key}",
                                 pure=False): c for c in todo}
        bar = tqdm(total=len(futures), desc="sweep", unit="cell", disable=not progress)
        for fut in as_completed(futures):
            cell = futures[fut]
            try:
                report.computed.append(Path(fut.result()))
            except Exception as exc:  # noqa: BLE001  (a failing cell never kills the sweep)
                report.failed[cell.key] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            bar.update(1)
        bar.close()
    finally:
        if own_client:
            client.close()
        if own_cluster is not None:
            own_cluster.close()
    return report
