"""The heteroscedastic tasks and their exact reference (docs/conventions.md#r-7) against analytic truth.

With the noise σ(x_i) known, the flat-prior posterior is weighted least squares:
``Σ_post = (ΦᵀWΦ)⁻¹``, ``W = diag(1/σ(x_i)²)``, ``γ̂ = Σ_post ΦᵀW y``. At x the exact epistemic
variance is ``G(x)ᵀ Σ_post G(x)``, the aleatoric one ``σ(x)²``, the predictive their sum.

* it equals the closed form and statsmodels WLS on random inputs, and no linear unbiased
  estimator beats it (Aitken: the true covariance of OLS under the same noise is larger);
* σ constant is the homoscedastic reference bit for bit (a constant σ array; a task whose noise
  profile is constant), and the weighted computation with (almost) constant weights equals it;
* training, calibration and test targets carry the noise σ(x) of their own input;
* Monte Carlo over K noise draws on a fixed design: the ±z·epistemic-std band covers the
  noise-free f(x*), and the ±z·predictive-std band covers a fresh noisy target, each with
  probability exactly 0.95; γ̂ is unbiased with variance diag Σ_post. Tolerances are k binomial
  standard errors, k from the sample size and the number of checks (test_reference.py's
  derivation, Bonferroni at family-wise level 1e-3). On random designs and on every registered
  heteroscedastic task;
* the check has power against the wrong variants: with the two parts swapped, and with the
  weights ignored (ordinary least squares with one σ, the training RMS), it fails in the noisy
  region.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import pytest
import statsmodels.api as sm
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_reference import K_DRAWS, P0, Z, _assert_psd, _check_repeated_draws, designs, k_bonferroni

from uqreg import cli
from uqreg.reference import (
    fit_reference,
    reference_decomposition,
    reference_posterior,
    reference_prediction,
)
from uqreg.tasks import ST_BUMPS, TASKS

HET_TASKS = sorted(name for name, task in TASKS.items() if task.heteroscedastic)
N_POINTS = 9  # test points per task in the Monte-Carlo checks, spread over the test inputs
# checks in one run of the task test: per task the two coverages at every point and the mean
# and variance of each of the p ≤ 6 parameters
K_TASKS = k_bonferroni(len(HET_TASKS) * (2 * N_POINTS + 2 * 6))


def coverage_failures(mean, band_variance, target, k):
    """Coverage of ``target`` by ``mean ± z·sqrt(band_variance)`` over the draws (axis 0) per
    point, and where it lies k binomial standard errors or more from P0 = 0.95."""
    cov = (np.abs(np.asarray(target) - mean) < Z * np.sqrt(band_variance)).mean(axis=0)
    se = np.sqrt(P0 * (1 - P0) / mean.shape[0])
    return cov, np.abs(cov - P0) >= k * se


@st.composite
def het_designs(draw):
    """A random design (test_reference.designs) with noise σ_i spread over a factor 100, and σ
    at the test points."""
    phi, phi_test, gamma, sigma, g = draw(designs())
    s = sigma * 10.0 ** g.uniform(-1, 1, phi.shape[0])
    s_test = sigma * 10.0 ** g.uniform(-1, 1, phi_test.shape[0])
    return phi, phi_test, gamma, s, s_test, g


def test_every_family_has_a_heteroscedastic_task():
    assert HET_TASKS == ["polynomial_het", "sinusoid_het", "styblinski_tang_het"]
    for name in HET_TASKS:  # the same task as its family's, the noise aside
        het, base = TASKS[name], TASKS[name.removesuffix("_het")]
        assert replace(het, name=base.name, noise=None, description=base.description) == base


def test_heteroscedastic_tasks_have_their_documented_noise():
    sin = TASKS["sinusoid_het"].instance(1, 0)
    s = sin.noise_std(sin.x_test)  # x* increasing over [−6, 6]
    assert np.all(np.diff(s) > 0) and s[0] > 0.15 and s[-1] < 1.5
    box = sin.noise_std(np.array([[-4.0], [4.0]]))
    np.testing.assert_allclose(box, 0.75 * (0.2 + 1.8 / (1 + np.exp([4.0, -4.0]))), rtol=1e-12)
    st_ = TASKS["styblinski_tang_het"]
    for d in (1, 2):
        at = st_.noise_std(np.array([[c] * d for c in (*ST_BUMPS, -5.0, 0.25, 5.0)]), d)
        np.testing.assert_allclose(at[:2], 3 * 2.0, rtol=1e-3)  # peaks: 3·(0.25 + 1.75)
        np.testing.assert_allclose(at[2:], 3 * 0.25, rtol=2e-3)  # far from the bumps: the floor
    poly = TASKS["polynomial_het"].instance(2, 0)
    x = poly.x_test
    np.testing.assert_allclose(poly.noise_std(x), 0.5 * (0.1 + np.linalg.norm(x, axis=1) / 4), rtol=1e-12)
    assert poly.noise_std(np.zeros((1, 2)))[0] == pytest.approx(0.05)  # the floor keeps σ > 0
    # --sigma / StudyConfig.sigma scales σ(x)
    np.testing.assert_allclose(TASKS["sinusoid_het"].instance(1, 0, sigma=1.5).noise_std(sin.x_test), 2 * s)


# ---------------------------------------------------------------------------------------------
# exact algebra: WLS = closed form = statsmodels; efficient; σ constant = homoscedastic


@settings(max_examples=20)  # CI time: each property is exact, a few designs suffice
@given(het_designs())
def test_wls_equals_closed_form_and_statsmodels(data):
    phi, phi_test, gamma, s, s_test, g = data
    y = phi @ gamma + s * g.standard_normal(phi.shape[0])
    post = fit_reference(phi, y, s)
    assert post.heteroscedastic
    w = 1 / s**2
    cov = np.linalg.inv(phi.T @ (w[:, None] * phi))  # the closed form Σ_post = (ΦᵀWΦ)⁻¹
    mean = cov @ (phi.T @ (w * y))  # μ_post = Σ_post ΦᵀW y
    fit = sm.WLS(y, phi, weights=w).fit()
    scale = np.abs(cov).max()
    for ref_mean, ref_cov in ((mean, cov), (fit.params, fit.cov_params(scale=1.0))):
        np.testing.assert_allclose(post.mean[0], ref_mean, rtol=1e-6, atol=1e-9 * np.abs(ref_mean).max())
        np.testing.assert_allclose(post.covariance, ref_cov, rtol=1e-6, atol=1e-9 * scale)
    dec = post.decompose(phi_test, s_test)
    epi = np.einsum("tp,pq,tq->t", phi_test, cov, phi_test)
    np.testing.assert_allclose(dec.epistemic_variance, epi, rtol=1e-6, atol=1e-12 * epi.max())
    np.testing.assert_array_equal(dec.aleatoric_variance, s_test**2)
    np.testing.assert_array_equal(dec.predictive_variance, dec.epistemic_variance + s_test**2)
    np.testing.assert_allclose(dec.mean[0], phi_test @ mean, rtol=1e-6, atol=1e-9 * np.abs(phi_test @ mean).max())
    m, sd = post.predict(phi_test)
    np.testing.assert_array_equal(m, dec.mean)
    np.testing.assert_array_equal(sd, dec.epistemic_std)
    np.testing.assert_array_equal(post.predict(phi_test, aleatoric=True, noise_std=s_test)[1], dec.predictive_std)
    # Aitken: OLS under the same noise has covariance (ΦᵀΦ)⁻¹ΦᵀΣΦ(ΦᵀΦ)⁻¹ ⪰ Σ_post
    ols = np.linalg.pinv(phi)
    _assert_psd(ols @ (s[:, None] ** 2 * ols.T) - post.covariance, "Cov(OLS) − Σ_post")


@settings(max_examples=15)
@given(designs())
def test_constant_sigma_is_the_homoscedastic_reference(data):
    phi, phi_test, gamma, sigma, g = data
    n = phi.shape[0]
    y = phi @ gamma + sigma * g.standard_normal((3, n))
    one, arr = fit_reference(phi, y, sigma), fit_reference(phi, y, np.full(n, sigma))
    assert not arr.heteroscedastic and arr.sigma == sigma
    for field in ("mean", "r", "perm"):
        np.testing.assert_array_equal(getattr(arr, field), getattr(one, field))
    for aleatoric in (False, True):
        for a, b in zip(arr.predict(phi_test, aleatoric=aleatoric), one.predict(phi_test, aleatoric=aleatoric)):
            np.testing.assert_array_equal(a, b)
    dec = arr.decompose(phi_test)
    np.testing.assert_array_equal(dec.epistemic_std, one.predict(phi_test)[1])
    np.testing.assert_array_equal(dec.aleatoric_variance, np.full(len(phi_test), sigma**2))
    # the weighted computation (one σ_i a ulp off) with constant weights is the same posterior
    s = np.full(n, sigma)
    s[0] = np.nextafter(sigma, np.inf)
    wls = fit_reference(phi, y, s)
    assert wls.heteroscedastic
    np.testing.assert_allclose(wls.covariance, one.covariance, rtol=1e-8, atol=1e-12 * np.abs(one.covariance).max())
    m_w, m_o = wls.predict(phi_test)[0], one.predict(phi_test)[0]
    np.testing.assert_allclose(m_w, m_o, rtol=1e-8, atol=1e-10 * np.abs(m_o).max())
    np.testing.assert_allclose(wls.decompose(phi_test, sigma).predictive_variance,
                               one.predict(phi_test, aleatoric=True)[1] ** 2, rtol=1e-8)


@pytest.mark.parametrize("name", ["polynomial", "sinusoid", "styblinski_tang"])
def test_constant_noise_profile_reproduces_the_homoscedastic_task(name):
    """A task whose registered σ(x) is constant draws the same targets and has the same exact
    reference, bit for bit, as the homoscedastic task."""
    base = TASKS[name]
    flat = replace(base, name=f"{name}_flat", noise=lambda x, c: np.ones(x.shape[0]))
    c = base.default_complexities[0]
    a, b = base.instance(c, 7), flat.instance(c, 7)
    assert b.heteroscedastic and not a.heteroscedastic
    reps = np.arange(3)
    np.testing.assert_array_equal(b.targets(reps), a.targets(reps))
    np.testing.assert_array_equal(b.test_targets(reps), a.test_targets(reps))
    for u, v in zip(b.calibration(reps, 5), a.calibration(reps, 5)):
        np.testing.assert_array_equal(u, v)
    y = a.targets(reps)
    for aleatoric in (False, True):
        for u, v in zip(reference_prediction(b, y, aleatoric=aleatoric), reference_prediction(a, y, aleatoric=aleatoric)):
            np.testing.assert_array_equal(u, v)
    da, db = reference_decomposition(a, y), reference_decomposition(b, y)
    for field in ("mean", "epistemic_variance", "aleatoric_variance"):
        np.testing.assert_array_equal(getattr(db, field), getattr(da, field))
    np.testing.assert_array_equal(da.aleatoric_variance, base.sigma**2)


# ---------------------------------------------------------------------------------------------
# the targets carry σ(x) of their input


def _unit_variance(z, k, what):
    """z (draws, points) standardised residuals: the sample variance is 1 within k SEs."""
    var = z.var(axis=0, ddof=1)
    se = np.sqrt(2 / (z.shape[0] - 1))
    assert np.all(np.abs(var - 1) < k * se), f"{what}: variance of (y − f)/σ(x) {var} not 1 within {k:.2f}·{se:.4f}"


@pytest.mark.parametrize("name", HET_TASKS)
def test_targets_carry_the_noise_of_their_input(name):
    task = TASKS[name]
    inst = task.instance(task.default_complexities[0], seed=1)
    n = inst.x_train.shape[0]
    k = k_bonferroni(len(HET_TASKS) * (n + 2 + 2))  # per task: N points, 2 halves × 2 draws
    y = inst.targets(np.arange(1000))
    _unit_variance((y - inst.f_train) / inst.noise_std(inst.x_train), k, "training targets, per point")
    # calibration and test targets, pooled over the points in the quieter and the noisier half
    x_cal, y_cal = inst.calibration(np.arange(200), 50)
    s_cal = inst.noise_std(x_cal.reshape(-1, x_cal.shape[-1]))
    z_cal = (y_cal.ravel() - inst.truth(x_cal.reshape(-1, x_cal.shape[-1]))) / s_cal
    z_new = ((inst.test_targets(np.arange(200)) - inst.f_test) / inst.noise_std(inst.x_test))
    s_new = np.broadcast_to(inst.noise_std(inst.x_test), z_new.shape).ravel()
    for z, s, what in ((z_cal, s_cal, "calibration targets"), (z_new.ravel(), s_new, "test targets")):
        quiet = s <= np.median(s)
        for half in (quiet, ~quiet):
            _unit_variance(z[half][:, None], k, what)
    # deterministic per seed; a repetition's draw does not depend on the others drawn with it
    np.testing.assert_array_equal(inst.targets([3]), y[3:4])
    np.testing.assert_array_equal(inst.test_targets([3])[0], task.instance(task.default_complexities[0], seed=1)
                                  .test_targets(np.arange(5))[3])
    assert not np.array_equal(inst.test_targets([0]), inst.test_targets([1]))


def test_epistemic_shrinks_with_data_aleatoric_does_not():
    """Ten times the data: the epistemic variance falls everywhere, the aleatoric stays σ(x)²."""
    task = TASKS["sinusoid_het"]
    small, large = task.instance(1, 0, n_train=50), task.instance(1, 0, n_train=500)
    ds, dl = (reference_decomposition(i, i.targets([0])) for i in (small, large))
    assert np.all(dl.epistemic_variance < ds.epistemic_variance)
    np.testing.assert_array_equal(dl.aleatoric_variance, ds.aleatoric_variance)
    np.testing.assert_array_equal(ds.aleatoric_variance, small.noise_std(small.x_test) ** 2)


# ---------------------------------------------------------------------------------------------
# Monte Carlo: the exact parts cover with probability 0.95


EXAMPLES_MC = 3  # random designs (the registered tasks below add three more)
K_RANDOM = k_bonferroni(EXAMPLES_MC * (5 + 5 + 7 + 7))  # per example: 2 × 5 points, γ̂ mean and var


@settings(max_examples=EXAMPLES_MC, suppress_health_check=[HealthCheck.too_slow])
@given(het_designs())
def test_wls_covers_unbiased_efficient_random_designs(data):
    phi, phi_test, gamma, s, s_test, g = data
    y = phi @ gamma + s * g.standard_normal((K_DRAWS, phi.shape[0]))
    _check_repeated_draws(phi, phi_test, gamma, s, y, K_RANDOM)  # f covered, γ̂ unbiased, var Σ_post
    dec = fit_reference(phi, y, s).decompose(phi_test, s_test)
    y_new = phi_test @ gamma + s_test * g.standard_normal((K_DRAWS, phi_test.shape[0]))
    cov, bad = coverage_failures(dec.mean, dec.predictive_variance, y_new, K_RANDOM)
    assert not bad.any(), f"predictive coverage {cov} of new targets not 0.95 within {K_RANDOM:.2f} SE"


@functools.cache
def _draws(name):
    """K noise draws of task ``name`` (seed 3, first default complexity) through its own noise
    streams, N_POINTS test points, and a fresh noisy target at each per draw."""
    task = TASKS[name]
    inst = task.instance(task.default_complexities[0], seed=3)
    idx = np.linspace(0, inst.x_test.shape[0] - 1, N_POINTS).round().astype(int)
    return inst, inst.x_test[idx], inst.targets(np.arange(K_DRAWS)), inst.test_targets(np.arange(K_DRAWS))[:, idx]


@pytest.mark.parametrize("name", HET_TASKS)
def test_exact_parts_cover_registered_tasks(name):
    inst, x, y, y_new = _draws(name)
    dec = reference_decomposition(inst, y, x)
    np.testing.assert_array_equal(dec.aleatoric_variance, inst.noise_std(x) ** 2)
    cov_f, bad_f = coverage_failures(dec.mean, dec.epistemic_variance, inst.truth(x), K_TASKS)
    cov_y, bad_y = coverage_failures(dec.mean, dec.predictive_variance, y_new, K_TASKS)
    assert not bad_f.any(), f"{name}: epistemic band covers f with {cov_f}, not 0.95 within {K_TASKS:.2f} SE"
    assert not bad_y.any(), f"{name}: predictive band covers new targets with {cov_y}, not 0.95"
    _check_repeated_draws(inst.features(inst.x_train), inst.features(x), inst.gamma,
                          inst.noise_std(inst.x_train), y, K_TASKS)  # γ̂ unbiased, variance Σ_post
    post = reference_posterior(inst, y[:2])  # the instance-level functions agree
    np.testing.assert_array_equal(reference_prediction(inst, y[:2])[1], post.predict(inst.features(inst.x_test))[1])


def test_check_fails_when_the_parts_are_swapped():
    inst, x, y, y_new = _draws("sinusoid_het")
    dec = reference_decomposition(inst, y, x)
    cov_f, bad_f = coverage_failures(dec.mean, dec.aleatoric_variance, inst.truth(x), K_TASKS)
    assert bad_f.all() and np.all(cov_f > P0), cov_f  # σ(x)² as the band of f: far too wide
    cov_y, bad_y = coverage_failures(dec.mean, dec.epistemic_variance, y_new, K_TASKS)
    assert bad_y.all() and np.all(cov_y < P0), cov_y  # Gᵀ Σ_post G as the noise: far too narrow


def test_check_fails_when_the_weights_are_ignored():
    """Ordinary least squares with one σ (the training RMS of σ(x_i)) on heteroscedastic data:
    both its bands under-cover where σ(x) exceeds that σ."""
    inst, x, y, y_new = _draws("sinusoid_het")
    s_bar = float(np.sqrt(np.mean(inst.noise_std(inst.x_train) ** 2)))
    mean, std = fit_reference(inst.features(inst.x_train), y, s_bar).predict(inst.features(x))
    noisy = inst.noise_std(x) > s_bar
    assert noisy.sum() >= 3
    cov_f, bad_f = coverage_failures(mean, std**2, inst.truth(x), K_TASKS)
    cov_y, bad_y = coverage_failures(mean, std**2 + s_bar**2, y_new, K_TASKS)
    assert bad_f[noisy].all() and np.all(cov_f[noisy] < P0), cov_f
    assert bad_y[noisy].all() and np.all(cov_y[noisy] < P0), cov_y


# ---------------------------------------------------------------------------------------------
# uqreg reference, and bad input


def test_reference_command_reports_both_parts(tmp_path, capsys):
    for name, hetero in (("sinusoid_het", 1), ("sinusoid", 0)):
        path = tmp_path / f"{name}.nc"
        assert cli.main(["reference", "--task", name, "--repetitions", "4", "--out", str(path)]) == 0
        out = capsys.readouterr().out
        assert "coverage over 4 draws" in out and "mean aleatoric var=" in out and "predictive coverage" in out
        with xr.open_dataset(path) as ds:
            ds = ds.load()
        inst = TASKS[name].instance(1, 0)
        dec = reference_decomposition(inst, inst.targets(np.arange(4)))
        assert int(ds.attrs["heteroscedastic"]) == hetero
        np.testing.assert_allclose(ds.prediction.values, dec.mean, rtol=1e-12)
        np.testing.assert_allclose(ds.uncertainty.values, np.sqrt(dec.epistemic_variance), rtol=1e-12)
        np.testing.assert_allclose(ds.epistemic_variance.values, dec.epistemic_variance, rtol=1e-12)
        np.testing.assert_allclose(ds.aleatoric_variance.values, inst.noise_std(inst.x_test) ** 2, rtol=1e-12)
        np.testing.assert_allclose(ds.predictive_variance.values, dec.epistemic_variance + dec.aleatoric_variance,
                                   rtol=1e-12)
        assert "sigma(x)^2" in ds.aleatoric_variance.attrs["long_name"]
    assert np.ptp(ds.aleatoric_variance.values) == 0  # homoscedastic: σ² everywhere


def test_bad_noise_is_rejected():
    phi = np.random.default_rng(0).standard_normal((10, 2))
    with pytest.raises(ValueError, match=r"sigma must be a number or have shape \(N,\) with N=10, got shape \(9,\)"):
        fit_reference(phi, np.zeros(10), np.ones(9))
    for bad in (0.0, -1.0, np.nan, np.inf):
        s = np.ones(10)
        s[3] = bad
        with pytest.raises(ValueError, match=f"sigma must be finite and positive at every training point, got "
                                             f"{bad} at point 3"):
            fit_reference(phi, np.zeros(10), s)
    post = fit_reference(phi, np.zeros(10), np.linspace(1, 2, 10))
    for call in (lambda: post.predict(phi[:4], aleatoric=True), lambda: post.decompose(phi[:4])):
        with pytest.raises(ValueError, match="noise_std .* is required: the posterior is heteroscedastic"):
            call()
    with pytest.raises(ValueError, match=r"noise_std must be a number or have shape \(4,\), got shape \(3,\)"):
        post.decompose(phi[:4], np.ones(3))
    with pytest.raises(ValueError, match="noise_std must be finite and positive, got -1.0"):
        post.decompose(phi[:4], -1.0)
    negative = replace(TASKS["sinusoid"], name="neg_noise", noise=lambda x, c: x[:, 0])
    with pytest.raises(ValueError, match=r"noise of task 'neg_noise' must be finite and positive, got -?[\d.]+ at x=\["):
        negative.instance(1, 0)  # refused when the instance is made, before any draw
    column = replace(TASKS["sinusoid"], name="col_noise", noise=lambda x, c: np.ones((x.shape[0], 1)))
    with pytest.raises(ValueError, match=r"noise of task 'col_noise' returned shape \(50, 1\), expected \(50,\)"):
        column.instance(1, 0)
