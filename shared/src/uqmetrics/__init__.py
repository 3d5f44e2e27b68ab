"""uqmetrics: the shared metrics layer of the UQ benchmark.

Pure functions, sklearn naming (``*_score`` higher is better, ``*_loss``/``*_error`` lower is
better), positional data and keyword-only options. Inputs may be numpy arrays, torch tensors or
xarray objects. The conventions each metric follows (PROTOCOLS.md S.1-S.6) are listed in
:data:`CONVENTIONS` and are written into every result file's attrs.
"""

from importlib.metadata import PackageNotFoundError, version

from .conventions import CONVENTIONS
from .exceptions import *  # noqa: F401,F403
from .classification import *  # noqa: F401,F403
from .calibration import *  # noqa: F401,F403
from .confidence import *  # noqa: F401,F403
from .selective import *  # noqa: F401,F403
from .ensembles import *  # noqa: F401,F403
from .ood import *  # noqa: F401,F403
from .retrieval import *  # noqa: F401,F403
from .regression import *  # noqa: F401,F403
from .io import *  # noqa: F401,F403
from . import (  # noqa: F401  (submodules as attributes)
    calibration, classification, confidence, ensembles, exceptions, io, ood, registry, regression, retrieval,
    selective,
)

try:
    __version__ = version("uqmetrics")
except PackageNotFoundError:  # pragma: no cover - source checkout without install
    __version__ = "0+unknown"

__all__ = ["CONVENTIONS", "__version__"]
for _m in (exceptions, classification, calibration, confidence, selective, ensembles, ood, retrieval, regression, io):
    __all__ += list(_m.__all__)
del _m
