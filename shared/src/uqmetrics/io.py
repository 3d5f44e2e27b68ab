"""Result files: provenance attrs and atomic, self-checking netCDF writes.

Every result of the project is an ``xarray.Dataset`` written with :func:`write_dataset`:

- the write is atomic (a temporary file in the target directory, ``fsync``, ``os.replace``),
  so a crash never leaves a half-written file under the final name and a sweep that skips
  existing files resumes safely;
- an existing file is never overwritten unless ``overwrite=True``;
- attrs netCDF cannot hold (dicts, lists, bools, None) are stored as JSON strings, which
  :func:`decode_attr` turns back;
- a ``complete = 1`` attr is added after all data has been written; :func:`read_dataset`
  rejects files without it.

:func:`provenance_attrs` gives the attrs every result file carries (versions, git commit, host,
time, config, seed and the metric conventions), so that ``xr.open_dataset`` alone is enough to
re-plot or re-score a result.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import errno
import functools
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import xarray as xr

__all__ = [
    "COMPLETE_ATTR",
    "IncompleteResultError",
    "check_writable",
    "dataset_checksum",
    "decode_attr",
    "folder_replaced",
    "provenance_attrs",
    "read_dataset",
    "write_dataset",
]

#: Name of the attr marking a fully written file.
COMPLETE_ATTR = "complete"


def xarray_module():
    """``xarray``, imported on first use (``import uqmetrics.io`` does not import it: a program
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
    """A result file lacks the completeness flag or cannot be read (partial or corrupt)."""


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
    decoded; other strings are returned unchanged; numpy scalars become Python scalars.

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
            except ValueError:
                return value
    return value


def _decoded(attrs: Mapping) -> dict:
    return {k: decode_attr(v) for k, v in attrs.items()}


def _git_commit(cwd: str | os.PathLike | None = None) -> str | None:
    try:
        res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = res.stdout.strip()
    return commit if res.returncode == 0 and commit else None


def _git_dirty(cwd: str | os.PathLike | None = None) -> bool | None:
    try:
        res = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(res.stdout.strip()) if res.returncode == 0 else None


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
                     extra: Mapping | None = None) -> dict[str, Any]:
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

    Returns
    -------
    dict
        ``<dist>_version`` for python, numpy, scipy, xarray, netCDF4 and uqmetrics, plus torch,
        timm, torchvision, uqreg and uqvision when installed (read from package metadata; torch
        is never imported); ``git_commit`` (``"unknown"`` outside a git checkout) and
        ``git_dirty`` (JSON bool or null) of the current directory; ``hostname``;
        ``created_utc`` (ISO 8601); ``config``; ``seed``; ``conventions`` (JSON).

    Examples
    --------
    >>> attrs = provenance_attrs(config={"task": "sinusoid", "k": 50}, seed=0)
    >>> decode_attr(attrs["config"]), attrs["seed"], "numpy_version" in attrs
    ({'task': 'sinusoid', 'k': 50}, 0, True)
    """
    if conventions is None:
        from .conventions import CONVENTIONS

        conventions = CONVENTIONS
    if not isinstance(conventions, Mapping):
        raise ValueError(f"conventions must be a mapping, got {type(conventions).__name__}")
    if extra is not None and not isinstance(extra, Mapping):
        raise ValueError(f"extra must be a mapping, got {type(extra).__name__}")
    attrs: dict[str, Any] = {f"{k}_version": v for k, v in _versions().items()}
    attrs["git_commit"] = _git_commit() or "unknown"
    attrs["git_dirty"] = _git_dirty()
    attrs["hostname"] = socket.gethostname()
    attrs["created_utc"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    attrs["config"] = _to_json(config, "config")
    attrs["seed"] = seed if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) \
        else _to_json(seed, "seed")
    attrs["conventions"] = _to_json(dict(conventions), "conventions")
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


@contextmanager
def temporary_beside(path: Path):
    """Yield a fresh temporary path in ``path``'s directory (created if needed) for an atomic
    write-then-rename; the temporary file is removed if the block raises (interrupts too)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def folder_replaced(path: str | os.PathLike):
    """Write a whole folder atomically: yield a fresh temporary folder beside ``path``; when the
    block succeeds it takes ``path``'s place (an existing folder there is removed only after the
    new one is complete), and when it raises (interrupts too) it is removed and ``path`` is left
    as it was.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     with folder_replaced(Path(d) / "out") as tmp:
    ...         _ = (tmp / "a.txt").write_text("x")
    ...     sorted(p.name for p in Path(d).iterdir()), (Path(d) / "out" / "a.txt").read_text()
    (['out'], 'x')
    """
    import shutil
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        if path.exists() or path.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old / "x")
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
    out = ds.drop_encoding()
    merged = {**ds.attrs, **(dict(attrs) if attrs else {})}
    merged.pop(COMPLETE_ATTR, None)
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

    Notes
    -----
    The data go to a temporary file ``.<name>.<random>.tmp`` in the target directory (the
    same filesystem), written by the ``netcdf4`` engine. The ``complete = 1`` attr is then
    appended, as the file's last attr, after all data is on disk; the file is fsync'ed and moved
    into place with :func:`os.replace` (or, without ``overwrite``, hard-linked so that a file
    created concurrently by another writer is never clobbered). On any exception, including
    :class:`KeyboardInterrupt`, the temporary file is removed and the target is untouched.
    Attrs netCDF cannot hold (dicts, lists, tuples, bools, None, dataclasses) become JSON
    strings; see :func:`decode_attr`. The input ``ds`` is not modified.

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
        prepared.to_netcdf(tmp, engine="netcdf4")
        import netCDF4

        with netCDF4.Dataset(tmp, mode="a") as nc:
            nc.setncattr(COMPLETE_ATTR, np.int32(1))
        _fsync_path(tmp)
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)  # atomic and never clobbers a concurrent writer's file
            except FileExistsError:
                raise FileExistsError(f"{path} already exists (created concurrently); pass "
                                      f"overwrite=True (--overwrite) to replace it") from None
            except OSError:  # filesystem without hard links
                if path.exists():
                    raise FileExistsError(f"{path} already exists; pass overwrite=True "
                                          f"(--overwrite) to replace it") from None
                os.replace(tmp, path)
            else:
                os.unlink(tmp)
        _fsync_path(path.parent, directory=True)
    return path


def read_dataset(path: str | os.PathLike, *, decode_attrs: bool = False,
                 variables: Sequence[str] | None = None) -> xr.Dataset:
    """Load a result file fully into memory and close it.

    Parameters
    ----------
    path : str or path-like
        A file written by :func:`write_dataset`.
    decode_attrs : bool, default False
        Decode JSON attrs (global and per variable) with :func:`decode_attr`.
    variables : sequence of str, optional
        Load only these data variables (with their coordinates and the global attrs); the
        others are never read from disk. ``KeyError`` names a variable the file lacks.

    Returns
    -------
    xarray.Dataset
        In memory; the file is closed (it can be replaced or deleted right away).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    IncompleteResultError
        (a :class:`ValueError`) if the file cannot be read or lacks ``complete = 1``:
        a partial or foreign file, to be recomputed.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"result file {path} does not exist")
    try:
        with xarray_module().open_dataset(path, engine="netcdf4") as src:
            if variables is not None:
                missing = [v for v in variables if v not in src.data_vars]
                if missing:
                    raise KeyError(f"{path} has no variables {missing}; it has "
                                   f"{sorted(src.data_vars)}")
                src = src[list(variables)]
            ds = src.load()
    except (OSError, RuntimeError) as exc:
        raise IncompleteResultError(f"{path} could not be read (partial or corrupt file?): "
                                    f"{exc}") from exc
    flag = ds.attrs.get(COMPLETE_ATTR)
    if flag is None or decode_attr(flag) != 1:
        raise IncompleteResultError(
            f"{path} lacks the completeness flag {COMPLETE_ATTR} = 1: it was not written by "
            f"uqmetrics.io.write_dataset or its write did not finish; recompute it"
        )
    if decode_attrs:
        ds.attrs = _decoded(ds.attrs)
        for var in ds.variables.values():
            var.attrs = _decoded(var.attrs)
    return ds


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
        var = ds.variables[name]
        kind = var.dtype.kind if var.dtype.kind not in "USO" else "U"
        header = json.dumps([str(name), [str(d) for d in var.dims], kind, var.dtype.itemsize
                             if kind != "U" else 0, list(var.shape)])
        h.update(header.encode())
        h.update(_variable_bytes(var))
    return h.hexdigest()
