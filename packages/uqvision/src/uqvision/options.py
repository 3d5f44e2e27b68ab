"""Command-line option types and output checks shared by the CLI and the protocols' own options.

argparse types (:func:`at_least`, :data:`COUNT`, :data:`INDEX`, :func:`positive_float`,
:func:`device_type`), ``--set key=value`` pairs (:func:`set_pairs`) and the checks of output
folders and files made before any work (:func:`check_output_folder`,
:func:`check_output_file`), and options generated from the fields of a typed config
(:class:`ConfigOption`, :func:`add_config_options`, :func:`config_kwargs`): a default is
written once, in the dataclass (``PredictConfig``, ``ImageTrainConfig``, ``SelectiveConfig``,
``EnsembleConfig``, ``DemoConfig``), never again in the parser. Errors name the option: the
project's bad-input policy (one line, exit code 2; see the README's "Bad input").
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from uqmetrics import InputError, check_writable

__all__ = [
    "COUNT",
    "FROM_CONFIG",
    "INDEX",
    "ConfigOption",
    "add_config_options",
    "at_least",
    "check_output_file",
    "check_output_folder",
    "config_defaults",
    "config_kwargs",
    "device_type",
    "non_negative_float",
    "positive_float",
    "set_pairs",
]


def at_least(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer >= ``minimum`` (the error names the option)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


#: argparse types: counts (>= 1) and indices and seeds (>= 0).
COUNT, INDEX = at_least(1), at_least(0)


def non_negative_float(text: str) -> float:
    """argparse type: a finite float >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite float > 0."""
    value = non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def check_output_folder(option: str, path: str | os.PathLike, *,
                   given: str | os.PathLike | None = None) -> None:
    """Refuse, before any work, an output folder that could not be written (a file where it or
    a parent must be a folder, no write permission, a read-only file system); nothing is
    created. The message names the option and the value ``given`` (default ``path``)."""
    given = path if given is None else given
    try:
        check_writable(path)
    except OSError as err:
        at = "" if Path(err.filename) == Path(given) else f": {err.filename!r}"
        raise InputError(f"{option} {str(given)!r}{at} {err.strerror}") from None


def check_output_file(option: str, path: str | os.PathLike, overwrite: bool | None) -> None:
    """Refuse, before any work, an output file that is a folder, exists (unless ``overwrite``;
    ``None``: the command replaces it anyway) or could not be written."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{option} {str(p)!r} is a folder; give a file name")
    if overwrite is False and (p.exists() or p.is_symlink()):
        raise InputError(f"{option} {str(p)!r} already exists; pass --overwrite to replace it")
    check_output_folder(option, p.parent, given=p)


def device_type(value: str) -> str:
    """``--device``: ``cpu``, ``cuda`` or ``cuda:N``, refused unless that device is here."""
    try:
        device = torch.device(value)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a device (cpu, cuda, cuda:N)") from None
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if count == 0:
            raise argparse.ArgumentTypeError(f"{value!r}: CUDA is not available here")
        if (device.index or 0) >= count:
            raise argparse.ArgumentTypeError(f"{value!r}: there are {count} CUDA devices")
    elif device.type != "cpu":
        raise argparse.ArgumentTypeError(f"{value!r}: only cpu and cuda devices are supported")
    return value


def set_pairs(items: Sequence[str] | None) -> dict[str, str]:
    """``--set key=value`` options as a dict of strings (``ValueError`` on a malformed one)."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


# --------------------------------------------------------------------------------------------
# options generated from typed configs: a default is written once, in the dataclass

#: Marks a :class:`ConfigOption` whose default is the config field's.
FROM_CONFIG: Any = object()


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
    help, metavar, nargs : optional
        As in ``argparse.ArgumentParser.add_argument``.
    choices : sequence or callable or None
        The allowed values, or a callable returning them (read when the parser is built, so
        a registry filled later is seen whole).
    default : object
        :data:`FROM_CONFIG` (the field's default) or a value that overrides it, e.g. ``None``
        for an option that only overrides the config when given.
    """

    field: str
    flag: str | None = None
    type: Callable[[str], Any] | None = None
    help: str | None = None
    choices: Sequence[Any] | Callable[[], Sequence[Any]] | None = None
    metavar: str | None = None
    nargs: str | None = None
    default: Any = FROM_CONFIG


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
    """Add one option per :class:`ConfigOption`, its default taken from ``config``'s field.

    Examples
    --------
    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Config:
    ...     batch_size: int = 64
    ...     num_workers: int = 0
    ...     amp: bool = False
    >>> opts = (ConfigOption("batch_size", type=COUNT), ConfigOption("num_workers",
    ...         flag="--workers", type=INDEX), ConfigOption("amp"))
    >>> p = argparse.ArgumentParser()
    >>> add_config_options(p, Config, opts)
    >>> Config(**config_kwargs(p.parse_args(["--workers", "2"]), opts))
    Config(batch_size=64, num_workers=2, amp=False)
    """
    defaults = config_defaults(config)
    for opt in options:
        if opt.field not in defaults:
            raise ValueError(f"{config.__name__} has no field {opt.field!r} with a default")
        default = defaults[opt.field] if opt.default is FROM_CONFIG else opt.default
        kwargs: dict[str, Any] = {"dest": opt.field, "default": default}
        if opt.help is not None:
            kwargs["help"] = opt.help
        if opt.type is None and isinstance(defaults[opt.field], bool):
            kwargs["action"] = "store_false" if defaults[opt.field] else "store_true"
        else:
            if opt.type is not None:
                kwargs["type"] = opt.type
            if opt.choices is not None:
                kwargs["choices"] = list(opt.choices() if callable(opt.choices)
                                         else opt.choices)
            if opt.metavar is not None:
                kwargs["metavar"] = opt.metavar
            if opt.nargs is not None:
                kwargs["nargs"] = opt.nargs
        parser.add_argument(opt.flag or "--" + opt.field.replace("_", "-"), **kwargs)


def config_kwargs(args: argparse.Namespace, options: Sequence[ConfigOption]) -> dict[str, Any]:
    """The config fields of parsed ``args`` (``config(**config_kwargs(args, options))``)."""
    return {opt.field: getattr(args, opt.field) for opt in options}
