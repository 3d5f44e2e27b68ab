"""OOD detectors of uqmetrics.metrics.detectors: hand-computed values on tiny inputs, independent
numpy formulas (OpenOOD's postprocessors written out), the fit/score API and its errors."""

import doctest
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import uqmetrics.metrics.detectors
from uqmetrics.metrics.detectors import (
    DETECTORS,
    FIT_KEYS,
    NEED_KEYS,
    Detector,
    get_detector,
    list_detectors,
    search_params,
    vim_dimension,
)

NAMES = ["msp", "maxlogit", "energy", "entropy", "gen", "mahalanobis", "knn", "vim", "react",
         "ensemble_entropy", "mutual_information", "disagreement"]


def score(name, inputs, fit=None, **params):
    d = get_detector(name)
    return (d.with_params(**params) if params else d).score(inputs, fit)


def softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ------------------------------------------------------------------------------ the registry


def test_all_detectors_are_registered_with_a_reference():
    assert set(NAMES) <= set(list_detectors())
    for name in NAMES:
        d = DETECTORS[name]
        assert d.name == name and d.description
        assert re.search(r"\((19|20)\d\d\)", d.reference), (name, d.reference)
        assert d.fit_keys <= set(FIT_KEYS)
        assert ("fit" in d.needs) == bool(d.fit_keys), name


def test_default_hyper_parameters():
    assert DETECTORS["energy"].params == {"temperature": 1.0}
    assert DETECTORS["gen"].params == {"gamma": 0.1, "M": 100}
    assert DETECTORS["knn"].params == {"k": 50, "backend": "auto"}
    assert DETECTORS["vim"].params == {"dim": None, "backend": "auto"}
    assert DETECTORS["react"].params == {"percentile": 90.0}
    assert DETECTORS["mahalanobis"].params == {"backend": "auto"}
    assert DETECTORS["mahalanobis"].fit_keys == {"embedding", "labels"}
    assert DETECTORS["vim"].fit_keys == {"embedding", "head_weight", "head_bias"}
    assert NEED_KEYS["head"] == ("head_weight", "head_bias")


# ---------------------------------------------------------------------- from logits, by hand


def test_logit_detectors_by_hand():
    z = np.array([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(score("maxlogit", {"logits": z}), [-2.0, 0.0])
    z2 = np.array([[0.0, 0.0], [np.log(3.0), 0.0]])
    np.testing.assert_allclose(score("energy", {"logits": z2}), [-np.log(2), -np.log(4)],
                               rtol=1e-15)
    # T = 2: -2 log(exp(0) + exp(0)) and -2 log(sqrt(3) + 1)
    np.testing.assert_allclose(score("energy", {"logits": z2}, temperature=2.0),
                               [-2 * np.log(2), -2 * np.log(np.sqrt(3) + 1)], rtol=1e-15)
    # entropy: log 2 for a uniform pair; -(3/4 log 3/4 + 1/4 log 1/4); ~0 for a sure one
    h = score("entropy", {"logits": np.array([[0.0, 0.0], [np.log(3.0), 0.0], [800.0, 0.0]])})
    np.testing.assert_allclose(h, [np.log(2), -(0.75 * np.log(0.75) + 0.25 * np.log(0.25)), 0],
                               atol=1e-15)


def test_gen_by_hand():
    # p = (1/2, 1/2): G = 2 (1/2)^0.1 (1/2)^0.1; with M = 1 only the top class counts
    z = np.array([[0.0, 0.0]])
    assert score("gen", {"logits": z})[0] == pytest.approx(2 * 0.5**0.2, rel=1e-15)
    assert score("gen", {"logits": z}, M=1)[0] == pytest.approx(0.5**0.2, rel=1e-15)
    # p = (1/2, 1/4, 1/4), gamma = 1: top-2 sum 1/2 * 1/2 + 1/4 * 3/4 = 7/16
    z3 = np.log([[2.0, 1.0, 1.0]])
    assert score("gen", {"logits": z3}, gamma=1.0, M=2)[0] == pytest.approx(7 / 16, rel=1e-15)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 300), st.integers(1, 400))
def test_gen_is_openood_generalized_entropy(seed, n_classes, m):
    # OpenOOD's GENPostprocessor.generalized_entropy, numpy: sort, keep the M largest, negate
    z = np.random.default_rng(seed).normal(0, 3, size=(6, n_classes))
    p = np.sort(softmax(z), axis=1)[:, -m:]
    expected = np.sum(p**0.1 * (1 - p)**0.1, axis=1)
    # (1 - p)^0.1 for p near 1 magnifies the rounding of p (two softmax formulas): rtol 1e-9
    np.testing.assert_allclose(score("gen", {"logits": z}, M=m), expected, rtol=1e-9)


# -------------------------------------------------------------------- from features, by hand


def test_mahalanobis_by_hand():
    # class means 1 and 11, residuals +-1: tied variance 1, so d^2 = min((x-1)^2, (x-11)^2)
    fit = {"embedding": np.array([[0.0], [2.0], [10.0], [12.0]]), "labels": np.array([0, 0, 1, 1])}
    x = np.array([[1.0], [5.0], [11.0], [6.0], [-3.0]])
    np.testing.assert_allclose(score("mahalanobis", {"embedding": x}, fit),
                               [0.0, 16.0, 0.0, 25.0, 16.0], atol=1e-12)


def test_mahalanobis_is_openood_mds():
    # OpenOOD's MDSPostprocessor written out: class means, EmpiricalCovariance of the centred
    # features (divided by n), u = min_c (x - mu_c)^T P (x - mu_c) (its conf is -u)
    rng = np.random.default_rng(3)
    a = rng.normal(size=(5, 5))
    x_fit = rng.normal(size=(300, 5)) @ a + 0.5
    y = rng.integers(0, 4, size=300)
    x_fit += 3 * np.eye(5)[y % 5]
    means = np.stack([x_fit[y == c].mean(0) for c in range(4)])
    centred = x_fit - means[y]
    precision = np.linalg.inv(centred.T @ centred / len(y))
    x = rng.normal(size=(40, 5)) * 2
    expected = np.min([np.einsum("nd,de,ne->n", x - m, precision, x - m) for m in means], axis=0)
    got = score("mahalanobis", {"embedding": x}, {"embedding": x_fit, "labels": y})
    np.testing.assert_allclose(got, expected, rtol=1e-10)


def test_knn_by_hand():
    # unit fit features at 0, 90 and 180 degrees; L2 distances between unit vectors
    fit = {"embedding": np.array([[3.0, 0.0], [0.0, 0.5], [-2.0, 0.0]])}
    x = np.array([[2.0, 0.0], [1.0, 1.0]])
    np.testing.assert_allclose(score("knn", {"embedding": x}, fit, k=1),
                               [0.0, np.sqrt(2 - np.sqrt(2))], atol=1e-12)
    np.testing.assert_allclose(score("knn", {"embedding": x}, fit, k=2),
                               [np.sqrt(2), np.sqrt(2 - np.sqrt(2))], atol=1e-12)
    # k = 50 is capped at the 3 fit features: the farthest one
    np.testing.assert_allclose(score("knn", {"embedding": x}, fit),
                               [2.0, np.sqrt(2 + np.sqrt(2))], atol=1e-12)


def test_knn_is_the_kth_sorted_distance():
    rng = np.random.default_rng(4)
    bank, x = rng.normal(size=(120, 6)), rng.normal(size=(30, 6))
    b = bank / np.linalg.norm(bank, axis=1, keepdims=True)
    z = x / np.linalg.norm(x, axis=1, keepdims=True)
    dist = np.sort(np.linalg.norm(z[:, None, :] - b[None, :, :], axis=2), axis=1)
    for k in (1, 7, 50, 120):
        np.testing.assert_allclose(score("knn", {"embedding": x}, {"embedding": bank}, k=k,
                                         backend="numpy"), dist[:, k - 1], atol=1e-12)
        # the default backend (faiss where installed: float32 unit vectors) within KNN_TOL of u^2
        np.testing.assert_allclose(score("knn", {"embedding": x}, {"embedding": bank}, k=k)**2,
                                   dist[:, k - 1]**2, rtol=0, atol=KNN_TOL)


#: |u^2 (float32 backends) - u^2 (float64)|: each unit vector is rounded once to float32
#: (relative error <= 2^-24 per element), which moves the inner product of two unit vectors by
#: at most 2 x 2^-24 (+ O(2^-48)); u^2 = 2 - 2 x inner product moves by twice that. The search's
#: own float32 rounding does not enter: the k-th similarity is recomputed exactly.
KNN_TOL = 4 * 2.0**-24 * (1 + 2.0**-20) + 1e-14


def _ties_bank():
    # 300 copies of one vector among 400: the search's band around the k-th similarity holds
    # more candidates than the first search returned, so the wider search runs
    rng = np.random.default_rng(8)
    bank = rng.normal(size=(400, 5))
    bank[:300] = bank[0] * rng.uniform(0.5, 2.0, size=(300, 1))
    x = np.r_[bank[:3] * 3.0, rng.normal(size=(20, 5))]
    return bank, x


@pytest.mark.parametrize("k", [1, 50, 299, 300, 301])
def test_knn_with_ties_is_the_kth_sorted_distance(k):
    bank, x = _ties_bank()
    b = bank / np.linalg.norm(bank, axis=1, keepdims=True)
    z = x / np.linalg.norm(x, axis=1, keepdims=True)
    dist = np.sort(np.sqrt(np.maximum(2 - 2 * z @ b.T, 0)), axis=1)
    np.testing.assert_allclose(score("knn", {"embedding": x}, {"embedding": bank}, k=k,
                                     backend="numpy"), dist[:, k - 1], atol=1e-7)


def test_knn_blocks_of_queries_change_nothing(monkeypatch):
    rng = np.random.default_rng(9)
    bank, x = rng.normal(size=(500, 8)), rng.normal(size=(97, 8))
    for fit_x in (bank, _ties_bank()[0][:, :5]):
        xx = x if fit_x.shape[1] == 8 else _ties_bank()[1]
        scorer = get_detector("knn").with_params(k=20, backend="numpy").fitted(
            {"embedding": fit_x})
        whole = scorer({"embedding": xx})
        monkeypatch.setattr(uqmetrics.metrics.detectors, "_KNN_BLOCK", 7 * fit_x.shape[0])
        blocks = scorer({"embedding": xx})
        monkeypatch.undo()
        one_by_one = np.concatenate([scorer({"embedding": xx[i:i + 1]})
                                     for i in range(len(xx))])
        assert np.array_equal(blocks, whole) and np.array_equal(one_by_one, whole)


def test_knn_backend_is_validated(monkeypatch):
    emb = np.eye(3)
    for bad in ("bogus", "numpy:cuda", "torch:", 3, None):
        with pytest.raises(ValueError, match=re.escape(f"knn: backend must be one of auto, "
                                                       f"numpy, faiss, torch or torch:<device> "
                                                       f"(e.g. torch:cuda), got {bad!r}")):
            score("knn", {"embedding": emb}, {"embedding": emb}, backend=bad)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match=re.escape(f"knn: k must be an integer >= 1, got "
                                                       f"{bad!r}")):
            score("knn", {"embedding": emb}, {"embedding": emb}, k=bad)
    # without faiss: auto is numpy, faiss names the extra to install
    monkeypatch.setitem(__import__("sys").modules, "faiss", None)
    np.testing.assert_array_equal(score("knn", {"embedding": emb}, {"embedding": emb}, k=2),
                                  score("knn", {"embedding": emb}, {"embedding": emb}, k=2,
                                        backend="numpy"))
    with pytest.raises(ValueError, match=r"backend 'faiss' needs faiss.*uqmetrics\[faiss\]"):
        score("knn", {"embedding": emb}, {"embedding": emb}, backend="faiss")


def _vim_toy():
    # W picks the first two features, b = 0: origin u0 = 0. The fit features spread along x
    # and y (covariance 4/3) more than along z (1/3): with dim 2 the residual is the z axis.
    w, b = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), np.zeros(2)
    x_fit = np.array([[2.0, 0, 0], [-2, 0, 0], [0, 2, 0], [0, -2, 0], [0, 0, 1], [0, 0, -1]])
    return w, b, x_fit


def test_vim_by_hand():
    w, b, x_fit = _vim_toy()
    # alpha = sum of max fit logits (2 + 0 + 2 + 0 + 0 + 0) / sum of residual norms (1 + 1) = 2
    x = np.array([[0.0, 0.0, 3.0], [1.0, 1.0, 0.0]])
    inputs = {"embedding": x, "head_weight": w, "head_bias": b}
    u = score("vim", inputs, {"embedding": x_fit}, dim=2)
    np.testing.assert_allclose(u, [2 * 3 - np.log(2), -(1 + np.log(2))], atol=1e-12)
    # the head in the fit mapping is used when given; the scorer fits once
    scorer = get_detector("vim").with_params(dim=2).fitted(
        {"embedding": x_fit, "head_weight": w, "head_bias": b})
    np.testing.assert_allclose(scorer(inputs), u, rtol=1e-15)


def openood_vim(x_fit, x, w, b, dim):
    """OpenOOD's VIMPostprocessor (and the ViM reference code) written out in numpy."""
    u0 = -np.matmul(np.linalg.pinv(w), b)
    c = x_fit - u0
    eig_vals, eig_vecs = np.linalg.eig(c.T @ c / len(c))
    ns = np.ascontiguousarray((eig_vecs.T[np.argsort(eig_vals * -1)[dim:]]).T)
    alpha = (x_fit @ w.T + b).max(axis=-1).mean() / np.linalg.norm(c @ ns, axis=-1).mean()
    z = x @ w.T + b
    energy = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)
    return alpha * np.linalg.norm((x - u0) @ ns, axis=-1) - energy


def _auroc(u_id, u_ood):
    return float(np.mean(u_ood[None, :] > u_id[:, None])
                 + 0.5 * np.mean(u_ood[None, :] == u_id[:, None]))


@pytest.mark.parametrize("clustered", [False, True])
def test_vim_is_openood_vim(clustered):
    rng = np.random.default_rng(5)
    n_feat, n_cls = 12, 5
    if clustered:  # features around class centres, as a trained network's
        centres = rng.normal(0, 3, size=(n_cls, n_feat))
        x_fit = centres[rng.integers(0, n_cls, 400)] + rng.normal(size=(400, n_feat))
        x = np.r_[centres[rng.integers(0, n_cls, 25)] + rng.normal(size=(25, n_feat)),
                  rng.normal(0, 4, size=(25, n_feat))]
    else:
        x_fit = rng.normal(size=(400, n_feat)) @ rng.normal(size=(n_feat, n_feat))
        x = rng.normal(size=(50, n_feat)) * 3
    w, b = rng.normal(size=(n_cls, n_feat)), rng.normal(size=n_cls)
    inputs = {"embedding": x, "head_weight": w, "head_bias": b}
    for dim in (0, 3, 6, 11, None):
        u = score("vim", inputs, {"embedding": x_fit}, dim=dim)
        # OpenOOD's float64 formula; the default dim: feature_dim // 2 below 768 features
        ref = openood_vim(x_fit, x, w, b, 6 if dim is None else dim)
        # float32 products: the covariance's rounding, ~sqrt(n_fit) 2^-24 lambda_max, turns the
        # residual space by that over the eigenvalue gap at the split (lambda_max / gap ~ 700
        # at dim 11 of the clustered features): agreement to 1e-4 of the scores' scale
        np.testing.assert_allclose(u, ref, rtol=0, atol=1e-4 * np.abs(ref).max())
        # ... and the ranking, hence every metric, unchanged
        np.testing.assert_array_equal(np.argsort(u), np.argsort(ref))
        assert _auroc(u[:25], u[25:]) == pytest.approx(_auroc(ref[:25], ref[25:]), abs=1e-12)


def test_vim_dimension_rule():
    assert [vim_dimension(n) for n in (4096, 2048, 2047, 1024, 768, 767, 512, 3, 1)] == \
        [1000, 1000, 512, 512, 512, 383, 256, 1, 0]


def test_react_by_hand():
    # fit activations 0..9: the 90th percentile (linear) is 8.1
    fit = {"embedding": np.arange(10.0).reshape(5, 2)}
    inputs = {"embedding": np.array([[10.0, 0.0], [1.0, 2.0]]), "head_weight": np.eye(2),
              "head_bias": np.zeros(2)}
    expected = [-np.logaddexp(8.1, 0.0), -np.logaddexp(1.0, 2.0)]
    np.testing.assert_allclose(score("react", inputs, fit), expected, rtol=1e-14)
    # percentile 100 clips at the fit maximum, 9
    np.testing.assert_allclose(score("react", inputs, fit, percentile=100.0),
                               [-np.logaddexp(9.0, 0.0), -np.logaddexp(1.0, 2.0)], rtol=1e-14)


# ---------------------------------------------------------------------- from members, by hand


def test_member_detectors_by_hand():
    # sample 0: members p = (1/2, 1/2), (3/4, 1/4), (3/4, 1/4); sample 1: argmax 0, 1, 1
    members = np.array([[[0.0, 0.0], [5.0, 0.0]],
                        [[np.log(3.0), 0.0], [0.0, 5.0]],
                        [[np.log(3.0), 0.0], [0.0, 5.0]]])
    inputs = {"members": members}

    def h(p):
        p = np.asarray(p)
        return -np.sum(p * np.log(p))

    pbar = [2 / 3, 1 / 3]
    h_mean = (h([0.5, 0.5]) + 2 * h([0.75, 0.25])) / 3
    u_tot = score("ensemble_entropy", inputs)
    u_mi = score("mutual_information", inputs)
    assert u_tot[0] == pytest.approx(h(pbar), rel=1e-14)
    assert u_mi[0] == pytest.approx(h(pbar) - h_mean, rel=1e-12)
    # the ensemble predicts class 1 on sample 1 (mean p1 = 2/3 of ~1): one member of 3 differs
    np.testing.assert_allclose(score("disagreement", inputs), [0.0, 1 / 3], rtol=1e-15)
    p1 = softmax(members[:, 1])
    assert u_tot[1] == pytest.approx(h(p1.mean(0)), rel=1e-12)
    assert u_mi[1] == pytest.approx(h(p1.mean(0)) - np.mean([h(p) for p in p1]), rel=1e-10)


def test_disagreement_can_be_one():
    # members sure of classes 0 and 1, both giving class 2 probability 0.45: the mean
    # (0.275, 0.275, 0.45) picks class 2, which neither member predicts
    p = np.array([[[0.55, 0.0, 0.45]], [[0.0, 0.55, 0.45]]]) + 1e-300
    assert score("disagreement", {"members": np.log(p)})[0] == 1.0


def test_one_member_has_no_epistemic_uncertainty():
    z = np.random.default_rng(6).normal(size=(1, 8, 4))
    assert np.all(score("mutual_information", {"members": z}) == 0)
    assert np.all(score("disagreement", {"members": z}) == 0)
    np.testing.assert_allclose(score("ensemble_entropy", {"members": z}),
                               score("entropy", {"logits": z[0]}), rtol=1e-14)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_member_decomposition(seed):
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 3, size=(rng.integers(2, 6), 10, rng.integers(2, 7)))
    inputs = {"members": z}
    tot, mi = score("ensemble_entropy", inputs), score("mutual_information", inputs)
    assert np.all(mi >= 0) and np.all(mi <= tot + 1e-12)
    assert np.all(tot <= np.log(z.shape[2]) + 1e-12)
    d = score("disagreement", inputs)
    # in [0, 1]: 1 is possible, when the mean's arg-max is a class no member predicts
    assert np.all((d >= 0) & (d <= 1))
    assert set(np.unique(d * z.shape[0]).round(9)) <= set(range(z.shape[0] + 1))


# ---------------------------------------------------------------------- the fit / score API


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_scores_are_per_sample(seed):
    # permuting the scored samples permutes u (no detector mixes the scored samples)
    rng = np.random.default_rng(seed)
    n, d, c = 12, 6, 4
    fit = {"embedding": rng.normal(size=(40, d)), "labels": rng.integers(0, c, 40)}
    inputs = {"logits": rng.normal(size=(n, c)), "embedding": rng.normal(size=(n, d)),
              "members": rng.normal(size=(3, n, c)), "head_weight": rng.normal(size=(c, d)),
              "head_bias": rng.normal(size=c)}
    perm = rng.permutation(n)
    permuted = {**inputs, "logits": inputs["logits"][perm],
                "embedding": inputs["embedding"][perm], "members": inputs["members"][:, perm]}
    for name in NAMES:
        u = score(name, inputs, fit)
        assert u.shape == (n,)
        np.testing.assert_allclose(score(name, permuted, fit), u[perm], rtol=1e-12,
                                   atol=1e-12, err_msg=name)


def test_fitted_fits_once():
    calls = []

    def fit_func(fit):
        calls.append(1)
        return fit["embedding"].mean(axis=0)

    d = Detector("centre", "", {"embedding", "fit"},
                 lambda inputs, centre: np.linalg.norm(inputs["embedding"] - centre, axis=1),
                 fit_func=fit_func, fit_keys={"embedding"})
    scorer = d.fitted({"embedding": np.array([[0.0, 0.0], [2.0, 0.0]])})
    np.testing.assert_allclose(scorer({"embedding": np.array([[1.0, 0.0]])}), [0.0])
    np.testing.assert_allclose(scorer({"embedding": np.array([[1.0, 3.0], [4.0, 0]])}), [3, 3])
    assert len(calls) == 1


def test_missing_inputs_and_fit_keys_are_named():
    rng = np.random.default_rng(7)
    emb = rng.normal(size=(5, 3))
    with pytest.raises(ValueError, match=r"'vim' needs \['head'\] \(keys \['head_bias', "
                                         r"'head_weight'\]\)"):
        get_detector("vim").score({"embedding": emb}, {"embedding": emb})
    with pytest.raises(ValueError, match=r"'react' needs \['head'\] \(keys \['head_bias'\]\)"):
        get_detector("react").score({"embedding": emb, "head_weight": np.ones((2, 3))},
                                    {"embedding": emb})
    with pytest.raises(ValueError, match=r"'mahalanobis': fit lacks \['labels'\]"):
        get_detector("mahalanobis").score({"embedding": emb}, {"embedding": emb})
    with pytest.raises(ValueError, match="'knn' fits on in-distribution data: pass fit="):
        get_detector("knn").score({"embedding": emb})
    with pytest.raises(ValueError, match=r"'vim': fit lacks \['head_bias', 'head_weight'\]"):
        get_detector("vim").fitted({"embedding": emb})
    with pytest.raises(ValueError, match=r"'ensemble_entropy' needs \['members'\]"):
        get_detector("ensemble_entropy").score({"logits": emb})
    with pytest.raises(ValueError, match=r"has no parameters \['K'\]; its parameters: \['backend', 'k'\]"):
        get_detector("knn").with_params(K=3)
    with pytest.raises(ValueError, match=r"shape \(sample, 3\) like the fit embedding"):
        get_detector("knn").score({"embedding": emb[:, :2]}, {"embedding": emb})
    with pytest.raises(ValueError, match="all zero"):
        get_detector("knn").score({"embedding": np.zeros((1, 3))}, {"embedding": emb})
    with pytest.raises(ValueError, match="principal dimension must lie in"):
        get_detector("vim").with_params(dim=3).score(
            {"embedding": emb, "head_weight": np.ones((2, 3)), "head_bias": np.zeros(2)},
            {"embedding": emb})
    with pytest.raises(ValueError, match="unknown fit keys"):
        Detector("x", "", {"embedding", "fit"}, lambda i, f: i, fit_keys={"targets"})
    with pytest.raises(ValueError, match="add 'fit' to its needs"):
        Detector("x", "", {"embedding"}, lambda i, f: i, fit_keys={"embedding"})


# ------------------------------------------------------ ensembles, and the parameter search


def test_ensemble_rules():
    """msp, entropy and gen score an ensemble's predictive p̄; maxlogit and energy its mean
    logits (OpenOOD v1.5's ensemble postprocessor); feature detectors the mean of the members'
    u; member detectors read the members themselves."""
    rules = {n: DETECTORS[n].ensemble for n in NAMES}
    assert rules == {"msp": "predictive", "entropy": "predictive", "gen": "predictive",
                     "maxlogit": "mean_logits", "energy": "mean_logits",
                     "mahalanobis": "mean_u", "knn": "mean_u", "vim": "mean_u",
                     "react": "mean_u", "ensemble_entropy": "members",
                     "mutual_information": "members", "disagreement": "members"}
    assert Detector("x", "", {"logits"}, lambda i, f: i).ensemble == "mean_logits"
    with pytest.raises(ValueError, match="ensemble rule 'predictive' does not fit its needs"):
        Detector("x", "", {"embedding"}, lambda i, f: i, ensemble="predictive")


def test_ensemble_logits_by_hand():
    """p̄ averages each member's softmax over its passes, then the members, each member
    weighted equally (an MC-dropout member of 3 passes as much as a plain one)."""
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(3, 5, 4)), rng.normal(size=(5, 4))  # 3 passes; one pass
    pbar = (softmax(a).mean(axis=0) + softmax(b)) / 2
    logp = get_detector("msp").ensemble_logits([a, b])
    np.testing.assert_allclose(np.exp(logp), pbar, rtol=1e-12)
    np.testing.assert_allclose(score("msp", {"logits": logp}), -pbar.max(axis=1), rtol=1e-12)
    np.testing.assert_allclose(score("entropy", {"logits": logp}),
                               -np.sum(pbar * np.log(pbar), axis=1), rtol=1e-12)
    assert not np.allclose(-pbar.max(axis=1),  # not the mean of the members' MSP
                           (score("msp", {"logits": a.mean(axis=0)})
                            + score("msp", {"logits": b})) / 2)
    zbar = (a.mean(axis=0) + b) / 2
    np.testing.assert_allclose(get_detector("energy").ensemble_logits([a, b]), zbar)
    np.testing.assert_array_equal(get_detector("gen").ensemble_logits([b]), b)  # one member
    with pytest.raises(ValueError, match="'knn' .*not scored on a predictor's logits"):
        get_detector("knn").ensemble_logits([b])
    with pytest.raises(ValueError, match="of one shape"):
        get_detector("msp").ensemble_logits([b, b[:, :3]])


def test_search_grids_are_openoods():
    """The grids of OpenOOD v1.5's configs/postprocessors/*.yml (postprocessor_sweep)."""
    assert {n: DETECTORS[n].grid for n in NAMES if DETECTORS[n].grid} == {
        "energy": {"temperature": (1,)},  # ebo.yml
        "gen": {"gamma": (0.01, 0.1, 0.5, 1, 2, 5, 10), "M": (10, 50, 100, 200, 500, 1000)},
        "knn": {"k": (50, 100, 200, 500, 1000)},
        "vim": {"dim": (256, 1000)},
        "react": {"percentile": (85, 90, 95, 99)}}
    with pytest.raises(ValueError, match="grid .* must give values of its parameters"):
        Detector("x", "", {"logits"}, lambda i, f: i, params={"a": 1}, grid={"b": (1,)})


def test_search_params_order_first_maximum_and_skipped_points():
    """OpenOOD's order (the last parameter varies slowest) and criterion (the first grid point
    of the largest validation AUROC); a point the data refuse is skipped and said."""
    det = Detector("x", "", {"logits"}, lambda i, f, a, b: i["logits"][:, 0],
                   params={"a": 0, "b": 0}, grid={"a": (1, 2, 3), "b": (10, 20)})
    auroc = {(1, 10): 0.6, (2, 10): 0.8, (3, 10): 0.7, (1, 20): 0.8, (2, 20): 0.5}
    seen = []

    def val_scores(d):
        key = (d.params["a"], d.params["b"])
        seen.append(key)
        if key not in auroc:
            raise ValueError(f"a = {key[0]} refused")
        n_out = round(10 * auroc[key])  # 10 OOD samples, n_out of them above the one ID
        return np.array([0.5]), np.r_[np.ones(n_out), np.zeros(10 - n_out)]

    params, trials = search_params(det, val_scores)
    assert seen == [(1, 10), (2, 10), (3, 10), (1, 20), (2, 20), (3, 20)]
    assert params == {"a": 2, "b": 10}  # 0.8 first, before (1, 20)
    assert trials[5] == {"params": {"a": 3, "b": 20}, "error": "a = 3 refused"}
    assert [t.get("auroc") for t in trials[:5]] == pytest.approx([0.6, 0.8, 0.7, 0.8, 0.5])

    def refused(d):
        raise ValueError("no")

    assert search_params(det, refused)[0] == {"a": 0, "b": 0}  # nothing scored: the defaults


def test_doctests_pass():
    result = doctest.testmod(uqmetrics.metrics.detectors, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
