"""The result-file schema (uqmetrics.runs.result_schema): stamped results pass the shared reader, and
each kind of violation is refused with a message naming the file and the problem."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

import uqmetrics
from uqmetrics import CONVENTIONS, IncompleteResultError, write_dataset
from uqmetrics.metrics.registry import list_metrics
from uqmetrics.runs import result_schema as rs
from uqmetrics.runs.result_schema import (
    RESULT_SCHEMA_VERSION,
    ResultSchemaError,
    check_result,
    input_checksum,
    metric_variables,
    read_result,
    result_attrs,
    stamp_result,
    tag_metric,
)

SUMS = ["0" * 64, "f" * 64]
REGISTERED = frozenset(list_metrics())

checksums = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
names = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True)


def _data() -> xr.Dataset:
    return xr.Dataset({"nll": ("model", [0.7, 0.9]), "cll": ("model", [-0.6, -0.8]),
                       "temperature": ("model", [1.2, 1.4])}, coords={"model": ["a", "b"]})


def _result(**kw) -> xr.Dataset:
    args = {"input_checksums": SUMS, "metrics": {"nll": "nll", "cll": ("cll", True)},
            "config": {"k": 1}, "seed": 0, **kw}
    return stamp_result(_data(), "toy", **args)


def _write(ds: xr.Dataset, folder: Path, name: str = "result.nc") -> Path:
    return write_dataset(ds, Path(folder) / name, overwrite=True)


# -- valid results ---------------------------------------------------------------------------


def test_a_stamped_result_reads_back_through_the_reader(tmp_path):
    path = _write(_result(notes="free text lives here"), tmp_path)
    ds = read_result(path, protocol="toy")
    assert ds.attrs["result_schema"] == RESULT_SCHEMA_VERSION and ds.attrs["protocol"] == "toy"
    assert json.loads(ds.attrs["conventions"]) == CONVENTIONS
    assert json.loads(ds.attrs["input_checksums"]) == SUMS
    assert ds.attrs["notes"] == "free text lives here"
    assert {"git_commit", "created_utc", "numpy_version", "config"} <= set(ds.attrs)
    assert metric_variables(ds) == {"nll": ("nll", False), "cll": ("cll", True)}
    assert "metric" not in ds["temperature"].attrs
    decoded = read_result(path, protocol={"toy", "other"}, decode_attrs=True)
    assert decoded.attrs["input_checksums"] == SUMS
    np.testing.assert_array_equal(decoded["nll"].values, [0.7, 0.9])


def test_the_data_are_not_touched_by_the_stamp():
    before = _data()
    after = _result()
    xr.testing.assert_equal(before, after)  # identical but for the attributes


def test_refined_conventions_and_extra_attrs_are_kept():
    conv = {**CONVENTIONS, "aurc_c": "S.2: over [0, 0.2]"}
    ds = _result(conventions=conv, extra={"n_images": 10, "caches": {"a.nc": "0" * 64}})
    assert json.loads(ds.attrs["conventions"])["aurc_c"] == "S.2: over [0, 0.2]"
    assert ds.attrs["n_images"] == 10 and json.loads(ds.attrs["caches"]) == {"a.nc": "0" * 64}


@settings(deadline=None)
@given(protocol=names, sums=st.lists(checksums, min_size=1, max_size=6),
       tags=st.dictionaries(names.filter(lambda n: n not in REGISTERED),
                            st.booleans(), min_size=1, max_size=4))
def test_any_protocol_inputs_and_metric_tags_make_a_valid_result(protocol, sums, tags):
    ds = xr.Dataset({f"v_{m}": ("i", np.arange(3.0)) for m in tags})
    out = stamp_result(ds, protocol, input_checksums=sums,
                       metrics={f"v_{m}": (m, better) for m, better in tags.items()})
    check_result(out, protocol=protocol)
    assert json.loads(out.attrs["input_checksums"]) == sorted(set(sums))
    assert metric_variables(out) == {f"v_{m}": (m, better) for m, better in tags.items()}


@settings(deadline=None, max_examples=10)
@given(sums=st.lists(checksums, min_size=1, max_size=4),
       better=st.booleans())
def test_a_valid_result_survives_the_file_round_trip(sums, better):
    ds = stamp_result(_data(), "toy", input_checksums=sums,
                      metrics={"cll": ("cll", better), "nll": "nll"})
    with tempfile.TemporaryDirectory() as d:
        back = read_result(_write(ds, Path(d)))
    assert metric_variables(back) == {"nll": ("nll", False), "cll": ("cll", better)}
    assert json.loads(back.attrs["input_checksums"]) == sorted(set(sums))


def test_input_checksum_prefers_a_caches_recorded_checksum():
    ds = _data()
    assert input_checksum(ds) == uqmetrics.dataset_checksum(ds)
    assert input_checksum(ds.assign_attrs(checksum="ab" * 32)) == "ab" * 32
    assert input_checksum(ds.assign_attrs(checksum="not hex")) == uqmetrics.dataset_checksum(ds)


# -- violations ------------------------------------------------------------------------------


def _drop(attr):
    def change(ds):
        del ds.attrs[attr]
    return change


def _set(attr, value):
    def change(ds):
        ds.attrs[attr] = value
    return change


def _var(name, attr, value=None):
    def change(ds):
        if value is None:
            del ds[name].attrs[attr]
        else:
            ds[name].attrs[attr] = value
    return change


def _untag(ds):
    for name in ds.data_vars:
        ds[name].attrs.clear()


VIOLATIONS = {
    "no schema version": (_drop("result_schema"), "lacks attr 'result_schema'"),
    "schema version not an int": (_set("result_schema", "one"), "not a schema version"),
    "later schema version": (_set("result_schema", RESULT_SCHEMA_VERSION + 1), "later schema"),
    "no protocol": (_drop("protocol"), "lacks attr 'protocol'"),
    "protocol in prose": (_set("protocol", "UIMNET (docs/conventions.md#v-3)"),
                          ("attr 'protocol' is 'UIMNET (docs/conventions.md#v-3)', not a "
                           "protocol's registry name")),
    "protocol with a final newline": (_set("protocol", "toy\n"),  # its site page: "toy\n.html"
                                      "attr 'protocol' is 'toy\\n', not a protocol's registry name"),
    "no conventions": (_drop("conventions"), "lacks attr 'conventions'"),
    "conventions in prose": (_set("conventions", "S.5: cosine R@1 excluding the query"),
                             ("attr 'conventions' is 'S.5: cosine R@1 excluding the query', "
                              "not the JSON object")),
    "conventions entry not text": (_set("conventions", json.dumps({"nll": [1]})),
                                   "the entry 'nll' is [1]"),
    "no input checksums": (_drop("input_checksums"), "lacks attr 'input_checksums'"),
    "input checksums not a list": (_set("input_checksums", json.dumps({"a": SUMS[0]})),
                                   "not a JSON list of checksums"),
    "input checksums empty": (_set("input_checksums", "[]"), "'input_checksums' is empty"),
    "input checksums unsorted": (_set("input_checksums", json.dumps(SUMS[::-1])),
                                 "not sorted without duplicates"),
    "input checksums repeated": (_set("input_checksums", json.dumps([SUMS[0]] * 2)),
                                 "not sorted without duplicates"),
    "input checksum not hex": (_set("input_checksums", json.dumps(["a.nc"])),
                               "holds 'a.nc', not a checksum"),
    "direction without metric": (_var("nll", "metric"),
                                 "variable 'nll' has 'greater_is_better' but no 'metric'"),
    "metric without direction": (_var("cll", "greater_is_better"),
                                 "variable 'cll' (metric 'cll') lacks attr 'greater_is_better'"),
    "direction not 0 or 1": (_var("cll", "greater_is_better", 2),
                             "variable 'cll': attr 'greater_is_better' is 2, not 0 or 1"),
    "metric name in prose": (_var("cll", "metric", "calibrated log-likelihood"),
                             "attr 'metric' is 'calibrated log-likelihood', not a metric's name"),
    "direction contradicts the registry": (_var("nll", "greater_is_better", 1),
                                           ("greater_is_better=1 contradicts the registered "
                                            "metric 'nll' (greater_is_better=0)")),
    "no metric variable": (_untag, "no data variable carries a metric tag"),
}


@pytest.mark.parametrize("kind", VIOLATIONS)
def test_each_violation_is_refused_naming_the_file_and_the_problem(kind, tmp_path):
    change, message = VIOLATIONS[kind]
    ds = _result()
    change(ds)
    path = _write(ds, tmp_path)
    with pytest.raises(ResultSchemaError) as err:
        read_result(path)
    assert str(path) in str(err.value) and message in str(err.value), str(err.value)
    assert err.value.path == path and len(err.value.problems) == 1
    assert isinstance(err.value, ValueError)
    with pytest.raises(ResultSchemaError, match="result dataset does not follow"):
        check_result(ds)


def test_every_problem_is_named_at_once(tmp_path):
    ds = _result()
    for change in (_drop("protocol"), _set("conventions", "prose"), _var("cll", "metric")):
        change(ds)
    with pytest.raises(ResultSchemaError) as err:
        read_result(_write(ds, tmp_path))
    assert len(err.value.problems) == 3


def test_a_result_of_another_protocol_is_refused(tmp_path):
    path = _write(_result(), tmp_path)
    with pytest.raises(ResultSchemaError, match="attr 'protocol' is 'toy', expected 'selective'"):
        read_result(path, protocol="selective")
    with pytest.raises(ResultSchemaError, match=r"expected one of \['pitfalls', 'url'\]"):
        read_result(path, protocol=("url", "pitfalls"))


@settings(deadline=None)
@given(sums=st.lists(checksums, min_size=2, max_size=5, unique=True), data=st.data())
def test_any_unsorted_checksum_list_is_refused(sums, data):
    order = data.draw(st.permutations(sums).filter(lambda p: list(p) != sorted(p)))
    ds = _result()
    ds.attrs["input_checksums"] = json.dumps(list(order))
    with pytest.raises(ResultSchemaError, match="not sorted"):
        check_result(ds)


def test_an_incomplete_file_is_refused_as_such(tmp_path):
    path = tmp_path / "partial.nc"
    _result().to_netcdf(path)  # no completeness flag
    with pytest.raises(IncompleteResultError, match="completeness flag"):
        read_result(path)
    with pytest.raises(FileNotFoundError):
        read_result(tmp_path / "absent.nc")


# -- the writer's own checks -----------------------------------------------------------------


def test_tag_metric_takes_the_registrys_direction_and_refuses_a_contradiction():
    assert tag_metric(xr.DataArray([1.0]), "auroc").attrs == {"metric": "auroc",
                                                              "greater_is_better": 1}
    with pytest.raises(ValueError, match="contradicts the registered metric 'aurc'"):
        tag_metric(xr.DataArray([1.0]), "aurc", greater_is_better=True)
    with pytest.raises(ValueError, match="'in_as_in' is not registered.*give its greater_is"):
        tag_metric(xr.DataArray([1.0]), "in_as_in")
    with pytest.raises(ValueError, match=r"lower-case identifier\), got .Top-1 accuracy."):
        tag_metric(xr.DataArray([1.0]), "Top-1 accuracy")


def test_stamp_result_names_a_missing_variable():
    with pytest.raises(KeyError, match="protocol 'toy': no data variable 'acc'"):
        stamp_result(_data(), "toy", input_checksums=SUMS, metrics={"acc": "accuracy"})


@pytest.mark.parametrize(("kw", "error", "message"), [
    ({"protocol": "Transfer (URL)"}, ValueError, "registry name .* got 'Transfer \\(URL\\)'"),
    ({"input_checksums": []}, ValueError, "input_checksums is empty"),
    ({"input_checksums": ["x.nc"]}, ValueError, "'x.nc' is not a checksum"),
    ({"input_checksums": SUMS[0]}, TypeError, "iterable of checksums, got the string"),
    ({"extra": {"protocol": "x"}}, ValueError, r"extra attrs \['protocol'\] are the result"),
    ({"extra": {"notes": "a"}, "notes": "b"}, ValueError, r"extra attrs \['notes'\]"),
])
def test_result_attrs_refuses_what_would_break_the_schema(kw, error, message):
    args = {"protocol": "toy", "input_checksums": SUMS, **kw}
    with pytest.raises(error, match=message):
        result_attrs(args.pop("protocol"), args.pop("input_checksums"), **args)


def test_result_attrs_sorts_and_deduplicates_the_checksums():
    attrs = result_attrs("toy", [SUMS[1], SUMS[0], SUMS[1]])
    assert json.loads(attrs["input_checksums"]) == SUMS


def test_importing_the_schema_imports_neither_xarray_nor_scipy():
    code = ("import sys, uqmetrics.runs.result_schema; "
            "print(sorted(m for m in ('xarray', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_the_schema_is_exported_by_uqmetrics():
    assert {"read_result", "stamp_result", "ResultSchemaError"} <= set(uqmetrics.__all__)
    assert uqmetrics.read_result is read_result


def test_doctests_pass():
    result = doctest.testmod(rs, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0
