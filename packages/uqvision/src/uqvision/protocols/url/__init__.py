"""V.4 — URL: transfer of uncertainty from an upstream to unseen downstream classes
(docs/conventions.md#v-4).

- :mod:`~.heads`: the uncertainty heads (:data:`~.heads.U_HEADS`) and :class:`~.heads.URLModel`,
  a network that gives its own uncertainty (``predicts_uncertainty``, the contract
  :func:`uqvision.predict.predict` relies on);
- :mod:`~.vmf`: von Mises–Fisher sampling and the expected likelihood kernel;
- :mod:`~.crop`: the crop intervention and its prediction mode (``--mode crop``);
- :mod:`~.methods`: the eleven representation learners, registered in
  :data:`~uqvision.training.method.TRAINING_METHODS`;
- :mod:`~.score`: R@1, R-AUROC, crop consistency, human alignment, OOD AUROC
  (``uqvision score --protocol transfer``);
- :mod:`~.reproduce`: ``uqvision reproduce url``.
"""

from __future__ import annotations

import argparse

from ..base import LazyReproduction, Protocol
from . import crop  # noqa: F401  (registers the "crop" prediction mode)
from .methods import REPRESENTATION_METHODS

__all__ = ["DESCRIPTION", "PROTOCOL"]

#: One line: the protocol and its driver (``uqvision reproduce url``).
DESCRIPTION = "URL transfer (V.4): eleven uncertainty-aware representation learners, zero-shot"


def _score(a: argparse.Namespace):
    """URL (V.4): R@1, R-AUROC, crop consistency, human alignment, OOD AUROC per method"""
    from .score import score_transfer_caches  # imported on use

    return score_transfer_caches(a.caches)


#: The URL protocol (registered in :data:`uqvision.protocols.VISION_PROTOCOLS`).
PROTOCOL = Protocol("url", DESCRIPTION, score=_score, score_name="transfer",
                    reproduce=LazyReproduction("url", DESCRIPTION, f"{__name__}.reproduce"),
                    methods=REPRESENTATION_METHODS,
                    smoke_options={"methods": "ce,losspred"})
