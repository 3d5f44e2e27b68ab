"""``uqreg plot`` and ``uqreg report`` of a file from someone else: the figure names built from
its labels (recipes, complexities, the task) never lead outside ``--out`` (before, a recipe
labelled ``x/../../escaped/y`` wrote ``escaped/y.png`` beside the output folder)."""

from __future__ import annotations

from dataclasses import replace

import uqmetrics

from uqreg import cli
from uqreg.study import StudyConfig, run_study

EVIL = "x/../../../escaped/y"


def _inside(root, out) -> list[str]:
    """Every file under ``root``, which must all lie under ``out``."""
    files = [p for p in root.rglob("*") if p.is_file()]
    outside = [str(p) for p in files if out not in p.parents]
    assert not outside, outside
    return sorted(p.name for p in files if out in p.parents)


def test_a_recipe_label_never_names_a_folder(tmp_path, capsys):
    ds = run_study(StudyConfig(task="sinusoid", complexities=(1,), methods=("blr",), repetitions=2,
                               recipes=("paper", "none")), progress=False)
    theirs = tmp_path / "received" / "study.nc"
    theirs.parent.mkdir()
    uqmetrics.write_dataset(ds.assign_coords(recipe=["paper", EVIL]), theirs)
    for command in ("plot", "report"):
        out = tmp_path / command / "out"
        assert cli.main([command, str(theirs), "--out", str(out)]) == 0, capsys.readouterr().err
        names = _inside(tmp_path / command, out)
        assert any("x+..+..+..+escaped+y" in n for n in names), names
    assert not (tmp_path / "escaped").exists()


def test_a_task_attr_never_names_a_folder(tmp_path, capsys):
    from uqreg.disentangle import SCALES, run_task

    scale = replace(SCALES.lookup("smoke"), name="tiny", tasks={"sinusoid_het": (1,)}, methods=("ens+mv",),
                    repetitions=2)
    run_task(scale, "sinusoid_het", tmp_path / "mine", progress=False)
    ds = uqmetrics.read_dataset(tmp_path / "mine" / "study.nc")
    ds.attrs["task"] = EVIL
    theirs = uqmetrics.write_dataset(ds, tmp_path / "received.nc")
    out = tmp_path / "work" / "figs"
    assert cli.main(["plot", str(theirs), "--out", str(out)]) == 0, capsys.readouterr().err
    assert _inside(tmp_path / "work", out) == ["disentangle_x+..+..+..+escaped+y_leakage.png",
                                              "disentangle_x+..+..+..+escaped+y_variances.png"]
    assert not (tmp_path / "escaped").exists()
