"""Benchmark of the batched training engine (run: ``python packages/uqreg/benchmarks/bench_engine.py``).

Prints, from ONE run, side by side:

1. the time to train a 120-member deep ensemble (sinusoid, f_main = 1, 50 training points,
   300 full-batch epochs; initialisation included, prediction not) with the engine, with the
   per-network loop peer libraries use (one ``nn.Module`` + ``torch.optim.Adam`` per member,
   ``tests/loop_reference.py``), and with the **vmap peer**: PyTorch's model-ensembling tutorial
   (``torch.func.stack_module_state`` + ``vmap`` over ``functional_call``) with ONE Adam over
   the stacked parameters (``fused=True``, L2 on the weights, the same recipe), starting from
   the loop's own initial members; and the ratios. Wall times; each peer runs with 1 and with
   all torch threads and keeps its better time;
2. for the paper-e1 cell (preset ``paper-e1``: 50 repetitions × 120 members = 6,000 networks at
   f_main = 1; the engine's chunks and concurrent workers: on CUDA the measured ``"auto"``
   plan, :mod:`uqreg.engine.autoplan`, and beside it the fixed chunk of 64 one after another),
   the time per epoch of the training step and, measured the same way,
   the **GEMM roofline**: the time the step's matrix products alone take at the exact shapes
   and chunk (``bmm``/``baddbmm`` with ``out=`` on tensors allocated beforehand: for every
   layer whose fan-in and fan-out both exceed 1, the forward product ``h·W``, the weight
   gradient ``hᵀ·dz`` and, except for the first layer, the input gradient ``dz·Wᵀ``);
   ``fraction_of_gemm_roofline = roofline time / step time``. (The degenerate products, the
   1→128 outer product and the 32→1 reductions, are not GEMMs and count as the step's other
   work, like activations and Adam.) Also the achieved GFLOP/s against this machine's float32
   matmul peak (a 4096² matmul on one thread, times the workers, best of before and after), and
   the peak resident memory; with ``--triton``, beside them the step of backend ``"triton"``
   (the whole step as one Triton kernel, :mod:`uqreg.engine.triton_step`) at each of
   ``--triton-warps`` warps per program (default :data:`TRITON_WARPS`) and each of
   ``--triton-precisions`` (the products' ``input_precision``), after a check that it
   trains the fused backend's networks to float32 rounding (``triton_max_rel_diff``; a kernel
   that fails the check, or fails to build, is reported, ``triton_failed=<precisions>``, and not
   timed);
3. with ``--explore``, the variants tried, so the losers' numbers are on record: the autograd
   backend and chunk sizes; and always (3b), op-level alternatives at the step's shapes, a chunk
   of the plan's size on the device (Adam implementations, the coupled L2 inside fused Adam's
   call, the output layer and a fan-in-1 first layer's weight gradient as ``bmm`` or as a
   reduction, the activation's backward from a stored mask or from the activation;
   ``DETAIL op_<row>_kept_vs_other``: below 1 where the step's choice is the faster);
4. a torch-profiler table of one chunk's training at the plan's chunk size, and where one epoch
   goes: GEMMs, fused Adam, the other ops, and the time outside them (on CUDA the device idle
   between kernels, which CUDA graphs remove), each op's time per epoch the difference between
   a profiled run of 1 + E epochs and one of 1 epoch; Adam's bytes per second beside those of a
   plain copy (is it at the memory's speed?); and the fraction of the GEMM roofline the step
   would reach if every op but the GEMMs and Adam cost nothing (``fraction_bound_gemm_adam``).

Step times come from the engine's own per-epoch progress calls: for every chunk, the CPU time
of its worker thread from the end of its first epoch to the end of its last, so the
initialisation (drawing Glorot-uniform weights from the counter-based streams) and the first
epoch's warm-up are not counted, nor are other processes of a shared machine; per-chunk times
are summed and divided by the concurrent workers. On CUDA the clock is the wall clock, read after
synchronising the chunk's stream (each concurrent chunk runs on its own CUDA stream, as in the
engine). FLOPs counted:
6·n·Σ fan_in·fan_out per network and epoch (2 forward, 4 backward), the usual dense-training
count, so the fraction of peak is a lower bound of how busy the matmul units are.

The last line is machine readable:
``RESULT speedup_vs_loop=<x> speedup_vs_vmap=<v> fraction_of_gemm_roofline=<r> fraction_of_matmul_peak=<y>
plan_chunk=<c> plan_workers=<w> cell_gflops=<g>``, followed, when the plan is not the fixed chunk of
64 (on CUDA by default), by ``fraction_of_gemm_roofline_chunk64=<r> cell_gflops_chunk64=<g>
plan_vs_chunk64=<step time ratio>``, by ``fraction_of_gemm_roofline_graphs=<r> graphs_vs_eager=<x>``
with ``--cuda-graphs`` on CUDA, by ``fraction_of_gemm_roofline_triton=<r> triton_vs_eager=<x>
triton_warps=<w> triton_max_rel_diff=<d>`` with ``--triton`` (the best of the warps; with
``--cuda-graphs`` the kernel's epochs are graph replays too; ``triton_vs_eager`` is against the
fused backend's eager step), ``triton_<precision>_vs_eager=<x> ...`` for each other precision
of ``--triton-precisions``, ``triton_failed=<precisions>`` where the check failed, and by ``fraction_bound_gemm_adam=<b>`` unless ``--no-profile``;
a ``DETAIL profile_...`` line before it gives the profile's numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import os
import resource
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from loop_reference import train_ensemble_loop

from uqreg.engine import (
    TrainConfig,
    TrainJob,
    make_plan,
    map_chunks,
    single_threaded,
    train_batched,
    triton_step,
)
from uqreg.engine.config import cuda_plan_defaults, int_or_auto
from uqreg.engine.fused import l2_of
from uqreg.methods import get_method
from uqreg.presets import PRESETS
from uqreg.tasks import get_task

MEMBERS = 120


def _sync(device) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _cuda(device) -> bool:
    return str(device).startswith("cuda")


def _stream_sync(device) -> None:
    """Wait for the calling thread's current CUDA stream (its chunk's work)."""
    if _cuda(device):
        torch.cuda.current_stream().synchronize()


def _clock(device):
    """The clock of a chunk's time: its thread's CPU time on the CPU (other processes of a shared
    machine not counted), wall time on CUDA (after :func:`_stream_sync`)."""
    return time.perf_counter if _cuda(device) else time.thread_time


def matmul_peak(device: str, workers: int, dtype=torch.float32, n: int = 4096, repeats: int = 3) -> float:
    """GFLOP/s of a large square matmul, best of ``repeats``: on the CPU, ``workers`` times its
    rate on one thread in that thread's CPU time (the measure of [2]); on CUDA, wall time."""
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    cuda = str(device).startswith("cuda")
    clock = time.perf_counter if cuda else time.thread_time
    best = float("inf")
    with single_threaded():
        for _ in range(repeats + 1):
            _sync(device)
            t = clock()
            a @ b
            _sync(device)
            best = min(best, clock() - t)
    return 2 * n**3 / best / 1e9 * (1 if cuda else workers)


def best_threads(fn) -> tuple[float, int]:
    """(best wall seconds, its torch thread count) of ``fn()`` run with 1 and with all torch
    threads: each peer gets its better setting."""
    results = []
    for threads in sorted({1, torch.get_num_threads()}):
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            t = time.perf_counter()
            fn()
            results.append((time.perf_counter() - t, threads))
        finally:
            torch.set_num_threads(old)
    return min(results)


def _load() -> str:
    """The 1-minute load average (the machine may be shared), or '?'."""
    return f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "?"


def widths_of(input_dim: int, cfg: TrainConfig) -> tuple[int, ...]:
    return (input_dim, *cfg.hidden, 1)


def parameter_counts(widths: tuple[int, ...]) -> tuple[int, int]:
    """(weights, weights + biases) of one network of these layer widths."""
    weights = sum(fi * fo for fi, fo in itertools.pairwise(widths))
    return weights, weights + sum(widths[1:])


def train_flops(n_rows: int, input_dim: int, cfg: TrainConfig) -> float:
    """FLOPs of one network's training step: 6·n·Σ fan_in·fan_out."""
    return 6.0 * n_rows * sum(a * b for a, b in itertools.pairwise(widths_of(input_dim, cfg)))


# ---------------------------------------------------------------------------------------------
# timing a job's training the way the engine runs it (plan: chunks, concurrent workers)


def run_chunks(job: TrainJob, work) -> None:
    """``work(chunk)`` for every chunk of ``job``'s plan, on its workers, one torch thread each
    (as :func:`uqreg.engine.execute`, without the prediction)."""
    plan = make_plan(job)
    with single_threaded():  # threads of one OpenMP thread; on CUDA one stream each (engine.map_chunks)
        map_chunks(work, plan.chunks(job.nets), plan.workers, job.cfg.device)


class EpochClock:
    """Progress callback that times every chunk from the end of its first epoch to the end of
    its last, in its worker's CPU time (per thread: a chunk's ``epochs`` calls come one after
    the other); on CUDA in wall time after synchronising the chunk's stream."""

    def __init__(self, epochs: int, device="cpu"):
        self.epochs = epochs
        self.device = device
        self.clock = _clock(device)
        self.stamps: dict[int, list[float]] = {}

    def __call__(self, n: int) -> None:
        _stream_sync(self.device)
        self.stamps.setdefault(threading.get_ident(), []).append(self.clock())

    def busy_time(self) -> float:
        """Sum over chunks of the time of their epochs 2..E."""
        total = 0.0
        for stamps in self.stamps.values():
            for i in range(0, len(stamps), self.epochs):
                total += stamps[i + self.epochs - 1] - stamps[i]
        return total


def time_training(job: TrainJob) -> tuple[float, float]:
    """(wall seconds of the whole training incl. initialisation, seconds per epoch of the step:
    busy time of epochs 2..E over all chunks / workers)."""
    clock = EpochClock(job.epochs, job.cfg.device)

    def work(chunk):
        train_batched(job.x_train, job.y, chunk, seed=job.seed, head=job.head, sampler=job.sampler,
                      adversarial=job.adversarial, cfg=job.cfg, epochs=job.epochs, sigma=job.sigma,
                      progress=clock)

    _sync(job.cfg.device)
    t = time.perf_counter()
    run_chunks(job, work)
    _sync(job.cfg.device)
    wall = time.perf_counter() - t
    return wall, clock.busy_time() / make_plan(job).workers / (job.epochs - 1)


#: Warps per program at which ``--triton`` times the kernel.
TRITON_WARPS = (4, 8, 16)
#: What ``--triton`` reports instead of timing: Triton missing (RuntimeError), or the kernel not
#: building on the device (registers, shared memory, PTX: Triton's errors).
BUILD_ERRORS = (RuntimeError,) + ((triton_step.triton.errors.TritonError,) if triton_step.triton else ())
#: Networks and epochs of the check that backend triton trains the fused backend's networks.
TRITON_CHECK = (8, 20)


@contextlib.contextmanager
def triton_variant(precision: str, warps: int):
    """The Triton steps made inside use ``precision`` and ``warps`` (the module defaults
    :data:`uqreg.engine.triton_step.PRECISION` and ``NUM_WARPS``, restored on exit)."""
    kept = triton_step.PRECISION, triton_step.NUM_WARPS
    triton_step.PRECISION, triton_step.NUM_WARPS = precision, warps
    try:
        yield
    finally:
        triton_step.PRECISION, triton_step.NUM_WARPS = kept


def check_triton(inst, y: np.ndarray, cfg: TrainConfig, precision: str = "ieee") -> float:
    """The largest difference between the parameters :data:`TRITON_CHECK` networks of the cell
    train to with backends triton (its products at ``precision``) and fused (float32, on the
    cell's device), relative to the largest parameter."""
    n, epochs = TRITON_CHECK
    job = get_method("ens").job(inst, y[:1], np.arange(1), replace(cfg, members=n), epochs=epochs)
    trained = {}
    with triton_variant(precision, triton_step.NUM_WARPS):
        for backend in ("fused", "triton"):
            c = replace(job.cfg, backend=backend)
            trained[backend] = train_batched(job.x_train, job.y, job.nets, seed=job.seed, head=job.head,
                                             sampler=job.sampler, adversarial=job.adversarial, cfg=c,
                                             epochs=epochs, sigma=job.sigma)
    pairs = zip(trained["triton"].parameters(), trained["fused"].parameters())
    with torch.no_grad():
        return max(float((a - e).abs().max() / e.abs().max()) for a, e in pairs)


def check_triton_variants(inst, y: np.ndarray, cfg: TrainConfig,
                          precisions: tuple[str, ...]) -> tuple[dict[str, float], list[str]]:
    """:func:`check_triton` at each of ``precisions``, printed: the differences (NaN where the
    kernel did not build: no Triton, or registers, shared memory, PTX on this device) and the
    precisions that failed the check (a difference above 1e-3, or none), which are not timed."""
    diffs, failed = {}, []
    for prec in precisions:
        try:
            diffs[prec] = check_triton(inst, y, cfg, prec)
            why = f"max parameter difference {diffs[prec]:.1e} of the largest parameter"
        except BUILD_ERRORS as exc:  # a finding, not a crash: the other measurements go on
            diffs[prec], why = float("nan"), f"{type(exc).__name__}: {exc}"
        print(f"backend triton ({prec} products) vs fused, {TRITON_CHECK[0]} networks x {TRITON_CHECK[1]} epochs, "
              f"float32: {why}")
        if not diffs[prec] <= 1e-3:
            print("    FAILED its check: not timed")
            failed.append(prec)
    return diffs, failed


def report_triton(step_triton: dict[tuple[str, int], float], step: float, roof: float, flops: float,
                  diffs: dict[str, float], failed: list[str]) -> str:
    """Print the kernel's step time per (precision, warps) beside the fused eager ``step`` and
    the GEMM roofline ``roof`` (seconds per epoch), and return the ``RESULT`` fields: the best
    warps of the exact kernel (``ieee``) as ``fraction_of_gemm_roofline_triton``,
    ``triton_vs_eager``, ``triton_warps``, ``triton_max_rel_diff``; each other precision as
    ``triton_<precision>_...``; ``triton_failed`` where a check failed."""
    best = {}  # per precision, the fastest warps and their step
    for (prec, warps), s in step_triton.items():
        print(f"    backend triton, {prec:6s} {warps:2d} warps: {s:8.4f} s ({flops / s / 1e9:6.1f} GFLOP/s), fraction "
              f"of roofline {roof / s:6.3f}; {step / s:5.2f} x the fused eager step")
        if s < best.get(prec, (0, float("inf")))[1]:
            best[prec] = (warps, s)
    fields = ""
    if "ieee" in best:
        w, s = best["ieee"]
        fields += (f" fraction_of_gemm_roofline_triton={roof / s:.3f} triton_vs_eager={step / s:.2f} "
                   f"triton_warps={w} triton_max_rel_diff={diffs['ieee']:.1e}")
    fields += "".join(f" triton_{p}_vs_eager={step / s:.2f} triton_{p}_warps={w} triton_{p}_max_rel_diff="
                      f"{diffs[p]:.1e}" for p, (w, s) in best.items() if p != "ieee")
    return fields + (f" triton_failed={','.join(failed)}" if failed else "")


def gemm_shapes(widths: tuple[int, ...], n: int) -> list[tuple[tuple[int, int], tuple[int, int], bool, bool]]:
    """The step's GEMMs ``A·B`` as ``((rows, inner), (inner, cols), A transposed, B transposed)``:
    per layer with fan-in and fan-out > 1, forward ``h·W``, weight gradient ``hᵀ·dz`` and (not the
    first layer) input gradient ``dz·Wᵀ``, in the operand layouts the fused step uses."""
    shapes = []
    for layer, (fi, fo) in enumerate(itertools.pairwise(widths)):
        if fi > 1 and fo > 1:
            shapes += [((n, fi), (fi, fo), False, False), ((fi, n), (n, fo), True, False)]
            if layer > 0:
                shapes.append(((n, fo), (fo, fi), False, True))
    return shapes


def time_roofline(job: TrainJob) -> float:
    """Seconds per epoch of the step's GEMMs alone (:func:`gemm_shapes`), every chunk at its
    exact size, on the same workers, timed as :func:`time_training` times the step (per chunk,
    epochs 2..E; operands allocated before)."""
    cfg = job.cfg
    n_rows = int(job.y.shape[1] if job.sampler == "full" else max(1, job.y.shape[1] // 2))
    shapes = gemm_shapes(widths_of(job.x_train.shape[1], cfg), n_rows)
    steps = job.epochs * (1 if job.sampler == "full" else cfg.bootstrap_batches) * (2 if job.adversarial else 1)
    kw = {"dtype": cfg.torch_dtype, "device": cfg.device}
    busy = []

    def operand(b, shape, transposed):
        t = torch.randn(b, *(shape[::-1] if transposed else shape), **kw)
        return t.transpose(1, 2) if transposed else t

    def work(chunk):
        b = len(chunk)
        ops = [(operand(b, sa, ta), operand(b, sb, tb), torch.empty(b, sa[0], sb[1], **kw))
               for sa, sb, ta, tb in shapes]
        for a, w, out in ops:  # warm-up, as the step's first epoch
            torch.bmm(a, w, out=out)
        _stream_sync(cfg.device)
        clock = _clock(cfg.device)
        t = clock()
        for _ in range(steps - 1):
            for a, w, out in ops:
                torch.bmm(a, w, out=out)
        _stream_sync(cfg.device)
        busy.append(clock() - t)

    run_chunks(job, work)
    return sum(busy) / make_plan(job).workers / (job.epochs - 1)


# ---------------------------------------------------------------------------------------------
# the vmap peer (PyTorch's model-ensembling tutorial, with one Adam)


def train_ensemble_vmap(x_train: np.ndarray, y: np.ndarray, n_members: int, cfg: TrainConfig, epochs: int, *,
                        seed: int = 0) -> dict[str, torch.Tensor]:
    """Train ``n_members`` members as the ensembling tutorial does: the loop peer's initial
    members (:func:`train_ensemble_loop` with 0 epochs, same seed) stacked with
    ``torch.func.stack_module_state``, the loss ``vmap``-ed over ``functional_call``, one
    ``torch.optim.Adam`` (fused) over the stacked parameters with L2 ``cfg``'s recipe factor on
    the weights (coupled recipes only). Returns the stacked parameters (member axis first)."""
    from torch.func import functional_call, stack_module_state, vmap

    recipe = cfg.recipe_spec
    if recipe.decoupled:
        raise ValueError(f"recipe {cfg.recipe!r}: the vmap peer implements the coupled recipes only")
    dev, dt = torch.device(cfg.device), cfg.torch_dtype
    models = train_ensemble_loop(x_train, y, n_members, cfg, 0, seed=seed)
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")

    def loss(p, b, x, t):
        return 0.5 * torch.mean((functional_call(base, (p, b), (x,))[:, 0] - t) ** 2)

    batched = vmap(loss, in_dims=(0, 0, None, None))
    x = torch.as_tensor(x_train, dtype=dt, device=dev)
    t = torch.as_tensor(np.asarray(y), dtype=dt, device=dev)
    wd = recipe.weight_decay(x.shape[0], cfg.weight_decay)
    weights = [v for k, v in params.items() if k.endswith("weight")]
    biases = [v for k, v in params.items() if not k.endswith("weight")]
    opt = torch.optim.Adam([{"params": weights, "weight_decay": wd}, {"params": biases, "weight_decay": 0.0}],
                           lr=cfg.lr, betas=cfg.betas, fused=True)
    for _ in range(epochs):
        opt.zero_grad(set_to_none=True)
        batched(params, buffers, x, t).sum().backward()
        opt.step()
    return params


def check_vmap_peer(inst, cfg: TrainConfig) -> float:
    """The vmap peer trains the loop peer's networks (float64, 3 members, 5 epochs): returns
    the largest relative parameter difference."""
    c64 = replace(cfg, dtype="float64")
    y = inst.targets([0])[0]
    loop = train_ensemble_loop(inst.x_train, y, 3, c64, 5, seed=1)
    stacked = train_ensemble_vmap(inst.x_train, y, 3, c64, 5, seed=1)
    worst = 0.0
    for i, model in enumerate(loop):
        for name, p in model.named_parameters():
            q = stacked[name][i].detach()
            worst = max(worst, float((p.detach() - q).abs().max() / p.detach().abs().max()))
    return worst


# ---------------------------------------------------------------------------------------------
# op-level variants (at the step's shapes, one thread or the CUDA device)


def _best(fn, repeats: int = 7, inner: int = 20, device="cpu") -> float:
    """Best seconds per call of ``fn()`` over ``repeats`` timings of ``inner`` calls (on CUDA
    each timing waits for the device's work)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(device)
        best = min(best, (time.perf_counter() - t) / inner)
    return best


def op_variants(b: int, n: int, widths: tuple[int, ...], device="cpu",
                l2: float = 1e-4) -> list[tuple[str, str, float, float]]:
    """``(key, what, kept µs per network, other µs per network)`` of op-level alternatives at a
    chunk of ``b`` networks on ``device``: the losers' numbers on record, and on a GPU the
    levers not taken until measured (the coupled L2 inside fused Adam's call, a one-row product
    for a fan-in-1 first layer's weight gradient: both read and write less memory, both round
    differently from the kept ops)."""
    kw = {"device": device}
    k, w1 = widths[-2], widths[1]
    n_weights, n_params = parameter_counts(widths)
    size = -(-b * n_params // 64) * 64
    split = -(-b * n_weights // 64) * 64
    h, g = torch.randn(b, n, k, **kw), torch.randn(b, n, 1, **kw)
    w, bias, out, tmp, gw = (torch.randn(b, k, 1, **kw), torch.randn(b, 1, 1, **kw), torch.empty(b, n, 1, **kw),
                             torch.empty(b, n, k, **kw), torch.empty(b, k, 1, **kw))
    z = torch.randn(b, n, w1, **kw)
    act, dz, mask, dgrad = torch.empty_like(z), torch.randn_like(z), torch.empty_like(z), torch.empty_like(z)
    x1, gw1 = torch.rand(b, n, 1, **kw), torch.empty(b, 1, w1, **kw)
    flat = [torch.randn(size, **kw) * 0.1 for _ in range(2)] + [torch.zeros(size, **kw) for _ in range(2)]
    step = torch.zeros((), **kw)
    shapes = [(b, fi, fo) for fi, fo in itertools.pairwise(widths)] + [(b, 1, fo) for fo in widths[1:]]
    tensors = [torch.nn.Parameter(torch.randn(s, **kw)) for s in shapes]
    for t in tensors:
        t.grad = torch.randn_like(t)
    flat_param = torch.nn.Parameter(flat[0].clone())
    flat_param.grad = flat[1].clone()
    opt_one = torch.optim.Adam([flat_param], fused=True)
    opt_foreach = torch.optim.Adam(tensors, foreach=True)
    adam_kw = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "amsgrad": False, "maximize": False}

    def fused_adam(wd: float = 0.0, parts=((0, size),)):
        step.add_(1)
        for a, e in parts:
            torch._fused_adam_([flat[0][a:e]], [flat[1][a:e]], [flat[2][a:e]], [flat[3][a:e]], [], [step],
                               weight_decay=wd if a == 0 else 0.0, **adam_kw)

    def l2_then_adam():  # the step's coupled L2: one op over the weights' part, then Adam
        flat[1][:split].add_(flat[0][:split], alpha=l2)
        fused_adam()

    def l2_in_adam():  # Adam's own weight decay over the weights' part, a second call for the rest
        fused_adam(l2, ((0, split), (split, size)))

    def out_reduce():
        torch.mul(h, w.transpose(1, 2), out=tmp)
        torch.sum(tmp, 2, keepdim=True, out=out).add_(bias)

    def grad_reduce():
        torch.mul(h, g, out=tmp)
        torch.sum(tmp, 1, keepdim=True, out=gw.transpose(1, 2))

    def first_reduce():  # the products (in the step: into dz itself), then the sum over rows
        torch.mul(x1, dz, out=dgrad)
        torch.sum(dgrad, 1, keepdim=True, out=gw1)

    def act_from_output():  # forward (in place in the step), backward from the activation
        torch._C._nn.leaky_relu(z, 0.01, out=act)
        torch.ops.aten.leaky_relu_backward.grad_input(dz, act, 0.01, True, grad_input=dgrad)

    def act_mask():  # forward writes a mask (1 or slope) and the product; backward multiplies
        torch.sign(z, out=mask).clamp_(min=0.0).mul_(1.0 - 0.01).add_(0.01)  # (no bool tensors: slow)
        torch.mul(z, mask, out=act)
        torch.mul(dz, mask, out=dgrad)

    # the levers not taken compute the kept ops' values, to rounding, before they are timed
    state = [t.clone() for t in (*flat, step)]
    l2_then_adam()
    kept_params = flat[0].clone()
    for t, v in zip((*flat, step), state):
        t.copy_(v)
    l2_in_adam()
    first_reduce()
    kept_grad = gw1.clone()
    torch.bmm(x1.transpose(1, 2), dz, out=gw1)
    for what, kept, other in (("the L2 inside Adam", kept_params, flat[0]), ("the one-row bmm", kept_grad, gw1)):
        if not torch.allclose(kept, other, rtol=1e-4, atol=1e-6):
            raise RuntimeError(f"{what} does not compute the step's values: max difference "
                               f"{(kept - other).abs().max().item():.2e}")

    def best(fn):
        return _best(fn, device=device)

    rows = [("adam_one", ("Adam step: one _fused_adam_ call on the flat buffer / Adam(fused=True) on one flat "
             "parameter"), best(fused_adam), best(opt_one.step)),
            ("adam_foreach", ("Adam step: one _fused_adam_ call on the flat buffer / Adam(foreach=True) on 8 "
             "stacked tensors"), best(fused_adam), best(opt_foreach.step)),
            ("l2_in_adam", ("coupled L2 + Adam: add_(alpha) over the weights, then Adam / the L2 as "
             "_fused_adam_'s weight_decay (two calls)"), best(l2_then_adam), best(l2_in_adam)),
            ("output_forward", f"output layer forward: mul + sum over k / baddbmm (GEMV), k={k}",
             best(out_reduce), best(lambda: torch.baddbmm(bias, h, w, out=out))),
            ("output_grad", "output weight gradient: mul + sum over rows / bmm (GEMV)",
             best(grad_reduce), best(lambda: torch.bmm(h.transpose(1, 2), g, out=gw))),
            ("first_grad", (f"fan-in-1 first layer's weight gradient, width {w1}: mul + sum over rows / "
             "one-row bmm"), best(first_reduce), best(lambda: torch.bmm(x1.transpose(1, 2), dz, out=gw1))),
            ("activation", (f"leaky ReLU forward + backward, width {w1}: backward from the activation / "
             "stored mask"), best(act_from_output), best(act_mask))]
    return [(key, what, kept / b * 1e6, other / b * 1e6) for key, what, kept, other in rows]


# ---------------------------------------------------------------------------------------------


#: Bytes of the copy that measures the device's memory bandwidth beside Adam's (:func:`step_profile`).
COPY_BYTES = 256 << 20
#: ATen ops counted as the step's GEMMs, and its optimiser, in :func:`step_profile`.
GEMM_OPS = frozenset({"aten::bmm", "aten::baddbmm", "aten::mm", "aten::addmm"})
ADAM_OPS = frozenset({"aten::_fused_adam_"})


def copy_bandwidth(device: str, repeats: int = 5) -> float:
    """GB/s of ``dst.copy_(src)`` over :data:`COPY_BYTES` (read + write counted), best of
    ``repeats``, on one thread of the CPU or on the CUDA device."""
    src = torch.ones(COPY_BYTES // 4, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    with single_threaded():
        for _ in range(repeats + 1):
            _sync(device)
            t = time.perf_counter()
            dst.copy_(src)
            _sync(device)
            best = min(best, time.perf_counter() - t)
    return 2 * COPY_BYTES / best / 1e9


def op_times(prof, cuda: bool) -> dict[str, tuple[float, int]]:
    """``{ATen op: (self seconds, calls)}`` of a profile: the op's own kernels' device time on
    CUDA (ops that launch none left out), its own CPU time otherwise."""
    out = {}
    for evt in prof.key_averages():
        if not evt.key.startswith("aten::"):  # kernels and runtime calls: counted in their op
            continue
        us = evt.self_device_time_total if cuda else evt.self_cpu_time_total
        if us > 0 or not cuda:
            out[evt.key] = (us * 1e-6, evt.count)
    return out


def step_profile(method, inst, y1: np.ndarray, cfg: TrainConfig, chunk: int, epochs: int) -> dict:
    """Where one epoch of a ``chunk``-network chunk of ``method``'s training goes, eager, on one
    thread (CUDA: the device's kernels): the chunk is trained for 1 and for ``1 + epochs`` epochs
    under the profiler, and the difference of each op's time, over ``epochs``, is its time per
    epoch (initialisation, the first epoch's warm-up and the prediction cancel out).

    Returns
    -------
    dict
        ``epochs``; per epoch in ms: ``gemm_ms`` (:data:`GEMM_OPS`), ``adam_ms``
        (:data:`ADAM_OPS`), ``other_ms`` (every other op), ``epoch_ms`` (the epoch timed
        without the profiler, as :class:`EpochClock` times it), ``outside_ms`` (``epoch_ms``
        minus the ops: on CUDA the device idle between kernels, on the CPU Python and dispatch);
        ``ops_per_epoch`` (ops that launched a kernel on CUDA, ATen calls on the CPU);
        ``adam_gb`` (bytes fused Adam reads and writes per epoch: 7 streams of 4-byte
        parameters, padding aside), ``adam_gbs``, ``copy_gbs`` (:func:`copy_bandwidth`),
        ``fraction_bound_gemm_adam`` (GEMMs / (GEMMs + Adam)), and ``table`` (the longer run's
        op table, by device or CPU time), ``per_op`` (``{ATen op: (ms, calls)}`` per epoch).
    """
    from torch.profiler import ProfilerActivity, profile

    cfg = replace(cfg, cuda_graphs=False)
    cuda = _cuda(cfg.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])

    def run(n_epochs, progress=None):
        job = method.job(inst, y1, [0], replace(cfg, members=chunk), epochs=n_epochs)
        train_batched(job.x_train, job.y, job.nets, seed=job.seed, head=job.head, sampler=job.sampler,
                      adversarial=job.adversarial, cfg=job.cfg, epochs=n_epochs, sigma=job.sigma,
                      progress=progress)
        _sync(cfg.device)

    with single_threaded():
        run(2)  # warm-up
        clock = EpochClock(1 + epochs, cfg.device)
        run(1 + epochs, clock)
        profiled = []
        for n_epochs in (1, 1 + epochs):
            with profile(activities=activities) as prof:
                run(n_epochs)
            profiled.append(prof)
    short, long = (op_times(p, cuda) for p in profiled)
    per = {op: ((t - short.get(op, (0.0, 0))[0]) / epochs, (n - short.get(op, (0.0, 0))[1]) / epochs)
           for op, (t, n) in long.items()}
    gemm = sum(t for op, (t, _) in per.items() if op in GEMM_OPS)
    adam = sum(t for op, (t, _) in per.items() if op in ADAM_OPS)
    other = sum(t for op, (t, _) in per.items() if op not in GEMM_OPS | ADAM_OPS)
    epoch = clock.busy_time() / epochs
    widths = widths_of(inst.x_train.shape[1], cfg)
    params = chunk * parameter_counts(widths)[1]
    adam_gb = 7 * 4 * params / 1e9
    return {"per_op": {op: (1e3 * t, n) for op, (t, n) in per.items()},
            "epochs": epochs, "gemm_ms": 1e3 * gemm, "adam_ms": 1e3 * adam, "other_ms": 1e3 * other,
            "epoch_ms": 1e3 * epoch, "outside_ms": 1e3 * (epoch - gemm - adam - other),
            "ops_per_epoch": sum(n for _, n in per.values()), "adam_gb": adam_gb,
            "adam_gbs": adam_gb / adam if adam > 0 else float("nan"),
            "copy_gbs": copy_bandwidth(cfg.device),
            "fraction_bound_gemm_adam": gemm / (gemm + adam) if gemm + adam > 0 else float("nan"),
            "table": profiled[1].key_averages().table(
                sort_by="self_device_time_total" if cuda else "self_cpu_time_total", row_limit=15)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int_or_auto, default=None,
                   help="concurrent chunks, or auto (default: the cores on the CPU, auto on CUDA)")
    p.add_argument("--backend", default=TrainConfig.backend, help="engine backend (TrainConfig.backend)")
    p.add_argument("--epochs", type=int, default=300, help="epochs of the 120-member comparison")
    p.add_argument("--loop-members", type=int, default=MEMBERS, help="members trained by the loop (time scaled)")
    p.add_argument("--cell-epochs", type=int, default=10, help="epochs timed for the 6,000-network cell")
    p.add_argument("--chunk", type=int_or_auto, default=None,
                   help=f"networks per chunk, or auto (default: {TrainConfig.chunk_networks} on the CPU, auto on CUDA)")
    p.add_argument("--max-memory", type=float, default=None,
                   help=f"GiB for the networks trained at once, shared by concurrent chunks (default "
                   f"{TrainConfig.max_memory / 2**30:.3g} on the CPU, half the device's memory on CUDA); "
                   "bounds the chunks auto tries")
    p.add_argument("--compare-chunk", type=int, default=64,
                   help="the fixed chunk timed beside the cell's plan when that differs from it (default 64)")
    p.add_argument("--repeats", type=int, default=3, help="cell and roofline timings, interleaved (best kept)")
    p.add_argument("--tf32", action="store_true", help="allow TF32 matmuls on CUDA")
    p.add_argument("--explore", action="store_true", help="also time the variants (backend, chunk, op level)")
    p.add_argument("--no-profile", action="store_true", help="skip the profile of one chunk's training")
    p.add_argument("--profile-epochs", type=int, default=20,
                   help="epochs of the profile's longer run (its time per epoch is the difference to one epoch)")
    p.add_argument("--triton", action="store_true",
                   help="on CUDA, also time the cell with backend triton, interleaved with the others")
    p.add_argument("--triton-warps", type=lambda v: tuple(int(w) for w in v.split(",")), default=TRITON_WARPS,
                   help="warps per program at which --triton times the kernel, comma-separated (default "
                   + ",".join(map(str, TRITON_WARPS)) + ")")
    p.add_argument("--triton-precisions", type=lambda v: tuple(v.split(",")), default=("ieee",),
                   help="the products' input_precision at which --triton times the kernel (default ieee, the "
                   "backend's exact float32; tf32x3: three TF32 tensor-core products, timed, not taken)")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="on CUDA, also time the cell with cuda_graphs=True (epochs replayed as one graph), "
                   "interleaved with the eager step")
    a = p.parse_args(argv)
    if a.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
    # the paper-e1 cell: its task at its first complexity, its repetitions x members
    e1 = PRESETS.lookup("paper-e1").config
    given = {"chunk_networks": a.chunk, "parallel_chunks": a.threads}
    if a.max_memory is not None:
        given["max_memory"] = a.max_memory * 2**30
    given = {k: v for k, v in given.items() if v is not None}
    cfg = cuda_plan_defaults(replace(e1.train, device=a.device, backend=a.backend, **given), given)
    inst = get_task(e1.task).instance(e1.complexities[0], seed=0)
    ens = get_method("ens")
    y1 = inst.targets([0])
    t = time.perf_counter()
    plan1 = make_plan(ens.job(inst, y1, [0], cfg, epochs=1))  # an auto plan is measured (or read) here
    print(f"device={a.device} torch={torch.__version__} backend={cfg.backend} chunk={cfg.chunk_networks} "
          f"parallel_chunks={cfg.parallel_chunks} plan: chunk {plan1.chunk}, workers {plan1.workers} "
          f"({plan1.source}, {time.perf_counter() - t:.1f} s) torch threads={torch.get_num_threads()} "
          f"load average={_load()}")

    # warm-up (imports, allocator, vmap tracing) and the vmap peer's equality with the loop peer
    time_training(ens.job(inst, y1, [0], replace(cfg, members=8), epochs=3))
    diff = check_vmap_peer(inst, cfg)
    print(f"vmap peer vs loop peer, float64, 3 members x 5 epochs: max relative parameter difference {diff:.1e}")
    if diff > 1e-9:
        raise RuntimeError("the vmap peer does not train the loop's networks")

    # 1. 120-member ensemble: engine vs loop vs vmap
    t_engine, _ = time_training(ens.job(inst, y1, [0], replace(cfg, members=MEMBERS), epochs=a.epochs))
    t_loop, th_loop = best_threads(lambda: train_ensemble_loop(inst.x_train, y1[0], a.loop_members, cfg, a.epochs))
    t_loop *= MEMBERS / a.loop_members
    t_vmap, th_vmap = best_threads(lambda: train_ensemble_vmap(inst.x_train, y1[0], MEMBERS, cfg, a.epochs))
    speedup, speedup_vmap = t_loop / t_engine, t_vmap / t_engine
    print(f"\n[1] {MEMBERS}-member ensemble, sinusoid f_main=1, N=50, {a.epochs} epochs (initialisation included)")
    print(f"    engine ({cfg.backend:8s})  : {t_engine:8.2f} s")
    print(f"    per-network loop    : {t_loop:8.2f} s  speedup {speedup:6.1f} x  ({th_loop} torch threads"
          + (f", timed {a.loop_members} members, scaled)" if a.loop_members != MEMBERS else ")"))
    print(f"    vmap peer (1 Adam)  : {t_vmap:8.2f} s  speedup {speedup_vmap:6.2f} x  ({th_vmap} torch threads)")

    # 2. the paper-e1 cell: 50 repetitions x 120 members = 6000 networks
    reps = e1.repetitions
    y = inst.targets(np.arange(reps))
    job = ens.job(inst, y, np.arange(reps), cfg, epochs=a.cell_epochs)
    plan = make_plan(job)
    flops = train_flops(inst.x_train.shape[0], 1, cfg) * len(job.nets)
    peak = matmul_peak(a.device, plan.workers)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if _cuda(a.device):
        torch.cuda.reset_peak_memory_stats()
    fixed = replace(cfg, chunk_networks=a.compare_chunk, parallel_chunks=None)
    fixed_job = ens.job(inst, y, np.arange(reps), fixed, epochs=a.cell_epochs)
    compare = (plan.chunk, plan.workers) != (make_plan(fixed_job).chunk, make_plan(fixed_job).workers)
    graphs = a.cuda_graphs and _cuda(a.device)
    graph_job = ens.job(inst, y, np.arange(reps), replace(cfg, cuda_graphs=True), epochs=a.cell_epochs) \
        if graphs else None
    triton_diff, triton_failed = {}, []
    if a.triton and _cuda(a.device):
        triton_job = ens.job(inst, y, np.arange(reps), replace(cfg, backend="triton", cuda_graphs=graphs),
                             epochs=a.cell_epochs)
        triton_diff, triton_failed = check_triton_variants(inst, y, cfg, a.triton_precisions)
    step_triton = dict.fromkeys(((prec, w) for prec in triton_diff if prec not in triton_failed
                                 for w in a.triton_warps), float("inf"))
    step, roof, step64, roof64, step_graphs = (float("inf"),) * 5
    for _ in range(a.repeats):  # interleaved, best of each: the machine is shared
        step = min(step, time_training(job)[1])
        if graphs:
            step_graphs = min(step_graphs, time_training(graph_job)[1])
        for variant in step_triton:
            with triton_variant(*variant):
                step_triton[variant] = min(step_triton[variant], time_training(triton_job)[1])
        roof = min(roof, time_roofline(job))
        if compare:
            step64 = min(step64, time_training(fixed_job)[1])
            roof64 = min(roof64, time_roofline(fixed_job))
    peak = max(peak, matmul_peak(a.device, plan.workers))
    achieved = flops / step / 1e9
    frac_peak, frac_roof = achieved / peak, roof / step
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"\n[2] the paper-e1 cell: {reps} x {MEMBERS} = {len(job.nets)} networks, {plan.n_chunks} chunks of "
          f"{plan.chunk}, {plan.workers} workers ({plan.source} plan), epochs 2..{a.cell_epochs} timed, "
          f"best of {a.repeats}")
    print(f"    step time per epoch   : {step:8.4f} s   ({achieved:6.1f} GFLOP/s)")
    print(f"    GEMM roofline / epoch : {roof:8.4f} s   ({flops / roof / 1e9:6.1f} GFLOP/s counted over the roofline)")
    print(f"    fraction of roofline  : {frac_roof:8.3f}")
    if compare:
        p64 = make_plan(fixed_job)
        print(f"    beside it, {p64.n_chunks} chunks of {p64.chunk}, {p64.workers} workers (fixed): step "
              f"{step64:8.4f} s ({flops / step64 / 1e9:6.1f} GFLOP/s), roofline {roof64:8.4f} s, fraction "
              f"{roof64 / step64:6.3f}; the plan's step is {step64 / step:5.2f} x faster")
    if graphs:
        print(f"    with CUDA graphs      : {step_graphs:8.4f} s   ({flops / step_graphs / 1e9:6.1f} GFLOP/s), fraction "
              f"of roofline {roof / step_graphs:6.3f}; {step / step_graphs:5.2f} x the eager step")
    elif a.cuda_graphs:
        print("    with CUDA graphs      : not timed (not a CUDA device)")
    triton_fields = report_triton(step_triton, step, roof, flops, triton_diff, triton_failed)
    if a.triton and not _cuda(a.device):
        print("    backend triton        : not timed (not a CUDA device)")
    print(f"    matmul peak           : {peak:8.1f} GFLOP/s (4096^2 on one thread x {plan.workers} workers, best of "
          "before/after)")
    print(f"    fraction of peak      : {frac_peak:8.3f}")
    print(f"    peak RSS              : {rss / 1024:8.0f} MiB (before the cell {rss0 / 1024:.0f} MiB)")
    if _cuda(a.device):
        print(f"    peak CUDA memory      : {torch.cuda.max_memory_allocated() / 2**20:8.0f} MiB")

    if a.explore:
        print("\n[3] variants (same cell; step time per epoch, GFLOP/s, fraction of that variant's own roofline)")
        variants = [("autograd backend", replace(cfg, backend="autograd"))]
        variants += [(f"chunk={c}", replace(cfg, chunk_networks=c)) for c in (16, 32, 128, 256) if c != cfg.chunk_networks]
        for label, c in variants:
            vjob = ens.job(inst, y, np.arange(reps), c, epochs=a.cell_epochs)
            s = min(time_training(vjob)[1] for _ in range(2))
            r = min(time_roofline(vjob) for _ in range(2))
            print(f"    {label:18s}: {s:8.4f} s {flops / s / 1e9:7.1f} GFLOP/s  roofline {r:8.4f} s  fraction {r / s:6.3f}")

    l2 = l2_of(cfg, inst.x_train.shape[0])[0] or 1e-4
    with single_threaded():
        ops = op_variants(plan.chunk, inst.x_train.shape[0], widths_of(1, cfg), a.device, l2)
    print(f"\n[3b] op level, a chunk of {plan.chunk} on {a.device}, one thread (µs per network: kept / other)")
    for key, what, kept, other in ops:
        print(f"      {what}: {kept:7.3f} / {other:7.3f}")
    print("DETAIL " + " ".join(f"op_{key}_kept_vs_other={kept / other:.3f}" for key, _, kept, other in ops))

    prof = None
    if not a.no_profile:
        prof = step_profile(ens, inst, y1, cfg, plan.chunk, a.profile_epochs)
        print(f"\n[4] profile: one {plan.chunk}-network chunk, one thread (eager; initialisation included)")
        print(prof.pop("table"))
        prof.pop("per_op")
        print(f"    one epoch, by difference of {prof['epochs']} profiled epochs: GEMMs (bmm, baddbmm) "
              f"{prof['gemm_ms']:.3f} ms, fused Adam {prof['adam_ms']:.3f} ms, the other ops "
              f"{prof['other_ms']:.3f} ms, outside the ops {prof['outside_ms']:.3f} ms "
              f"({'the device idle between kernels' if _cuda(a.device) else 'Python and dispatch'}) "
              f"of {prof['epoch_ms']:.3f} ms timed without the profiler; {prof['ops_per_epoch']:.0f} "
              + ("ops that launched kernels" if _cuda(a.device) else "ATen calls (views and internal calls "
                 "included)") + " per epoch")
        print(f"    fused Adam moves {prof['adam_gb']:.3f} GB per epoch (7 streams of the flat buffer): "
              f"{prof['adam_gbs']:.0f} GB/s, where a copy of {COPY_BYTES >> 20} MiB runs at "
              f"{prof['copy_gbs']:.0f} GB/s")
        print(f"    with every op but the GEMMs and Adam free, the fraction would be "
              f"{prof['fraction_bound_gemm_adam']:.3f} (GEMMs / (GEMMs + Adam))")
        if frac_roof < 0.9 or speedup_vmap < 1.5:
            print("    targets (>= 0.90 of the GEMM roofline, >= 1.5x the vmap peer) not both reached;\n"
                  "    see the README's performance section.")
        print("DETAIL " + " ".join(f"profile_{k}={v:.4g}" for k, v in prof.items()))

    print(f"\nload average at the end: {_load()}")
    print(f"\nRESULT speedup_vs_loop={speedup:.1f} speedup_vs_vmap={speedup_vmap:.2f} "
          f"fraction_of_gemm_roofline={frac_roof:.3f} fraction_of_matmul_peak={frac_peak:.3f} "
          f"plan_chunk={plan.chunk} plan_workers={plan.workers} cell_gflops={achieved:.1f}"
          + (f" fraction_of_gemm_roofline_chunk{a.compare_chunk}={roof64 / step64:.3f} "
             f"cell_gflops_chunk{a.compare_chunk}={flops / step64 / 1e9:.1f} "
             f"plan_vs_chunk{a.compare_chunk}={step64 / step:.2f}" if compare else "")
          + (f" fraction_of_gemm_roofline_graphs={roof / step_graphs:.3f} graphs_vs_eager={step / step_graphs:.2f}"
             if graphs else "")
          + triton_fields
          + (f" fraction_bound_gemm_adam={prof['fraction_bound_gemm_adam']:.3f}" if prof else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
