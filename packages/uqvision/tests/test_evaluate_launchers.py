"""``uqvision evaluate``: where and how the models run is the command line's, never the file's.

An evaluation file is data, possibly someone else's: its ``[predict]`` table took launcher
options (``device = "cuda"``, ``workers = 5``), so that a received file chose the device and
the processes the run started, as ``--config`` files no longer may. Now every prediction
option marked a launcher option (:data:`uqvision.predict.options.PREDICT_OPTIONS`) is refused
there, in one line naming the file, the table and the key and saying which option to give;
``uqvision evaluate`` takes them on its command line, generated from the same declarations as
``uqvision sweep``'s, and a run given them computes the caches as before (the device recorded
in them, neither it nor the worker count part of their identity: a rerun without them
resumes).

The runs are real ``uqvision evaluate`` runs, in process, their sweep on test_sweep_sets.py's
thread-based Dask cluster: a random-init network on a few digits, the selective protocol.
"""

from __future__ import annotations

import argparse
import json

import pytest
import xarray as xr
from test_evaluate_images import HEAD, SELECTIVE
from test_sweep_sets import _dask_globals_kept, client  # noqa: F401  (fixtures)
from uqmetrics import InputError
from uqmetrics.runs.config_options import is_launcher

from uqvision.cli import build_parser, main
from uqvision.data import make_digits_folder
from uqvision.evaluate import plan_evaluation, read_evaluation
from uqvision.predict.options import PREDICT_OPTIONS

#: An evaluation of digits/test by one random-init network, scored by selective.
TOML = HEAD + SELECTIVE
#: The prediction's launcher options, as a file would give them (key, a valid value).
LAUNCHERS = [((o.flag or "--" + o.field.replace("_", "-"))[2:],
              {"device": "cpu", "num_workers": 0}[o.field]) for o in PREDICT_OPTIONS
             if o.launcher]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """``digits/test``: 15 images, 3 of each of 5 classes."""
    root = tmp_path_factory.mktemp("launchers")
    make_digits_folder(root / "digits", max_per_class=3)
    return root


def _toml(folder, name: str, predict: str = "") -> str:
    path = folder / name
    path.write_text(TOML.format(predict=predict))
    return str(path)


def _subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def test_the_launcher_options_are_every_marked_prediction_option():
    """The table below is generated: a new launcher option is tested without a line here."""
    assert {key for key, _ in LAUNCHERS} >= {"device", "workers"}


@pytest.mark.parametrize(("key", "value"), LAUNCHERS)
def test_a_launcher_option_in_predict_is_refused_naming_file_table_key_and_option(
        folder, key, value, capsys):
    """``[predict] device = "cpu"`` (or ``workers = 0``) was taken from the file."""
    toml = _toml(folder, f"{key}.toml", f"{key} = {json.dumps(value)}")
    with pytest.raises(InputError) as exc:
        read_evaluation(toml)
    line = str(exc.value)
    assert line.startswith(f"{toml}: [predict]: key {key!r} = {json.dumps(value)}: "), line
    assert f"give --{key} on the command line" in line and "never taken from a file" in line
    for argv in (["--dry-run"], ["--n-workers", "1", "--no-figures"]):
        assert main(["evaluate", toml, *argv]) == 2
        err = capsys.readouterr().err
        assert err == f"uqvision evaluate: error: {line}\n", err
    assert not (folder / "out").exists()


def test_an_unknown_predict_key_lists_no_launcher_option_among_the_known(folder):
    with pytest.raises(InputError, match="unknown key; known: ") as exc:
        read_evaluation(_toml(folder, "typo.toml", "batch-sise = 4"))
    known = str(exc.value).partition("known: ")[2].split(", ")
    assert "batch-size" in known and not {key for key, _ in LAUNCHERS} & set(known)


def test_evaluate_has_the_prediction_launcher_options_sweep_has():
    """Generated from the same declarations: the same flags, launcher options on both."""
    flags = {(o.flag or "--" + o.field.replace("_", "-")) for o in PREDICT_OPTIONS if o.launcher}
    for command in ("evaluate", "sweep"):
        actions = {s: a for a in _subparser(command)._actions for s in a.option_strings}
        assert flags <= set(actions), command
        assert all(is_launcher(actions[f]) for f in flags), command
    evaluate = _subparser("evaluate")
    assert all(is_launcher(a) for a in evaluate._actions if "--cell-threads" in a.option_strings)
    assert "--device cuda" in evaluate.format_help().replace("\n", " ")  # --gpus' help says so


def test_the_plan_takes_the_launcher_options_given_and_no_other(folder):
    ev = read_evaluation(_toml(folder, "plain.toml"))
    plan = plan_evaluation(ev, launcher={"device": "cpu", "num_workers": 0})
    assert (plan.config.device, plan.config.num_workers) == ("cpu", 0)
    assert all(t.config.num_workers == 0 for t in plan.targets)
    default = plan_evaluation(ev)
    assert (default.config.device, default.config.num_workers) == ("cpu", None)
    with pytest.raises(ValueError, match="'batch_size' is not a launcher option"):
        plan_evaluation(ev, launcher={"batch_size": 2})


def test_device_and_workers_on_the_command_line_compute_the_caches_as_before(
        folder, tmp_path, client, capsys):  # noqa: F811
    """A run given ``--device cpu --workers 0`` records its device in the caches as the
    file's ``device`` did; a rerun without them finds everything up to date (the device and
    the workers are no part of a cache's identity), as does one with them."""
    toml = _toml(folder, "run.toml")
    out = tmp_path / "out"
    run = ["evaluate", toml, "--out", str(out), "--scheduler", client.scheduler.address,
           "--no-figures"]
    assert main([*run, "--device", "cpu", "--workers", "0"]) == 0
    first = capsys.readouterr().out
    assert "sweep: computed 1, skipped 0" in first, first
    (cache,) = (out / "caches").glob("*.nc")
    with xr.open_dataset(cache) as ds:
        assert ds.attrs["device"] == "cpu"
        assert json.loads(ds.attrs["config"])["num_workers"] == 0
    before = cache.stat().st_mtime_ns
    for extra in ([], ["--device", "cpu"]):
        assert main([*run, *extra]) == 0
        assert "nothing to compute" in capsys.readouterr().out
    assert cache.stat().st_mtime_ns == before
