"""``uqreg study`` from its configuration file and ``uqreg rerun`` reproduce a study exactly.

A small study from the cheapest preset (``quick``, cut down by options: one level, two methods,
two repetitions, tiny ensembles; it keeps the preset's companion study) writes
``OUT/study.config.toml`` and records the same configuration in its study file
(``run_config``). Run again with ``--config FILE --out OTHER``, and with ``uqreg rerun
STUDY.nc --out THIRD``, every variable and every attr but the time, the host and the recorded
``out`` is identical, the companion's too. An option on the command line overrides the file (the
recorded configuration shows it, and the results change with it); the configuration file is
replaced only with its study (``--overwrite``); bad files are one line naming the file, the key
and the value, exit code 2, before any training; a study file that records no run is refused by
``rerun`` with a message saying so.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import uqmetrics
import xarray as xr
from uqmetrics.runs.run_config import read_config
from uqmetrics.runs.testing import steady_attrs

from uqreg import cli

SMALL = ["--preset", "quick", "--complexities", "1", "--methods", "blr,ens", "--repetitions", "2",
         "--members", "2", "--epochs", "3", "--mc-samples", "3", "--recipes", "paper", "--quiet",
         "--no-plots"]

#: The attrs that may differ between two runs of one configuration (at any depth of a JSON
#: attr): when and where it ran, how long it took, and the recorded configuration (its
#: ``out``; compared apart).
_VOLATILE = {"created_utc", "hostname", "wall_time_s", "study_wall_time_s", "run_config"}


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    out = tmp_path_factory.mktemp("config") / "first"
    assert cli.main(["study", *SMALL, "--out", str(out)]) == 0
    return out


def _load(folder) -> dict[str, xr.Dataset]:
    """The main study and the companion's, by their folder below ``folder``."""
    return {str(p.parent.relative_to(folder)): xr.load_dataset(p)
            for p in sorted(folder.rglob("study.nc"))}


def _no_attrs(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` without its own attributes, its variables keeping theirs (what
    ``drop_attrs(deep=False)`` of xarray >= 2024.7 gives; uqreg supports xarray >= 2023.1)."""
    out = ds.copy()
    out.attrs = {}
    return out


def _assert_same_study(a, b) -> None:
    studies_a, studies_b = _load(a), _load(b)
    assert list(studies_a) == list(studies_b) == [".", "styblinski_tang"]
    for name, ds in studies_a.items():
        other = studies_b[name]
        assert _no_attrs(ds).identical(_no_attrs(other)), name
        assert _steady(ds.attrs) == _steady(other.attrs), name


def _steady(value):
    """Attrs (JSON ones decoded) without the :data:`_VOLATILE` keys, at any depth."""
    return steady_attrs(value, _VOLATILE)


def _recorded(path) -> dict:
    return json.loads(xr.open_dataset(path).attrs["run_config"])


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_study_writes_its_configuration_and_records_it(first):
    config = read_config(first / "study.config.toml", command="uqreg study")
    assert config["preset"] == "quick" and config["complexities"] == [1]
    assert config["out"] == str(first) and config["quiet"] is True
    recorded = _recorded(first / "study.nc")
    assert recorded["command"] == "uqreg study" and recorded["version"]
    assert recorded["git_commit"]
    assert {k: v for k, v in recorded["options"].items() if v is not None} == config
    # every option of the command is in the record, defaults included (none: not set)
    assert {"seed", "alpha", "lr", "overwrite", "preset", "max-memory"} <= set(recorded["options"])
    assert _recorded(first / "styblinski_tang" / "study.nc") == recorded


def test_a_study_from_its_configuration_file_is_the_same_study(first, tmp_path):
    other = tmp_path / "other"
    assert cli.main(["study", "--config", str(first / "study.config.toml"),
                     "--out", str(other)]) == 0
    _assert_same_study(first, other)
    a, b = _recorded(first / "study.nc"), _recorded(other / "study.nc")
    assert b["options"].pop("out") == str(other)
    a["options"].pop("out")
    assert a == b


def test_rerun_of_a_study_file_is_the_same_study(first, tmp_path, capsys):
    before = _sha(first / "study.nc")
    assert cli.main(["rerun", str(first / "study.nc")]) == 2  # where it ran: refused
    assert "pass --out OTHER, or --overwrite" in capsys.readouterr().err
    third = tmp_path / "third"
    assert cli.main(["rerun", str(first / "study.nc"), "--out", str(third)]) == 0
    _assert_same_study(first, third)
    assert _recorded(third / "study.nc")["options"]["out"] == str(third)
    assert _sha(first / "study.nc") == before


def test_options_on_the_command_line_override_the_file(first, tmp_path):
    out = tmp_path / "seeded"
    assert cli.main(["study", "--seed", "5", "--config", str(first / "study.config.toml"),
                     "--out", str(out)]) == 0
    assert _recorded(out / "study.nc")["options"]["seed"] == 5
    assert read_config(out / "study.config.toml")["seed"] == 5
    assert json.loads(xr.open_dataset(out / "study.nc").attrs["config"])["seed"] == 5
    a, b = xr.load_dataset(first / "study.nc"), xr.load_dataset(out / "study.nc")
    assert not _no_attrs(a).identical(_no_attrs(b))  # other draws


@pytest.mark.parametrize(("text", "said"), [
    ('[options]\nrepetitons = 2\n', "unknown key 'repetitons' = 2"),
    ('[options]\nrepetitions = "two"\n', "key 'repetitions' = \"two\": invalid int value"),
    ('[options]\nquiet = "yes"\n', "key 'quiet' = \"yes\": expected true or false"),
    ('[options]\nmethods = ["blr", true]\n', "key 'methods' = [\"blr\", true]: expected a list"),
    ('[options\nrepetitions = 2\n', "is not a TOML file"),
    ('[options]\nn-cal = 50\nn_cal = 60\n',
     "keys 'n-cal' and 'n_cal' are one option (--n-cal): give it once"),
])
def test_a_bad_configuration_file_exits_2_naming_it(tmp_path, capsys, text, said):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exc:
        cli.main(["study", "--config", str(path), "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("uqreg study: error: argument --config: ")
    assert str(path) in err and said in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_the_configuration_is_replaced_only_with_its_study(first, tmp_path, capsys):
    out = tmp_path / "again"
    assert cli.main(["study", "--config", str(first / "study.config.toml"), "--out", str(out)]) == 0
    before = (out / "study.config.toml").read_text()
    # a file gives no absolute --out (docs/config.md): the command line gives it
    again = ["study", "--config", str(out / "study.config.toml"), "--seed", "9", "--out", str(out)]
    assert cli.main(again) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert (out / "study.config.toml").read_text() == before  # the study was not replaced
    assert cli.main([*again, "--overwrite"]) == 0
    assert read_config(out / "study.config.toml")["seed"] == 9
    assert _recorded(out / "study.nc")["options"]["seed"] == 9


def test_rerun_of_a_file_without_a_recorded_run_says_so(first, tmp_path, capsys):
    ds = xr.load_dataset(first / "study.nc")
    del ds.attrs["run_config"]
    bare = uqmetrics.write_dataset(ds, tmp_path / "bare.nc")
    assert cli.main(["rerun", str(bare), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("uqreg rerun: error: ") and "records no run configuration" in err
