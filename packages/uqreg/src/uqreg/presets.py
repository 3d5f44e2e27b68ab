"""Named study configurations (``uqreg study|sweep --preset NAME``), registered in
:data:`PRESETS`.

``quick`` is the README's main job; ``paper-e1/e2/e3`` are the paper's sizes
(docs/conventions.md#r-5): 120 members, 200 MC passes, 300·c epochs, 50/50/30 repetitions, the
paper's recipe.
"""

from __future__ import annotations

from dataclasses import dataclass

from uqmetrics.registry import Registry

from .engine import TrainConfig
from .study import StudyConfig


@dataclass(frozen=True)
class Preset:
    """A named :class:`~uqreg.study.StudyConfig` with a one-line description (CLI help)."""

    name: str
    description: str
    config: StudyConfig


PAPER_TRAIN = TrainConfig(members=120, mc_samples=200)

PRESETS: Registry[Preset] = Registry("preset")
for _p in (
    Preset("quick", "all seven methods on the sinusoid, f_main 1-3, under the paper's recipe (whose networks "
                    "collapse) and the 'sum' recipe (whose networks fit), side by side; minutes on 2 CPU cores",
           StudyConfig(task="sinusoid", complexities=(1, 2, 3), repetitions=6, recipes=("paper", "sum"),
                       train=TrainConfig(members=10, mc_samples=50))),
    Preset("paper-e1", "E.1 at the paper's size: sinusoid, f_main 1-10, k = 50",
           StudyConfig(task="sinusoid", complexities=tuple(range(1, 11)), repetitions=50, train=PAPER_TRAIN)),
    Preset("paper-e2", "E.2 at the paper's size: Styblinski-Tang, d 1-4, k = 50",
           StudyConfig(task="styblinski_tang", complexities=(1, 2, 3, 4), repetitions=50, train=PAPER_TRAIN)),
    Preset("paper-e3", "E.3 at the paper's size: 2-D polynomial, k = 30",
           StudyConfig(task="polynomial", complexities=(2,), repetitions=30, train=PAPER_TRAIN)),
):
    PRESETS.register(_p)
del _p

__all__ = ["PAPER_TRAIN", "PRESETS", "Preset"]
