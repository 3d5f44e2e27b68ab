"""Sweep progress (uqmetrics.runs.sweep): on a stream that is not a terminal (CI logs, a pipe), at
most one line per interval plus one at the end, never a bar redrawn per cell."""

import doctest
import io
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tqdm
import xarray as xr
from dask import distributed

from uqmetrics.runs import sweep
from uqmetrics.runs.sweep import LOG_PROGRESS_INTERVAL, Cell, LogProgress, progress_bar, run_sweep
from uqmetrics.runs.testing.signals import interruptible


class FakeClock:
    """Seconds that advance only when the test says so."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class TtyStream(io.StringIO):
    def isatty(self):
        return True


def test_a_cell_key_with_a_final_newline_is_refused():
    """A key is a file stem of letters, digits and ``._=+-``: ``"c0\\n"`` passed the check
    (``re.match``'s ``$`` matches before a final newline) and went to ``c0\\n.nc``, a file
    that is not ``c0.nc``. It is refused, naming the key."""
    with pytest.raises(ValueError, match=r"cell key must match .*, got 'c0\\n'"):
        Cell("c0\n")
    assert sweep.cell_path("/o", Cell("c0")) == Path("/o/c0.nc")


def test_log_progress_writes_one_line_per_interval_and_one_at_close():
    clock, out = FakeClock(), io.StringIO()
    bar = LogProgress(300, "sweep", interval=30.0, stream=out, unit="cell", clock=clock)
    for _ in range(300):  # one update per second for 300 s
        clock.t += 1.0
        bar.update(1)
    bar.close()
    lines = out.getvalue().splitlines()
    # a line at t = 30, 60, ..., 300, then the closing one
    assert len(lines) == 300 // 30 + 1
    assert lines[0] == "sweep: 30/300 cells (10%), 270 left, 30 s elapsed, ETA 4 min 30 s"
    assert lines[-1] == lines[-2] == "sweep: 300/300 cells (100%), 0 left, 5 min 00 s elapsed"


def test_log_progress_many_fast_updates_give_one_line():
    out = io.StringIO()
    bar = LogProgress(10_000, "sweep", stream=out, unit="cell")
    t0 = time.monotonic()
    for _ in range(10_000):
        bar.update(1)
    bar.set_postfix_str("done")
    bar.close()
    elapsed = time.monotonic() - t0
    lines = out.getvalue().splitlines()
    assert 1 <= len(lines) <= 1 + elapsed / LOG_PROGRESS_INTERVAL
    assert lines[-1].startswith("sweep: 10000/10000 cells (100%) done, ")


def test_log_progress_interval_zero_writes_every_update_and_bad_interval_raises():
    out = io.StringIO()
    bar = LogProgress(5, "x", interval=0.0, stream=out)
    for _ in range(5):
        bar.update(1)
    assert len(out.getvalue().splitlines()) == 5
    with pytest.raises(ValueError, match="interval must be >= 0 seconds, got -1"):
        LogProgress(5, "x", interval=-1)


def test_progress_bar_picks_log_lines_off_a_terminal_and_nothing_when_disabled():
    out = io.StringIO()
    bar = progress_bar(3, "sweep", unit="cell", stream=out, interval=3600.0)
    assert isinstance(bar, LogProgress)
    quiet = progress_bar(3, "sweep", enabled=False, stream=out)
    for b in (bar, quiet):
        b.update(3)
        b.set_postfix_str("p")
        b.close()
    assert out.getvalue() == "sweep: 3/3 cells (100%) p, 0 left, 0 s elapsed\n"


def test_the_process_switch_silences_every_bar_and_line_and_is_given_back():
    """``uqvision --quiet`` (``set_progress(False)``): a bar asked for and a progress line print
    nothing; the previous setting comes back from the call, to restore it."""
    out = io.StringIO()
    before = sweep.set_progress(False)
    try:
        bar = progress_bar(3, "sweep", unit="cell", stream=out, interval=0.0)
        bar.update(3)
        bar.close()
        sweep.progress_line("step", stream=out)
        assert not sweep.progress_enabled(True)
    finally:
        assert sweep.set_progress(before) is False
    assert out.getvalue() == ""
    sweep.progress_line("step", stream=out)
    assert out.getvalue() == "step\n" and sweep.progress_enabled()


def test_progress_bar_is_tqdm_on_a_terminal():
    tty = TtyStream()
    bar = progress_bar(3, "sweep", unit="cell", stream=tty)
    assert isinstance(bar, tqdm.tqdm)
    bar.close()


def test_log_progress_eta_is_the_mean_time_per_cell_of_this_run_times_the_cells_left():
    """Cells of uneven duration: the ETA follows the mean over the finished cells (not the last
    one), and cells found done on disk (``initial``) count as done but take no time."""
    clock, out = FakeClock(), io.StringIO()
    bar = LogProgress(10, "sweep", interval=0.0, stream=out, unit="cell", clock=clock, initial=4)
    for dt in (10.0, 50.0, 30.0):  # mean 30 s per cell
        clock.t += dt
        bar.update(1)
    bar.set_postfix_str("3/5 models")
    clock.t += 3 * 30.0
    bar.update(3)
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines == [
        "sweep: 5/10 cells (50%), 5 left, 10 s elapsed, ETA 50 s",
        "sweep: 6/10 cells (60%), 4 left, 1 min 00 s elapsed, ETA 2 min 00 s",
        "sweep: 7/10 cells (70%), 3 left, 1 min 30 s elapsed, ETA 1 min 30 s",
        "sweep: 10/10 cells (100%) 3/5 models, 0 left, 3 min 00 s elapsed",
        "sweep: 10/10 cells (100%) 3/5 models, 0 left, 3 min 00 s elapsed",
    ]
    # before any cell of this run finished there is no ETA (nothing to take the mean of)
    out = io.StringIO()
    LogProgress(10, "sweep", stream=out, unit="cell", clock=clock, initial=4).close()
    assert out.getvalue() == "sweep: 4/10 cells (40%), 6 left, 0 s elapsed\n"
    with pytest.raises(ValueError, match="initial must be in"):
        LogProgress(3, "x", initial=4)


def test_long_durations_read_in_hours():
    assert [sweep.format_duration(s) for s in (0, 59.4, 60, 3599, 3600, 90061)] == [
        "0 s", "59 s", "1 min 00 s", "59 min 59 s", "1 h 00 min", "25 h 01 min"]


def test_tqdm_bar_shows_the_mean_rate_over_this_runs_cells():
    """On a terminal the bar starts at the cells already done and its remaining time is the
    mean over this run's cells (smoothing 0), as in the log lines."""
    tty = TtyStream()
    bar = progress_bar(10, "sweep", unit="cell", stream=tty, initial=4)
    assert bar.n == 4 and bar.initial == 4 and bar.smoothing == 0
    bar.close()


def _tiny_cell(i: int) -> xr.Dataset:
    return xr.Dataset({"v": ("x", np.full(2, float(i)))})


def test_run_sweep_under_a_non_tty_stderr_writes_sparse_lines(tmp_path, capsys):
    """Many fast cells through Dask with stderr captured (not a terminal): the old tqdm bar
    wrote a carriage-return redraw per cell; now at most 1 + elapsed / interval lines. One
    worker thread: netCDF (HDF5) writes are not thread-safe."""
    n_cells, interval = 120, 0.5
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=1,
                            dashboard_address=":0") as client:
        t0 = time.monotonic()
        report = run_sweep([Cell(f"c{i:03d}", {"i": i}) for i in range(n_cells)], _tiny_cell,
                           tmp_path, client=client, progress_interval=interval)
        elapsed = time.monotonic() - t0
    assert report.ok and len(report.computed) == n_cells
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("sweep:")]
    assert 1 <= len(lines) <= 1 + elapsed / interval
    assert lines[-1].startswith(f"sweep: {n_cells}/{n_cells} cells (100%), ")


def _fails_on_odd(i: int) -> xr.Dataset:
    if i % 2:
        raise RuntimeError(f"cell {i} is odd")
    return _tiny_cell(i)


def test_run_sweep_counts_groups_and_calls_back_on_every_finished_cell(tmp_path, capsys):
    """Cells grouped by model (two cells each): the last line counts the groups done; the
    callback sees every submitted cell once, with its error or None; a rerun starts from the
    complete files (counted as done) and submits only the failed cells."""
    cells = [Cell(f"m{i // 2}.c{i % 2}", {"i": i}) for i in range(6)]
    seen = []
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=1,
                            dashboard_address=":0") as client:
        report = run_sweep(cells, _fails_on_odd, tmp_path, client=client,
                           group=lambda c: c.key.split(".")[0], group_unit="model",
                           on_result=lambda c, err: seen.append((c.key, err)))
        err = capsys.readouterr().err
        assert sorted(seen) == [(c.key, report.failed.get(c.key)) for c in cells]
        assert set(report.failed) == {"m0.c1", "m1.c1", "m2.c1"}
        assert report.failed["m1.c1"] == "RuntimeError: cell 3 is odd"
        assert err.splitlines()[-1].startswith("sweep: 6/6 cells (100%) 3/3 models, 0 left, ")
        seen.clear()
        again = run_sweep(cells, _fails_on_odd, tmp_path, client=client,
                          group=lambda c: c.key.split(".")[0], group_unit="model",
                          on_result=lambda c, err: seen.append((c.key, err)))
    assert len(again.skipped) == 3 and sorted(k for k, _ in seen) == ["m0.c1", "m1.c1", "m2.c1"]
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        "sweep: 6/6 cells (100%) 3/3 models, 0 left, ")


def _needs_flag(flag: str) -> xr.Dataset:
    if not Path(flag).exists():
        raise FileNotFoundError(f"no {flag}")
    return _tiny_cell(0)


def test_a_retry_on_the_same_scheduler_recomputes_a_failed_cell(tmp_path):
    """A scheduler that outlives a sweep remembers the outcome of each task key; a retry of a
    failed cell must run it again, not be answered with the old error."""
    flag = tmp_path / "flag"
    cells = [Cell("c", {"flag": str(flag)})]
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=1,
                            dashboard_address=":0") as client:
        first = run_sweep(cells, _needs_flag, tmp_path / "out", client=client, progress=False)
        assert list(first.failed) == ["c"] and "no " in first.failed["c"]
        flag.touch()
        second = run_sweep(cells, _needs_flag, tmp_path / "out", client=client, progress=False)
    assert second.ok and [p.name for p in second.computed] == ["c.nc"]


def test_failures_file_is_written_whole_and_read_back(tmp_path):
    path = tmp_path / "sweep_failures.json"
    assert sweep.read_failures(path) == []
    records = [{"model": "a", "error": "OutOfMemoryError: CUDA out of memory", "time": "t"}]
    sweep.write_failures(path, records)
    assert sweep.read_failures(path) == records
    sweep.write_failures(path, [])
    assert sweep.read_failures(path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep_failures.json"]  # no temporaries
    path.write_text("{not json")
    with pytest.raises(ValueError, match="sweep_failures.json' is not JSON"):
        sweep.read_failures(path)
    path.write_text('{"failures": []}')
    with pytest.raises(ValueError, match="is not a sweep failures file"):
        sweep.read_failures(path)


def test_doctests():
    from uqmetrics.runs.sweep import cells, failures, launch, logs, options, progress, run

    results = [doctest.testmod(m) for m in (sweep, cells, failures, launch, logs, options,
                                             progress, run)]
    assert sum(r.failed for r in results) == 0 and sum(r.attempted for r in results) > 0


def _cell_with_coordinate(i: int) -> xr.Dataset:
    """A cell with an uncompressed coordinate of distinct values and many attrs (the kind
    HDF5 keeps in a block of their own)."""
    from uqmetrics.runs.io import provenance_attrs

    x = np.linspace(-6.0, 6.0, 101) + 1000.0 * i
    return xr.Dataset({"v": ("x", np.sin(x))}, coords={"x": x}, attrs=provenance_attrs(seed=i))


def test_damaged_cell_files_are_not_complete_and_a_rerun_recomputes_them(tmp_path):
    """Issue 24, F1/F5: a cell whose coordinate had one value flipped on disk was taken as
    complete (a rerun combined the wrong value); one whose attribute block had a flipped bit
    made ``is_complete`` raise netCDF4's AttributeError, which stopped the whole sweep. Both
    are incomplete; a rerun recomputes exactly them."""
    from uqmetrics.runs.sweep import is_complete

    cells = [Cell(f"c{i}", {"i": i}) for i in range(3)]
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=1,
                            dashboard_address=":0") as client:
        first = run_sweep(cells, _cell_with_coordinate, tmp_path, client=client, progress=False)
        assert first.ok and len(first.computed) == 3
        data = bytearray((tmp_path / "c1.nc").read_bytes())
        at = bytes(data).find(np.float64(1000.0).tobytes())  # x[50] of cell 1
        assert at > 0
        data[at + 7] ^= 0x40
        (tmp_path / "c1.nc").write_bytes(bytes(data))
        data = bytearray((tmp_path / "c2.nc").read_bytes())
        at = bytes(data).find(b"FHDB")  # the block of its attributes
        assert at > 0
        data[at] ^= 0x80
        (tmp_path / "c2.nc").write_bytes(bytes(data))
        assert is_complete(tmp_path / "c0.nc")
        assert not is_complete(tmp_path / "c1.nc") and not is_complete(tmp_path / "c2.nc")
        again = run_sweep(cells, _cell_with_coordinate, tmp_path, client=client, progress=False)
    assert again.ok and sorted(p.name for p in again.computed) == ["c1.nc", "c2.nc"]
    assert [p.name for p in again.skipped] == ["c0.nc"]
    assert all(is_complete(tmp_path / f"c{i}.nc") for i in range(3))


# --------------------------------------------------------------------------------------------
# quiet failures (issue 24): no worker traceback on the console, the tracebacks in a log file,
# one line on Ctrl-C


def test_a_failing_cell_prints_no_traceback_and_leaves_it_in_the_log_file(tmp_path, capfd,
                                                                         caplog):
    """A cell that raises used to make its worker log a "Compute Failed" block with the whole
    traceback on the console; now the error comes back as a value: one line in the report,
    the traceback in ``log_file``."""
    cells = [Cell(f"c{i}", {"i": i}) for i in range(4)]
    log = tmp_path / "logs" / "sweep.log"
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=1,
                            dashboard_address=":0") as client:
        quiet = run_sweep(cells, _fails_on_odd, tmp_path / "a", client=client, progress=False)
        err = capfd.readouterr().err
        assert "Compute Failed" not in err and "Traceback" not in err, err
        worker = [r for r in caplog.records if r.name.startswith("distributed.worker")
                  and r.levelno >= logging.WARNING]
        assert worker == [], [r.getMessage()[:200] for r in worker]
        assert quiet.failed == {"c1": "RuntimeError: cell 1 is odd",
                                "c3": "RuntimeError: cell 3 is odd"}
        logged = run_sweep(cells, _fails_on_odd, tmp_path / "b", client=client, progress=False,
                           log_file=log)
    assert logged.failed == quiet.failed and len(logged.computed) == 2
    assert "Traceback" not in capfd.readouterr().err
    text = log.read_text()
    assert text.count("Traceback (most recent call last)") == 2
    assert "uqmetrics.sweep ERROR: cell c1 failed: RuntimeError: cell 1 is odd" in text
    assert "in _fails_on_odd" in text


_INTERRUPTED = '''
import sys
import time

import numpy as np
import xarray as xr

from uqmetrics.runs.sweep import Cell, run_sweep


def slow(i):
    time.sleep(0.1 if i == 0 else 5)
    return xr.Dataset({"x": ("i", np.arange(3.0))})


if __name__ == "__main__":
    try:
        run_sweep([Cell(f"c{i}", {"i": i}) for i in range(6)], slow, sys.argv[1], n_workers=2,
                  progress=False, log_file=sys.argv[2])
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
'''


@pytest.mark.slow
def test_ctrl_c_stops_a_local_cluster_without_a_line_from_dask(tmp_path):
    """Ctrl-C in a terminal reaches every process of the group: the workers used to print
    their KeyboardInterrupt tracebacks and distributed its warnings while the cluster closed.
    Now the workers ignore SIGINT and write their standard error to the log file, and the
    caller's one line is all the console gets."""
    script = tmp_path / "sweep_script.py"
    script.write_text(_INTERRUPTED)
    out, log = tmp_path / "out", tmp_path / "sweep.log"
    # SIGINT at its default in the script, even where this test runs with it ignored (nohup)
    proc = subprocess.Popen(interruptible([sys.executable, str(script), str(out), str(log)]),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend(
        (time.monotonic(), ln.rstrip("\n")) for ln in proc.stderr), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not (out / "c0.nc").exists() and time.monotonic() < deadline:
        assert proc.poll() is None, lines
        time.sleep(0.1)
    time.sleep(0.5)  # the other cells are running
    assert proc.poll() is None
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal does
    assert proc.wait(timeout=60) == 130
    reader.join(timeout=30)
    assert [ln for t, ln in lines if t >= sent] == ["interrupted"], lines


def _may_start_a_child(i: int = 0) -> xr.Dataset:
    """A cell that records whether its process is daemonic, after starting a child if not."""
    import multiprocessing

    daemon = multiprocessing.current_process().daemon
    if not daemon:
        child = multiprocessing.get_context("fork").Process(target=int)
        child.start()  # "daemonic processes are not allowed to have children" in a daemonic one
        child.join(30)
    return xr.Dataset(attrs={"daemon": int(daemon)})


def test_the_clusters_a_sweep_starts_have_workers_that_may_start_children(tmp_path):
    """The LocalCluster of ``open_client`` and of ``run_sweep`` (the one every sweep command
    starts): its workers are not daemonic, so a cell may start DataLoader workers."""
    with sweep.open_client(sweep.ClusterSpec(dashboard="none"), n_workers=1) as client:
        assert client.submit(_may_start_a_child, pure=False).result(timeout=120).attrs == {"daemon": 0}
    report = run_sweep([Cell("child", {"i": 0})], _may_start_a_child, tmp_path,
                       scheduler=sweep.ClusterSpec(dashboard="none"), n_workers=1, progress=False)
    assert report.ok
    assert int(xr.open_dataset(tmp_path / "child.nc").attrs["daemon"]) == 0


#: Bytes of the array :func:`_faults_of_arrays` makes again and again (below glibc's 32 MiB).
_ARRAY_BYTES = 16 << 20


def _faults_of_arrays(i: int = 0) -> xr.Dataset:
    """Page faults (minor) of making, filling and freeing an array of :data:`_ARRAY_BYTES` 20
    times, in the process that runs it."""
    import resource

    np.ones(_ARRAY_BYTES // 8)  # the heap grown once
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        np.ones(_ARRAY_BYTES // 8)
    return xr.Dataset(attrs={"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before})


def test_a_cell_in_a_dask_worker_reuses_the_heap_for_large_arrays(tmp_path):
    """Dask's nanny starts a worker with ``MALLOC_TRIM_THRESHOLD_=65536``, which turns glibc's
    adaptive mmap threshold off: an array made 20 times in a row is mapped, and its pages
    faulted in, 20 times (up to 4,096 faults of 4 KiB pages each time, fewer where the kernel
    gives numpy's arrays huge pages; the plain function, submitted first). A sweep's cell on the
    same worker first gives the allocator back its reuse of such blocks (``heap_for_arrays``):
    the array's pages stay in the heap, faulted in once, before the count. Counted, not timed:
    uqreg's cells ran 1.9-2.6x slower without it (packages/uqreg/benchmarks/bench_worker_env.py)."""
    environ = dict(os.environ)  # a nanny sets its variables in this process too
    try:
        with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                      dashboard_address=None) as cluster, \
                distributed.Client(cluster) as client:
            plain = client.submit(_faults_of_arrays, pure=False).result(timeout=120).attrs["faults"]
            report = run_sweep([Cell("faults", {"i": 0})], _faults_of_arrays, tmp_path,
                               client=client, progress=False)
    finally:
        os.environ.clear()
        os.environ.update(environ)
    assert report.ok
    in_cell = int(xr.open_dataset(tmp_path / "faults.nc").attrs["faults"])
    assert plain >= 20, plain  # mapped afresh: each array faults at least one page in
    assert in_cell < 20, (in_cell, plain)  # reused: fewer faults than arrays (measured: 2)


#: The write-behind test's events: a write has started; a cell was computed after that.
_BEHIND = {"writing": threading.Event(), "computed": threading.Event(), "waited": [],
           "first": threading.Lock()}


def _behind_cell(i: int) -> xr.Dataset:
    if _BEHIND["writing"].is_set():
        _BEHIND["computed"].set()
    return _tiny_cell(i)


_behind_cell.write_behind = True


def test_a_cell_written_behind_lets_the_next_cell_compute_and_its_write_error_is_its_own(
        tmp_path, monkeypatch):
    """A cell function marked ``write_behind``: on a worker of one thread, the next cell is
    computed while the first file is being written (that write waits for it); every file is
    complete when the sweep returns, and a write that fails is its own cell's failure."""
    from uqmetrics.runs.sweep import cells as cells_module

    real = cells_module.write_dataset

    def write(ds, path, **kw):
        if _BEHIND["first"].acquire(blocking=False):  # held until another cell is computed
            _BEHIND["writing"].set()
            _BEHIND["waited"].append(_BEHIND["computed"].wait(20))
        if Path(path).name == "c2.nc":
            raise OSError(28, "No space left on device", str(path))
        return real(ds, path, **kw)

    monkeypatch.setattr(cells_module, "write_dataset", write)
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=1,
                            dashboard_address=":0") as client:
        report = run_sweep([Cell(f"c{i}", {"i": i}) for i in range(3)], _behind_cell,
                           tmp_path, client=client, progress=False)
    assert _BEHIND["waited"] == [True]  # the next cell computed during the first write
    assert sorted(p.name for p in report.computed) == ["c0.nc", "c1.nc"]
    assert all(sweep.is_complete(p) for p in report.computed)
    assert list(report.failed) == ["c2"] and "No space left" in report.failed["c2"]
    assert not (tmp_path / "c2.nc").exists()


#: The interrupt test's events: c2's write has begun; c1 may return; c1 has returned.
_STOP = {"c2 writing": threading.Event(), "release c1": threading.Event(),
         "c1 returned": threading.Event()}


def _stopped_cell(i: int) -> xr.Dataset:
    if i == 0:  # returns once c2's file is being written
        assert _STOP["c2 writing"].wait(30)
    if i == 1:  # still computing when the sweep is interrupted
        assert _STOP["release c1"].wait(60)
        _STOP["c1 returned"].set()
    return _tiny_cell(i)


def test_an_interrupted_sweep_finishes_the_writes_under_way_and_writes_nothing_after(
        tmp_path, monkeypatch):
    """Ctrl-C during a sweep on a cluster of threads in the caller's process: a file being
    written is finished whole before the interrupt reaches the caller, and a cell still
    computing writes nothing afterwards (before, it wrote its file later, behind the back of
    a rerun that had already listed what was complete; the threads of a cluster outlive it)."""
    from uqmetrics.runs.sweep import cells as cells_module

    real = cells_module.write_dataset

    def write(ds, path, **kw):
        if Path(path).name == "c2.nc":
            _STOP["c2 writing"].set()
            time.sleep(1.0)  # a long write, under way when the interrupt comes
        return real(ds, path, **kw)

    def interrupt(cell, error):
        if cell.key == "c0":
            raise KeyboardInterrupt

    monkeypatch.setattr(cells_module, "write_dataset", write)
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=3,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        with pytest.raises(KeyboardInterrupt):
            run_sweep([Cell(f"c{i}", {"i": i}) for i in range(3)], _stopped_cell, tmp_path,
                      client=client, progress=False, on_result=interrupt)
        assert sweep.is_complete(tmp_path / "c2.nc")  # finished before the interrupt came
        _STOP["release c1"].set()
        assert _STOP["c1 returned"].wait(30)
        (worker,) = cluster.workers.values()
        deadline = time.monotonic() + 30
        while worker.state.executing and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not worker.state.executing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c0.nc", "c2.nc"]
