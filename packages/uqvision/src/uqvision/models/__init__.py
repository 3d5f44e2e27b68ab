"""Networks by name, their checkpoints and sidecars (shared by every protocol).

- :mod:`~uqvision.models.names`: :class:`ModelSpec` (which model to run);
- :mod:`~uqvision.models.spec`: :class:`LoadedModel`, the typed
  :data:`MODEL_SOURCES` registry (:class:`ModelSource`, :class:`PretrainedSource`),
  :func:`load_model`, :func:`data_config` (a model's preprocessing before it is built) and the
  checks before a run (:func:`check_model_name`, :func:`check_model_spec`);
- :mod:`~uqvision.models.sources`: the ``timm`` (``arch`` / ``arch.tag``) and ``tv``
  (``tv/<name>``, with timm's feature interface) model sources;
- :mod:`~uqvision.models.prototype`: the ``proto`` source (cosine prototype classifiers);
- :mod:`~uqvision.models.weights`: pretrained weights from the hub / torch.hub caches
  (:func:`pretrained_weights`, :func:`locate_pretrained`);
- :mod:`~uqvision.models.weight_files`: a weight file located (:class:`PretrainedWeights`)
  and the hashes of weight files (:func:`file_sha256`);
- :mod:`~uqvision.models.checkpoints`: checkpoint files and their JSON sidecars;
- :mod:`~uqvision.models.archs`: uqvision's tiny timm architectures (registered in timm);
- :mod:`~uqvision.models.spectral`: spectral normalisation of a featurizer (the training loop's
  ``spectral`` option).

Importing this package registers every model source (``proto`` included). The package
re-exports the public names of ``spec``, ``weights`` and ``checkpoints``
(:mod:`uqvision.models.core` re-exports the same, for older imports).
"""

from . import (
    prototype,  # noqa: F401  (registers the "proto" model source)
    sources,  # noqa: F401  (registers the "timm" and "tv" model sources)
)
from .checkpoints import *
from .spec import *
from .weights import *

__all__ = [
    "DROPOUT_TYPES",
    "MODEL_SOURCES",
    "LoadedModel",
    "ModelSource",
    "ModelSpec",
    "PretrainedSource",
    "PretrainedWeights",
    "check_checkpoint_file",
    "check_model_kwargs",
    "check_model_name",
    "check_model_spec",
    "check_pretrained",
    "check_sidecar_pretrained_cfg",
    "data_config",
    "existing_checkpoint",
    "file_sha256",
    "has_dropout",
    "hub_cache_dir",
    "load_model",
    "locate_pretrained",
    "pretrained_weights",
    "read_sidecar",
    "read_state_dict",
    "recorded_class_names",
    "sidecar_path",
    "tensors_only",
    "torch_hub_checkpoints",
    "weights_offline",
    "weights_sha256",
    "write_checkpoint",
]
