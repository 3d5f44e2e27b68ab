"""Every ``uqvision score`` command prints its headline table and writes it as CSV beside the
score file (issue 37 §4): shift, ood and conformal through ``uqvision.cli.main`` on the
synthetic caches of their own score tests, the printed rows and the CSV read back against the
netCDF; and ``score ood --help`` names every registered detector, plugins included (§6)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from uqmetrics.metrics.detectors import list_detectors
from uqmetrics.report import parse_column
from uqmetrics.runs.testing.scripts import load_script

from uqvision.cli import main

HERE = Path(__file__).parent


def _caches_of(test_file: str):
    """The ``_caches(folder, ...)`` builder of one protocol's score tests."""
    return load_script(HERE / test_file, "_tables")._caches


def _score(capsys, name: str, caches: Path, out: Path, *options: str):
    """``uqvision score NAME``: (printed lines, CSV rows, the score file's Dataset)."""
    capsys.readouterr()
    assert main(["score", name, "--caches", str(caches), "--out", str(out), *options]) == 0
    printed = capsys.readouterr().out.splitlines()
    table = out.with_suffix(".csv")
    assert str(table) in printed  # its path said, as the score file's
    with open(table, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return printed, rows, xr.load_dataset(out)


def _value(ds: xr.Dataset, column: str, at: dict[str, str]) -> float:
    """A table column read from the score file at one row's labels: ``dim=mean`` is the mean
    over that dim (NaN where any value is)."""
    variable, selection = parse_column(column)
    da = ds[variable]
    for dim, label in {**at, **selection}.items():
        if dim not in da.dims or label == "mean":
            continue
        da = da.isel({dim: [str(v) for v in ds.indexes[dim].values].index(label)})
    means = [d for d, label in selection.items() if label == "mean"]
    return float(da.mean(means, skipna=False) if means else da)


def _same_numbers(rows, ds, keys):
    for row in rows:
        at = {k: row[k] for k in keys}
        for column, text in row.items():
            if column in keys:
                continue
            want = _value(ds, column, at)
            if math.isnan(want):
                assert text == "", (column, at)
            else:
                assert float(text) == want, (column, at)  # repr of the float64: exact


def _body(printed, header_word):
    """The printed table's caption, its header's first line and its rows (up to the CSV path
    line; a header's labels stacked below it, indented, and the line saying how many columns
    are shown, in parentheses, are not rows)."""
    start = next(i for i, line in enumerate(printed) if line.split()[:1] == [header_word]
                 and len(line.split()) > 2)
    end = next(i for i in range(start + 1, len(printed)) if printed[i].endswith(".csv"))
    rows = [line for line in printed[start + 1:end] if not line.startswith((" ", "("))]
    return printed[start - 1], printed[start].split(), rows


def test_score_shift_prints_and_writes_its_table(tmp_path, capsys):
    caches = _caches_of("shift/test_shift_score.py")(tmp_path / "c")
    printed, rows, ds = _score(capsys, "shift", caches, tmp_path / "shift.nc",
                               "--dataset", "test", "--calibration-dataset", "val",
                               "--baseline", "m1")
    columns = list(rows[0])
    for want in ("clean_accuracy[calibration=none]", "mean_corruption_error",
                 "relative_mean_corruption_error", "clean_ece[calibration=none]",
                 "accuracy[calibration=none,corruption=mean,severity=mean]"):
        assert want in columns
    # these caches have severities 1 and 2: no column of ECE at severity 5, and no error
    assert not any("severity=5" in c for c in columns)
    models = [str(m) for m in ds.indexes["model"]]
    assert sorted(r["model"] for r in rows) == sorted(models)  # one row per model
    top1 = [float(r["clean_accuracy[calibration=none]"]) for r in rows]
    assert top1 == sorted(top1, reverse=True)
    _same_numbers(rows, ds, ["model"])
    caption, header, body = _body(printed, "model")
    assert "sorted by clean_accuracy[calibration=none] descending" in caption
    assert "mean_corruption_error" in header
    assert [line.split()[0] for line in body] == [r["model"] for r in rows]

    # without a baseline the file has no mCE, and neither has the table
    _, rows, _ = _score(capsys, "shift", caches, tmp_path / "plain.nc", "--dataset", "test",
                        "--calibration-dataset", "val")
    assert not any("corruption_error" in c for c in rows[0])


def test_score_shift_table_has_ece_at_severity_5(tmp_path, capsys):
    from uqvision.protocols.shift.__init__ import PROTOCOL

    ds = xr.Dataset(
        {"ece": (("model", "corruption", "severity", "calibration"),
                 np.arange(16, dtype=float).reshape(2, 2, 2, 2), {"metric": "ece",
                                                                   "greater_is_better": 0}),
         "accuracy": (("model", "corruption", "severity", "calibration"),
                      np.linspace(0, 1, 16).reshape(2, 2, 2, 2),
                      {"metric": "accuracy", "greater_is_better": 1}),
         "clean_accuracy": (("model", "calibration"), [[0.2, 0.2], [0.9, 0.9]],
                            {"metric": "accuracy", "greater_is_better": 1}),
         "clean_ece": (("model", "calibration"), [[0.1, 0.0], [0.3, 0.1]],
                       {"metric": "ece", "greater_is_better": 0})},
        coords={"model": ["a", "b"], "corruption": ["fog", "noise"], "severity": [1, 5],
                "calibration": ["none", "temperature"]}, attrs={"protocol": "shift"})
    table = PROTOCOL.score_table.make(type("A", (), {"out": str(tmp_path / "s.nc")})(), ds)
    assert [r["model"] for r in table.rows] == ["b", "a"]
    column = "ece[calibration=none,severity=5,corruption=mean]"
    assert column in table.columns
    # model a: ece[none] at severity 5 is 2 (fog) and 6 (noise)
    assert table.rows[1][column] == pytest.approx(4.0)


def test_score_ood_prints_and_writes_openood_table(tmp_path, capsys):
    caches = _caches_of("ood/test_ood_score.py")(tmp_path / "c")
    printed, rows, ds = _score(capsys, "ood", caches, tmp_path / "ood.nc",
                               "--id-dataset", "test", "--fit-data", "fit")
    assert list(rows[0]) == ["model", "detector", "near_fpr_at_95_tpr", "near_auroc",
                             "far_fpr_at_95_tpr", "far_auroc", "id_accuracy"]
    # a row per model and detector scored (member detectors of one network are not)
    scored = {(str(m), str(d)) for m in ds.indexes["model"] for d in ds.indexes["detector"]
              if not np.isnan(ds["near_auroc"].sel(model=m, detector=d))}
    got = [(r["model"], r["detector"]) for r in rows]
    assert len(got) == len(set(got)) and set(got) == scored
    assert {m for m, _ in got} == {str(m) for m in ds.indexes["model"]}
    near = [float(r["near_auroc"]) for r in rows]
    assert near == sorted(near, reverse=True)  # OpenOOD's leaderboard order
    _same_numbers(rows, ds, ["model", "detector"])
    caption, header, body = _body(printed, "model")
    assert header == list(rows[0]) and "sorted by near_auroc descending" in caption
    assert [tuple(line.split()[:2]) for line in body] == got


def test_score_conformal_prints_and_writes_its_table(tmp_path, capsys):
    caches = _caches_of("conformal/test_conformal_score.py")(tmp_path / "c")
    printed, rows, ds = _score(capsys, "conformal", caches, tmp_path / "conformal.nc",
                               "--dataset", "test", "--calibration-dataset", "val",
                               "--trials", "3", "--alphas", "0.1", "0.2")
    # RAPS's Table 1 as published (issue 38 §2): a row per model; the medians over the trials
    # of top-1 and top-5 accuracy, then coverage and mean set size of Top-K, Naive, APS and
    # RAPS, Platt-scaled per trial (each level: the method's two levels side by side)
    columns = ["accuracy_median", "top5_accuracy_median"] + [
        f"{v}_median[method={m},alpha={a},calibration=platt]"
        for v in ("coverage", "mean_set_size") for m in ("topk", "naive", "aps", "raps")
        for a in ("0.1", "0.2")]
    assert list(rows[0]) == ["model", *columns]
    assert [r["model"] for r in rows] == [str(m) for m in ds.indexes["model"]]  # file order
    _same_numbers(rows, ds, ["model"])
    caption, header, body = _body(printed, "model")
    assert caption.startswith("conformal: a row per model")
    assert caption.endswith("every column with a calibration at calibration=platt")
    # printed: the first columns that fit a terminal, each variable over its labels; the CSV
    # has them all (test_tables_audit.py)
    assert header[1:] == [c.partition("[")[0] for c in columns[:len(header) - 1]]
    assert f"of {len(columns)} columns shown; all {len(columns)}: " \
        f"{tmp_path / 'conformal.csv'})" in printed[-2]
    assert len(body) == len(rows)


def test_score_ood_help_lists_every_detector(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["score", "ood", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    detectors = list_detectors()
    assert "toy_max_logit" in detectors  # the toy plugin's (tests/plugin)
    for name in detectors:
        assert f" {name}," in text or f" {name} " in text, name
