"""Models that return (class logits, uncertainty u, embedding): heads and u functions (V.4).

Defined in :mod:`uqvision.methods.uncertainty_heads` (moved there, issue 41, so that other
protocols build HET-XL, SNGP, loss-prediction and multi-head models without importing this
one); this module keeps the old import path.
"""

from __future__ import annotations

from ...methods.uncertainty_heads import (
    NOISE_KEY,
    U_FUNCTIONS,
    U_HEADS,
    UMLP,
    BatchNoise,
    SampleNoise,
    URLModel,
    entropy_of_logits,
    kappa_mlp,
    nivmf_log_density,
)

__all__ = [
    "NOISE_KEY",
    "UMLP",
    "U_FUNCTIONS",
    "U_HEADS",
    "BatchNoise",
    "SampleNoise",
    "URLModel",
    "entropy_of_logits",
    "kappa_mlp",
    "nivmf_log_density",
]
