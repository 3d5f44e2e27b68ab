"""The UIMNET measures (V.3): each equals its formula; GMM recovers an analytic density; the
Jacobian and the official GMM fit equal UIMNET's released definitions, computed by hand; the
default GMM fit's class covariances are sklearn's Ledoit–Wolf estimates of the training
features."""

import numpy as np
import pytest
import torch
from scipy.special import logsumexp
from scipy.stats import multivariate_normal
from sklearn.covariance import LedoitWolf

from uqvision.protocols.uimnet import DEFAULT_GMM_FIT
from uqvision.protocols.uimnet.measures import (
    GMM_COVARIANCE,
    GMM_FITS,
    GMM_TRAIN_FITS,
    MEASURES,
    GaussianClasses,
    MeasureInput,
    gmm_train_uncertainty,
    jacobian_logits,
    jacobian_norm,
    measures_for,
    stratified_subset,
)

Z = np.array([[[2.0, 1.0, 0.0], [0.0, 0.0, 3.0], [1.0, 1.0, 1.0]],
              [[1.0, 2.0, 0.0], [0.5, 0.0, 2.0], [0.0, 3.0, 0.0]]])  # (member 2, n 3, C 3)


def probs(z, t):
    e = np.exp(z / t - (z / t).max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def ent(p):
    return -(p * np.log(p)).sum(-1)


def calibrated(z, t):
    """The calibrated ensemble predictor softmax(log mean_k softmax(z_k) / t), by hand."""
    return probs(np.log(probs(z, 1.0).mean(0)), t)


#: a 5-member ensemble (member 5, n 4, C 3)
Z5 = np.random.default_rng(5).normal(0.0, 2.0, (5, 4, 3))


def test_the_registry_holds_the_seven_measures_in_the_papers_order():
    assert MEASURES.names() == ["largest", "gap", "entropy", "jacobian", "gmm", "tta", "native",
                                "jacobian_softmax"]
    assert GMM_FITS.names() == ["train-ledoit-wolf", "official", "validation-ledoit-wolf"]
    # the default fit: Ledoit-Wolf class covariances on the training split (the spec's estimator)
    assert DEFAULT_GMM_FIT == "train-ledoit-wolf"
    assert MEASURES.lookup("gmm") is GMM_FITS.lookup("train-ledoit-wolf")
    assert measures_for()["gmm"] is GMM_FITS.lookup("train-ledoit-wolf")
    chosen = measures_for("validation-ledoit-wolf")
    assert list(chosen) == MEASURES.names() and chosen["gmm"].fitted
    for fit in GMM_TRAIN_FITS:  # computed when the run cache is written: nothing fitted here
        assert not any(m.fitted for m in measures_for(fit).values())
    assert set(GMM_COVARIANCE) == set(GMM_FITS.names())
    with pytest.raises(ValueError, match="unknown GMM fit"):
        measures_for("train")


@pytest.mark.parametrize("z", [Z, Z5], ids=["k2", "k5"])
@pytest.mark.parametrize("t", [1.0, 2.5])
def test_probability_measures_equal_their_formulas(t, z):
    """largest, gap, entropy and tta read the one calibrated predictor softmax(log p̄ / τ)
    (the one τ is fitted on), not the mean of the members' softmax(z_k / τ)."""
    inp = MeasureInput(z, temperature=t, tta=np.stack([z, z[::-1] + 0.5], axis=1))
    p = calibrated(z, t)
    s = np.sort(p, -1)[:, ::-1]
    np.testing.assert_allclose(MEASURES.lookup("largest")(inp), -s[:, 0])
    np.testing.assert_allclose(MEASURES.lookup("gap")(inp), s[:, 1] - s[:, 0])
    np.testing.assert_allclose(MEASURES.lookup("entropy")(inp), ent(p))
    np.testing.assert_allclose(inp.probs, p)
    tta = (calibrated(z, t) + calibrated(z[::-1] + 0.5, t)) / 2
    np.testing.assert_allclose(MEASURES.lookup("tta")(inp), -tta.max(-1))
    if t != 1.0:  # the members' mean at τ is another predictor
        assert not np.allclose(MEASURES.lookup("largest")(inp), -probs(z, t).mean(0).max(-1))
    # native of an ensemble: Jensen-Shannon between the members, H(mean p_k) - mean H(p_k)
    pk = probs(z, t)
    js = ent(pk.mean(0)) - ent(pk).mean(0)
    np.testing.assert_allclose(MEASURES.lookup("native")(inp), js)


def test_single_member_native_tta_and_jacobian_read_their_arrays():
    native = np.array([[0.3, 0.1, 0.7]])
    tta = np.stack([Z[0], Z[1] + 1.0])[None]  # (member 1, aug 2, n 3, C 3)
    inp = MeasureInput(Z[:1], native=native, tta=tta, jacobian=np.array([1.0, 2.0, 3.0]),
                       jacobian_softmax=np.array([4.0, 5.0, 6.0]), temperature=2.0)
    np.testing.assert_array_equal(MEASURES.lookup("native")(inp), native[0])
    np.testing.assert_array_equal(MEASURES.lookup("jacobian")(inp), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(MEASURES.lookup("jacobian_softmax")(inp), [4.0, 5.0, 6.0])
    expected = -probs(tta[0], 2.0).mean(0).max(-1)
    np.testing.assert_allclose(MEASURES.lookup("tta")(inp), expected)
    with pytest.raises(ValueError, match="needs 'gmm_train_ledoit_wolf'"):
        MEASURES.lookup("gmm")(inp)
    with pytest.raises(ValueError, match="needs 'gmm_train'"):
        GMM_FITS.lookup("official")(inp)
    with pytest.raises(ValueError, match="needs 'features'"):
        GMM_FITS.lookup("validation-ledoit-wolf")(inp)


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


@pytest.mark.parametrize("t", [1.0, 1.7])
def test_jacobian_norm_of_an_ensemble_is_that_of_its_calibrated_predictor(t):
    """5 members: the Jacobian of softmax(log mean_k softmax(f_k) / τ), the predictor τ is
    fitted on (at τ ≠ 1 not the mean of the members' softmax(f_k / τ))."""
    torch.manual_seed(1)
    members = [torch.nn.Linear(4, 3).double() for _ in range(5)]
    x = torch.randn(3, 4, dtype=torch.float64)

    def predictor(v):
        p = torch.stack([torch.softmax(m(v), -1) for m in members]).mean(0)
        return torch.softmax(torch.log(p) / t, -1)

    got = jacobian_norm(members, x, temperature=t)
    for i in range(3):
        full = torch.autograd.functional.jacobian(predictor, x[i])
        assert got[i].item() == pytest.approx(float((full ** 2).sum()), rel=1e-10)
    if t != 1.0:
        mean_of_members = torch.autograd.functional.jacobian(
            lambda v: torch.stack([torch.softmax(m(v) / t, -1) for m in members]).mean(0), x[0])
        assert got[0].item() != pytest.approx(float((mean_of_members ** 2).sum()), rel=1e-3)


def test_gmm_measure_equals_the_fitted_class_gaussians():
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], [30, 50, 20])
    feats = rng.standard_normal((100, 2)) + np.array([[0, 0], [4, 0], [0, 4]])[y]
    test = rng.standard_normal((7, 2)) * 3
    u = GMM_FITS.lookup("validation-ledoit-wolf")(
        MeasureInput(Z[:1, :1].repeat(7, 1), features=test[None]),
        MeasureInput(Z[:1, :1].repeat(100, 1), features=feats[None], labels=y))
    density = sum((y == c).mean() * multivariate_normal(
        feats[y == c].mean(0), ledoit_wolf(feats[y == c]) + gc_reg(feats) * np.eye(2)).pdf(test)
        for c in range(3))
    np.testing.assert_allclose(u, -np.log(density), rtol=1e-10)


def gc_reg(feats):
    return 1e-6 * feats.var(axis=0).mean()


def ledoit_wolf(x):
    """Ledoit & Wolf (2004)'s shrinkage estimate, from its formula: S the MLE covariance,
    m = tr(S)/d, δ² = ||S − mI||², β² = min(δ², mean_i ||x_i x_iᵀ − S||² / n)."""
    xc = x - x.mean(0)
    n, d = xc.shape
    s = xc.T @ xc / n
    m = np.trace(s) / d
    delta2 = ((s - m * np.eye(d)) ** 2).sum()
    beta2 = min(delta2, np.mean([((np.outer(r, r) - s) ** 2).sum() for r in xc]) / n)
    return beta2 / delta2 * m * np.eye(d) + (1 - beta2 / delta2) * s


def test_gmm_with_fewer_fit_images_than_dimensions_is_a_density():
    """n_c = 12 < d = 32: each class covariance is the shrinkage estimate, finite and
    well-conditioned; a held-out image of a class is more likely than a far point, and about
    as likely as the class's fit images (a distance to the fit images' affine hull, the
    singular covariance plus a tiny ridge, puts held-out images astronomically far)."""
    rng = np.random.default_rng(3)
    d, n_c = 32, 12
    mus = rng.normal(0.0, 3.0, (3, d))
    y = np.repeat([0, 1, 2], n_c)
    fit = mus[y] + rng.standard_normal((y.size, d))
    held = mus[0] + rng.standard_normal((20, d))
    far = mus[0] + 10.0 * rng.standard_normal((20, d))
    gmm = GaussianClasses.fit(fit, y)
    covs = gmm.covariances
    assert np.isfinite(covs).all() and np.linalg.cond(covs).max() < 100
    for c in range(3):
        np.testing.assert_allclose(covs[c], ledoit_wolf(fit[y == c]) + gc_reg(fit) * np.eye(d),
                                   rtol=1e-8, atol=1e-12)
    ld_held, ld_far, ld_fit = (gmm.log_density(v) for v in (held, far, fit[y == 0]))
    assert np.isfinite(ld_held).all() and ld_held.min() > ld_far.max()
    # in-sample vs held-out: the gap is of the order of d, not of 1 / ridge
    assert ld_fit.mean() - ld_held.mean() < 2 * d
    assert "LedoitWolf" in GMM_COVARIANCE["validation-ledoit-wolf"]


def test_stratified_subset_represents_every_class_in_proportion():
    """The Jacobian's images of a set: folders are in class order, so the first images are a
    few classes; the seeded, stratified subset holds every class within 1 of its share."""
    y = np.repeat(np.arange(18), np.arange(18) % 4 + 8)  # 18 classes, 8 to 11 images each
    for size in (18, 64, 100):
        keep = stratified_subset(y, size, seed=0)
        assert keep.size == size and np.unique(keep).size == size
        counts = np.bincount(y[keep], minlength=18)
        assert np.all(np.abs(counts - np.bincount(y) * size / y.size) <= 1)
    assert np.array_equal(stratified_subset(y, 64, seed=0), stratified_subset(y, 64, seed=0))
    assert not np.array_equal(stratified_subset(y, 64, seed=0), stratified_subset(y, 64, seed=1))
    np.testing.assert_array_equal(stratified_subset(y[:5], 64), np.arange(5))
    with pytest.raises(ValueError, match="size must be >= 1"):
        stratified_subset(y, 0)


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


def linear_jacobian_by_hand(w, t):
    """UIMNET's Jacobian of a linear network z = W x + b: ∂ Σ_c z_c / τ / ∂x = Σ_c W_c / τ
    for every x; squared, averaged over the input elements."""
    return float(((w.sum(0) / t) ** 2).mean())


@pytest.mark.parametrize("t", [1.0, 1.7])
def test_uimnet_jacobian_of_a_linear_network_is_the_analytic_value(t):
    """jacobian = mean_j (∂ Σ_c z_c / τ / ∂x_j)² (uimnet/measures/jacobian.py), not the
    softmax's squared Frobenius norm (the jacobian_softmax variant), and not a sum over
    elements."""
    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3)).double()
    x = torch.randn(5, 3, 2, 2, dtype=torch.float64)  # images (n, C, H, W): 12 elements
    w = lin[1].weight.detach()
    got = jacobian_logits([lin], x, temperature=t)
    assert got.shape == (5,) and got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), linear_jacobian_by_hand(w, t), rtol=1e-12)
    softmax_variant = jacobian_norm([lin], x, temperature=t).numpy()
    assert not np.allclose(got.numpy(), softmax_variant, rtol=1e-3)


def test_uimnet_jacobian_is_nan_for_ensembles_and_mc_dropout():
    """The released code marks the measure invalid for its Ensemble and MCDropout algorithms."""
    torch.manual_seed(1)
    members = [torch.nn.Linear(4, 3).double() for _ in range(5)]
    x = torch.randn(3, 4, dtype=torch.float64)
    assert torch.isnan(jacobian_logits(members, x)).all()
    assert torch.isnan(jacobian_logits(members[:2], x, temperature=2.0)).all()
    assert torch.isnan(jacobian_logits(members[:1], x, stochastic=True)).all()
    assert torch.isfinite(jacobian_logits(members[:1], x)).all()


def official_gmm_by_hand(train, y, points, eps=0.1):
    """-log Σ_c λ_c N(x; μ_c, S_c + eps I), S_c the unbiased (n_c - 1) sample covariance and λ_c
    the class share (uimnet/modules/gaussian_mixture.py, eps of configs/release/06_mog.yaml)."""
    d = train.shape[1]
    density = np.zeros(len(points))
    for c in np.unique(y):
        xc = train[y == c]
        mu = xc.mean(0)
        s = sum(np.outer(r - mu, r - mu) for r in xc) / (len(xc) - 1) + eps * np.eye(d)
        diff = points - mu
        maha = np.einsum("ni,ij,nj->n", diff, np.linalg.inv(s), diff)
        norm = (2 * np.pi) ** (-d / 2) / np.sqrt(np.linalg.det(s))
        density += (y == c).mean() * norm * np.exp(-0.5 * maha)
    return -np.log(density)


def test_official_gmm_equals_the_released_estimate_by_hand():
    """Class means, sample covariance (ddof 1) + 0.1 I, class shares; few images per class
    (n_c = 4, 6, 9 in d = 3), where ddof 0 vs 1 and eps matter."""
    rng = np.random.default_rng(7)
    y = np.repeat([0, 1, 2], [4, 6, 9])
    train = rng.normal(0.0, 0.6, (y.size, 3)) + np.array([[0, 0, 0], [2, 0, 1], [0, 2, -1]])[y]
    sets = {"in_val": rng.normal(0.5, 1.0, (5, 3)), "out_test": rng.normal(3.0, 1.0, (4, 3))}
    got = gmm_train_uncertainty(train, y, sets)
    for name, pts in sets.items():
        np.testing.assert_allclose(got[name], official_gmm_by_hand(train, y, pts), rtol=1e-10)
    gmm = GaussianClasses.fit(train, y, covariance="sample")
    np.testing.assert_allclose(gmm.covariances[0], np.cov(train[y == 0].T, ddof=1)
                               + 0.1 * np.eye(3), rtol=1e-12)
    np.testing.assert_allclose(gmm.weights, [4 / 19, 6 / 19, 9 / 19])
    # the measure: each member's array of an ensemble, averaged
    u = np.stack([got["in_val"], got["in_val"] + 1.0])
    inp = MeasureInput(np.zeros((2, 5, 3)), gmm_train=u)
    np.testing.assert_allclose(GMM_FITS.lookup("official")(inp), got["in_val"] + 0.5)
    np.testing.assert_allclose(GMM_FITS.lookup("official")(inp.subset([4, 0])),
                               got["in_val"][[4, 0]] + 0.5)
    with pytest.raises(ValueError, match="needs 2"):
        GaussianClasses.fit(train[:5], y[:5], covariance="sample")  # class 1: one sample
    with pytest.raises(ValueError, match="covariance must be"):
        GaussianClasses.fit(train, y, covariance="diagonal")


def train_ledoit_wolf_by_hand(train, y, points):
    """-log Σ_c λ_c N(x; μ_c, LW_c + f I): LW_c = sklearn.covariance.LedoitWolf of the class's
    training features, f = 1e-6 × the mean variance of the training features (the floor),
    λ_c the class share."""
    d = train.shape[1]
    floor = 1e-6 * train.var(axis=0).mean()
    terms = [np.log((y == c).mean()) + multivariate_normal(
        train[y == c].mean(0), LedoitWolf().fit(train[y == c]).covariance_ + floor * np.eye(d)
    ).logpdf(points) for c in np.unique(y)]
    return -logsumexp(terms, axis=0)


def test_train_ledoit_wolf_fit_is_sklearns_ledoit_wolf_of_the_training_features():
    """The default fit on the training split: each class covariance is sklearn's LedoitWolf of
    that class's training features plus the floor, with n_c < d (n_c = 6, 8, 7 in d = 10),
    where the sample covariance is singular; not the released sample covariance + 0.1 I."""
    rng = np.random.default_rng(11)
    d = 10
    y = np.repeat([0, 1, 2], [6, 8, 7])
    train = rng.normal(0.0, 0.05, (y.size, d)) + rng.normal(0.0, 1.0, (3, d))[y]
    sets = {"in_val": train[:4] + 0.01, "out_test": rng.normal(0.0, 1.0, (5, d))}
    got = gmm_train_uncertainty(train, y, sets, fit="train-ledoit-wolf")
    for name, pts in sets.items():
        np.testing.assert_allclose(got[name], train_ledoit_wolf_by_hand(train, y, pts),
                                   rtol=1e-10)
    gmm = GaussianClasses.fit(train, y, covariance=GMM_TRAIN_FITS["train-ledoit-wolf"][1])
    floor = 1e-6 * train.var(axis=0).mean()
    for c in range(3):
        np.testing.assert_allclose(gmm.covariances[c], LedoitWolf().fit(train[y == c])
                                   .covariance_ + floor * np.eye(d), rtol=1e-10, atol=1e-15)
    official = gmm_train_uncertainty(train, y, sets, fit="official")
    assert not np.allclose(got["in_val"], official["in_val"], rtol=1e-3)
    # the measure: each member's cached array, averaged; subset carries it
    u = np.stack([got["out_test"], got["out_test"] + 1.0])
    inp = MeasureInput(np.zeros((2, 5, 3)), gmm_train_ledoit_wolf=u)
    np.testing.assert_allclose(GMM_FITS.lookup("train-ledoit-wolf")(inp), got["out_test"] + 0.5)
    np.testing.assert_allclose(MEASURES.lookup("gmm")(inp.subset([3, 1])),
                               got["out_test"][[3, 1]] + 0.5)
    assert "LedoitWolf" in GMM_COVARIANCE["train-ledoit-wolf"]
    assert "training split" in GMM_COVARIANCE["train-ledoit-wolf"]
    with pytest.raises(ValueError, match="fit must be one of .*'validation-ledoit-wolf'"):
        gmm_train_uncertainty(train, y, sets, fit="validation-ledoit-wolf")
