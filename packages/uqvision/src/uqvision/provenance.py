"""Per-entry provenance of a score file: the caches each row was computed from and what they
record (the ``caches`` and ``entries`` attrs every vision protocol's scorer writes through
:func:`uqmetrics.stamp_result`; read by ``uqvision report`` and checked by ``uqvision verify``).

:func:`entry_provenance` turns ``row -> the caches it was computed from`` into two attrs:

- ``caches``: JSON object ``{absolute cache path: checksum}`` of every input cache (the checksum
  by which ``input_checksums`` records it, :func:`uqmetrics.input_checksum`);
- ``entries``: JSON object ``{"dim": <row dim>, "provenance": {row: {field: value}},
  "conflicts": {row: {field: [distinct values]}}, "identity": {cache path: {attr: value}}}``.

The fields of a row, each read from its caches' attrs (:mod:`uqvision.cache`) and left out
where no cache records it:

========================  ====================================================================
field                     from the cache attrs
========================  ====================================================================
``checkpoint_sha256``     ``checkpoint_sha256`` (per model: one value, or ``{model: value}``
                          for a row of several models, an ensemble)
``weights_source``,       ``weights_source``, ``weights_revision``, ``weights_file`` (per
``weights_revision``,     model, as ``checkpoint_sha256``)
``weights_file``
``data_fingerprint``      ``dataset_fingerprint`` (per dataset: one value, or
                          ``{dataset_name: value}`` for a row scored on several datasets)
``layout``                ``label_file_kind`` (how the images were labelled; absent for class
                          folders)
``preprocessing``         ``data_config`` (object: input size, mean, std, crop, interpolation)
``mode``, ``passes``,     ``mode``, ``n_passes``, ``tta_policy`` (TTA caches only)
``tta``
``decoder``               ``decoder`` (``pil`` or ``torchvision``: the pixels of two decoders
                          differ; ``pil`` for a cache written before the option, where another
                          cache of the row records one)
``seeds``                 ``{"predict": [...], "train": [...]}``: the distinct prediction seeds
                          (``config.seed``) and training seeds (``train_seed``, >= 0) of the
                          row's caches
``wall_time_s``           the prediction wall time (``wall_time_s``), summed over the row's
                          distinct (model, dataset) runs
``caches``                the row's cache paths, sorted
========================  ====================================================================

A field on which the row's caches disagree — two values for the same model (a per-model
field), for the same dataset (``data_fingerprint``) or any two values of ``layout``,
``preprocessing``, ``mode``, ``passes``, ``tta``, ``decoder`` — goes to ``conflicts`` with every distinct
value instead of ``provenance``: such a row is flagged, never averaged.

``identity`` records, per cache, the attrs that name what it is (``model``, ``dataset_name``,
``checkpoint_sha256``, ``dataset_fingerprint``, where recorded): ``uqvision verify`` checks that
each cache still records them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uqmetrics import input_checksum, read_dataset
from uqmetrics.runs.io import decode_attr, open_netcdf

if TYPE_CHECKING:
    import xarray as xr

__all__ = ["IDENTITY_ATTRS", "cache_path", "entry_provenance", "predictor_rows",
           "recorded_caches", "recorded_config", "rescore_caches"]

#: The cache attrs ``entries.identity`` records for each cache (those it has).
IDENTITY_ATTRS = ("model", "dataset_name", "checkpoint_sha256", "dataset_fingerprint")
#: Fields of one model (key: the cache's ``model``): cache attr -> field.
_PER_MODEL = {"checkpoint_sha256": "checkpoint_sha256", "weights_source": "weights_source",
              "weights_revision": "weights_revision", "weights_file": "weights_file"}
#: Fields every cache of the row must share: field -> cache attr.
_SHARED = {"layout": "label_file_kind", "preprocessing": "data_config", "mode": "mode",
           "passes": "n_passes", "tta": "tta_policy", "decoder": "decoder"}
#: The value of an attr in a cache written before it was recorded (when another cache of the
#: row records it).
_RECORDED_BEFORE = {"decoder": "pil"}


def cache_path(cache: xr.Dataset | str | os.PathLike) -> str:
    """The absolute path of a cache (a path, or a Dataset read from a file: its
    ``encoding["source"]``); ``<in memory: CHECKSUM>`` for a Dataset made in memory (recorded
    as such: a result scored from it cannot be verified from files).
    """
    if isinstance(cache, (str, os.PathLike)):
        return str(Path(cache).resolve())
    source = cache.encoding.get("source")
    if not source:
        return f"<in memory: {input_checksum(cache)[:16]}>"
    return str(Path(source).resolve())


def _header(cache: xr.Dataset | str | os.PathLike) -> tuple[Mapping, str]:
    """(attrs, checksum) of a cache: a Dataset's own, or a file's header (its ``checksum``
    attr, a prediction cache's; else its data read: :func:`uqmetrics.input_checksum`)."""
    if not isinstance(cache, (str, os.PathLike)):
        return cache.attrs, input_checksum(cache)
    with open_netcdf(cache) as ds:
        attrs = dict(ds.attrs)
    if not isinstance(attrs.get("checksum"), str):
        return attrs, input_checksum(read_dataset(cache))
    return attrs, attrs["checksum"]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _plain(value: Any) -> Any:
    """A netCDF attr value as JSON-able Python (JSON text decoded, numpy scalars unwrapped)."""
    value = decode_attr(value)
    return value.item() if hasattr(value, "item") and not isinstance(value, (list, dict)) \
        else value


def _distinct(values: Iterable[Any]) -> list[Any]:
    seen: dict[str, Any] = {}
    for v in values:
        seen.setdefault(_canonical(v), v)
    return list(seen.values())


def _row(caches: list[tuple[str, Mapping]]) -> tuple[dict, dict]:
    """(provenance, conflicts) of one row from its ``(path, attrs)`` caches."""
    prov: dict[str, Any] = {}
    conflicts: dict[str, list] = {}
    models = _distinct(str(a.get("model", "")) for _, a in caches)

    def keyed(field: str, attr: str, key: str) -> None:
        by_key: dict[str, list] = {}
        for _, a in caches:
            if attr in a and _plain(a[attr]) not in ("", None):
                by_key.setdefault(str(a.get(key, "")), []).append(_plain(a[attr]))
        if not by_key:
            return
        values = {k: _distinct(v) for k, v in by_key.items()}
        if any(len(v) > 1 for v in values.values()):
            conflicts[field] = _distinct(x for v in values.values() for x in v)
        elif len(values) == 1:
            prov[field] = next(iter(values.values()))[0]
        else:
            prov[field] = {k: v[0] for k, v in sorted(values.items())}

    for attr, field in _PER_MODEL.items():
        keyed(field, attr, "model")
    keyed("data_fingerprint", "dataset_fingerprint", "dataset_name")
    for field, attr in _SHARED.items():
        if not any(attr in a for _, a in caches):
            continue  # recorded by none of the row's caches
        values = _distinct(_plain(a.get(attr, _RECORDED_BEFORE.get(attr))) for _, a in caches
                           if _plain(a.get(attr, _RECORDED_BEFORE.get(attr))) not in ("", None))
        if len(values) > 1:
            conflicts[field] = values
        elif values:
            prov[field] = values[0]
    predict, train = set(), set()
    for _, a in caches:
        config = _plain(a.get("config"))
        if isinstance(config, dict) and isinstance(config.get("seed"), int):
            predict.add(config["seed"])
        if "train_seed" in a and int(_plain(a["train_seed"])) >= 0:
            train.add(int(_plain(a["train_seed"])))
    if predict or train:
        prov["seeds"] = {k: sorted(v) for k, v in (("predict", predict), ("train", train)) if v}
    walls = {(str(a.get("model", "")), str(a.get("dataset_name", "")),
              float(_plain(a["wall_time_s"]))) for _, a in caches if "wall_time_s" in a}
    if walls:
        prov["wall_time_s"] = sum(w for _, _, w in walls)
    prov["caches"] = sorted({p for p, _ in caches})
    if len(models) > 1:
        prov["models"] = sorted(models)
    return prov, conflicts


def entry_provenance(rows: Mapping[Any, Iterable[xr.Dataset]], dim: str) -> dict[str, str]:
    """The ``caches`` and ``entries`` attrs of a score file (see the module docstring).

    Parameters
    ----------
    rows : mapping
        Row value (a coordinate value along ``dim``) -> the caches it was computed from, each
        an ``xarray.Dataset`` read from its file (:func:`uqvision.cache.read_cache`; its path
        is ``encoding["source"]``) or the path of a cache (its header read).
    dim : str
        The row dimension, e.g. ``model``.

    Returns
    -------
    dict
        ``{"caches": JSON, "entries": JSON}``, for ``stamp_result(..., extra=...)``.

    Raises
    ------
    ValueError
        ``dim`` empty, or a row without caches.

    Examples
    --------
    >>> import xarray as xr
    >>> c = xr.Dataset({"x": ("i", [1.0])}, attrs={"model": "m", "mode": "plain",
    ...                                             "checksum": "ab" * 32})
    >>> c.encoding["source"] = "/caches/m.nc"
    >>> attrs = entry_provenance({"m": [c]}, "model")
    >>> json.loads(attrs["entries"])["provenance"]["m"]
    {'mode': 'plain', 'caches': ['/caches/m.nc']}
    """
    if not isinstance(dim, str) or not dim:
        raise ValueError(f"dim must be the row dimension's name, got {dim!r}")
    checksums: dict[str, str] = {}
    identity: dict[str, dict] = {}
    provenance: dict[str, dict] = {}
    conflicts: dict[str, dict] = {}
    headers: dict[str, Mapping] = {}
    for row, caches in rows.items():
        pairs = []
        for c in caches:
            path = cache_path(c)
            if path not in checksums:
                headers[path], checksums[path] = _header(c)
                identity[path] = {k: _plain(headers[path][k]) for k in IDENTITY_ATTRS
                                  if k in headers[path]}
            pairs.append((path, headers[path]))
        if not pairs:
            raise ValueError(f"row {row!r} of dim {dim!r} has no cache")
        provenance[str(row)], bad = _row(pairs)
        if bad:
            conflicts[str(row)] = bad
    entries = {"dim": dim, "provenance": provenance, "conflicts": conflicts,
               "identity": identity}
    return {"caches": json.dumps(dict(sorted(checksums.items()))),
            "entries": json.dumps(entries, default=str)}


def recorded_caches(result: xr.Dataset) -> list[str]:
    """The cache paths a score file records (its ``caches`` attr), in the order recorded.

    Raises
    ------
    ValueError
        A score file that records no caches (scored before they were recorded: rescore it).
    """
    caches = decode_attr(result.attrs.get("caches"))
    if not isinstance(caches, dict) or not caches:
        raise ValueError("the result records no caches (attr 'caches'): it was scored before "
                         "they were recorded; rescore it to verify it")
    return list(caches)


def recorded_config(result: xr.Dataset) -> dict[str, Any]:
    """The configuration a score file records (its ``config`` attr, JSON lists as tuples).

    Raises
    ------
    TypeError
        A score file that records no configuration object.
    """
    config = decode_attr(result.attrs.get("config"))
    if not isinstance(config, dict):
        raise TypeError(f"the result records no configuration object (attr 'config' is "
                         f"{config!r})")
    return {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}


def predictor_rows(predictors: Iterable[Any], groups: Mapping[tuple[str, str], list]
                   ) -> dict[str, list]:
    """Each predictor's caches: ``{name: every cache of every member, on every dataset}``.

    Parameters
    ----------
    predictors : iterable of uqvision.predictors.Predictor
    groups : mapping
        ``(model, dataset_name) -> [caches]`` (:attr:`uqvision.predictors.CacheGroups.groups`).

    Returns
    -------
    dict
        For :func:`entry_provenance`.
    """
    return {p.name: [c for (m, _), caches in groups.items() if m in p.members for c in caches]
            for p in predictors}


def rescore_caches(result: xr.Dataset, score: Any, config_class: Any) -> xr.Dataset:
    """``score(caches, config_class(**config))`` of the caches and configuration a score file
    records (:func:`recorded_caches`, :func:`recorded_config`): the rescoring of a protocol
    whose scorer takes caches and a config dataclass (``uqvision verify``)."""
    return score(recorded_caches(result), config_class(**recorded_config(result)))
