"""Where a sweep on a LocalCluster listens (its dashboard on loopback, ``--dashboard``), and a
missing dask-jobqueue named in one line: the sweep-cluster tests that need no job queue.

test_sweep_cluster.py, the tests on dask-jobqueue's job classes (an optional library, the extra
``uqmetrics[hpc]``), is skipped without it and imports its helpers from here; these run always.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
import xarray as xr

from uqmetrics.runs.sweep import Cell, ClusterSpec, add_cluster_options, options, run_sweep

LOOPBACK = {"127.0.0.1", "::1"}


@pytest.fixture(autouse=True)
def _workers_import_this_module(monkeypatch):
    """Dask sends a cell function by reference (module and name): the job processes, started
    from the environment, find this test module on their ``PYTHONPATH``."""
    here = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [here, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))


def _square(i: int) -> xr.Dataset:
    return xr.Dataset({"v": ("x", np.arange(3.0) * i * i)}, attrs={"i": i})



def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_cluster_options(parser)
    return parser.parse_args(list(argv))


def _listening() -> set[tuple[str, int]]:
    """(address, port) of the TCP sockets this process listens on."""
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}



def test_a_missing_dask_jobqueue_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "dask_jobqueue", None)  # import fails as if not installed
    with pytest.raises(ValueError, match=r"--cluster slurm: .*pip install 'uqmetrics\[hpc\]'"):
        ClusterSpec.from_args(_parse("--cluster", "slurm"))
    with pytest.raises(ImportError, match=r"uqmetrics\[hpc\]"):
        options._jobqueue()
    ClusterSpec.from_args(_parse())  # the local default needs no dask-jobqueue


# ---------------------------------------------------------------------------------------------
# the dashboard


def _sweep_listening(tmp_path, name: str, scheduler, capfd) -> tuple[set, str]:
    """Run a sweep of two cells; the sockets it listened on while its first cell finished, and
    what it printed on stderr."""
    before = _listening()
    seen: set = set()

    def look(cell, error):
        if not seen:
            seen.update(_listening() - before)

    report = run_sweep([Cell(f"c{i}", {"i": i}) for i in range(2)], _square, tmp_path / name,
                       scheduler=scheduler, n_workers=1, on_result=look, progress_interval=0)
    assert report.ok
    return seen, capfd.readouterr().err


def _link_port(err: str) -> int | None:
    links = re.findall(r"^sweep: dashboard http://([^/]+):(\d+)/status", err, re.MULTILINE)
    assert len(links) <= 1, err  # printed once
    return int(links[0][1]) if links else None


def test_the_default_sweeps_dashboard_listens_on_loopback_only(tmp_path, capfd):
    seen, err = _sweep_listening(tmp_path, "default", None, capfd)
    port = _link_port(err)
    assert port is not None, err
    assert "sweep: dashboard http://127.0.0.1:" in err
    on_port = {addr for addr, p in seen if p == port}
    assert on_port == {"127.0.0.1"}, seen  # not 0.0.0.0 nor ::
    assert all(addr in LOOPBACK for addr, _ in seen), seen  # the scheduler neither


def test_dashboard_option_is_honoured(tmp_path, capfd):
    import socket

    with socket.socket() as s:  # a free port, on loopback
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = ClusterSpec.from_args(_parse("--dashboard", f"127.0.0.1:{port}"))
    seen, err = _sweep_listening(tmp_path, "given", spec, capfd)
    assert _link_port(err) == port and ("127.0.0.1", port) in seen

    spec = ClusterSpec.from_args(_parse("--dashboard", "none"))
    seen, err = _sweep_listening(tmp_path, "none", spec, capfd)
    assert _link_port(err) is None and "dashboard" not in err
    assert all(addr in LOOPBACK for addr, _ in seen), seen
