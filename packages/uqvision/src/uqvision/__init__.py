"""uqvision: image-classification uncertainty protocols on timm models.

Importing the package fills every registry: model sources (``timm``, ``tv``, ``proto``),
training methods (the general ones of :mod:`uqvision.methods` and the protocols' own
learners), prediction modes (``crop`` included), evaluation sets and :data:`VISION_PROTOCOLS`,
then adds the installed plugins' entries (:mod:`uqvision.plugins`: Python entry points).

Public API
----------
- :func:`load_model`, :class:`ModelSpec` — networks by name (:mod:`uqvision.models`);
- :func:`train_model`, :class:`ImageTrainConfig`, :func:`load_run` — the one training loop
  (:mod:`uqvision.training`), :data:`TRAINING_METHODS`;
- :func:`predict`, :func:`predict_to_files`, :class:`PredictConfig`, :data:`PASS_MODES` —
  caches of per-sample outputs (:mod:`uqvision.predict`);
- :data:`EVAL_SETS` — evaluation sets, their roles and class maps (:mod:`uqvision.evalsets`);
- :data:`VISION_PROTOCOLS` — the protocols (:mod:`uqvision.protocols`);
- :func:`load_plugins` — the plugins' entries (done on import; :mod:`uqvision.plugins`).

Layers (each imports only the ones below it; ``.importlinter`` at the repository root):
``cli`` > ``demo``/``plugins`` > ``protocols`` > ``sweep`` > ``predict`` > ``methods`` >
``training`` > ``models`` > ``runtime``/``plots``/``options``/``evalsets`` > ``data`` >
``hierarchy``/``cache``/``layouts`` > ``exceptions``.
"""

__version__ = "0.1.0"

# isort: off  (the order fills the registries: methods before the protocols' learners)
from . import methods  # noqa: F401  (registers the general training methods)
from .evalsets import EVAL_SETS
from .models import ModelSpec, load_model
from .plugins import load_plugins
from .predict import PASS_MODES, PredictConfig, predict, predict_to_files
from .protocols import VISION_PROTOCOLS
from .training import TRAINING_METHODS, ImageTrainConfig, load_run, train_model

# isort: on

load_plugins()  # the installed packages' protocols, methods, sources, sets, detectors

__all__ = [
    "EVAL_SETS",
    "PASS_MODES",
    "TRAINING_METHODS",
    "VISION_PROTOCOLS",
    "ImageTrainConfig",
    "ModelSpec",
    "PredictConfig",
    "__version__",
    "load_model",
    "load_plugins",
    "load_run",
    "predict",
    "predict_to_files",
    "train_model",
]
