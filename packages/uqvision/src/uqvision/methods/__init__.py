"""General ensembling and Bayesian training methods, one registry entry each (any protocol
may train them; the Pitfalls protocol, V.2, compares exactly these: :data:`GENERAL_METHODS`).

Each entry of :data:`~uqvision.training.method.TRAINING_METHODS` is a
:class:`~uqvision.training.method.TrainingMethod`: its hyper-parameters (a frozen dataclass with
the stand-in defaults) and the hooks the one training loop calls; see
:mod:`uqvision.training.method` for exactly how a loop drives a method. Families:
:mod:`~uqvision.methods.ensembling` (deep_ensemble, mc_dropout, sse, fge) and
:mod:`~uqvision.methods.bayesian` (:mod:`~uqvision.methods.swag`, :mod:`~uqvision.methods.csgld`,
:mod:`~uqvision.methods.vi`, :mod:`~uqvision.methods.laplace`: swag, csgld, vi, kfac_laplace);
schedules (eqs. 10, 16, 17) in :mod:`uqvision.training.schedules`.

Learners that more than one protocol trains live here too, since protocols do not import each
other (issue 41): URL's representation learners (V.4; HET-XL, SNGP, loss prediction and the
10-head ensemble among them) in :mod:`~uqvision.methods.representation`, on the heads of
:mod:`~uqvision.methods.uncertainty_heads` (von Mises-Fisher maths:
:mod:`~uqvision.methods.vmf`); MIMO, RBF and DUE (V.3) in :mod:`~uqvision.methods.mimo`,
:mod:`~uqvision.methods.rbf` and :mod:`~uqvision.methods.due`, on the featurizer + linear
classifier of :mod:`~uqvision.methods.feature`. Each registers its entries when imported; the
protocol that lists them imports them (URL's and UIMNET's ``methods`` modules, at the place of
the paper's order), so the registry's order, which ``uqvision train --method`` shows, is the
one it had before they moved; they are not among this package's lazy names, which
:func:`uqvision.load_registries` reads first. What only one protocol trains (UIMNET's Mixup,
soft labeler, RND, OC, DeepAE) stays in its folder, :mod:`uqvision.protocols`.

Examples
--------
>>> from uqvision.methods import GENERAL_METHODS, TRAINING_METHODS
>>> TRAINING_METHODS.names()[:8] == list(GENERAL_METHODS)  # registered first
True
>>> TRAINING_METHODS.lookup("sse").hparams_from(["cycles=3"]).cycles
3
"""

import importlib

from uqmetrics.runs.lazy import attach

#: The methods of this package, in the Pitfalls paper's order (what V.2 ensembles and scores).
GENERAL_METHODS: tuple[str, ...] = ("deep_ensemble", "mc_dropout", "sse", "fge", "swag", "csgld",
                                    "vi", "kfac_laplace")


def _register() -> None:
    """Import the modules that register the methods (first: the paper's order), once; the
    package's other names are imported on first use (:mod:`uqmetrics.runs.lazy`)."""
    for module in ("ensembling", "bayesian"):  # swag, csgld, vi, laplace, in this order
        importlib.import_module(f"{__name__}.{module}")


__getattr__, __dir__ = attach(__name__, {
    ".csgld": ["CSGLDHParams"],
    ".ensembling": ["DropoutHParams", "FGEHParams", "SSEHParams"],
    ".laplace": ["LaplaceHParams"],
    ".swag": ["SWAGHParams"],
    ".vi": ["VIHParams"],
    "..training.method": ["OPTIMIZERS", "TRAINING_METHODS", "HParams", "Snapshot",
                          "TrainRecipe", "TrainState", "TrainingMethod", "export_state"],
    "..training.schedules": ["SCHEDULES"],
}, first=_register)

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
