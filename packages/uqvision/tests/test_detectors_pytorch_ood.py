"""uqmetrics' OOD detectors and metrics against pytorch-ood (Kirchheim et al. 2022, "PyTorch-OOD:
a library for out-of-distribution detection based on PyTorch"), an independent implementation.

Both score the same random logits and features (torch tensors built from the numpy arrays); the
detectors agree exactly or up to a positive constant factor (so every metric agrees):

=============  =====================  =====================================================
uqmetrics      pytorch-ood            relation
=============  =====================  =====================================================
msp            MaxSoftmax             equal
maxlogit       MaxLogit               equal
energy         EnergyBased            equal (T = 1 and T = 2)
entropy        Entropy                equal
gen            GEN(M=100)             ours = min(M, C) x theirs: they average the top-M
                                      terms, OpenOOD and we sum them (and they clamp p to
                                      [1e-7, 1 - 1e-7], not reached here)
mahalanobis    Mahalanobis            ours = 2 n_fit x theirs: their covariance is the
                                      scatter matrix (not divided by n_fit) plus a 1e-6
                                      ridge, their distance halved; no input preprocessing
                                      on either side (their MahalanobisODIN has it)
knn            KNN(k=50)              equal (Euclidean distance of unit features; backend
                                      numpy, float64; faiss's float32 within 4 x 2^-24 of u^2)
vim            ViM                    equal (theirs in float32)
react          ReAct(percentile=0.9)  equal
=============  =====================  =====================================================

The metrics agree with ``pytorch_ood.metrics.OODMetrics`` (OOD samples labelled < 0, scores =
u): AUROC; FPR95TPR = ``fpr_at_95_tpr`` (both out-domain positive); AUPR-IN / AUPR-OUT =
``aupr_in`` / ``aupr_out`` with ``curve="trapezoid"`` (pytorch-ood and OpenOOD take the
trapezoidal area, uqmetrics by default the average precision).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pytorch_ood")

from pytorch_ood.detector import (
    GEN,
    KNN,
    EnergyBased,
    Entropy,
    Mahalanobis,
    MaxLogit,
    MaxSoftmax,
    ReAct,
    ViM,
)

try:  # pytorch-ood >= 0.3
    from pytorch_ood.metrics import OODMetrics
except ImportError:  # pragma: no cover - older releases
    from pytorch_ood.utils import OODMetrics

from uqmetrics.metrics.detectors import get_detector
from uqmetrics.metrics.ood import aupr_in, aupr_out, fpr_at_95_tpr, ood_auroc_score

N_FIT, N, D, C = 600, 200, 32, 10


@pytest.fixture(scope="module")
def data():
    """Fit features with labels 0..C-1 (all present), scored features, head, logits."""
    rng = np.random.default_rng(20230613)
    centres = rng.normal(0, 2, size=(C, D))
    y = np.arange(N_FIT) % C
    mix = rng.normal(size=(D, D)) / np.sqrt(D) + np.eye(D)
    x_fit = centres[y] + rng.normal(size=(N_FIT, D)) @ mix
    x = np.r_[centres[rng.integers(0, C, N // 2)] + rng.normal(size=(N // 2, D)) @ mix,
              rng.normal(0, 3, size=(N // 2, D))]  # half in-distribution-like, half not
    w, b = rng.normal(size=(C, D)) / np.sqrt(D), rng.normal(size=C)
    # logits for the logit-only detectors: moderate, so that pytorch-ood's clamps of p to
    # [1e-7, 1] (Entropy) and [1e-7, 1 - 1e-7] (GEN) are inactive (checked below)
    logits = rng.normal(0, 2, size=(N, C))
    return {"x_fit": x_fit, "y_fit": y, "x": x, "w": w, "b": b, "logits": logits}


@pytest.fixture
def float64():
    """pytorch-ood allocates its fitted statistics in torch's default dtype."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def t(a):
    return torch.from_numpy(np.asarray(a))


def ours(name, data, **params):
    """uqmetrics' detector ``name`` on the scored features/logits, fitted on the fit features
    (extra input keys are ignored)."""
    d = get_detector(name)
    d = d.with_params(**params) if params else d
    inputs = {"logits": data["logits"], "embedding": data["x"], "head_weight": data["w"],
              "head_bias": data["b"]}
    fit = {"embedding": data["x_fit"], "labels": data["y_fit"]} if "fit" in d.needs else None
    return d.score(inputs, fit)


@pytest.mark.parametrize(("name", "theirs"), [
    ("msp", lambda z: MaxSoftmax.score(z)),
    ("maxlogit", lambda z: MaxLogit.score(z)),
    ("energy", lambda z: EnergyBased.score(z)),
    ("entropy", lambda z: Entropy.score(z)),
])
def test_logit_detectors_equal_pytorch_ood(data, name, theirs):
    p = torch.softmax(t(data["logits"]), dim=1)
    assert 1e-7 < float(p.min()) and float(p.max()) < 1 - 1e-7  # their clamps are inactive
    expected = theirs(t(data["logits"])).numpy()
    np.testing.assert_allclose(ours(name, data), expected, rtol=1e-12, atol=1e-12)


def test_energy_temperature_equals_pytorch_ood(data):
    expected = EnergyBased.score(t(data["logits"]), t=2.0).numpy()
    np.testing.assert_allclose(ours("energy", data, temperature=2.0), expected, rtol=1e-12)


@pytest.mark.parametrize("m", [100, 5, 1])
def test_gen_is_pytorch_ood_times_m(data, m):
    p = torch.softmax(t(data["logits"]), dim=1)
    assert 1e-7 < float(p.min()) and float(p.max()) < 1 - 1e-7  # their clamp is inactive
    expected = GEN.score(t(data["logits"]), gamma=0.1, M=m).numpy() * min(m, C)
    np.testing.assert_allclose(ours("gen", data, M=m), expected, rtol=1e-12)


def test_mahalanobis_is_pytorch_ood_times_2n(data, float64):
    det = Mahalanobis(None).fit_features(t(data["x_fit"]), t(data["y_fit"]))
    theirs = det.predict_features(t(data["x"])).numpy()
    # their 1e-6 ridge on the scatter matrix moves the distances by about 1e-6 / (n_fit x the
    # smallest covariance eigenvalue), here < 1e-6 relative
    np.testing.assert_allclose(ours("mahalanobis", data), 2 * N_FIT * theirs, rtol=2e-6)
    # ... and that ridge is the only difference: with it added to our (tied, MLE) covariance
    # times n_fit the two agree to rounding
    x_fit, y, x = data["x_fit"], data["y_fit"], data["x"]
    means = np.stack([x_fit[y == c].mean(0) for c in range(C)])
    scatter = (x_fit - means[y]).T @ (x_fit - means[y])
    precision = np.linalg.inv(scatter + 1e-6 * np.eye(D))
    ridged = np.min([np.einsum("nd,de,ne->n", x - m, precision, x - m) for m in means], axis=0)
    np.testing.assert_allclose(ridged / 2, theirs, rtol=1e-10)


def test_knn_equals_pytorch_ood(data):
    det = KNN(None, k=50).fit_features(t(data["x_fit"]), t(data["y_fit"]))
    theirs = det.predict_features(t(data["x"])).numpy()
    np.testing.assert_allclose(ours("knn", data, backend="numpy"), theirs, rtol=1e-10,
                               atol=1e-12)
    # the default backend (faiss, installed by the test extra) on float32 unit vectors: u^2
    # within 4 x 2^-24 (each unit vector rounded once; test_detectors_knn_backends.py)
    np.testing.assert_allclose(ours("knn", data)**2, theirs**2, rtol=0, atol=4.1 * 2.0**-24)


@pytest.mark.parametrize("dim", [16, 8])
def test_vim_equals_pytorch_ood(data, dim):
    det = ViM(None, d=dim, w=t(data["w"]), b=t(data["b"]))
    det.fit_features(t(data["x_fit"]), t(data["y_fit"]))
    theirs = det.predict_features(t(data["x"])).numpy().astype(np.float64)
    u = ours("vim", data, dim=dim)
    # float32 on their side: agreement to 1e-4 of the scale of the scores
    np.testing.assert_allclose(u, theirs, rtol=0, atol=1e-4 * np.abs(u).max())
    # and the default dimension D // 2 = 16 for 32 features is their rule for d > D
    np.testing.assert_allclose(ours("vim", data), ours("vim", data, dim=16), rtol=1e-15)


def test_react_equals_pytorch_ood(data):
    w, b = t(data["w"]), t(data["b"])
    det = ReAct(lambda x: x, lambda f: f @ w.T + b, percentile=0.9)
    det.fit_feature_maps(t(data["x_fit"]), t(data["y_fit"]))
    theirs = det.predict_feature_maps(t(data["x"])).numpy()
    assert det.threshold == pytest.approx(np.percentile(data["x_fit"], 90), rel=1e-15)
    np.testing.assert_allclose(ours("react", data), theirs, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------ metrics


def _their_metrics(u_in, u_out):
    scores = t(np.r_[u_in, u_out])
    labels = t(np.r_[np.zeros(len(u_in), np.int64), -np.ones(len(u_out), np.int64)])
    return OODMetrics().update(scores, labels).compute()


def _cases():
    rng = np.random.default_rng(7)
    yield "random", rng.normal(size=300), rng.normal(0.8, 1.5, size=120)
    yield "small", rng.normal(size=7), rng.normal(size=3)
    yield "tied", rng.integers(0, 4, 300).astype(float), rng.integers(1, 6, 80).astype(float)
    yield "very tied", rng.integers(0, 2, 50).astype(float), rng.integers(0, 2, 500).astype(float)
    yield "separated", rng.normal(size=40), rng.normal(size=40) + 100.0
    u = np.arange(20.0)
    yield "diagonal ties", u, u  # one straight ROC line (OpenOOD's drop_intermediate differs)
    for seed in range(20):
        r = np.random.default_rng(seed)
        n_in, n_out = r.integers(2, 60, size=2)
        yield f"grid {seed}", r.integers(0, 8, n_in) / 4.0, r.integers(2, 10, n_out) / 4.0


@pytest.mark.parametrize(("case", "u_in", "u_out"), list(_cases()),
                         ids=[c[0] for c in _cases()])
def test_metrics_equal_pytorch_ood(case, u_in, u_out):
    theirs = _their_metrics(u_in, u_out)
    assert ood_auroc_score(u_in, u_out) == pytest.approx(theirs["AUROC"], abs=1e-12)
    assert fpr_at_95_tpr(u_in, u_out) == pytest.approx(theirs["FPR95TPR"], abs=1e-15)
    assert aupr_in(u_in, u_out, curve="trapezoid") == pytest.approx(theirs["AUPR-IN"],
                                                                    abs=1e-12)
    assert aupr_out(u_in, u_out, curve="trapezoid") == pytest.approx(theirs["AUPR-OUT"],
                                                                     abs=1e-12)
