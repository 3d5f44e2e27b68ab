"""uqmetrics: the shared metrics layer of the UQ benchmark.

Pure functions, sklearn naming (``*_score`` higher is better, ``*_loss``/``*_error`` lower is
better), positional data and keyword-only options. Inputs may be numpy arrays, torch tensors or
xarray objects. The conventions each metric follows (docs/conventions.md#s) are listed in
:data:`CONVENTIONS` and are written into every result file's attrs.
"""

from importlib.metadata import PackageNotFoundError, version

from . import (  # noqa: F401  (submodules as attributes)
    calibration,
    classification,
    confidence,
    conventions,
    ensembles,
    exceptions,
    io,
    ood,
    registry,
    regression,
    retrieval,
    scoring,
    selective,
)
from .calibration import *
from .classification import *
from .confidence import *
from .conventions import CONVENTIONS, COVERAGE_Z
from .ensembles import *
from .exceptions import *
from .io import *
from .ood import *
from .regression import *
from .retrieval import *
from .scoring import *
from .selective import *

try:
    __version__ = version("uqmetrics")
except PackageNotFoundError:  # pragma: no cover - source checkout without install
    __version__ = "0+unknown"

__all__ = ["CONVENTIONS", "COVERAGE_Z", "__version__"]
for _m in (exceptions, classification, calibration, confidence, selective, scoring, ensembles, ood,
           retrieval, regression, io):
    __all__ += list(_m.__all__)
del _m
