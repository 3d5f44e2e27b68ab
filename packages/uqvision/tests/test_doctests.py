import doctest
import importlib
import pkgutil

import pytest

import uqvision

MODULES = sorted(m.name for m in pkgutil.iter_modules(uqvision.__path__, "uqvision.")
                 if m.name != "uqvision.__main__")


@pytest.mark.parametrize("name", MODULES)
def test_module_doctests_and_public_names(name):
    module = importlib.import_module(name)
    assert doctest.testmod(module).failed == 0
    for public in getattr(module, "__all__", []):
        assert hasattr(module, public), f"{name}.__all__ lists missing {public!r}"
