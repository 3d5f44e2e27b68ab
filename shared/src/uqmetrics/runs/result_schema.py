"""The result-file schema: what every protocol's result file carries, so that one reader reads
them all (docs/conventions.md#result-schema).

A *result file* is the scored output of a protocol (``selective.nc``, ``ensembles.nc``,
``ood.nc``, ``transfer.nc``, a ``uqvision score`` file), written by
:func:`uqmetrics.write_dataset` (so it is complete and self-checking) with these attrs besides
the provenance of :func:`uqmetrics.provenance_attrs`:

``result_schema``
    :data:`RESULT_SCHEMA_VERSION` (int): the version of this schema the file follows.
``protocol``
    The registry name of the protocol that wrote it (``selective``, ``pitfalls``, ``uimnet``,
    ``url``, or a plugin's): a lower-case identifier, never prose.
``conventions``
    The JSON object of metric conventions (name -> one line) that
    :func:`~uqmetrics.provenance_attrs` writes, :data:`uqmetrics.CONVENTIONS` by default (a
    protocol may refine an entry, e.g. the coverage range of ``aurc_c``). Never prose: a
    protocol's free-text notes go to the optional attr ``notes``.
``input_checksums``
    JSON list of the checksums of the input files the result was computed from
    (:func:`input_checksum`: a prediction cache's recorded ``checksum``, else
    :func:`~uqmetrics.dataset_checksum` of the input), sorted, without duplicates, at least one.

and a *metric tag* on every metric variable: the data-variable attrs ``metric`` (the metric's
name in :data:`uqmetrics.metrics.registry.METRICS` where it is registered, else the protocol's name for
the measure, e.g. ``cll``, ``in_as_in``, ``crop_consistency``) and ``greater_is_better`` (0 or
1; for a registered metric, the registry's direction). A data variable is a metric variable
when its values are values of one metric, a score or loss of a model or method with a direction
that is better, whichever aggregate, subset or bound of it the variable holds (``<m>_mean``,
``all_<m>``, ``oracle_<m>``, the bounds of a DEE); counts, temperatures, thresholds, selections,
flags, correlations between quantities and a table of several metrics along a ``metric``
dimension are not. A variable carries both attrs or neither, and every result file has at least
one metric variable.

Writers call :func:`stamp_result` (one call: the metric tags, the provenance and the schema
attrs, checked); readers call :func:`read_result`, which refuses a file that does not follow
the schema with a :class:`ResultSchemaError` naming the file and every problem, and
:func:`metric_variables` to find the metrics of any protocol's file.

Examples
--------
>>> import xarray as xr
>>> ds = xr.Dataset({"nll": ("model", [0.7, 0.9]), "temperature": ("model", [1.2, 1.4])})
>>> ds = stamp_result(ds, "toy", input_checksums=["ab" * 32], metrics={"nll": "nll"})
>>> ds.attrs["protocol"], ds.attrs["input_checksums"] == json.dumps(["ab" * 32])
('toy', True)
>>> metric_variables(ds)
{'nll': ('nll', False)}
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .io import _caller_package, dataset_checksum, decode_attr, provenance_attrs, read_dataset

if TYPE_CHECKING:
    import xarray as xr

__all__ = [
    "RESULT_SCHEMA_VERSION",
    "SCHEMA_ATTRS",
    "ResultSchemaError",
    "check_result",
    "input_checksum",
    "metric_variables",
    "read_result",
    "result_attrs",
    "stamp_result",
    "tag_metric",
]

#: The version of the schema :func:`stamp_result` writes (attr ``result_schema``).
RESULT_SCHEMA_VERSION = 1

#: The global attrs the schema requires (:func:`stamp_result` sets them last; ``extra`` attrs
#: may not replace them).
SCHEMA_ATTRS = ("result_schema", "protocol", "conventions", "input_checksums")

#: A protocol's registry name, or a metric's name: a lower-case identifier.
_NAME = re.compile(r"^[a-z][a-z0-9_]*\Z")
#: A checksum: lower-case hex digits (``dataset_checksum`` gives 64).
_HEX = re.compile(r"^[0-9a-f]{16,128}\Z")


class ResultSchemaError(ValueError):
    """A result file (or Dataset) that does not follow the result-file schema.

    The message names the file and every problem; ``path`` is the file (None for a Dataset
    in memory) and ``problems`` the list of problems, each naming the attr (and variable) at
    fault and its bad value.
    """

    def __init__(self, message: str, *, path: str | os.PathLike | None = None,
                 problems: Iterable[str] = ()):
        super().__init__(message)
        self.path = None if path is None else Path(path)
        self.problems = list(problems)


def _short(value: Any, width: int = 70) -> str:
    """``repr(value)``, cut to ``width`` characters."""
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def _registered(metric: str):
    """The :class:`~uqmetrics.metrics.registry.MetricSpec` registered as ``metric``, or None (loads
    the metric modules)."""
    from ..metrics.registry import get_metric

    try:
        return get_metric(metric)
    except ValueError:
        return None


def _direction(value: Any) -> bool | None:
    """``greater_is_better`` as stored (0/1, a bool, their JSON) -> bool; None if malformed."""
    value = decode_attr(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    return None


def tag_metric(variable: Any, metric: str, *, greater_is_better: bool | None = None) -> Any:
    """Tag a result variable as holding values of ``metric`` (attrs ``metric`` and
    ``greater_is_better``), in place.

    Parameters
    ----------
    variable : xarray.DataArray or xarray.Variable
        A data variable of a result Dataset (``ds[name]`` or ``ds.variables[name]``).
    metric : str
        The metric's registered name (:data:`uqmetrics.metrics.registry.METRICS`), or, for a measure
        uqmetrics does not register, the protocol's name for it (a lower-case identifier).
    greater_is_better : bool, optional
        Default (and, if given, it must agree): the registry's direction of a registered
        metric. Required for an unregistered one.

    Returns
    -------
    The same ``variable``.

    Raises
    ------
    ValueError
        ``metric`` is not a lower-case identifier, an unregistered metric without
        ``greater_is_better``, or a direction that contradicts the registry.

    Examples
    --------
    >>> import xarray as xr
    >>> v = tag_metric(xr.DataArray([0.1, 0.2]), "ece")
    >>> v.attrs
    {'metric': 'ece', 'greater_is_better': 0}
    >>> tag_metric(xr.DataArray([0.5]), "cll", greater_is_better=True).attrs["greater_is_better"]
    1
    """
    if not isinstance(metric, str) or not _NAME.match(metric):
        raise ValueError(f"metric must be a metric's name (a lower-case identifier), got "
                         f"{metric!r}")
    spec = _registered(metric)
    if greater_is_better is None:
        if spec is None:
            raise ValueError(f"metric {metric!r} is not registered in uqmetrics.registry.METRICS:"
                             f" give its greater_is_better")
        greater_is_better = spec.greater_is_better
    elif spec is not None and bool(greater_is_better) != spec.greater_is_better:
        raise ValueError(f"greater_is_better={greater_is_better!r} contradicts the registered "
                         f"metric {metric!r} (greater_is_better={spec.greater_is_better})")
    variable.attrs["metric"] = metric
    variable.attrs["greater_is_better"] = int(bool(greater_is_better))
    return variable


def input_checksum(ds: xr.Dataset) -> str:
    """The checksum an input file is recorded by in ``input_checksums``.

    A uqvision prediction cache's ``checksum`` attr (its :func:`uqmetrics.dataset_checksum`,
    verified when the cache was read); for any other input, :func:`uqmetrics.dataset_checksum`
    of its data.

    Parameters
    ----------
    ds : xarray.Dataset
        An input, as read.

    Returns
    -------
    str
        Hex digits.

    Examples
    --------
    >>> import xarray as xr
    >>> ds = xr.Dataset({"x": ("i", [1.0, 2.0])})
    >>> input_checksum(ds) == dataset_checksum(ds)
    True
    >>> input_checksum(ds.assign_attrs(checksum="ab" * 32)) == "ab" * 32
    True
    """
    recorded = ds.attrs.get("checksum")
    if isinstance(recorded, str) and _HEX.match(recorded):
        return recorded
    return dataset_checksum(ds)


def _checksum_list(checksums: Iterable[str]) -> list[str]:
    """``checksums`` sorted, without duplicates; ValueError naming a bad one or none."""
    if isinstance(checksums, (str, bytes)):
        raise TypeError(f"input_checksums must be an iterable of checksums, got the string "
                         f"{_short(checksums)}")
    out = sorted(set(checksums))
    bad = [c for c in out if not isinstance(c, str) or not _HEX.match(c)]
    if bad:
        raise ValueError(f"input_checksums: {_short(bad[0])} is not a checksum (lower-case hex "
                         "digits, e.g. uqmetrics.dataset_checksum)")
    if not out:
        raise ValueError("input_checksums is empty: a result records the checksum of every "
                         "input it was computed from")
    return out


def _check_protocol_name(protocol: Any) -> None:
    if not isinstance(protocol, str) or not _NAME.match(protocol):
        raise ValueError(f"protocol must be the protocol's registry name (a lower-case "
                         f"identifier such as 'selective'), got {_short(protocol)}")


def result_attrs(protocol: str, input_checksums: Iterable[str], *, config: Any = None,
                 seed: Any = None, conventions: Mapping | None = None,
                 notes: str | None = None, extra: Mapping | None = None,
                 package: str | None = None) -> dict[str, Any]:
    """The global attrs of a result file: :func:`uqmetrics.provenance_attrs` and the schema's.

    Parameters
    ----------
    protocol : str
        The protocol's registry name (attr ``protocol``).
    input_checksums : iterable of str
        The checksums of the inputs (:func:`input_checksum`); stored sorted, duplicates
        dropped.
    config, seed, conventions
        As :func:`uqmetrics.provenance_attrs` (``conventions``: default
        :data:`uqmetrics.CONVENTIONS`).
    notes : str, optional
        The protocol's free-text notes (attr ``notes``): what ``conventions`` must not hold.
    extra : mapping, optional
        Further attrs of the protocol; they may not be the schema's (:data:`SCHEMA_ATTRS`).
    package : str, optional
        The package whose code made the result (``git_commit``); default the caller's.

    Returns
    -------
    dict
        netCDF-safe attrs.

    Raises
    ------
    ValueError
        A bad ``protocol`` or checksum, no checksum, or ``extra`` naming a schema attr.
    TypeError
        ``input_checksums`` is one string, not an iterable of them.
    """
    _check_protocol_name(protocol)
    sums = _checksum_list(input_checksums)
    extra = dict(extra or {})
    clash = sorted(set(extra) & {*SCHEMA_ATTRS, *(("notes",) if notes is not None else ())})
    if clash:
        raise ValueError(f"extra attrs {clash} are the result-file schema's; pass them as "
                         "arguments of result_attrs")
    if notes is not None:
        extra["notes"] = str(notes)
    attrs = provenance_attrs(config=config, seed=seed, conventions=conventions, extra=extra,
                             package=package or _caller_package(1))
    attrs.update(result_schema=RESULT_SCHEMA_VERSION, protocol=protocol,
                 input_checksums=json.dumps(sums))
    return attrs


def stamp_result(ds: xr.Dataset, protocol: str, *, input_checksums: Iterable[str],
                 metrics: Mapping[str, str | tuple[str, bool]], config: Any = None,
                 seed: Any = None, conventions: Mapping | None = None,
                 notes: str | None = None, extra: Mapping | None = None,
                 package: str | None = None) -> xr.Dataset:
    """Make ``ds`` a result Dataset of ``protocol``: tag its metric variables, replace its
    attrs with :func:`result_attrs` and check it (:func:`check_result`).

    Parameters
    ----------
    ds : xarray.Dataset
        Modified in place (its data are not touched).
    protocol : str
        The protocol's registry name.
    input_checksums : iterable of str
        Checksums of the inputs (:func:`input_checksum`).
    metrics : mapping
        Data variable -> its metric's name, or ``(name, greater_is_better)`` for a metric the
        registry does not hold (:func:`tag_metric`).
    config, seed, conventions, notes, extra, package
        As :func:`result_attrs`; ``ds``'s own attrs are dropped, so keep any in ``extra``.

    Returns
    -------
    xarray.Dataset
        ``ds``.

    Raises
    ------
    KeyError
        A variable of ``metrics`` that ``ds`` lacks (named, with the protocol).
    ValueError
        As :func:`tag_metric` and :func:`result_attrs`.
    """
    for name, metric in metrics.items():
        if name not in ds.data_vars:
            raise KeyError(f"protocol {protocol!r}: no data variable {name!r} to tag as metric "
                           f"{metric!r}; data variables: {sorted(map(str, ds.data_vars))}")
        metric, better = (metric, None) if isinstance(metric, str) else metric
        tag_metric(ds.variables[name], metric, greater_is_better=better)
    ds.attrs = result_attrs(protocol, input_checksums, config=config, seed=seed,
                            conventions=conventions, notes=notes, extra=extra,
                            package=package or _caller_package(1))
    check_result(ds, protocol=protocol)
    return ds


def _attr_problems(attrs: Mapping, protocol: str | Collection[str] | None) -> list[str]:
    """The problems of a result's global attrs."""
    problems = []
    missing = [a for a in SCHEMA_ATTRS if a not in attrs]
    if "result_schema" in missing:
        problems.append("lacks attr 'result_schema' (written before the result-file schema, "
                        "or not by a protocol's scorer: rescore it)")
    else:
        version = decode_attr(attrs["result_schema"])
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            problems.append(f"attr 'result_schema' is {_short(version)}, not a schema version "
                            f"(a positive int)")
        elif version > RESULT_SCHEMA_VERSION:
            problems.append(f"attr 'result_schema' is {version}: a later schema than this "
                            f"uqmetrics reads ({RESULT_SCHEMA_VERSION}); upgrade uqmetrics")
    problems += [f"lacks attr {a!r}" for a in missing if a != "result_schema"]
    if "protocol" in attrs:
        name = decode_attr(attrs["protocol"])
        if not isinstance(name, str) or not _NAME.match(name):
            problems.append(f"attr 'protocol' is {_short(name)}, not a protocol's registry name "
                            "(a lower-case identifier such as 'selective'); free text belongs "
                            "in 'notes'")
        elif protocol is not None:
            wanted = [protocol] if isinstance(protocol, str) else sorted(protocol)
            if name not in wanted:
                problems.append(f"attr 'protocol' is {name!r}, expected "
                                + (repr(wanted[0]) if len(wanted) == 1 else f"one of {wanted}"))
    if "conventions" in attrs:
        conv = decode_attr(attrs["conventions"])
        if not isinstance(conv, dict) or not conv:
            problems.append(f"attr 'conventions' is {_short(conv)}, not the JSON object of "
                            "metric conventions uqmetrics.provenance_attrs writes (free text "
                            "belongs in 'notes')")
        else:
            bad = [k for k, v in conv.items() if not isinstance(v, str)]
            if bad:
                problems.append(f"attr 'conventions': the entry {bad[0]!r} is "
                                f"{_short(conv[bad[0]])}, not one line of text")
    if "input_checksums" in attrs:
        sums = decode_attr(attrs["input_checksums"])
        if not isinstance(sums, list):
            problems.append(f"attr 'input_checksums' is {_short(sums)}, not a JSON list of "
                            "checksums")
        elif not sums:
            problems.append("attr 'input_checksums' is empty: the inputs' checksums are not "
                            "recorded")
        else:
            bad = [c for c in sums if not isinstance(c, str) or not _HEX.match(c)]
            if bad:
                problems.append(f"attr 'input_checksums' holds {_short(bad[0])}, not a checksum "
                                "(lower-case hex digits)")
            elif sums != sorted(set(sums)):
                problems.append("attr 'input_checksums' is not sorted without duplicates")
    return problems


def _metric_problems(ds: xr.Dataset) -> list[str]:
    """The problems of a result's metric tags."""
    problems, tagged = [], 0
    for name, var in ds.data_vars.items():
        has_metric, has_direction = "metric" in var.attrs, "greater_is_better" in var.attrs
        if not (has_metric or has_direction):
            continue
        where = f"variable {str(name)!r}"
        if not has_metric:
            problems.append(f"{where} has 'greater_is_better' but no 'metric' attr")
            continue
        tagged += 1
        metric = decode_attr(var.attrs["metric"])
        if not isinstance(metric, str) or not _NAME.match(metric):
            problems.append(f"{where}: attr 'metric' is {_short(metric)}, not a metric's name "
                            "(a lower-case identifier)")
            continue
        if not has_direction:
            problems.append(f"{where} (metric {metric!r}) lacks attr 'greater_is_better'")
            continue
        better = _direction(var.attrs["greater_is_better"])
        if better is None:
            problems.append(f"{where}: attr 'greater_is_better' is "
                            f"{_short(decode_attr(var.attrs['greater_is_better']))}, not 0 or 1")
            continue
        spec = _registered(metric)
        if spec is not None and better != spec.greater_is_better:
            problems.append(f"{where}: greater_is_better={int(better)} contradicts the "
                            f"registered metric {metric!r} "
                            f"(greater_is_better={int(spec.greater_is_better)})")
    if not tagged and not problems:
        problems.append("no data variable carries a metric tag (attrs 'metric' and "
                        "'greater_is_better')")
    return problems


def check_result(ds: xr.Dataset, *, path: str | os.PathLike | None = None,
                 protocol: str | Collection[str] | None = None) -> None:
    """Raise :class:`ResultSchemaError` unless ``ds`` follows the result-file schema.

    Parameters
    ----------
    ds : xarray.Dataset
        A result, its attrs as written or as read (decoded or not).
    path : path-like, optional
        The file it was read from (named in the message).
    protocol : str or collection of str, optional
        The protocol(s) the result must be of.

    Raises
    ------
    ResultSchemaError
        Naming the file (or "result dataset") and every problem: a missing schema attr, a
        ``protocol`` that is prose or not the expected one, ``conventions`` that are not the
        JSON object of conventions, ``input_checksums`` that are not a sorted list of
        checksums, a malformed or contradictory metric tag, no metric variable.
    """
    problems = _attr_problems(ds.attrs, protocol) + _metric_problems(ds)
    if problems:
        where = "result dataset" if path is None else str(path)
        raise ResultSchemaError(f"{where} does not follow the result-file schema "
                                f"(docs/conventions.md#result-schema): " + "; ".join(problems),
                                path=path, problems=problems)


def read_result(path: str | os.PathLike, *, protocol: str | Collection[str] | None = None,
                decode_attrs: bool = False) -> xr.Dataset:
    """Read a result file and check it against the result-file schema.

    Parameters
    ----------
    path : str or path-like
        A result file (written by :func:`uqmetrics.write_dataset` after
        :func:`stamp_result`).
    protocol : str or collection of str, optional
        The protocol(s) the file must be of (its attr ``protocol``).
    decode_attrs : bool, default False
        Decode JSON attrs (:func:`uqmetrics.read_dataset`).

    Returns
    -------
    xarray.Dataset
        In memory, the file closed.

    Raises
    ------
    FileNotFoundError, IncompleteResultError, CorruptResultError
        As :func:`uqmetrics.read_dataset`.
    ResultSchemaError
        (a :class:`ValueError`) naming the file and what is missing or wrong
        (:func:`check_result`).
    """
    ds = read_dataset(path, decode_attrs=decode_attrs)
    check_result(ds, path=path, protocol=protocol)
    return ds


def metric_variables(ds: xr.Dataset) -> dict[str, tuple[str, bool]]:
    """The metric variables of a result: name -> (metric, greater_is_better).

    Parameters
    ----------
    ds : xarray.Dataset
        A result (as :func:`read_result` returns it).

    Returns
    -------
    dict
        In the order of ``ds.data_vars``; variables without a well-formed tag are left out.
    """
    out = {}
    for name, var in ds.data_vars.items():
        metric = decode_attr(var.attrs.get("metric"))
        better = _direction(var.attrs.get("greater_is_better"))
        if isinstance(metric, str) and better is not None:
            out[str(name)] = (metric, better)
    return out
