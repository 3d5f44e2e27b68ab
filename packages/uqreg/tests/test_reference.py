"""The exact reference (docs/conventions.md#r-2) against analytic truth.

* it IS ordinary least squares: statsmodels OLS gives the same γ̂, and with the scale fixed to
  σ² the same covariance σ²(ΦᵀΦ)⁻¹ and predictive std;
* its ±z·std interval (z = uqmetrics.COVERAGE_Z, the 97.5 % normal quantile) covers the
  noise-free truth with probability 0.95 under repeated noise
  draws (fixed design), the estimate is unbiased and its sampling variance is σ²(ΦᵀΦ)⁻¹;
* Gauss–Markov: every other linear unbiased estimator has a covariance at least as large
  (exact covariances, no Monte Carlo);
* bad input is rejected with a clear ValueError.

Monte-Carlo tolerances (derivation). With K independent noise draws the number of covering
draws at a test point is exactly Binomial(K, p0), p0 = 2Φ(z) − 1 = 0.95; the empirical
coverage has standard error sqrt(p0(1 − p0)/K). A check passes if the estimate is within k
standard errors. With m checks in one test run (points × Hypothesis examples) we want the
family-wise false-alarm probability below ALPHA_FW = 1e-3, so by Bonferroni
k = Φ⁻¹(1 − ALPHA_FW / (2m)) (k ≈ 4.9 for m = 100; k ≥ 4 always). The same k is used for the
unbiasedness check (the mean of γ̂ is Gaussian with SE sqrt(V_jj/K)) and the variance check
(the sample variance of a Gaussian has SE ≈ var·sqrt(2/(K − 1))).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import statsmodels.api as sm
import uqmetrics
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from uqreg.reference import fit_reference, reference_prediction
from uqreg.tasks import TASKS

Z = uqmetrics.COVERAGE_Z
P0 = 2 * scipy.stats.norm.cdf(Z) - 1  # exact coverage of the ±zσ interval
K_DRAWS = 2000
ALPHA_FW = 1e-3


def k_bonferroni(m: int) -> float:
    """Standard errors allowed for each of ``m`` checks at family-wise level ALPHA_FW."""
    return max(4.0, float(scipy.stats.norm.isf(ALPHA_FW / (2 * m))))


@st.composite
def designs(draw, min_p=1, max_p=7):
    """A random well-conditioned design Φ (N, p), test features (T, p), σ and a seed."""
    p = draw(st.integers(min_p, max_p))
    n = draw(st.integers(p + 2, 60))
    sigma = draw(st.floats(0.05, 20.0))
    seed = draw(st.integers(0, 2**32 - 1))
    g = np.random.default_rng(seed)
    col_scale = 10.0 ** g.uniform(-1.5, 1.5, p)  # different column scales exercise the pivoting
    phi = g.standard_normal((n, p)) * col_scale
    assume(np.linalg.cond(phi / col_scale) < 1e3)
    phi_test = g.standard_normal((5, p)) * col_scale * 2.0  # some beyond the training range
    gamma = g.uniform(-2, 2, p) / col_scale
    return phi, phi_test, gamma, sigma, g


# ---------------------------------------------------------------------------------------------
# (a) equals OLS


@given(designs())
def test_reference_equals_statsmodels_ols(data):
    phi, phi_test, gamma, sigma, g = data
    y = phi @ gamma + sigma * g.standard_normal(phi.shape[0])
    post = fit_reference(phi, y, sigma)
    fit = sm.OLS(y, phi).fit()
    assert post.mean.shape == (1, phi.shape[1])
    scale = np.abs(fit.params).max() + np.linalg.norm(y) / np.linalg.norm(phi, axis=0).max()
    np.testing.assert_allclose(post.mean[0], fit.params, rtol=1e-7, atol=1e-9 * scale)
    cov = fit.cov_params(scale=sigma**2)
    np.testing.assert_allclose(post.covariance, cov, rtol=1e-7, atol=1e-10 * np.abs(cov).max())
    np.testing.assert_allclose(post.covariance, post.covariance.T, rtol=1e-12, atol=1e-14 * np.abs(cov).max())
    mean, std = post.predict(phi_test)
    np.testing.assert_allclose(mean[0], phi_test @ fit.params, rtol=1e-7, atol=1e-9 * np.abs(phi_test @ fit.params).max())
    np.testing.assert_allclose(std, np.sqrt(np.einsum("tp,pq,tq->t", phi_test, cov, phi_test)), rtol=1e-7)
    # aleatoric option: adds σ² to the variance
    _, std_al = post.predict(phi_test, aleatoric=True)
    np.testing.assert_allclose(std_al**2, std**2 + sigma**2, rtol=1e-10)


@given(designs(), st.integers(2, 6))
def test_reference_vectorised_over_repetitions(data, r):
    """y of shape (R, N) gives the R posteriors of the rows one at a time (same covariance)."""
    phi, phi_test, gamma, sigma, g = data
    y = phi @ gamma + sigma * g.standard_normal((r, phi.shape[0]))
    post = fit_reference(phi, y, sigma)
    mean, std = post.predict(phi_test)
    assert mean.shape == (r, phi_test.shape[0]) and std.shape == (phi_test.shape[0],)
    for i in range(r):
        one = fit_reference(phi, y[i], sigma)
        np.testing.assert_allclose(post.mean[i], one.mean[0], rtol=1e-10, atol=1e-12 * np.abs(one.mean).max())
        np.testing.assert_allclose(mean[i], one.predict(phi_test)[0][0], rtol=1e-9, atol=1e-12 * np.abs(mean).max())


# ---------------------------------------------------------------------------------------------
# (b, c) coverage 0.95, unbiased, variance σ²(ΦᵀΦ)⁻¹ under repeated noise draws


def _check_repeated_draws(phi, phi_test, gamma, sigma, y, k):
    """Coverage at every test point, mean and variance of γ̂, from K = len(y) noise draws."""
    n_draws = y.shape[0]
    post = fit_reference(phi, y, sigma)
    mean, std = post.predict(phi_test)
    truth = phi_test @ gamma
    cov = (np.abs(mean - truth) < Z * std).mean(axis=0)
    se_cov = np.sqrt(P0 * (1 - P0) / n_draws)
    assert np.all(np.abs(cov - P0) < k * se_cov), f"coverage {cov} not within {k:.2f} SE ({se_cov:.4f}) of {P0:.4f}"
    v = np.diag(post.covariance)
    se_mean = np.sqrt(v / n_draws)
    bias = post.mean.mean(axis=0) - gamma
    assert np.all(np.abs(bias) < k * se_mean), f"mean of γ̂ − γ = {bias}, SE {se_mean}"
    var = post.mean.var(axis=0, ddof=1)
    assert np.all(np.abs(var - v) < k * v * np.sqrt(2 / (n_draws - 1))), f"var of γ̂ {var} vs σ²V {v}"


EXAMPLES_MC = 12
POINTS_MC = 5 + 7 + 7  # test points, γ̂ means, γ̂ variances (at most) per example


@settings(max_examples=EXAMPLES_MC, suppress_health_check=[HealthCheck.too_slow])
@given(designs())
def test_reference_covers_unbiased_efficient_random_designs(data):
    phi, phi_test, gamma, sigma, g = data
    y = phi @ gamma + sigma * g.standard_normal((K_DRAWS, phi.shape[0]))
    _check_repeated_draws(phi, phi_test, gamma, sigma, y, k_bonferroni(EXAMPLES_MC * POINTS_MC))


# homoscedastic tasks; the heteroscedastic ones (R.7): test_heteroscedastic_reference.py
TASK_CASES = [(name, c) for name, task in sorted(TASKS.items()) for c in task.default_complexities[:2]
              if task.n_train(c) <= 1000 and not task.heteroscedastic]


@pytest.mark.slow
@pytest.mark.parametrize("name, complexity", TASK_CASES)
def test_reference_covers_registered_tasks(name, complexity):
    """Through the task's own noise streams (``instance.targets``), at 5 test points spread over
    the test range (in and out of distribution), for every registered task."""
    inst = TASKS[name].instance(complexity, seed=3)
    y = inst.targets(np.arange(K_DRAWS))  # (K, N): repetition r's noise from its own stream
    idx = np.linspace(0, inst.x_test.shape[0] - 1, 5).round().astype(int)
    phi, phi_test = inst.features(inst.x_train), inst.features(inst.x_test[idx])
    m = len(TASK_CASES) * (5 + 2 * inst.gamma.size)
    _check_repeated_draws(phi, phi_test, inst.gamma, inst.sigma, y, k_bonferroni(m))
    # reference_prediction is the same computation on the instance
    mean, std = reference_prediction(inst, y[:3])
    post = fit_reference(phi, y[:3], inst.sigma)
    np.testing.assert_allclose(mean[:, idx], post.predict(phi_test)[0], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(std[idx], post.predict(phi_test)[1], rtol=1e-10)


def test_coverage_check_has_power():
    """The MC check rejects a too-narrow interval (std × 0.9 covers only 0.923)."""
    g = np.random.default_rng(0)
    phi = g.standard_normal((30, 3))
    gamma = np.ones(3)
    y = phi @ gamma + g.standard_normal((K_DRAWS, 30))
    post = fit_reference(phi, y, 1.0)
    mean, std = post.predict(phi[:5])
    cov = (np.abs(mean - phi[:5] @ gamma) < Z * 0.9 * std).mean(axis=0)
    k = k_bonferroni(EXAMPLES_MC * POINTS_MC)
    assert np.any(np.abs(cov - P0) >= k * np.sqrt(P0 * (1 - P0) / K_DRAWS))


# ---------------------------------------------------------------------------------------------
# (d) Gauss–Markov: no linear unbiased estimator has a smaller covariance


def _assert_psd(mat, what):
    scale = np.abs(mat).max() + 1e-300
    eig = np.linalg.eigvalsh((mat + mat.T) / 2)
    assert eig.min() >= -1e-9 * scale, f"{what}: min eigenvalue {eig.min():.3e} (scale {scale:.3e})"
    return eig


@given(designs(min_p=2), st.integers(0, 2**32 - 1))
def test_gauss_markov_weighted_least_squares(data, wseed):
    phi, _, _, sigma, _ = data
    w = np.random.default_rng(wseed).uniform(0.1, 10.0, phi.shape[0])
    post = fit_reference(phi, np.zeros(phi.shape[0]), sigma)
    a = phi.T @ (w[:, None] * phi)  # ΦᵀWΦ
    ainv = np.linalg.inv(a)
    cov_wls = sigma**2 * ainv @ (phi.T @ ((w**2)[:, None] * phi)) @ ainv  # σ²(ΦᵀWΦ)⁻¹ΦᵀW²Φ(ΦᵀWΦ)⁻¹
    # WLS is linear and unbiased: L Φ = I with L = (ΦᵀWΦ)⁻¹ΦᵀW
    np.testing.assert_allclose(ainv @ phi.T @ (w[:, None] * phi), np.eye(phi.shape[1]), atol=1e-8)
    _assert_psd(cov_wls - post.covariance, "Cov(WLS) − Cov(reference)")


@given(designs(min_p=2), st.integers(0, 2**32 - 1))
def test_gauss_markov_any_linear_unbiased_estimator(data, zseed):
    """L = (ΦᵀΦ)⁻¹Φᵀ + Z(I − H) is linear and unbiased for every Z (p × N); Cov = σ² L Lᵀ."""
    phi, _, _, sigma, _ = data
    n, p = phi.shape
    post = fit_reference(phi, np.zeros(n), sigma)
    ols = np.linalg.lstsq(phi, np.eye(n), rcond=None)[0]  # (p, N)
    hat = phi @ ols
    zmat = np.random.default_rng(zseed).standard_normal((p, n)) * np.abs(ols).max()
    lin = ols + zmat @ (np.eye(n) - hat)
    np.testing.assert_allclose(lin @ phi, np.eye(p), atol=1e-7)
    eig = _assert_psd(sigma**2 * lin @ lin.T - post.covariance, "Cov(L y) − Cov(reference)")
    assert eig.max() > 0  # a different estimator is strictly worse in some direction


# ---------------------------------------------------------------------------------------------
# (e) bad input


def test_rank_deficient_design_names_the_rank():
    g = np.random.default_rng(1)
    phi = g.standard_normal((20, 4))
    phi[:, 3] = phi[:, 0] - 2 * phi[:, 1]
    with pytest.raises(ValueError, match=r"rank 3"):
        fit_reference(phi, np.zeros(20), 1.0)
    phi[:, 3] = 0.0
    with pytest.raises(ValueError, match="rank"):
        fit_reference(phi, np.zeros(20), 1.0)


def test_fewer_points_than_parameters():
    with pytest.raises(ValueError, match="N=3 .* p=5"):
        fit_reference(np.ones((3, 5)), np.zeros(3), 1.0)


@pytest.mark.parametrize("sigma", [0.0, -1.0, np.nan, np.inf])
def test_sigma_must_be_positive(sigma):
    with pytest.raises(ValueError, match="sigma"):
        fit_reference(np.eye(3), np.zeros(3), sigma)


def test_shape_and_finiteness_errors():
    phi = np.random.default_rng(0).standard_normal((10, 2))
    with pytest.raises(ValueError, match="y must have shape"):
        fit_reference(phi, np.zeros(9), 1.0)
    with pytest.raises(ValueError, match="phi must have shape"):
        fit_reference(np.zeros(10), np.zeros(10), 1.0)
    with pytest.raises(ValueError, match="finite"):
        fit_reference(phi, np.full(10, np.nan), 1.0)
    post = fit_reference(phi, np.zeros(10), 1.0)
    with pytest.raises(ValueError, match="phi_test"):
        post.predict(np.zeros((4, 3)))
