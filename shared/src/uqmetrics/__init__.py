"""uqmetrics: the shared metrics layer of the UQ benchmark.

Pure functions, sklearn naming (``*_score`` higher is better, ``*_loss``/``*_error`` lower is
better), positional data and keyword-only options. Inputs may be numpy arrays, torch tensors or
xarray objects. The conventions each metric follows (docs/conventions.md#s) are listed in
:data:`CONVENTIONS` and are written into every result file's attrs.
"""

import importlib
import sys
from importlib.metadata import PackageNotFoundError, version

from . import config_options, conventions, exceptions, io, registry, result_schema  # noqa: F401
from .conventions import CONVENTIONS, COVERAGE_Z  # noqa: F401  (exported)
from .exceptions import *
from .io import *
from .result_schema import *

try:
    __version__ = version("uqmetrics")
except PackageNotFoundError:  # pragma: no cover - source checkout without install
    __version__ = "0+unknown"

#: The metric modules, in the order of ``__all__``. They import scipy (about a second), so they
#: are imported on the first use of one of their names (``uqmetrics.auroc_score``, ``from
#: uqmetrics import ...``, ``uqmetrics.calibration``, ``dir(uqmetrics)``, ``import *``), not by
#: ``import uqmetrics``: a program that only writes result files (``uqvision predict``,
#: ``uqvision train``) never loads them. :func:`uqmetrics.registry.get_metric` and
#: :func:`~uqmetrics.registry.list_metrics` load them too.
_METRIC_MODULES = ("classification", "calibration", "confidence", "selective", "scoring",
                   "ensembles", "ood", "retrieval", "regression", "shift")
_LOADED = False


def _load_metrics() -> None:
    """Import the metric modules and export their names (once; re-entrant calls return)."""
    global _LOADED, __all__
    if _LOADED:
        return
    _LOADED = True
    package = sys.modules[__name__]
    names = ["CONVENTIONS", "COVERAGE_Z", "__version__", *exceptions.__all__]
    for name in _METRIC_MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        for attr in module.__all__:
            setattr(package, attr, getattr(module, attr))
        names += module.__all__
    __all__ = [*names, *io.__all__, *result_schema.__all__]


def __getattr__(name: str):
    if name.startswith("__") and name != "__all__":  # dunders (doctest's __test__, ...)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _load_metrics()
    try:
        return globals()[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    _load_metrics()
    return sorted(globals())
