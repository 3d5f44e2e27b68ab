"""Training methods of the Pitfalls protocol (V.2), one registry entry each.

:data:`TRAINING_METHODS` maps a name to a :class:`TrainingMethod`: its hyper-parameters (a
frozen dataclass with the stand-in defaults) and the hooks the one training loop calls. See
:mod:`uqvision.methods.registry` for exactly how a loop drives a method. Families:
:mod:`~uqvision.methods.ensembles` (deep_ensemble, mc_dropout, sse, fge) and
:mod:`~uqvision.methods.bayesian` (swag, csgld, vi, kfac_laplace); schedules (eqs. 10, 16, 17)
in :mod:`~uqvision.methods.schedules`.

Examples
--------
>>> from uqvision.methods import TRAINING_METHODS
>>> TRAINING_METHODS.names()[:8]  # V.2's; V.3 (ood) follows
['deep_ensemble', 'mc_dropout', 'sse', 'fge', 'swag', 'csgld', 'vi', 'kfac_laplace']
>>> TRAINING_METHODS.lookup("sse").hparams_from(["cycles=3"]).cycles
3
"""

# isort: off
from . import ensembles  # noqa: F401  (registers first: the paper's order)
from . import bayesian  # noqa: F401
from . import ood  # noqa: F401  (UIMNET algorithms, V.3)
from . import representation  # noqa: F401  (URL representation learners, V.4)
# isort: on
from .bayesian import CSGLDHParams, LaplaceHParams, SWAGHParams, VIHParams
from .ensembles import DropoutHParams, FGEHParams, SSEHParams
from .registry import (
    OPTIMIZERS,
    TRAINING_METHODS,
    HParams,
    Recipe,
    Snapshot,
    TrainingMethod,
    TrainState,
    export_state,
)
from .schedules import SCHEDULES

__all__ = [
    "OPTIMIZERS",
    "SCHEDULES",
    "TRAINING_METHODS",
    "CSGLDHParams",
    "DropoutHParams",
    "FGEHParams",
    "HParams",
    "LaplaceHParams",
    "Recipe",
    "SSEHParams",
    "SWAGHParams",
    "Snapshot",
    "TrainState",
    "TrainingMethod",
    "VIHParams",
    "export_state",
]
