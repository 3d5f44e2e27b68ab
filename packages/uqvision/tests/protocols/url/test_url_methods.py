"""URL losses against their definitions (appendix B), the vMF maths, the recipe pieces."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, special

from uqvision.methods import TRAINING_METHODS
from uqvision.protocols.url.methods import (
    REPRESENTATION_METHODS,
    Accumulating,
    build_model,
    hib_loss,
    hib_match_probability,
    infonce_loss,
)
from uqvision.protocols.url.vmf import elk_sim, log_iv, sample_vmf, vmf_log_normalizer


def _vmf_logpdf(x, mu, kappa):
    """The vMF log-density on S^(m-1) in closed form, the reference of our normaliser (scipy's
    own vonmises_fisher came with scipy 1.11; uqvision supports 1.10): log C_m(kappa) + kappa
    mu^T x, C_m = kappa^(m/2-1) / ((2 pi)^(m/2) I_(m/2-1)(kappa)), log I from scipy's scaled
    ive (log I_v(k) = log ive_v(k) + k)."""
    m = len(mu)
    log_i = np.log(special.ive(m / 2 - 1, kappa)) + kappa
    return (m / 2 - 1) * np.log(kappa) - m / 2 * np.log(2 * np.pi) - log_i + kappa * x @ mu


def _vmf_rejection(mu, kappa, n, rng):
    """``n`` draws of vMF(mu, kappa) by rejection from the uniform law on the sphere (accept x
    with probability exp(kappa (mu^T x - 1))): a sampler independent of ours."""
    out = []
    while sum(len(o) for o in out) < n:
        x = rng.normal(size=(20 * n, len(mu)))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        out.append(x[rng.uniform(size=len(x)) < np.exp(kappa * (x @ mu - 1))])
    return np.concatenate(out)[:n]


def test_infonce_equals_direct_formula():
    g = torch.Generator().manual_seed(0)
    e1, e2, t = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g), 7.0
    n1, n2 = (e / e.norm(dim=1, keepdim=True) for e in (e1, e2))
    total = 0.0
    for i in range(5):
        negs = [n1[j] for j in range(5) if j != i] + [n2[j] for j in range(5) if j != i]
        lse = lambda a, negs=negs: math.log(sum(math.exp(t * float(a @ n)) for n in negs))
        total += -t * float(n1[i] @ n2[i]) + lse(n1[i]) + lse(n2[i])
    assert float(infonce_loss(e1, e2, t)) == pytest.approx(total / 5, rel=1e-5)


@pytest.mark.parametrize("m", [3, 10, 64])
@pytest.mark.parametrize("kappa", [0.5, 5.0, 80.0])
def test_vmf_normaliser_matches_scipy(m, kappa):
    mu = np.zeros(m)
    mu[0] = 1
    x = np.random.default_rng(0).normal(size=(3, m))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ours = vmf_log_normalizer(np.array(kappa), m) + kappa * x @ mu
    ref = _vmf_logpdf(x, mu, kappa)
    np.testing.assert_allclose(ours, ref, rtol=1e-8, atol=1e-8)
    torch_val = vmf_log_normalizer(torch.tensor([kappa], dtype=torch.float64), m)
    assert float(torch_val) == pytest.approx(float(vmf_log_normalizer(np.array(kappa), m)))


def test_log_iv_large_order_and_gradient():
    # Debye branch where ive underflows: compare with mpmath-free series limit at small x
    v, x = 300.0, np.array(1.0)
    series = v * np.log(x / 2) - special.gammaln(v + 1)  # leading term, rel. error ~ x^2/4v
    assert float(log_iv(v, x)) == pytest.approx(float(series), rel=1e-3)
    k = torch.tensor([3.0], dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda z: log_iv(4.5, z), (k,))


@pytest.mark.parametrize("m", [2, 3])
def test_elk_kernel_matches_numerical_integration(m):
    mu1, mu2 = np.array([1.0, 0.0, 0.0][:m]), np.array([0.6, 0.8, 0.0][:m])
    k1, k2 = 2.0, 3.5
    c1, c2 = (np.exp(vmf_log_normalizer(np.array(k), m)) for k in (k1, k2))

    def dens(z):
        return c1 * np.exp(k1 * z @ mu1) * c2 * np.exp(k2 * z @ mu2)

    if m == 2:
        ref, _ = integrate.quad(lambda a: dens(np.array([np.cos(a), np.sin(a)])), 0, 2 * np.pi)
    else:
        ref, _ = integrate.dblquad(
            lambda p, th: dens(np.array([np.sin(th) * np.cos(p), np.sin(th) * np.sin(p),
                                         np.cos(th)])) * np.sin(th), 0, np.pi, 0, 2 * np.pi)
    t = lambda a: torch.tensor(a, dtype=torch.float64)
    ours = elk_sim(t(mu1)[None], t([k1]), t(mu2)[None], t([k2]))
    assert float(ours) == pytest.approx(np.log(ref), abs=1e-6)


def test_vmf_sampler_mean_resultant():
    # E[mu^T s] = A_m(kappa) = I_{m/2}(kappa) / I_{m/2-1}(kappa); k standard errors
    m, kappa, n = 8, 6.0, 20000
    mu = torch.nn.functional.normalize(torch.ones(1, m, dtype=torch.float64), dim=1)
    s = sample_vmf(mu, torch.tensor([kappa], dtype=torch.float64), n,
                   torch.Generator().manual_seed(1))[:, 0]
    w = (s @ mu[0]).numpy()
    assert np.allclose(np.linalg.norm(s.numpy(), axis=1), 1)
    a = special.iv(m / 2, kappa) / special.iv(m / 2 - 1, kappa)
    assert abs(w.mean() - a) < 4 * w.std(ddof=1) / np.sqrt(n)


def test_hib_match_probability_by_monte_carlo():
    t, b, n = 8.0, -2.0, 4000
    mus = np.array([[1.0, 0, 0], [0.8, 0.6, 0]])
    kappas = np.array([4.0, 10.0])
    s = sample_vmf(torch.tensor(mus), torch.tensor(kappas), n, torch.Generator().manual_seed(2))
    ours = float(hib_match_probability(s, t, b)[0, 1])
    rng = np.random.default_rng(3)
    x = _vmf_rejection(mus[0], kappas[0], n, rng)
    y = _vmf_rejection(mus[1], kappas[1], n, rng)
    ref = special.expit(t * (x * y).sum(1) + b)
    ours_se = float(torch.sigmoid(t * (s[:, 0] * s[:, 1]).sum(-1) + b).std()) / np.sqrt(n)
    se = np.hypot(ref.std(ddof=1) / np.sqrt(n), ours_se)
    assert abs(ours - ref.mean()) < 4 * se


def test_hib_loss_definition():
    p = torch.tensor([[0.9, 0.2, 0.7], [0.2, 0.9, 0.4], [0.7, 0.4, 0.9]])
    y = torch.tensor([0, 1, 0])
    same = -np.log(0.7)  # pairs (0,2), (2,0)
    diff = np.mean(np.log([0.2, 0.2, 0.4, 0.4]))
    assert float(hib_loss(p, y)) == pytest.approx(same + diff, rel=1e-6)


def test_losspred_loss_definition():
    tm = TRAINING_METHODS.lookup("losspred")
    hp = tm.hparams_from(lam=0.3)
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    out = {"logits": logits, "scalar": torch.tensor([0.1, 0.5])}
    y = torch.tensor([0, 0])
    ce = torch.nn.functional.cross_entropy(logits, y, reduction="none")
    want = ce.mean() + 0.3 * ((out["scalar"] - ce) ** 2).mean()

    class S:
        pass

    state = S()
    state.hp = hp
    assert float(tm.loss(state, out, y)) == pytest.approx(float(want))


def test_accumulating_equals_one_step_on_the_mean_gradient():
    torch.manual_seed(0)
    x, y = torch.randn(8, 3), torch.randn(8)
    w1 = torch.zeros(3, requires_grad=True)
    w2 = torch.zeros(3, requires_grad=True)
    opt = Accumulating(torch.optim.SGD([w1], lr=0.1), 2)
    for part in (slice(0, 4), slice(4, 8)):
        opt.zero_grad()
        ((x[part] @ w1 - y[part]) ** 2).mean().backward()
        opt.step()
    ref = torch.optim.SGD([w2], lr=0.1)
    ((x @ w2 - y) ** 2).mean().backward()
    ref.step()
    assert torch.allclose(w1, w2)


class _Tiny(torch.nn.Module):
    num_features = 6

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3, padding=1)

    def forward(self, x):
        return self.conv(x).amax((2, 3))


@pytest.mark.parametrize("name", REPRESENTATION_METHODS)
def test_every_method_trains_and_predicts(name):
    torch.manual_seed(0)
    x = torch.randn(16, 3, 8, 8)
    y = torch.arange(16) % 4
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    tm = TRAINING_METHODS.lookup(name)
    hp = tm.hparams_from(epochs=2, batch_size=8, samples=4) if "samples" in {
        f for f in tm.hparams.__dataclass_fields__} else tm.hparams_from(epochs=2, batch_size=8)
    model = build_model(name, _Tiny(), 4, hp)
    state = tm.start(model, hp, n_train=16, steps_per_epoch=len(loader), seed=0)
    while not state.done:  # the hooks as uqvision.training.method documents them
        for xb, yb in loader:
            assert torch.isfinite(tm.step(state, xb, yb))
        tm.end_epoch(state)
    tm.finish(state, loader, None)
    assert state.step == 4
    logits, u, e = model.predict(x)
    assert logits.shape == (16, 4) and u.shape == (16,) and e.shape == (16, 6)
    assert torch.isfinite(u).all() and torch.isfinite(logits).all()


@pytest.mark.parametrize("name, bad", [("hib", "samples=0"), ("infonce", "t=-1"),
                                       ("mcdropout", "dropout=1.0"), ("ce", "u=nope"),
                                       ("ensemble", "heads=0")])
def test_bad_hyper_parameters_name_the_field(name, bad):
    with pytest.raises(ValueError, match=bad.split("=")[0] if bad[0] != "u" else "nope"):
        TRAINING_METHODS.lookup(name).hparams_from([bad])


# -- the uncertainty module's start value (URL's "warm-up of kappa to 0.001") ---------------
U_START = {"mcinfonce": 0.001, "nivmf": 0.001, "elk": 0.0, "hib": 0.0, "losspred": 0.0}


def test_u_start_defaults_are_the_official_resnet_choices():
    """appendix B: "randomly initialized or warmed up to 0.001" is a hyper-parameter of the
    methods with the 3-layer MLP; the official code's ResNet-50 runs use 0.001 for MCInfoNCE
    and nivMF, 0 (random) for ELK, HIB and Losspred. The others have no such module."""
    have = {n for n in REPRESENTATION_METHODS
            if "u_start" in TRAINING_METHODS.lookup(n).hparams.__dataclass_fields__}
    assert have == set(U_START)
    assert {n: TRAINING_METHODS.lookup(n).hparams().u_start for n in have} == U_START
    with pytest.raises(ValueError, match="u_start"):
        TRAINING_METHODS.lookup("elk").hparams_from(["u_start=-1"])


@pytest.mark.parametrize("name", sorted(U_START))
def test_u_start_fixes_the_mean_uncertainty_before_the_first_step(name):
    """With u_start > 0 the first training step first rescales the MLP so that its mean
    uncertainty (1/kappa; Losspred: the predicted loss) on that batch, in eval mode, is
    u_start; no parameter moves for it, and later steps keep the scale. u_start = 0 leaves
    the random initialisation (scale 1)."""
    import copy

    torch.manual_seed(0)
    x, y = torch.randn(8, 3, 8, 8), torch.arange(8) % 4
    tm = TRAINING_METHODS.lookup(name)
    for start in (0.0, 0.001, 0.25):
        hp = tm.hparams_from(epochs=2, batch_size=8, u_start=start, **(
            {"samples": 4} if "samples" in tm.hparams.__dataclass_fields__ else {}))
        model = build_model(name, _Tiny(), 4, hp)
        state = tm.start(model, hp, n_train=16, steps_per_epoch=2, seed=0)
        before = copy.deepcopy(model)
        tm.step(state, x, y)
        mlp = model.u_module
        if start == 0:
            assert float(mlp.scale) == 1.0 and not bool(mlp.calibrated)
            continue
        assert bool(mlp.calibrated)
        assert {"head.mlp.scale", "head.mlp.calibrated"} <= set(model.state_dict())  # saved
        params = {k: v.clone() for k, v in before.state_dict().items()}
        scale = before.calibrate_u(x)
        assert float(mlp.scale) == pytest.approx(scale, rel=1e-6)
        moved = [k for k, v in before.state_dict().items()
                 if not torch.equal(v, params[k]) and not k.endswith(("scale", "calibrated"))]
        assert moved == []
        before.eval()
        with torch.no_grad():
            m = before.u_module(before.backbone(x)).squeeze(-1).double()
        u = m if name == "losspred" else 1 / m
        assert float(u.mean()) == pytest.approx(start, rel=1e-5)
        tm.step(state, x, y)
        assert float(mlp.scale) == pytest.approx(scale, rel=1e-6)  # fixed after the first
