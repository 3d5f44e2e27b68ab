"""A configuration file received from someone else, run by ``uqreg`` (docs/config.md): it never
says where the study is written (an absolute ``out``, or one with ``..``, is refused before any
training and nothing is written there), nor how it runs (``--parallel-chunks``, the threads
that train chunks at once, and ``--device`` are launcher options: named on stderr, not taken,
given on the command line, a rerun's too); ``rerun --overwrite`` replaces the study where its
file lies; a result file whose recorded command cannot be rerun (``uqreg rerun`` itself, which
ran itself until Python's stack ran out) is refused in one line.
"""

from __future__ import annotations

import getpass
import json
import socket

import numpy as np
import pytest
import tomli_w
import xarray as xr
from uqmetrics import write_dataset
from uqmetrics.runs.run_config import read_config

from uqreg import cli

#: A study of seconds (the audit's: one level, one method, tiny networks).
SMALL = {"task": "sinusoid", "complexities": "1", "methods": "blr", "repetitions": 2,
         "members": 2, "epochs": 5, "no-plots": True, "quiet": True}


def _their(path, **options) -> str:
    """A configuration file as someone else may have written it: ``uqreg study``'s, with
    ``options`` over :data:`SMALL`."""
    path.write_text(tomli_w.dumps({"command": "uqreg study", "host": "their-host",
                                   "user": "them", "options": {**SMALL, **options}}))
    return str(path)


@pytest.mark.parametrize("out", ["home/.config/autostart", "../escaped"])
def test_a_file_never_says_where_the_study_is_written(tmp_path, monkeypatch, capsys, out):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    target = tmp_path / out if out.startswith("home") else work / out
    config = _their(tmp_path / "their.config.toml", out=str(target) if out.startswith("home")
                    else out)
    with pytest.raises(SystemExit) as exc:
        cli.main(["study", "--config", config])
    assert exc.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"uqreg study: error: argument --config: {config!r}: key 'out' = ")
    assert "give --out on the command line" in line
    assert not target.resolve().exists()


def test_launcher_options_of_a_file_are_not_taken_and_a_rerun_gives_them(tmp_path,
                                                                        monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = _their(tmp_path / "their.config.toml", out="mine", **{"parallel-chunks": 7},
                    device="cuda:0")
    assert cli.main(["study", "--config", config]) == 0
    err = capsys.readouterr().err
    assert f"uqreg study: --config {config}: not taken from the file: --parallel-chunks 7, " \
           '--device "cuda:0" (launcher options come from the command line only' in err
    study = tmp_path / "mine" / "study.nc"  # relative: in the folder the command ran in
    recorded = read_config(tmp_path / "mine" / "study.config.toml")
    assert "parallel-chunks" not in recorded and "device" not in recorded  # not set
    # rerun: --overwrite replaces the study where its file lies; the command line gives the
    # launcher options (a study run on a GPU is rerun there with --device cuda)
    assert cli.main(["rerun", str(study), "--overwrite", "--parallel-chunks", "1",
                     "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert f"uqreg rerun: running: uqreg study --config {study} --out {study.parent} " \
           "--overwrite --parallel-chunks 1 --device cpu" in err
    recorded = read_config(tmp_path / "mine" / "study.config.toml")
    assert (recorded["parallel-chunks"], recorded["device"]) == (1, "cpu")
    assert cli.main(["rerun", str(study), "--out", str(tmp_path / "again")]) == 0
    left = capsys.readouterr().err.split("not taken from the file: ")[1]
    assert "--parallel-chunks 1" in left and '--device "cpu"' in left


@pytest.mark.parametrize("command", ["uqreg rerun", "uqreg plot"])
def test_rerun_refuses_a_recorded_command_that_cannot_be_rerun(tmp_path, capsys, command):
    path = tmp_path / "study.nc"
    record = {"command": command, "host": socket.gethostname(), "user": getpass.getuser(),
              "options": {"file": str(path), "out": str(tmp_path)}}
    write_dataset(xr.Dataset({"x": ("i", np.arange(3.0))}), path,
                  attrs={"run_config": json.dumps(record)})
    assert cli.main(["rerun", str(path), "--out", str(tmp_path / "x")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (f"uqreg rerun: error: {str(path)!r}: its recorded command {command!r} "
                    "cannot be rerun: it is not a uqreg command that reads --config")
    assert not (tmp_path / "x").exists()
