"""The vision protocols, one folder each, and :data:`VISION_PROTOCOLS`, their registry.

A protocol is a folder of this package whose ``__init__`` builds one :class:`Protocol`
(``PROTOCOL``: its scorer and options of ``uqvision score NAME``, its ``uqvision reproduce NAME``
driver and options, its figures of ``uqvision plot``, its scoring of ``uqvision sweep``, the
training methods it compares, any extra command, its section of ``docs/conventions.md``) and
ONE line below registering it (``VISION_PROTOCOLS.register(_folder("NAME"))``); a protocol
of another package registers through an entry point instead (:mod:`uqvision.plugins`). The command line takes every protocol's options, scorer, driver,
figures and commands from :data:`VISION_PROTOCOLS` and names none;
``tests/test_protocols_common.py`` checks each one's entry and runs it at smoke scale.
``uqvision score -h`` and ``uqvision reproduce -h`` list them, with their papers.

A protocol builds on the shared machinery (:mod:`uqvision.predict`, :mod:`uqvision.methods`,
:mod:`uqvision.training`, :mod:`uqvision.models`, :mod:`uqvision.data`,
:mod:`uqvision.cache`), never the other way round, and no protocol imports another
(the import contracts of ``.importlinter``).

Examples
--------
>>> from uqvision.protocols import VISION_PROTOCOLS, score_protocol
>>> all(VISION_PROTOCOLS.lookup(name).name == name for name in VISION_PROTOCOLS.names())
True
>>> all(score_protocol(alias) is p for p in VISION_PROTOCOLS.values() for alias in p.score_names)
True
"""

from __future__ import annotations

import importlib

from uqmetrics.metrics.registry import Registry

from .base import (
    Command,
    LazyReproduction,
    Plots,
    Protocol,
    ReproduceFlags,
    ReproduceOptions,
    Reproduction,
    ScoreTable,
    SweepPlan,
    SweepScoring,
    incomplete_caches,
)

__all__ = ["VISION_PROTOCOLS", "Command", "LazyReproduction", "Plots", "Protocol",
           "ReproduceFlags", "ReproduceOptions", "Reproduction", "ScoreTable", "SweepPlan",
           "SweepScoring", "incomplete_caches", "score_protocol"]

#: The protocols by name (``uqvision reproduce NAME``), in the papers' order. (Not named with
#: the bare upper-case word: tests/test_repository_docs.py reserves it for the team's private
#: specification, which nothing in the repository may cite.)
#: Plugins: entry-point group ``uqvision.protocols`` (:mod:`uqvision.plugins`).
VISION_PROTOCOLS: Registry[Protocol] = Registry("protocol", group="uqvision.protocols",
                                                item_type=Protocol)


def _folder(name: str) -> Protocol:
    """The ``PROTOCOL`` of this package's folder ``name`` (its name must be the folder's)."""
    proto = importlib.import_module(f"{__name__}.{name}").PROTOCOL
    if proto.name != name:
        raise RuntimeError(f"{__name__}.{name}.PROTOCOL is named {proto.name!r}, not {name!r}")
    return proto


# One line per protocol folder:
VISION_PROTOCOLS.register(_folder("selective"))
VISION_PROTOCOLS.register(_folder("pitfalls"))
VISION_PROTOCOLS.register(_folder("uimnet"))
VISION_PROTOCOLS.register(_folder("url"))
VISION_PROTOCOLS.register(_folder("shift"))
VISION_PROTOCOLS.register(_folder("ood"))
VISION_PROTOCOLS.register(_folder("conformal"))
VISION_PROTOCOLS.register(_folder("disentangle"))


def score_protocol(name: str) -> Protocol:
    """The protocol ``uqvision score NAME`` means: by its own name or its score name
    (``ensembles``, ``ood``, ``transfer``; :attr:`Protocol.score_names`); ``KeyError`` naming
    the choices."""
    for proto in VISION_PROTOCOLS.values():
        if name in proto.score_names and proto.score is not None:
            return proto
    raise KeyError(f"unknown score protocol {name!r}; choose from "
                   f"{[n for p in VISION_PROTOCOLS.values() if p.score is not None for n in p.score_names]}")
