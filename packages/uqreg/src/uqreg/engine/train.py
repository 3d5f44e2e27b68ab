"""Training and prediction of one chunk of networks as one batched computation.

One Adam optimiser steps the stacked parameters (Adam is elementwise, so this is exactly one Adam
per network); each network's loss depends on its own parameters only, so the summed loss gives
every network its own gradient. Randomness is counter based (:mod:`uqreg.rng`): a network's
initialisation, dropout masks, bootstrap draws and MC passes depend on its own key only, so the
engine trains exactly the networks a per-network loop would, whatever chunk they fall in.
Shapes: ``B`` networks, ``n`` inputs per batch, ``d`` input dimension, ``S`` MC passes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .. import rng
from . import fused
from .config import TrainConfig
from .network import BatchedMLP, NetworkBatch
from .objectives import half_mse
from .samplers import SAMPLERS


def objective(model: BatchedMLP, xb: torch.Tensor, yb: torch.Tensor, counter: int, *,
              fgsm_step: torch.Tensor | None = None) -> torch.Tensor:
    """The per-network training objective, shape (B,): the model's data term on the batch
    (½·MSE, or the mean–variance networks' β-NLL: :data:`~uqreg.engine.objectives.OBJECTIVES`),
    plus the same loss on FGSM inputs ``x + ε·sign(∇ₓ loss)`` when ``fgsm_step`` ε (d,) is given
    (Lakshminarayanan et al. 2017), plus the head's regulariser. The recipe's L2 is applied by
    the optimiser."""
    if model.objective.name == "mse":  # the mean-only networks' graph, as it always was

        def data_loss(x, c):
            return half_mse(model(x, c), yb)
    else:

        def data_loss(x, c):
            return model.objective.loss(*model.forward_mv(x, c), yb, model.cfg)

    if fgsm_step is None:
        loss = data_loss(xb, counter)
    else:
        xb = xb.detach().clone().requires_grad_(True)
        loss = data_loss(xb, counter)
        (gx,) = torch.autograd.grad(loss.sum(), xb, retain_graph=True)
        x_adv = (xb + fgsm_step * gx.sign()).detach()
        loss = loss + data_loss(x_adv, counter + 1)
    return loss + model.regulariser()


_objective = objective  # train_batched's argument ``objective`` names the registered data term


def make_optimizer(model: BatchedMLP, cfg: TrainConfig, n_train: int) -> torch.optim.Optimizer:
    """Adam over the stacked parameters with the recipe's L2 on the weights only (biases and
    head parameters unregularised): coupled recipes as Adam's ``weight_decay``, a decoupled one
    as AdamW's (``w ← w − lr·λ·w`` per step)."""
    recipe = cfg.recipe_spec
    wd = recipe.weight_decay(n_train, cfg.weight_decay)
    others = model.bias_parameters() + list(model.head_params.values())
    groups = [{"params": model.weight_parameters(), "weight_decay": wd}, {"params": others, "weight_decay": 0.0}]
    adam = torch.optim.AdamW if recipe.decoupled else torch.optim.Adam
    return adam(groups, lr=cfg.lr, betas=cfg.betas, **{cfg.adam: True})


def train_batched(x_train: np.ndarray, y_train: np.ndarray, nets: NetworkBatch, *, seed: int, head: str,
                  sampler: str, adversarial: bool, cfg: TrainConfig, epochs: int, sigma: float,
                  progress: Callable[[int], None] | None = None, objective: str = "mse",
                  noise_weights: np.ndarray | None = None, alpha: float | None = None) -> BatchedMLP:
    """Train the networks ``nets`` as one batched computation.

    Parameters
    ----------
    x_train : ndarray, shape (N, d)
        Training inputs, shared by every network.
    y_train : ndarray, shape (R, N)
        Targets of every repetition; network i uses row ``nets.repetition[i]``.
    nets : NetworkBatch
        The (repetition, member) of each of the B networks.
    seed : int
        Task seed, keying every random stream.
    head, sampler : str
        Names in :data:`~uqreg.engine.heads.HEADS` and :data:`~uqreg.engine.samplers.SAMPLERS`.
    adversarial : bool
        Add the FGSM loss term (Lakshminarayanan et al. 2017).
    cfg : TrainConfig
    epochs : int
    sigma : float
        The task's noise std σ (the likelihood of the variational heads' objectives).
    progress : callable, optional
        Called with the number of finished epochs after each epoch.
    objective : str
        Name in :data:`~uqreg.engine.objectives.OBJECTIVES`: ``"mse"`` (a mean), or
        ``"gaussian_nll"`` (mean–variance networks, β = ``cfg.nll_beta``), or ``"pinball"``
        (quantile networks: outputs ``q_lo``, ``q_hi`` at the levels α/2, 1 − α/2).
    noise_weights : ndarray, shape (N,), optional
        Weights of the training points' squared errors (½·mean w·(y − ŷ)²): σ²/σ(x_n)² for the
        known-noise heads on a heteroscedastic task; None: unweighted.
    alpha : float, optional
        The quantile networks' α (objective ``"pinball"``); ignored by the other objectives.

    Returns
    -------
    BatchedMLP
        The trained networks (B of them).
    """
    dev = cfg.torch_device()
    dt = cfg.torch_dtype
    n, d = x_train.shape
    init_keys = rng.network_keys(seed, "init", nets.repetition, nets.member).to(dev)
    drop_keys = rng.network_keys(seed, "dropout", nets.repetition, nets.member).to(dev)
    boot_keys = rng.network_keys(seed, "bootstrap", nets.repetition, nets.member).to(dev)
    model = BatchedMLP(init_keys, drop_keys, d, head, cfg, n, sigma, objective, alpha)
    b = len(nets)
    x = torch.as_tensor(x_train, dtype=dt, device=dev)[None].expand(b, n, d)
    y = torch.as_tensor(y_train[nets.repetition], dtype=dt, device=dev)
    if noise_weights is not None:  # (B, N, 2): targets and row weights, drawn together by the sampler
        w = torch.as_tensor(noise_weights, dtype=dt, device=dev)[None].expand(b, n)
        y = torch.stack([y, w], dim=-1)
    fgsm_step = None
    if adversarial:
        fgsm_step = torch.as_tensor(cfg.adversarial_epsilon * np.ptp(x_train, axis=0), dtype=dt, device=dev)
    if cfg.backend in ("fused", "triton") and fused.supports(head, cfg):
        return fused.train_fused(model, x, y, keys=drop_keys, boot_keys=boot_keys, sampler=sampler,
                                 fgsm_step=fgsm_step, epochs=epochs, progress=progress)
    opt = make_optimizer(model, cfg, n)
    smp = SAMPLERS.lookup(sampler)
    steps = smp.steps(cfg)
    for epoch in range(epochs):
        for step, (xb, yb) in enumerate(smp.batches(x, y, boot_keys, epoch, cfg)):
            counter = 2 * (epoch * steps + step)
            opt.zero_grad(set_to_none=True)
            _objective(model, xb, yb, counter, fgsm_step=fgsm_step).sum().backward()
            opt.step()
        if progress is not None:
            progress(1)
    return model


@torch.no_grad()
def predict_batched(model: BatchedMLP, x_test: np.ndarray, nets: NetworkBatch, *, seed: int,
                    cfg: TrainConfig, purpose: str = "mc") -> tuple[np.ndarray, np.ndarray | None]:
    """Predict at test inputs.

    Parameters
    ----------
    x_test : ndarray, shape (T, d) or (B, T, d)
        Inputs shared by every network, or one set per network (the calibration points of the
        network's repetition).
    purpose : str
        Random stream of the MC passes (:data:`uqreg.rng.PURPOSES`): ``"mc"`` at the test inputs,
        ``"mc_calibration"`` at the calibration inputs, so the two draws are independent.

    Returns
    -------
    mean : ndarray, shape (B, T)
        Deterministic output (deterministic head) or mean over ``cfg.mc_samples`` passes.
    std : ndarray, shape (B, T) or None
        Std over MC passes for stochastic heads; None for deterministic heads.
    """
    return predict_decomposed(model, x_test, nets, seed=seed, cfg=cfg, purpose=purpose)[:2]


@torch.no_grad()
def predict_decomposed(model: BatchedMLP, x_test: np.ndarray, nets: NetworkBatch, *, seed: int,
                       cfg: TrainConfig, purpose: str = "mc") -> tuple[np.ndarray, np.ndarray | None,
                                                                       np.ndarray | None]:
    """:func:`predict_batched` plus each network's aleatoric variance.

    Returns
    -------
    mean, std : ndarray, shape (B, T)
        As :func:`predict_batched` (``std`` None for deterministic heads).
    aleatoric : ndarray, shape (B, T) or None
        The second output: a mean–variance network's predicted σ²(x), its mean over the MC
        passes for stochastic heads (Kendall & Gal 2017); a quantile network's upper quantile
        ``q_hi`` (``mean`` is then its lower quantile ``q_lo``), its mean over the passes
        likewise; None for a mean-only network.
    """
    dev = cfg.torch_device()
    xt = torch.as_tensor(x_test, dtype=cfg.torch_dtype, device=dev)
    xt = xt[None].expand(model.n_networks, -1, -1) if xt.ndim == 2 else xt
    h = model.hidden_aligned(xt)
    mv = model.objective.mean_variance

    def numpy(t):
        return t.double().cpu().numpy()

    if not model.head.stochastic:
        if not mv:
            return numpy(model.output(h)), None, None
        mean, raw = model.output_mv(h)
        return numpy(mean), None, numpy(model.objective.second_output(raw))
    mc_keys = rng.network_keys(seed, purpose, nets.repetition, nets.member).to(dev)
    if not mv:
        passes = torch.stack([model.output(h, s, mc_keys) for s in range(cfg.mc_samples)], dim=1)  # (B, S, T)
        var = None
    else:
        outs = [model.output_mv(h, s, mc_keys) for s in range(cfg.mc_samples)]
        passes = torch.stack([m for m, _ in outs], dim=1)
        second = model.objective.second_output  # variance (mean–variance), identity (quantile)
        var = numpy(torch.stack([second(r) for _, r in outs], dim=1).double().mean(dim=1))
    passes = passes.double()
    return passes.mean(dim=1).cpu().numpy(), passes.std(dim=1, correction=cfg.std_ddof).cpu().numpy(), var


__all__ = ["half_mse", "make_optimizer", "objective", "predict_batched", "predict_decomposed", "train_batched"]
