"""Mean–variance networks (docs/conventions.md#r-7): every trained method's ``<method>+mv``
version, the β-NLL objective, the decomposition into aleatoric and epistemic variance, and the
engine's properties (fused = autograd, bit-identical whatever the chunk) for the new head.

What is checked, and against what:

* the β-NLL's gradient against its definition, by autograd on a tiny example: β = 0 is the
  Gaussian NLL's, β = 1 gives μ the gradient of ½·MSE; the fused path's hand-written gradient of
  every head with a variance output equals autograd's;
* the decomposition against an independent numpy computation from the networks' own outputs:
  aleatoric = mean over members (ensembles) or MC passes (dropout) of σ²ₘ(x), epistemic = their
  variance of μₘ(x) with ``std_ddof``; the same check REJECTS the two parts swapped, and the
  epistemic variance taken over the passes of one network of an ensemble;
* on a heteroscedastic task, the predicted variance recovers what the NLL estimates, the expected
  squared residual of the network's own mean, ``σ²(x) + (μ(x) − f(x))²``, in each quarter of the
  training box within 3 relative standard errors of a variance estimated from that quarter's
  n_q training points, ``3·sqrt(2/n_q)``; a constant variance (a homoscedastic model) and the
  epistemic part in its place are rejected by the same check;
* the R.6 interval of a heteroscedastic task uses σ(x), and the study's conditional coverage too.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import execution_check
import numpy as np
import pytest
import torch
from scipy.special import ndtr
from two_output_check import assert_fused_gradients_equal_autograd

from uqreg import rng
from uqreg.conformal import interval_z
from uqreg.engine import BatchedMLP, NetworkBatch, TrainConfig, execute, train_batched
from uqreg.engine.fused import Workspace, l2_of
from uqreg.engine.heads import HEADS
from uqreg.engine.objectives import gaussian_nll, gaussian_nll_grad, variance
from uqreg.engine.train import objective
from uqreg.methods import METHODS, MeanVarianceMethod, get_method, mean_variance_method_names
from uqreg.reference import Decomposition, reference_decomposition
from uqreg.tasks import get_task

SEED = 5
N_TRAIN = 9
MV = mean_variance_method_names()


def _cfg(**kw) -> TrainConfig:
    return TrainConfig(**{"dtype": "float64", "hidden": (6, 5, 4), "members": 3, "mc_samples": 4, **kw})


# ---------------------------------------------------------------------------------------------
# the registry


def test_every_trained_method_has_a_mean_variance_version():
    trained = [n for n, m in METHODS.items() if m.closed_form is None]
    assert MV == [f"{n}+mv" for n in trained]
    for name in MV:
        m, base = get_method(name), METHODS[name[:-3]]
        assert isinstance(m, MeanVarianceMethod) and m.objective == "gaussian_nll"
        assert (m.head, m.ensemble, m.sampler, m.adversarial) == (base.head, base.ensemble, base.sampler,
                                                                   base.adversarial)
    conf = get_method("ens+mv+cp_abs")
    assert conf.trains_as == "ens+mv" and conf.objective == "gaussian_nll" and conf.ensemble
    for bad in ("blr+mv", "ens+mv+nope", "nope+mv"):
        with pytest.raises(ValueError, match="unknown method"):
            get_method(bad)
    with pytest.raises(ValueError, match=r"nll_beta must be a number in \[0, 1\], got 1.5"):
        TrainConfig(nll_beta=1.5)


# ---------------------------------------------------------------------------------------------
# β-NLL: its gradient against its definition; the fused backward against autograd


def _nll_example(beta: float):
    gen = torch.Generator().manual_seed(0)
    mean = torch.randn(2, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    raw = torch.randn(2, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    y = 2.0 * torch.randn(2, 7, generator=gen, dtype=torch.float64)
    loss = gaussian_nll(mean, raw, y, TrainConfig(nll_beta=beta))
    return mean, raw, y, torch.autograd.grad(loss.sum(), (mean, raw))


def _plain_nll(mean, raw, y):
    var = torch.nn.functional.softplus(raw) + 1e-6  # the documented parametrisation, from torch
    return (0.5 * torch.log(var) + 0.5 * (y - mean) ** 2 / var).mean(dim=1)


def test_beta_nll_gradient_is_its_definition():
    """β = 0: the Gaussian NLL's gradient; β = 1: μ gets the gradient of ½·MSE, (μ − y)/n, and s
    the NLL's gradient times σ² (the weight without gradient); β = ½ the weight σ."""
    mean, raw, y, (g_mean, g_raw) = _nll_example(0.0)
    e_mean, e_raw = torch.autograd.grad(_plain_nll(mean, raw, y).sum(), (mean, raw))
    torch.testing.assert_close(g_mean, e_mean, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(g_raw, e_raw, rtol=1e-12, atol=1e-14)
    var = (torch.nn.functional.softplus(raw) + 1e-6).detach()
    for beta in (1.0, 0.5):
        mean, raw, y, (g_mean, g_raw) = _nll_example(beta)
        if beta == 1.0:
            torch.testing.assert_close(g_mean, (mean - y).detach() / y.shape[1], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(g_mean, var**beta * e_mean, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(g_raw, var**beta * e_raw, rtol=1e-12, atol=1e-14)
        # and the fused path's hand-written gradient is the same
        h_mean, h_raw = gaussian_nll_grad(mean.detach(), raw.detach(), y, TrainConfig(nll_beta=beta))
        torch.testing.assert_close(h_mean, g_mean, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(h_raw, g_raw, rtol=1e-12, atol=1e-14)
    # the check can fail: without the stop-gradient, β = 1 changes s's gradient
    mean, raw, y, (_, g_raw) = _nll_example(1.0)
    v = torch.nn.functional.softplus(raw) + 1e-6
    no_stop = torch.autograd.grad((v * (0.5 * torch.log(v) + 0.5 * (y - mean) ** 2 / v)).mean(dim=1).sum(), raw)[0]
    assert not torch.allclose(no_stop, g_raw, rtol=1e-3)


def _model(head: str, d: int, cfg: TrainConfig, b: int = 3) -> BatchedMLP:
    """``b`` mean–variance networks with every parameter moved off its initial value."""
    keys = rng.network_keys(SEED, "init", np.arange(b), np.zeros(b, dtype=np.int64))
    drop = rng.network_keys(SEED, "dropout", np.arange(b), np.zeros(b, dtype=np.int64))
    model = BatchedMLP(keys, drop, d, head, cfg, N_TRAIN, 0.7, "gaussian_nll")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("fgsm", [False, True], ids=["plain", "fgsm"])
@pytest.mark.parametrize("head", sorted(HEADS))
def test_fused_gradients_equal_autograd(head, fgsm, beta):
    """Every parameter's gradient (the variance output's weight under the coupled L2 like every
    weight), with and without FGSM, for each β."""
    cfg = _cfg(recipe="paper", nll_beta=beta)
    model = _model(head, 2, cfg)
    assert_fused_gradients_equal_autograd(model, cfg, N_TRAIN, fgsm, head)


@pytest.mark.parametrize("head", sorted(HEADS))
def test_mean_output_is_the_heads_own(head):
    """The mean of a mean–variance network is its head's output bit for bit, for the same draw
    (the dropped activation is computed once for both outputs where ``linear_output``)."""
    model = _model(head, 2, _cfg())
    h = model.hidden(torch.randn(3, N_TRAIN, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64))
    with torch.no_grad():
        mean, raw = model.output_mv(h, 7)
        assert torch.equal(mean, model.output(h, 7)) and raw.shape == mean.shape


@pytest.fixture(scope="module")
def instance():
    return get_task("sinusoid_het").instance(1, SEED, n_train=12)


def _train(method, instance, nets, cfg, epochs=6):
    cfg = replace(cfg, **method.overrides)
    y = instance.targets(range(int(nets.repetition.max()) + 1))
    return train_batched(instance.x_train, y, nets, seed=instance.seed, head=method.head, sampler=method.sampler,
                         adversarial=method.adversarial, cfg=cfg, epochs=epochs, sigma=instance.sigma,
                         objective=method.objective)


@pytest.mark.parametrize("name", MV)
def test_backends_train_the_same_networks(name, instance):
    method = get_method(name)
    cfg = _cfg(recipe="paper", nll_beta=0.5)
    nets = method.networks([0, 2], cfg)
    fused = _train(method, instance, nets, replace(cfg, backend="fused"))
    autograd = _train(method, instance, nets, replace(cfg, backend="autograd"))
    for i in range(len(nets)):
        for a, e in zip(fused.network_parameters(i), autograd.network_parameters(i), strict=True):
            torch.testing.assert_close(a, e, rtol=1e-9, atol=1e-9 * float(e.abs().max()))


@pytest.mark.parametrize("name", ["ens_adv+mv", "bd+mv", "cd+mv", "vd+mv"])
def test_network_bitwise_independent_of_its_chunk(name, instance):
    """float32: a mean–variance network trains to the same bits alone, first in a chunk of 2, or
    inside a chunk of 40 (test_fused.py's check for the mean heads)."""
    method = get_method(name)
    cfg = TrainConfig(hidden=(16, 12, 8), members=3)
    big = NetworkBatch(np.repeat(np.arange(10), 4), np.tile(np.arange(4), 10))
    alone = NetworkBatch(np.array([0]), np.array([2]))
    first = NetworkBatch(np.array([0, 9]), np.array([2, 3]))
    m_big, m_alone, m_first = (_train(method, instance, nets, cfg, epochs=15) for nets in (big, alone, first))
    for a, b, c in zip(m_big.network_parameters(2), m_alone.network_parameters(0), m_first.network_parameters(0),
                       strict=True):
        assert torch.equal(a, b) and torch.equal(a, c), name
    assert not torch.equal(m_big.var_weight[0], m_big.var_weight[1])


@pytest.mark.parametrize("name, dim", [("ens_adv+mv", 2), ("bd+mv", 1)])
def test_execution_changes_no_bit(name, dim):
    """Chunks of 2, of 1, and concurrent chunks give the one-chunk run's predictions and
    aleatoric variances bit for bit (float32; test_engine.py's check for the mean heads)."""
    assert execution_check.mismatches(name, dim) == dict.fromkeys(
        ("chunks of 2", "chunks of 1", "concurrent chunks of 1"), 0)


# ---------------------------------------------------------------------------------------------
# the decomposition


def _agrees(dec: Decomposition, mean, epistemic, aleatoric) -> bool:
    return all(np.allclose(a, b, rtol=1e-9, atol=1e-12) for a, b in (
        (dec.mean, mean), (dec.epistemic_variance, epistemic), (dec.aleatoric_variance, aleatoric),
        (dec.predictive_variance, epistemic + aleatoric)))


def test_ensemble_decomposition_is_over_its_members(instance):
    """``ens+mv``: the members' μₘ and σ²ₘ from the engine, the formulas in numpy."""
    method, cfg, reps = get_method("ens+mv"), _cfg(members=4), [0, 1]
    y = instance.targets(reps)
    dec = method.run(instance, y, reps, cfg, epochs=20).decompose()
    per_net = execute(method.job(instance, y, reps, cfg, epochs=20))
    mu = per_net.mean.reshape(2, 4, -1)  # (R, M, T)
    s2 = per_net.aleatoric.reshape(2, 4, -1)
    ddof = cfg.std_ddof
    right = (mu.mean(axis=1), mu.var(axis=1, ddof=ddof), s2.mean(axis=1))
    assert _agrees(dec, *right)
    assert dec.mean.shape == dec.epistemic_variance.shape == dec.aleatoric_variance.shape == (2, len(instance.x_test))
    # the check rejects the wrong variants: the parts swapped, and the epistemic variance over
    # the passes of ONE network of each repetition (a member is deterministic: its passes agree)
    assert not _agrees(dec, right[0], right[2], right[1])
    one_network_passes = np.stack([mu[:, 0]] * cfg.mc_samples, axis=1).var(axis=1, ddof=ddof)
    assert not _agrees(dec, right[0], one_network_passes, s2[:, 0])


def test_dropout_decomposition_is_over_its_passes(instance):
    """``bd+mv`` (float64): T passes of each repetition's network, recomputed here from the
    trained network's output layers and mask draws; the formulas in numpy."""
    method, cfg, reps = get_method("bd+mv"), _cfg(mc_samples=6), [0, 1]
    y = instance.targets(reps)
    dec = method.run(instance, y, reps, cfg, epochs=20).decompose()
    nets = method.networks(reps, cfg)
    model = _train(method, instance, nets, cfg, epochs=20)
    keys = rng.network_keys(instance.seed, "mc", nets.repetition, nets.member)
    x = torch.as_tensor(instance.x_test)[None].expand(len(nets), -1, -1)
    with torch.no_grad():
        outs = [model.forward_mv(x, s, keys) for s in range(cfg.mc_samples)]
    mu = np.stack([m.numpy() for m, _ in outs], axis=1)  # (R, T passes, points)
    s2 = np.stack([variance(r).numpy() for _, r in outs], axis=1)
    right = (mu.mean(axis=1), mu.var(axis=1, ddof=cfg.std_ddof), s2.mean(axis=1))
    assert _agrees(dec, *right)
    assert not _agrees(dec, right[0], right[2], right[1])


def test_mean_only_method_has_no_decomposition(instance):
    res = get_method("ens").run(instance, instance.targets([0]), [0], _cfg(), epochs=2)
    assert res.aleatoric_variance is None
    with pytest.raises(ValueError, match=r"decompose needs a mean-variance method \(<method>\+mv\)"):
        res.decompose()


# ---------------------------------------------------------------------------------------------
# on a heteroscedastic task: the variance follows σ(x)


def _quarter_ratios(instance, predicted, mean):
    """Per quarter of the training box: mean predicted variance over the test points in it, over
    the mean of what it estimates, σ²(x) + (μ(x) − f(x))²; and the quarter's training points."""
    x, xt = instance.x_test[:, 0], instance.x_train[:, 0]
    target = instance.noise_std(instance.x_test) ** 2 + (mean - instance.truth(instance.x_test)) ** 2
    edges = np.linspace(xt.min(), xt.max(), 5)
    ratios, counts = [], []
    for a, b in itertools.pairwise(edges):
        at = (x >= a) & (x <= b)
        ratios.append(predicted[at].mean() / target[at].mean())
        counts.append(int(np.sum((xt >= a) & (xt <= b))))
    return np.array(ratios), np.array(counts)


def test_mean_variance_ensemble_recovers_the_noise_profile():
    """``sinusoid_het`` (σ rises 9-fold across the box), 200 training points, 4 members: in each
    quarter of the box the aleatoric estimate is within 3·sqrt(2/n_q) (relative) of
    σ²(x) + (μ(x) − f(x))², the expected squared residual the NLL's variance estimates (n_q the
    quarter's training points: the relative standard error of a variance from n_q Gaussian
    residuals is sqrt(2/n_q)). A constant variance (the quarters' mean) or the epistemic part
    in its place fails the same check."""
    inst = get_task("sinusoid_het").instance(1, 0, n_train=200)
    cfg = TrainConfig(hidden=(32, 16), members=4, recipe="none")
    res = get_method("ens+mv").run(inst, inst.targets([0]), [0], cfg, epochs=600)
    dec = res.decompose()
    ratios, counts = _quarter_ratios(inst, dec.aleatoric_variance[0], dec.mean[0])
    tol = 3 * np.sqrt(2 / counts)
    assert np.all(np.abs(ratios - 1) <= tol), (ratios, tol)
    constant = np.full_like(dec.aleatoric_variance[0], dec.aleatoric_variance[0].mean())
    assert np.any(np.abs(_quarter_ratios(inst, constant, dec.mean[0])[0] - 1) > tol)
    assert np.any(np.abs(_quarter_ratios(inst, dec.epistemic_variance[0], dec.mean[0])[0] - 1) > tol)


# ---------------------------------------------------------------------------------------------
# R.6 intervals with σ(x)


def test_gaussian_interval_uses_the_noise_profile():
    """``blr`` on a heteroscedastic task: its interval is the exact posterior predictive one,
    mean ± z·sqrt(epistemic + σ(x)²) (before: σ, one number, everywhere); a mean–variance
    method's interval uses its own aleatoric variance."""
    inst = get_task("polynomial_het").instance(2, 0)
    y = inst.targets([0, 1])
    res = get_method("blr").run(inst, y, [0, 1], TrainConfig())
    exact = reference_decomposition(inst, y)
    z = interval_z(0.05)
    np.testing.assert_allclose(res.interval_high - res.interval_low, 2 * z * np.broadcast_to(
        exact.predictive_std, res.prediction.shape), rtol=1e-10)
    mv = get_method("ens+mv").run(inst, y, [0, 1], _cfg(members=2), epochs=3)
    np.testing.assert_allclose(mv.interval_high - mv.interval_low,
                               2 * z * np.sqrt(mv.uncertainty**2 + mv.aleatoric_variance), rtol=1e-12)


def test_study_conditional_coverage_uses_the_noise_profile():
    """The exact conditional coverage of a heteroscedastic study is Φ((u − f)/σ(x)) −
    Φ((l − f)/σ(x)) at every point, for the methods and the reference."""
    from uqreg.study import StudyConfig, conditional_diagnostics, run_study

    cfg = StudyConfig(task="sinusoid_het", complexities=(1,), methods=("blr",), repetitions=2, n_train=20)
    raw = run_study(cfg, progress=False)
    diag = conditional_diagnostics(raw)
    inst = get_task("sinusoid_het").instance(1, cfg.seed, n_train=20)
    s = inst.noise_std(inst.x_test)
    sel = {"method": "blr", "complexity": 1}
    low, high = raw.interval_low.sel(sel).values, raw.interval_high.sel(sel).values
    f = raw.truth.sel(complexity=1).values
    expected = ndtr((high - f) / s) - ndtr((low - f) / s)
    np.testing.assert_allclose(diag.conditional_coverage.sel(sel).values, expected, rtol=1e-12)
    np.testing.assert_allclose(diag.reference_conditional_coverage.sel(complexity=1).values, expected[0], rtol=1e-9)


# ---------------------------------------------------------------------------------------------
# cd and vd: the likelihood of the known σ(x)


@pytest.mark.parametrize("head", ["concrete", "variational"])
def test_known_noise_objective_uses_the_noise_profile(head):
    """``cd``/``vd`` train on σ² × (the Gaussian NLL with the known noise + KL/N) (R.3): on a
    heteroscedastic task the NLL's σ is σ(x_n), so the data term is ½·mean (σ/σ(x_n))²(y − ŷ)²
    (before: σ, one number, at every point). Checked on the engine's objective against that
    formula, and the fused gradient against autograd's."""
    inst = get_task("polynomial_het").instance(2, 0, n_train=N_TRAIN)
    name = {"concrete": "cd", "variational": "vd"}[head]
    job = METHODS[name].job(inst, inst.targets([0]), [0], _cfg())
    w = (inst.sigma / inst.noise_std(inst.x_train)) ** 2
    np.testing.assert_array_equal(job.noise_weights, w)
    assert w.max() / w.min() > 2  # the profile matters on this task
    for other, task in (("ens", "polynomial_het"), ("cd+mv", "polynomial_het"), (name, "polynomial")):
        i = get_task(task).instance(2, 0, n_train=N_TRAIN)
        assert get_method(other).job(i, i.targets([0]), [0], _cfg()).noise_weights is None, (other, task)
    cfg = _cfg(recipe="paper")
    keys = rng.network_keys(SEED, "init", np.arange(3), np.zeros(3, dtype=np.int64))
    model = BatchedMLP(keys, keys + 1, 2, head, cfg, N_TRAIN, inst.sigma)
    x = torch.as_tensor(inst.x_train)[None].expand(3, -1, -1)
    y = torch.as_tensor(inst.targets([0, 1, 2]))
    yw = torch.stack([y, torch.as_tensor(w)[None].expand(3, -1)], dim=-1)
    engine = objective(model, x, yw, 3)
    with torch.no_grad():
        pred = model(x, 3)
        nll = ((y - pred) ** 2 / (2 * torch.as_tensor(inst.noise_std(inst.x_train)) ** 2)).mean(dim=1)
        expected = inst.sigma**2 * nll + model.regulariser()
    torch.testing.assert_close(engine.detach(), expected, rtol=1e-12, atol=1e-12)
    params = [*model.weights, *model.biases, *model.head_params.values()]
    grads = torch.autograd.grad(engine.sum(), params)
    l2, _ = l2_of(cfg, N_TRAIN)
    ws = Workspace(model, N_TRAIN, l2=l2, decoupled=False)
    ws.load(model)
    ws.gradients(x.contiguous(), yw, 3, model.dropout_keys, None)
    for i, (a, e) in enumerate(zip(ws.gW + ws.gb + list(ws.ghp.values()), grads, strict=True)):
        e = e + l2 * params[i].detach() if i < len(model.weights) else e
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12 * float(e.abs().max()) + 1e-300)
