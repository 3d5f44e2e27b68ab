"""Approximate Bayesian methods: SWAG, cyclical SGLD, variational inference and K-FAC Laplace,
as :class:`~uqvision.training.method.TrainingMethod` entries, one module each
(:mod:`~uqvision.methods.swag`, :mod:`~uqvision.methods.csgld`, :mod:`~uqvision.methods.vi`,
:mod:`~uqvision.methods.laplace`); importing this module registers them in that order, and
re-exports their public names.

All four share Pitfalls' probabilistic model (eqs. 6-9): the softmax likelihood and the prior
``N(0, (N wd)^-1 I)`` implied by the weight decay ``wd`` on ``N`` training examples. Epoch
counts are the paper's CIFAR values / 10 (``method.paper`` has the paper's own).

References
----------
.. [1] Ashukha et al. Pitfalls of in-domain uncertainty estimation and ensembling in deep
   learning. ICLR 2020, appendix B.
.. [2] Maddox et al. A simple baseline for Bayesian uncertainty in deep learning. NeurIPS 2019.
.. [3] Zhang et al. Cyclical stochastic gradient MCMC for Bayesian deep learning. ICLR 2020.
.. [4] Kingma, Salimans, Welling. Variational dropout and the local reparameterization trick.
   NeurIPS 2015.
.. [5] Ritter, Botev, Barber. A scalable Laplace approximation for neural networks. ICLR 2018.
.. [6] Martens, Grosse. Optimizing neural networks with Kronecker-factored approximate
   curvature. ICML 2015 (the pi-corrected damping, section 6.3).
"""

from __future__ import annotations

# isort: off
from .swag import SWAGHParams, swag_moments  # registers "swag" (the paper's order)
from .csgld import CSGLD_TEMPERATURE_RULES, CSGLDHParams, csgld_temperature  # "csgld"
from .vi import PerSampleVINoise, VIConv2d, VIHParams, VILinear, variational_layers  # "vi"
from .laplace import LaplaceHParams, kfac_factors, search_scale  # "kfac_laplace"
# isort: on

__all__ = [
    "CSGLD_TEMPERATURE_RULES",
    "CSGLDHParams",
    "LaplaceHParams",
    "PerSampleVINoise",
    "SWAGHParams",
    "VIConv2d",
    "VIHParams",
    "VILinear",
    "csgld_temperature",
    "kfac_factors",
    "search_scale",
    "swag_moments",
    "variational_layers",
]
