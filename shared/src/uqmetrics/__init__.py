"""uqmetrics: the shared metrics layer of the UQ benchmark.

Pure functions, sklearn naming (``*_score`` higher is better, ``*_loss``/``*_error`` lower is
better), positional data and keyword-only options. Inputs may be numpy arrays, torch tensors or
xarray objects. The conventions each metric follows (docs/conventions.md#s) are listed in
:data:`CONVENTIONS` and are written into every result file's attrs.

Three layers, each a subpackage; a layer imports only the layers below it (``.importlinter``):

- :mod:`uqmetrics.report`: the leaderboard site, plots and ``verify``;
- :mod:`uqmetrics.runs`: result files, their schema, run configurations, options, sweeps;
- :mod:`uqmetrics.metrics`: one metric family per module and the registry of metric kinds.

This face exports the public names of the metric families, the result files and the result
schema (``from uqmetrics import auroc_score, write_dataset, stamp_result``). The module paths
of the flat layout before the layers (``uqmetrics.io``, ``uqmetrics.sweep``,
``uqmetrics.registry``, ...; :data:`_MOVED`) still import, for one release, as the module of
their new path, with a :class:`MovedModuleWarning` naming it.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from importlib.metadata import PackageNotFoundError, version

from . import metrics as _metrics
from .metrics import exceptions as _exceptions
from .metrics.conventions import CONVENTIONS, COVERAGE_Z  # noqa: F401  (exported)
from .metrics.exceptions import *
from .runs import io as _io
from .runs import result_schema as _result_schema
from .runs.io import *
from .runs.result_schema import *

try:
    __version__ = version("uqmetrics")
except PackageNotFoundError:  # pragma: no cover - source checkout without install
    __version__ = "0+unknown"


class MovedModuleWarning(DeprecationWarning):
    """A module path of uqmetrics' flat layout was imported: the message names its new path
    (the old paths are removed in the next release)."""


#: Old module path (below ``uqmetrics.``) -> new one, for one release: importing the old path
#: gives the module of the new path (the same objects) and warns once
#: (:class:`MovedModuleWarning`). ``uqmetrics.report`` and its modules kept their paths.
_MOVED = {
    **{name: f"metrics.{name}" for name in (
        "_validation", "calibration", "classification", "confidence", "conformal", "conventions",
        "detectors", "ensembles", "exceptions", "ood", "registry", "regression", "retrieval",
        "scoring", "selective", "shift", "stats")},
    **{name: f"runs.{name}" for name in (
        "config_options", "io", "lazy", "result_schema", "run_config", "sweep", "testing",
        "testing.attrs", "testing.examples", "testing.filesystems", "testing.parsers",
        "testing.profiles", "testing.signals", "testing.strategies")},
    "plotting": "report.plotting",
    "verify": "report.verify",
}


def _stacklevel() -> int:
    """The stack level of the first frame outside the import machinery and this module (the
    import statement that named an old path)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename == __file__
                                 or "importlib" in frame.f_code.co_filename
                                 or frame.f_code.co_filename.startswith("<frozen")):
        frame, level = frame.f_back, level + 1
    return level


class _MovedLoader(importlib.abc.Loader):
    """Loads an old module path as the module of its new path, warning."""

    def __init__(self, new: str):
        self.new = new
        self.spec = None

    def create_module(self, spec):
        warnings.warn(f"{spec.name} has moved to {self.new}: import {self.new} (the old path "
                      f"is removed in the next release)", MovedModuleWarning,
                      stacklevel=_stacklevel())
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self.spec  # the import system set the alias's spec: restore the module's


class _MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old module paths of :data:`_MOVED` (first on ``sys.meta_path``)."""

    def find_spec(self, fullname, path=None, target=None):
        new = _MOVED.get(fullname[len(__name__) + 1:]) if fullname.startswith(__name__ + ".") \
            else None
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _MovedLoader(f"{__name__}.{new}"))


if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedFinder())

#: Whether the metric modules (:data:`uqmetrics.metrics.METRIC_MODULES`, in the order of
#: ``__all__``) are loaded. They import scipy (about a second), so they are imported on the
#: first use of one of their names (``uqmetrics.auroc_score``, ``from uqmetrics import ...``,
#: ``dir(uqmetrics)``, ``import *``), not by ``import uqmetrics``: a program that only writes
#: result files (``uqvision predict``, ``uqvision train``) never loads them.
#: :func:`uqmetrics.metrics.registry.get_metric` and
#: :func:`~uqmetrics.metrics.registry.list_metrics` load them too.
_LOADED = False


def _load_metrics() -> None:
    """Import the metric modules and export their names (once; re-entrant calls return)."""
    global _LOADED, __all__
    if _LOADED:
        return
    _LOADED = True
    package = sys.modules[__name__]
    names = ["CONVENTIONS", "COVERAGE_Z", "__version__", *_exceptions.__all__]
    for module in _metrics.import_metric_modules():
        for attr in module.__all__:
            setattr(package, attr, getattr(module, attr))
        names += module.__all__
    __all__ = [*names, *_io.__all__, *_result_schema.__all__]


def __getattr__(name: str):
    if name.startswith("__") and name != "__all__":  # dunders (doctest's __test__, ...)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name in _MOVED:  # an old module path as an attribute (``uqmetrics.io.read_dataset``)
        return importlib.import_module(f"{__name__}.{name}")
    _load_metrics()
    try:
        return globals()[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    _load_metrics()
    return sorted(globals())
