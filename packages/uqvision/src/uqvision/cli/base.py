"""The machinery every ``uqvision`` command shares: the argument parser (one-line errors, no
abbreviated options, retired options refused with what to write instead, sub-commands whose
arguments are added when they are parsed), the help formatter, the building of sub-commands
(``uqvision COMMAND``, ``uqvision score PROTOCOL``, ``uqvision reproduce NAME``) and the
printing of a result line.
"""

from __future__ import annotations

import argparse
import textwrap
import typing
from collections.abc import Callable, Iterable, Sequence

from uqmetrics.run_config import finish_parse


def _print(msg: str) -> None:
    print(msg, flush=True)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (the project's error policy): ``uqvision
    predict: error: argument --seed: must be >= 0, got -1 (see uqvision predict -h)``, exit
    code 2. Options are never abbreviated (``allow_abbrev=False``, here and in every
    subcommand): ``--dataset`` must not be taken as ``--dataset-name``, which renames the
    caches. With ``lazy``, its subcommands get their arguments when parsed
    (:class:`_LazySubparsers`); an option of ``retired`` (:func:`_retire`) is refused, anywhere
    on its line, with what to write instead. A command's ``--config FILE`` is laid under its
    command line when it is parsed (:func:`uqmetrics.run_config.finish_parse`)."""

    def __init__(self, *args, lazy: bool = False, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        self.lazy = lazy
        self.retired: dict[str, str] = {}
        self.register("action", "parsers", _LazySubparsers)

    def parse_known_args(self, args=None, namespace=None):
        for i, arg in enumerate(args if self.retired and args is not None else ()):
            if arg == "--":
                break
            flag, eq, value = arg.partition("=")
            if flag in self.retired:
                value = value if eq else args[i + 1] if i + 1 < len(args) else "..."
                self.error(f"argument {flag}: {self.retired[flag].format(value=value)}")
        ns, extras = super().parse_known_args(args, namespace)
        return finish_parse(self, ns, args), extras  # a --config file under the command line

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} -h)\n")


def _retire(p: argparse.ArgumentParser, flag: str, message: str) -> None:
    """Refuse ``flag`` on ``p``'s line, before anything else is parsed, with ``message``
    (``{value}``: the value given to it), e.g. ``uqvision score --protocol X``."""
    if isinstance(p, _Parser):
        p.retired[flag] = message


class _HelpFormatter(argparse.HelpFormatter):
    """Keeps the line breaks of registry descriptions (one line per choice), wraps each."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return [w for line in text.splitlines() for w in (textwrap.wrap(line, width) or [""])]


class _LazySubparsers(argparse._SubParsersAction):
    """Subcommands whose arguments are added when their command is parsed: building every
    command's options would import what every command needs (the scorers, the demo, the
    metadata tables), and ``uqvision predict`` needs none of it; ``uqvision score PROTOCOL``
    builds only that protocol's options. ``uqvision -h`` lists every command; ``uqvision
    COMMAND -h`` shows all of that command's options (or its sub-commands)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pending: dict[argparse.ArgumentParser,
                           Callable[[argparse.ArgumentParser], None]] = {}

    def __call__(self, parser, namespace, values, option_string=None):
        chosen = self._name_parser_map.get(values[0])  # a name or an alias
        arguments = self.pending.pop(chosen, None) if chosen is not None else None
        if arguments is not None:
            arguments(chosen)
        super().__call__(parser, namespace, values, option_string)


def _add_subcommands(p: argparse.ArgumentParser, dest: str, metavar: str | None,
                     title: str | None,
                     entries: Iterable[tuple[str, Sequence[str], str,
                                             Callable[[argparse.ArgumentParser], None]]]
                     ) -> None:
    """Sub-commands of ``p`` (``uqvision COMMAND``, ``uqvision score PROTOCOL``, ``uqvision
    reproduce NAME``), the chosen name in ``dest``: ``entries`` of ``(name, aliases, help,
    arguments)``; ``arguments(parser)`` runs now, or when that sub-command is parsed if ``p``
    is lazy."""
    sub = p.add_subparsers(dest=dest, required=True, metavar=metavar, title=title)
    lazy = isinstance(sub, _LazySubparsers) and getattr(p, "lazy", False)
    for name, aliases, text, arguments in entries:
        kwargs = {"lazy": lazy} if isinstance(p, _Parser) else {}
        parser = sub.add_parser(name, aliases=list(aliases), help=text, description=text,
                                formatter_class=_HelpFormatter, allow_abbrev=False, **kwargs)
        if lazy:
            sub.pending[parser] = arguments
        else:
            arguments(parser)
