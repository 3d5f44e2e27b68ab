"""The eleven URL representation learners (V.4) as :data:`TRAINING_METHODS` entries.

Defined and registered in :mod:`uqvision.methods.representation` (the recipe, the
hyper-parameters, the losses of the paper's appendix B and the registrations, moved there in
issue 41 so that other protocols train HET-XL, SNGP, loss prediction and the 10-head ensemble
without importing this one); the heads are in :mod:`uqvision.methods.uncertainty_heads`.
Importing this module registers them (:attr:`uqvision.protocols.base.Protocol.registers`) and
keeps the old import path; :data:`REPRESENTATION_METHODS` is the protocol's list, in the
paper's order.
"""

from __future__ import annotations

from ...methods.representation import (
    Accumulating,
    ELKHParams,
    EnsembleHParams,
    HetXLHParams,
    HIBHParams,
    LosspredHParams,
    MCDropoutHParams,
    SampledHParams,
    SNGPHParams,
    TemperatureHParams,
    URLHParams,
    build_model,
    hib_loss,
    hib_match_probability,
    infonce_loss,
    two_views,
    warmup_cosine_lr,
)
from . import REPRESENTATION_METHODS

__all__ = [
    "REPRESENTATION_METHODS",
    "Accumulating",
    "ELKHParams",
    "EnsembleHParams",
    "HIBHParams",
    "HetXLHParams",
    "LosspredHParams",
    "MCDropoutHParams",
    "SNGPHParams",
    "SampledHParams",
    "TemperatureHParams",
    "URLHParams",
    "build_model",
    "hib_loss",
    "hib_match_probability",
    "infonce_loss",
    "two_views",
    "warmup_cosine_lr",
]
