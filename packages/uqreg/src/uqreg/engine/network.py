"""The batched network: ``B`` small MLPs stacked on a leading network axis.

Weights ``(B, fan_in, fan_out)``, biases ``(B, 1, fan_out)``, activations ``(B, n, width)``; a
layer is one ``torch.baddbmm``. Each network's output depends on its own parameters only, so a
summed loss gives every network its own gradient.
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
from .heads import HEADS


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
        The task's noise std σ (used by the head's regulariser).
    """

    def __init__(self, init_keys, dropout_keys, input_dim: int, head: str, cfg: TrainConfig, n_train: int,
                 sigma: float):
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
        self.dropout_keys = dropout_keys
        self.cfg = cfg
        self.n_train = n_train
        self.sigma = float(sigma)

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

    def regulariser(self) -> torch.Tensor | float:
        """The head's per-network regulariser, shape (B,) (or 0)."""
        return self.head.regulariser(self.weights[-1], dict(self.head_params), n_train=self.n_train,
                                     sigma=self.sigma, cfg=self.cfg)

    def network_parameters(self, i: int) -> list[torch.Tensor]:
        """Network ``i``'s parameters: weights of every layer, biases of every layer, then the
        head's (in :meth:`Head.init_params` order)."""
        return ([w[i].detach() for w in self.weights] + [b[i].detach() for b in self.biases]
                + [p[i].detach() for p in self.head_params.values()])
