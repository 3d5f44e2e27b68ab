"""Output heads: the layer from the last hidden activation to the output, and its regulariser.

A head is the ONE place a method's network differs: its forward maths (deterministic, or
stochastic given its random draw) and the term it adds to the loss. Each is registered in
:data:`HEADS` and written as small pure functions of tensors, so that the batched autograd path
(:mod:`uqreg.engine.train`), a hand-written fused path, and the per-network loop of the tests
all call the same formula. Shapes: ``B`` networks, ``n`` inputs, ``k`` width of the last hidden
layer; ``h (B, n, k)``, output weight ``weight (B, k, 1)``, bias ``bias (B, 1, 1)``, output
``(B, n)``.

Add a head with::

    class MyHead(Head):
        name = "my_head"
        description = "..."
        stochastic = True
        def draw(self, keys, counter, n, k, *, dtype, device): ...
        def forward(self, h, weight, bias, noise, params, cfg): ...
        def regulariser(self, weight, params, *, n_train, sigma, cfg): ...

    HEADS.register(MyHead())

and a method using it (``Method(..., head="my_head")``); the engine, the plan, the loop
reference of the tests and the CLI pick it up.
"""

from __future__ import annotations

import math

import torch
from uqmetrics.metrics.registry import Registry

from .. import rng
from .config import TrainConfig

# ---------------------------------------------------------------------------------------------
# pure per-network formulas (every tensor has the leading network axis B)


class _Sigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        e = torch.exp(-x.abs())  # in (0, 1]: no overflow
        s = torch.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
        ctx.save_for_backward(s)
        return s

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        return grad * s * (1.0 - s)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """The logistic function from exp, division and products only. (``torch.sigmoid`` and its
    backward round differently in their vectorised CPU body and their scalar tail, so an
    element's value would depend on its position in the tensor, i.e. a network's result on the
    chunk it is trained in; the operations used here do not.)"""
    return _Sigmoid.apply(x)


def output_layer(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The k→1 output layer ``h @ weight + bias`` as a reduction over k: ``h (B, n, k)`` →
    ``(B, n)``. (A reduction, not ``bmm``: a GEMV's summation order changes with the batch size,
    a row reduction's does not, so a network's output never depends on its chunk.)"""
    return (h * weight.transpose(1, 2)).sum(dim=-1) + bias[..., 0]


def bernoulli_forward(h, weight, bias, u, p: float) -> torch.Tensor:
    """Inverted Bernoulli dropout of rate ``p`` on ``h``: keep where ``u >= p``, scale 1/(1−p).

    ``u (B, n, k)`` uniform in [0, 1).
    """
    return output_layer(h * (u >= p).to(h.dtype) / (1.0 - p), weight, bias)


CONCRETE_EPS = 1e-7


def concrete_forward(h, weight, bias, u, p_logit, temperature: float) -> torch.Tensor:
    """Concrete (relaxed Bernoulli) dropout, Gal, Hron & Kendall (2017).

    ``z = σ((log p − log(1−p) + log u − log(1−u)) / t)`` is the relaxed drop indicator and
    ``h ← h (1 − z)/(1 − p)``; ``u (B, n, k)`` uniform, ``p_logit (B, 1, 1)`` the logit of p.
    """
    return output_layer(concrete_dropped(h, u, p_logit, temperature), weight, bias)


def concrete_dropped(h, u, p_logit, temperature: float) -> torch.Tensor:
    """``h (1 − z)/(1 − p)``, the activation :func:`concrete_forward` feeds its output layer."""
    eps = CONCRETE_EPS
    p = sigmoid(p_logit)
    z = sigmoid((torch.log(p + eps) - torch.log1p(-p + eps) + torch.log(u + eps) - torch.log1p(-u + eps))
                / temperature)
    return h * (1.0 - z) / (1.0 - p)


def concrete_regulariser(weight, p_logit, *, n_train: int, sigma: float, length_scale: float) -> torch.Tensor:
    """Concrete dropout's regulariser against ½·MSE, per network, shape (B,).

    Notes
    -----
    The objective is the Gaussian negative log-likelihood with the known σ plus KL/N; times σ²
    (to put its data term on the ½·MSE scale of the other methods):
    ``½·mean (y − ŷ)² + (σ² l² / (2N))·‖W‖²/(1−p) + (σ²/N)·K·(p log p + (1−p) log(1−p))``,
    K the width of the dropped layer and W the output weights (docs/conventions.md#r-3; the official
    code's ``l²/(τN)`` and ``2/(τN)`` pair with a squared error without the ½). A mean–variance
    network's objective is already the per-sample NLL with its own variance, so the network
    passes ``sigma = 1`` (:attr:`~uqreg.engine.network.BatchedMLP.regulariser_sigma`): KL/N
    itself, ``l²/(2N)`` and ``1/N``.
    """
    p = sigmoid(p_logit)[:, 0, 0]
    s2 = sigma * sigma
    k = weight.shape[1]
    wreg = s2 * length_scale**2 / (2.0 * n_train) * weight.pow(2).sum(dim=(1, 2)) / (1.0 - p)
    dreg = s2 / n_train * k * (p * torch.log(p) + (1.0 - p) * torch.log1p(-p))
    return wreg + dreg


#: Molchanov et al. (2017), eq. 14: −KL ≈ k1·σ(k2 + k3·log α) − ½·log(1 + 1/α) − k1
MOLCHANOV_K = (0.63576, 1.87320, 1.48695)
#: log α is clipped to this range (Molchanov et al.'s approximation holds for every α)
LOG_ALPHA_RANGE = (-8.0, 8.0)


def clipped_log_alpha(log_alpha: torch.Tensor) -> torch.Tensor:
    return log_alpha.clamp(*LOG_ALPHA_RANGE)


def variational_forward(h, weight, bias, z, log_alpha) -> torch.Tensor:
    """Gaussian multiplicative noise ξ_j ~ N(1, α_j) on hidden unit j, sampled by the local
    reparameterisation trick: output ~ N(hW + b, (h² α)(W²)); ``z (B, n)`` standard normal,
    ``log_alpha (B, 1, k)`` (clipped to :data:`LOG_ALPHA_RANGE`)."""
    mean = output_layer(h, weight, bias)
    alpha = clipped_log_alpha(log_alpha).exp()
    var = (h.pow(2) * alpha * weight.pow(2).transpose(1, 2)).sum(dim=-1)
    return mean + torch.sqrt(var + 1e-12) * z


def variational_regulariser(log_alpha, *, n_train: int, sigma: float) -> torch.Tensor:
    """σ²·KL(q‖p)/N per network, shape (B,): the ELBO's KL against ½·MSE (its data term
    ½(y − ŷ)²/σ² times σ²), with Molchanov's approximation summed over units; KL/N itself
    (``sigma = 1``) against a mean–variance network's NLL
    (:attr:`~uqreg.engine.network.BatchedMLP.regulariser_sigma`)."""
    k1, k2, k3 = MOLCHANOV_K
    la = clipped_log_alpha(log_alpha)[:, 0, :]
    neg_kl = k1 * sigmoid(k2 + k3 * la) - 0.5 * torch.log1p(torch.exp(-la)) - k1
    return -(sigma * sigma) * neg_kl.sum(dim=1) / n_train


def _logit(p: float) -> float:
    return math.log(p) - math.log1p(-p)


# ---------------------------------------------------------------------------------------------
# the registered heads


class Head:
    """A registered output head (stateless: its parameters live in the network).

    Attributes
    ----------
    name, description : str
    stochastic : bool
        True: a forward pass needs a random draw (training and the MC passes of prediction).
    known_noise : bool
        True: the head's objective is the likelihood of the task's known noise, scaled by σ²
        (``cd``, ``vd``: docs/conventions.md#r-3); on a heteroscedastic task its squared errors
        are then weighted by σ²/σ(x_n)² (docs/conventions.md#r-7).
    linear_output : bool
        True: the output is ``output_layer(variance_input(h, …))`` exactly (any noise acts before
        the output layer), so a mean–variance network computes the dropped activation once for
        both outputs; False where the noise acts on the output itself (``variational``).
    """

    name = "deterministic"
    description = "plain linear output layer"
    stochastic = False
    known_noise = False
    linear_output = True

    def init_params(self, n_networks: int, width: int, cfg: TrainConfig, *, dtype, device) -> dict[str, torch.Tensor]:
        """Initial values of the head's own trainable parameters, each (B, ...)."""
        return {}

    def draw(self, keys: torch.Tensor, counter: int, n: int, width: int, *, dtype, device) -> torch.Tensor | None:
        """The random numbers of one forward pass of the networks ``keys (B,)``."""
        return None

    def forward(self, h, weight, bias, noise, params: dict, cfg: TrainConfig) -> torch.Tensor:
        """``h (B, n, k)`` → output ``(B, n)`` given the draw ``noise``."""
        return output_layer(h, weight, bias)

    def regulariser(self, weight, params: dict, *, n_train: int, sigma: float,
                    cfg: TrainConfig) -> torch.Tensor | float:
        """Per-network term added to the loss, shape (B,) (or 0); ``sigma`` is the network's
        :attr:`~uqreg.engine.network.BatchedMLP.regulariser_sigma` (the task's σ against ½·MSE,
        1 against a mean–variance NLL)."""
        return 0.0

    def variance_input(self, h, noise, params: dict, cfg: TrainConfig) -> torch.Tensor:
        """What the variance output layer of a mean–variance network reads, ``(B, n, k)``: the
        activation the mean output layer reads (the dropped one for the dropout heads, so that
        both outputs see the same mask: Kendall & Gal 2017); ``h`` itself here."""
        return h


class _UniformDraw:
    def draw(self, keys, counter, n, width, *, dtype, device):
        return rng.uniform(keys, counter, (n, width), dtype=dtype, device=device)


class BernoulliHead(_UniformDraw, Head):
    name = "bernoulli"
    description = "inverted Bernoulli dropout on the last hidden activation (MC dropout)"
    stochastic = True

    def forward(self, h, weight, bias, noise, params, cfg):
        return bernoulli_forward(h, weight, bias, noise, cfg.dropout)

    def variance_input(self, h, noise, params, cfg):
        return h * (noise >= cfg.dropout).to(h.dtype) / (1.0 - cfg.dropout)  # as bernoulli_forward


class ConcreteHead(_UniformDraw, Head):
    name = "concrete"
    description = "concrete dropout with a learned rate per network (Gal, Hron & Kendall 2017)"
    stochastic = True
    known_noise = True

    def init_params(self, n_networks, width, cfg, *, dtype, device):
        return {"p_logit": torch.full((n_networks, 1, 1), _logit(cfg.dropout), dtype=dtype, device=device)}

    def forward(self, h, weight, bias, noise, params, cfg):
        return concrete_forward(h, weight, bias, noise, params["p_logit"], cfg.concrete_temperature)

    def variance_input(self, h, noise, params, cfg):
        return concrete_dropped(h, noise, params["p_logit"], cfg.concrete_temperature)

    def regulariser(self, weight, params, *, n_train, sigma, cfg):
        return concrete_regulariser(weight, params["p_logit"], n_train=n_train, sigma=sigma,
                                    length_scale=cfg.concrete_length_scale)


class VariationalHead(Head):
    name = "variational"
    description = "variational Gaussian dropout, learned α per unit, local reparameterisation (Kingma et al. 2015)"
    stochastic = True
    known_noise = True
    linear_output = False

    def init_params(self, n_networks, width, cfg, *, dtype, device):
        alpha0 = cfg.dropout / (1.0 - cfg.dropout)
        return {"log_alpha": torch.full((n_networks, 1, width), math.log(alpha0), dtype=dtype, device=device)}

    def draw(self, keys, counter, n, width, *, dtype, device):
        return rng.normal(keys, counter, (n,), dtype=dtype, device=device)

    def forward(self, h, weight, bias, noise, params, cfg):
        return variational_forward(h, weight, bias, noise, params["log_alpha"])

    def regulariser(self, weight, params, *, n_train, sigma, cfg):
        return variational_regulariser(params["log_alpha"], n_train=n_train, sigma=sigma)


HEADS: Registry[Head] = Registry("head")
for _head in (Head(), BernoulliHead(), ConcreteHead(), VariationalHead()):
    HEADS.register(_head)
del _head

__all__ = [
    "CONCRETE_EPS",
    "HEADS",
    "LOG_ALPHA_RANGE",
    "MOLCHANOV_K",
    "BernoulliHead",
    "ConcreteHead",
    "Head",
    "VariationalHead",
    "bernoulli_forward",
    "concrete_dropped",
    "concrete_forward",
    "concrete_regulariser",
    "output_layer",
    "variational_forward",
    "variational_regulariser",
]
