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
  (:mod:`uqmetrics.config_options` and the parsers built with it).
- The parser class of each command-line tool calls :func:`finish_parse` at the end of its
  ``parse_known_args``: it lays the file's values under those given on the command line and
  records which options the command has (:func:`resolved_config` reads them back).
- :func:`run_recorded` runs a command: it records the configuration for
  :func:`uqmetrics.io.provenance_attrs` while the command runs (every result file written with
  provenance attrs carries it, as :data:`RUN_CONFIG_ATTR`, JSON), then writes the configuration
  files atomically beside the results, which the command refuses to replace without
  ``--overwrite``: a configuration file is replaced only with the results it describes.
- :func:`rerun_argv` is the command line that re-runs a result file's recorded command.

The keys of a configuration file are the options' long names without the leading dashes
(``batch-size``, ``workers``; ``batch_size`` is read as ``batch-size``), and a positional
argument's name (``kind``); an option whose value is none (not set: the command decides) is
left out of the TOML file. Options of the tool itself, before the command (``uqvision
--threads``), are not part of a command's configuration.

Examples
--------
A configuration file as written by ``uqreg study --preset smoke --out results/s``::

    # uqreg study: the fully resolved configuration of a run (written by uqreg).
    # Run it again with: uqreg study --config THIS_FILE (options on the command line override it)
    command = "uqreg study"
    version = "0.1.0"
    git_commit = "a730825..."
    git_dirty = false

    [options]
    preset = "smoke"
    out = "results/s"
    overwrite = false
    ...
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from .config_options import given_options, mark_given, records_given
from .exceptions import InputError

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
    "current_run_config",
    "finish_parse",
    "read_config",
    "recorded_config",
    "recording",
    "rerun_argv",
    "resolved_config",
    "run_recorded",
    "write_config_file",
]

#: The attr of a result file that records the run that made it (JSON: :func:`resolved_config`).
RUN_CONFIG_ATTR = "run_config"

#: How a configuration file's name ends: ``<out>/<command>.config.toml`` or
#: ``<result stem>.config.toml`` beside a single result file.
CONFIG_SUFFIX = ".config.toml"

#: The keys of a configuration file beside its ``[options]`` table (written, never required).
_META_KEYS = ("command", "version", "git_commit", "git_dirty")

#: Namespace attributes: the values read from ``--config`` (until :func:`finish_parse` lays
#: them under the command line), and the options of the command parsed (:class:`_Options`).
_LAYER = "_config_file_layer"
_OPTIONS = "_run_options"


@dataclass(frozen=True)
class _Options:
    """The options of the command a namespace was parsed for: its name (the parser's ``prog``,
    e.g. ``uqvision score selective``) and, in order, each option's key and ``dest``."""

    command: str
    keys: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class _Layer:
    """The values of a ``--config`` file, converted (``{dest: value}``), and where they came
    from."""

    values: dict[str, Any]
    source: str


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


class _ConfigFile(argparse.Action):
    """``--config FILE``: read ``FILE`` (:func:`read_config`), convert each value with its
    option's type and choices, and keep them for :func:`finish_parse`; the options the file
    gives are no longer required on the command line. Any problem is the parser's one-line
    error (exit code 2) naming the file, the key and the value."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            options = read_config(values, command=parser.prog)
            layer = _Layer(_converted(parser, options, str(values)), str(values))
        except InputError as exc:
            parser.error(f"argument {option_string}: {exc}")
        for action in parser._actions:
            if action.dest in layer.values:
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
    given, :func:`~uqmetrics.config_options.given_options`, so that they override a preset
    as the command line does), and record the options of a command that has ``--config``
    (:func:`resolved_config`). Other parsers' namespaces are returned as they are."""
    layer = namespace.__dict__.pop(_LAYER, None)
    actions = _option_actions(parser)
    if layer is not None:
        given = _given_on_line(parser, actions, namespace, arg_strings or ())
        taken = {dest: value for dest, value in layer.values.items() if dest not in given}
        for dest, value in taken.items():
            setattr(namespace, dest, value)
        mark_given(namespace, {a.dest for a in actions.values()
                               if a.dest in taken and records_given(a)})
    if any(isinstance(a, _ConfigFile) for a in parser._actions):
        setattr(namespace, _OPTIONS, _Options(parser.prog, tuple(
            (key, action.dest) for key, action in actions.items())))
    return namespace


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
    p = Path(path)
    if p.suffix == ".nc":
        data = recorded_config(p)
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
    if command is not None and recorded is not None and recorded != command:
        raise InputError(f"{str(p)!r} records a run of {recorded!r}, not of {command!r}")
    return dict(options)


def recorded_config(path: str | os.PathLike) -> dict[str, Any]:
    """The run a result file records (:data:`RUN_CONFIG_ATTR`): ``command``, ``version``,
    ``git_commit``, ``git_dirty`` and ``options`` (:func:`resolved_config`).

    Raises
    ------
    InputError
        The file cannot be read, or it records no run (written by an earlier version, or by
        the library rather than a command).
    """
    from .io import READ_ERRORS, xarray_module

    p = Path(path)
    try:
        with xarray_module().open_dataset(p) as ds:
            raw = ds.attrs.get(RUN_CONFIG_ATTR)
    except READ_ERRORS as exc:
        raise InputError(f"cannot read {str(p)!r}: {getattr(exc, 'strerror', None) or exc}") \
            from None
    if raw is None:
        raise InputError(f"{str(p)!r} records no run configuration (no {RUN_CONFIG_ATTR!r} "
                         "attr): it was written by an earlier version or by the library, not "
                         "by a command; run the command again with its options")
    try:
        data = json.loads(raw)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{str(p)!r}: its {RUN_CONFIG_ATTR!r} attr is damaged ({exc})") \
            from None
    if not isinstance(data, dict) or not isinstance(data.get("options"), dict):
        raise InputError(f"{str(p)!r}: its {RUN_CONFIG_ATTR!r} attr is damaged (not a JSON "
                         "object with options)")
    return data


def _shown(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (str, bool, list, dict)) else repr(value)


def _converted(parser: argparse.ArgumentParser, options: Mapping[str, Any],
               source: str) -> dict[str, Any]:
    """``{dest: value}`` of a file's ``{key: value}``, each value checked and converted by its
    option's action (type, choices, nargs) as the command line's would be; ``None`` (a JSON
    null: not set) leaves the option at its default."""
    actions = _option_actions(parser)
    out: dict[str, Any] = {}
    for key, value in options.items():
        action = actions.get(_key(str(key)))
        if action is None:
            raise InputError(f"{source!r}: unknown key {key!r} = {_shown(value)} (not an "
                             f"option of {parser.prog}; its options: {', '.join(actions)})")
        if value is None:
            continue
        try:
            out[action.dest] = _value(action, value)
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            raise InputError(f"{source!r}: key {key!r} = {_shown(value)}: {exc}") from None
    return out


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
        except (TypeError, ValueError):
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
    ``git_commit`` and ``git_dirty`` (:func:`uqmetrics.io.source_revision`), and ``options``:
    every option's value (defaults included; ``None``: not set), JSON-safe."""
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
            "git_commit": commit or "unknown", "git_dirty": dirty,
            "options": _resolved_options(args)}


def _resolved_options(args: argparse.Namespace) -> dict[str, Any]:
    options: _Options = getattr(args, _OPTIONS)
    return {key: _plain(getattr(args, dest, None)) for key, dest in options.keys}


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
            (f"# Run it again with: {config['command']} --config THIS_FILE (options given on "
             "the command line override it)")]
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


#: The configuration of the command running (:func:`recording`), read by
#: :func:`uqmetrics.io.provenance_attrs`.
_CURRENT: dict[str, Any] | None = None


@contextlib.contextmanager
def recording(config: Mapping[str, Any] | None) -> Iterator[None]:
    """While the block runs, :func:`current_run_config` is ``config``: every result written
    with :func:`uqmetrics.io.provenance_attrs` records it (:data:`RUN_CONFIG_ATTR`)."""
    global _CURRENT
    before, _CURRENT = _CURRENT, (dict(config) if config is not None else None)
    try:
        yield
    finally:
        _CURRENT = before


def current_run_config() -> dict[str, Any] | None:
    """The configuration of the command running in this process (:func:`recording`), or
    ``None``."""
    return _CURRENT


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


def rerun_argv(result: str | os.PathLike, tool: str, *, out: str | None = None,
               overwrite: bool = False) -> list[str]:
    """The command line (after ``tool``) that runs again the command a result file records:
    ``<command> --config RESULT [--out OUT] [--overwrite]``.

    Without ``out`` the run writes where the recorded one did, which is refused unless
    ``overwrite``.

    Raises
    ------
    InputError
        The file records no run, or a run of another tool.
    """
    config = recorded_config(result)
    command = str(config.get("command", "")).split()
    if not command or command[0] != tool:
        raise InputError(f"{str(result)!r} records a run of {' '.join(command)!r}; re-run it "
                         f"with {command[0] if command else 'its tool'} rerun")
    if out is None and not overwrite:
        recorded = config["options"].get("out")
        raise InputError(f"re-running {str(result)!r} would write where its run did "
                         f"({recorded!r}); pass --out OTHER, or --overwrite to replace it")
    argv = [*command[1:], "--config", os.fspath(result)]
    if out is not None:
        argv += ["--out", out]
    if overwrite and "overwrite" in config["options"]:
        argv.append("--overwrite")
    return argv
