"""Bad input to ``uqreg verify`` and ``uqreg report`` (the audit of the command line): ONE line
on stderr naming the option or the file, exit code 2 (not 1, a disagreement), no traceback,
nothing written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from uqmetrics import write_dataset
from uqmetrics.runs.testing.filesystems import not_writable

from uqreg import cli


def _refused(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as exc:  # the parser's own errors
        code = exc.code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured.err
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert captured.out == ""
    return lines[0]


@pytest.fixture
def truncated(tmp_path) -> Path:
    whole = write_dataset(xr.Dataset({"x": ("i", np.arange(100.0))}), tmp_path / "whole.nc")
    path = tmp_path / "trunc.nc"
    path.write_bytes(whole.read_bytes()[:200])
    return path


def test_verify_refuses_a_study_file_that_cannot_be_read(truncated, capsys):
    """``uqreg verify trunc.nc`` was a disagreement (``cannot be read``, exit code 1)."""
    line = _refused(capsys, ["verify", truncated])
    assert line.startswith("uqreg verify: error: result file ")
    assert str(truncated.resolve()) in line and "could not be read" in line


@pytest.mark.parametrize("option", ["--rtol", "--atol"])
def test_verify_names_a_bad_tolerance_option(truncated, capsys, option):
    """``uqreg verify --rtol -1`` said ``rtol must be ...``, without the option."""
    line = _refused(capsys, ["verify", option, "-1", truncated])
    assert f"argument {option}: must be a finite number >= 0, got -1" in line


def test_report_refuses_an_out_that_cannot_be_written(tmp_path, capsys, monkeypatch):
    """Root (which runs the tests here) writes through permissions: ``os.access`` gives, for
    this folder alone, the answer a user gets after the chmod."""
    study = write_dataset(xr.Dataset({"x": ("i", np.arange(3.0))}), tmp_path / "study.nc")
    locked = tmp_path / "locked"
    locked.mkdir()
    not_writable(monkeypatch, locked)
    line = _refused(capsys, ["report", study, "--out", locked / "site"])
    assert f"--out {str(locked / 'site')!r}" in line and "not writable" in line
    assert list(locked.iterdir()) == []
