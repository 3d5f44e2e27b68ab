"""Bad input to the report site and to ``verify`` (the audit of the command line), through the
library: a folder given as a result file is said to be a folder; an ``--out`` that cannot be
written is refused, naming it, before anything is read or written; a result file given as the
target of ``verify`` that cannot be read, or that is not a result (a cache), is bad input
(:class:`uqmetrics.InputError`, exit code 2 on the command line), not a disagreement (exit
code 1); ``--rtol``/``--atol`` are refused by their argparse type, naming the option."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from uqmetrics import InputError, ResultSchemaError, stamp_result, write_dataset
from uqmetrics.report import build_site
from uqmetrics.report.verify import verify
from uqmetrics.runs.testing.filesystems import not_writable


def _result(tmp_path: Path, name: str = "toy.nc") -> Path:
    ds = xr.Dataset({"auroc": ("model", np.array([0.7, 0.8]))}, coords={"model": ["a", "b"]})
    return write_dataset(stamp_result(ds, "toy", input_checksums=["ab" * 32],
                                      metrics={"auroc": "auroc"}), tmp_path / name)


def _truncated(tmp_path: Path) -> Path:
    """A result file cut short (a copy that did not finish)."""
    whole = _result(tmp_path, "whole.nc").read_bytes()
    path = tmp_path / "trunc.nc"
    path.write_bytes(whole[: len(whole) // 2])
    return path


def _listing(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


# ---------------------------------------------------------------------------------------------
# the site


def test_a_folder_given_as_a_result_file_is_said_to_be_a_folder(tmp_path):
    """It said ``result file 'scores' does not exist``: it does, as a folder."""
    folder = tmp_path / "scores"
    _result(folder)
    with pytest.raises(InputError, match=r"result '.*scores' is a folder, not a result file"):
        build_site([folder], tmp_path / "site", figures=False)
    assert not (tmp_path / "site").exists()


@pytest.mark.parametrize("exists", [False, True], ids=["new-site", "empty-out"])
def test_an_out_that_cannot_be_written_is_refused_before_anything_is_written(
        tmp_path, monkeypatch, exists):
    """The site was drawn, ``wrote .../toy.html`` said, and then its swap into place failed
    (``Operation not permitted``, without the option): now refused first, naming ``--out``."""
    result = _result(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    out = locked if exists else locked / "site"
    not_writable(monkeypatch, locked)
    lines: list[str] = []
    with pytest.raises(InputError) as exc:
        build_site([result], out, figures=False, log=lines.append)
    assert str(exc.value).startswith(f"--out {str(out)!r}")
    assert "not writable" in str(exc.value) and str(locked) in str(exc.value)
    assert lines == [] and _listing(locked) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["locked", "toy.nc"]  # no temp folder


def test_a_writable_out_still_builds(tmp_path):
    report = build_site([_result(tmp_path)], tmp_path / "site", figures=False)
    assert (report.out / "index.html").is_file()


# ---------------------------------------------------------------------------------------------
# verify


def test_a_target_that_cannot_be_read_is_bad_input_naming_it(tmp_path):
    """A truncated result file was a disagreement (``disagree  the result file cannot be
    read``, exit code 1): it is bad input, named, and nothing is printed."""
    path = _truncated(tmp_path)
    lines: list[str] = []
    with pytest.raises(InputError, match=r"result file .*trunc\.nc could not be read"):
        verify(path, lambda protocol: None, out=lines.append)
    assert lines == []


def test_a_target_that_is_not_a_result_is_refused_naming_it(tmp_path):
    """A file of no protocol (a prediction cache) was "verified": every row disagreed with
    ``protocol (unnamed) records no rescoring``; it is not a result file, named."""
    cache = write_dataset(xr.Dataset({"logits": (("sample", "class"), np.zeros((3, 2)))},
                                     attrs={"kind": "a cache"}), tmp_path / "cache.nc")
    lines: list[str] = []
    with pytest.raises(ResultSchemaError, match=r"cache\.nc does not follow the result-file "
                                                r"schema.*lacks attr 'protocol'"):
        verify(cache, lambda protocol: None, out=lines.append)
    assert lines == []
    # a tool whose results carry no protocol attr names it itself (uqreg): verified as before
    assert verify(cache, lambda protocol: None, protocol_of=lambda ds: "x",
                  out=lines.append) == 1


def test_a_site_entry_whose_file_cannot_be_read_still_disagrees(tmp_path):
    """A site's result file damaged since the site was built is a finding of the
    verification (exit code 1), not bad input: the site is the target."""
    result = _result(tmp_path)
    build_site([result], tmp_path / "site", figures=False, paths="absolute")
    result.write_bytes(result.read_bytes()[:100])
    lines: list[str] = []
    assert verify(tmp_path / "site", lambda protocol: None, out=lines.append) == 1
    assert any("the result file cannot be read" in line for line in lines)


@pytest.mark.parametrize("text", ["-1", "nan", "inf", "abc"])
def test_a_bad_tolerance_is_refused_by_its_argparse_type(text):
    """``verify --rtol -1`` said ``rtol must be ...``: the option's type refuses it, so
    argparse names ``--rtol``."""
    from uqmetrics.report.verify import tolerance

    with pytest.raises(argparse.ArgumentTypeError, match=text):
        tolerance(text)
    assert tolerance("0") == 0.0 and tolerance("1e-6") == 1e-6
