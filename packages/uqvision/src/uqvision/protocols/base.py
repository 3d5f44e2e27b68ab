"""What a protocol is: :class:`Protocol` (its scorer, its options of ``uqvision score``, its
reproduction driver, the training methods it compares, its extra commands) and
:class:`Reproduction` (a driver of ``uqvision reproduce``).

A protocol folder's ``__init__`` builds one :class:`Protocol`, ``PROTOCOL``;
:mod:`uqvision.protocols` registers it in :data:`~uqvision.protocols.VISION_PROTOCOLS` (one line).
Importing a protocol imports only what registers its training methods and prediction modes:
its scorer, its options and its driver import their modules when first used (through
:class:`LazyReproduction` for the driver), so that ``uqvision predict`` and ``uqvision train``
load no scoring code.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Command", "LazyReproduction", "Protocol", "ReproduceOptions", "Reproduction"]


@dataclass(frozen=True)
class ReproduceOptions:
    """The options every driver takes besides its output folder, its ``--set`` options and its
    log: the defaults of ``Reproduction.run`` (``uqvision reproduce`` generates its options
    from these fields; tests/test_protocols_common.py checks each driver's signature against
    them).

    Attributes
    ----------
    scale : str
        A scale of the driver (``smoke``: tests, minutes; ``cpu``: 2 cores, under an hour).
    data : str or None
        A real image folder (``train/ val/ test/``) instead of the generated stand-in.
    arch : str or None
        The timm architecture for ``data`` (and URL's ``upstream``).
    seed : int
    device : str
        Where every network trains and predicts: ``cpu``, ``cuda`` or ``cuda:N``.
    overwrite : bool
        Recompute outputs that exist.
    """

    scale: str = "smoke"
    data: str | None = None
    arch: str | None = None
    seed: int = 0
    device: str = "cpu"
    overwrite: bool = False


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


class LazyReproduction:
    """A :class:`Reproduction` whose module is imported on the first use of ``run`` or
    ``scales`` (a driver imports the training, prediction and scoring stack).

    Parameters
    ----------
    name, description : str
        As the driver's (known without the import).
    module : str
        The module whose ``REPRODUCTION`` is the driver, e.g.
        ``"uqvision.protocols.url.reproduce"``.

    Examples
    --------
    >>> from uqvision.protocols import VISION_PROTOCOLS
    >>> driver = VISION_PROTOCOLS.lookup("url").reproduce
    >>> driver.name, driver.scales, driver.driver.run is driver.run
    ('url', ('smoke', 'cpu'), True)
    """

    def __init__(self, name: str, description: str, module: str):
        self.name = name
        self.description = description
        self.module = module

    @property
    def driver(self) -> Reproduction:
        """The module's :class:`Reproduction` (the module imported on first use)."""
        driver = importlib.import_module(self.module).REPRODUCTION
        if driver.name != self.name:
            raise RuntimeError(f"{self.module}.REPRODUCTION is {driver.name!r}, not {self.name!r}")
        return driver

    @property
    def run(self) -> Callable[..., Path]:
        """The driver's ``run`` (see :class:`Reproduction`)."""
        return self.driver.run

    @property
    def scales(self) -> tuple[str, ...]:
        """The driver's scales."""
        return self.driver.scales

    def __repr__(self) -> str:
        return f"LazyReproduction({self.name!r}, module={self.module!r})"


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
    reproduce : Reproduction or LazyReproduction or None
        The driver of ``uqvision reproduce NAME`` (lazily imported: :class:`LazyReproduction`).
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
    reproduce: Reproduction | LazyReproduction | None = None
    methods: tuple[str, ...] = ()
    commands: Mapping[str, Command] = field(default_factory=dict)
    smoke_options: Mapping[str, str] = field(default_factory=dict)

    @property
    def scales(self) -> tuple[str, ...]:
        """The reproduction's scales (none without a driver)."""
        return self.reproduce.scales if self.reproduce else ()
