"""Plugins: the toy plugin package (tests/plugin), installed with pip by conftest.py, joins every
registry through its entry points; a broken plugin is one line, never a crash; and a protocol
added inside the package is its folder plus one registration line."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from uqmetrics import read_result
from uqmetrics.metrics.detectors import DETECTORS, get_detector

import uqvision
from uqvision.evalsets import EVAL_SETS
from uqvision.models import MODEL_SOURCES, ModelSpec, data_config, load_model
from uqvision.plugins import PLUGIN_REGISTRIES, plugin_report
from uqvision.predict import PredictConfig, predict
from uqvision.protocols import VISION_PROTOCOLS
from uqvision.training import TRAINING_METHODS

#: What the toy plugin declares (tests/plugin/pyproject.toml): group -> entry point names.
DECLARED = {"uqvision.training_methods": ["toy_label_smoothing"], "uqvision.model_sources": ["toy"],
            "uqvision.eval_sets": ["toy-shifted"], "uqmetrics.detectors": ["toy_max_logit"],
            "uqvision.protocols": ["toy"]}


def _uqvision(*args: str, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "uqvision", *args], capture_output=True,
                          check=False, text=True, env={**os.environ, **(env or {})}, cwd=cwd,
                          timeout=600)


def test_the_plugin_joins_every_registry_through_its_entry_points():
    assert {r.group: sorted(r.plugins) for r in PLUGIN_REGISTRIES} == DECLARED
    assert all(not r.broken for r in PLUGIN_REGISTRIES)
    import uqvision_toy
    from uqvision_toy import detector, evalset, method, source

    assert VISION_PROTOCOLS.lookup("toy") is uqvision_toy.PROTOCOL
    assert TRAINING_METHODS.lookup("toy_label_smoothing") is method.METHOD
    assert MODEL_SOURCES.lookup("toy") is source.ToySource
    assert EVAL_SETS.lookup("toy-shifted") is evalset.EVAL_SET
    assert get_detector("toy_max_logit") is DETECTORS["toy_max_logit"] is detector.DETECTOR
    assert Path(uqvision_toy.__file__).is_relative_to(Path(os.environ["PYTHONPATH"].split(
        os.pathsep)[0]))  # the installed copy, not the source folder
    assert uqvision.load_plugins() == {r.group: {} for r in PLUGIN_REGISTRIES}  # idempotent


def test_the_plugin_model_source_predicts_with_timms_interface(digits):
    spec = ModelSpec.parse("toy/meancolour")
    loaded = load_model(spec, num_classes=10, allow_random_init=True)
    assert data_config(spec) == loaded.data_config
    out = predict(spec, digits / "test", PredictConfig(allow_random_init=True, embeddings=True,
                                                       extra_variables=("head_weight",)))[0]
    x = np.stack([loaded.transform(img).mean(dim=(1, 2)).numpy()
                  for img in _images(digits / "test", out.sample.values)])
    np.testing.assert_allclose(out["embedding"].values, x, rtol=1e-5, atol=1e-6)
    w = out["head_weight"].values
    np.testing.assert_allclose(out["logits"].values, x @ w.T + loaded.model.head.bias.detach()
                               .numpy(), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="unknown toy model 'other'"):
        load_model("toy/other", allow_random_init=True)


def _images(root: Path, samples):
    from uqvision.data import load_image

    return [load_image(root / s) for s in samples]


def test_the_plugin_detector_and_eval_set_are_usable():
    z = np.array([[3.0, 1.0], [0.5, 0.2]])
    np.testing.assert_array_equal(get_detector("toy_max_logit").score({"logits": z}),
                                  [-3.0, -0.5])
    assert EVAL_SETS.lookup("toy-shifted").role == "shifted"


def test_the_command_line_lists_the_plugins():
    r = _uqvision("plugins")
    assert r.returncode == 0, r.stderr
    for group, names in DECLARED.items():
        for name in names:
            assert re.search(rf"^{re.escape(group)}: {re.escape(name)} = .* \(loaded\)$",
                             r.stdout, re.MULTILINE), (group, name, r.stdout)
    assert plugin_report().splitlines() == r.stdout.splitlines()
    help_ = _uqvision("score", "-h").stdout
    assert "toy" in help_ and "toy_scores" in help_


def _broken_plugins(root: Path) -> None:
    """A distribution whose entry points fail three ways: an import error, an object of the
    wrong type, a name already taken."""
    (root / "brokenplug.py").write_text(textwrap.dedent("""
        NOT_A_PROTOCOL = "a string"
        import not_installed_library_xyz  # noqa: F401
        """))
    (root / "wrongtype.py").write_text("NOT_A_METHOD = 42\n")
    info = root / "brokenplug-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenplug\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[uqvision.protocols]\nbroken = brokenplug:NOT_A_PROTOCOL\n"
        "[uqvision.training_methods]\nnumber = wrongtype:NOT_A_METHOD\n"
        "[uqvision.model_sources]\ntimm = uqvision_toy.source:ToySource\n")


def test_a_broken_plugin_is_one_line_naming_it_and_nothing_stops(tmp_path):
    _broken_plugins(tmp_path)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ["PYTHONPATH"]])}
    r = _uqvision("reproduce", "-h", env=env)  # a help loads the protocols' plugins alone
    assert r.returncode == 0 and "toy" in r.stdout  # the good plugin still loads
    assert [line for line in r.stderr.splitlines() if line.strip() and "'broken'" not in line] \
        == [], r.stderr
    r = _uqvision("plugins", env=env)  # a command loads every plugin
    assert r.returncode == 1 and r.stdout.count("NOT LOADED") == 3
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 3, r.stderr
    expect = {"'broken'": "ModuleNotFoundError: No module named 'not_installed_library_xyz'",
              "'number'": "is of type int, not TrainingMethod",
              "'timm'": "model source 'timm' is already registered"}
    for name, why in expect.items():
        line = next(x for x in lines if name in x)
        assert "package brokenplug" in line and why in line, line
    assert "uqvision.protocols: toy = uqvision_toy:PROTOCOL (loaded)" in r.stdout


def test_a_plugin_that_calls_sys_exit_is_one_line_and_the_command_runs(tmp_path):
    """Issue 36, row 17: a plugin whose import calls ``sys.exit(0)`` made every command quit
    silently with exit 0; now it is one line naming it, and the command runs."""
    (tmp_path / "exitplug.py").write_text("import sys\nsys.exit(0)\n")
    info = tmp_path / "exitplug-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: exitplug\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[uqvision.protocols]\nquits = exitplug:PROTOCOL\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ["PYTHONPATH"]])}
    r = _uqvision("reproduce", "-h", env=env)
    assert r.returncode == 0 and "toy" in r.stdout, (r.returncode, r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "'quits'" in lines[0], r.stderr
    assert "package exitplug" in lines[0] and "sys.exit(0)" in lines[0], lines[0]
    r = _uqvision("plugins", env=env)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "uqvision.protocols: quits NOT LOADED: SystemExit: loading it called sys.exit(0)" \
        in r.stdout.splitlines()
    assert "uqvision.protocols: toy = uqvision_toy:PROTOCOL (loaded)" in r.stdout


@pytest.mark.slow
def test_a_protocol_added_in_the_package_is_its_folder_and_one_line(tmp_path, digits):
    """A copy of the installed uqvision gains a protocol folder (the toy protocol under another
    name) and one line in protocols/__init__.py; the command line then reproduces and scores
    it, and no other file of the package differs from the original."""
    src = Path(uqvision.__file__).parent
    copy = tmp_path / "site" / "uqvision"
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__"))
    folder = copy / "protocols" / "toy2"
    plugin = Path(__file__).parent / "plugin" / "uqvision_toy"
    shutil.copytree(plugin, folder, ignore=shutil.ignore_patterns("__pycache__"))
    for f in folder.glob("*.py"):  # the plugin's code as a folder of the package
        f.write_text(f.read_text().replace("uqvision_toy", "uqvision.protocols.toy2")
                     .replace('"toy"', '"toy2"').replace('"toy_scores"', '"toy2_scores"'))
    init = copy / "protocols" / "__init__.py"
    init.write_text(init.read_text() + 'VISION_PROTOCOLS.register(_folder("toy2"))\n')

    changed = [str(p.relative_to(copy)) for p in sorted(copy.rglob("*"))
               if p.is_file() and "__pycache__" not in p.parts and "toy2" not in p.parts
               and (not (src / p.relative_to(copy)).is_file()
                    or (src / p.relative_to(copy)).read_bytes() != p.read_bytes())]
    assert changed == ["protocols/__init__.py"]
    env = {"PYTHONPATH": os.pathsep.join([str(copy.parent), os.environ["PYTHONPATH"]])}
    out = tmp_path / "run"
    r = _uqvision("reproduce", "toy2", "--scale", "smoke", "--out", str(out), env=env)
    assert r.returncode == 0, r.stderr
    r = _uqvision("score", "toy2", "--caches", str(out / "caches"), "--calibration-size", "0.5",
                  "--out", str(tmp_path / "toy2.nc"), env=env)
    assert r.returncode == 0, r.stderr
    with xr.open_dataset(tmp_path / "toy2.nc") as ds:
        assert ds.attrs["protocol"] == "toy2" and ds.sizes["model"] == 2
    read_result(tmp_path / "toy2.nc", protocol="toy2")
