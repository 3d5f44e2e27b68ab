"""Hostile inputs to the ``uqreg`` command line: no silent wrong result, no lost file.

A user's mistake is ONE line on stderr, ``uqreg <command>: error: ...``, naming the option (or
the file) and the problem, with exit code 2; it is found before anything is computed (training
is a tripwire here) or written; and an earlier result in the output folder is left exactly as it
was (every file hashed before and after), with no folder or file left behind. One test per case
of the issue "No silent wrong result, no lost file" (a-j); each ran into a hang, a traceback, a
late or unnamed error before.

The tests run as root in the sandbox, where permissions do not stop a write: an unwritable output
is made by putting it under a regular file (the earlier study file itself), which stops root too;
a permission case runs where the tests are not root.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import uqmetrics
import xarray as xr
from uqmetrics.runs.testing.filesystems import full_filesystems, not_writable

from uqreg import cli
from uqreg.methods import Method
from uqreg.rng import SEED_MAX
from uqreg.study import StudyConfig
from uqreg.sweep import run_study_sweep

#: A tiny study: the closed-form reference only (no training), one level, two repetitions.
EARLIER = ["--task", "sinusoid", "--complexities", "1", "--methods", "blr", "--repetitions", "2", "--quiet"]
#: Options that would train networks in seconds, were a bad value let through.
TINY = ["--task", "sinusoid", "--complexities", "1", "--methods", "blr,ens", "--repetitions", "2", "--members", "2",
        "--epochs", "2", "--mc-samples", "2", "--quiet"]


def _hashes(folder: Path) -> dict[str, str]:
    """Every file (hidden ones too) and folder under ``folder``: relative path to its SHA-256
    (``"folder"`` for a folder)."""
    return {str(p.relative_to(folder)): "folder" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def earlier_study(tmp_path_factory) -> Path:
    """An earlier result: study.nc and its plots, written by ``uqreg study``."""
    out = tmp_path_factory.mktemp("earlier") / "run"
    assert cli.main(["study", *EARLIER, "--out", str(out)]) == 0
    assert (out / "study.nc").is_file() and any((out / "plots").iterdir())
    return out


@pytest.fixture
def run(earlier_study, tmp_path) -> Path:
    """A copy of the earlier result, which the bad command must leave exactly as it is."""
    out = tmp_path / "run"
    shutil.copytree(earlier_study, out)
    return out


@pytest.fixture
def no_training(monkeypatch):
    """A tripwire: training a network fails the test (nothing may be computed before the inputs
    are known to be good)."""
    def fail(*args, **kwargs):
        raise AssertionError("training started before the inputs were checked")

    monkeypatch.setattr(Method, "run", fail)


def _refused(capsys, args: list[str], *names: str) -> str:
    """Run ``uqreg ARGS``; assert exit code 2 and ONE line ``uqreg <command>: error: ...`` naming
    every one of ``names``; return the line."""
    capsys.readouterr()
    try:
        code = cli.main(args)
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"uqreg {args[0]}: error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for name in names:
        assert name in err, (name, err)
    return err


# ---------------------------------------------------------------------------------------------
# a. --workers 0 or -1: a LocalCluster of no worker waited for ever


@pytest.mark.parametrize("workers", ["0", "-1"])
def test_a_sweep_without_workers_is_refused_instead_of_hanging(run, workers):
    """The real command line, in a process of its own with a deadline: before, it hung."""
    before = _hashes(run)
    proc = subprocess.run([sys.executable, "-m", "uqreg.cli", "sweep", *TINY, "--workers", workers,
                           "--out", str(run), "--overwrite"], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"uqreg sweep: error: argument --workers: must be an integer >= 1, got {workers} "
                           f"(see uqreg sweep --help)\n")
    assert _hashes(run) == before  # no cells/ folder either
    # the library refuses it too, before any cell or folder
    with pytest.raises(ValueError, match="n_workers must be an integer >= 1, got 0"):
        run_study_sweep(StudyConfig(task="sinusoid", complexities=(1,), methods=("blr",), repetitions=2),
                        run / "lib", n_workers=0, progress=False)
    assert not (run / "lib").exists()


# ---------------------------------------------------------------------------------------------
# b. an output that cannot be written: refused before any training, not with a traceback after it


@pytest.mark.parametrize("command", ["study", "reference"])
def test_b_an_unwritable_output_is_refused_before_any_work(run, capsys, no_training, command):
    """``--out`` under a regular file (the earlier study file itself) cannot be created, even by
    root; the earlier study and its plots are untouched."""
    before = _hashes(run)
    blocked = run / "study.nc" / ("again" if command == "study" else "ref.nc")
    args = ["study", *TINY, "--overwrite"] if command == "study" else ["reference", "--repetitions", "2"]
    err = _refused(capsys, [*args, "--out", str(blocked)], "--out", str(blocked))
    assert err.endswith(f"cannot be written: {run / 'study.nc'} is not a folder\n")
    assert _hashes(run) == before


def test_b_a_folder_without_write_permission_is_refused_before_any_work(run, capsys, no_training,
                                                                         monkeypatch):
    """Root (which runs the tests here) writes through permissions: ``os.access`` gives, for
    this folder alone, the answer a user gets after the chmod."""
    before = _hashes(run)
    run.chmod(0o500)
    not_writable(monkeypatch, run)
    try:
        assert not os.access(run, os.W_OK)
        _refused(capsys, ["study", *TINY, "--overwrite", "--out", str(run)], "--out", "not writable")
    finally:
        run.chmod(0o700)
    assert _hashes(run) == before


# ---------------------------------------------------------------------------------------------
# c. --complexities 1,1: a TypeError after training


def test_c_repeated_complexities_are_refused(run, capsys, no_training):
    before = _hashes(run)
    _refused(capsys, ["study", *TINY, "--complexities", "1,1", "--overwrite", "--out", str(run)],
             "--complexities must not repeat, got 1,1")
    assert _hashes(run) == before


# ---------------------------------------------------------------------------------------------
# d. --seed beyond 64 bits: a netCDF attribute error after training, and an empty folder


@pytest.mark.parametrize("seed", [str(10**23), str(SEED_MAX + 1)])
def test_d_a_seed_out_of_range_is_refused_and_no_folder_is_created(tmp_path, capsys, no_training, seed):
    out = tmp_path / "new"
    _refused(capsys, ["study", *TINY, "--seed", seed, "--out", str(out)],
             f"--seed must be an integer from 0 to 2**63 - 1 = {SEED_MAX}, got {seed}")
    assert not out.exists()
    _refused(capsys, ["study", *TINY, "--seed", "1e23", "--out", str(out)], "argument --seed: invalid int value")
    assert list(tmp_path.iterdir()) == []


def test_d_the_largest_seed_of_the_stated_range_is_written_and_read_back(tmp_path):
    """The range the message states is the range that works: 2**63 - 1 runs and is stored."""
    out = tmp_path / "max"
    assert cli.main(["study", *EARLIER, "--no-plots", "--seed", str(SEED_MAX), "--out", str(out)]) == 0
    assert int(uqmetrics.read_dataset(out / "study.nc").attrs["seed"]) == SEED_MAX


# ---------------------------------------------------------------------------------------------
# e. uqreg plot on a file that is not a study: an AttributeError and an empty plots folder


@pytest.mark.parametrize("kind", ["cache", "plain"])
def test_e_plot_refuses_a_file_that_is_not_a_study(tmp_path, capsys, kind):
    """A result file of another kind (a uqvision-style logits cache) and a netCDF file not written
    by uqmetrics: the file is named; no plots folder appears beside it."""
    folder = tmp_path / "cache"
    folder.mkdir()
    path = folder / "run.nc"
    ds = xr.Dataset({"logits": (("sample", "class"), [[0.1, 0.9], [0.8, 0.2]])}, attrs={"model": "vit"})
    if kind == "cache":
        uqmetrics.write_dataset(ds, path)
        problem = "is not a uqreg study"
    else:
        ds.to_netcdf(path)
        problem = "lacks the completeness flag"
    before = _hashes(folder)
    _refused(capsys, ["plot", str(path)], str(path), problem)
    assert _hashes(folder) == before  # no plots/ folder
    _refused(capsys, ["plot", str(folder)], str(folder / "study.nc"), "does not exist")
    assert _hashes(folder) == before


# ---------------------------------------------------------------------------------------------
# f. reproduce --experiments ,: an argparse traceback


@pytest.mark.parametrize("value, problem", [(",", "expected comma-separated names, got ','"),
                                            ("e1,nope", "unknown nope (choose among e1, e2, e3")])
def test_f_reproduce_refuses_an_empty_or_unknown_experiment_list(run, capsys, value, problem):
    before = _hashes(run)
    _refused(capsys, ["reproduce", "--experiments", value, "--out", str(run)], "argument --experiments: " + problem)
    assert _hashes(run) == before


# ---------------------------------------------------------------------------------------------
# g. --members 1, --lr inf, --weight-decay inf: "pass skipna=True" after training


@pytest.mark.parametrize("option, value, problem", [
    ("--members", "1", "must be >= 2 (an ensemble of one network has no spread; ensemble methods run: ens), got 1"),
    ("--lr", "inf", "must be a finite number > 0, got inf"),
    ("--lr", "nan", "must be a finite number > 0, got nan"),
    ("--lr", "0", "must be a finite number > 0, got 0.0"),
    ("--weight-decay", "inf", "must be a finite number >= 0, got inf"),
    ("--weight-decay", "-1", "must be a finite number >= 0, got -1.0"),
])
def test_g_training_options_without_a_meaningful_result_are_refused(run, capsys, no_training, option, value,
                                                                     problem):
    before = _hashes(run)
    _refused(capsys, ["study", *TINY, option, value, "--overwrite", "--out", str(run)], f"{option} {problem}")
    assert _hashes(run) == before


def test_g_one_member_is_fine_without_an_ensemble_method(tmp_path):
    """Members only matter to the ensembles: ``--methods blr --members 1`` still runs."""
    assert cli.main(["study", *EARLIER, "--members", "1", "--no-plots", "--out", str(tmp_path / "blr")]) == 0


# ---------------------------------------------------------------------------------------------
# h. --max-memory inf: "cannot convert float NaN to integer"


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-1"])
def test_h_a_memory_budget_that_is_not_finite_and_positive_is_refused(run, capsys, no_training, value):
    before = _hashes(run)
    _refused(capsys, ["study", *TINY, "--max-memory", value, "--overwrite", "--out", str(run)],
             f"--max-memory must be a finite number > 0 or auto, got {value}")
    assert _hashes(run) == before


# ---------------------------------------------------------------------------------------------
# i. --seed -1: "expected non-negative integer", no option named


@pytest.mark.parametrize("command", ["study", "sweep", "reference"])
def test_i_a_negative_seed_is_refused_naming_the_option(run, capsys, no_training, command):
    before = _hashes(run)
    args = [*TINY, "--overwrite"] if command != "reference" else ["--out", str(run / "ref.nc")]
    if command != "reference":
        args += ["--out", str(run)]
    _refused(capsys, [command, *args, "--seed", "-1"], "--seed must be an integer from 0 to 2**63 - 1", "got -1")
    assert _hashes(run) == before


# ---------------------------------------------------------------------------------------------
# j. --out FILE where a folder is expected: "[Errno 17] File exists"


@pytest.mark.parametrize("command", ["study", "sweep", "reproduce", "plot"])
def test_j_an_output_folder_that_is_a_file_is_refused_naming_option_and_path(run, capsys, no_training, command):
    before = _hashes(run)
    target = run / "study.nc"  # the earlier result itself, passed where a folder is expected
    args = {"study": ["study", *TINY, "--overwrite"], "sweep": ["sweep", *TINY, "--overwrite"],
            "reproduce": ["reproduce", "--scale", "smoke"], "plot": ["plot", str(run)]}[command]
    _refused(capsys, [*args, "--out", str(target)], f"--out {target} is not a folder")
    assert _hashes(run) == before


def test_j_reference_refuses_a_folder_or_an_existing_file_as_its_output(run, capsys):
    """``reference --out`` names a file: a folder, or an existing file without --overwrite, is
    refused before the reference is computed."""
    before = _hashes(run)
    _refused(capsys, ["reference", "--out", str(run)], f"--out {run} is a folder")
    _refused(capsys, ["reference", "--out", str(run / "study.nc")], f"--out {run / 'study.nc'} already exists",
             "--overwrite")
    assert _hashes(run) == before


# ---------------------------------------------------------------------------------------------
# the other numeric options: each refusal names its option too


@pytest.mark.parametrize("args, message", [
    (["study", "--sigma", "inf"], "--sigma must be a positive number, got inf"),
    (["study", "--n-train", "0"], "--n-train must be an integer >= 1, got 0"),
    (["study", "--dropout", "nan"], "--dropout must be a number in (0, 1), got nan"),
    (["study", "--epochs", "0"], "--epochs must be an integer >= 1, got 0"),
    (["study", "--mc-samples", "1"], "--mc-samples must be an integer >= 2"),
    (["study", "--methods", "ens,ens"], "--methods must not repeat, got ens,ens"),
    (["sweep", "--chunk-repetitions", "0"], "argument --chunk-repetitions: must be an integer >= 1, got 0"),
    (["sweep", "--threads-per-worker", "0"], "argument --threads-per-worker: must be an integer >= 1, got 0"),
    (["reference", "--sigma", "inf"], "--sigma must be a positive number, got inf"),
    (["reference", "--n-train", "0"], "--n-train must be an integer >= 1, got 0"),
])
def test_other_bad_numbers_name_their_option(run, capsys, no_training, args, message):
    before = _hashes(run)
    out = ["--out", str(run / "ref.nc")] if args[0] == "reference" else [*TINY, "--overwrite", "--out", str(run)]
    _refused(capsys, [args[0], *out, *args[1:]], message)
    assert _hashes(run) == before


# ---------------------------------------------------------------------------------------------
# failed sweep cells (not a user's mistake): one line, exit code 1, finished cells kept


def test_failed_cells_of_reproduce_are_one_line_with_exit_code_1(tmp_path, capsys):
    """A device the workers lack fails the cells that train (it is checked where the networks are
    placed: a scheduler's workers may have it); the closed-form cell finishes and is kept, and
    the error is one line naming the failed cells, exit code 1 (was: a RuntimeError traceback)."""
    import torch
    from dask.distributed import LocalCluster

    missing = f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"
    out = tmp_path / "repro"
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster:
        code = cli.main(["reproduce", "--scale", "smoke", "--experiments", "e3", "--device", missing,
                         "--scheduler", cluster.scheduler_address, "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("uqreg reproduce: error: e3: 2 cell(s) failed (") and err.count("\n") == 1, err
    assert f"device {missing!r} is not available here" in err and "rerun the same command" in err
    kept = sorted(p.name for p in (out / "e3" / "cells").glob("*.nc"))
    assert len(kept) == 1 and "_blr_" in kept[0]
    assert not (out / "e3" / "study.nc").exists()


# ---------------------------------------------------------------------------------------------
# issue 24: an abbreviated option (row 8), a full disk (F3)


@pytest.mark.parametrize("args, option", [(["study", *EARLIER, "--over"], "--over"),
                                          (["reference", "--rep", "2"], "--rep")])
def test_k_an_abbreviated_option_is_refused(run, capsys, no_training, args, option):
    """``--over`` was taken for ``--overwrite`` (argparse's prefix matching), ``--rep`` for
    ``--repetitions``: a typo, or an option added later, silently meant another one. Refused,
    one line naming it, nothing written."""
    before = _hashes(run)
    out = str(run if args[0] == "study" else run / "ref.nc")
    err = _refused(capsys, [*args, "--out", out], f"unrecognized arguments: {option}")
    assert err.endswith(f"(see uqreg {args[0]} --help)\n")
    assert _hashes(run) == before


@pytest.fixture
def disk_full(tmp_path):
    """``disk_full(leave) -> folder``: a real 1 MiB file system (tmpfs) filled up but
    ``leave`` bytes (:func:`uqmetrics.runs.testing.filesystems.full_filesystems`; needs root)."""
    with full_filesystems(tmp_path) as make:
        yield make


def test_l_a_full_disk_is_one_line_no_space_naming_the_study_file(disk_full, capsys):
    """F3: ``uqreg study`` whose study file fills the disk stopped with a traceback of
    ``RuntimeError: NetCDF: HDF error`` (exit 1), no path, no "no space". One line naming the
    study file and "no space left", exit 2; no temporary file stays."""
    out = disk_full(16384) / "run"
    target = out / "study.nc"
    _refused(capsys, ["study", *EARLIER, "--out", str(out), "--no-plots"],
             f"{target}: cannot be written: no space left on the device")
    assert not target.exists() and [p.name for p in out.iterdir()] == []
