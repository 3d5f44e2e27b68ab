"""The vision protocols, one folder each, and :data:`VISION_PROTOCOLS`, their registry.

=============  =====================================================  ==========================
protocol       paper                                                  ``score --protocol``
=============  =====================================================  ==========================
``selective``  V.1, selective prediction over a model zoo             ``selective``
``pitfalls``   V.2, Pitfalls of in-domain uncertainty (ensembles)     ``ensembles``
``uimnet``     V.3, UIMNET in/out-domain split                        ``ood``
``url``        V.4, URL transfer of uncertainty                       ``transfer``
=============  =====================================================  ==========================

A protocol is a folder of this package whose ``__init__`` builds one :class:`Protocol`
(``PROTOCOL``: its scorer, its options of ``uqvision score``, its ``uqvision reproduce`` driver,
the training methods it compares, any extra command) and ONE line below registering it. The
command line takes every protocol's options, scorer, driver and commands from
:data:`VISION_PROTOCOLS`; ``tests/test_protocols_common.py`` runs each one at smoke scale.

A protocol builds on the shared machinery (:mod:`uqvision.predict`, :mod:`uqvision.methods`,
:mod:`uqvision.training`, :mod:`uqvision.models`, :mod:`uqvision.data`,
:mod:`uqvision.cache`), never the other way round, and no protocol imports another
(the import contracts of ``.importlinter``).

Examples
--------
>>> from uqvision.protocols import VISION_PROTOCOLS
>>> VISION_PROTOCOLS.names()
['selective', 'pitfalls', 'uimnet', 'url']
>>> VISION_PROTOCOLS.lookup("pitfalls").score_name, VISION_PROTOCOLS.lookup("uimnet").scales
('ensembles', ('smoke', 'cpu'))
"""

from __future__ import annotations

from uqmetrics.registry import Registry

from . import pitfalls, selective, uimnet, url
from .base import Command, LazyReproduction, Protocol, ReproduceOptions, Reproduction

__all__ = ["VISION_PROTOCOLS", "Command", "LazyReproduction", "Protocol", "ReproduceOptions",
           "Reproduction", "score_protocol"]

#: The protocols by name (``uqvision reproduce NAME``), in the papers' order. (Not named with
#: the bare upper-case word: tests/test_repository_docs.py reserves it for the team's private
#: specification, which nothing in the repository may cite.)
VISION_PROTOCOLS: Registry[Protocol] = Registry("protocol")
VISION_PROTOCOLS.add("selective", selective.PROTOCOL)
VISION_PROTOCOLS.add("pitfalls", pitfalls.PROTOCOL)
VISION_PROTOCOLS.add("uimnet", uimnet.PROTOCOL)
VISION_PROTOCOLS.add("url", url.PROTOCOL)


def score_protocol(name: str) -> Protocol:
    """The protocol ``uqvision score --protocol NAME`` means: by its score name (``ensembles``,
    ``ood``, ``transfer``, ``selective``) or its own name (``KeyError`` naming the choices)."""
    for proto in VISION_PROTOCOLS.values():
        if name in (proto.score_name, proto.name) and proto.score is not None:
            return proto
    raise KeyError(f"unknown score protocol {name!r}; choose from "
                   f"{[p.score_name for p in VISION_PROTOCOLS.values()]}")
