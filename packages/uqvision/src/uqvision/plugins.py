"""Plugins: protocols, training methods, model sources, evaluation sets and OOD detectors from
installed packages, through Python entry points.

A package adds to a registry by declaring an entry point in that registry's group; the object
it names is registered under the entry point's name when the registries are filled
(:func:`uqvision.load_registries`, :func:`load_plugins`); the names alone are read from the
installed packages' metadata without importing anything
(:func:`uqvision.catalog.plugin_names`):

=============================  =============================================  ==================
group                          registry                                       object
=============================  =============================================  ==================
``uqvision.training_methods``  :data:`uqvision.training.TRAINING_METHODS`     ``TrainingMethod``
``uqvision.model_sources``     :data:`uqvision.models.MODEL_SOURCES`          ``ModelSource``
``uqvision.eval_sets``         :data:`uqvision.evalsets.EVAL_SETS`            ``EvalSet``
``uqmetrics.detectors``        :data:`uqmetrics.metrics.detectors.DETECTORS`  ``Detector``
``uqvision.protocols``         :data:`uqvision.protocols.VISION_PROTOCOLS`    ``Protocol``
=============================  =============================================  ==================

In the plugin's ``pyproject.toml``::

    [project.entry-points."uqvision.protocols"]
    toy = "my_package:PROTOCOL"

Groups load in the order of the table (a plugin protocol may compare a plugin's training
method). A plugin that cannot be loaded (its import fails or calls ``sys.exit``, its object is of
the wrong type, its name is taken) is reported in one line naming it and skipped;
``uqvision plugins`` lists what was loaded and what was not.
"""

from __future__ import annotations

from importlib import metadata

from .catalog import plugin_names

__all__ = [
    "PLUGIN_GROUPS",
    "PLUGIN_REGISTRIES",  # noqa: F822  (module __getattr__: its registries, imported on use)
    "load_plugins",
    "plugin_names",
    "plugin_report",
]

#: The entry-point groups, in loading order, and the registry of each (``module:name``).
PLUGIN_GROUPS: dict[str, str] = {
    "uqvision.training_methods": "uqvision.training.method:TRAINING_METHODS",
    "uqvision.model_sources": "uqvision.models.spec:MODEL_SOURCES",
    "uqvision.eval_sets": "uqvision.evalsets.sets:EVAL_SETS",
    "uqmetrics.detectors": "uqmetrics.metrics.detectors:DETECTORS",
    "uqvision.protocols": "uqvision.protocols:VISION_PROTOCOLS",
}


def __getattr__(name: str):
    if name == "PLUGIN_REGISTRIES":  # the registries plugins join (imported on first use)
        import importlib

        return tuple(getattr(importlib.import_module(module), attr) for module, _, attr in
                     (target.partition(":") for target in PLUGIN_GROUPS.values()))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_plugins() -> dict[str, dict[str, str]]:
    """Register every installed plugin (:meth:`uqmetrics.metrics.registry.Registry.load_plugins` for
    each of :data:`PLUGIN_REGISTRIES`); a later call loads only the plugins installed since.

    Returns
    -------
    dict
        Group -> {entry point name: why it was not loaded} (empty dicts when all loaded).
    """
    installed = metadata.entry_points()  # the installed packages, listed once
    return {reg.group: reg.load_plugins(installed) for reg in __getattr__("PLUGIN_REGISTRIES")}


def plugin_report() -> str:
    """One line per plugin entry point: its group, name, what it points at, and whether it
    was loaded (``uqvision plugins``)."""
    lines = []
    for reg in __getattr__("PLUGIN_REGISTRIES"):
        lines += [f"{reg.group}: {name} = {value} (loaded)" for name, value in reg.plugins.items()]
        lines += [f"{reg.group}: {name} NOT LOADED: {why}" for name, why in reg.broken.items()]
    return "\n".join(lines) if lines else "no plugins installed"
