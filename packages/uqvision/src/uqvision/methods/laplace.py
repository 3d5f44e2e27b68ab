"""K-FAC Laplace as a :class:`~uqvision.training.method.TrainingMethod` entry: a Kronecker-
factored Laplace approximation around a conventionally trained network (the MAP), with
pi-corrected damping and a noise scale tuned on validation data (:func:`search_scale`).

The probabilistic model is Pitfalls' (eqs. 6-9, :mod:`uqvision.methods.bayesian`).

References
----------
.. [1] Ashukha et al. Pitfalls of in-domain uncertainty estimation and ensembling in deep
   learning. ICLR 2020, appendix B.
.. [2] Ritter, Botev, Barber. A scalable Laplace approximation for neural networks. ICLR 2018.
.. [3] Martens, Grosse. Optimizing neural networks with Kronecker-factored approximate
   curvature. ICML 2015 (the pi-corrected damping, section 6.3).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..training.method import (
    TRAINING_METHODS,
    TrainingMethod,
    TrainRecipe,
    TrainState,
    check_fields,
    check_k,
    restoring,
    sample_seed,
    update_batchnorm,
)

logger = logging.getLogger(__name__)

__all__ = [
    "LaplaceHParams",
    "kfac_factors",
    "search_scale",
]


@dataclass(frozen=True)
class LaplaceHParams(TrainRecipe):
    """K-FAC Laplace around a conventionally trained network (the MAP of eq. 7).

    Per ``nn.Linear``/``nn.Conv2d`` layer (bias as an extra input column) the empirical
    Fisher of the whole training set is ``N (A ⊗ G)`` (Kronecker factors of the inputs and of
    the per-example output gradients, Grosse & Martens' KFC for convolutions); the prior
    precision ``tau`` (default ``N wd``, eq. 9) is added with Martens & Grosse's pi-corrected
    damping, ``N (A + pi sqrt(eps) I) ⊗ (G + sqrt(eps)/pi I)`` with ``eps = tau / N`` and
    ``pi = sqrt((tr A / dim A) / (tr G / dim G))``. Samples are ``w_MAP + scale *
    N^(-1/2) L_G^-T Z L_A^-1``; ``scale`` is chosen from ``scales`` by the validation NLL of a
    ``tune_samples`` ensemble (Ritter et al.; Pitfalls Table 2 reports the chosen scales in
    their code's own normalisation). A single scale skips the tuning. An optimum on an edge
    of the grid extends it by the grid's own ratio there, up to ``max_scale_extensions``
    points (:func:`search_scale`); one still on an edge is flagged (``state.extra
    ["laplace.scale_at_edge"]`` and a log warning). Other layers stay at the MAP;
    ``bn_update`` recomputes BatchNorm statistics for each sample.
    """

    scales: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
    tune_samples: int = 5
    prior_precision: float | None = None
    bn_update: bool = True
    max_scale_extensions: int = 4

    def __post_init__(self):
        super().__post_init__()
        check_fields(self, positive=("tune_samples",),
                     nonnegative=("max_scale_extensions",))
        if not self.scales or any(not s >= 0 for s in self.scales):
            raise ValueError(f"scales must be non-negative numbers, got {self.scales!r}")
        if self.prior_precision is not None and not self.prior_precision >= 0:
            raise ValueError(f"prior_precision must be >= 0, got {self.prior_precision!r}")


def _kfac_layers(net: nn.Module) -> dict[str, nn.Module]:
    """Layers K-FAC covers: plain Linear, and plain ungrouped Conv2d with numeric padding."""
    return {n: m for n, m in net.named_modules()
            if type(m) is nn.Linear or (type(m) is nn.Conv2d and m.groups == 1
                                        and not isinstance(m.padding, str)
                                        and m.padding_mode == "zeros")}


def _layer_rows(module: nn.Module, x: torch.Tensor, g: torch.Tensor):
    """Input rows (with a ones column for the bias) and output-gradient rows, one per
    (example, location)."""
    if isinstance(module, nn.Conv2d):
        x = F.unfold(x, module.kernel_size, module.dilation, module.padding, module.stride)
        x = x.transpose(1, 2).reshape(-1, x.shape[1])
        g = g.flatten(2).transpose(1, 2).reshape(-1, g.shape[1])
    else:
        x, g = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
    if module.bias is not None:
        x = torch.cat([x, torch.ones_like(x[:, :1])], 1)
    return x.double(), g.double()


def kfac_factors(state: TrainState, loader) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The empirical-Fisher Kronecker factors ``(A, G)`` of every K-FAC layer over ``loader``.

    ``A = mean over examples and locations of a a^T`` (a: the layer input, with a 1 for the
    bias), ``G = (1/N) sum over examples and locations of g g^T`` (g: the gradient of the
    example's NLL w.r.t. the layer output), so that the layer's Fisher is ``N (A ⊗ G)``.
    The network runs in eval mode (BatchNorm statistics as at prediction). Stored in
    ``state.extra`` as ``kfac.<layer>.A`` / ``.G`` and ``kfac.n`` (N).
    """
    net, layers = state.net, _kfac_layers(state.net)
    if not layers:
        raise ValueError(f"kfac_laplace needs nn.Linear or nn.Conv2d layers; "
                         f"{type(net).__name__} has none")
    inputs, outputs = {}, {}
    sums = {n: [0.0, 0.0, 0] for n in layers}  # A sum, G sum, rows
    def keep(name):
        def hook(module, args, out):
            inputs[name], outputs[name] = args[0].detach(), out
        return hook

    hooks = [m.register_forward_hook(keep(n)) for n, m in layers.items()]
    n_examples = 0
    net.eval()
    try:
        for batch in loader:
            x, y = batch[0].to(state.device), batch[1].to(state.device)
            inputs.clear()
            outputs.clear()
            loss = state.nll(net(x), y, reduction="sum")
            names = list(outputs)
            grads = torch.autograd.grad(loss, [outputs[n] for n in names], allow_unused=True)
            for name, g in zip(names, grads):
                if g is None:
                    continue
                a, g = _layer_rows(layers[name], inputs[name], g.detach())
                s = sums[name]
                s[0], s[1], s[2] = s[0] + a.T @ a, s[1] + g.T @ g, s[2] + len(a)
            n_examples += len(y)
    finally:
        for h in hooks:
            h.remove()
    state.extra["kfac.n"] = torch.tensor(n_examples)
    factors = {}
    for name, (a_sum, g_sum, rows) in sums.items():
        if rows:
            factors[name] = (a_sum / rows, g_sum / n_examples)
            state.extra[f"kfac.{name}.A"], state.extra[f"kfac.{name}.G"] = factors[name]
    return factors


def _inverse_cholesky(m: torch.Tensor, what: str) -> torch.Tensor:
    chol, info = torch.linalg.cholesky_ex(m)
    if int(info):
        raise ValueError(f"K-FAC factor {what} is not positive definite; use a prior "
                         "precision > 0 (weight_decay or prior_precision)")
    return torch.linalg.solve_triangular(chol, torch.eye(len(m), dtype=m.dtype,
                                                         device=m.device), upper=False)


def _kfac_posterior(state: TrainState) -> list[tuple[nn.Module, torch.Tensor, torch.Tensor]]:
    """Per layer: (module, L_G^-T, L_A^-1) of the damped factors (scale 1 / sqrt(N) not in)."""
    hp, ex = state.hp, state.extra
    n = int(ex["kfac.n"])
    tau = n * hp.weight_decay if hp.prior_precision is None else hp.prior_precision
    eps = tau / n
    out = []
    for name, module in _kfac_layers(state.net).items():
        if f"kfac.{name}.A" not in ex:
            continue
        a, g = ex[f"kfac.{name}.A"], ex[f"kfac.{name}.G"]
        ta, tg = torch.trace(a) / len(a), torch.trace(g) / len(g)
        if not (ta > 0 and tg > 0):
            continue  # a layer the loss does not reach stays at the MAP
        pi = torch.sqrt(ta / tg)
        ia = _inverse_cholesky(a + pi * math.sqrt(eps) * torch.eye(len(a), dtype=a.dtype,
                                                                    device=a.device), name)
        ig = _inverse_cholesky(g + math.sqrt(eps) / pi * torch.eye(len(g), dtype=g.dtype,
                                                                    device=g.device), name)
        out.append((module, ig.T, ia))
    return out


def _kfac_draws(state: TrainState, scale: float, k: int, seed: int) -> Iterator[nn.Module]:
    """``k`` networks ``w_MAP + scale N^-1/2 L_G^-T Z L_A^-1`` (weights restored after)."""
    layers = _kfac_posterior(state)
    n = int(state.extra["kfac.n"])
    with restoring(state.net) as net:
        maps = [(m.weight.detach().clone(), None if m.bias is None else m.bias.detach().clone())
                for m, _, _ in layers]
        for i in range(k):
            g = torch.Generator().manual_seed(sample_seed(seed, i))
            with torch.no_grad():
                for (module, left, right), (w0, b0) in zip(layers, maps):
                    z = torch.randn(len(left), len(right), generator=g, dtype=left.dtype)
                    delta = (scale / math.sqrt(n)) * (left @ z.to(left.device) @ right)
                    delta = delta.to(w0.dtype)
                    cols = w0[0].numel()
                    module.weight.copy_(w0 + delta[:, :cols].reshape(w0.shape))
                    if b0 is not None:
                        module.bias.copy_(b0 + delta[:, cols])
            update_batchnorm(state, state.hp.bn_update)
            yield net


def _validation_nll(state: TrainState, nets: Iterator[nn.Module], loader) -> float:
    """NLL of the equal-weight mixture of the networks' predictives on ``loader``."""
    batches = [(b[0].to(state.device), b[1].to(state.device)) for b in loader]
    logliks = []
    with torch.no_grad():
        for net in nets:
            logliks.append(torch.cat([-state.nll(net(x), y, reduction="none").double()
                                      for x, y in batches]))
    stacked = torch.stack(logliks)
    return float(-(torch.logsumexp(stacked, 0) - math.log(len(stacked))).mean())


def search_scale(scales, objective, max_extensions: int) -> tuple[list[float], list[float],
                                                                   float, bool]:
    """Minimise ``objective`` over the grid ``scales``, extending it past an edge optimum.

    While the best scale is the grid's smallest (and positive) or its largest, one point is
    added beyond that edge at the grid's ratio there (its two outer points; 10 for a
    one-point grid), at most ``max_extensions`` times. Scale 0 (the MAP) is a true lower
    bound and never extended.

    Returns
    -------
    grid : list of float
        Every scale evaluated, ascending.
    values : list of float
        ``objective`` at each.
    best : float
        The minimiser.
    at_edge : bool
        ``best`` is still an extendable edge of the grid (the search ran out of extensions).
    """
    grid = sorted({float(s) for s in scales})
    values = {s: float(objective(s)) for s in grid}

    def edge() -> float | None:
        best = min(grid, key=values.__getitem__)
        if len(grid) > 1 and best == grid[0] and best > 0:
            return best * best / grid[1] if grid[1] > 0 else best / 10
        if best == grid[-1] and (best > 0 or len(grid) == 1):
            ratio = best / grid[-2] if len(grid) > 1 and grid[-2] > 0 else 10.0
            return best * ratio if best > 0 else 1e-2
        return None

    for _ in range(int(max_extensions)):
        new = edge()
        if new is None:
            break
        values[new] = float(objective(new))
        grid = sorted(values)
    best = min(grid, key=values.__getitem__)
    return grid, [values[s] for s in grid], best, edge() is not None


def _laplace_post_fit(state: TrainState, train_loader, val_loader) -> None:
    hp = state.hp
    if train_loader is None:
        raise ValueError("kfac_laplace needs the training data (train_loader) after training")
    kfac_factors(state, train_loader)
    if len(hp.scales) == 1:
        scale = hp.scales[0]
    else:
        if val_loader is None:
            raise ValueError("kfac_laplace tunes its noise scale on validation data: pass "
                             "val_loader, or give a single scale (scales=(s,))")
        grid, nlls, scale, at_edge = search_scale(
            hp.scales, lambda s: _validation_nll(state, _kfac_draws(state, s, hp.tune_samples,
                                                                    seed=0), val_loader),
            hp.max_scale_extensions)
        state.extra["laplace.scales"] = torch.tensor(grid, dtype=torch.float64)
        state.extra["laplace.validation_nll"] = torch.tensor(nlls, dtype=torch.float64)
        state.extra["laplace.scale_at_edge"] = torch.tensor(int(at_edge))
        if at_edge:
            logger.warning("kfac_laplace: the best noise scale %g is on the edge of the "
                           "searched grid %s after %d extensions (validation NLL still "
                           "falling): recorded as laplace.scale_at_edge", scale, grid,
                           hp.max_scale_extensions)
    state.extra["laplace.scale"] = torch.tensor(float(scale), dtype=torch.float64)


def _laplace_samples(state: TrainState, k: int, seed: int = 0) -> Iterator[nn.Module]:
    check_k(k)
    if "laplace.scale" not in state.extra:
        raise ValueError("kfac_laplace has no fitted posterior: call method.finish(state, "
                         "train_loader, val_loader) after training")
    return _kfac_draws(state, float(state.extra["laplace.scale"]), k, seed)


TRAINING_METHODS.register(TrainingMethod(
    name="kfac_laplace",
    description="K-FAC Laplace: empirical Fisher, pi-corrected damping, noise scale tuned on "
                "validation (Ritter et al.)",
    hparams=LaplaceHParams, paper=LaplaceHParams(epochs=300),
    post_fit=_laplace_post_fit, samples=_laplace_samples))
