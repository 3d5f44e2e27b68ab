"""The seven UIMNET measures (V.3): each equals its formula; GMM recovers an analytic density."""

import numpy as np
import pytest
import torch
from scipy.stats import multivariate_normal

from uqvision.protocols.uimnet.measures import (
    MEASURES,
    GaussianClasses,
    MeasureInput,
    jacobian_norm,
)

Z = np.array([[[2.0, 1.0, 0.0], [0.0, 0.0, 3.0], [1.0, 1.0, 1.0]],
              [[1.0, 2.0, 0.0], [0.5, 0.0, 2.0], [0.0, 3.0, 0.0]]])  # (member 2, n 3, C 3)


def probs(z, t):
    e = np.exp(z / t - (z / t).max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def ent(p):
    return -(p * np.log(p)).sum(-1)


def test_the_registry_holds_the_seven_measures_in_the_papers_order():
    assert MEASURES.names() == ["largest", "gap", "entropy", "jacobian", "gmm", "tta", "native"]


@pytest.mark.parametrize("t", [1.0, 2.5])
def test_probability_measures_equal_their_formulas(t):
    inp = MeasureInput(Z, temperature=t)
    p = probs(Z, t).mean(0)
    s = np.sort(p, -1)[:, ::-1]
    np.testing.assert_allclose(MEASURES.lookup("largest")(inp), -s[:, 0])
    np.testing.assert_allclose(MEASURES.lookup("gap")(inp), s[:, 1] - s[:, 0])
    np.testing.assert_allclose(MEASURES.lookup("entropy")(inp), ent(p))
    # native of an ensemble: Jensen-Shannon H(mean p) - mean H(p)
    js = ent(p) - ent(probs(Z, t)).mean(0)
    np.testing.assert_allclose(MEASURES.lookup("native")(inp), js)


def test_single_member_native_tta_and_jacobian_read_their_arrays():
    native = np.array([[0.3, 0.1, 0.7]])
    tta = np.stack([Z[0], Z[1] + 1.0])[None]  # (member 1, aug 2, n 3, C 3)
    inp = MeasureInput(Z[:1], native=native, tta=tta, jacobian=np.array([1.0, 2.0, 3.0]),
                       temperature=2.0)
    np.testing.assert_array_equal(MEASURES.lookup("native")(inp), native[0])
    np.testing.assert_array_equal(MEASURES.lookup("jacobian")(inp), [1.0, 2.0, 3.0])
    expected = -probs(tta[0], 2.0).mean(0).max(-1)
    np.testing.assert_allclose(MEASURES.lookup("tta")(inp), expected)
    with pytest.raises(ValueError, match="needs 'features'"):
        MEASURES.lookup("gmm")(inp)


def test_jacobian_norm_equals_the_analytic_jacobian_of_a_linear_softmax():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3).double()
    x = torch.randn(5, 4, dtype=torch.float64)
    t = 1.7
    got = jacobian_norm([lin], x, temperature=t)
    w = lin.weight.detach()
    for i in range(5):
        s = torch.softmax(lin(x[i]) / t, -1).detach()
        jac = (torch.diag(s) - torch.outer(s, s)) @ w / t  # d softmax(Wx/t) / dx
        assert got[i].item() == pytest.approx(float((jac ** 2).sum()), rel=1e-10)
    # an ensemble: the Jacobian of the mean
    lin2 = torch.nn.Linear(4, 3).double()
    both = jacobian_norm([lin, lin2], x[:1])
    full = torch.autograd.functional.jacobian(
        lambda v: (torch.softmax(lin(v), -1) + torch.softmax(lin2(v), -1)) / 2, x[0])
    assert both.item() == pytest.approx(float((full ** 2).sum()), rel=1e-10)


def test_gmm_measure_equals_the_fitted_class_gaussians():
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], [30, 50, 20])
    feats = rng.standard_normal((100, 2)) + np.array([[0, 0], [4, 0], [0, 4]])[y]
    test = rng.standard_normal((7, 2)) * 3
    u = MEASURES.lookup("gmm")(MeasureInput(Z[:1, :1].repeat(7, 1), features=test[None]),
                               MeasureInput(Z[:1, :1].repeat(100, 1), features=feats[None],
                                            labels=y))
    density = sum((y == c).mean() * multivariate_normal(
        feats[y == c].mean(0), np.cov(feats[y == c].T) + gc_reg(feats) * np.eye(2)).pdf(test)
        for c in range(3))
    np.testing.assert_allclose(u, -np.log(density), rtol=1e-10)


def gc_reg(feats):
    return 1e-6 * feats.var(axis=0).mean()


def test_gmm_recovers_the_analytic_density_of_gaussian_features():
    """Plug-in fits on R independent samples; their mean log density must be within 4
    standard errors (from the R fits' spread) of the true mixture's log density."""
    mus = np.array([[0.0, 0.0], [3.0, 1.0]])
    covs = np.array([[[1.0, 0.3], [0.3, 0.5]], [[0.7, -0.2], [-0.2, 1.2]]])
    lam = np.array([0.3, 0.7])
    points = np.array([[0.0, 0.0], [1.5, 0.5], [3.0, 1.0], [-1.0, 2.0]])
    truth = np.log(sum(w * multivariate_normal(m, c).pdf(points)
                       for w, m, c in zip(lam, mus, covs)))
    rng = np.random.default_rng(1)
    n, reps = 4000, 20
    estimates = []
    for _ in range(reps):
        y = (rng.random(n) < lam[1]).astype(int)
        chol = np.linalg.cholesky(covs)[y]  # (n, 2, 2)
        x = mus[y] + np.einsum("nij,nj->ni", chol, rng.standard_normal((n, 2)))
        estimates.append(GaussianClasses.fit(x, y).log_density(points))
    est = np.array(estimates)
    se = est.std(axis=0, ddof=1) / np.sqrt(reps)
    assert np.all(np.abs(est.mean(0) - truth) < 4 * se + 1e-12)
