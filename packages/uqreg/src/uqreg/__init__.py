"""uqreg: deep-regression UQ benchmark with an exact Bayesian reference.

The data path: :class:`~uqreg.tasks.LinearTask` ─instance→ :class:`~uqreg.tasks.TaskInstance`
─targets(rep)→ training targets ─:class:`~uqreg.methods.Method` (batched engine)→ predictions
(repetition, point) ─:func:`~uqreg.study.run_study`→ one xarray.Dataset scored by uqmetrics.
"""

from .engine import TrainConfig
from .methods import METHODS, Method, get_method, list_methods, register_method
from .reference import ReferencePosterior, fit_reference, reference_prediction
from .study import StudyConfig, recompute_reference, run_raw, run_study, summarize
from .tasks import TASKS, LinearTask, TaskInstance, get_task, list_tasks, register_task

__version__ = "0.1.0"

__all__ = [
    "METHODS",
    "TASKS",
    "LinearTask",
    "Method",
    "ReferencePosterior",
    "StudyConfig",
    "TaskInstance",
    "TrainConfig",
    "fit_reference",
    "get_method",
    "get_task",
    "list_methods",
    "list_tasks",
    "recompute_reference",
    "reference_prediction",
    "register_method",
    "register_task",
    "run_raw",
    "run_study",
    "summarize",
]
