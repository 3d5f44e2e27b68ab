"""The batched training engine: many small MLPs trained as one computation.

================  ===============================================================================
module            owns
================  ===============================================================================
``config``        :class:`TrainConfig` (network, optimiser, method hyper-parameters), :data:`RECIPES`
``heads``         the output heads and :data:`HEADS`: each head's forward maths and regulariser
``objectives``    the data terms of the loss and :data:`OBJECTIVES`: ½·MSE, the mean–variance β-NLL,
                  the quantile networks' pinball loss
``network``       :class:`BatchedMLP` (networks stacked on a leading axis), :func:`xavier_uniform`
``samplers``      batch samplers and :data:`SAMPLERS`
``train``         :func:`train_batched`, :func:`predict_batched`, the loss and the optimiser
``fused``         the default training step: hand-written forward/backward, one flat buffer, one Adam
``triton_step``   backend ``"triton"`` (CUDA): an ensemble network's whole step as one Triton program
``chunks``        the chunk size a configuration allows, cores and memory, running chunks at once
``plan``          the execution plan: memory per network, chunks, threads, running the chunks
``autoplan``      ``"auto"`` chunk and concurrency: measured once per device, recorded in a JSON file
================  ===============================================================================

All networks of a study cell (repetitions × members, or repetitions for dropout nets) live on a
leading *network* axis ``B``; randomness is counter based (:mod:`uqreg.rng`), so the engine
trains exactly the networks a per-network loop would, whatever chunk they fall in.
"""

from uqmetrics.runs.lazy import attach

# every name imported on first use (docs/conventions.md#fast-help)
__getattr__, __dir__ = attach(__name__, {
    ".config": ["AUTO", "L2_MODES", "RECIPES", "Recipe", "TrainConfig"],
    ".heads": ["HEADS", "Head"],
    ".network": ["BatchedMLP", "NetworkBatch", "xavier_uniform"],
    ".objectives": ["OBJECTIVES", "Objective"],
    ".plan": ["ExecutionPlan", "JobResult", "TrainJob", "bytes_per_network", "chunk_size",
              "execute", "make_plan", "map_chunks", "recording_plans", "single_threaded"],
    ".samplers": ["SAMPLERS", "Sampler"],
    ".train": ["half_mse", "objective", "predict_batched", "predict_decomposed", "train_batched"],
})

__all__ = [
    "AUTO",
    "HEADS",
    "L2_MODES",
    "OBJECTIVES",
    "RECIPES",
    "SAMPLERS",
    "BatchedMLP",
    "ExecutionPlan",
    "Head",
    "JobResult",
    "NetworkBatch",
    "Objective",
    "Recipe",
    "Sampler",
    "TrainConfig",
    "TrainJob",
    "bytes_per_network",
    "chunk_size",
    "execute",
    "half_mse",
    "make_plan",
    "map_chunks",
    "objective",
    "predict_batched",
    "predict_decomposed",
    "recording_plans",
    "single_threaded",
    "train_batched",
    "xavier_uniform",
]
