"""Runs from a configuration file (uqmetrics.runs.run_config) on a small parser of every kind of
option the two command lines have: the resolved configuration written as TOML reads back to the
same values; the command line overrides the file (a list option replaced, not appended to); the
file's values count as given (they override a preset); a bad file is one error naming the file,
the key and the value; the file is written only when the command wrote its results; result files written while a command runs record its configuration, and a file without one is
refused by rerun with a clear message.
"""

from __future__ import annotations

import argparse
import getpass
import json
import socket
from dataclasses import dataclass

import numpy as np
import pytest
import xarray as xr

from uqmetrics import InputError, provenance_attrs, write_dataset
from uqmetrics.runs.config_options import ConfigOption, add_config_options, given_options
from uqmetrics.runs.run_config import (
    RUN_CONFIG_ATTR,
    add_config_option,
    config_in_by_digest,
    read_config,
    recorded_config,
    recording,
    rerun_argv,
    resolved_config,
    run_recorded,
    write_config_file,
)
from uqmetrics.runs.testing.parsers import ToolParser

_Parser = ToolParser


@dataclass
class _Config:
    batch_size: int = 64
    channels_last: bool = False
    amp: bool = False
    seed: int | None = None


_OPTIONS = (ConfigOption("batch_size", type=int), ConfigOption("channels_last", negatable=True),
            ConfigOption("amp"), ConfigOption("seed", type=int, default=None))


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(t) for t in text.split(","))


def _parser() -> argparse.ArgumentParser:
    top = _Parser(prog="tool")
    sub = top.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run")
    p.add_argument("kind", choices=["a", "b"])
    p.add_argument("--out", required=True)
    p.add_argument("--caches", nargs="+", required=True)
    p.add_argument("--model", action="append")
    p.add_argument("--levels", type=_ints, default=(1, 2))
    p.add_argument("--rate", type=float, default=0.5)
    p.add_argument("--mode", choices=["x", "y"], default="x")
    p.add_argument("--overwrite", action="store_true")
    add_config_options(p, _Config, _OPTIONS)
    add_config_option(p)
    sub.add_parser("list")  # no --config: nothing recorded
    return top


_LINE = ["run", "b", "--out", "o", "--caches", "c1", "c2", "--model", "m1", "--model", "m2",
         "--levels", "1,3,5", "--rate", "0.25", "--mode", "y", "--batch-size", "8",
         "--no-channels-last", "--amp"]


def test_the_resolved_configuration_reads_back_to_the_same_values(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c1").write_text("a cache")
    args = _parser().parse_args(_LINE)
    config = resolved_config(args)
    assert config["command"] == "tool run"
    # where it ran; its paths absolute (out, and what names an existing path: c1, not c2)
    assert (config["host"], config["user"], config["cwd"]) == \
        (socket.gethostname(), getpass.getuser(), str(tmp_path))
    assert config["options"] == {
        "kind": "b", "out": str(tmp_path / "o"), "caches": [str(tmp_path / "c1"), "c2"],
        "model": ["m1", "m2"], "levels": [1, 3, 5], "rate": 0.25, "mode": "y",
        "overwrite": False, "batch-size": 8, "channels-last": False, "amp": True, "seed": None}
    path = write_config_file(tmp_path / "run.config.toml", config)
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temporary file
    assert read_config(path, command="tool run") == {
        k: v for k, v in config["options"].items() if v is not None}  # none: left out
    # a file gives no absolute --out (docs/config.md): the command line gives it
    again = _parser().parse_args(["run", "--config", str(path), "--out", str(tmp_path / "o")])
    assert {k: getattr(again, k) for k in vars(args) if not k.startswith("_")} == \
        {k: getattr(args, k) for k in vars(args) if not k.startswith("_") and
         k not in ("out", "caches")} | {"out": str(tmp_path / "o"),
                                        "caches": [str(tmp_path / "c1"), "c2"]}
    assert resolved_config(again)["options"] == config["options"]


def test_the_command_line_overrides_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_config_file(tmp_path / "f.toml", resolved_config(_parser().parse_args(_LINE)))
    args = _parser().parse_args(["run", "a", "--model", "m9", "--caches", "z",
                                 "--config", str(path), "--batch-size=16", "--channels-last",
                                 "--out", str(tmp_path / "o")])
    assert (args.kind, args.model, args.caches, args.batch_size, args.channels_last) == \
        ("a", ["m9"], ["z"], 16, True)  # a list given replaces the file's, whatever the order
    assert (args.out, args.levels, args.rate, args.amp) == \
        (str(tmp_path / "o"), (1, 3, 5), 0.25, True)
    # the file's values count as given: they override a base configuration (a preset)
    assert {"batch_size", "channels_last", "amp"} <= given_options(args)


def test_a_file_written_by_hand_may_use_underscores_and_give_some_options(tmp_path):
    path = tmp_path / "f.toml"
    path.write_text('[options]\nkind = "a"\nout = "o"\ncaches = ["c"]\nbatch_size = 4\n'
                    'levels = "2,4"\nseed = 7\n')
    args = _parser().parse_args(["run", "--config", str(path)])
    assert (args.batch_size, args.levels, args.seed, args.rate) == (4, (2, 4), 7, 0.5)
    assert given_options(args) == {"batch_size", "seed"}


@pytest.mark.parametrize(("text", "said"), [
    ('[options]\nbatch-sise = 4\n', "unknown key 'batch-sise' = 4 (not an option of tool run"),
    ('[options]\nbatch-size = "four"\n', "key 'batch-size' = \"four\": invalid int value"),
    ('[options]\namp = "yes"\n', "key 'amp' = \"yes\": expected true or false"),
    ('[options]\ncaches = "c"\n', "key 'caches' = \"c\": expected a list"),
    ('[options]\nmode = "z"\n', "key 'mode' = \"z\": choose from x, y"),
    ('[options]\nout = 3\n', "key 'out' = 3: expected a string"),
    ('[options\nout = 3\n', "is not a TOML file"),
    ('seed = 3\n', "unknown key 'seed' = 3 (a configuration file holds"),
    ('command = "tool other"\n', "records a run of 'tool other', not of 'tool run'"),
])
def test_a_bad_file_is_one_error_naming_the_file_key_and_value(tmp_path, capsys, text, said):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["run", "a", "--out", "o", "--caches", "c", "--config", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("tool run: error: argument --config: ") and str(path) in err
    assert said in err and len(err.strip().splitlines()) == 1


def test_a_missing_file_and_a_result_without_a_recorded_run_are_refused(tmp_path):
    with pytest.raises(InputError, match="cannot read .*nope.toml"):
        read_config(tmp_path / "nope.toml")
    result = write_dataset(xr.Dataset({"x": ("i", np.arange(3.0))}), tmp_path / "r.nc")
    with pytest.raises(InputError, match="records no run configuration"):
        read_config(result)
    with pytest.raises(InputError, match="records no run configuration"):
        rerun_argv(result, "tool", out="elsewhere")


def test_results_written_while_a_command_runs_record_it_and_rerun_reads_it(tmp_path,
                                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = _parser().parse_args(_LINE[:1] + ["a", "--out", str(tmp_path / "o"), "--caches", "c"])
    written = []

    def command() -> int:
        ds = xr.Dataset({"x": ("i", np.arange(3.0))})
        written.append(write_dataset(ds, tmp_path / "r.nc", attrs=provenance_attrs(seed=0)))
        return 0

    files = lambda a, config: [config_in_by_digest(a.out, "run", config)]
    assert run_recorded(args, command, files) == 0
    recorded = recorded_config(written[0])
    assert recorded["options"] == resolved_config(args)["options"]
    assert json.loads(xr.open_dataset(written[0]).attrs[RUN_CONFIG_ATTR]) == recorded
    (path,) = (tmp_path / "o").glob("run.*.config.toml")
    assert read_config(path) == {k: v for k, v in recorded["options"].items() if v is not None}
    assert "run_config" not in provenance_attrs()  # only while a command runs
    # rerun: the recorded command, its options from the result, --out overriding them
    assert rerun_argv(written[0], "tool", out="new") == \
        ["run", "--config", str(written[0]), "--out", "new"]
    again = _parser().parse_args(rerun_argv(written[0], "tool", out="new"))
    assert (again.out, again.caches, again.kind) == ("new", ["c"], "a")
    with pytest.raises(InputError, match="would write where its run did"):
        rerun_argv(written[0], "tool")
    # --overwrite writes where the run did only where that holds the result (here it does not)
    with pytest.raises(InputError, match="neither is that file nor holds it"):
        rerun_argv(written[0], "tool", overwrite=True)
    with pytest.raises(InputError, match="re-run it with tool rerun"):
        rerun_argv(written[0], "other", out="new")


def test_the_file_is_written_only_by_a_run_that_wrote_its_results(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "run.config.toml"
    files = lambda a, config: [target]
    line = ["run", "a", "--out", "o", "--caches", "c"]
    assert run_recorded(_parser().parse_args(line), lambda: 0, files) == 0
    first = target.read_text()
    # refused (exit 2, as a command refusing its existing results) or failed: left as it was
    assert run_recorded(_parser().parse_args([*line, "--seed", "2"]), lambda: 2, files) == 2

    def fails() -> int:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError):
        run_recorded(_parser().parse_args([*line, "--seed", "2"]), fails, files)
    assert target.read_text() == first
    # exit 1 (a sweep with failed cells keeps the others): written
    assert run_recorded(_parser().parse_args([*line, "--seed", "2"]), lambda: 1, files) == 1
    assert read_config(target)["seed"] == 2
    ran = []
    with pytest.raises(InputError, match="is a folder where the configuration file goes"):
        run_recorded(_parser().parse_args(line), lambda: ran.append(1) or 0,
                     lambda a, config: [tmp_path])
    assert not ran  # before the command ran


def test_a_command_without_config_runs_as_it_is(tmp_path):
    args = _parser().parse_args(["list"])
    assert resolved_config(args) is None
    with recording(None):
        assert run_recorded(args, lambda: 3, lambda a, c: [tmp_path / "never"]) == 3
    assert not (tmp_path / "never").exists()
