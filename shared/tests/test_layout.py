"""The layout of uqmetrics (issue 39): three layers behind a thin face, every public name of
the face kept, and the module paths of the flat layout importing, for one release, as the module
of their new path with one :class:`uqmetrics.MovedModuleWarning` naming it."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import uqmetrics

#: ``uqmetrics.__all__`` before the layers (issue 39): the face keeps every one of them.
FACE = (Path(__file__).with_name("uqmetrics_face.txt")).read_text().split()

#: Every module path of the flat layout and the new path it moved to.
MOVED = {
    **{f"uqmetrics.{n}": f"uqmetrics.metrics.{n}" for n in (
        "_validation", "calibration", "classification", "confidence", "conformal", "conventions",
        "detectors", "ensembles", "exceptions", "ood", "registry", "regression", "retrieval",
        "scoring", "selective", "shift", "stats")},
    **{f"uqmetrics.{n}": f"uqmetrics.runs.{n}" for n in (
        "config_options", "io", "lazy", "result_schema", "run_config", "sweep", "testing",
        "testing.attrs", "testing.examples", "testing.filesystems", "testing.parsers",
        "testing.profiles", "testing.signals", "testing.strategies")},
    "uqmetrics.plotting": "uqmetrics.report.plotting",
    "uqmetrics.verify": "uqmetrics.report.verify",
}


def test_the_folder_holds_three_layers_and_a_thin_face():
    root = Path(uqmetrics.__file__).parent
    assert sorted(p.name for p in root.iterdir() if p.suffix == ".py" or (
        p.is_dir() and p.name != "__pycache__")) == ["__init__.py", "metrics", "report", "runs"]


def test_the_face_keeps_every_public_name():
    assert uqmetrics.__all__ == FACE
    for name in FACE:
        assert getattr(uqmetrics, name) is not None


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_imports_the_new_module_and_warns_once(old):
    new = importlib.import_module(MOVED[old])
    for name in [old, *(m for m in sys.modules if m.startswith(old + "."))]:
        sys.modules.pop(name, None) if name in MOVED else None
    with pytest.warns(uqmetrics.MovedModuleWarning, match=rf"{old} has moved to {MOVED[old]}\b"):
        module = importlib.import_module(old)
    assert module is new and module.__name__ == MOVED[old]
    assert module.__spec__.name == MOVED[old]  # the alias did not replace the module's spec
    with warnings.catch_warnings():
        warnings.simplefilter("error", uqmetrics.MovedModuleWarning)
        assert importlib.import_module(old) is new  # once: the second import is silent
    if "." not in old.removeprefix("uqmetrics."):
        assert getattr(uqmetrics, old.removeprefix("uqmetrics.")) is new
    public = getattr(new, "__all__", [])
    for name in public:
        assert getattr(module, name) is getattr(new, name)


def test_the_old_names_of_the_report_package_still_import():
    from uqmetrics.report import build_site, column_name
    from uqmetrics.report.leaderboard import column_name as leaderboard_column_name
    assert column_name is leaderboard_column_name and callable(build_site)


def test_import_uqmetrics_imports_no_metric_family_and_no_scipy():
    code = ("import sys, uqmetrics; print(sorted(m for m in sys.modules if m == 'scipy' or "
            "m.startswith('uqmetrics.metrics.') and m.split('.')[-1] not in "
            "('conventions', 'exceptions')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
