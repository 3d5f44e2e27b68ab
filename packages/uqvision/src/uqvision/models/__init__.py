"""Networks by name, their checkpoints and sidecars (shared by every protocol).

- :mod:`~uqvision.models.core`: :class:`ModelSpec`, the :data:`MODEL_SOURCES` registry with
  the ``timm`` (``arch`` / ``arch.tag``) and ``tv`` (``tv/<name>``) sources, checkpoints and
  sidecars, pretrained weights from the hub / torch.hub caches (:func:`pretrained_weights`),
  :func:`load_model`;
- :mod:`~uqvision.models.prototype`: the ``proto`` source (cosine prototype classifiers);
- :mod:`~uqvision.models.archs`: uqvision's tiny timm architectures (registered in timm);
- :mod:`~uqvision.models.spectral`: spectral normalisation of a featurizer (the training loop's
  ``spectral`` option).

Importing this package registers every model source (``proto`` included): a module that only
imports :mod:`~uqvision.models.core` sees ``timm`` and ``tv``.
"""

from . import prototype  # noqa: F401  (registers the "proto" model source)
from .core import *  # the package re-exports core's public names, listed once there
from .core import __all__ as __all__
