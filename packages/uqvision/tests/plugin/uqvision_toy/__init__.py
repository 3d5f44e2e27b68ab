"""uqvision-toy-plugin: what a researcher's package adds to uqvision without forking it.

- :data:`PROTOCOL` (entry point ``uqvision.protocols: toy``): each cache's accuracy, NLL and
  ECE (:mod:`.score`), with a driver that trains the plugin's method on a generated folder
  and predicts it, with the trained network and with the plugin's model source
  (:mod:`.reproduce`);
- :mod:`.method`: ``toy_label_smoothing`` (``uqvision.training_methods``);
- :mod:`.source`: ``toy/meancolour`` (``uqvision.model_sources``);
- :mod:`.evalset`: ``toy-shifted`` (``uqvision.eval_sets``);
- :mod:`.detector`: ``toy_max_logit`` (``uqmetrics.detectors``).
"""

from __future__ import annotations

import argparse

from uqvision.options import positive_float
from uqvision.protocols.base import LazyReproduction, Protocol

DESCRIPTION = "toy (a plugin's protocol): accuracy, NLL and ECE of each cache"


def _add_options(p: argparse.ArgumentParser) -> None:
    # the selective protocol has an option of this name too: each protocol has its own parser
    p.add_argument("--calibration-size", type=positive_float, default=1.0,
                   help="toy: the fraction of each cache's samples scored (the first ones)")


def _score(a: argparse.Namespace):
    from .score import score_toy  # imported on use, as the built-in protocols do

    return score_toy(a.caches, fraction=a.calibration_size)


PROTOCOL = Protocol("toy", DESCRIPTION, score=_score, score_name="toy_scores",
                    add_options=_add_options,
                    reproduce=LazyReproduction("toy", DESCRIPTION, "uqvision_toy.reproduce"),
                    methods=("toy_label_smoothing",))
