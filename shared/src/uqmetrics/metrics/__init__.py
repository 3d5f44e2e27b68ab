"""The metrics layer of uqmetrics: one metric family per module, as scikit-learn's metrics
(calibration, classification, confidence, selective, scoring, ensembles, ood, detectors,
conformal, regression, retrieval, shift, stats), the registry of metric kinds
(:mod:`~uqmetrics.metrics.registry`) and what every family needs (:mod:`~uqmetrics.metrics.exceptions`,
:mod:`~uqmetrics.metrics.conventions`, :mod:`~uqmetrics.metrics._validation`).

The lowest layer: it imports neither :mod:`uqmetrics.runs` nor :mod:`uqmetrics.report`, and no
Dask, Jinja or netCDF (``.importlinter``). This face imports nothing: the family modules import
scipy (about a second) and are imported on first use (``from uqmetrics.metrics.selective import
auroc_score``, or the package face :mod:`uqmetrics`, which exports their names).
"""
