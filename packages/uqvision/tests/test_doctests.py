import doctest
import functools
import importlib
import inspect
import pkgutil

import pytest

import uqvision

MODULES = sorted(m.name for m in pkgutil.walk_packages(uqvision.__path__, "uqvision.")
                 if m.name != "uqvision.__main__")


@functools.cache
def _run(name: str) -> doctest.TestResults:
    return doctest.testmod(importlib.import_module(name))


@pytest.mark.parametrize("name", MODULES)
def test_module_doctests_and_public_names(name):
    module = importlib.import_module(name)
    result = _run(name)
    assert result.failed == 0
    # a module whose source shows examples must have run them (not skipped: e.g. -OO strips
    # docstrings, or a doctest collector that finds nothing)
    if ">>> " in inspect.getsource(module):
        assert result.attempted > 0, f"{name} has examples but none was run"
    for public in getattr(module, "__all__", []):
        assert hasattr(module, public), f"{name}.__all__ lists missing {public!r}"


def test_doctests_were_attempted():
    assert sum(_run(name).attempted for name in MODULES) > 0
