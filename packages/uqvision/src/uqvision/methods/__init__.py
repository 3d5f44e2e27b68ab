"""General ensembling and Bayesian training methods, one registry entry each (any protocol
may train them; the Pitfalls protocol, V.2, compares exactly these: :data:`GENERAL_METHODS`).

Each entry of :data:`~uqvision.training.method.TRAINING_METHODS` is a
:class:`~uqvision.training.method.TrainingMethod`: its hyper-parameters (a frozen dataclass with
the stand-in defaults) and the hooks the one training loop calls; see
:mod:`uqvision.training.method` for exactly how a loop drives a method. Families:
:mod:`~uqvision.methods.ensembling` (deep_ensemble, mc_dropout, sse, fge) and
:mod:`~uqvision.methods.bayesian` (:mod:`~uqvision.methods.swag`, :mod:`~uqvision.methods.csgld`,
:mod:`~uqvision.methods.vi`, :mod:`~uqvision.methods.laplace`: swag, csgld, vi, kfac_laplace);
schedules (eqs. 10, 16, 17) in :mod:`uqvision.training.schedules`. A protocol's own learners
(UIMNET's algorithms, URL's representation learners) live in its folder,
:mod:`uqvision.protocols`.

Examples
--------
>>> from uqvision.methods import GENERAL_METHODS, TRAINING_METHODS
>>> TRAINING_METHODS.names()[:8] == list(GENERAL_METHODS)  # registered first
True
>>> TRAINING_METHODS.lookup("sse").hparams_from(["cycles=3"]).cycles
3
"""

# isort: off
from . import ensembling  # noqa: F401  (registers first: the paper's order)
from . import bayesian  # noqa: F401  (swag, csgld, vi, laplace, in this order)
# isort: on
from ..training.method import (
    OPTIMIZERS,
    TRAINING_METHODS,
    HParams,
    Snapshot,
    TrainingMethod,
    TrainRecipe,
    TrainState,
    export_state,
)
from ..training.schedules import SCHEDULES
from .csgld import CSGLDHParams
from .ensembling import DropoutHParams, FGEHParams, SSEHParams
from .laplace import LaplaceHParams
from .swag import SWAGHParams
from .vi import VIHParams

#: The methods of this package, in the Pitfalls paper's order (what V.2 ensembles and scores).
GENERAL_METHODS: tuple[str, ...] = ("deep_ensemble", "mc_dropout", "sse", "fge", "swag", "csgld",
                                    "vi", "kfac_laplace")
for _name in GENERAL_METHODS:
    TRAINING_METHODS.lookup(_name)  # each one registered above
del _name

__all__ = [
    "GENERAL_METHODS",
    "OPTIMIZERS",
    "SCHEDULES",
    "TRAINING_METHODS",
    "CSGLDHParams",
    "DropoutHParams",
    "FGEHParams",
    "HParams",
    "LaplaceHParams",
    "SSEHParams",
    "SWAGHParams",
    "Snapshot",
    "TrainRecipe",
    "TrainState",
    "TrainingMethod",
    "VIHParams",
    "export_state",
]
