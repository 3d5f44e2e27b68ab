"""Backend ``"triton"``: a whole training step of the ensembles' networks as one Triton kernel
(:mod:`uqreg.engine.triton_step`).

The kernel is checked where it runs: on CUDA, or on the CPU under Triton's interpreter
(``TRITON_INTERPRET=1``, set by ``tox -e uqreg-triton`` before anything imports Triton). Its
float32 step is compared with the fused backend's ops, each against the same step in float64:
the kernel's error may be of the fused ops' order, never more (it computes the same sums in
another order). Where the kernel does not cover a step, the backend runs the fused ops, bit for
bit.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from uqreg.engine import TrainConfig, train_batched
from uqreg.engine.fused import Workspace, l2_of, use_kernel
from uqreg.engine.network import BatchedMLP, NetworkBatch
from uqreg.engine.samplers import SAMPLERS
from uqreg.methods import METHODS
from uqreg.tasks import get_task

HAVE_TRITON = importlib.util.find_spec("triton") is not None


def _kernel_device() -> str | None:
    """Where the kernel runs in this process: CUDA, the CPU under the interpreter, or nowhere."""
    if not HAVE_TRITON:
        return None
    from uqreg.engine.triton_step import interpreting

    return "cuda" if torch.cuda.is_available() and not interpreting() else "cpu" if interpreting() else None


DEVICE = _kernel_device()
needs_kernel = pytest.mark.skipif(
    DEVICE is None, reason="the Triton kernel needs triton and CUDA, or Triton's interpreter on the CPU "
    "(tox -e uqreg-triton runs these tests with TRITON_INTERPRET=1)")
SEED = 20240607
HIDDEN = (24, 16, 8)  # three hidden layers; widths padded to 32, 16, 16 in the kernel


def _model(cfg: TrainConfig, b: int, n: int, d: int, head: str = "deterministic", objective: str = "mse"):
    keys = torch.arange(b, dtype=torch.int64) * 7919 + 11
    return BatchedMLP(keys, keys + 1, d, head, cfg, n, 0.1, objective, None).to(cfg.device)


def _workspace(model: BatchedMLP, rows: int) -> Workspace:
    l2, decoupled = l2_of(model.cfg, model.n_train)
    ws = Workspace(model, rows, l2=l2, decoupled=decoupled)
    ws.load(model)
    return ws


def _steps(ws: Workspace, sampler: str, x, y, epochs: int, fgsm_step=None) -> None:
    smp = SAMPLERS.lookup(sampler)
    keys = torch.arange(ws.n_networks, dtype=torch.int64, device=x.device) + 5
    fgsm_step = None if fgsm_step is None else fgsm_step.to(x.dtype)
    for e in range(epochs):
        for xb, yb in smp.batches(x, y, keys, e, ws.cfg):
            ws.train_step(xb, yb, 0, keys, fgsm_step)


# Every pair of values of two of the four factors (the L2 recipe, the input dimension, the
# sampler, FGSM's second pass) in six cases, not all 24 combinations: each factor selects its
# own part of the kernel, and the interpreter takes seconds per case.
PAIRWISE = [("paper", 1, "full", False), ("paper", 2, "bootstrap", True),
            ("decoupled", 1, "bootstrap", False), ("decoupled", 2, "full", True),
            ("none", 1, "full", True), ("none", 2, "bootstrap", False)]


def test_the_cases_cover_every_pair_of_factor_values():
    columns = list(zip(*PAIRWISE))
    for i, j in itertools.combinations(range(4), 2):
        assert {(c[i], c[j]) for c in PAIRWISE} == set(itertools.product(set(columns[i]), set(columns[j])))


@needs_kernel
@pytest.mark.parametrize(("recipe", "d", "sampler", "fgsm"), PAIRWISE)
def test_kernel_step_is_the_fused_step_within_float32_rounding(recipe, d, sampler, fgsm):
    """Six epochs from the same parameters: the kernel's float32 parameters and Adam moments
    differ from the float64 step's by at most 4× what the fused float32 ops' differ, plus 16
    float32 ulps of the largest value (where the fused ops happen to round exactly); with
    FGSM's second pass (ε = 0.05 per input dimension) too."""
    b, n = 3, 20
    cfg = TrainConfig(hidden=HIDDEN, recipe=recipe, device=DEVICE)
    gen = torch.Generator().manual_seed(d)
    x64 = torch.randn(n, d, generator=gen, dtype=torch.float64)[None].expand(b, n, d).to(DEVICE)
    y64 = torch.randn(b, n, generator=gen, dtype=torch.float64).to(DEVICE)
    rows = SAMPLERS.lookup(sampler).rows(n, cfg)
    m32 = _model(cfg, b, n, d)
    m64 = _model(replace(cfg, dtype="float64"), b, n, d)
    with torch.no_grad():
        for p64, p32 in zip(m64.parameters(), m32.parameters()):
            p64.copy_(p32)
    ws64, fused, kernel = _workspace(m64, rows), _workspace(m32, rows), _workspace(m32, rows)
    assert use_kernel(kernel, y64)
    x32, y32 = x64.float(), y64.float()
    eps = torch.full((d,), 0.05, dtype=torch.float64, device=DEVICE) if fgsm else None
    _steps(ws64, sampler, x64, y64, 6, eps)
    _steps(fused, sampler, x32, y32, 6, eps)
    _steps(kernel, sampler, x32, y32, 6, eps)
    assert float(kernel.step) == float(fused.step) == 6 * SAMPLERS.lookup(sampler).steps(cfg)
    for name in ("params", "exp_avg", "exp_avg_sq"):
        ref = _values(ws64, name)
        err_fused = (_values(fused, name).double() - ref).abs().max()
        err_kernel = (_values(kernel, name).double() - ref).abs().max()
        floor = 16 * 2.0**-24 * ref.abs().max()
        assert err_kernel <= 4 * err_fused + floor, f"{name}: kernel {err_kernel:.3g}, fused ops {err_fused:.3g}"
    moved = (_values(kernel, "params").double() - _values(_workspace(m64, rows), "params")).abs().max()
    assert moved > 1e-3  # it trained


def _values(ws: Workspace, name: str) -> torch.Tensor:
    """Every parameter's entry of the flat buffer ``name`` (the layouts of float32 and float64
    differ by their padding)."""
    buf = getattr(ws, name)
    return torch.cat([buf.as_strided(v.shape, v.stride(), v.storage_offset()).flatten() for v in ws._views])


@pytest.fixture(scope="module")
def instance():
    return get_task("sinusoid").instance(1, SEED, n_train=12)


def _train(name: str, instance, nets: NetworkBatch, cfg: TrainConfig, epochs: int = 5) -> BatchedMLP:
    method = METHODS[name]
    cfg = replace(cfg, **method.overrides)
    y = instance.targets(range(int(nets.repetition.max()) + 1))
    return train_batched(instance.x_train, y, nets, seed=instance.seed, head=method.head, sampler=method.sampler,
                         adversarial=method.adversarial, cfg=cfg, epochs=epochs, sigma=instance.sigma)


def _bits(model: BatchedMLP, i: int) -> list[torch.Tensor]:
    return [p.detach().cpu() for p in model.network_parameters(i)]


@needs_kernel
@pytest.mark.parametrize("name", ["ens", "ens_bs", "ens_adv"])
def test_a_network_trains_to_the_same_bits_in_any_chunk(name, instance):
    """One program per network: a network's bits do not depend on the other networks of its
    chunk, nor on its position there (on CUDA too, unlike the fused ops' batched products)."""
    cfg = TrainConfig(hidden=HIDDEN, members=3, device=DEVICE, backend="triton")
    nets = NetworkBatch(np.array([0, 1, 1, 0]), np.array([2, 0, 1, 0]))
    whole = _train(name, instance, nets, cfg)
    for i in range(len(nets)):
        part = NetworkBatch(nets.repetition[[i, i - 1]], nets.member[[i, i - 1]])
        alone = _train(name, instance, part, cfg)
        for a, e in zip(_bits(alone, 0), _bits(whole, i)):
            assert torch.equal(a, e), f"{name}: network {i} trained in another chunk differs"


@needs_kernel
@pytest.mark.parametrize("name", ["ens", "ens_bs", "ens_adv"])
def test_trained_ensemble_is_the_fused_backends_within_rounding(name, instance):
    """Through ``train_batched``: the trained networks of both backends agree to float32
    rounding grown over the epochs (relative 1e-4 of the largest parameter), and the kernel's
    two runs are bit-identical."""
    cfg = TrainConfig(hidden=HIDDEN, members=3, device=DEVICE)
    nets = METHODS[name].networks([0, 1], cfg)
    fused = _train(name, instance, nets, cfg)
    kernel = _train(name, instance, nets, replace(cfg, backend="triton"))
    again = _train(name, instance, nets, replace(cfg, backend="triton"))
    for i in range(len(nets)):
        for j, (a, e, r) in enumerate(zip(_bits(kernel, i), _bits(fused, i), _bits(again, i))):
            assert torch.equal(a, r), f"network {i} parameter {j}: two runs differ"
            torch.testing.assert_close(a, e, rtol=0, atol=1e-4 * float(e.abs().max()))


@needs_kernel
@pytest.mark.parametrize("name", ["bd", "vd"])
def test_steps_the_kernel_does_not_cover_run_the_fused_ops_bit_for_bit(name, instance):
    cfg = TrainConfig(hidden=HIDDEN, members=2, mc_samples=4, device=DEVICE)
    nets = METHODS[name].networks([0, 1], cfg)
    fused = _train(name, instance, nets, cfg, epochs=3)
    triton = _train(name, instance, nets, replace(cfg, backend="triton"), epochs=3)
    for i in range(len(nets)):
        for a, e in zip(_bits(triton, i), _bits(fused, i)):
            assert torch.equal(a, e)


@needs_kernel
def test_uncovered_names_the_reason():
    from uqreg.engine.triton_step import uncovered

    n, y = 10, torch.zeros(2, 10, device=DEVICE)
    cases = [
        (TrainConfig(hidden=HIDDEN, device=DEVICE), "deterministic", "mse", y, None),
        (TrainConfig(hidden=(16, 16), device=DEVICE), "deterministic", "mse", y, "2 hidden layers"),
        (TrainConfig(hidden=HIDDEN, device=DEVICE, dtype="float64"), "deterministic", "mse", y,
         "dtype torch.float64"),
        (TrainConfig(hidden=HIDDEN, device=DEVICE), "bernoulli", "mse", y, "head 'bernoulli'"),
        (TrainConfig(hidden=HIDDEN, device=DEVICE), "deterministic", "gaussian_nll", y,
         "objective 'gaussian_nll'"),
        (TrainConfig(hidden=HIDDEN, device=DEVICE), "deterministic", "mse", y[..., None].expand(2, n, 2),
         "weighted rows"),
    ]
    for cfg, head, objective, targets, reason in cases:
        ws = _workspace(_model(cfg, 2, n, 1, head, objective), n)
        why = uncovered(ws, targets)
        assert (why is None) if reason is None else (why is not None and reason in why), (reason, why)


def test_backend_triton_says_what_is_missing_on_the_cpu(instance, monkeypatch):
    """Without Triton the error names the extra to install; with it, outside the interpreter, it
    says the kernel runs on CUDA (the CPU has no Triton backend)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    cfg = TrainConfig(hidden=HIDDEN, members=2, backend="triton")
    nets = METHODS["ens"].networks([0], cfg)
    expected = "runs on a CUDA device, not on 'cpu'" if HAVE_TRITON else r"pip install 'uqreg\[triton\]'"
    with pytest.raises(RuntimeError, match=expected):
        _train("ens", instance, nets, cfg, epochs=1)


@needs_kernel
def test_bench_engine_checks_the_kernel_it_times(instance, monkeypatch):
    """``bench_engine.py --triton`` times the kernel only after checking that it trains the
    fused backend's networks; the check measures a difference, and a wrong kernel fails it."""
    from uqmetrics.runs.testing.scripts import load_script

    from uqreg.engine import triton_step

    bench = load_script(Path(__file__).resolve().parents[1] / "benchmarks" / "bench_engine.py")
    monkeypatch.setattr(bench, "TRITON_CHECK", (4, 8))  # networks, epochs: the interpreter is slow
    cfg = TrainConfig(hidden=HIDDEN, device=DEVICE)
    y = instance.targets([0])
    diff = bench.check_triton(instance, y, cfg)
    assert 0 < diff < 1e-4  # float32 rounding grown over the epochs, not the same bits
    make = triton_step.TritonStep.__init__

    def wrong_slope(self, ws, num_warps=None):
        make(self, ws, num_warps)
        self.scalars["slope"] = 0.2  # the kernel's leaky ReLU differs from the fused ops' 0.01

    monkeypatch.setattr(triton_step.TritonStep, "__init__", wrong_slope)
    assert bench.check_triton(instance, y, cfg) > 1e-3
    diffs, failed = bench.check_triton_variants(instance, y, cfg, ("ieee",))
    assert failed == ["ieee"] and diffs["ieee"] > 1e-3  # reported, and then not timed


@pytest.mark.skipif(not HAVE_TRITON, reason="needs triton (tox -e uqreg-triton)")
def test_the_kernel_compiled_for_hopper_keeps_its_products_in_registers():
    """Compiled for sm_90 without a GPU (benchmarks/triton_resources.py): at 8 warps the
    paper network's step spills at most 1 KB per thread. The mechanism: Triton's exact float32
    product holds its operands' whole contracted dimension per thread, so the kernel reads the
    products' operands from memory in slices of ``BLOCK_K``; with 128-wide products in one
    ``tl.dot`` the same step spilled 27 KB per thread."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "triton_resources.py"
    code = ("import json; from uqmetrics.runs.testing.scripts import load_script; "
            f"m = load_script({str(script)!r}); print(json.dumps(m.resources((128, 64, 32), 50, False, 8)))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    used = json.loads(done.stdout.strip().splitlines()[-1])
    assert used["spill_stores"] <= 1024 and 0 < used["registers"] <= 255, used
