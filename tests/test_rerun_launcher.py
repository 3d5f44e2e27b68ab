"""Cross-package: a result file is data, never code (docs/conventions.md#rerun-rules).

A result file received from someone else records a sweep to run on a ``jobqueue-local`` cluster
whose job script starts with a command of theirs (``--cluster-option
job_script_prologue=...``: here, a Python one-liner that creates a marker file). ``uqreg
rerun``, ``uqvision rerun`` and ``uqreg sweep --config FILE.nc`` never take those options: the
marker never appears, the run uses a ``LocalCluster`` of this machine (what its own record
says), and the options left out are named on stderr; the user gives launcher options on the
command line. Without ``--yes`` a file that records no host or user is not run at all.
"""

from __future__ import annotations

import getpass
import json
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr
from uqmetrics import write_dataset

pytest.importorskip("dask_jobqueue")  # what the hostile file asks for, so that it could run
pytestmark = pytest.mark.slow  # each test runs a sweep (a minute on 2 CPUs)


def _run(*args: str, cwd=None, timeout: int = 900) -> subprocess.CompletedProcess:
    exe = shutil.which(args[0])
    assert exe, f"the {args[0]} console script must be installed"
    return subprocess.run([exe, *args[1:]], check=False, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def _hostile(marker) -> dict:
    """Cluster options that run a command when the job starts (no shell: dask-jobqueue's local
    job runs its script's words, so the command is one Python call)."""
    return {"cluster": "jobqueue-local",
            "cluster-option": ["cores=1", "memory=1GB",
                               (f"job_script_prologue={sys.executable} -c "
                                f"open({str(marker)!r},'w')")],
            "jobs": 1}


def _result_file(path, command: str, options: dict, **where) -> str:
    """A result file recording ``command`` with ``options`` (and ``where``: host, user; none by
    default), written by the project's write path."""
    record = {"command": command, "version": "0.1.0", "git_commit": "unknown",
              "git_dirty": None, **where, "options": options}
    write_dataset(xr.Dataset({"x": ("i", np.arange(3.0))}), path,
                  attrs={"run_config": json.dumps(record)})
    return str(path)


def _recorded(path) -> dict:
    with xr.open_dataset(path) as ds:
        return json.loads(ds.attrs["run_config"])


def _assert_not_taken(res, marker, out_file) -> None:
    assert not marker.exists()  # the job script never ran
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (line,) = [x for x in res.stderr.splitlines() if "not taken from the file: " in x]
    assert '--cluster "jobqueue-local"' in line and "job_script_prologue=" in line
    assert line.endswith("(launcher options come from the command line only: a file, a result "
                         "or a TOML configuration, is data and never says where or how the "
                         "work runs)")
    run = _recorded(out_file)
    run = run.get("part_of", run)["options"]  # a sweep's score file: the sweep, its part_of
    assert (run["cluster"], run["cluster-option"]) == ("local", None)


_UQREG = {"task": "sinusoid", "complexities": [1], "methods": ["blr"], "repetitions": 1,
          "chunk-repetitions": 1, "workers": 1, "no-plots": True, "quiet": True}


def test_uqreg_rerun_and_config_of_a_hostile_study_run_nothing_it_names(tmp_path):
    marker = tmp_path / "MARKER"
    study = _result_file(tmp_path / "study.nc", "uqreg sweep",
                         {**_UQREG, **_hostile(marker), "out": str(tmp_path / "theirs")})
    res = _run("uqreg", "rerun", study, "--out", str(tmp_path / "r"))
    assert res.returncode == 2 and "pass --yes to run it" in res.stderr
    assert f"uqreg rerun: running: uqreg sweep --config {study} --out {tmp_path / 'r'}" \
        in res.stderr
    assert not marker.exists() and not (tmp_path / "r").exists()

    # the launcher options are the user's, on the command line after the file
    res = _run("uqreg", "rerun", study, "--out", str(tmp_path / "r"), "--yes", "--workers", "1")
    assert f"--out {tmp_path / 'r'} --workers 1" in res.stderr
    _assert_not_taken(res, marker, tmp_path / "r" / "study.nc")
    assert _recorded(tmp_path / "r" / "study.nc")["options"]["workers"] == 1

    res = _run("uqreg", "sweep", "--config", study, "--out", str(tmp_path / "c"))
    _assert_not_taken(res, marker, tmp_path / "c" / "study.nc")


def test_uqvision_rerun_of_a_hostile_result_runs_nothing_it_names(tmp_path):
    marker = tmp_path / "MARKER"
    res = _run("uqvision", "data", "digits", "--out", str(tmp_path / "digits"),
               "--max-per-class", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    # recorded here, by this user (a file of one's own, edited): no --yes needed
    result = _result_file(tmp_path / "scores.nc", "uqvision sweep", {
        "models": ["test_vit"], "random-init": True, "data": str(tmp_path / "digits" / "test"),
        "calibration-size": 0.5, "out": str(tmp_path / "theirs"), **_hostile(marker)},
        host=socket.gethostname(), user=getpass.getuser())
    res = _run("uqvision", "--threads", "1", "rerun", result, "--out", str(tmp_path / "r"))
    assert not marker.exists(), res.stderr[-3000:]
    assert len(list((tmp_path / "r" / "caches").glob("*.nc"))) == 1
    (scores,) = (tmp_path / "r" / "scores").glob("*.nc")
    _assert_not_taken(res, marker, scores)
