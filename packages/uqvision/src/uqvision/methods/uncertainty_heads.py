"""Models that return (class logits, uncertainty u, embedding): heads and u functions (URL's,
V.4; shared by any protocol that trains :mod:`uqvision.methods.representation`'s learners).

A :class:`URLModel` is a backbone (a timm model with its classifier removed, giving the
pooled embedding) followed by one head of :data:`U_HEADS`; the head returns a dict of named
outputs (always ``embedding``; ``logits`` and whatever its u needs), and one function of
:data:`U_FUNCTIONS` turns that dict into u (higher = more uncertain). Training losses
(:mod:`uqvision.methods.representation`) read the same dict.

Output keys (shapes with ``b`` the batch): ``embedding`` (b, d) the backbone output;
``logits`` (b, c) upstream class logits (for averaging heads: log of the mean probability);
``scalar`` (b,) the 3-layer MLP's positive output (a vMF concentration kappa, or a predicted
loss); ``member_logits`` (k, b, c) the logits of k heads / passes / samples; ``gp_var`` (b,) the
GP posterior variance; ``logdet`` (b,) ``log det Sigma(x)`` of a heteroscedastic head.

Noise of the stochastic heads (MC dropout, HET-XL, nivMF) comes from a noise source:
:class:`BatchNoise` in training (one generator for the whole batch, the run's), and
:class:`SampleNoise` in :meth:`URLModel.predict` with ``sample_ids``: every example draws from
its own generator seeded by ``(seed, example id)``, so its u and logits do not depend on the
batch size, on the other examples of the batch or on torchrun sharding (what
:mod:`uqvision.predict` promises for every cache).

The uncertainty module's start value (URL's "warm-up of kappa to 0.001", ``u_start``): before
the first training step, the 3-layer MLP's output is rescaled by a constant so that the mean
uncertainty it expresses — 1/kappa for the vMF methods, the predicted loss for Losspred — on
the first training batch is ``u_start`` (:meth:`URLModel.calibrate_u`).

References
----------
M. Kirchhof, B. Mucsányi, S. J. Oh, E. Kasneci, "URL: A representation learning benchmark for
transferable uncertainty estimates", NeurIPS 2023 Datasets and Benchmarks (appendix B).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from uqmetrics.metrics.registry import Registry

from ..data import derive_seed
from .vmf import elk_sim, sample_vmf

__all__ = [
    "UMLP",
    "U_FUNCTIONS",
    "U_HEADS",
    "BatchNoise",
    "SampleNoise",
    "URLModel",
    "entropy_of_logits",
    "kappa_mlp",
]

#: Heads: name -> ``builder(embed_dim, n_classes, hp) -> nn.Module`` (forward(emb) -> dict).
U_HEADS: Registry[Callable[..., nn.Module]] = Registry("uncertainty head")
#: u functions: name -> ``f(outputs: dict) -> Tensor (b,)``, higher = more uncertain.
U_FUNCTIONS: Registry[Callable[[dict], torch.Tensor]] = Registry("uncertainty function")


def entropy_of_logits(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of ``softmax(logits)`` along the last axis."""
    logp = F.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def _mean_log_probs(member_logits: torch.Tensor) -> torch.Tensor:
    """``log mean_k softmax(z_k)``, shape (b, c), from (k, b, c)."""
    return torch.logsumexp(F.log_softmax(member_logits, -1), 0) - math.log(member_logits.shape[0])


@U_FUNCTIONS.register(name="class_entropy")
def _class_entropy(out: dict) -> torch.Tensor:
    """entropy of the class probabilities H(P(Y|x)) (CE, SNGP, HET-XL, ensembles)."""
    return entropy_of_logits(out["logits"])


@U_FUNCTIONS.register(name="inverse_norm")
def _inverse_norm(out: dict) -> torch.Tensor:
    """1 / ||e(x)|| of the unnormalised embedding (InfoNCE)."""
    return 1 / torch.linalg.vector_norm(out["embedding"], dim=-1).clamp_min(1e-12)


@U_FUNCTIONS.register(name="inverse_kappa")
def _inverse_kappa(out: dict) -> torch.Tensor:
    """1 / kappa(x), kappa the predicted vMF concentration (MCInfoNCE, ELK, nivMF, HIB)."""
    return 1 / out["scalar"].clamp_min(1e-12)


@U_FUNCTIONS.register(name="predicted_loss")
def _predicted_loss(out: dict) -> torch.Tensor:
    """the 3-layer MLP's prediction of the cross-entropy loss (Losspred)."""
    return out["scalar"]


@U_FUNCTIONS.register(name="gp_variance")
def _gp_variance(out: dict) -> torch.Tensor:
    """the GP posterior variance phi^T (I + Phi^T Phi)^-1 phi (SNGP)."""
    return out["gp_var"]


@U_FUNCTIONS.register(name="covariance_logdet")
def _covariance_logdet(out: dict) -> torch.Tensor:
    """log det Sigma(x) of the predicted embedding covariance (HET-XL)."""
    return out["logdet"]


@U_FUNCTIONS.register(name="jensen_shannon")
def _jensen_shannon(out: dict) -> torch.Tensor:
    """Jensen-Shannon divergence of k samples: H(mean_k p_k) - mean_k H(p_k)."""
    z = out["member_logits"]
    return entropy_of_logits(_mean_log_probs(z)) - entropy_of_logits(z).mean(0)


class UMLP(nn.Sequential):
    """The 3-layer MLP on the embedding with a softplus output, times a constant ``scale``.

    ``forward(e)`` maps (b, d) to (b, 1) > 0. ``scale`` (a buffer, 1 until
    :meth:`URLModel.calibrate_u` sets it; saved with the weights) is URL's start value of the
    uncertainty module (the official code's ``unc_scaler``); ``calibrated`` records whether it
    was set.
    """

    def __init__(self, d: int, hidden: int | None = None):
        h = hidden or d
        super().__init__(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(),
                         nn.Linear(h, 1), nn.Softplus())
        self.register_buffer("scale", torch.ones(()))
        self.register_buffer("calibrated", torch.zeros((), dtype=torch.bool))

    def forward(self, e: torch.Tensor) -> torch.Tensor:
        return super().forward(e) * self.scale

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # checkpoints written before the start value existed: scale 1, not calibrated
        state_dict.setdefault(prefix + "scale", torch.ones(()))
        state_dict.setdefault(prefix + "calibrated", torch.zeros((), dtype=torch.bool))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def kappa_mlp(d: int, hidden: int | None = None) -> UMLP:
    """The 3-layer MLP on the embedding with a softplus output (b, 1) > 0 (URL's u module)."""
    return UMLP(d, hidden)


#: Key mixed into the per-example noise seeds (keeps them apart from the crop fractions'
#: ``derive_seed(seed, i)`` streams).
NOISE_KEY = 0x55524C  # "URL"


class BatchNoise:
    """Noise for a whole batch from one generator (``None``: torch's global RNG).

    ``rand``/``randn`` take the full shape, batch axis included; ``vmf`` samples
    :func:`uqvision.methods.vmf.sample_vmf` of every row.
    """

    def __init__(self, generator: torch.Generator | None = None):
        self.generator = generator

    def rand(self, shape, batch_dim: int, like: torch.Tensor) -> torch.Tensor:
        return torch.rand(shape, generator=self.generator, device=like.device, dtype=like.dtype)

    def randn(self, shape, batch_dim: int, like: torch.Tensor) -> torch.Tensor:
        return torch.randn(shape, generator=self.generator, device=like.device, dtype=like.dtype)

    def vmf(self, mu: torch.Tensor, kappa: torch.Tensor, n: int) -> torch.Tensor:
        return sample_vmf(mu, kappa, n, self.generator)


class SampleNoise(BatchNoise):
    """Noise drawn per example: example ``i`` of the batch draws from its own generator, seeded
    by ``derive_seed(seed, NOISE_KEY, sample_ids[i])``.

    The draws of one example depend only on ``(seed, its id)`` and the order of the draws inside
    one forward pass, never on the batch it is in.

    Parameters
    ----------
    seed : int
    sample_ids : sequence of int, shape (b,)
        The examples' data-set indices, in batch order.
    device : str or torch.device
    """

    def __init__(self, seed: int, sample_ids, device):
        super().__init__(None)
        self.generators = [torch.Generator(device=device).manual_seed(
            derive_seed(seed, NOISE_KEY, int(i))) for i in sample_ids]

    def _each(self, f, shape, batch_dim, like):
        shape = list(shape)
        if shape[batch_dim] != len(self.generators):
            raise ValueError(f"noise for {shape[batch_dim]} examples asked of a source with "
                             f"{len(self.generators)} sample ids")
        del shape[batch_dim]
        return torch.stack([f(shape, generator=g, device=like.device, dtype=like.dtype)
                            for g in self.generators], dim=batch_dim)

    def rand(self, shape, batch_dim: int, like: torch.Tensor) -> torch.Tensor:
        return self._each(torch.rand, shape, batch_dim, like)

    def randn(self, shape, batch_dim: int, like: torch.Tensor) -> torch.Tensor:
        return self._each(torch.randn, shape, batch_dim, like)

    def vmf(self, mu: torch.Tensor, kappa: torch.Tensor, n: int) -> torch.Tensor:
        return torch.cat([sample_vmf(mu[i:i + 1], kappa[i:i + 1], n, g)
                          for i, g in enumerate(self.generators)], dim=1)


class _Linear(nn.Module):
    def __init__(self, d, c, mlp=False, dropout=0.0):
        super().__init__()
        self.fc = nn.Linear(d, c)
        self.mlp = kappa_mlp(d) if mlp else None
        self.dropout = dropout
        self.passes = 10
        self.noise = BatchNoise()

    def forward(self, e):
        out = {"embedding": e}
        if self.dropout > 0 and not self.training:  # MC dropout: k passes of the head
            z = torch.stack([self.fc(_dropout(e, self.dropout, self.noise))
                             for _ in range(self.passes)])
            out.update(member_logits=z, logits=_mean_log_probs(z))
        else:
            out["logits"] = self.fc(F.dropout(e, self.dropout, self.training))
        if self.mlp is not None:
            out["scalar"] = self.mlp(e).squeeze(-1)
        return out


def _dropout(e, p, noise: BatchNoise):
    keep = noise.rand(e.shape, 0, e) >= p
    return e * keep / (1 - p)


@U_HEADS.register(name="linear")
def _linear_head(d: int, c: int, hp) -> nn.Module:
    """a linear classifier (CE, InfoNCE's upstream logits)."""
    return _Linear(d, c)


@U_HEADS.register(name="linear_mlp")
def _linear_mlp_head(d: int, c: int, hp) -> nn.Module:
    """a linear classifier and the 3-layer MLP (MCInfoNCE, HIB, Losspred)."""
    return _Linear(d, c, mlp=True)


@U_HEADS.register(name="dropout")
def _dropout_head(d: int, c: int, hp) -> nn.Module:
    """dropout (rate hp.dropout) before a linear classifier; eval: hp.passes MC passes."""
    head = _Linear(d, c, dropout=hp.dropout)
    head.passes = hp.passes
    return head


class _Ensemble(nn.Module):
    def __init__(self, d, c, k):
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(d, c) for _ in range(k))

    def forward(self, e):
        z = torch.stack([h(e) for h in self.heads])
        return {"embedding": e, "member_logits": z, "logits": _mean_log_probs(z)}


@U_HEADS.register(name="ensemble")
def _ensemble_head(d: int, c: int, hp) -> nn.Module:
    """hp.heads linear classifiers on the shared embedding, probabilities averaged."""
    return _Ensemble(d, c, hp.heads)


class _VMFProxies(nn.Module):
    """Class proxies rho_c = vMF(mu_c, t * kappa_c) (ELK) or non-isotropic vMFs (nivMF)."""

    def __init__(self, d, c, t, non_isotropic=False, samples=16):
        super().__init__()
        self.mlp = kappa_mlp(d)
        self.mu = nn.Parameter(torch.randn(c, d) / math.sqrt(d))
        self.log_kappa = nn.Parameter(torch.zeros(c))
        self.log_scale = nn.Parameter(torch.zeros(c, d)) if non_isotropic else None
        self.t, self.samples = float(t), int(samples)
        self.noise = BatchNoise()

    def class_kappa(self):
        return self.t * self.log_kappa.exp()

    def forward(self, e):
        kappa = self.mlp(e).squeeze(-1)
        mu = F.normalize(e, dim=-1)
        protos = F.normalize(self.mu, dim=-1)
        if self.log_scale is None:
            logits = elk_sim(mu, kappa, protos, self.class_kappa())
        else:
            s = self.noise.vmf(mu, kappa, self.samples)  # (n, b, d)
            logits = nivmf_log_density(s, protos, self.class_kappa(), self.log_scale.exp())
            logits = torch.logsumexp(logits, 0) - math.log(self.samples)
        return {"embedding": e, "scalar": kappa, "logits": logits}


def nivmf_log_density(z: torch.Tensor, mu: torch.Tensor, kappa: torch.Tensor,
                      scale: torch.Tensor) -> torch.Tensor:
    """Unnormalised log density of the non-isotropic class vMFs at points ``z``.

    Parameters
    ----------
    z : Tensor, shape (..., b, d)
    mu : Tensor, shape (c, d), unit
    kappa : Tensor, shape (c,)
    scale : Tensor, shape (c, d), positive per-axis scales

    Returns
    -------
    Tensor, shape (..., b, c)

    Notes
    -----
    **Decision** (the paper does not print the density):
    ``log rho_c(z) = kappa_c mu_c^T (a_c * z) / ||a_c * z||`` — a vMF in a per-class,
    per-axis rescaled space, so its spread differs along each axis; the normaliser (no closed
    form) is left out, which makes it a proxy-NCA logit with learned per-axis metrics.
    """
    az = z[..., None, :] * scale  # (..., b, c, d)
    return kappa * (F.normalize(az, dim=-1) * mu).sum(-1)


@U_HEADS.register(name="elk")
def _elk_head(d: int, c: int, hp) -> nn.Module:
    """vMF posterior (3-layer MLP kappa) and vMF class proxies; logits = elk_sim."""
    return _VMFProxies(d, c, hp.t)


@U_HEADS.register(name="nivmf")
def _nivmf_head(d: int, c: int, hp) -> nn.Module:
    """vMF posterior and non-isotropic vMF class proxies; logits = MC expected likelihood."""
    return _VMFProxies(d, c, hp.t, non_isotropic=True, samples=hp.samples)


class _HetXL(nn.Module):
    """N(phi(x), V(x)^T V(x) + diag d(x)) in the embedding, MC softmax with learnt temperature."""

    def __init__(self, d, c, rank, samples):
        super().__init__()
        self.fc = nn.Linear(d, c)
        self.cov = nn.Linear(d, d * (rank + 1))
        self.log_tau = nn.Parameter(torch.zeros(()))
        self.rank, self.samples = int(rank), int(samples)
        self.noise = BatchNoise()

    def forward(self, e):
        b, d = e.shape
        p = self.cov(e)
        v = p[:, : d * self.rank].reshape(b, self.rank, d)
        diag = F.softplus(p[:, d * self.rank:]) + 1e-6
        z1 = self.noise.randn((self.samples, b, self.rank), 1, e)
        z2 = self.noise.randn((self.samples, b, d), 1, e)
        eps = torch.einsum("sbr,brd->sbd", z1, v) + diag.sqrt() * z2
        z = self.fc(e + eps) / self.log_tau.exp()
        # matrix determinant lemma: det(V^T V + D) = det(D) det(I_r + V D^-1 V^T)
        small = torch.eye(self.rank, device=e.device) + torch.einsum("brd,bqd->brq", v / diag[:, None],
                                                                     v)
        logdet = diag.log().sum(-1) + torch.logdet(small)
        return {"embedding": e, "member_logits": z, "logits": _mean_log_probs(z),
                "logdet": logdet}


@U_HEADS.register(name="hetxl")
def _hetxl_head(d: int, c: int, hp) -> nn.Module:
    """HET-XL's low-rank Gaussian embedding noise and MC-averaged tempered softmax."""
    return _HetXL(d, c, hp.rank, hp.samples)


class _SNGP(nn.Module):
    """Random-feature GP output layer with a Laplace precision over the training features."""

    def __init__(self, d, c, features, ridge, layer_norm):
        super().__init__()
        self.norm = nn.LayerNorm(d) if layer_norm else nn.Identity()
        self.register_buffer("w", torch.randn(features, d))
        self.register_buffer("b", torch.rand(features) * 2 * math.pi)
        self.beta = nn.Linear(features, c, bias=False)
        self.register_buffer("precision", ridge * torch.eye(features))
        self.register_buffer("covariance", torch.eye(features) / ridge)
        self.ridge = ridge
        self.collect = False

    def features(self, e):
        h = self.norm(e)
        return math.sqrt(2 / self.w.shape[0]) * torch.cos(h @ self.w.T + self.b)

    def forward(self, e):
        phi = self.features(e)
        mean = self.beta(phi)
        if self.collect:
            self.precision += phi.detach().T @ phi.detach()
        var = ((phi @ self.covariance) * phi).sum(-1)
        out = {"embedding": e, "gp_var": var}
        # mean field: logits / sqrt(1 + pi/8 var) at test time; the mean in training
        out["logits"] = mean if self.training else mean / torch.sqrt(1 + math.pi / 8 * var)[:, None]
        return out

    def reset_precision(self):
        self.precision.copy_(self.ridge * torch.eye(self.precision.shape[0],
                                                    device=self.precision.device))

    def finalize(self):
        self.covariance.copy_(torch.linalg.inv(self.precision))


@U_HEADS.register(name="sngp")
def _sngp_head(d: int, c: int, hp) -> nn.Module:
    """SNGP: cos random features, beta, precision I + Phi^T Phi of the last training epoch."""
    return _SNGP(d, c, hp.features, hp.ridge, hp.layer_norm)


class URLModel(nn.Module):
    """A backbone with an uncertainty head: ``predict(x) -> (logits, u, embedding)``.

    Parameters
    ----------
    backbone : nn.Module
        Maps images (b, 3, H, W) to embeddings (b, d) (a timm model with ``num_classes=0``).
    head : nn.Module
        A :data:`U_HEADS` entry's module.
    u : str
        A :data:`U_FUNCTIONS` name.
    u_start : float
        Start value of the uncertainty module (its 3-layer MLP, if the head has one): 0 keeps
        its random initialisation; > 0 rescales it on the first training forward
        (:meth:`calibrate_u`).
    scalar_u : {1, -1}
        How the MLP's output expresses uncertainty: 1 it is u (a predicted loss), -1 it is a
        concentration kappa = 1/u.
    """

    #: the capability :data:`uqvision.predict.OWN_UNCERTAINTY` names: :meth:`predict` gives
    #: ``(logits, u, embedding)``
    predicts_uncertainty = True

    def __init__(self, backbone: nn.Module, head: nn.Module, u: str, *, u_start: float = 0.0,
                 scalar_u: int = -1):
        super().__init__()
        U_FUNCTIONS.lookup(u)
        if not u_start >= 0:
            raise ValueError(f"u_start must be >= 0, got {u_start!r}")
        if scalar_u not in (1, -1):
            raise ValueError(f"scalar_u must be 1 or -1, got {scalar_u!r}")
        self.backbone, self.head, self.u_name = backbone, head, u
        self.u_start, self.scalar_u = float(u_start), int(scalar_u)
        self.views = 1
        self.views_fn: Callable | None = None  # training: images -> several views (InfoNCE)
        self.generator: torch.Generator | None = None

    @property
    def u_module(self) -> UMLP | None:
        """The head's uncertainty MLP (None for heads without one)."""
        return getattr(self.head, "mlp", None)

    def forward(self, x: torch.Tensor) -> dict:
        """The head's dict of outputs (``embedding`` (b, d), ``logits`` (b, c), ...).

        In training mode with ``views_fn`` set, the batch is first replaced by its views
        (``views_fn(x, generator)``, e.g. (2b, ...) for InfoNCE). The first training forward
        with ``u_start > 0`` first calibrates the uncertainty module on ``x``
        (:meth:`calibrate_u`).
        """
        mlp = self.u_module
        if self.training and self.u_start > 0 and mlp is not None and not bool(mlp.calibrated):
            self.calibrate_u(x)
        if self.training and self.views_fn is not None:
            x = self.views_fn(x, self.generator)
        return self.head(self.backbone(x))

    @torch.no_grad()
    def calibrate_u(self, x: torch.Tensor) -> float:
        """Set the uncertainty MLP's ``scale`` so that its mean uncertainty on ``x`` is
        ``u_start``; returns the scale.

        The images ``x`` (b, 3, H, W) run in eval mode without gradients (the official code's
        ``initialize_avg_uncertainty``); no parameter changes, only the ``scale`` buffer.
        Under ``torch.distributed`` the mean is over every rank's batch.

        Notes
        -----
        With ``m`` the MLP's outputs at scale 1 and ``p = scalar_u``, the uncertainty is
        ``(s m)^p``; ``s = (u_start / mean(m^p))^p`` makes its mean ``u_start``.
        **Decision**: the official code averages 10 training batches before training; here
        the first training batch (the hook every training loop passes through).
        """
        mlp = self.u_module
        if mlp is None:
            raise ValueError("calibrate_u needs a head with an uncertainty MLP")
        if not self.u_start > 0:
            raise ValueError(f"calibrate_u needs u_start > 0, got {self.u_start!r}")
        was = self.training
        self.eval()
        try:
            mlp.scale.fill_(1.0)
            m = mlp(self.backbone(x)).squeeze(-1).double()
            total = torch.stack([(m ** self.scalar_u).sum(), m.new_tensor(float(m.numel()))])

            if dist.is_available() and dist.is_initialized():
                dist.all_reduce(total)
            mean = float(total[0] / total[1])
            scale = (self.u_start / mean) ** self.scalar_u
            mlp.scale.fill_(scale)
            mlp.calibrated.fill_(True)
        finally:
            self.train(was)
        return scale

    def set_generator(self, generator: torch.Generator | None) -> None:
        """Where stochastic heads draw their noise (MC dropout, HET-XL, nivMF), for the whole
        batch (:class:`BatchNoise`); also the training views' generator."""
        self.generator = generator
        self._set_noise(BatchNoise(generator))

    def _set_noise(self, noise: BatchNoise) -> list:
        old = []
        for m in self.modules():
            if hasattr(m, "noise"):
                old.append((m, m.noise))
                m.noise = noise
        return old

    @torch.no_grad()
    def predict(self, x: torch.Tensor, sample_ids=None, seed: int = 0,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logits (b, c), u (b,), embedding (b, d))`` in eval mode.

        Parameters
        ----------
        x : Tensor, shape (b, 3, H, W)
        sample_ids : sequence of int, shape (b,), optional
            The examples' data-set indices: stochastic heads then draw each example's noise
            from ``(seed, id)`` (:class:`SampleNoise`), independent of batching. Without them,
            the noise source :meth:`set_generator` set (default: the global RNG).
        seed : int
        """
        self.eval()
        if sample_ids is None:
            out = self(x)
        else:
            old = self._set_noise(SampleNoise(seed, sample_ids, x.device))
            try:
                out = self(x)
            finally:
                for m, noise in old:
                    m.noise = noise
        return out["logits"], U_FUNCTIONS.lookup(self.u_name)(out), out["embedding"]
