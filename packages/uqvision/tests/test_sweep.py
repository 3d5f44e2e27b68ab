import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import timm
import torch
import xarray as xr
from uqmetrics.runs.testing.signals import interruptible

from uqvision.cli import main
from uqvision.predict import PredictConfig
from uqvision.protocols.selective.score import SelectiveConfig, score_selective
from uqvision.sweep import FAILURES_FILE, LOG_FILE, expand_models, plan_sweep, sweep_predictions


def test_wildcards_expand_through_the_registries():
    names = [s.name for s in expand_models(["test_vit*", "test_resnet.*", "tv/resnet1*"])]
    assert "test_vit" in names and "test_vit2" in names
    assert "test_resnet.r160_in1k" in names
    assert "tv/resnet18" in names
    with pytest.raises(ValueError, match="matches no model"):
        expand_models(["no_such_net*"])
    with pytest.raises(ValueError, match="did you mean"):
        expand_models(["test_vitt"])
    with pytest.raises(ValueError, match="twice"):
        expand_models(["test_vit", "test_vit"])


def test_models_without_local_weights_are_planned_for_the_hub_cache(digits, tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "test_vit.safetensors").write_bytes(b"")
    plan = plan_sweep(expand_models(["test_vit", "test_resnet"]), digits / "test",
                      PredictConfig(mode="tta", passes=2), weights_dir=tmp_path / "w")
    assert plan.refused == {}
    assert [c.key for c in plan.cells] == ["test_vit.test.tta-000", "test_vit.test.tta-001",
                                           "test_resnet.test.tta-000", "test_resnet.test.tta-001"]
    assert plan.cells[1].params["config"]["first_pass"] == 1
    # the weights folder's file first; the other model's weights come from the hub cache
    assert plan.cells[0].params["checkpoint"] == str(tmp_path / "w" / "test_vit.safetensors")
    assert plan.cells[2].params["checkpoint"] is None


@pytest.mark.slow
def test_sweep_on_a_local_cluster_survives_a_model_that_raises(spec, digits, tmp_path,
                                                                monkeypatch):
    from dask.distributed import Client, LocalCluster

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # test_vit's weights: not in this empty cache
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))

    bad = tmp_path / "broken.safetensors"
    bad.write_bytes(b"not a checkpoint at all")
    models = [spec, f"test_byobnet={bad}", "test_vit"]
    caches = tmp_path / "caches"
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        report = sweep_predictions(models, digits / "test", caches,
                                   PredictConfig(batch_size=32), client=client, threads=1)
        assert [p.name for p in report.computed] == ["test_byobnet+m0.test.plain-000.nc"]
        # test_vit's weights are looked up before any cell runs: it fails there, by model
        assert set(report.failed) == {"test_byobnet+broken.test.plain-000", "test_vit"}
        assert "HF_HUB_OFFLINE is set" in report.failed["test_vit"]
        assert report.failed_models["test_vit"]["cells"] == []
        again = sweep_predictions(models, digits / "test", caches,
                                  PredictConfig(batch_size=32), client=client, threads=1)
    assert again.computed == [] and [p.name for p in again.skipped] == [
        "test_byobnet+m0.test.plain-000.nc"]
    ds = score_selective([caches], SelectiveConfig(calibration_size=0.3))
    assert list(ds["model"].values) == ["test_byobnet@m0"]


def test_a_method_run_is_one_cell_per_sample_and_pass(digits, tmp_path):
    from uqvision.models import ModelSpec
    from uqvision.training.loop import ImageTrainConfig, train_model

    ckpt = train_model(digits / "train", tmp_path / "sse", ImageTrainConfig(
        arch="test_vit", method="sse", input_size=16,
        hparams={"cycles": "2", "cycle_epochs": "1", "batch_size": "32"})).checkpoint
    plan = plan_sweep([ModelSpec("test_vit", str(ckpt))], digits / "test",
                      PredictConfig(mode="tta", passes=2))
    assert [c.key for c in plan.cells] == [f"test_vit+sse+{k:03d}.test.tta-{p:03d}"
                                           for k in range(2) for p in range(2)]
    assert [(c.params["config"]["first_sample"], c.params["config"]["first_pass"])
            for c in plan.cells] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_a_rerun_refuses_caches_of_other_inputs_and_keeps_them(spec, digits, tmp_path):
    """A sweep resumes only caches of the same identity (as predict does): one computed with
    another seed is refused for its model, reported, and left as it is."""
    import hashlib

    from uqvision.predict import predict_to_files

    caches = tmp_path / "caches"
    (path,) = predict_to_files(spec, digits / "test", caches, PredictConfig(batch_size=32, seed=0))
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    report = sweep_predictions([spec], digits / "test", caches, PredictConfig(batch_size=32, seed=1))
    assert report.computed == [] and report.skipped == []
    (row,) = report.failed
    assert "computed from other inputs" in report.failed[row] and "seed 0 vs 1" in report.failed[row]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


# --------------------------------------------------------------------------------------------
# issue 24: checks before the work, --dry-run, the weights looked up at once, quiet failures,
# a full disk, Ctrl-C, figures, several datasets in one --out


def _cli(args, env, timeout=240):
    """``uqvision`` in a subprocess (its workers' output included), with ``env`` over ours."""
    full = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE",
                                                               "TRANSFORMERS_OFFLINE")}
    full.update(env)
    return subprocess.run([sys.executable, "-m", "uqvision", "--threads", "1", *map(str, args)],
                          check=False, capture_output=True, text=True, env=full,
                          timeout=timeout)


def _offline(tmp_path, monkeypatch=None):
    """An empty hub cache and torch.hub folder, offline (in this process or for a child)."""
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"),
           "TORCH_HOME": str(tmp_path / "torch")}
    (tmp_path / "hub").mkdir(exist_ok=True)
    if monkeypatch is not None:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
    return env


def _write_hub_weights(cache: Path, name: str) -> Path:
    """Seeded weights of timm tag ``name`` as ``model.safetensors`` of its hub repository, in
    the hub cache layout (``blobs/``, ``snapshots/<revision>/``, ``refs/main``)."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    state = {k: v.contiguous() for k, v in timm.create_model(name).state_dict().items()}
    repo = cache / ("models--timm--" + name)
    (repo / "blobs").mkdir(parents=True)
    tmp = repo / "blobs" / "incoming"
    save_file(state, str(tmp))
    blob = repo / "blobs" / hashlib.sha256(tmp.read_bytes()).hexdigest()
    os.replace(tmp, blob)
    snap = repo / "snapshots" / ("0" * 40) / "model.safetensors"
    snap.parent.mkdir(parents=True)
    snap.symlink_to(os.path.relpath(blob, snap.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    return snap


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def scheduler():
    """One in-process Dask cluster for the command-line sweeps of this module (--scheduler)."""
    from dask.distributed import LocalCluster

    with LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                      dashboard_address=None) as cluster:
        yield cluster.scheduler_address


def test_a_small_set_with_the_default_calibration_size_is_refused_before_any_model_runs(
        digits, tmp_path, capsys):
    """Issue 24, A / row 7: 65 images and the default --calibration-size 5000 used to predict
    every model and then exit 2 with no scores; now one line, before any model runs."""
    out = tmp_path / "s"
    assert main(["--threads", "1", "sweep", "--models", "test_vit", "test_resnet",
                 "--random-init", "--data", str(digits / "test"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert (f"uqvision sweep: error: --calibration-size 5000: --data {str(digits / 'test')!r} "
            "has 65 image(s) to score; give a count in [1, 64] or a fraction in (0, 1)") in err
    assert not out.exists()  # no cache, no failures file: nothing ran


def test_the_calibration_size_is_checked_against_the_images_left_after_skipping(
        digits, tmp_path, capsys):
    """Unreadable images left out (--skip-bad-images) are not scored: 64 of 65 remain, so 64
    calibration samples leave none to evaluate."""
    data = tmp_path / "data"
    shutil.copytree(digits / "test", data)
    next(iter(sorted(data.rglob("*.png")))).write_bytes(b"not a png")
    out = tmp_path / "s"
    assert main(["--threads", "1", "sweep", "--models", "test_vit", "--random-init",
                 "--data", str(data), "--out", str(out), "--skip-bad-images",
                 "--calibration-size", "64"]) == 2
    err = capsys.readouterr().err
    assert "--calibration-size 64: " in err and "has 64 image(s) to score (1 left out)" in err
    assert "[1, 63]" in err and not out.exists()


def test_an_mc_dropout_sweep_with_fewer_passes_than_its_rows_need_is_refused_up_front(
        digits, tmp_path, capsys):
    """MC-dropout caches are scored (+mc_dropout rows) from their first --mc-passes passes: a
    sweep whose caches would hold fewer is refused before any model runs."""
    out = tmp_path / "s"
    assert main(["--threads", "1", "sweep", "--models", "test_vit", "--random-init", "--data",
                 str(digits / "test"), "--out", str(out), "--calibration-size", "0.3",
                 "--mode", "mc_dropout", "--passes", "2"]) == 2
    err = capsys.readouterr().err
    assert ("--mc-passes 30: the MC-dropout caches of this sweep hold 2 passes (--passes 2); "
            "give --mc-passes 2 or --passes 30") in err
    assert not out.exists()


def test_dry_run_lists_weights_cells_and_cost_and_writes_nothing(digits, trained, tmp_path,
                                                                 monkeypatch, capsys):
    """Issue 24, B: each model's weights (local file, hub cache, random init, missing), the
    cells to compute and those complete on disk, the cost; exit 0 and nothing written."""
    from uqvision.predict import predict_to_files

    _offline(tmp_path, monkeypatch)
    snap = _write_hub_weights(tmp_path / "hub", "test_resnet.r160_in1k")
    out = tmp_path / "s"
    local = f"test_byobnet={trained.checkpoint}"
    (done,) = predict_to_files(local, digits / "test", out / "caches",  # an earlier run's cache
                               PredictConfig(batch_size=32))
    before = {p: _sha(out / p) for p in _tree(out) if (out / p).is_file()}
    args = ["--threads", "1", "sweep", "--models", local, "test_resnet.r160_in1k",
            "test_vit.r160_in1k", "--data", str(digits / "test"), "--out", str(out),
            "--calibration-size", "0.3", "--dry-run"]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("sweep plan (dry run: nothing is computed, downloaded or "
                               "written): 3 model(s) on ")
    assert f"  test_byobnet@m0: weights local file {trained.checkpoint}; 0 cell(s) to " \
           "compute, 1 complete (skipped)" in lines
    assert f"  test_resnet.r160_in1k: weights cached {snap}; 1 cell(s) to compute, 0 " \
           "complete (skipped)" in lines
    (missing,) = [ln for ln in lines if ln.startswith("  test_vit.r160_in1k: ")]
    assert missing.startswith("  test_vit.r160_in1k: FAILS before any cell (weights): model "
                              "'test_vit.r160_in1k': its pretrained weights")
    assert "HF_HUB_OFFLINE is set" in missing
    assert "cells: 1 to compute, 1 complete on disk (skipped); 1 model(s) would fail before " \
           "any cell runs" in lines
    (cost,) = [ln for ln in lines if ln.startswith("cost: ")]
    wall = float(xr.open_dataset(done).attrs["wall_time_s"])
    assert cost.startswith("cost: 1 cell(s) × 65 images = 65 image-cells; time ≈ ")
    assert f"({wall / 65:.3g} s per image and cell: the mean of 1 earlier cache(s)" in cost
    assert lines[-1] == f"scores: {out / 'scores' / 'selective-test.nc'}"
    assert {p: _sha(out / p) for p in _tree(out) if (out / p).is_file()} == before

    # a folder given as NAME=FILE is no local file: it fails before any cell, and says why
    folder = trained.checkpoint.parent
    assert main(args[:4] + [f"test_byobnet={folder}", *args[7:]]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if "test_byobnet@" in ln]
    assert line.startswith(f"  test_byobnet@{folder.name}: FAILS before any cell (weights): "
                           f"checkpoint '{folder}' is a folder, not a checkpoint file"), line

    # random weights for every named model; no earlier cache of mode tta: the time is unknown
    assert main(args[:4] + ["test_vit", "--random-init", *args[7:], "--mode", "tta"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  test_vit: weights random init; 1 cell(s) to compute, 0 complete (skipped)" in lines
    assert any(ln.startswith("cost: 1 cell(s) × 65 images = 65 image-cells; time unknown: no "
                             "cache of mode tta in ") for ln in lines)
    assert lines[-1].startswith("scores: none (--mode tta caches are not scored")
    assert {p: _sha(out / p) for p in _tree(out) if (out / p).is_file()} == before


#: Real pretrained tags of timm (and a torchvision weights name) whose weights no test has.
PRETRAINED = ["resnet18.a1_in1k", "test_vit.r160_in1k", "test_resnet.r160_in1k",
              "convnext_atto.d2_in1k", "tv/resnet18"]


def _console(result) -> list[str]:
    return (result.stdout + result.stderr).splitlines()


def test_an_offline_sweep_fails_the_models_without_weights_up_front_in_one_line(
        digits, tmp_path):
    """Issue 24, D/E: offline with an empty cache, every model used to run a cell that failed
    with a Dask "Compute Failed" block and its traceback (3 MB for the timm-in1k zoo); now
    their weights are looked up before any cell, each model is one record without cells, and
    the console has at most one line per model (here one line for them all)."""
    out = tmp_path / "s"
    result = _cli(["sweep", "--models", *PRETRAINED, "--data", digits / "test", "--out", out,
                   "--calibration-size", "0.3", "--n-workers", "1"], _offline(tmp_path))
    assert result.returncode == 1, result.stderr
    lines = _console(result)
    assert len(lines) <= len(PRETRAINED) + 2, lines
    assert "Traceback" not in result.stderr and "Compute Failed" not in result.stderr
    assert not any(ln.startswith("sweep:") for ln in lines)  # no cell was submitted
    records = {r["model"]: r for r in json.loads((out / FAILURES_FILE).read_text())["failures"]}
    assert set(records) == set(PRETRAINED)
    for rec in records.values():
        assert (rec["kind"], rec["cells"], rec["attempts"], rec["retried"]) == (
            "weights", [], 1, False)
        assert "HF_HUB_OFFLINE is set" in rec["error"] and "HF_HUB_OFFLINE" in rec["cause"]
    (grouped,) = [ln for ln in lines if ln.startswith("  FAILED ")]
    assert grouped.startswith(f"  FAILED {len(PRETRAINED)} models, pretrained weights not "
                              "cached (hub cache ")
    assert all(m in grouped for m in PRETRAINED)
    assert lines[-1] == (f"uqvision sweep: {len(PRETRAINED)} model(s) failed, recorded in "
                         f"{out / FAILURES_FILE}; {len(PRETRAINED)} without weights: fetch them "
                         "where the network is allowed, or give local files (NAME=FILE, "
                         "--weights-dir)")
    assert not (out / "caches").exists() or not list((out / "caches").glob("*.nc"))


@pytest.mark.slow
def test_an_offline_zoo_sweep_prints_a_few_lines_for_a_thousand_models(digits, tmp_path):
    """The done-when of issue 24: an offline --zoo timm-in1k sweep (1,319 models, none cached)
    prints at most one line per failed model (10,579 lines and 3.8 MB before; 3 now)."""
    from uqvision.zoo import zoo_models

    out = tmp_path / "s"
    result = _cli(["sweep", "--zoo", "timm-in1k", "--data", digits / "test", "--out", out,
                   "--calibration-size", "0.3", "--n-workers", "1"], _offline(tmp_path))
    n = len(zoo_models(["timm-in1k"]))
    assert result.returncode == 1, result.stderr[-2000:]
    lines = _console(result)
    assert len(lines) <= 3, lines[:5]
    records = json.loads((out / FAILURES_FILE).read_text())["failures"]
    assert len(records) == n
    # every model is refused before any of its cells (nothing built, nothing decoded): what
    # keeps a thousand missing models cheap, without timing it (the machines are noisy)
    assert {r["kind"] for r in records} == {"weights"}
    assert all(r["cells"] == [] for r in records)
    assert f"failed {n} model(s)" in lines[0]


def test_one_model_without_weights_is_one_complete_line(digits, tmp_path, monkeypatch, capsys):
    """The console line of a failure is the whole error, its suggested fix included (it was
    cut at 300 characters)."""
    _offline(tmp_path, monkeypatch)
    assert main(["--threads", "1", "sweep", "--models", "resnet18.a1_in1k", "--data",
                 str(digits / "test"), "--out", str(tmp_path / "s"),
                 "--calibration-size", "0.3"]) == 1
    got = capsys.readouterr()
    (line,) = [ln for ln in got.out.splitlines() if ln.startswith("  FAILED ")]
    assert line.startswith("  FAILED resnet18.a1_in1k: model 'resnet18.a1_in1k': its "
                           "pretrained weights ")
    assert line.endswith("or give a local file as NAME=FILE or with --weights-dir")
    assert "..." not in line and got.err.count("\n") == 1


def test_the_hub_unreachable_fails_every_missing_model_at_once(digits, tmp_path):
    """Issue 24, D: online, weights not cached and the hub unreachable: one short request finds
    out, and every such model fails before any cell, instead of each cell retrying the
    download (about 50 s a model)."""
    out = tmp_path / "s"
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "TORCH_HOME": str(tmp_path / "torch"),
           "HF_ENDPOINT": "http://127.0.0.1:9"}  # the discard port: the connection is refused
    result = _cli(["sweep", "--models", *PRETRAINED[:3], "--data", digits / "test", "--out",
                   out, "--calibration-size", "0.3", "--n-workers", "1"], env)
    assert result.returncode == 1, result.stderr
    records = json.loads((out / FAILURES_FILE).read_text())["failures"]
    assert [r["cells"] for r in records] == [[], [], []]
    assert {r["kind"] for r in records} == {"weights"}
    lines = _console(result)
    (grouped,) = [ln for ln in lines if ln.startswith("  FAILED ")]
    assert grouped.startswith("  FAILED 3 models, pretrained weights not cached (")
    assert "and the hub is unreachable (HEAD http://127.0.0.1:9: " in grouped
    assert not any(ln.startswith("sweep:") for ln in lines) and "Traceback" not in result.stderr


def test_a_refusal_is_told_to_use_overwrite_and_retried_means_a_second_attempt(
        spec, digits, tmp_path, scheduler, capsys):
    """Issue 24, E: a model refused for caches of other inputs needs --overwrite, not a rerun;
    ``retried`` is true only when an earlier run had recorded the model as failed."""
    from uqvision.predict import predict_to_files

    out = tmp_path / "s"
    predict_to_files(spec, digits / "test", out / "caches", PredictConfig(batch_size=32, seed=0))
    args = ["--threads", "1", "sweep", "--models", spec, "--data", str(digits / "test"),
            "--out", str(out), "--seed", "1", "--calibration-size", "0.3", "--scheduler",
            scheduler]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.endswith("; 1 refused: pass --overwrite to recompute them, or sweep into "
                        "another --out\n"), err
    assert "rerun the same command" not in err
    (rec,) = json.loads((out / FAILURES_FILE).read_text())["failures"]
    assert (rec["kind"], rec["attempts"], rec["retried"], rec["left_out"]) == (
        "refused", 1, False, False)
    assert main(args) == 1
    capsys.readouterr()
    (rec,) = json.loads((out / FAILURES_FILE).read_text())["failures"]
    assert (rec["attempts"], rec["retried"]) == (2, True)


def test_a_failures_file_that_cannot_be_written_is_one_line_and_the_sweep_goes_on(
        spec, digits, tmp_path, scheduler, capsys):
    """Issue 24, F (F4): the failures file cannot be written (a full disk used to abort the
    sweep unrecorded; here its folder is a link to nowhere, which reads as no file but
    cannot be written: the same OSError path): one line on stderr, the other models are
    computed and kept, the failures are in the report."""
    from dask import distributed

    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    failures = tmp_path / "gone" / FAILURES_FILE
    caches = tmp_path / "caches"
    with distributed.Client(scheduler) as client:
        report = sweep_predictions([spec, "test_vit=" + str(tmp_path / "absent.safetensors")],
                                   digits / "test", caches, PredictConfig(batch_size=32),
                                   client=client, threads=1, failures_file=failures)
    assert [p.name for p in report.computed] == ["test_byobnet+m0.test.plain-000.nc"]
    assert list(report.failed_models) == ["test_vit@absent"]
    assert report.failures_error is not None and not failures.exists()
    err = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("sweep:")]
    assert err == [(f"uqvision sweep: cannot write the failures file {str(failures)!r} "
                    f"({report.failures_error}); the sweep goes on, the caches written are "
                    "kept, and the failures are listed at the end")]


def test_a_failed_cell_leaves_its_traceback_in_the_log_file_not_on_the_console(
        digits, tmp_path, scheduler, capfd):
    """Issue 24, E: the console gets one line per failed model; the traceback goes to
    <out>/sweep.log."""
    bad = tmp_path / "broken.safetensors"
    bad.write_bytes(b"not a checkpoint at all")
    out = tmp_path / "s"
    assert main(["--threads", "1", "sweep", "--models", f"test_byobnet={bad}", "test_vit",
                 "--random-init", "--data", str(digits / "test"), "--out", str(out),
                 "--calibration-size", "0.3", "--scheduler", scheduler]) == 1
    got = capfd.readouterr()
    assert "Traceback" not in got.err and "Compute Failed" not in got.err
    (line,) = [ln for ln in got.out.splitlines() if ln.startswith("  FAILED ")]
    assert line.startswith("  FAILED test_byobnet@broken: uqvision.exceptions.CheckpointError")
    assert f"full tracebacks in {out / LOG_FILE}" in got.err
    log = (out / LOG_FILE).read_text()
    assert "cell test_byobnet+broken.test.plain-000 failed: uqvision.exceptions." \
           "CheckpointError" in log
    assert "Traceback (most recent call last)" in log and "predict_cell" in log


def _selective_files(out: Path) -> dict[str, str]:
    return {p.name: _sha(p) for p in sorted((out / "scores").glob("*"))}


def test_a_sweep_draws_its_figures_and_writes_its_results_table(digits, tmp_path, scheduler,
                                                                 capsys):
    """Issue 24, H and K: after scoring, the figures under <out>/plots/<dataset>/ and the
    results table (console, CSV, JSON) beside the scores, each path printed."""
    out = tmp_path / "s"
    assert main(["--threads", "1", "sweep", "--models", "test_vit", "test_resnet",
                 "--random-init", "--data", str(digits / "test"), "--out", str(out),
                 "--calibration-size", "0.3", "--scheduler", scheduler]) == 0
    lines = capsys.readouterr().out.splitlines()
    plots = out / "plots" / "test"
    names = sorted(p.name for p in plots.glob("*.png"))
    assert {"selective_risk_coverage.png", "selective_aurc_vs_accuracy.png",
            "selective_auroc_vs_ece_none.png"} <= set(names)
    assert f"figures: {plots} ({len(names)} files)" in lines
    assert str(out / "scores" / "selective-test.nc") in lines
    for suffix in (".csv", ".json"):
        path = out / "scores" / f"results-test{suffix}"
        assert str(path) in lines and path.is_file()
    assert "test_vit" in (out / "scores" / "results-test.csv").read_text()


def test_a_tta_sweep_says_that_it_writes_no_scores(digits, tmp_path, scheduler, capsys):
    """Issue 24, H: only plain and MC-dropout caches are scored; a TTA sweep says so."""
    out = tmp_path / "s"
    assert main(["--threads", "1", "sweep", "--models", "test_vit", "--random-init",
                 "--data", str(digits / "test"), "--out", str(out), "--mode", "tta",
                 "--passes", "2", "--scheduler", scheduler]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == ("scores: none (--mode tta caches are not scored: the selective "
                         "protocol scores plain and mc_dropout caches (softmax response; "
                         "MC-dropout entropy); score TTA or ensemble caches with uqvision score "
                         f"pitfalls --caches {out / 'caches'})")
    assert not (out / "scores").exists()


def test_an_mc_dropout_sweep_is_scored(spec, digits, tmp_path, scheduler, capsys):
    """The selective protocol's row kinds read plain and MC-dropout caches: an MC-dropout sweep
    writes its +mc_dropout rows (only plain sweeps were scored)."""
    out = tmp_path / "s"
    assert main(["--threads", "1", "sweep", "--models", spec, "--data", str(digits / "test"),
                 "--out", str(out), "--calibration-size", "0.3", "--mode", "mc_dropout",
                 "--passes", "2", "--mc-passes", "2", "--scheduler", scheduler]) == 0
    assert str(out / "scores" / "selective-test.nc") in capsys.readouterr().out
    ds = xr.open_dataset(out / "scores" / "selective-test.nc")
    assert list(ds["model"].values) == ["test_byobnet@m0+mc_dropout"]
    assert int(ds["passes"].values[0]) == 2


def test_a_second_dataset_in_the_same_out_replaces_nothing(digits, tmp_path, scheduler,
                                                           capsys):
    """Issue 24, J (row 8): a second dataset swept into the same --out used to stop at
    scoring with a hint to a --dataset option the sweep does not have (which argparse then
    took as --dataset-name, renaming the caches and overwriting scores/selective.nc); now each
    dataset has its own score file and table, and the first is left as it was."""
    out = tmp_path / "s"
    common = ["--threads", "1", "sweep", "--models", "test_vit", "--random-init", "--out",
              str(out), "--calibration-size", "0.3", "--scheduler", scheduler]
    assert main([*common, "--data", str(digits / "test")]) == 0
    first = _selective_files(out)
    assert main([*common, "--data", str(digits / "train")]) == 0
    got = capsys.readouterr()
    assert "--dataset" not in got.out + got.err
    second = _selective_files(out)
    assert {k: v for k, v in second.items() if k.endswith("-test.nc")} == {
        k: v for k, v in first.items() if k.endswith("-test.nc")}
    assert {"selective-test.nc", "selective-train.nc", "results-test.csv",
            "results-train.csv"} <= set(second)
    assert xr.open_dataset(out / "scores" / "selective-train.nc").attrs["dataset_name"] == \
        "train"
    # an abbreviation is not an option: --dataset is refused, not taken as --dataset-name
    with pytest.raises(SystemExit) as stop:
        main([*common, "--data", str(digits / "test"), "--dataset", "x"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --dataset x" in err and err.count("\n") == 1
    assert _selective_files(out) == second


def test_a_scores_file_of_another_dataset_is_refused_before_any_model_runs(digits, tmp_path,
                                                                           capsys):
    from uqmetrics import write_dataset

    out = tmp_path / "s"
    write_dataset(xr.Dataset(attrs={"protocol": "selective", "dataset_name": "other"}),
                  out / "scores" / "selective-test.nc")
    assert main(["--threads", "1", "sweep", "--models", "test_vit", "--random-init", "--data",
                 str(digits / "test"), "--out", str(out), "--calibration-size", "0.3"]) == 2
    err = capsys.readouterr().err
    assert "is not the selective scores of dataset 'test' (protocol 'selective', dataset " \
           "'other'); move it away, or pass --overwrite to replace it" in err
    assert not (out / "caches").exists()


def test_two_checkpoints_of_one_stem_are_named_as_such():
    """Two different files of one stem give one result row (NAME@stem): the error names the
    files and the way out, not only "listed twice"."""
    with pytest.raises(ValueError, match=r"models listed twice: 'test_vit@m' names 2 files "
                                         r"\(/a/m.pth, /b/m.pth\): .*rename one file$"):
        expand_models(["test_vit=/a/m.pth", "test_vit=/b/m.pth"])
    with pytest.raises(ValueError, match=r"models listed twice: 'test_vit'$"):
        expand_models(["test_vit", "test_vit"])


def test_a_weights_dir_that_is_not_a_folder_is_refused_before_any_model_runs(digits, tmp_path,
                                                                            capsys):
    """A mistyped --weights-dir used to be taken as a folder holding no file, so that every
    model silently loaded its pretrained weights from the hub instead of the local ones."""
    out = tmp_path / "s"
    missing = tmp_path / "weigths"
    assert main(["--threads", "1", "sweep", "--models", "test_vit", "--weights-dir",
                 str(missing), "--data", str(digits / "test"), "--out", str(out),
                 "--calibration-size", "0.3", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err == (f"uqvision sweep: error: --weights-dir {str(missing)!r}: not a folder (the "
                   "folder of the models' <name>.safetensors/.pth files)\n"), err
    assert not out.exists()
    from uqvision.models import ModelSpec

    with pytest.raises(ValueError, match=r"weights_dir '.*weigths' is not a folder"):  # the library
        plan_sweep([ModelSpec("test_vit")], digits / "test", PredictConfig(), weights_dir=missing)


def test_an_output_subfolder_that_cannot_be_written_is_refused_before_any_model_runs(
        digits, tmp_path, capsys):
    """The figures' folder is checked with the others (a file where <out>/plots must be)."""
    out = tmp_path / "s"
    out.mkdir()
    (out / "plots").write_text("a file where a folder must be")
    assert main(["--threads", "1", "sweep", "--models", "test_vit", "--random-init", "--data",
                 str(digits / "test"), "--out", str(out), "--calibration-size", "0.3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"uqvision sweep: error: --out {str(out / 'plots')!r}") and \
        err.count("\n") == 1, err
    assert sorted(p.name for p in out.iterdir()) == ["plots"]


@pytest.mark.slow
def test_ctrl_c_on_a_sweep_prints_one_line(digits, tmp_path):
    """Issue 24, G (F7): Ctrl-C in a terminal (SIGINT to the whole process group) while cells
    run used to print tens of lines of the Dask workers' tracebacks; now the one line
    "uqvision sweep: interrupted"."""
    out = tmp_path / "s"
    env = {k: v for k, v in os.environ.items()}
    cmd = [sys.executable, "-m", "uqvision", "--threads", "1", "sweep", "--models", "resnet18",
           "resnet34", "resnet50", "resnet101", "--random-init", "--data",
           str(digits / "test"), "--out", str(out), "--calibration-size", "0.3",
           "--n-workers", "2", "--batch-size", "16"]
    # SIGINT at its default in the sweep, even where this test runs with it ignored (nohup)
    proc = subprocess.Popen(interruptible(cmd), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend(
        (time.monotonic(), ln.rstrip("\n")) for ln in proc.stderr), daemon=True)
    reader.start()
    deadline = time.monotonic() + 240
    while not list((out / "caches").glob("*.nc")) and time.monotonic() < deadline:
        assert proc.poll() is None, lines
        time.sleep(0.2)
    assert list((out / "caches").glob("*.nc")), "no cell finished"
    assert proc.poll() is None, "the sweep finished before the interrupt"
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal does
    assert proc.wait(timeout=120) == 130
    reader.join(timeout=30)
    after = [ln for t, ln in lines if t >= sent]
    assert after == ["uqvision sweep: interrupted"], after
