"""u heads and u functions (V.4): each u against its definition."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from uqmetrics.metrics.confidence import entropy

from uqvision.methods import TRAINING_METHODS
from uqvision.protocols.url.heads import U_FUNCTIONS, U_HEADS, URLModel
from uqvision.protocols.url.methods import build_model


def test_registries_hold_the_issue_entries():
    assert {"class_entropy", "inverse_norm", "inverse_kappa", "predicted_loss", "gp_variance",
            "covariance_logdet", "jensen_shannon"} <= set(U_FUNCTIONS.names())
    with pytest.raises(ValueError, match="class_entropy"):
        URLModel(torch.nn.Identity(), torch.nn.Identity(), "no_such_u")


def test_class_entropy_matches_uqmetrics():
    z = torch.randn(6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ours = U_FUNCTIONS.lookup("class_entropy")({"logits": z}).numpy()
    np.testing.assert_allclose(ours, entropy(z.numpy(), from_logits=True), rtol=1e-10)


def test_jensen_shannon_of_samples():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(3, 5, 4))
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    want = entropy(p.mean(0)) - np.mean([entropy(q) for q in p], axis=0)
    js = U_FUNCTIONS.lookup("jensen_shannon")
    np.testing.assert_allclose(js({"member_logits": torch.tensor(z)}).numpy(), want, rtol=1e-9)
    same = torch.tensor(np.repeat(z[:1], 3, axis=0))
    np.testing.assert_allclose(js({"member_logits": same}).numpy(), 0, atol=1e-12)


def test_inverse_norm_and_kappa():
    e = torch.tensor([[3.0, 4.0], [0.0, 0.5]], dtype=torch.float64)
    assert U_FUNCTIONS.lookup("inverse_norm")({"embedding": e}).tolist() == [0.2, 2.0]
    assert U_FUNCTIONS.lookup("inverse_kappa")({"scalar": torch.tensor([4.0])}).tolist() == [0.25]


def test_hetxl_logdet_is_the_full_covariance_logdet():
    torch.manual_seed(0)
    hp = TRAINING_METHODS.lookup("hetxl").hparams_from(rank=2, samples=3)
    head = U_HEADS.lookup("hetxl")(5, 3, hp).double()
    e = torch.randn(4, 5, dtype=torch.float64)
    out = head(e)
    p = head.cov(e)
    v = p[:, :10].reshape(4, 2, 5)
    d = torch.nn.functional.softplus(p[:, 10:]) + 1e-6
    full = v.transpose(1, 2) @ v + torch.diag_embed(d)
    torch.testing.assert_close(out["logdet"], torch.logdet(full))
    assert out["member_logits"].shape == (3, 4, 3)


def test_sngp_precision_and_variance():
    torch.manual_seed(0)
    tm = TRAINING_METHODS.lookup("sngp")
    hp = tm.hparams_from(features=16, ridge=2.0)

    class Flat(torch.nn.Module):
        num_features = 3

        def forward(self, x):
            return x

    model = build_model("sngp", Flat(), 2, hp).double()
    x = torch.randn(10, 3, dtype=torch.float64)
    loader = [(x[:5], None), (x[5:], None)]
    state = tm.start(model, hp, n_train=10, steps_per_epoch=2)
    tm.finish(state, loader, None)
    phi = model.head.features(x)
    prec = 2.0 * torch.eye(16, dtype=torch.float64) + phi.T @ phi
    torch.testing.assert_close(model.head.precision, prec)
    _, u, _ = model.predict(x)
    want = ((phi @ torch.linalg.inv(prec)) * phi).sum(1)
    torch.testing.assert_close(model.head(x)["gp_var"], want)
    assert hp.u == "class_entropy" and u.shape == (10,)


def test_ensemble_heads_share_the_backbone():
    hp = TRAINING_METHODS.lookup("ensemble").hparams_from(heads=4)
    model = build_model("ensemble", torch.nn.Linear(3, 6), 5, hp, embed_dim=6)
    out = model(torch.randn(2, 3))
    assert out["member_logits"].shape == (4, 2, 5)
    assert sum(1 for m in model.modules() if isinstance(m, torch.nn.Linear)) == 5  # 1 + 4
    torch.testing.assert_close(out["logits"].exp().sum(1), torch.ones(2))


def test_u_module_scale_is_saved_and_old_checkpoints_load_with_scale_one():
    """The start value's scale is a buffer of the uncertainty MLP: it travels with the weights;
    a checkpoint from before it existed loads as scale 1, not calibrated."""
    hp = TRAINING_METHODS.lookup("losspred").hparams_from(u_start=0.5)
    model = build_model("losspred", torch.nn.Linear(3, 6), 4, hp, embed_dim=6)
    model.train()
    model(torch.randn(5, 3))  # the first training forward calibrates
    saved = model.state_dict()
    fresh = build_model("losspred", torch.nn.Linear(3, 6), 4, hp, embed_dim=6)
    fresh.load_state_dict(saved)
    assert float(fresh.u_module.scale) == float(model.u_module.scale) != 1.0
    assert bool(fresh.u_module.calibrated)
    old = {k: v for k, v in saved.items() if not k.endswith(("mlp.scale", "mlp.calibrated"))}
    fresh.load_state_dict(old)
    assert float(fresh.u_module.scale) == 1.0 and not bool(fresh.u_module.calibrated)
