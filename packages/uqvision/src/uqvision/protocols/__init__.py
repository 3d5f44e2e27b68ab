"""Paper reproductions: one driver per paper, registered in :data:`REPRODUCTIONS`.

``uqvision reproduce NAME --scale smoke|cpu --out DIR`` runs a driver on the generated
``hierarchy`` stand-in (docs/conventions.md#v-0); ``--data ROOT --arch NAME`` runs the same
code path on a real image folder with a real timm architecture. A driver trains (or reuses, after an
interruption) what its protocol needs, predicts into ``DIR/caches/``, scores into ``DIR/*.nc``
and draws the figures into ``DIR/figures/``.

A driver is a :class:`Reproduction` registered by a module of this package; the modules are
listed in :data:`DRIVER_MODULES` and imported by :func:`load_drivers` (the CLI calls it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from uqmetrics.registry import Registry

__all__ = ["DRIVER_MODULES", "REPRODUCTIONS", "Reproduction", "load_drivers"]


@dataclass(frozen=True)
class Reproduction:
    """A registered paper reproduction.

    Attributes
    ----------
    name, description : str
        Registry name (``uqvision reproduce NAME``) and one-line help.
    run : callable
        ``run(out, *, scale, data=None, arch=None, seed=0, overwrite=False, options=None,
        log=print, device="cpu") -> Path`` (``options``: the ``--set key=value`` pairs as a
        dict of strings; ``device``: where every network trains and predicts, ``--device``).
    scales : tuple of str
        The scales the driver knows (``smoke`` for tests, ``cpu`` for a 2-core machine, ...).
    """

    name: str
    description: str
    run: Callable[..., Path]
    scales: tuple[str, ...] = ("smoke", "cpu")


#: ``uqvision reproduce`` drivers by name.
REPRODUCTIONS: Registry[Reproduction] = Registry("reproduction")

#: Modules that register a driver when imported (add one line per new driver module).
DRIVER_MODULES: list[str] = ["uqvision.reproduce.selective", "uqvision.reproduce.uimnet",
                             "uqvision.reproduce.pitfalls", "uqvision.reproduce.url"]


def load_drivers() -> Registry[Reproduction]:
    """Import every module of :data:`DRIVER_MODULES` (each registers its driver) and return
    :data:`REPRODUCTIONS`."""
    for mod in DRIVER_MODULES:
        importlib.import_module(mod)
    return REPRODUCTIONS
