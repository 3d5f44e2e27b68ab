"""The decisions of docs/conventions.md#r-1 to #r-5 that no other test pins, each against the
value the documentation states (written out here, not read from the code): the three tasks of
the regression paper (feature maps, γ, σ, training and test inputs, boxes, probe points), the
network and method defaults, the 300·c epochs, and the paper presets' sizes.

Statistical checks (uniform draws, the training noise) use bounds of the sample size with a
false-alarm probability of 1e-6 each: the Dvoretzky–Kiefer–Wolfowitz bound
``sup |F_n − F| ≤ sqrt(log(2/δ)/(2n))`` for a distribution, and 5 standard errors of a sample
variance, ``σ²·sqrt(2/(n − 1))``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from uqreg import rng
from uqreg.engine import HEADS, SAMPLERS, NetworkBatch, TrainConfig, fused, train_batched
from uqreg.methods import get_method
from uqreg.presets import PRESETS
from uqreg.study import StudyConfig
from uqreg.tasks import get_task

DELTA = 1e-6


def dkw(n: int) -> float:
    """The DKW bound on ``sup |F_n − F|`` for ``n`` draws, exceeded with probability ``DELTA``."""
    return math.sqrt(math.log(2 / DELTA) / (2 * n))


def ks_uniform(values: np.ndarray, low: float, high: float) -> float:
    """``sup |F_n − F|`` of ``values`` against U[low, high]."""
    u = np.sort((np.ravel(values) - low) / (high - low))
    n = u.size
    return float(max(np.max(np.arange(1, n + 1) / n - u), np.max(u - np.arange(n) / n)))


# -- R.1: the tasks ----------------------------------------------------------------------------


@pytest.mark.parametrize("f_main", [1, 3])
def test_sinusoid_is_e1(f_main):
    inst = get_task("sinusoid").instance(f_main, seed=4)
    assert inst.sigma == 0.75 and inst.task.complexity_name == "f_main"
    assert inst.x_train.shape == (50, 1) and np.all(np.abs(inst.x_train) <= 4)
    np.testing.assert_array_equal(inst.x_test[:, 0], np.linspace(-6, 6, 1000))
    assert inst.gamma.shape == (4,) and np.all((inst.gamma >= 0) & (inst.gamma <= 1))
    f = np.array([0.9, 1 - 1 / 30, 1 + 1 / 30, 1.1]) * f_main  # four equally spaced in [0.9, 1.1]·f_main
    rho = np.array([0, np.pi / 2, np.pi, 3 * np.pi / 2])  # four equally spaced in [0, 2π), no repeated 0 ≡ 2π
    x = inst.x_test
    np.testing.assert_allclose(inst.features(x), np.sin(2 * np.pi * f * x + rho), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(inst.in_distribution, np.abs(x[:, 0]) <= 4)
    assert inst.epochs == 300 * f_main
    assert inst.task.probes == {"in_-2.38": -2.38, "in_1.2": 1.2, "out_-5.11": -5.11}


@pytest.mark.parametrize("d", [1, 2])
def test_styblinski_tang_is_e2(d):
    inst = get_task("styblinski_tang").instance(d, seed=4)
    assert inst.sigma == 3.0 and inst.task.complexity_name == "d"
    assert inst.x_train.shape == (100 * 9 ** (d - 1), d) and np.all(np.abs(inst.x_train) <= 4)
    np.testing.assert_array_equal(inst.gamma, [2.5, -8.0, 0.5] * d)
    lam = np.linspace(0, 1, 1000)
    diagonal = (1 - lam)[:, None] * np.full(d, -5.0) + lam[:, None] * np.full(d, 5.0)
    np.testing.assert_allclose(inst.x_test, diagonal, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(inst.test_coords["lambda"], lam)
    x = inst.x_train
    phi = np.concatenate([np.stack([x[:, j], x[:, j] ** 2, x[:, j] ** 4], axis=1) for j in range(d)], axis=1)
    np.testing.assert_allclose(inst.features(x), phi, rtol=1e-14)
    np.testing.assert_allclose(inst.f_train, np.sum(x**4 - 16 * x**2 + 5 * x, axis=1) / 2, rtol=1e-12, atol=1e-9)
    np.testing.assert_array_equal(inst.in_distribution, np.all(np.abs(inst.x_test) <= 4, axis=1))
    assert inst.epochs == 300 * d
    assert inst.task.probes == {"in_0.5996": 0.5996, "out_0.074": 0.074}
    x_in, x_out = -5 + 10 * 0.5996, -5 + 10 * 0.074
    assert abs(x_in) <= 4 < abs(x_out)  # the probes lie where their names say


def test_polynomial_is_e3():
    task = get_task("polynomial")
    assert task.default_complexities == (2,) and task.train_box == (1.0, 4.0)
    inst = task.instance(2, seed=4)
    assert inst.sigma == 0.5 and inst.gamma.shape == (6,)  # p = 6, not the paper's γ ∈ R⁷
    assert np.all((inst.gamma >= 0) & (inst.gamma <= 1))
    assert inst.x_train.shape == (450, 2) and np.all((inst.x_train >= 1) & (inst.x_train <= 4))
    x1, x2 = inst.x_test[:, 0], inst.x_test[:, 1]
    grid = np.linspace(-5, 5, 41)
    assert set(np.unique(x1)) == set(grid) == set(np.unique(x2)) and inst.x_test.shape == (41 * 41, 2)
    np.testing.assert_array_equal(inst.features(inst.x_test), np.stack([np.ones_like(x1), x1, x2, x1 * x2, x1**2,
                                                                        x2**2], axis=1))
    np.testing.assert_array_equal(inst.in_distribution, (x1 >= 1) & (x1 <= 4) & (x2 >= 1) & (x2 <= 4))
    assert inst.epochs == 600  # 300·c at c = d = 2


@pytest.mark.parametrize("name, box", [("sinusoid", (-4, 4)), ("styblinski_tang", (-4, 4)), ("polynomial", (1, 4))])
def test_training_inputs_are_uniform_in_the_training_box(name, box):
    """R.1: the training inputs are uniform in the box the task declares (``train_box``, what the
    study calls in distribution); 20,000 coordinates against U[box] within the DKW bound."""
    task = get_task(name)
    assert task.train_box == box
    c = task.default_complexities[0]
    x = task.instance(c, seed=1, n_train=20_000 // task.input_dim(c)).x_train
    assert ks_uniform(x, *box) < dkw(x.size), name


@pytest.mark.parametrize("name, p", [("sinusoid", 4), ("polynomial", 6)])
def test_gamma_is_uniform_on_the_unit_interval_and_drawn_per_instance(name, p):
    """R.1: γ ~ U[0, 1]^p, drawn once per instance from the task seed: 2,000 seeds' γ against
    U[0, 1] within the DKW bound; the same seed gives the same γ and training inputs."""
    task = get_task(name)
    c = task.default_complexities[0]
    gammas = np.stack([task.gamma(rng.numpy_stream(s, "gamma", 0, c), c) for s in range(2000)])
    assert gammas.shape == (2000, p)
    assert ks_uniform(gammas, 0.0, 1.0) < dkw(gammas.size)
    a, b, other = task.instance(c, seed=3), task.instance(c, seed=3), task.instance(c, seed=4)
    np.testing.assert_array_equal(a.gamma, b.gamma)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert not np.array_equal(a.gamma, other.gamma)


def test_only_the_training_noise_is_redrawn_between_repetitions():
    """R.1: the inputs stay fixed; repetition r's targets are the truth plus N(0, σ²) noise of its
    own stream: the residuals of 400 repetitions × 50 points have variance σ² within 5 standard
    errors, and a repetition's targets do not depend on which others are drawn with it."""
    inst = get_task("sinusoid").instance(2, seed=5)
    y = inst.targets(np.arange(400))
    resid = (y - inst.f_train) / inst.sigma
    n = resid.size
    assert abs(resid.var() - 1.0) < 5 * math.sqrt(2 / (n - 1))
    assert abs(resid.mean()) < 5 / math.sqrt(n)
    np.testing.assert_array_equal(inst.targets([7])[0], y[7])
    assert not np.array_equal(y[0], y[1])


# -- R.3: the network, the methods and their defaults --------------------------------------------


def test_train_config_defaults_are_r3():
    cfg = TrainConfig()
    assert cfg.hidden == (128, 64, 32) and cfg.negative_slope == 0.01
    assert cfg.lr == 1e-2 and cfg.betas == (0.9, 0.999)
    assert cfg.recipe == "paper" and cfg.weight_decay is None  # λ = 1/N, coupled
    assert cfg.recipe_spec.weight_decay(50) == 1 / 50 and not cfg.recipe_spec.decoupled
    assert cfg.epochs is None  # 300·c
    assert cfg.members == 120 and cfg.mc_samples == 200 and cfg.dropout == 0.1
    assert cfg.adversarial_epsilon == 0.01  # 1 % of the training inputs' range per dimension
    assert cfg.bootstrap_batches == 2  # two mini-batches of N/2 per epoch
    assert cfg.std_ddof == 1  # the sample std over members / passes
    assert cfg.concrete_temperature == 0.1 and cfg.concrete_length_scale == 1e-4
    assert cfg.dtype == "float32" and cfg.nll_beta == 0.0


def test_cd_and_vd_start_from_the_rate_of_bd():
    """R.3: cd and vd learn their rates from bd's 0.1: concrete p = 0.1, variational α = p/(1 − p)
    (the Gaussian noise of the same variance as Bernoulli dropout's), one per hidden unit."""
    cfg = TrainConfig()
    p = HEADS.lookup("concrete").init_params(3, 32, cfg, dtype=torch.float64, device="cpu")["p_logit"]
    np.testing.assert_allclose(torch.sigmoid(p).numpy(), np.full((3, 1, 1), 0.1), rtol=1e-12)
    la = HEADS.lookup("variational").init_params(3, 32, cfg, dtype=torch.float64, device="cpu")["log_alpha"]
    np.testing.assert_allclose(la.exp().numpy(), np.full((3, 1, 32), 0.1 / 0.9), rtol=1e-12)


@pytest.mark.parametrize("task, c", [("sinusoid", 2), ("styblinski_tang", 1), ("polynomial", 2)])
def test_methods_train_300_c_epochs_and_their_networks(task, c):
    """R.3: 300·c epochs unless ``epochs`` is given; an ensemble trains ``members`` networks per
    repetition, a dropout method one."""
    inst = get_task(task).instance(c, seed=0)
    y = inst.targets([0, 1])
    cfg = TrainConfig(members=5)
    for name, per_rep in (("ens", 5), ("ens_adv", 5), ("ens_bs", 5), ("bd", 1), ("cd", 1), ("vd", 1)):
        job = get_method(name).job(inst, y, [0, 1], cfg)
        assert job.epochs == 300 * c, name
        assert len(job.nets) == 2 * per_rep, name
    assert get_method("ens").job(inst, y, [0, 1], TrainConfig(epochs=7)).epochs == 7


def test_fgsm_step_is_one_percent_of_the_training_range(monkeypatch):
    """R.3: ens_adv's FGSM step is ε = 1 % of the training inputs' range, per dimension."""
    seen = {}

    def capture(model, x, y, **kw):
        seen["step"] = kw["fgsm_step"]
        return model

    monkeypatch.setattr(fused, "train_fused", capture)
    x = np.random.default_rng(0).uniform(0, 1, (30, 2)) * np.array([8.0, 0.5]) + np.array([-4.0, 1.0])
    train_batched(x, np.zeros((1, 30)), NetworkBatch(np.array([0]), np.array([0])), seed=0, head="deterministic",
                  sampler="full", adversarial=True, cfg=TrainConfig(dtype="float64"), epochs=1, sigma=1.0)
    np.testing.assert_allclose(seen["step"].numpy(), 0.01 * (x.max(axis=0) - x.min(axis=0)), rtol=1e-15)


def test_bootstrap_sampler_draws_two_half_batches_with_replacement():
    """R.3: ens_bs takes, each epoch, two optimiser steps on N/2 training rows drawn with
    replacement (uniform over the N rows: 2,000 networks' rows against U{0..N−1} within DKW)."""
    cfg = TrainConfig()
    smp = SAMPLERS.lookup("bootstrap")
    assert smp.steps(cfg) == 2 and smp.rows(50, cfg) == 25
    n, b = 50, 2000
    x = torch.arange(n, dtype=torch.float64)[None, :, None].expand(b, n, 1)
    keys = rng.network_keys(0, "bootstrap", np.arange(b), np.zeros(b, dtype=np.int64))
    batches = list(smp.batches(x, x[..., 0], keys, 3, cfg))
    assert len(batches) == 2
    rows = np.concatenate([xb[..., 0].numpy().ravel() for xb, _ in batches])
    assert rows.size == 2 * b * 25 and set(np.unique(rows)) <= set(range(n))
    assert any(len(np.unique(xb[i, :, 0].numpy())) < 25 for xb, _ in batches for i in range(10))  # repeats
    cdf = np.cumsum(np.bincount(rows.astype(int), minlength=n)) / rows.size
    assert np.max(np.abs(cdf - np.arange(1, n + 1) / n)) < dkw(rows.size)


# -- R.4 and R.5: the study's defaults and the paper presets -------------------------------------


def test_study_default_is_50_repetitions():
    assert StudyConfig().repetitions == 50


@pytest.mark.parametrize("name, task, levels, k", [
    ("paper-e1", "sinusoid", tuple(range(1, 11)), 50),
    ("paper-e2", "styblinski_tang", (1, 2, 3, 4), 50),
    ("paper-e3", "polynomial", (2,), 30),
])
def test_paper_presets_are_the_papers_sizes(name, task, levels, k):
    """R.4/R.5: f_main 1–10 and d 1–4 with k = 50, E.3's heat map with k = 30; 120 members,
    200 MC passes, 300·c epochs, the paper's recipe."""
    cfg = PRESETS.lookup(name).config
    assert (cfg.task, cfg.complexities, cfg.repetitions) == (task, levels, k)
    assert cfg.recipes in (None, ("paper",)) and cfg.train.recipe == "paper"
    assert cfg.train.members == 120 and cfg.train.mc_samples == 200 and cfg.train.epochs is None
    assert cfg.train.dropout == 0.1 and cfg.train.weight_decay is None
