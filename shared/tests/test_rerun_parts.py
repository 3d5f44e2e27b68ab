"""A result made as a part of a larger command (uqmetrics.runs.run_config, issue 37 section 6): a
``tool sweep`` that scores its caches records in the score file the command that makes that
file alone (``tool score``, :func:`derived_config`) and, under ``part_of``, the sweep. A rerun
runs the score (``--out`` a file); ``whole`` runs the sweep, whose ``--config RESULT`` reads the
sweep's record (``--out`` a folder); an ``--out`` of the other kind is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

from uqmetrics import InputError, provenance_attrs, write_dataset
from uqmetrics.runs.run_config import (
    add_config_option,
    current_run_config,
    derived_config,
    recorded_config,
    recording,
    rerun_argv,
    run_recorded,
)
from uqmetrics.runs.testing.parsers import ToolParser


def _parser() -> ToolParser:
    top = ToolParser(prog="tool")
    sub = top.add_subparsers(dest="command", required=True)
    sweep = sub.add_parser("sweep")
    sweep.add_argument("--data", required=True)
    sweep.add_argument("--out", required=True)
    sweep.add_argument("--seed", type=int, default=0)
    add_config_option(sweep)
    score = sub.add_parser("score")
    score.add_argument("--caches", nargs="+", required=True)
    score.add_argument("--out", required=True)
    score.add_argument("--seed", type=int, default=0)
    score.add_argument("--alpha", type=float, default=0.1)
    add_config_option(score)
    return top


def _score_parser() -> ToolParser:
    return _parser()._subparsers._group_actions[0].choices["score"]


@pytest.fixture
def scores(tmp_path, monkeypatch):
    """``tool sweep --data d --out zoo --seed 3``, which writes ``zoo/scores.nc`` recording
    ``tool score`` on its caches, part of the sweep."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    args = _parser().parse_args(["sweep", "--data", "d", "--out", "zoo", "--seed", "3"])

    def sweep() -> int:
        (tmp_path / "zoo" / "caches").mkdir(parents=True)
        target = tmp_path / "zoo" / "scores.nc"
        values = {**vars(args), "caches": [str(tmp_path / "zoo" / "caches")], "out": str(target)}
        with recording(derived_config(_score_parser(), values, part_of=current_run_config())):
            write_dataset(xr.Dataset({"x": ("i", np.arange(3.0))}), target,
                          attrs=provenance_attrs(seed=args.seed))
        return 0

    assert run_recorded(args, sweep) == 0
    return tmp_path / "zoo" / "scores.nc"


def test_the_score_file_records_its_score_and_the_sweep_it_was_part_of(scores, tmp_path):
    run = recorded_config(scores)
    assert run["command"] == "tool score" and run["cwd"] == str(tmp_path)
    assert run["options"] == {"caches": [str(tmp_path / "zoo" / "caches")],
                              "out": str(scores), "seed": 3, "alpha": 0.1}
    assert run["part_of"]["command"] == "tool sweep"
    assert run["part_of"]["options"] == {"data": str(tmp_path / "d"),
                                         "out": str(tmp_path / "zoo"), "seed": 3}
    assert json.loads(xr.open_dataset(scores).attrs["run_config"]) == run


def test_a_rerun_scores_and_whole_reruns_the_sweep(scores, tmp_path):
    argv = rerun_argv(scores, "tool", out="again.nc")
    assert argv == ["score", "--config", str(scores), "--out", "again.nc"]
    again = _parser().parse_args(argv)
    assert (again.command, again.caches, again.seed) == (
        "score", [str(tmp_path / "zoo" / "caches")], 3)
    argv = rerun_argv(scores, "tool", out="zoo2", whole=True)
    assert argv == ["sweep", "--config", str(scores), "--out", "zoo2"]
    again = _parser().parse_args(argv)  # --config reads the sweep's record of the file
    assert (again.command, again.data, again.seed) == ("sweep", str(tmp_path / "d"), 3)


def test_out_is_of_the_recorded_kind_and_whole_needs_a_larger_command(scores, tmp_path):
    with pytest.raises(InputError, match=r"--out 'zoo2': tool score writes a file, .* give a "
                                         r"file name ending in \.nc"):
        rerun_argv(scores, "tool", out="zoo2")
    with pytest.raises(InputError, match=r"--out 'x\.nc': tool sweep writes a folder, .* "
                                         r"give a folder"):
        rerun_argv(scores, "tool", out="x.nc", whole=True)
    (tmp_path / "taken.nc").mkdir()  # named as a file, but a folder
    with pytest.raises(InputError, match="writes a file"):
        rerun_argv(scores, "tool", out=str(tmp_path / "taken.nc"))
    sweep_alone = tmp_path / "alone.nc"  # a result of the sweep itself: part of nothing
    write_dataset(xr.Dataset({"x": ("i", np.arange(3.0))}), sweep_alone, attrs={
        "run_config": json.dumps(recorded_config(scores)["part_of"])})
    with pytest.raises(InputError, match="part of no larger command: rerun it without "
                                         "--with-sweep"):
        rerun_argv(sweep_alone, "tool", out="zoo3", whole=True)
