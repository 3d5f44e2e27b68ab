"""Uncertainty disentanglement estimators (docs/conventions.md#s-9, issue 41 item 1).

Where untangle (github.com/bmucsanyi/untangle) defines a quantity, a test re-derives it here
with explicit loops, from the definitions read in its ``validate.py``
(``convert_inference_dict_general``: the dual BMA, ``expected_divergence``,
``jensen_shannon_divergence``; the ground-truth ``gt_*_bregman*`` terms of soft labels),
``untangle/utils/metric.py`` (``entropy``, ``kl_divergence``, ``centered_cov``) and
``untangle/wrappers/ddu_wrapper.py`` (``_get_gmm``, ``forward_head``: the unweighted
log-sum-exp of the class log densities).
"""

import doctest
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.special import logsumexp
from scipy.stats import multivariate_normal

import uqmetrics
import uqmetrics.metrics.disentangle
from uqmetrics import (
    DDU_DETECTOR,
    DDU_JITTERS,
    ESTIMATES,
    ESTIMATORS,
    InputError,
    bregman_decomposition,
    expected_entropy,
    fit_class_gaussians,
    get_estimator,
    gmm_neg_log_density,
    information_decomposition,
    list_estimators,
    mutual_information,
    one_minus_max_probability,
    predictive_entropy,
)
from uqmetrics.runs.testing import strategies

TOL = 1e-12


def _logits(draw, min_members=1, max_members=5, max_n=20, max_c=6):
    m = draw(st.integers(min_members, max_members))
    n = draw(st.integers(1, max_n))
    c = draw(st.integers(2, max_c))
    return draw(hnp.arrays(np.float64, (m, n, c), elements=st.floats(-8, 8, width=64)))


@st.composite
def member_logits(draw, **kwargs):
    """``(n_members, n, C)`` logits in [-8, 8]."""
    return _logits(draw, **kwargs)


@st.composite
def logits_and_label_probs(draw):
    """Member logits and a label distribution per sample: soft, with zeros, or one-hot."""
    z = _logits(draw)
    _, n, c = z.shape
    w = draw(hnp.arrays(np.float64, (n, c), elements=st.floats(0, 1, width=64)))
    w[np.arange(n), draw(hnp.arrays(np.int64, (n,), elements=st.integers(0, c - 1)))] += 1e-3
    if draw(st.booleans()):
        w = (w == w.max(axis=1, keepdims=True)).astype(float)  # hard labels, one-hot
    return z, w / w.sum(axis=1, keepdims=True)


def _softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


def test_doctests():
    result = doctest.testmod(uqmetrics.metrics.disentangle)
    assert result.attempted > 0 and result.failed == 0


def test_the_face_exports_the_estimators():
    assert set(uqmetrics.metrics.disentangle.__all__) <= set(uqmetrics.__all__)
    assert "disentangle" in uqmetrics.metrics.METRIC_MODULES


# ------------------------------------------------------------------------ information split


@given(strategies.member_probs())
def test_information_split_identity_bounds_and_the_confidence_functions(mp):
    s = information_decomposition(mp)
    assert s.total.shape == s.aleatoric.shape == s.epistemic.shape == (mp.shape[1],)
    assert s.total.dtype == np.float64
    np.testing.assert_array_equal(s.total, s.aleatoric + s.epistemic)  # exactly
    np.testing.assert_allclose(s.total, predictive_entropy(mp), rtol=0, atol=TOL)
    np.testing.assert_array_equal(s.aleatoric, expected_entropy(mp))
    np.testing.assert_array_equal(s.epistemic, mutual_information(mp))
    log_k = math.log(mp.shape[2])
    assert np.all(s.aleatoric >= 0) and np.all(s.aleatoric <= log_k + TOL)
    assert np.all(s.epistemic >= 0) and np.all(s.total <= log_k + TOL)


@given(member_logits())
def test_information_split_is_untangles(z):
    # validate.py: entropy_of_bma (bma = mean of the softmaxes), expected_entropy,
    # jensen_shannon_divergence = entropy_of_bma - expected_entropy
    s = information_decomposition(z, from_logits=True)
    m, n, c = z.shape
    for i in range(n):
        probs = [_softmax(z[k, i]) for k in range(m)]
        bma = [sum(p[j] for p in probs) / m for j in range(c)]
        h_bma = -sum(b * math.log(b) for b in bma)
        e_h = sum(-sum(pj * math.log(pj) for pj in p) for p in probs) / m
        assert s.total[i] == pytest.approx(h_bma, abs=1e-10)
        assert s.aleatoric[i] == pytest.approx(e_h, abs=1e-10)
        assert s.epistemic[i] == pytest.approx(max(h_bma - e_h, 0.0), abs=1e-10)


@given(st.data())
def test_splits_do_not_depend_on_member_order(data):
    z = data.draw(member_logits(min_members=2))
    order = data.draw(st.permutations(range(z.shape[0])))
    for f in (information_decomposition, bregman_decomposition):
        a, b = f(z, from_logits=True), f(z[list(order)], from_logits=True)
        for part in ("total", "aleatoric", "epistemic"):
            np.testing.assert_allclose(getattr(a, part), getattr(b, part), rtol=1e-12,
                                       atol=TOL)


@given(member_logits(max_members=1), st.integers(2, 6))
def test_identical_members_have_no_epistemic_uncertainty(z, m):
    same = np.repeat(z, m, axis=0)
    p = np.exp(z[0] - z[0].max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    it = information_decomposition(same, from_logits=True)
    br = bregman_decomposition(same, from_logits=True)
    np.testing.assert_allclose(it.epistemic, 0.0, atol=TOL)
    np.testing.assert_allclose(br.epistemic, 0.0, atol=TOL)
    np.testing.assert_allclose(br.central, p, atol=TOL)
    np.testing.assert_allclose(it.total, it.aleatoric, atol=TOL)


# -------------------------------------------------------------------------- Bregman split


@given(logits_and_label_probs())
def test_bregman_parts_sum_to_the_members_expected_log_loss(zq):
    z, q = zq
    s = bregman_decomposition(z, q, from_logits=True)
    m, n, c = z.shape
    for i in range(n):  # mean_s (-sum_c q_c log p_s,c), member by member
        loss = 0.0
        for k in range(m):
            p = _softmax(z[k, i])
            loss += -sum(q[i, j] * math.log(p[j]) for j in range(c) if q[i, j] > 0) / m
        assert s.total[i] == pytest.approx(loss, rel=1e-10, abs=1e-10)
    np.testing.assert_array_equal(s.total, s.aleatoric + s.bias + s.epistemic)
    assert np.all(s.epistemic >= 0) and np.all(s.bias >= 0)
    assert np.all(s.aleatoric >= 0) and np.all(s.aleatoric <= math.log(c) + TOL)


@given(logits_and_label_probs())
def test_bregman_split_is_untangles(zq):
    # validate.py, convert_inference_dict_general: log_dual_bma = log_softmax(mean_s log p_s);
    # expected_divergence = mean_s kl_divergence(log_dual_bma, log p_s), metric.py's
    # kl_divergence(a, b) = sum exp(a) (a - b). For soft labels q: gt_aleatorics_bregman =
    # entropy(q), gt_biases_bregman_dual_bma = kl_divergence(log q, log_dual_bma),
    # gt_total_predictives_bregman_dual_bma = their sum plus the expected divergence; the
    # estimate expected_entropies_plus_expected_divergences = mean_s H(p_s) + the divergence.
    z, q = zq
    s = bregman_decomposition(z, q, from_logits=True)
    est = bregman_decomposition(z, from_logits=True)
    m, n, c = z.shape
    for i in range(n):
        logp = [[z[k, i, j] - math.log(sum(math.exp(v) for v in z[k, i])) for j in range(c)]
                for k in range(m)]
        mean_logp = [sum(logp[k][j] for k in range(m)) / m for j in range(c)]
        log_norm = math.log(sum(math.exp(v) for v in mean_logp))
        log_dual = [v - log_norm for v in mean_logp]
        divergence = sum(sum(math.exp(log_dual[j]) * (log_dual[j] - logp[k][j])
                             for j in range(c)) for k in range(m)) / m
        aleatoric = -sum(qj * math.log(qj) for qj in q[i] if qj > 0)
        bias = sum(q[i, j] * (math.log(q[i, j]) - log_dual[j]) for j in range(c) if q[i, j] > 0)
        expected_h = sum(-sum(math.exp(v) * v for v in logp[k]) for k in range(m)) / m
        assert s.epistemic[i] == pytest.approx(divergence, rel=1e-9, abs=1e-10)
        assert s.aleatoric[i] == pytest.approx(aleatoric, abs=1e-10)
        assert s.bias[i] == pytest.approx(bias, rel=1e-9, abs=1e-10)
        assert s.total[i] == pytest.approx(aleatoric + bias + divergence, rel=1e-9, abs=1e-10)
        assert est.total[i] == pytest.approx(expected_h + divergence, rel=1e-9, abs=1e-10)
        np.testing.assert_allclose(s.central[i], np.exp(log_dual), rtol=1e-9, atol=1e-12)
    assert est.bias is None
    np.testing.assert_allclose(est.aleatoric, expected_entropy(z, from_logits=True), atol=TOL)


def test_bregman_members_without_a_shared_class():
    members = np.array([[[1.0, 0.0], [0.5, 0.5]], [[0.0, 1.0], [0.9, 0.1]]])
    s = bregman_decomposition(members, np.array([[0.5, 0.5], [1.0, 0.0]]))
    assert s.epistemic[0] == np.inf and np.isnan(s.central[0]).all()
    assert s.total[0] == np.inf and s.bias[0] == np.inf
    assert np.isfinite([s.epistemic[1], s.bias[1], s.total[1]]).all()
    central = np.sqrt([0.45, 0.05]) / np.sqrt([0.45, 0.05]).sum()  # normalised geometric mean
    np.testing.assert_allclose(s.central[1], central, rtol=1e-14)
    assert s.epistemic[1] == pytest.approx(-math.log(np.sqrt([0.45, 0.05]).sum()), rel=1e-14)


def test_bad_inputs_raise_input_errors():
    mp = np.full((2, 3, 2), 0.5)
    with pytest.raises(InputError, match="from_logits must be a bool"):
        information_decomposition(mp, from_logits=1)
    with pytest.raises(InputError, match=r"label_probs must have shape \(3, 2\)"):
        bregman_decomposition(mp, np.full((2, 2), 0.5))
    with pytest.raises(ValueError, match="member_probs must have shape"):
        bregman_decomposition(mp[0])


# ------------------------------------------------------------------------------ single pass


@given(strategies.member_probs())
def test_one_minus_max_probability(mp):
    u = one_minus_max_probability(mp)
    np.testing.assert_allclose(u, 1 - mp.mean(axis=0).max(axis=1), atol=TOL)
    assert np.all(u >= 0) and np.all(u <= 1 - 1 / mp.shape[2] + TOL)
    np.testing.assert_array_equal(one_minus_max_probability(mp[0]), 1 - mp[0].max(axis=1))


# ------------------------------------------------------------------------------------- DDU


@st.composite
def gaussian_fit_data(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    d, c = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    counts = draw(st.lists(st.integers(d + 2, 12), min_size=c, max_size=c))
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.normal(3 * rng.normal(size=d), rng.uniform(0.3, 2), size=(k, d))
                        for k in counts])
    labels = np.repeat(np.arange(c) * 2 + 1, counts)  # classes need not be 0..C-1
    return x, labels, rng.normal(scale=3, size=(7, d))


@given(gaussian_fit_data())
def test_ddu_density_is_the_scipy_mixture(data):
    x, labels, test = data
    g = fit_class_gaussians(x, labels)
    assert g.jitter == 0.0  # n_c > d: every covariance is positive definite as it is
    classes = np.unique(labels)
    log_pdfs = np.stack([multivariate_normal(x[labels == c].mean(axis=0),
                                             np.cov(x[labels == c], rowvar=False, ddof=1)
                                             ).logpdf(test).reshape(len(test))
                         for c in classes], axis=1)
    weights = np.array([np.mean(labels == c) for c in classes])
    expected = -logsumexp(log_pdfs, b=weights, axis=1)
    np.testing.assert_allclose(gmm_neg_log_density(test, g), expected, rtol=1e-9, atol=1e-9)
    # ddu_wrapper.py: -logsumexp_c log N(z; mu_c, Sigma_c), the classes unweighted
    unweighted = -logsumexp(log_pdfs, axis=1)
    np.testing.assert_allclose(gmm_neg_log_density(test, g, prior="none"), unweighted,
                               rtol=1e-9, atol=1e-9)


def test_ddu_jitter_is_the_first_that_makes_every_covariance_positive_definite():
    rng = np.random.default_rng(3)
    x, labels = rng.normal(size=(12, 8)), np.repeat([0, 1, 2], 4)  # 4 samples, 8 features
    g = fit_class_gaussians(x, labels)
    k = DDU_JITTERS.index(g.jitter)
    assert k > 0
    covs = [np.cov(x[labels == c], rowvar=False, ddof=1) for c in range(3)]

    def all_factor(eps):
        try:
            [np.linalg.cholesky(c + eps * np.eye(8)) for c in covs]
        except np.linalg.LinAlgError:
            return False
        return True

    assert all_factor(DDU_JITTERS[k]) and not any(all_factor(e) for e in DDU_JITTERS[:k])
    np.testing.assert_allclose(g.cholesky @ g.cholesky.transpose(0, 2, 1),
                               np.stack(covs) + g.jitter * np.eye(8), atol=1e-12)
    assert np.isfinite(gmm_neg_log_density(rng.normal(size=(3, 8)), g)).all()


def test_ddu_detector_and_estimator_fit_once_and_score():
    rng = np.random.default_rng(0)
    fit = {"embedding": rng.normal(size=(30, 3)), "labels": np.repeat([0, 1, 2], 10)}
    z = rng.normal(size=(5, 3))
    expected = gmm_neg_log_density(z, fit_class_gaussians(fit["embedding"], fit["labels"]))
    np.testing.assert_array_equal(DDU_DETECTOR.fitted(fit)({"embedding": z}), expected)
    np.testing.assert_array_equal(get_estimator("ddu_density").score({"embedding": z}, fit),
                                  expected)
    unweighted = DDU_DETECTOR.with_params(prior="none").score({"embedding": z}, fit)
    np.testing.assert_allclose(unweighted, expected - math.log(3), rtol=1e-12)  # balanced
    with pytest.raises(InputError, match="class 1 has 1"):
        fit_class_gaussians(np.zeros((3, 2)), [0, 0, 1])
    with pytest.raises(InputError, match="prior must be one of"):
        gmm_neg_log_density(z, fit_class_gaussians(fit["embedding"], fit["labels"]), prior="x")
    with pytest.raises(InputError, match="pass fit="):
        get_estimator("ddu_density").score({"embedding": z})


# ---------------------------------------------------------------------------- the registry


@given(member_logits())
def test_every_estimator_scores_members(z):
    rng = np.random.default_rng(0)
    n = z.shape[1]
    inputs = {"members": z, "embedding": rng.normal(size=(n, 2)), "learned": rng.random(n)}
    fit = {"embedding": rng.normal(size=(20, 2)), "labels": np.repeat([0, 1], 10)}
    for name, e in ESTIMATORS.items_ordered():
        assert e.estimates in ESTIMATES and e.reference and e.description
        u = e.score(inputs, fit, from_logits=True)
        assert u.shape == (n,) and u.dtype == np.float64 and np.all(np.isfinite(u)), name
        assert np.all(u >= 0) or name == "ddu_density", name
        if "members" in e.needs:  # a single-pass predictor's (n, C) is one member
            one = e.score({"members": z[0]}, from_logits=True)
            np.testing.assert_array_equal(one, e.score({"members": z[:1]}, from_logits=True))
            if e.min_members > 1:
                np.testing.assert_allclose(one, 0.0, atol=TOL)


def test_registry_entries_and_the_learned_passthrough():
    assert list_estimators("aleatoric") == ["expected_entropy"]
    assert set(list_estimators("epistemic")) == {"mutual_information", "bregman_epistemic",
                                                 "ddu_density"}
    assert list_estimators(needs="learned") == ["learned"]
    assert {e.estimates for e in ESTIMATORS.values()} == set(ESTIMATES)
    u = np.array([0.3, 1.5, 0.0])
    np.testing.assert_array_equal(get_estimator("learned").score({"learned": u}), u)
    with pytest.raises(InputError, match="learned must be a finite uncertainty"):
        get_estimator("learned").score({"learned": np.array([0.1, np.nan])})
    with pytest.raises(InputError, match=r"needs \['members'\]"):
        get_estimator("entropy").score({"learned": u})
    with pytest.raises(ValueError, match="unknown estimator 'nope'"):
        get_estimator("nope")
    with pytest.raises(InputError, match="estimates must be one of"):
        list_estimators("both")
