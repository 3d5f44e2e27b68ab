"""Model metadata tables (issue 13 item 1): parsing, rejection of malformed rows, merging."""

from __future__ import annotations

import doctest
import json

import numpy as np
import pytest
import xarray as xr

import uqvision.protocols.selective.metadata
from uqvision.protocols.selective.metadata import (
    COLUMNS,
    METADATA_ENV,
    REGIME_FIELDS,
    MetadataError,
    ModelMetadata,
    attach_metadata,
    load_metadata,
    metadata_key,
    read_metadata,
    shipped_metadata_path,
    unknown_models,
    write_metadata,
)

HEADER = "# uqvision model metadata, format_version 1\n" + ",".join(COLUMNS) + "\n"
GOOD = "m.a,Fam,m,100,32,yes,t.b,none,no,supervised,no,a note\n"


def _table(tmp_path, body: str, header: str = HEADER, name: str = "t.csv"):
    p = tmp_path / name
    p.write_text(header + body)
    return p


def test_columns_are_the_dataclass_fields():
    import dataclasses

    assert tuple(f.name for f in dataclasses.fields(ModelMetadata)) == COLUMNS
    assert set(REGIME_FIELDS) == {"distillation", "pretraining_data", "adversarial_training",
                                  "supervision", "label_smoothing"}


def test_shipped_table_parses_and_names_real_models():
    import timm
    import torchvision

    table = read_metadata(shipped_metadata_path())
    assert len(table) >= 50
    for key, row in table.items():
        if key.startswith("tv/"):
            arch, weights = key[3:].split(".")
            torchvision.models.get_model_weights(arch)[weights]  # KeyError if not a weights enum
        else:
            assert timm.list_pretrained(key) == [key], key
        assert row.params is not None and row.input_size is not None
    deit = table["deit_tiny_distilled_patch16_224.fb_in1k"]
    assert (deit.distillation, deit.teacher, deit.base_architecture) == (
        "yes", "regnety_160.deit_in1k", "deit_tiny_patch16_224")
    assert table["inception_v3.tf_adv_in1k"].adversarial_training == "yes"
    assert table["tv/resnet50.IMAGENET1K_V1"].params == 25557032


def test_read_good_row(tmp_path):
    (row,) = read_metadata(_table(tmp_path, GOOD)).values()
    assert row == ModelMetadata("m.a", "Fam", "m", 100, 32, "yes", "t.b", "none", "no",
                                "supervised", "no", "a note")


def test_unknowns_and_comments(tmp_path):
    body = "# a comment line\nm.a,Fam,m,,,unknown,,unknown,unknown,unknown,unknown,\n"
    (row,) = read_metadata(_table(tmp_path, body)).values()
    assert row.params is None and row.input_size is None
    assert row.teacher == "unknown"  # distillation not known to be absent: teacher unknown


@pytest.mark.parametrize("header, body, match", [
    ("# something else\n" + ",".join(COLUMNS) + "\n", GOOD, "first line must be"),
    ("# uqvision model metadata, format_version 2\n" + ",".join(COLUMNS) + "\n", GOOD,
     "format_version 2"),
    (HEADER.replace(",notes", ""), GOOD, r"missing \['notes'\]"),
    (HEADER.replace(",notes", ",notes,extra"), GOOD, r"unknown columns \['extra'\]"),
    (HEADER.replace("family,base_architecture", "base_architecture,family"), GOOD,
     "out of order"),
    (HEADER, "m.a,Fam,m,100,32,yes,t.b,none,no,supervised,no\n", r"t\.csv:3: expected 12"),
    (HEADER, GOOD.replace(",yes,", ",maybe,"),
     r"t\.csv:3: distillation must be one of yes, no, unknown; got 'maybe'"),
    (HEADER, GOOD.replace(",100,", ",-5,"), "params must be a positive integer"),
    (HEADER, GOOD.replace(",100,", ",1e6,"), "params must be a positive integer"),
    (HEADER, GOOD.replace(",32,", ",0,"), "input_size must be a positive integer"),
    (HEADER, GOOD.replace("m.a,", "m a,"), "key must be arch.tag"),
    (HEADER, GOOD.replace(",none,", ",ImageNet 21k,"), "pretraining_data must be a lower-case"),
    (HEADER, GOOD.replace(",supervised,", ",strongly,"), "supervision must be one of"),
    (HEADER, GOOD + GOOD, r"t\.csv:4: key 'm\.a' appears twice"),
    (HEADER, GOOD.replace(",yes,t.b,", ",no,t.b,"), "teacher 't.b' given but distillation"),
])
def test_malformed_tables_are_rejected(tmp_path, header, body, match):
    with pytest.raises(MetadataError, match=match):
        read_metadata(_table(tmp_path, body, header))


def test_metadata_error_is_a_value_error():
    assert issubclass(MetadataError, ValueError)


def test_write_read_roundtrip(tmp_path):
    rows = [ModelMetadata("a.x", "F", "a", 10, 32, "no", "", "none", "no", "supervised", "yes",
                          "with, a comma"),
            ModelMetadata("tv/b.V1")]
    p = write_metadata(rows, tmp_path / "sub" / "m.csv")
    back = read_metadata(p)
    assert back["a.x"] == rows[0]
    assert back["tv/b.V1"] == ModelMetadata("tv/b.V1", teacher="unknown")


def test_write_rejects_invalid_rows(tmp_path):
    with pytest.raises(MetadataError, match="distillation"):
        write_metadata([ModelMetadata("a.x", distillation="maybe")], tmp_path / "m.csv")
    assert not (tmp_path / "m.csv").exists()


def test_load_merges_in_order(tmp_path, monkeypatch):
    env = _table(tmp_path, GOOD.replace("Fam", "EnvFam"), name="env.csv")
    extra = _table(tmp_path, GOOD.replace("Fam", "ExtraFam") + GOOD.replace("m.a", "m.b"),
                   name="extra.csv")
    monkeypatch.setenv(METADATA_ENV, str(env))
    t = load_metadata(shipped=False)
    assert t.get("m.a").family == "EnvFam"
    t = load_metadata([extra], shipped=False)
    assert t.get("m.a").family == "ExtraFam" and "m.b" in t and len(t) == 2
    t = load_metadata([extra])
    assert "resnet50.tv_in1k" in t and "m.b" in t
    assert list(json.loads(t.attrs["metadata_tables"])) == [
        "uqvision:resources/model_metadata.csv", str(env), str(extra)]
    monkeypatch.delenv(METADATA_ENV)
    assert "m.a" not in load_metadata()


def test_unknown_models_and_key():
    t = load_metadata()
    keys = ["resnet50.tv_in1k", "resnet10t.hier_s0", "resnet10t.hier_s0",
            metadata_key("tv", "resnet50", "IMAGENET1K_V1")]
    assert unknown_models(keys, t) == ["resnet10t.hier_s0"]


def test_attach_metadata():
    ds = xr.Dataset({"auroc": ("model", [0.8, 0.9, 0.85])},
                    coords={"model": ["a", "b", "c"],
                            "metadata_key": ("model", ["deit_tiny_patch16_224.fb_in1k",
                                                       "mystery.x",
                                                       "deit_tiny_patch16_224.fb_in1k"])})
    out = attach_metadata(ds, load_metadata(), measured={"params": [np.nan, 7.0, 11.0]})
    assert list(out["family"].values) == ["ViT", "unknown", "ViT"]
    assert list(out["distillation"].values) == ["no", "unknown", "no"]
    # measured values win over the table; the table fills in what was not measured
    np.testing.assert_array_equal(out["params"].values, [5717416, 7, 11])
    assert np.isnan(out["input_size"].values[1]) and out["input_size"].values[0] == 224
    assert list(out["metadata_known"].values) == [True, False, True]
    assert out.attrs["metadata_format_version"] == 1
    with pytest.raises(ValueError, match="metadata_key"):
        attach_metadata(ds.drop_vars("metadata_key"), load_metadata())


def test_doctests():
    result = doctest.testmod(uqvision.protocols.selective.metadata)
    assert result.attempted > 0 and result.failed == 0
