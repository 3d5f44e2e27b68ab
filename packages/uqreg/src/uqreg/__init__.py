"""uqreg: deep-regression UQ benchmark with an exact Bayesian reference.

The data path: :class:`~uqreg.tasks.LinearTask` ─instance→ :class:`~uqreg.tasks.TaskInstance`
─targets(rep)→ training targets ─:class:`~uqreg.methods.Method` (batched engine)→ predictions
(repetition, point) ─:func:`~uqreg.study.run_study`→ one xarray.Dataset scored by uqmetrics.
"""

from uqmetrics.runs.lazy import attach

# every name imported on first use (docs/conventions.md#fast-help)
__getattr__, __dir__ = attach(__name__, {
    ".engine": ["TrainConfig"],
    ".methods": ["METHODS", "CQRMethod", "MeanVarianceMethod", "Method", "QuantileMethod", "get_method",
                 "list_methods", "mean_variance_method_names", "quantile_method_names", "register_method"],
    ".reference": ["ReferencePosterior", "fit_reference", "reference_prediction"],
    ".study": ["StudyConfig", "recompute_reference", "run_raw", "run_study", "summarize"],
    ".tasks": ["TASKS", "LinearTask", "TaskInstance", "get_task", "list_tasks", "register_task"],
})

__version__ = "0.1.0"

__all__ = [
    "METHODS",
    "TASKS",
    "CQRMethod",
    "LinearTask",
    "MeanVarianceMethod",
    "Method",
    "QuantileMethod",
    "ReferencePosterior",
    "StudyConfig",
    "TaskInstance",
    "TrainConfig",
    "fit_reference",
    "get_method",
    "get_task",
    "list_methods",
    "list_tasks",
    "mean_variance_method_names",
    "quantile_method_names",
    "recompute_reference",
    "reference_prediction",
    "register_method",
    "register_task",
    "run_raw",
    "run_study",
    "summarize",
]
