"""``uqvision verify`` and the per-entry provenance of score files: a smoke reproduction's
score file agrees with its recomputation from the caches it names; a metric altered in the file,
or one cache rewritten with one logit changed (self-consistent checksums, but not the one the
score file recorded), makes that entry, and only that entry, disagree; every built-in protocol
records a rescoring, and its smoke reproduction's score files verify."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import xarray as xr
from uqmetrics import dataset_checksum, read_dataset, write_dataset
from uqmetrics.runs.io import decode_attr

from uqvision.cli import main
from uqvision.protocols import VISION_PROTOCOLS


@pytest.fixture(scope="module")
def scores(tmp_path_factory):
    out = tmp_path_factory.mktemp("verify") / "selective"
    assert main(["--threads", "1", "reproduce", "selective", "--scale", "smoke", "--out",
                 str(out)]) == 0
    return out / "scores" / "selective.nc"


def _verify(capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["verify", *map(str, args)])
    return code, capsys.readouterr().out


def _entry_blocks(text: str) -> dict[str, str]:
    """entry id -> its lines."""
    blocks = re.split(r"^entry ", text, flags=re.MULTILINE)[1:]
    return {b.split()[0]: b for b in blocks}


#: The protocols this package ships (a plugin's may record no rescoring).
BUILT_IN = ("selective", "pitfalls", "uimnet", "url", "shift", "ood", "conformal",
            "disentangle")


def test_every_protocol_records_a_rescoring():
    missing = [name for name in BUILT_IN if VISION_PROTOCOLS.lookup(name).rescore is None]
    assert not missing, f"protocols without rescoring: {missing}"


def _cache(path: str, **attrs) -> xr.Dataset:
    ds = xr.Dataset({"x": ("i", [1.0])}, attrs={"checksum": "ab" * 32, **attrs})
    ds.encoding["source"] = path
    return ds


def test_provenance_keys_fields_by_model_and_dataset_and_flags_disagreement():
    """An ensemble row lists its members' checkpoints per model; a row whose caches of one
    dataset record two fingerprints (or two preprocessings) is flagged in ``conflicts`` with
    both values, never one of them."""
    from uqvision.provenance import entry_provenance

    common = {"mode": "plain", "data_config": json.dumps({"input_size": [3, 32, 32]}),
              "config": json.dumps({"seed": 0}), "wall_time_s": 2.0}
    rows = {
        "ens": [_cache("/c/m1.test.nc", model="m1", dataset_name="test", checkpoint_sha256="a1",
                       dataset_fingerprint="f", train_seed=1, **common),
                _cache("/c/m2.test.nc", model="m2", dataset_name="test", checkpoint_sha256="a2",
                       dataset_fingerprint="f", train_seed=2, **common)],
        "m1": [_cache("/c/m1.test.nc", model="m1", dataset_name="test", checkpoint_sha256="a1",
                      dataset_fingerprint="f", train_seed=1, **common),
               _cache("/c/m1.val.nc", model="m1", dataset_name="val", checkpoint_sha256="a1",
                      dataset_fingerprint="g", train_seed=1, **common)],
        "bad": [_cache("/c/b.0.nc", model="b", dataset_name="test", checkpoint_sha256="b",
                       dataset_fingerprint="f", **common),
                _cache("/c/b.1.nc", model="b", dataset_name="test", checkpoint_sha256="b",
                       dataset_fingerprint="f2", **{**common, "data_config": "{}"})]}
    attrs = entry_provenance(rows, "model")
    entries = json.loads(attrs["entries"])
    prov, conflicts = entries["provenance"], entries["conflicts"]
    assert prov["ens"]["checkpoint_sha256"] == {"m1": "a1", "m2": "a2"}
    assert prov["ens"]["seeds"] == {"predict": [0], "train": [1, 2]}
    assert prov["ens"]["wall_time_s"] == 4.0 and prov["ens"]["data_fingerprint"] == "f"
    assert prov["m1"]["data_fingerprint"] == {"test": "f", "val": "g"}
    assert prov["m1"]["checkpoint_sha256"] == "a1" and "m1" not in conflicts
    assert conflicts["bad"] == {"data_fingerprint": ["f", "f2"],
                                "preprocessing": [{"input_size": [3, 32, 32]}, {}]}
    assert "data_fingerprint" not in prov["bad"] and "preprocessing" not in prov["bad"]
    assert json.loads(attrs["caches"]) == {p: "ab" * 32 for p in (
        "/c/b.0.nc", "/c/b.1.nc", "/c/m1.test.nc", "/c/m1.val.nc", "/c/m2.test.nc")}
    assert entries["identity"]["/c/m2.test.nc"] == {
        "model": "m2", "dataset_name": "test", "checkpoint_sha256": "a2",
        "dataset_fingerprint": "f"}


@pytest.mark.slow
def test_score_file_records_per_entry_provenance(scores):
    ds = read_dataset(scores)
    caches = decode_attr(ds.attrs["caches"])
    entries = decode_attr(ds.attrs["entries"])
    assert entries["dim"] == "model"
    assert set(entries["provenance"]) == {str(m) for m in ds["model"].values}
    for row, prov in entries["provenance"].items():
        assert set(prov["caches"]) <= set(caches), row
        cache = read_dataset(prov["caches"][0])
        assert prov["mode"] == cache.attrs["mode"]
        if cache.attrs.get("checkpoint_sha256"):
            assert prov["checkpoint_sha256"] == cache.attrs["checkpoint_sha256"]
        assert caches[prov["caches"][0]] == cache.attrs["checksum"]
    assert entries["conflicts"] == {}


@pytest.mark.slow
def test_untouched_result_agrees(scores, capsys):
    code, text = _verify(capsys, scores)
    ds = read_dataset(scores)
    n = ds.sizes["model"]
    assert code == 0, text
    assert f"summary: {n} entries: {n} agree, 0 disagree" in text
    assert "disagree  " not in text
    assert "tolerance: rtol=1e-09, atol=1e-12" in text
    # one line per metric value of each row (11 metrics x 2 calibrations, less skipped ones)
    assert text.count("agree     auroc[calibration=none]") == n


@pytest.mark.slow
def test_a_file_of_before_none_samples_verifies_with_the_rule_it_used(scores, tmp_path, capsys):
    """A selective file written before ``none_samples`` scored its unscaled row on every image
    and records no such field: verify rescores it with that rule (its ``sample_set`` coord),
    not with today's default, which scores the held-out images."""
    from uqvision.protocols.selective.score import SelectiveConfig, score_selective
    from uqvision.provenance import recorded_caches, recorded_config

    ds = read_dataset(scores)
    config = {k: v for k, v in recorded_config(ds).items() if k != "none_samples"}
    old = score_selective(recorded_caches(ds), SelectiveConfig(**config, none_samples="all"))
    assert list(old["sample_set"].values) == ["all", "heldout"]
    old.attrs["config"] = json.dumps(config)
    write_dataset(old, tmp_path / "before.nc")
    code, text = _verify(capsys, tmp_path / "before.nc")
    assert code == 0 and "disagree  " not in text, text
    code, text = _verify(capsys, scores)  # today's file: none on the held-out images
    assert code == 0 and list(ds["sample_set"].values) == ["heldout", "heldout"], text


@pytest.mark.slow
def test_altered_metric_disagrees(scores, tmp_path, capsys):
    ds = read_dataset(scores)
    row = str(ds["model"].values[0])
    ds["auroc"].loc[{"model": row, "calibration": "none"}] += 1e-6
    altered = tmp_path / "altered.nc"
    write_dataset(ds, altered)
    code, text = _verify(capsys, altered)
    assert code == 1
    block = _entry_blocks(text)[f"selective:{row}"]
    assert re.search(r"disagree  auroc\[calibration=none\]  recorded=\S+ recomputed=\S+ "
                     r"\|diff\|=1e-06 tolerance", block), block
    assert "disagree, " not in "".join(b for k, b in _entry_blocks(text).items()
                                       if k != f"selective:{row}")
    assert f"{ds.sizes['model'] - 1} agree, 1 disagree" in text


@pytest.mark.slow
def test_altered_cache_disagrees_on_that_entry(scores, capsys):
    ds = read_dataset(scores)
    entries = decode_attr(ds.attrs["entries"])
    row = next(r for r, p in entries["provenance"].items() if p.get("mode") == "plain")
    path = entries["provenance"][row]["caches"][0]
    cache = read_dataset(path)
    logits = cache["logits"].values.copy()
    # the first correctly classified held-out image (scored by both rows: outside the
    # calibration subset) has its top logit dropped: it becomes an error
    from uqmetrics import calibration_splits

    labels = cache["label"].values
    (_, held), = calibration_splits(labels, protocol="stratified_holdout",
                                    n_calib=int(ds.attrs["n_calib"]), seed=int(ds.attrs["seed"]))
    j = int(next(i for i in np.flatnonzero(logits.argmax(axis=1) == labels) if i in set(held)))
    logits[j, cache["label"].values[j]] -= 100.0
    cache["logits"] = xr.Variable(cache["logits"].dims, logits, cache["logits"].attrs)
    cache.attrs["checksum"] = dataset_checksum(cache)  # a self-consistent cache, rewritten
    write_dataset(cache, path, overwrite=True)
    assert read_dataset(path).attrs["checksum"] != decode_attr(ds.attrs["caches"])[path]

    code, text = _verify(capsys, scores)
    assert code == 1
    blocks = _entry_blocks(text)
    bad = blocks[f"selective:{row}"]
    assert f"cache disagree  {path}: checksum" in bad and "differs from the recorded" in bad
    assert re.search(r"^  disagree  accuracy\[calibration=none\]", bad, flags=re.MULTILINE), bad
    others = [k for k, b in blocks.items() if "DISAGREE" in b]
    assert others == [f"selective:{row}"], others
    assert json.dumps(row)[1:-1] in text.splitlines()[-1]  # the summary names it


def _results(out, name: str) -> list:
    """The score files of protocol ``name`` a reproduction wrote under ``out``."""
    found = []
    for path in sorted(out.rglob("*.nc")):
        with xr.open_dataset(path) as ds:
            if ds.attrs.get("protocol") == name:
                found.append(path)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILT_IN)
def test_each_protocols_smoke_results_verify(smoke_run, name, capsys):
    """Every score file of each protocol's smoke reproduction is recomputed by its own
    rescoring from the caches it records, and agrees."""
    out, _ = smoke_run(name)
    results = _results(out, name)
    assert results, f"no score file of {name} under {out}"
    for path in results:
        assert decode_attr(read_dataset(path).attrs["entries"])["provenance"], path
        code, text = _verify(capsys, path)
        assert code == 0, text[-4000:]
        assert ", 0 disagree;" in text.splitlines()[-1]
        compared = [int(n) for n in re.findall(r"^  agree: (\d+) of \1 values agree", text,
                                               flags=re.MULTILINE)]
        assert compared and min(compared) > 0, text[-4000:]
