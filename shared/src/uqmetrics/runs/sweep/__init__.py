"""Resumable sweeps of independent cells on Dask (used by uqreg and uqvision).

A sweep is a list of :class:`Cell` s, each a JSON-serialisable parameter mapping with a unique
key. :func:`run_sweep` sends every cell whose result file is not already on disk to a Dask
cluster (a ``LocalCluster`` by default, any cluster by its scheduler address, or workers in
jobs of a queue); each worker
computes its cell's :class:`xarray.Dataset` and writes it atomically with
:func:`uqmetrics.runs.io.write_dataset`. A rerun skips the complete files, so an interrupted sweep
resumes without redoing finished cells and never leaves a half-written file. A cell that raises
is reported, not fatal: the other cells still run.

Progress (:func:`progress_bar`, shared with uqreg's study loop): a tqdm bar when the stream is
a terminal; otherwise (CI logs, ``cmd > log``, a pipe) one plain line at most every
:data:`LOG_PROGRESS_INTERVAL` seconds and one at the end (:class:`LogProgress`), never a bar
redrawn for every cell. Both show the units done and left and an ETA: the mean wall time per
unit finished in this run times the units left (cells found complete on disk count as done but
not in the mean; with several workers the mean is wall time per finished cell, so it already
accounts for the parallelism). :func:`run_sweep` can also count groups of cells (``group``: a
model's passes, say) and call back on every finished cell (``on_result``), e.g. to keep a
failures file (:func:`write_failures`, :func:`read_failures`) up to date while it runs.

Quiet failures (docs/conventions.md#v-1-zoos): a cell that raises returns its error to the
caller as a value (:class:`CellFailure`), so Dask's workers never log a "Compute Failed" block
with its traceback; :attr:`SweepReport.failed` holds the one-line error, and the full traceback
goes to ``log_file`` when one is given, with the log records of ``distributed`` in this process.
The workers of a cluster :func:`run_sweep` starts ignore ``SIGINT`` (a Ctrl-C in a terminal
reaches the whole process group) and, with a ``log_file``, write their standard error there:
the caller gets the ``KeyboardInterrupt`` alone and shuts the cluster down without the workers'
tracebacks or distributed's warnings on the console.

Where the cells run (:class:`ClusterSpec`, the options of :func:`add_cluster_options` that every
sweep command shares): a ``LocalCluster`` of this machine (default), the scheduler of a running
cluster (``--scheduler``), or Dask workers started inside jobs of an HPC queue by dask-jobqueue
(``--cluster slurm|pbs|lsf|sge``, ``--cluster-option KEY=VALUE``, ``--cluster-config FILE``,
``--jobs N``; ``jobqueue-local`` runs the same job scripts as local processes). Jobs survive
preemption through the resume: a cell file is written atomically, so it is there whole or not
at all; the cells of a job that ended are run again by the other workers, on a job submitted in
its place (:data:`WORKER_CHECK_INTERVAL`), or by a rerun. ``--gpus-per-job 1`` gives each job's
worker the Dask resource ``GPU=1`` and, for cells on cuda, each cell asks for it: one model per
GPU at a time. On one machine of several GPUs, ``--gpus all|N|I,J`` starts the ``LocalCluster``
with one worker per GPU instead (:func:`gpu_worker_env`: each worker's nanny sets its
``CUDA_VISIBLE_DEVICES`` to its GPU alone before the process starts, and the worker has the
resource ``GPU=1``), so cells on cuda spread over the GPUs, one per GPU at a time; fewer GPUs
visible than asked (:func:`visible_gpus`, :func:`select_gpus`) is an error before anything
starts. The dashboard of a cluster started here listens on 127.0.0.1 unless
``--dashboard`` says otherwise (a queue's scheduler itself binds where dask-jobqueue puts it, an
interface the workers of other nodes reach); its link is printed once.

``dask.distributed``, ``tqdm`` and ``dask_jobqueue`` (the optional extra ``uqmetrics[hpc]``) are
imported lazily: the rest of uqmetrics needs none of them.
"""

from __future__ import annotations

from .cells import Cell, CellFailure, SweepReport, cell_path, heap_for_arrays, is_complete
from .failures import FAILURES_FORMAT, read_failures, write_failures
from .launch import WORKER_CHECK_INTERVAL, gpu_worker_env, open_client
from .options import (
    CLUSTER_KINDS,
    DEFAULT_DASHBOARD,
    GPUS_ALL,
    HPC_EXTRA,
    QUEUE_CLUSTERS,
    ClusterSpec,
    add_cluster_options,
    parse_cluster_options,
    parse_gpus,
    positive_int,
    read_cluster_config,
    select_gpus,
    visible_gpus,
)
from .progress import (
    LOG_PROGRESS_INTERVAL,
    LogProgress,
    format_duration,
    progress_bar,
    progress_enabled,
    progress_line,
    set_progress,
)
from .run import run_sweep, undone_if_refused

__all__ = ["CLUSTER_KINDS", "DEFAULT_DASHBOARD", "FAILURES_FORMAT", "GPUS_ALL", "HPC_EXTRA",
           "LOG_PROGRESS_INTERVAL", "QUEUE_CLUSTERS", "WORKER_CHECK_INTERVAL", "Cell",
           "CellFailure", "ClusterSpec", "LogProgress", "SweepReport", "add_cluster_options",
           "cell_path", "format_duration", "gpu_worker_env", "heap_for_arrays", "is_complete",
           "open_client", "parse_cluster_options", "parse_gpus", "positive_int", "progress_bar",
           "progress_enabled", "progress_line", "read_cluster_config", "read_failures",
           "run_sweep", "select_gpus", "set_progress", "undone_if_refused", "visible_gpus",
           "write_failures"]
