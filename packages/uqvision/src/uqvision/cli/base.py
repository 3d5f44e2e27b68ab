"""The machinery every ``uqvision`` command shares: the argument parser (one-line errors, no
abbreviated options, retired options refused with what to write instead, sub-commands whose
arguments are added when they are parsed), the help formatter, the building of sub-commands
(``uqvision COMMAND``, ``uqvision score PROTOCOL``, ``uqvision reproduce NAME``,
``uqvision data MAKER``), help read from a function's numpydoc docstring as plain text
(:func:`summary`, :func:`parameter_help`) and the printing of a result line.

This module and every module a parser is built from import no torch, timm or Dask: the
commands import what they run (docs/conventions.md#fast-help).
"""

from __future__ import annotations

import argparse
import inspect
import re
import textwrap
import typing
from collections.abc import Callable, Iterable, Sequence

from uqmetrics.runs.lazy import LazySubParsers
from uqmetrics.runs.run_config import finish_parse
from uqmetrics.runs.sweep import progress_line


def _print(msg: str) -> None:
    """A result line (a path written, a table) on stdout."""
    print(msg, flush=True)


def _progress(msg: str) -> None:
    """A progress line on stderr, none under ``uqvision --quiet``
    (:func:`uqmetrics.runs.sweep.progress_line`)."""
    progress_line(msg)


#: A Sphinx role (``:func:`~a.b``` -> ``b``, ``:data:`X``` -> ``X``).
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(~?)([^`]+)`")
#: A parameter documented as another function's (``As :func:`make_corrupted_folder`.``).
_AS = re.compile(r"As :[a-z]+:`~?([\w.]+)`\.?")


def plain_text(text: str) -> str:
    """Docstring text as the help shows it: Sphinx roles and literals unmarked
    (``:func:`~a.b``` -> ``b``, ````x```` -> ``x``), on one line, ``%`` escaped for argparse.

    Examples
    --------
    >>> plain_text("As :func:`~uqvision.data.make_corrupted_folder`; ``--out`` 5%")
    'As make_corrupted_folder; --out 5%%'
    """
    text = _ROLE.sub(lambda m: m.group(2).rpartition(".")[2] if m.group(1) else m.group(2),
                     text)
    return " ".join(text.replace("``", "").split()).replace("%", "%%")


def summary(func: typing.Callable) -> str:
    """The first paragraph of ``func``'s docstring, whole, as plain text (:func:`plain_text`)."""
    return plain_text((inspect.getdoc(func) or "").split("\n\n")[0])


def parameter_help(func: typing.Callable) -> dict[str, str]:
    """Each parameter's description in ``func``'s numpydoc ``Parameters`` section, whole, as
    plain text (:func:`plain_text`); ``a, b : int`` documents both; a description that reads
    ``As :func:`other`.`` is ``other``'s description of that parameter (a function of
    ``func``'s module)."""
    lines = (inspect.getdoc(func) or "").splitlines()
    heads = [i for i in range(len(lines) - 1)
             if lines[i].strip() and not lines[i].startswith(" ")
             and lines[i + 1].strip() and set(lines[i + 1].strip()) == {"-"}]
    start = next((i for i in heads if lines[i].strip() == "Parameters"), None)
    if start is None:
        return {}
    end = next((i for i in heads if i > start), len(lines))
    found: dict[str, list[str]] = {}
    names: list[str] = []
    for line in lines[start + 2:end]:
        if line.strip() and not line.startswith(" "):  # "name, other : type, default x"
            names = [n.strip() for n in line.partition(" : ")[0].split(",")]
            for n in names:
                found[n] = []
        elif line.strip():
            for n in names:
                found[n].append(line.strip())
    out = {}
    for name, words in found.items():
        text = " ".join(words)
        other = _AS.fullmatch(text)
        target = func.__globals__.get(other.group(1).rpartition(".")[2]) if other else None
        out[name] = (parameter_help(target).get(name, plain_text(text)) if callable(target)
                     else plain_text(text))
    return out


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (the project's error policy): ``uqvision
    predict: error: argument --seed: must be >= 0, got -1 (see uqvision predict -h)``, exit
    code 2. Options are never abbreviated (``allow_abbrev=False``, here and in every
    subcommand): ``--dataset`` must not be taken as ``--dataset-name``, which renames the
    caches. With ``lazy``, its subcommands get their arguments when parsed
    (:class:`_LazySubparsers`); an option of ``retired``
    (:func:`uqvision.score_options._retire`) is refused, anywhere on its line, with what to
    write instead. A command's ``--config FILE`` is laid under its command line when it is
    parsed (:func:`uqmetrics.runs.run_config.finish_parse`)."""

    def __init__(self, *args, lazy: bool = False, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        self.lazy = lazy
        self.retired: dict[str, str] = {}
        self.chosen: argparse.ArgumentParser | None = None  # the sub-command parsed (lazy)
        self.register("action", "parsers", _LazySubparsers)

    def innermost(self) -> argparse.ArgumentParser:
        """The parser of the sub-command parsed last (``uqvision score NAME``'s), whose
        ``prog`` names the command in its errors; this parser before any parse."""
        parser = self
        while getattr(parser, "chosen", None) is not None:
            parser = parser.chosen
        return parser

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


class _HelpFormatter(argparse.HelpFormatter):
    """Keeps the line breaks of registry descriptions (one line per choice), wraps each."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return [w for line in text.splitlines() for w in (textwrap.wrap(line, width) or [""])]


class _LazySubparsers(LazySubParsers):
    """Subcommands whose arguments are added when their command is parsed
    (:class:`uqmetrics.runs.lazy.LazySubParsers`): building every command's options would import
    what every command needs (the scorers, the demo, the metadata tables), and ``uqvision
    predict`` needs none of it; ``uqvision score PROTOCOL`` builds only that protocol's
    options. ``uqvision -h`` lists every command; ``uqvision COMMAND -h`` shows all of that
    command's options (or its sub-commands)."""


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
