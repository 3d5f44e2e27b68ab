"""uqvision: image-classification uncertainty protocols on timm models.

Importing the package imports nothing else: its names are imported on first use, and the
first use of one (``uqvision.predict``, ``from uqvision import VISION_PROTOCOLS``,
``dir(uqvision)``) or :func:`load_registries` fills every registry: model sources (``timm``,
``tv``, ``proto``), training methods (the general ones of :mod:`uqvision.methods` and the
protocols' own learners), prediction modes (``crop`` included), evaluation sets and
:data:`VISION_PROTOCOLS`, then adds the installed plugins' entries (:mod:`uqvision.plugins`:
Python entry points). So does every ``uqvision`` command before it runs, and the first lookup
of a name these registries do not hold (a Dask worker that imported only the module of its
task finds ``crop`` or a plugin's model source there too). Until then a module imports only
what it needs: the command line builds its parsers without torch, timm or Dask
(docs/conventions.md#fast-help).

Public API
----------
- :func:`load_model`, :class:`ModelSpec` — networks by name (:mod:`uqvision.models`);
- :func:`train_model`, :class:`ImageTrainConfig`, :func:`load_run` — the one training loop
  (:mod:`uqvision.training`), :data:`TRAINING_METHODS`;
- :func:`predict`, :func:`predict_to_files`, :class:`PredictConfig`, :data:`PASS_MODES` —
  caches of per-sample outputs (:mod:`uqvision.predict`);
- :data:`EVAL_SETS` — evaluation sets, their roles and class maps (:mod:`uqvision.evalsets`);
- :data:`VISION_PROTOCOLS` — the protocols (:mod:`uqvision.protocols`);
- :func:`load_plugins` — the plugins' entries (done by :func:`load_registries`;
  :mod:`uqvision.plugins`);
- :func:`load_registries` — every registry filled (once).

Layers (each imports only the ones below it; ``.importlinter`` at the repository root):
``cli`` > ``demo``/``plugins`` > ``protocols`` > ``sweep`` > ``predict`` > ``methods`` >
``training`` > ``models`` > ``runtime``/``plots``/``options``/``evalsets`` > ``data`` >
``hierarchy``/``cache``/``layouts`` > ``exceptions``.
"""

__version__ = "0.1.0"

import importlib

from uqmetrics.runs.lazy import attach

#: The packages whose modules fill the registries, in this order (the general training methods
#: before the protocols' learners); then what each protocol registers (:attr:`uqvision.
#: protocols.Protocol.registers`) and the plugins.
_REGISTERING = ("methods", "data", "evalsets", "models", "predict", "training", "protocols")
_LOADED = False


def load_registries() -> None:
    """Fill every registry of the package, once: import the modules that register the
    built-in entries (training methods, prediction modes, model sources, evaluation sets,
    protocols, and what each protocol registers), then the installed plugins'
    (:func:`load_plugins`). Called by the first use of a name of the package, by every
    ``uqvision`` command before it runs, and by the first lookup of an unknown name in these
    registries."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for name in _REGISTERING:  # every module of the package (its names, imported on use)
        package = importlib.import_module(f"{__name__}.{name}")
        for attr in getattr(package, "__all__", ()):
            getattr(package, attr)
    for proto in importlib.import_module(f"{__name__}.protocols").VISION_PROTOCOLS.values():
        for module in proto.registers:
            importlib.import_module(module)
    importlib.import_module(f"{__name__}.plugins").load_plugins()
    for module, names in _EXPORTS.items():  # ``uqvision.predict``: the function, not the module
        globals().update({n: getattr(importlib.import_module(module, __name__), n)
                          for n in names})


_EXPORTS = {
    ".evalsets": ["EVAL_SETS"],
    ".models": ["ModelSpec", "load_model"],
    ".plugins": ["load_plugins"],
    ".predict": ["PASS_MODES", "PredictConfig", "predict", "predict_to_files"],
    ".protocols": ["VISION_PROTOCOLS"],
    ".training": ["TRAINING_METHODS", "ImageTrainConfig", "load_run", "train_model"],
}
__getattr__, __dir__ = attach(__name__, _EXPORTS, first=load_registries)

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
    "load_registries",
    "load_run",
    "predict",
    "predict_to_files",
    "train_model",
]
