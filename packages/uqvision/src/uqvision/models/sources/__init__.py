"""The model sources registered in :data:`~uqvision.models.MODEL_SOURCES` by importing them:
``timm`` (:mod:`~uqvision.models.sources.timm`) and ``tv``
(:mod:`~uqvision.models.sources.torchvision`); ``proto`` is
:mod:`uqvision.models.prototype`.

Each is a :class:`~uqvision.models.ModelSource` (here a :class:`~uqvision.models.
PretrainedSource`): ``check_name``, ``load``, ``data_config`` and ``pretrained``.
"""

from .timm import TimmSource, timm_data_config
from .torchvision import TorchvisionFeatures, TorchvisionSource, with_feature_interface

__all__ = ["TimmSource", "TorchvisionFeatures", "TorchvisionSource", "timm_data_config",
           "with_feature_interface"]
