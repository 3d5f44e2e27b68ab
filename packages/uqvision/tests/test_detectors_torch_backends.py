"""uqmetrics' Mahalanobis and ViM detectors on their torch backends (docs/conventions.md#s-4):
``torch`` on the CPU runs here, ``torch:cuda`` where a device is.

The torch backends fit and score with float32 products and float64 where accuracy needs it;
``numpy`` (and ``auto``, its alias) is the reference. The tolerances below are derived from
float32 rounding (unit roundoff u = 2^-24; a float32 inner product of length n is within
gamma_n |a|.|b| of the exact one, gamma_n = n u / (1 - n u): Higham 2002, Accuracy and
stability of numerical algorithms, section 3.1) and from perturbation theory for the fitted
matrices (the covariance's rounding E moves its pseudo-inverse by <= ||P||^2 ||E|| / (1 - ||P||
||E||) and the residual space of ViM by sin(theta) <= ||E|| / (gap - ||E||): Davis & Kahan 1970,
The rotation of eigenvectors by a perturbation. III); each is computed from the data of the
test. The ranking (AUROC) must be identical."""

import numpy as np
import pytest
import torch
from uqmetrics.metrics import detectors
from uqmetrics.metrics.detectors import FEATURE_BACKENDS, get_detector
from uqmetrics.metrics.ood import ood_auroc_score

U = 2.0**-24


def _gamma(n):
    return n * U / (1 - n * U)


def _maha_data(seed=0, n_fit=3000, n=300, d=32, n_cls=8):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 2, size=(n_cls, d))
    y = np.arange(n_fit) % n_cls
    scale = rng.uniform(0.5, 2.0, size=d)  # an anisotropic covariance
    x_fit = 3.0 + centres[y] + scale * rng.normal(size=(n_fit, d))
    x = np.r_[3.0 + centres[rng.integers(0, n_cls, n)] + scale * rng.normal(size=(n, d)),
              3.0 + rng.normal(0, 3, size=(n, d))]
    return x_fit.astype(np.float32), y, x.astype(np.float32)


def _maha_bound(x_fit, y, x, rows):
    """|u_torch - u_exact| per scored sample (module docstring): the float32 products of the
    scoring, and the covariance's rounding E through the pseudo-inverse P: v^T (P~ - P) v for
    v = x - mu_c is -(Pv)^T E (Pv) to first order, the rest <= ||Pv||^2 ||E||^2 ||P|| / (1 -
    ||P|| ||E||). The minimum over classes moves by at most the largest bound among the classes
    that can be the minimum."""
    d = x_fit.shape[1]
    xf, x = x_fit.astype(np.float64), x.astype(np.float64)
    classes, inverse = np.unique(y, return_inverse=True)
    means = np.array([xf[inverse == c].mean(axis=0) for c in range(classes.size)])
    r = xf - means[inverse]
    precision = np.linalg.inv(r.T @ r / len(xf))
    e_abs = (_gamma(min(rows, len(xf))) + 2 * U) * (np.abs(r).T @ np.abs(r)) / len(xf)
    e2, p2 = np.linalg.norm(e_abs), np.linalg.norm(precision, 2)
    assert p2 * e2 < 0.5  # the perturbation bound applies
    v = x[:, None, :] - means[None]  # (sample, class, feature)
    pv = v @ precision
    fit_term = (np.einsum("ncd,de,nce->nc", np.abs(pv), e_abs, np.abs(pv))
                + (pv**2).sum(axis=2) * e2**2 * p2 / (1 - p2 * e2))
    centre = xf.mean(axis=0)
    xc, mc = np.abs(x - centre), np.abs(means - centre)
    quad = np.einsum("nd,de,ne->n", xc, np.abs(precision), xc)
    cross = xc @ (np.abs(precision) @ mc.T)  # (sample, class)
    e = (_gamma(d) + 3 * U) * (quad[:, None] + 2 * cross) + fit_term
    d2 = np.einsum("ncd,nce->nc", pv, v)
    best = d2.argmin(axis=1)
    rows_ = np.arange(len(x))
    candidates = d2 - e <= (d2[rows_, best] + e[rows_, best])[:, None]
    return np.where(candidates, e, 0).max(axis=1)


def _vim_data(seed=0, n_fit=1000, n=300, d=48, n_cls=10, dim=24):
    """Features with a clear gap at ViM's cut: dim principal directions of std 3 (holding the
    mean) and the rest of std 0.5."""
    rng = np.random.default_rng(seed)
    q = np.linalg.qr(rng.normal(size=(d, d)))[0]
    std = np.r_[np.full(dim, 3.0), np.full(d - dim, 0.5)]
    mu = q[:, :dim] @ rng.normal(0, 2, dim)
    x_fit = mu + (rng.normal(size=(n_fit, d)) * std) @ q.T
    x = np.r_[mu + (rng.normal(size=(n, d)) * std) @ q.T,
              mu + (rng.normal(size=(n, d)) * np.r_[std[:dim], np.full(d - dim, 1.2)]) @ q.T]
    w = rng.normal(size=(n_cls, d)) / np.sqrt(d)
    b = rng.normal(0, 0.1, size=n_cls)
    return (x_fit.astype(np.float32), x.astype(np.float32), w.astype(np.float32),
            b.astype(np.float32))


def _vim_bound(x_fit, x, w, b, dim, rows=4096):
    """|u - u_exact| per scored sample for either backend (both compute with float32
    products): the logits' and the residuals' float32 products; the covariance's rounding E
    through the residual space: to first order the residual r = ||a|| (a, p: v's coordinates
    in the residual and the principal eigenvectors) moves by a^T X p / r, X_ij = s_i^T E s_j /
    (l_j - l_i), ||X||_F <= ||E||_F / gap, so by <= ||p|| ||E||_F / gap (twice that for the
    higher orders, with gap > 4 ||E||_F); and through alpha."""
    d = x_fit.shape[1]
    w64, b64 = w.astype(np.float64), b.astype(np.float64)
    origin = -np.linalg.pinv(w64) @ b64
    xf = x_fit.astype(np.float64)
    c = np.abs(xf - xf.mean(axis=0))
    vals, vecs = np.linalg.eigh((xf - origin).T @ (xf - origin) / len(xf))
    e_abs = (_gamma(min(rows, len(xf))) + 2 * U) * (c.T @ c) / len(xf)
    k = d - dim
    gap, e_frob = vals[k] - vals[k - 1], np.linalg.norm(e_abs)
    assert gap > 4 * e_frob  # first order dominates

    def parts(z):
        z = z.astype(np.float64)
        v = z - origin
        logits = z @ w64.T + b64
        e_logit = (_gamma(d) + 2 * U) * (np.abs(z) @ np.abs(w64).T).max(axis=1)
        a, p = v @ vecs[:, :k], v @ vecs[:, k:]
        residual = np.linalg.norm(a, axis=1)
        e_res = (np.sqrt(k) * (_gamma(d) * np.linalg.norm(z, axis=1)
                               + U * np.linalg.norm(v, axis=1))
                 + 2 * np.linalg.norm(p, axis=1) * e_frob / gap)
        return logits, e_logit, residual, e_res

    logits, e_logit, residual, e_res = parts(x_fit)
    big_a, big_b = logits.max(axis=1).sum(), residual.sum()
    alpha = big_a / big_b
    e_alpha = (e_logit.sum() + abs(alpha) * e_res.sum()) / (big_b - e_res.sum())
    _, e_logit, residual, e_res = parts(x)
    return e_alpha * residual + (abs(alpha) + e_alpha) * e_res + e_logit


def _score(name, backend, fit, inputs, **params):
    det = get_detector(name).with_params(backend=backend, **params)
    return det.fitted({k: fit[k] for k in det.fit_keys})(inputs)


def _maha(backend, seed=0):
    x_fit, y, x = _maha_data(seed)
    return _score("mahalanobis", backend, {"embedding": x_fit, "labels": y}, {"embedding": x})


def _vim(backend, seed=0):
    x_fit, x, w, b = _vim_data(seed)
    head = {"head_weight": w, "head_bias": b}
    return _score("vim", backend, {"embedding": x_fit, **head}, {"embedding": x, **head}, dim=24)


def _same_ranking(u, ref):
    n = len(u) // 2
    assert ood_auroc_score(u[:n], u[n:]) == ood_auroc_score(ref[:n], ref[n:])
    np.testing.assert_array_equal(np.argsort(u), np.argsort(ref))


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                         reason="needs a CUDA device"))])
def test_mahalanobis_torch_within_float32_rounding(device):
    x_fit, y, x = _maha_data()
    ref = _maha("numpy")
    u = _maha(f"torch:{device}")
    bound = _maha_bound(x_fit, y, x, detectors._torch_rows(torch.device(device)))
    err = np.abs(u - ref)
    assert (err <= bound + 1e-12 * np.abs(ref)).all(), (err / bound).max()
    assert err.max() > 0 and bound.max() < 0.1 * np.abs(ref).max()  # (not vacuous)
    _same_ranking(u, ref)
    assert np.array_equal(_maha("auto"), ref)  # auto is numpy, bit for bit


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                         reason="needs a CUDA device"))])
def test_vim_torch_within_float32_rounding(device):
    x_fit, x, w, b = _vim_data()
    ref = _vim("numpy")
    u = _vim(f"torch:{device}")
    rows = max(detectors._CHUNK, detectors._torch_rows(torch.device(device)))
    bound = 2 * _vim_bound(x_fit, x, w, b, 24, rows)  # each backend's own float32 rounding
    err = np.abs(u - ref)
    assert (err <= bound + 1e-12 * np.abs(ref)).all(), (err / bound).max()
    assert err.max() > 0 and bound.max() < 0.1 * np.abs(ref).max()  # (not vacuous)
    _same_ranking(u, ref)
    assert np.array_equal(_vim("auto"), ref)  # auto is numpy, bit for bit


@pytest.mark.parametrize("name", ["mahalanobis", "vim"])
def test_torch_scores_do_not_depend_on_the_rows_scored_together(name, monkeypatch):
    """A scored block is always _torch_rows rows (padded), so a sample's score is the same bits
    whether scored alone, in pieces or with the whole set; fitting again gives the same bits."""
    if name == "mahalanobis":
        x_fit, y, x = _maha_data(1)
        fit, extra = {"embedding": x_fit, "labels": y}, {}
    else:
        x_fit, x, w, b = _vim_data(1)
        extra = {"head_weight": w, "head_bias": b}
        fit = {"embedding": x_fit, **extra}
    monkeypatch.setattr(detectors, "_torch_rows", lambda dev: 256)  # several blocks here
    det = get_detector(name).with_params(backend="torch")
    scorer = det.fitted({k: fit[k] for k in det.fit_keys})
    whole = scorer({"embedding": x, **extra})
    parts = np.concatenate([scorer({"embedding": x[i:i + 37], **extra})
                            for i in range(0, len(x), 37)])
    again = det.fitted({k: fit[k] for k in det.fit_keys})({"embedding": x, **extra})
    assert np.array_equal(parts, whole) and np.array_equal(again, whole)


@pytest.mark.parametrize("name", ["mahalanobis", "vim"])
def test_torch_cpu_scores_do_not_depend_on_the_thread_count(name):
    """The float32 products split no sum across threads; the float64 eigendecompositions run
    on one thread (LAPACK's threaded ones differ in the last bits)."""
    saved = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runs.append(_maha("torch", 3) if name == "mahalanobis" else _vim("torch", 3))
            assert torch.get_num_threads() == threads  # (restored)
    finally:
        torch.set_num_threads(saved)
    assert np.array_equal(*runs)


@pytest.mark.parametrize("name", ["mahalanobis", "vim", "knn"])
@pytest.mark.parametrize("bad", ["gpu", "numpy:cuda", "torch:", "faiss:cpu", "torch:nowhere",
                                 3, None])
def test_bad_backend_names_the_argument_and_value(name, bad):
    det = get_detector(name).with_params(backend=bad)
    fit = {"embedding": np.ones((4, 3)), "labels": np.arange(4) % 2,
           "head_weight": np.eye(2, 3), "head_bias": np.zeros(2)}
    with pytest.raises(ValueError, match=rf"{name}: backend .*{repr(bad)[:5]}"):
        det.fitted({k: fit[k] for k in det.fit_keys})


@pytest.mark.parametrize("name", ["mahalanobis", "vim"])
def test_faiss_is_no_backend_of_mahalanobis_and_vim(name):
    assert FEATURE_BACKENDS == ("auto", "numpy", "torch")
    with pytest.raises(ValueError, match=rf"{name}: backend must be one of auto, numpy, torch"):
        get_detector(name).with_params(backend="faiss").fitted(
            {"embedding": np.ones((4, 3)), "labels": np.arange(4) % 2,
             "head_weight": np.eye(2, 3), "head_bias": np.zeros(2)})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_cuda_backend_without_cuda_says_so():
    with pytest.raises(ValueError, match=r"vim: backend 'torch:cuda' needs a CUDA device"):
        _vim("torch:cuda")


def test_float32_products_are_ieee_and_the_setting_restored():
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        with detectors._Float32Products(torch):
            assert torch.get_float32_matmul_precision() == "highest"
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(saved)


def test_float32_products_under_torchs_per_backend_precision():
    """A user who set torch >= 2.9's per-backend fp32_precision (torch then refuses
    get_float32_matmul_precision): IEEE within, theirs restored."""
    matmul = torch.backends.cuda.matmul
    saved = matmul.fp32_precision
    try:
        matmul.fp32_precision = "tf32"
        with detectors._Float32Products(torch):
            assert matmul.fp32_precision == "ieee"
        assert matmul.fp32_precision == "tf32"
        assert np.array_equal(_vim("torch"), _vim("torch"))  # and the backend runs
    finally:
        matmul.fp32_precision = saved


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["mahalanobis", "vim"])
def test_cuda_runs_are_bit_identical(name):
    u = _maha("torch:cuda", 2) if name == "mahalanobis" else _vim("torch:cuda", 2)
    again = _maha("torch:cuda", 2) if name == "mahalanobis" else _vim("torch:cuda", 2)
    assert np.array_equal(u, again)


@pytest.mark.parametrize("name", ["mahalanobis", "vim"])
def test_torch_fit_refuses_non_finite_features(name):
    x_fit, _, w, b = _vim_data(4)
    x_fit[5, 3] = np.nan
    fit = {"embedding": x_fit, "labels": np.arange(len(x_fit)) % 3, "head_weight": w,
           "head_bias": b}
    det = get_detector(name).with_params(backend="torch")
    with pytest.raises(ValueError, match="fit embedding must be finite"):
        det.fitted({k: fit[k] for k in det.fit_keys})


def test_class_sums_one_hot_as_index_add():
    """CUDA's one-hot product (its index_add_ adds in no fixed order) and the CPU's index_add_
    sum the same float64 values: equal to float64 rounding."""
    rng = np.random.default_rng(5)
    x = torch.from_numpy(rng.normal(size=(700, 6)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 4, 700))
    a = detectors._class_sums(x, y, 4, 256, one_hot=True)
    b = detectors._class_sums(x, y, 4, 256, one_hot=False)
    ref = np.array([x.numpy()[y.numpy() == c].astype(np.float64).sum(axis=0) for c in range(4)])
    np.testing.assert_allclose(a.numpy(), ref, rtol=1e-13, atol=1e-12)
    np.testing.assert_allclose(b.numpy(), ref, rtol=1e-13, atol=1e-12)


@pytest.mark.parametrize("shape", [(10, 48), (60, 48), (48, 48)])
def test_vim_origin_by_qr_is_numpys_lstsq(shape):
    """CUDA's origin -pinv(W) b by a QR factorisation (run here on the CPU): numpy's lstsq to
    float64 rounding for W of full rank, wide (minimum norm) or tall (least squares); lstsq
    itself for a rank-deficient W."""
    rng = np.random.default_rng(6)
    w, b = rng.normal(size=shape), rng.normal(size=shape[0])
    ref = -np.linalg.lstsq(w, b, rcond=None)[0]
    u = detectors._vim_origin_torch(w, b, torch.device("cpu"), qr=True).numpy()
    np.testing.assert_allclose(u, ref, rtol=0, atol=1e-10 * np.abs(ref).max())
    if shape[0] > shape[1]:  # rank-deficient: the QR's triangle says so, lstsq decides
        w[:, 1] = w[:, 0]
    else:
        w[1] = w[0]
    ref = -np.linalg.lstsq(w, b, rcond=None)[0]
    assert np.array_equal(detectors._vim_origin_torch(w, b, torch.device("cpu"), qr=True)
                          .numpy(), ref)
