"""Plugins through entry points (:meth:`uqmetrics.metrics.registry.Registry.load_plugins`): an installed
distribution's entry point registers its object; a broken one is reported in one line naming
it and skipped. The distribution is a real ``.dist-info`` on ``sys.path``, which is what
``importlib.metadata`` reads for an installed package."""

from __future__ import annotations

import logging
import textwrap

import numpy as np
import pytest

from uqmetrics.metrics.detectors import DETECTORS, Detector, get_detector, list_detectors
from uqmetrics.metrics.registry import Registry


def _install(root, name: str, entry_points: dict[str, dict[str, str]], module: str) -> None:
    """A distribution ``name`` 0.1 under ``root``: its module ``<name>_mod`` and dist-info."""
    (root / f"{name}_mod.py").write_text(textwrap.dedent(module))
    info = root / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items())
        for group, eps in entry_points.items()))


@pytest.fixture
def plugin_path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_an_entry_point_registers_its_object_and_a_broken_one_is_one_line(plugin_path, caplog):
    _install(plugin_path, "goodplug", {"test.colours": {"green": "goodplug_mod:GREEN",
                                                       "number": "goodplug_mod:NUMBER",
                                                       "gone": "goodplug_mod:MISSING",
                                                       "red": "goodplug_mod:RED"}},
             """
             GREEN = "green!"
             NUMBER = 3
             RED = "another red"
             """)
    _install(plugin_path, "badplug", {"test.colours": {"blue": "badplug_mod:BLUE"}},
             "raise ImportError('needs a library that is not installed')\n")
    reg: Registry[str] = Registry("colour", group="test.colours", item_type=str)
    reg.add("red", "red")
    with caplog.at_level(logging.WARNING, logger="uqmetrics.plugins"):
        broken = reg.load_plugins()
    assert reg.lookup("green") == "green!" and reg.plugins == {"green": "goodplug_mod:GREEN"}
    assert reg.lookup("red") == "red"  # a plugin cannot replace a built-in
    assert set(broken) == {"number", "gone", "red", "blue"} == set(reg.broken)
    assert "of type int, not str" in broken["number"] and "already registered" in broken["red"]
    assert "AttributeError" in broken["gone"] and "ImportError" in broken["blue"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4 and all("\n" not in m for m in lines)
    blue = next(m for m in lines if "'blue'" in m)
    assert "badplug_mod:BLUE" in blue and "package badplug" in blue and "test.colours" in blue
    caplog.clear()
    assert reg.load_plugins() == broken and not caplog.records  # once only
    assert Registry("plain").load_plugins() == {}


def test_a_plugin_that_calls_sys_exit_is_one_line_and_an_interrupt_propagates(plugin_path,
                                                                              caplog):
    """Issue 36, row 17: a plugin whose import calls ``sys.exit(0)`` used to end the program
    (every command quit silently with exit 0); it is a broken plugin like any other. A
    KeyboardInterrupt while a plugin loads (Ctrl-C) still stops the program."""
    _install(plugin_path, "exitplug", {"test.exits": {"quits": "exitplug_mod:QUITS"}},
             "import sys\nsys.exit(0)\nQUITS = 'never reached'\n")
    _install(plugin_path, "msgplug", {"test.exits": {"says": "msgplug_mod:SAYS"}},
             "raise SystemExit('no GPU here')\n")
    _install(plugin_path, "goodexit", {"test.exits": {"stays": "goodexit_mod:STAYS"}},
             "STAYS = 'stays'\n")
    reg: Registry[str] = Registry("exit", group="test.exits", item_type=str)
    with caplog.at_level(logging.WARNING, logger="uqmetrics.plugins"):
        broken = reg.load_plugins()
    assert reg.plugins == {"stays": "goodexit_mod:STAYS"} and reg.lookup("stays") == "stays"
    assert broken == {"quits": "SystemExit: loading it called sys.exit(0)",
                      "says": "SystemExit: loading it called sys.exit('no GPU here')"}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("\n" not in m for m in lines)
    quits = next(m for m in lines if "'quits'" in m)
    assert "exitplug_mod:QUITS" in quits and "package exitplug" in quits and "sys.exit(0)" in quits

    _install(plugin_path, "ctrlcplug", {"test.ctrlc": {"waits": "ctrlcplug_mod:WAITS"}},
             "raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        Registry("ctrl-c", group="test.ctrlc", item_type=str).load_plugins()


def test_a_detector_plugin_joins_the_registry(plugin_path):
    _install(plugin_path, "detplug", {"uqmetrics.detectors": {"neg_max_logit":
                                                              "detplug_mod:DETECTOR"}},
             """
             import numpy as np
             from uqmetrics.metrics.detectors import Detector
             DETECTOR = Detector("neg_max_logit", "maximum logit, negated", {"logits"},
                                 lambda x, fit: -x["logits"].max(axis=1))
             """)
    try:
        assert "neg_max_logit" in list_detectors() and "msp" in list_detectors()
        u = get_detector("neg_max_logit").score({"logits": np.array([[3.0, 1.0], [0.5, 0.2]])})
        np.testing.assert_array_equal(u, [-3.0, -0.5])
    finally:
        DETECTORS.pop("neg_max_logit", None)
        DETECTORS.plugins.pop("neg_max_logit", None)


def test_msp_is_the_negated_maximum_softmax_probability():
    z = np.array([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(get_detector("msp").score({"logits": z}), -p.max(axis=1))


def test_a_detector_checks_its_needs_and_its_result():
    with pytest.raises(ValueError, match="unknown needs.*'gradients'"):
        Detector("x", "", {"gradients"}, lambda x, f: x)
    with pytest.raises(ValueError, match="must read the scored samples"):
        Detector("x", "", {"fit"}, lambda x, f: x)
    fits = Detector("fitter", "", {"embedding", "fit"}, lambda x, f: x["embedding"][:, 0])
    with pytest.raises(ValueError, match=r"needs \['embedding'\]"):
        fits.score({"logits": np.zeros((2, 2))}, fit={})
    with pytest.raises(ValueError, match="pass fit="):
        fits.score({"embedding": np.zeros((2, 2))})
    short = Detector("short", "", {"logits"}, lambda x, f: x["logits"][:1, 0])
    with pytest.raises(ValueError, match=r"shape \(1,\) for 2 samples"):
        short.score({"logits": np.zeros((2, 2))})
    members = Detector("m", "", {"members"}, lambda x, f: x["members"].std(axis=0).sum(axis=1))
    assert members.score({"members": np.zeros((3, 5, 2))}).shape == (5,)


def test_doctests_pass():
    import doctest

    from uqmetrics.metrics import detectors, registry

    for module in (detectors, registry):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.attempted > 0 and result.failed == 0, module.__name__
