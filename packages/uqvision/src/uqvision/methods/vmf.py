"""von Mises-Fisher maths of the probabilistic-embedding methods (URL, V.4).

Shapes: ``mu`` (..., m) unit vectors on the sphere S^{m-1}, ``kappa`` (...) concentrations > 0.

- :func:`log_iv` — ``log I_v(x)``, the modified Bessel function of the first kind, stable for the
  large orders of embedding spaces (scipy's scaled ``ive``, with the uniform (Debye) asymptotic
  expansion where ``ive`` underflows); differentiable in ``x`` for torch tensors.
- :func:`vmf_log_normalizer` — ``log C_m(kappa)`` of ``vMF(z; mu, kappa) = C_m(kappa) exp(kappa
  mu^T z)``.
- :func:`elk_sim` — the log expected likelihood kernel between two vMFs (ELK).
- :func:`sample_vmf` — Wood's (1994) rejection sampler, reparameterised as Davidson et al.
  (2018): the accepted proposal is held fixed and ``w`` is differentiable in ``kappa``.

References
----------
.. [1] Wood, "Simulation of the von Mises Fisher distribution", 1994.
.. [2] Davidson et al., "Hyperspherical variational auto-encoders", UAI 2018.
.. [3] Kirchhof et al., "A non-isotropic probabilistic take on proxy-based deep metric
   learning", ECCV 2022 (ELK).
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["elk_sim", "log_iv", "sample_vmf", "vmf_log_normalizer"]


def _log_iv_np(v: float, x: np.ndarray) -> np.ndarray:
    from scipy import special  # imported on first use: registering the URL learners needs none

    x = np.asarray(x, dtype=np.float64)
    shape = x.shape
    x = x.reshape(-1)
    with np.errstate(all="ignore"):
        out = np.log(special.ive(v, x)) + x
    bad = ~np.isfinite(out)
    if bad.any():  # Debye: log I_v(vz) ~ -log(2 pi v)/2 - log(1+z^2)/4 + v eta(z)
        z = x[bad] / v
        r = np.sqrt(1 + z * z)
        out[bad] = -0.5 * np.log(2 * np.pi * v) - 0.5 * np.log(r) + v * (r + np.log(z / (1 + r)))
    return out.reshape(shape)


class _LogIv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, v):
        out = torch.from_numpy(_log_iv_np(v, x.detach().cpu().double().numpy())).to(x)
        ctx.save_for_backward(x, out)
        ctx.v = v
        return out

    @staticmethod
    def backward(ctx, grad):
        x, out = ctx.saved_tensors
        nxt = torch.from_numpy(_log_iv_np(ctx.v + 1, x.detach().cpu().double().numpy())).to(x)
        # I_v'(x) = I_{v+1}(x) + (v / x) I_v(x)
        return grad * (torch.exp(nxt - out) + ctx.v / x), None


def log_iv(v: float, x):
    """``log I_v(x)`` for ``x > 0`` (numpy array or torch tensor; tensors keep the gradient).

    Examples
    --------
    >>> from scipy import special
    >>> round(float(log_iv(0.5, np.array(2.0))), 10) == round(float(np.log(special.iv(0.5, 2.0))), 10)
    True
    """
    if isinstance(x, torch.Tensor):
        return _LogIv.apply(x, float(v))
    return _log_iv_np(float(v), x)


def vmf_log_normalizer(kappa, m: int):
    """``log C_m(kappa)`` of the vMF density on S^{m-1}.

    Notes
    -----
    .. math:: C_m(\\kappa) = \\frac{\\kappa^{m/2-1}}{(2\\pi)^{m/2} I_{m/2-1}(\\kappa)}

    ``kappa`` is clamped at 1e-6 (the uniform limit).
    """
    if m < 2:
        raise ValueError(f"m must be >= 2, got {m!r}")
    v = m / 2 - 1
    if isinstance(kappa, torch.Tensor):
        k = kappa.clamp_min(1e-6)
        return v * torch.log(k) - (m / 2) * math.log(2 * math.pi) - log_iv(v, k)
    k = np.maximum(np.asarray(kappa, dtype=np.float64), 1e-6)
    return v * np.log(k) - (m / 2) * np.log(2 * np.pi) - log_iv(v, k)


def elk_sim(mu1: torch.Tensor, kappa1: torch.Tensor, mu2: torch.Tensor,
            kappa2: torch.Tensor) -> torch.Tensor:
    """Log expected likelihood kernel ``log ∫ vMF(z; mu1, k1) vMF(z; mu2, k2) dz``, all pairs.

    Parameters
    ----------
    mu1 : Tensor, shape (n, m)
        Unit mean directions of the first set (image posteriors).
    kappa1 : Tensor, shape (n,)
    mu2 : Tensor, shape (c, m)
        Unit mean directions of the second set (class proxies).
    kappa2 : Tensor, shape (c,)

    Returns
    -------
    Tensor, shape (n, c)

    Notes
    -----
    .. math:: \\log C_m(\\kappa_1) + \\log C_m(\\kappa_2) - \\log C_m(\\lVert\\kappa_1\\mu_1 +
       \\kappa_2\\mu_2\\rVert)
    """
    m = mu1.shape[-1]
    joint = torch.linalg.vector_norm(kappa1[:, None, None] * mu1[:, None, :]
                                     + kappa2[None, :, None] * mu2[None, :, :], dim=-1)
    return (vmf_log_normalizer(kappa1, m)[:, None] + vmf_log_normalizer(kappa2, m)[None, :]
            - vmf_log_normalizer(joint, m))


def sample_vmf(mu: torch.Tensor, kappa: torch.Tensor, n: int,
               generator: torch.Generator | None = None, max_rounds: int = 1000) -> torch.Tensor:
    """``n`` samples of ``vMF(mu_b, kappa_b)`` for every row ``b``, differentiable in both.

    Parameters
    ----------
    mu : Tensor, shape (b, m)
        Unit mean directions.
    kappa : Tensor, shape (b,)
    n : int
        Samples per row.
    generator : torch.Generator, optional
        The only randomness used (default: the global RNG).

    Returns
    -------
    Tensor, shape (n, b, m)
        Unit vectors.
    """
    b, m = mu.shape
    if m < 2:
        raise ValueError(f"mu must have at least 2 features, got shape {tuple(mu.shape)}")
    dev, dt = mu.device, mu.dtype
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device="cpu").item()
               if generator is None or generator.device.type == "cpu"
               else torch.randint(0, 2**62, (1,), generator=generator, device=dev).item())
    rng = np.random.default_rng(seed)
    k = kappa.detach().double().cpu().numpy().clip(1e-6)[None, :].repeat(n, 0)
    sq = np.sqrt(4 * k * k + (m - 1) ** 2)
    bb = (m - 1) / (2 * k + sq)
    a = ((m - 1) + 2 * k + sq) / 4
    d = 4 * a * bb / (1 + bb) - (m - 1) * np.log(m - 1)
    eps = np.empty((n, b))
    todo = np.ones((n, b), dtype=bool)
    for _ in range(max_rounds):
        cnt = int(todo.sum())
        if cnt == 0:
            break
        e = rng.beta((m - 1) / 2, (m - 1) / 2, size=cnt)
        u = rng.uniform(size=cnt)
        bt, at, dt_ = bb[todo], a[todo], d[todo]
        t = 2 * at * bt / (1 - (1 - bt) * e)
        ok = (m - 1) * np.log(t) - t + dt_ >= np.log(u)
        idx = np.flatnonzero(todo)[ok]
        eps.flat[idx] = e[ok]
        todo.flat[idx] = False
    if todo.any():
        raise RuntimeError("vMF rejection sampler did not accept within max_rounds")
    eps_t = torch.as_tensor(eps, dtype=dt, device=dev)
    kt = kappa.clamp_min(1e-6)[None, :].to(dt)
    bt = (m - 1) / (2 * kt + torch.sqrt(4 * kt * kt + (m - 1) ** 2))
    w = (1 - (1 + bt) * eps_t) / (1 - (1 - bt) * eps_t)  # (n, b), differentiable in kappa
    v = torch.as_tensor(rng.standard_normal((n, b, m - 1)), dtype=dt, device=dev)
    v = v / torch.linalg.vector_norm(v, dim=-1, keepdim=True)
    s = torch.cat([w[..., None], torch.sqrt((1 - w * w).clamp_min(0))[..., None] * v], dim=-1)
    # Householder reflection mapping e1 to mu
    e1 = torch.zeros(m, dtype=dt, device=dev)
    e1[0] = 1
    h = e1[None, :] - mu  # (b, m)
    hn = (h * h).sum(-1, keepdim=True)
    refl = torch.where(hn > 1e-12, 2 * (s * h).sum(-1, keepdim=True) / hn.clamp_min(1e-12),
                       torch.zeros_like(hn))
    return s - refl * h
