"""uqmetrics.runs.config_options: options generated from a dataclass's fields."""

from __future__ import annotations

import argparse
import doctest
from dataclasses import dataclass

import pytest

from uqmetrics.runs import config_options
from uqmetrics.runs.config_options import (
    ConfigOption,
    add_config_options,
    config_kwargs,
    given_options,
)


@dataclass
class _Config:
    budget: float = 4e9
    members: int = 120
    name: str = "x"


def test_doctests_pass():
    result = doctest.testmod(config_options, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_overrides_given_only_and_defaults_shown_from_the_config():
    opts = (ConfigOption("budget", type=float, default=None, shown=lambda v: f"{v / 2**30:.3g}",
                         help="GiB (default {default})"),
            ConfigOption("members", type=int, default=None, help="members (default {default})"),
            ConfigOption("name"))
    p = argparse.ArgumentParser()
    add_config_options(p, _Config, opts)
    text = " ".join(p.format_help().split())
    assert "GiB (default 3.73)" in text and "members (default 120)" in text
    args = p.parse_args(["--members", "3"])
    assert config_kwargs(args, opts, given_only=True) == {"members": 3}
    assert config_kwargs(args, opts) == {"budget": None, "members": 3, "name": "x"}


@dataclass
class _Flags:
    size: int = 64
    amp: bool = False
    pin: bool = True
    fast: bool = True
    layers: tuple = (1, 2)


_FLAGS = (ConfigOption("size", type=int, help="size (default {default})"), ConfigOption("amp"),
          ConfigOption("pin"), ConfigOption("fast", negatable=True),
          ConfigOption("layers", type=int, nargs="+"))


def _flags_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_config_options(p, _Flags, _FLAGS)
    return p


def test_a_parsed_line_tells_given_options_from_defaults():
    """Item 7 of issue 26: the parsed line says which options were given, a value equal to the
    default included, for every kind of option (value, store_true, store_false, --x/--no-x,
    nargs); the namespace still holds every value, defaults from the dataclass."""
    parse = _flags_parser().parse_args
    nothing = parse([])
    assert given_options(nothing) == frozenset()
    assert config_kwargs(nothing, _FLAGS) == {"size": 64, "amp": False, "pin": True, "fast": True,
                                              "layers": (1, 2)}
    assert config_kwargs(nothing, _FLAGS, given_only=True) == {}
    same = parse(["--size", "64", "--fast", "--layers", "1", "2"])  # the defaults, given
    assert given_options(same) == {"size", "fast", "layers"}
    assert config_kwargs(same, _FLAGS, given_only=True) == {"size": 64, "fast": True,
                                                            "layers": [1, 2]}
    flags = parse(["--amp", "--pin", "--no-fast", "--size", "3", "--size", "5"])
    assert given_options(flags) == {"amp", "pin", "fast", "size"}
    assert (flags.amp, flags.pin, flags.fast, flags.size) == (True, False, False, 5)
    assert given_options(argparse.Namespace(size=3)) == frozenset()  # not parsed: none given


def test_given_options_cross_subcommands_and_help_shows_the_field_default():
    top = argparse.ArgumentParser()
    sub = top.add_subparsers(dest="command")
    add_config_options(sub.add_parser("run"), _Flags, _FLAGS)
    args = top.parse_args(["run", "--size", "64"])
    assert given_options(args) == {"size"} and args.amp is False
    assert "size (default 64)" in " ".join(_flags_parser().format_help().split())


def test_a_field_without_a_default_is_refused():
    with pytest.raises(ValueError, match="has no field 'nope'"):
        add_config_options(argparse.ArgumentParser(), _Config, (ConfigOption("nope"),))
