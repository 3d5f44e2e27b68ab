"""Where a sweep's cells run, as options: the ``--cluster`` kinds, ``--cluster-option`` and
``--cluster-config`` values, the GPUs of a local cluster (``--gpus``, :func:`visible_gpus`,
:func:`select_gpus`), :class:`ClusterSpec` and the option group every sweep command shares
(:func:`add_cluster_options`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config_options import mark_launcher

#: ``--cluster`` kinds that start the workers inside jobs of a queue, each by its dask-jobqueue
#: class (module attribute path); ``jobqueue-local`` runs the same job scripts as local processes
#: (``dask_jobqueue.local.LocalCluster``): a queue setup tried without a queue.
QUEUE_CLUSTERS = {"slurm": "SLURMCluster", "pbs": "PBSCluster", "lsf": "LSFCluster",
                  "sge": "SGECluster", "jobqueue-local": "local.LocalCluster"}
#: Every ``--cluster`` kind; ``local`` (the default) is a ``LocalCluster`` of this machine.
CLUSTER_KINDS = ("local", *QUEUE_CLUSTERS)
#: Where a dashboard started here listens unless ``--dashboard`` says otherwise: this machine
#: only (loopback), a free port.
DEFAULT_DASHBOARD = "127.0.0.1:0"
#: The optional dependency that brings dask-jobqueue.
HPC_EXTRA = "uqmetrics[hpc]"
#: ``--cluster-option`` keys every queue kind takes (dask-jobqueue's job keywords), by type;
#: ``list`` keys add one entry per ``--cluster-option``.
_JOB_OPTIONS: dict[str, type] = {
    "cores": int, "processes": int, "memory": str, "python": str, "job_name": str,
    "interface": str, "death_timeout": int, "local_directory": str, "log_directory": str,
    "shared_temp_directory": str, "shebang": str, "nanny": bool, "worker_command": str,
    "job_extra_directives": list, "worker_extra_args": list, "job_script_prologue": list,
    "job_directives_skip": list}
#: The keys of one queue kind only.
_KIND_OPTIONS: dict[str, dict[str, type]] = {
    "slurm": {"queue": str, "account": str, "walltime": str, "job_cpu": int, "job_mem": str},
    "pbs": {"queue": str, "account": str, "walltime": str, "resource_spec": str},
    "lsf": {"queue": str, "project": str, "walltime": str, "ncpus": int, "mem": int,
            "lsf_units": str, "use_stdin": bool},
    "sge": {"queue": str, "project": str, "walltime": str, "resource_spec": str},
    "jobqueue-local": {}}
#: The job directive asking the queue for ``n`` GPUs (``--gpus-per-job``), where one spelling
#: is standard; elsewhere the user gives it (``--cluster-option job_extra_directives=...``).
_GPU_DIRECTIVES = {"slurm": "--gres=gpu:{n}", "lsf": '-gpu "num={n}"'}
#: ``--gpus`` value for every GPU this process sees.
GPUS_ALL = "all"
_BOOLS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
_DASHBOARD = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]*):(?P<port>\d{1,5})\Z")


def _cluster_option_value(kind: str, name: str, value: Any, item: str) -> Any:
    """One ``--cluster-option`` value checked (and, from a string, converted) by its key."""
    allowed = {**_JOB_OPTIONS, **_KIND_OPTIONS[kind]}
    if name not in allowed:
        raise ValueError(f"--cluster-option {item!r}: {name!r} is not an option of --cluster "
                         f"{kind}; known: {', '.join(sorted(allowed))}")
    typ = allowed[name]
    if typ is list:
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, (list, tuple)) or not all(isinstance(v, str) for v in values):
            raise ValueError(f"--cluster-option {item!r}: {name} takes strings (repeat the "
                             f"option for several), got {value!r}")
        return list(values)
    if typ is int:
        try:
            number = int(value) if isinstance(value, (str, int)) and not isinstance(value, bool) \
                else None
        except ValueError:
            number = None
        if number is None or number < 1:
            raise ValueError(f"--cluster-option {item!r}: {name} must be an integer >= 1, got "
                             f"{value!r}")
        return number
    if typ is bool:
        if isinstance(value, bool):
            return value
        if str(value).strip().lower() not in _BOOLS:
            raise ValueError(f"--cluster-option {item!r}: {name} must be true or false, got "
                             f"{value!r}")
        return _BOOLS[str(value).strip().lower()]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"--cluster-option {item!r}: {name} must be a non-empty string, got "
                         f"{value!r}")
    return value


def parse_cluster_options(items: Iterable[str], kind: str) -> dict[str, Any]:
    """``--cluster-option KEY=VALUE`` strings as keyword arguments of the cluster class.

    Parameters
    ----------
    items : iterable of str
        ``KEY=VALUE`` each; ``KEY`` a keyword of dask-jobqueue's cluster class (``cores``,
        ``memory``, ``processes``, ``queue``, ``account``, ``walltime``,
        ``job_extra_directives``, ``worker_extra_args``, ``local_directory``, ...; ``-`` and
        ``_`` alike). Integers (``cores``, ``processes``, ...) are converted; a list keyword
        (``job_extra_directives``, ``worker_extra_args``, ``job_script_prologue``,
        ``job_directives_skip``) gets one entry per item; any other key given once.
    kind : str
        A queue kind of :data:`QUEUE_CLUSTERS`.

    Returns
    -------
    dict

    Raises
    ------
    ValueError
        Naming the item: not ``KEY=VALUE``, a key the kind does not take, a bad value, a key
        given twice, or a ``kind`` that is not a queue.

    Examples
    --------
    >>> parse_cluster_options(["cores=8", "job-extra-directives=--gres=gpu:1",
    ...                        "job_extra_directives=--exclusive", "queue=gpu"], "slurm")
    {'cores': 8, 'job_extra_directives': ['--gres=gpu:1', '--exclusive'], 'queue': 'gpu'}
    """
    items = list(items)
    if items and kind not in QUEUE_CLUSTERS:
        raise ValueError(f"--cluster-option {items[0]!r}: options apply to a job-queue cluster "
                         f"(--cluster {'|'.join(QUEUE_CLUSTERS)}), not --cluster {kind}")
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        name = key.strip().replace("-", "_")
        if not sep or not name:
            raise ValueError(f"--cluster-option {item!r}: give KEY=VALUE (e.g. queue=gpu, "
                             "walltime=04:00:00)")
        value = _cluster_option_value(kind, name, value, item)
        if isinstance(value, list):
            out.setdefault(name, []).extend(value)
        elif name in out:
            raise ValueError(f"--cluster-option {item!r}: {name} is given twice")
        else:
            out[name] = value
    return out


def _flat(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys (``{"jobqueue.slurm.cores": 8}``): what
    ``dask.config.set`` merges key by key, leaving the other defaults in place."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_flat(value, name + "."))
        else:
            out[name] = value
    return out


def read_cluster_config(path: str | os.PathLike) -> dict[str, Any]:
    """A dask configuration file (YAML, as dask-jobqueue documents ``jobqueue.yaml``:
    ``jobqueue: {slurm: {cores: 8, memory: 32GB, ...}}``) as dotted keys for
    ``dask.config.set``.

    Raises
    ------
    ValueError
        The file cannot be read, is not YAML, or is not a mapping (the message names it).
    """
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"--cluster-config {str(path)!r}: cannot read it "
                         f"({err.strerror or err})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"--cluster-config {str(path)!r} is not YAML ({err})") from None
    if not isinstance(data, Mapping) or not all(isinstance(k, str) for k in data):
        raise ValueError(f"--cluster-config {str(path)!r} must hold a mapping of dask "
                         f"settings (e.g. 'jobqueue: {{slurm: {{cores: 8}}}}'), got "
                         f"{type(data).__name__}")
    return _flat(data)


def _jobqueue():
    """The ``dask_jobqueue`` module; a clear error naming the extra when it is missing."""
    try:
        import dask_jobqueue
        import dask_jobqueue.local  # the jobqueue-local kind
    except ImportError as err:
        raise ImportError(f"a job-queue --cluster needs dask-jobqueue ({err}): install it with "
                          f"pip install '{HPC_EXTRA}'") from None
    return dask_jobqueue


def _cuda_visible_entries(text: str) -> list[str]:
    """The devices a ``CUDA_VISIBLE_DEVICES`` value names, as CUDA reads it: comma-separated
    entries, each an index (``0``) or a UUID (``GPU-...``, ``MIG-...``), the list cut at the
    first entry that is neither (``-1`` hides every GPU)."""
    out: list[str] = []
    for entry in text.split(","):
        entry = entry.strip()
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        out.append(entry)
    return out


def _gpu_count() -> int:
    """The CUDA devices of this machine as this process sees them: torch's count when torch is
    installed (it honours ``CUDA_VISIBLE_DEVICES``; no CUDA context is made), else the lines of
    ``nvidia-smi -L``, else 0. uqmetrics does not need torch: it is imported only here."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        return int(torch.cuda.device_count())
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30,
                                check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listed.splitlines() if line.startswith("GPU "))


def visible_gpus() -> tuple[str, ...]:
    """The GPUs this process sees, each as the ``CUDA_VISIBLE_DEVICES`` value that gives a
    child process that GPU alone.

    Without ``CUDA_VISIBLE_DEVICES`` they are the indices ``"0"`` .. ``"n-1"``; with it, its
    entries (indices or UUIDs) in its order, as many as there are devices: the ``k``-th is the
    GPU this process calls ``cuda:k``.

    Returns
    -------
    tuple of str, shape (n_gpus,)
    """
    count = _gpu_count()
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return tuple(str(i) for i in range(count))
    return tuple(_cuda_visible_entries(env)[:count])


def parse_gpus(text: str) -> str | int | tuple[int, ...]:
    """An argparse type for ``--gpus``: ``all`` (:data:`GPUS_ALL`), a count ``N`` >= 1, or a
    comma-separated list of distinct device indices (``0,2``: ``cuda:0`` and ``cuda:2`` as
    this process numbers them). ``argparse.ArgumentTypeError`` naming the value otherwise.

    Examples
    --------
    >>> parse_gpus("all"), parse_gpus("2"), parse_gpus("0,3")
    ('all', 2, (0, 3))
    """
    import argparse

    value = str(text).strip().lower()
    if value == GPUS_ALL:
        return GPUS_ALL
    parts = [p.strip() for p in value.split(",")]
    if not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected all, a count or indices such as 0,1, got "
                                         f"{text!r}")
    if len(parts) == 1:
        if int(parts[0]) < 1:
            raise argparse.ArgumentTypeError(f"a count must be >= 1, got {text!r}")
        return int(parts[0])
    indices = tuple(int(p) for p in parts)
    if len(set(indices)) != len(indices):
        raise argparse.ArgumentTypeError(f"an index is given twice in {text!r}")
    return indices


def _gpus_text(asked: Any) -> str:
    """``--gpus``'s value as the user wrote it (``2``, ``all``, ``0,3``)."""
    return ",".join(map(str, asked)) if isinstance(asked, tuple) else str(asked)


def _gpus_elsewhere(shown: str, kind: str, address: str | None) -> str:
    """The error of ``--gpus`` with a cluster not started here."""
    return (f"--gpus {shown}: applies to the LocalCluster started here, not "
            + (f"--scheduler {address!r}" if address
               else f"--cluster {kind} (each job's GPU: --gpus-per-job 1)"))


def select_gpus(asked: str | int | tuple[int, ...], available: tuple[str, ...] | None = None
                ) -> tuple[str, ...]:
    """The GPUs ``--gpus`` asks for, each as the ``CUDA_VISIBLE_DEVICES`` value of its worker.

    Parameters
    ----------
    asked : str, int or tuple of int
        A value of :func:`parse_gpus` (a string is parsed first): ``"all"``, a count (the
        first ``N`` GPUs) or indices into ``available``.
    available : tuple of str, optional
        The GPUs this process sees; default :func:`visible_gpus`.

    Returns
    -------
    tuple of str, shape (n_workers,)

    Raises
    ------
    ValueError
        Naming ``--gpus`` and its value: no GPU here, fewer GPUs than asked, or an index this
        process does not have.

    Examples
    --------
    >>> select_gpus("all", ("2", "3")), select_gpus(1, ("2", "3")), select_gpus((1,), ("2", "3"))
    (('2', '3'), ('2',), ('3',))
    """
    if isinstance(asked, str):
        import argparse

        try:
            asked = parse_gpus(asked)
        except argparse.ArgumentTypeError as err:
            raise ValueError(f"--gpus {asked!r}: {err}") from None
    shown = _gpus_text(asked)
    gpus = visible_gpus() if available is None else tuple(available)
    seen = (f"{len(gpus)} GPU(s) visible here (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    if not gpus:
        raise ValueError(f"--gpus {shown}: no GPU is visible here (CUDA_VISIBLE_DEVICES="
                         f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); leave --gpus "
                         "out to run on the CPU")
    if asked == GPUS_ALL:
        return gpus
    if isinstance(asked, int):
        if asked > len(gpus):
            raise ValueError(f"--gpus {shown}: asks for {asked} GPUs, {seen}")
        return gpus[:asked]
    missing = [i for i in asked if i >= len(gpus)]
    if missing:
        raise ValueError(f"--gpus {shown}: no GPU of index {missing[0]}, {seen}")
    return tuple(gpus[i] for i in asked)


@dataclass(frozen=True)
class ClusterSpec:
    """Where a sweep's cells run: a ``LocalCluster`` of this machine, the scheduler of a
    running cluster, or workers started in jobs of a queue by dask-jobqueue.

    Built from the command-line options of :func:`add_cluster_options` by :meth:`from_args`, or
    directly; checked on construction (``ValueError`` naming the option and the value).

    Attributes
    ----------
    kind : str, default "local"
        One of :data:`CLUSTER_KINDS` (``--cluster``).
    address : str, optional
        The scheduler of a running cluster (``--scheduler``, ``tcp://host:8786``); kind local.
    options : mapping
        Keyword arguments of the queue's cluster class (:func:`parse_cluster_options`,
        ``--cluster-option``).
    config_file : str, optional
        A dask configuration file (YAML, ``jobqueue: {slurm: {...}}``; ``--cluster-config``)
        in force while the cluster runs: its settings are the defaults ``options`` override.
    jobs : int, default 1
        Jobs to keep running (``--jobs``); a job that ends is submitted again.
    gpus_per_job : int, default 0
        GPUs each job asks for (``--gpus-per-job``, 0 or 1): its worker (one process) gets the
        Dask resource ``GPU=1`` and, for slurm and lsf, the job its GPU directive.
    dashboard : str, optional
        ``--dashboard``: ``HOST:PORT`` of the scheduler's dashboard, ``none`` for none;
        default :data:`DEFAULT_DASHBOARD` (loopback; a config file's
        ``scheduler-options: {dashboard_address: ...}`` for a queue kind).
    resources : mapping, optional
        Dask resources every cell asks for (``{"GPU": 1}``: one cell per GPU at a time); set by
        :meth:`from_args` with ``gpu_cells`` when jobs or local workers have GPUs.
    gpus : tuple of str, optional
        ``--gpus``: the ``LocalCluster`` started here runs one worker process per GPU, the
        ``i``-th with ``CUDA_VISIBLE_DEVICES=gpus[i]`` (it sees that GPU alone, as ``cuda``)
        and the Dask resource ``GPU=1``; its worker count is ``len(gpus)``, not ``--workers``
        (:meth:`local_workers`). Resolved by :meth:`from_args` (:func:`select_gpus`); given
        directly, the entries are taken as they are (no GPU need be there).
    """

    kind: str = "local"
    address: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    config_file: str | None = None
    jobs: int = 1
    gpus_per_job: int = 0
    dashboard: str | None = None
    resources: Mapping[str, float] | None = None
    gpus: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.kind not in CLUSTER_KINDS:
            raise ValueError(f"--cluster must be one of {', '.join(CLUSTER_KINDS)}, got "
                             f"{self.kind!r}")
        if self.address is not None:
            if not isinstance(self.address, str) or not self.address.strip():
                raise ValueError(f"--scheduler: give a Dask scheduler address "
                                 f"(tcp://host:8786), got {self.address!r}")
            if self.kind != "local":
                raise ValueError(f"--scheduler {self.address!r} and --cluster {self.kind}: give "
                                 "one (the scheduler of a running cluster, or a cluster to "
                                 "start)")
        queue_only = [f"{flag} {value!r}" for flag, value, unset in (
            ("--cluster-option", dict(self.options), {}),
            ("--cluster-config", self.config_file, None), ("--jobs", self.jobs, 1),
            ("--gpus-per-job", self.gpus_per_job, 0)) if value != unset]
        if queue_only and not self.queue:
            raise ValueError(f"{queue_only[0]}: applies to a job-queue cluster (--cluster "
                             f"{'|'.join(QUEUE_CLUSTERS)}), not "
                             + (f"--scheduler {self.address!r}" if self.address
                                else f"--cluster {self.kind}"))
        if self.queue:
            for name, value in self.options.items():
                _cluster_option_value(self.kind, name, value, f"{name}={value}")
        if isinstance(self.jobs, bool) or not isinstance(self.jobs, int) or self.jobs < 1:
            raise ValueError(f"--jobs must be an integer >= 1, got {self.jobs!r}")
        if self.gpus_per_job not in (0, 1) or isinstance(self.gpus_per_job, bool):
            raise ValueError(f"--gpus-per-job must be 0 or 1, got {self.gpus_per_job!r}: a "
                             "cell runs on its worker's first GPU, so a job of several GPUs "
                             "would stack its cells on one; ask for more --jobs instead")
        if self.gpus_per_job and self.options.get("processes", 1) != 1:
            raise ValueError(f"--cluster-option processes={self.options['processes']} with "
                             "--gpus-per-job: a GPU job runs one worker process "
                             "(processes=1)")
        if self.config_file is not None:
            read_cluster_config(self.config_file)
        if self.dashboard is not None and self.dashboard != "none":
            m = _DASHBOARD.match(str(self.dashboard))
            if m is None or int(m["port"]) > 65535:
                raise ValueError(f"--dashboard must be HOST:PORT (127.0.0.1:8787, :0 for any "
                                 f"interface and a free port) or none, got {self.dashboard!r}")
        if self.resources is not None and (
                not isinstance(self.resources, Mapping)
                or not all(isinstance(k, str) and isinstance(v, (int, float))
                           and not isinstance(v, bool) and v > 0
                           for k, v in self.resources.items())):
            raise ValueError(f"resources must map resource names to positive amounts, got "
                             f"{self.resources!r}")
        if self.gpus is not None:
            if not self.local_default:
                raise ValueError(_gpus_elsewhere(_gpus_text(self.gpus), self.kind,
                                                 self.address))
            if (not isinstance(self.gpus, tuple) or not self.gpus
                    or not all(isinstance(g, str) and g.strip() and "," not in g
                               for g in self.gpus)
                    or len(set(self.gpus)) != len(self.gpus)):
                raise ValueError(f"gpus must be a non-empty tuple of distinct "
                                 f"CUDA_VISIBLE_DEVICES entries (one GPU each), got "
                                 f"{self.gpus!r}")

    @property
    def queue(self) -> bool:
        """True for a job-queue kind (workers in jobs, dask-jobqueue)."""
        return self.kind in QUEUE_CLUSTERS

    @property
    def local_default(self) -> bool:
        """True when nothing but a ``LocalCluster`` of this machine was asked for (``--gpus``
        included: its workers are pinned to GPUs)."""
        return self.kind == "local" and self.address is None

    def local_workers(self, n_workers: int) -> int:
        """The worker processes of a ``LocalCluster`` started here for ``--workers
        n_workers``: one per GPU with :attr:`gpus`, else ``n_workers``."""
        return len(self.gpus) if self.gpus else n_workers

    def describe(self) -> str:
        """One phrase for messages: ``"the Dask scheduler at tcp://..."``, ``"4 slurm
        job(s)"``, ``"a LocalCluster"``."""
        if self.address is not None:
            return f"the Dask scheduler at {self.address}"
        if self.queue:
            return f"{self.jobs} {self.kind} job(s)"
        if self.gpus:
            return (f"a LocalCluster of {len(self.gpus)} GPU worker(s) (CUDA_VISIBLE_DEVICES "
                    f"{', '.join(self.gpus)})")
        return "a LocalCluster"

    @classmethod
    def from_args(cls, args: Any, *, gpu_cells: bool | None = None,
                  device: str | None = None) -> ClusterSpec:
        """The spec of the options :func:`add_cluster_options` added, from parsed ``args``.

        Parameters
        ----------
        args : argparse.Namespace
        gpu_cells : bool, optional
            The cells run on a GPU: with ``--gpus-per-job`` or ``--gpus``, each asks for the
            resource ``GPU=1`` (one model per GPU at a time). Default: whether ``device`` is
            a CUDA device (False without ``device``).
        device : str, optional
            The cells' ``--device``: with ``--gpus`` it must be ``cuda`` (or ``cuda:0``), since
            each worker sees its own GPU alone, as ``cuda``.

        Raises
        ------
        ValueError
            A bad option value or combination (``--gpus`` with cells not on ``cuda``), fewer
            GPUs here than ``--gpus`` asks for, or a
            queue kind without dask-jobqueue installed (naming the extra to install), before
            anything starts.
        """
        if gpu_cells is None:
            gpu_cells = device is not None and str(device).startswith("cuda")
        kind = getattr(args, "cluster", "local") or "local"
        options = parse_cluster_options(getattr(args, "cluster_option", None) or (), kind)
        gpus = getattr(args, "gpus_per_job", 0) or 0
        asked = getattr(args, "gpus", None)
        address = getattr(args, "scheduler", None)
        if asked is not None and (kind != "local" or address is not None):
            raise ValueError(_gpus_elsewhere(_gpus_text(asked), kind, address))
        local_gpus = select_gpus(asked) if asked is not None else None
        if asked is not None and device is not None and str(device) not in ("cuda", "cuda:0"):
            raise ValueError(f"--device {device}: with --gpus each worker sees its own GPU alone, "
                             "as cuda; give --device cuda, or leave out --gpus")
        spec = cls(kind=kind, address=address, options=options,
                   config_file=getattr(args, "cluster_config", None),
                   jobs=getattr(args, "jobs", 1) or 1, gpus_per_job=gpus,
                   dashboard=getattr(args, "dashboard", None),
                   resources={"GPU": 1} if gpu_cells and (gpus or local_gpus) else None,
                   gpus=local_gpus)
        if spec.queue:
            try:
                _jobqueue()
            except ImportError as err:
                raise ValueError(f"--cluster {kind}: {err}") from None
        return spec


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (worker, job and chunk counts: none of them would
    wait for ever); ``argparse.ArgumentTypeError`` naming the value otherwise."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def add_cluster_options(parser: Any, *, workers: str | None = "--workers",
                        workers_default: int = 2, local: str = "a LocalCluster here") -> Any:
    """Add the options of where a sweep runs to an ``argparse`` parser (one group):
    ``--scheduler``, ``--cluster``, ``--cluster-option``, ``--cluster-config``, ``--jobs``,
    ``--gpus-per-job``, ``--dashboard`` and (``workers``) the local worker count and
    ``--gpus`` (one local worker per GPU). Read them back with :meth:`ClusterSpec.from_args`. All are launcher options
    (:func:`uqmetrics.runs.config_options.mark_launcher`): a result file never gives them.

    Parameters
    ----------
    parser : argparse.ArgumentParser
    workers : str or None, default "--workers"
        The flag of the ``LocalCluster``'s worker processes (destination: the flag without
        dashes, ``-`` as ``_``), and with it ``--gpus`` (destination ``gpus``, default None);
        None: neither is added (the command has its own local processes).
    workers_default : int, default 2
    local : str, default "a LocalCluster here"
        What runs the cells when no cluster is asked for (the help's words).

    Returns
    -------
    argparse._ArgumentGroup
        The group.
    """
    g = parser.add_argument_group(
        "cluster", f"where the cells run: {local} (default), a running scheduler "
                   "(--scheduler), or Dask workers in jobs of a queue (--cluster slurm|pbs|"
                   "lsf|sge, with dask-jobqueue: pip install '" + HPC_EXTRA + "')")
    g.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help=f"address of an existing Dask scheduler (default: {local})")
    if workers is not None:
        g.add_argument(workers, dest=workers.lstrip("-").replace("-", "_"), type=positive_int,
                       default=workers_default, metavar="N",
                       help=f"LocalCluster worker processes (default {workers_default})")
        g.add_argument("--gpus", type=parse_gpus, default=None, metavar="all|N|I,J",
                       help="one LocalCluster worker per GPU of this machine, instead of "
                            f"{workers}: all, the first N, or these indices; each worker sees "
                            "its GPU alone (CUDA_VISIBLE_DEVICES) and, with --device cuda, "
                            "runs one cell on it at a time (Dask resource GPU=1); fewer GPUs "
                            "here than asked is an error")
    g.add_argument("--cluster", choices=CLUSTER_KINDS, default="local",
                   help=f"local: {local} (default); slurm, pbs, lsf, "
                        "sge: Dask workers started in jobs of that queue (dask-jobqueue's "
                        "job scripts); jobqueue-local: the same job scripts run as local "
                        "processes, to try a queue setup without a queue")
    g.add_argument("--cluster-option", dest="cluster_option", action="append", default=None,
                   metavar="KEY=VALUE",
                   help="a keyword of the queue's dask-jobqueue cluster (repeatable): cores=8, "
                        "memory=32GB, processes=1, queue=gpu, account=proj, "
                        "walltime=04:00:00, local_directory=/tmp, "
                        "job_extra_directives=--exclusive (one entry per option), "
                        "worker_extra_args=..., job_script_prologue='module load cuda', ...")
    g.add_argument("--cluster-config", dest="cluster_config", default=None, metavar="FILE",
                   help="a dask config file in force while the cluster runs (YAML, as "
                        "dask-jobqueue's jobqueue.yaml: 'jobqueue: {slurm: {cores: 8, "
                        "memory: 32GB}}'); --cluster-option overrides it")
    g.add_argument("--jobs", type=positive_int, default=1, metavar="N",
                   help="queue jobs to keep running (default 1; a job that ends is "
                        "submitted again while the sweep runs)")
    g.add_argument("--gpus-per-job", dest="gpus_per_job", type=int, choices=(0, 1), default=0,
                   help="1: each job asks for a GPU (slurm --gres=gpu:1, lsf -gpu num=1; "
                        "other queues: give the directive with --cluster-option "
                        "job_extra_directives=...) and, with --device cuda, runs one cell on "
                        "it at a time (Dask resource GPU=1)")
    g.add_argument("--dashboard", default=None, metavar="ADDRESS",
                   help="HOST:PORT of the scheduler's dashboard started here, or none "
                        f"(default {DEFAULT_DASHBOARD}: this machine only, a free port; "
                        "reach it from elsewhere through ssh -L); its link is printed once")
    mark_launcher(g)  # never taken from a result file (uqmetrics.runs.run_config)
    return g
