"""Sweeps on a real Dask LocalCluster: the same dataset, bit for bit, as a sequential study;
resume after a kill, combining cells, and the memory budget.

A result must not depend on how it was executed: the configuration fixes every network's
arithmetic (its chunk composition and thread count do not enter it), so a study, a sweep on a
2-worker LocalCluster and a study chunked by a small ``max_memory`` give identical float32
predictions (float32 training amplifies any difference in summation order into a different
network: before this was fixed, ``ens`` differed by up to 0.25 between a study and a sweep).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import uqmetrics
import xarray as xr
from uqmetrics.runs.sweep import is_complete
from uqmetrics.runs.testing.filesystems import append_only

from uqreg import cli
from uqreg.engine import TrainConfig, make_plan
from uqreg.methods import get_method, list_methods, mean_variance_method_names
from uqreg.study import StudyConfig, run_study
from uqreg.sweep import combine_cells, plan_cells, run_study_sweep

TINY = StudyConfig(task="sinusoid", complexities=(1, 2), methods=("blr", "bd", "ens", "ens_bs"), repetitions=4,
                   recipes=("paper", "none"), train=TrainConfig(members=3, epochs=8, mc_samples=6, dtype="float32"))
N_CELLS_2 = 2 * 2 * 4 * 2  # recipes × complexities × methods × chunks of 2 repetitions


def assert_same_study(a: xr.Dataset, b: xr.Dataset, rtol=0.0, atol=0.0):
    """Every variable and coordinate equal (bit for bit by default)."""
    assert set(a.data_vars) == set(b.data_vars)
    for name in a.data_vars:
        x, y = a[name], b[name].transpose(*a[name].dims)
        assert x.dims == y.dims, name
        for d in x.dims:
            if d in a.coords:
                np.testing.assert_array_equal(a[d].values, b[d].values, err_msg=f"{name}: coord {d}")
        if rtol == atol == 0.0:
            np.testing.assert_array_equal(x.values, y.values, err_msg=name)
        else:
            np.testing.assert_allclose(x.values.astype(float), y.values.astype(float), rtol=rtol, atol=atol,
                                       equal_nan=True, err_msg=name)


@pytest.fixture(scope="module")
def sequential():
    return run_study(TINY, progress=False)


@pytest.fixture(scope="module")
def cluster_client():
    from dask.distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = Client(cluster)
    yield client
    client.close()
    cluster.close()


@pytest.mark.slow
def test_sweep_on_localcluster_equals_sequential_study(tmp_path, sequential, cluster_client):
    """The stochastic methods of TINY under one recipe, swept on a 2-worker cluster: that part of
    the sequential study, bit for bit; a rerun computes nothing."""
    sub = replace(TINY, methods=("bd", "ens_bs"), recipes=("none",))
    n_cells = 2 * 2 * 2  # complexities × methods × chunks of 2 repetitions
    ds, report = run_study_sweep(sub, tmp_path, chunk_repetitions=2, client=cluster_client, progress=False)
    assert report.ok and len(report.computed) == len(plan_cells(sub, chunk_repetitions=2)) == n_cells
    part = sequential.sel({"method": list(sub.methods), "recipe": list(sub.recipes)})
    assert set(ds.data_vars) <= set(part.data_vars)
    assert_same_study(part[list(ds.data_vars)], ds)
    # a rerun computes nothing and gives the same dataset
    ds2, report2 = run_study_sweep(sub, tmp_path, chunk_repetitions=2, client=cluster_client, progress=False)
    assert report2.computed == [] and len(report2.skipped) == n_cells
    assert_same_study(ds, ds2)


def _max_memory_for_chunks_of(config: StudyConfig, networks: int) -> float:
    """A memory budget that puts at most ``networks`` networks of any method in one chunk."""
    per_net = []
    for c in config.resolved().complexities:
        inst = config.instance(c)
        for m in config.methods:
            method = get_method(m)
            if method.closed_form is None:
                job = method.job(inst, inst.targets([0]), [0], config.train)
                per_net.append(make_plan(job).per_network)
    return (networks + 0.5) * max(per_net)


@pytest.mark.slow
def test_max_memory_chunking_and_threads_change_nothing(sequential):
    """A study chunked by a small ``max_memory`` (the largest network in chunks of two, the
    smallest a budget allows; each repetition's members split over chunks), run from a process
    with 2 torch threads, is bit-identical to the default study."""
    budget = _max_memory_for_chunks_of(TINY, 2)
    cfg = replace(TINY, train=replace(TINY.train, max_memory=budget, parallel_chunks=2))
    inst = cfg.instance(2)
    plans = {m: make_plan(get_method(m).job(inst, inst.targets(range(4)), range(4), cfg.train))
             for m in ("bd", "ens", "ens_bs")}
    assert min(p.chunk for p in plans.values()) == 2
    assert plans["ens"].chunk < 3 and plans["ens"].n_chunks > 4  # members of a repetition split
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        chunked = run_study(cfg, progress=False)
        assert torch.get_num_threads() == 2  # the plan restores the caller's setting
    finally:
        torch.set_num_threads(old)
    for name in ("prediction", "uncertainty"):
        np.testing.assert_array_equal(chunked[name].values, sequential[name].values, err_msg=name)


def test_combining_cells_equals_single_study(tmp_path, sequential):
    """Cells computed in-process (no cluster) and combined equal one study of the same config."""
    from uqreg.sweep import run_cell

    paths = []
    for cell in plan_cells(TINY, chunk_repetitions=3):  # uneven chunks: 3 + 1 repetitions
        path = tmp_path / f"{cell.key}.nc"
        uqmetrics.write_dataset(run_cell(**cell.params), path)
        paths.append(path)
    from uqreg.study import summarize

    assert_same_study(sequential, summarize(combine_cells(paths[::-1], TINY)))


@pytest.mark.slow
def test_sweep_resumes_after_the_client_is_killed(tmp_path, sequential):
    """Kill a running `uqreg sweep` (client and its cluster) part way; rerun completes without
    redoing finished cells and without a corrupt file. The sweep runs two of TINY's methods under
    one recipe (16 cells of one repetition): its study is that part of TINY's, bit for bit."""
    out = tmp_path / "sweep"
    sub = replace(TINY, methods=("blr", "ens"), recipes=("paper",))
    args = [sys.executable, "-m", "uqreg.cli", "sweep", "--task", "sinusoid", "--complexities", "1,2",
            "--methods", ",".join(sub.methods), "--recipes", ",".join(sub.recipes), "--repetitions", "4",
            "--members", "3", "--epochs", "8",
            "--mc-samples", "6", "--dtype", "float32", "--chunk-repetitions", "1", "--out", str(out), "--quiet", "--no-plots"]
    proc = subprocess.Popen(args, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    cells = out / "cells"
    deadline = time.time() + 240
    while time.time() < deadline and len(list(cells.glob("*.nc"))) < 4 and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = sorted(p.name for p in cells.glob("*.nc"))
    n_cells = len(plan_cells(sub, chunk_repetitions=1))
    assert n_cells == 16
    assert 0 < len(done_before) < n_cells, "the sweep must be killed part way"
    mtimes = {p.name: p.stat().st_mtime_ns for p in cells.glob("*.nc")}

    res = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(done_before)} already on disk" in res.stdout or \
        f"{n_cells - len(done_before)} computed" in res.stdout, res.stdout
    for name, mtime in mtimes.items():  # finished cells were not redone
        assert (cells / name).stat().st_mtime_ns == mtime
    finished = list(cells.glob("*.nc"))
    assert len(finished) == n_cells and all(is_complete(p) for p in finished)
    ds = uqmetrics.read_dataset(out / "study.nc")
    part = sequential.sel({"method": list(sub.methods), "recipe": list(sub.recipes)})
    part = part[[v for v in part.data_vars if v in ds.data_vars]]
    assert set(ds.data_vars) == set(part.data_vars)
    assert_same_study(part, ds)


def test_failing_cell_is_reported_and_others_finish(tmp_path):
    from dask.distributed import Client
    from uqmetrics.runs.sweep import Cell, run_sweep

    with Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=":0") as client:
        report = run_sweep([Cell("good", {"value": 1.0}), Cell("bad", {"value": -1.0})], _cell_func, tmp_path,
                           client=client, progress=False)
    assert [p.name for p in report.computed] == ["good.nc"]
    assert "value must be positive" in report.failed["bad"]
    assert not (tmp_path / "bad.nc").exists()


def _cell_func(value):
    if value < 0:
        raise ValueError("value must be positive")
    return xr.Dataset({"v": ("i", np.full(3, value))})


def test_plan_cells_validates():
    with pytest.raises(ValueError, match="chunk_repetitions"):
        plan_cells(TINY, chunk_repetitions=0)
    keys = [c.key for c in plan_cells(TINY, chunk_repetitions=2)]
    assert len(keys) == len(set(keys)) == N_CELLS_2
    assert json.loads(json.dumps(plan_cells(TINY)[0].params))  # cells are plain JSON


MEMORY_SCRIPT = textwrap.dedent("""
    import sys, threading, time, numpy as np, torch
    torch.set_num_threads(1)
    from uqreg.engine import TrainConfig
    from uqreg.methods import get_method
    from uqreg.tasks import get_task

    def anon():  # resident anonymous memory (heap, tensors): not the shared-library pages the
        # kernel may drop under memory pressure, which made a ru_maxrss difference read 0
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("RssAnon:"))

    inst = get_task("styblinski_tang").instance(2, seed=0)   # N = 900, d = 2
    y = inst.targets(range(2))
    get_method("ens").run(inst, y, range(2), TrainConfig(members=2, epochs=2, max_memory=1e9))  # warm-up
    base, peak, done = anon(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], anon())
            time.sleep(0.001)

    t = threading.Thread(target=sample)
    t.start()
    cfg = TrainConfig(members=60, epochs=3, max_memory=float(sys.argv[1]), mc_samples=2)
    get_method("ens_adv").run(inst, y, range(2), cfg)
    done.set()
    t.join()
    print(max(peak[0], anon()) - base)
""")


@pytest.mark.slow
def test_max_memory_bounds_peak_memory():
    """Peak RSS growth of a chunked run stays within the budget; without the budget it does not."""

    def growth(budget: float) -> int:
        out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(budget)], capture_output=True, text=True,
                             timeout=300, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert out.returncode == 0, out.stderr
        return int(out.stdout.split()[-1])

    budget = 64e6
    bounded, unbounded = growth(budget), growth(64e9)
    assert bounded <= budget * 1.25, (bounded, budget)
    assert unbounded > 1.5 * bounded, (unbounded, bounded)


@pytest.mark.cuda
def test_cuda_matches_cpu():
    """Every method's study on CUDA equals the CPU's, in float64: float32 training on two
    devices rounds differently and drifts apart over the epochs, so float64 checks that both
    devices run the same computation (the coverage counts equal exactly: a relative 1e-6 of a
    count below 10^6 is below 1)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    methods = (*list_methods(), *mean_variance_method_names())  # the mean and the mean–variance heads
    cfg = StudyConfig(task="sinusoid", complexities=(1,), methods=methods, repetitions=2,
                      train=TrainConfig(members=3, epochs=20, mc_samples=8, dtype="float64"))
    cpu = run_study(cfg, progress=False)
    gpu = run_study(replace(cfg, train=replace(cfg.train, device="cuda")), progress=False)
    assert_same_study(cpu, gpu, rtol=1e-6, atol=1e-8)



ST3_SCRIPT = textwrap.dedent("""
    import resource, numpy as np, torch
    from uqreg.engine import TrainConfig
    from uqreg.methods import get_method
    from uqreg.tasks import get_task
    inst = get_task("styblinski_tang").instance(3, seed=0)   # N = 8100 training points, d = 3
    assert inst.x_train.shape == (8100, 3)
    cfg = TrainConfig(members=120, epochs=1, max_memory=2e9)
    res = get_method("ens").run(inst, inst.targets([0]), [0], cfg)
    assert np.isfinite(res.prediction).all() and np.isfinite(res.uncertainty).all()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
""")


@pytest.mark.slow
def test_styblinski_tang_d3_with_120_members_fits_the_budget():
    """Issue: E.2 at d = 3 (8,100 points) with 120 members runs far below 24 GB of RAM; the
    whole 120-network chunk would need about 4 GB of activations, the 2 GB budget halves it."""
    out = subprocess.run([sys.executable, "-c", ST3_SCRIPT], capture_output=True, text=True, timeout=600,
                         check=False)
    assert out.returncode == 0, out.stderr
    peak = int(out.stdout.split()[-1])
    assert peak < 2e9 * 1.25 + 1.0e9, peak  # budget + interpreter, torch and data


def test_cells_of_another_configuration_are_not_reused():
    """Cell keys carry a digest of the cell's full config: changing any setting (here the
    members) gives new keys, so stale files are never taken for finished cells."""
    a = [c.key for c in plan_cells(TINY)]
    b = [c.key for c in plan_cells(replace(TINY, train=replace(TINY.train, members=4)))]
    assert not set(a) & set(b)
    assert a == [c.key for c in plan_cells(TINY)]  # and the same config gives the same keys


def _digest_of_before(params: dict) -> str:
    """A cell's digest as sweeps on disk were named before revisions and before the chunking
    fields left it: the sha256 of its config, every training field but ``cuda_graphs``."""
    import hashlib

    train = {k: v for k, v in params["train"].items() if k != "cuda_graphs"}
    return hashlib.sha256(json.dumps(dict(params, train=train), sort_keys=True).encode()).hexdigest()[:10]


def test_cells_of_a_revised_method_get_a_new_identity():
    """``cd+mv``/``vd+mv`` (and their conformal versions) were computed with their KL scaled by
    σ² before revision 1 (docs/conventions.md#r-7): their cells' digest, and the digest of
    before that a sweep looks for on disk (:func:`uqreg.sweep.legacy_cell_digest`), differ from
    the one the same config had before, so such a cell on disk is never reused; every other
    method's digest of before is the one it always was (the sha256 of its config, written out
    here), so their cells on disk stay valid."""
    from uqreg.sweep import legacy_cell_digest

    cfg = StudyConfig(task="sinusoid_het", complexities=(1,), repetitions=2, n_cal=20,
                      methods=("cd", "vd", "ens+mv", "bd+mv", "cd+mv", "vd+mv", "cd+mv+cp_abs", "ens+mv+cp_abs"))
    revised = {"cd+mv", "vd+mv", "cd+mv+cp_abs"}
    for cell in plan_cells(cfg):
        params = cell.params["config"]
        before = _digest_of_before(params)
        (method,) = params["methods"]
        assert (legacy_cell_digest(params) == before) == (method not in revised), method
        assert not cell.key.endswith("_" + before), method  # the chunking fields are left out now


# ---------------------------------------------------------------------------------------------
# max_memory, chunk_networks, parallel_chunks: execution only on the CPU, out of a cell's key

#: A small float32 study of two trained methods (9 networks of ens, 3 of bd per cell of three
#: repetitions) whose chunking would show: the widths of execution_check, a fan-in-1 first
#: layer of width 50 (one-row products, which BLAS rounds by batch size).
CHUNKED = StudyConfig(task="sinusoid", complexities=(1,), methods=("bd", "ens"), recipes=("paper",), repetitions=3,
                      train=TrainConfig(members=3, epochs=5, mc_samples=6, hidden=(50, 20, 8), dtype="float32",
                                        parallel_chunks=1))


def _train(config: StudyConfig, **fields) -> StudyConfig:
    return replace(config, train=replace(config.train, **fields))


def _keys(config: StudyConfig, **fields) -> list[str]:
    return [c.key for c in plan_cells(_train(config, **fields), chunk_repetitions=2)]


def test_the_chunking_fields_change_no_bit_of_a_cell(tmp_path, monkeypatch):
    """The premise of leaving them out of a cell's key: a cell (:func:`uqreg.sweep.run_cell`,
    what a sweep computes and writes) is the same, every variable bit for bit in float32, in
    one chunk, in chunks of one network, of two on two concurrent threads, in chunks bounded
    to two networks by ``max_memory``, and in chunks and concurrency measured (``auto``)."""
    from uqreg.engine import autoplan
    from uqreg.sweep import run_cell

    monkeypatch.setenv(autoplan.PLAN_FILE_ENV, str(tmp_path / "engine_plan.json"))
    monkeypatch.delenv(autoplan.REMEASURE_ENV, raising=False)
    monkeypatch.setattr(autoplan, "CPU_CHUNKS", (2, 4, 8))  # below the 9 networks: auto cuts them
    autoplan.forget()
    variants = {"chunks of 1": {"chunk_networks": 1},
                "chunks of 2, 2 threads": {"chunk_networks": 2, "parallel_chunks": 2},
                "max_memory": {"max_memory": _max_memory_for_chunks_of(CHUNKED, 2)},
                "auto": {"chunk_networks": "auto", "parallel_chunks": "auto", "max_memory": "auto"}}
    inst = CHUNKED.instance(1)

    def ens_plan(cfg):
        return make_plan(get_method("ens").job(inst, inst.targets(range(3)), range(3), cfg.train))

    try:
        wholes = [run_cell(**cell.params) for cell in plan_cells(CHUNKED)]  # one per method
        assert ens_plan(CHUNKED).n_chunks == 1
        for label, fields in variants.items():
            cfg = _train(CHUNKED, **fields)
            assert ens_plan(cfg).n_chunks > 1, label  # the variant does cut the networks
            for cell, whole in zip(plan_cells(cfg), wholes, strict=True):
                got = run_cell(**cell.params)
                assert set(got.data_vars) == set(whole.data_vars)
                for name in whole.data_vars:
                    assert np.array_equal(got[name].values, whole[name].values,
                                          equal_nan=whole[name].dtype.kind == "f"), f"{label}: {cell.key} {name}"
    finally:
        autoplan.forget()


def test_the_chunking_fields_leave_a_cpu_cells_key_unchanged():
    """On the CPU a cell's key is the same whatever ``max_memory``, ``chunk_networks`` and
    ``parallel_chunks`` are (and ``cuda_graphs``), and changes with a field a result depends
    on. Where the chunk can change a result's rounding they stay in the key, whose digest is
    then the one of before: on CUDA (cuBLAS may pick its kernels by batch size) and with
    PyTorch's fused Adam of the autograd backend (its rounding depends on a network's place in
    its chunk)."""
    keys = _keys(CHUNKED)
    for fields in ({"max_memory": 1e8}, {"max_memory": "auto"}, {"chunk_networks": 1}, {"chunk_networks": None},
                   {"chunk_networks": "auto"}, {"parallel_chunks": 3}, {"parallel_chunks": None},
                   {"parallel_chunks": "auto"}, {"cuda_graphs": True},
                   {"max_memory": 2.5e9, "chunk_networks": 7, "parallel_chunks": 2}):
        assert _keys(CHUNKED, **fields) == keys, fields
    for fields in ({"epochs": 6}, {"members": 4}, {"mc_samples": 7}, {"dtype": "float64"}, {"hidden": (50, 20)},
                   {"backend": "autograd"}, {"device": "cuda"}):
        assert not set(_keys(CHUNKED, **fields)) & set(keys), fields
    assert not set(_keys(replace(CHUNKED, seed=1))) & set(keys)
    autograd = _keys(CHUNKED, backend="autograd")  # with the foreach Adam: execution only too
    assert _keys(CHUNKED, backend="autograd", chunk_networks=1, max_memory=1e8, parallel_chunks=2) == autograd
    for where in ({"device": "cuda"}, {"backend": "autograd", "adam": "fused"}):
        kept = _keys(CHUNKED, **where)
        assert [k.rsplit("_", 1)[1] for k in kept] == [
            _digest_of_before(c.params["config"]) for c in plan_cells(_train(CHUNKED, **where), chunk_repetitions=2)]
        for fields in ({"max_memory": 1e8}, {"chunk_networks": 1}, {"parallel_chunks": 3}):
            assert not set(_keys(CHUNKED, **where, **fields)) & set(kept), (where, fields)
        assert _keys(CHUNKED, **where, cuda_graphs=True) == kept


def test_a_rerun_with_other_chunking_fields_computes_nothing(tmp_path, scheduler):
    """A sweep rerun (resumed) with another ``max_memory``, ``chunk_networks`` or
    ``parallel_chunks`` reads every cell the first run wrote, computes none, and gives the same
    study; one with another number of epochs computes every cell again. (Before, their values
    were part of the cells' keys: every cell was computed again.)"""
    first, report = run_study_sweep(CHUNKED, tmp_path, chunk_repetitions=2, scheduler=scheduler, progress=False)
    n_cells = len(plan_cells(CHUNKED, chunk_repetitions=2))
    assert report.ok and len(report.computed) == n_cells == 4
    mtimes = {p: p.stat().st_mtime_ns for p in report.computed}
    for fields in ({"max_memory": 2.5e9}, {"chunk_networks": 2, "parallel_chunks": 2},
                   {"max_memory": 1e9, "chunk_networks": "auto"}):
        again, rerun = run_study_sweep(_train(CHUNKED, **fields), tmp_path, chunk_repetitions=2, scheduler=scheduler,
                                       progress=False)
        assert rerun.ok and rerun.computed == [] and sorted(rerun.skipped) == sorted(mtimes), fields
        assert_same_study(first, again)
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes
    _, other = run_study_sweep(_train(CHUNKED, epochs=6, max_memory=2.5e9), tmp_path, chunk_repetitions=2,
                               scheduler=scheduler, progress=False)
    assert len(other.computed) == n_cells and other.skipped == []


def test_a_cell_on_disk_under_its_key_of_before_is_reused_where_it_is(tmp_path, scheduler):
    """Cells written before the chunking fields left the digest are named by the digest of
    every training field but ``cuda_graphs`` (written out here): a sweep of the same
    configuration reads them where they are (:func:`plan_cells` keeps that key when only that
    file is there): nothing computed, no file renamed, rewritten or added, and the study they
    make is the sequential study's. A cell whose file is there under its key of now is read
    from that one."""
    from uqreg.study import summarize
    from uqreg.sweep import run_cell, sweep_config

    cells = tmp_path / "cells"
    cells.mkdir()
    for cell in plan_cells(sweep_config(CHUNKED), chunk_repetitions=2):
        stem, digest = cell.key.rsplit("_", 1)
        before = _digest_of_before(cell.params["config"])
        assert digest != before  # the key of now is another
        uqmetrics.write_dataset(run_cell(**cell.params), cells / f"{stem}_{before}.nc")
    mtimes = {p.name: p.stat().st_mtime_ns for p in cells.glob("*.nc")}
    assert len(mtimes) == 4
    ds, report = run_study_sweep(CHUNKED, tmp_path, chunk_repetitions=2, scheduler=scheduler, progress=False)
    assert report.ok and report.computed == [] and sorted(p.name for p in report.skipped) == sorted(mtimes)
    assert {p.name: p.stat().st_mtime_ns for p in cells.glob("*.nc")} == mtimes
    assert sorted(Path(p).name for p in json.loads(ds.attrs["caches"])) == sorted(mtimes)
    study = run_study(CHUNKED, progress=False)
    assert_same_study(study[list(ds.data_vars)], ds)
    assert_same_study(summarize(combine_cells(sorted(cells.glob("*.nc")), CHUNKED))[list(ds.data_vars)], ds)
    # the file of now, where it is there too, is the one read
    planned = plan_cells(sweep_config(CHUNKED), chunk_repetitions=2)
    stem = planned[0].key.rsplit("_", 1)[0]
    (cells / f"{planned[0].key}.nc").write_bytes(
        (cells / f"{stem}_{_digest_of_before(planned[0].params['config'])}.nc").read_bytes())
    found = [c.key for c in plan_cells(sweep_config(CHUNKED), chunk_repetitions=2, cells_dir=cells)]
    assert found[0] == planned[0].key and all(f"{k}.nc" in mtimes for k in found[1:])


# ---------------------------------------------------------------------------------------------
# issue 24: cells damaged on disk, temporary files of failed writes, two sweeps in one folder

#: A sweep of two cells (repetitions 0-1 and 2-3) of the closed-form reference: no training.
SWEEP = ["sweep", "--task", "sinusoid", "--complexities", "1", "--methods", "blr", "--recipes",
         "paper", "--repetitions", "4", "--chunk-repetitions", "2", "--quiet", "--no-plots"]


def _flip_in_variable(path, name: str, index: int, byte: int, mask: int) -> None:
    """Flip bits ``mask`` of byte ``byte`` of value ``index`` of variable ``name`` in the file
    (stored uncompressed: coordinates are), so that the file still opens and reads. The
    variable's stored bytes are found among the places they occur (``point`` holds 2, 3 too)
    as the one after whose flip only ``name`` reads differently."""
    with xr.open_dataset(path) as ds:
        before = {str(k): v.values.copy() for k, v in ds.variables.items()}
    raw = path.read_bytes()
    values = np.ascontiguousarray(before[name])
    needle, at = values.tobytes(), -1
    while (at := raw.find(needle, at + 1)) >= 0:
        data = bytearray(raw)
        data[at + index * values.itemsize + byte] ^= mask
        path.write_bytes(bytes(data))
        with xr.open_dataset(path) as ds:
            changed = [k for k, v in before.items() if not np.array_equal(
                v, ds.variables[k].values, equal_nan=v.dtype.kind == "f")]
        if changed == [name]:
            return
    path.write_bytes(raw)
    raise AssertionError(f"the values of {name} were not found in {path}")


@pytest.mark.parametrize("name, index, byte, mask",
                         [("x", 500, 7, 0x40), ("repetition", 0, 0, 0x01)], ids=["x", "repetition"])
def test_a_cell_flipped_on_disk_is_named_and_recomputed(tmp_path, capsys, scheduler, name, index,
                                                        byte, mask):
    """Issue 24 F1/F2: one value of a stored cell's ``x`` flipped on disk was taken as done
    ("2 already on disk") and combined into a study whose ``x`` had twice the points, silently;
    a flipped ``repetition`` (2 -> 3: [3, 3]) stopped the rerun with xarray's message about
    monotonic indexes, no cell named, and no rerun could repair it. The cell's data do not
    match its recorded checksums: the rerun names it in one line, recomputes it, and writes
    the same study as before."""
    out = tmp_path / "sweep"
    argv = [*SWEEP, "--out", str(out), "--scheduler", scheduler]
    assert cli.main(argv) == 0
    study = uqmetrics.read_dataset(out / "study.nc")
    victim = max((out / "cells").glob("*.nc"))  # repetitions 2-3
    assert "_r0002-0003_" in victim.name
    _flip_in_variable(victim, name, index, byte, mask)
    capsys.readouterr()
    code = cli.main([*argv, "--overwrite"])
    got = capsys.readouterr()
    assert code == 0, got.err
    assert "cells: 1 computed, 1 already on disk, 0 failed" in got.out
    assert [ln for ln in got.err.splitlines() if str(victim) in ln] == [
        (f"uqreg sweep: {victim}: variable {name!r} does not match the checksum recorded when "
         f"the file was written (the file changed on disk: corrupt); recomputing it")]
    again = uqmetrics.read_dataset(out / "study.nc")
    assert again.sizes == study.sizes
    np.testing.assert_array_equal(again["x"].values, study["x"].values)
    assert_same_study(study, again)
    assert is_complete(victim)


def test_combining_refuses_an_unverified_cell_whose_coordinates_differ(tmp_path):
    """A cell file written before checksums were recorded (the record removed on disk) with a
    flipped ``x``: combining named no file and gave a study with twice the points; it is
    refused naming the cell."""
    import netCDF4

    from uqreg.sweep import run_cell

    cfg = StudyConfig(task="sinusoid", complexities=(1,), methods=("blr",), recipes=("paper",),
                      repetitions=4)
    paths = [uqmetrics.write_dataset(run_cell(**cell.params), tmp_path / f"{cell.key}.nc")
             for cell in plan_cells(cfg, chunk_repetitions=2)]
    with netCDF4.Dataset(paths[1], "a") as nc:
        if "data_checksums" in nc.ncattrs():  # uqmetrics.runs.io.CHECKSUM_ATTR
            nc.delncattr("data_checksums")
    _flip_in_variable(paths[1], "x", 500, 7, 0x40)
    with pytest.raises(ValueError, match=f"cell file {paths[1]}: its coordinate x "):
        combine_cells(paths, cfg)


def test_temporary_files_of_failed_writes_are_removed_by_the_next_sweep(tmp_path, capsys,
                                                                          scheduler):
    """Issue 24 F6: cells/ turned read-only while the cells were written (``chattr +a``: files
    can be created there, none removed or renamed, root included): every cell's write failed
    after its temporary file was written and could not remove it; the next sweep left those
    files in cells/ for ever. It removes them (holding the folder's lock, no other sweep
    writes there)."""
    out = tmp_path / "sweep"
    cells = out / "cells"
    cells.mkdir(parents=True)
    argv = [*SWEEP, "--out", str(out), "--scheduler", scheduler]
    with append_only(cells):
        assert cli.main(argv) == 1
    assert len([p for p in cells.iterdir() if p.name.endswith(".tmp")]) == 2
    capsys.readouterr()
    assert cli.main(argv) == 0
    assert "cells: 2 computed, 0 already on disk, 0 failed" in capsys.readouterr().out
    assert [p.name for p in cells.iterdir() if not p.name.endswith(".nc")] == []  # lock too
    assert not [p for p in cells.iterdir() if p.name.endswith(".tmp")]


#: Holds a lock as :func:`uqmetrics.runs.io.exclusive_lock` does (``flock``, the holder written in
#: the file), in a process of its own.
HOLD = textwrap.dedent("""
    import fcntl, os, socket, sys, time
    os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}: uqreg sweep".encode())
    print("held", flush=True)
    time.sleep(120)
""")


def test_a_second_sweep_into_the_same_folder_is_refused_naming_the_other(tmp_path, capsys):
    """While a sweep (here: a real process holding its lock) runs into ``--out``, another one
    into the same folder is refused at once, in one line naming the lock and the process;
    nothing is computed or written."""
    out = tmp_path / "sweep"
    lock = out / "cells" / ".sweep.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        capsys.readouterr()
        assert cli.main([*SWEEP, "--out", str(out)]) == 2
        err = capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    assert err.count("\n") == 1, err
    assert err.startswith(f"uqreg sweep: error: {lock}: is held by another process "
                          f"(pid {holder.pid} on "), err
    assert err.rstrip().endswith("wait for that sweep to finish, or write to another --out")
    assert sorted(p.name for p in (out / "cells").iterdir()) == [".sweep.lock"]  # the holder's


def test_gpus_with_cells_off_cuda_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    """``--gpus`` pins each local worker to its own GPU, seen as ``cuda``: cells on the CPU (or
    on ``cuda:1``) are refused with the flag and the value named, nothing written. The GPUs
    are faked (their count); no cluster starts."""
    from uqmetrics.runs.sweep import options

    monkeypatch.setattr(options, "_gpu_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    out = tmp_path / "sweep"
    for device in ("cpu", "cuda:1"):
        assert cli.main([*SWEEP, "--out", str(out), "--gpus", "2", "--device", device]) == 2
        assert f"--device {device}: with --gpus each worker sees its own GPU alone" in \
            capsys.readouterr().err
    assert not out.exists()


def _refusing_connect(*args, **kwargs):
    """A queue that refuses the first job, as dask-jobqueue's does: its traceback logged by
    ``distributed`` (the sweep's log takes it), then the one-line ``ValueError``."""
    import logging

    try:
        raise FileNotFoundError(2, "No such file or directory", "/nonexistent")
    except FileNotFoundError:
        logging.getLogger("distributed.deploy.spec").exception("job failed")
    raise ValueError("--cluster slurm: the queue refused a job: [Errno 2] No such file or "
                     "directory: '/nonexistent' (check --cluster-option and --cluster-config)")


@pytest.mark.parametrize("queue", ["faked", "jobqueue-local"])
def test_a_sweep_the_queue_refuses_leaves_no_folder_and_changes_nothing(tmp_path, capfd,
                                                                        monkeypatch, queue):
    """packages/uqreg/README.md#bad-input, docs/hpc.md: a sweep whose cluster refuses to start
    (``--cluster-option python=`` a program that does not exist under ``jobqueue-local``;
    ``faked``: the same refusal where dask-jobqueue is not installed) exits 2 with one line,
    and leaves no ``--out`` (no empty ``cells/``, no ``sweep.log`` holding the queue's
    traceback) or, for an ``--out`` that was there, its content as it was."""
    if queue == "faked":
        from uqmetrics.runs.sweep import run

        monkeypatch.setattr(run, "_connect", _refusing_connect)
        cluster, kind = [], "slurm"  # the local cluster's start, refused as a queue's
    else:
        pytest.importorskip("dask_jobqueue")
        cluster = ["--cluster", "jobqueue-local", "--cluster-option", "cores=1",
                   "--cluster-option", "memory=1GB", "--cluster-option", "python=/nonexistent"]
        kind = queue
    out = tmp_path / "new" / "sweep"
    before = tmp_path / "before"
    (before / "cells").mkdir(parents=True)
    (before / "sweep.log").write_text("a log of before\n")
    (before / "notes.txt").write_text("mine\n")
    for target in (out, before):
        capfd.readouterr()
        assert cli.main([*SWEEP, "--out", str(target), *cluster]) == 2
        err = capfd.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith(f"uqreg sweep: error: --cluster {kind}: the queue refused a job: "), err
        assert "No such file or directory: '/nonexistent'" in err
    assert not (tmp_path / "new").exists()
    assert sorted(str(p.relative_to(before)) for p in before.rglob("*")) == [
        "cells", "notes.txt", "sweep.log"]
    assert (before / "sweep.log").read_text() == "a log of before\n"
    assert (before / "notes.txt").read_text() == "mine\n"
