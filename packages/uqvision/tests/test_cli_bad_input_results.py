"""Bad input to the commands that read results (the audit of the command line): ``score``,
``plot``, ``metadata``, ``verify``, ``report`` and ``compare``. A user's mistake is ONE line on
stderr naming the option as typed (or the file), the value, exit code 2, no traceback, and
nothing written before the refusal (docs/conventions.md: "Bad input gets a clear error, and
nothing is lost")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from uqmetrics import InputError, stamp_result, write_dataset
from uqmetrics.runs.testing.filesystems import not_writable

from uqvision.cli import main
from uqvision.protocols.base import protocol_result


def _listing(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


@pytest.fixture
def caches(tmp_path, write_cache):
    """A folder of one complete prediction cache (40 images, 4 classes)."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "caches"
    folder.mkdir()
    write_cache(folder, rng.normal(size=(40, 4)), rng.integers(0, 4, 40), model="m")
    return folder


@pytest.fixture
def cache(caches) -> Path:
    (path,) = caches.glob("*.nc")
    return path


def _result(path: Path, protocol: str) -> Path:
    """A schema-stamped result file of ``protocol`` (one metric per model)."""
    ds = xr.Dataset({"auroc": ("model", np.array([0.7, 0.8]))}, coords={"model": ["a", "b"]})
    return write_dataset(stamp_result(ds, protocol, input_checksums=["ab" * 32],
                                      metrics={"auroc": "auroc"}), path)


@pytest.fixture
def selective(tmp_path) -> Path:
    return _result(tmp_path / "scores" / "sel.nc", "selective")


@pytest.fixture
def not_netcdf(tmp_path) -> Path:
    path = tmp_path / "notnc.nc"
    path.write_text("not a netCDF file\n")
    return path


@pytest.fixture
def truncated(tmp_path, selective) -> Path:
    path = tmp_path / "trunc.nc"
    whole = selective.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    return path


# ---------------------------------------------------------------------------------------------
# 1. score --out: a score file (.nc); its table beside it never takes its name


@pytest.mark.parametrize("name", ["x.csv", "x.json", "x"])
def test_score_out_must_be_a_netcdf_file(caches, tmp_path, capsys, name, refused):
    """``--out s/x.csv``: the score file was written to x.csv, then the table beside it
    (x.csv) was refused (``x.csv: already exists``): a partial result, the message without
    the option. Refused before any work, naming --out and the value."""
    out = tmp_path / "s" / name
    line = refused(["score", "selective", "--caches", caches, "--calibration-size",
                             "20", "--out", out])
    assert f"--out {str(out)!r} must be a score file ending in .nc" in line
    assert not (tmp_path / "s").exists()


# ---------------------------------------------------------------------------------------------
# 2. plot --SCORE_NAME FILE: a score file of that protocol


def test_plot_refuses_a_cache_given_as_a_score_file(cache, tmp_path, capsys, refused):
    """``plot --selective CACHE.nc`` ended in a traceback (KeyError 'model')."""
    line = refused(["plot", "--selective", cache, "--out", tmp_path / "fig"])
    assert f"--selective {str(cache)!r} must be a result of protocol 'selective'" in line
    assert "records no protocol" in line
    assert not (tmp_path / "fig").exists()


def test_plot_refuses_a_score_file_of_another_protocol_naming_option_and_path(
        selective, tmp_path, capsys, refused):
    """``plot --ood SEL.nc`` said ``result must be a result of protocol 'ood', got one of
    protocol 'selective'``, without the option or the file."""
    line = refused(["plot", "--ood", selective, "--out", tmp_path / "fig"])
    assert line.endswith(f"--ood {str(selective)!r} must be a result of protocol 'ood', got "
                         "one of protocol 'selective'")
    assert not (tmp_path / "fig").exists()


@pytest.mark.parametrize("bad", ["missing", "folder", "not_netcdf", "truncated"])
def test_plot_refuses_a_score_file_that_cannot_be_read(request, tmp_path, capsys, bad, refused):
    path = {"missing": tmp_path / "nope.nc", "folder": tmp_path,
            "not_netcdf": request.getfixturevalue("not_netcdf"),
            "truncated": request.getfixturevalue("truncated")}[bad]
    line = refused(["plot", "--selective", path, "--out", tmp_path / "fig"])
    assert f"--selective {str(path)!r}" in line
    assert not (tmp_path / "fig").exists()


def test_protocol_result_names_the_file_and_the_option(selective):
    with pytest.raises(InputError, match=rf"^result {str(selective)!r} must be a result of "
                                         r"protocol 'ood', got one of protocol 'selective'$"):
        protocol_result(selective, "ood")
    with pytest.raises(InputError, match=rf"^--ood {str(selective)!r} must be"):
        protocol_result(selective, "ood", option="--ood")
    assert protocol_result(selective, "selective").sizes["model"] == 2


# ---------------------------------------------------------------------------------------------
# 3. metadata --scores / --caches / --metadata, score --metadata


def test_metadata_refuses_a_cache_given_as_scores(cache, capsys, refused):
    """``metadata --scores CACHE.nc`` ended in a traceback (KeyError 'metadata_key')."""
    line = refused(["metadata", "--scores", cache])
    assert f"--scores {str(cache)!r} must be a result of protocol 'selective'" in line


def test_metadata_refuses_a_selective_file_without_metadata_keys(selective, capsys, refused):
    line = refused(["metadata", "--scores", selective])
    assert f"--scores {str(selective)!r} has no metadata_key" in line


@pytest.mark.parametrize("bad", ["not_netcdf", "truncated", "selective"])
def test_metadata_refuses_caches_that_are_not_caches(request, caches, capsys, bad, refused):
    """``metadata --caches notnc.nc`` printed a raw Python warning (``SkippedCacheWarning``)
    and exited 0; every file given is a cache or the command stops, naming it."""
    path = request.getfixturevalue(bad)
    line = refused(["metadata", "--caches", path])
    assert line.startswith("uqvision metadata: error: --caches ") and str(path) in line
    line = refused(["metadata", "--caches", caches, path])  # one bad file among them
    assert "--caches: 1 of 2 files is not a complete prediction cache" in line
    assert str(path) in line


def test_metadata_lists_the_models_of_good_caches(caches, capsys):
    assert main(["metadata", "--caches", str(caches)]) == 0
    assert "m" in capsys.readouterr().out.split()


@pytest.mark.parametrize("command", ["metadata", "score"])
@pytest.mark.parametrize("bad", ["missing", "folder", "bad_table"])
def test_a_bad_metadata_table_names_the_option(caches, tmp_path, capsys, command, bad, refused):
    """``score --metadata nope.csv`` said ``nope.csv: does not exist``, without the option."""
    table = {"missing": tmp_path / "nope.csv", "folder": tmp_path / "tables",
             "bad_table": tmp_path / "bad.csv"}[bad]
    (tmp_path / "tables").mkdir()
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    out = tmp_path / "s" / "x.nc"
    argv = (["metadata", "--caches", caches] if command == "metadata" else
            ["score", "selective", "--caches", caches, "--calibration-size", "20", "--out", out])
    line = refused([*argv, "--metadata", table])
    assert f"--metadata {str(table)!r}: " in line
    assert not (tmp_path / "s").exists()


# ---------------------------------------------------------------------------------------------
# 4. verify: a target that cannot be read, or is not a result, is bad input (exit code 2)


@pytest.mark.parametrize("bad", ["truncated", "cache"])
def test_verify_refuses_a_target_that_is_not_a_readable_result(request, capsys, bad, refused):
    """``verify trunc.nc`` was a disagreement (exit code 1, ``cannot be read``); ``verify
    CACHE.nc`` was "verified" with a disagreement per image (exit code 1)."""
    path = request.getfixturevalue(bad)
    capsys.readouterr()
    line = refused(["verify", path])
    assert str(path.resolve()) in line
    assert ("could not be read" if bad == "truncated" else "does not follow the result-file "
            "schema") in line


@pytest.mark.parametrize("option", ["--rtol", "--atol"])
def test_verify_names_a_bad_tolerance_option(selective, capsys, option, refused):
    """``verify --rtol -1`` said ``rtol must be ...``."""
    line = refused(["verify", option, "-1", selective])
    assert f"argument {option}: must be a finite number >= 0, got -1" in line


# ---------------------------------------------------------------------------------------------
# 5. report: a folder given as a result; an --out that cannot be written


def test_report_says_a_folder_given_as_a_result_is_a_folder(selective, tmp_path, capsys, refused):
    """``report scores --out site`` said ``result file 'scores' does not exist``."""
    line = refused(["report", selective.parent, "--out", tmp_path / "site"])
    assert f"result {str(selective.parent)!r} is a folder, not a result file" in line
    assert not (tmp_path / "site").exists()


def test_compare_says_a_folder_given_as_a_result_is_a_folder(selective, capsys, refused):
    line = refused(["compare", selective.parent, "--published",
                             "selective-imagenet"])
    assert f"result {str(selective.parent)!r} is a folder, not a result file" in line


@pytest.mark.parametrize("inside", [False, True], ids=["out", "out-parent"])
def test_report_refuses_an_out_that_cannot_be_written_before_writing(
        selective, tmp_path, capsys, monkeypatch, inside, refused):
    """``report R.nc --out READONLY_DIR`` printed ``wrote .../selective.html`` and then
    failed with ``Operation not permitted``, without the option. Root (which runs the tests
    here) writes through permissions: ``os.access`` gives, for this folder alone, the answer
    a user gets after the chmod (root: after ``chattr +i``)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    out = locked / "site" if inside else locked
    not_writable(monkeypatch, locked)
    line = refused(["report", selective, "--out", out])
    assert f"--out {str(out)!r}" in line and "not writable" in line
    assert capsys.readouterr().out == ""  # no "wrote ..." line before the refusal
    assert _listing(locked) == [] and sorted(p.name for p in tmp_path.iterdir()) == [
        "locked", "scores"]


# ---------------------------------------------------------------------------------------------
# 6. --caches that hold no prediction cache: the option and the paths


@pytest.mark.parametrize("command", ["score", "plot"])
def test_caches_without_a_complete_cache_name_the_option_and_the_paths(
        tmp_path, capsys, not_netcdf, command, refused):
    """``score selective --caches EMPTY_DIR`` and ``plot --caches EMPTY_DIR`` said only ``no
    complete prediction cache found``."""
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out" / "x.nc"
    argv = (["score", "selective", "--out", out] if command == "score" else
            ["plot", "--out", out.parent])
    line = refused([*argv, "--caches", empty])
    assert f"--caches {str(empty)!r}: no prediction cache found" in line
    line = refused([*argv, "--caches", not_netcdf, tmp_path / "nope"])
    assert f"--caches {str(tmp_path / 'nope')!r} does not exist" in line
    line = refused([*argv, "--caches", not_netcdf])
    assert f"--caches {str(not_netcdf)!r}: no complete prediction cache found" in line
    if command == "score":  # --skip-incomplete scores the others: there are none
        line = refused([*argv, "--caches", not_netcdf, "--skip-incomplete"])
        assert f"--caches {str(not_netcdf)!r}: no complete prediction cache found" in line
    assert not (tmp_path / "out").exists()
