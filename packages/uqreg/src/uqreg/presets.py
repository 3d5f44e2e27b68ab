"""Named study configurations (``uqreg study|sweep --preset NAME``).

``quick`` is the README's demo; ``paper-e1/e2/e3`` are the paper's sizes (PROTOCOLS R.4/R.5):
120 members, 200 MC passes, 300·c epochs, 50/50/30 repetitions.
"""

from __future__ import annotations

from .engine import TrainConfig
from .study import StudyConfig

PAPER_TRAIN = TrainConfig(members=120, mc_samples=200)

PRESETS: dict[str, StudyConfig] = {
    # All seven methods on the sinusoid at several f_main levels, reduced repetitions, members
    # and MC passes, so that it finishes in minutes on 2 CPU cores.
    "quick": StudyConfig(task="sinusoid", complexities=(1, 2, 3), repetitions=6,
                         train=TrainConfig(members=10, mc_samples=50)),
    "paper-e1": StudyConfig(task="sinusoid", complexities=tuple(range(1, 11)), repetitions=50, train=PAPER_TRAIN),
    "paper-e2": StudyConfig(task="styblinski_tang", complexities=(1, 2, 3, 4), repetitions=50, train=PAPER_TRAIN),
    "paper-e3": StudyConfig(task="polynomial", complexities=(2,), repetitions=30, train=PAPER_TRAIN),
}
