"""Result files: provenance attrs and atomic, self-checking netCDF writes.

Every result of the project is an ``xarray.Dataset`` written with :func:`write_dataset`:

- the write is atomic (a temporary file in the target directory, ``fsync``, ``os.replace``),
  so a crash never leaves a half-written file under the final name and a sweep that skips
  existing files resumes safely;
- an existing file is never overwritten unless ``overwrite=True``;
- attrs netCDF cannot hold (dicts, lists, bools, None) are stored as JSON strings, which
  :func:`decode_attr` turns back;
- a ``complete = 1`` attr is added after all data has been written; :func:`read_dataset`
  rejects files without it;
- the checksum of every variable, as it reads back from the file, is recorded in the
  ``data_checksums`` attr (:data:`CHECKSUM_ATTR`) and verified by :func:`read_dataset`: a file
  whose data changed on disk after it was written (a flipped bit) is refused
  (:class:`CorruptResultError`), so that a sweep recomputes it instead of combining wrong
  values; a file written before the record existed is read unverified;
- a write that fails removes its temporary file, and a full disk is reported as such
  (``OSError`` ``ENOSPC`` naming the target), not as netCDF's ``HDF error``.

:func:`exclusive_lock` keeps two processes from computing the same result at once (the second
is refused in one line naming the lock and the process that holds it).

:func:`provenance_attrs` gives the attrs every result file carries (versions, git commit, host,
time, config, seed and the metric conventions), so that ``xr.open_dataset`` alone is enough to
re-plot or re-score a result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import errno
import functools
import hashlib
import json
import os
import platform
import re
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import xarray as xr

__all__ = [
    "CHECKSUM_ATTR",
    "COMPLETE_ATTR",
    "NETCDF_LOCK",
    "READ_ERRORS",
    "WRITTEN_RECORD",
    "CorruptResultError",
    "IncompleteResultError",
    "LockedError",
    "check_apart",
    "check_replaceable",
    "check_writable",
    "dataset_checksum",
    "decode_attr",
    "exclusive_lock",
    "folder_replaced",
    "named_write_error",
    "open_netcdf",
    "provenance_attrs",
    "read_dataset",
    "record_written",
    "remove_files",
    "remove_stale_temporaries",
    "remove_written",
    "safe_name",
    "source_revision",
    "write_dataset",
    "write_text_file",
    "written_files",
]

#: Name of the attr marking a fully written file.
COMPLETE_ATTR = "complete"

#: Name of the attr recording the checksum of every variable of a file (:func:`write_dataset`).
CHECKSUM_ATTR = "data_checksums"

#: The hash of :data:`CHECKSUM_ATTR` (BLAKE2b with 32-byte digests: about twice as fast as
#: SHA-256 without SHA instructions, and as strong for detecting damage).
_CHECKSUM_ALGORITHM = "blake2b-256"

#: What reading a damaged netCDF file can raise besides ``OSError``: netCDF4 raises
#: ``RuntimeError`` for HDF errors and ``AttributeError`` for an attribute it cannot open, and
#: decoding damaged metadata can raise almost anything (``IndexError``, ``UnicodeDecodeError``,
#: ``ValueError`` of xarray's decoders, ``OverflowError`` of a size). Not ``MemoryError``: a
#: good file too large for the machine is not a damaged one.
READ_ERRORS: tuple[type[BaseException], ...] = (OSError, RuntimeError, AttributeError,
                                                LookupError, TypeError, UnicodeError,
                                                ValueError, OverflowError)


def xarray_module():
    """``xarray``, imported on first use (``import uqmetrics.runs.io`` does not import it: a program
    that writes no result file, e.g. a training run, does not pay for it), and kept from
    importing dask for a Dataset of numpy arrays.

    xarray asks, for every array it wraps, whether it is a dask array, and answers by importing
    ``dask.array`` when dask is installed; writing asks whether each array is a dask
    collection (importing ``dask.base``) and which dask scheduler is active (importing dask
    and ``dask.distributed``): together about 0.5 s. No object can be a dask array or
    collection, and no dask scheduler can be active, before dask is imported: until then the
    answers are "no dask array type", "not a dask collection" and "no scheduler" without the
    import (:class:`_DaskOnceImported`, :func:`_once_dask_imported`); once dask is imported,
    xarray's own answers.
    """
    import xarray

    _dask_checked_lazily()
    return xarray


class _DaskOnceImported:
    """Stands for xarray's record of dask (``xarray.namedarray.pycompat.DuckArrayModule``)
    until ``dask.array`` is imported: its array ``type`` is ``()`` while no dask array can
    exist; any other attribute (version, module, availability), and the type afterwards, come
    from the real record, which then replaces this one."""

    def __init__(self, pycompat):
        self._pycompat = pycompat

    def _real(self):
        real = self._pycompat.DuckArrayModule("dask")
        self._pycompat._cached_duck_array_modules["dask"] = real
        return real

    @property
    def type(self) -> tuple:
        return self._real().type if "dask.array" in sys.modules else ()

    def __getattr__(self, name: str):
        return getattr(self._real(), name)


def _once_dask_imported(original, answer):
    """xarray's function ``original``, answering ``answer`` without importing dask while dask
    is not imported (``is_dask_collection``: False; ``get_dask_scheduler``: None)."""

    def function(*args, **kwargs):
        if "dask" not in sys.modules:
            return answer
        return original(*args, **kwargs)

    function.__name__ = function.__qualname__ = original.__name__
    function.__doc__ = original.__doc__
    function.uqmetrics_lazy = True
    return function


def _dask_checked_lazily() -> None:
    """Install :class:`_DaskOnceImported` in xarray's cache of duck-array modules and
    :func:`_once_dask_imported` in place of its ``is_dask_collection`` (which its
    ``is_duck_dask_array`` calls) and of the ``get_dask_scheduler`` of its netCDF writers
    (once; a no-op for an xarray laid out otherwise)."""
    try:
        from xarray.backends import locks, writers
        from xarray.namedarray import pycompat, utils

        cache = pycompat._cached_duck_array_modules
        pycompat.DuckArrayModule  # noqa: B018  (the record the stand-in builds later)
        patches = [((locks, writers), "get_dask_scheduler", locks.get_dask_scheduler, None),
                   ((utils,), "is_dask_collection", utils.is_dask_collection, False)]
    except (ImportError, AttributeError):  # pragma: no cover - another xarray layout
        return
    if "dask" not in cache and "dask.array" not in sys.modules:
        cache["dask"] = _DaskOnceImported(pycompat)
    for modules, name, original, answer in patches:
        if getattr(original, "uqmetrics_lazy", False):
            continue
        lazy = _once_dask_imported(original, answer)
        for module in modules:
            if getattr(module, name, None) is original:
                setattr(module, name, lazy)

#: Distributions whose versions are recorded when installed (looked up, never imported).
_VERSIONED = ("numpy", "scipy", "xarray", "netCDF4", "uqmetrics", "torch", "timm", "torchvision",
              "uqreg", "uqvision")

_JSON_LITERALS = ("null", "true", "false")


class IncompleteResultError(ValueError):
    """A result file lacks the completeness flag or cannot be read (partial or corrupt).

    ``path`` is the file and ``detail`` what is wrong with it, without the advice (``None``
    when raised with a message only)."""

    def __init__(self, message: str, *, path: str | os.PathLike | None = None,
                 detail: str | None = None):
        super().__init__(message)
        self.path = None if path is None else Path(path)
        self.detail = detail


class CorruptResultError(IncompleteResultError):
    """A complete result file whose data do not match the checksums recorded when it was
    written: it changed on disk afterwards (a flipped bit, an edit in place). Like any
    :class:`IncompleteResultError`, a sweep recomputes it."""


class LockedError(BlockingIOError):
    """Another process holds the lock (:func:`exclusive_lock`); ``filename`` is the lock file
    and ``strerror`` names the process that holds it."""


# --------------------------------------------------------------------------------------------
# attrs


def _json_default(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=str)
    if isinstance(obj, (Path, _dt.datetime, _dt.date)):
        return str(obj) if isinstance(obj, Path) else obj.isoformat()
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"object of type {type(obj).__name__} is not JSON serialisable")


def _to_json(value: Any, name: str) -> str:
    try:
        return json.dumps(value, default=_json_default, sort_keys=False, allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"attr {name!r} cannot be stored in a netCDF file: {exc}") from None


def _netcdf_attr(value: Any, name: str) -> Any:
    """Convert one attr value to something netCDF4 stores faithfully."""
    if isinstance(value, (bool, np.bool_)) or value is None:
        return _to_json(bool(value) if value is not None else None, name)
    if isinstance(value, str):
        return value
    if isinstance(value, np.generic):
        value = value.item()
        return _netcdf_attr(value, name)
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iuf" \
            and value.size:
        return value
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    return _to_json(value, name)


def _netcdf_attrs(attrs: Mapping, where: str) -> dict:
    out = {}
    for k, v in attrs.items():
        if not isinstance(k, str):
            raise ValueError(f"{where} attr names must be strings, got {k!r}")
        out[k] = _netcdf_attr(v, f"{where}{k}")
    return out


def decode_attr(value: Any) -> Any:
    """Turn an attr written by :func:`write_dataset` back into its Python value.

    JSON-encoded attrs (objects ``{...}``, arrays ``[...]``, ``true``/``false``/``null``) are
    decoded; other strings are returned unchanged (so is one nested too deeply to decode,
    which only a hostile or damaged file holds); numpy scalars become Python scalars.

    Parameters
    ----------
    value : str, number or numpy.ndarray
        An attr value as read from a netCDF file.

    Returns
    -------
    object

    Examples
    --------
    >>> decode_attr('{"lr": 0.01, "epochs": [300, 600]}')
    {'lr': 0.01, 'epochs': [300, 600]}
    >>> decode_attr("true"), decode_attr("null"), decode_attr("blr"), decode_attr("[not json")
    (True, None, 'blr', '[not json')
    """
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, str):
        s = value.strip()
        if s in _JSON_LITERALS or (s[:1], s[-1:]) in (("{", "}"), ("[", "]")):
            try:
                return json.loads(s)
            except (ValueError, RecursionError):  # not JSON, or nested past the stack
                return value
    return value


def _decoded(attrs: Mapping) -> dict:
    return {k: decode_attr(v) for k, v in attrs.items()}


def _git(args: Sequence[str], cwd: str | os.PathLike | None) -> str | None:
    """``git ARGS`` in ``cwd``: its stdout, or None when git is missing or fails."""
    try:
        res = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                             timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout if res.returncode == 0 else None


def _git_commit(cwd: str | os.PathLike | None = None) -> str | None:
    commit = (_git(["rev-parse", "HEAD"], cwd) or "").strip()
    return commit or None


def _git_dirty(cwd: str | os.PathLike | None = None) -> bool | None:
    out = _git(["status", "--porcelain", "--untracked-files=no"], cwd)
    return None if out is None else bool(out.strip())


@functools.cache
def _source_checkout(source: str) -> str | None:
    """The folder of the git work tree that tracks the file ``source``, or None: not in a work
    tree, or in one that does not track it (a package installed into a virtual environment
    that lies inside a checkout is not that checkout's code)."""
    folder = os.path.dirname(source)
    if not os.path.isdir(folder):
        return None
    top = (_git(["rev-parse", "--show-toplevel"], folder) or "").strip()
    if not top or _git(["ls-files", "--error-unmatch", "--", os.path.basename(source)],
                       folder) is None:
        return None
    return folder


def _package_file(package: str) -> str | None:
    """The ``__file__`` of an imported top-level package (None if not imported or no file)."""
    source = getattr(sys.modules.get(package), "__file__", None)
    return os.path.realpath(source) if source else None


@functools.cache
def _installed_commit(distribution: str) -> str | None:
    """The commit pip recorded for a distribution installed from a git URL (PEP 610
    ``direct_url.json``, ``vcs_info.commit_id``), or None."""
    from importlib.metadata import distribution as _distribution

    try:
        text = _distribution(distribution).read_text("direct_url.json")
        info = json.loads(text) if text else {}
    except (PackageNotFoundError, OSError, ValueError):
        return None
    commit = info.get("vcs_info", {}).get("commit_id") if isinstance(info, dict) else None
    return commit if isinstance(commit, str) and commit else None


def _caller_package(depth: int) -> str:
    """The top-level package of the module ``depth`` frames up (``uqmetrics`` when it is a
    script, ``__main__`` or unknown)."""
    try:
        name = sys._getframe(depth + 1).f_globals.get("__name__", "")
    except ValueError:
        name = ""
    top = str(name).split(".")[0]
    if not top or top == "__main__" or getattr(sys.modules.get(top), "__file__", None) is None:
        return "uqmetrics"
    return top


def source_revision(package: str = "uqmetrics") -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the code of ``package`` that is running.

    The commit of the git work tree that tracks the package's ``__init__`` file (an editable
    install or a source checkout on the path), with whether tracked files differ from it; else
    the commit pip recorded when the package was installed from a git URL (dirty: None); else
    ``(None, None)``. Never the repository of the current directory: a command run from inside
    another repository does not record that repository's commit.
    """
    source = _package_file(package)
    checkout = _source_checkout(source) if source else None
    if checkout is not None:
        return _git_commit(checkout), _git_dirty(checkout)
    return _installed_commit(package), None


@functools.cache
def _versions() -> dict[str, str]:
    """The installed versions (read once per process: the code a process runs does not change
    with what is installed after it started; reading the metadata of ten distributions cost
    about 25 ms a result file)."""
    out = {"python": platform.python_version()}
    for dist in _VERSIONED:
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            continue
    return out


def provenance_attrs(*, config: Any = None, seed: Any = None, conventions: Mapping | None = None,
                     extra: Mapping | None = None, package: str | None = None) -> dict[str, Any]:
    """Attrs recording where a result came from, every value netCDF-safe.

    Parameters
    ----------
    config : dataclass, mapping or JSON-serialisable object, optional
        The full configuration of the run; stored as a JSON string under ``config``.
    seed : int or JSON-serialisable, optional
        The root seed (JSON when not an int; ``"null"`` when absent).
    conventions : mapping, optional
        Metric conventions used; default :data:`uqmetrics.CONVENTIONS` (docs/conventions.md#s).
    extra : mapping, optional
        Further attrs (e.g. ``device``, ``wall_time_s``); converted the same way and applied
        last, so they may override the defaults.
    package : str, optional
        The top-level package whose code made the result, for ``git_commit``; default the
        caller's (``uqreg`` when called from ``uqreg.study``; ``uqmetrics`` from a script).

    Returns
    -------
    dict
        ``<dist>_version`` for python, numpy, scipy, xarray, netCDF4 and uqmetrics, plus torch,
        timm, torchvision, uqreg and uqvision when installed (read from package metadata; torch
        is never imported); ``git_commit`` and ``git_dirty`` (JSON bool or null) of the
        code that ran (:func:`source_revision` of ``package``: the git work tree that tracks
        the package's source, or the commit pip recorded for a git install; ``"unknown"`` and
        null otherwise, e.g. for a package installed from a folder, and never the commit of
        the current directory's repository); ``hostname``;
        ``created_utc`` (ISO 8601); ``config``; ``seed``; ``conventions`` (JSON); and, while a
        command runs, ``run_config``: its fully resolved configuration (JSON,
        :func:`uqmetrics.runs.run_config.current_run_config`), what ``rerun`` reads back.

    Examples
    --------
    >>> attrs = provenance_attrs(config={"task": "sinusoid", "k": 50}, seed=0)
    >>> decode_attr(attrs["config"]), attrs["seed"], "numpy_version" in attrs
    ({'task': 'sinusoid', 'k': 50}, 0, True)
    """
    if conventions is None:
        from ..metrics.conventions import CONVENTIONS

        conventions = CONVENTIONS
    if not isinstance(conventions, Mapping):
        raise ValueError(f"conventions must be a mapping, got {type(conventions).__name__}")
    if extra is not None and not isinstance(extra, Mapping):
        raise ValueError(f"extra must be a mapping, got {type(extra).__name__}")
    attrs: dict[str, Any] = {f"{k}_version": v for k, v in _versions().items()}
    commit, dirty = source_revision(package or _caller_package(1))
    attrs["git_commit"] = commit or "unknown"
    attrs["git_dirty"] = dirty
    attrs["hostname"] = socket.gethostname()
    attrs["created_utc"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    attrs["config"] = _to_json(config, "config")
    attrs["seed"] = seed if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) \
        else _to_json(seed, "seed")
    attrs["conventions"] = _to_json(dict(conventions), "conventions")
    from .current import RUN_CONFIG_ATTR, current_run_config

    if (run := current_run_config()) is not None:
        attrs[RUN_CONFIG_ATTR] = _to_json(run, RUN_CONFIG_ATTR)
    if extra:
        attrs.update(extra)
    return _netcdf_attrs(attrs, "")


# --------------------------------------------------------------------------------------------
# files


def _fsync_path(path: Path, *, directory: bool = False) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        if directory:  # some platforms cannot open directories; the data itself is synced
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not directory:
            raise
    finally:
        os.close(fd)


def check_writable(folder: str | os.PathLike) -> None:
    """Raise before any work if files could not be written into ``folder``.

    ``folder`` need not exist yet (a writer creates it with its parents): the check goes to its
    nearest existing ancestor. Nothing is created, written or left behind.

    Parameters
    ----------
    folder : str or path-like
        The folder that will receive the results.

    Raises
    ------
    NotADirectoryError
        ``folder`` or one of its parents exists but is not a folder (a regular file, say).
    PermissionError
        The nearest existing folder cannot be written: no write permission, or (``errno``
        ``EROFS``) it is on a read-only file system, which is reported to root too.

    Each error's ``filename`` is the path at fault and its ``strerror`` says what is wrong with
    it (``"is not a folder"``, ``"is not writable (permission denied)"``, ``"is on a read-only
    file system"``).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     check_writable(Path(d) / "new" / "run")  # fine: it will be created
    ...     _ = (Path(d) / "file").write_text("x")
    ...     try:
    ...         check_writable(Path(d) / "file" / "run")
    ...     except NotADirectoryError as exc:
    ...         print(Path(exc.filename).name, exc.strerror)
    ...     sorted(p.name for p in Path(d).iterdir())
    file is not a folder
    ['file']
    """
    folder = Path(folder)
    probe = folder
    while not (probe.exists() or probe.is_symlink()) and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():  # a file, or a link to nowhere, where a folder must be
        raise NotADirectoryError(errno.ENOTDIR, "is not a folder", str(probe))
    if not os.access(probe, os.W_OK | os.X_OK):
        read_only = bool(os.statvfs(probe).f_flag & os.ST_RDONLY) if hasattr(os, "statvfs") else False
        if read_only:
            raise PermissionError(errno.EROFS, "is on a read-only file system", str(probe))
        raise PermissionError(errno.EACCES, "is not writable (permission denied)", str(probe))


_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")


def safe_name(name: Any) -> str:
    """A label from a file (a model, a recipe, a task) made fit to be part of a file name:
    every character but letters, digits and ``._+-`` becomes ``+``, and a name of dots only
    (``.``, ``..``) is prefixed with ``+``. No separator is left, so a name built from it stays
    in the folder it is joined to: a received file's ``recipe = "x/../../../etc/y"`` names no
    other folder.

    Examples
    --------
    >>> safe_name("tv/mobilenet_v3_small@m0"), safe_name("x/../../y"), safe_name("..")
    ('tv+mobilenet_v3_small+m0', 'x+..+..+y', '+..')
    """
    text = _UNSAFE.sub("+", str(name))
    return "+" + text if text and set(text) == {"."} else text


def refuse_links(option: str, root: str | os.PathLike, names: Sequence[str]) -> None:
    """Refuse, before any work, a symbolic link where a command writes or deletes inside its
    output folder ``root``: at any of ``names`` or on the way to it.

    An output folder may be one received from someone else (a copy of their results to add to
    or resume), and a link in it, ``scores -> /elsewhere``, would make the command's writes and
    deletions land where the link points, outside the folder the user named. ``root`` itself
    is the user's choice and may be a link; what lies inside it may not.

    Parameters
    ----------
    option : str
        How the message names ``root`` (``"--out"``, or the file and key that named it).
    root : str or path-like
        The output folder; it need not exist.
    names : sequence of str
        What the command creates in ``root`` and writes into, as relative POSIX paths: its
        subfolders (``"caches"``, ``"plots/selective"``) and the files it opens in place
        (a lock, an appended log). Something missing is passed over (the command makes a
        folder there).

    Raises
    ------
    uqmetrics.InputError
        One line naming ``option``, ``root``, the link and where it points.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     (Path(d) / "elsewhere").mkdir()
    ...     (Path(d) / "out").mkdir()
    ...     (Path(d) / "out" / "scores").symlink_to(Path(d) / "elsewhere")
    ...     refuse_links("--out", Path(d) / "out", ["caches"])  # missing: fine
    ...     try:
    ...         refuse_links("--out", Path(d) / "out", ["caches", "scores"])
    ...     except ValueError as exc:
    ...         print(str(exc).replace(d, "D"))
    --out 'D/out': 'D/out/scores' is a link to 'D/elsewhere': a command writes and deletes only inside its output folder, never where a link there points; make it a folder of its own, or choose another output folder
    """
    from ..metrics.exceptions import InputError

    root = Path(root)
    for name in names:
        at = root
        for part in PurePosixPath(name).parts:
            at = at / part
            if at.is_symlink():
                raise InputError(
                    f"{option} {str(root)!r}: {str(at)!r} is a link to "
                    f"{os.path.realpath(at)!r}: a command writes and deletes only inside its "
                    "output folder, never where a link there points; make it a folder of "
                    "its own, or choose another output folder")
            if not at.is_dir():  # missing, or a file: nothing below it to follow
                break


@contextmanager
def temporary_beside(path: Path):
    """Yield a fresh temporary path in ``path``'s directory (created if needed) for an atomic
    write-then-rename; the temporary file is removed if the block raises (interrupts too)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        yield tmp
    except BaseException:
        # best effort: a folder that turned read-only cannot lose the file, and the error that
        # matters is the write's (:func:`remove_stale_temporaries` removes it later). Emptied
        # first: HDF5 keeps a file whose close failed (a full disk) open, and an open file,
        # even unlinked, keeps its space
        with contextlib.suppress(OSError):
            os.truncate(tmp, 0)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


#: Names of :func:`temporary_beside`'s files: ``.<name>.<32 hex digits>.tmp``.
_TEMPORARY = re.compile(r"^\..+\.[0-9a-f]{32}\.tmp\Z")


def write_text_file(path: str | os.PathLike, text: str, *, overwrite: bool = False) -> Path:
    """Write ``text`` (UTF-8, newlines as given) to ``path`` atomically: a temporary file
    beside it, synced, then put in place. Without ``overwrite`` an existing file is never
    replaced, even one another process created meanwhile (a hard link, where the file system
    has them, claims the name atomically).

    Raises
    ------
    FileExistsError
        ``path`` exists and ``overwrite`` is false.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = write_text_file(Path(d) / "t.csv", "a,b")
    ...     try:
    ...         write_text_file(p, "c")
    ...     except FileExistsError:
    ...         print(p.read_text())
    a,b
    """
    import errno

    path = Path(path)
    with temporary_beside(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
            return path
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path)) from None
        except OSError:  # a file system without hard links
            if path.exists():
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST),
                                      str(path)) from None
            os.replace(tmp, path)
            return path
        os.unlink(tmp)
    return path


def remove_stale_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Remove the temporary files that failed writes left in ``folder`` and return them.

    Only files named as :func:`write_dataset` names its temporary files
    (``.<name>.<32 hex digits>.tmp``) are removed: a write that could not remove its own (a
    folder that turned read-only, a process killed in the middle) leaves one there. Call it
    only while no other process writes into ``folder`` (e.g. holding an
    :func:`exclusive_lock` of it): an unfinished write's file has the same name.

    Parameters
    ----------
    folder : str or path-like
        A missing folder has none.

    Returns
    -------
    list of pathlib.Path
        The files removed (one that could not be removed is left and not listed).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = (Path(d) / ".cell.nc.0123456789abcdef0123456789abcdef.tmp").write_bytes(b"x")
    ...     _ = (Path(d) / "notes.tmp").write_text("kept")
    ...     [p.name[:9] for p in remove_stale_temporaries(d)], sorted(os.listdir(d))
    (['.cell.nc.'], ['notes.tmp'])
    """
    folder = Path(folder)
    removed = []
    try:
        entries = sorted(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return removed
    for entry in entries:
        if _TEMPORARY.match(entry.name) and entry.is_file() and not entry.is_symlink():
            try:
                entry.unlink()
            except OSError:
                continue
            removed.append(entry)
    return removed


def _holder() -> str:
    """Who holds a lock, for the message of the process refused: pid, host, start time and
    command line."""
    command = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return f"pid {os.getpid()} on {socket.gethostname()} since {now}: {command[:200]}"


@contextmanager
def exclusive_lock(path: str | os.PathLike, *, advice: str = "wait for it to finish"):
    """Hold the lock file ``path`` for the block, or refuse at once if another process holds it.

    The lock is ``flock``'s (the kernel releases it when its holder dies, even by
    ``SIGKILL``: a lock is never stale), on a file that records its holder (pid, host, start
    time, command line) for the message of the process refused. The file is removed when the
    block ends. On a file system without locks the block runs unlocked.

    Parameters
    ----------
    path : str or path-like
        The lock file (its folder is created).
    advice : str, default "wait for it to finish"
        What the refused user should do, ending the message.

    Yields
    ------
    pathlib.Path
        ``path``.

    Raises
    ------
    LockedError
        (a :class:`BlockingIOError`, ``errno`` ``EAGAIN``) another process holds it: its
        ``filename`` is ``path`` and its ``strerror`` names the holder and ends with
        ``advice``.
    uqmetrics.InputError
        ``path`` is a symbolic link (the lock is written: through a link it would truncate
        the file the link points to).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     with exclusive_lock(Path(d) / "out.lock") as lock:
    ...         held = lock.exists()
    ...     held, os.listdir(d)
    (True, [])
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no flock
        yield Path(path)
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        try:  # never through a link: the lock file is truncated and written (its holder)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as exc:
            if exc.errno != errno.ELOOP or not path.is_symlink():
                raise
            from ..metrics.exceptions import InputError

            raise InputError(f"{str(path)!r} is a link to {os.path.realpath(path)!r}: a "
                             "lock file is never opened through a link (it is written); "
                             "remove the link") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
            except OSError:
                holder = ""
            os.close(fd)
            holder = holder or "it is starting"
            raise LockedError(errno.EAGAIN, f"is held by another process ({holder}); {advice}",
                              str(path)) from None
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                os.close(fd)
                raise
            break  # no locks on this file system: run unlocked
        try:  # the holder before us may have removed the file between our open and flock
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        with contextlib.suppress(OSError):  # a full disk: the lock holds, unnamed
            os.ftruncate(fd, 0)
            os.pwrite(fd, (_holder() + "\n").encode(), 0)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # before unlocking: a waiting process retries on a fresh file
        os.close(fd)


# --------------------------------------------------------------------------------------------
# what --overwrite may delete (docs/conventions.md#overwrite-rules)

#: The record a command keeps in a folder of the files it wrote there (:func:`record_written`,
#: :func:`folder_replaced`): ``--overwrite`` deletes only the files it lists.
WRITTEN_RECORD = ".uqmetrics-written.json"
_WRITTEN_FORMAT = {"format": "uqmetrics.written", "version": 1}


def _from_inside(folder: Path, name: Any, where: str) -> str:
    """``name`` (read from a file: ``where``) as a relative POSIX path that stays inside
    ``folder``; :class:`~uqmetrics.metrics.exceptions.InputError` for anything else (an absolute path,
    ``..``, an empty or non-string name)."""
    from ..metrics.exceptions import InputError

    parts = name.split("/") if isinstance(name, str) else []
    if not parts or any(p in ("", ".", "..") or "\0" in p for p in parts):
        raise InputError(f"{where}: {name!r} is not a file name inside {str(folder)!r} (a "
                         "relative path without '..'); the record was not written by this "
                         "project")
    return "/".join(parts)


def _read_written(folder: Path) -> tuple[str, list[str]] | None:
    """``(writer, files)`` of ``folder``'s :data:`WRITTEN_RECORD`, every name checked to lie
    inside ``folder``; None without a record."""
    from ..metrics.exceptions import InputError

    path = folder / WRITTEN_RECORD
    if not path.is_file() or path.is_symlink():
        return None
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
        ok = (isinstance(rec, dict) and all(rec.get(k) == v for k, v in _WRITTEN_FORMAT.items())
              and isinstance(rec.get("writer"), str) and isinstance(rec.get("files"), list))
    except (OSError, UnicodeError, ValueError, RecursionError):
        ok = False
    if not ok:
        raise InputError(f"{path}: not a record of written files ({_WRITTEN_FORMAT})")
    return rec["writer"], [_from_inside(folder, f, str(path)) for f in rec["files"]]


def _write_record(folder: Path, writer: str, files: Sequence[str]) -> None:
    """Write ``folder``'s record atomically (sorted names: the same files, the same bytes)."""
    text = json.dumps({**_WRITTEN_FORMAT, "writer": writer, "files": sorted(set(files))},
                      indent=1) + "\n"
    with temporary_beside(folder / WRITTEN_RECORD) as tmp:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, folder / WRITTEN_RECORD)


def _entries(folder: Path) -> list[str]:
    """Every entry of ``folder`` that is not a folder (files, links, a link to a folder too),
    relative POSIX, without following links."""
    out = []
    for top, dirs, files in os.walk(folder):
        rel = Path(top).relative_to(folder)
        for d in [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            dirs.remove(d)
            files.append(d)
        out += [(rel / f).as_posix() for f in files]
    return sorted(out)


def written_files(folder: str | os.PathLike, writer: str) -> list[str]:
    """The files ``folder``'s record says ``writer`` wrote there (relative POSIX paths, each
    checked to lie inside ``folder``); ``[]`` without a record.

    Raises
    ------
    uqmetrics.InputError
        A damaged record, a name in it that leaves the folder, or a record of another writer.
    """
    from ..metrics.exceptions import InputError

    folder = Path(folder)
    rec = _read_written(folder)
    if rec is None:
        return []
    if rec[0] != writer:
        raise InputError(f"{folder / WRITTEN_RECORD}: {str(folder)!r} was written by "
                         f"{rec[0] or 'another command'!r}, not {writer!r}; choose another "
                         "folder")
    return rec[1]


def record_written(folder: str | os.PathLike, writer: str,
                   paths: Sequence[str | os.PathLike]) -> None:
    """Add ``paths`` (files ``writer`` wrote inside ``folder``) to ``folder``'s record, which
    :func:`remove_written` (a later ``--overwrite``) deletes and nothing else.

    Raises
    ------
    ValueError
        A path outside ``folder``.
    uqmetrics.InputError
        ``folder`` holds another writer's record (:func:`written_files`).
    """
    folder = Path(folder)
    base = folder.absolute()
    rels = []
    for p in paths:
        try:
            rels.append(Path(p).absolute().relative_to(base).as_posix())
        except ValueError:
            raise ValueError(f"{str(p)!r} is not inside {str(folder)!r}") from None
    _write_record(folder, writer, [*written_files(folder, writer), *rels])


def _lstat_inside(folder: Path, rel: str) -> os.stat_result | None:
    """``lstat`` of ``folder/rel`` when every folder on the way is a real folder (no link
    followed); None when something is missing or a link is on the way."""
    import stat

    at = folder
    parts = rel.split("/")
    for part in parts[:-1]:
        at = at / part
        try:
            if not stat.S_ISDIR(os.lstat(at).st_mode):
                return None
        except OSError:
            return None
    try:
        return os.lstat(at / parts[-1])
    except OSError:
        return None


def remove_files(folder: str | os.PathLike, files: Sequence[str]) -> list[Path]:
    """Delete the files ``files`` names in ``folder`` (relative POSIX paths, e.g. read from a
    record), then the folders they leave empty (never ``folder`` itself).

    Every name is checked to lie inside ``folder`` before any path is built from it
    (:class:`~uqmetrics.InputError` otherwise, with nothing deleted). A file is reached
    without following a link: one behind a linked folder is left, and a link is removed, not
    its target. A folder is removed only once empty (a file of someone else's keeps it). A
    name that is missing or a folder is passed over.

    Returns
    -------
    list of pathlib.Path
        The files removed.
    """
    import stat

    folder = Path(folder)
    names = [_from_inside(folder, f, "files") for f in files]
    removed, parents = [], set()
    for rel in names:
        st = _lstat_inside(folder, rel)
        if st is None or stat.S_ISDIR(st.st_mode):
            continue
        (folder / rel).unlink()
        removed.append(folder / rel)
        parents.update(list(PurePosixPath(rel).parents)[:-1])
    for rel in sorted(parents, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):  # not empty (someone else's file): kept
            os.rmdir(folder / rel)
    return removed


def remove_written(folder: str | os.PathLike, writer: str) -> list[Path]:
    """Delete what ``writer`` wrote in ``folder`` and nothing else: the files of ``folder``'s
    record (:func:`record_written`, :func:`remove_files`), then the record.

    Returns
    -------
    list of pathlib.Path
        The files removed.

    Raises
    ------
    uqmetrics.InputError
        A damaged record, a name in it that leaves ``folder``, or another writer's record
        (nothing is deleted).
    """
    folder = Path(folder)
    removed = remove_files(folder, written_files(folder, writer))
    (folder / WRITTEN_RECORD).unlink(missing_ok=True)
    return removed


def check_replaceable(path: str | os.PathLike, writer: str, *, also: Sequence[str] = ()
                      ) -> None:
    """Refuse to replace ``path`` unless it is missing, an empty folder, or a folder
    :func:`folder_replaced` wrote for ``writer`` that holds nothing else than the files its
    record lists and ``also`` (names the command adds after, e.g. its ``data.config.toml``).

    Raises
    ------
    uqmetrics.InputError
        ``path`` is a file or a link, holds no record (not written by ``writer``), another
        writer's record, or files its record does not list (naming a few and their count).
    """
    from ..metrics.exceptions import InputError

    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        return
    if path.is_symlink() or not path.is_dir():
        raise InputError(f"{str(path)!r} is not a folder: --overwrite replaces only a folder "
                         f"{writer or 'this command'} wrote")
    entries = _entries(path)
    if not entries:
        return
    who = writer or "this command"
    if _read_written(path) is None:
        raise InputError(f"{str(path)!r} is not a folder {who} wrote (it has no "
                         f"{WRITTEN_RECORD}; it holds {_some(entries)}): --overwrite replaces "
                         "only such a folder; choose another folder, or empty this one")
    own = {*written_files(path, writer), *also, WRITTEN_RECORD}
    foreign = [e for e in entries if e not in own]
    if foreign:
        raise InputError(f"{str(path)!r} holds files {who} did not write ({_some(foreign)}): "
                         "--overwrite deletes only what the command wrote; move them, or "
                         "choose another folder")


def _some(names: Sequence[str], k: int = 3) -> str:
    """``'a', 'b', 'c' and 4 more``."""
    head = ", ".join(repr(n) for n in names[:k])
    return head + (f" and {len(names) - k} more" if len(names) > k else "")


def check_apart(out: str | os.PathLike, inputs: Mapping[str, Any], *,
                option: str = "--out") -> None:
    """Refuse an output that holds an input, is one, or lies inside an input folder: the
    command would delete or replace what it reads, or read what it writes.

    Parameters
    ----------
    out : path
        The output folder (or file).
    inputs : mapping
        How an error names each input (``"--src"``) -> its path or a list of paths.
    option : str
        How an error names ``out``.

    Raises
    ------
    uqmetrics.InputError
        Naming both options and paths.

    Examples
    --------
    >>> check_apart("/data/run", {"--src": "/data/clean"})
    >>> try:
    ...     check_apart("/data/clean/run", {"--src": "/data/clean"})
    ... except ValueError as exc:
    ...     print(exc)
    --out '/data/clean/run' lies inside the input --src '/data/clean': choose an --out outside it
    """
    from ..metrics.exceptions import InputError

    target = Path(os.path.realpath(out))
    for name, value in inputs.items():
        for p in [value] if isinstance(value, (str, os.PathLike)) else value:
            real = Path(os.path.realpath(p))
            if real == target or target in real.parents:
                raise InputError(f"{option} {str(out)!r} holds the input {name} {str(p)!r}: "
                                 f"choose an {option} that does not hold it")
            if real in target.parents:
                raise InputError(f"{option} {str(out)!r} lies inside the input {name} "
                                 f"{str(p)!r}: choose an {option} outside it")


@contextmanager
def folder_replaced(path: str | os.PathLike, *, writer: str = "", also: Sequence[str] = ()):
    """Write a whole folder atomically: yield a fresh temporary folder beside ``path``; when the
    block succeeds it takes ``path``'s place (an existing folder there is removed only after the
    new one is complete), and when it raises (interrupts too) it is removed and ``path`` is left
    as it was.

    The new folder records the files written in it (:data:`WRITTEN_RECORD`, with ``writer``),
    and an existing ``path`` is replaced only when it is missing, empty, or such a folder of
    the same ``writer`` holding nothing but its recorded files and ``also``
    (:func:`check_replaceable`: checked on entry and again before the swap). The folders are
    made with the process's umask (as ``mkdir`` makes them).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     with folder_replaced(Path(d) / "out", writer="doc") as tmp:
    ...         _ = (tmp / "a.txt").write_text("x")
    ...     written_files(Path(d) / "out", "doc"), (Path(d) / "out" / "a.txt").read_text()
    (['a.txt'], 'x')
    """
    import shutil

    path = Path(path)
    check_replaceable(path, writer, also=also)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    tmp.mkdir()  # not tempfile.mkdtemp: its folder is private (0700) whatever the umask
    try:
        yield tmp
        _write_record(tmp, writer, [e for e in _entries(tmp) if e != WRITTEN_RECORD])
        if path.exists() or path.is_symlink():
            check_replaceable(path, writer, also=also)  # nothing was added meanwhile
            old = path.parent / f".{path.name}.{uuid.uuid4().hex}.old"
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def _prepare(ds: xr.Dataset, attrs: Mapping | None, compress: bool) -> xr.Dataset:
    # Encodings inherited from a file read earlier are dropped: a fixed string width carried
    # over from one cell would silently truncate the longer labels of a combined dataset.
    # (a shallow copy with every encoding emptied: what drop_encoding (xarray >= 2023.10) does)
    out = ds.copy()
    out.encoding = {}
    for var in out.variables.values():
        var.encoding = {}
    merged = {**ds.attrs, **(dict(attrs) if attrs else {})}
    merged.pop(COMPLETE_ATTR, None)
    merged.pop(CHECKSUM_ATTR, None)  # a file read earlier: the record is made anew
    out.attrs = _netcdf_attrs(merged, "")
    for name, var in out.variables.items():
        var.attrs = _netcdf_attrs(var.attrs, f"{name}.")
        if compress and name in out.data_vars and var.dtype.kind in "biuf" and var.ndim \
                and "zlib" not in var.encoding and "compression" not in var.encoding:
            var.encoding = {**var.encoding, "zlib": True, "complevel": 4}
    return out


def write_dataset(ds: xr.Dataset, path: str | os.PathLike, *, overwrite: bool = False,
                  attrs: Mapping | None = None, compress: bool = True) -> Path:
    """Write a Dataset to netCDF atomically, refusing to overwrite by default.

    Parameters
    ----------
    ds : xarray.Dataset
        The result.
    path : str or path-like
        Target file (``.nc``); parent directories are created.
    overwrite : bool, default False
        Replace an existing file. Otherwise an existing file raises :class:`FileExistsError`.
    attrs : mapping, optional
        Extra global attrs (e.g. :func:`provenance_attrs`), merged over ``ds.attrs``.
    compress : bool, default True
        zlib-compress numeric data variables (level 4).

    Returns
    -------
    pathlib.Path
        The path written.

    Raises
    ------
    FileExistsError
        ``path`` exists and ``overwrite`` is False.
    OSError
        The write failed; ``errno.ENOSPC`` with ``filename`` = ``path`` when the disk (or the
        quota) is full, whatever netCDF reported (``RuntimeError: NetCDF: HDF error``).

    Notes
    -----
    The data go to a temporary file ``.<name>.<random>.tmp`` in the target directory (the
    same filesystem), written by the ``netcdf4`` engine. The file is then read back as
    :func:`read_dataset` reads it and the checksum of every variable is recorded in the
    :data:`CHECKSUM_ATTR` attr (JSON: the algorithm, BLAKE2b-256, and a digest per variable);
    the ``complete = 1`` attr is appended last, after all data is on disk; the file is fsync'ed
    and moved into place with :func:`os.replace` (or, without ``overwrite``, hard-linked so
    that a file created concurrently by another writer is never clobbered). On any exception,
    including :class:`KeyboardInterrupt`, the temporary file is removed (when the folder still
    allows it) and the target is untouched. Attrs netCDF cannot hold (dicts, lists, tuples,
    bools, None, dataclasses) become JSON strings; see :func:`decode_attr`. The input ``ds`` is
    not modified.

    The checksums are of the values read back, not of ``ds``: decoding may change what was
    written (a NaN's sign, a variable with time units), and the file must verify as it reads.
    Their cost is one read of the file just written (from the page cache) and one hash of its
    values: a 100 MB float32 dataset wrote in 2.3 s instead of 1.9 s on a loaded 2-core machine.

    Examples
    --------
    >>> import tempfile, xarray as xr
    >>> ds = xr.Dataset({"coverage": ("point", [0.9, 0.95])}, attrs={"config": {"k": 50}})
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = write_dataset(ds, Path(d) / "cell.nc")
    ...     back = read_dataset(p)
    >>> back.coverage.values, decode_attr(back.attrs["config"]), int(back.attrs["complete"])
    (array([0.9 , 0.95]), {'k': 50}, 1)
    """
    xr = xarray_module()
    if not isinstance(ds, xr.Dataset):
        raise ValueError(f"ds must be an xarray.Dataset, got {type(ds).__name__}")
    if not isinstance(overwrite, bool):
        raise ValueError(f"overwrite must be a bool, got {overwrite!r}")
    if attrs is not None and not isinstance(attrs, Mapping):
        raise ValueError(f"attrs must be a mapping, got {type(attrs).__name__}")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"path {str(path)!r} is a directory")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True (--overwrite on the "
                              f"command line) to replace it")
    prepared = _prepare(ds, attrs, compress)
    with temporary_beside(path) as tmp:
        with _space_named(path, prepared.nbytes):
            _write_flagged(prepared, tmp)
        with _space_named(path, None):
            if overwrite:
                os.replace(tmp, path)
            else:
                try:
                    os.link(tmp, path)  # atomic and never clobbers a concurrent writer's file
                except FileExistsError:
                    raise FileExistsError(f"{path} already exists (created concurrently); "
                                          f"pass overwrite=True (--overwrite) to replace "
                                          f"it") from None
                except OSError:  # filesystem without hard links
                    if path.exists():
                        raise FileExistsError(f"{path} already exists; pass overwrite=True "
                                              f"(--overwrite) to replace it") from None
                    os.replace(tmp, path)
                else:
                    with contextlib.suppress(OSError):  # the result is in place
                        os.unlink(tmp)
            _fsync_path(path.parent, directory=True)
    return path


@contextmanager
def _space_named(path: Path, nbytes: int | None):
    """Raise a write error of the block that is for want of space (:func:`_no_space`; with
    ``nbytes`` None only the OS's own ``ENOSPC``) as ``OSError(ENOSPC, why, path)``, naming
    the target, not the temporary file; the others as they are. Inside
    :func:`temporary_beside`'s block, so that the temporary file still holds its space when
    the free space is looked at."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        full = _no_space(exc, path.parent, nbytes)
        if full is None:
            raise
        raise OSError(errno.ENOSPC, full, str(path)) from exc


#: One lock for every use of netCDF-C/HDF5 in this process (:func:`open_netcdf`,
#: :func:`read_dataset`, :func:`write_dataset`): a sweep writes a cell's file in a thread of
#: its own while the caller reads others, and the library is not thread-safe. xarray's own
#: lock is held per call only: it reads a file's metadata, and creates a written file's
#: variables, without it, and two threads doing so at once crash the process (segmentation
#: fault) or fail a call (``NetCDF: HDF error``). Reentrant: a block holding it may read.
#:
#: A fork waits for it too (:func:`os.register_at_fork`): a child forked while a thread had a
#: file open (a DataLoader's workers, started by the next cell while a cell writes its file)
#: would inherit that file's descriptor and, with it, the lock HDF5 takes on a file it writes
#: (``flock``), held until the child exits; reopening the file to flag it complete then
#: failed (``OSError: [Errno -101] NetCDF: HDF error``; 4 of 50 writes beside a thread forking
#: children of 0.3 s). Held across the fork, no file is open and no HDF5 call is under way in
#: the child's copy of the process.
NETCDF_LOCK = threading.RLock()
if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(before=NETCDF_LOCK.acquire, after_in_parent=NETCDF_LOCK.release,
                        after_in_child=NETCDF_LOCK.release)


@contextmanager
def open_netcdf(path: str | os.PathLike, **kwargs: Any):
    """``xarray.open_dataset(path, engine="netcdf4", **kwargs)`` as a block that holds
    :data:`NETCDF_LOCK` and closes the file at its end: read what is needed (attrs, a variable
    loaded) inside the block.

    Examples
    --------
    >>> import tempfile, xarray as xr
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = write_dataset(xr.Dataset(attrs={"kind": "demo"}), Path(d) / "r.nc")
    ...     with open_netcdf(p) as ds:
    ...         kind = ds.attrs["kind"]
    >>> kind
    'demo'
    """
    with NETCDF_LOCK, xarray_module().open_dataset(path, **{"engine": "netcdf4", **kwargs}) \
            as ds:
        yield ds


def _write_flagged(prepared: xr.Dataset, tmp: Path) -> None:
    """Write ``prepared`` to ``tmp``, record its checksums and flag it complete; fsync.

    Under :data:`NETCDF_LOCK`. The file is written through xarray's netCDF4 store opened
    with xarray's process lock alone: ``to_netcdf`` would add a lock of the active Dask
    scheduler, under ``dask.distributed`` (a sweep's cell, a caller with a client) a
    ``distributed.Lock`` per file name, which asks the scheduler at every netCDF call and fails
    once that client is closed; a temporary file has a name of its own and one writer."""
    import netCDF4
    from xarray.backends import NetCDF4DataStore
    from xarray.backends.netCDF4_ import NETCDF4_PYTHON_LOCK  # what its reads take

    prepared = prepared.load()  # every array written now, none left for a dask writer
    with NETCDF_LOCK:
        store = NetCDF4DataStore.open(str(tmp), mode="w", format="NETCDF4",
                                      lock=NETCDF4_PYTHON_LOCK)
        try:
            prepared.dump_to_store(store)
        finally:
            store.close()
        record = _file_checksums(tmp)
        with netCDF4.Dataset(tmp, mode="a") as nc:
            nc.setncattr(CHECKSUM_ATTR, record)
            nc.setncattr(COMPLETE_ATTR, np.int32(1))
    _fsync_path(tmp)


def _no_space(exc: BaseException, folder: Path, nbytes: int | None) -> str | None:
    """Why a failed write failed for want of space (the ``strerror`` of the ``ENOSPC`` error
    to raise instead), or None when it did not.

    The OS says ``ENOSPC`` (or ``EDQUOT``); netCDF does not: HDF5 reports a failed write as
    ``RuntimeError: NetCDF: HDF error`` (or ``OSError`` -101), and a file it could not create
    on a full disk as ``PermissionError``. With ``nbytes`` (the data's size) such an error, in
    a folder this process may write, is taken for a full disk when, the temporary file still
    there, the space left to this user on ``folder``'s file system is less than ``nbytes``
    plus 1 MiB (or no inode is left)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        return "no space left on the device" + (
            " (disk quota exceeded)" if exc.errno != errno.ENOSPC else "")
    if nbytes is None or isinstance(exc, FileExistsError) or not hasattr(os, "statvfs"):
        return None
    try:
        st = os.statvfs(folder)
        writable = os.access(folder, os.W_OK | os.X_OK) and not st.f_flag & os.ST_RDONLY
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if not writable or (free >= nbytes + 2**20 and st.f_favail != 0):
        return None  # a real permission error, or space enough: another cause
    return f"no space left on the device ({_size(free)} free, the data take up to {_size(nbytes)})"


def named_write_error(exc: OSError, path: str | os.PathLike) -> OSError:
    """The error to raise for a failed write of ``path``: ``exc``'s ``errno``, why the write
    failed (a full disk or quota said as such, as :func:`write_dataset` says it) and ``path``
    as its ``filename``, so that the one-line message of the command-line tools names the file
    being written (not a temporary name, not none: the OS names no file when a write fails).

    Examples
    --------
    >>> err = named_write_error(OSError(errno.ENOSPC, "No space left on device"), "/o/a.JPEG")
    >>> err.filename, err.strerror
    ('/o/a.JPEG', 'no space left on the device')
    """
    why = _no_space(exc, Path(path).parent, None) or exc.strerror or str(exc)
    return OSError(exc.errno, why, str(path))


def _size(nbytes: float) -> str:
    """``"812 B"``, ``"4.0 KiB"``, ``"1.5 GiB"``."""
    if nbytes < 1024:
        return f"{nbytes:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        nbytes /= 1024
        if nbytes < 1024 or unit == "GiB":
            break
    return f"{nbytes:.1f} {unit}"


def read_dataset(path: str | os.PathLike, *, decode_attrs: bool = False,
                 variables: Sequence[str] | None = None, verify: bool = True) -> xr.Dataset:
    """Load a result file fully into memory and close it.

    Parameters
    ----------
    path : str or path-like
        A file written by :func:`write_dataset`.
    decode_attrs : bool, default False
        Decode JSON attrs (global and per variable) with :func:`decode_attr`.
    variables : sequence of str, optional
        Load only these data variables (with their coordinates and the global attrs); the
        others are never read from disk (and only the variables read are verified).
        ``KeyError`` names a variable the file lacks; a string (not a sequence of names) is
        a ``ValueError``.
    verify : bool, default True
        Check the data against the checksums the file records (:data:`CHECKSUM_ATTR`); a file
        without them (written before they were recorded) is read unverified.

    Returns
    -------
    xarray.Dataset
        In memory; the file is closed (it can be replaced or deleted right away).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    IncompleteResultError
        (a :class:`ValueError`) if the file cannot be read (truncated, damaged metadata: any
        of :data:`READ_ERRORS` from netCDF or xarray) or lacks ``complete = 1``: a partial or
        foreign file, to be recomputed.
    CorruptResultError
        (an :class:`IncompleteResultError`) if its data do not match the recorded checksums,
        or a variable to load is not in its record of them (checked before anything is
        loaded); the message names the variables.

    Notes
    -----
    Verifying costs one hash of the values read (BLAKE2b): a 100 MB float32 dataset read in
    0.30 s instead of 0.25 s on a loaded 2-core machine.

    A file is data, possibly from someone else: before anything is loaded, the data its
    variables declare (their shapes and types) must take at most 1000 times its size on disk
    plus 1 GiB (compressed data can take far more than their file, but not that much), else
    :class:`IncompleteResultError`, naming the file and both sizes. A few kilobytes declaring
    gigabytes (a compressed variable never written takes no room) would otherwise fill the
    memory before the checksums could refuse it.
    """
    path = Path(path)
    if isinstance(variables, str):  # its letters would be read as the names
        raise ValueError(f"variables must be a sequence of variable names, got the string "
                         f"{variables!r} (reading {str(path)!r}); give [{variables!r}]")
    if not path.is_file():
        raise FileNotFoundError(f"result file {path} does not exist")
    missing: list[str] = []
    refused: IncompleteResultError | None = None
    try:
        with open_netcdf(path) as src:
            names = [str(n) for n in src.data_vars]
            if variables is not None:
                missing = [v for v in variables if v not in src.data_vars]
                if not missing:
                    src = src[list(variables)]
            if not missing:
                refused = _refuse_declared(src, path, verify=verify)
            if not (missing or refused):
                ds = src.load()
    except READ_ERRORS as exc:
        detail = f"could not be read (partial or corrupt file?): {' '.join(str(exc).split())}"
        raise IncompleteResultError(f"{path} {detail}", path=path, detail=detail) from exc
    if missing:
        raise KeyError(f"{path} has no variables {missing}; it has {sorted(names)}")
    if refused is not None:
        raise refused
    flag = ds.attrs.get(COMPLETE_ATTR)
    if flag is None or np.ndim(flag) != 0 or decode_attr(flag) != 1:  # not one value: edited
        detail = (f"lacks the completeness flag {COMPLETE_ATTR} = 1: it was not written by "
                  f"uqmetrics.io.write_dataset or its write did not finish")
        raise IncompleteResultError(f"{path} {detail}; recompute it", path=path, detail=detail)
    if verify and CHECKSUM_ATTR in ds.attrs:
        _verify_checksums(ds, path, whole=variables is None)
    if decode_attrs:
        ds.attrs = _decoded(ds.attrs)
        for var in ds.variables.values():
            var.attrs = _decoded(var.attrs)
    return ds


#: :func:`read_dataset` loads a file only when the data its variables declare take at most
#: this many times its size on disk, plus :data:`_DECLARED_SLACK`: compression can make a
#: file far smaller than its data (a constant array, zeros), so the bound is generous, but
#: a file of a few kilobytes declaring gigabytes (an unwritten, compressed variable takes no
#: room on disk) is refused before it fills the memory.
_DECLARED_PER_BYTE = 1000
#: What any file may declare besides :data:`_DECLARED_PER_BYTE` times its size (1 GiB).
_DECLARED_SLACK = 1 << 30


def _refuse_declared(src: xr.Dataset, path: Path, *, verify: bool
                     ) -> IncompleteResultError | None:
    """The refusal of a file opened lazily (``src``, the variables to load) that should not be
    loaded, or None: data declared beyond the bound of :data:`_DECLARED_PER_BYTE` (their
    shapes and types, nothing read), or, where its checksums are to be verified, a variable
    its record of them (:data:`CHECKSUM_ATTR`) does not list (added after it was written: it
    would fail the check once loaded)."""
    declared = sum(int(np.prod(v.shape, dtype=np.float64)) * v.dtype.itemsize
                   for v in src.variables.values())
    on_disk = path.stat().st_size
    if declared > _DECLARED_PER_BYTE * on_disk + _DECLARED_SLACK:
        detail = (f"declares {_size(declared)} of data in a file of {_size(on_disk)} (more than "
                  f"{_DECLARED_PER_BYTE} times its size plus {_size(_DECLARED_SLACK)}): not "
                  "read; not a file write_dataset wrote, or damaged")
        return IncompleteResultError(f"{path} {detail}", path=path, detail=detail)
    if not verify or CHECKSUM_ATTR not in src.attrs:
        return None
    record = _checksum_record(src.attrs)  # damaged (None): refused by _verify_checksums
    unlisted = [str(n) for n in src.variables if record is not None and str(n) not in record[1]]
    if not unlisted:
        return None
    detail = (f"{'variable' if len(unlisted) == 1 else 'variables'} {_names_shown(unlisted)} "
              f"{'is' if len(unlisted) == 1 else 'are'} not in its record of checksums "
              f"({CHECKSUM_ATTR}): added after the file was written (corrupt); not read")
    return CorruptResultError(f"{path}: {detail}; recompute it: delete the file, or rerun the "
                              "command that wrote it with --overwrite", path=path,
                              detail=detail)


def _checksum_record(attrs: Mapping) -> tuple[Any, dict] | None:
    """``(algorithm, {variable: digest})`` of a file's :data:`CHECKSUM_ATTR`, or None where
    that record is damaged (not JSON, nested past recursion, or of another shape)."""
    try:
        record = json.loads(attrs[CHECKSUM_ATTR])
        algorithm, digests = record["algorithm"], record["variables"]
    except (TypeError, ValueError, KeyError, RecursionError):  # RecursionError: nested JSON
        return None
    return (algorithm, digests) if isinstance(digests, dict) else None


def _names_shown(names: Sequence[str]) -> str:
    """The first 5 of ``names`` quoted, then `` ...`` if there are more."""
    return ", ".join(repr(n) for n in names[:5]) + (" ..." if len(names) > 5 else "")


def _verify_checksums(ds: xr.Dataset, path: Path, *, whole: bool) -> None:
    """Raise :class:`CorruptResultError` unless the variables of ``ds`` (all the file's when
    ``whole``) match the record of :data:`CHECKSUM_ATTR`."""
    record = _checksum_record(ds.attrs)
    if record is None:
        detail = f"its record of checksums ({CHECKSUM_ATTR}) is damaged"
    else:
        algorithm, digests = record
        if algorithm != _CHECKSUM_ALGORITHM:
            # never read unverified: one flipped byte in the name would turn the check off
            detail = (f"its record of checksums ({CHECKSUM_ATTR}) names the algorithm "
                      f"{str(algorithm)[:40]!r}, not {_CHECKSUM_ALGORITHM!r} (damaged, or "
                      "written by a later uqmetrics: upgrade it)")
        else:
            names = [str(n) for n in ds.variables]
            bad = [n for n in names if digests.get(n) != _variable_digest(n, ds.variables[n])]
            if whole:  # a variable renamed or lost (a flipped byte in its name)
                bad += sorted(set(digests) - set(names))
            if not bad:
                return
            detail = (f"{'variable' if len(bad) == 1 else 'variables'} {_names_shown(bad)} "
                      f"{'does' if len(bad) == 1 else 'do'} not match the checksum recorded "
                      f"when the file was written (the file changed on disk: corrupt)")
    raise CorruptResultError(f"{path}: {detail}; recompute it: delete the file, or rerun the "
                             f"command that wrote it with --overwrite", path=path,
                             detail=detail)


def _file_checksums(path: Path) -> str:
    """The :data:`CHECKSUM_ATTR` record of the netCDF file ``path``: its variables as
    :func:`read_dataset` reads them (the same decoding), loaded and hashed one at a time."""
    digests = {}
    with open_netcdf(path, cache=False) as src:
        for name, var in src.variables.items():
            digests[str(name)] = _variable_digest(str(name), var)
    return json.dumps({"algorithm": _CHECKSUM_ALGORITHM, "variables": digests})


def _hash_variable(h: Any, name: str, var: xr.Variable) -> None:
    """Feed one variable to the hash ``h``: its name, dims, dtype kind and shape, then its
    values (:func:`_variable_bytes`)."""
    kind = var.dtype.kind if var.dtype.kind not in "USO" else "U"
    header = json.dumps([str(name), [str(d) for d in var.dims], kind, var.dtype.itemsize
                         if kind != "U" else 0, list(var.shape)])
    h.update(header.encode())
    h.update(_variable_bytes(var))


def _variable_digest(name: str, var: xr.Variable) -> str:
    h = hashlib.blake2b(digest_size=32)
    _hash_variable(h, name, var)
    return h.hexdigest()


def _variable_bytes(var: xr.Variable) -> bytes:
    vals = np.asarray(var.values)
    if vals.dtype.kind in "USO":
        return json.dumps([str(v) for v in vals.ravel().tolist()]).encode()
    if vals.dtype.kind == "M" or vals.dtype.kind == "m":
        vals = vals.astype("datetime64[ns]" if vals.dtype.kind == "M" else "timedelta64[ns]")
    return np.ascontiguousarray(vals).tobytes()


def dataset_checksum(ds: xr.Dataset) -> str:
    """SHA-256 hex digest of a Dataset's variables (data and coordinates), attrs excluded.

    Variables are hashed in sorted name order, each as its name, dims, dtype kind and shape
    followed by its values (numbers as raw C-order bytes; strings as UTF-8 JSON so that the
    fixed-width vs object representation after a netCDF round trip does not matter). Equal
    for a Dataset and its :func:`write_dataset` / :func:`read_dataset` round trip; any change
    of a value, name, dim or shape changes it.

    Parameters
    ----------
    ds : xarray.Dataset

    Returns
    -------
    str
        64 hex characters.

    Examples
    --------
    >>> import xarray as xr
    >>> a = xr.Dataset({"x": ("i", [1.0, 2.0])})
    >>> dataset_checksum(a) == dataset_checksum(a.copy(deep=True)), len(dataset_checksum(a))
    (True, 64)
    """
    if not isinstance(ds, xarray_module().Dataset):
        raise ValueError(f"ds must be an xarray.Dataset, got {type(ds).__name__}")
    h = hashlib.sha256()
    for name in sorted(ds.variables, key=str):
        _hash_variable(h, name, ds.variables[name])
    return h.hexdigest()
