"""The ``uqreg`` command line end to end on a tiny configuration.

``study`` writes study.nc and the PNGs; a rerun without ``--overwrite`` refuses and leaves the
file untouched; ``plot`` redraws from the file alone; ``reference``/``tasks``/``methods`` print;
bad input (and a study too large for memory) exits with code 2 and a clear message before any
training; an interrupted study leaves no file (and no temporary file) behind; ``--recipes`` runs
recipes side by side and the summary shows collapse beside coverage; progress in logs is a
line every 30 s, not a redrawn bar.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import time

import numpy as np
import pytest
import uqmetrics
import xarray as xr
from uqmetrics.runs.sweep import LOG_PROGRESS_INTERVAL, LogProgress

from uqreg import cli
from uqreg.engine import RECIPES
from uqreg.methods import METHODS, Method
from uqreg.reference import reference_prediction
from uqreg.tasks import TASKS, get_task

TINY = ["--task", "sinusoid", "--complexities", "1,2", "--methods", "blr,ens,bd", "--repetitions", "2",
        "--members", "2", "--epochs", "3", "--mc-samples", "3", "--quiet"]


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _is_png(path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def no_training(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(Method, "run", fail)


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    assert cli.main(["study", *TINY, "--out", str(out)]) == 0
    return out


@pytest.mark.slow
def test_study_writes_file_and_plots(study_dir):
    target = study_dir / "study.nc"
    ds = uqmetrics.read_dataset(target, decode_attrs=True)
    assert list(ds.method.values) == ["blr", "ens", "bd"]
    assert list(ds.complexity.values) == [1, 2] and ds.sizes["repetition"] == 2
    cfg = ds.attrs["config"]
    assert cfg["task"] == "sinusoid" and cfg["train"]["members"] == 2 and cfg["train"]["epochs"] == 3
    pngs = sorted(p.name for p in (study_dir / "plots").iterdir())
    assert pngs == ["bands_c1.png", "bands_c2.png", "conditional_coverage_c1.png", "conditional_coverage_c2.png",
                    "conditional_vs_complexity.png", "probes_vs_complexity.png"]
    assert all(_is_png(study_dir / "plots" / p) for p in pngs)
    assert not [p for p in study_dir.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.slow
def test_rerun_without_overwrite_refuses_and_keeps_the_file(study_dir, capsys, no_training):
    target = study_dir / "study.nc"
    before, mtime = _digest(target), target.stat().st_mtime_ns
    assert cli.main(["study", *TINY, "--out", str(study_dir)]) == 2
    err = capsys.readouterr().err
    assert "--overwrite" in err and "study.nc" in err
    assert _digest(target) == before and target.stat().st_mtime_ns == mtime


@pytest.mark.slow
def test_plot_redraws_from_the_file(study_dir, tmp_path, capsys):
    """``plot DIR`` finds DIR/study.nc and draws every figure from the file alone."""
    assert cli.main(["plot", str(study_dir), "--out", str(tmp_path / "again")]) == 0
    names = sorted(p.name for p in (tmp_path / "again").iterdir())
    assert names == ["bands_c1.png", "bands_c2.png", "conditional_coverage_c1.png", "conditional_coverage_c2.png",
                     "conditional_vs_complexity.png", "probes_vs_complexity.png"]
    assert all(_is_png(tmp_path / "again" / n) for n in names)
    assert capsys.readouterr().out.count("wrote") == 6


def test_overwrite_replaces_the_file(tmp_path):
    out = tmp_path / "o"
    args = ["study", "--task", "sinusoid", "--complexities", "1", "--methods", "blr", "--repetitions", "2",
            "--quiet", "--no-plots", "--out", str(out)]
    assert cli.main([*args, "--seed", "1"]) == 0
    first = uqmetrics.read_dataset(out / "study.nc")
    assert cli.main([*args, "--seed", "2", "--overwrite"]) == 0
    second = uqmetrics.read_dataset(out / "study.nc")
    assert int(first.attrs["seed"]) == 1 and int(second.attrs["seed"]) == 2
    assert not (out / "plots").exists()
    assert sorted(p.name for p in out.iterdir()) == ["study.config.toml", "study.nc"]


def test_reference_tasks_methods_print(tmp_path, capsys):
    assert cli.main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in TASKS)
    assert cli.main(["methods"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in METHODS)
    path = tmp_path / "ref.nc"
    assert cli.main(["reference", "--task", "sinusoid", "--complexity", "2", "--repetitions", "5",
                     "--out", str(path)]) == 0
    out = capsys.readouterr().out
    assert "p=4" in out and "N=50" in out and "coverage over 5 draws" in out
    with xr.open_dataset(path) as ds:
        ds = ds.load()
    inst = get_task("sinusoid").instance(2, 0)
    mean, std = reference_prediction(inst, inst.targets(np.arange(5)))
    np.testing.assert_allclose(ds.prediction.values, mean, rtol=1e-12)
    np.testing.assert_allclose(ds.uncertainty.values, std, rtol=1e-12)


@pytest.mark.parametrize("args, message", [
    (["study", "--task", "nope"], "valid tasks: polynomial, polynomial_het, sinusoid, sinusoid_het, styblinski_tang"),
    (["study", "--methods", "ens,nope"], "valid methods: blr, bd, cd, vd, ens, ens_adv, ens_bs"),
    (["study", "--repetitions", "0"], "repetitions must be an integer >= 1"),
    (["study", "--sigma", "-1"], "sigma must be a positive number"),
    (["study", "--complexities", "0"], "complexit"),
    (["study", "--n-train", "3"], "n_train must be at least the number of parameters p=4"),
    (["study", "--members", "0"], "members"),
    (["study", "--dropout", "1.5"], "dropout"),
    (["study", "--device", "tpu"], "--device must be cpu, cuda or cuda:N, got tpu"),
    (["reference", "--task", "nope"], "valid tasks"),
    (["reference", "--complexity", "0"], "complexity must be an integer >= 1"),
    (["reference", "--repetitions", "0"], "repetitions must be an integer >= 1"),
])
def test_bad_input_exits_2_before_training(args, message, tmp_path, capsys, no_training):
    out = tmp_path / "bad"
    extra = ["--out", str(out), "--quiet"] if args[0] == "study" else []
    assert cli.main([*args, *extra]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.err.startswith(f"uqreg {args[0]}: error:")
    assert not out.exists()


def test_a_device_that_is_not_here_exits_2_and_writes_nothing(tmp_path, capsys):
    """A valid device this machine lacks (one past its last CUDA device) is refused where the
    networks would be placed, with the count, and no study file is written."""
    import torch

    missing = f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"
    out = tmp_path / "gpu"
    assert cli.main(["study", *TINY, "--device", missing, "--out", str(out)]) == 2
    assert f"device {missing!r} is not available here" in capsys.readouterr().err
    assert not (out / "study.nc").exists()


def test_plot_missing_file_exits_2(tmp_path, capsys):
    assert cli.main(["plot", str(tmp_path / "missing.nc")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_unparsable_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["study", "--complexities", "a,b"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        cli.main(["nope"])
    assert exc.value.code == 2
    # an empty selection is an error, not "the default" (which would silently run everything)
    for args in (["--complexities", "3-1"], ["--complexities", ","], ["--methods", ""], ["--methods", " , "]):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            cli.main(["study", *args])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "expected" in err or "empty range" in err, err


@pytest.mark.slow
def test_module_entry_point_exit_code(tmp_path):
    """``python -m uqreg.cli`` exits with main()'s code and prints the message."""
    proc = subprocess.run([sys.executable, "-m", "uqreg.cli", "study", "--task", "nope", "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    assert "valid tasks" in proc.stderr
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------------------------------------
# interruption


def _interrupt_on_call(monkeypatch, n: int):
    calls = {"n": 0}
    original = Method.run

    def run(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Method, "run", run)
    return calls


def test_interrupted_training_leaves_no_file(tmp_path, monkeypatch):
    out = tmp_path / "run"
    calls = _interrupt_on_call(monkeypatch, 3)
    assert cli.main(["study", *TINY, "--out", str(out)]) == 130  # Ctrl-C: uqmetrics.run_command's code
    assert calls["n"] == 3
    assert not out.exists() or list(out.iterdir()) == []


def test_interrupted_write_leaves_no_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    out = tmp_path / "run"
    args = ["study", "--task", "sinusoid", "--complexities", "1", "--methods", "blr", "--repetitions", "2",
            "--quiet", "--no-plots", "--out", str(out)]
    original = xr.Dataset.dump_to_store  # what writes the data into the temporary file

    def write_then_interrupt(self, store, *a, **kw):
        original(self, store, *a, **kw)  # the temporary file is fully written, then: Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(xr.Dataset, "dump_to_store", write_then_interrupt)
    assert cli.main(args) == 130
    assert not out.exists() or list(out.iterdir()) == []
    # with an existing result and --overwrite, the old file survives an interrupted write
    monkeypatch.setattr(xr.Dataset, "dump_to_store", original)
    assert cli.main([*args, "--seed", "1"]) == 0
    before = _digest(out / "study.nc")
    monkeypatch.setattr(xr.Dataset, "dump_to_store", write_then_interrupt)
    assert cli.main([*args, "--seed", "2", "--overwrite"]) == 130
    assert sorted(p.name for p in out.iterdir()) == ["study.config.toml", "study.nc"]
    assert _digest(out / "study.nc") == before


# ---------------------------------------------------------------------------------------------
# recipes, collapse in the summary, memory, progress in logs


def test_recipes_side_by_side_and_collapse_in_the_summary(tmp_path, capsys):
    """``--recipes`` runs every method under each recipe; the summary shows, per recipe, coverage
    beside the collapsed fraction and R², and names collapsed methods (3 epochs: nothing learned)."""
    out = tmp_path / "r"
    args = ["study", "--task", "sinusoid", "--complexities", "1", "--methods", "blr,ens", "--recipes", "paper,none",
            "--repetitions", "2", "--members", "2", "--epochs", "3", "--quiet", "--no-plots", "--out", str(out)]
    assert cli.main(args) == 0
    text = capsys.readouterr().out
    assert "recipe paper:" in text and "recipe none:" in text and "R²" in text
    assert "COLLAPSED under recipe paper: ens (f_main=1)" in text and "COLLAPSED under recipe none: ens (f_main=1)" in text
    assert "blr" not in text.split("COLLAPSED")[1].splitlines()[0]
    ds = uqmetrics.read_dataset(out / "study.nc")
    assert list(ds.recipe.values) == ["paper", "none"]
    assert float(ds.collapsed_fraction.sel({"method": "ens"}).min()) == 1.0
    assert float(ds.collapsed_fraction.sel({"method": "blr"}).max()) == 0.0


def test_recipes_list_and_unknown_recipe(capsys, tmp_path, no_training):
    assert cli.main(["recipes"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in RECIPES)
    assert cli.main(["study", "--recipes", "paper,nope", "--out", str(tmp_path / "x"), "--quiet"]) == 2
    assert "valid recipes: paper, sum, decoupled, none" in capsys.readouterr().err


def test_too_large_study_exits_2_before_allocating(tmp_path, capsys, no_training):
    """``--task styblinski_tang --complexities 9`` (4.3e9 training points) used to die in numpy
    with a 289 GiB allocation; now a clear message names the size and the options."""
    out = tmp_path / "big"
    assert cli.main(["study", "--task", "styblinski_tang", "--complexities", "9", "--methods", "blr",
                     "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("uqreg study: error: styblinski_tang at d=9 (N=4,304,672,100 training points")
    assert "GiB" in err and "--n-train" in err and "--max-memory" in err
    assert not out.exists()


@pytest.mark.slow
def test_progress_does_not_flood_logs(tmp_path):
    """With stderr a pipe (CI, ``tox -e demo > log``) the study writes periodic one-line updates,
    not a bar redrawn for every epoch (tqdm wrote thousands of carriage-return updates)."""
    args = [sys.executable, "-m", "uqreg.cli", "study", "--task", "sinusoid", "--complexities", "1,2",
            "--methods", "ens,bd", "--repetitions", "2", "--members", "2", "--epochs", "150", "--mc-samples", "3",
            "--no-plots", "--out", str(tmp_path / "p")]
    t0 = time.monotonic()
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "sinusoid study:" in ln]
    assert 1 <= len(lines) <= 1 + elapsed / LOG_PROGRESS_INTERVAL
    assert lines[-1].startswith("sinusoid study: 600/600 epochs (100%)")  # 2 methods × 2 levels × 150


def test_log_progress_lines_are_periodic():
    stream = io.StringIO()
    bar = LogProgress(10, "demo", interval=3600.0, stream=stream, unit="epoch")
    for _ in range(10):
        bar.update(1)
    bar.close()
    assert stream.getvalue().splitlines() == [ln for ln in stream.getvalue().splitlines()
                                              if ln.startswith("demo: 10/10 epochs (100%)")]
    assert len(stream.getvalue().splitlines()) == 1
    stream = io.StringIO()
    bar = LogProgress(10, "demo", interval=0.0, stream=stream, unit="epoch")
    for _ in range(10):
        bar.update(1)
    assert len(stream.getvalue().splitlines()) == 10


def test_study_options_take_their_defaults_from_the_configs(capsys):
    """Each study option's default is written once, in StudyConfig/TrainConfig, and the help
    shows it from there (before, the help restated them by hand, e.g. 4 GiB for 4e9 bytes)."""
    from uqreg.engine import TrainConfig
    from uqreg.study import StudyConfig

    with pytest.raises(SystemExit):
        cli.main(["study", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    train, study = TrainConfig(), StudyConfig()
    for expected in (f"ensemble members (default {train.members})",
                     f"MC passes of dropout methods (default {train.mc_samples})",
                     f"Adam learning rate (default {train.lr})",
                     f"noise redraws k per cell (default {study.repetitions})",
                     f"half the CUDA device's memory (default {train.max_memory / 2**30:.3g} on the CPU, auto on CUDA)"):
        assert expected in text, expected
