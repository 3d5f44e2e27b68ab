"""What lets a command line build its parsers from light modules (no torch, timm or Dask), in
packages whose other modules import them (docs/conventions.md#fast-help):

- :func:`attach`: a package whose names are imported on first use (PEP 562), so that
  importing one of its modules imports that module alone;
- :class:`Catalog`: the entries of registries whose modules import torch, by name and
  description, known without importing them (the choices and help of an option), checked
  against the registries by the package's tests;
- :func:`plugin_names`: the installed plugins of an entry-point group, by name, read from the
  packages' metadata;
- :class:`LazySubParsers`: sub-commands whose arguments are added when their command is
  parsed, so that ``TOOL -h`` and ``TOOL COMMAND -h`` build one command's options only.

A package lists what it exports, by module, and gets its ``__getattr__`` and ``__dir__`` from
:func:`attach`::

    __getattr__, __dir__ = attach(__name__, {".config": ["PredictConfig"], ...})

``from uqvision.predict import PredictConfig`` then imports ``uqvision.predict.config`` only.

Examples
--------
>>> import types, sys
>>> pkg = types.ModuleType("pkg_of_the_example")
>>> pkg.__getattr__, pkg.__dir__ = attach("pkg_of_the_example", {"json": ["dumps"]})
>>> sys.modules["pkg_of_the_example"] = pkg
>>> pkg.dumps([1])
'[1]'
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata

__all__ = ["Catalog", "LazySubParsers", "attach", "plugin_names"]


def attach(package: str, exports: Mapping[str, Iterable[str]], *,
           first: Callable[[], None] | None = None
           ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a package whose names are imported on first use.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    exports : mapping
        Module, relative to the package (``".config"``, ``"..training.method"``) or absolute
        -> the names it exports.
    first : callable, optional
        Called before the first name is looked up (e.g. the imports that fill the package's
        registries).

    Returns
    -------
    tuple
        ``(__getattr__, __dir__)``. A submodule of the package is an attribute too
        (``uqvision.data.transforms``), imported on first use.

    Examples
    --------
    See the module's.
    """
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> object:
        if name in where:
            if first is not None:
                first()
            module = where[name]
            value = getattr(importlib.import_module(module, package if module.startswith(".")
                                                    else None), name)
        elif not name.startswith("__"):
            try:
                value = importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as err:
                if err.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__


def plugin_names(group: str) -> dict[str, str]:
    """The installed entry points of ``group``, name -> ``module:attr``, read from the
    packages' metadata: nothing is imported (what a help lists, e.g. the detectors of
    ``uqvision score ood -h``, plugins included, without torch).

    Parameters
    ----------
    group : str
        An entry-point group, e.g. ``"uqmetrics.detectors"``.

    Returns
    -------
    dict
        Sorted by name.
    """
    return {ep.name: ep.value for ep in sorted(metadata.entry_points().select(group=group),
                                               key=lambda ep: ep.name)}


def _description(item: object) -> str:
    """An entry's description: its ``description``, else its docstring; the first paragraph,
    on one line."""
    text = getattr(item, "description", None) or getattr(item, "__doc__", None) or ""
    return " ".join(str(text).strip().split("\n\n")[0].split())


@dataclass(frozen=True)
class Catalog:
    """The entries of registries whose modules import torch, by name and description, known
    without importing them: an option's choices and help.

    Attributes
    ----------
    registries : mapping
        kind -> (``"module:attribute"`` of the registry, the entry-point group of its plugins
        or None).
    built_in : mapping
        kind -> {name: description}, the package's own entries in the registry's order (the
        first paragraph of each description, on one line).
    fill : str, optional
        ``"module:function"`` that fills the registries (:meth:`from_registries` calls it).

    Examples
    --------
    >>> c = Catalog({"colour": ("uqmetrics.metrics.registry:METRIC_KINDS", None)},
    ...             {"colour": {"red": "the colour of fire"}})
    >>> c.names("colour"), c.describe("colour")
    (['red'], 'red: the colour of fire')
    """

    registries: Mapping[str, tuple[str, str | None]]
    built_in: Mapping[str, Mapping[str, str]]
    fill: str | None = None

    def _plugins(self, kind: str) -> dict[str, str]:
        group = self.registries[kind][1]
        return {n: v for n, v in (plugin_names(group) if group else {}).items()
                if n not in self.built_in[kind]}

    def names(self, kind: str) -> list[str]:
        """The names of registry ``kind``: the built-in ones, then the installed plugins'."""
        return [*self.built_in[kind], *self._plugins(kind)]

    def describe(self, kind: str) -> str:
        """One line per entry of registry ``kind``, ``name: description`` (as
        :meth:`uqmetrics.metrics.registry.Registry.describe`); a plugin's says where it comes from."""
        return "\n".join([*(f"{n}: {text}" for n, text in self.built_in[kind].items()),
                          *(f"{n}: plugin ({value})" for n, value in self._plugins(kind).items())])

    def from_registries(self) -> dict[str, dict[str, str]]:
        """:attr:`built_in` as the registries hold it once filled (their plugins left out):
        what the package's tests compare it with."""
        if self.fill:
            module, _, function = self.fill.partition(":")
            getattr(importlib.import_module(module), function)()
        out: dict[str, dict[str, str]] = {}
        for kind, (target, _group) in self.registries.items():
            module, _, attr = target.partition(":")
            reg = getattr(importlib.import_module(module), attr)
            out[kind] = {name: _description(item) for name, item in reg.items_ordered()
                         if name not in getattr(reg, "plugins", {})}
        return out

    def source(self, width: int = 100) -> str:
        """The Python source of ``BUILT_IN = {...}`` as the registries hold it
        (:meth:`from_registries`), lines of at most ``width`` characters: what to paste into
        the package's catalog after adding an entry to one of them."""
        lines = ["BUILT_IN: dict[str, dict[str, str]] = {"]
        for kind, entries in self.from_registries().items():
            lines.append(f"    {_quoted(kind)}: {{")
            for name, text in entries.items():
                head = f"        {_quoted(name)}: "
                parts = textwrap.wrap(text, width - 3 - len(head), drop_whitespace=False,
                                      break_on_hyphens=False) or [""]
                for i, part in enumerate(parts):
                    lines.append((head if i == 0 else " " * len(head)) + _quoted(part)
                                 + ("," if i == len(parts) - 1 else ""))
            lines.append("    },")
        lines.append("}")
        return "\n".join(lines)


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class LazySubParsers(argparse._SubParsersAction):
    """Sub-commands whose arguments are added when their command is parsed: building every
    command's options would import what every command needs, and ``TOOL COMMAND -h`` needs one
    command's. A parser registers it for its sub-commands (``parser.register("action",
    "parsers", LazySubParsers)``); ``add_parser(name, arguments=f, ...)`` then defers ``f(sub)``
    until ``name`` is parsed (the parser that chose it records it as ``chosen``), or until
    :meth:`complete`.

    Examples
    --------
    >>> p = argparse.ArgumentParser(prog="tool")
    >>> p.register("action", "parsers", LazySubParsers)
    >>> sub = p.add_subparsers(dest="command")
    >>> _ = sub.add_parser("go", arguments=lambda q: q.add_argument("--fast", action="store_true"))
    >>> p.parse_args(["go", "--fast"]).fast, p.chosen.prog
    (True, 'tool go')
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pending: dict[argparse.ArgumentParser,
                           Callable[[argparse.ArgumentParser], None]] = {}

    def add_parser(self, name: str, *, arguments: Callable[[argparse.ArgumentParser], None]
                   | None = None, **kwargs) -> argparse.ArgumentParser:
        """``add_parser`` of argparse, whose ``arguments(parser)`` runs when ``name`` is
        parsed."""
        parser = super().add_parser(name, **kwargs)
        if arguments is not None:
            self.pending[parser] = arguments
        return parser

    def complete(self) -> None:
        """Add every sub-command's arguments now (for tools that inspect the parsers)."""
        for parser in list(self.pending):
            self.pending.pop(parser)(parser)

    def built(self, name: str) -> argparse.ArgumentParser | None:
        """The sub-command ``name`` (or an alias), its arguments added now if they were not;
        None for a name it does not have."""
        chosen = self._name_parser_map.get(name)
        arguments = self.pending.pop(chosen, None) if chosen is not None else None
        if arguments is not None:
            arguments(chosen)
        return chosen

    def __call__(self, parser, namespace, values, option_string=None):
        chosen = self.built(values[0])
        parser.chosen = chosen
        super().__call__(parser, namespace, values, option_string)
