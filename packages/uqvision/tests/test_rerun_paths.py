"""``uqvision rerun`` reads the inputs the result was computed from, or refuses
(docs/conventions.md#rerun-rules).

Two folders each hold the caches of a randomly initialised ``test_vit`` (other seeds: other
logits) under the same relative name, ``caches``. A score file made in the first with
``--caches caches`` records that path absolute and the folder it ran in: rerun from the second,
it scores the first folder's caches again. A file that records the relative path and no folder
(as earlier versions wrote them) is refused there, naming the option, and so is a result whose
recorded cache was replaced by another: nothing is written.
"""

from __future__ import annotations

import json
import shutil

import pytest
import xarray as xr
from test_config_roundtrip import _no_attrs
from uqmetrics import read_dataset, write_dataset

from uqvision.cli import main


@pytest.fixture(scope="module")
def folders(digits, tmp_path_factory):
    root = tmp_path_factory.mktemp("rerun")
    for name, seed in (("a", 0), ("b", 1)):
        assert main(["--threads", "1", "predict", "--model", "test_vit", "--random-init",
                     "--seed", str(seed), "--data", str(digits / "test"),
                     "--out", str(root / name / "caches")]) == 0
    return root


@pytest.fixture
def scored(folders, tmp_path, monkeypatch):
    """(a, b): copies of the two folders; a holds ``sel.nc``, scored there from ``caches``."""
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(folders / "a", a)
    shutil.copytree(folders / "b", b)
    monkeypatch.chdir(a)
    assert main(["score", "selective", "--caches", "caches", "--out", "sel.nc",
                 "--calibration-size", "0.5"]) == 0
    return a, b


def _attrs(path) -> dict:
    with xr.open_dataset(path) as ds:
        return dict(ds.attrs)


def test_a_rerun_from_another_folder_scores_the_recorded_caches(scored, monkeypatch, capsys):
    a, b = scored
    (cache,) = (b / "caches").glob("*.nc")
    recorded = json.loads(_attrs(a / "sel.nc")["caches"])
    assert str(cache.resolve()) not in recorded  # b's caches are others
    monkeypatch.chdir(b)
    assert main(["rerun", str(a / "sel.nc"), "--out", "again.nc"]) == 0
    assert json.loads(_attrs(b / "again.nc")["caches"]) == recorded
    first, again = xr.load_dataset(a / "sel.nc"), xr.load_dataset(b / "again.nc")
    assert _no_attrs(first).identical(_no_attrs(again))
    assert f"uqvision rerun: running: uqvision score selective --config {a / 'sel.nc'} --out " \
           "again.nc" in capsys.readouterr().err
    run = json.loads(_attrs(a / "sel.nc")["run_config"])
    assert run["cwd"] == str(a) and run["options"]["caches"] == [str(a / "caches")]


def test_a_relative_path_recorded_without_its_folder_is_refused_elsewhere(scored, monkeypatch,
                                                                         capsys):
    a, b = scored
    ds = read_dataset(a / "sel.nc")
    record = json.loads(ds.attrs["run_config"])
    for key in ("host", "user", "cwd"):  # as an earlier version recorded the run
        record.pop(key, None)
    record["options"].update(caches=["caches"], out="sel.nc")
    ds.attrs["run_config"] = json.dumps(record)
    write_dataset(ds, a / "old.nc")
    monkeypatch.chdir(b)
    assert main(["rerun", str(a / "old.nc"), "--out", "x.nc"]) == 2  # recorded nowhere: --yes
    assert "pass --yes to run it" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["rerun", str(a / "old.nc"), "--out", "x.nc", "--yes"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "records --caches 'caches', a path relative to a folder the file does not record; " \
           f"here it names {str(b / 'caches')!r}" in err
    assert not (b / "x.nc").exists()


def test_a_recorded_cache_replaced_by_another_is_refused_before_scoring(scored, monkeypatch,
                                                                       capsys):
    a, b = scored
    (mine,) = (a / "caches").glob("*.nc")
    (theirs,) = (b / "caches").glob("*.nc")
    shutil.copyfile(theirs, mine)  # another model's cache under the recorded name
    monkeypatch.chdir(b)
    with pytest.raises(SystemExit) as exc:
        main(["rerun", str(a / "sel.nc"), "--out", "y.nc"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"was computed from {str(mine.resolve())!r} (checksum " in err
    assert "now has checksum" in err
    assert not (b / "y.nc").exists()


def test_an_error_names_the_cluster_by_its_options_never_by_an_object_repr(digits, tmp_path,
                                                                          capsys):
    assert main(["data", "imagenet-c", "--src", str(digits / "test"), "--out",
                 str(tmp_path / "c"), "--workers", "2", "--scheduler",
                 "tcp://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "workers 2 and the Dask scheduler at tcp://127.0.0.1:9: the images run on the " \
           "cluster's workers" in err
    assert "ClusterSpec(" not in err and len(err.strip().splitlines()) == 1
