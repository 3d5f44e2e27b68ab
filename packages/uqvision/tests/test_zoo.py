"""Named zoos (uqvision.zoo), the sweep's failures file and resume, its progress lines, and
metadata templates from timm's pretrained configs."""

from __future__ import annotations

import csv
import json
import re
import shutil

import pytest
import timm
import torch
from dask import distributed
from timm.models import get_pretrained_cfg

from uqvision.cli import main
from uqvision.models import check_model_name
from uqvision.models.core import sidecar_path
from uqvision.predict import PredictConfig
from uqvision.protocols.selective.metadata import (
    COLUMNS,
    pretraining_from_tag,
    read_metadata,
    shipped_metadata_path,
    template_metadata,
)
from uqvision.sweep import FAILURES_FILE, sweep_predictions
from uqvision.zoo import IN1K_TAG, ZOOS, zoo_models

# --------------------------------------------------------------------------------------------
# the registered zoos


def test_selective_paper_zoo_is_the_shipped_tables_rows_and_all_load_by_name():
    names = zoo_models(["selective-paper"])
    assert names == list(read_metadata(shipped_metadata_path()))
    assert len(names) == 65 and sum(n.startswith("tv/") for n in names) == 7
    for name in names:  # every row is a model the installed timm / torchvision knows
        check_model_name(name)


def test_timm_in1k_zoo_is_exactly_the_1000_class_in1k_tags():
    names = zoo_models(["timm-in1k"])
    assert len(names) > 1000 and len(set(names)) == len(names)
    for name in names:
        assert IN1K_TAG.fullmatch(name.partition(".")[2]), name
        assert get_pretrained_cfg(name).num_classes == 1000, name
    members = set(names)
    left_out = [n for n in timm.list_pretrained() if n not in members]
    for name in left_out:  # the rule, both ways: a tag left out fails one of its two parts
        assert (not IN1K_TAG.fullmatch(name.partition(".")[2])
                or get_pretrained_cfg(name).num_classes != 1000), name
    assert {"resnet50.a1_in1k", "convnext_tiny.fb_in22k_ft_in1k_384",
            "vit_base_patch16_clip_224.openai_ft_in12k_in1k",
            "tf_efficientnet_l2.ns_jft_in1k_475"} <= members
    assert not {"beitv2_base_patch16_224.in1k_ft_in22k",  # 21,841 classes
                "vit_huge_patch14_gap_224.in1k_ijepa",  # no head
                "vit_base_patch16_224.augreg_in21k", "resmlp_12_224.fb_dino"} & members


def test_zoos_combine_in_order_each_model_once():
    both = zoo_models(["selective-paper", "timm-in1k", "selective-paper"])
    assert both[:65] == zoo_models(["selective-paper"])
    assert len(both) == len(set(both)) == len(set(zoo_models(["selective-paper"]))
                                              | set(zoo_models(["timm-in1k"])))


def test_an_unknown_zoo_is_one_line_naming_it_and_the_known_zoos(digits, tmp_path, capsys):
    with pytest.raises(ValueError, match=r"^unknown zoo 'nope'; valid zoos: selective-paper, "
                                         r"timm-in1k"):
        zoo_models(["nope"])
    for argv in (["sweep", "--zoo", "nope", "--data", str(digits / "test"), "--out",
                  str(tmp_path / "s")],
                 ["metadata", "--zoo", "nope", "--template", str(tmp_path / "t.csv")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert f"uqvision {argv[0]}: error: --zoo: unknown zoo 'nope'; valid zoos: " in err
        assert "selective-paper" in err and "timm-in1k" in err
    assert not (tmp_path / "s").exists() and not (tmp_path / "t.csv").exists()
    assert main(["sweep", "--data", str(digits / "test"), "--out", str(tmp_path / "s")]) == 2
    assert "give --models PATTERN... and/or --zoo NAME" in capsys.readouterr().err


def test_list_zoos_with_a_name_prints_its_members(capsys):
    """Issue 24, C: --list-zoos NAME lists the members of zoo NAME, one per line."""
    with pytest.raises(SystemExit) as stop:
        main(["sweep", "--list-zoos", "selective-paper"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.splitlines() == zoo_models(["selective-paper"])
    with pytest.raises(SystemExit) as stop:
        main(["sweep", "--list-zoos", "nope"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "argument --list-zoos: unknown zoo 'nope'; valid zoos: selective-paper" in err


def test_list_zoos_prints_each_zoo_with_its_description(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["sweep", "--list-zoos"])
    assert stop.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ZOOS.names()
    assert "Galil, Dabbah & El-Yaniv, 2023" in lines[0]


# --------------------------------------------------------------------------------------------
# a sweep over a zoo: failures recorded, the others finished, a rerun resumes


@pytest.fixture
def tiny_zoo(tmp_path):
    """A zoo registered for the test: two tiny timm models (random weights), a model whose
    weights file is corrupt, and a tag the installed timm does not have."""
    broken = tmp_path / "weights" / "broken.safetensors"
    broken.parent.mkdir()
    broken.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header")
    members = ["test_vit", "test_resnet", f"test_byobnet={broken}", "resnet50.no_such_tag"]
    ZOOS.add("test-tiny", lambda: list(members))
    yield broken
    del ZOOS["test-tiny"]


def _records(path):
    data = json.loads(path.read_text())
    assert data["format"] == "uqmetrics.sweep_failures/1"
    return {r["model"]: r for r in data["failures"]}


def test_a_zoo_sweep_records_failures_finishes_the_others_and_resumes(tiny_zoo, trained, digits,
                                                                      tmp_path, capsys):
    caches = tmp_path / "caches"
    cfg = PredictConfig(batch_size=32, allow_random_init=True)
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=1,
                            dashboard_address=None) as client:
        def sweep(**kw):
            return sweep_predictions(["test_vit"], digits / "test", caches, cfg,
                                     zoos=["test-tiny"], client=client, threads=1, **kw)

        first = sweep(progress=True, progress_interval=0.0)
        assert sorted(p.name for p in first.computed) == ["test_resnet.test.plain-000.nc",
                                                          "test_vit.test.plain-000.nc"]
        failures = caches / FAILURES_FILE
        rec = _records(failures)
        assert first.failed_models == rec and set(rec) == {"test_byobnet@broken",
                                                           "resnet50.no_such_tag"}
        assert rec["test_byobnet@broken"]["cells"] == ["test_byobnet+broken.test.plain-000"]
        assert "CheckpointError" in rec["test_byobnet@broken"]["error"]
        assert "not a safetensors file" in rec["test_byobnet@broken"]["error"]
        assert rec["resnet50.no_such_tag"]["cells"] == []  # refused before running: not a crash
        assert "unknown pretrained tag 'no_such_tag'" in rec["resnet50.no_such_tag"]["error"]
        assert f"timm {timm.__version__}" in rec["resnet50.no_such_tag"]["error"]
        # a first failure is not a retry (issue 24: ``retried`` was true on a first attempt)
        assert all(r["attempts"] == 1 and not r["retried"] and r["time"] for r in rec.values())
        assert {r["kind"] for r in rec.values()} == {"failed", "unknown"}
        # log mode (stderr is not a terminal): a line per cell here (interval 0), cells and
        # models done and left, and an ETA while cells are left
        lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("sweep:")]
        assert len(lines) == 4  # three cells, and the closing line
        assert re.fullmatch(r"sweep: 1/3 cells \(33%\) 1/3 models, 2 left, \d+ s elapsed, "
                            r"ETA \d+ s", lines[0]), lines[0]
        assert lines[-1].startswith("sweep: 3/3 cells (100%) 3/3 models, 0 left, ")
        assert "ETA" not in lines[-1]

        # without retry: the recorded failure is reported again and nothing is recomputed
        kept = sweep(retry_failed=False)
        assert kept.computed == [] and len(kept.skipped) == 2
        again = _records(failures)
        assert again["test_byobnet@broken"] == {**rec["test_byobnet@broken"], "retried": False,
                                                "left_out": True}
        assert "not retried" in kept.failed["test_byobnet@broken"]

        # the default retries it: it fails again (a second attempt), the finished cells are
        # skipped
        retried = sweep()
        assert retried.computed == [] and len(retried.skipped) == 2
        again = _records(failures)
        assert again["test_byobnet@broken"]["attempts"] == 2
        assert again["test_byobnet@broken"]["retried"] is True

        # weights fixed between runs: the retry computes the model and it leaves the file
        shutil.copyfile(trained.checkpoint, tiny_zoo)
        shutil.copyfile(sidecar_path(trained.checkpoint), sidecar_path(tiny_zoo))
        fixed = sweep()
    assert [p.name for p in fixed.computed] == ["test_byobnet+broken.test.plain-000.nc"]
    assert set(_records(failures)) == {"resnet50.no_such_tag"}
    assert set(fixed.failed) == {"resnet50.no_such_tag"}


def test_a_previous_failure_stays_recorded_until_its_model_finishes(tmp_path):
    """An interrupted rerun must not lose the record of a model it had not retried yet."""
    from uqvision.sweep import _FailureLog

    path = tmp_path / FAILURES_FILE
    old = {"model": "a", "name": "a", "checkpoint": None, "error": "OOM", "cells": ["a.x"],
           "time": "t", "attempts": 1, "retried": True}
    gone = {**old, "model": "gone"}
    log = _FailureLog(path, [old, gone], ["a", "b"])
    log.write()
    assert set(_records(path)) == {"a"}  # a model no longer in the sweep is dropped
    log.finished("a")
    assert _records(path) == {}


def test_cli_sweep_lists_failed_models_one_line_each_and_exits_1(tiny_zoo, digits, tmp_path,
                                                                   capsys):
    out = tmp_path / "sweep"
    args = ["--threads", "1", "sweep", "--zoo", "test-tiny", "--models", "test_vit",
            "--data", str(digits / "test"), "--out", str(out), "--random-init",
            "--batch-size", "32", "--calibration-size", "0.3"]
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                                  dashboard_address=None) as cluster:
        argv = args + ["--scheduler", cluster.scheduler_address]
        assert main(argv) == 1
        got = capsys.readouterr()
        lines = got.out.splitlines()
        assert lines[0] == "computed 2, skipped 0 (already complete), failed 2 model(s)"
        assert lines[1].startswith("  FAILED resnet50.no_such_tag: unknown pretrained tag "
                                   "'no_such_tag' for timm model 'resnet50'")
        assert re.fullmatch(r"  FAILED test_byobnet@broken: uqvision\.exceptions\."
                            r"CheckpointError: checkpoint '.*broken\.safetensors': not a "
                            r"safetensors file .*\(1 cell\(s\)\)", lines[2]), lines[2]
        assert lines[3] == str(out / "scores" / "selective-test.nc")  # the others are scored
        assert f"2 model(s) failed, recorded in {out / FAILURES_FILE}" in got.err
        # what to do, by kind: a failed cell is retried by a rerun, an unknown name is not
        assert ("1 failed: rerun the same command to retry (finished caches are kept); 1 "
                "unknown: upgrade them, or leave the model out") in got.err
        assert "sweep: 3/3 cells (100%) 3/3 models, 0 left, " in got.err

        assert main(argv) == 1  # a rerun: says what failed before, retries it, skips the rest
        got = capsys.readouterr()
    assert (f"2 model(s) failed in the previous run ({out / FAILURES_FILE}): "
            "resnet50.no_such_tag, test_byobnet@broken; retrying them") in got.err
    lines = got.out.splitlines()
    assert lines[0] == "computed 0, skipped 2 (already complete), failed 2 model(s)"
    assert lines[2].endswith("(1 cell(s); failed 2 runs in a row)")


# --------------------------------------------------------------------------------------------
# metadata templates from what timm already knows


def test_pretraining_data_from_tag_tokens():
    assert [pretraining_from_tag(t) for t in (
        "a1_in1k", "sw_in1k", "fb_in22k_ft_in1k", "in12k_ft_in1k_384", "fb_ssl_yfcc100m_ft_in1k",
        "fb_swsl_ig1b_ft_in1k", "ns_jft_in1k", "clip_laion2b_augreg_ft_in12k_in1k",
        "mim_m38m_ft_in22k_in1k", "openai_ft_in12k_in1k", "swag_lc_in1k", "seer_ft_in1k",
        "fcmae_ft_in1k", "mae_in1k_ft_in1k", "IMAGENET1K_SWAG_E2E_V1", "")] == [
        "none", "none", "in21k", "in12k", "yfcc100m", "ig1b", "jft300m", "laion2b_in12k",
        "m38m_in21k", "unknown", "unknown", "unknown", "unknown", "none", "unknown", "unknown"]


def test_metadata_template_of_models_holds_their_pretrained_cfg(tmp_path, capsys):
    out = tmp_path / "t.csv"
    names = ["resnet18.a1_in1k", "convnext_tiny.in12k_ft_in1k_384",
             "vit_base_patch16_clip_224.openai_ft_in1k"]
    assert main(["metadata", "--models", *names, "resnet50.a1_in1k",  # shipped: not templated
                 "--template", str(out)]) == 0
    assert capsys.readouterr().out.split() == [str(out), *names]
    rows = read_metadata(out)
    assert list(rows) == names
    text = [ln for ln in out.read_text().splitlines() if not ln.startswith("#")]
    assert text[0].split(",") == list(COLUMNS)
    raw = {r["key"]: r for r in csv.DictReader(text)}
    for name, data in zip(names, ("none", "in12k", "unknown"), strict=True):
        cfg = get_pretrained_cfg(name)
        row = rows[name]
        assert row.input_size == cfg.input_size[-1] == cfg.input_size[-2]
        assert f"crop_pct {cfg.crop_pct}" in row.notes
        assert f"interpolation {cfg.interpolation}" in row.notes
        assert row.pretraining_data == data
        for col in ("family", "base_architecture", "distillation", "adversarial_training",
                    "supervision", "label_smoothing"):  # never guessed
            assert getattr(row, col) == "unknown" and raw[name][col] == "unknown"
    # parameters: the architecture's, as a real (CPU) build counts them
    assert rows["resnet18.a1_in1k"].params == sum(
        p.numel() for p in timm.create_model("resnet18.a1_in1k", pretrained=False).parameters())
    assert rows["convnext_tiny.in12k_ft_in1k_384"].input_size == 384
    assert "crop_pct 1.0 (squash)" in rows["convnext_tiny.in12k_ft_in1k_384"].notes


def test_a_template_leaves_unknown_what_the_installed_timm_does_not_know():
    (row,) = template_metadata(["resnet50.no_such_tag"])
    assert row.params is None and row.input_size is None and row.pretraining_data == "unknown"
    assert f"not a model of the installed timm {timm.__version__}" in row.notes


@pytest.mark.slow
def test_templates_of_the_shipped_rows_agree_with_the_shipped_table():
    """Every one of the 65 rows: the parameters counted on the meta device (or a torchvision
    weights' meta), the input size and the pre-training data read from the tag are those the
    shipped table records."""
    table = read_metadata(shipped_metadata_path())
    rows = template_metadata(table)
    assert [r.key for r in rows] == list(table)
    for row in rows:
        ref = table[row.key]
        assert (row.params, row.input_size, row.pretraining_data) == (
            ref.params, ref.input_size, ref.pretraining_data), row.key
    assert torch.get_default_device().type == "cpu"  # the meta builds left no default behind
