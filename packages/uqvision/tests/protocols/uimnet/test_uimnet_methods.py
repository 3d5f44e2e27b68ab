"""The UIMNET algorithms (V.3): each loss equals its definition on a hand-made batch."""

import dataclasses
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from uqvision.methods import TRAINING_METHODS
from uqvision.models.spectral import spectral_normalize
from uqvision.protocols.uimnet.methods import (
    SEARCH_SPACES,
    UIMNET_ALGORITHMS,
    FeatureClassifier,
    MixupNet,
    mimo_batch,
    oc_penalty,
    small_cnn,
    soft_targets,
    student_width,
)

C = 3


def linear_base(d_in=6, d=4):
    torch.manual_seed(0)
    return FeatureClassifier(nn.Sequential(nn.Flatten(), nn.Linear(d_in, d), nn.ReLU()), d, C)


def batch(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g), torch.arange(n) % C


def started(name, base=None, **hp):
    method = TRAINING_METHODS.lookup(name)
    state = method.start(base if base is not None else linear_base(),
                         method.hparams_from(**hp), n_train=8, steps_per_epoch=1)
    return method, state


def test_the_ten_algorithms_are_registered_with_search_spaces():
    assert set(UIMNET_ALGORITHMS) <= set(TRAINING_METHODS.names())
    rng = np.random.default_rng(0)
    for name in UIMNET_ALGORITHMS:
        method = TRAINING_METHODS.lookup(name)
        hp = method.hparams_from(SEARCH_SPACES.lookup(name)(rng))
        json.dumps(dataclasses.asdict(hp))
        with pytest.raises(dataclasses.FrozenInstanceError):
            hp.lr_init = 1.0


def test_mixup_loss_is_cross_entropy_to_the_mixed_targets():
    method, state = started("mixup")
    x, y = batch()
    torch.manual_seed(3)
    out = state.model(x)  # training mode: mixes
    perm, lam = state.net.mixed
    assert 0 < lam < 1 and sorted(perm.tolist()) == list(range(8))
    torch.testing.assert_close(out, state.net.base(lam * x + (1 - lam) * x[perm]))
    target = lam * F.one_hot(y, C) + (1 - lam) * F.one_hot(y[perm], C)
    expected = -(target * F.log_softmax(out, -1)).sum(-1).mean()
    torch.testing.assert_close(method.loss(state, out, y), expected)


def test_mixup_native_is_the_mixup_criterion():
    torch.manual_seed(0)
    net = MixupNet(linear_base(), alpha=0.5, native_refs=2).eval()
    x, y = batch(4)
    net.ref_x, net.ref_y = x[:2].clone(), y[:2].clone()
    lams = np.random.default_rng(0).beta(0.5, 0.5, 2)
    f = lambda v: torch.softmax(net.base(v), -1)
    expected = sum(((lam * f(x) + (1 - lam) * F.one_hot(y[k], C) - f(lam * x + (1 - lam) * x[k]))
                    ** 2).sum(-1) for k, lam in enumerate(lams)) / 2
    torch.testing.assert_close(net.native(x), expected.float())


def test_soft_labeler_targets_loss_and_overshoot():
    t = soft_targets(torch.tensor([1, 0]), 4, 0.2)
    torch.testing.assert_close(t, torch.tensor([[0.05, 0.85, 0.05, 0.05],
                                                [0.85, 0.05, 0.05, 0.05]]))
    method, state = started("soft_labeler", smoothing=0.3)
    x, y = batch()
    out = state.model(x)
    t = soft_targets(y, C, 0.3)
    torch.testing.assert_close(method.loss(state, out, y),
                               -(t * F.log_softmax(out, -1)).sum(-1).mean())
    state.net.eval()
    s1 = torch.softmax(state.net(x), -1).max(-1).values
    torch.testing.assert_close(state.net.native(x), (s1 - (1 - 0.3 + 0.3 / C)) ** 2)


def test_rbf_transforms_the_logits():
    _, state = started("rbf")
    x, _ = batch()
    torch.testing.assert_close(state.model(x), torch.exp(-state.net.base(x) ** 2))


def test_mimo_multi_input_batch_loss_and_prediction():
    x = torch.randn(5, 3, 8, 8)
    perms = torch.stack([torch.tensor([4, 3, 2, 1, 0]), torch.tensor([1, 2, 3, 4, 0])])
    stacked = mimo_batch(x, perms)
    assert stacked.shape == (5, 6, 8, 8)
    torch.testing.assert_close(stacked[:, 3:], x[perms[1]])
    method, state = started("mimo", base=small_cnn(C, width=4), members=2)
    net = state.net
    y = torch.tensor([0, 1, 2, 0, 1])
    torch.manual_seed(0)
    out = state.model(x)
    assert out.shape == (5, 2, C)
    torch.testing.assert_close(out, net.member_logits(mimo_batch(x, net.perms)))
    expected = sum(F.cross_entropy(out[:, m], y[p]) for m, p in enumerate(net.perms))
    torch.testing.assert_close(method.loss(state, out, y), expected)
    net.eval()
    z = net.member_logits(x.repeat(1, 2, 1, 1))
    torch.testing.assert_close(net(x), torch.log(torch.softmax(z, -1).mean(1)))


def test_oc_penalty_is_summed_over_layers_and_in_the_loss():
    student = nn.Sequential(nn.Linear(4, 2), nn.ReLU(), nn.Linear(2, 2))
    with torch.no_grad():
        student[0].weight.copy_(torch.tensor([[1.0, 0, 0, 0], [0, 2.0, 0, 0]]))
        student[2].weight.copy_(torch.tensor([[1.0, 1.0], [0.0, 1.0]]))
    # ||diag(1, 4) - I||^2 = 9 ; [[2,1],[1,1]] - I -> 1 + 1 + 1 = 3
    assert oc_penalty(student).item() == pytest.approx(12.0)
    method, state = started("oc", layers=2, width=2, aux_weight=0.5, ortho=0.25)
    x, y = batch()
    out = state.model(x)
    net = state.net
    phi = F.batch_norm(net.base.features(x).detach(), None, None, training=True)
    certificates = (net.student(phi) ** 2).mean(-1).mean()
    expected = F.cross_entropy(out, y) + 0.5 * certificates + 0.25 * oc_penalty(net.student)
    torch.testing.assert_close(method.loss(state, out, y), expected)


@pytest.mark.parametrize("kind,width", [("rnd", 5), ("deep_ae", 3)])
def test_student_losses_and_native_disagreement(kind, width):
    method, state = started(kind, width=width, aux_weight=2.0)
    x, y = batch()
    out = state.model(x)
    net = state.net
    phi = F.batch_norm(net.base.features(x).detach(), None, None, training=True)
    target = net.teacher(phi) if kind == "rnd" else phi
    gap = ((net.student(phi) - target) ** 2).mean(-1)
    torch.testing.assert_close(method.loss(state, out, y),
                               F.cross_entropy(out, y) + 2.0 * gap.mean())
    if kind == "rnd":  # the teacher is fixed
        before = [p.clone() for p in net.teacher.parameters()]
        method.step(state, x, y)
        assert all(torch.equal(a, b) for a, b in zip(before, net.teacher.parameters()))
        assert not any(p.requires_grad for p in net.teacher.parameters())


@pytest.mark.parametrize("d", [4, 16, 32])
def test_student_widths_fit_the_feature_size(d):
    """DeepAE's bottleneck is narrower than d; OC has at most d certificates in R^d; the
    default and every search-space draw derive the width from d."""
    base = FeatureClassifier(nn.Sequential(nn.Flatten(), nn.Linear(6, d), nn.ReLU()), d, C)
    for kind in ("deep_ae", "oc"):
        method, state = started(kind, base=base)
        layers = [m for m in state.net.student.modules() if isinstance(m, nn.Linear)]
        if kind == "deep_ae":
            assert layers[0].out_features == d // 2 < d and layers[-1].out_features == d
        else:
            assert layers[-1].out_features == d // 2 <= d
        rng = np.random.default_rng(0)
        for _ in range(20):
            hp = method.hparams_from(SEARCH_SPACES.lookup(kind)(rng))
            assert 1 <= student_width(kind, d, hp) < d
    with pytest.raises(ValueError, match="deep_ae: option 'width' = 4 is no bottleneck"):
        started("deep_ae", base=linear_base(d=4), width=4)
    with pytest.raises(ValueError, match="oc: option 'width' = 5 orthonormal certificates"):
        started("oc", base=linear_base(d=4), width=5)
    started("oc", base=linear_base(d=4), width=4)  # d certificates in R^d: an orthonormal basis
    started("rnd", base=linear_base(d=4), width=64)  # RND's width is free
    with pytest.raises(ValueError, match="width_ratio must lie in"):
        started("oc", width_ratio=1.0)


def test_spectral_normalisation_bounds_the_featurizer():
    torch.manual_seed(0)
    base = FeatureClassifier(nn.Sequential(nn.Linear(6, 6), nn.ReLU()), 6, C)
    with torch.no_grad():
        base.backbone[0].weight.mul_(20)
    spectral_normalize(base, coeff=2.0)
    base.train()
    for _ in range(50):  # power iterations
        base(torch.randn(4, 6))
    sigma = torch.linalg.matrix_norm(base.backbone[0].weight, ord=2)
    assert sigma.item() == pytest.approx(2.0, rel=1e-3)
    small = FeatureClassifier(nn.Sequential(nn.Linear(6, 6)), 6, C)
    with torch.no_grad():
        small.backbone[0].weight.mul_(0.01)
    raw = small.backbone[0].weight.clone()
    spectral_normalize(small, coeff=2.0)
    torch.testing.assert_close(small.backbone[0].weight, raw)  # one-sided: unchanged below


def test_spectral_normalisation_bounds_batchnorm_lipschitz_constants_and_skips_the_head():
    import timm

    net = timm.create_model("uqvision_cnn", num_classes=3, width=4)
    bn = net.stages[1]
    with torch.no_grad():
        bn.running_var.fill_(1e-3)  # |γ| / sqrt(σ² + ε) ≈ 31.5 > 5
        net.stages[4].running_var.fill_(4.0)  # 0.5 < 5: left as it is
    spectral_normalize(net, coeff=5.0)
    lip = (bn.weight.abs() / (bn.running_var + bn.eps).sqrt()).max()
    assert lip.item() == pytest.approx(5.0, rel=1e-6)
    torch.testing.assert_close(net.stages[4].weight, torch.ones(4))
    assert not parametrize.is_parametrized(net.fc, "weight")
    assert parametrize.is_parametrized(net.stages[0], "weight")
    x = torch.randn(2, 3, 16, 16)
    net.eval()
    scaled = net.stages[:3](x)  # conv -> BN -> ReLU: BN output bounded by the new γ
    ref = torch.relu(torch.nn.functional.batch_norm(
        net.stages[0](x), bn.running_mean, bn.running_var,
        torch.full((4,), 5.0 * (1e-3 + bn.eps) ** 0.5), bn.bias, False, 0.0, bn.eps))
    torch.testing.assert_close(scaled, ref)


def test_due_prediction_is_the_softmax_expectation_and_independent_of_batching():
    """Eval: E[softmax(f)] over f ~ N(μ, σ²) per class by common random numbers — one image
    alone, in any batch and after any use of the global RNG gives the same values, and they
    agree with gpytorch's own (random) Monte-Carlo estimate within its standard error."""
    import warnings

    with warnings.catch_warnings():  # gpytorch's import uses the deprecated torch.jit.script
        warnings.simplefilter("ignore", FutureWarning)
        import gpytorch

    torch.manual_seed(0)
    _, state = started("due", inducing=4, likelihood_samples=4000)
    for _ in range(3):
        state.method.step(state, torch.randn(8, 6), torch.randint(0, C, (8,)))
    net = state.net.eval()
    x = torch.randn(9, 6)
    with torch.no_grad():
        full = net(x)
        torch.manual_seed(123)
        alone = torch.cat([net(x[i:i + 1]) for i in range(9)])
        torch.testing.assert_close(alone, full, rtol=1e-5, atol=1e-6)
        phi = net.features(x)
        torch.manual_seed(1)
        with gpytorch.settings.num_likelihood_samples(4000):
            ref = net.likelihood(net.gp(phi)).probs  # (S, n, C)
    p, se = ref.mean(0), ref.std(0) / 4000 ** 0.5
    assert ((full.exp() - p).abs() <= 4 * (2 * se ** 2) ** 0.5 + 1e-6).all()


@pytest.mark.parametrize("name", UIMNET_ALGORITHMS)
def test_every_algorithm_trains_with_the_hooks_and_predicts(name):
    torch.manual_seed(0)
    method = TRAINING_METHODS.lookup(name)
    hp = method.hparams_from(epochs=2, batch_size=8)
    x = torch.randn(16, 3, 8, 8)
    y = torch.arange(16) % C
    state = method.start(small_cnn(C, width=4), hp, n_train=16, steps_per_epoch=2, seed=0)
    while not state.done:
        for i in (0, 8):
            loss = method.step(state, x[i:i + 8], y[i:i + 8])
        method.end_epoch(state)
    assert torch.isfinite(loss)
    method.finish(state, [(x[:8], y[:8])], None)
    net = next(iter(method.samples(state, 1, 0))) if not method.stochastic_passes else state.net
    with torch.no_grad():
        z = net(x)
        assert z.shape == (16, C) and torch.isfinite(z).all()
        assert net.features(x).shape == (16, 16)
        if hasattr(net, "native") and name not in ("erm", "mimo", "rbf", "mc_dropout"):
            u = net.native(x)
            assert u.shape == (16,) and torch.isfinite(u).all() and (u >= 0).all()


def test_due_loss_is_the_negative_elbo_and_predictions_are_distributions():
    """−ELBO by hand: KL of the whitened q(u) = N(m, LLᵀ) from N(0, I), per class (closed
    form), over the training-set size, minus the batch mean of E_q[log softmax(f_i)[y_i]] with
    f_i ~ N(μ_i, diag σ²_i), the GP's marginal at image i (a Monte-Carlo mean of many draws).
    The loss's own likelihood term is a Monte-Carlo estimate too (gpytorch's SoftmaxLikelihood
    draws joint samples of the batch); the tolerance is 5 standard errors of the two estimates,
    the loss's bounded by the fully correlated case (mean over images of each image's sd)."""
    import gpytorch

    method = TRAINING_METHODS.lookup("due")
    torch.manual_seed(0)
    n_train = 16
    state = method.start(small_cnn(C, width=4), method.hparams_from(inducing=4),
                         n_train=n_train, steps_per_epoch=1)
    net = state.net
    x, y = torch.randn(8, 3, 8, 8), torch.arange(8) % C
    state.model(x)  # the first call initialises q(u) (to the prior) and the inducing points
    q = net.gp.variational_strategy.base_variational_strategy._variational_distribution
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a q(u) away from the prior, so that the KL term counts
        q.variational_mean.copy_(torch.randn(q.variational_mean.shape, generator=g))
        lower = 0.3 * torch.randn(q.chol_variational_covar.shape, generator=g).tril(-1)
        diag = 0.5 + torch.rand(q.chol_variational_covar.shape[:-1], generator=g)
        q.chol_variational_covar.copy_(lower + torch.diag_embed(diag))
    out = state.model(x)
    draws = 20_000
    with gpytorch.settings.num_likelihood_samples(draws):
        loss = float(method.loss(state, out, y).detach())

    m = q.variational_mean.detach().double()
    chol = q.chol_variational_covar.detach().double().tril()
    M = m.shape[-1]
    kl = 0.5 * float(((chol ** 2).sum((-2, -1)) + (m ** 2).sum(-1) - M
                      - 2 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)).sum())
    assert kl > 1.0  # the KL term is far larger than the tolerance below
    mu, sd = out.mean.detach().double(), out.variance.detach().double().sqrt()
    assert mu.shape == sd.shape == (8, C)
    eps = torch.randn(200_000, 8, C, generator=g, dtype=torch.float64)
    logp = torch.log_softmax(mu + sd * eps, -1)[:, torch.arange(8), y]  # (draws, images)
    per_draw = logp.mean(1)
    expected_loglik = float(per_draw.mean())
    se_hand = float(per_draw.std()) / len(per_draw) ** 0.5
    se_loss = float(logp.std(0).mean()) / draws ** 0.5
    hand = -(expected_loglik - kl / n_train)
    assert abs(loss - hand) <= 5 * (se_hand ** 2 + se_loss ** 2) ** 0.5, (loss, hand)
    # a KL weighted by the batch size instead of the training-set size is far outside it
    assert abs(loss - (hand + kl / n_train - kl / 8)) > 10 * (se_hand ** 2 + se_loss ** 2) ** 0.5
    net.eval()
    with torch.no_grad():
        torch.testing.assert_close(torch.logsumexp(net(x), -1), torch.zeros(8), atol=1e-5,
                                   rtol=0)
        torch.testing.assert_close(net.native(x), net.gp(net.features(x)).variance.sum(-1))
    # DUE always normalises its featurizer
    assert any(hasattr(m, "parametrizations") for m in net.base.backbone.modules())
