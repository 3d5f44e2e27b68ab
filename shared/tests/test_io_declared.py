"""A result file is data, possibly from someone else (security audit F6): ``read_dataset``
loaded every variable before verifying its checksums, so a file of a few kilobytes declaring
a compressed variable of gigabytes that was never written (HDF5 stores no chunk of it) took
gigabytes of memory. Before anything is loaded, a variable its record of checksums does not
list, and data declared beyond 1000 times the file's size plus 1 GiB, are refused, naming the
file."""

from __future__ import annotations

import shutil
import tracemalloc
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import xarray as xr

from uqmetrics import CorruptResultError, IncompleteResultError, read_dataset, write_dataset
from uqmetrics.runs import io

#: Elements of the variable the crafted files declare: 128 MiB of float64.
N = 1 << 24


@pytest.fixture
def result(tmp_path) -> Path:
    ds = xr.Dataset({"score": (("model",), np.arange(3.0))},
                    coords={"model": ["a", "b", "c"]})
    return write_dataset(ds, tmp_path / "result.nc")


def _crafted(result: Path, name: str, n: int = N) -> Path:
    """A copy of ``result`` with a compressed variable of ``n`` float64 never written: the
    file grows by a few kilobytes."""
    path = result.with_name(name)
    shutil.copy(result, path)
    with netCDF4.Dataset(path, "a") as f:
        f.createDimension("big", n)
        f.createVariable("huge", "f8", ("big",), zlib=True, chunksizes=(1 << 20,),
                         fill_value=0.0)
    assert path.stat().st_size < 100_000
    return path


def _peak(read) -> int:
    """The peak of memory Python and numpy allocated while ``read()`` ran, in bytes."""
    tracemalloc.start()
    try:
        read()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def test_a_variable_its_checksums_do_not_list_is_refused_before_it_is_loaded(result):
    huge = _crafted(result, "added.nc")

    def read():
        with pytest.raises(CorruptResultError) as exc:
            read_dataset(huge)
        assert str(exc.value).startswith(f"{huge}: variable 'huge' is not in its record of "
                                         "checksums (data_checksums): added after the file "
                                         "was written (corrupt); not read")

    assert _peak(read) < N  # 128 MiB declared: not loaded


def test_data_declared_far_beyond_the_files_size_is_refused_unread(result, monkeypatch):
    """The bound is 1000 times the file's size plus 1 GiB; with the slack set to 0 here, so
    that 128 MiB declared in a file of a few kilobytes is over it. Without checksums to
    verify, nothing else would stop the load."""
    monkeypatch.setattr(io, "_DECLARED_SLACK", 0, raising=False)
    huge = _crafted(result, "declared.nc")

    def read():
        with pytest.raises(IncompleteResultError) as exc:
            read_dataset(huge, verify=False)
        size = io._size(huge.stat().st_size)
        assert str(exc.value) == (
            f"{huge} declares 128.0 MiB of data in a file of {size} (more than 1000 times its "
            "size plus 0 B): not read; not a file write_dataset wrote, or damaged")

    assert _peak(read) < N


def test_the_bound_is_generous_for_real_files(result):
    """A result file reads as before, and a well compressed one declaring far more than its
    size (zeros) is within the bound when it records its checksums."""
    assert float(read_dataset(result)["score"].sum()) == 3.0
    zeros = xr.Dataset({"z": (("i",), np.zeros(1 << 22))})  # 32 MiB, a few KiB compressed
    path = write_dataset(zeros, result.with_name("zeros.nc"))
    assert path.stat().st_size < (1 << 22) * 8 // 100
    assert float(read_dataset(path)["z"].sum()) == 0.0
