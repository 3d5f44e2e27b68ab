"""The Bayesian methods against analytic references (issue 10, item 6).

Model: Bayesian linear regression with a bias, ``m`` independent outputs and Gaussian noise
``sigma`` — ``nn.Linear(2, m)`` trained with the methods' own hooks on the mean Gaussian NLL.
Its posterior under the weight-decay prior ``N(0, (N wd)^-1 I)`` is exactly Gaussian
(precision ``X^T X / sigma^2 + N wd I`` per output). The design makes the methods'
approximations exact, so the only difference left is Monte-Carlo error:

- inputs and bias are columns of a Sylvester-Hadamard matrix scaled by ``c`` (orthogonal, so
  the posterior precision is diagonal: mean-field VI is exact), and each output's residuals
  at the least-squares fit are ``sigma`` times another Hadamard column (so with a flat prior
  the empirical Fisher equals the true one, and K-FAC with one Kronecker factor per layer is
  the exact posterior precision);
- SWAG summarises constant-learning-rate SGD iterates; its target is the exact stationary
  covariance of SGD with i.i.d. minibatches (a discrete Lyapunov equation solved below),
  which on an isotropic design at Mandt et al.'s learning rate ``2B / (N h)`` is the
  posterior up to a computed gap;
- cyclical SGLD's snapshots have an exactly computable Gaussian law (linear dynamics); the
  test checks that it is the posterior to 2 % and that the snapshots follow it.

Tolerances are ``Z`` standard errors computed from the samples (means: s/sqrt(n); variances:
s^2 sqrt(2/(n-1)), Gaussian samples; SWAG's autocorrelated iterates: batch means; VI: the
spread over the ``m`` outputs, which are independent replicates), with ``Z`` the Bonferroni
quantile (normal, or Student t for the estimated standard errors) for a family-wise
false-alarm rate of 1e-3 over every comparison in this file. Pooling over the outputs
(independent by construction) gives ``m`` samples per draw.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import scipy.stats
import torch
from torch import nn

from uqvision.methods import TRAINING_METHODS
from uqvision.methods.swag import swag_moments

N, SIGMA, OUTPUTS = 1024, 0.5, 16
# every statistical comparison in this file: (w1, w2, b) x (mean, var) for Laplace, cSGLD and
# SWAG, (w1, w2) x (mean, var) for VI
COMPARISONS, BLOCKS = 3 * 2 * 3 + 2 * 2, 20
Z = float(scipy.stats.norm.ppf(1 - 1e-3 / (2 * COMPARISONS)))
Z_BLOCKS = float(scipy.stats.t.ppf(1 - 1e-3 / (2 * COMPARISONS), BLOCKS - 1))
Z_OUTPUTS = float(scipy.stats.t.ppf(1 - 1e-3 / (2 * COMPARISONS), OUTPUTS - 1))


def gaussian_nll(output, y, reduction="mean"):
    """Gaussian NLL (constants dropped), summed over outputs; torch-style ``reduction``."""
    per_example = (0.5 * ((output - y) / SIGMA) ** 2).sum(-1)
    return {"mean": per_example.mean, "sum": per_example.sum}.get(reduction,
                                                                  lambda: per_example)()


def design(c, outputs=OUTPUTS, n=N, seed=0):
    """X (N, 2) = Hadamard columns 1, 2 scaled by ``c`` and Y (N, outputs) whose residuals at
    the least-squares fit are ``SIGMA`` times Hadamard columns 3, 4, ... (column 0: bias)."""
    h = scipy.linalg.hadamard(n).astype(np.float64)
    x = h[:, 1:3] * np.asarray(c)
    rng = np.random.default_rng(seed)
    w, b = rng.normal(size=(2, outputs)), rng.normal(size=outputs)
    y = x @ w + b + SIGMA * h[:, 3:3 + outputs]
    return torch.from_numpy(x), torch.from_numpy(y)


def posterior(x, y, wd):
    """Exact posterior of each output's (w1, w2, b): mean (3, m) and covariance (3, 3)."""
    xa = np.column_stack([x.numpy(), np.ones(len(x))])
    precision = xa.T @ xa / SIGMA**2 + len(x) * wd * np.eye(3)
    cov = np.linalg.inv(precision)
    return cov @ xa.T @ y.numpy() / SIGMA**2, cov


def train(name, hp, x, y, *, batch=None, seed=0, record=None):
    """The methods' hooks driven as the training loop does: full batch, or ``batch`` examples
    drawn with replacement (``N // batch`` steps per epoch)."""
    method = TRAINING_METHODS.lookup(name)
    torch.manual_seed(seed)
    n = len(x)
    spe = 1 if batch is None else n // batch
    state = method.start(nn.Linear(2, y.shape[1]).double(), hp, n_train=n, steps_per_epoch=spe,
                         seed=seed, nll=gaussian_nll)
    gen = torch.Generator().manual_seed(seed)
    while not state.done:
        idx = slice(None) if batch is None else torch.randint(n, (batch,), generator=gen)
        method.step(state, x[idx], y[idx])
        if state.step % spe == 0:
            method.end_epoch(state)
        if record is not None:
            record(state)
    method.finish(state, [(x, y)], None)
    return method, state


PROBES = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], dtype=torch.float64)


def draws(method, state, k):
    """(k, 3, m): each sample's (w1, w2, b) per output, read off the network's outputs at the
    probes e1, e2, 0 (so stochastic forward passes count too)."""
    out = []
    with torch.no_grad():
        for net in method.samples(state, k, 1):
            f = net(PROBES)
            out.append(torch.stack([f[0] - f[2], f[1] - f[2], f[2]]).numpy())
    return np.stack(out)


def check_moments(samples, mean, var, coords, what):
    """Pooled over outputs: mean deviation ~ 0 and variance ~ ``var`` within Z standard
    errors. ``samples`` (n, 3, m) independent draws, ``mean`` (3, m), ``var`` (3,)."""
    for j in coords:
        dev = (samples[:, j] - mean[j]).ravel()
        n = dev.size
        se_mean = math.sqrt(var[j] / n)
        assert abs(dev.mean()) <= Z * se_mean, (what, j, dev.mean(), se_mean)
        v = dev.var(ddof=1)
        se_var = v * math.sqrt(2 / (n - 1))
        assert abs(v - var[j]) <= Z * se_var, (what, j, v, var[j], se_var)


def check_across_outputs(samples, mean, var, coords, what):
    """Per output: the mean deviation and the variance of its draws; their averages over the
    ``m`` outputs (independent replicates: each output is its own regression with its own
    parameters) against 0 and ``var`` with the standard error of the spread over outputs
    (Student t, m - 1 dof), which covers each output's optimisation error besides the
    Monte-Carlo error."""
    for j in coords:
        dev = samples[:, j] - mean[j]  # (n, m)
        for stat, target in ((dev.mean(0), 0.0), (dev.var(0, ddof=1), var[j])):
            se = stat.std(ddof=1) / math.sqrt(stat.size)
            assert abs(stat.mean() - target) <= Z_OUTPUTS * se, (what, j, stat.mean(), target, se)


def test_kfac_laplace_is_the_exact_posterior():
    """Flat prior: the MAP is least squares, A = X^T X / N, G = I / sigma^2 exactly."""
    x, y = design((2.0, 0.5))
    hp = TRAINING_METHODS.lookup("kfac_laplace").hparams_from(
        epochs=600, lr_init=0.05, weight_decay=0.0, scales=(1.0,), bn_update=False)
    method, state = train("kfac_laplace", hp, x, y)
    mean, cov = posterior(x, y, 0.0)
    trained = torch.cat([state.net.weight.T, state.net.bias[None]]).detach().numpy()
    assert np.abs(trained - mean).max() < 1e-3 * math.sqrt(cov.diagonal().min())  # at the MAP
    check_moments(draws(method, state, 1000), mean, cov.diagonal(), range(3), "laplace")


@pytest.mark.slow
def test_vi_reaches_the_mean_field_optimum():
    """The exact ELBO (KL weight 1); the posterior precision is diagonal, so the mean-field
    optimum is the posterior itself (the bias is a point estimate: only w is compared). Adam
    at a constant rate leaves each fitted log-sigma jittering (~1.5 %), hence the comparison
    across outputs."""
    x, y = design((2.0, 0.5))
    wd = 0.05
    mean, cov = posterior(x, y, wd)
    assert np.allclose(cov, np.diag(cov.diagonal()), atol=1e-15)
    hp = TRAINING_METHODS.lookup("vi").hparams_from(
        pretrain_epochs=300, pretrain_lr=0.05, epochs=4000, lr_init=0.05, log_sigma_lr=1e-3,
        kl_weight=1.0, weight_decay=wd)
    method, state = train("vi", hp, x, y)
    check_across_outputs(draws(method, state, 4000), mean, cov.diagonal(), range(2), "vi")


def csgld_law(h, lrs, noise, n, cycles):
    """Mean contraction and variance of one coordinate's snapshot after each cycle of SGLD on
    a quadratic with curvature ``h`` (mean loss), learning rates ``lrs`` per cycle step, noise
    in the last ``noise`` steps: ``e' = (1 - lr h) e + sqrt(2 lr / n) xi``."""
    var, out = 0.0, []
    for _ in range(cycles):
        phi = 1.0
        for i, lr in enumerate(lrs):
            var, phi = (1 - lr * h) ** 2 * var + (2 * lr / n if i >= len(lrs) - noise else 0.0), \
                phi * (1 - lr * h)
        out.append((phi, var))
    return out


@pytest.mark.slow
def test_csgld_snapshots_follow_the_posterior():
    """Snapshots against the sampler's exact law (independent across cycles), which is the
    posterior to 2 %. 256 outputs (nearly free with full batches) let 30 cycles resolve a
    10 % error in the variance."""
    n, c, wd = 512, (1.5, 0.75), 0.05
    x, y = design(c, outputs=256, n=n)
    cycles, length, noise = 30, 400, 200
    method = TRAINING_METHODS.lookup("csgld")
    hp = method.hparams_from(
        cycles=cycles, cycle_epochs=length, noise_epochs=noise, samples_per_cycle=1,
        sample_gap_epochs=1, lr0=0.1, weight_decay=wd, temperature=1.0)  # the posterior itself
    mean, cov = posterior(x, y, wd)
    h = np.array([c[0] ** 2, c[1] ** 2, 1.0]) / SIGMA**2 + wd  # diagonal mean-loss curvature
    lrs = [method.lr_at(s, 1, hp) for s in range(length)]
    law = np.empty(3)
    for j, hj in enumerate(h):
        cycle_laws = csgld_law(hj, lrs, noise, n, cycles)
        # each cycle forgets the previous one and the initialisation: independent snapshots
        # with one law (cycle 1 starts from variance 0, the others from the last snapshot's)
        assert max(phi for phi, _ in cycle_laws) < 1e-12
        law[j] = cycle_laws[-1][1]
        assert abs(cycle_laws[0][1] / law[j] - 1) < 1e-12
    assert np.all(np.abs(law / cov.diagonal() - 1) < 0.02)  # discretisation: the posterior to 2 %
    _, state = train("csgld", hp, x, y)
    assert len(state.snapshots) == cycles
    snaps = np.stack([np.concatenate([s.weights["weight"].T.numpy(), s.weights["bias"][None]])
                      for s in state.snapshots])
    check_moments(snaps, mean, law, range(3), "csgld")


def sgd_stationary_covariance(x, y, wd, lr, batch):
    """Exact stationary covariance of SGD iterates (one output) with ``batch`` examples drawn
    i.i.d. with replacement: ``S = E[M S M^T] + lr^2 Cov(g_B)``, ``M = I - lr H_B``."""
    xa = np.column_stack([x.numpy(), np.ones(len(x))])
    d = xa.shape[1]
    mean, _ = posterior(x, y, wd)
    h_i = np.einsum("ia,ib->iab", xa, xa) / SIGMA**2 + wd * np.eye(d)
    g_i = np.einsum("iab,b->ia", h_i, mean[:, 0]) - xa * y.numpy()[:, :1] / SIGMA**2
    assert np.abs(g_i.mean(0)).max() < 1e-9  # per-example gradients at the MAP average to 0
    m_i = np.eye(d) - lr * h_i
    m_bar = m_i.mean(0)
    emm = np.kron(m_bar, m_bar) + (np.einsum("iab,icd->acbd", m_i, m_i).reshape(d * d, d * d)
                                   / len(xa) - np.kron(m_bar, m_bar)) / batch
    noise = lr**2 * g_i.T @ g_i / len(xa) / batch
    return np.linalg.solve(np.eye(d * d) - emm, noise.ravel()).reshape(d, d)


@pytest.mark.slow
def test_swag_mean_is_the_running_average_and_its_diagonal_the_sgd_law():
    """SWAG's moments are exactly those of the iterates it collected; the iterates follow the
    exact stationary law of SGD, which on this isotropic design at Mandt et al.'s learning rate
    is the posterior to 1 %. Iterates are autocorrelated: standard errors from batch means
    (``BLOCKS`` blocks, Student t quantile)."""
    x, y = design((1.0, 1.0))
    wd, batch, collections = 0.05, 16, 240
    lr = 2 * batch / (N * (1 / SIGMA**2 + wd))
    mean, cov = posterior(x, y, wd)
    law = sgd_stationary_covariance(x, y, wd, lr, batch).diagonal()
    assert np.all(np.abs(law / cov.diagonal() - 1) < 0.01)
    hp = TRAINING_METHODS.lookup("swag").hparams_from(
        pretrain_epochs=20, lr_init=0.05, swag_epochs=collections, swag_lr=lr, momentum=0.0,
        weight_decay=wd, rank=20, bn_update=False)
    iterates = []

    def record(state):
        if int(state.extra.get("swag.n", 0)) > len(iterates):
            iterates.append(torch.nn.utils.parameters_to_vector(state.net.parameters())
                            .detach().numpy().copy())

    _, state = train("swag", hp, x, y, batch=batch, record=record)
    swa, var, dev = (t.numpy() for t in swag_moments(state))
    w = np.stack(iterates)
    assert w.shape[0] == collections and dev.shape == (20, w.shape[1])
    # SWA mean and SWAG diagonal: the running moments of the iterates (float64 rounding only)
    np.testing.assert_allclose(swa, w.mean(0), rtol=0, atol=1e-13 * np.abs(w).max())
    np.testing.assert_allclose(var, w.var(0), rtol=1e-9, atol=1e-18)
    np.testing.assert_allclose(dev[-1], w[-1] - swa, rtol=0, atol=1e-6 * np.abs(w).max())
    # parameters_to_vector order: weight (m, 2) row-major, then bias (m,)
    deviation = w - np.concatenate([mean[:2].T.ravel(), mean[2]])
    for j, idx in enumerate([slice(0, 2 * OUTPUTS, 2), slice(1, 2 * OUTPUTS, 2),
                             slice(2 * OUTPUTS, None)]):
        d = deviation[:, idx]  # (collections, m)
        for stat, target in ((lambda b: b.mean(), 0.0), (lambda b: (b**2).mean(), law[j])):
            blocks = np.array([stat(b) for b in np.array_split(d, BLOCKS)])
            se = blocks.std(ddof=1) / math.sqrt(BLOCKS)
            assert abs(stat(d) - target) <= Z_BLOCKS * se, (j, stat(d), target, se)


def test_kfac_damping_is_pi_corrected():
    """Per layer the sampling factors are the inverse Cholesky factors of (A + pi sqrt(eps) I)
    and (G + sqrt(eps)/pi I), pi = sqrt((tr A / dim A) / (tr G / dim G)) (Martens & Grosse
    6.3), eps = prior precision / N, the prior precision N wd unless given."""
    from uqvision.methods.laplace import _kfac_posterior

    x, y = design((2.0, 0.5))
    for wd, prior, eps in ((0.01, None, 0.01), (0.01, 2048.0, 2.0)):
        hp = TRAINING_METHODS.lookup("kfac_laplace").hparams_from(
            epochs=50, lr_init=0.05, weight_decay=wd, prior_precision=prior, scales=(1.0,),
            bn_update=False)
        _, state = train("kfac_laplace", hp, x, y)
        a, g = state.extra["kfac..A"].numpy(), state.extra["kfac..G"].numpy()
        xa = np.column_stack([x.numpy(), np.ones(len(x))])
        np.testing.assert_allclose(a, xa.T @ xa / len(x), rtol=1e-12)
        pi = math.sqrt((np.trace(a) / len(a)) / (np.trace(g) / len(g)))
        [(module, left, right)] = _kfac_posterior(state)
        assert module is state.net
        np.testing.assert_allclose(left.numpy() @ left.numpy().T,
                                   np.linalg.inv(g + math.sqrt(eps) / pi * np.eye(len(g))),
                                   rtol=1e-9)
        np.testing.assert_allclose(right.numpy().T @ right.numpy(),
                                   np.linalg.inv(a + pi * math.sqrt(eps) * np.eye(len(a))),
                                   rtol=1e-9)
