"""URL losses against hand computations (numpy, float64) on 2–3-sample batches, and the
gradient paths the losses promise (V.4).

Tolerances: both sides are float64; each loss is O(10^2) floating-point operations on values of
order 1-10 (log-sum-exps, a 3-layer MLP, scipy's scaled Bessel function, which is accurate to a
few ulp). Rounding therefore differs by at most ~1e-13 relative; ``RTOL = 1e-10`` is that
bound with a margin of 10^3, and still far below any change a wrong formula makes (>= 1e-3 on
these batches).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import special

from uqvision.methods import TRAINING_METHODS
from uqvision.protocols.url.heads import BatchNoise
from uqvision.protocols.url.methods import build_model
from uqvision.protocols.url.vmf import sample_vmf

RTOL = 1e-10


class _Flat(torch.nn.Module):
    """The identity backbone: the embedding is the input (d features)."""

    def __init__(self, d):
        super().__init__()
        self.num_features = d

    def forward(self, x):
        return x


def _np(t):
    """A float64 numpy copy (never a view of a parameter)."""
    return t.detach().double().numpy().copy()


def _softplus(x):
    return np.logaddexp(0.0, x)


def _log_softmax(z, axis=-1):
    return z - special.logsumexp(z, axis=axis, keepdims=True)


def _ce(logits, y):
    """Mean cross-entropy of (b, c) logits (log-probabilities up to a constant)."""
    return float(-np.mean(_log_softmax(logits)[np.arange(len(y)), y]))


def _mlp(mlp, e):
    """The 3-layer uncertainty MLP of heads.UMLP by hand: relu, relu, softplus, times scale."""
    w = [(_np(m.weight), _np(m.bias)) for m in mlp if isinstance(m, torch.nn.Linear)]
    h = np.maximum(e @ w[0][0].T + w[0][1], 0)
    h = np.maximum(h @ w[1][0].T + w[1][1], 0)
    return _softplus(h @ w[2][0].T + w[2][1])[:, 0] * float(mlp.scale)


def _log_c(kappa, m):
    """log C_m(kappa) of the vMF on S^{m-1}: (m/2-1) log k - (m/2) log 2 pi - log I_{m/2-1}(k)."""
    v = m / 2 - 1
    return v * np.log(kappa) - m / 2 * np.log(2 * np.pi) - (np.log(special.ive(v, kappa))
                                                              + kappa)


def _model(name, d, c, seed=0, **hp):
    torch.manual_seed(seed)
    tm = TRAINING_METHODS.lookup(name)
    model = build_model(name, _Flat(d), c, tm.hparams_from(**hp)).double()
    model.train()
    return tm, model


def _batch(b, d, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, d, generator=g, dtype=torch.float64)


def _randomise(module, seed):
    """Non-default values for every parameter (so that e.g. unit LayerNorm weights or zero
    log-concentrations cannot hide a missing term)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))


def test_elk_loss_by_hand():
    """ELK: CE over logits_c = log C(k) + log C(t k_c) - log C(||k mu + t k_c mu_c||) (eq. 3),
    k from the 3-layer MLP, mu the normalised embedding, mu_c the normalised proxies."""
    d, c, t = 4, 3, 2.0
    tm, model = _model("elk", d, c, t=t)
    _randomise(model.head, 2)
    x, y = _batch(3, d), torch.tensor([0, 2, 1])
    out = model(x)
    loss = tm.loss(None, out, y).item()
    e = _np(x)
    kappa = _mlp(model.head.mlp, e)
    mu = e / np.linalg.norm(e, axis=1, keepdims=True)
    protos = _np(model.head.mu)
    protos = protos / np.linalg.norm(protos, axis=1, keepdims=True)
    kc = t * np.exp(_np(model.head.log_kappa))
    joint = np.linalg.norm(kappa[:, None, None] * mu[:, None] + kc[None, :, None] * protos[None],
                           axis=-1)
    logits = _log_c(kappa, d)[:, None] + _log_c(kc, d)[None] - _log_c(joint, d)
    np.testing.assert_allclose(_np(out["scalar"]), kappa, rtol=RTOL)
    assert loss == pytest.approx(_ce(logits, y.numpy()), rel=RTOL)


def test_nivmf_loss_by_hand():
    """nivMF: CE over log mean_k exp(k_c mu_c^T (a_c * s_k) / ||a_c * s_k||) with s_k the vMF
    samples of the posterior (the samples are the sampler's, drawn from the same seed; the
    sampler itself is tested in test_url_methods.py)."""
    d, c, t, n = 3, 3, 1.5, 4
    tm, model = _model("nivmf", d, c, t=t, samples=n, u_start=0.0)
    _randomise(model.head, 3)
    model.head.noise = BatchNoise(torch.Generator().manual_seed(11))
    x, y = _batch(2, d, seed=4), torch.tensor([1, 2])
    loss = tm.loss(None, model(x), y).item()
    e = _np(x)
    kappa = _mlp(model.head.mlp, e)
    mu = e / np.linalg.norm(e, axis=1, keepdims=True)
    s = _np(sample_vmf(torch.tensor(mu), torch.tensor(kappa), n,
                       torch.Generator().manual_seed(11)))  # (n, b, d)
    protos = _np(model.head.mu)
    protos = protos / np.linalg.norm(protos, axis=1, keepdims=True)
    kc = t * np.exp(_np(model.head.log_kappa))
    a = np.exp(_np(model.head.log_scale))  # (c, d)
    dens = np.empty((n, 2, c))
    for k in range(n):
        for i in range(2):
            for j in range(c):
                z = a[j] * s[k, i]
                dens[k, i, j] = kc[j] * protos[j] @ z / np.linalg.norm(z)
    logits = special.logsumexp(dens, axis=0) - np.log(n)
    assert loss == pytest.approx(_ce(logits, y.numpy()), rel=RTOL)


def test_hetxl_loss_by_hand():
    """HET-XL: e + V^T z1 + sqrt(diag) z2 (rank-r low-rank plus diagonal noise), a linear
    classifier over tau, CE of the log of the mean softmax over the MC samples (eq. 6)."""
    d, c, r, n = 3, 3, 2, 5
    tm, model = _model("hetxl", d, c, rank=r, samples=n)
    _randomise(model.head, 5)
    model.head.noise = BatchNoise(torch.Generator().manual_seed(13))
    x, y = _batch(3, d, seed=6), torch.tensor([2, 0, 0])
    loss = tm.loss(None, model(x), y).item()
    g = torch.Generator().manual_seed(13)  # the head's draws, in its order: z1 then z2
    z1 = _np(torch.randn((n, 3, r), generator=g, dtype=torch.float64))
    z2 = _np(torch.randn((n, 3, d), generator=g, dtype=torch.float64))
    e = _np(x)
    p = e @ _np(model.head.cov.weight).T + _np(model.head.cov.bias)
    v = p[:, : d * r].reshape(3, r, d)
    diag = _softplus(p[:, d * r:]) + 1e-6
    logits = np.empty((n, 3, c))
    for k in range(n):
        for i in range(3):
            noisy = e[i] + z1[k, i] @ v[i] + np.sqrt(diag[i]) * z2[k, i]
            logits[k, i] = ((_np(model.head.fc.weight) @ noisy + _np(model.head.fc.bias))
                            / np.exp(_np(model.head.log_tau)))
    mean_logp = special.logsumexp(_log_softmax(logits), axis=0) - np.log(n)
    assert loss == pytest.approx(_ce(mean_logp, y.numpy()), rel=RTOL)


def test_sngp_loss_by_hand():
    """SNGP in training: CE of beta^T phi, phi = sqrt(2/F) cos(W LN(e) + b) with a learnt
    LayerNorm (eps 1e-5); at test time the mean-field logits beta^T phi / sqrt(1 + pi/8 var)."""
    d, c, f = 4, 3, 6
    tm, model = _model("sngp", d, c, features=f, ridge=2.0)
    _randomise(model.head, 7)
    x, y = _batch(3, d, seed=8), torch.tensor([1, 1, 0])
    loss = tm.loss(None, model(x), y).item()
    e = _np(x)
    h = (e - e.mean(1, keepdims=True)) / np.sqrt(e.var(1, keepdims=True) + 1e-5)
    h = h * _np(model.head.norm.weight) + _np(model.head.norm.bias)
    phi = np.sqrt(2 / f) * np.cos(h @ _np(model.head.w).T + _np(model.head.b))
    mean = phi @ _np(model.head.beta.weight).T
    assert loss == pytest.approx(_ce(mean, y.numpy()), rel=RTOL)
    model.eval()
    cov = _np(model.head.covariance)  # I / ridge before the post-fit
    var = np.einsum("bi,ij,bj->b", phi, cov, phi)
    np.testing.assert_allclose(_np(model(x)["logits"]),
                               mean / np.sqrt(1 + np.pi / 8 * var)[:, None], rtol=RTOL)


def test_ensemble_loss_by_hand():
    """Ensemble: CE of log mean_k softmax(W_k e + b_k) over the k heads (B.10)."""
    d, c, k = 3, 4, 3
    tm, model = _model("ensemble", d, c, heads=k)
    x, y = _batch(2, d, seed=9), torch.tensor([3, 1])
    loss = tm.loss(None, model(x), y).item()
    e = _np(x)
    z = np.stack([e @ _np(h.weight).T + _np(h.bias) for h in model.head.heads])
    logp = special.logsumexp(_log_softmax(z), axis=0) - np.log(k)
    assert loss == pytest.approx(_ce(logp, y.numpy()), rel=RTOL)
    # not the mean of the members' losses (a different, common formulation)
    assert abs(loss - np.mean([_ce(zk, y.numpy()) for zk in z])) > 1e-3


def test_losspred_target_is_detached():
    """Losspred's eq. (8): lambda (u - CE)^2 trains u towards the CE, never the CE towards u.
    The gradient that reaches the classifier is exactly CE's, and the backbone's is CE's plus
    that of lambda (u - c)^2 with c the CE's value held constant. Without ``.detach()`` on the
    target, both gain the term -2 lambda (u - CE) dCE, which is non-zero here (u != CE)."""
    torch.manual_seed(0)
    tm = TRAINING_METHODS.lookup("losspred")
    hp = tm.hparams_from(lam=0.7)
    model = build_model("losspred", torch.nn.Linear(3, 5), 4, hp, embed_dim=5).double()
    model.train()
    x, y = _batch(3, 3, seed=2), torch.tensor([0, 3, 1])
    params = {"backbone": model.backbone.weight, "classifier": model.head.fc.weight}

    def grads(loss):
        model.zero_grad()
        loss.backward()
        return {k: torch.zeros_like(p) if p.grad is None else p.grad.clone()
                for k, p in params.items()}

    class _S:  # the loss reads only state.hp
        pass

    state = _S()
    state.hp = hp
    got = grads(tm.loss(state, model(x), y))
    out = model(x)
    ce = torch.nn.functional.cross_entropy(out["logits"], y, reduction="none")
    assert (out["scalar"] - ce).abs().min().item() > 0.1  # the term a mutation adds is not 0
    want_ce = grads(ce.mean())
    torch.testing.assert_close(got["classifier"], want_ce["classifier"], rtol=1e-12, atol=1e-14)
    out = model(x)
    target = torch.nn.functional.cross_entropy(out["logits"], y, reduction="none").detach()
    want_u = grads(0.7 * ((out["scalar"] - target) ** 2).mean())
    torch.testing.assert_close(got["backbone"], want_ce["backbone"] + want_u["backbone"],
                               rtol=1e-12, atol=1e-14)


def test_infonce_u_is_the_inverse_embedding_norm():
    """InfoNCE's u is 1/||e|| of the unnormalised embedding (the official code's
    ``UncertaintyViaNorm``; docs/conventions.md#v-4): a longer embedding is more certain."""
    tm = TRAINING_METHODS.lookup("infonce")
    assert tm.hparams().u == "inverse_norm"
    model = build_model("infonce", _Flat(3), 2, tm.hparams()).double()
    e = torch.tensor([[3.0, 4.0, 0.0], [0.3, 0.4, 0.0]], dtype=torch.float64)
    _, u, emb = model.predict(e)
    torch.testing.assert_close(emb, e)
    assert u.tolist() == pytest.approx([0.2, 2.0], rel=1e-15)
