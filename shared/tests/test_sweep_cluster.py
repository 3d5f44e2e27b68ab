"""Sweeps on job-queue clusters (uqmetrics.runs.sweep.ClusterSpec, dask-jobqueue) and where a sweep's
dashboard listens.

The queue path runs for real through dask-jobqueue's local job class (``--cluster
jobqueue-local``: the job scripts a queue would run, started as local processes), the code path
of slurm, pbs, lsf and sge but for the submit command. Every scheduler here binds to 127.0.0.1
(``scheduler-options: {host: 127.0.0.1}`` in the cluster config file; the LocalCluster's is on
loopback already), and every dashboard too unless a test asks otherwise.
"""

import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import xarray as xr

# what this file shares with the sweeps on a LocalCluster (which need no dask-jobqueue)
from test_sweep_dashboard import (  # noqa: F401  (the fixture: used by name)
    LOOPBACK,
    _link_port,
    _listening,
    _parse,
    _square,
    _sweep_listening,
    _workers_import_this_module,
)

from uqmetrics.runs import sweep
from uqmetrics.runs.io import read_dataset
from uqmetrics.runs.sweep import Cell, ClusterSpec, launch, run_sweep
from uqmetrics.runs.testing.signals import sigint_raises

dask_jobqueue = pytest.importorskip("dask_jobqueue")


def _slow_square(i: int, seconds: float) -> xr.Dataset:
    import time

    time.sleep(seconds)
    return _square(i)


def _expected(i: int) -> np.ndarray:
    return np.arange(3.0) * i * i


def _config(tmp_path: Path, extra: str = "") -> Path:
    """A dask-jobqueue config file (the documented YAML layout) for the local job class: one
    core, a small memory limit, the scheduler on loopback."""
    path = tmp_path / "jobqueue.yaml"
    path.write_text("jobqueue:\n  local:\n    cores: 1\n    memory: 1GB\n"
                    "    scheduler-options:\n      host: 127.0.0.1\n" + extra)
    return path


def _running_jobs() -> list[psutil.Process]:
    """The jobs of dask-jobqueue's local job class running now: the worker commands this
    process started (the jobs of closed clusters, killed, are zombies until reaped)."""
    jobs = []
    for proc in psutil.Process().children():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and any(
                    "distributed.cli.dask_worker" in a for a in proc.cmdline()):
                jobs.append(proc)
        except psutil.Error:  # ended meanwhile
            continue
    return jobs


def _read_values(out: Path, n: int) -> dict[int, np.ndarray]:
    values = {}
    for i in range(n):
        with read_dataset(out / f"c{i}.nc") as ds:
            values[i] = ds["v"].values.copy()
    return values


# ---------------------------------------------------------------------------------------------
# the options


def test_options_build_a_queue_spec_and_bad_values_name_the_option(tmp_path):
    cfg = _config(tmp_path)
    spec = ClusterSpec.from_args(_parse(
        "--cluster", "slurm", "--cluster-option", "queue=gpu", "--cluster-option",
        "walltime=04:00:00", "--cluster-option", "cores=8", "--cluster-option",
        "job-extra-directives=--exclusive", "--cluster-config", str(cfg), "--jobs", "8",
        "--gpus-per-job", "1"), gpu_cells=True)
    assert spec.kind == "slurm" and spec.jobs == 8 and spec.gpus_per_job == 1
    assert dict(spec.options) == {"queue": "gpu", "walltime": "04:00:00", "cores": 8,
                                  "job_extra_directives": ["--exclusive"]}
    assert spec.resources == {"GPU": 1}
    # the same options on cpu: no resource asked of the cells
    assert ClusterSpec.from_args(_parse("--cluster", "slurm", "--gpus-per-job", "1")
                                 ).resources is None
    # the default: today's LocalCluster, its worker count by --workers
    args = _parse()
    assert ClusterSpec.from_args(args).local_default and args.workers == 2
    assert ClusterSpec.from_args(_parse("--scheduler", "tcp://h:8786")).address == "tcp://h:8786"

    bad = [(("--cluster", "slurm", "--cluster-option", "cores=eight"), r"cores=eight.*integer"),
           (("--cluster", "slurm", "--cluster-option", "queue"), r"'queue'.*KEY=VALUE"),
           (("--cluster", "slurm", "--cluster-option", "ncpus=2"), (r"'ncpus' is not an option "
                                                                   r"of --cluster slurm")),
           (("--cluster", "slurm", "--cluster-option", "queue=a", "--cluster-option", "queue=b"),
            r"queue is given twice"),
           (("--cluster-option", "queue=gpu"), (r"--cluster-option 'queue=gpu'.*not --cluster "
                                               r"local")),
           (("--jobs", "3"), r"--jobs 3.*not --cluster local"),
           (("--scheduler", "tcp://h:8786", "--cluster", "pbs"), (r"--scheduler 'tcp://h:8786' "
                                                                r"and --cluster pbs")),
           (("--cluster", "slurm", "--gpus-per-job", "1", "--cluster-option", "processes=2"),
            r"processes=2 with --gpus-per-job"),
           (("--dashboard", "localhost"), r"--dashboard must be HOST:PORT.*'localhost'"),
           (("--cluster", "sge", "--cluster-config", str(tmp_path / "none.yaml")),
            r"--cluster-config .*none.yaml.*cannot read")]
    for argv, message in bad:
        with pytest.raises(ValueError, match=message):
            ClusterSpec.from_args(_parse(*argv))
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ValueError, match=r"list.yaml' must hold a mapping"):
        ClusterSpec(kind="slurm", config_file=str(tmp_path / "list.yaml"))
    with pytest.raises(ValueError, match=r"--gpus-per-job must be 0 or 1, got 2"):
        ClusterSpec(kind="slurm", gpus_per_job=2)


def test_the_slurm_job_script_has_the_directives_the_options_ask_for(tmp_path):
    """The SLURM cluster these options make, built without a queue (no job submitted): its job
    script, its scheduler and dashboard addresses."""
    import dask
    from distributed.comm import get_tcp_server_address

    cfg = tmp_path / "slurm.yaml"
    cfg.write_text("jobqueue:\n  slurm:\n    memory: 16GB\n"
                   "    job-script-prologue: ['module load cuda']\n"
                   "    scheduler-options:\n      host: 127.0.0.1\n")
    spec = ClusterSpec.from_args(_parse(
        "--cluster", "slurm", "--cluster-config", str(cfg), "--cluster-option", "queue=gpu",
        "--cluster-option", "account=uq", "--cluster-option", "walltime=04:00:00",
        "--cluster-option", "cores=4", "--cluster-option", "job_extra_directives=--exclusive",
        "--cluster-option", "local_directory=/scratch/dask", "--gpus-per-job", "1",
        "--jobs", "8"), gpu_cells=True)
    with dask.config.set(sweep.read_cluster_config(spec.config_file)):
        cls, kwargs = launch._queue_cluster_args(spec)
        assert cls is dask_jobqueue.SLURMCluster
        with cls(silence_logs=logging.CRITICAL, **kwargs) as cluster:
            script = cluster.job_script()
            scheduler_host = cluster.scheduler_address.split("://")[1].rsplit(":", 1)[0]
            dashboard = get_tcp_server_address(cluster.scheduler.http_server)[0]  # bound
    directives = [ln.split(None, 1)[1] for ln in script.splitlines()
                  if ln.startswith("#SBATCH")]
    for wanted in ("-p gpu", "-A uq", "-t 04:00:00", "--cpus-per-task=4", "--mem=15G",
                   "--exclusive", "--gres=gpu:1"):
        assert wanted in directives, (wanted, script)
    assert "module load cuda" in script  # the config file's setting, kept
    command = script.strip().splitlines()[-1]
    assert "--nthreads 4" in command  # one worker process of the job's four cores
    assert "--resources GPU=1" in command and "--local-directory /scratch/dask" in command
    assert scheduler_host == "127.0.0.1" and dashboard == "127.0.0.1"


# ---------------------------------------------------------------------------------------------
# a sweep on jobs


def test_a_sweep_on_jobs_resumes_and_survives_a_killed_job(tmp_path, monkeypatch):
    """A real sweep of six cells on two jobs of dask-jobqueue's local job class; the rerun
    after removing one cell file recomputes that one alone. Then one job holding a cell is
    killed (SIGKILL to its processes, as a queue preempting it) while the sweep runs: the cell
    goes to the other job, a job is submitted in the killed one's place, and the sweep still
    finishes every cell; a rerun has nothing left to do and the values are those of a direct
    computation."""
    monkeypatch.setattr(launch, "WORKER_CHECK_INTERVAL", 0.5)
    cfg = _config(tmp_path, "distributed:\n  deploy:\n    lost-worker-timeout: 1s\n")
    spec = ClusterSpec.from_args(_parse("--cluster", "jobqueue-local", "--cluster-config",
                                        str(cfg), "--jobs", "2"))
    cells = [Cell(f"c{i}", {"i": i}) for i in range(6)]
    out = tmp_path / "out"
    first = run_sweep(cells, _square, out, scheduler=spec, progress=False)
    assert first.ok and len(first.computed) == 6
    (out / "c3.nc").unlink()
    again = run_sweep(cells, _square, out, scheduler=spec, progress=False)
    assert again.ok and [p.name for p in again.computed] == ["c3.nc"]
    assert len(again.skipped) == 5
    assert {i: v.tolist() for i, v in _read_values(out, 6).items()} == \
        {i: _expected(i).tolist() for i in range(6)}

    # a job killed mid-sweep
    out = tmp_path / "killed"
    slow = [Cell(f"c{i}", {"i": i, "seconds": 1.0}) for i in range(6)]
    killed: list[int] = []

    def kill_a_busy_job(cell, error):
        if killed:
            return
        jobs = _running_jobs()
        assert len(jobs) >= 1
        job = jobs[0]
        for proc in [*job.children(recursive=True), job]:
            killed.append(proc.pid)
            os.kill(proc.pid, signal.SIGKILL)

    report = run_sweep(slow, _slow_square, out, scheduler=spec, progress=False,
                       on_result=kill_a_busy_job)
    assert killed
    assert report.ok, report.failed
    assert len(report.computed) == 6
    rerun = run_sweep(slow, _slow_square, out, scheduler=spec, progress=False)
    assert rerun.ok and not rerun.computed and len(rerun.skipped) == 6
    assert {i: v.tolist() for i, v in _read_values(out, 6).items()} == \
        {i: _expected(i).tolist() for i in range(6)}


def test_the_only_job_killed_is_replaced_and_the_sweep_finishes(tmp_path, monkeypatch):
    """One job, killed after the first cell: no worker is left, so the sweep would wait for
    ever unless a job is submitted in its place (:func:`uqmetrics.runs.sweep.launch._keep_workers`)."""
    monkeypatch.setattr(launch, "WORKER_CHECK_INTERVAL", 0.5)
    cfg = _config(tmp_path, "distributed:\n  deploy:\n    lost-worker-timeout: 1s\n")
    spec = ClusterSpec(kind="jobqueue-local", config_file=str(cfg), jobs=1)
    cells = [Cell(f"c{i}", {"i": i, "seconds": 0.3}) for i in range(4)]
    pids: list[int] = []
    done = threading.Event()

    def kill_the_job(cell, error):
        if pids:
            return
        jobs = _running_jobs()
        assert len(jobs) == 1
        job = jobs[0]
        for proc in [*job.children(recursive=True), job]:
            pids.append(proc.pid)
            os.kill(proc.pid, signal.SIGKILL)

    watchdog = threading.Timer(90, lambda: done.is_set() or os.kill(os.getpid(),
                                                                   signal.SIGINT))
    watchdog.start()
    try:
        with sigint_raises():  # the watchdog's SIGINT stops a hung sweep even under nohup
            report = run_sweep(cells, _slow_square, tmp_path / "out", scheduler=spec,
                               progress=False, on_result=kill_the_job)
    finally:
        done.set()
        watchdog.cancel()
    assert pids and report.ok and len(report.computed) == 4
    assert {i: v.tolist() for i, v in _read_values(tmp_path / "out", 4).items()} == \
        {i: _expected(i).tolist() for i in range(4)}
    for pid in pids:  # the killed job's processes are gone (none came back under its pid)
        try:
            assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            pass


def test_gpu_cells_run_on_workers_with_the_gpu_resource(tmp_path):
    """``--gpus-per-job 1`` on cells that ask for a GPU: each job's worker has the resource
    GPU=1 (in its job script's worker arguments) and the cells run there one at a time; a
    resource the jobs do not give is refused before anything starts."""
    cfg = _config(tmp_path)
    spec = ClusterSpec(kind="jobqueue-local", config_file=str(cfg), jobs=1, gpus_per_job=1,
                       resources={"GPU": 1})
    cells = [Cell(f"c{i}", {"i": i}) for i in range(3)]
    report = run_sweep(cells, _square, tmp_path / "out", scheduler=spec, progress=False)
    assert report.ok and len(report.computed) == 3
    with pytest.raises(ValueError, match=r"resources \{'GPU': 1\}.*--gpus-per-job 1"):
        run_sweep(cells, _square, tmp_path / "other",
                  scheduler=ClusterSpec(kind="jobqueue-local", config_file=str(cfg)),
                  resources={"GPU": 1}, progress=False)


# ---------------------------------------------------------------------------------------------
# a one-node SLURM started here


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A one-node SLURM on this machine (munged, slurmctld and slurmd of Debian's slurm-wlm,
    started here with a configuration of their own under a temporary folder, on loopback,
    stopped at the end): the folder, whose ``slurm.conf`` ``SLURM_CONF`` must name. Skipped
    without the programs, ``/etc/munge/munge.key`` or root."""
    programs = {p: shutil.which(p) for p in ("munged", "slurmctld", "slurmd", "sbatch", "sinfo",
                                             "squeue", "scancel")}
    if not all(programs.values()) or not Path("/etc/munge/munge.key").is_file() \
            or os.geteuid() != 0:
        pytest.skip("a one-node SLURM needs root and Debian's slurm-wlm and munge "
                    "(apt-get install slurm-wlm)")
    d = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool", "log"):
        (d / sub).mkdir()
    host = socket.gethostname()
    (d / "slurm.conf").write_text(f"""ClusterName=uqtest
SlurmctldHost={host}(127.0.0.1)
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
    env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
    pid_files = [d / "munged.pid", d / "slurmctld.pid", d / "slurmd.pid"]
    try:
        subprocess.run([programs["munged"], f"--socket={d}/munge.sock",
                        f"--pid-file={d}/munged.pid", f"--seed-file={d}/munge.seed",
                        f"--log-file={d}/log/munged.log", "--key-file=/etc/munge/munge.key",
                        "--force"], check=True, env=env, timeout=30)
        for daemon in ("slurmctld", "slurmd"):
            subprocess.run([programs[daemon], "-f", str(d / "slurm.conf")], check=True, env=env,
                           timeout=30)
        deadline = time.monotonic() + 60
        while True:
            state = subprocess.run([programs["sinfo"], "-h", "-o", "%T"], env=env,
                                   capture_output=True, text=True, check=False).stdout.strip()
            if state == "idle":
                break
            assert time.monotonic() < deadline, f"the SLURM node is {state!r}, not idle"
            time.sleep(0.5)
        yield d
    finally:  # the daemons started here, by their pid files
        for pid_file in reversed(pid_files):
            if pid_file.is_file():
                try:
                    os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
                except (ProcessLookupError, ValueError):
                    pass


def test_a_sweep_on_a_one_node_slurm_survives_its_only_job_cancelled(slurm, tmp_path,
                                                                     monkeypatch):
    """``--cluster slurm`` for real: the cells run in a sbatch job; that job cancelled
    (``scancel``, as a preemption) after the first cell, a job is submitted in its place and
    the sweep finishes every cell; the rerun has nothing to do and the values are right."""
    monkeypatch.setenv("SLURM_CONF", str(slurm / "slurm.conf"))
    monkeypatch.setattr(launch, "WORKER_CHECK_INTERVAL", 0.5)
    cfg = tmp_path / "slurm.yaml"
    cfg.write_text("jobqueue:\n  slurm:\n    scheduler-options:\n      host: 127.0.0.1\n"
                   f"    log-directory: {tmp_path / 'jobs'}\n"
                   "distributed:\n  deploy:\n    lost-worker-timeout: 1s\n")
    spec = ClusterSpec.from_args(_parse(
        "--cluster", "slurm", "--cluster-config", str(cfg), "--cluster-option", "cores=1",
        "--cluster-option", "memory=1GB", "--cluster-option", "walltime=00:10:00",
        "--jobs", "1"))
    cells = [Cell(f"c{i}", {"i": i, "seconds": 0.5}) for i in range(4)]
    cancelled: list[str] = []

    def cancel_the_job(cell, error):
        if cancelled:
            return
        jobs = subprocess.run(["squeue", "-h", "-o", "%i", "-t", "RUNNING"], capture_output=True,
                              text=True, check=True).stdout.split()
        assert len(jobs) == 1, jobs
        subprocess.run(["scancel", jobs[0]], check=True)
        cancelled.append(jobs[0])

    report = run_sweep(cells, _slow_square, tmp_path / "out", scheduler=spec, progress=False,
                       on_result=cancel_the_job)
    assert cancelled and report.ok, report.failed
    assert len(report.computed) == 4
    outputs = sorted(p.name for p in (tmp_path / "jobs").glob("*.err"))
    assert len(outputs) >= 2, outputs  # the cancelled job and the one in its place
    rerun = run_sweep(cells, _slow_square, tmp_path / "out", scheduler=spec, progress=False)
    assert rerun.ok and not rerun.computed and len(rerun.skipped) == 4
    assert {i: v.tolist() for i, v in _read_values(tmp_path / "out", 4).items()} == \
        {i: _expected(i).tolist() for i in range(4)}


def test_a_job_the_queue_refuses_is_one_error_not_a_sweep_waiting_for_ever(slurm, tmp_path,
                                                                          monkeypatch):
    """An unknown partition: sbatch refuses the job, and the sweep says so (with sbatch's
    words) instead of waiting for workers that never come; no cell file is written."""
    monkeypatch.setenv("SLURM_CONF", str(slurm / "slurm.conf"))
    cfg = tmp_path / "slurm.yaml"
    cfg.write_text("jobqueue:\n  slurm:\n    scheduler-options:\n      host: 127.0.0.1\n")
    spec = ClusterSpec.from_args(_parse(
        "--cluster", "slurm", "--cluster-config", str(cfg), "--cluster-option", "cores=1",
        "--cluster-option", "memory=1GB", "--cluster-option", "queue=no-such-partition"))
    with pytest.raises(ValueError, match=r"--cluster slurm: the queue refused a job: .*"
                                         r"invalid partition"):
        run_sweep([Cell("c0", {"i": 0})], _square, tmp_path / "out", scheduler=spec,
                  progress=False)
    assert not list((tmp_path / "out").glob("*.nc"))


# ---------------------------------------------------------------------------------------------
# the dashboard


def test_a_queue_clusters_dashboard_is_on_loopback_and_printed_once(tmp_path, capfd):
    spec = ClusterSpec(kind="jobqueue-local", config_file=str(_config(tmp_path)), jobs=1)
    seen, err = _sweep_listening(tmp_path, "queue", spec, capfd)
    port = _link_port(err)
    assert port is not None and "(1 jobqueue-local job(s) asked for)" in err
    assert {addr for addr, p in seen if p == port} == {"127.0.0.1"}


def test_a_job_whose_worker_cannot_start_is_one_line_with_the_reason(tmp_path, capfd):
    """``--cluster-option python=/nonexistent``: the job's command cannot start. The sweep
    stops with one line naming the queue's reason (dask-jobqueue, closing the cluster, would
    raise its own TypeError over it: a job never started has no job id to cancel), and leaves
    no process behind."""
    spec = ClusterSpec.from_args(_parse("--cluster", "jobqueue-local", "--cluster-config",
                                        str(_config(tmp_path)), "--cluster-option",
                                        "python=/nonexistent"))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ValueError) as exc:
        run_sweep([Cell("c0", {"i": 1})], _square, tmp_path / "out", scheduler=spec,
                  progress=False)
    message = str(exc.value)
    assert message == ("--cluster jobqueue-local: the queue refused a job: [Errno 2] No such "
                       "file or directory: '/nonexistent' (check --cluster-option and "
                       "--cluster-config)")
    assert "Traceback" not in capfd.readouterr().err
    assert not {p.pid for p in psutil.Process().children(recursive=True)} - before


def test_a_refused_queue_leaves_no_folder_and_no_log(tmp_path, capfd):
    """The same refusal, with the sweep's folder and log: a folder it made is removed, with
    its log (the queue's traceback); a folder that was there keeps its content, its log cut
    back to what it held (packages/uqreg/README.md#bad-input: no empty folder is left)."""
    spec = ClusterSpec.from_args(_parse("--cluster", "jobqueue-local", "--cluster-config",
                                        str(_config(tmp_path)), "--cluster-option",
                                        "python=/nonexistent"))
    new = tmp_path / "new" / "out"
    before = tmp_path / "before"
    before.mkdir()
    (before / "sweep.log").write_text("earlier\n")
    (before / "cell.nc").write_text("not a cell")
    for out in (new, before):
        with pytest.raises(ValueError, match="the queue refused a job"):
            run_sweep([Cell("c0", {"i": 1})], _square, out, scheduler=spec, progress=False,
                      log_file=out / "sweep.log")
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in before.iterdir()) == ["cell.nc", "sweep.log"]
    assert (before / "sweep.log").read_text() == "earlier\n"
    assert "Traceback" not in capfd.readouterr().err


def test_undone_if_refused_undoes_only_a_refusal_before_any_work(tmp_path):
    """:func:`uqmetrics.runs.sweep.undone_if_refused`: on a refusal, the folders and files the
    block made at the paths named are removed and a file there before is cut back; nothing is
    undone once the block said its work began (``kept``), for another exception, or where
    something else was written."""
    def refused(paths, body, error=ValueError):
        with pytest.raises(error), sweep.undone_if_refused(*paths) as refusal:
            body(refusal)
            raise error("refused")

    out = tmp_path / "a" / "b"
    log = tmp_path / "log"

    def make(refusal, extra=None):
        (out / "cells").mkdir(parents=True, exist_ok=True)
        with open(log, "a") as f:
            f.write("refusal\n")
        if extra:
            (out / extra).write_text("x")

    refused([out / "cells", log], make)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    log.write_text("before\n")
    refused([out / "cells", log], make)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log"] and log.read_text() == "before\n"
    refused([out / "cells", log], lambda r: (make(r), r.kept()))  # the work began: kept
    assert (out / "cells").is_dir() and log.read_text() == "before\nrefusal\n"
    shutil.rmtree(tmp_path / "a")
    refused([out / "cells"], lambda r: make(r, extra="result.nc"))  # a result: kept
    assert (out / "result.nc").is_file()
    shutil.rmtree(tmp_path / "a")
    refused([out / "cells"], make, error=KeyError)  # not a refusal
    assert (out / "cells").is_dir()
