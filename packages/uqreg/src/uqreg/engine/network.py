"""The batched network: ``B`` small MLPs stacked on a leading network axis.

Weights ``(B, fan_in, fan_out)``, biases ``(B, 1, fan_out)``, activations ``(B, n, width)``; a
layer is one ``torch.baddbmm``. Each network's output depends on its own parameters only, so a
summed loss gives every network its own gradient.

Every tensor whose network blocks BLAS reads or writes (the fused step's parameters, gradients,
activations and inputs; the prediction's weights and activations) is laid out by
:func:`aligned_blocks`: network ``i``'s block starts at a multiple of :data:`ALIGN_BYTES` bytes,
whatever ``i`` and ``B``. MKL's batched products round differently with the 16-byte alignment of
an operand (measured: a ``(20, 50)·(50, 8)`` product written 8 bytes off a 16-byte boundary
differs in the last bits), and in a contiguous ``(B, r, c)`` tensor network ``i``'s block starts
at ``i·r·c`` elements, so without the layout a network's bits would depend on its position in its
chunk.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from .. import rng
from .config import TrainConfig
from .heads import HEADS, output_layer
from .objectives import OBJECTIVES

#: Alignment, in bytes, of every network's block in the tensors BLAS sees (a cache line; a
#: multiple of the 16 bytes MKL's kernels were measured to depend on).
ALIGN_BYTES = 64


def block_stride(numel: int, dtype: torch.dtype) -> int:
    """Elements between two networks' blocks of ``numel`` elements: ``numel`` rounded up to a
    multiple of :data:`ALIGN_BYTES` bytes."""
    q = max(1, ALIGN_BYTES // torch.empty((), dtype=dtype).element_size())
    return -(-numel // q) * q


def aligned_blocks(flat: torch.Tensor, b: int, shape: tuple[int, ...]) -> torch.Tensor:
    """View ``b`` blocks of ``shape`` in the 1-D ``flat`` (of ``b * block_stride(prod(shape))``
    elements, starting at an aligned address), network ``i``'s block at ``i * block_stride``.

    Returns
    -------
    torch.Tensor, shape (b, *shape)
        Contiguous when the block needs no padding; otherwise each block is contiguous and the
        network stride is padded (ATen then computes a batched product network by network).
    """
    numel = math.prod(shape)
    stride = block_stride(numel, flat.dtype)
    return flat.view(b, stride)[:, :numel].view(b, *shape)


def empty_aligned(b: int, shape: tuple[int, ...], *, dtype: torch.dtype, device) -> torch.Tensor:
    """A new ``(b, *shape)`` tensor laid out by :func:`aligned_blocks` (PyTorch's CPU allocator
    aligns every allocation to 64 bytes)."""
    flat = torch.empty(b * block_stride(math.prod(shape), dtype), dtype=dtype, device=device)
    return aligned_blocks(flat, b, shape)


def aligned_copy(x: torch.Tensor) -> torch.Tensor:
    """``x (B, …)`` copied into a new tensor laid out by :func:`aligned_blocks`."""
    return empty_aligned(x.shape[0], tuple(x.shape[1:]), dtype=x.dtype, device=x.device).copy_(x)


@dataclass(frozen=True)
class NetworkBatch:
    """Which networks to train: repetition and member index of each, shape (B,)."""

    repetition: np.ndarray
    member: np.ndarray

    def __len__(self) -> int:
        return len(self.repetition)

    def chunks(self, size: int) -> Iterator[NetworkBatch]:
        for i in range(0, len(self), size):
            yield NetworkBatch(self.repetition[i:i + size], self.member[i:i + size])


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
        Name in :data:`uqreg.engine.heads.HEADS`.
    cfg : TrainConfig
    n_train : int
        Training-set size N (used by the head's regulariser).
    sigma : float
        The task's noise std σ (the head's regulariser reads :attr:`regulariser_sigma`).
    objective : str
        Name in :data:`uqreg.engine.objectives.OBJECTIVES`. A mean–variance objective adds a second
        output layer k→1, ``var_weight (B, k, 1)`` and ``var_bias (B, 1, 1)``, that reads the head's
        :meth:`~uqreg.engine.heads.Head.variance_input` and gives the raw variance output s
        (σ² = softplus(s) + floor); its weight is drawn with counter ``len(hidden) + 1`` of the
        initialisation keys, so the mean branch starts as the mean-only network's. Otherwise
        both are None. A quantile objective (``pinball``) has the same second output layer: the
        first output is then ``q_lo``, the second ``q_hi`` (docs/conventions.md#r-6).
    alpha : float, optional
        The α of an objective that uses one (the quantile networks' levels α/2 and 1 − α/2),
        bound into :attr:`objective` (:meth:`~uqreg.engine.objectives.Objective.bound`);
        ignored by the others.
    """

    def __init__(self, init_keys, dropout_keys, input_dim: int, head: str, cfg: TrainConfig, n_train: int,
                 sigma: float, objective: str = "mse", alpha: float | None = None):
        super().__init__()
        dt = cfg.torch_dtype
        dev = init_keys.device
        widths = (input_dim, *cfg.hidden, 1)
        self.weights = torch.nn.ParameterList()
        self.biases = torch.nn.ParameterList()
        for layer, (fi, fo) in enumerate(itertools.pairwise(widths)):
            self.weights.append(torch.nn.Parameter(xavier_uniform(init_keys, layer, fi, fo, dt)))
            self.biases.append(torch.nn.Parameter(torch.zeros(init_keys.shape[0], 1, fo, dtype=dt, device=dev)))
        self.head = HEADS.lookup(head)
        self.head_params = torch.nn.ParameterDict({
            k: torch.nn.Parameter(v)
            for k, v in self.head.init_params(init_keys.shape[0], widths[-2], cfg, dtype=dt, device=dev).items()
        })
        self.objective = OBJECTIVES.lookup(objective).bound(alpha)
        self.var_weight = self.var_bias = None
        if self.objective.mean_variance:
            self.var_weight = torch.nn.Parameter(xavier_uniform(init_keys, len(widths) - 1, widths[-2], 1, dt))
            self.var_bias = torch.nn.Parameter(torch.zeros(init_keys.shape[0], 1, 1, dtype=dt, device=dev))
        self.dropout_keys = dropout_keys
        self.cfg = cfg
        self.n_train = n_train
        self.sigma = float(sigma)

    @property
    def regulariser_sigma(self) -> float:
        """The σ of the head's regulariser σ²·KL/N: the task's σ under an objective that is the
        known-σ likelihood times σ² (``mse``: ½·MSE + σ²·KL/N, docs/conventions.md#r-3), 1 under
        one that is a negative log-likelihood with its own learned variance (a mean–variance
        network's β-NLL: the ELBO per sample is NLL + KL/N, Kendall & Gal 2017;
        docs/conventions.md#r-7). The autograd and the fused paths both read it."""
        return self.sigma if self.objective.sigma_scaled else 1.0

    @property
    def n_networks(self) -> int:
        return self.weights[0].shape[0]

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """Last hidden activation, ``x (B, n, d) -> (B, n, hidden[-1])`` (``x`` itself without
        hidden layers)."""
        h = x
        for w, b in zip(self.weights[:-1], self.biases[:-1]):
            # a 1-D input makes the first layer an outer product: cheaper as a broadcast addcmul
            z = torch.addcmul(b, h, w) if w.shape[1] == 1 else torch.baddbmm(b, h, w)
            h = torch.nn.functional.leaky_relu(z, self.cfg.negative_slope)
        return h

    @torch.no_grad()
    def hidden_aligned(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`hidden` for prediction (no graph), with every operand of every product laid out
        by :func:`aligned_blocks`, so that a network's predictions do not depend on its position
        in the batch. ``x (B or 1 broadcast, n, d) -> (B, n, hidden[-1])``."""
        b, h = self.n_networks, x
        for w, bias in zip(self.weights[:-1], self.biases[:-1]):
            z = empty_aligned(b, (h.shape[1], w.shape[2]), dtype=w.dtype, device=w.device)
            if w.shape[1] == 1:
                torch.addcmul(bias, h, w, out=z)
            else:
                torch.baddbmm(bias, h, aligned_copy(w), out=z)
            h = torch.nn.functional.leaky_relu_(z, self.cfg.negative_slope)
        return h

    def output(self, h: torch.Tensor, counter: int = 0, keys: torch.Tensor | None = None) -> torch.Tensor:
        """The head on the last hidden activation ``h (B, n, k)`` → ``(B, n)``; ``counter`` and
        ``keys`` (default: the dropout keys) index the head's random draw."""
        noise = None
        if self.head.stochastic:
            keys = self.dropout_keys if keys is None else keys
            noise = self.head.draw(keys, counter, h.shape[1], h.shape[2], dtype=h.dtype, device=h.device)
        return self.head.forward(h, self.weights[-1], self.biases[-1], noise, dict(self.head_params), self.cfg)

    def forward(self, x: torch.Tensor, counter: int = 0, keys: torch.Tensor | None = None) -> torch.Tensor:
        """``x (B, n, d) -> y (B, n)``; ``counter`` indexes the stochastic head's draw."""
        return self.output(self.hidden(x), counter, keys)

    def output_mv(self, h: torch.Tensor, counter: int = 0,
                  keys: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Both outputs on ``h (B, n, k)`` with ONE draw of the head: the mean ``(B, n)`` and the
        raw variance output s ``(B, n)`` (None without a variance output)."""
        noise = None
        if self.head.stochastic:
            keys = self.dropout_keys if keys is None else keys
            noise = self.head.draw(keys, counter, h.shape[1], h.shape[2], dtype=h.dtype, device=h.device)
        params = dict(self.head_params)
        if self.var_weight is None:
            return self.head.forward(h, self.weights[-1], self.biases[-1], noise, params, self.cfg), None
        hv = self.head.variance_input(h, noise, params, self.cfg)
        if self.head.linear_output:  # the head's own output, its dropped activation computed once
            mean = output_layer(hv, self.weights[-1], self.biases[-1])
        else:
            mean = self.head.forward(h, self.weights[-1], self.biases[-1], noise, params, self.cfg)
        return mean, output_layer(hv, self.var_weight, self.var_bias)

    def forward_mv(self, x: torch.Tensor, counter: int = 0,
                   keys: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``x (B, n, d) -> (mean (B, n), raw variance output (B, n) or None)``."""
        return self.output_mv(self.hidden(x), counter, keys)

    def weight_parameters(self) -> list[torch.Tensor]:
        """Every weight (the recipe's L2 acts on these): the layers', then the variance output's."""
        return list(self.weights) + ([] if self.var_weight is None else [self.var_weight])

    def bias_parameters(self) -> list[torch.Tensor]:
        """Every bias: the layers', then the variance output's."""
        return list(self.biases) + ([] if self.var_bias is None else [self.var_bias])

    def regulariser(self) -> torch.Tensor | float:
        """The head's per-network regulariser, shape (B,) (or 0), at :attr:`regulariser_sigma`."""
        return self.head.regulariser(self.weights[-1], dict(self.head_params), n_train=self.n_train,
                                     sigma=self.regulariser_sigma, cfg=self.cfg)

    def network_parameters(self, i: int) -> list[torch.Tensor]:
        """Network ``i``'s parameters: weights of every layer, biases of every layer, then the
        head's (in :meth:`Head.init_params` order), then the variance output's weight and bias."""
        extra = [] if self.var_weight is None else [self.var_weight, self.var_bias]
        return ([w[i].detach() for w in self.weights] + [b[i].detach() for b in self.biases]
                + [p[i].detach() for p in self.head_params.values()] + [p[i].detach() for p in extra])
