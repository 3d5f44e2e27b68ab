"""Named study configurations (``uqreg study --preset NAME``)."""

from __future__ import annotations

from .engine import TrainConfig
from .study import StudyConfig

PRESETS: dict[str, StudyConfig] = {
    # The README's demo: all seven methods on the sinusoid, several f_main levels, reduced
    # repetitions/members/MC passes so that it finishes in minutes on 2 CPU cores.
    "quick": StudyConfig(task="sinusoid", complexities=(1, 2, 3), repetitions=8,
                         train=TrainConfig(members=16, mc_samples=50)),
}
