"""``uqvision`` commands from their configuration files and ``uqvision rerun`` reproduce their
results exactly.

A tiny chain (``predict`` of a randomly initialised ``test_vit`` over the test digits, then
``score selective`` of its cache) writes each command's fully resolved configuration beside its
results (``CACHES/predict.<digest>.config.toml``, ``SCORES/sel.config.toml``) and records it in
the result files (``run_config``). ``score selective --config FILE --out OTHER`` and ``uqvision
rerun sel.nc --out THIRD`` write the same score file (every variable, every attr but the time,
the host and the recorded ``out``), and ``rerun`` of the cache predicts the same cache. An option
on the command line overrides the file and the recorded configuration shows it; a bad file is
one error naming the file, the key and the value (exit code 2); a file recording no run is
refused by ``rerun`` with a message saying so; ``data`` writes its configuration too.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr
from uqmetrics import write_dataset
from uqmetrics.runs.run_config import read_config
from uqmetrics.runs.testing import steady_attrs

from uqvision.cli import main

#: Attrs that may differ between two runs of one configuration (at any depth of a JSON attr).
_VOLATILE = {"created_utc", "hostname", "wall_time_s", "run_config", "images_per_s"}


@pytest.fixture(scope="module")
def chain(digits, tmp_path_factory):
    root = tmp_path_factory.mktemp("config")
    assert main(["--threads", "1", "predict", "--model", "test_vit", "--random-init", "--data",
                 str(digits / "test"), "--out", str(root / "caches")]) == 0
    assert main(["--threads", "1", "score", "selective", "--caches", str(root / "caches"),
                 "--out", str(root / "scores" / "sel.nc"), "--calibration-size", "0.5"]) == 0
    return root


def _steady(value):
    """Attrs (JSON ones decoded) without the :data:`_VOLATILE` keys, at any depth."""
    return steady_attrs(value, _VOLATILE)


def _no_attrs(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` without its own attributes, its variables keeping theirs (what
    ``drop_attrs(deep=False)`` of xarray >= 2024.7 gives; uqvision supports xarray >= 2023.1)."""
    out = ds.copy()
    out.attrs = {}
    return out


def _assert_same(a, b) -> None:
    x, y = xr.load_dataset(a), xr.load_dataset(b)
    assert _no_attrs(x).identical(_no_attrs(y))
    assert _steady(x.attrs) == _steady(y.attrs)


def _recorded(path) -> dict:
    with xr.open_dataset(path) as ds:
        return json.loads(ds.attrs["run_config"])


def test_each_command_writes_its_configuration_beside_its_results(chain):
    (predict,) = (chain / "caches").glob("predict.*.config.toml")
    options = read_config(predict, command="uqvision predict")
    assert options["model"] == ["test_vit"] and options["random-init"] is True
    assert options["batch-size"] == 64 and options["mode"] == "plain"  # defaults included
    (cache,) = (chain / "caches").glob("*.nc")
    assert _recorded(cache)["command"] == "uqvision predict"
    score = read_config(chain / "scores" / "sel.config.toml", command="uqvision score selective")
    assert score["calibration-size"] == 0.5 and score["caches"] == [str(chain / "caches")]
    recorded = _recorded(chain / "scores" / "sel.nc")
    assert recorded["command"] == "uqvision score selective" and recorded["git_commit"]
    assert {k: v for k, v in recorded["options"].items() if v is not None} == score


def test_a_score_from_its_configuration_file_and_rerun_are_the_same(chain, tmp_path, capsys):
    config = chain / "scores" / "sel.config.toml"
    assert main(["score", "selective", "--config", str(config),
                 "--out", str(tmp_path / "other" / "sel.nc")]) == 0
    _assert_same(chain / "scores" / "sel.nc", tmp_path / "other" / "sel.nc")
    assert main(["rerun", str(chain / "scores" / "sel.nc")]) == 2  # where it ran: refused
    assert "pass --out OTHER, or --overwrite" in capsys.readouterr().err
    assert main(["rerun", str(chain / "scores" / "sel.nc"),
                 "--out", str(tmp_path / "third.nc")]) == 0
    _assert_same(chain / "scores" / "sel.nc", tmp_path / "third.nc")
    a, b = _recorded(chain / "scores" / "sel.nc"), _recorded(tmp_path / "third.nc")
    assert b["options"].pop("out") == str(tmp_path / "third.nc")
    a["options"].pop("out")
    assert a == b
    assert (tmp_path / "third.config.toml").is_file()


def test_rerun_of_a_cache_predicts_the_same_cache(chain, tmp_path):
    (cache,) = (chain / "caches").glob("*.nc")
    assert main(["--threads", "1", "rerun", str(cache), "--out", str(tmp_path / "c")]) == 0
    _assert_same(cache, tmp_path / "c" / cache.name)


def test_options_on_the_command_line_override_the_file(chain, tmp_path):
    out = tmp_path / "sel.nc"
    assert main(["score", "selective", "--calibration-size", "0.6", "--config",
                 str(chain / "scores" / "sel.config.toml"), "--out", str(out)]) == 0
    assert _recorded(out)["options"]["calibration-size"] == 0.6
    assert read_config(tmp_path / "sel.config.toml")["calibration-size"] == 0.6
    before, after = xr.load_dataset(chain / "scores" / "sel.nc"), xr.load_dataset(out)
    assert not _no_attrs(before).identical(_no_attrs(after))


@pytest.mark.parametrize(("text", "said"), [
    ('[options]\ncalibration-sise = 0.5\n', "unknown key 'calibration-sise' = 0.5"),
    ('[options]\nseed = "one"\n', "key 'seed' = \"one\": 'one' is not an integer"),
    ('[options]\nseed = -1\n', "key 'seed' = -1: must be >= 0, got -1"),
    ('[options]\noverwrite = 1\n', "key 'overwrite' = 1: expected true or false"),
    ('[options]\ncaches = "c"\n', "key 'caches' = \"c\": expected a list"),
    ('[options\nseed = 1\n', "is not a TOML file"),
])
def test_a_bad_configuration_file_exits_2_naming_it(tmp_path, capsys, text, said):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exc:
        main(["score", "selective", "--config", str(path), "--caches", str(tmp_path),
              "--out", str(tmp_path / "s.nc")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("uqvision score selective: error: argument --config: ")
    assert str(path) in err and said in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s.nc").exists()


@pytest.mark.parametrize(("text", "said"), [
    ('[options]\nn-cal = 50\nn_cal = 60\n',
     "keys 'n-cal' and 'n_cal' are one option (--n-cal): give it once"),
    ('[options]\ntrials = 1e21\n', "key 'trials' = 1e+21: "),
])
def test_a_key_given_twice_or_out_of_range_is_one_line(tmp_path, capsys, text, said):
    path = tmp_path / "conformal.toml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exc:
        main(["score", "conformal", "--config", str(path), "--caches", str(tmp_path),
              "--out", str(tmp_path / "c.nc")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("uqvision score conformal: error: argument --config: ")
    assert str(path) in err and said in err and len(err.strip().splitlines()) == 1


def test_a_configuration_of_another_command_is_refused(chain, capsys, tmp_path):
    (predict,) = (chain / "caches").glob("predict.*.config.toml")
    with pytest.raises(SystemExit):
        main(["score", "selective", "--config", str(predict), "--out", str(tmp_path / "s.nc")])
    assert "records a run of 'uqvision predict', not of 'uqvision score selective'" in \
        capsys.readouterr().err


def test_rerun_of_a_file_without_a_recorded_run_says_so(tmp_path, capsys):
    bare = write_dataset(xr.Dataset({"x": ("i", np.arange(3.0))}), tmp_path / "bare.nc")
    assert main(["rerun", str(bare), "--out", str(tmp_path / "x.nc")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("uqvision rerun: error: ") and "records no run configuration" in err


def test_data_writes_its_configuration_and_runs_again_from_it(tmp_path):
    assert main(["data", "synthetic", "--out", str(tmp_path / "s"), "--classes", "2",
                 "--n-per-class", "1", "--image-size", "8"]) == 0
    config = tmp_path / "s" / "data.config.toml"
    assert read_config(config, command="uqvision data synthetic")["n-classes"] == 2
    assert main(["data", "synthetic", "--config", str(config), "--out", str(tmp_path / "t")]) == 0
    files = sorted(p.relative_to(tmp_path / "s") for p in (tmp_path / "s").rglob("*.png"))
    assert files and files == sorted(p.relative_to(tmp_path / "t")
                                     for p in (tmp_path / "t").rglob("*.png"))
    assert all((tmp_path / "s" / f).read_bytes() == (tmp_path / "t" / f).read_bytes()
               for f in files)
