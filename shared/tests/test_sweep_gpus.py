"""One local worker per GPU (``--gpus``, uqmetrics.runs.sweep): the option's parsing and
checks, which GPUs this process sees (``CUDA_VISIBLE_DEVICES``), which worker gets which GPU,
and a real ``LocalCluster`` of two processes that report their environment (no GPU needed:
the GPUs are names here). The CUDA test needs two GPUs and is skipped otherwise.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import pytest
import xarray as xr

# the fixture that lets spawned workers import this module (used by name)
from test_sweep_dashboard import _parse, _workers_import_this_module  # noqa: F401

from uqmetrics.runs.sweep import (
    GPUS_ALL,
    Cell,
    ClusterSpec,
    gpu_worker_env,
    launch,
    open_client,
    options,
    parse_gpus,
    run_sweep,
    select_gpus,
    visible_gpus,
)


def _gpus_here(monkeypatch, n: int, visible: str | None = None) -> None:
    """This process sees ``n`` GPUs, with ``CUDA_VISIBLE_DEVICES=visible`` (None: unset)."""
    monkeypatch.setattr(options, "_gpu_count", lambda: n)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)


# ---------------------------------------------------------------------------------------------
# the option


def test_gpus_values_parse_and_bad_ones_name_the_value(capsys):
    assert parse_gpus("all") == GPUS_ALL and parse_gpus(" ALL ") == GPUS_ALL
    assert parse_gpus("2") == 2 and parse_gpus("0,3") == (0, 3) and parse_gpus("1, 0") == (1, 0)
    for bad, message in (("0", "count must be >= 1"), ("two", "expected all, a count"),
                         ("1,1", "given twice"), ("-1", "expected all"), ("", "expected all")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            parse_gpus(bad)
    with pytest.raises(SystemExit):
        _parse("--gpus", "some")
    assert "--gpus: expected all, a count or indices such as 0,1, got 'some'" in \
        capsys.readouterr().err
    assert _parse().gpus is None


def test_the_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    _gpus_here(monkeypatch, 0)
    assert visible_gpus() == ()
    _gpus_here(monkeypatch, 3)
    assert visible_gpus() == ("0", "1", "2")
    _gpus_here(monkeypatch, 2, "3,1")  # cuda:0 is GPU 3
    assert visible_gpus() == ("3", "1")
    _gpus_here(monkeypatch, 2, "GPU-8f2a, MIG-77")
    assert visible_gpus() == ("GPU-8f2a", "MIG-77")
    _gpus_here(monkeypatch, 1, "2,-1,0")  # CUDA stops at the first invalid entry
    assert visible_gpus() == ("2",)
    _gpus_here(monkeypatch, 1, "4,5")  # only as many as the devices there are
    assert visible_gpus() == ("4",)


def test_select_gpus_takes_all_a_count_or_indices_and_refuses_too_many(monkeypatch):
    here = ("2", "3", "5")
    assert select_gpus("all", here) == here
    assert select_gpus(2, here) == ("2", "3")
    assert select_gpus((2, 0), here) == ("5", "2")
    assert select_gpus("1,2", here) == ("3", "5")
    with pytest.raises(ValueError, match=r"^--gpus 4: asks for 4 GPUs, 3 GPU\(s\) visible"):
        select_gpus(4, here)
    with pytest.raises(ValueError, match=r"^--gpus 0,3: no GPU of index 3, 3 GPU\(s\)"):
        select_gpus((0, 3), here)
    with pytest.raises(ValueError, match=r"^--gpus all: no GPU is visible here"):
        select_gpus("all", ())
    with pytest.raises(ValueError, match=r"^--gpus 'x,1': expected all"):
        select_gpus("x,1", here)
    _gpus_here(monkeypatch, 2, "7,6")
    assert select_gpus("all") == ("7", "6")  # default: visible_gpus()


def test_from_args_gives_one_local_worker_per_gpu(monkeypatch):
    _gpus_here(monkeypatch, 4)
    args = _parse("--gpus", "3", "--workers", "7")
    spec = ClusterSpec.from_args(args, gpu_cells=True)
    assert spec.gpus == ("0", "1", "2") and spec.resources == {"GPU": 1}
    assert spec.local_default and spec.local_workers(args.workers) == 3
    assert "3 GPU worker(s) (CUDA_VISIBLE_DEVICES 0, 1, 2)" in spec.describe()
    # cells on the CPU ask for no GPU; without --gpus nothing changes
    assert ClusterSpec.from_args(_parse("--gpus", "all")).resources is None
    plain = ClusterSpec.from_args(_parse(), gpu_cells=True)
    assert plain.gpus is None and plain.resources is None and plain.local_workers(2) == 2

    with pytest.raises(ValueError, match=r"^--gpus 5: asks for 5 GPUs, 4 GPU\(s\) visible"):
        ClusterSpec.from_args(_parse("--gpus", "5"))
    with pytest.raises(ValueError, match=r"^--gpus all: applies to the LocalCluster started "
                                         r"here, not --scheduler 'tcp://h:8786'"):
        ClusterSpec.from_args(_parse("--gpus", "all", "--scheduler", "tcp://h:8786"))
    with pytest.raises(ValueError, match=r"^--gpus 0,1: .* not --cluster slurm "
                                         r"\(each job's GPU: --gpus-per-job 1\)"):
        ClusterSpec.from_args(_parse("--gpus", "0,1", "--cluster", "slurm"))
    _gpus_here(monkeypatch, 0)
    with pytest.raises(ValueError, match=r"^--gpus 1: no GPU is visible here"):
        ClusterSpec.from_args(_parse("--gpus", "1"))


def test_cluster_spec_checks_its_gpus():
    assert ClusterSpec(gpus=("GPU-1", "GPU-2")).local_workers(9) == 2
    for bad in [(), ("0", "0"), ("0,1",), ("",), ["0"], (0,)]:
        with pytest.raises(ValueError, match=r"gpus must be a non-empty tuple of distinct"):
            ClusterSpec(gpus=bad)
    with pytest.raises(ValueError, match=r"^--gpus 0: applies to the LocalCluster"):
        ClusterSpec(kind="pbs", gpus=("0",))


def test_each_worker_sees_its_own_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    assert gpu_worker_env(("3", "GPU-ab")) == {
        0: {"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        1: {"CUDA_VISIBLE_DEVICES": "GPU-ab", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}}
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")  # this process's order, kept
    assert gpu_worker_env(("0",))[0]["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


# ---------------------------------------------------------------------------------------------
# a real LocalCluster of two worker processes


def _env(dask_worker) -> tuple:
    return (dask_worker.name, os.environ.get("CUDA_VISIBLE_DEVICES"),
            dict(dask_worker.state.total_resources))


def _memory_limit(dask_worker) -> int:
    return dask_worker.memory_manager.memory_limit


def _visible(i: int) -> xr.Dataset:
    return xr.Dataset({"v": ("x", np.arange(3.0) * i)},
                      attrs={"visible": os.environ.get("CUDA_VISIBLE_DEVICES", "")})


def _names_and_gpus(client) -> list[tuple]:
    return sorted(client.run(_env).values())


def test_a_local_cluster_pins_each_worker_to_its_gpu(tmp_path):
    """Two worker processes, each with its own CUDA_VISIBLE_DEVICES and GPU=1; cells asking
    for GPU=1 all run there; a worker lost and added again takes the GPU no worker holds."""
    spec = ClusterSpec(gpus=("5", "7"), resources={"GPU": 1})
    client, cluster = launch._connect(spec, 4, 2, None, spec.resources)  # 2 threads each
    try:
        assert _names_and_gpus(client) == [(0, "5", {"GPU": 1}), (1, "7", {"GPU": 1})]
        from distributed.system import MEMORY_LIMIT  # shared out as by a LocalCluster of 2

        assert all(abs(m - MEMORY_LIMIT / 2) <= 1 for m in client.run(_memory_limit).values())
        cells = [Cell(f"c{i}", {"i": i}) for i in range(4)]
        report = run_sweep(cells, _visible, tmp_path / "out", client=client,
                           resources=spec.resources, progress=False)
        assert report.ok and len(report.computed) == 4
        for path in report.computed:
            with xr.open_dataset(path) as ds:
                assert ds.attrs["visible"] in {"5", "7"}
        cluster.scale(1)  # worker 1 gone ...
        deadline = time.monotonic() + 30
        while len(client.scheduler_info()["workers"]) != 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _names_and_gpus(client) == [(0, "5", {"GPU": 1})]
        cluster.scale(2)  # ... and added again: GPU 7, the one no worker holds
        client.wait_for_workers(2, timeout=30)
        assert _names_and_gpus(client) == [(0, "5", {"GPU": 1}), (1, "7", {"GPU": 1})]
    finally:
        launch._close_quietly(client, cluster)
    too_many = ClusterSpec(gpus=("0",), resources={"GPU": 2})
    with (pytest.raises(ValueError, match=r"resources \{'GPU': 2\}: a worker of --gpus has one"),
          open_client(too_many)):
        pass


# ---------------------------------------------------------------------------------------------
# CUDA: two GPUs of this machine


def _cuda_cell(i: int) -> xr.Dataset:
    import torch

    x = torch.full((4,), float(i), device="cuda")
    props = torch.cuda.get_device_properties(0)
    return xr.Dataset({"v": ("x", (x * x).cpu().numpy())},
                      attrs={"visible": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                             "count": torch.cuda.device_count(),
                             "uuid": str(getattr(props, "uuid", ""))})


def _cuda_gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(_cuda_gpus() < 2, reason="needs 2 CUDA GPUs")
def test_cells_on_cuda_spread_over_the_gpus(tmp_path):
    spec = ClusterSpec.from_args(_parse("--gpus", "2"), gpu_cells=True)
    cells = [Cell(f"c{i}", {"i": i}) for i in range(8)]
    report = run_sweep(cells, _cuda_cell, tmp_path / "out", scheduler=spec, progress=False)
    assert report.ok, report.failed
    seen = {}
    for path in report.computed:
        with xr.open_dataset(path) as ds:
            assert ds.attrs["count"] == 1  # each worker sees its GPU alone
            seen[ds.attrs["visible"]] = ds.attrs["uuid"]
    assert set(seen) == set(spec.gpus)  # both GPUs ran cells ...
    if all(seen.values()):  # ... and they are two devices (torch gives their UUIDs)
        assert len(set(seen.values())) == 2
