"""Distributed runtime shared by training and prediction: the ``torch.distributed`` context
torchrun sets up, exact sharding of samples over ranks, the gather of per-rank arrays, and the
number of DataLoader workers a prediction uses by default (:func:`loader_workers`).

:func:`distributed_context` is entered by :func:`uqvision.training.loop.train_model` and
:func:`uqvision.predict.predict` alike (it lived in ``predict.py``, which made training import
prediction); nothing here knows a model, a method or a protocol.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import warnings

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["MAX_LOADER_WORKERS", "cpu_threads", "distributed_context", "gather",
           "loader_workers", "shard_indices", "usable_cores"]

#: The most DataLoader workers :func:`loader_workers` picks by itself.
MAX_LOADER_WORKERS = 4


def shard_indices(n: int, world_size: int, rank: int) -> np.ndarray:
    """Contiguous shard ``rank`` of ``range(n)`` over ``world_size`` ranks (sizes differ by ≤ 1).

    Examples
    --------
    >>> [shard_indices(5, 2, r).tolist() for r in range(2)]
    [[0, 1, 2], [3, 4]]
    """
    return np.array_split(np.arange(n), world_size)[rank]


@contextlib.contextmanager
def distributed_context(device: str):
    """Initialise ``torch.distributed`` from torchrun's environment, if present.

    Yields ``(world_size, rank, device)``; the backend is NCCL on CUDA, gloo otherwise; the
    device becomes ``cuda:LOCAL_RANK`` for a CUDA run. Without ``WORLD_SIZE > 1`` in the
    environment and no initialised group, yields ``(1, 0, device)``.

    The process group is initialised once per process and kept until the process exits: a
    torchrun job cannot re-initialise its group (the second group finds the first one's stale
    addresses in torchrun's store), and every TTA pass and every model of ``uqvision predict``
    enters this context.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    ready = dist.is_available() and dist.is_initialized()
    if not ready and (world <= 1 or not dist.is_available()):
        yield 1, 0, device
        return
    if device.startswith("cuda") and "LOCAL_RANK" in os.environ:
        local = int(os.environ["LOCAL_RANK"])
        device = f"cuda:{local}"
        torch.cuda.set_device(local)
    if not ready:
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
        atexit.register(_destroy_process_group)
    yield dist.get_world_size(), dist.get_rank(), device


def _destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def gather(local: dict[str, np.ndarray], world: int) -> dict[str, np.ndarray]:
    """Concatenate every rank's arrays along the sample axis in rank order (all ranks)."""
    if world == 1:
        return local
    parts: list = [None] * world
    dist.all_gather_object(parts, local)
    return {k: np.concatenate([p[k] for p in parts], axis=-2 if k == "logits" else 0)
            for k in local}


@contextlib.contextmanager
def cpu_threads(n: int, device: str = "cpu"):
    """Run the block with ``n`` torch intra-op threads on the CPU, then restore the count.

    A network trained on the CPU is not bit-identical across thread counts: the float
    reductions (matrix products, BatchNorm statistics, gradient sums) are split differently,
    and a training run amplifies the last-bit differences. A protocol that must not depend on
    ``--threads`` trains each network under a fixed count. On another device the block runs
    as it is.
    """
    if not str(device).startswith("cpu"):
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask; ``os.cpu_count()`` where the
    platform has none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def loader_workers(requested: int | None, n_batches: int, device: str = "cpu") -> int:
    """DataLoader workers of a prediction loader of ``n_batches`` batches of image files.

    ``requested`` (a count) is returned as it is. ``None`` (the default of
    :class:`uqvision.predict.PredictConfig`) gives the cores the network leaves idle, at most
    :data:`MAX_LOADER_WORKERS`: on a CUDA device ``usable cores - 1``, at least 1 (the images
    are decoded while the GPU runs); on the CPU ``usable cores - torch threads`` (the intra-op
    threads use every core by default, and a worker that competes with them for a core made
    the loop 3-6 % slower on 2 cores, 1.03x faster with one torch thread). It gives 0 when
    there is at most one batch (nothing to overlap) and inside a daemonic process (a
    ``multiprocessing.Pool`` worker, or a Dask worker of a cluster configured so, may not start
    children; a requested count there gives 0 with a ``RuntimeWarning``; the sweep's own
    ``LocalCluster`` starts non-daemonic workers). The logits do not depend on the
    number of workers.

    Examples
    --------
    >>> loader_workers(3, 100), loader_workers(None, 1), loader_workers(None, 5, "cuda") >= 1
    (3, 0, True)
    """
    daemonic = multiprocessing.current_process().daemon
    if requested is not None:
        if requested > 0 and daemonic:
            warnings.warn(f"{requested} DataLoader workers asked for inside a daemonic process "
                          f"({multiprocessing.current_process().name}), which may not start "
                          "children: the images are read in the process itself (0 workers; "
                          "the logits are the same)", RuntimeWarning, stacklevel=2)
            return 0
        return int(requested)
    if n_batches <= 1 or daemonic:
        return 0
    if str(device).startswith("cuda"):
        return max(1, min(MAX_LOADER_WORKERS, usable_cores() - 1))
    return max(0, min(MAX_LOADER_WORKERS, usable_cores() - torch.get_num_threads()))
