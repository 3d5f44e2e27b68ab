"""Runs from a configuration file: the fully resolved configuration of a command, written as a
TOML file beside its results and recorded in their attrs, read back with ``--config FILE``, and
re-run from a result file (``uqreg rerun STUDY.nc``, ``uqvision rerun RESULT.nc``).

The mechanism is driven by the argument parser, so that every option a command has (those added
later included) is covered without being listed here:

- :func:`add_config_option` gives a command's parser ``--config FILE``. ``FILE`` is a TOML file
  (:func:`write_config_file`'s layout, or one written by hand) or a result file (``.nc``) whose
  attrs record the run (:data:`RUN_CONFIG_ATTR`). Its options become the command's values, and
  the options given on the command line override them. A file's value goes through the
  option's own argparse ``type`` and ``choices``, as if typed on the command line, so the
  defaults and the checks stay in one place: the options layer
  (:mod:`uqmetrics.runs.config_options` and the parsers built with it).
- The parser class of each command-line tool calls :func:`finish_parse` at the end of its
  ``parse_known_args``: it lays the file's values under those given on the command line and
  records which options the command has (:func:`resolved_config` reads them back).
- :func:`run_recorded` runs a command: it records the configuration for
  :func:`uqmetrics.runs.io.provenance_attrs` while the command runs (every result file written with
  provenance attrs carries it, as :data:`RUN_CONFIG_ATTR`, JSON), then writes the configuration
  files atomically beside the results, which the command refuses to replace without
  ``--overwrite``: a configuration file is replaced only with the results it describes.
- :func:`rerun_argv` is the command line that re-runs a result file's recorded command;
  :func:`rerun` prints it, checks it and runs it. A command that writes a result as a part of
  a larger one (``uqvision sweep`` scoring its caches) records the command that makes that
  result alone (``uqvision score selective`` on those caches, :func:`derived_config`) and,
  under ``part_of``, the larger one: a rerun makes the result again, and ``whole`` (``uqvision
  rerun --with-sweep``) reruns the larger command instead, whose ``--config RESULT`` reads the
  record of the command that parses it;
- ``--out`` of a rerun means what the recorded command's ``--out`` means: a file where it
  wrote a file (a score file, ``.nc``), a folder where it wrote a folder (caches, a sweep, a
  reproduction); the other kind is refused before anything runs.

A result file is data, never code (docs/conventions.md#rerun-rules), and so is a TOML file: the
one a command writes beside its results travels with them, and nothing tells a file someone
else wrote (or edited, its recorded ``host`` and ``user`` included) from one's own. Options are
read back from either with these differences from the command line:

- *launcher options* (:func:`uqmetrics.runs.config_options.is_launcher`: a cluster, its options,
  config and job count, a scheduler, a dashboard, worker and thread counts, the device) are
  never taken from a file: the user gives them on the command line (where ``--cluster-config
  FILE`` names a dask configuration of their own); ``--config`` names, in one line on stderr,
  those a file gave and that were not taken;
- ``overwrite`` is never taken from any file: only the command line replaces results;
- an output path (``out``, :data:`_OUTPUT_KEYS`) is taken from a file only relative, without
  ``..``, and resolves in the folder the command runs in; any other is refused, in one line
  naming the file, the key and the value, unless the command line gives the option (an option
  the command line must give stays so, unless the file gives an acceptable value). So a
  ``--config`` file written by a command (its ``out`` absolute) is run again with ``--out``,
  and :func:`rerun` always gives ``--out``: the user's, or with ``overwrite`` the recorded one
  where it is the result file or a folder that holds it;
- a recorded command that cannot be rerun (not one that reads ``--config``: ``rerun`` itself)
  is refused before a command line is built;
- the run records where it ran (``host``, ``user``, ``cwd``) and its path options absolute (a
  relative path that names an existing file or folder, and ``out``); a relative path a result
  file still holds is resolved against its recorded ``cwd``, and one that would name something
  else here is refused;
- before anything runs, every input the file records (its ``caches`` attr, ``{path:
  checksum}``) that the run would read again (inside a path option taken from the file) must
  still have its recorded checksum: a changed or missing input is refused, naming it;
- :func:`rerun` prints the command it runs, and runs a command recorded by another user or on
  another host (or a file that records neither) only with ``yes`` (``--yes``).

The keys of a configuration file are the options' long names without the leading dashes
(``batch-size``, ``workers``; ``batch_size`` is read as ``batch-size``, and a file giving both
spellings is refused), and a positional argument's name (``kind``); an option whose value is
none (not set: the command decides) is left out of the TOML file. Options of the tool itself,
before the command (``uqvision --threads``), are not part of a command's configuration.

Examples
--------
A configuration file as written by ``uqreg study --preset smoke --out results/s``::

    # uqreg study: the fully resolved configuration of a run (written by uqreg).
    # Run it again with: uqreg study --config THIS_FILE (options on the command line override it)
    command = "uqreg study"
    version = "0.1.0"
    git_commit = "a730825..."
    git_dirty = false
    host = "node17"
    user = "alice"
    cwd = "/home/alice/project"

    [options]
    preset = "smoke"
    out = "/home/alice/project/results/s"
    overwrite = false
    ...
"""

from __future__ import annotations

import argparse
import getpass
import hashlib
import json
import math
import os
import re
import shlex
import socket
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ..metrics.exceptions import InputError
from .config_options import (
    given_options,
    is_launcher,
    launcher_keys,
    mark_given,
    records_given,
)
from .current import RUN_CONFIG_ATTR, current_run_config, recording
from .lazy import LazySubParsers

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "CONFIG_SUFFIX",
    "RUN_CONFIG_ATTR",
    "add_config_option",
    "config_beside",
    "config_in",
    "config_in_by_digest",
    "config_origin",
    "current_run_config",
    "derived_config",
    "finish_parse",
    "read_config",
    "recorded_config",
    "recording",
    "rerun",
    "rerun_argv",
    "resolved_config",
    "run_recorded",
    "write_config_file",
]

#: How a configuration file's name ends: ``<out>/<command>.config.toml`` or
#: ``<result stem>.config.toml`` beside a single result file.
CONFIG_SUFFIX = ".config.toml"

#: A word of a recorded command after the tool: a sub-command's name (``sweep``, ``score``,
#: ``imagenet-c``), never an option or a value.
_COMMAND_WORD = re.compile(r"[a-z][a-z0-9_-]*")

#: The keys of a configuration file beside its ``[options]`` table (written, never required):
#: the command, the code that ran it, and where it ran (host, user, working folder).
_META_KEYS = ("command", "version", "git_commit", "git_dirty", "host", "user", "cwd")
#: The key of a result's record under which the larger command it was made by, as a part, is
#: recorded (:func:`derived_config`).
_PART_OF = "part_of"
#: The suffix of the files a command's ``--out`` names when that command writes one file
#: (a score file); any other ``--out`` is a folder (:func:`rerun_argv`).
_FILE_SUFFIX = ".nc"
#: The options that name where a command writes its results: paths whatever their value (the
#: others: when they name an existing path), recorded absolute; from a file, only a relative
#: path without ``..`` is taken (:func:`_outside`), resolved in the folder the command runs in.
_OUTPUT_KEYS = ("out",)
#: An option no file gives: only the command line replaces results.
_LINE_ONLY = ("overwrite",)

#: Namespace attributes: the values read from ``--config`` (until :func:`finish_parse` lays
#: them under the command line), and the options of the command parsed (:class:`_Options`).
_LAYER = "_config_file_layer"
_OPTIONS = "_run_options"
#: Where a parsed namespace keeps which values its ``--config`` file gave: ``{dest: (file, key
#: as the file writes it)}`` (:func:`config_origin`).
_ORIGIN = "_config_file_origin"


@dataclass(frozen=True)
class _Options:
    """The options of the command a namespace was parsed for: its name (the parser's ``prog``,
    e.g. ``uqvision score selective``), in order each option's key and ``dest``, and the keys
    whose values may be paths (:func:`_may_be_path`)."""

    command: str
    keys: tuple[tuple[str, str], ...]
    paths: frozenset[str] = frozenset()


@dataclass(frozen=True)
class _Layer:
    """The values of a ``--config`` file, converted (``{dest: value}``), and where they came
    from: ``left``, what a file gave that was not taken (``(dest, "--key value")`` each);
    ``refused``, the output paths it gave that are not taken (``{dest: why}``, one line each,
    :func:`_outside`), an error unless the command line gives the option; for a result file,
    ``paths`` (``{dest: (key, value as read)}``) and the inputs it records (``{path:
    checksum}``), checked by :func:`finish_parse` against the options it gives."""

    values: dict[str, Any]
    source: str
    keys: dict[str, str] = field(default_factory=dict)
    left: tuple[tuple[str, str], ...] = ()
    result: bool = False
    paths: dict[str, tuple[str, Any]] | None = None
    cwd: str | None = None
    inputs: dict[str, str] | None = None
    refused: dict[str, str] = field(default_factory=dict)


def _option_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """``{key: action}`` of every option and positional argument of ``parser`` that holds a
    value of the run (not ``--help``, ``--config``, sub-commands or actions that only print)."""
    out: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if (isinstance(action, (argparse._HelpAction, argparse._VersionAction,
                                argparse._SubParsersAction, _ConfigFile))
                or action.dest == argparse.SUPPRESS or action.default == argparse.SUPPRESS):
            continue
        longs = [s for s in action.option_strings if s.startswith("--")]
        key = (longs[0][2:] if longs else action.option_strings[0].lstrip("-")
               if action.option_strings else action.dest).replace("_", "-")
        out.setdefault(key, action)
    return out


def _key(name: str) -> str:
    return name.replace("_", "-")


def _may_be_path(action: argparse.Action) -> bool:
    """Whether ``action``'s values may be paths: strings of any text (no type, no choices)."""
    return action.type in (None, str) and action.choices is None and action.nargs != 0


class _ConfigFile(argparse.Action):
    """``--config FILE``: read ``FILE`` (:func:`read_config`), convert each value with its
    option's type and choices, and keep them for :func:`finish_parse`; the options the file
    gives are no longer required on the command line. Any problem is the parser's one-line
    error (exit code 2) naming the file, the key and the value.

    An output path the file gives and that is not taken (:func:`_outside`) leaves its option
    required all the same: :func:`finish_parse` refuses the run unless the command line gives
    it, in a line naming the file, the key and the value (rather than argparse's "required"
    line, which names no file)."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            layer = _layer(parser, values)
        except InputError as exc:
            parser.error(f"argument {option_string}: {exc}")
        for action in parser._actions:
            if action.dest in layer.values or action.dest in layer.refused:
                action.required = False
        setattr(namespace, _LAYER, layer)


def add_config_option(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` (a command's) ``--config FILE``: its options from a configuration file
    or a result file's recorded run; options on the command line override the file.

    The parser's class must call :func:`finish_parse` at the end of its ``parse_known_args``.
    """
    parser.add_argument(
        "--config", action=_ConfigFile, default=None, metavar="FILE",
        help=f"read the options from FILE: a configuration file (TOML; every command writes "
             f"its own beside its results, *{CONFIG_SUFFIX}) or a result file (.nc) whose run "
             "it records; options given on the command line override it")


def finish_parse(parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 arg_strings: Sequence[str] | None) -> argparse.Namespace:
    """End a parse of ``parser`` (called by the parser class's ``parse_known_args``): lay the
    values of ``--config`` under those given on the command line ``arg_strings`` (recorded as
    given, :func:`~uqmetrics.runs.config_options.given_options`, so that they override a preset
    as the command line does), and record the options of a command that has ``--config``
    (:func:`resolved_config`). Other parsers' namespaces are returned as they are."""
    layer = namespace.__dict__.pop(_LAYER, None)
    actions = _option_actions(parser)
    if layer is not None:
        given = _given_on_line(parser, actions, namespace, arg_strings or ())
        for dest, why in layer.refused.items():
            if dest not in given:
                parser.error(f"argument --config: {why}")
        taken = {dest: value for dest, value in layer.values.items() if dest not in given}
        if layer.result:
            try:
                _check_result(layer, given)
            except InputError as exc:
                parser.error(f"argument --config: {exc}")
        for dest, value in taken.items():
            setattr(namespace, dest, value)
        setattr(namespace, _ORIGIN, {dest: (layer.source, layer.keys[dest]) for dest in taken})
        mark_given(namespace, {a.dest for a in actions.values()
                               if a.dest in taken and records_given(a)})
        _say_left(layer, parser.prog, given)
    if any(isinstance(a, _ConfigFile) for a in parser._actions):
        setattr(namespace, _OPTIONS, _Options(parser.prog, tuple(
            (key, action.dest) for key, action in actions.items()), frozenset(
            key for key, action in actions.items() if _may_be_path(action))))
    return namespace


#: Why a file's launcher options are not taken (the stderr line of :func:`_say_left`).
_LAUNCHERS_LEFT = ("launcher options come from the command line only: a file, a result or a "
                   "TOML configuration, is data and never says where or how the work runs")


def config_origin(args: argparse.Namespace, dest: str) -> tuple[str, str] | None:
    """``(file, key)`` when the value of ``dest`` in parsed ``args`` came from the ``--config``
    file (the key as the file writes it, ``n_cal`` or ``n-cal``), so that an error about it
    can name the file and the key; None when the command line (or a default) gave it.

    Examples
    --------
    >>> import argparse
    >>> config_origin(argparse.Namespace(seed=3), "seed") is None
    True
    """
    return getattr(args, _ORIGIN, {}).get(dest)


def _say_left(layer: _Layer, prog: str, given: set[str]) -> None:
    """One line on stderr naming what a file gave that was not taken (launcher options,
    ``overwrite``), leaving out what the command line gives."""
    left = [(dest, text) for dest, text in layer.left if dest not in given]
    if left:
        why = [*([_LAUNCHERS_LEFT]
                 if any(dest not in _LINE_ONLY for dest, _ in left) else []),
               *(["--overwrite comes from the command line only"]
                 if any(dest in _LINE_ONLY for dest, _ in left) else [])]
        print(f"{prog}: --config {layer.source}: not taken from the file: "
              f"{', '.join(text for _, text in left)} ({'; '.join(why)})", file=sys.stderr,
              flush=True)


def _strings(value: Any) -> Iterator[str]:
    """The strings of a value as a file holds it (a list's items), and the PATH of each
    ``NAME=PATH``."""
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, str) and item:
            yield item
            name, eq, path = item.rpartition("=")
            if eq and name and path:
                yield path


def _check_result(layer: _Layer, given: set[str]) -> None:
    """Before anything runs, the paths a result file gives (those the command line does not):
    a relative one that names something here is refused (it was relative to another folder,
    or to one the file does not record: the run would read other files), and every input the
    file records inside one of them must still have its recorded checksum.

    Raises
    ------
    InputError
        Naming the option and its value, or the input, its recorded and its present checksum.
    """
    roots = []
    for dest, (key, value) in (layer.paths or {}).items():
        if dest in given:
            continue
        for text in _strings(value):
            if not os.path.isabs(text):
                if os.path.lexists(text) and key not in _OUTPUT_KEYS:
                    where = (f"relative to {layer.cwd!r}, where it names nothing"
                             if layer.cwd else "relative to a folder the file does not record")
                    raise InputError(
                        f"{layer.source!r} records --{key} {text!r}, a path {where}; here it "
                        f"names {os.path.abspath(text)!r}, which may be other files: give "
                        f"--{key} on the command line")
                continue
            roots.append(Path(os.path.realpath(text)))
    for path, recorded in (layer.inputs or {}).items():
        p = Path(path)
        if not any(p == root or root in p.parents for root in roots):
            continue  # not read by this run (its option is given on the command line)
        now = _checksum_now(p)
        if now != recorded:
            state = "no longer exists or cannot be read" if now is None else \
                f"now has checksum {now[:12]}..."
            raise InputError(
                f"{layer.source!r} was computed from {path!r} (checksum {str(recorded)[:12]}...), "
                f"which {state}: the run would read other inputs (restore them, or give the "
                "option that names them on the command line)")


def _checksum_now(path: Path) -> str | None:
    """The checksum a result records for an input (:func:`uqmetrics.input_checksum`: a
    cache's ``checksum`` attr, read from its header, else its data's), or None when it is
    missing or unreadable."""
    from .io import READ_ERRORS, IncompleteResultError, open_netcdf, read_dataset
    from .result_schema import input_checksum

    try:
        with open_netcdf(path) as ds:
            own = ds.attrs.get("checksum")
        return own if isinstance(own, str) else input_checksum(read_dataset(path))
    except (*READ_ERRORS, IncompleteResultError, ValueError):
        return None


def _given_on_line(parser: argparse.ArgumentParser, actions: Mapping[str, argparse.Action],
                   namespace: argparse.Namespace, arg_strings: Sequence[str]) -> set[str]:
    """The dests given on the command line: an option whose flag is among ``arg_strings``
    (``--flag value`` or ``--flag=value``; no option is abbreviated), a positional argument
    whose value is not its default."""
    given = set(given_options(namespace))
    tokens = set()
    for token in arg_strings:
        if token == "--":
            break
        tokens.add(token.split("=", 1)[0] if token.startswith("--") else token)
    for action in actions.values():
        if action.option_strings:
            if tokens & set(action.option_strings):
                given.add(action.dest)
        elif getattr(namespace, action.dest, action.default) != action.default:
            given.add(action.dest)
    return given


# ------------------------------------------------------------------------------------------------
# reading


def read_config(path: str | os.PathLike, *, command: str | None = None) -> dict[str, Any]:
    """The options of a configuration file (TOML) or of the run a result file (``.nc``)
    records, ``{key: value}`` (keys as in the file; values as TOML or JSON holds them).

    Parameters
    ----------
    path : path-like
        A TOML file: optional ``command``, ``version``, ``git_commit``, ``git_dirty`` keys and
        an ``[options]`` table; or a netCDF result file with the attr :data:`RUN_CONFIG_ATTR`.
    command : str, optional
        The command the options are for (``"uqreg study"``): a file recording another command
        is refused.

    Raises
    ------
    InputError
        The file cannot be read, is not TOML, has a key other than those above, a result file
        records no run, or it records another command; the message names the file.
    """
    return dict(_read(path, command=command)[0].get("options", {}))


def _read(path: str | os.PathLike, *, command: str | None = None
          ) -> tuple[dict[str, Any], dict[str, str] | None]:
    """(what :func:`read_config`'s file holds, its meta keys included; the inputs a result
    file records, ``{path: checksum}``, None for a TOML file)."""
    p = Path(path)
    inputs = None
    if p.suffix == ".nc":
        data, inputs = _recorded(p)
    else:
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeError) as exc:
            raise InputError(f"cannot read {str(p)!r}: {getattr(exc, 'strerror', None) or exc}") \
                from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"{str(p)!r} is not a TOML file: {exc}") from None
        unknown = [k for k in data if k not in (*_META_KEYS, "options")]
        if unknown:
            raise InputError(f"{str(p)!r}: unknown key {unknown[0]!r} = "
                             f"{_shown(data[unknown[0]])} (a configuration file holds "
                             f"{', '.join(_META_KEYS)} and the [options] table)")
    options = data.get("options", {})
    if not isinstance(options, Mapping):
        raise InputError(f"{str(p)!r}: 'options' must be a table, got {_shown(options)}")
    recorded = data.get("command")
    part_of = data.get(_PART_OF)
    if command is not None and recorded is not None and recorded != command:
        if isinstance(part_of, Mapping) and part_of.get("command") == command \
                and isinstance(part_of.get("options"), Mapping):
            return dict(part_of), inputs  # a sweep's score file read by the sweep
        raise InputError(f"{str(p)!r} records a run of {recorded!r}, not of {command!r}")
    return data, inputs


def recorded_config(path: str | os.PathLike) -> dict[str, Any]:
    """The run a result file records (:data:`RUN_CONFIG_ATTR`): ``command``, ``version``,
    ``git_commit``, ``git_dirty`` and ``options`` (:func:`resolved_config`).

    Raises
    ------
    InputError
        The file cannot be read, or it records no run (written by an earlier version, or by
        the library rather than a command).
    """
    return _recorded(path)[0]


def _recorded(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, str]]:
    """(:func:`recorded_config`, the inputs the file records: its ``caches`` attr, ``{path:
    checksum}``, empty when it records none)."""
    from .io import READ_ERRORS, decode_attr, open_netcdf

    p = Path(path)
    try:
        with open_netcdf(p) as ds:
            raw = ds.attrs.get(RUN_CONFIG_ATTR)
            caches = decode_attr(ds.attrs.get("caches"))
    except READ_ERRORS as exc:
        raise InputError(f"cannot read {str(p)!r}: {getattr(exc, 'strerror', None) or exc}") \
            from None
    if raw is None:
        raise InputError(f"{str(p)!r} records no run configuration (no {RUN_CONFIG_ATTR!r} "
                         "attr): it was written by an earlier version or by the library, not "
                         "by a command; run the command again with its options")
    try:
        data = json.loads(raw)
    except (TypeError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise InputError(f"{str(p)!r}: its {RUN_CONFIG_ATTR!r} attr is damaged ({exc})") \
            from None
    if not isinstance(data, dict) or not isinstance(data.get("options"), dict):
        raise InputError(f"{str(p)!r}: its {RUN_CONFIG_ATTR!r} attr is damaged (not a JSON "
                         "object with options)")
    inputs = {str(k): str(v) for k, v in caches.items()} if isinstance(caches, dict) else {}
    return data, inputs


def _shown(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (str, bool, list, dict)) else repr(value)


def _layer(parser: argparse.ArgumentParser, path: str | os.PathLike) -> _Layer:
    """The values of ``--config path`` for ``parser``: each checked and converted by its
    option's action (type, choices, nargs) as the command line's would be; ``None`` (a JSON
    null: not set) leaves the option at its default. ``overwrite`` and launcher options are
    never taken; from a result file (``.nc``) a relative path is resolved against the folder
    the run records (``cwd``), where it names something there. An output path
    (:data:`_OUTPUT_KEYS`) is taken only relative, without ``..`` (:func:`_outside`), and is
    resolved in the folder the command runs in, never against the recorded ``cwd``: what the
    file gives otherwise is kept in ``refused``, for :func:`finish_parse`.

    Raises
    ------
    InputError
        :func:`read_config`'s, an unknown key, a key given twice (``n-cal`` and ``n_cal``), a
        value its option refuses (any error of its type: one line naming the file, the key and
        the value).
    """
    source = str(path)
    data, inputs = _read(path, command=parser.prog)
    result = inputs is not None
    cwd = data.get("cwd") if result else None
    cwd = cwd if isinstance(cwd, str) and os.path.isabs(cwd) else None
    actions = _option_actions(parser)
    values: dict[str, Any] = {}
    keys: dict[str, str] = {}
    paths: dict[str, tuple[str, Any]] = {}
    left: list[tuple[str, str]] = []
    refused: dict[str, str] = {}
    seen: dict[str, str] = {}
    for key, value in data.get("options", {}).items():
        name = _key(str(key))
        action = actions.get(name)
        if action is None:
            raise InputError(f"{source!r}: unknown key {key!r} = {_shown(value)} (not an "
                             f"option of {parser.prog}; its options: {', '.join(actions)})")
        if name in seen:
            raise InputError(f"{source!r}: keys {seen[name]!r} and {key!r} are one option "
                             f"(--{name}): give it once")
        seen[name] = str(key)
        if value is None:
            continue
        if is_launcher(action):  # never from a file: a file is data
            if value != _plain(action.default):
                left.append((action.dest, f"--{name} {_shown(value)}"))
            continue
        if launcher_keys(action) and isinstance(value, list):  # --set workers=4
            # the key as the option reads it (`` workers =8`` is ``workers``)
            dropped = [v for v in value
                       if str(v).split("=", 1)[0].strip() in launcher_keys(action)]
            left += [(action.dest, f"--{name} {_shown(v)}") for v in dropped]
            value = [v for v in value if v not in dropped] or None
            if value is None:
                continue
        if cwd is not None and _may_be_path(action) and name not in _OUTPUT_KEYS:
            value = _anchored(value, cwd, name)
        try:
            converted = _value(action, value)
        except (TypeError, ValueError, ArithmeticError, argparse.ArgumentTypeError) as exc:
            raise InputError(f"{source!r}: key {key!r} = {_shown(value)}: "
                             f"{' '.join(str(exc).split())}") from None
        why = _outside(converted) if name in _OUTPUT_KEYS else None
        if why is not None:
            refused[action.dest] = (
                f"{source!r}: key {key!r} = {_shown(value)} is {why}: a file names where "
                "results are written only as a path relative to the folder the command runs "
                f"in, without '..'; give --{name} on the command line, which is taken")
            continue
        if name in _LINE_ONLY:
            if converted != action.default:
                left.append((action.dest, f"--{name}" if converted is True
                             else f"--{name} {_shown(value)}"))
            continue
        values[action.dest] = converted
        keys[action.dest] = str(key)
        if result and _may_be_path(action):
            paths[action.dest] = (name, value)
    return _Layer(values, source, keys, tuple(left), result, paths, cwd, inputs, refused)


def _outside(path: str) -> str | None:
    """Why an output path a file gives is not taken (None: it is): an absolute path, one that
    starts with ``~`` (a home folder, once expanded), or one with a ``..`` part, any of which
    may name a place outside the folder the command runs in (a configuration file received
    from someone else would choose where results are written: another user's
    ``~/.config/autostart``)."""
    if os.path.isabs(path):
        return "an absolute path"
    if path.startswith("~"):
        return "a path in a home folder"
    if ".." in Path(path).parts:
        return "a path with '..'"
    return None


def _anchored(value: Any, base: str, key: str) -> Any:
    """``value`` (as a file holds it) with each relative path made absolute against the folder
    ``base``: a string that names an existing path there (or any, for an option of
    :data:`_OUTPUT_KEYS`), or the PATH of ``NAME=PATH`` that does; a list item by item."""
    if isinstance(value, list):
        return [_anchored(v, base, key) for v in value]
    if not isinstance(value, str) or not value or os.path.isabs(value):
        return value
    if key in _OUTPUT_KEYS or os.path.lexists(os.path.join(base, value)):
        return os.path.normpath(os.path.join(base, value))
    name, eq, path = value.rpartition("=")
    if eq and name and path and not os.path.isabs(path) \
            and os.path.lexists(os.path.join(base, path)):
        return f"{name}={os.path.normpath(os.path.join(base, path))}"
    return value


def _value(action: argparse.Action, value: Any) -> Any:
    """A file's ``value`` for ``action``, as parsing it on the command line would give."""
    if action.nargs == 0:  # a flag: store_true/false, --x/--no-x
        if not isinstance(value, bool):
            raise TypeError("expected true or false")
        return value
    many = (isinstance(action, (argparse._AppendAction, argparse._ExtendAction))
            or action.nargs in ("+", "*", argparse.REMAINDER) or isinstance(action.nargs, int))
    if many:
        if not isinstance(value, list):
            raise TypeError("expected a list")
        return [_one(action, v) for v in value]
    if isinstance(value, list):  # a comma-separated option (1,2,5), written as a list
        if not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
            raise TypeError("expected a list of numbers or strings")
        value = ",".join(str(v) for v in value)
    return _one(action, value)


def _one(action: argparse.Action, value: Any) -> Any:
    """One argument of ``action`` through its type and choices."""
    if action.type is None or action.type is str:
        if not isinstance(value, str):
            raise TypeError("expected a string")
        converted = value
    else:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise TypeError("expected a number or a string")
        text = value if isinstance(value, str) else _text(value)
        try:
            converted = action.type(text)
        except argparse.ArgumentTypeError:
            raise
        except (TypeError, ValueError, ArithmeticError):
            name = getattr(action.type, "__name__", repr(action.type))
            raise ValueError(f"invalid {name} value: {text!r}") from None
    if action.choices is not None and converted not in action.choices:
        raise ValueError(f"choose from {', '.join(map(str, action.choices))}")
    return converted


def _text(number: float) -> str:
    return repr(number) if isinstance(number, float) and math.isfinite(number) else str(number)


# ------------------------------------------------------------------------------------------------
# the resolved configuration of a run


def resolved_config(args: argparse.Namespace) -> dict[str, Any] | None:
    """The fully resolved configuration of the command ``args`` was parsed for (``None`` for a
    command without ``--config``): ``command`` (``"uqreg study"``), the tool's ``version``,
    ``git_commit`` and ``git_dirty`` (:func:`uqmetrics.runs.io.source_revision`), where it runs
    (``host``, ``user``, and ``cwd``, the working folder), and ``options``: every option's value
    (defaults included; ``None``: not set), JSON-safe, its paths absolute (:func:`_anchored`:
    ``out``, and a relative path that names an existing file or folder)."""
    from .io import source_revision

    options: _Options | None = getattr(args, _OPTIONS, None)
    if options is None:
        return None
    tool = options.command.split()[0]
    try:
        tool_version = version(tool)
    except PackageNotFoundError:
        tool_version = "unknown"
    commit, dirty = source_revision(tool)
    return {"command": options.command, "version": tool_version,
            "git_commit": commit or "unknown", "git_dirty": dirty, "host": socket.gethostname(),
            "user": _user(), "cwd": os.getcwd(), "options": _resolved_options(args)}


def derived_config(parser: argparse.ArgumentParser, values: Mapping[str, Any], *,
                   part_of: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The configuration of the command ``parser`` parses, as :func:`resolved_config` gives it
    for a run here with ``values`` (``{dest: value}``; the other options at their defaults):
    what a larger command records in a result it makes as one of its parts, so that a rerun
    of that result runs this command alone (``uqvision sweep`` writing its scores records
    ``uqvision score selective`` on the sweep's caches).

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The parser of the command (its ``prog``: the command, ``"uqvision score selective"``),
        built complete.
    values : mapping
        Option destinations -> values, as a parse would give them.
    part_of : mapping, optional
        The configuration of the larger command (:func:`current_run_config`), recorded under
        ``part_of``: ``rerun(..., whole=True)`` runs it, and its ``--config RESULT`` reads it.

    Returns
    -------
    dict
        As :func:`resolved_config`'s, with ``part_of``.
    """
    actions = _option_actions(parser)
    args = argparse.Namespace(**{a.dest: values.get(a.dest, a.default) for a in actions.values()})
    setattr(args, _OPTIONS, _Options(parser.prog, tuple(
        (key, action.dest) for key, action in actions.items()), frozenset(
        key for key, action in actions.items() if _may_be_path(action))))
    config = resolved_config(args)
    if part_of is not None:
        config[_PART_OF] = {k: v for k, v in part_of.items() if k != _PART_OF}
    return config


def _user() -> str:
    """The name of the user running this process (its uid where it has none)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid()) if hasattr(os, "getuid") else "unknown"


def _resolved_options(args: argparse.Namespace) -> dict[str, Any]:
    options: _Options = getattr(args, _OPTIONS)
    here = os.getcwd()
    return {key: _anchored(_plain(getattr(args, dest, None)), here, key)
            if key in options.paths else _plain(getattr(args, dest, None))
            for key, dest in options.keys}


def _plain(value: Any) -> Any:
    """A value as JSON and TOML hold it: tuples as lists, paths as strings, numpy scalars as
    Python numbers; anything else by its text."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        return _plain(value.item())
    return str(value)


def _digest(config: Mapping[str, Any]) -> str:
    """8 hex digits of a configuration's command and options (``out`` aside: the file is in
    it)."""
    options = {k: v for k, v in config["options"].items() if k != "out"}
    text = json.dumps([config["command"], options], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _toml_text(config: Mapping[str, Any]) -> str:
    import tomli_w

    options = config["options"]
    unset = [k for k, v in options.items() if v is None]
    head = [(f"# {config['command']}: the fully resolved configuration of a run (written by "
             f"{config['command'].split()[0]})."),
            (f"# Run it again with: {config['command']} --config THIS_FILE --out OUT (options "
             "given on the command line override it)")]
    if unset:
        head.append(f"# Not set (the command decides): {', '.join(unset)}")
    body = {k: config[k] for k in _META_KEYS if config.get(k) is not None}
    body["options"] = {k: v for k, v in options.items() if v is not None}
    return "\n".join(head) + "\n" + tomli_w.dumps(body)


def write_config_file(path: str | os.PathLike, config: Mapping[str, Any]) -> Path:
    """Write ``config`` (:func:`resolved_config`) to ``path`` as TOML, atomically (a temporary
    file beside it, then renamed)."""
    from .io import _fsync_path, temporary_beside

    p = Path(path)
    text = _toml_text(config)
    with temporary_beside(p) as tmp:
        tmp.write_text(text, encoding="utf-8")
        _fsync_path(tmp)
        os.replace(tmp, p)
    return p


def _check_target(path: Path) -> None:
    """Refuse, before any work, a configuration file ``path`` that is a folder."""
    if path.is_dir():
        raise InputError(f"--out: {str(path)!r} is a folder where the configuration file goes")


def run_recorded(args: argparse.Namespace, run: Callable[[], int],
                 files: Callable[[argparse.Namespace, Mapping[str, Any]], Sequence[Path]]
                 | None = None) -> int:
    """Run a command (``run()``, its exit status), recording its configuration.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed command line (a command without ``--config`` runs as it is).
    run : callable
        ``run() -> int``: the command.
    files : callable, optional
        ``files(args, config) -> paths``: the configuration files the command writes (called
        first: it may resolve a default output in ``args``, which the configuration then
        records). Each is written, atomically, when the command returns 0 or 1 (a sweep's
        finished cells are kept), by rank 0 under ``torchrun``: it follows the command's
        results, which the command refuses to replace without ``--overwrite`` before any work,
        so that an existing file is replaced only by a run that wrote there (a file named by
        its options, :func:`config_in_by_digest`, for a command whose runs share a folder,
        is replaced only by the same run).

    Returns
    -------
    int
        ``run()``'s exit status.
    """
    config = resolved_config(args)
    if config is None:
        return run()
    targets = [Path(p) for p in files(args, config)] if files else []
    config["options"] = _resolved_options(args)  # with the outputs ``files`` resolved
    for target in targets:
        _check_target(target)
    with recording(config):
        status = run()
    if status in (0, 1) and int(os.environ.get("RANK", "0")) == 0:
        for target in targets:
            write_config_file(target, config)
    return status


def config_beside(result: str | os.PathLike) -> Path:
    """``<result stem>.config.toml`` beside a single result file."""
    p = Path(result)
    return p.with_name(p.stem + CONFIG_SUFFIX)


def config_in(folder: str | os.PathLike, command: str) -> Path:
    """``<folder>/<command>.config.toml``: the configuration of a command that writes a
    folder."""
    return Path(folder) / f"{command}{CONFIG_SUFFIX}"


def config_in_by_digest(folder: str | os.PathLike, command: str,
                        config: Mapping[str, Any]) -> Path:
    """``<folder>/<command>.<8 hex digits>.config.toml``, named by the configuration's
    :func:`_digest`: for a command whose runs add to a shared folder (``uqvision predict``),
    the same run finds its own file again and another run writes its own."""
    return Path(folder) / f"{command}.{_digest(config)}{CONFIG_SUFFIX}"


def _rerun_record(result: str | os.PathLike, whole: bool) -> dict[str, Any]:
    """The record a rerun of ``result`` runs: its own run's, or with ``whole`` the larger
    command's it was part of (:func:`derived_config`); ``InputError`` when it has none."""
    config = recorded_config(result)
    if not whole:
        return config
    part_of = config.get(_PART_OF)
    if not (isinstance(part_of, Mapping) and isinstance(part_of.get("options"), Mapping)):
        raise InputError(f"{str(result)!r} records a run of {config.get('command')!r}, part "
                         "of no larger command: rerun it without --with-sweep")
    return dict(part_of)


def _check_out_kind(out: str, config: Mapping[str, Any]) -> None:
    """Refuse an ``out`` of the other kind than the recorded command's ``--out``: a file
    (``.nc``) where it wrote a file, a folder where it wrote a folder."""
    recorded = config["options"].get("out")
    if not isinstance(recorded, str) or not recorded:
        return
    command = config.get("command")
    if recorded.endswith(_FILE_SUFFIX) and not (out.endswith(_FILE_SUFFIX)
                                                and not os.path.isdir(out)):
        raise InputError(f"--out {out!r}: {command} writes a file, {recorded!r} in the run "
                         f"recorded; give a file name ending in {_FILE_SUFFIX}")
    if not recorded.endswith(_FILE_SUFFIX) and (out.endswith(_FILE_SUFFIX)
                                                or os.path.isfile(out)):
        raise InputError(f"--out {out!r}: {command} writes a folder, {recorded!r} in the run "
                         "recorded; give a folder")


def rerun_argv(result: str | os.PathLike, tool: str, *, out: str | None = None,
               overwrite: bool = False, options: Sequence[str] = (), whole: bool = False,
               parser: argparse.ArgumentParser | None = None) -> list[str]:
    """The command line (after ``tool``) that runs again the command a result file records:
    ``<command> --config RESULT --out OUT [--overwrite] [OPTIONS...]``.

    Without ``out`` the run writes where the recorded one did, which is refused unless
    ``overwrite``, and unless that recorded ``--out`` is the result file itself or a folder
    that holds it (:func:`_recorded_out`); it is then given on the command line, since a
    file never gives an absolute ``--out`` (:func:`_outside`). ``out`` is of the recorded
    ``--out``'s kind, a file (``.nc``) or a folder. ``options``: further options of the
    command, given by the user (launcher options among them: a result file gives none).
    ``whole``: the larger command the result was made by as a part, when it records one
    (``uqvision sweep``, which wrote a score file: ``uqvision rerun --with-sweep``), instead of
    the command that makes that result alone. ``parser``: the tool's parser (lazy or
    complete; :func:`rerun` always gives it), of which the recorded command must be a command
    that reads ``--config``.

    Raises
    ------
    InputError
        The file records no run, or a run of another tool, or a command that cannot be rerun
        (not one of ``parser``'s commands with ``--config``: ``rerun`` itself, ``plot``);
        ``whole`` for a file that records no larger command; an ``out`` of the other kind.
    """
    config = _rerun_record(result, whole)
    command = str(config.get("command", "")).split()
    if not command or command[0] != tool:
        raise InputError(f"{str(result)!r} records a run of {' '.join(command)!r}; re-run it "
                         f"with {command[0] if command else 'its tool'} rerun")
    if not all(_COMMAND_WORD.fullmatch(word) for word in command[1:]):
        # a command is the tool and its sub-command names: an option smuggled into it
        # (``uqvision sweep --cluster ...``) would bypass what a result file may give
        raise InputError(f"{str(result)!r}: its recorded command {' '.join(command)!r} is not "
                         f"a {tool} command (the tool and its sub-command names only)")
    if parser is not None and not _reads_config(parser, command[1:]):
        # ``tool rerun`` would read the file again and run itself until the stack ran out
        raise InputError(f"{str(result)!r}: its recorded command {' '.join(command)!r} cannot "
                         f"be rerun: it is not a {tool} command that reads --config")
    if out is None and not overwrite:
        recorded = config["options"].get("out")
        raise InputError(f"re-running {str(result)!r} would write where its run did "
                         f"({recorded!r}); pass --out OTHER, or --overwrite to replace it")
    if out is None:
        out = _recorded_out(result, config)
    _check_out_kind(out, config)
    argv = [*command[1:], "--config", os.fspath(result), "--out", out]
    if overwrite and "overwrite" in config["options"]:
        argv.append("--overwrite")
    return [*argv, *options]


def _reads_config(parser: argparse.ArgumentParser, words: Sequence[str]) -> bool:
    """Whether ``words`` (sub-command names) name a command of ``parser`` that has
    ``--config``. A lazy sub-command (:class:`uqmetrics.runs.lazy.LazySubParsers`) gets its
    options here, as parsing it would add them: only the commands named are built."""
    for word in words:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return False
        chosen = subs[0].built(word) if isinstance(subs[0], LazySubParsers) \
            else subs[0].choices.get(word)
        if chosen is None:
            return False
        parser = chosen
    return any(isinstance(a, _ConfigFile) for a in parser._actions)


def _recorded_out(result: str | os.PathLike, config: Mapping[str, Any]) -> str:
    """The ``--out`` a run recorded, for a rerun with ``--overwrite`` and no ``--out``: only
    the result file itself or a folder that holds it, the results the user named by naming the
    file; anywhere else the file would choose where results are written (``InputError``)."""
    recorded = config["options"].get("out")
    here = Path(os.path.realpath(result))
    if isinstance(recorded, str) and os.path.isabs(recorded):
        where = Path(os.path.realpath(recorded))
        if where == here or where in here.parents:
            return recorded
    raise InputError(f"re-running {str(result)!r} with --overwrite writes where its run did, "
                     f"but the --out it records ({recorded!r}) neither is that file nor holds "
                     "it: a file never chooses where results are written; pass --out")


def rerun(result: str | os.PathLike, tool: str, run: Callable[[list[str]], int], *,
          parser: argparse.ArgumentParser, out: str | None = None, overwrite: bool = False,
          options: Sequence[str] = (), yes: bool = False, whole: bool = False) -> int:
    """``TOOL rerun RESULT``: print the command that runs again what ``result`` records
    (:func:`rerun_argv`) on stderr and run it (``run(argv)``, the tool's ``main``), its options
    read back from the file as ``--config RESULT`` reads them (no launcher option, no
    ``overwrite``; its inputs checked first: module docstring).

    Parameters
    ----------
    result : path-like
        A result file (``.nc``) that records its run.
    tool : str
        ``"uqvision"`` or ``"uqreg"``: the file must record a command of this tool.
    run : callable
        ``run(argv) -> int``: the tool's entry point.
    parser : argparse.ArgumentParser
        The tool's parser (lazy or complete): the recorded command must be one of its commands
        that read ``--config`` (:func:`rerun_argv`).
    out, overwrite, options, whole
        As :func:`rerun_argv`: given on the command line.
    yes : bool
        Run a command recorded by another user or on another host, or by a file that records
        neither (``--yes``).

    Returns
    -------
    int
        The command's exit status.

    Raises
    ------
    InputError
        :func:`rerun_argv`'s, or a command recorded elsewhere without ``yes``.
    """
    argv = rerun_argv(result, tool, out=out, overwrite=overwrite, options=options, whole=whole,
                      parser=parser)
    print(f"{tool} rerun: running: {shlex.join([tool, *argv])}", file=sys.stderr, flush=True)
    config = _rerun_record(result, whole)
    host, user = config.get("host"), config.get("user")
    here = (socket.gethostname(), _user())
    if (host, user) != here and not yes:
        what = (f"records a command run by {user!r} on host {host!r}"
                if isinstance(host, str) and isinstance(user, str)
                else "does not record who ran its command, nor where")
        raise InputError(f"{str(result)!r} {what} (this is {here[1]!r} on {here[0]!r}): check "
                         "the command above and pass --yes to run it")
    return run(argv)
