"""The metrics layer of uqmetrics: one metric family per module, as scikit-learn's metrics
(calibration, classification, confidence, selective, scoring, ensembles, ood, detectors,
conformal, regression, retrieval, shift, disentangle, stats), the registry of metric kinds
(:mod:`~uqmetrics.metrics.registry`) and what every family needs
(:mod:`~uqmetrics.metrics.exceptions`, :mod:`~uqmetrics.metrics.conventions`,
:mod:`~uqmetrics.metrics._validation`).

The lowest layer: it imports neither :mod:`uqmetrics.runs` nor :mod:`uqmetrics.report`, and no
Dask, Jinja or netCDF (``.importlinter``). This face imports nothing: the family modules import
scipy (about a second) and are imported on first use (``from uqmetrics.metrics.selective import
auroc_score``, or the package face :mod:`uqmetrics`, which exports their names).
"""

import importlib
from types import ModuleType

#: The metric family modules whose names the face :mod:`uqmetrics` exports, in the order of its
#: ``__all__``; importing them registers every metric (:mod:`~uqmetrics.metrics.registry`).
METRIC_MODULES = ("classification", "calibration", "confidence", "selective", "scoring",
                  "ensembles", "ood", "retrieval", "regression", "shift", "disentangle")


def import_metric_modules() -> list[ModuleType]:
    """Import the modules of :data:`METRIC_MODULES` (scipy: about a second, once), in order."""
    return [importlib.import_module(f"{__name__}.{name}") for name in METRIC_MODULES]
