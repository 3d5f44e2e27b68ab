"""What a protocol is: :class:`Protocol` (its scorer, its options of ``uqvision score``, its
reproduction driver, the training methods it compares, its extra commands) and
:class:`Reproduction` (a driver of ``uqvision reproduce``).

A protocol folder's ``__init__`` builds one :class:`Protocol`, ``PROTOCOL``;
:mod:`uqvision.protocols` registers it in :data:`~uqvision.protocols.VISION_PROTOCOLS` (one line).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Command", "Protocol", "Reproduction"]


@dataclass(frozen=True)
class Reproduction:
    """A paper reproduction (``uqvision reproduce NAME``).

    Attributes
    ----------
    name, description : str
        The protocol's name and one-line help.
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


@dataclass(frozen=True)
class Command:
    """An extra ``uqvision`` subcommand a protocol brings: its handler (args -> exit status),
    its arguments and its one-line help."""

    run: Callable[[argparse.Namespace], int]
    arguments: Callable[[argparse.ArgumentParser], None]
    description: str


@dataclass(frozen=True)
class Protocol:
    """One evaluation protocol: everything the command line and the tests need of it.

    Attributes
    ----------
    name : str
        The folder's name; ``uqvision reproduce NAME``.
    description : str
        One line (CLI help).
    score : callable or None
        ``score(args) -> xarray.Dataset`` from the parsed ``uqvision score`` options
        (``args.caches``, ``args.dataset``, ``args.seed`` and the protocol's own options).
    score_name : str
        The name ``uqvision score --protocol`` knows the scorer by (``ensembles``, ``ood``, ...,
        as documented; the protocol's ``name`` is accepted too).
    add_options : callable or None
        ``add_options(parser)``: the protocol's own options of ``uqvision score`` (help text
        prefixed with the score name).
    reproduce : Reproduction or None
        The driver of ``uqvision reproduce NAME``.
    methods : tuple of str
        The training methods (entries of ``TRAINING_METHODS``) the protocol compares.
    commands : mapping
        Extra subcommands, name -> :class:`Command` (e.g. UIMNET's ``split``).
    smoke_options : mapping
        ``--set`` options for the cheapest run of the driver (``tests/test_protocols_common.py``).
    """

    name: str
    description: str
    score: Callable[[argparse.Namespace], Any] | None = None
    score_name: str = ""
    add_options: Callable[[argparse.ArgumentParser], None] | None = None
    reproduce: Reproduction | None = None
    methods: tuple[str, ...] = ()
    commands: Mapping[str, Command] = field(default_factory=dict)
    smoke_options: Mapping[str, str] = field(default_factory=dict)

    @property
    def scales(self) -> tuple[str, ...]:
        """The reproduction's scales (none without a driver)."""
        return self.reproduce.scales if self.reproduce else ()
