"""DUE (van Amersfoort et al. 2021): a spectral-normalised featurizer and a sparse variational
GP head (gpytorch), as the ``due`` entry of :data:`~uqvision.training.method.TRAINING_METHODS`
(trained by UIMNET, V.3, and any protocol that needs it), on a
:class:`~uqvision.methods.feature.FeatureClassifier`.

References
----------
.. [1] van Amersfoort et al. On feature collapse and deep kernel learning for single forward
   pass uncertainty (DUE). 2021.
.. [2] Miyato et al. Spectral normalization for generative adversarial networks. ICLR 2018.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

from ..models.spectral import spectral_normalize
from ..training.method import TrainState, check_fields
from .feature import FeatureClassifier, OODRecipe, feature_classifier, register_feature_method

__all__ = ["DUEHParams", "DUENet"]


# -- DUE -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DUEHParams(OODRecipe):
    """``inducing``: inducing points of the sparse variational GP; ``coeff``: the featurizer's
    spectral-norm bound; ``likelihood_samples``: Monte-Carlo samples of the softmax likelihood
    at prediction."""

    inducing: int = 20
    coeff: float = 5.0
    likelihood_samples: int = 32
    lr_init: float = 0.05

    def __post_init__(self):
        super().__post_init__()
        check_fields(self, positive=("inducing", "coeff", "likelihood_samples"))


def _gpytorch():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import gpytorch  # heavy: imported on first use (start-up time)
    return gpytorch


def _gp_class():
    gpytorch = _gpytorch()

    class _GP(gpytorch.models.ApproximateGP):
        """One independent sparse variational GP per class over the features (DUE's GP)."""

        def __init__(self, num_features: int, num_classes: int, inducing: int):
            batch = torch.Size([num_classes])
            dist = gpytorch.variational.CholeskyVariationalDistribution(inducing,
                                                                        batch_shape=batch)
            strategy = gpytorch.variational.IndependentMultitaskVariationalStrategy(
                gpytorch.variational.VariationalStrategy(
                    self, torch.randn(inducing, num_features), dist,
                    learn_inducing_locations=True),
                num_tasks=num_classes)
            super().__init__(strategy)
            self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
            self.covar_module = gpytorch.kernels.ScaleKernel(
                gpytorch.kernels.RBFKernel(batch_shape=batch), batch_shape=batch)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x),
                                                             self.covar_module(x))

    return _GP


class DUENet(nn.Module):
    """Spectral-normalised featurizer + sparse variational GP head with a softmax likelihood
    (gpytorch). Training forward returns the GP's distribution (the loss is −ELBO); eval
    forward returns ``log E[softmax(f)]`` (:meth:`predictive`). ``native``: the GP's predictive
    variance summed over classes. The inducing points start at the features of the first
    training batch (DUE initialises them by k-means of training features)."""

    def __init__(self, base: FeatureClassifier, hp: DUEHParams):
        super().__init__()
        gpytorch = _gpytorch()
        self.base = spectral_normalize(base, hp.coeff)
        self.gp = _gp_class()(base.num_features, base.num_classes, hp.inducing)
        # no mixing weights: None (gpytorch before 1.14 took False for True, as it is not None)
        self.likelihood = gpytorch.likelihoods.SoftmaxLikelihood(
            num_classes=base.num_classes, mixing_weights=None)
        self.register_buffer("initialised", torch.tensor(False))
        self.samples = hp.likelihood_samples

    def features(self, x):
        return self.base.features(x)

    def _init_inducing(self, phi: torch.Tensor) -> None:
        strategy = self.gp.variational_strategy.base_variational_strategy
        n = strategy.inducing_points.shape[0]
        idx = torch.arange(n, device=phi.device) % phi.shape[0]
        with torch.no_grad():
            pts = phi.detach()[idx] + 1e-3 * torch.randn(n, phi.shape[1], device=phi.device)
            strategy.inducing_points.copy_(pts)
            scale = torch.cdist(phi.detach(), phi.detach()).mean().clamp(min=1e-3)
            self.gp.covar_module.base_kernel.lengthscale = scale
        self.initialised.fill_(True)

    def forward(self, x):
        phi = self.base.features(x)
        if self.training:
            if not bool(self.initialised):
                self._init_inducing(phi)
            return self.gp(phi)
        return torch.log(self.predictive(phi).clamp_min(1e-12))

    def predictive(self, phi: torch.Tensor) -> torch.Tensor:
        """``E[softmax(f)]``, shape (n, C), f ~ the GP's marginal N(μ(φ), σ²(φ)) per class
        (independent GPs, no mixing weights: what gpytorch's ``SoftmaxLikelihood`` samples),
        by Monte Carlo over ``samples`` standard-normal draws fixed once and shared by every
        image (common random numbers): an image's prediction depends on nothing but the image,
        whatever the batch, the process or the global RNG."""
        dist = self.gp(phi)
        mu, sd = dist.mean, dist.variance.sqrt()
        gen = torch.Generator().manual_seed(0)
        eps = torch.randn(self.samples, mu.shape[-1], generator=gen).to(mu)
        return torch.softmax(mu + sd * eps[:, None, :], -1).mean(0)

    @torch.no_grad()
    def native(self, x):
        return self.gp(self.base.features(x)).variance.sum(-1)


def _due_loss(state: TrainState, out, y):
    gpytorch = _gpytorch()
    net = state.net
    elbo = gpytorch.mlls.VariationalELBO(net.likelihood, net.gp, num_data=state.n_train)
    return -elbo(out, y)

register_feature_method("due", "spectral-normalised featurizer + sparse variational GP head "
                        "(gpytorch); native: GP predictive variance", DUEHParams,
                        wrap_model=lambda model, hp: DUENet(feature_classifier(model), hp),
                        loss=_due_loss)
