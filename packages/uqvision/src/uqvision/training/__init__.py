"""Training machinery shared by every protocol.

- :mod:`~uqvision.training.method`: the :class:`TrainingMethod` base, its hooks and the
  :data:`TRAINING_METHODS` registry (filled by :mod:`uqvision.methods` and by the protocols
  that bring their own learners; ``import uqvision`` fills it);
- :mod:`~uqvision.training.loop`: the one training loop, :func:`train_model`;
- :mod:`~uqvision.training.runs`: :func:`load_run`, a trained run rebuilt for prediction, and
  the ``method`` (:func:`run_method`: ``single`` for a network trained alone) and ensemble
  (:func:`run_ensemble`) its caches record;
- :mod:`~uqvision.training.schedules`: learning-rate schedules (:data:`SCHEDULES`);
- :mod:`~uqvision.training.dropout`: per-sample dropout masks (MC dropout).
"""

from uqmetrics.runs.lazy import attach

# every name imported on first use (docs/conventions.md#fast-help)
__getattr__, __dir__ = attach(__name__, {
    ".loop": ["ADAMW_RECIPE", "CHECKPOINT_FORMAT", "EnsembleMember", "ImageTrainConfig",
              "TrainConfig", "TrainResult", "checkpoint_files", "new_ensemble_id", "train_model"],
    ".method": ["OPTIMIZERS", "TRAINING_METHODS", "HParams", "Snapshot", "TrainingMethod",
                "TrainRecipe", "TrainState", "export_state"],
    ".runs": ["SINGLE", "LoadedRun", "load_run", "run_ensemble", "run_method"],
    ".schedules": ["SCHEDULES"],
})

__all__ = [
    "ADAMW_RECIPE",
    "CHECKPOINT_FORMAT",
    "OPTIMIZERS",
    "SCHEDULES",
    "SINGLE",
    "TRAINING_METHODS",
    "EnsembleMember",
    "HParams",
    "ImageTrainConfig",
    "LoadedRun",
    "Snapshot",
    "TrainConfig",
    "TrainRecipe",
    "TrainResult",
    "TrainState",
    "TrainingMethod",
    "checkpoint_files",
    "export_state",
    "load_run",
    "new_ensemble_id",
    "run_ensemble",
    "run_method",
    "train_model",
]
