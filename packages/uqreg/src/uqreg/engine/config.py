"""What a training run is: :class:`TrainConfig` (network, optimiser and method hyper-parameters,
PROTOCOLS R.3 defaults)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TrainConfig:
    """Network, optimiser and method hyper-parameters (R.3 defaults; every value overridable).

    Attributes
    ----------
    hidden : tuple of int
        Hidden widths; the paper's network is d→128→64→32→1. ``()`` gives a linear model.
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
            "hidden": all(h >= 1 for h in self.hidden),
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
