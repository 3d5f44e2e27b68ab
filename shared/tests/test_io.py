"""Tests of uqmetrics.io: provenance attrs and atomic, self-checking result files."""

from __future__ import annotations

import dataclasses
import doctest
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import uqmetrics
from uqmetrics import io as uio
from uqmetrics.io import (
    IncompleteResultError,
    dataset_checksum,
    decode_attr,
    provenance_attrs,
    read_dataset,
    write_dataset,
)


def _result() -> xr.Dataset:
    rng = np.random.default_rng(0)
    return xr.Dataset(
        {
            "coverage": (("method", "complexity", "point"), rng.uniform(size=(2, 3, 4))),
            "n_repetitions": (("method", "complexity", "point"),
                              np.full((2, 3, 4), 50, dtype=np.int64)),
            "in_box": ("point", np.array([True, False, True, True])),
        },
        coords={
            "method": ["blr", "ens_adv"],
            "complexity": [1, 2, 3],
            "x": ("point", np.array([-2.38, 1.2, -5.11, 0.0])),
        },
        attrs={
            "task": "sinusoid",
            "z": 1.96,
            "k": 50,
            "config": {"epochs": [300, 600], "lr": 0.01, "nested": {"a": None}},
            "aleatoric": False,
            "seed": None,
            "methods": ["blr", "ens_adv"],
        },
    )


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_doctests():
    res = doctest.testmod(uio, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert res.attempted > 0
    assert res.failed == 0


def test_round_trip(tmp_path):
    ds = _result()
    ds["coverage"].attrs = {"units": "1", "meta": {"bins": 15}}
    path = write_dataset(ds, tmp_path / "sub" / "dir" / "result.nc")
    assert path == tmp_path / "sub" / "dir" / "result.nc" and path.is_file()
    back = read_dataset(path, decode_attrs=True)
    xr.testing.assert_equal(back, ds)  # values, dims, coords (attrs compared below)
    assert back["coverage"].dtype == np.float64
    assert back["n_repetitions"].dtype == np.int64
    assert back["in_box"].dtype == bool
    assert list(back["method"].values) == ["blr", "ens_adv"]
    for key, value in ds.attrs.items():
        assert back.attrs[key] == value, key
    assert back.attrs["complete"] == 1
    assert list(back.attrs)[-1] == "complete"
    assert back["coverage"].attrs["meta"] == {"bins": 15}
    assert back["coverage"].attrs["units"] == "1"
    assert dataset_checksum(back) == dataset_checksum(ds)
    # without decoding, the non-netCDF attrs are JSON strings
    raw = read_dataset(path)
    assert json.loads(raw.attrs["config"]) == ds.attrs["config"]
    assert raw.attrs["aleatoric"] == "false" and raw.attrs["seed"] == "null"
    # the input was not modified
    assert ds.attrs["config"] == {"epochs": [300, 600], "lr": 0.01, "nested": {"a": None}}
    assert "complete" not in ds.attrs


def test_plain_xarray_can_read_the_file(tmp_path):
    path = write_dataset(_result(), tmp_path / "r.nc", attrs={"extra": 3})
    with xr.open_dataset(path) as plain:
        assert plain.attrs["extra"] == 3
        np.testing.assert_array_equal(plain["coverage"].values, _result()["coverage"].values)


def test_refuses_to_overwrite(tmp_path):
    path = tmp_path / "r.nc"
    write_dataset(_result(), path)
    before = path.read_bytes()
    other = _result() * 0
    with pytest.raises(FileExistsError, match="--overwrite") as info:
        write_dataset(other, path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == before
    assert _leftovers(tmp_path) == []


def test_overwrite_true_replaces(tmp_path):
    path = tmp_path / "r.nc"
    write_dataset(_result(), path)
    first = read_dataset(path)  # read, then replace the same file
    new = _result().assign(coverage=lambda d: d["coverage"] * 0 + 0.5)
    write_dataset(new, path, overwrite=True)
    back = read_dataset(path)
    np.testing.assert_array_equal(back["coverage"].values, 0.5)
    assert dataset_checksum(back) == dataset_checksum(new) != dataset_checksum(first)
    # a dataset read from disk (carrying encodings and the complete flag) can be written again
    write_dataset(back, tmp_path / "copy.nc")
    assert dataset_checksum(read_dataset(tmp_path / "copy.nc")) == dataset_checksum(new)


def test_read_loads_fully_and_closes_the_file(tmp_path):
    path = write_dataset(_result(), tmp_path / "r.nc")
    ds = read_dataset(path)
    if os.path.isdir("/proc/self/fd"):
        targets = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                targets.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                continue
        assert str(path) not in targets
    path.unlink()
    assert float(ds["coverage"].sum()) == pytest.approx(float(_result()["coverage"].sum()))


def test_read_only_some_variables(tmp_path):
    """``variables`` loads those data variables with their coordinates and the global attrs
    (the completeness flag still checked); a missing one is a KeyError naming it."""
    path = write_dataset(_result(), tmp_path / "r.nc")
    ds = read_dataset(path, variables=["in_box"])
    assert list(ds.data_vars) == ["in_box"] and ds["x"].values.tolist() == [-2.38, 1.2, -5.11, 0.0]
    assert ds.attrs["task"] == "sinusoid" and ds.attrs[uio.COMPLETE_ATTR] == 1
    xr.testing.assert_identical(ds["in_box"], read_dataset(path)["in_box"])
    with pytest.raises(KeyError, match="no variables \\['nope'\\]"):
        read_dataset(path, variables=["in_box", "nope"])


class _Boom(RuntimeError):
    pass


@pytest.mark.parametrize("exc", [_Boom, KeyboardInterrupt])
@pytest.mark.parametrize("existing", [False, True])
def test_failed_write_leaves_nothing_behind(tmp_path, monkeypatch, exc, existing):
    path = tmp_path / "r.nc"
    if existing:
        write_dataset(_result(), path)
        before = path.read_bytes()
    real = xr.Dataset.to_netcdf

    def partial_then_fail(self, target, *args, **kwargs):
        real(self, target, *args, **kwargs)  # the temporary file is fully written ...
        with open(target, "r+b") as fh:  # ... then damaged and the writer dies
            fh.truncate(100)
        raise exc("simulated crash")

    monkeypatch.setattr(xr.Dataset, "to_netcdf", partial_then_fail)
    with pytest.raises(exc):
        write_dataset(_result() * 2, path, overwrite=True)
    monkeypatch.undo()
    if existing:
        assert path.read_bytes() == before
        read_dataset(path)
    else:
        assert not path.exists()
    assert _leftovers(tmp_path) == []


def test_failure_after_flagging_leaves_nothing_behind(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(uio, "_fsync_path", fail)
    with pytest.raises(OSError, match="disk full"):
        write_dataset(_result(), tmp_path / "r.nc")
    assert list(tmp_path.iterdir()) == []


def test_file_without_completeness_flag_is_rejected(tmp_path):
    path = tmp_path / "plain.nc"
    _result().drop_attrs().to_netcdf(path, engine="netcdf4")
    with pytest.raises(IncompleteResultError, match="complete"):
        read_dataset(path)
    assert issubclass(IncompleteResultError, ValueError)
    flagged0 = tmp_path / "flag0.nc"
    _result().drop_attrs().assign_attrs(complete=0).to_netcdf(flagged0, engine="netcdf4")
    with pytest.raises(IncompleteResultError):
        read_dataset(flagged0)


def test_truncated_and_missing_files(tmp_path):
    path = write_dataset(_result(), tmp_path / "r.nc")
    data = path.read_bytes()
    bad = tmp_path / "bad.nc"
    bad.write_bytes(data[: len(data) // 3])
    with pytest.raises(IncompleteResultError, match="bad.nc"):
        read_dataset(bad)
    with pytest.raises(FileNotFoundError, match="missing.nc"):
        read_dataset(tmp_path / "missing.nc")


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="ds"):
        write_dataset(_result()["coverage"], tmp_path / "a.nc")
    with pytest.raises(ValueError, match="overwrite"):
        write_dataset(_result(), tmp_path / "a.nc", overwrite="yes")
    with pytest.raises(ValueError, match="attrs"):
        write_dataset(_result(), tmp_path / "a.nc", attrs=[("a", 1)])
    with pytest.raises(ValueError, match="path"):
        write_dataset(_result(), tmp_path)
    with pytest.raises(ValueError, match="odd"):
        write_dataset(_result(), tmp_path / "a.nc", attrs={"odd": object()})
    assert not (tmp_path / "a.nc").exists()


def test_decode_attr():
    assert decode_attr('{"a": [1, 2.5, null]}') == {"a": [1, 2.5, None]}
    assert decode_attr("[1, 2]") == [1, 2]
    assert decode_attr("true") is True and decode_attr("false") is False
    assert decode_attr("null") is None
    assert decode_attr("blr") == "blr"
    assert decode_attr("1.5") == "1.5"  # plain strings are never reinterpreted as numbers
    assert decode_attr("{not json}") == "{not json}"
    assert decode_attr(np.int32(1)) == 1 and type(decode_attr(np.int32(1))) is int
    arr = np.array([1.0, 2.0])
    assert decode_attr(arr) is arr


@dataclasses.dataclass
class _Config:
    task: str = "sinusoid"
    f_main: tuple = (1, 2, 3)
    out: Path = Path("results")


def test_provenance_attrs_contents(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    attrs = provenance_attrs(config=_Config(), seed=123, extra={"device": "cpu", "dry": True})
    for key in ("python_version", "numpy_version", "xarray_version", "uqmetrics_version",
                "git_commit", "git_dirty", "hostname", "created_utc", "config", "seed",
                "conventions", "device"):
        assert key in attrs, key
    assert attrs["numpy_version"] == np.__version__
    assert attrs["xarray_version"] == xr.__version__
    assert attrs["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert attrs["git_commit"] == "unknown"  # tmp_path is not a git checkout
    assert decode_attr(attrs["config"]) == {"task": "sinusoid", "f_main": [1, 2, 3],
                                            "out": "results"}
    assert attrs["seed"] == 123
    assert decode_attr(attrs["conventions"]) == uqmetrics.CONVENTIONS
    assert decode_attr(attrs["dry"]) is True
    assert attrs["created_utc"].endswith("+00:00")
    # everything is storable as is
    for key, value in attrs.items():
        assert isinstance(value, (str, int, float, np.ndarray)) and not isinstance(value, bool), key
    path = write_dataset(_result(), tmp_path / "r.nc", attrs=attrs)
    back = read_dataset(path, decode_attrs=True)
    assert back.attrs["conventions"] == uqmetrics.CONVENTIONS
    assert back.attrs["task"] == "sinusoid"  # the dataset's own attrs survive the merge


def test_provenance_custom_conventions_and_missing_seed():
    attrs = provenance_attrs(conventions={"coverage": "strict <"})
    assert decode_attr(attrs["conventions"]) == {"coverage": "strict <"}
    assert decode_attr(attrs["seed"]) is None and decode_attr(attrs["config"]) is None
    with pytest.raises(ValueError, match="conventions"):
        provenance_attrs(conventions=["a"])
    with pytest.raises(ValueError, match="config"):
        provenance_attrs(config={"f": object()})


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_provenance_records_git_commit(tmp_path, monkeypatch):
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tmp_path.parent)}
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c",
           "commit.gpgsign=false"]
    subprocess.run(git + ["init", "-q", str(tmp_path)], check=True, env=env)
    (tmp_path / "f.txt").write_text("x")
    subprocess.run(git + ["add", "f.txt"], cwd=tmp_path, check=True, env=env)
    subprocess.run(git + ["commit", "-q", "-m", "init"], cwd=tmp_path, check=True, env=env)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True,
                          text=True, check=True, env=env).stdout.strip()
    monkeypatch.chdir(tmp_path)
    attrs = provenance_attrs()
    assert attrs["git_commit"] == head and len(head) == 40
    assert decode_attr(attrs["git_dirty"]) is False
    (tmp_path / "f.txt").write_text("changed")
    assert decode_attr(provenance_attrs()["git_dirty"]) is True


def test_provenance_does_not_import_torch(monkeypatch):
    class _BlockTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError(f"uqmetrics must not import {name}")

    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        monkeypatch.delitem(sys.modules, name)  # restored after the test
    monkeypatch.setattr(sys, "meta_path", [_BlockTorch(), *sys.meta_path])
    attrs = provenance_attrs()
    assert "torch" not in sys.modules
    if "torch_version" in attrs:  # read from metadata, not from the module
        from importlib.metadata import version

        assert attrs["torch_version"] == version("torch")


def test_checksum_detects_changes_and_ignores_order_and_attrs():
    ds = _result()
    ref = dataset_checksum(ds)
    assert len(ref) == 64 and int(ref, 16) >= 0
    reordered = xr.Dataset({k: ds[k] for k in reversed(list(ds.data_vars))}, attrs={})
    assert dataset_checksum(reordered) == ref
    assert dataset_checksum(ds.assign_attrs(new="x")) == ref
    changed = ds.copy(deep=True)
    changed["coverage"].values[1, 2, 3] += 1e-12
    assert dataset_checksum(changed) != ref
    assert dataset_checksum(ds.rename(coverage="cov")) != ref
    assert dataset_checksum(ds.assign_coords(method=["blr", "ens"])) != ref
    assert dataset_checksum(ds.isel(point=slice(0, 3))) != ref
    with pytest.raises(ValueError, match="ds"):
        dataset_checksum(ds["coverage"])


def test_checksum_detects_corruption_on_disk(tmp_path):
    ds = xr.Dataset({"v": ("i", np.arange(10_000, dtype=np.float64))})
    path = write_dataset(ds, tmp_path / "r.nc", compress=False)
    ref = dataset_checksum(read_dataset(path))
    data = bytearray(path.read_bytes())
    # flip one byte inside the (uncompressed) data block: 4999.0 -> a different double
    needle = np.float64(4999.0).tobytes()
    at = bytes(data).find(needle)
    assert at > 0
    data[at + 7] ^= 0x01
    path.write_bytes(bytes(data))
    assert dataset_checksum(read_dataset(path)) != ref


def test_inherited_string_encoding_does_not_truncate_labels(tmp_path):
    """A dataset combined from files with short labels keeps its longer labels when written."""
    short = xr.Dataset({"v": ("method", [1.0])}, coords={"method": ["bd"]})
    write_dataset(short, tmp_path / "short.nc")
    read = read_dataset(tmp_path / "short.nc")
    longer = xr.concat([read, xr.Dataset({"v": ("method", [2.0])}, coords={"method": ["ens_bs"]})], dim="method")
    longer = longer.assign_coords(method=longer.method.copy())
    longer["method"].encoding = dict(read["method"].encoding)  # what combine_by_coords carries over
    write_dataset(longer, tmp_path / "long.nc")
    assert list(read_dataset(tmp_path / "long.nc").method.values) == ["bd", "ens_bs"]


def test_folder_replaced_keeps_the_old_folder_when_the_block_fails(tmp_path):
    from uqmetrics.io import folder_replaced

    out = tmp_path / "data"
    with folder_replaced(out) as tmp:
        (tmp / "v1.txt").write_text("1")
    with pytest.raises(KeyboardInterrupt), folder_replaced(out) as tmp:
        (tmp / "v2.txt").write_text("2")
        raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # no temporary left
    assert sorted(p.name for p in out.iterdir()) == ["v1.txt"]
    with folder_replaced(out) as tmp:
        (tmp / "v3.txt").write_text("3")
    assert sorted(p.name for p in out.iterdir()) == ["v3.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_check_writable_refuses_a_file_where_a_folder_must_be(tmp_path):
    """A regular file as the folder, as its parent or further up, and a link to nowhere are
    refused with the path at fault (meaningful as root, whom permissions do not stop)."""
    from uqmetrics.io import check_writable

    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for folder, culprit in ((tmp_path / "file", tmp_path / "file"),
                            (tmp_path / "file" / "run", tmp_path / "file"),
                            (tmp_path / "file" / "a" / "b", tmp_path / "file"),
                            (tmp_path / "dangling" / "run", tmp_path / "dangling")):
        with pytest.raises(NotADirectoryError) as exc:
            check_writable(folder)
        assert exc.value.filename == str(culprit) and exc.value.strerror == "is not a folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "file"]  # nothing created
    assert (tmp_path / "file").read_text() == "x"


def test_check_writable_accepts_existing_and_missing_folders_and_creates_nothing(tmp_path):
    from uqmetrics.io import check_writable

    check_writable(tmp_path)
    check_writable(tmp_path / "a" / "b" / "c")
    check_writable(os.path.relpath(tmp_path / "a", Path.cwd()))
    assert list(tmp_path.iterdir()) == []


def test_check_writable_refuses_a_folder_without_write_permission(tmp_path, monkeypatch):
    """A folder without write permission. Root (which runs the tests here) writes through
    permissions, so the OS's answer for that folder is made the one a user gets: ``os.access``
    says "not writable" for it alone (as it does for a user after the chmod)."""
    from uqmetrics.io import check_writable

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, *a, **k: False if Path(path) == locked
                        and mode & os.W_OK else access(path, mode, *a, **k))
    try:
        for folder in (locked, locked / "run"):
            with pytest.raises(PermissionError) as exc:
                check_writable(folder)
            assert exc.value.filename == str(locked)
    finally:
        locked.chmod(0o700)
