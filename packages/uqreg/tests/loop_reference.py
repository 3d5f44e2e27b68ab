"""The per-network loop: the plain baseline the batched engine must reproduce exactly.

Not a test module. ``test_engine.py`` trains every registered method both ways and compares
the parameters and predictions; the benchmark in ``packages/uqreg/benchmarks`` times the
batched engine against :func:`train_ensemble_loop`.

Everything here is written for ONE network at a time, the way a reader would write it from
PROTOCOLS R.3, with ``torch.nn.Sequential`` / ``nn.Linear`` / ``nn.LeakyReLU`` and one
``torch.optim.Adam`` per network. It shares with :mod:`uqreg.engine` only the random draws
(they are *inputs*: the same Glorot-uniform initial weights, dropout uniforms, bootstrap
uniforms, MC-pass uniforms, all keyed by (seed, purpose, repetition, member) in
:mod:`uqreg.rng`) and the declarative fields of the registered :class:`uqreg.methods.Method`
(which head, sampler, FGSM or not, config overrides). The forward maths of every head, the
regularisers, the bootstrap resampling, FGSM, the loss and the optimiser groups are written
out again below, independently of the engine's ``Head`` classes.

Public API
----------
``train_loop(method, x_train, y, repetition, member, *, seed, cfg, epochs) -> LoopNet``
``predict_loop(method, net, x_test, repetition, member, *, seed, cfg) -> (mean (T,), std (T,) | None)``
``run_loop(method, instance, y, repetitions, cfg, *, epochs) -> (prediction (R, T), uncertainty (R, T))``
    the loop version of :meth:`uqreg.methods.Method.run`.
``train_ensemble_loop(x_train, y, n_members, cfg, epochs, *, seed=0) -> list[nn.Sequential]``
``predict_ensemble_loop(models, x_test) -> (mean (T,), std (T,))``
    how peer libraries train a deep ensemble (one module + one Adam per member, full batch):
    the speed baseline of the benchmark.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from uqreg import rng
from uqreg.engine import TrainConfig, xavier_uniform
from uqreg.methods import Method, get_method

# Molchanov et al. (2017), eq. 14: -KL ≈ k1·σ(k2 + k3·log α) − ½·log(1 + 1/α) − k1
_K1, _K2, _K3 = 0.63576, 1.87320, 1.48695
_CONCRETE_EPS = 1e-7


def _method(method: str | Method) -> Method:
    return method if isinstance(method, Method) else get_method(method)


def _keys(seed: int, purpose: str, repetition: int, member: int) -> torch.Tensor:
    """The (1,) key of ONE network for ``purpose``."""
    return rng.network_keys(seed, purpose, [repetition], [member])


class LoopNet(nn.Module):
    """One network d→hidden…→1 (``self.mlp``: Linear, LeakyReLU, …, Linear) and its head.

    Attributes
    ----------
    mlp : nn.Sequential
        The plain network; ``mlp[:-1]`` gives the last hidden activation.
    head : str
        ``deterministic``, ``bernoulli``, ``concrete`` or ``variational``.
    p_logit : nn.Parameter, shape (1, 1)
        Concrete dropout: logit of the learned rate (``concrete`` head only).
    log_alpha : nn.Parameter, shape (1, width)
        Variational dropout: log α per last-hidden unit (``variational`` head only).
    """

    def __init__(self, input_dim: int, head: str, cfg: TrainConfig, init_key: torch.Tensor):
        super().__init__()
        dt = cfg.torch_dtype
        widths = (input_dim, *cfg.hidden, 1)
        layers: list[nn.Module] = []
        for layer, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
            lin = nn.Linear(fan_in, fan_out, dtype=dt)
            with torch.no_grad():
                # the same Glorot-uniform draw as the engine's network (an input, not the code under test)
                lin.weight.copy_(xavier_uniform(init_key, layer, fan_in, fan_out, dt)[0].T)
                lin.bias.zero_()
            layers.append(lin)
            if layer < len(widths) - 2:
                layers.append(nn.LeakyReLU(cfg.negative_slope))
        self.mlp = nn.Sequential(*layers)
        self.head = head
        self.cfg = cfg
        if head == "concrete":
            p0 = cfg.dropout
            self.p_logit = nn.Parameter(torch.full((1, 1), math.log(p0 / (1.0 - p0)), dtype=dt))
        elif head == "variational":
            alpha0 = cfg.dropout / (1.0 - cfg.dropout)
            self.log_alpha = nn.Parameter(torch.full((1, cfg.hidden[-1]), math.log(alpha0), dtype=dt))
        elif head not in ("deterministic", "bernoulli"):
            raise NotImplementedError(f"loop_reference has no loop version of head {head!r}; add one")

    @property
    def out(self) -> nn.Linear:
        return self.mlp[-1]

    def forward(self, x: torch.Tensor, counter: int, key: torch.Tensor) -> torch.Tensor:
        """``x (n, d) -> y (n,)``; ``counter``/``key`` index the head's random draw."""
        if self.head == "deterministic":
            return self.mlp(x)[:, 0]
        h = self.mlp[:-1](x)  # (n, width)
        w, b = self.out.weight, self.out.bias  # (1, width), (1,)
        p = self.cfg.dropout
        if self.head == "bernoulli":
            u = rng.uniform(key, counter, tuple(h.shape), dtype=h.dtype)[0]
            keep = (u >= p).to(h.dtype)
            return (h * keep / (1.0 - p)) @ w[0] + b[0]
        if self.head == "concrete":
            eps, t = _CONCRETE_EPS, self.cfg.concrete_temperature
            rate = torch.sigmoid(self.p_logit[0, 0])
            u = rng.uniform(key, counter, tuple(h.shape), dtype=h.dtype)[0]
            logit_drop = (torch.log(rate + eps) - torch.log(1.0 - rate + eps)
                          + torch.log(u + eps) - torch.log(1.0 - u + eps))
            drop = torch.sigmoid(logit_drop / t)
            return (h * (1.0 - drop) / (1.0 - rate)) @ w[0] + b[0]
        # variational: output ~ N(h·w + b, Σ_j h_j² α_j w_j²) sampled with one normal per output
        alpha = torch.exp(torch.clamp(self.log_alpha[0], max=0.0))
        mean = h @ w[0] + b[0]
        var = (h * h * alpha) @ (w[0] * w[0])
        z = rng.normal(key, counter, (h.shape[0],), dtype=h.dtype)[0]
        return mean + torch.sqrt(var + 1e-12) * z

    def regulariser(self, n_train: int) -> torch.Tensor | float:
        """The head's term added to the loss (concrete and variational dropout)."""
        if self.head == "concrete":
            rate = torch.sigmoid(self.p_logit[0, 0])
            w = self.out.weight
            weight_term = self.cfg.concrete_length_scale ** 2 / n_train * (w * w).sum() / (1.0 - rate)
            entropy_term = 2.0 / n_train * w.shape[1] * (rate * torch.log(rate) + (1.0 - rate) * torch.log(1.0 - rate))
            return weight_term + entropy_term
        if self.head == "variational":
            la = torch.clamp(self.log_alpha[0], max=0.0)
            neg_kl = _K1 * torch.sigmoid(_K2 + _K3 * la) - 0.5 * torch.log(1.0 + 1.0 / torch.exp(la)) - _K1
            return -neg_kl.sum() / n_train
        return 0.0

    def engine_parameters(self) -> list[torch.Tensor]:
        """Parameters in the engine's layout and order: weights (fan_in, fan_out) of every
        layer, biases (1, fan_out) of every layer, then the head's parameters."""
        lins = [m for m in self.mlp if isinstance(m, nn.Linear)]
        out = [m.weight.detach().T for m in lins] + [m.bias.detach()[None, :] for m in lins]
        if self.head == "concrete":
            out.append(self.p_logit.detach())
        elif self.head == "variational":
            out.append(self.log_alpha.detach())
        return out


def _half_mse(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 0.5 * torch.mean((pred - y) ** 2)


def train_loop(method: str | Method, x_train: np.ndarray, y: np.ndarray, repetition: int, member: int, *,
               seed: int, cfg: TrainConfig, epochs: int) -> LoopNet:
    """Train ONE network (repetition, member) of ``method`` the plain way.

    Parameters
    ----------
    method : str or Method
        Registered method (its head, sampler, FGSM flag and config overrides are used).
    x_train : ndarray, shape (N, d)
    y : ndarray, shape (N,)
        This network's training targets (its repetition's noise draw).
    repetition, member : int
        Which network; keys every random draw.
    seed : int
        Task seed.
    cfg : TrainConfig
    epochs : int

    Returns
    -------
    LoopNet
    """
    m = _method(method)
    cfg = replace(cfg, **m.overrides)
    dt = cfg.torch_dtype
    n, d = x_train.shape
    net = LoopNet(d, m.head, cfg, _keys(seed, "init", repetition, member))
    drop_key = _keys(seed, "dropout", repetition, member)
    boot_key = _keys(seed, "bootstrap", repetition, member)
    wd = 1.0 / n if cfg.weight_decay is None else cfg.weight_decay
    lins = [mod for mod in net.mlp if isinstance(mod, nn.Linear)]
    weights = [lin.weight for lin in lins]
    others = [lin.bias for lin in lins] + [p for name, p in net.named_parameters() if not name.startswith("mlp.")]
    opt = torch.optim.Adam([{"params": weights, "weight_decay": wd}, {"params": others, "weight_decay": 0.0}],
                           lr=cfg.lr, betas=cfg.betas)
    x = torch.as_tensor(x_train, dtype=dt)
    yt = torch.as_tensor(np.asarray(y), dtype=dt)
    fgsm_step = torch.as_tensor(cfg.adversarial_epsilon * (x_train.max(axis=0) - x_train.min(axis=0)), dtype=dt)
    if m.sampler == "full":
        steps = 1
    elif m.sampler == "bootstrap":
        steps = cfg.bootstrap_batches
    else:
        raise NotImplementedError(f"loop_reference has no loop version of sampler {m.sampler!r}; add one")
    for epoch in range(epochs):
        for step in range(steps):
            if m.sampler == "full":
                xb, yb = x, yt
            else:  # N/2 indices drawn with replacement, uniform over the N training points
                u = rng.uniform(boot_key, epoch * steps + step, (max(1, n // 2),), dtype=torch.float64)[0]
                idx = torch.clamp(torch.floor(u * n).long(), max=n - 1)
                xb, yb = x[idx], yt[idx]
            counter = 2 * (epoch * steps + step)
            opt.zero_grad()
            if m.adversarial:  # FGSM (Goodfellow et al.): x + ε·sign(∇ₓ loss), loss on both
                xb = xb.clone().requires_grad_(True)
                loss = _half_mse(net(xb, counter, drop_key), yb)
                (gx,) = torch.autograd.grad(loss, xb, retain_graph=True)
                x_adv = (xb + fgsm_step * torch.sign(gx)).detach()
                loss = loss + _half_mse(net(x_adv, counter + 1, drop_key), yb)
            else:
                loss = _half_mse(net(xb, counter, drop_key), yb)
            (loss + net.regulariser(n)).backward()
            opt.step()
    return net


@torch.no_grad()
def predict_loop(method: str | Method, net: LoopNet, x_test: np.ndarray, repetition: int, member: int, *,
                 seed: int, cfg: TrainConfig) -> tuple[np.ndarray, np.ndarray | None]:
    """Predict with ONE network: output (deterministic head) or mean/std over MC passes.

    Returns
    -------
    mean : ndarray, shape (T,)
    std : ndarray, shape (T,) or None (deterministic head)
    """
    m = _method(method)
    cfg = replace(cfg, **m.overrides)
    x = torch.as_tensor(x_test, dtype=cfg.torch_dtype)
    if m.head == "deterministic":
        return net(x, 0, None).double().numpy(), None
    mc_key = _keys(seed, "mc", repetition, member)
    passes = np.stack([net(x, s, mc_key).double().numpy() for s in range(cfg.mc_samples)])  # (S, T)
    return passes.mean(axis=0), passes.std(axis=0, ddof=cfg.std_ddof)


def run_loop(method: str | Method, instance, y: np.ndarray, repetitions, cfg: TrainConfig, *,
             epochs: int) -> tuple[np.ndarray, np.ndarray]:
    """Loop version of :meth:`uqreg.methods.Method.run` (trained methods only).

    Returns
    -------
    prediction, uncertainty : ndarray, shape (R, T)
        Ensembles: mean / std (``cfg.std_ddof``) over members; dropout: over MC passes.
    """
    m = _method(method)
    mcfg = replace(cfg, **m.overrides)
    preds, uncs = [], []
    for i, r in enumerate(np.asarray(repetitions)):
        if m.ensemble:
            outs = []
            for member in range(mcfg.members):
                net = train_loop(m, instance.x_train, y[i], int(r), member, seed=instance.seed, cfg=cfg, epochs=epochs)
                outs.append(predict_loop(m, net, instance.x_test, int(r), member, seed=instance.seed, cfg=cfg)[0])
            outs = np.stack(outs)
            preds.append(outs.mean(axis=0))
            uncs.append(outs.std(axis=0, ddof=mcfg.std_ddof))
        else:
            net = train_loop(m, instance.x_train, y[i], int(r), 0, seed=instance.seed, cfg=cfg, epochs=epochs)
            mu, sd = predict_loop(m, net, instance.x_test, int(r), 0, seed=instance.seed, cfg=cfg)
            preds.append(mu)
            uncs.append(sd)
    return np.stack(preds), np.stack(uncs)


# ---------------------------------------------------------------------------------------------
# the speed baseline: a deep ensemble the way peer libraries train one


def _peer_mlp(input_dim: int, cfg: TrainConfig, generator: torch.Generator, device) -> nn.Sequential:
    widths = (input_dim, *cfg.hidden, 1)
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
        lin = nn.Linear(fan_in, fan_out, dtype=cfg.torch_dtype)
        nn.init.xavier_uniform_(lin.weight, generator=generator)
        nn.init.zeros_(lin.bias)
        layers.append(lin)
        if i < len(widths) - 2:
            layers.append(nn.LeakyReLU(cfg.negative_slope))
    return nn.Sequential(*layers).to(device)


def train_ensemble_loop(x_train: np.ndarray, y: np.ndarray, n_members: int, cfg: TrainConfig, epochs: int, *,
                        seed: int = 0) -> list[nn.Sequential]:
    """Train a deep ensemble member by member: one ``nn.Sequential`` and one ``Adam`` each.

    Full-batch half-MSE, Adam with ``cfg.lr``/``cfg.betas`` and L2 ``1/N`` (or
    ``cfg.weight_decay``) on the weights only, on ``cfg.device`` in ``cfg.dtype`` — the same
    training as the ``ens`` method, looped in Python (the benchmark's baseline).

    Parameters
    ----------
    x_train : ndarray, shape (N, d)
    y : ndarray, shape (N,)
    n_members : int
    cfg : TrainConfig
    epochs : int
    seed : int
        Seeds a ``torch.Generator`` for the members' Glorot-uniform initialisations.

    Returns
    -------
    list of nn.Sequential, length ``n_members``
    """
    dev = torch.device(cfg.device)
    dt = cfg.torch_dtype
    n, d = x_train.shape
    x = torch.as_tensor(x_train, dtype=dt, device=dev)
    yt = torch.as_tensor(np.asarray(y), dtype=dt, device=dev)
    wd = 1.0 / n if cfg.weight_decay is None else cfg.weight_decay
    gen = torch.Generator().manual_seed(seed)
    models = []
    for _ in range(n_members):
        model = _peer_mlp(d, cfg, gen, dev)
        lins = [mod for mod in model if isinstance(mod, nn.Linear)]
        opt = torch.optim.Adam([{"params": [lin.weight for lin in lins], "weight_decay": wd},
                                {"params": [lin.bias for lin in lins], "weight_decay": 0.0}],
                               lr=cfg.lr, betas=cfg.betas)
        for _epoch in range(epochs):
            opt.zero_grad()
            loss = 0.5 * torch.mean((model(x)[:, 0] - yt) ** 2)
            loss.backward()
            opt.step()
        models.append(model)
    return models


@torch.no_grad()
def predict_ensemble_loop(models: list[nn.Sequential], x_test: np.ndarray, *, ddof: int = 1
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std (``ddof``) over members at ``x_test (T, d)``; each of shape (T,)."""
    p = next(models[0].parameters())
    x = torch.as_tensor(x_test, dtype=p.dtype, device=p.device)
    outs = np.stack([m(x)[:, 0].double().cpu().numpy() for m in models])
    return outs.mean(axis=0), outs.std(axis=0, ddof=ddof)
