"""What a file may carry into a run (uqmetrics.runs.run_config; docs/conventions.md#rerun-rules), on
a small tool whose command has the cluster options every sweep command has
(uqmetrics.runs.sweep.add_cluster_options) and a worker count of its own:

- a result file (.nc) never gives a launcher option (cluster, cluster options, job count,
  scheduler, dashboard, worker and thread counts) nor ``overwrite``; the options it did not give
  are named in one line; a TOML file (the user's own) gives launcher options, named in one line,
  but never ``overwrite``;
- a key given in its two spellings, and any error of an option's type, are one line naming the
  file, the key and the value;
- a run records where it ran (host, user, folder) and its paths absolute; a result file's
  relative path that would name other files here is refused, and so is an input the file
  records whose checksum changed;
- ``rerun`` prints the command it runs, and runs one recorded by another user or on another
  host (or a file that records neither) only with ``yes``.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import xarray as xr

from uqmetrics import InputError, input_checksum, provenance_attrs, read_dataset, write_dataset
from uqmetrics.runs.config_options import is_launcher, mark_launcher
from uqmetrics.runs.run_config import (
    RUN_CONFIG_ATTR,
    add_config_option,
    config_origin,
    recorded_config,
    rerun,
    run_recorded,
)
from uqmetrics.runs.sweep import add_cluster_options
from uqmetrics.runs.testing.parsers import ToolParser

_Parser = ToolParser


def _parser() -> argparse.ArgumentParser:
    top = _Parser(prog="tool")
    sub = top.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sweep")
    p.add_argument("--out", required=True)
    p.add_argument("--caches", nargs="+", default=None)
    p.add_argument("--rate", type=float, default=0.5)
    p.add_argument("--count", type=lambda text: int(float(text)), default=1)
    p.add_argument("--overwrite", action="store_true")
    add_cluster_options(p)
    mark_launcher(p.add_argument("--threads-per-worker", type=int, default=1))
    add_config_option(p)
    return top


#: The cluster options of a hostile result file: a queue job whose script runs a command.
_HOSTILE = {"cluster": "jobqueue-local", "cluster-option": ["cores=1", "memory=1GB",
                                                            "job_script_prologue=touch /x"],
            "jobs": 3, "scheduler": None, "workers": 7, "dashboard": ":8787",
            "threads-per-worker": 5, "gpus": "all"}


def _result(path, options: dict, caches: dict | None = None, **meta) -> str:
    """A result file whose ``run_config`` attr records ``tool sweep`` with ``options`` (and
    ``meta``: host, user, cwd), written by the project's write path."""
    record = {"command": "tool sweep", "version": "0", "git_commit": "unknown",
              "git_dirty": None, **meta, "options": options}
    attrs = {RUN_CONFIG_ATTR: json.dumps(record)}
    if caches is not None:
        attrs["caches"] = json.dumps(caches)
    write_dataset(xr.Dataset({"x": ("i", np.arange(3.0))}), path, attrs=attrs, overwrite=True)
    return str(path)


def test_the_cluster_options_are_launcher_options():
    p = _parser()
    sweep = p._subparsers._group_actions[0].choices["sweep"]
    assert sorted(a.dest for a in sweep._actions if is_launcher(a)) == sorted(
        ["scheduler", "workers", "gpus", "cluster", "cluster_option", "cluster_config", "jobs",
         "gpus_per_job", "dashboard", "threads_per_worker"])


def test_a_result_file_gives_no_launcher_option_and_never_overwrite(tmp_path, capsys):
    result = _result(tmp_path / "r.nc", {"out": str(tmp_path / "o"), "rate": 0.25,
                                         "overwrite": True, **_HOSTILE})
    args = _parser().parse_args(["sweep", "--config", result, "--out", "o"])
    assert args.rate == 0.25  # what is computed: taken
    assert (args.cluster, args.cluster_option, args.jobs, args.workers, args.dashboard,
            args.threads_per_worker, args.overwrite, args.gpus) == ("local", None, 1, 2, None,
                                                                    1, False, None)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"tool sweep: --config {result}: not taken from the file: ")
    assert '--cluster "jobqueue-local"' in line and "job_script_prologue=touch /x" in line
    assert "--jobs 3" in line and "--workers 7" in line and "--overwrite" in line
    assert '--gpus "all"' in line
    # the command line gives them
    args = _parser().parse_args(["sweep", "--config", result, "--out", "o", "--workers", "3",
                                 "--overwrite"])
    assert (args.workers, args.overwrite) == (3, True)
    assert "--workers" not in capsys.readouterr().err


def test_a_result_file_gives_no_launcher_key_of_a_key_value_option(tmp_path, capsys):
    """``uqvision reproduce --set workers=8`` holds a worker count among what is computed:
    only the launcher keys' pairs are left out of a result file's options, and named."""
    top = _parser()
    sweep = top._subparsers._group_actions[0].choices["sweep"]
    mark_launcher(sweep.add_argument("--set", action="append"), keys=("workers",))
    result = _result(tmp_path / "r.nc", {"out": str(tmp_path / "o"),
                                         "set": ["members=3", "workers=8"]})
    assert top.parse_args(["sweep", "--config", result, "--out", "o"]).set == ["members=3"]
    assert '--set "workers=8"' in capsys.readouterr().err
    only = _result(tmp_path / "w.nc", {"out": str(tmp_path / "o"), "set": ["workers=8"]})
    assert top.parse_args(["sweep", "--config", only, "--out", "o"]).set is None
    path = tmp_path / "mine.toml"  # nor a TOML file: the command line gives it
    path.write_text('[options]\nout = "o"\nset = ["members=3", "workers=8"]\n')
    assert top.parse_args(["sweep", "--config", str(path)]).set == ["members=3"]
    assert top.parse_args(["sweep", "--config", str(path), "--set", "workers=8"]).set == \
        ["workers=8"]


@pytest.mark.parametrize("pair", [" workers=8", "workers =8", "workers\t=8"])
def test_a_launcher_key_spelled_with_spaces_is_still_a_launcher_key(tmp_path, capsys, pair):
    """The ``--set`` option reads its key stripped (``uqvision.options.set_pairs``), so that
    ``' workers=8'`` sets ``workers``: such a pair in a result file was taken, a worker count
    coming from a file. It is left out and named as ``workers=8`` is."""
    top = _parser()
    sweep = top._subparsers._group_actions[0].choices["sweep"]
    mark_launcher(sweep.add_argument("--set", action="append"), keys=("workers",))
    result = _result(tmp_path / "r.nc", {"out": str(tmp_path / "o"), "set": ["members=3", pair]})
    assert top.parse_args(["sweep", "--config", result, "--out", "o"]).set == ["members=3"]
    assert f"--set {json.dumps(pair)}" in capsys.readouterr().err


def test_a_run_record_nested_past_the_stack_is_a_damaged_attr_named(tmp_path, capsys):
    """A result file whose ``run_config`` is JSON nested past Python's stack (``[[[...``)
    raised a bare ``RecursionError`` from ``--config FILE.nc`` and ``rerun``; it is a damaged
    attr, named with the file, in one line."""
    path = tmp_path / "r.nc"
    write_dataset(xr.Dataset({"x": ("i", np.arange(3.0))}), path,
                  attrs={RUN_CONFIG_ATTR: "[" * 100_000 + "]" * 100_000})
    with pytest.raises(InputError, match=f"{str(path)!r}: its 'run_config' attr is damaged"):
        recorded_config(path)
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["sweep", "--config", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "attr is damaged" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("where", ["none", "here", "elsewhere"])
def test_a_toml_file_gives_no_launcher_option_and_never_overwrite(tmp_path, monkeypatch, capsys,
                                                                 where):
    """A TOML file is data too: the one a command writes beside its results travels with
    them, and what it records of itself (``host``, ``user``) proves nothing (a file from
    someone else with those lines removed, or with this host and user written in, read as the
    user's own, and its ``--cluster-option python=...`` ran as the workers' interpreter). So
    no TOML file gives a launcher option, whatever it records; the command line gives them."""
    import socket

    from uqmetrics.runs import run_config

    monkeypatch.setattr(run_config, "_user", lambda: "alice")
    meta = {"none": "", "here": f'host = "{socket.gethostname()}"\nuser = "alice"\n',
            "elsewhere": 'host = "elsewhere"\nuser = "mallory"\n'}[where]
    path = tmp_path / "theirs.config.toml"
    path.write_text(f'command = "tool sweep"\n{meta}[options]\nout = "o"\nrate = 0.25\n'
                    'overwrite = true\n'
                    + "".join(f"{k} = {json.dumps(v)}\n" for k, v in _HOSTILE.items()
                              if v is not None))
    args = _parser().parse_args(["sweep", "--config", str(path)])
    assert args.rate == 0.25  # what is computed: taken
    assert (args.cluster, args.cluster_option, args.jobs, args.workers, args.dashboard,
            args.overwrite) == ("local", None, 1, 2, None, False)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"tool sweep: --config {path}: not taken from the file: ")
    assert '--cluster "jobqueue-local"' in line and "job_script_prologue=touch /x" in line
    assert "--jobs 3" in line and "--workers 7" in line and "--overwrite" in line
    assert line.endswith("(launcher options come from the command line only: a file, a result "
                         "or a TOML configuration, is data and never says where or how the "
                         "work runs; --overwrite comes from the command line only)")
    # the command line gives them
    args = _parser().parse_args(["sweep", "--config", str(path), "--cluster", "jobqueue-local",
                                 "--jobs", "2", "--overwrite"])
    assert (args.cluster, args.jobs, args.overwrite) == ("jobqueue-local", 2, True)
    assert "--jobs" not in capsys.readouterr().err


def test_config_origin_names_the_file_and_its_key_of_each_value_it_gave(tmp_path):
    """What a value's error names: the file and the key as the file writes it, for a value the
    file gave; nothing for one the command line gave (it replaces the file's) or a default."""
    path = tmp_path / "mine.toml"
    path.write_text('[options]\nout = "o"\nrate = 0.25\ncount = 3\n')
    args = _parser().parse_args(["sweep", "--config", str(path), "--count", "4"])
    assert config_origin(args, "rate") == (str(path), "rate")
    assert config_origin(args, "count") is None and args.count == 4
    assert config_origin(args, "overwrite") is None  # a default
    path.write_text('[options]\nout = "o"\nthreads_per_worker = 1\n')
    args = _parser().parse_args(["sweep", "--config", str(path)])
    assert config_origin(args, "out") == (str(path), "out")
    assert config_origin(args, "threads_per_worker") is None  # a launcher: never taken


@pytest.mark.parametrize(("text", "said"), [
    ('[options]\nrate = 0.1\nrate = 0.2\n', "is not a TOML file"),  # TOML's own rule
    ('[options]\nthreads-per-worker = 2\nthreads_per_worker = 3\n',
     ("keys 'threads-per-worker' and 'threads_per_worker' are one option "
      "(--threads-per-worker): give it once")),
    ('[options]\ncount = inf\n', "key 'count' = inf: invalid <lambda> value: 'inf'"),
    ('[options]\ncount = 1e400\n', "key 'count' = inf: invalid <lambda> value: 'inf'"),
])
def test_two_spellings_of_a_key_and_any_error_of_a_type_are_one_line(tmp_path, capsys, text,
                                                                     said):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["sweep", "--out", "o", "--config", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("tool sweep: error: argument --config: ") and str(path) in err
    assert said in err and len(err.strip().splitlines()) == 1


def _cache(path, value: float) -> tuple[str, str]:
    """A cache (a file with a ``checksum`` attr, as uqvision's) and its checksum."""
    ds = xr.Dataset({"logits": ("i", np.full(3, value))})
    ds.attrs["checksum"] = input_checksum(ds)
    write_dataset(ds, path, overwrite=True)
    return str(path.resolve()), input_checksum(read_dataset(path))


def _scored_in(folder, monkeypatch) -> str:
    """``tool sweep --caches caches --out o`` run in ``folder`` (relative paths), writing a
    result that records its caches and their checksums, as the scoring commands do."""
    monkeypatch.chdir(folder)
    (folder / "caches").mkdir()
    path, checksum = _cache(folder / "caches" / "m.nc", 1.0)
    args = _parser().parse_args(["sweep", "--caches", "caches", "--out", "o"])

    def command() -> int:
        attrs = provenance_attrs(seed=0)
        attrs["caches"] = json.dumps({path: checksum})
        write_dataset(xr.Dataset({"x": ("i", np.arange(3.0))}), folder / "r.nc", attrs=attrs)
        return 0

    assert run_recorded(args, command) == 0
    return str(folder / "r.nc")


def test_paths_are_recorded_absolute_and_a_rerun_elsewhere_reads_the_same_inputs(tmp_path,
                                                                                monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    result = _scored_in(a, monkeypatch)
    recorded = recorded_config(result)
    assert recorded["cwd"] == str(a)
    assert recorded["options"]["caches"] == [str(a / "caches")]
    assert recorded["options"]["out"] == str(a / "o")
    monkeypatch.chdir(b)
    (b / "caches").mkdir()
    _cache(b / "caches" / "m.nc", 2.0)  # other caches, where "caches" names them here
    args = _parser().parse_args(["sweep", "--config", result, "--out", "o"])
    assert args.caches == [str(a / "caches")]


def test_a_relative_path_of_a_file_that_records_no_folder_is_refused_elsewhere(tmp_path,
                                                                              monkeypatch,
                                                                              capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    result = _scored_in(a, monkeypatch)
    # as an earlier version recorded it: relative paths, no folder, no host or user
    with xr.open_dataset(result) as ds:
        caches = json.loads(ds.attrs["caches"])
    _result(result, {"out": "o", "caches": ["caches"]}, caches)
    monkeypatch.chdir(b)
    (b / "caches").mkdir()
    _cache(b / "caches" / "m.nc", 2.0)
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["sweep", "--config", result])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"{result!r} records --caches 'caches', a path relative to a folder the file does " \
           f"not record; here it names {str(b / 'caches')!r}" in err
    assert len(err.strip().splitlines()) == 1
    # given on the command line: the user's choice
    assert _parser().parse_args(["sweep", "--config", result, "--caches", "caches"]).caches == \
        ["caches"]


def test_an_input_whose_checksum_changed_is_refused_before_anything_runs(tmp_path,
                                                                        monkeypatch, capsys):
    result = _scored_in(tmp_path, monkeypatch)
    assert _parser().parse_args(["sweep", "--config", result, "--out", "o"]).caches == \
        [str(tmp_path / "caches")]
    _cache(tmp_path / "caches" / "m.nc", 3.0)  # another model's cache in its place
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["sweep", "--config", result, "--out", "o"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"was computed from {str(tmp_path / 'caches' / 'm.nc')!r} (checksum " in err
    assert "now has checksum" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "caches" / "m.nc").unlink()
    with pytest.raises(SystemExit):
        _parser().parse_args(["sweep", "--config", result, "--out", "o"])
    assert "no longer exists" in capsys.readouterr().err
    # not read by this run: its caches given on the command line
    assert _parser().parse_args(["sweep", "--config", result, "--out", "o", "--caches",
                                 "x"]).caches == ["x"]


def test_rerun_prints_the_command_and_needs_yes_for_one_recorded_elsewhere(tmp_path,
                                                                          monkeypatch, capsys):
    result = _scored_in(tmp_path, monkeypatch)
    ran = []

    def run(argv):
        ran.append(_parser().parse_args(argv))
        return 0

    assert rerun(result, "tool", run, parser=_parser(), out="new", options=["--workers", "1"]) == 0
    err = capsys.readouterr().err
    assert f"tool rerun: running: tool sweep --config {result} --out new --workers 1" in err
    assert (ran[-1].out, ran[-1].workers) == ("new", 1)
    recorded = recorded_config(result)
    for meta in ({**recorded, "host": "elsewhere"}, {**recorded, "user": "someone-else"},
                 {k: v for k, v in recorded.items() if k not in ("host", "user")}):
        with xr.open_dataset(result) as ds:
            caches = json.loads(ds.attrs["caches"])
        _result(result, meta["options"], caches,
                **{k: v for k, v in meta.items() if k in ("host", "user", "cwd")})
        with pytest.raises(InputError, match="pass --yes to run it"):
            rerun(result, "tool", run, parser=_parser(), out="new")
        assert "tool rerun: running: tool sweep" in capsys.readouterr().err  # printed first
        assert rerun(result, "tool", run, parser=_parser(), out="new", yes=True) == 0


def test_a_toml_written_by_a_run_records_where_it_ran(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = _parser().parse_args(["sweep", "--out", "o", "--workers", "3"])
    assert run_recorded(args, lambda: 0, lambda a, c: [tmp_path / "s.toml"]) == 0
    text = (tmp_path / "s.toml").read_text()
    assert f'cwd = "{tmp_path}"' in text and "host = " in text and "user = " in text
    assert f'out = "{tmp_path / "o"}"' in text


def test_rerun_refuses_options_smuggled_into_the_recorded_command(tmp_path):
    """The recorded ``command`` is the tool and its sub-command names; a file whose command
    carries options (``tool sweep --cluster jobqueue-local ...``) would hand them to the parser
    beside what the file may give: refused before anything runs."""
    path = tmp_path / "r.nc"
    record = {"command": "tool sweep --cluster jobqueue-local --cluster-option "
                         "job_script_prologue=touch", "options": {"out": str(tmp_path)}}
    write_dataset(xr.Dataset({"x": ("i", np.arange(3.0))}), path,
                  attrs={RUN_CONFIG_ATTR: json.dumps(record)})
    ran = []
    with pytest.raises(InputError, match="is not a tool command"):
        rerun(path, "tool", ran.append, parser=_parser(), out=str(tmp_path / "o"), yes=True)
    assert ran == []
