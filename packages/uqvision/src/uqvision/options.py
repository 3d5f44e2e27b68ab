"""Command-line option types, output checks and subcommands shared by the CLI and the protocols'
own options and commands.

argparse types (:func:`at_least`, :data:`COUNT`, :data:`INDEX`, :func:`positive_float`,
:func:`device_type`), ``--set key=value`` pairs (:func:`set_pairs`) and the checks of output
folders and files made before any work (:func:`check_output_folder`,
:func:`check_output_file`), and options generated from the fields of a typed config
(:class:`ConfigOption`, :func:`add_config_options`, :func:`config_kwargs`): a default is
written once, in the dataclass (``PredictConfig``, ``ImageTrainConfig``, ``SelectiveConfig``,
``EnsembleConfig``, ``DemoConfig``), never again in the parser, and the parsed line says which
options were given (:func:`given_options`). :class:`Command` is a subcommand (``uqvision``'s own
and those a protocol brings). Errors name the option: the project's bad-input policy (one line,
exit code 2; see the README's "Bad input").
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from uqmetrics import InputError, check_writable
from uqmetrics.runs.config_options import (
    FROM_CONFIG,
    ConfigOption,
    add_config_options,
    config_defaults,
    config_kwargs,
    given_options,
)

__all__ = [
    "COUNT",
    "FROM_CONFIG",
    "INDEX",
    "SEED",
    "Command",
    "ConfigOption",
    "add_config_options",
    "at_least",
    "check_output_file",
    "check_output_folder",
    "config_defaults",
    "config_kwargs",
    "count_or_fraction",
    "device_type",
    "given_options",
    "non_negative_float",
    "positive_float",
    "set_pairs",
]


def at_least(minimum: int, maximum: int | None = None, why: str = "") -> Callable[[str], int]:
    """argparse type: an integer >= ``minimum`` (and <= ``maximum``, ``why`` saying why; the
    error names the option)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum}{why}, got {value}")
        return value

    return parse


@dataclass(frozen=True)
class Command:
    """A ``uqvision`` subcommand: ``uqvision``'s own (:data:`uqvision.cli.COMMANDS`) or one a
    protocol brings (:attr:`uqvision.protocols.Protocol.commands`, e.g. UIMNET's ``split``).

    Attributes
    ----------
    run : callable
        ``run(args) -> int``: the handler, from the parsed options to the exit status.
    arguments : callable
        ``arguments(parser)``: adds the command's options (called when the command is parsed).
    description : str
        One line (the command's help).
    config_files : callable or None
        ``config_files(args, config) -> paths``: the files its fully resolved configuration
        is written to, beside its results (:func:`uqmetrics.runs.run_config.run_recorded`; the
        command's ``arguments`` give it ``--config``,
        :func:`uqmetrics.runs.run_config.add_config_option`); ``None``: a command that writes no
        results.
    """

    run: Callable[[argparse.Namespace], int]
    arguments: Callable[[argparse.ArgumentParser], None]
    description: str
    config_files: Callable[[argparse.Namespace, Mapping], Sequence[Path]] | None = None


#: argparse types: counts (>= 1) and indices and seeds (>= 0).
COUNT, INDEX = at_least(1), at_least(0)
#: argparse type of a seed: 0 to 2**63 - 1 (torch and numpy take it as a signed 64-bit integer).
SEED = at_least(0, 2**63 - 1, " (a seed is a signed 64-bit integer)")


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


def count_or_fraction(text: str) -> float:
    """argparse type of a number of samples given as a count or as a fraction of a set (the
    selective protocol's ``--calibration-size``): a fraction in (0, 1) or an integer >= 1
    (``1.5`` is neither).

    Examples
    --------
    >>> count_or_fraction("0.3"), count_or_fraction("20"), count_or_fraction("20.0")
    (0.3, 20.0, 20.0)
    """
    value = positive_float(text)
    if value >= 1 and value != int(value):
        raise argparse.ArgumentTypeError(f"must be a count (an integer >= 1) or a fraction in "
                                         f"(0, 1), got {text}")
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
    import torch  # when a --device is given, not when the parsers are built

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


# options generated from typed configs (uqmetrics.runs.config_options, shared with uqreg's CLI):
# a default is written once, in the dataclass
