"""What lets a command line build its parsers from light modules (uqmetrics.runs.lazy; issue 37,
section 6, docs/conventions.md#fast-help): a package's names imported on first use, the names
of a registry known without importing it, sub-commands whose options are added when parsed,
and a registry that fills itself the first time it is asked for a name it lacks."""

from __future__ import annotations

import doctest
import sys
import types

import pytest

import uqmetrics.runs.lazy
from uqmetrics.metrics.registry import Registry
from uqmetrics.runs.lazy import Catalog, LazySubParsers


def test_the_examples_run():
    result = doctest.testmod(uqmetrics.runs.lazy)
    assert result.failed == 0 and result.attempted >= 3


@pytest.fixture
def filler(monkeypatch):
    """A module ``uqmetrics_test_filler`` whose ``fill()`` registers ``late`` in the registry
    it is given, counting its calls."""
    module = types.ModuleType("uqmetrics_test_filler")
    module.calls = 0
    module.registry = Registry("colour", fill="uqmetrics_test_filler:fill")

    def fill():
        module.calls += 1
        module.registry.add("late", 2)

    module.fill = fill
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def test_a_registry_fills_itself_once_for_a_name_it_lacks(filler):
    reg = filler.registry
    reg.add("early", 1)  # registering never fills
    assert "early" in reg and reg.lookup("early") == 1 and filler.calls == 0
    assert reg.lookup("late") == 2 and filler.calls == 1  # a name it lacks: filled first
    assert "nope" not in reg and reg.get("nope") is None and filler.calls == 1  # once
    with pytest.raises(ValueError, match="unknown colour 'nope'; valid colours: early, late"):
        reg.lookup("nope")


def test_in_and_get_fill_as_lookup_does(filler):
    assert filler.registry.get("late") == 2 and filler.calls == 1


def test_sub_commands_get_their_options_when_parsed_or_completed():
    import argparse

    p = argparse.ArgumentParser(prog="tool")
    p.register("action", "parsers", LazySubParsers)
    sub = p.add_subparsers(dest="command")
    built = []
    for name in ("a", "b"):
        sub.add_parser(name, arguments=lambda q, n=name: built.append(n)
                       or q.add_argument(f"--{n}"))
    assert p.parse_args(["b", "--b", "1"]).b == "1" and built == ["b"]
    sub.complete()
    assert built == ["b", "a"] and sub.pending == {}


def test_a_catalog_lists_its_built_in_entries_and_checks_them_against_the_registry():
    catalog = Catalog({"metric kind": ("uqmetrics.metrics.registry:METRIC_KINDS", "no.such.group")},
                      {"metric kind": {"classification": "wrong"}})
    assert catalog.names("metric kind") == ["classification"]  # no plugin of that group
    actual = catalog.from_registries()["metric kind"]
    assert list(actual)[:2] == ["classification", "selective"]
    assert actual != catalog.built_in["metric kind"]  # what the packages' tests catch
    assert '"classification": ' in catalog.source()
