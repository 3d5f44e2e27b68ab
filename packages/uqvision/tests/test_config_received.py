"""Files received from someone else, read by ``uqvision`` (docs/config.md): a ``--config`` file
never says where results are written (an absolute ``out`` is refused, naming the file, though
``uqvision score``'s ``--out`` is then missing from the command line; a relative one is taken),
nor how or where the work runs (``--device`` and the driver options ``--set threads=``,
``--set workers=`` of ``reproduce`` are named and not taken; every option of that kind of every
command is a launcher option); ``rerun`` refuses a recorded command that cannot be rerun
(``uqvision rerun`` itself ran itself until Python's stack ran out); a trained run's sidecar
gives its preprocessing only (a ``pretrained_cfg`` naming a weight ``file`` or an
``hf_hub_id`` is refused, and a malformed one is one line, not ``KeyError: 'mean'``).
"""

from __future__ import annotations

import argparse
import getpass
import json
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest
import tomli_w
import xarray as xr
from uqmetrics import write_dataset
from uqmetrics.runs.config_options import is_launcher, launcher_keys
from uqmetrics.runs.run_config import read_config

from uqvision.cli import build_parser, main
from uqvision.protocols.base import Reproduction

ARCH = "test_byobnet"  # the architecture of conftest's trained checkpoint


def _toml(path: Path, command: str, **options) -> str:
    path.write_text(tomli_w.dumps({"command": command, "options": options}))
    return str(path)


def test_a_score_file_never_goes_where_a_file_says(tmp_path, monkeypatch, refused,
                                                  write_cache):
    monkeypatch.chdir(tmp_path)
    caches = tmp_path / "caches"
    caches.mkdir()
    rng = np.random.default_rng(0)
    write_cache(caches, rng.normal(size=(40, 3)), rng.integers(0, 3, 40), model="m")
    victim = tmp_path / "home" / ".config" / "autostart"
    config = _toml(tmp_path / "their.toml", "uqvision score selective", caches=[str(caches)],
                   out=str(victim / "s.nc"))
    line = refused(["score", "selective", "--config", config])
    assert line.startswith(f"uqvision score selective: error: argument --config: {config!r}: "
                           f"key 'out' = \"{victim / 's.nc'}\" is an absolute path: ")
    assert not victim.exists()
    # a relative out: taken (no --out on the command line needed), written here
    config = _toml(tmp_path / "mine.toml", "uqvision score selective", caches=[str(caches)],
                   out="scores/s.nc", **{"calibration-size": 0.5})
    assert main(["score", "selective", "--config", config]) == 0
    assert read_config(tmp_path / "scores" / "s.config.toml")["out"] == \
        str(tmp_path / "scores" / "s.nc")


def test_reproduce_takes_no_thread_count_nor_device_from_a_file(tmp_path, monkeypatch,
                                                               capsys):
    """The audit's ``set = ["workers=4", "threads=7"]``: workers was left out, threads=7 ran."""
    from uqvision.protocols.selective import reproduce as selective

    runs = []

    def run(out, **kwargs):  # the driver, recording what it is given
        runs.append(kwargs)
        Path(out).mkdir(parents=True, exist_ok=True)
        return Path(out) / "summary.md"

    monkeypatch.setattr(selective, "REPRODUCTION", Reproduction(
        "selective", selective.DESCRIPTION, run, selective.REPRODUCTION.scales))
    monkeypatch.chdir(tmp_path)
    config = _toml(tmp_path / "their_repro.toml", "uqvision reproduce selective", out="r",
                   scale="smoke", device="cuda", set=["workers=4", "threads=7", "epochs=1"])
    assert main(["reproduce", "selective", "--config", config]) == 0
    assert runs[-1]["options"] == {"epochs": "1"} and runs[-1]["device"] == "cpu"
    left = capsys.readouterr().err.split("not taken from the file: ")[1]
    assert all(said in left for said in ('--device "cuda"', '--set "workers=4"',
                                         '--set "threads=7"'))
    # the command line gives them
    assert main(["reproduce", "selective", "--config", config, "--set", "threads=2",
                 "--device", "cpu"]) == 0
    assert runs[-1]["options"] == {"threads": "2"} and runs[-1]["device"] == "cpu"


def _commands(parser: argparse.ArgumentParser):
    """Every command of ``parser`` (its sub-commands' too) that reads ``--config``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from _commands(sub)
    if any(a.option_strings == ["--config"] for a in parser._actions):
        yield parser


def test_every_option_saying_where_and_how_the_work_runs_is_a_launcher_option():
    """A new command's --device, --workers, thread count or --set threads= would otherwise be
    taken from a file again."""
    commands = list(_commands(build_parser()))
    assert len(commands) > 20
    for parser in commands:
        for action in parser._actions:
            flags = [s for s in action.option_strings if s.startswith("--")]
            if any(word in flag for flag in flags for word in ("device", "worker", "thread",
                                                               "gpus", "cluster", "jobs")):
                assert is_launcher(action), (parser.prog, flags)
            if "--set" in flags and parser.prog.startswith("uqvision reproduce"):
                assert launcher_keys(action) == {"workers", "threads"}, parser.prog


@pytest.mark.parametrize("command", ["uqvision rerun", "uqvision plot", "uqvision score"])
def test_rerun_refuses_a_recorded_command_that_cannot_be_rerun(tmp_path, refused, command):
    path = tmp_path / "r.nc"
    record = {"command": command, "host": socket.gethostname(), "user": getpass.getuser(),
              "options": {"result": str(path), "out": str(tmp_path / "o.nc")}}
    write_dataset(xr.Dataset({"x": ("i", np.arange(3.0))}), path,
                  attrs={"run_config": json.dumps(record)})
    assert refused(["rerun", path, "--out", tmp_path / "x.nc"]) == (
        f"uqvision rerun: error: {str(path)!r}: its recorded command {command!r} cannot be "
        "rerun: it is not a uqvision command that reads --config")


@pytest.fixture
def images(digits, tmp_path):
    """One image of each class of the digits test folder."""
    root = tmp_path / "images"
    for c in sorted(p.name for p in (digits / "test").iterdir()):
        (root / c).mkdir(parents=True)
        first = min((digits / "test" / c).iterdir())
        shutil.copy(first, root / c / first.name)
    return root


@pytest.mark.parametrize(("pretrained_cfg", "said"), [
    ({"file": "/tmp/evil.pth"}, "names ['file'], which are not preprocessing fields"),
    ({"hf_hub_id": "attacker/x"}, "names ['hf_hub_id'], which are not preprocessing fields"),
    ({"input_size": [3, 16, 16], "std": [0.5, 0.5, 0.5]},
     "'mean' must be a list of numbers (the preprocessing uqvision train recorded), got None"),
    ({"input_size": [3, 16], "mean": [0.5] * 3, "std": [0.5] * 3},
     "'input_size' must be [channels, height, width]"),
    ({"input_size": [3, 16, 16], "mean": [0.5] * 3, "std": [0.5] * 3, "crop_pct": "x"},
     "'crop_pct' = 'x' is not a number"),
])
def test_a_trained_runs_sidecar_gives_its_preprocessing_only(edited_run, images, tmp_path,
                                                             refused, pretrained_cfg, said):
    checkpoint, sidecar = edited_run(pretrained_cfg, keep="file" in pretrained_cfg)
    assert json.loads(sidecar.read_text())["method"]  # a trained run: read back through its method
    line = refused(["predict", "--model", f"{ARCH}={checkpoint}",
                    "--data", images, "--out", tmp_path / "caches"])
    assert f"sidecar {str(sidecar)!r}: pretrained_cfg" in line and said in line
    assert not list(tmp_path.glob("caches/*.nc"))
