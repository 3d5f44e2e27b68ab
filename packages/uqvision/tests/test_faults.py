"""Faults of the disk and of other processes (issue 24): a full disk, caches damaged on disk
(an attribute netCDF cannot open, data that changed), two runs into one cache folder.

Each is met by the real command (``uqvision.cli.main``, or ``python -m uqvision`` in processes
of its own) on real files: caches written by the code, then bytes flipped on disk; a full disk
is a real small file system (tmpfs, which mounting needs root for: skipped elsewhere).
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from uqmetrics import provenance_attrs, read_dataset, write_dataset
from uqmetrics.runs.testing.filesystems import full_filesystems

from uqvision.cache import cache_dataset, cache_key, read_cache
from uqvision.cli import main
from uqvision.predict import PredictConfig, check_caches

#: ``uqvision predict`` of a random-init test network (no weights needed), tiny and quick.
MODEL = "test_byobnet"
PREDICT = ["--model", MODEL, "--random-init", "--batch-size", "32"]


def _cache(out, dataset="test", mode="plain", pass_index=0):
    return out / f"{cache_key(MODEL, dataset, mode, pass_index)}.nc"


#: A progress line of the work done before a failure (stderr, not a terminal).
_PROGRESS = re.compile(r"^.+: \d+/\d+ \w+ \(\d+%\)")


def _one_line(err: str, command: str) -> str:
    """The error: one line, the last of stderr; only progress lines of the work done before
    the failure may precede it."""
    lines = err.splitlines()
    assert lines and lines[-1].startswith(f"uqvision {command}: error: "), err
    assert all(_PROGRESS.match(line) for line in lines[:-1]), err
    assert "Traceback" not in err
    return lines[-1] + "\n"


@pytest.fixture
def disk_full(tmp_path):
    """``disk_full(leave) -> folder``: a real 1 MiB file system (tmpfs) filled up but
    ``leave`` bytes (:func:`uqmetrics.runs.testing.filesystems.full_filesystems`; needs root)."""
    with full_filesystems(tmp_path) as make:
        yield make


@pytest.fixture
def synthetic_caches(tmp_path, member_logits):
    """A folder of two plain caches (50 samples, 4 classes) that ``score`` scores, with the
    provenance attrs of a real cache (so many that HDF5 keeps them in a block of their own)."""
    folder = tmp_path / "caches"
    folder.mkdir()
    y, z = member_logits(np.random.default_rng(0), 50, 4, 2)
    for k in range(2):
        attrs = {**provenance_attrs(seed=k), "model": f"m{k}", "dataset_name": "test",
                 "mode": "plain", "pass_index": 0}
        ds = cache_dataset(z[k], y, samples=[f"{i:05d}.png" for i in range(50)],
                           classes=[f"c{j}" for j in range(4)], attrs=attrs)
        write_dataset(ds, folder / f"{cache_key(f'm{k}', 'test', 'plain', 0)}.nc")
    return folder


# ---------------------------------------------------------------------------------------------
# F3: a full disk


def test_predict_on_a_full_disk_is_one_line_no_space_naming_the_cache(digits, disk_full, capsys):
    """``uqvision predict`` whose cache fills the disk stopped with a traceback of
    ``RuntimeError: NetCDF: HDF error`` (exit 1): no path, no "no space". One line naming the
    cache and "no space left", exit 2; no temporary or lock file stays, nor the --out folder
    it created."""
    out = disk_full() / "caches"
    code = main(["predict", *PREDICT, "--data", str(digits / "test"), "--out", str(out)])
    err = _one_line(capsys.readouterr().err, "predict")
    assert code == 2
    assert f"{_cache(out)}: cannot be written: no space left on the device" in err
    assert not out.exists()  # the folder it made, empty, is removed with it: nothing stays


def test_score_on_a_full_disk_is_one_line_no_space_naming_the_score_file(synthetic_caches,
                                                                         disk_full, capsys):
    out = disk_full() / "scores" / "selective.nc"
    code = main(["score", "selective", "--caches", str(synthetic_caches),
                 "--out", str(out), "--calibration-size", "0.3"])
    err = _one_line(capsys.readouterr().err, "score selective")
    assert code == 2
    assert f"{out}: cannot be written: no space left on the device" in err
    assert sorted(p.name for p in out.parent.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# F5: a bit flip in a cache's attributes


def _flip_attribute_block(path) -> None:
    """Flip a bit of the first fractal-heap block of a cache (its signature ``FHDB``): where
    HDF5 keeps the attributes of an object with many, as a cache's global attrs. The file
    still opens; netCDF cannot open its attributes."""
    data = bytearray(path.read_bytes())
    at = bytes(data).find(b"FHDB")
    assert at > 0
    data[at] ^= 0x80
    path.write_bytes(bytes(data))


def test_score_refuses_a_cache_whose_attributes_cannot_be_opened(synthetic_caches, tmp_path,
                                                                 capsys):
    """``score`` crashed with ``AttributeError: NetCDF: Can't open HDF5 attribute`` (no file
    named). It refuses in one line naming the file as unreadable; with --skip-incomplete it
    scores the others."""
    bad = sorted(synthetic_caches.glob("*.nc"))[1]
    _flip_attribute_block(bad)
    args = ["score", "selective", "--caches", str(synthetic_caches),
            "--calibration-size", "0.3"]
    code = main([*args, "--out", str(tmp_path / "s.nc")])
    err = _one_line(capsys.readouterr().err, "score selective")
    assert code == 2 and f"{bad.name} (unreadable" in err and "--skip-incomplete" in err
    assert main([*args, "--out", str(tmp_path / "s.nc"), "--skip-incomplete"]) == 0
    assert list(read_dataset(tmp_path / "s.nc")["model"].values) == ["m0"]


def test_predict_and_the_sweep_recompute_a_cache_whose_attributes_cannot_be_opened(
        digits, tmp_path, capsys):
    """``predict`` (through ``check_caches``) and the zoo sweep (which checks the caches on
    disk the same way, then skips the complete ones) crashed on the cache with the
    AttributeError; one damaged file blocked the whole sweep. Unreadable is unfinished: the
    cache is recomputed (it holds nothing to lose)."""
    from dask import distributed

    from uqvision.sweep import sweep_predictions

    out = tmp_path / "caches"
    args = ["predict", *PREDICT, "--data", str(digits / "test"), "--out", str(out)]
    assert main(args) == 0
    path = _cache(out)
    good = read_cache(path)["logits"].values
    _flip_attribute_block(path)
    config = PredictConfig(allow_random_init=True, batch_size=32, num_workers=0)
    _, missing = check_caches(MODEL, digits / "test", out, config)
    assert missing == {(0, 0)}
    assert main(args) == 0
    np.testing.assert_array_equal(read_cache(path)["logits"].values, good)

    _flip_attribute_block(path)
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=1,
                            dashboard_address=None) as client:
        report = sweep_predictions([MODEL], digits / "test", out, config, client=client,
                                   failures_file=tmp_path / "failures.json")
    assert not report.failed_models and [p.name for p in report.computed] == [path.name]
    np.testing.assert_array_equal(read_cache(path)["logits"].values, good)


# ---------------------------------------------------------------------------------------------
# data that changed on disk: refused, saying how to recompute


@pytest.mark.parametrize("recorded", ["file", "cache"], ids=["file-checksums", "cache-checksum"])
def test_a_cache_whose_data_changed_is_refused_saying_how_to_recompute_it(
        synthetic_caches, tmp_path, capsys, recorded):
    """A cache whose logits changed on disk (edited in place with netCDF4), checked by the
    per-variable checksums every result file records or, for a cache written before them,
    by the cache's own ``checksum``: ``score`` refused it advising to "recompute it", which
    a plain rerun never does; it says: delete the file or pass --overwrite."""
    import netCDF4

    bad = min(synthetic_caches.glob("*.nc"))
    with netCDF4.Dataset(bad, "a") as nc:
        nc["logits"][0, 0] = 99.0
        if recorded == "cache" and "data_checksums" in nc.ncattrs():
            nc.delncattr("data_checksums")  # as a cache written before they were recorded
    code = main(["score", "selective", "--caches", str(synthetic_caches),
                 "--out", str(tmp_path / "s.nc"), "--calibration-size", "0.3"])
    err = _one_line(capsys.readouterr().err, "score selective")
    assert code == 2 and str(bad) in err and "checksum" in err
    assert "delete the file" in err and "--overwrite" in err


def test_predict_refuses_a_cache_whose_data_changed_saying_how_to_recompute_it(digits, tmp_path,
                                                                              capsys):
    """``predict`` over a cache whose data changed on disk: refused (never replaced without
    --overwrite), the one line saying to delete the file or pass --overwrite; kept as it is."""
    import netCDF4

    out = tmp_path / "caches"
    args = ["predict", *PREDICT, "--data", str(digits / "test"), "--out", str(out)]
    assert main(args) == 0
    path = _cache(out)
    with netCDF4.Dataset(path, "a") as nc:
        nc["logits"][0, 0] = 99.0
    before = path.read_bytes()
    capsys.readouterr()
    assert main(args) == 2
    err = _one_line(capsys.readouterr().err, "predict")
    assert str(path) in err and "'logits' does not match the checksum" in err
    assert "delete the file" in err and "--overwrite" in err
    assert path.read_bytes() == before
    assert main([*args, "--overwrite"]) == 0
    assert read_cache(path)["logits"].values[0, 0] != 99.0


# ---------------------------------------------------------------------------------------------
# row 2: two runs into one --out

#: Holds a lock as :func:`uqmetrics.runs.io.exclusive_lock` does (``flock``, the holder written in
#: the file), in a process of its own.
HOLD = textwrap.dedent("""
    import fcntl, os, socket, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}: uqvision predict".encode())
    print("held", flush=True)
    time.sleep(120)
""")


def _predict_process(digits, out, *extra):
    return subprocess.Popen([sys.executable, "-m", "uqvision", "--threads", "1", "predict",
                             *PREDICT, "--data", str(digits / "test"), "--out", str(out),
                             "--workers", "0", *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_predict_is_refused_while_another_process_computes_the_cache(digits, tmp_path):
    """A real ``uqvision predict`` while another process holds the cache's lock: it went on
    and replaced whatever the other wrote; it is refused at once, one line naming the lock
    and the process, exit 2, and writes nothing."""
    out = tmp_path / "caches"
    out.mkdir()
    lock = out / f".{_cache(out).name}.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = _predict_process(digits, out)
        _, err = proc.communicate(timeout=300)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2, err
    _one_line(err, "predict")
    assert err.startswith(f"uqvision predict: error: {lock}: is held by another process "
                          f"(pid {holder.pid} on "), err
    assert err.rstrip().endswith("wait for it to finish, or write to another --out")
    assert sorted(p.name for p in out.iterdir()) == [lock.name]  # the holder's


def test_two_predict_runs_into_one_folder_never_replace_each_others_cache(digits, tmp_path):
    """Two ``uqvision predict`` processes at once into one --out, one with --channels-last
    (another cache identity): both exited 0 and one cache silently replaced the other's. One
    of them computes and writes its caches; the other is refused in one line (the lock is
    held, or, when it comes after, the caches there are of other inputs), and the caches are
    those of the run that exited 0."""
    out = tmp_path / "caches"
    extra = ["--mode", "tta", "--passes", "6", "--tta-policy", "crop"]  # a few seconds' work
    runs = {False: _predict_process(digits, out, *extra, "--no-channels-last"),
            True: _predict_process(digits, out, *extra, "--channels-last")}
    results = {cl: p.communicate(timeout=600) for cl, p in runs.items()}
    codes = {cl: p.returncode for cl, p in runs.items()}
    assert sorted(codes.values()) == [0, 2], results
    winner = next(cl for cl, code in codes.items() if code == 0)
    err = _one_line(results[not winner][1], "predict")
    assert ("is held by another process" in err or "computed from other inputs" in err), err
    caches = sorted(out.glob("*.nc"))
    assert len(caches) == 6
    for path in caches:
        assert int(read_cache(path).attrs["channels_last"]) == int(winner), path
    assert not [p for p in out.iterdir() if p.name.endswith((".tmp", ".lock"))]
