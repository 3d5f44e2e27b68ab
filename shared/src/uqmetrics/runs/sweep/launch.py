"""Starting and closing the cluster a sweep runs on: a ``LocalCluster`` (one worker per GPU
with ``--gpus``: :func:`gpu_worker_env`), a running scheduler or Dask workers in jobs of a queue
(dask-jobqueue), the jobs kept at their count (:data:`WORKER_CHECK_INTERVAL`), the dashboard
link, and :func:`open_client`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .logs import _sigint_held, _stderr_to
from .options import (
    _GPU_DIRECTIVES,
    DEFAULT_DASHBOARD,
    QUEUE_CLUSTERS,
    ClusterSpec,
    _jobqueue,
    read_cluster_config,
)

#: Seconds between two checks that a cluster started here still has all its workers (jobs): a
#: job that ended (preempted, past its walltime, killed) is submitted again.
WORKER_CHECK_INTERVAL = 10.0


def gpu_worker_env(gpus: tuple[str, ...]) -> dict[int, dict[str, str]]:
    """The environment of each worker of a ``LocalCluster`` of one worker per GPU (``--gpus``),
    by worker name: worker ``i`` sees ``gpus[i]`` alone.

    The variables are set by the worker's nanny when it starts the worker process (and each
    time it restarts it), before the process imports anything, so before CUDA initialises:
    a cell on ``cuda`` (``cuda:0``) runs on its worker's GPU. ``CUDA_DEVICE_ORDER`` is this
    process's, or ``PCI_BUS_ID`` (``nvidia-smi``'s numbering) when unset, so that index
    ``k`` names the same GPU in every worker.

    Parameters
    ----------
    gpus : tuple of str, shape (n_workers,)
        ``CUDA_VISIBLE_DEVICES`` entries (:attr:`ClusterSpec.gpus`), distinct.

    Returns
    -------
    dict
        ``{i: {"CUDA_VISIBLE_DEVICES": gpus[i], "CUDA_DEVICE_ORDER": ...}}``.

    Examples
    --------
    >>> gpu_worker_env(("2", "3"))[1]["CUDA_VISIBLE_DEVICES"]
    '3'
    """
    order = os.environ.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return {i: {"CUDA_VISIBLE_DEVICES": str(gpu), "CUDA_DEVICE_ORDER": order}
            for i, gpu in enumerate(gpus)}


@functools.cache
def _gpu_cluster_class() -> type:
    """``LocalCluster`` whose worker ``i`` has the environment ``gpu_worker_env(gpus)[i]``
    (defined on first use: distributed is imported lazily)."""
    from dask.distributed import LocalCluster

    class GpuLocalCluster(LocalCluster):
        """A ``LocalCluster`` of one worker process per GPU (:func:`gpu_worker_env`), started
        with ``n_workers=0`` and scaled to one worker per GPU; a worker added again (the
        cluster kept at its size, :func:`_keep_workers`) takes a GPU no worker holds."""

        def __init__(self, *, gpus: tuple[str, ...], **kwargs: Any):
            self._gpu_env = gpu_worker_env(gpus)
            # the machine's memory shared out as a LocalCluster of len(gpus) workers does (a
            # fraction of it: with n_workers=0 each worker would take nthreads / cores of it)
            kwargs.setdefault("memory_limit", 1 / len(gpus))
            super().__init__(n_workers=0, **kwargs)
            try:  # the workers started, as LocalCluster(n_workers=...) starts them
                self.scale(len(gpus))
                self.sync(self._correct_state)
            except BaseException:
                self.close()
                raise

        def new_worker_spec(self) -> dict:
            free = [i for i in self._gpu_env if i not in self.worker_spec]
            if not free:  # more workers than GPUs asked of it: as many as GPUs, no more
                raise ValueError(f"a LocalCluster of {len(self._gpu_env)} GPU worker(s) "
                                 "cannot grow past one worker per GPU")
            options = dict(self.new_spec["options"])
            options["env"] = {**(options.get("env") or {}), **self._gpu_env[free[0]]}
            return {free[0]: {"cls": self.new_spec["cls"], "options": options}}

    return GpuLocalCluster


def _dashboard_option(spec: ClusterSpec, config_name: str | None = None) -> str | None:
    """The dashboard address to bind (None: no dashboard): ``--dashboard``, else for a queue
    kind the config's ``scheduler-options``, else :data:`DEFAULT_DASHBOARD`."""
    if spec.dashboard == "none":
        return None
    if spec.dashboard is not None:
        return spec.dashboard
    if config_name is not None:
        import dask

        configured = (dask.config.get(f"jobqueue.{config_name}.scheduler-options", {}) or {}
                      ).get("dashboard_address")
        if configured:
            return configured
    return DEFAULT_DASHBOARD


def _local_dashboard_args(spec: ClusterSpec) -> dict[str, Any]:
    """A LocalCluster's dashboard keywords (:func:`_dashboard_option`): without a dashboard its
    scheduler's HTTP server (health routes) is still started, and left on loopback as a queue
    kind's is (distributed 2023.1 binds it to every interface, on port 8787, when
    ``dashboard_address`` is None)."""
    dashboard = _dashboard_option(spec)
    if dashboard is None:
        return {"dashboard_address": None,
                "scheduler_kwargs": {"dashboard": False, "dashboard_address": DEFAULT_DASHBOARD}}
    return {"dashboard_address": dashboard}


def _queue_cluster_args(spec: ClusterSpec) -> tuple[type, dict[str, Any]]:
    """(dask-jobqueue's cluster class, its keyword arguments) for ``spec``, with its config
    file already in force: the options, ``--gpus-per-job``'s worker resource and job directive,
    and ``scheduler_options`` (the config file's, with the dashboard of
    :func:`_dashboard_option`)."""
    import dask

    jq = _jobqueue()
    cls = jq
    for part in QUEUE_CLUSTERS[spec.kind].split("."):
        cls = getattr(cls, part)
    config_name = cls.job_cls.default_config_name()
    kwargs = {k: list(v) if isinstance(v, list) else v for k, v in spec.options.items()}

    def setting(name: str) -> list:  # a list keyword: the option's, else the config file's
        key = name.replace("_", "-")
        return list(kwargs.get(name, dask.config.get(f"jobqueue.{config_name}.{key}", None)
                                or []))

    if spec.gpus_per_job:
        kwargs["processes"] = 1
        kwargs["worker_extra_args"] = [*setting("worker_extra_args"), "--resources",
                                       f"GPU={spec.gpus_per_job}"]
        directive = _GPU_DIRECTIVES.get(spec.kind)
        directives = setting("job_extra_directives")
        if directive and not any("gpu" in d.lower() or "gres" in d.lower() for d in directives):
            kwargs["job_extra_directives"] = [*directives,
                                              directive.format(n=spec.gpus_per_job)]
    scheduler_options = dict(dask.config.get(f"jobqueue.{config_name}.scheduler-options", {})
                             or {})
    dashboard = _dashboard_option(spec, config_name)
    if dashboard is None:  # no dashboard; the HTTP server left (health routes) on loopback
        scheduler_options.update(dashboard=False, dashboard_address=DEFAULT_DASHBOARD)
    else:
        scheduler_options["dashboard_address"] = dashboard
    return cls, {**kwargs, "scheduler_options": scheduler_options}


async def _submitted(cluster: Any) -> None:
    """Wait until ``cluster`` (a dask-jobqueue cluster just scaled) has submitted its jobs. A
    job whose submission failed is kept by the cluster as if it were running (its error only
    logged) and never replaced: awaiting it again submits it again, and raises the queue's
    error if the queue refuses it again; the jobs never submitted are then marked failed, for
    the cluster to close."""
    from distributed.core import Status

    await cluster._correct_state()
    try:
        for job in list(cluster.workers.values()):
            await job
    except BaseException:
        for job in cluster.workers.values():
            if job.status == Status.created:
                job.status = Status.failed
        raise


def _queue_cluster(spec: ClusterSpec, silence: int) -> Any:
    """Start dask-jobqueue's cluster of ``spec`` (its config file already in force) and ask for
    ``spec.jobs`` jobs. The scheduler binds as dask-jobqueue does (the interface the workers of
    other nodes reach; ``scheduler-options: {host: ...}`` in the config file); its dashboard
    binds to :func:`_dashboard_option` (loopback by default)."""
    cls, kwargs = _queue_cluster_args(spec)
    try:
        cluster = cls(silence_logs=silence, **kwargs)
    except ValueError as err:  # e.g. no cores or memory given
        raise ValueError(f"--cluster {spec.kind}: {err} (--cluster-option KEY=VALUE or "
                         "--cluster-config FILE)") from None
    try:
        cluster.scale(jobs=spec.jobs)
        # wait for the submissions (not for the jobs to start): a queue that refuses a job (an
        # unknown partition or account, a bad directive) says so here, not in a log while the
        # sweep waits for ever for workers
        cluster.sync(_submitted, cluster)
    except Exception as err:  # noqa: BLE001  (sbatch's RuntimeError, OSError, a bare Exception)
        _close_refused(cluster)
        raise ValueError(f"--cluster {spec.kind}: the queue refused a job: "
                         f"{' '.join(str(err).split()) or type(err).__name__} (check "
                         "--cluster-option and --cluster-config)") from None
    except BaseException:
        _close_refused(cluster)
        raise
    return cluster


def _close_refused(cluster: Any) -> None:
    """Close a queue cluster whose jobs were not all submitted: a job without a job id (its
    submission failed: the queue refused it, or its command could not start) is dropped
    first, as dask-jobqueue would try to cancel it by an id it never had (``kill None``,
    ``scancel None``) and raise while closing; what closing still raises is dropped, the
    submission's error being the one to report."""
    for name, job in list(getattr(cluster, "workers", {}).items()):
        if getattr(job, "job_id", None) is None:
            del cluster.workers[name]
    with contextlib.suppress(Exception):
        cluster.close()


def _keep_workers(cluster: Any, n: int, interval: float | None = None) -> None:
    """Every ``interval`` seconds, scale ``cluster`` (started here) back to ``n`` jobs or
    workers, on its event loop, until it closes: a worker whose job ended (preempted, killed,
    past its walltime) is forgotten by the cluster after ``distributed.deploy.
    lost-worker-timeout`` and submitted again here. Its cells were handed to the other workers
    by the scheduler (or wait for the new one); one that killed its workers
    ``distributed.scheduler.allowed-failures`` + 1 times fails (``KilledWorker``), reported as
    any failed cell."""
    from tornado.ioloop import PeriodicCallback

    interval = WORKER_CHECK_INTERVAL if interval is None else interval
    queue = hasattr(cluster, "job_cls")

    async def rescale():
        if cluster.status.name not in ("running", "created"):
            return
        if not queue:
            cluster.scale(n)
            return
        # a job the queue refused stays in the cluster's list, never replaced: dropped here,
        # the next check submits it again
        for name, job in list(cluster.workers.items()):
            if job.status.name == "failed":
                del cluster.workers[name]
        cluster.scale(jobs=n)
        with contextlib.suppress(Exception):  # refused again: logged, tried at the next check
            await _submitted(cluster)

    pc = PeriodicCallback(rescale, interval * 1000)
    cluster.periodic_callbacks["uqmetrics-keep-workers"] = pc  # stopped when it closes
    cluster.loop.add_callback(pc.start)


def _dashboard_link(client: Any, cluster: Any) -> str | None:
    """The link of the dashboard of a cluster started here, by the address its HTTP server
    really bound (``cluster.dashboard_link`` names the scheduler's host, which a dashboard on
    loopback is not on); a running scheduler's link as the client gives it."""
    from distributed.comm import get_tcp_server_address
    from distributed.utils import format_dashboard_link

    if cluster is None:
        return getattr(client, "dashboard_link", None) or None
    server = getattr(getattr(cluster, "scheduler", None), "http_server", None)
    if server is None or getattr(server, "port", None) is None:
        return None
    # from its socket: the server's own ``address`` attribute is not set by distributed 2023.1
    host, port = get_tcp_server_address(server)[:2]
    if host in ("0.0.0.0", "::", ""):
        import socket

        host = socket.gethostname()
    return format_dashboard_link(host, port)


def _as_spec(scheduler: str | ClusterSpec | None) -> ClusterSpec:
    if isinstance(scheduler, ClusterSpec):
        return scheduler
    if scheduler is None or isinstance(scheduler, str):
        return ClusterSpec(address=scheduler)
    raise ValueError(f"scheduler must be a scheduler address (str), a ClusterSpec or None, got "
                     f"{type(scheduler).__name__}")


def _connect(spec: ClusterSpec, n_workers: int, threads_per_worker: int,
             log_file: Path | None = None, resources: Mapping[str, float] | None = None
             ) -> tuple[Any, Any]:
    """(client, cluster or None): a client of ``spec``'s scheduler, or of a cluster started
    here (a ``LocalCluster``, or a queue's, :func:`_queue_cluster`; its config file must be in
    force, :func:`_cluster_config`).

    The local cluster's worker processes ignore ``SIGINT`` (:func:`_sigint_held`: they would
    each print a ``KeyboardInterrupt`` traceback while the caller shuts them down). With a
    ``log_file`` their standard error is that file (:func:`_stderr_to`: their warnings, and what
    they print while they are killed, go there) and their log records from WARNING on go to it;
    without, they print no log record below CRITICAL (``silence_logs``). A cell's error comes
    back as a value either way (:func:`_guarded_cell`). A Ctrl-C while the local cluster starts
    (seconds) is not seen; one while a client of ``scheduler`` connects is raised once it is
    connected, and closed. The local cluster's workers get ``resources`` (the cells ask for
    them; without, they would wait for ever); its dashboard binds to :data:`DEFAULT_DASHBOARD`
    unless ``spec.dashboard`` says otherwise. With ``spec.gpus`` it has one worker per GPU
    (``n_workers`` unused), each pinned to its GPU (:func:`gpu_worker_env`) with the resource
    ``GPU=1`` besides ``resources``. A cluster started here is kept at its size
    (:func:`_keep_workers`)."""
    from dask.distributed import Client, LocalCluster

    if spec.address is not None:
        with _sigint_held(inherit=False) as caught:
            client = Client(spec.address)
        if caught:
            _close_quietly(client, None)
            raise KeyboardInterrupt
        return client, None
    silence = logging.WARNING if log_file is not None else logging.CRITICAL
    with _sigint_held(inherit=True), _stderr_to(log_file):
        if spec.queue:
            cluster = _queue_cluster(spec, silence)
            size = spec.jobs
        elif spec.gpus:
            asked = dict(resources or {})
            if asked.get("GPU", 1) > 1:
                raise ValueError(f"resources {asked!r}: a worker of --gpus has one GPU "
                                 "(GPU=1); the cells would wait for ever")
            cluster = _gpu_cluster_class()(
                gpus=spec.gpus, threads_per_worker=threads_per_worker, processes=True,
                silence_logs=silence, resources={**asked, "GPU": 1},
                **_local_dashboard_args(spec))
            size = len(spec.gpus)
        else:
            cluster = LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker,
                                   processes=True, silence_logs=silence,
                                   resources=dict(resources) if resources else None,
                                   **_local_dashboard_args(spec))
            size = n_workers
        try:
            _keep_workers(cluster, size)
            return Client(cluster), cluster
        except BaseException:
            cluster.close()
            raise


@contextlib.contextmanager
def _cluster_config(spec: ClusterSpec):
    """Dask's config for a cluster started in the block (and for the workers it starts again, and
    the jobs it submits again, while the block lasts): its worker processes are not daemonic, and
    ``spec``'s config file is in force on top.

    A daemonic process may not start children, so a cell that asks for DataLoader workers
    (``uqvision sweep --workers N``) would fail in every worker of a ``LocalCluster``
    (``distributed.worker.daemon``, ``True`` in Dask's defaults; the nanny still ends its
    worker when it closes)."""
    import dask

    with dask.config.set({"distributed.worker.daemon": False}):
        if spec.config_file is None:
            yield
            return
        with dask.config.set(read_cluster_config(spec.config_file)):
            yield


@contextlib.contextmanager
def open_client(scheduler: str | ClusterSpec, *, n_workers: int = 2,
                threads_per_worker: int = 1, log_file: str | os.PathLike | None = None):
    """A ``dask.distributed.Client`` of ``scheduler`` for the block: a running scheduler's
    address, or a :class:`ClusterSpec` (a cluster started here, closed at the end).

    Parameters
    ----------
    scheduler : str or ClusterSpec
    n_workers, threads_per_worker : int
        Of a ``LocalCluster`` started here (one worker per GPU instead of ``n_workers`` with
        :attr:`ClusterSpec.gpus`).
    log_file : path, optional
        The standard error of the worker processes started here.

    Yields
    ------
    dask.distributed.Client
    """
    spec = _as_spec(scheduler)
    with _cluster_config(spec):
        client, cluster = _connect(spec, n_workers, threads_per_worker,
                                   None if log_file is None else Path(log_file), spec.resources)
        try:
            yield client
        finally:
            _close_quietly(client, cluster)


def _close_quietly(client: Any, cluster: Any) -> None:
    """Close a client and its cluster, whatever state a Ctrl-C left them in."""
    for thing in (client, cluster):
        if thing is None:
            continue
        with contextlib.suppress(Exception):
            thing.close()
