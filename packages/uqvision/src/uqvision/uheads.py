"""Models that return (class logits, uncertainty u, embedding): heads and u functions (V.4).

A :class:`URLModel` is a backbone (a timm model with its classifier removed, giving the
pooled embedding) followed by one head of :data:`HEADS`; the head returns a dict of named
outputs (always ``embedding``; ``logits`` and whatever its u needs), and one function of
:data:`U_FUNCTIONS` turns that dict into u (higher = more uncertain). Training losses
(:mod:`uqvision.methods.representation`) read the same dict.

Output keys (shapes with ``b`` the batch): ``embedding`` (b, d) the backbone output;
``logits`` (b, c) upstream class logits (for averaging heads: log of the mean probability);
``scalar`` (b,) the 3-layer MLP's positive output (a vMF concentration kappa, or a predicted
loss); ``member_logits`` (k, b, c) the logits of k heads / passes / samples; ``gp_var`` (b,) the
GP posterior variance; ``logdet`` (b,) ``log det Sigma(x)`` of a heteroscedastic head.

References
----------
M. Kirchhof, B. Mucsányi, S. J. Oh, E. Kasneci, "URL: A representation learning benchmark for
transferable uncertainty estimates", NeurIPS 2023 Datasets and Benchmarks (appendix B).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from uqmetrics.registry import Registry

from .vmf import elk_sim, sample_vmf

__all__ = ["HEADS", "U_FUNCTIONS", "URLModel", "entropy_of_logits", "kappa_mlp"]

#: Heads: name -> ``builder(embed_dim, n_classes, hp) -> nn.Module`` (forward(emb) -> dict).
HEADS: Registry[Callable[..., nn.Module]] = Registry("uncertainty head")
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


def kappa_mlp(d: int, hidden: int | None = None) -> nn.Sequential:
    """The 3-layer MLP on the embedding with a softplus output (b,) > 0 (URL's u module)."""
    h = hidden or d
    return nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(),
                         nn.Linear(h, 1), nn.Softplus())


class _Linear(nn.Module):
    def __init__(self, d, c, mlp=False, dropout=0.0):
        super().__init__()
        self.fc = nn.Linear(d, c)
        self.mlp = kappa_mlp(d) if mlp else None
        self.dropout = dropout
        self.passes = 10
        self.generator: torch.Generator | None = None

    def forward(self, e):
        out = {"embedding": e}
        if self.dropout > 0 and not self.training:  # MC dropout: k passes of the head
            z = torch.stack([self.fc(_dropout(e, self.dropout, self.generator))
                             for _ in range(self.passes)])
            out.update(member_logits=z, logits=_mean_log_probs(z))
        else:
            out["logits"] = self.fc(F.dropout(e, self.dropout, self.training))
        if self.mlp is not None:
            out["scalar"] = self.mlp(e).squeeze(-1)
        return out


def _dropout(e, p, generator):
    keep = torch.rand(e.shape, generator=generator, device=e.device, dtype=e.dtype) >= p
    return e * keep / (1 - p)


@HEADS.register(name="linear")
def _linear_head(d: int, c: int, hp) -> nn.Module:
    """a linear classifier (CE, InfoNCE's upstream logits)."""
    return _Linear(d, c)


@HEADS.register(name="linear_mlp")
def _linear_mlp_head(d: int, c: int, hp) -> nn.Module:
    """a linear classifier and the 3-layer MLP (MCInfoNCE, HIB, Losspred)."""
    return _Linear(d, c, mlp=True)


@HEADS.register(name="dropout")
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


@HEADS.register(name="ensemble")
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
        self.generator: torch.Generator | None = None

    def class_kappa(self):
        return self.t * self.log_kappa.exp()

    def forward(self, e):
        kappa = self.mlp(e).squeeze(-1)
        mu = F.normalize(e, dim=-1)
        protos = F.normalize(self.mu, dim=-1)
        if self.log_scale is None:
            logits = elk_sim(mu, kappa, protos, self.class_kappa())
        else:
            s = sample_vmf(mu, kappa, self.samples, self.generator)  # (n, b, d)
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


@HEADS.register(name="elk")
def _elk_head(d: int, c: int, hp) -> nn.Module:
    """vMF posterior (3-layer MLP kappa) and vMF class proxies; logits = elk_sim."""
    return _VMFProxies(d, c, hp.t)


@HEADS.register(name="nivmf")
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
        self.generator: torch.Generator | None = None

    def forward(self, e):
        b, d = e.shape
        p = self.cov(e)
        v = p[:, : d * self.rank].reshape(b, self.rank, d)
        diag = F.softplus(p[:, d * self.rank:]) + 1e-6
        g = self.generator
        z1 = torch.randn(self.samples, b, self.rank, generator=g, device=e.device, dtype=e.dtype)
        z2 = torch.randn(self.samples, b, d, generator=g, device=e.device, dtype=e.dtype)
        eps = torch.einsum("sbr,brd->sbd", z1, v) + diag.sqrt() * z2
        z = self.fc(e + eps) / self.log_tau.exp()
        # matrix determinant lemma: det(V^T V + D) = det(D) det(I_r + V D^-1 V^T)
        small = torch.eye(self.rank, device=e.device) + torch.einsum("brd,bqd->brq", v / diag[:, None],
                                                                     v)
        logdet = diag.log().sum(-1) + torch.logdet(small)
        return {"embedding": e, "member_logits": z, "logits": _mean_log_probs(z),
                "logdet": logdet}


@HEADS.register(name="hetxl")
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


@HEADS.register(name="sngp")
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
        A :data:`HEADS` entry's module.
    u : str
        A :data:`U_FUNCTIONS` name.
    """

    def __init__(self, backbone: nn.Module, head: nn.Module, u: str):
        super().__init__()
        U_FUNCTIONS.lookup(u)
        self.backbone, self.head, self.u_name = backbone, head, u
        self.views = 1
        self.views_fn: Callable | None = None  # training: images -> several views (InfoNCE)
        self.generator: torch.Generator | None = None

    def forward(self, x: torch.Tensor) -> dict:
        """The head's dict of outputs (``embedding`` (b, d), ``logits`` (b, c), ...).

        In training mode with ``views_fn`` set, the batch is first replaced by its views
        (``views_fn(x, generator)``, e.g. (2b, ...) for InfoNCE).
        """
        if self.training and self.views_fn is not None:
            x = self.views_fn(x, self.generator)
        return self.head(self.backbone(x))

    def set_generator(self, generator: torch.Generator | None) -> None:
        """Where stochastic heads draw their noise (MC dropout, HET-XL, nivMF)."""
        for m in self.modules():
            if hasattr(m, "generator"):
                m.generator = generator

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logits (b, c), u (b,), embedding (b, d))`` in eval mode."""
        self.eval()
        out = self(x)
        return out["logits"], U_FUNCTIONS.lookup(self.u_name)(out), out["embedding"]
