"""The batched engine trains exactly the networks a plain per-network loop trains.

Every registered method with a trainable network is trained both ways (``loop_reference`` is
the independent loop: ``nn.Sequential`` + one ``torch.optim.Adam`` per network) in float64,
and every final parameter and every prediction must agree to 1e-8 relative (the two differ
only in floating-point summation order, ~1e-14 after these few epochs). Also: chunking and
the company a network keeps in its batch change nothing, and the counter-based random streams
are uniform / normal and independent across keys and counters.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import execution_check
import loop_reference as loop
import numpy as np
import pytest
import scipy.stats
import torch

from uqreg import rng
from uqreg.engine import (
    HEADS,
    RECIPES,
    Head,
    NetworkBatch,
    TrainConfig,
    predict_batched,
    train_batched,
    xavier_uniform,
)
from uqreg.engine.heads import output_layer
from uqreg.methods import METHODS, Method, register_method
from uqreg.tasks import get_task

SEED = 11
EPOCHS = 15
RTOL = 1e-8
TRAINED = [name for name, m in METHODS.items() if m.closed_form is None]

# An anisotropic 2-D task (input ranges differ by a factor 8, so the per-dimension FGSM step
# matters), small enough that each comparison takes about a second.
ANISO = execution_check.ANISO


@pytest.fixture(scope="module")
def instance():
    return ANISO.instance(1, SEED)


@pytest.fixture(scope="module")
def instance_1d():
    """A 1-D input (the engine may special-case a first layer with fan_in 1)."""
    return get_task("sinusoid").instance(1, SEED, n_train=30)


def _instance(request, dim: int):
    return request.getfixturevalue("instance" if dim == 2 else "instance_1d")


def _cfg(**kw) -> TrainConfig:
    base = {"dtype": "float64", "members": 3, "mc_samples": 6, "hidden": (16, 12, 8), "epochs": EPOCHS}
    return TrainConfig(**{**base, **kw})


def _reps(method) -> list[int]:
    return [0, 3] if method.ensemble else [0, 1, 3]


def _train(method, instance, y_full, nets, cfg) -> torch.nn.Module:
    cfg = replace(cfg, **method.overrides)
    return train_batched(instance.x_train, y_full, nets, seed=instance.seed, head=method.head,
                         sampler=method.sampler, adversarial=method.adversarial, cfg=cfg, epochs=EPOCHS,
                         sigma=instance.sigma)


def _engine_parameters(model, i: int) -> list[torch.Tensor]:
    """Network i's parameters: weights, biases, then the head's (the loop's order)."""
    return model.network_parameters(i)


def _close(actual, expected, what: str) -> None:
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    scale = float(expected.abs().max())
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=RTOL * scale, msg=lambda m: f"{what}: {m}")


CASES = ([(n, "foreach", "paper") for n in TRAINED] + [("cd", "fused", "paper"), ("ens", "fused", "paper")]
         + [("ens", "foreach", r) for r in RECIPES if r != "paper"] + [("vd", "foreach", "decoupled")])


@pytest.mark.parametrize("dim", [2, 1])
@pytest.mark.parametrize("name, adam, recipe", CASES)
def test_batched_parameters_equal_loop(name, adam, recipe, dim, request):
    """Every method, both of the engine's Adam implementations (TrainConfig.adam) and every
    recipe's L2 convention equal one plain Adam per network, on two tasks with different σ."""
    instance = _instance(request, dim)
    method = METHODS[name]
    cfg = _cfg(adam=adam, recipe=recipe)
    mcfg = replace(cfg, **method.overrides)
    reps = _reps(method)
    y_full = instance.targets(range(max(reps) + 1))
    nets = method.networks(reps, mcfg)
    model = _train(method, instance, y_full, nets, cfg)
    assert model.n_networks == len(nets)
    for i, (r, m) in enumerate(zip(nets.repetition, nets.member)):
        net = loop.train_loop(method, instance.x_train, y_full[r], int(r), int(m), seed=SEED, sigma=instance.sigma,
                              cfg=cfg, epochs=EPOCHS)
        expected = net.engine_parameters()
        actual = _engine_parameters(model, i)
        assert len(actual) == len(expected), f"{name}: {len(actual)} parameter tensors, loop has {len(expected)}"
        for j, (a, e) in enumerate(zip(actual, expected)):
            _close(a, e, f"{name} network (rep {r}, member {m}) parameter {j}")
        # the trained networks really moved away from their initialisation
        init = loop.LoopNet(instance.x_train.shape[1], method.head, mcfg,
                            rng.network_keys(SEED, "init", [r], [m])).engine_parameters()
        assert not torch.allclose(actual[0], init[0], rtol=1e-3, atol=0)


@pytest.mark.parametrize("dim", [2, 1])
@pytest.mark.parametrize("name", TRAINED)
def test_method_run_equals_loop(name, dim, request):
    instance = _instance(request, dim)
    method = METHODS[name]
    cfg = _cfg()
    reps = _reps(method)
    y = instance.targets(reps)
    res = method.run(instance, y, reps, cfg, epochs=EPOCHS)
    mean, std = res.prediction, res.uncertainty
    loop_mean, loop_std, loop_loss = loop.run_loop(method, instance, y, reps, cfg, epochs=EPOCHS)
    assert mean.shape == std.shape == (len(reps), instance.x_test.shape[0])
    _close(mean, loop_mean, f"{name} prediction")
    _close(std, loop_std, f"{name} uncertainty")
    assert np.all(np.isfinite(std)) and np.all(std >= 0) and std.mean() > 0
    # the collapse diagnostics of every network (R.3b), recomputed from the loop's networks
    _close(res.train_loss, loop_loss.mean(axis=1), f"{name} train_loss")
    best_constant = 0.5 * y.var(axis=1)
    np.testing.assert_array_equal(res.collapsed_fraction, (loop_loss >= 0.95 * best_constant[:, None]).mean(axis=1))


def test_concrete_and_variational_rates_are_learned(instance):
    """cd/vd start at the configured rate and move it (their head parameters are trained)."""
    cfg = _cfg(epochs=EPOCHS)
    for name, attr, start in (("cd", "p_logit", math.log(0.1 / 0.9)), ("vd", "log_alpha", math.log(0.1 / 0.9))):
        method = METHODS[name]
        nets = method.networks([0, 1], cfg)
        model = _train(method, instance, instance.targets([0, 1]), nets, cfg)
        learned = model.head_params[attr].detach()
        assert learned.shape[0] == 2
        assert torch.all((learned - start).abs() > 1e-6), f"{name}: {attr} did not move"


@pytest.mark.parametrize("dim", [2, 1])
@pytest.mark.parametrize("name", TRAINED)
def test_execution_changes_no_bit(name, dim):
    """In float32 (where training amplifies any change of summation order into a different
    network), one chunk, chunks of 2 and of 1 network, run one after the other or by two
    concurrent threads, give bit-identical predictions: chunk composition and threads do not
    enter a network's arithmetic. (Before: PyTorch's fused Adam and a GEMV output layer made a
    network depend on its chunk, e.g. |Δ| 0.07 for cd between chunks of 40 and 7 networks; then
    the one-row weight gradient of a fan-in-1 first layer, sent to BLAS, made a network alone in
    its chunk differ, e.g. 2,335 of 8,000 bd predictions here with widths 50, 50.)"""
    assert execution_check.mismatches(name, dim) == dict.fromkeys(
        ("chunks of 2", "chunks of 1", "concurrent chunks of 1"), 0)


# The code paths a CPU chooses that can be forced from one machine: ATen's kernels for each
# instruction set, MKL's instruction set and its conditional-numerical-reproducibility branch,
# and the caller's thread count (chunks always run on one thread each).
FORCED = {
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "aten-avx512": {"ATEN_CPU_CAPABILITY": "avx512"},
    "mkl-avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "mkl-cbwr-compatible": {"MKL_CBWR": "COMPATIBLE"},
    "caller-2-threads": {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"},
}


def _cpu_flags() -> set[str]:
    """The CPU's instruction-set flags (Linux's /proc/cpuinfo; all assumed elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"avx2", "avx512f"}
    return {f for line in text.splitlines() if line.startswith("flags")
            for f in line.split(":", 1)[1].split()}


@pytest.mark.slow
@pytest.mark.parametrize("forced", list(FORCED))
def test_execution_changes_no_bit_on_every_forced_cpu_path(forced):
    """The same bit-identity in a fresh interpreter under each forced code path, for every
    trained method (input dimension 1, where BLAS would see one-row products, and 2). A path
    whose instructions this CPU lacks cannot run here (torch then dies of SIGILL): skipped,
    naming the flag; the others still compare."""
    needs = {"aten-avx2": "avx2", "aten-avx512": "avx512f"}.get(forced)
    if needs is not None and needs not in _cpu_flags():
        pytest.skip(f"this CPU has no {needs}: {forced} cannot run here")
    env = {k: v for k, v in os.environ.items() if k not in {k2 for f in FORCED.values() for k2 in f}}
    env.update(FORCED[forced])
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, str(Path(execution_check.__file__)), ",".join(TRAINED), "1,2"],
                         env=env, capture_output=True, text=True, timeout=900, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    if forced.startswith("aten-"):  # the instruction set the kernels ran with (capped by the CPU)
        assert report["cpu_capability"] in {"DEFAULT", "AVX2", "AVX512"}
    bad = {case: counts for case, counts in report["mismatches"].items() if any(counts.values())}
    assert not bad, f"{forced} ({report['cpu_capability']}): differing elements {bad}"


def test_plan_restores_the_callers_threads(instance):
    """Chunks run with one torch thread; the caller's setting is restored afterwards."""
    seen = []
    method = METHODS["ens"]
    cfg = _cfg(members=2, chunk_networks=1, parallel_chunks=2)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        method.run(instance, instance.targets([0]), [0], cfg, epochs=2,
                   progress=lambda n: seen.append(torch.get_num_threads()))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)
    assert seen == [1] * 4


@pytest.mark.parametrize("name", ["cd", "ens_adv"])
def test_network_independent_of_its_batch(name, instance):
    """A network trains to the same parameters alone, in a batch, in any position."""
    method = METHODS[name]
    cfg = _cfg()
    y_full = instance.targets(range(3))
    big = NetworkBatch(np.array([0, 0, 1, 2, 2]), np.array([0, 1, 1, 0, 2]))
    alone = NetworkBatch(np.array([1]), np.array([1]))
    reordered = NetworkBatch(np.array([2, 1]), np.array([0, 1]))
    m_big = _train(method, instance, y_full, big, cfg)
    m_alone = _train(method, instance, y_full, alone, cfg)
    m_re = _train(method, instance, y_full, reordered, cfg)
    for a, b, c in zip(_engine_parameters(m_big, 2), _engine_parameters(m_alone, 0), _engine_parameters(m_re, 1)):
        _close(b, a, f"{name}: alone vs in batch")
        _close(c, a, f"{name}: reordered vs in batch")
    # and networks with different keys differ
    assert not torch.allclose(_engine_parameters(m_big, 0)[0], _engine_parameters(m_big, 1)[0])
    # predictions too
    p_big = predict_batched(m_big, instance.x_test, big, seed=SEED, cfg=cfg)[0][2]
    p_alone = predict_batched(m_alone, instance.x_test, alone, seed=SEED, cfg=cfg)[0][0]
    _close(p_alone, p_big, f"{name}: prediction alone vs in batch")


# ---------------------------------------------------------------------------------------------
# the counter-based random streams

N_DRAWS = 20_000
K_SE = 4.0  # per check: two-sided normal tail 6e-5; a handful of checks per test


def test_uniform_in_unit_interval_and_uniform():
    keys = rng.network_keys(SEED, "dropout", [0, 1, 2], [0, 0, 5])
    u = rng.uniform(keys, 7, (N_DRAWS,), dtype=torch.float64).numpy()
    assert u.shape == (3, N_DRAWS)
    assert u.min() >= 0.0 and u.max() < 1.0
    for row in u:
        # mean 1/2, SE sqrt(1/12 / n); variance 1/12, SE of the sample variance sqrt(Var((U-1/2)^2) / n)
        # with Var((U-1/2)^2) = 1/80 - 1/144 = 1/180
        assert abs(row.mean() - 0.5) < K_SE * math.sqrt(1 / 12 / N_DRAWS)
        assert abs(row.var() - 1 / 12) < K_SE * math.sqrt(1 / 180 / N_DRAWS)
        assert scipy.stats.kstest(row, "uniform").pvalue > 1e-4
    # float32 draws stay below 1 as well
    u32 = rng.uniform(keys, 0, (N_DRAWS,), dtype=torch.float32)
    assert u32.dtype == torch.float32 and float(u32.max()) < 1.0


def test_streams_differ_across_keys_and_counters():
    keys = rng.network_keys(SEED, "dropout", [0, 0, 1], [0, 1, 0])
    assert len(set(keys.tolist())) == 3
    a = rng.uniform(keys, 0, (N_DRAWS,), dtype=torch.float64).numpy()
    b = rng.uniform(keys, 1, (N_DRAWS,), dtype=torch.float64).numpy()
    se = 1 / math.sqrt(N_DRAWS)  # SE of a correlation coefficient between independent streams
    pairs = [(a[0], a[1]), (a[0], a[2]), (a[1], a[2]), (a[0], b[0]), (a[2], b[2])]
    for x, y in pairs:
        assert not np.array_equal(x, y)
        assert abs(np.corrcoef(x, y)[0, 1]) < K_SE * se
    # purposes and seeds key different streams
    assert rng.network_keys(SEED, "init", [0], [0]).item() != rng.network_keys(SEED, "dropout", [0], [0]).item()
    assert rng.network_keys(SEED, "init", [0], [0]).item() != rng.network_keys(SEED + 1, "init", [0], [0]).item()
    with pytest.raises(ValueError, match="purpose"):
        rng.network_keys(SEED, "nope", [0], [0])


def test_stream_of_a_network_does_not_depend_on_the_batch():
    keys = rng.network_keys(SEED, "mc", [0, 1, 2, 3], [0, 1, 2, 3])
    together = rng.uniform(keys, 5, (7, 3), dtype=torch.float64)
    assert together.shape == (4, 7, 3)
    for i in range(4):
        assert torch.equal(rng.uniform(keys[i:i + 1], 5, (7, 3), dtype=torch.float64)[0], together[i])
    # the same call twice is reproducible
    assert torch.equal(rng.uniform(keys, 5, (7, 3), dtype=torch.float64), together)


def _splitmix64_reference(x: int) -> int:
    """SplitMix64's finaliser (Steele, Lea & Flood 2014) on Python integers mod 2**64."""
    m = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_uniform_is_splitmix64_across_blocks(dtype, monkeypatch):
    """Each number is ``splitmix64(splitmix64(key ^ splitmix64(c * M)) + splitmix64(i)) >> 11``
    times 2**-53, however many rows the CPU hashes at a time (here blocks of 2 rows of 5 numbers,
    so that 5 networks take 3 blocks, the last one short)."""
    keys = rng.network_keys(SEED, "mc", [0, 1, 2, 3, 4], [0, 0, 0, 1, 2])
    whole = rng.uniform(keys, 11, (5,), dtype=dtype)
    monkeypatch.setattr(rng, "_CPU_BLOCK", 10)
    blocked = rng.uniform(keys, 11, (5,), dtype=dtype)
    assert torch.equal(blocked, whole)
    m = (1 << 64) - 1
    mixed = _splitmix64_reference((11 * 0x2545F4914F6CDD1D) & m)
    for b, key in enumerate(keys.tolist()):
        base = _splitmix64_reference((key & m) ^ mixed)
        for i in range(5):
            bits = _splitmix64_reference((base + _splitmix64_reference(i)) & m) >> 11
            expected = torch.tensor(bits * 2.0**-53, dtype=torch.float64).to(dtype)
            assert blocked[b, i] == min(expected, torch.tensor(1.0 - torch.finfo(dtype).eps, dtype=dtype))


def test_normal_stream_is_standard_normal():
    keys = rng.network_keys(SEED, "dropout", [4], [2])
    z = rng.normal(keys, 3, (N_DRAWS,), dtype=torch.float64).numpy()[0]
    assert abs(z.mean()) < K_SE / math.sqrt(N_DRAWS)
    assert abs(z.var() - 1.0) < K_SE * math.sqrt(2.0 / N_DRAWS)
    assert scipy.stats.kstest(z, "norm").pvalue > 1e-4


def test_xavier_uniform_is_glorot():
    fan_in, fan_out = 128, 64
    keys = rng.network_keys(SEED, "init", [0, 1], [0, 0])
    w = xavier_uniform(keys, 0, fan_in, fan_out, torch.float64).numpy()
    assert w.shape == (2, fan_in, fan_out)
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    assert np.all(np.abs(w) <= bound)
    n = fan_in * fan_out
    for wi in w:
        # U(-a, a): variance a²/3 = 2/(fan_in + fan_out); Var(U²) = a⁴/5 - a⁴/9 = 4a⁴/45
        assert abs(wi.mean()) < K_SE * bound / math.sqrt(3 * n)
        assert abs(np.mean(wi**2) - bound**2 / 3) < K_SE * math.sqrt(4 * bound**4 / 45 / n)
    assert not np.array_equal(w[0], w[1])
    assert not np.array_equal(w[0], xavier_uniform(keys, 1, fan_in, fan_out, torch.float64).numpy()[0])


# ---------------------------------------------------------------------------------------------
# the peer-style ensemble loop of the benchmark trains the same kind of networks


def test_ensemble_loop_baseline_runs(instance):
    cfg = _cfg(epochs=5)
    y = instance.targets([0])[0]
    models = loop.train_ensemble_loop(instance.x_train, y, 3, cfg, 5, seed=1)
    assert len(models) == 3
    mean, std = loop.predict_ensemble_loop(models, instance.x_test)
    assert mean.shape == std.shape == (instance.x_test.shape[0],)
    assert np.all(np.isfinite(mean)) and np.all(std > 0)
    # it trains: the training loss after 5 epochs is below the one at initialisation
    untrained = loop.train_ensemble_loop(instance.x_train, y, 1, cfg, 0, seed=1)[0]
    trained = loop.train_ensemble_loop(instance.x_train, y, 1, cfg, 5, seed=1)[0]
    x = torch.as_tensor(instance.x_train)
    yt = torch.as_tensor(y)
    with torch.no_grad():
        assert float(((trained(x)[:, 0] - yt) ** 2).mean()) < float(((untrained(x)[:, 0] - yt) ** 2).mean())


# ---------------------------------------------------------------------------------------------
# a new head is added in one place


class _ScaledNoiseHead(Head):
    """A user head: multiplicative uniform noise on the last hidden layer with a learned scale
    per network and an L2 pull of the scale to 0; defined only here."""

    name = "scaled_noise_test"
    description = "test head"
    stochastic = True

    def init_params(self, n_networks, width, cfg, *, dtype, device):
        return {"scale": torch.full((n_networks, 1, 1), 0.3, dtype=dtype, device=device)}

    def draw(self, keys, counter, n, width, *, dtype, device):
        return rng.uniform(keys, counter, (n, width), dtype=dtype, device=device)

    def forward(self, h, weight, bias, noise, params, cfg):
        return output_layer(h * (1.0 + params["scale"] * (noise - 0.5)), weight, bias)

    def regulariser(self, weight, params, *, n_train, sigma, cfg):
        return sigma**2 * params["scale"][:, 0, 0] ** 2 / n_train


@pytest.fixture
def new_head():
    head = HEADS.register(_ScaledNoiseHead())
    method = register_method(Method("scaled_noise_test", "test method", head=head.name))
    yield method
    del METHODS[method.name]
    del HEADS[head.name]


def test_new_head_is_added_in_one_place(new_head, instance):
    """A head registered in one place (its class above) trains in the engine exactly as in the
    plain loop, which calls the same head definition on one network; no table to edit."""
    cfg = _cfg()
    reps = [0, 2]
    y = instance.targets(reps)
    res = new_head.run(instance, y, reps, cfg, epochs=EPOCHS)
    loop_mean, loop_std, loop_loss = loop.run_loop(new_head, instance, y, reps, cfg, epochs=EPOCHS)
    _close(res.prediction, loop_mean, "new head prediction")
    _close(res.uncertainty, loop_std, "new head uncertainty")
    _close(res.train_loss, loop_loss.mean(axis=1), "new head train_loss")
    assert np.all(res.uncertainty > 0)
