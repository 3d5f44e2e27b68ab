"""V.2 — Pitfalls of in-domain uncertainty estimation: ensembles (docs/conventions.md#v-2).

- :mod:`~.score`: metrics vs ensemble size and the Deep Ensemble Equivalent of every method
  (:func:`~.score.score_ensembles`, ``uqvision score --protocol ensembles``); its groups are
  built from the general methods only (:data:`uqvision.methods.GENERAL_METHODS`);
- :mod:`~.plots`: metrics and DEE vs ensemble size (``uqvision plot --ensembles``);
- :mod:`~.reproduce`: ``uqvision reproduce pitfalls``.
"""

from __future__ import annotations

import argparse

from ...options import COUNT, ConfigOption, add_config_options, config_kwargs
from ..base import Protocol
from .reproduce import PITFALLS_METHODS, REPRODUCTION
from .score import ENSEMBLE_METHODS, EnsembleConfig, score_ensembles

__all__ = ["ENSEMBLE_OPTIONS", "PROTOCOL"]


#: The ensembles options of ``uqvision score`` generated from :class:`~.score.EnsembleConfig`
#: (defaults from its fields).
ENSEMBLE_OPTIONS = (
    ConfigOption("members", nargs="+",
                 help="ensembles: the deep ensemble's model names, whatever their method attr "
                      "(default: the caches of method deep_ensemble)"),
    ConfigOption("methods", nargs="+", choices=ENSEMBLE_METHODS.names,
                 help="ensembles: methods (default: every one with caches; a cache's method "
                      "attr decides its group)\n" + ENSEMBLE_METHODS.describe()),
    ConfigOption("n_orders", type=COUNT),
    ConfigOption("reference", choices=ENSEMBLE_METHODS.names,
                 help="ensembles: the method DEE is measured against"),
)


def _add_options(p: argparse.ArgumentParser) -> None:
    add_config_options(p, EnsembleConfig, ENSEMBLE_OPTIONS)


def _score(a: argparse.Namespace):
    """metrics vs ensemble size and the Deep Ensemble Equivalent of every method (V.2)"""
    kw = config_kwargs(a, ENSEMBLE_OPTIONS)
    kw["methods"] = tuple(kw["methods"]) if kw["methods"] else None
    return score_ensembles(a.caches, EnsembleConfig(**kw, seed=a.seed, dataset=a.dataset))


#: The Pitfalls protocol (registered in :data:`uqvision.protocols.VISION_PROTOCOLS`).
PROTOCOL = Protocol("pitfalls", REPRODUCTION.description, score=_score, score_name="ensembles",
                    add_options=_add_options, reproduce=REPRODUCTION,
                    methods=tuple(PITFALLS_METHODS))
