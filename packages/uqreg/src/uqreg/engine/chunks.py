"""The primitives of running chunks of networks, below :mod:`uqreg.engine.plan` and
:mod:`uqreg.engine.autoplan` (both use them; the plan re-exports them): the chunk size a
configuration allows (:func:`chunk_size`, :data:`MIN_BATCH`), the machine's cores and memory,
running chunks concurrently (:func:`map_chunks`, one CUDA stream per thread on CUDA) and one
torch thread per chunk (:func:`single_threaded`). The rules they keep are the plan's (its
module notes).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import torch

from .config import TrainConfig, is_auto

__all__ = ["MIN_BATCH", "available_cores", "chunk_size", "map_chunks", "physical_memory",
           "single_threaded"]


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"


#: The fewest networks a chunk's kernels ever see: a chunk of one network is padded to this many
#: copies of it (see the module notes).
MIN_BATCH = 2


def chunk_size(per_network: int, cfg: TrainConfig) -> int:
    """Networks per chunk, from the configuration only: ``cfg.chunk_networks`` bounded by the
    memory budget ``cfg.memory_budget()`` (``chunk_networks="auto"``: the budget's bound; :func:`make_plan` puts the
    measured chunk in its place); raises if fewer than :data:`MIN_BATCH` networks fit the
    budget (a chunk of one is computed as :data:`MIN_BATCH` copies)."""
    budget = cfg.memory_budget()
    size = int(budget // per_network)
    if size < MIN_BATCH:
        raise ValueError(
            f"max_memory={budget:.3g} bytes ({_gib(budget)}) is below the {MIN_BATCH} × "
            f"{per_network} bytes ({_gib(MIN_BATCH * per_network)}) of the smallest chunk ({MIN_BATCH} networks: a "
            f"chunk of one is computed as two); raise --max-memory, or reduce the training set (--n-train) or the "
            f"MC passes (--mc-samples)"
        )
    if cfg.chunk_networks is not None and not is_auto(cfg.chunk_networks):  # auto: bounded by memory here
        size = min(size, cfg.chunk_networks)
    return size


def physical_memory() -> int | None:
    """Bytes of physical memory of this machine (None where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def available_cores() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cores or 1)


def map_chunks(work: Callable, chunks: list, workers: int, device: torch.device | str) -> list:
    """``[work(c) for c in chunks]``, ``workers`` at a time: threads with ONE torch thread each
    (ATen ops release the GIL) and, on CUDA, one CUDA stream per thread, which the thread's work
    runs on (a chunk's kernels and shapes are those it has alone: the same bits)."""
    device = torch.device(device)
    if workers <= 1:
        return [work(c) for c in chunks]
    local = threading.local()

    def on_stream(chunk):
        if device.type != "cuda":
            return work(chunk)
        if not hasattr(local, "stream"):
            local.stream = torch.cuda.Stream(device)
        # the job's tensors were made on the default stream: wait for them before using them
        local.stream.wait_stream(torch.cuda.default_stream(device))
        with torch.cuda.device(device), torch.cuda.stream(local.stream):
            out = work(chunk)
            local.stream.synchronize()  # the chunk's results are complete before they are used
        return out

    # each pool thread sets its own thread-local OpenMP/MKL thread count to 1 as well
    with ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(1,)) as pool:
        return list(pool.map(on_stream, chunks))


# ---------------------------------------------------------------------------------------------
# one torch thread per chunk, process-wide (concurrent plans in one process share the setting)

_threads_lock = threading.Lock()
_threads_users = 0
_threads_saved = 1


@contextmanager
def single_threaded() -> Iterator[None]:
    """Run torch's kernels on ONE intra-op thread inside the block (restored after the last
    concurrent user leaves)."""
    global _threads_users, _threads_saved
    with _threads_lock:
        if _threads_users == 0:
            _threads_saved = torch.get_num_threads()
            torch.set_num_threads(1)
        _threads_users += 1
    try:
        yield
    finally:
        with _threads_lock:
            _threads_users -= 1
            if _threads_users == 0:
                torch.set_num_threads(_threads_saved)
