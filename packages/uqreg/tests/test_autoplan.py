"""The engine's measured execution plan (``chunk_networks="auto"``, ``parallel_chunks="auto"``).

The plan is measured once per device and shape class, recorded atomically in a JSON file,
reused, measured again on request, and changes no bit of a result: an auto-chosen chunk gives
the predictions a fixed chunk gives, bit for bit in float32 on the CPU. On CUDA (skipped
without one): two runs are bit-identical, and concurrent chunks on CUDA streams give the bits
of one chunk after another.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import execution_check
import numpy as np
import pytest
import torch

from uqreg import cli
from uqreg.engine import AUTO, TrainConfig, autoplan, make_plan, recording_plans
from uqreg.engine.config import ConfigError, cuda_plan_defaults
from uqreg.engine.plan import available_cores
from uqreg.methods import get_method

EPOCHS = 5
VARS = ("prediction", "uncertainty", "train_loss", "collapsed_fraction")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(autouse=True)
def record(tmp_path, monkeypatch):
    """A fresh record file, small CPU candidates (a fixed chunk of 64 holds every network of
    these jobs, so any measured chunk cuts them differently), nothing remembered."""
    path = tmp_path / "cache" / "engine_plan.json"
    monkeypatch.setenv(autoplan.PLAN_FILE_ENV, str(path))
    monkeypatch.delenv(autoplan.REMEASURE_ENV, raising=False)
    monkeypatch.setattr(autoplan, "CPU_CHUNKS", (2, 4, 8))
    autoplan.forget()
    yield path
    autoplan.forget()


def _cfg(**kw) -> TrainConfig:
    base = {"dtype": "float32", "members": 3, "mc_samples": 6, "hidden": execution_check.HIDDEN,
            "epochs": EPOCHS}
    return TrainConfig(**{**base, **kw})


def _job(name="ens", reps=9, **kw):
    inst = execution_check.instance(2)
    y = inst.targets(range(reps))
    return get_method(name).job(inst, y, range(reps), _cfg(**kw), epochs=EPOCHS)


def _run(name, cfg, reps):
    inst = execution_check.instance(2)
    return get_method(name).run(inst, inst.targets(reps), reps, cfg, epochs=EPOCHS)


@pytest.mark.parametrize("name", ["ens", "bd"])
def test_auto_plan_gives_the_fixed_chunks_bits(name, record):
    """A measured chunk (here 2, 4 or 8 networks) and concurrency give the float32 predictions of
    one fixed chunk of 64 holding every network, bit for bit; the plan is recorded."""
    reps = list(range(9 if name == "ens" else 19))
    auto = _cfg(chunk_networks=AUTO, parallel_chunks=AUTO)
    plan = make_plan(get_method(name).job(execution_check.instance(2), execution_check.instance(2).targets(reps),
                                          reps, auto, epochs=EPOCHS))
    assert plan.source == "measured" and plan.chunk in (2, 4, 8) and plan.n_chunks > 1
    a, b = _run(name, auto, reps), _run(name, _cfg(), reps)
    for v in VARS:
        assert np.array_equal(getattr(a, v), getattr(b, v), equal_nan=True), v
    plans = json.loads(record.read_text())["plans"]
    assert len(plans) == 1
    (key, entry), = plans.items()
    assert json.loads(key)["head"] == get_method(name).head and entry["chunk_networks"] == plan.chunk
    assert entry["rates"][0][0] == 2  # ascending from the smallest candidate


@pytest.mark.parametrize(("budget", "chosen", "warned"), [(5, 4, True), (64, 8, False)])
def test_a_chunk_bounded_by_the_memory_budget_is_said(monkeypatch, caplog, budget, chosen, warned):
    """When the fastest chunk is the largest the memory budget admits, and larger candidates
    exist, the log says that a larger budget may be faster (rates rising with the chunk)."""
    monkeypatch.setattr(autoplan, "rate", lambda job, size, workers: float(size * workers))
    job = _job(chunk_networks=AUTO, parallel_chunks=1)
    with caplog.at_level("WARNING", logger="uqreg.engine"):
        plan = autoplan.measure(job, int(job.cfg.max_memory // budget))
    assert plan.chunk == chosen
    assert ("larger --max-memory" in caplog.text) is warned


def test_the_record_is_reused_then_remeasured_on_request(record, monkeypatch):
    job = _job(chunk_networks=AUTO)
    first = make_plan(job)
    assert first.source == "measured" and first.workers == min(available_cores(), first.n_chunks)  # not auto
    autoplan.forget()  # a new process: the record answers, nothing is measured

    def refuse(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(autoplan, "measure", refuse)
    again = make_plan(job)
    assert again.source == "recorded" and again.chunk == first.chunk
    # another shape class (other hidden widths) is not the recorded one
    with pytest.raises(AssertionError, match="measured again"):
        make_plan(_job(chunk_networks=AUTO, hidden=(8,)))
    autoplan.forget()
    monkeypatch.setenv(autoplan.REMEASURE_ENV, "1")
    seen = []
    monkeypatch.setattr(autoplan, "measure", lambda job, per_net: seen.append(1) or autoplan.MeasuredPlan(
        4, 1, "measured", ((4, 1, 1.0),), "test"))
    assert make_plan(job).chunk == 4 and make_plan(job).chunk == 4 and seen == [1]  # once per process
    assert next(iter(json.loads(record.read_text())["plans"].values()))["chunk_networks"] == 4


def test_an_unreadable_record_is_measured_anew_and_rewritten(record):
    record.parent.mkdir(parents=True)
    record.write_text("{not json")
    assert make_plan(_job(chunk_networks=AUTO)).source == "measured"
    assert json.loads(record.read_text())["format"] == autoplan.RECORD_FORMAT


def test_concurrent_writers_keep_every_entry(record):
    """Workers writing their entries at once (under the lock, atomically) lose none, and the
    file is always whole JSON."""
    errors = []

    def writer(i):
        try:
            with autoplan._waiting_lock(record.with_name(record.name + ".lock")) as held:
                assert held
                autoplan.write_entry(record, f"key{i}", {"chunk_networks": i + 1, "parallel_chunks": 1})
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(autoplan.read_record(record)) == [f"key{i}" for i in range(8)]
    assert not [p for p in record.parent.iterdir() if p.name.endswith(".tmp")]


def test_a_study_records_the_measured_plan_in_its_attrs():
    from uqreg.study import StudyConfig, run_raw

    cfg = StudyConfig(task="sinusoid", complexities=(1,), repetitions=2, methods=("ens",), n_train=20,
                      train=_cfg(members=3, epochs=3, chunk_networks=AUTO))
    ds = run_raw(cfg, progress=False)
    (plan,) = json.loads(ds.attrs["engine_plans"])
    assert plan["chunk"] in (2, 4, 8) and plan["shape"]["head"] == "deterministic"
    assert "engine_plans" not in run_raw(replace(cfg, train=_cfg(members=3, epochs=3)), progress=False).attrs
    with recording_plans() as plans:
        make_plan(_job(chunk_networks=AUTO))
    assert len(plans) == 1


def test_a_swept_study_records_every_cells_plan(tmp_path):
    """The combined study of a sweep lists the measured plans of all its cells, each once."""
    import uqmetrics

    from uqreg.study import StudyConfig
    from uqreg.sweep import combine_cells, plan_cells, run_cell

    cfg = StudyConfig(task="sinusoid", complexities=(1,), repetitions=2, methods=("ens", "bd"), n_train=20,
                      train=_cfg(members=3, epochs=3, chunk_networks=AUTO))
    paths = [uqmetrics.write_dataset(run_cell(**cell.params), tmp_path / f"{cell.key}.nc")
             for cell in plan_cells(cfg, chunk_repetitions=2)]
    plans = json.loads(combine_cells(paths, cfg).attrs["engine_plans"])
    assert sorted(p["shape"]["head"] for p in plans) == ["bernoulli", "deterministic"]


def test_auto_is_a_value_of_the_config_and_the_cuda_default_of_the_command_line():
    with pytest.raises(ConfigError, match="chunk_networks must be an integer >= 1 or auto, got 'fast'"):
        TrainConfig(chunk_networks="fast")
    with pytest.raises(ConfigError, match="parallel_chunks"):
        TrainConfig(parallel_chunks=0)
    assert cuda_plan_defaults(TrainConfig()) == TrainConfig()  # the CPU: unchanged
    gpu = cuda_plan_defaults(TrainConfig(device="cuda"), given={"chunk_networks"})
    assert (gpu.chunk_networks, gpu.parallel_chunks) == (64, AUTO)
    a = cli.build_parser().parse_args(["study", "--device", "cuda:0", "--parallel-chunks", "3"])
    (_, study), = cli._studies_from_args(a)
    assert (study.train.chunk_networks, study.train.parallel_chunks) == (AUTO, 3)


def test_max_memory_auto_is_the_cuda_default_resolved_where_the_work_runs():
    """``--max-memory auto`` (the command line's default on CUDA) is half the CUDA device's
    memory, read where the work runs; on the CPU it is the fixed default, and a study's memory
    check (made where the study is planned, maybe without that GPU) takes the fixed default
    in its place. A number given stays in bytes."""
    from uqreg.engine.config import DEFAULT_MAX_MEMORY
    from uqreg.study import StudyConfig

    assert TrainConfig(max_memory=AUTO).memory_budget() == DEFAULT_MAX_MEMORY == TrainConfig().memory_budget()
    with pytest.raises(ConfigError, match="max_memory must be a finite number > 0 or auto, got 'lots'"):
        TrainConfig(max_memory="lots")
    (_, gpu), = cli._studies_from_args(cli.build_parser().parse_args(["study", "--device", "cuda"]))
    (_, cpu), = cli._studies_from_args(cli.build_parser().parse_args(["study"]))
    (_, given), = cli._studies_from_args(cli.build_parser().parse_args(["study", "--device", "cuda",
                                                                       "--max-memory", "2"]))
    (_, asked), = cli._studies_from_args(cli.build_parser().parse_args(["study", "--max-memory", "auto"]))
    assert (gpu.train.max_memory, cpu.train.max_memory, given.train.max_memory, asked.train.max_memory) \
        == (AUTO, DEFAULT_MAX_MEMORY, 2 * 2**30, AUTO)
    study = StudyConfig(task="sinusoid", complexities=(1,), methods=("ens",), repetitions=2)
    auto = replace(study, train=replace(study.train, max_memory=AUTO, device="cuda:7"))
    assert auto.memory_estimate(1)["training"] == study.memory_estimate(1)["training"]
    auto.check_memory()  # no CUDA device 7 needed here
    if torch.cuda.is_available():
        total = torch.cuda.get_device_properties(0).total_memory
        assert TrainConfig(device="cuda", max_memory=AUTO).memory_budget() == 0.5 * total


def test_cuda_graphs_is_an_option_of_the_config_and_leaves_cell_keys_unchanged():
    """``--cuda-graphs`` sets the config's field (off by default, a bool only); being execution
    only, it is left out of the cells' digest, so a sweep on disk resumes with or without it."""
    from uqreg.study import StudyConfig
    from uqreg.sweep import plan_cells

    with pytest.raises(ConfigError, match="cuda_graphs must be true or false, got 'yes'"):
        TrainConfig(cuda_graphs="yes")
    (_, plain), = cli._studies_from_args(cli.build_parser().parse_args(["study", "--device", "cuda"]))
    (_, graphed), = cli._studies_from_args(cli.build_parser().parse_args(["study", "--device", "cuda",
                                                                          "--cuda-graphs"]))
    assert (plain.train.cuda_graphs, graphed.train.cuda_graphs) == (False, True)
    cfg = StudyConfig(task="sinusoid", complexities=(1,), methods=("bd",), repetitions=2)
    keys = [c.key for c in plan_cells(cfg)]
    assert keys == [c.key for c in plan_cells(replace(cfg, train=replace(cfg.train, cuda_graphs=True)))]
    assert keys != [c.key for c in plan_cells(replace(cfg, train=replace(cfg.train, members=4)))]


# ---------------------------------------------------------------------------------------------
# CUDA (skipped without one)


@cuda
@pytest.mark.cuda
def test_cuda_auto_plan_runs_are_bit_identical(monkeypatch):
    """Two float32 CUDA runs under the measured plan give the same bits; in float64 the
    measured plan equals a fixed chunk to rounding (cuBLAS may pick other kernels by batch
    size), at the tolerance of the CUDA-against-CPU check (test_sweep.py)."""
    monkeypatch.setattr(autoplan, "CUDA_CHUNKS", (2, 4, 8))
    reps = list(range(9))
    auto = _cfg(device="cuda", chunk_networks=AUTO, parallel_chunks=AUTO)
    a, b = _run("bd", auto, reps), _run("bd", auto, reps)
    assert make_plan(_job("bd", 9, device="cuda", chunk_networks=AUTO, parallel_chunks=AUTO)).chunk in (2, 4, 8)
    auto64 = replace(auto, dtype="float64")
    c, fixed = _run("bd", auto64, reps), _run("bd", replace(auto64, chunk_networks=64, parallel_chunks=1), reps)
    for v in VARS:
        assert np.array_equal(getattr(a, v), getattr(b, v), equal_nan=True), v
        np.testing.assert_allclose(getattr(c, v), getattr(fixed, v), rtol=1e-6, atol=1e-8, err_msg=v)


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("name", ["ens", "vd"])
def test_cuda_streams_give_the_bits_of_one_chunk_after_another(name):
    """Concurrent chunks on CUDA streams run the kernels each chunk runs alone: same bits."""
    reps = list(range(9 if name == "ens" else 19))
    one = _cfg(device="cuda", chunk_networks=4, parallel_chunks=1)
    plan = make_plan(_job(name, len(reps), device="cuda", chunk_networks=4, parallel_chunks=3))
    assert plan.workers == 3
    a, b = _run(name, one, reps), _run(name, replace(one, parallel_chunks=3), reps)
    for v in VARS:
        assert np.array_equal(getattr(a, v), getattr(b, v), equal_nan=True), v
