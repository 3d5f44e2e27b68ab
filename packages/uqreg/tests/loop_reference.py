"""The per-network loop: the plain baseline the batched engine must reproduce exactly.

Not a test module. ``test_engine.py`` trains every registered method both ways and compares
the parameters and predictions; the benchmark in ``packages/uqreg/benchmarks`` times the
batched engine against :func:`train_ensemble_loop`.

Everything here is written for ONE network at a time, the way a reader would write it from
docs/conventions.md#r-3 and docs/conventions.md#r-3b, with ``torch.nn.Sequential`` /
``nn.Linear`` / ``nn.LeakyReLU`` and one ``torch.optim.Adam`` per network. What it shares with
:mod:`uqreg.engine`:

* the random draws (inputs, not code under test: the same Glorot-uniform initial weights,
  dropout uniforms, bootstrap uniforms, MC-pass draws, all keyed by (seed, purpose, repetition,
  member) in :mod:`uqreg.rng`), and the initial values of a head's parameters;
* each head's pure per-network forward formula (:mod:`uqreg.engine.heads`), called on ONE
  network, so that a new head is added in one place. The formulas themselves are checked
  against the papers, independently in numpy, by ``test_objective.py``;
* the declarative fields of the registered :class:`uqreg.methods.Method`.

Written out again below, independently of the engine: the hidden layers and the optimiser
(one ``nn.Linear`` stack and one Adam per network), the regularisers of concrete and variational
dropout derived from their papers' objectives (not from the engine's constants), the recipes'
L2 conventions from the R.3b table, the bootstrap resampling, FGSM and the loss.

Public API
----------
``train_loop(method, x_train, y, repetition, member, *, seed, sigma, cfg, epochs) -> LoopNet``
``predict_loop(method, net, x_test, repetition, member, *, seed, cfg) -> (mean (T,), std (T,) | None)``
``run_loop(method, instance, y, repetitions, cfg, *, epochs) -> (prediction (R, T), uncertainty (R, T),
train_loss (R, M))``
    the loop version of :meth:`uqreg.methods.Method.run`, with each network's final ½·MSE of its
    (MC-mean) prediction on the training set.
``train_ensemble_loop(x_train, y, n_members, cfg, epochs, *, seed=0) -> list[nn.Sequential]``
``predict_ensemble_loop(models, x_test) -> (mean (T,), std (T,))``
    how peer libraries train a deep ensemble (one module + one Adam per member, full batch):
    the speed baseline of the benchmark.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from uqreg import rng
from uqreg.engine import HEADS, TrainConfig, xavier_uniform
from uqreg.methods import Method, get_method


def _method(method: str | Method) -> Method:
    return method if isinstance(method, Method) else get_method(method)


def _keys(seed: int, purpose: str, repetition: int, member: int) -> torch.Tensor:
    """The (1,) key of ONE network for ``purpose``."""
    return rng.network_keys(seed, purpose, [repetition], [member])


# ---------------------------------------------------------------------------------------------
# the regularisers, from the papers' objectives
#
# Both papers minimise the negative ELBO per training point with a Gaussian likelihood of known
# noise σ: mean (y − ŷ)²/(2σ²) + KL/N. Multiplied by σ² its data term is the ½·MSE every method
# trains on, so the term added to ½·MSE is σ²·KL/N.


def concrete_kl(weight: torch.Tensor, rate: torch.Tensor, length_scale: float) -> torch.Tensor:
    """Gal, Hron & Kendall (2017), Concrete Dropout, the KL of a dropped layer:
    (l²(1−p)/2)·‖M‖² − K·H(p), with M the weight of a layer that multiplies by the un-scaled
    keep mask (here M = W/(1−p): the layer scales kept units by 1/(1−p)) and K its fan-in."""
    m = weight / (1.0 - rate)
    entropy = -(rate * torch.log(rate) + (1.0 - rate) * torch.log(1.0 - rate))
    return length_scale**2 * (1.0 - rate) / 2.0 * (m * m).sum() - weight.shape[1] * entropy


def variational_kl(log_alpha: torch.Tensor) -> torch.Tensor:
    """Molchanov, Ashukha & Vetrov (2017), eq. 14, summed over units, with their clip of log α
    to [−8, 8]: −KL ≈ 0.63576·sigmoid(1.87320 + 1.48695·log α) − ½·log(1 + 1/α) − 0.63576."""
    la = torch.clamp(log_alpha, -8.0, 8.0)
    neg_kl = 0.63576 * torch.sigmoid(1.87320 + 1.48695 * la) - 0.5 * torch.log(1.0 + torch.exp(-la)) - 0.63576
    return -neg_kl.sum()


# ---------------------------------------------------------------------------------------------
# the recipes, from the R.3b table: (coupled factor added to the gradient, decoupled factor)


def recipe_l2(recipe: str, n_train: int, lam: float | None) -> tuple[float, float]:
    lam = 1.0 / n_train if lam is None else lam
    table = {"paper": (lam, 0.0), "sum": (lam / n_train, 0.0), "decoupled": (0.0, lam), "none": (0.0, 0.0)}
    if recipe not in table:
        raise NotImplementedError(f"loop_reference has no loop version of recipe {recipe!r}; add one")
    return table[recipe]


class LoopNet(nn.Module):
    """One network d→hidden…→1 (``self.mlp``: Linear, LeakyReLU, …, Linear) and its head.

    Attributes
    ----------
    mlp : nn.Sequential
        The plain network; ``mlp[:-1]`` gives the last hidden activation.
    head : uqreg.engine.Head
        The registered head (its forward formula, called on this one network).
    head_params : nn.ParameterDict
        The head's own parameters, each with a leading axis of 1.
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
        self.head = HEADS.lookup(head)
        self.head_params = nn.ParameterDict({
            k: nn.Parameter(v) for k, v in self.head.init_params(1, widths[-2], cfg, dtype=dt, device="cpu").items()
        })
        self.cfg = cfg

    @property
    def out(self) -> nn.Linear:
        return self.mlp[-1]

    def forward(self, x: torch.Tensor, counter: int, key: torch.Tensor | None) -> torch.Tensor:
        """``x (n, d) -> y (n,)``; ``counter``/``key`` index the head's random draw."""
        h = self.mlp[:-1](x)  # (n, width)
        noise = None
        if self.head.stochastic:
            noise = self.head.draw(key, counter, h.shape[0], h.shape[1], dtype=h.dtype, device=h.device)
        w, b = self.out.weight, self.out.bias  # (1, width), (1,)
        return self.head.forward(h[None], w.T[None], b.view(1, 1, 1), noise, dict(self.head_params), self.cfg)[0]

    def regulariser(self, n_train: int, sigma: float) -> torch.Tensor | float:
        """σ²·KL/N of the papers (concrete and variational dropout); other heads add their own
        term (none of the built-in ones has any)."""
        if self.head.name == "concrete":
            rate = torch.sigmoid(self.head_params["p_logit"][0, 0, 0])
            return sigma**2 * concrete_kl(self.out.weight, rate, self.cfg.concrete_length_scale) / n_train
        if self.head.name == "variational":
            return sigma**2 * variational_kl(self.head_params["log_alpha"][0, 0]) / n_train
        params = {k: v for k, v in self.head_params.items()}
        reg = self.head.regulariser(self.out.weight.T[None], params, n_train=n_train, sigma=sigma, cfg=self.cfg)
        return reg if isinstance(reg, float) else reg[0]

    def engine_parameters(self) -> list[torch.Tensor]:
        """Parameters in the engine's layout and order: weights (fan_in, fan_out) of every
        layer, biases (1, fan_out) of every layer, then the head's parameters."""
        lins = [m for m in self.mlp if isinstance(m, nn.Linear)]
        out = [m.weight.detach().T for m in lins] + [m.bias.detach()[None, :] for m in lins]
        return out + [p.detach()[0] for p in self.head_params.values()]


def _half_mse(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 0.5 * torch.mean((pred - y) ** 2)


def train_loop(method: str | Method, x_train: np.ndarray, y: np.ndarray, repetition: int, member: int, *,
               seed: int, sigma: float, cfg: TrainConfig, epochs: int) -> LoopNet:
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
    sigma : float
        The task's noise std (the variational heads' likelihood).
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
    coupled, decoupled = recipe_l2(cfg.recipe, n, cfg.weight_decay)
    lins = [mod for mod in net.mlp if isinstance(mod, nn.Linear)]
    weights = [lin.weight for lin in lins]
    others = [lin.bias for lin in lins] + list(net.head_params.values())
    opt = torch.optim.Adam([{"params": weights, "weight_decay": coupled}, {"params": others, "weight_decay": 0.0}],
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
            (loss + net.regulariser(n, sigma)).backward()
            if decoupled:  # w ← w − lr·λ·w, then the plain Adam step
                with torch.no_grad():
                    for w in weights:
                        w.mul_(1.0 - cfg.lr * decoupled)
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
    if not net.head.stochastic:
        return net(x, 0, None).double().numpy(), None
    mc_key = _keys(seed, "mc", repetition, member)
    passes = np.stack([net(x, s, mc_key).double().numpy() for s in range(cfg.mc_samples)])  # (S, T)
    return passes.mean(axis=0), passes.std(axis=0, ddof=cfg.std_ddof)


def run_loop(method: str | Method, instance, y: np.ndarray, repetitions, cfg: TrainConfig, *,
             epochs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Loop version of :meth:`uqreg.methods.Method.run` (trained methods only).

    Returns
    -------
    prediction, uncertainty : ndarray, shape (R, T)
        Ensembles: mean / std (``cfg.std_ddof``) over members; dropout: over MC passes.
    train_loss : ndarray, shape (R, M)
        Each network's ½·mean (y − ŷ)² on the training set, ŷ its (MC-mean) prediction; M = 1
        without an ensemble.
    """
    m = _method(method)
    mcfg = replace(cfg, **m.overrides)
    preds, uncs, losses = [], [], []
    for i, r in enumerate(np.asarray(repetitions)):
        outs, sds, loss = [], [], []
        for member in range(mcfg.members if m.ensemble else 1):
            net = train_loop(m, instance.x_train, y[i], int(r), member, seed=instance.seed, sigma=instance.sigma,
                             cfg=cfg, epochs=epochs)
            mu, sd = predict_loop(m, net, instance.x_test, int(r), member, seed=instance.seed, cfg=cfg)
            fit = predict_loop(m, net, instance.x_train, int(r), member, seed=instance.seed, cfg=cfg)[0]
            outs.append(mu)
            sds.append(sd)
            loss.append(0.5 * np.mean((np.asarray(y[i]) - fit) ** 2))
        losses.append(loss)
        if m.ensemble:
            preds.append(np.mean(outs, axis=0))
            uncs.append(np.std(outs, axis=0, ddof=mcfg.std_ddof))
        else:
            preds.append(outs[0])
            uncs.append(sds[0])
    return np.stack(preds), np.stack(uncs), np.array(losses)


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
