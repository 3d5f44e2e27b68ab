"""Execution plans measured on the device: ``chunk_networks="auto"``, ``parallel_chunks="auto"``.

The fastest chunk (networks per batched product) and number of concurrent chunks depend on the
device: 64 networks on 2 CPU cores keep a chunk's operands in cache, while an H100 runs 94 such
chunks one after another at a fifth of its GEMM roofline (docs/gpu.md). With ``"auto"`` the
engine measures them once per device and shape class and records the choice:

* **what is measured**: a few epochs (:data:`MEASURE_EPOCHS`, the first a warm-up) of the job's
  own training step (its data, network, head, sampler, objective and dtype) on synthetic
  networks, at chunk sizes of :data:`CPU_CHUNKS` or :data:`CUDA_CHUNKS` within the memory
  budget, in ascending order until two in a row are :data:`GAIN` slower than the best so far;
  then the concurrent chunks (threads on the CPU, CUDA streams on a GPU: :data:`CUDA_STREAMS`)
  at the chosen chunk. The rate is networks × epochs per second: wall time on CUDA, on the CPU
  the engine threads' CPU time (other processes of a shared machine do not count), the best of
  two measurements of at least :data:`MIN_MEASURE_S`. The smallest setting within :data:`GAIN`
  of the fastest is kept (less memory, and the same choice under noise);
* **where it is recorded**: a JSON file (:func:`plan_file`: ``$UQREG_ENGINE_PLAN``, else
  ``$XDG_CACHE_HOME/uqreg/engine_plan.json``, else ``~/.cache/uqreg/engine_plan.json``), keyed by
  the device's name, the torch version and the shape class (:func:`record_key`), and reused by
  every later run; ``UQREG_ENGINE_REMEASURE=1`` measures again (once per process and key) and
  replaces the entry. The file is written atomically (a temporary file beside it, then
  ``os.replace``) under a lock file (:func:`uqmetrics.runs.io.exclusive_lock`), re-read under
  the lock, so concurrent workers neither corrupt it nor drop each other's entries; one that
  finds the lock held waits for it (and, after :data:`LOCK_WAIT_S`, measures without writing).
  An unreadable record is measured anew; a record that cannot be written only costs the
  measurement next time;
* **what it changes**: execution only. Results never depend on the chunk or the concurrency
  (:mod:`uqreg.engine.plan`), so a measured plan changes speed, never a result; the plan a
  study used is recorded in its ``engine_plans`` attr and logged (logger ``uqreg.engine``).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import math
import os
import platform
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from uqmetrics.runs.io import LockedError, exclusive_lock, write_text_file

from .config import is_auto
from .network import NetworkBatch
from .samplers import SAMPLERS

log = logging.getLogger("uqreg.engine")

#: Environment variable: the record's path (default :func:`plan_file`'s cache location).
PLAN_FILE_ENV = "UQREG_ENGINE_PLAN"
#: Environment variable: ``1`` measures again (once per process and key), replacing the record.
REMEASURE_ENV = "UQREG_ENGINE_REMEASURE"
#: The record's ``format`` and ``version``.
RECORD_FORMAT, RECORD_VERSION = "uqreg.engine_plan", 1
#: Chunk sizes tried on the CPU and on CUDA (ascending; those above the memory budget are not).
CPU_CHUNKS = (16, 32, 64, 128, 256)
CUDA_CHUNKS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
#: Concurrent chunks (CUDA streams) tried on CUDA; on the CPU: 1, 2, 4, ... up to the cores.
CUDA_STREAMS = (1, 2, 4)
#: Epochs of each measurement; the first is a warm-up and is not timed. A measurement shorter
#: than :data:`MIN_MEASURE_S` (2× that on the CPU) is repeated with the epochs that take that
#: long at its rate (up to 256).
MEASURE_EPOCHS = 4
MIN_MEASURE_S = 0.05
#: Measurements of each setting after the first (the best is kept: noise only slows).
REPEATS = 1
#: A larger setting is kept only when at least this much faster (and the search stops at one
#: this much slower than the best).
GAIN = 1.05
#: Seconds a worker waits for another's measurement before measuring without writing.
LOCK_WAIT_S = 300.0


@dataclass(frozen=True)
class MeasuredPlan:
    """The measured chunk and concurrency of a shape class on a device.

    Attributes
    ----------
    chunk : int
        Networks per chunk.
    workers : int
        Chunks run at once (threads; CUDA streams on a GPU).
    source : str
        ``"measured"`` (in this process) or ``"recorded"`` (read from :func:`plan_file`).
    rates : list of (int, int, float)
        ``(chunk, workers, networks × epochs per second)`` of every setting measured.
    device : str
        The device's name (:func:`device_name`).
    """

    chunk: int
    workers: int
    source: str
    rates: tuple = ()
    device: str = ""


def plan_file() -> Path:
    """Where measured plans are recorded: ``$UQREG_ENGINE_PLAN``, else
    ``$XDG_CACHE_HOME/uqreg/engine_plan.json``, else ``~/.cache/uqreg/engine_plan.json`` (read at
    call time)."""
    if os.environ.get(PLAN_FILE_ENV):
        return Path(os.environ[PLAN_FILE_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "uqreg" / "engine_plan.json"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_name(device: torch.device) -> str:
    """The name a plan is recorded under: the GPU's name, or the CPU's model and its cores."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device.index or 0)
    from .chunks import available_cores

    return f"{_cpu_model()} ({available_cores()} cores)"


def shape_class(job) -> dict:
    """What makes two jobs' steps cost alike: the network's widths, the rows per step (rounded
    up to a power of two), head, sampler, FGSM, objective, dtype and backend."""
    cfg = job.cfg
    n, d = job.x_train.shape
    rows = SAMPLERS.lookup(job.sampler).rows(n, cfg)
    return {"widths": [int(d), *map(int, cfg.hidden), 1], "rows": 2 ** math.ceil(math.log2(max(rows, 1))),
            "head": job.head, "sampler": job.sampler, "adversarial": bool(job.adversarial),
            "objective": job.objective, "dtype": cfg.dtype, "backend": cfg.backend}


def record_key(job) -> str:
    """The record's key of ``job``: device name, torch version, :func:`shape_class`, the memory
    budget and what is asked (``auto`` or the fixed value of each setting)."""
    cfg = job.cfg
    key = {"device": device_name(cfg.torch_device()), "torch": torch.__version__, **shape_class(job),
           "max_memory": cfg.memory_budget(), "chunk_networks": cfg.chunk_networks,
           "parallel_chunks": cfg.parallel_chunks}
    return json.dumps(key, sort_keys=True, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------
# measuring


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def rate(job, size: int, workers: int) -> float:
    """Networks × epochs per second of ``workers`` concurrent chunks of ``size`` synthetic
    networks training on ``job``'s data: the best of :data:`REPEATS` measurements of
    :data:`MEASURE_EPOCHS` epochs or more (the first not timed; at least
    :data:`MIN_MEASURE_S`)."""
    cuda = job.cfg.torch_device().type == "cuda"
    least = MIN_MEASURE_S if cuda else 2 * MIN_MEASURE_S
    epochs = MEASURE_EPOCHS
    elapsed = _time_epochs(job, size, workers, epochs)
    if elapsed < least:  # long enough to be measured: the epochs that take ``least`` at this rate
        epochs = min(256, 1 + math.ceil(least / max(elapsed / (epochs - 1), 1e-9)))
        elapsed = _time_epochs(job, size, workers, epochs)
    for _ in range(REPEATS):
        elapsed = min(elapsed, _time_epochs(job, size, workers, epochs))
    return size * workers * (epochs - 1) / max(elapsed, 1e-9)


def _time_epochs(job, size: int, workers: int, epochs: int) -> float:
    """Seconds of epochs 2..``epochs`` of ``workers`` concurrent chunks of ``size``: on CUDA
    wall time (synchronised with each chunk's stream); on the CPU the chunks' thread CPU time
    over the workers (the engine's threads, not the other processes of a shared machine: the
    clock of bench_engine.py)."""
    from .chunks import map_chunks, single_threaded
    from .train import train_batched

    dev = job.cfg.torch_device()
    clock = time.perf_counter if dev.type == "cuda" else time.thread_time
    rep = int(job.nets.repetition[0])
    chunks = [NetworkBatch(np.full(size, rep), np.arange(i * size, (i + 1) * size)) for i in range(workers)]
    stamps: list[tuple[float, float]] = []

    def work(nets):
        times = []

        def tick(_):  # the first and the last epoch's end, synchronised (the others run on)
            if len(times) in (0, epochs - 1):
                _sync(dev)
            times.append(clock())

        train_batched(job.x_train, job.y, nets, seed=job.seed, head=job.head, sampler=job.sampler,
                      adversarial=job.adversarial, cfg=job.cfg, epochs=epochs, sigma=job.sigma,
                      progress=tick, objective=job.objective, noise_weights=job.noise_weights, alpha=job.alpha)
        stamps.append((times[0], times[-1]))

    with single_threaded():  # as the engine runs chunks (plan.execute)
        map_chunks(work, chunks, workers, dev)
    if dev.type == "cuda":
        return max(end for _, end in stamps) - min(first for first, _ in stamps)
    return sum(end - first for first, end in stamps) / workers


def _search(candidates, measure) -> tuple[int, list[tuple[int, float]]]:
    """The smallest candidate within :data:`GAIN` of the fastest, trying them in ascending
    order until two in a row are :data:`GAIN` slower than the best so far (or one does not fit
    the device)."""
    rates: list[tuple[int, float]] = []
    slower = 0
    for c in candidates:
        try:
            r = measure(c)
        except torch.OutOfMemoryError:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            break
        rates.append((c, r))
        slower = slower + 1 if r * GAIN < max(x for _, x in rates) else 0
        if slower == 2:
            break
    best = max(r for _, r in rates)
    return min(c for c, r in rates if r * GAIN >= best), rates


def measure(job, per_network: int) -> MeasuredPlan:
    """Measure the fastest chunk and concurrency of ``job``'s shape class (see the module notes):
    the chunk at the fixed concurrency (or 1 stream / all cores when that is ``auto`` too), then
    the concurrency at that chunk, all within ``job.cfg.memory_budget()``."""
    from .chunks import MIN_BATCH, available_cores

    cfg = job.cfg
    dev = cfg.torch_device()
    cuda = dev.type == "cuda"
    cores = available_cores()
    if is_auto(cfg.parallel_chunks):
        fixed_workers = 1 if cuda else cores
        worker_options = CUDA_STREAMS if cuda else sorted({*(2**i for i in range(cores.bit_length())), cores})
    else:
        fixed_workers = cfg.parallel_chunks or (1 if cuda else cores)
        worker_options = None
    budget = int(cfg.memory_budget() // per_network)  # networks that fit the budget at once

    def fits(chunk, workers):
        return chunk >= MIN_BATCH and chunk * workers <= budget

    if is_auto(cfg.chunk_networks):
        candidates = CUDA_CHUNKS if cuda else CPU_CHUNKS
        sizes = [c for c in candidates if fits(c, fixed_workers)]
        if not sizes:  # the budget holds fewer networks than the smallest candidate
            sizes = [max(MIN_BATCH, budget // fixed_workers)]
        with _quiet_grad():
            rate(job, sizes[0], 1)  # warm-up: allocator, kernels, libraries
            chunk, rates = _search(sizes, lambda c: rate(job, c, fixed_workers))
        table = [(c, fixed_workers, r) for c, r in rates]
        if chunk == sizes[-1] and max(candidates) > chunk:
            log.warning("engine plan: the fastest chunk measured, %d networks, is the largest that "
                        "the memory budget admits (max_memory %.3g GiB, about %d bytes a network); "
                        "larger chunks were not tried: a larger --max-memory may be faster",
                        chunk, cfg.memory_budget() / 2**30, per_network)
    else:
        from .chunks import chunk_size

        chunk = chunk_size(per_network, cfg)
        table = []
    workers = fixed_workers
    if worker_options is not None:
        options = [w for w in worker_options if fits(chunk, w)] or [1]
        with _quiet_grad():
            if not table:
                rate(job, chunk, 1)  # warm-up
            workers, rates = _search(options, lambda w: rate(job, chunk, w))
        table += [(chunk, w, r) for w, r in rates]
    return MeasuredPlan(int(chunk), int(workers), "measured", tuple(table), device_name(dev))


@contextlib.contextmanager
def _quiet_grad():
    with torch.enable_grad():  # training needs autograd on the autograd backend
        yield


# ---------------------------------------------------------------------------------------------
# the record


def read_record(path: Path) -> dict:
    """The plans recorded in ``path`` (``{key: entry}``); empty when the file is missing, not
    readable, or not a record of this format (it is then measured anew and rewritten)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("engine plan record %s is not readable (%s): measuring anew", path, exc)
        return {}
    if not (isinstance(data, dict) and data.get("format") == RECORD_FORMAT
            and data.get("version") == RECORD_VERSION and isinstance(data.get("plans"), dict)):
        log.warning("engine plan record %s is not a %s record: measuring anew", path, RECORD_FORMAT)
        return {}
    return data["plans"]


def _entry(plan: MeasuredPlan, seconds: float) -> dict:
    return {"chunk_networks": plan.chunk, "parallel_chunks": plan.workers, "device": plan.device,
            "rates": [[c, w, round(r, 1)] for c, w, r in plan.rates], "calibration_s": round(seconds, 2),
            "measured_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def _from_entry(entry) -> MeasuredPlan | None:
    try:
        chunk, workers = entry["chunk_networks"], entry["parallel_chunks"]
    except (TypeError, KeyError):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (chunk, workers)):
        return None
    return MeasuredPlan(chunk, workers, "recorded", tuple(map(tuple, entry.get("rates", ()))),
                        str(entry.get("device", "")))


def write_entry(path: Path, key: str, entry: dict) -> None:
    """Add ``entry`` under ``key`` to the record at ``path``: re-read and rewritten atomically
    (the caller holds the lock)."""
    plans = read_record(path)
    plans[key] = entry
    text = json.dumps({"format": RECORD_FORMAT, "version": RECORD_VERSION, "plans": plans}, indent=1,
                      sort_keys=True)
    write_text_file(path, text + "\n", overwrite=True)


@contextlib.contextmanager
def _waiting_lock(path: Path):
    """Hold ``path`` (:func:`exclusive_lock`), waiting up to :data:`LOCK_WAIT_S` for another
    holder; yields False when it could not be had (the caller then does not write)."""
    deadline = time.monotonic() + LOCK_WAIT_S
    with contextlib.ExitStack() as stack:
        held = False
        while True:
            try:
                stack.enter_context(exclusive_lock(path, advice="another worker is measuring the engine's plan"))
                held = True
                break
            except LockedError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            except OSError as exc:  # a cache folder that cannot be written
                log.warning("engine plan record lock %s: %s; the plan is measured, not recorded", path, exc)
                break
        yield held


_memo: dict[str, MeasuredPlan] = {}
_memo_lock = threading.Lock()


def resolve(job, per_network: int) -> MeasuredPlan:
    """The plan of ``job``'s shape class: from this process's memory, else the record, else
    measured (and recorded). ``UQREG_ENGINE_REMEASURE=1`` skips the record once per process and
    key."""
    key = record_key(job)
    with _memo_lock:  # one measurement at a time in a process
        if key in _memo:
            return _memo[key]
        path = plan_file()
        remeasure = os.environ.get(REMEASURE_ENV, "").strip().lower() in ("1", "true", "yes")
        plan = None if remeasure else _from_entry(read_record(path).get(key))
        if plan is None:
            with _waiting_lock(path.with_name(path.name + ".lock")) as locked:
                if locked and not remeasure:  # another worker may have measured it meanwhile
                    plan = _from_entry(read_record(path).get(key))
                if plan is None:
                    t0 = time.perf_counter()
                    plan = measure(job, per_network)
                    seconds = time.perf_counter() - t0
                    log.info("engine plan measured in %.1f s on %s: chunk_networks=%d parallel_chunks=%d (%s)",
                             seconds, plan.device, plan.chunk, plan.workers, key)
                    if locked:
                        try:
                            write_entry(path, key, _entry(plan, seconds))
                        except OSError as exc:
                            log.warning("engine plan not recorded in %s: %s", path, exc)
        _memo[key] = plan
        return plan


def forget() -> None:
    """Forget the plans resolved in this process (the record on disk stays)."""
    with _memo_lock:
        _memo.clear()


__all__ = [
    "CPU_CHUNKS",
    "CUDA_CHUNKS",
    "CUDA_STREAMS",
    "GAIN",
    "MEASURE_EPOCHS",
    "MIN_MEASURE_S",
    "PLAN_FILE_ENV",
    "REMEASURE_ENV",
    "REPEATS",
    "MeasuredPlan",
    "device_name",
    "forget",
    "measure",
    "plan_file",
    "rate",
    "read_record",
    "record_key",
    "resolve",
    "shape_class",
    "write_entry",
]
