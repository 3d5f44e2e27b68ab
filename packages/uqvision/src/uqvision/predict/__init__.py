"""Run a model over an image folder once and cache per-sample logits (one file per pass).

Modes (:data:`PASS_MODES`):

- ``plain``: the model's own evaluation preprocessing, one pass;
- ``tta``: one random augmentation per pass (policy of :data:`uqvision.data.TTA_POLICIES`);
  pass ``p`` of sample ``i`` is a pure function of ``(seed, p, i)``;
- ``mc_dropout``: dropout masks drawn per sample (:class:`uqvision.training.dropout.PerSampleDropout`;
  the rest of the model, BatchNorm included, in eval mode), ``passes`` forward passes per
  batch sharing one data loading; one file with logits (pass, sample, class). Pass ``r`` of
  sample ``i`` is a pure function of ``(seed, r, i)``;
- and the modes a protocol registers (``crop``: URL's crop intervention,
  :mod:`uqvision.protocols.url.crop`); a mode is a runner that calls :func:`run_loader`.

A network that gives its own uncertainty declares it: ``model.predicts_uncertainty = True``
(:data:`OWN_UNCERTAINTY`) and a method ``predict(x, ids, seed) -> (logits, u, embedding)``
(the URL heads, :class:`uqvision.methods.uncertainty_heads.URLModel`, V.4): its caches also hold ``uncertainty``
(sample) and, with ``embeddings``, its embedding; the noise of its stochastic heads is drawn
per sample from ``(seed, sample index)``. With ``logits=False`` a cache keeps no logits and
the folder's classes need not be the model's (zero-shot embeddings of unseen classes).

ONE path from a training method's prediction samples to caches: a checkpoint trained by
:func:`uqvision.training.loop.train_model` is rebuilt through its method
(:func:`uqvision.training.runs.load_run`), and each of its K samples — deep-ensemble member,
snapshot, posterior draw or stochastic pass (noise drawn per sample, like the MC-dropout
masks) — goes through the mode as one network, one cache per sample and pass (attrs
``method``, ``run``, ``sample_index``). A network without a method is one sample.

No mode reads or writes the global torch RNG: a cache does not depend on the batch size, the
number of torchrun processes or DataLoader workers, nor on what the caller did with the RNG
(up to the float rounding of batched kernels, the same as for ``plain``).

Multi-process: under ``torchrun`` (``RANK``/``WORLD_SIZE`` set) each rank runs a contiguous
shard of the samples (``numpy.array_split``: exact, no padded duplicates) and the logits are
gathered onto every rank in sample order before anything is written (rank 0 writes).

One concern per module; every name is importable from ``uqvision.predict`` itself:

- :mod:`~.config`: :class:`PredictConfig`, :data:`AMP_MODES` (:func:`amp_mode`),
  :func:`resolve_channels_last` and :data:`CHANNELS_LAST_CPU_FAMILIES`, the image decoders
  (:data:`DECODERS`, :class:`Decoder`, :data:`DEVICE_DECODING_MODES`,
  :func:`decoder_suggestion`),
  :data:`DEFAULT_PASSES`, :data:`REFERENCE_EXECUTION`, :data:`PREDICT_CONFIG_OPTIONS`;
- :mod:`~.variables`: the cache variables (:data:`CACHE_VARIABLES`, :class:`CacheVariable`);
- :mod:`~.options`: the command-line options of a prediction (:data:`PREDICT_OPTIONS`,
  :func:`add_predict_options`) and the config they give (:func:`predict_config`);
- :mod:`~.loop`: the batch loop (:func:`run_loader`, :data:`OWN_UNCERTAINTY`; its progress:
  :func:`batch_progress`) and the dataset a decoder gives it (:func:`eval_dataset`);
- :mod:`~.device_decode`: JPEGs decoded, resized and normalised on the prediction's device
  (``decoder="torchvision"``);
- :mod:`~.modes`: the prediction modes (:data:`PASS_MODES`, :func:`head_only_dropout`,
  :data:`MC_DROPOUT_PATHS`);
- :mod:`~.plan`: a request's checks, its caches (:func:`cache_plan`, :func:`sample_label`) and
  class space;
- :mod:`~.core`: :func:`predict`;
- :mod:`~.decoded`: images decoded once for several models (a sweep's preprocessing groups:
  :func:`~.decoded.split_transform`, :func:`~.decoded.decode_images`);
- :mod:`~.files`: caches on disk (:data:`IDENTITY_FIELDS`, :func:`cache_identity`,
  :func:`check_caches`, :func:`predict_to_files`).
"""

from uqmetrics.runs.lazy import attach

# every name imported on first use (docs/conventions.md#fast-help)
__getattr__, __dir__ = attach(__name__, {
    ".config": ["AMP_MODES", "CHANNELS_LAST_CPU_FAMILIES", "DECODERS", "DEFAULT_PASSES",
                "DEVICE_DECODING_MODES", "PREDICT_CONFIG_OPTIONS", "REFERENCE_EXECUTION",
                "Decoder", "PredictConfig", "amp_mode", "decoder_suggestion",
                "resolve_channels_last"],
    ".core": ["predict"],
    ".files": ["IDENTITY_FIELDS", "cache_identity", "check_caches", "predict_to_files"],
    ".loop": ["OWN_UNCERTAINTY", "batch_progress", "eval_dataset", "run_loader"],
    ".modes": ["MC_DROPOUT_PATHS", "PASS_MODES", "head_only_dropout"],
    ".options": ["PREDICT_OPTIONS", "add_predict_options", "predict_config"],
    ".plan": ["cache_plan", "sample_label"],
    ".variables": ["CACHE_VARIABLES", "CacheVariable"],
})

__all__ = [
    "AMP_MODES",
    "CACHE_VARIABLES",
    "CHANNELS_LAST_CPU_FAMILIES",
    "DECODERS",
    "DEFAULT_PASSES",
    "DEVICE_DECODING_MODES",
    "IDENTITY_FIELDS",
    "MC_DROPOUT_PATHS",
    "OWN_UNCERTAINTY",
    "PASS_MODES",
    "PREDICT_CONFIG_OPTIONS",
    "PREDICT_OPTIONS",
    "REFERENCE_EXECUTION",
    "CacheVariable",
    "Decoder",
    "PredictConfig",
    "add_predict_options",
    "batch_progress",
    "cache_identity",
    "check_caches",
    "decoder_suggestion",
    "eval_dataset",
    "head_only_dropout",
    "predict",
    "predict_config",
    "predict_to_files",
    "resolve_channels_last",
    "run_loader",
]
