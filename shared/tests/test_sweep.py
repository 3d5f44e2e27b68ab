"""Sweep progress (uqmetrics.sweep): on a stream that is not a terminal (CI logs, a pipe), at
most one line per interval plus one at the end, never a bar redrawn per cell."""

import doctest
import io
import time
from pathlib import Path

import numpy as np
import pytest
import tqdm
import xarray as xr
from dask import distributed

from uqmetrics import sweep
from uqmetrics.sweep import LOG_PROGRESS_INTERVAL, Cell, LogProgress, progress_bar, run_sweep


class FakeClock:
    """Seconds that advance only when the test says so."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class TtyStream(io.StringIO):
    def isatty(self):
        return True


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
                            dashboard_address=None) as client:
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
                            dashboard_address=None) as client:
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
                            dashboard_address=None) as client:
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
    result = doctest.testmod(sweep)
    assert result.failed == 0 and result.attempted > 0
