"""Each method's training objective, evaluated by the engine on fixed weights, rates and data,
equals its paper's formula computed independently in numpy (float64), for two noise levels σ.

The formulas below are written from the papers, not from the engine's constants:

* MC dropout (Gal & Ghahramani 2016) and the ensembles (Lakshminarayanan et al. 2017): ½·mean
  squared error of the (dropped-out) network; FGSM adds the same loss at x + ε·sign(∇ₓ loss);
* concrete dropout (Gal, Hron & Kendall 2017): per training point, the Gaussian negative
  log-likelihood with the known σ, mean (y − ŷ)²/(2σ²), plus KL/N with
  KL = (l²(1 − p)/2)·‖M‖² − K·H(p), M = W/(1 − p) the weight of a layer that multiplies by the
  un-scaled keep mask, K its fan-in, H the Bernoulli entropy; the relaxed mask is
  z = sigmoid((log p − log(1 − p) + log u − log(1 − u))/t) (ε = 1e-7 inside the logs, as in the
  official code);
* variational dropout (Kingma, Salimans & Welling 2015, with the KL approximation of Molchanov,
  Ashukha & Vetrov 2017, eq. 14, log α clipped to [−8, 8] as in their code): the same Gaussian
  data term plus KL/N, −KL ≈ Σ_units 0.63576·sigmoid(1.87320 + 1.48695·log α) − ½·log(1 + 1/α)
  − 0.63576; the output is sampled by the local reparameterisation trick,
  ŷ = hw + b + sqrt((h²α)·w²)·z.

The engine trains on σ² × this per-point objective (its data term is then the ½·MSE all methods
share, docs/conventions.md#r-3), so the assertion is ``engine == σ²·paper`` for σ = 0.5 and σ = 3. A
regulariser scaled as if σ = 1, or the official code's extra factor 2, fails it.

The mean–variance versions ``cd+mv`` and ``vd+mv`` train on the Gaussian NLL with their own
variance plus KL/N, with no σ² anywhere (docs/conventions.md#r-7-mv): there the assertion is
``engine == paper`` for σ = 0.5 and σ = 3, and the fused gradients equal autograd's, so a σ²
left on the KL of either path fails it.

Tolerance: rtol 1e-10 — float64 rounding (~1e-15 per operation) plus the engine's 1e-12 under the
square root of the variational output's variance (a relative change ~1e-11 here).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from two_output_check import assert_fused_gradients_equal_autograd

from uqreg import rng
from uqreg.engine import NetworkBatch, TrainConfig, objective
from uqreg.engine.network import BatchedMLP
from uqreg.methods import METHODS, get_method

N_TRAIN = 40  # the N of KL/N: not the batch size, so a mix-up shows
HIDDEN = (6, 5)
B, N_BATCH, D = 3, 7, 2
COUNTER = 5
RTOL = 1e-10
TRAINED = [name for name, m in METHODS.items() if m.closed_form is None]
SLOPE = 0.01
# a length scale at which concrete dropout's weight term is not negligible (the default 1e-4
# makes it ~1e-9 of the objective)
CFG = {"concrete_length_scale": 0.5}


def _leaky(z):
    return np.where(z > 0, z, SLOPE * z)


def _hidden(x, ws, bs):
    """The last hidden activation and the pre-activations, numpy, one network."""
    h, pre = x, []
    for w, b in zip(ws[:-1], bs[:-1]):
        z = h @ w + b
        pre.append(z)
        h = _leaky(z)
    return h, pre


def _sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def _paper_data_term(pred, y, sigma):
    return np.mean((y - pred) ** 2) / (2 * sigma**2)


def _paper_forward(head: str, params: dict, xx, noise, cfg: TrainConfig):
    """ONE network's (mean) output at ``xx`` and its KL, from the papers (the module docstring)."""
    ws, bs = params["w"], params["b"]
    w, b = ws[-1][:, 0], bs[-1][0]
    h, _ = _hidden(xx, ws, bs)
    if head == "deterministic":
        return h @ w + b, 0.0
    if head == "bernoulli":
        p = cfg.dropout
        return (h * (noise >= p) / (1 - p)) @ w + b, 0.0
    if head == "concrete":
        p, eps, t = _sigmoid(params["p_logit"]), 1e-7, cfg.concrete_temperature
        z = _sigmoid((np.log(p + eps) - np.log(1 - p + eps) + np.log(noise + eps) - np.log(1 - noise + eps)) / t)
        m = w / (1 - p)
        entropy = -(p * np.log(p) + (1 - p) * np.log(1 - p))
        kl = cfg.concrete_length_scale**2 * (1 - p) / 2 * np.sum(m**2) - len(w) * entropy
        return (h * (1 - z) / (1 - p)) @ w + b, kl
    if head == "variational":
        alpha = np.exp(np.clip(params["log_alpha"], -8.0, 8.0))
        la = np.log(alpha)
        neg_kl = 0.63576 * _sigmoid(1.87320 + 1.48695 * la) - 0.5 * np.log1p(1 / alpha) - 0.63576
        return h @ w + b + np.sqrt((h**2 * alpha) @ w**2) * noise, -neg_kl.sum()
    raise NotImplementedError(head)


def paper_objective(head: str, params: dict, x, y, noise, sigma: float, cfg: TrainConfig, fgsm=None) -> float:
    """σ² × the per-point objective of ONE network, from the papers (see the module docstring)."""
    ws, bs = params["w"], params["b"]
    w = ws[-1][:, 0]

    def forward(xx):
        return _paper_forward(head, params, xx, noise, cfg)

    pred, kl = forward(x)
    total = _paper_data_term(pred, y, sigma) + kl / N_TRAIN
    if fgsm is not None:  # FGSM: the same data term at x + ε·sign(∂loss/∂x), deterministic nets
        _, pre = _hidden(x, ws, bs)
        g = ((pred - y) / len(y))[:, None] * w[None, :]  # ∂(½·mean (ŷ − y)²)/∂h, (n, k)
        for wl, z in zip(ws[-2::-1], pre[::-1]):
            g = (g * np.where(z > 0, 1.0, SLOPE)) @ wl.T
        x_adv = x + fgsm * np.sign(g)
        total += _paper_data_term(forward(x_adv)[0], y, sigma)
    return sigma**2 * total


def _model(head: str, sigma: float, cfg: TrainConfig, g: np.random.Generator,
           objective_name: str = "mse") -> tuple[BatchedMLP, list[dict]]:
    """A BatchedMLP with random fixed parameters, and each network's parameters as numpy (the
    variance output's as ``wv``, ``bv`` under a mean–variance objective)."""
    nets = NetworkBatch(np.arange(B), np.zeros(B, dtype=np.int64))
    keys = rng.network_keys(3, "dropout", nets.repetition, nets.member)
    model = BatchedMLP(rng.network_keys(3, "init", nets.repetition, nets.member), keys, D, head, cfg, N_TRAIN, sigma,
                       objective_name)
    extra = [] if model.var_weight is None else [model.var_weight, model.var_bias]
    with torch.no_grad():
        for p in [*model.weights, *model.biases, *extra]:
            p.copy_(torch.as_tensor(g.normal(0, 0.7, tuple(p.shape))))
        if "p_logit" in model.head_params:  # rates 0.05, 0.2, 0.45
            model.head_params["p_logit"].copy_(torch.logit(torch.tensor([0.05, 0.2, 0.45], dtype=torch.float64))
                                               .view(B, 1, 1))
        if "log_alpha" in model.head_params:  # inside and beyond the clip range
            model.head_params["log_alpha"].copy_(torch.as_tensor(g.uniform(-11, 11, (B, 1, HIDDEN[-1]))))
    per_net = []
    for i in range(B):
        d = {"w": [w[i].detach().numpy() for w in model.weights],
             "b": [b[i, 0].detach().numpy() for b in model.biases]}
        if "p_logit" in model.head_params:
            d["p_logit"] = float(model.head_params["p_logit"][i, 0, 0].detach())
        if "log_alpha" in model.head_params:
            d["log_alpha"] = model.head_params["log_alpha"][i, 0].detach().numpy()
        if extra:
            d["wv"], d["bv"] = model.var_weight[i, :, 0].detach().numpy(), float(model.var_bias[i, 0, 0].detach())
        per_net.append(d)
    return model, per_net


@pytest.mark.parametrize("sigma", [0.5, 3.0])
@pytest.mark.parametrize("name", TRAINED)
def test_engine_objective_is_the_papers(name, sigma):
    method = METHODS[name]
    cfg = TrainConfig(hidden=HIDDEN, dtype="float64", **{**CFG, **method.overrides})
    g = np.random.default_rng(17)
    model, params = _model(method.head, sigma, cfg, g)
    x = g.uniform(-2, 2, (N_BATCH, D))
    y = g.normal(0, 1.5, (B, N_BATCH))
    fgsm = np.array([0.04, 0.1]) if method.adversarial else None
    xb = torch.as_tensor(x)[None].expand(B, -1, -1)
    with torch.enable_grad():
        engine = objective(model, xb, torch.as_tensor(y), COUNTER,
                           fgsm_step=None if fgsm is None else torch.as_tensor(fgsm)).detach().numpy()
    head = model.head
    noise = head.draw(model.dropout_keys, COUNTER, N_BATCH, HIDDEN[-1], dtype=torch.float64, device="cpu")
    for i in range(B):
        nz = None if noise is None else noise[i].numpy()
        expected = paper_objective(method.head, params[i], x, y[i], nz, sigma, cfg, fgsm)
        np.testing.assert_allclose(engine[i], expected, rtol=RTOL, err_msg=f"{name} network {i} sigma {sigma}")


def test_sigma_and_the_regularisers_matter():
    """The comparison can fail: for cd and vd the objective changes with σ (their regulariser
    is scaled by σ² against the ½·MSE data term), for bd it does not."""
    for name, depends in (("cd", True), ("vd", True), ("bd", False)):
        method = METHODS[name]
        cfg = TrainConfig(hidden=HIDDEN, dtype="float64", **CFG)
        values = []
        for sigma in (0.5, 3.0):
            g = np.random.default_rng(17)
            model, _ = _model(method.head, sigma, cfg, g)
            x = torch.as_tensor(g.uniform(-2, 2, (N_BATCH, D)))[None].expand(B, -1, -1)
            y = torch.as_tensor(g.normal(0, 1.5, (B, N_BATCH)))
            values.append(objective(model, x, y, COUNTER).detach().numpy())
        differ = not np.allclose(values[0], values[1], rtol=1e-6)
        assert differ == depends, name


# ---------------------------------------------------------------------------------------------
# the mean–variance versions of concrete and variational dropout: NLL + KL/N, no σ²


def paper_mean_variance_objective(head: str, params: dict, x, y, noise, cfg: TrainConfig) -> float:
    """The per-point objective of ONE mean–variance network (β = 0), from the papers: the mean
    Gaussian negative log-likelihood with the network's own variance,
    mean ½·log σ²(x) + (y − μ(x))²/(2σ²(x)), σ² = softplus(s) + 1e-6 (without ½·log 2π), plus
    KL/N (Kendall & Gal 2017 eq. 8 with the dropout ELBO of Gal, Hron & Kendall 2017; the
    official heteroscedastic concrete-dropout code's ``l²/N`` and ``2/N`` against twice this
    NLL). The variance output reads the activation the mean output reads (the dropped one for
    concrete dropout: one mask for both, Kendall & Gal 2017; ``h`` itself for variational
    dropout, whose noise acts on the mean output)."""
    mean, kl = _paper_forward(head, params, x, noise, cfg)
    ws, bs = params["w"], params["b"]
    h, _ = _hidden(x, ws, bs)
    if head == "concrete":
        p, eps, t = _sigmoid(params["p_logit"]), 1e-7, cfg.concrete_temperature
        z = _sigmoid((np.log(p + eps) - np.log(1 - p + eps) + np.log(noise + eps) - np.log(1 - noise + eps)) / t)
        h = h * (1 - z) / (1 - p)
    s = h @ params["wv"] + params["bv"]
    var = np.log1p(np.exp(s)) + 1e-6
    nll = np.mean(0.5 * np.log(var) + 0.5 * (y - mean) ** 2 / var)
    return nll + kl / N_TRAIN


MV_DROPOUT = {"cd+mv": "concrete", "vd+mv": "variational"}


@pytest.mark.parametrize("sigma", [0.5, 3.0])
@pytest.mark.parametrize("name", sorted(MV_DROPOUT))
def test_mean_variance_objective_is_nll_plus_kl(name, sigma):
    """``cd+mv``/``vd+mv`` train on the NLL with their own variance plus KL/N, whatever the task's
    σ: the regulariser is not scaled by σ² (before: σ²·KL/N, ×9 at σ = 3 and ×0.25 at σ = 0.5;
    the mean-only ``cd``/``vd`` keep σ²·KL/N, :func:`test_engine_objective_is_the_papers`).
    The fused path's gradients equal autograd's of this same objective (so they are the
    paper's gradients too: a σ² left in the fused regulariser alone fails here)."""
    method = get_method(name)
    head = MV_DROPOUT[name]
    assert method.head == head and method.objective == "gaussian_nll"
    cfg = TrainConfig(hidden=HIDDEN, dtype="float64", recipe="paper", nll_beta=0.0, **CFG)
    g = np.random.default_rng(23)
    model, params = _model(head, sigma, cfg, g, "gaussian_nll")
    assert model.regulariser_sigma == 1.0
    x = g.uniform(-2, 2, (N_BATCH, D))
    y = g.normal(0, 1.5, (B, N_BATCH))
    xb = torch.as_tensor(x)[None].expand(B, -1, -1)
    engine = objective(model, xb, torch.as_tensor(y), COUNTER).detach().numpy()
    noise = model.head.draw(model.dropout_keys, COUNTER, N_BATCH, HIDDEN[-1], dtype=torch.float64, device="cpu")
    for i in range(B):
        expected = paper_mean_variance_objective(head, params[i], x, y[i], noise[i].numpy(), cfg)
        np.testing.assert_allclose(engine[i], expected, rtol=RTOL, err_msg=f"{name} network {i} sigma {sigma}")
    # the regulariser is a visible part of the objective here, so a σ² on it shows
    kl_share = [abs(_paper_forward(head, params[i], x, noise[i].numpy(), cfg)[1] / N_TRAIN / engine[i])
                for i in range(B)]
    assert max(kl_share) > 1e-3, kl_share
    assert_fused_gradients_equal_autograd(model, cfg, N_TRAIN, False, name)
