"""V.2 — Pitfalls of in-domain uncertainty estimation: ensembles (docs/conventions.md#v-2).

- :mod:`~.score`: metrics vs ensemble size and the Deep Ensemble Equivalent of every method
  (:func:`~.score.score_ensembles`, ``uqvision score --protocol ensembles``); its groups are
  built from the general methods only (:data:`uqvision.methods.GENERAL_METHODS`);
- :mod:`~.plots`: metrics and DEE vs ensemble size (``uqvision plot --ensembles``);
- :mod:`~.reproduce`: ``uqvision reproduce pitfalls``.
"""

from __future__ import annotations

import argparse

from ...options import COUNT
from ..base import Protocol
from .reproduce import PITFALLS_METHODS, REPRODUCTION
from .score import ENSEMBLE_METHODS, EnsembleConfig, score_ensembles

__all__ = ["PROTOCOL"]


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--members", nargs="+", default=None,
                   help="ensembles: the deep ensemble's model names, whatever their method attr "
                        "(default: the caches of method deep_ensemble)")
    p.add_argument("--methods", nargs="+", choices=ENSEMBLE_METHODS.names(), default=None,
                   help="ensembles: methods (default: every one with caches; a cache's "
                        "method attr decides its group)\n" + ENSEMBLE_METHODS.describe())
    p.add_argument("--n-orders", type=COUNT, default=5)
    p.add_argument("--reference", default="deep_ensemble", choices=ENSEMBLE_METHODS.names(),
                   help="ensembles: the method DEE is measured against")


def _score(a: argparse.Namespace):
    """metrics vs ensemble size and the Deep Ensemble Equivalent of every method (V.2)"""
    methods = tuple(a.methods) if a.methods else None
    return score_ensembles(a.caches, EnsembleConfig(members=a.members, n_orders=a.n_orders,
                                                    seed=a.seed, dataset=a.dataset,
                                                    reference=a.reference, methods=methods))


#: The Pitfalls protocol (registered in :data:`uqvision.protocols.VISION_PROTOCOLS`).
PROTOCOL = Protocol("pitfalls", REPRODUCTION.description, score=_score, score_name="ensembles",
                    add_options=_add_options, reproduce=REPRODUCTION,
                    methods=tuple(PITFALLS_METHODS))
