"""The fused training path (:mod:`uqreg.engine.fused`) computes what autograd computes.

In float64, on random parameters (log α also outside its clipping range, learned dropout rates
away from their start, non-zero biases) and σ ≠ 1: the hand-written gradients of every head equal
autograd's gradients of the autograd path's own objective (:func:`uqreg.engine.objective`, with
and without FGSM, plus the recipe's coupled L2), the FGSM input gradient equals autograd's, and
one fused Adam step equals the step of the autograd path's optimiser
(:func:`uqreg.engine.train.make_optimizer`) for every recipe. Then end to end: both backends of
:func:`uqreg.engine.train_batched` train the same networks for every method and recipe, and in
float32 a network trained by the fused path is bit for bit the same whatever chunk it is in.
(``test_engine.py`` proves the engine, fused by default, against the plain per-network loop.)
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from uqreg import rng
from uqreg.engine import (
    HEADS,
    RECIPES,
    BatchedMLP,
    NetworkBatch,
    TrainConfig,
    fused,
    objective,
    train_batched,
)
from uqreg.engine.fused import FUSED_HEADS, Workspace, l2_of, supports
from uqreg.engine.train import make_optimizer
from uqreg.methods import METHODS
from uqreg.tasks import get_task

SEED = 5
SIGMA = 0.7
N_TRAIN = 9
TRAINED = [name for name, m in METHODS.items() if m.closed_form is None]


def _cfg(**kw) -> TrainConfig:
    return TrainConfig(**{"dtype": "float64", "hidden": (6, 5, 4), "members": 2, "mc_samples": 3, **kw})


def _model(head: str, d: int, cfg: TrainConfig, b: int = 3) -> BatchedMLP:
    """``b`` networks with every parameter moved off its initial value (biases non-zero, rates
    learned, some log α beyond the clipping range on both sides)."""
    keys = rng.network_keys(SEED, "init", np.arange(b), np.zeros(b, dtype=np.int64))
    drop = rng.network_keys(SEED, "dropout", np.arange(b), np.zeros(b, dtype=np.int64))
    model = BatchedMLP(keys, drop, d, head, cfg, N_TRAIN, SIGMA)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
        if "log_alpha" in model.head_params:
            la = model.head_params["log_alpha"]
            la[:, :, 0], la[:, :, 1] = 9.0, -9.5
    return model


def _batch(d: int, b: int = 3):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(b, N_TRAIN, d, generator=gen, dtype=torch.float64)
    y = torch.randn(b, N_TRAIN, generator=gen, dtype=torch.float64)
    return x, y


def _fused_grads(model: BatchedMLP, x, y, counter: int, fgsm_step) -> Workspace:
    l2, decoupled = l2_of(model.cfg, N_TRAIN)
    ws = Workspace(model, x.shape[1], l2=l2, decoupled=decoupled)
    ws.load(model)
    ws.gradients(x, y, counter, model.dropout_keys, fgsm_step)
    return ws


def _assert_close(actual, expected, what):
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12 * float(expected.abs().max()) + 1e-300,
                               msg=lambda m: f"{what}: {m}")


def test_every_head_has_a_fused_backward():
    missing = set(HEADS) - set(FUSED_HEADS)
    assert not missing, f"heads {sorted(missing)} would train on the slower autograd path: add a FusedHead"
    assert set(FUSED_HEADS) == set(HEADS)
    assert all(supports(name, TrainConfig()) for name in HEADS)
    assert not supports("deterministic", TrainConfig(negative_slope=-0.1))


@pytest.mark.parametrize("d", [1, 2])
@pytest.mark.parametrize("fgsm", [False, True], ids=["plain", "fgsm"])
@pytest.mark.parametrize("recipe", ["paper", "sum", "decoupled", "none"])
@pytest.mark.parametrize("head", sorted(HEADS))
def test_gradients_equal_autograd(head, recipe, fgsm, d):
    """Every parameter's gradient of the objective (+ the coupled L2 term λ·W) and, under FGSM,
    the input gradient of the first pass."""
    cfg = _cfg(recipe=recipe)
    model = _model(head, d, cfg)
    x, y = _batch(d)
    counter = 4
    fgsm_step = torch.tensor([0.05, 0.2][:d], dtype=torch.float64) if fgsm else None
    params = list(model.parameters())
    expected = torch.autograd.grad(objective(model, x, y, counter, fgsm_step=fgsm_step).sum(), params)
    l2, decoupled = l2_of(cfg, N_TRAIN)
    n_layers = len(model.weights)
    ws = _fused_grads(model, x, y, counter, fgsm_step)
    actual = ws.gW + ws.gb + list(ws.ghp.values())
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        if i < n_layers and not decoupled:
            e = e + l2 * params[i].detach()  # the coupled recipes put λ·W into the gradient
        _assert_close(a, e, f"{head} parameter {i}")
    if fgsm:
        xr = x.clone().requires_grad_(True)
        loss = 0.5 * (model(xr, counter) - y).pow(2).mean(dim=1)
        (gx,) = torch.autograd.grad(loss.sum(), xr)
        _assert_close(ws.dx, gx, f"{head} input gradient")


def test_gradients_without_hidden_layers():
    """hidden=() (a linear model: the analytic L2 test's network) with FGSM."""
    cfg = _cfg(hidden=())
    for head in HEADS:
        model = _model(head, 2, cfg)
        x, y = _batch(2)
        step = torch.tensor([0.1, 0.3], dtype=torch.float64)
        expected = torch.autograd.grad(objective(model, x, y, 1, fgsm_step=step).sum(), list(model.parameters()))
        ws = _fused_grads(model, x, y, 1, step)
        for i, (a, e) in enumerate(zip(ws.gW + ws.gb + list(ws.ghp.values()), expected)):
            _assert_close(a, e + (cfg.recipe_spec.weight_decay(N_TRAIN) * model.weights[0].detach() if i == 0 else 0),
                          f"{head} parameter {i}")


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_adam_steps_equal_torch_optimiser(recipe):
    """Three fused Adam steps (one ``_fused_adam_`` call over the flat buffer each) equal the
    autograd path's optimiser (Adam, or AdamW for a decoupled recipe; its foreach and fused
    implementations) given the same gradients."""
    for impl in ("foreach", "fused"):
        cfg = _cfg(recipe=recipe, adam=impl, lr=0.05)
        model = _model("concrete", 2, cfg)
        reference = _model("concrete", 2, cfg)
        opt = make_optimizer(reference, cfg, N_TRAIN)
        l2, decoupled = l2_of(cfg, N_TRAIN)
        ws = Workspace(model, 4, l2=l2, decoupled=decoupled)
        ws.load(model)
        gen = torch.Generator().manual_seed(3)
        for _ in range(3):
            for mine, theirs in zip(ws.gW + ws.gb + list(ws.ghp.values()), reference.parameters()):
                g = torch.randn(theirs.shape, generator=gen, dtype=torch.float64)
                theirs.grad = g.clone()
                mine.copy_(g)
            for mine, w in zip(ws.gW, ws.W):  # what Workspace.gradients adds for a coupled recipe
                if not decoupled:
                    mine.add_(w, alpha=l2)
            opt.step()
            ws.adam(cfg.lr, cfg.betas)
        ws.store(model)
        for i, (a, e) in enumerate(zip(model.parameters(), reference.parameters())):
            _assert_close(a.detach(), e.detach(), f"{recipe} ({impl}) parameter {i}")
        moved = [(a.detach() - b.detach()).abs().max() for a, b in zip(model.parameters(), _model("concrete", 2, cfg).parameters())]
        assert min(moved) > 1e-3


# ---------------------------------------------------------------------------------------------
# end to end: the backends of train_batched, and chunk independence


@pytest.fixture(scope="module")
def instance():
    return get_task("sinusoid").instance(1, SEED, n_train=12)


def _train(method, instance, nets, cfg, epochs=6):
    cfg = replace(cfg, **method.overrides)
    y = instance.targets(range(int(nets.repetition.max()) + 1))
    return train_batched(instance.x_train, y, nets, seed=instance.seed, head=method.head, sampler=method.sampler,
                         adversarial=method.adversarial, cfg=cfg, epochs=epochs, sigma=instance.sigma)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("name", TRAINED)
def test_backends_train_the_same_networks(name, recipe, instance):
    method = METHODS[name]
    cfg = _cfg(recipe=recipe)
    nets = method.networks([0, 2], cfg)
    fused = _train(method, instance, nets, replace(cfg, backend="fused"))
    autograd = _train(method, instance, nets, replace(cfg, backend="autograd"))
    for i in range(len(nets)):
        for j, (a, e) in enumerate(zip(fused.network_parameters(i), autograd.network_parameters(i))):
            what = f"{name}/{recipe} network {i} parameter {j}"
            torch.testing.assert_close(a, e, rtol=1e-9, atol=1e-9 * float(e.abs().max()),
                                       msg=lambda m, what=what: f"{what}: {m}")


@pytest.mark.parametrize("name", TRAINED)
def test_network_bitwise_independent_of_its_chunk(name, instance):
    """float32: a network trains to the same bits alone, first in a chunk of 2, or inside a
    chunk of 40 (where elementwise kernels run their vectorised body; with one or two networks
    only their scalar tail): the flat buffer's padding keeps parameters out of the tails, and
    no op that rounds differently in the two is used."""
    method = METHODS[name]
    cfg = TrainConfig(hidden=(16, 12, 8), members=3)
    big = NetworkBatch(np.repeat(np.arange(10), 4), np.tile(np.arange(4), 10))
    alone = NetworkBatch(np.array([0]), np.array([2]))
    first = NetworkBatch(np.array([0, 9]), np.array([2, 3]))
    m_big, m_alone, m_first = (_train(method, instance, nets, cfg, epochs=15) for nets in (big, alone, first))
    for a, b, c in zip(m_big.network_parameters(2), m_alone.network_parameters(0), m_first.network_parameters(0)):
        assert torch.equal(a, b) and torch.equal(a, c), name
    assert not torch.equal(m_big.network_parameters(0)[0], m_big.network_parameters(1)[0])


# ---------------------------------------------------------------------------------------------
# CUDA graphs: epochs counted by a device tensor (what a captured graph replays)


def _workspace(method, instance, cfg, nets):
    """A loaded workspace and the arguments of :func:`~uqreg.engine.fused.run_epoch`, set up
    as :func:`~uqreg.engine.train_batched` sets them up."""
    cfg = replace(cfg, **method.overrides)
    y = torch.as_tensor(instance.targets(range(int(nets.repetition.max()) + 1))[nets.repetition], dtype=cfg.torch_dtype)
    keys = {p: rng.network_keys(instance.seed, p, nets.repetition, nets.member) for p in ("init", "dropout", "bootstrap")}
    n, d = instance.x_train.shape
    model = BatchedMLP(keys["init"], keys["dropout"], d, method.head, cfg, n, instance.sigma)
    x = torch.as_tensor(instance.x_train, dtype=cfg.torch_dtype)[None].expand(len(nets), n, d).contiguous()
    fgsm = (torch.as_tensor(cfg.adversarial_epsilon * np.ptp(instance.x_train, axis=0), dtype=cfg.torch_dtype)
            if method.adversarial else None)
    smp = fused.SAMPLERS.lookup(method.sampler)
    l2, decoupled = l2_of(cfg, n)
    ws = Workspace(model, smp.rows(n, cfg), l2=l2, decoupled=decoupled)
    ws.load(model)
    return ws, {"smp": smp, "x": x, "y": y, "keys": keys["dropout"], "boot_keys": keys["bootstrap"],
                "fgsm_step": fgsm}


@pytest.mark.parametrize("name", [n for n in TRAINED if supports(METHODS[n].head, TrainConfig())])
def test_epochs_counted_by_a_device_tensor_train_the_same_bits(name, instance):
    """The body a CUDA graph captures (:func:`~uqreg.engine.fused.train_graphed`): epochs whose
    counter is a 0-d int64 tensor the body increments draw the numbers int epochs draw (dropout
    masks, concrete and variational noise, bootstrap rows, FGSM's second pass), so float32
    training gives the same bits. On the CPU, where the graph itself cannot run."""
    method = METHODS[name]
    cfg = TrainConfig(hidden=(16, 12, 8), members=3)
    nets = method.networks([0, 3], cfg)
    by_int, args = _workspace(method, instance, cfg, nets)
    for e in range(7):
        fused.run_epoch(by_int, epoch=e, **args)
    by_tensor, args = _workspace(method, instance, cfg, nets)
    counter = torch.zeros((), dtype=torch.int64)
    for _ in range(7):
        fused.run_epoch(by_tensor, epoch=counter, **args)
        counter.add_(1)
    assert torch.equal(by_int.params, by_tensor.params), name
    assert torch.equal(by_int.exp_avg_sq, by_tensor.exp_avg_sq), name


@pytest.mark.parametrize("counter", [0, 1, 6, 12_345, 2**40 + 3, 2**62 - 1])
def test_a_tensor_counter_draws_the_numbers_of_the_int(counter):
    """``counter·multiplier`` overflows 64 bits for all but the smallest counters: the int path
    reduces it modulo 2**64, the tensor path wraps in int64 arithmetic, to the same bits."""
    keys = rng.network_keys(SEED, "dropout", np.arange(3), np.zeros(3, dtype=np.int64))
    tensor = torch.tensor(counter, dtype=torch.int64)
    assert torch.equal(rng.uniform(keys, counter, (4, 5)), rng.uniform(keys, tensor, (4, 5)))
    assert torch.equal(rng.normal(keys, counter, (6,)), rng.normal(keys, tensor, (6,)))


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("name", ["bd", "cd", "vd", "ens_adv", "ens_bs"])
def test_cuda_graphs_train_the_bits_of_eager_epochs(name, instance):
    """``cuda_graphs=True`` (epoch 0 eager, the others replays of one captured graph) trains
    the networks eager CUDA epochs train, bit for bit, and they moved in training."""
    method = METHODS[name]
    cfg = TrainConfig(hidden=(16, 12, 8), members=3, device="cuda")
    nets = method.networks(list(range(5)), cfg)
    eager = _train(method, instance, nets, cfg, epochs=9)
    graphed = _train(method, instance, nets, replace(cfg, cuda_graphs=True), epochs=9)
    start = _train(method, instance, nets, cfg, epochs=1)
    for i in range(len(nets)):
        for a, b, c in zip(eager.network_parameters(i), graphed.network_parameters(i), start.network_parameters(i)):
            assert torch.equal(a, b), name
            assert not torch.equal(a, c), name


@needs_cuda
@pytest.mark.cuda
def test_cuda_graphs_of_concurrent_chunks_give_the_bits_of_one_chunk_after_another(instance):
    """Chunks on CUDA streams, each in its own thread, capture their graphs one at a time
    (thread-local capture) and train the bits of eager chunks run one after another."""
    from uqreg.methods import get_method

    cfg = TrainConfig(hidden=(16, 12, 8), members=3, mc_samples=6, device="cuda", chunk_networks=4,
                      parallel_chunks=1)
    reps = list(range(11))
    y = instance.targets(reps)
    one = get_method("vd").run(instance, y, reps, cfg, epochs=7)
    many = get_method("vd").run(instance, y, reps, replace(cfg, parallel_chunks=3, cuda_graphs=True), epochs=7)
    for v in ("prediction", "uncertainty", "train_loss"):
        assert np.array_equal(getattr(one, v), getattr(many, v), equal_nan=True), v
