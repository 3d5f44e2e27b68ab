"""uqmetrics.config_options: options generated from a dataclass's fields."""

from __future__ import annotations

import argparse
import doctest
from dataclasses import dataclass

import pytest

from uqmetrics import config_options
from uqmetrics.config_options import ConfigOption, add_config_options, config_kwargs


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
    assert config_kwargs(args, opts, given_only=True) == {"members": 3, "name": "x"}
    assert config_kwargs(args, opts) == {"budget": None, "members": 3, "name": "x"}


def test_a_field_without_a_default_is_refused():
    with pytest.raises(ValueError, match="has no field 'nope'"):
        add_config_options(argparse.ArgumentParser(), _Config, (ConfigOption("nope"),))
