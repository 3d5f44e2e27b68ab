"""Tests of uqmetrics.runs.io: provenance attrs and atomic, self-checking result files."""

from __future__ import annotations

import dataclasses
import doctest
import errno
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
from uqmetrics.runs import io as uio
from uqmetrics.runs.io import (
    IncompleteResultError,
    dataset_checksum,
    decode_attr,
    provenance_attrs,
    read_dataset,
    write_dataset,
)
from uqmetrics.runs.testing.filesystems import append_only, full_filesystems, not_writable


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


def test_read_variables_given_as_one_string_is_refused(tmp_path):
    """``variables="ab"`` was read as its letters: a file with variables ``a``, ``b`` and
    ``ab`` gave ``a`` and ``b``, silently. A string is refused naming the argument."""
    path = write_dataset(xr.Dataset({n: ("i", [float(k)]) for k, n in enumerate(["a", "b",
                                                                                 "ab"])}),
                         tmp_path / "r.nc")
    with pytest.raises(ValueError, match=r"variables must be a sequence of variable names, got "
                                         r"the string 'ab' \(reading '.*r\.nc'\); give \['ab'\]"):
        read_dataset(path, variables="ab")
    assert list(read_dataset(path, variables=["ab"]).data_vars) == ["ab"]


class _Boom(RuntimeError):
    pass


@pytest.mark.parametrize("exc", [_Boom, KeyboardInterrupt])
@pytest.mark.parametrize("existing", [False, True])
def test_failed_write_leaves_nothing_behind(tmp_path, monkeypatch, exc, existing):
    path = tmp_path / "r.nc"
    if existing:
        write_dataset(_result(), path)
        before = path.read_bytes()
    real = xr.Dataset.dump_to_store  # what writes the data into the temporary file

    def partial_then_fail(self, store, *args, **kwargs):
        real(self, store, *args, **kwargs)  # the temporary file is fully written ...
        store.close()
        (target,) = tmp_path.glob(".*.tmp")
        with open(target, "r+b") as fh:  # ... then damaged and the writer dies
            fh.truncate(100)
        raise exc("simulated crash")

    monkeypatch.setattr(xr.Dataset, "dump_to_store", partial_then_fail)
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
    plain = _result()
    plain.attrs = {}  # its variables have none
    plain.to_netcdf(path, engine="netcdf4")
    with pytest.raises(IncompleteResultError, match="complete"):
        read_dataset(path)
    assert issubclass(IncompleteResultError, ValueError)
    flagged0 = tmp_path / "flag0.nc"
    plain.assign_attrs(complete=0).to_netcdf(flagged0, engine="netcdf4")
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
    attrs = provenance_attrs(config=_Config(), seed=123, extra={"device": "cpu", "dry": True},
                             package="uqmetrics")
    for key in ("python_version", "numpy_version", "xarray_version", "uqmetrics_version",
                "git_commit", "git_dirty", "hostname", "created_utc", "config", "seed",
                "conventions", "device"):
        assert key in attrs, key
    assert attrs["numpy_version"] == np.__version__
    assert attrs["xarray_version"] == xr.__version__
    assert attrs["python_version"] == ".".join(map(str, sys.version_info[:3]))
    # the commit of the code that ran (uqmetrics' own checkout, or "unknown"), not tmp_path's
    assert attrs["git_commit"] == (uio.source_revision("uqmetrics")[0] or "unknown")
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


_GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c",
        "commit.gpgsign=false"]


def _git_repo(folder: Path, files: dict[str, str]) -> str:
    """A git repository in ``folder`` with ``files`` committed; its HEAD."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(_GIT + ["init", "-q", str(folder)], check=True)
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    subprocess.run(_GIT + ["add", *files], cwd=folder, check=True)
    subprocess.run(_GIT + ["commit", "-q", "-m", "init"], cwd=folder, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True,
                          text=True, check=True).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_provenance_never_records_the_working_directorys_repository(tmp_path, monkeypatch):
    """Issue 24, row 3: a command run from inside another git repository recorded THAT
    repository's HEAD as the code's commit. It records the commit of the checkout that tracks
    the installed uqmetrics, or "unknown" (an install that is not a checkout), whatever the
    current directory."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    other = _git_repo(tmp_path / "elsewhere", {"f.txt": "x"})
    monkeypatch.chdir(tmp_path / "elsewhere")
    # the default package is the caller's: this test module, tracked by the project's checkout
    assert provenance_attrs()["git_commit"] != other
    attrs = provenance_attrs(package="uqmetrics")
    assert attrs["git_commit"] != other
    expected = uio.source_revision("uqmetrics")  # "unknown" for uqmetrics installed by tox
    assert attrs["git_commit"] == (expected[0] or "unknown")
    assert decode_attr(attrs["git_dirty"]) == expected[1]


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_provenance_records_the_commit_of_the_calling_packages_checkout(tmp_path, monkeypatch):
    """A package imported from a git checkout that tracks it: its HEAD, and whether tracked
    files changed; the caller's package is found from the calling module. An untracked copy
    inside a checkout (a virtual environment in it) is "unknown"."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    code = ("from uqmetrics.runs.io import provenance_attrs\n\n\ndef attrs():\n"
            "    return provenance_attrs()\n")
    head = _git_repo(tmp_path / "repo", {"src/fakepkg24/__init__.py": code})
    untracked = tmp_path / "repo" / "venv" / "fakepkg24b"
    untracked.mkdir(parents=True)
    (untracked / "__init__.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path / "repo" / "src"))
    monkeypatch.syspath_prepend(str(tmp_path / "repo" / "venv"))
    monkeypatch.chdir(tmp_path)
    import fakepkg24
    import fakepkg24b

    try:
        attrs = fakepkg24.attrs()
        assert attrs["git_commit"] == head and len(head) == 40
        assert decode_attr(attrs["git_dirty"]) is False
        assert provenance_attrs(package="fakepkg24")["git_commit"] == head
        (tmp_path / "repo" / "src" / "fakepkg24" / "__init__.py").write_text(code + "# edit\n")
        assert decode_attr(fakepkg24.attrs()["git_dirty"]) is True
        assert fakepkg24b.attrs()["git_commit"] == "unknown"  # in the work tree, not tracked
    finally:
        for name in ("fakepkg24", "fakepkg24b"):
            sys.modules.pop(name, None)


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


def _flip(path: Path, value: np.generic, byte: int, mask: int = 0x01) -> None:
    """Flip bits ``mask`` of byte ``byte`` of the one place ``value`` is stored in ``path``
    (uncompressed data: the file still opens)."""
    data = bytearray(path.read_bytes())
    needle = value.tobytes()
    at = bytes(data).find(needle)
    assert at > 0 and bytes(data).count(needle) == 1
    data[at + byte] ^= mask
    path.write_bytes(bytes(data))


def test_checksum_detects_corruption_on_disk(tmp_path):
    """A flipped bit in a file's data: ``read_dataset`` refuses it, naming the file and the
    variable (it read it silently before); unverified, the data read differently."""
    ds = xr.Dataset({"v": ("i", np.arange(10_000, dtype=np.float64))})
    path = write_dataset(ds, tmp_path / "r.nc", compress=False)
    ref = dataset_checksum(read_dataset(path))
    _flip(path, np.float64(4999.0), 7)  # 4999.0 -> a different double
    with pytest.raises(uio.CorruptResultError) as info:
        read_dataset(path)
    assert str(path) in str(info.value) and "'v'" in str(info.value)
    assert isinstance(info.value, IncompleteResultError) and info.value.path == path
    assert dataset_checksum(read_dataset(path, verify=False)) != ref


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
    from uqmetrics.runs.io import WRITTEN_RECORD, folder_replaced

    out = tmp_path / "data"
    with folder_replaced(out) as tmp:
        (tmp / "v1.txt").write_text("1")
    with pytest.raises(KeyboardInterrupt), folder_replaced(out) as tmp:
        (tmp / "v2.txt").write_text("2")
        raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # no temporary left
    assert sorted(p.name for p in out.iterdir()) == [WRITTEN_RECORD, "v1.txt"]
    with folder_replaced(out) as tmp:
        (tmp / "v3.txt").write_text("3")
    assert sorted(p.name for p in out.iterdir()) == [WRITTEN_RECORD, "v3.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_check_writable_refuses_a_file_where_a_folder_must_be(tmp_path):
    """A regular file as the folder, as its parent or further up, and a link to nowhere are
    refused with the path at fault (meaningful as root, whom permissions do not stop)."""
    from uqmetrics.runs.io import check_writable

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
    from uqmetrics.runs.io import check_writable

    check_writable(tmp_path)
    check_writable(tmp_path / "a" / "b" / "c")
    check_writable(os.path.relpath(tmp_path / "a", Path.cwd()))
    assert list(tmp_path.iterdir()) == []


def test_check_writable_refuses_a_folder_without_write_permission(tmp_path, monkeypatch):
    """A folder without write permission. Root (which runs the tests here) writes through
    permissions, so the OS's answer for that folder is made the one a user gets: ``os.access``
    says "not writable" for it alone (as it does for a user after the chmod)."""
    from uqmetrics.runs.io import check_writable

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    not_writable(monkeypatch, locked)
    try:
        for folder in (locked, locked / "run"):
            with pytest.raises(PermissionError) as exc:
                check_writable(folder)
            assert exc.value.filename == str(locked)
    finally:
        locked.chmod(0o700)


# ---------------------------------------------------------------------------------------------
# issue 24: data checksums, damaged files, full disks, failed clean-ups, locks


def test_a_flipped_coordinate_value_is_refused_naming_it(tmp_path):
    """F1 (generic): one value of a coordinate flipped on disk (uncompressed, the file still
    opens and reads) was read silently; it is refused naming the coordinate. Reading only some
    variables verifies those read (a flipped value elsewhere is not looked at)."""
    path = write_dataset(_result(), tmp_path / "r.nc")
    _flip(path, np.float64(-5.11), 7, 0x40)  # x[2]: -5.11 -> about -1e154
    with pytest.raises(uio.CorruptResultError, match=r"variable 'x' does not match the checksum"):
        read_dataset(path)
    assert read_dataset(path, verify=False)["x"].values[2] != -5.11
    with pytest.raises(uio.CorruptResultError, match="'x'"):  # the coordinate of what is read
        read_dataset(path, variables=["in_box"])
    path = write_dataset(_result(), tmp_path / "plain.nc", compress=False)
    _flip(path, np.float64(_result()["coverage"].values[1, 2, 3]), 7, 0x40)
    assert read_dataset(path, variables=["in_box"])["in_box"].values.tolist() == [True, False,
                                                                                True, True]
    with pytest.raises(uio.CorruptResultError, match="'coverage'"):
        read_dataset(path, variables=["coverage"])


def test_a_file_without_checksums_is_read_unverified(tmp_path):
    """A file written before the checksums were recorded (the attr removed on disk with
    netCDF4, as such a file lacks it) reads as before, damage and all; every new file has
    the record, and its digests are per variable."""
    import netCDF4

    path = write_dataset(_result(), tmp_path / "r.nc")
    record = json.loads(read_dataset(path).attrs[uio.CHECKSUM_ATTR])
    assert record["algorithm"] == "blake2b-256"
    assert sorted(record["variables"]) == sorted(str(n) for n in _result().variables)
    with netCDF4.Dataset(path, "a") as nc:
        nc.delncattr(uio.CHECKSUM_ATTR)
    _flip(path, np.float64(-5.11), 7, 0x40)
    assert read_dataset(path)["x"].values[2] != -5.11  # unverified: read as it is
    # a damaged record is a corrupt file
    path = write_dataset(_result(), tmp_path / "r2.nc")
    with netCDF4.Dataset(path, "a") as nc:
        nc.setncattr(uio.CHECKSUM_ATTR, "{not json")
    with pytest.raises(uio.CorruptResultError, match="record of checksums"):
        read_dataset(path)
    # an algorithm this version does not know (one flipped byte of its name, or a later
    # version's): refused, never read unverified (before, the flip turned the check off)
    path = write_dataset(_result(), tmp_path / "r3.nc")
    record = json.loads(read_dataset(path).attrs[uio.CHECKSUM_ATTR])
    with netCDF4.Dataset(path, "a") as nc:
        nc.setncattr(uio.CHECKSUM_ATTR, json.dumps({**record, "algorithm": "blake2b-25\x16"}))
    _flip(path, np.float64(-5.11), 7, 0x40)
    with pytest.raises(uio.CorruptResultError, match=r"names the algorithm 'blake2b-25\\x16', not "
                                                     r"'blake2b-256' \(damaged, or written by a "
                                                     r"later uqmetrics: upgrade it\)") as info:
        read_dataset(path)
    assert str(path) in str(info.value)


def test_edited_flags_and_records_are_damaged_files_named(tmp_path):
    """A hostile or damaged file's record of checksums nested past Python's stack (``[[[...``)
    raised a bare ``RecursionError`` from ``read_dataset`` and ``is_complete`` (a sweep
    stopped at its plan), and a ``complete`` attr of two values a bare ``ValueError`` (the
    truth value of an array): each is a damaged file, named; a sweep recomputes it; and
    ``decode_attr`` leaves a value nested too deep as it is."""
    import netCDF4

    from uqmetrics.runs.sweep import is_complete

    deep = "[" * 100_000 + "]" * 100_000
    path = write_dataset(_result(), tmp_path / "deep.nc")
    with netCDF4.Dataset(path, "a") as nc:
        nc.setncattr(uio.CHECKSUM_ATTR, deep)
    with pytest.raises(uio.CorruptResultError, match="record of checksums") as info:
        read_dataset(path)
    assert str(path) in str(info.value)
    assert not is_complete(path)
    assert decode_attr(deep) == deep
    path = write_dataset(_result(), tmp_path / "flag.nc")
    with netCDF4.Dataset(path, "a") as nc:
        nc.setncattr(uio.COMPLETE_ATTR, np.array([1, 1], dtype=np.int32))
    with pytest.raises(IncompleteResultError, match="completeness flag") as info:
        read_dataset(path)
    assert str(path) in str(info.value)
    assert not is_complete(path)


def test_a_dataset_read_back_and_written_again_gets_a_fresh_record(tmp_path):
    """The record of a file read is not carried into another file (where it would not
    match): each write records its own."""
    first = read_dataset(write_dataset(_result(), tmp_path / "a.nc"))
    changed = first.assign(coverage=first["coverage"] * 2)
    back = read_dataset(write_dataset(changed, tmp_path / "b.nc"))
    np.testing.assert_array_equal(back["coverage"].values, _result()["coverage"].values * 2)
    assert back.attrs[uio.CHECKSUM_ATTR] != first.attrs[uio.CHECKSUM_ATTR]


def test_values_decoding_changes_verify_as_read(tmp_path):
    """What is recorded is what reads back: a negative NaN (which reads back as NaN) and a
    variable with time units (which reads back as timedeltas) verify."""
    neg_nan = np.array([1.0, -np.nan, 2.0])
    assert np.signbit(neg_nan[1])
    ds = xr.Dataset({"v": ("i", neg_nan), "t": ("i", [1.0, 2.0, 3.0], {"units": "seconds"})})
    back = read_dataset(write_dataset(ds, tmp_path / "r.nc"))
    assert np.isnan(back["v"].values[1])


@pytest.fixture
def disk_full(tmp_path):
    """``disk_full(leave) -> folder``: a real 1 MiB file system (tmpfs) filled up but
    ``leave`` bytes (:func:`uqmetrics.runs.testing.filesystems.full_filesystems`; needs root)."""
    with full_filesystems(tmp_path) as make:
        yield make


@pytest.mark.parametrize("leave", [0, 16384])
def test_a_full_disk_is_one_line_naming_the_file_and_no_space(tmp_path, disk_full, capsys,
                                                                leave):
    """F3: a write that fills the disk raised ``RuntimeError: NetCDF: HDF error`` (a traceback,
    exit 1) when the file could be created, ``PermissionError`` naming the temporary file when
    it could not: it is ``OSError(ENOSPC)`` naming the target, one line "no space left" under
    ``run_command`` (exit 2), and no temporary file stays."""
    from uqmetrics.metrics.exceptions import run_command

    folder = disk_full(leave)
    target = folder / "sub" / "r.nc"
    big = xr.Dataset({"v": ("i", np.random.default_rng(0).normal(size=25_000))})
    with pytest.raises(OSError) as info:
        write_dataset(big, target)
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)
    assert not target.exists() and _leftovers(target.parent) == []
    assert run_command("uqtest", "write", lambda: write_dataset(big, target) and 0) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"uqtest write: error: {target}: ")
    assert "no space left on the device" in err
    # the space the failed writes took is free again (HDF5 keeps a file it could not close
    # open: emptied, it holds none), and a write that fits works there
    free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize
    assert free >= leave
    (folder / "filler").unlink()
    small = write_dataset(xr.Dataset({"v": ("i", [1.0])}), folder / "small.nc")
    assert read_dataset(small)["v"].values.tolist() == [1.0]


def test_other_write_errors_are_not_taken_for_a_full_disk(tmp_path):
    """An existing target, a folder where the file must go: their own errors."""
    path = write_dataset(_result(), tmp_path / "r.nc")
    with pytest.raises(FileExistsError):
        write_dataset(_result(), path)
    (tmp_path / "d.nc").mkdir()
    with pytest.raises(ValueError, match="directory"):
        write_dataset(_result(), tmp_path / "d.nc")


def test_a_failed_clean_up_does_not_hide_the_error_and_is_cleaned_later(tmp_path):
    """F6: a folder in which files can be created but none removed or renamed (``chattr +a``:
    a folder that turned read-only after the temporary file was made; root too): the write
    fails at the rename, its temporary file cannot be removed, and the clean-up raised its own
    error instead of the write's. The write's error is raised; the file is removed by
    :func:`remove_stale_temporaries` once the folder allows it."""
    out = tmp_path / "out"
    out.mkdir()
    with append_only(out):
        with pytest.raises(PermissionError) as info:
            write_dataset(_result(), out / "r.nc", overwrite=True)
        assert info.value.filename == str(out / "r.nc") or info.value.filename2 == str(
            out / "r.nc")
        assert len(_leftovers(out)) == 1
    (out / "notes.tmp").write_text("not ours")
    removed = uio.remove_stale_temporaries(out)
    assert len(removed) == 1 and _leftovers(out) == ["notes.tmp"]


_HOLD = """
import sys, time
from uqmetrics.runs.io import exclusive_lock
with exclusive_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def test_exclusive_lock_refuses_another_process_naming_it_and_dies_with_its_holder(tmp_path):
    """Row 2: a lock held by a real process refuses this one at once, naming the lock file
    and the holder's pid; when the holder is killed (SIGKILL) the lock is free again."""
    lock = tmp_path / "out" / ".r.nc.lock"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(lock)], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                  sys.path)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(uio.LockedError) as info, uio.exclusive_lock(lock, advice="wait for it"):
            pass
        assert info.value.filename == str(lock) and info.value.errno == errno.EAGAIN
        assert f"pid {holder.pid} " in info.value.strerror
        assert info.value.strerror.endswith("; wait for it")
        from uqmetrics import error_line

        line = error_line(info.value)
        assert line.startswith(f"{lock}: is held by another process (pid {holder.pid} ")
        assert "\n" not in line
    finally:
        holder.kill()
        holder.wait()
    with uio.exclusive_lock(lock) as held:  # released by the kernel with its holder
        assert held == lock and f"pid {os.getpid()} " in lock.read_text()
    assert not lock.exists()


def _flip_attribute_block(path: Path) -> None:
    """Flip a bit of the first fractal-heap block of ``path`` (its signature ``FHDB``): the
    block where HDF5 keeps the attributes of an object with many (the file still opens; its
    attributes do not)."""
    data = bytearray(path.read_bytes())
    at = bytes(data).find(b"FHDB")
    assert at > 0
    data[at] ^= 0x80
    path.write_bytes(bytes(data))


def test_an_attribute_netcdf_cannot_open_is_an_unreadable_file(tmp_path):
    """F5: a flipped bit in the block holding a file's attributes raised netCDF4's
    ``AttributeError: NetCDF: Can't open HDF5 attribute`` (no file named; not an
    :class:`IncompleteResultError`, so a sweep stopped on it). It is an unreadable file,
    named."""
    path = write_dataset(_result(), tmp_path / "r.nc", attrs=provenance_attrs())
    _flip_attribute_block(path)
    with pytest.raises(IncompleteResultError, match="could not be read") as info:
        read_dataset(path)
    assert str(path) in str(info.value) and "Can't open HDF5 attribute" in str(info.value)
    assert not isinstance(info.value, uio.CorruptResultError)
    assert isinstance(info.value.__cause__, AttributeError)


def test_writes_and_reads_in_other_threads_at_once_all_succeed(tmp_path):
    """netCDF-C/HDF5 is not thread-safe: a sweep writes a cell's file behind (in a thread of its
    own) while the caller reads others. Every use of the library holds one lock
    (:data:`~uqmetrics.runs.io.NETCDF_LOCK`): threads writing and reading at once all succeed,
    and every file reads back as written. Before, only xarray's per-call lock was held, and
    this test crashed the process (segmentation fault) or failed a write (``NetCDF: HDF
    error``)."""
    import threading

    ds, errors, rounds = _result(), [], 40
    write_dataset(ds, tmp_path / "read.nc")

    def writer(k: int) -> None:
        try:
            for i in range(rounds):
                write_dataset(ds * (k + i), tmp_path / f"w{k}-{i}.nc")
        except Exception as exc:  # noqa: BLE001  (collected, asserted below)
            errors.append(exc)

    def reader() -> None:
        try:
            for _ in range(3 * rounds):
                read_dataset(tmp_path / "read.nc")
                with uio.open_netcdf(tmp_path / "read.nc") as header:
                    header.attrs.get("complete")
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(2)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for k in range(2):
        for i in range(rounds):
            xr.testing.assert_equal(read_dataset(tmp_path / f"w{k}-{i}.nc"), ds * (k + i))


@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="no fork on this platform")
def test_a_child_forked_while_a_file_is_written_does_not_fail_the_write(tmp_path, monkeypatch):
    """A sweep's cell writes its file in a thread while the next cell starts its DataLoader,
    whose workers are forked. A child forked while the file was open inherited its descriptor
    and HDF5's lock on it (``flock``) until it exited, and reopening the file to flag it
    complete failed (``OSError: [Errno -101] NetCDF: HDF error``). The fork now waits for
    :data:`~uqmetrics.runs.io.NETCDF_LOCK`: here a child is forked, in another thread, at the
    moment the data are in the file and it is still open, and lives on for 4 s. Before, the
    write failed; now the fork waits (up to the 2 s the writer gives it, then the write ends
    and the fork goes ahead), and the file reads back complete."""
    import multiprocessing
    import threading
    import time

    ds = _result()
    opened, forked, children = threading.Event(), threading.Event(), []
    dump = xr.Dataset.dump_to_store

    def dump_then_let_a_fork_in(self, store, **kwargs):
        dump(self, store, **kwargs)
        opened.set()
        forked.wait(2)  # a fork that does not wait for the lock happens now, the file open

    def fork() -> None:
        opened.wait(30)
        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(4,))
        child.start()
        children.append(child)
        forked.set()

    monkeypatch.setattr(xr.Dataset, "dump_to_store", dump_then_let_a_fork_in)
    forking = threading.Thread(target=fork)
    forking.start()
    try:
        write_dataset(ds, tmp_path / "r.nc")
    finally:
        forking.join()
        for child in children:
            child.terminate()
            child.join()
    monkeypatch.undo()
    assert len(children) == 1 and read_dataset(tmp_path / "r.nc").attrs[uio.COMPLETE_ATTR] == 1
    xr.testing.assert_equal(read_dataset(tmp_path / "r.nc"), ds)


def test_a_write_under_a_dask_client_asks_its_scheduler_for_no_lock(tmp_path):
    """With a ``dask.distributed`` client active, xarray's ``to_netcdf`` takes a
    ``distributed.Lock`` named after the file, a round trip to the scheduler per netCDF call,
    which fails once that client is closed (seen as ``RuntimeError: ConnectionPool is closed``
    when a file manager is collected later). A temporary file has a name of its own and one
    writer: :func:`write_dataset` takes only the process's netCDF lock, in the caller and in a
    task alike."""
    from dask.distributed import Client, LocalCluster

    def leases(dask_scheduler) -> list[str]:
        return sorted(dask_scheduler.extensions["semaphores"].max_leases)

    with LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        write_dataset(_result(), tmp_path / "caller.nc")
        client.submit(write_dataset, _result(), str(tmp_path / "task.nc"), pure=False).result()
        assert client.run_on_scheduler(leases) == []
    for name in ("caller.nc", "task.nc"):
        xr.testing.assert_equal(read_dataset(tmp_path / name), _result())
