"""The generic core of ``verify`` (:mod:`uqmetrics.report.verify`) on synthetic result files: a toy
protocol whose metric is the mean of each row's cache, recomputed by a rescorer that reads the
caches the result records."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from uqmetrics import InputError, dataset_checksum, read_dataset, stamp_result, write_dataset
from uqmetrics.report.verify import MANIFEST, column_name, verify
from uqmetrics.runs.io import decode_attr

ROWS = ("a", "b", "c")


def _score(caches: dict[str, str]) -> xr.Dataset:
    """The toy protocol's scorer: ``score`` (row, calibration) = the mean (``none``) and the
    mean times 2 (``double``) of the row's cache; attrs ``caches`` and ``entries``."""
    rows, values, identity = [], [], {}
    for path in caches:
        ds = read_dataset(path)
        row = str(ds.attrs["model"])
        rows.append(row)
        m = float(ds["x"].values.mean())
        values.append([m, 2 * m])
        identity[path] = {"model": row}
    out = xr.Dataset({"score": (("model", "calibration"), np.array(values))},
                     coords={"model": rows, "calibration": ["none", "double"]})
    entries = {"dim": "model", "provenance": {r: {"caches": [p]} for r, p in
                                              zip(rows, caches, strict=True)},
               "conflicts": {}, "identity": identity}
    return stamp_result(out, "toy", input_checksums=list(caches.values()),
                        metrics={"score": ("score", True)},
                        extra={"caches": json.dumps(caches), "entries": json.dumps(entries)})


def _rescore(result: xr.Dataset, path) -> xr.Dataset:
    caches = decode_attr(result.attrs["caches"])
    return _score({p: dataset_checksum(read_dataset(p)) for p in caches})


def _rescorer(protocol: str):
    return _rescore if protocol == "toy" else None


def _toy_result(tmp_path, xs: dict) -> Path:
    """``tmp_path/toy.nc`` scored from one cache per row, its ``x`` the row's values."""
    caches = {}
    for row, x in xs.items():
        ds = xr.Dataset({"x": ("i", np.asarray(x, dtype=float))}, attrs={"model": row})
        path = tmp_path / "caches" / f"{row}.nc"
        path.parent.mkdir(exist_ok=True)
        write_dataset(ds, path)
        caches[str(path)] = dataset_checksum(ds)
    return write_dataset(_score(caches), tmp_path / "toy.nc")


@pytest.fixture
def result(tmp_path):
    rng = np.random.default_rng(0)
    return _toy_result(tmp_path, {row: rng.normal(size=50) for row in ROWS})


def _run(target, **kw) -> tuple[int, str]:
    lines: list[str] = []
    code = verify(target, _rescorer, out=lines.append, **kw)
    return code, "\n".join(lines)


def _blocks(text: str) -> dict[str, str]:
    return {b.split()[0]: b for b in re.split(r"^entry ", text, flags=re.MULTILINE)[1:]}


def test_an_untouched_result_agrees(result):
    code, text = _run(result)
    assert code == 0, text
    assert "summary: 3 entries: 3 agree, 0 disagree; tolerance: rtol=1e-09, atol=1e-12" in text
    ds = read_dataset(result)
    for row in ROWS:
        v = float(ds["score"].sel(model=row, calibration="double"))
        assert (f"agree     score[calibration=double]  recorded={v!r} recomputed={v!r} "
                f"|diff|=0 tolerance: rtol=1e-09, atol=1e-12") in _blocks(text)[f"toy:{row}"]
        assert f"cache ok        {result.parent / 'caches' / (row + '.nc')}" in text


def test_a_metric_altered_in_the_file_disagrees_on_its_entry(result, tmp_path):
    ds = read_dataset(result)
    ds["score"].loc[{"model": "b", "calibration": "none"}] += 1e-6
    altered = tmp_path / "altered.nc"
    write_dataset(ds, altered)
    code, text = _run(altered)
    assert code == 1
    blocks = _blocks(text)
    assert re.search(r"^  disagree  score\[calibration=none\]  recorded=\S+ recomputed=\S+ "
                     r"\|diff\|=1e-06 tolerance: rtol=1e-09, atol=1e-12$", blocks["toy:b"],
                     flags=re.MULTILINE), blocks["toy:b"]
    assert "DISAGREE" not in blocks["toy:a"] + blocks["toy:c"]
    assert "summary: 3 entries: 2 agree, 1 disagree (toy:b)" in text


def test_the_tolerance_decides(result, tmp_path):
    ds = read_dataset(result)
    v = float(ds["score"].sel(model="a", calibration="none"))
    ds["score"].loc[{"model": "a", "calibration": "none"}] = v * (1 + 1e-7)
    altered = tmp_path / "altered.nc"
    write_dataset(ds, altered)
    assert _run(altered)[0] == 1  # 1e-7 relative: beyond the default rtol 1e-9
    code, text = _run(altered, rtol=1e-6)
    assert code == 0, text
    assert "tolerance: rtol=1e-06, atol=1e-12" in text


def test_a_cache_whose_checksum_differs_from_the_recorded_one_disagrees(result, tmp_path):
    ds = read_dataset(result)
    caches = decode_attr(ds.attrs["caches"])
    victim = next(p for p in caches if p.endswith("c.nc"))
    caches[victim] = "0" * 64
    ds.attrs["caches"] = json.dumps(caches)
    altered = tmp_path / "altered.nc"
    write_dataset(ds, altered)
    code, text = _run(altered)
    assert code == 1
    block = _blocks(text)["toy:c"]
    assert f"cache disagree  {victim}: checksum" in block
    assert "differs from the recorded 000000000000" in block
    assert "DISAGREE: 2 of 2 values agree, 0 of 1 caches intact" in block
    assert "summary: 3 entries: 2 agree, 1 disagree (toy:c)" in text


def test_a_cache_changed_on_disk_disagrees_in_checksum_and_values(result):
    victim = result.parent / "caches" / "a.nc"
    ds = read_dataset(victim)
    ds["x"].values[0] += 1.0
    write_dataset(ds, victim, overwrite=True)  # its own checksums are the new data's
    code, text = _run(result)
    assert code == 1
    block = _blocks(text)["toy:a"]
    assert f"cache disagree  {victim}: checksum" in block
    assert re.search(r"^  disagree  score\[calibration=none\]", block, flags=re.MULTILINE)


def test_a_missing_cache_and_an_identity_change_are_named(result):
    (result.parent / "caches" / "b.nc").unlink()
    victim = result.parent / "caches" / "c.nc"
    ds = read_dataset(victim)
    ds.attrs["model"] = "z"
    write_dataset(ds, victim, overwrite=True)
    code, text = _run(result)
    assert code == 1
    blocks = _blocks(text)
    assert f"cache disagree  {result.parent / 'caches' / 'b.nc'}: missing" in blocks["toy:b"]
    assert "identity: model is 'z', the result recorded 'c'" in blocks["toy:c"]
    assert "cannot recompute: FileNotFoundError" in blocks["toy:a"]  # never agreement


@pytest.mark.parametrize(("attr", "edit", "said"), [
    ("entries", lambda e: {**e, "identity": [1]}, "'identity' is not an object"),
    ("entries", lambda e: {**e, "provenance": ["a"]}, "'provenance' is not an object"),
    ("entries", lambda e: {**e, "provenance": {"a": {"caches": [1]}}},
     "'provenance' is not an object"),
    ("caches", lambda c: {p: 5 for p in c}, "attr 'caches' is not a JSON object"),
])
def test_an_edited_record_of_the_caches_disagrees_naming_the_attr(result, tmp_path, attr, edit,
                                                                   said):
    """A result file whose ``caches`` or ``entries`` attr was edited into another shape (attrs
    carry no checksum) stopped ``verify`` with a bare ``AttributeError`` or ``TypeError``
    naming neither the file nor the attr; the file now disagrees, naming the attr."""
    ds = read_dataset(result)
    ds.attrs[attr] = json.dumps(edit(decode_attr(ds.attrs[attr])))
    altered = tmp_path / "altered.nc"
    write_dataset(ds, altered)
    code, text = _run(altered)
    assert code == 1
    assert "  disagree  the result file's attr " in text and said in text
    assert f"result {altered.resolve()}" in text
    assert "summary: 1 entry: 0 agree, 1 disagree (altered.nc)" in text


def test_a_protocol_without_rescoring_never_agrees(result):
    lines: list[str] = []
    assert verify(result, lambda protocol: None, out=lines.append) == 1
    assert lines.count("  disagree  cannot recompute: protocol toy records no rescoring") == 3


def _site(tmp_path, result, **change) -> str:
    ds = read_dataset(result)
    entries = []
    for row in ROWS:
        entries.append({"id": f"toy:{row}", "protocol": "toy", "result": str(result),
                        "result_checksum": dataset_checksum(ds), "dim": "model", "row": row,
                        "metrics": {column_name("score", {"calibration": c}):
                                    float(ds["score"].sel(model=row, calibration=c))
                                    for c in ("none", "double")}})
    for row, (key, value) in change.items():
        entry = next(e for e in entries if e["row"] == row)
        if key == "result_checksum":
            entry[key] = value
        else:
            entry["metrics"][key] = value
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / MANIFEST).write_text(json.dumps({"generator": "uqmetrics.report",
                                             "manifest_version": 1, "entries": entries}))
    return str(site)


def test_a_site_and_one_of_its_entries(result, tmp_path):
    site = _site(tmp_path, result)
    code, text = _run(site)
    assert code == 0, text
    assert text.count("agree     result_checksum") == 3
    assert "agree     manifest metrics: 2 values equal the file's" in text
    code, text = _run(f"{site}#toy:b")
    assert code == 0, text
    assert list(_blocks(text)) == ["toy:b"]


def test_a_site_whose_manifest_no_longer_matches_disagrees(result, tmp_path):
    site = _site(tmp_path, result, a=("result_checksum", "f" * 64),
                 b=("score[calibration=none]", 0.5))
    code, text = _run(site)
    assert code == 1
    blocks = _blocks(text)
    assert "disagree  result_checksum  manifest=" + "f" * 64 in blocks["toy:a"]
    assert "manifest metrics: 1 of 2 differ from the file: score[calibration=none] " \
           "manifest=0.5" in blocks["toy:b"]
    assert "DISAGREE" not in blocks["toy:c"]


def test_a_site_entry_with_an_infinite_value_agrees(tmp_path):
    # JSON has no infinity: the site's manifest writes an infinite metric value as null, as it
    # does NaN, and the check of the manifest against the file reads it back as such.
    from uqmetrics.report import build_site

    path = _toy_result(tmp_path, {"a": [np.inf, 1.0], "b": [0.5, 1.5]})
    build_site([path], tmp_path / "site", figures=False)
    manifest = json.loads((tmp_path / "site" / MANIFEST).read_text())
    assert manifest["entries"][0]["metrics"]["score[calibration=none]"] is None
    code, text = _run(tmp_path / "site")
    assert code == 0, text
    assert "agree     manifest metrics: 2 values equal the file's" in _blocks(text)["toy:a"]


def test_bad_targets_are_input_errors(result, tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        verify(tmp_path / "nowhere.nc", _rescorer, out=lambda line: None)
    with pytest.raises(InputError, match="not a report site"):
        verify(tmp_path / "caches", _rescorer, out=lambda line: None)
    site = _site(tmp_path, result)
    with pytest.raises(InputError, match="no entry 'toy:zz'.*'toy:a'"):
        verify(f"{site}#toy:zz", _rescorer, out=lambda line: None)
    with pytest.raises(InputError, match="rtol must be a finite number >= 0"):
        verify(result, _rescorer, rtol=-1.0, out=lambda line: None)



def test_a_manifest_nested_past_the_stack_is_not_a_manifest(tmp_path):
    """A site's ``manifest.json`` of JSON nested past Python's stack raised a bare
    ``RecursionError``; it is not a report manifest, named."""
    (tmp_path / MANIFEST).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match="manifest.json: not a report manifest"):
        verify(tmp_path, _rescorer, out=lambda line: None)


def test_a_target_that_is_not_netcdf_is_an_input_error(tmp_path):
    text = tmp_path / "passwd"
    text.write_text("root:x:0:0:root:/root:/bin/bash\n")
    with pytest.raises(InputError, match=r"target '.*passwd' is not a netCDF file"):
        verify(text, _rescorer, out=lambda line: None)


def test_a_result_of_another_tool_is_refused_naming_the_tool_that_verifies_it(result, tmp_path):
    ds = read_dataset(result)
    ds.attrs["run_config"] = json.dumps({"command": "uqvision score toy", "options": {}})
    other = write_dataset(ds, tmp_path / "vision.nc")
    with pytest.raises(InputError, match=r"is a result of uqvision, not of uqreg: verify it with "
                                         r"uqvision verify"):
        verify(other, _rescorer, tool="uqreg", out=lambda line: None)
    site = _site(tmp_path, other)
    with pytest.raises(InputError, match=r"^toy:b: .* verify it with uqvision verify"):
        verify(f"{site}#toy:b", _rescorer, tool="uqreg", out=lambda line: None)
    assert verify(other, _rescorer, tool="uqvision", out=lambda line: None) == 0
