"""uqmetrics' KNN detector on its search backends (docs/conventions.md#s-4): faiss (faiss-cpu, in
the test extra) and torch on the CPU run, torch on CUDA where a device is.

The float32 backends (faiss, torch) search float32 unit vectors and recompute the k-th
similarity exactly: their scores are bit-identical to each other and whatever the blocks of
queries; against the float64 numpy backend they differ by the one rounding of each unit vector
to float32, within 4 x 2^-24 of u^2, and rank the samples alike (AUROC unchanged)."""

import faiss  # noqa: F401  (the test extra installs it: a missing faiss fails, never skips)
import numpy as np
import pytest
import torch
from uqmetrics.metrics import detectors
from uqmetrics.metrics.detectors import get_detector
from uqmetrics.metrics.ood import ood_auroc_score

#: |u^2 float32 - u^2 float64|: each unit vector rounded once to float32 (relative 2^-24 per
#: element) moves the inner product of two unit vectors by <= 2 x 2^-24 (+ O(2^-48)), u^2 =
#: 2 - 2 x inner product twice that; the float32 search's own rounding does not enter.
TOL = 4 * 2.0**-24 * (1 + 2.0**-20) + 1e-14


def _data(kind):
    rng = np.random.default_rng({"random": 1, "clustered": 2, "ties": 3}[kind])
    n_fit, n, d = 2000, 300, 64
    if kind == "random":
        return rng.normal(size=(n_fit, d)), np.r_[rng.normal(size=(n, d)),
                                                  rng.normal(0.3, 1, size=(n, d))]
    centres = rng.normal(0, 2, size=(10, d))
    x_fit = centres[rng.integers(0, 10, n_fit)] + rng.normal(size=(n_fit, d))
    x = np.r_[centres[rng.integers(0, 10, n)] + rng.normal(size=(n, d)),
              rng.normal(0, 3, size=(n, d))]
    if kind == "ties":  # 500 copies of one direction: wide bands of equal similarities
        x_fit[:500] = x_fit[0] * rng.uniform(0.5, 2, size=(500, 1))
        x[:20] = x_fit[0]
    return x_fit, x


def _scores(backend, x_fit, x, k=50):
    return get_detector("knn").with_params(k=k, backend=backend).fitted(
        {"embedding": x_fit})({"embedding": x})


@pytest.mark.parametrize("kind", ["random", "clustered", "ties"])
def test_float32_backends_agree_with_float64(kind):
    x_fit, x = _data(kind)
    ref = _scores("numpy", x_fit, x)
    u = {b: _scores(b, x_fit, x) for b in ("faiss", "torch", "auto")}
    assert np.array_equal(u["faiss"], u["torch"]) and np.array_equal(u["auto"], u["faiss"])
    np.testing.assert_allclose(u["faiss"]**2, ref**2, rtol=0, atol=TOL)
    n = len(x) // 2
    assert ood_auroc_score(u["faiss"][:n], u["faiss"][n:]) == pytest.approx(
        ood_auroc_score(ref[:n], ref[n:]), abs=1e-6)
    if kind != "ties":  # (equal fit directions tie the scores of equal queries exactly)
        np.testing.assert_array_equal(np.argsort(u["faiss"]), np.argsort(ref))


@pytest.mark.parametrize("backend", ["faiss", "torch"])
@pytest.mark.parametrize("k", [1, 50, 499, 501])
def test_blocks_of_queries_change_nothing(backend, k, monkeypatch):
    x_fit, x = _data("ties")
    scorer = get_detector("knn").with_params(k=k, backend=backend).fitted({"embedding": x_fit})
    whole = scorer({"embedding": x})
    parts = np.concatenate([scorer({"embedding": x[i:i + 13]}) for i in range(0, len(x), 13)])
    monkeypatch.setattr(detectors, "_KNN_BLOCK", 5 * len(x_fit))
    blocks = scorer({"embedding": x})
    assert np.array_equal(parts, whole) and np.array_equal(blocks, whole)
    # and the exact k-th neighbour: the sorted distances of the float32 unit vectors
    b32 = (x_fit / np.linalg.norm(x_fit, axis=1, keepdims=True)).astype(np.float32)
    z32 = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    sim = np.sort(z32.astype(np.float64) @ b32.astype(np.float64).T, axis=1)[:, -k]
    np.testing.assert_allclose(whole, np.sqrt(np.maximum(2 - 2 * sim, 0)), rtol=0, atol=1e-7)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_torch_on_cuda_equals_faiss():
    x_fit, x = _data("clustered")
    assert np.array_equal(_scores("torch:cuda", x_fit, x), _scores("faiss", x_fit, x))


@pytest.mark.parametrize("kind", ["clustered", "ties"])
def test_auto_without_faiss_gives_the_same_bits(kind, monkeypatch):
    """A result never depends on whether faiss is installed: without it (``find_spec`` answers
    None), ``auto`` runs the same float32 search in numpy and scores the same bits."""
    x_fit, x = _data(kind)
    with_faiss = _scores("auto", x_fit, x)
    monkeypatch.setitem(__import__("sys").modules, "faiss", None)  # as if not installed
    assert detectors._knn_backend("auto")[0] == "numpy32"
    assert np.array_equal(_scores("auto", x_fit, x), with_faiss)


def test_torch_search_under_torchs_per_backend_precision(monkeypatch):
    """A user who set torch >= 2.9's per-backend fp32_precision to TF32 (torch then refuses
    its legacy TF32 flags): the torch search runs in IEEE float32, gives the bits of the other
    float32 backends, and the user's setting is theirs again afterwards."""
    x_fit, x = _data("random")
    matmul = torch.backends.cuda.matmul
    seen = []
    kth = detectors._kth_similarity

    def spy(*args, **kwargs):
        seen.append(matmul.fp32_precision)
        return kth(*args, **kwargs)

    monkeypatch.setattr(detectors, "_kth_similarity", spy)
    saved = matmul.fp32_precision
    try:
        matmul.fp32_precision = "tf32"
        u = _scores("torch", x_fit, x)
        assert matmul.fp32_precision == "tf32"
    finally:
        matmul.fp32_precision = saved
    assert seen and set(seen) == {"ieee"}
    assert np.array_equal(u, _scores("faiss", x_fit, x))
