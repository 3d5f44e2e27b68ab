"""Named study configurations (``uqreg study|sweep --preset NAME``), registered in
:data:`PRESETS`.

``quick`` is the README's main job; ``paper-e1/e2/e3`` are the paper's sizes
(docs/conventions.md#r-5): 120 members, 200 MC passes, 300·c epochs, 50/50/30 repetitions, the
paper's recipe.

A preset may run :class:`Companion` studies beside its main one, each written to its own folder
of the output (``OUT/<folder>/study.nc``). ``quick`` has one: on the sinusoid (E.1) no deep
method fits the truth under either recipe (R² < 0 against it at every f_main: the networks fit
the data's noise, not the function), so the main job also runs the same methods, sizes and
recipes on Styblinski-Tang at d = 1 (E.2), where the networks fit the function (R² ≈ 0.9) and
their coverage says something about their error bars.
"""

from __future__ import annotations

from dataclasses import dataclass

from uqmetrics.metrics.registry import Registry

from .engine import TrainConfig
from .study import StudyConfig


@dataclass(frozen=True)
class Companion:
    """A study a preset runs beside its main one, written to ``OUT/<folder>/study.nc``.

    The command line's options apply to it as to the main study, except those that describe the
    main study's task (:data:`TASK_FIELDS`)."""

    folder: str
    why: str
    config: StudyConfig


#: The fields of a :class:`~uqreg.study.StudyConfig` that describe its task: options that set them
#: change a preset's main study only, never its companions (a sinusoid's ``--complexities 1-10``
#: or ``--sigma`` means nothing for Styblinski-Tang).
TASK_FIELDS = ("task", "complexities", "n_train", "sigma")


@dataclass(frozen=True)
class Preset:
    """A named :class:`~uqreg.study.StudyConfig` with a one-line description (CLI help), and the
    :class:`Companion` studies run beside it."""

    name: str
    description: str
    config: StudyConfig
    companions: tuple[Companion, ...] = ()


PAPER_TRAIN = TrainConfig(members=120, mc_samples=200)
QUICK_TRAIN = TrainConfig(members=10, mc_samples=50)

PRESETS: Registry[Preset] = Registry("preset")
for _p in (
    Preset("quick", "all seven methods on the sinusoid (E.1), f_main 1-3, under the paper's recipe (whose "
                    "networks collapse toward a constant) and the 'sum' recipe (whose networks do not collapse but "
                    "fit the noise, not the function: R² < 0 against the truth), side by side, and beside it (in "
                    "OUT/styblinski_tang) the same on Styblinski-Tang at d = 1 (E.2), where the networks fit the "
                    "function. A few minutes on 2 CPU cores",
           StudyConfig(task="sinusoid", complexities=(1, 2, 3), repetitions=6, recipes=("paper", "sum"),
                       train=QUICK_TRAIN),
           companions=(Companion(
               "styblinski_tang", "E.2 at d = 1: the same methods, sizes and recipes on a task whose function "
               "the networks fit",
               StudyConfig(task="styblinski_tang", complexities=(1,), repetitions=6, recipes=("paper", "sum"),
                           train=QUICK_TRAIN)),)),
    Preset("paper-e1", "E.1 at the paper's size: sinusoid, f_main 1-10, k = 50",
           StudyConfig(task="sinusoid", complexities=tuple(range(1, 11)), repetitions=50, train=PAPER_TRAIN)),
    Preset("paper-e2", "E.2 at the paper's size: Styblinski-Tang, d 1-4, k = 50",
           StudyConfig(task="styblinski_tang", complexities=(1, 2, 3, 4), repetitions=50, train=PAPER_TRAIN)),
    Preset("paper-e3", "E.3 at the paper's size: 2-D polynomial, k = 30",
           StudyConfig(task="polynomial", complexities=(2,), repetitions=30, train=PAPER_TRAIN)),
):
    PRESETS.register(_p)
del _p

__all__ = ["PAPER_TRAIN", "PRESETS", "QUICK_TRAIN", "TASK_FIELDS", "Companion", "Preset"]
