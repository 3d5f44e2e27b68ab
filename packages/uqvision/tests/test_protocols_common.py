"""Every registered protocol, driven by :data:`uqvision.protocols.VISION_PROTOCOLS` (as
``shared/tests/test_common.py`` is driven by ``uqmetrics.METRICS``): a protocol registered
there is complete, is offered by the command line, and runs at smoke scale, its results scored
through ``uqvision score``. The smoke runs are shared with each protocol's own tests
(``conftest.smoke_run``), so this file adds the scoring only."""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest
import xarray as xr

from uqvision.cli import build_parser, main
from uqvision.methods import GENERAL_METHODS
from uqvision.protocols import VISION_PROTOCOLS, Protocol, ReproduceOptions, score_protocol
from uqvision.training.method import TRAINING_METHODS

NAMES = VISION_PROTOCOLS.names()


def _choices(command: str, dest: str) -> list[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    return list(next(a for a in sub._actions if a.dest == dest).choices)


def test_the_four_protocols_are_registered_in_the_papers_order():
    assert NAMES == ["selective", "pitfalls", "uimnet", "url"]


@pytest.mark.parametrize("name", NAMES)
def test_a_protocol_is_one_folder_with_a_complete_entry(name):
    proto = VISION_PROTOCOLS.lookup(name)
    assert isinstance(proto, Protocol) and proto.name == name and proto.description
    package = importlib.import_module(f"uqvision.protocols.{name}")
    assert package.PROTOCOL is proto
    assert callable(proto.score) and proto.score_name
    assert score_protocol(proto.score_name) is score_protocol(name) is proto
    assert proto.reproduce is not None and proto.reproduce.name == name
    assert "smoke" in proto.scales
    assert proto.methods and all(m in TRAINING_METHODS for m in proto.methods)


@pytest.mark.parametrize("name", NAMES)
def test_the_command_line_takes_the_protocol_from_the_registry(name):
    proto = VISION_PROTOCOLS.lookup(name)
    assert name in _choices("reproduce", "name")
    assert {proto.score_name, name} <= set(_choices("score", "protocol"))
    for command in proto.commands:
        assert command in next(a for a in build_parser()._actions
                               if a.dest == "command").choices


@pytest.mark.parametrize("name", NAMES)
def test_the_driver_takes_the_common_reproduce_options_with_their_defaults(name):
    params = inspect.signature(VISION_PROTOCOLS.lookup(name).reproduce.run).parameters
    for f in dataclasses.fields(ReproduceOptions):
        assert params[f.name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[f.name].default == f.default, (name, f.name)
    assert {"options", "log"} <= set(params)


def test_only_the_pitfalls_protocol_compares_the_general_methods():
    assert VISION_PROTOCOLS.lookup("pitfalls").methods == GENERAL_METHODS
    learners = [set(VISION_PROTOCOLS.lookup(n).methods) - set(GENERAL_METHODS) for n in ("uimnet", "url")]
    assert all(learners) and not learners[0] & learners[1]


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_smoke_run_then_score_through_the_cli(name, smoke_run, tmp_path):
    out, path = smoke_run(name)
    assert path.exists() and (out / "caches").is_dir()
    proto = VISION_PROTOCOLS.lookup(name)
    scores = tmp_path / f"{name}.nc"
    assert main(["score", "--protocol", proto.score_name, "--caches", str(out / "caches"),
                 "--calibration-size", "0.5", "--out", str(scores)]) == 0
    with xr.open_dataset(scores) as ds:
        assert len(ds.data_vars) > 0
