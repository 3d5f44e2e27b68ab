"""The batched training engine: many small MLPs trained as one computation.

All networks of a study cell (repetitions × members, or repetitions for dropout nets) live on a
leading *network* axis ``B``: weights ``(B, fan_in, fan_out)``, biases ``(B, 1, fan_out)``,
activations ``(B, n, width)``. A layer is one ``torch.baddbmm``; one Adam optimiser steps the
stacked parameters (Adam is elementwise, so this is exactly one Adam per network); each
network's loss depends on its own parameters only, so the summed loss gives every network its
own gradient. Randomness is counter based (:mod:`uqreg.rng`): a network's initialisation,
dropout masks, bootstrap draws and MC passes depend on its own key only, so the engine trains
exactly the networks a per-network loop would, whatever the batch or chunk they fall in.

Shapes used throughout: ``B`` networks, ``n`` inputs per batch, ``d`` input dimension,
``S`` Monte-Carlo passes.
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from . import rng

# ---------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class TrainConfig:
    """Network, optimiser and method hyper-parameters (R.3 defaults; every value overridable).

    Attributes
    ----------
    hidden : tuple of int
        Hidden widths; the paper's network is d→128→64→32→1.
    negative_slope : float
        Leaky-ReLU slope after every hidden layer.
    lr, betas : float, (float, float)
        Adam learning rate and moments.
    weight_decay : float or None
        L2 factor λ added to the gradient of the weights (PyTorch Adam ``weight_decay``, biases
        unregularised); ``None`` means 1/N.
    epochs : int or None
        Training epochs; ``None`` means 300·c.
    members : int
        Ensemble members per repetition (ensemble methods).
    dropout : float
        Bernoulli dropout rate of ``bd`` and the initial rate of ``cd``/``vd``.
    mc_samples : int
        Stochastic forward passes T at prediction for the dropout methods.
    concrete_temperature : float
        Temperature of the concrete relaxation (``cd``).
    concrete_length_scale : float
        Prior length scale l of ``cd``: weight regulariser l²/N, dropout regulariser 2/N.
    adversarial_epsilon : float
        FGSM step as a fraction of the training-input range per dimension (``ens_adv``).
    bootstrap_batches : int
        Mini-batches of N/2 drawn with replacement per epoch (``ens_bs``).
    std_ddof : int
        Delta degrees of freedom of the std over members / passes (1: sample std).
    dtype : str
        ``"float32"`` or ``"float64"``.
    device : str
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    max_memory : float
        Memory budget in bytes for one chunk of networks; the network axis is chunked to it.
    chunk_networks : int or None
        Upper bound on the networks trained together (tuned to the cache; see the benchmark);
        ``None``: only the memory budget bounds the chunk.
    adam : str
        ``"foreach"`` (multi-tensor) or ``"fused"`` Adam implementation of PyTorch.
    parallel_chunks : int or None
        Chunks trained concurrently by threads, each with single-threaded torch kernels (on
        the CPU this beats multi-threaded kernels on these small matrices, see the benchmark);
        ``None``: the number of available cores on the CPU, 1 on CUDA. The memory budget is
        shared by the concurrent chunks.
    """

    hidden: tuple[int, ...] = (128, 64, 32)
    negative_slope: float = 0.01
    lr: float = 1e-2
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float | None = None
    epochs: int | None = None
    members: int = 120
    dropout: float = 0.1
    mc_samples: int = 200
    concrete_temperature: float = 0.1
    concrete_length_scale: float = 1e-4
    adversarial_epsilon: float = 0.01
    bootstrap_batches: int = 2
    std_ddof: int = 1
    dtype: str = "float32"
    device: str = "cpu"
    max_memory: float = 4e9
    chunk_networks: int | None = None
    adam: str = "fused"
    parallel_chunks: int | None = None

    def __post_init__(self):
        checks = {
            "members": self.members >= 1,
            "mc_samples": self.mc_samples >= 2,
            "bootstrap_batches": self.bootstrap_batches >= 1,
            "dropout": 0.0 < self.dropout < 1.0,
            "lr": self.lr > 0,
            "max_memory": self.max_memory > 0,
            "epochs": self.epochs is None or self.epochs >= 1,
            "weight_decay": self.weight_decay is None or self.weight_decay >= 0,
            "hidden": len(self.hidden) >= 1 and all(h >= 1 for h in self.hidden),
            "dtype": self.dtype in ("float32", "float64"),
            "std_ddof": self.std_ddof in (0, 1),
            "chunk_networks": self.chunk_networks is None or self.chunk_networks >= 1,
            "adam": self.adam in ("foreach", "fused"),
            "parallel_chunks": self.parallel_chunks is None or self.parallel_chunks >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name} has an invalid value: {getattr(self, name)!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def threads(self) -> int:
        """Concurrent chunks (see ``parallel_chunks``)."""
        if self.parallel_chunks is not None:
            return self.parallel_chunks
        if self.device.startswith("cuda"):
            return 1
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return max(1, cores or 1)


# ---------------------------------------------------------------------------------------------
# stochastic heads: the layer between the last hidden activation and the output


class Head(torch.nn.Module):
    """Output layer ``h (B, n, k) -> y (B, n)``, possibly stochastic, with a regulariser."""

    stochastic = False

    def __init__(self, keys: torch.Tensor, cfg: TrainConfig, n_train: int):
        super().__init__()
        self.keys = keys  # (B,) int64 dropout keys
        self.cfg = cfg
        self.n_train = n_train

    def forward(self, h, weight, bias, counter: int, keys: torch.Tensor | None = None):  # pragma: no cover
        raise NotImplementedError

    def regulariser(self, weight) -> torch.Tensor | float:
        """Per-network regulariser added to the loss, shape (B,) (or 0)."""
        return 0.0


class DeterministicHead(Head):
    def forward(self, h, weight, bias, counter, keys=None):
        return torch.baddbmm(bias, h, weight)[..., 0]


class BernoulliHead(Head):
    """Inverted Bernoulli dropout (rate p) on the last hidden activation (MC dropout, ``bd``)."""

    stochastic = True

    def forward(self, h, weight, bias, counter, keys=None):
        keys = self.keys if keys is None else keys
        p = self.cfg.dropout
        u = rng.uniform(keys, counter, tuple(h.shape[1:]), dtype=h.dtype, device=h.device)
        h = h * (u >= p).to(h.dtype) / (1.0 - p)
        return torch.baddbmm(bias, h, weight)[..., 0]


def _logit(p: float) -> float:
    return math.log(p) - math.log1p(-p)


class ConcreteHead(Head):
    """Concrete dropout (Gal, Hron & Kendall 2017) with a learned rate per network (``cd``).

    Notes
    -----
    Relaxed drop indicator ``z = σ((logit p + log u − log(1−u)) / t)``, ``h ← h (1−z)/(1−p)``.
    Regulariser (per network): ``wr·‖W‖²/(1−p) + dr·K·(p log p + (1−p) log(1−p))`` with
    ``wr = l²/N``, ``dr = 2/N``, K the width of the dropped layer and W the output weights.
    """

    stochastic = True

    def __init__(self, keys, cfg, n_train):
        super().__init__(keys, cfg, n_train)
        b = keys.shape[0]
        self.p_logit = torch.nn.Parameter(torch.full((b, 1, 1), _logit(cfg.dropout), dtype=cfg.torch_dtype, device=keys.device))

    @property
    def rate(self) -> torch.Tensor:
        return torch.sigmoid(self.p_logit)

    def forward(self, h, weight, bias, counter, keys=None):
        keys = self.keys if keys is None else keys
        eps = 1e-7
        u = rng.uniform(keys, counter, tuple(h.shape[1:]), dtype=h.dtype, device=h.device)
        p = self.rate
        z = torch.sigmoid((torch.log(p + eps) - torch.log1p(-p + eps) + torch.log(u + eps) - torch.log1p(-u + eps))
                          / self.cfg.concrete_temperature)
        h = h * (1.0 - z) / (1.0 - p)
        return torch.baddbmm(bias, h, weight)[..., 0]

    def regulariser(self, weight):
        p = self.rate[:, 0, 0]
        n = self.n_train
        wr = self.cfg.concrete_length_scale**2 / n
        dr = 2.0 / n
        k = weight.shape[1]
        wreg = wr * weight.pow(2).sum(dim=(1, 2)) / (1.0 - p)
        dreg = dr * k * (p * torch.log(p) + (1.0 - p) * torch.log1p(-p))
        return wreg + dreg


class VariationalHead(Head):
    """Variational (Gaussian) dropout with learned per-unit α and the local reparameterisation
    trick (Kingma, Salimans & Welling 2015; ``vd``).

    Notes
    -----
    Multiplicative noise ξ_j ~ N(1, α_j) on the last hidden unit j; the output is sampled from
    its exact Gaussian: mean ``hW + b``, variance ``(h² α) (W²)``. KL approximation of
    Molchanov et al. (2017), ``−KL ≈ k1 σ(k2 + k3 log α) − ½ log(1 + 1/α) − k1``, summed over
    units and divided by N (the ELBO per training point). log α is clipped at 0 (α ≤ 1).
    """

    stochastic = True
    K1, K2, K3 = 0.63576, 1.87320, 1.48695

    def __init__(self, keys, cfg, n_train):
        super().__init__(keys, cfg, n_train)
        b = keys.shape[0]
        width = cfg.hidden[-1]
        alpha0 = cfg.dropout / (1.0 - cfg.dropout)
        self.log_alpha = torch.nn.Parameter(torch.full((b, 1, width), math.log(alpha0), dtype=cfg.torch_dtype, device=keys.device))

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.clamp(max=0.0).exp()

    def forward(self, h, weight, bias, counter, keys=None):
        keys = self.keys if keys is None else keys
        mean = torch.baddbmm(bias, h, weight)[..., 0]
        var = torch.bmm(h.pow(2) * self.alpha, weight.pow(2))[..., 0]
        eps = rng.normal(keys, counter, tuple(mean.shape[1:]), dtype=h.dtype, device=h.device)
        return mean + torch.sqrt(var + 1e-12) * eps

    def regulariser(self, weight):
        la = self.log_alpha.clamp(max=0.0)[:, 0, :]
        neg_kl = self.K1 * torch.sigmoid(self.K2 + self.K3 * la) - 0.5 * torch.log1p(torch.exp(-la)) - self.K1
        return -neg_kl.sum(dim=1) / self.n_train


HEADS: dict[str, type[Head]] = {
    "deterministic": DeterministicHead,
    "bernoulli": BernoulliHead,
    "concrete": ConcreteHead,
    "variational": VariationalHead,
}


# ---------------------------------------------------------------------------------------------
# the batched network


def xavier_uniform(keys: torch.Tensor, counter: int, fan_in: int, fan_out: int, dtype) -> torch.Tensor:
    """Glorot-uniform weights per network, shape (B, fan_in, fan_out)."""
    a = math.sqrt(6.0 / (fan_in + fan_out))
    u = rng.uniform(keys, counter, (fan_in, fan_out), dtype=torch.float64)
    return (a * (2.0 * u - 1.0)).to(dtype)


class BatchedMLP(torch.nn.Module):
    """``B`` fully connected networks d→hidden…→1 with leaky ReLU, stacked on axis 0.

    Parameters
    ----------
    init_keys, dropout_keys : torch.Tensor, int64, shape (B,)
        Per-network keys of the initialisation and of the stochastic head.
    input_dim : int
    head : str
        Name in :data:`HEADS`.
    cfg : TrainConfig
    n_train : int
        Training-set size N (used by the head's regulariser).
    """

    def __init__(self, init_keys, dropout_keys, input_dim: int, head: str, cfg: TrainConfig, n_train: int):
        super().__init__()
        dt = cfg.torch_dtype
        widths = (input_dim, *cfg.hidden, 1)
        self.weights = torch.nn.ParameterList()
        self.biases = torch.nn.ParameterList()
        for layer, (fi, fo) in enumerate(zip(widths[:-1], widths[1:])):
            self.weights.append(torch.nn.Parameter(xavier_uniform(init_keys, layer, fi, fo, dt)))
            self.biases.append(torch.nn.Parameter(torch.zeros(init_keys.shape[0], 1, fo, dtype=dt, device=init_keys.device)))
        self.head = HEADS[head](dropout_keys, cfg, n_train)
        self.negative_slope = cfg.negative_slope

    @property
    def n_networks(self) -> int:
        return self.weights[0].shape[0]

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """Last hidden activation, ``x (B, n, d) -> (B, n, hidden[-1])``."""
        h = x
        for w, b in zip(self.weights[:-1], self.biases[:-1]):
            # a 1-D input makes the first layer an outer product: cheaper as a broadcast addcmul
            z = torch.addcmul(b, h, w) if w.shape[1] == 1 else torch.baddbmm(b, h, w)
            h = torch.nn.functional.leaky_relu(z, self.negative_slope)
        return h

    def forward(self, x: torch.Tensor, counter: int = 0, keys: torch.Tensor | None = None) -> torch.Tensor:
        """``x (B, n, d) -> y (B, n)``; ``counter`` indexes the stochastic head's draw."""
        return self.head(self.hidden(x), self.weights[-1], self.biases[-1], counter, keys)

    def regulariser(self):
        return self.head.regulariser(self.weights[-1])

    def param_groups(self, weight_decay: float) -> list[dict]:
        """Adam groups: L2 on the weights only (biases and head parameters unregularised)."""
        others = list(self.biases) + list(self.head.parameters())
        return [{"params": list(self.weights), "weight_decay": weight_decay},
                {"params": others, "weight_decay": 0.0}]


# ---------------------------------------------------------------------------------------------
# batch samplers and the training loop


def full_batches(x, y, keys, epoch, cfg) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One full batch per epoch: ``x (B, N, d)``, ``y (B, N)``."""
    yield x, y


def bootstrap_batches(x, y, keys, epoch, cfg):
    """``cfg.bootstrap_batches`` batches of N/2 drawn with replacement per network and epoch."""
    b, n = y.shape
    half = max(1, n // 2)
    for step in range(cfg.bootstrap_batches):
        u = rng.uniform(keys, epoch * cfg.bootstrap_batches + step, (half,), dtype=torch.float64, device=y.device)
        idx = torch.clamp((u * n).long(), max=n - 1)  # (B, N/2)
        yield (torch.gather(x, 1, idx[..., None].expand(-1, -1, x.shape[2])), torch.gather(y, 1, idx))


SAMPLERS: dict[str, Callable] = {"full": full_batches, "bootstrap": bootstrap_batches}


def half_mse(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-network loss ½·mean (y − ŷ)², shape (B,)."""
    return 0.5 * (pred - y).pow(2).mean(dim=1)


@dataclass(frozen=True)
class NetworkBatch:
    """Which networks to train: repetition and member index of each, shape (B,)."""

    repetition: np.ndarray
    member: np.ndarray

    def __len__(self) -> int:
        return len(self.repetition)

    def chunks(self, size: int) -> Iterator["NetworkBatch"]:
        for i in range(0, len(self), size):
            yield NetworkBatch(self.repetition[i:i + size], self.member[i:i + size])


def train_batched(x_train: np.ndarray, y_train: np.ndarray, nets: NetworkBatch, *, seed: int, head: str,
                  sampler: str, adversarial: bool, cfg: TrainConfig, epochs: int,
                  progress: Callable[[int], None] | None = None) -> BatchedMLP:
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
        Names in :data:`HEADS` and :data:`SAMPLERS`.
    adversarial : bool
        Add the FGSM loss term (Lakshminarayanan et al. 2017).
    epochs : int
    progress : callable, optional
        Called with the number of finished epochs after each epoch.

    Returns
    -------
    BatchedMLP
        The trained networks (B of them).
    """
    dev = torch.device(cfg.device)
    dt = cfg.torch_dtype
    n, d = x_train.shape
    init_keys = rng.network_keys(seed, "init", nets.repetition, nets.member).to(dev)
    drop_keys = rng.network_keys(seed, "dropout", nets.repetition, nets.member).to(dev)
    boot_keys = rng.network_keys(seed, "bootstrap", nets.repetition, nets.member).to(dev)
    model = BatchedMLP(init_keys, drop_keys, d, head, cfg, n)
    wd = 1.0 / n if cfg.weight_decay is None else cfg.weight_decay
    opt = torch.optim.Adam(model.param_groups(wd), lr=cfg.lr, betas=cfg.betas, **{cfg.adam: True})
    b = len(nets)
    x = torch.as_tensor(x_train, dtype=dt, device=dev)[None].expand(b, n, d)
    y = torch.as_tensor(y_train[nets.repetition], dtype=dt, device=dev)
    eps = None
    if adversarial:
        rng_x = np.ptp(x_train, axis=0)
        eps = torch.as_tensor(cfg.adversarial_epsilon * rng_x, dtype=dt, device=dev)
    sample = SAMPLERS[sampler]
    steps = cfg.bootstrap_batches if sampler == "bootstrap" else 1
    for epoch in range(epochs):
        for step, (xb, yb) in enumerate(sample(x, y, boot_keys, epoch, cfg)):
            counter = 2 * (epoch * steps + step)
            opt.zero_grad(set_to_none=True)
            if adversarial:
                xb = xb.detach().clone().requires_grad_(True)
                loss = half_mse(model(xb, counter), yb)
                (gx,) = torch.autograd.grad(loss.sum(), xb, retain_graph=True)
                x_adv = (xb + eps * gx.sign()).detach()
                loss = loss + half_mse(model(x_adv, counter + 1), yb)
            else:
                loss = half_mse(model(xb, counter), yb)
            (loss + model.regulariser()).sum().backward()
            opt.step()
        if progress is not None:
            progress(1)
    return model


@torch.no_grad()
def predict_batched(model: BatchedMLP, x_test: np.ndarray, nets: NetworkBatch, *, seed: int,
                    cfg: TrainConfig) -> tuple[np.ndarray, np.ndarray | None]:
    """Predict at test inputs.

    Returns
    -------
    mean : ndarray, shape (B, T)
        Deterministic output (deterministic head) or mean over ``cfg.mc_samples`` passes.
    std : ndarray, shape (B, T) or None
        Std over MC passes for stochastic heads; None for deterministic heads.
    """
    dev = torch.device(cfg.device)
    xt = torch.as_tensor(x_test, dtype=cfg.torch_dtype, device=dev)[None].expand(model.n_networks, -1, -1)
    h = model.hidden(xt)
    w, bias = model.weights[-1], model.biases[-1]
    if not model.head.stochastic:
        return model.head(h, w, bias, 0).double().cpu().numpy(), None
    mc_keys = rng.network_keys(seed, "mc", nets.repetition, nets.member).to(dev)
    passes = torch.stack([model.head(h, w, bias, s, mc_keys) for s in range(cfg.mc_samples)], dim=1)  # (B, S, T)
    passes = passes.double()
    return passes.mean(dim=1).cpu().numpy(), passes.std(dim=1, correction=cfg.std_ddof).cpu().numpy()


def bytes_per_network(n_rows: int, n_test: int, input_dim: int, cfg: TrainConfig, *, adversarial: bool,
                      mc: bool) -> int:
    """Upper estimate of the memory one network needs during training and prediction.

    Parameters: weights, gradients and two Adam moments; activations saved for backward (input,
    pre-activation and activation of every layer, twice under FGSM plus the input gradient);
    prediction activations and, for MC heads, the (S, T) passes.
    """
    widths = (input_dim, *cfg.hidden, 1)
    n_params = sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))
    itemsize = 4 if cfg.dtype == "float32" else 8
    act = n_rows * (2 * input_dim + 3 * sum(widths[1:]))
    train = 4 * n_params + act * (2.2 if adversarial else 1.0) * 1.5
    predict = n_test * (input_dim + 2 * sum(widths[1:])) + (2 * cfg.mc_samples * n_test if mc else 0)
    return int(itemsize * (train + predict)) + 4096


def chunk_size(per_network: int, cfg: TrainConfig) -> int:
    """How many networks fit in the memory budget of one of ``cfg.threads`` concurrent chunks
    (and ``cfg.chunk_networks``); raises if not even one does."""
    size = int(cfg.max_memory / cfg.threads // per_network)
    if cfg.chunk_networks is not None:
        size = min(size, cfg.chunk_networks)
    if size < 1:
        raise ValueError(
            f"max_memory={cfg.max_memory:.3g} bytes shared by {cfg.threads} concurrent chunks is below the "
            f"{per_network} bytes one network needs per chunk"
        )
    return size


@contextmanager
def torch_threads(n: int):
    """Temporarily set torch's intra-op threads (restored afterwards)."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


__all__ = [
    "TrainConfig", "Head", "HEADS", "BatchedMLP", "SAMPLERS", "NetworkBatch", "train_batched",
    "predict_batched", "bytes_per_network", "chunk_size", "half_mse", "xavier_uniform", "torch_threads",
]
