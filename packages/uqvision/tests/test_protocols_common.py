"""Every registered protocol, driven by :data:`uqvision.protocols.VISION_PROTOCOLS` (as
``shared/tests/test_common.py`` is driven by ``uqmetrics.METRICS``): a protocol registered
there is complete, is in the import contracts, is offered by the command line, and runs at
smoke scale, its results scored through ``uqvision score``. A protocol registered by a test
alone (``toy``) plugs into every command: adding a protocol touches nothing outside its folder
but the one registration line. The smoke runs are shared with each protocol's own tests
(``conftest.smoke_run``), so this file adds the scoring only."""

from __future__ import annotations

import argparse
import configparser
import dataclasses
import fnmatch
import importlib
import inspect
import itertools
import pkgutil
import re
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import uqvision.protocols
from uqvision import cli
from uqvision.cli import COMMANDS, build_parser, main
from uqvision.evalsets import ROLES
from uqvision.methods import GENERAL_METHODS
from uqvision.protocols import (
    VISION_PROTOCOLS,
    Plots,
    Protocol,
    ReproduceFlags,
    ReproduceOptions,
    Reproduction,
    ScoreTable,
    SweepScoring,
    score_protocol,
)
from uqvision.roles import SET_ROLES
from uqvision.training.method import TRAINING_METHODS

NAMES = VISION_PROTOCOLS.names()
#: The protocols of this package (a plugin registered from another package is not in its
#: import contracts).
BUILT_IN = [n for n in NAMES if n not in getattr(VISION_PROTOCOLS, "plugins", {})]
IMPORTLINTER = Path(__file__).resolve().parents[3] / ".importlinter"


def _subparsers(parser):
    return next(a for a in parser._actions if a.dest in ("command", "protocol", "name")
                and a.choices)


def _command(name: str):
    return _subparsers(build_parser()).choices[name]


def _choices(command: str) -> list[str]:
    return list(_subparsers(_command(command)).choices)


def _options(add) -> dict[str, argparse.Action]:
    """The options ``add(parser)`` adds, by flag."""
    p = argparse.ArgumentParser(add_help=False)
    add(p)
    return {s: a for a in p._actions for s in a.option_strings}


def test_every_protocol_folder_is_registered():
    """The folders of uqvision/protocols that build a PROTOCOL are the registry's built-in
    protocols (a folder left unregistered, or a registration without a folder, fails here)."""
    folders = [m.name for m in pkgutil.iter_modules(uqvision.protocols.__path__) if m.ispkg]
    with_protocol = [f for f in folders
                     if hasattr(importlib.import_module(f"uqvision.protocols.{f}"), "PROTOCOL")]
    assert sorted(with_protocol) == sorted(BUILT_IN) and BUILT_IN


@pytest.mark.parametrize("name", NAMES)
def test_a_protocol_is_one_folder_with_a_complete_entry(name):
    proto = VISION_PROTOCOLS.lookup(name)
    assert isinstance(proto, Protocol) and proto.name == name and proto.description
    assert callable(proto.score) and proto.score_name
    assert all(score_protocol(alias) is proto for alias in proto.score_names)
    assert proto.reproduce is not None and proto.reproduce.name == name
    assert "smoke" in proto.scales
    assert proto.methods and all(m in TRAINING_METHODS for m in proto.methods)
    if name in BUILT_IN:  # its folder builds it and cites its section of docs/conventions.md
        # (required by tests/test_repository_docs.py; a plugin documents itself)
        assert re.fullmatch(r"[a-z]-\d+[a-z]?", proto.section), proto.section
        package = importlib.import_module(f"uqvision.protocols.{name}")
        assert package.PROTOCOL is proto
        assert f"docs/conventions.md#{proto.section}" in " ".join(package.__doc__.split())


def test_names_aliases_sections_and_commands_are_unique():
    aliases = [a for p in VISION_PROTOCOLS.values() for a in p.score_names]
    assert len(aliases) == len(set(aliases))
    sections = [p.section for p in VISION_PROTOCOLS.values() if p.section]
    assert len(sections) == len(set(sections))
    commands = [c for p in VISION_PROTOCOLS.values() for c in p.commands]
    assert len(commands) == len(set(commands))


def test_every_built_in_protocol_is_in_the_independence_contract():
    """.importlinter's ``uqvision-protocols-independent`` contract covers every protocol of the
    registry, so that no protocol imports another (lint-imports checks the contract): through
    the wildcard ``uqvision.protocols.*`` (every module of the package, so a new protocol folder
    needs no line there), whose only exceptions are the shared definition ``base``, the
    headline table read from it (``headline``, which imports ``base`` only) and the findings'
    vocabulary (``findings``, which imports no protocol)."""
    config = configparser.ConfigParser()
    assert config.read(IMPORTLINTER), IMPORTLINTER
    contract = config["importlinter:contract:uqvision-protocols-independent"]
    modules = contract["modules"].split()
    covered = [n for n in BUILT_IN
               if any(fnmatch.fnmatchcase(f"uqvision.protocols.{n}", m) for m in modules)]
    assert covered == BUILT_IN
    assert contract["ignore_imports"].split() == [
        "uqvision.protocols.**", "->", "uqvision.protocols.base",
        "uqvision.protocols.**", "->", "uqvision.protocols.headline",
        "uqvision.protocols.**", "->", "uqvision.protocols.findings"]


@pytest.mark.parametrize("name", NAMES)
def test_the_command_line_takes_the_protocol_from_the_registry(name):
    proto = VISION_PROTOCOLS.lookup(name)
    assert name in _choices("reproduce")
    assert set(proto.score_names) <= set(_choices("score"))
    for command in proto.commands:
        assert COMMANDS[command] is proto.commands[command] and command in _choices_top()
    score = _subparsers(_command("score")).choices[name]
    given = {s for a in score._actions for s in a.option_strings}
    if proto.add_options is not None:  # its own options, with their choices
        for flag, action in _options(proto.add_options).items():
            assert flag in given, flag
            ours = score._option_string_actions[flag]
            assert (list(ours.choices) if ours.choices else None) == \
                (list(action.choices) if action.choices else None), flag
    reproduce = _subparsers(_command("reproduce")).choices[name]
    flags = {s for a in reproduce._actions for s in a.option_strings}
    assert {"--out", "--set", "--scale", "--device"} <= flags
    if proto.reproduce_flags is not None:
        assert set(_options(proto.reproduce_flags.add)) <= flags
    plot = {s for a in _command("plot")._actions for s in a.option_strings}
    assert (f"--{proto.score_name}" in plot) == (proto.plots is not None)
    if proto.sweep is not None:
        sweep = {s for a in _command("sweep")._actions for s in a.option_strings}
        assert set(_options(proto.sweep.add_options)) <= sweep


def _choices_top() -> list[str]:
    return list(_subparsers(build_parser()).choices)


def test_the_command_line_names_no_protocol():
    """The command line (every module of the ``uqvision.cli`` package) holds no protocol's
    code: it imports no protocol's module, and no protocol's name or alias appears in it (but
    as an attribute of another module's object: the demo's result has a ``selective`` file).
    A name that is also an evaluation-set role is data vocabulary, not a protocol: ``ood``
    (``uqvision sweep --ood-sets``, sets of role ``ood``) is the OOD protocol's name too, and
    ``shift`` the role a shifted set plays (``--sets shift:...``, uqvision.roles.SET_ROLES)."""
    sources = sorted(Path(inspect.getsourcefile(cli)).parent.rglob("*.py"))
    assert {f"{m.name}.py" for m in pkgutil.iter_modules(cli.__path__)} < {p.name for p in sources}
    aliases = {a for p in VISION_PROTOCOLS.values() for a in p.score_names} - set(ROLES) \
        - set(SET_ROLES)
    assert "selective" in aliases and "ood" in VISION_PROTOCOLS.names()
    for source in sources:
        text = source.read_text(encoding="utf-8")
        for name in VISION_PROTOCOLS.names():  # no import of a protocol's package
            assert not re.search(rf"^\s*(from|import)\s+[\w.]*protocols\.{name}\b", text,
                                 re.MULTILINE), (source.name, name)
        for alias in aliases:
            assert not re.search(rf"(?<![.\w]){alias}\b", text), (source.name, alias)


@pytest.mark.parametrize("name", NAMES)
def test_the_driver_takes_the_common_reproduce_options_with_their_defaults(name):
    params = inspect.signature(VISION_PROTOCOLS.lookup(name).reproduce.run).parameters
    for f in dataclasses.fields(ReproduceOptions):
        assert params[f.name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[f.name].default == f.default, (name, f.name)
    assert {"options", "log"} <= set(params)


def test_the_protocols_own_learners_are_theirs_alone():
    """Beyond the general methods, no two protocols share a training method; one protocol
    compares the general methods."""
    own = {n: set(p.methods) - set(GENERAL_METHODS) for n, p in VISION_PROTOCOLS.items()}
    for a, b in itertools.combinations(own, 2):
        assert not own[a] & own[b], (a, b)
    assert any(p.methods == GENERAL_METHODS for p in VISION_PROTOCOLS.values())


# --------------------------------------------------------------------------------------------
# a protocol registered by a test alone plugs into every command


def _toy(calls: list) -> Protocol:
    def score(a):
        """toy: one number per call"""
        calls.append(("score", a.calibration_size, a.level))
        return xr.Dataset({"x": ("i", np.arange(3.0))}, attrs={"protocol": "toy"})

    def add_options(p):  # an option selective has too: no collision across protocols
        p.add_argument("--calibration-size", type=float, default=1.0)
        p.add_argument("--level", type=int, default=0)

    def run(out, *, scale="smoke", data=None, arch=None, seed=0, device="cpu", overwrite=False,
            options=None, log=print):
        calls.append(("reproduce", scale, dict(options or {})))
        return Path(out)

    class Table:
        def format(self):
            return "toy table"

        def write(self, folder, stem, *, overwrite=False):
            path = Path(folder) / f"{stem}.txt"
            path.write_text("t")
            return [path]

    return Protocol(
        "toy", "a protocol registered by a test", score=score, score_name="toyscore",
        add_options=add_options, reproduce=Reproduction("toy", "a toy driver", run, ("smoke",)),
        methods=("deep_ensemble",), section="v-9",
        reproduce_flags=ReproduceFlags(
            lambda p: p.add_argument("--root", default=None),
            lambda a: {"root": a.root} if a.root else {}),
        score_table=ScoreTable(lambda a, ds: Table(), suffixes=(".txt",)),
        plots=Plots(lambda f, out: calls.append(("plot", Path(f).name)) or [Path(f)],
                    "toy score file"),
        sweep=SweepScoring(lambda p: p.add_argument("--toy-level", type=int, default=0),
                           plan=lambda a, **kw: None, outputs="toy/<dataset>.nc"))


def test_a_protocol_registered_alone_plugs_into_every_command(tmp_path, monkeypatch, capsys,
                                                              write_cache):
    calls: list = []
    monkeypatch.setitem(VISION_PROTOCOLS, "toy", _toy(calls))
    (tmp_path / "caches").mkdir()  # one cache: score refuses --caches that hold none
    write_cache(tmp_path / "caches", np.zeros((3, 2)), [0, 1, 0], model="m")
    out = tmp_path / "toy.nc"
    assert main(["score", "toy", "--caches", str(tmp_path / "caches"), "--out", str(out),
                 "--calibration-size", "3", "--level", "2"]) == 0
    assert calls.pop() == ("score", 3.0, 2) and out.is_file()
    assert capsys.readouterr().out.splitlines()[1:] == ["toy table", str(tmp_path / "toy.txt")]
    assert main(["score", "toyscore", "--caches", str(tmp_path / "caches"), "--out",
                 str(out), "--overwrite"]) == 0  # its score name is an alias
    assert calls.pop() == ("score", 1.0, 0)
    assert main(["reproduce", "toy", "--out", str(tmp_path / "run"), "--root", "R",
                 "--set", "root=S", "--set", "k=v"]) == 0
    assert calls.pop() == ("reproduce", "smoke", {"root": "R", "k": "v"})
    assert main(["plot", "--toyscore", str(out), "--out", str(tmp_path / "fig")]) == 0
    assert calls.pop() == ("plot", "toy.nc")
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["sweep", "-h"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--toy-level" in text and "toy/<dataset>.nc" in text
    assert main(["plot", "--out", str(tmp_path / "fig")]) == 2
    assert "--toyscore" in capsys.readouterr().err  # named among what there is to plot
    # a protocol's option is its own: the other protocols do not take it
    with pytest.raises(SystemExit) as stop:
        main(["score", NAMES[0], "--caches", "c", "--out", "o.nc", "--level", "2"])
    assert stop.value.code == 2 and "unrecognized arguments: --level 2" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# smoke scale


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_smoke_run_then_score_through_the_cli(name, smoke_run, tmp_path):
    out, path = smoke_run(name)
    assert path.exists() and (out / "caches").is_dir()
    scores = tmp_path / f"{name}.nc"
    score = _subparsers(_command("score")).choices[name]
    small = (["--calibration-size", "0.5"] if "--calibration-size" in score._option_string_actions
             else [])
    assert main(["score", name, "--caches", str(out / "caches"), *small,
                 "--out", str(scores)]) == 0
    with xr.open_dataset(scores) as ds:
        assert len(ds.data_vars) > 0
