"""Sweep progress (uqmetrics.sweep): on a stream that is not a terminal (CI logs, a pipe), at
most one line per interval plus one at the end, never a bar redrawn per cell."""

import doctest
import io
import time

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
    assert lines[0] == "sweep: 30/300 cells (10%), 30 s"
    assert lines[-1] == lines[-2] == "sweep: 300/300 cells (100%), 300 s"


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
    assert out.getvalue() == "sweep: 3/3 cells (100%) p, 0 s\n"


def test_progress_bar_is_tqdm_on_a_terminal():
    tty = TtyStream()
    bar = progress_bar(3, "sweep", unit="cell", stream=tty)
    assert isinstance(bar, tqdm.tqdm)
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


def test_doctests():
    result = doctest.testmod(sweep)
    assert result.failed == 0 and result.attempted > 0
