"""Command-line options generated from the fields of a typed config (a dataclass).

Both command-line tools (``uqreg``, ``uqvision``) declare an option as a :class:`ConfigOption`
of a config field: its default, and the default shown in its help, are the field's, so a default
is written once, in the dataclass, never again in a parser.

The parsed command line also says which options were given (:func:`given_options`), a value
equal to the default included: each option records itself when it is parsed. This is what
layering other sources under the command line needs (a preset, a configuration file): the
options given override them, the others leave them alone
(``config_kwargs(args, options, given_only=True)``). The values of a ``--config`` file
(:mod:`uqmetrics.runs.run_config`) count as given (:func:`mark_given`), under those of the command
line.

A *launcher option* says where and how a command's work runs, not what it computes: a cluster
and its job script, a scheduler to connect to, a dashboard, the device (``cpu`` or ``cuda``),
the processes and threads it starts (worker and thread counts). Such an option is marked where
it is defined (:func:`mark_launcher`, which :func:`uqmetrics.runs.sweep.add_cluster_options`
applies to all of its own; ``ConfigOption(..., launcher=True)``), and :func:`is_launcher` is the
one test of it: a file, a result or a TOML configuration, never gives one to a run
(:mod:`uqmetrics.runs.run_config`), so that a file received from someone else cannot start a
job, connect anywhere, or choose how many processes and threads run and on which device.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FROM_CONFIG", "ConfigOption", "add_config_options", "config_defaults", "config_kwargs",
           "given_options", "is_launcher", "launcher_keys", "mark_given", "mark_launcher",
           "records_given"]

#: Marks a :class:`ConfigOption` whose default is the config field's.
FROM_CONFIG: Any = object()

#: The attribute of a parsed namespace that holds the fields given on the command line (as
#: argparse keeps its unrecognized arguments in ``_unrecognized_args``); read it with
#: :func:`given_options`.
_GIVEN = "_given_options"
#: The attribute of an argparse action that marks a launcher option (:func:`mark_launcher`).
_LAUNCHER = "uqmetrics_launcher"


@dataclass(frozen=True)
class ConfigOption:
    """A command-line option generated from one field of a typed config (a dataclass).

    Attributes
    ----------
    field : str
        The config's field; also the parsed attribute (``dest``).
    flag : str or None
        The option (default ``--`` + the field with dashes), e.g. ``--workers`` for
        ``num_workers``.
    type : callable or None
        The argparse type (a ``bool`` field without one is a ``store_true`` flag).
    help : str or None
        As in ``argparse``; ``{default}`` in it is replaced by the field's default (through
        ``shown``), so the help never restates a default by hand.
    choices : sequence or callable or None
        The allowed values, or a callable returning them (read when the parser is built, so
        a registry filled later is seen whole).
    metavar, nargs : optional
        As in ``argparse.ArgumentParser.add_argument``.
    default : object
        :data:`FROM_CONFIG` (the field's default) or the value the parsed namespace holds when
        the option is not given, e.g. ``None`` (whether it was given is :func:`given_options`'
        answer either way).
    shown : callable or None
        How ``{default}`` is written in the help (e.g. bytes as GiB); default ``str``.
    negatable : bool
        A ``bool`` field's flag also has its ``--no-`` form (``--channels-last`` and
        ``--no-channels-last``; ``argparse.BooleanOptionalAction``).
    launcher : bool
        A launcher option (:func:`mark_launcher`): where and how the work runs (e.g. a worker
        count, the device), never taken from a file.
    """

    field: str
    flag: str | None = None
    type: Callable[[str], Any] | None = None
    help: str | None = None
    choices: Sequence[Any] | Callable[[], Sequence[Any]] | None = None
    metavar: str | None = None
    nargs: str | None = None
    default: Any = FROM_CONFIG
    shown: Callable[[Any], str] | None = None
    negatable: bool = False
    launcher: bool = False


def config_defaults(config: type) -> dict[str, Any]:
    """The default of every field of the dataclass ``config`` that has one."""
    out = {}
    for f in dataclasses.fields(config):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def add_config_options(parser: argparse.ArgumentParser, config: type,
                       options: Sequence[ConfigOption]) -> None:
    """Add one option per :class:`ConfigOption`, its default taken from ``config``'s field; each
    records, when parsed, that it was given (:func:`given_options`).

    Examples
    --------
    >>> @dataclass
    ... class Config:
    ...     batch_size: int = 64
    ...     num_workers: int = 0
    ...     amp: bool = False
    >>> opts = (ConfigOption("batch_size", type=int, help="images per batch (default {default})"),
    ...         ConfigOption("num_workers", flag="--workers", type=int), ConfigOption("amp"))
    >>> p = argparse.ArgumentParser()
    >>> add_config_options(p, Config, opts)
    >>> args = p.parse_args(["--workers", "2", "--batch-size", "64"])
    >>> Config(**config_kwargs(args, opts))
    Config(batch_size=64, num_workers=2, amp=False)
    >>> sorted(given_options(args)), config_kwargs(args, opts, given_only=True)
    (['batch_size', 'num_workers'], {'batch_size': 64, 'num_workers': 2})
    >>> "images per batch (default 64)" in p.format_help()
    True
    """
    defaults = config_defaults(config)
    for opt in options:
        if opt.field not in defaults:
            raise ValueError(f"{config.__name__} has no field {opt.field!r} with a default")
        field_default = defaults[opt.field]
        default = field_default if opt.default is FROM_CONFIG else opt.default
        kwargs: dict[str, Any] = {"dest": opt.field, "default": default}
        if opt.help is not None:
            kwargs["help"] = opt.help.replace("{default}", (opt.shown or str)(field_default))
        if opt.type is None and isinstance(field_default, bool):
            if opt.negatable:
                kwargs["action"] = _GivenBooleanOptional
            else:
                kwargs.update(action=_GivenConst, const=not field_default)
        else:
            kwargs["action"] = _GivenStore
            if opt.type is not None:
                kwargs["type"] = opt.type
            if opt.choices is not None:
                kwargs["choices"] = list(opt.choices() if callable(opt.choices) else opt.choices)
            if opt.metavar is not None:
                kwargs["metavar"] = opt.metavar
            if opt.nargs is not None:
                kwargs["nargs"] = opt.nargs
        action = parser.add_argument(opt.flag or "--" + opt.field.replace("_", "-"), **kwargs)
        if opt.launcher:
            mark_launcher(action)


def mark_launcher(*actions: argparse.Action | argparse._ArgumentGroup,
                  keys: Sequence[str] | None = None) -> None:
    """Mark options (argparse actions, or every action of an argument group) as launcher
    options: where and how the work runs (a cluster, a queue's job script or interpreter, a
    scheduler, a dashboard, the device, worker and thread counts), not what is computed.
    :mod:`uqmetrics.runs.run_config` never takes them from a file (``rerun``, ``--config
    FILE.nc``, ``--config FILE.toml``): only the command line gives them.

    Examples
    --------
    >>> p = argparse.ArgumentParser()
    >>> mark_launcher(p.add_argument("--workers", type=int, default=2))
    >>> [a.dest for a in p._actions if is_launcher(a)]
    ['workers']

    ``keys`` marks the launcher keys of a ``KEY=VALUE`` option (``uqvision reproduce --set
    workers=4``): only those pairs are launcher options (:func:`launcher_keys`).

    >>> s = p.add_argument("--set", action="append")
    >>> mark_launcher(s, keys=("workers",))
    >>> is_launcher(s), launcher_keys(s)
    (False, frozenset({'workers'}))
    """
    for item in actions:
        for action in getattr(item, "_group_actions", [item]):
            setattr(action, _LAUNCHER, True if keys is None else frozenset(keys))


def is_launcher(action: argparse.Action) -> bool:
    """Whether ``action`` is a launcher option as a whole (:func:`mark_launcher`)."""
    return getattr(action, _LAUNCHER, False) is True


def launcher_keys(action: argparse.Action) -> frozenset[str]:
    """The launcher keys of a ``KEY=VALUE`` option (:func:`mark_launcher` with ``keys``);
    empty for any other option."""
    marked = getattr(action, _LAUNCHER, False)
    return marked if isinstance(marked, frozenset) else frozenset()


def _record_given(namespace: argparse.Namespace, dest: str) -> None:
    setattr(namespace, _GIVEN, getattr(namespace, _GIVEN, frozenset()) | {dest})


class _GivenStore(argparse.Action):
    """argparse's ``store``, recording that the option was given."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        _record_given(namespace, self.dest)


class _GivenConst(argparse.Action):
    """argparse's ``store_true`` / ``store_false`` (``const``: the value stored), recording that
    the flag was given."""

    def __init__(self, option_strings, dest, const, default=None, required=False, help=None):
        super().__init__(option_strings, dest, nargs=0, const=const, default=default,
                         required=required, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, self.const)
        _record_given(namespace, self.dest)


class _GivenBooleanOptional(argparse.BooleanOptionalAction):
    """``--flag`` / ``--no-flag``, recording that either was given."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        _record_given(namespace, self.dest)


def given_options(args: argparse.Namespace) -> frozenset[str]:
    """The config fields whose options were given on the command line that ``args`` was parsed
    from (a value equal to the default included; an option repeated counts once).

    Only the options of :func:`add_config_options` are recorded; a namespace not parsed by
    such a parser gives the empty set.
    """
    return frozenset(getattr(args, _GIVEN, frozenset()))


def records_given(action: argparse.Action) -> bool:
    """Whether ``action`` is an option of :func:`add_config_options` (one that records itself
    as given)."""
    return isinstance(action, (_GivenStore, _GivenConst, _GivenBooleanOptional))


def mark_given(args: argparse.Namespace, fields: Iterable[str]) -> None:
    """Record ``fields`` as given (:func:`given_options`), as if on the command line: the values
    of a configuration file laid under it (:mod:`uqmetrics.runs.run_config`) override a preset as
    the options given do."""
    for field in fields:
        _record_given(args, field)


def config_kwargs(args: argparse.Namespace, options: Sequence[ConfigOption], *,
                  given_only: bool = False) -> dict[str, Any]:
    """The config fields of parsed ``args`` (``config(**config_kwargs(args, options))``): the
    value given, else the default (the field's, or the option's ``default``).

    ``given_only``: only the options given on the command line (:func:`given_options`), to
    override a base config (a preset, a configuration file's values) with them.
    """
    given = given_options(args)
    return {opt.field: getattr(args, opt.field) for opt in options
            if not given_only or opt.field in given}
