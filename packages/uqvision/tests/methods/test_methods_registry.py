"""The training-method registry: every entry trains, snapshots, samples, round-trips and is
deterministic; the schedules are the paper's equations (issue 10, items 2-3 and 6).

The tests iterate :data:`TRAINING_METHODS`, so a new method is covered by registering it and
adding its small configuration to ``SMALL`` (a test fails until it is there).
"""

from __future__ import annotations

import dataclasses
import doctest
import importlib
import io
import json
import math
import pkgutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors
from torch import nn

import uqvision.methods
from uqvision.methods import TRAINING_METHODS, export_state
from uqvision.methods.ensembling import DropoutLinear, ensure_dropout
from uqvision.methods.laplace import kfac_factors
from uqvision.methods.vi import VIConv2d, VILinear, variational_layers
from uqvision.training.schedules import (
    cosine_cycle_lr,
    fge_cycle_position,
    fge_lr,
    linear_decay_lr,
    one_cycle_lr,
)

N_TRAIN, BATCH = 96, 16
SPE = N_TRAIN // BATCH  # 6 steps per epoch

#: per method, a run of a few dozen steps on the blobs below
SMALL = {
    "deep_ensemble": {"epochs": 2},
    "mc_dropout": {"epochs": 2},
    "sse": {"cycles": 3, "cycle_epochs": 1, "lr0": 0.1},
    "fge": {"pretrain_epochs": 1, "cycles": 3, "cycle_epochs": 1},
    "swag": {"pretrain_epochs": 1, "swag_epochs": 3, "collect_epochs": 0.5, "rank": 4},
    "csgld": {"cycles": 2, "cycle_epochs": 2, "noise_epochs": 1.5, "samples_per_cycle": 3,
              "sample_gap_epochs": 0.5, "lr0": 0.1},
    "vi": {"pretrain_epochs": 1, "epochs": 2, "log_sigma_init": -3.0},
    "kfac_laplace": {"epochs": 2, "scales": (0.1, 1.0), "tune_samples": 2},
}
#: the V.2 (Pitfalls) methods: those whose hyper-parameters live in the V.2 modules (V.3's UIMNET
#: algorithms and V.4's learners wrap other models and have their own tests)
V2_MODULES = ("uqvision.training.method", "uqvision.methods.ensembling", "uqvision.methods.swag",
              "uqvision.methods.csgld", "uqvision.methods.vi", "uqvision.methods.laplace")
NAMES = [n for n in TRAINING_METHODS.names()
         if TRAINING_METHODS.lookup(n).hparams.__module__ in V2_MODULES]


def blobs(seed=0, n=N_TRAIN):
    """Three Gaussian classes in 8 dimensions."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    centres = torch.randn(3, 8, generator=g) * 2
    return centres[y] + torch.randn(n, 8, generator=g), y


X, Y = blobs()
X_VAL, Y_VAL = blobs(1, 48)


def make_model():
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def batches(seed, epoch):
    order = torch.randperm(N_TRAIN, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
    return [(X[i], Y[i], i) for i in order.split(BATCH)]


def fit(name, seed=0, **overrides):
    """Train ``name`` as the one training loop does (see uqvision.training.method)."""
    method = TRAINING_METHODS.lookup(name)
    hp = method.hparams_from(**{**SMALL[name], **overrides})
    torch.manual_seed(seed)
    state = method.start(make_model(), hp, n_train=N_TRAIN, steps_per_epoch=SPE, seed=seed)
    epoch = 0
    while not state.done:
        for x, y, _ in batches(seed, epoch):
            method.step(state, x, y)
            if state.done:
                break
        method.end_epoch(state)
        epoch += 1
    method.finish(state, batches(seed, 0), [(X_VAL, Y_VAL)])
    return method, state


def outputs(method, state, k, seed=0):
    with torch.no_grad():
        return [net(X).clone() for net in method.samples(state, k, seed)]


def weights(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- the registry itself -------------------------------------------------------------------
def test_registry_lists_the_pitfalls_methods_and_small_configs_cover_them():
    assert NAMES == ["deep_ensemble", "mc_dropout", "sse", "fge", "swag", "csgld", "vi",
                     "kfac_laplace"]
    assert set(SMALL) == set(NAMES)
    assert all(line.split(": ", 1)[1] for line in TRAINING_METHODS.describe().splitlines())
    with pytest.raises(ValueError, match="unknown training method 'sgd'.*deep_ensemble"):
        TRAINING_METHODS.lookup("sgd")


@pytest.mark.parametrize("name", NAMES)
def test_hyperparameters_are_frozen_recordable_dataclasses(name):
    method = TRAINING_METHODS.lookup(name)
    hp = method.hparams()
    assert dataclasses.is_dataclass(hp) and isinstance(method.paper, method.hparams)
    with pytest.raises(dataclasses.FrozenInstanceError):
        hp.weight_decay = 1.0
    json.dumps(dataclasses.asdict(hp))  # result attrs
    # the paper's run is longer than the stand-in default (epochs / 10), never shorter
    assert method.total_steps(method.paper, 100) > method.total_steps(hp, 100) > 0


def test_hparams_from_parses_set_strings_and_names_bad_input():
    laplace = TRAINING_METHODS.lookup("kfac_laplace")
    hp = laplace.hparams_from(["scales=0.1,1", "tune_samples=3", "bn_update=false",
                               "prior_precision=none", "optimizer=adamw"], epochs=4)
    assert (hp.scales, hp.tune_samples, hp.bn_update, hp.prior_precision, hp.optimizer,
            hp.epochs) == ((0.1, 1.0), 3, False, None, "adamw", 4)
    with pytest.raises(ValueError, match="unknown hyper-parameter 'cycles'.*valid: batch_size"):
        laplace.hparams_from(["cycles=3"])
    with pytest.raises(ValueError, match="tune_samples expects .*'many'"):
        laplace.hparams_from(["tune_samples=many"])
    with pytest.raises(ValueError, match="key=value"):
        laplace.hparams_from(["epochs"])
    with pytest.raises(ValueError, match="unknown optimizer 'lbfgs'; valid optimizers: sgd"):
        laplace.hparams_from(optimizer="lbfgs")
    with pytest.raises(ValueError, match="lr0 must be > 0, got -1"):
        TRAINING_METHODS.lookup("sse").hparams_from(lr0=-1)
    with pytest.raises(TypeError, match="hp must be a SSEHParams"):
        TRAINING_METHODS.lookup("sse").start(make_model(), hp, n_train=1, steps_per_epoch=1)


def test_submodule_doctests():
    names = [m.name for m in pkgutil.iter_modules(uqvision.methods.__path__, "uqvision.methods.")]
    names += [m.name for m in pkgutil.iter_modules(uqvision.training.__path__,
                                                   "uqvision.training.")]
    assert {"uqvision.training.schedules", "uqvision.training.method"} <= set(names)
    for name in names:
        module = importlib.import_module(name)
        assert doctest.testmod(module).failed == 0, name
        assert all(hasattr(module, p) for p in getattr(module, "__all__", []))


# -- schedules: the paper's equations at sample points -------------------------------------
def test_eq10_linear_decay():
    lr, epochs = 0.1, 300
    expected = {0: 0.1, 150: 0.1, 180: 0.1 * (1 - 0.99 * 0.1 / 0.4), 240: 0.1 * (1 - 0.99 * 0.3 / 0.4),
                270: 0.001, 299: 0.001}
    for i, value in expected.items():
        assert linear_decay_lr(i, epochs, lr) == pytest.approx(value, rel=1e-12)
    # continuous at 0.5 and 0.9 of the run
    assert linear_decay_lr(150.0001, epochs, lr) == pytest.approx(0.1, rel=1e-5)
    assert linear_decay_lr(269.9999, epochs, lr) == pytest.approx(0.001, rel=1e-4)


def test_eq16_cosine_cycles():
    lr0, total, cycles = 0.2, 100, 4  # cycles of 25 iterations
    for t in range(1, total + 1):
        pos = (t - 1) % 25
        assert cosine_cycle_lr(t, total, cycles, lr0) == pytest.approx(
            lr0 / 2 * (math.cos(math.pi * pos / 25) + 1), rel=1e-12)
    assert [cosine_cycle_lr(t, total, cycles, lr0) for t in (1, 26, 51, 76)] == [lr0] * 4
    # a cycle's last iteration: alpha0 sin^2(pi / 2L), the cycle's minimum
    assert cosine_cycle_lr(25, total, cycles, lr0) == pytest.approx(
        lr0 * math.sin(math.pi / 50) ** 2, rel=1e-12)
    # ceil(T/M) = 4 when M does not divide T: cycles start at t = 1, 5, 9
    assert [cosine_cycle_lr(t, 10, 3, 1.0) for t in (1, 5, 9)] == [1.0] * 3
    assert cosine_cycle_lr(4, 10, 3, 1.0) == pytest.approx((math.cos(3 * math.pi / 4) + 1) / 2)


def test_eq17_fge_cycle():
    a1, a2 = 5e-2, 5e-4
    assert [fge_lr(t, a1, a2) for t in (0.5, 1.0)] == [a2, a1]
    for t in np.linspace(0.01, 1, 23):
        expected = (1 - 2 * t) * a1 + 2 * t * a2 if t <= 0.5 else (2 - 2 * t) * a2 + (2 * t - 1) * a1
        assert fge_lr(t, a1, a2) == pytest.approx(expected, rel=1e-12)
    assert [fge_cycle_position(i, 8) for i in (1, 4, 8, 9, 12)] == [0.125, 0.5, 1.0, 0.125, 0.5]
    with pytest.raises(ValueError, match="t must be in"):
        fge_lr(0.0, a1, a2)


def test_onecycle_is_torch_onecyclelr():
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=3e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=57)
    for step in range(57):
        assert one_cycle_lr(step, 57, 3e-3) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-9)
        opt.step()
        sched.step()


def test_methods_compose_the_schedules():
    spe = 10
    sse = TRAINING_METHODS.lookup("sse")
    hp = sse.hparams_from(cycles=3, cycle_epochs=2)
    total = sse.total_steps(hp, spe)
    assert total == 60
    assert [sse.lr_at(s, spe, hp) for s in range(total)] == [
        cosine_cycle_lr(s + 1, total, 3, hp.lr0) for s in range(total)]
    csgld = TRAINING_METHODS.lookup("csgld")
    hp = csgld.hparams_from(cycles=2, cycle_epochs=3, noise_epochs=1.5, sample_gap_epochs=0.5)
    assert [csgld.lr_at(s, spe, hp) for s in range(60)] == [
        cosine_cycle_lr(s + 1, 60, 2, hp.lr0) for s in range(60)]
    fge = TRAINING_METHODS.lookup("fge")
    hp = fge.hparams_from(pretrain_epochs=3, cycle_epochs=0.4, cycles=2)
    assert fge.total_steps(hp, spe) == 30 + 2 * 4
    assert [fge.lr_at(s, spe, hp) for s in (0, 15, 29)] == [
        linear_decay_lr(s, 30, hp.lr_init) for s in (0, 15, 29)]
    assert [fge.lr_at(s, spe, hp) for s in range(30, 38)] == [
        fge_lr(fge_cycle_position(i, 4), hp.alpha1, hp.alpha2) for i in range(1, 9)]
    swag = TRAINING_METHODS.lookup("swag")
    hp = swag.hparams_from(pretrain_epochs=2, swag_epochs=1)
    assert [swag.lr_at(s, spe, hp) for s in (0, 19, 20, 29)] == [
        hp.lr_init, linear_decay_lr(19, 20, hp.lr_init), hp.swag_lr, hp.swag_lr]
    vi = TRAINING_METHODS.lookup("vi")
    hp = vi.hparams_from(pretrain_epochs=2, epochs=1)
    assert [vi.lr_at(s, spe, hp) for s in (0, 19, 20, 29)] == [
        hp.pretrain_lr, linear_decay_lr(19, 20, hp.pretrain_lr), hp.lr_init,
        linear_decay_lr(9, 10, hp.lr_init)]
    de = TRAINING_METHODS.lookup("deep_ensemble")
    hp = de.hparams_from(epochs=3, schedule="onecycle", optimizer="adamw", lr_init=3e-3)
    assert de.lr_at(7, spe, hp) == one_cycle_lr(7, 30, 3e-3)


def test_training_uses_the_scheduled_lr_and_the_optimizer_recipe():
    seen = []
    method = TRAINING_METHODS.lookup("sse")
    hp = method.hparams_from(**SMALL["sse"])
    state = method.start(make_model(), hp, n_train=N_TRAIN, steps_per_epoch=SPE)
    assert isinstance(state.optimizer, torch.optim.SGD)
    assert state.optimizer.defaults["momentum"] == 0.9
    assert state.optimizer.defaults["weight_decay"] == hp.weight_decay
    while not state.done:
        for x, y, _ in batches(0, state.epoch):
            method.step(state, x, y)
            seen.append(state.optimizer.param_groups[0]["lr"])
        method.end_epoch(state)
    assert seen == [method.lr_at(s, SPE, hp) for s in range(state.total_steps)]


# -- snapshots -----------------------------------------------------------------------------
@pytest.mark.parametrize("name, steps, lr", [
    ("sse", [6, 12, 18], "min"),
    ("fge", [6 + 3, 6 + 9, 6 + 15], "alpha2"),
    ("csgld", [6, 9, 12, 18, 21, 24], None),
])
def test_snapshots_are_distinct_networks_taken_where_the_schedule_says(name, steps, lr):
    method, state = fit(name)
    assert [s.step for s in state.snapshots] == steps
    assert [s.epoch for s in state.snapshots] == [s / SPE for s in steps]
    if lr == "min":  # the last step of each cosine cycle, where the learning rate is lowest
        cycle = [method.lr_at(s, SPE, state.hp) for s in range(SPE)]
        assert all(s.lr == min(cycle) == cycle[-1] for s in state.snapshots)
    elif lr == "alpha2":
        assert all(s.lr == state.hp.alpha2 for s in state.snapshots)
    final = weights(state.net)
    logits = outputs(method, state, len(steps))
    live = {p.data_ptr() for p in state.net.state_dict().values()}
    for i in range(len(steps)):
        assert not live & {t.data_ptr() for t in state.snapshots[i].weights.values()}  # copies
        # the last snapshot is taken at the last step: it is the final network
        assert same(state.snapshots[i].weights, final) == (steps[i] == state.total_steps)
        for j in range(i):
            assert not same(state.snapshots[i].weights, state.snapshots[j].weights)
            assert (logits[i] - logits[j]).abs().max() > 1e-4
    assert same(weights(state.net), final)  # sampling gave the trained weights back
    with pytest.raises(ValueError, match=f"only {len(steps)} snapshots"):
        list(method.samples(state, len(steps) + 1, 0))


def test_csgld_adds_noise_only_late_in_each_cycle():
    """Same seed with and without noise: the weights agree exactly until the noise phase (the
    last 9 of each 12-step cycle) and differ from its first step on."""
    def trajectory(noise_epochs):
        method = TRAINING_METHODS.lookup("csgld")
        hp = method.hparams_from(**{**SMALL["csgld"], "noise_epochs": noise_epochs})
        torch.manual_seed(0)
        state = method.start(make_model(), hp, n_train=N_TRAIN, steps_per_epoch=SPE)
        out = []
        for x, y, _ in batches(0, 0) + batches(0, 1):
            method.step(state, x, y)
            out.append(weights(state.net))
        return out

    noisy, quiet = trajectory(1.5), trajectory(0)
    assert [same(a, b) for a, b in zip(noisy, quiet)] == [True] * 3 + [False] * 9
    with pytest.raises(ValueError, match="within the noise phase"):
        TRAINING_METHODS.lookup("csgld").total_steps(
            TRAINING_METHODS.lookup("csgld").hparams_from(noise_epochs=0.1), 100)


# -- samples, determinism, persistence -----------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_samples_deterministic_training_and_export_restore(name):
    method, state = fit(name, seed=0)
    k = 1 if method.independent_runs else 3
    trained = weights(state.net)
    first = outputs(method, state, k, seed=5)
    assert len(first) == k
    assert same(weights(state.net), trained) and not state.net.training
    if k > 1:
        assert (first[0] - first[1]).abs().max() > 1e-6  # the samples differ
        assert all(torch.equal(a, b) for a, b in zip(first, outputs(method, state, k, seed=5)))
    else:
        with pytest.raises(ValueError, match="one member per run"):
            list(method.samples(state, 2, 0))
    # the same seed trains the same network; another seed another one
    _, again = fit(name, seed=0)
    assert same(weights(again.net), trained)
    assert all(torch.equal(a, b) for a, b in zip(first, outputs(method, again, k, seed=5)))
    _, other = fit(name, seed=1)
    assert not same(weights(other.net), trained)
    # what a prediction process needs: checkpoint + export_state -> the same samples
    tensors, meta = export_state(state)
    tensors = load_tensors(save_tensors(tensors))
    meta = json.loads(json.dumps(meta))
    checkpoint = torch.load(io.BytesIO(_saved(state.model.state_dict())), weights_only=True)
    restored = method.restore(make_model(), state.hp, tensors, meta)
    restored.model.load_state_dict(checkpoint)
    restored.bn_loader = state.bn_loader
    assert all(torch.equal(a, b) for a, b in zip(first, outputs(method, restored, k, seed=5)))


def _saved(state_dict):
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("name", NAMES)
def test_k_must_be_positive(name):
    method, state = fit(name)
    with pytest.raises(ValueError, match="k must be a positive integer, got 0"):
        list(method.samples(state, 0, 0))


# -- model wrappers ------------------------------------------------------------------------
def test_mc_dropout_puts_dropout_before_the_classifier_keeping_checkpoint_keys():
    model = make_model()
    keys = set(model.state_dict())
    wrapped = ensure_dropout(model, 0.3)
    assert isinstance(wrapped[3], DropoutLinear) and wrapped[3].dropout.p == 0.3
    assert set(wrapped.state_dict()) == keys
    has_own = nn.Sequential(nn.Linear(8, 4), nn.Dropout(0.1), nn.Linear(4, 3))
    assert ensure_dropout(has_own, 0.3) is has_own and type(has_own[2]) is nn.Linear
    with pytest.raises(ValueError, match="needs a dropout module or an nn.Linear"):
        ensure_dropout(nn.Sequential(nn.ReLU()), 0.3)
    method, state = fit("mc_dropout")
    a, b = outputs(method, state, 2)
    assert not torch.equal(a, b)  # dropout on at prediction ...
    state.net.eval()
    assert torch.equal(state.net(X), state.net(X))  # ... and off in plain eval mode


def conv_net():
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1, stride=2), nn.ReLU(), nn.Flatten(),
                         nn.Linear(3 * 3 * 3, 4))


def test_vi_wraps_linear_and_conv_layers_keeping_the_means():
    torch.manual_seed(0)
    model = conv_net()
    before = weights(model)
    method = TRAINING_METHODS.lookup("vi")
    hp = method.hparams_from(pretrain_epochs=1, epochs=1)
    state = method.start(model, hp, n_train=100, steps_per_epoch=1)
    layers = variational_layers(state.net)
    assert [type(m) for m in layers] == [VIConv2d, VILinear]
    assert all(torch.equal(state.net.state_dict()[k], v) for k, v in before.items())
    assert all(torch.all(m.log_sigma == hp.log_sigma_init) for m in layers)
    sgd, adam = state.optimizer.optimizers
    assert adam.param_groups[0]["fixed_lr"] and adam.defaults["weight_decay"] == 0
    assert {id(p) for p in adam.param_groups[0]["params"]} == {id(m.log_sigma) for m in layers}
    assert sgd.defaults["weight_decay"] == hp.weight_decay
    x, y = torch.randn(5, 2, 6, 6), torch.tensor([0, 1, 2, 3, 0])
    method.step(state, x, y)  # pre-training: deterministic, no KL, log-sigma untouched
    assert not layers[0].stochastic and all(m.log_sigma.grad is None for m in layers)
    assert adam.param_groups[0]["lr"] == hp.log_sigma_lr
    method.step(state, x, y)  # VI: noise on, KL in the loss, log-sigma trained
    assert layers[0].stochastic and all(m.log_sigma.grad is not None for m in layers)
    assert adam.param_groups[0]["lr"] == hp.log_sigma_lr  # constant, as in the paper
    # the output distribution of the local reparameterisation: mean and variance per unit
    layers[1].log_sigma.data.fill_(-1.0)
    h = torch.randn(4000, 27)
    with torch.no_grad():
        out = layers[1](h[:1].expand(4000, 27))
    mean = F.linear(h[:1], layers[1].weight, layers[1].bias)[0]
    var = (h[:1] ** 2 @ torch.exp(2 * layers[1].log_sigma).T)[0]
    se_mean, se_var = (var / 4000).sqrt(), var * math.sqrt(2 / 3999)
    z = float(torch.distributions.Normal(0, 1).icdf(torch.tensor(1 - 1e-3 / 16)))
    assert torch.all((out.mean(0) - mean).abs() <= z * se_mean)
    assert torch.all((out.var(0) - var).abs() <= z * se_var)


def test_kfac_factors_match_a_direct_computation():
    """A: unfolded input patches (with the bias 1) averaged over examples and locations; G:
    the cross-entropy gradient w.r.t. the logits, p - onehot(y), for the last layer."""
    torch.manual_seed(0)
    net = conv_net().double()
    method = TRAINING_METHODS.lookup("kfac_laplace")
    state = method.start(net, method.hparams_from(epochs=1), n_train=20, steps_per_epoch=1)
    x = torch.randn(20, 2, 6, 6, dtype=torch.float64)
    y = torch.arange(20) % 4
    factors = kfac_factors(state, [(x[:7], y[:7]), (x[7:], y[7:])])
    assert int(state.extra["kfac.n"]) == 20
    conv, lin = net[0], net[3]
    padded = F.pad(x, (1, 1, 1, 1))
    rows = [torch.cat([padded[i, :, 2 * r:2 * r + 3, 2 * c:2 * c + 3].reshape(-1),
                       torch.ones(1, dtype=x.dtype)])
            for i in range(20) for r in range(3) for c in range(3)]
    a = torch.stack(rows)
    torch.testing.assert_close(factors["0"][0], a.T @ a / len(a))
    with torch.no_grad():
        hidden = net[2](net[1](conv(x)))
        p = torch.softmax(lin(hidden), 1)
    delta = p - F.one_hot(y, 4).double()
    torch.testing.assert_close(factors["3"][1], delta.T @ delta / 20)
    h1 = torch.cat([hidden, torch.ones(20, 1, dtype=x.dtype)], 1)
    torch.testing.assert_close(factors["3"][0], h1.T @ h1 / 20)
    assert factors["0"][1].shape == (3, 3) and torch.all(torch.diagonal(factors["0"][1]) > 0)


def test_laplace_tunes_the_scale_on_validation_data():
    method, state = fit("kfac_laplace", scales=(0.01, 0.3, 30.0))
    nll, grid = state.extra["laplace.validation_nll"], state.extra["laplace.scales"]
    assert grid.shape == nll.shape and len(grid) >= 3
    assert {0.01, 0.3, 30.0} <= set(grid.tolist())  # the given grid, plus any extension
    assert float(state.extra["laplace.scale"]) == float(grid[int(nll.argmin())])
    assert nll[grid.tolist().index(30.0)] > nll.min()  # a huge scale destroys the network
    best = int(nll.argmin())
    assert bool(state.extra["laplace.scale_at_edge"]) == (best in (0, len(grid) - 1))
    with pytest.raises(ValueError, match="tunes its noise scale on validation data"):
        method.finish(state, batches(0, 0), None)


def test_laplace_scale_search_extends_past_an_edge_optimum():
    """The validation objective as a function of the scale, minimised at ``s*``: an optimum
    below the grid's lowest point (0.01) is found by extending the grid at its own ratio; one
    beyond the allowed extensions is flagged, not reported as an interior optimum."""
    from uqvision.methods.laplace import search_scale

    grid0 = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)

    def objective(target):
        return lambda s: (math.log(s) - math.log(target)) ** 2

    grid, values, best, at_edge = search_scale(grid0, objective(1e-3), 4)
    assert best == pytest.approx(0.01 / 9) and not at_edge  # the grid point nearest 1e-3
    assert grid[0] < best < grid[-1] and len(grid) == len(grid0) + 3  # 0.0033, 0.0011, 0.00037
    assert values == [objective(1e-3)(s) for s in grid]
    grid, _, best, at_edge = search_scale(grid0, objective(50.0), 4)  # above: 9, 27, 81, 243
    assert best == pytest.approx(81.0) and grid[-1] == pytest.approx(243.0) and not at_edge
    grid, _, best, at_edge = search_scale(grid0, objective(1e-9), 2)  # out of reach
    assert at_edge and best == grid[0] and len(grid) == len(grid0) + 2
    _, _, best, at_edge = search_scale((0.0, 0.1, 1.0), lambda s: s, 3)
    assert best == 0.0 and not at_edge  # the MAP (scale 0) is a true lower bound


def test_laplace_flags_an_edge_optimum_in_its_state():
    """End to end: no extension allowed and a grid far above any useful scale: the chosen
    scale is the grid's lowest point, flagged in the state (exported with the run)."""
    _, state = fit("kfac_laplace", scales=(30.0, 100.0), max_scale_extensions=0)
    assert float(state.extra["laplace.scale"]) == 30.0
    assert int(state.extra["laplace.scale_at_edge"]) == 1
