"""``uqvision rerun`` of a score file a sweep wrote (issue 37, section 6): the file records the
score command on the sweep's caches, so a rerun scores again (``--out`` a file) and
``--with-sweep`` runs the sweep (``--out`` its folder; here ``--dry-run``); an ``--out`` of the
other kind is refused before anything runs; an error names the command that failed
(``uqvision score selective``, not ``uqvision score``). The sweep runs in process on a
thread-based Dask cluster, as tests/test_sweep_sets.py's do (its fixtures are reused)."""

from __future__ import annotations

import json

import pytest
import xarray as xr
from test_config_roundtrip import _no_attrs
from test_sweep_sets import RANDOM, _dask_globals_kept, client  # noqa: F401  (fixtures)

from uqvision.cli import main


@pytest.fixture(scope="module")
def swept(digits, client, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("rerun_sweep") / "zoo"
    assert main(["--threads", "1", "sweep", "--models", RANDOM, "--random-init", "--data",
                 str(digits / "test"), "--calibration-size", "0.3", "--scheduler",
                 client.scheduler.address, "--out", str(out)]) == 0
    (scores,) = (out / "scores").glob("selective-*.nc")
    return out, scores


def test_a_sweeps_score_file_reruns_its_score_alone(swept, tmp_path, capsys):
    out, scores = swept
    with xr.open_dataset(scores) as ds:
        run = json.loads(ds.attrs["run_config"])
    assert run["command"] == "uqvision score selective"
    assert run["options"]["caches"] == [str(out / "caches")]
    assert run["part_of"]["command"] == "uqvision sweep"  # what --with-sweep runs
    capsys.readouterr()
    again = tmp_path / "again.nc"
    assert main(["rerun", str(scores), "--out", str(again)]) == 0
    assert f"running: uqvision score selective --config {scores} --out {again}" in \
        capsys.readouterr().err
    first, second = xr.load_dataset(scores), xr.load_dataset(again)
    assert _no_attrs(first).identical(_no_attrs(second))
    assert not (tmp_path / "again.nc" / "caches").exists()  # a file, no sweep folder


def test_with_sweep_reruns_the_sweep_into_a_folder(swept, tmp_path, client, capsys):  # noqa: F811
    _, scores = swept
    capsys.readouterr()
    assert main(["rerun", str(scores), "--with-sweep", "--out", str(tmp_path / "zoo2"),
                 "--dry-run", "--scheduler", client.scheduler.address]) == 0
    captured = capsys.readouterr()
    assert f"running: uqvision sweep --config {scores} --out {tmp_path / 'zoo2'} --dry-run" \
        in captured.err
    assert f"scores: {tmp_path / 'zoo2' / 'scores'}" in captured.out  # the sweep's plan


@pytest.mark.parametrize("argv, message", [
    (["--out", "{tmp}"], "--out '{tmp}': uqvision score selective writes a file"),
    (["--with-sweep", "--out", "{tmp}/x.nc"], "--out '{tmp}/x.nc': uqvision sweep writes a folder"),
])
def test_out_names_a_file_for_a_file_and_a_folder_for_a_folder(swept, tmp_path, capsys, argv,
                                                               message):
    _, scores = swept
    capsys.readouterr()
    assert main(["rerun", str(scores), *[a.format(tmp=tmp_path) for a in argv]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("uqvision rerun: error: ") and message.format(tmp=tmp_path) in err
    assert list(tmp_path.iterdir()) == []


def test_an_error_names_the_command_that_failed(swept, tmp_path, capsys):
    _, scores = swept
    capsys.readouterr()
    assert main(["rerun", str(scores), "--out", str(tmp_path / "x.nc"), "--dataset",
                 "nowhere"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("uqvision score selective: error: "), err
