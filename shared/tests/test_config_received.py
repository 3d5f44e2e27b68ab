"""A configuration file received from someone else is data (uqmetrics.runs.run_config;
docs/config.md), on a small tool whose commands have ``--out`` as the two command lines do:

- an output path (``out``) is taken from a file, TOML or result, only relative and without
  ``..``, and resolves in the folder the command runs in (a result file's too, never against
  the folder it records); any other is refused in one line naming the file, the key and the
  value, unless ``--out`` is on the command line; a ``--out`` the command line must give
  stays so unless the file gives an acceptable one (the refusal names the file, not argparse's
  "required" line);
- ``rerun`` always gives ``--out`` on the command line it builds: the user's, or with
  ``overwrite`` the recorded one where it is the result file or a folder holding it;
- ``rerun`` refuses a recorded command that does not read ``--config`` (``rerun`` itself, which
  would run itself until the stack ran out) before anything runs.
"""

from __future__ import annotations

import getpass
import json
import socket

import numpy as np
import pytest
import xarray as xr

from uqmetrics import InputError, write_dataset
from uqmetrics.runs.run_config import RUN_CONFIG_ATTR, add_config_option, rerun, rerun_argv
from uqmetrics.runs.testing.parsers import ToolParser


def _parser() -> ToolParser:
    top = ToolParser(prog="tool")
    sub = top.add_subparsers(dest="command", required=True)
    score = sub.add_parser("score")  # --out required, as uqvision score's
    score.add_argument("--out", required=True)
    score.add_argument("--rate", type=float, default=0.5)
    score.add_argument("--overwrite", action="store_true")
    add_config_option(score)
    study = sub.add_parser("study")  # --out optional, as uqreg study's
    study.add_argument("--out", default=None)
    study.add_argument("--rate", type=float, default=0.5)
    study.add_argument("--overwrite", action="store_true")
    add_config_option(study)
    again = sub.add_parser("rerun")  # reads no --config: runs what a file records
    again.add_argument("file")
    again.add_argument("--out")
    plot = sub.add_parser("plot")
    plot.add_argument("file")
    plot.add_argument("--out")
    return top


def _result(path, command: str, options: dict, **meta) -> str:
    """A result file recording a run of ``command`` with ``options`` (and ``meta``: cwd)."""
    record = {"command": command, "host": socket.gethostname(), "user": getpass.getuser(),
              **meta, "options": options}
    write_dataset(xr.Dataset({"x": ("i", np.arange(3.0))}), path,
                  attrs={RUN_CONFIG_ATTR: json.dumps(record)}, overwrite=True)
    return str(path)


def _refused(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(argv)
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("command", ["score", "study"])
@pytest.mark.parametrize(("value", "why"), [
    ("/home/you/.config/autostart", "is an absolute path"),
    ("~/.config/autostart", "is a path in a home folder"),
    ("../autostart", "is a path with '..'"),
    ("results/../../autostart", "is a path with '..'"),
])
def test_an_output_path_outside_the_folder_is_refused_naming_the_file(tmp_path, capsys,
                                                                     command, value, why):
    path = tmp_path / "their.config.toml"
    path.write_text(f'[options]\nout = {json.dumps(value)}\nrate = 0.25\n')
    line = _refused(capsys, [command, "--config", str(path)])
    assert line.startswith(f"tool {command}: error: argument --config: {str(path)!r}: key "
                           f"'out' = {json.dumps(value)} {why}: ")
    assert line.endswith("give --out on the command line, which is taken")
    # the command line's --out is taken, the file's other options too, and nothing is said
    args = _parser().parse_args([command, "--config", str(path), "--out", "mine"])
    assert (args.out, args.rate) == ("mine", 0.25)
    assert capsys.readouterr().err == ""


def test_a_result_file_gives_no_absolute_out_and_a_relative_one_resolves_here(tmp_path,
                                                                             monkeypatch,
                                                                             capsys):
    elsewhere, here = tmp_path / "elsewhere", tmp_path / "here"
    elsewhere.mkdir()
    here.mkdir()
    monkeypatch.chdir(here)
    absolute = _result(tmp_path / "a.nc", "tool score", {"out": str(elsewhere / "s.nc")})
    assert "key 'out' = " in _refused(capsys, ["score", "--config", absolute])
    # relative: in the folder the command runs in, not the one the file records
    relative = _result(tmp_path / "r.nc", "tool score", {"out": "s.nc", "rate": 0.25},
                       cwd=str(elsewhere))
    args = _parser().parse_args(["score", "--config", relative])
    assert (args.out, args.rate) == ("s.nc", 0.25)


def test_a_relative_out_from_a_toml_file_is_taken_and_no_longer_required(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('[options]\nout = "results/s.nc"\n')
    assert _parser().parse_args(["score", "--config", str(path)]).out == "results/s.nc"
    path.write_text('[options]\nrate = 0.25\n')  # no out at all: --out is still required
    with pytest.raises(SystemExit):
        _parser().parse_args(["score", "--config", str(path)])


def test_rerun_with_overwrite_gives_the_recorded_out_only_where_it_holds_the_result(tmp_path):
    folder = tmp_path / "q"
    folder.mkdir()
    inside = _result(folder / "study.nc", "tool study", {"out": str(folder), "overwrite": False})
    argv = rerun_argv(inside, "tool", overwrite=True, parser=_parser())
    assert argv == ["study", "--config", inside, "--out", str(folder), "--overwrite"]
    assert _parser().parse_args(argv).out == str(folder)  # given on the command line: taken
    score = _result(tmp_path / "s.nc", "tool score", {"out": str(tmp_path / "s.nc")})
    assert rerun_argv(score, "tool", overwrite=True)[3:5] == ["--out", str(tmp_path / "s.nc")]
    moved = _result(tmp_path / "m.nc", "tool study", {"out": "/home/you/.config/autostart"})
    with pytest.raises(InputError, match=r"the --out it records \('/home/you/.config/"
                                         r"autostart'\) neither is that file nor holds it"):
        rerun_argv(moved, "tool", overwrite=True)
    assert rerun_argv(moved, "tool", out="mine")[-2:] == ["--out", "mine"]


@pytest.mark.parametrize("command", ["tool rerun", "tool plot", "tool nope", "tool"])
def test_rerun_refuses_a_recorded_command_that_reads_no_config(tmp_path, command):
    path = _result(tmp_path / "r.nc", command, {"out": str(tmp_path / "o")})
    ran = []
    with pytest.raises(InputError) as exc:
        rerun(path, "tool", ran.append, parser=_parser(), out=str(tmp_path / "x"), yes=True)
    assert str(exc.value) == (f"{path!r}: its recorded command {command!r} cannot be rerun: it "
                              "is not a tool command that reads --config")
    assert ran == []
