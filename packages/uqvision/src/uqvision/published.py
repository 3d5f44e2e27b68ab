"""Published numbers beside the user's (docs/conventions.md#v-pub).

Each published table is a data file of this package, ``uqvision/resources/published/NAME.json``
(:func:`names`, :func:`load`), every number in it the value its source prints, and cited: the
paper, the table, the repository file and the commit it was read at (``sources``; each row
names its source). The tables:

- ``openood-v1.5``: the OpenOOD v1.5 ImageNet-1K leaderboard, near- and far-OOD AUROC and ID
  accuracy of every post-hoc detector on torchvision's ResNet-50, ViT-B/16 and Swin-T
  (protocol ``ood``);
- ``raps-imagenet-val``, ``raps-imagenet-v2``: RAPS Table 1 and Table 2 (alpha = 0.1) and their
  appendix versions at alpha = 0.05: coverage and set size of Top K, Naive, APS and RAPS, and
  the top-1/top-5 accuracy, of nine torchvision classifiers (protocol ``conformal``);
- ``imagenet-c``: AlexNet's top-1 error per corruption and severity, and ResNet-50's mCE and
  clean error (protocol ``shift``);
- ``selective-imagenet``: Galil et al. 2023's Table 3 (accuracy and AUROC, softmax response and
  MC dropout, of twelve torchvision classifiers) and the best AUROC its Section 3 prints,
  ViT-L/16-384's (protocol ``selective``);
- ``pitfalls-imagenet``: Ashukha et al. 2020's Tables 6 and 7: the error and negative calibrated
  log-likelihood of their ImageNet ResNet-50 deep ensemble by ensemble size, without and with
  test-time augmentation (protocol ``pitfalls``).

A published row names a *checkpoint* (``checkpoints.json``: the weights the paper used and the
model names under which a result's row holds them, e.g. ``resnet50.tv_in1k`` and
``tv/resnet50.IMAGENET1K_V1`` for torchvision's ResNet-50 IMAGENET1K_V1); :func:`compare`
matches a result's rows (its ``model`` labels, or what the table's ``match`` names: a row's
``base_model``, a deep ensemble's ``members``) to them and reads, for every published number,
the result's value at the same keys (``columns``: the result variable, its labels, the unit:
a percentage is the result's fraction times 100), and their difference (yours - published).

Published numbers are cited, never re-verifiable: no cache stands behind them, and ``uqvision
verify`` checks only a result's own rows. ``published:alexnet`` is also a baseline of the shift
protocol's mCE (:func:`published_baseline_errors`): AlexNet's published errors, so that mCE is
computed against AlexNet without sweeping it.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import numpy as np
from uqmetrics import InputError
from uqmetrics.runs.io import decode_attr

__all__ = ["PUBLISHED_BASELINES", "Checkpoint", "Comparison", "PublishedTable", "checkpoints",
           "compare", "format_comparison", "load", "names", "published_baseline_errors",
           "report_blocks"]

#: The published baselines of the shift protocol's mCE (``--baseline published:alexnet``):
#: name -> (published table, checkpoint, column of its errors).
PUBLISHED_BASELINES = {"published:alexnet": ("imagenet-c", "torchvision/alexnet.IMAGENET1K_V1",
                                             "error")}
#: The default ``match`` of a table: rows along ``model``, each holding the weights its label
#: names, every published row compared with it.
_MATCH = {"dim": "model", "weights": "label", "where": {}}
#: Row fields that are neither keys nor numbers.
_ROW_FIELDS = ("source", "added")
#: How a difference is printed, per unit.
_DIGITS = {"%": 2, "fraction": 4, "classes": 2, "nats": 4}
#: How a table names the weights of a result's row (its ``match.weights``): the row's label,
#: a per-row coordinate (``coord:NAME``), or the result's ``members`` attr (a deep ensemble's
#: members, every one of them the checkpoint's).
_WEIGHTS = ("label", "members")


def _folder():
    return resources.files("uqvision") / "resources" / "published"


def names() -> list[str]:
    """The published tables shipped with the package, sorted (``--published`` choices)."""
    return sorted(p.name[:-5] for p in _folder().iterdir()
                  if p.name.endswith(".json") and p.name != "checkpoints.json")


@dataclass(frozen=True)
class Checkpoint:
    """The weights behind published numbers.

    Attributes
    ----------
    id : str
        E.g. ``torchvision/resnet50.IMAGENET1K_V1``.
    label : str
        E.g. ``ResNet-50 (torchvision IMAGENET1K_V1)``.
    models : tuple of str
        The model names (a result's ``model`` labels) that hold these weights.
    weights : str
        The weight file's url, as torchvision (or timm's pretrained config, or the release)
        names it.
    files : tuple of str
        Patterns (:func:`fnmatch.fnmatchcase`) of the stems of the released files, for weights
        published only as files: a model ``NAME@STEM`` (``NAME=FILE``) whose stem matches
        holds them. Matched by name, not by hash (the release publishes none).
    """

    id: str
    label: str
    models: tuple[str, ...]
    weights: str = ""
    files: tuple[str, ...] = ()

    def holds(self, model: str) -> bool:
        """Whether the model name ``model`` holds these weights (a name of :attr:`models`, or
        ``NAME@STEM`` with a stem of :attr:`files`)."""
        if model in self.models:
            return True
        stem = model.rpartition("@")[2] if "@" in model else None
        return stem is not None and any(fnmatch.fnmatchcase(stem, p) for p in self.files)

    def describe(self) -> str:
        """``label as name or name`` (or ``as NAME@STEM``, the file patterns)."""
        names = [*self.models, *(f"NAME@{p}" for p in self.files)]
        return f"{self.label} as {' or '.join(names)}"


@cache
def checkpoints() -> dict[str, Checkpoint]:
    """The checkpoints of the published tables (``checkpoints.json``), by id."""
    data = json.loads((_folder() / "checkpoints.json").read_text(encoding="utf-8"))
    return {k: Checkpoint(k, v["label"], tuple(v["models"]), v.get("weights", ""),
                          tuple(v.get("files", ())))
            for k, v in data["checkpoints"].items()}


@dataclass(frozen=True)
class PublishedTable:
    """One published table (a data file; :func:`load`).

    Attributes
    ----------
    name, protocol, title, paper : str
        Its name (``--published NAME``), the protocol whose results it compares with, what
        it holds, the paper.
    setting : str
        How the numbers were made (data, weights, splits, trials): what a result must share
        to be comparable.
    sources : mapping
        Source id -> ``{paper, table, url, note}``, and ``repository``, ``file``, ``commit``
        where the numbers are read from a repository's file (a source without them is the
        paper's own text, ``table`` naming its table or section).
    keys : tuple of str
        The row fields that say what a number is about (``checkpoint`` first).
    columns : mapping
        Published column -> ``{source_column, unit, result}``; ``result`` (absent: not
        compared) says where the result holds the same number: ``variable``, ``select``
        (dim -> a label, or ``{key}``: the row's value of that key), ``scale`` (default 1),
        ``complement`` (``1 - value`` first, an error from an accuracy) and ``config`` (what
        the result's configuration must record, e.g. its mCE baseline).
    rows : tuple of mapping
        Each: the keys, the published numbers (a subset of ``columns``), ``source``.
    path : str
        The data file.
    match : mapping
        How a result's rows are matched to the checkpoints (the file's optional ``match``):
        ``dim``, the result's row dimension (default ``model``); ``weights``, what names a
        row's weights: ``label`` (default: the row's label), ``coord:NAME`` (the row's value
        of the coordinate NAME, e.g. the selective protocol's ``base_model``) or ``members``
        (the result's ``members`` attr, every member a model of the checkpoint: a deep
        ensemble); ``where``, coordinate -> ``{key}`` (or a value): a published row is
        compared with a result's row only where the row's coordinate equals the published
        row's key (e.g. the selective protocol's ``method``, softmax or MC dropout).
    """

    name: str
    protocol: str
    title: str
    paper: str
    setting: str
    sources: Mapping[str, Mapping[str, str]]
    keys: tuple[str, ...]
    columns: Mapping[str, Mapping[str, Any]]
    rows: tuple[Mapping[str, Any], ...]
    path: str = ""
    match: Mapping[str, Any] = field(default_factory=lambda: dict(_MATCH))

    def citation(self, source: str) -> str:
        """One line: the paper, the table, the repository file and commit (for numbers read
        from a repository), the url."""
        s = self.sources[source]
        if not s.get("repository"):
            return f"{self.paper}; {s['table']} ({s['url']})"
        return (f"{self.paper}; {s['table']}; {s['repository']} {s['file']} at commit "
                f"{s['commit']} ({s['url']})")

    def value(self, column: str, **keys: Any) -> float:
        """The published number of ``column`` in the one row with these ``keys``.

        Raises
        ------
        KeyError
            No row, or several, has those keys and the column.
        """
        found = [r[column] for r in self.rows if column in r
                 and all(r.get(k) == v for k, v in keys.items())]
        if len(found) != 1:
            raise KeyError(f"{self.name}: {len(found)} rows with {keys} and {column!r}")
        return found[0]

    def checkpoint_ids(self) -> list[str]:
        """The checkpoints of its rows, in row order."""
        return list(dict.fromkeys(r["checkpoint"] for r in self.rows))


def _check_table(data: Any, path: str) -> PublishedTable:
    """The table of a data file's JSON, checked (one-line :class:`InputError` naming it)."""
    def bad(what: str) -> InputError:
        return InputError(f"published table file {path!r}: {what}")

    need = ("name", "protocol", "title", "paper", "setting", "sources", "keys", "columns",
            "rows")
    if not isinstance(data, dict) or any(k not in data for k in need):
        raise bad(f"must be a JSON object with {', '.join(need)}")
    keys, columns, sources = tuple(data["keys"]), data["columns"], data["sources"]
    if not keys or keys[0] != "checkpoint":
        raise bad(f"keys must begin with 'checkpoint', got {list(keys)}")
    for sid, s in sources.items():
        repo = ("repository", "file", "commit")
        need_s = ("paper", "table", "url", *(repo if any(k in s for k in repo) else ()))
        missing = [k for k in need_s if not isinstance(s.get(k), str) or not s[k]]
        if missing or ("commit" in s and re.fullmatch(r"[0-9a-f]{40}", s["commit"]) is None):
            raise bad(f"source {sid!r} lacks {missing or ['a 40-hex commit']}")
    match = {**_MATCH, **data.get("match", {})}
    weights = match["weights"]
    if (set(match) - set(_MATCH) or not isinstance(match["dim"], str)
            or not isinstance(match["where"], dict)
            or not (weights in _WEIGHTS or (isinstance(weights, str)
                                            and weights.startswith("coord:")))):
        raise bad(f"match must have dim (a string), weights ({', '.join(_WEIGHTS)} or "
                  f"coord:NAME) and where (an object), got {data.get('match')!r}")
    known, seen = checkpoints(), set()
    for i, row in enumerate(data["rows"]):
        extra = set(row) - set(keys) - set(columns) - set(_ROW_FIELDS)
        numbers = [c for c in columns if c in row]
        if extra or not numbers:
            raise bad(f"row {i} has unknown fields {sorted(extra)} or no number")
        if row["checkpoint"] not in known or row.get("source") not in sources:
            raise bad(f"row {i}: unknown checkpoint {row['checkpoint']!r} or source "
                      f"{row.get('source')!r}")
        if not all(isinstance(row[c], (int, float)) and not isinstance(row[c], bool)
                   and math.isfinite(row[c]) for c in numbers):
            raise bad(f"row {i}: a published value is not a finite number")
        key = tuple((k, json.dumps(row.get(k))) for k in keys) + (("numbers", tuple(numbers)),)
        if key in seen:
            raise bad(f"row {i} repeats the keys of an earlier row")
        seen.add(key)
    return PublishedTable(data["name"], data["protocol"], data["title"], data["paper"],
                          data["setting"], sources, keys, columns,
                          tuple(data["rows"]), path, match)


@cache
def load(name: str) -> PublishedTable:
    """The published table ``name`` (:func:`names`), its file checked.

    Raises
    ------
    uqmetrics.InputError
        An unknown name (listing the known ones), or a file that is not a table.
    """
    if name not in names():
        raise InputError(f"--published: unknown published table {name!r}; known: "
                         f"{', '.join(names())}")
    f = _folder() / f"{name}.json"
    return _check_table(json.loads(f.read_text(encoding="utf-8")), str(f))


def published_baseline_errors(baseline: str, corruptions: Sequence[str],
                              severities: Sequence[int]) -> np.ndarray:
    """A published baseline's top-1 errors (``--baseline published:alexnet``).

    Parameters
    ----------
    baseline : str
        A key of :data:`PUBLISHED_BASELINES`.
    corruptions : sequence of str
        The corruptions (ImageNet-C names, e.g. ``gaussian_noise``), shape (corruption,).
    severities : sequence of int
        The severities (1 to 5), shape (severity,).

    Returns
    -------
    numpy.ndarray
        Shape (corruption, severity), fractions in [0, 1].

    Raises
    ------
    uqmetrics.InputError
        An unknown baseline, or a corruption or severity it has no published error for
        (naming those it has).
    """
    if baseline not in PUBLISHED_BASELINES:
        raise InputError(f"baseline {baseline!r} is not a published baseline; known: "
                         f"{', '.join(PUBLISHED_BASELINES)}")
    name, ckpt, column = PUBLISHED_BASELINES[baseline]
    table = load(name)
    errors = {(r["corruption"], r["severity"]): r[column] for r in table.rows
              if r["checkpoint"] == ckpt and column in r}
    missing = [f"{c}/{s}" for c in corruptions for s in severities if (c, int(s)) not in errors]
    if missing:
        have = sorted({c for c, _ in errors})
        raise InputError(f"baseline {baseline!r}: no published error for {', '.join(missing)} "
                         f"(published: severities 1-5 of {', '.join(have)})")
    return np.array([[errors[c, int(s)] for s in severities] for c in corruptions], float)


@dataclass
class Comparison:
    """A result's rows beside a published table's (:func:`compare`).

    Attributes
    ----------
    table : PublishedTable
    result : str
        The result file (or ``<in memory>``).
    matched : dict
        Result row (its label along the table's ``match`` dim, e.g. a model) -> checkpoint
        id.
    rows : list of dict
        One per number compared: ``model`` (the result's row), the table's keys but
        ``checkpoint`` (None for a column read at none of them: a row per distinct published
        value, e.g. OpenOOD's ID accuracy), ``column``, ``unit``, ``published``, ``yours``
        (NaN where the result's value is), ``difference`` (yours - published) and
        ``source``.
    unpaired : dict
        Why some published numbers of the matched checkpoints were not compared -> what is
        missing (a label, a variable, a row of the table) -> how many numbers.
    """

    table: PublishedTable
    result: str
    matched: dict[str, str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    unpaired: dict[str, dict[str, int]] = field(default_factory=dict)

    def n_unpaired(self) -> int:
        """The published numbers of the matched checkpoints not compared."""
        return sum(sum(v.values()) for v in self.unpaired.values())

    def shown_keys(self) -> list[str]:
        """The table's keys (but ``checkpoint``) that a compared row has."""
        return [k for k in self.table.keys[1:] if any(r.get(k) is not None for r in self.rows)]

    def sources(self) -> list[str]:
        """The sources the compared rows cite, in order."""
        return list(dict.fromkeys(r["source"] for r in self.rows))


def _index(ds: Any, dim: str, value: Any) -> int | None:
    """The position of label ``value`` along ``dim`` (text equal, or a number close)."""
    labels = list(ds.indexes[dim]) if dim in ds.indexes else []
    for i, label in enumerate(labels):
        if str(label) == str(value):
            return i
        try:
            if math.isclose(float(label), float(value), rel_tol=1e-9):
                return i
        except (TypeError, ValueError):
            continue
    return None


def _yours(ds: Any, model: str, row: Mapping[str, Any], recipe: Mapping[str, Any],
           config: Mapping[str, Any], label: str,
           dim: str = "model") -> tuple[float | None, str, str]:
    """The result's value of one published number (in the published unit), or None, why and
    what is missing. ``model`` is the result's row, a label along ``dim``."""
    var = recipe["variable"]
    if var not in ds.data_vars or dim not in ds[var].dims:
        return None, f"the result has no variable per {dim}", var
    for k, want in (recipe.get("config") or {}).items():
        if config.get(k) != want:
            return None, f"the published number needs {k} {want}", \
                f"{var} (the result's {k}: {config.get(k)})"
    da = ds[var].isel({dim: _index(ds, dim, model)})
    for dim_, want in (recipe.get("select") or {}).items():
        if dim_ not in da.dims:
            continue
        value = row.get(want[1:-1]) if want.startswith("{") else want
        if value is None:
            return None, f"published rows without a {want[1:-1]} of this project", label
        at = _index(ds, dim_, value)
        if at is None:
            return None, f"the result has no {dim_}", str(value)
        da = da.isel({dim_: at})
    mean = [d for d in recipe.get("mean", ()) if d in da.dims]
    if mean:  # e.g. the member orders of a size curve, as the paper's mean over them
        da = da.mean(mean, skipna=False)
    if da.ndim:
        return None, "dims not selected by the published keys", f"{var} {list(da.dims)}"
    value = float(da.values)
    if recipe.get("complement"):
        value = 1.0 - value
    return value * float(recipe.get("scale", 1)), "", ""


def _row_weights(ds: Any, table: PublishedTable, dim: str) -> dict[str, list[str]]:
    """Each result row (label along ``dim``) -> the model names of its weights (the table's
    ``match.weights``)."""
    labels = [str(m) for m in ds.indexes[dim]] if dim in ds.indexes else []
    how = table.match["weights"]
    if how == "label":
        return {m: [m] for m in labels}
    if how == "members":
        members = decode_attr(ds.attrs.get("members"))
        members = [str(m) for m in members] if isinstance(members, list) else []
        return {m: members for m in labels}
    coord = how.partition(":")[2]
    if coord in ds.coords and ds.coords[coord].dims == (dim,):
        return {m: [str(v)] for m, v in zip(labels, ds.coords[coord].values, strict=True)}
    return {m: [m] for m in labels}


def _where(ds: Any, table: PublishedTable, dim: str, model: str,
           row: Mapping[str, Any]) -> bool:
    """Whether the result's row ``model`` is the one the published ``row`` is about (the
    table's ``match.where``: each coordinate along ``dim`` equal to the row's key)."""
    at = _index(ds, dim, model)
    for coord, want in table.match["where"].items():
        value = row.get(want[1:-1]) if str(want).startswith("{") else want
        if coord not in ds.coords or ds.coords[coord].dims != (dim,):
            return False
        if str(ds.coords[coord].values[at]) != str(value):
            return False
    return True


def _label(table: PublishedTable, row: Mapping[str, Any]) -> str:
    """A row's name: its keys' values but the checkpoint's (the first, the source's own
    name where a key holds it)."""
    return next((str(row[k]) for k in table.keys[1:] if row.get(k) is not None),
                row["checkpoint"])


def compare(result: Any, name: str, *, path: str = "") -> Comparison:
    """A result's numbers beside the published table ``name``'s, matched by checkpoint.

    Parameters
    ----------
    result : xarray.Dataset or path-like
        A score file (:func:`uqmetrics.read_result`).
    name : str
        A published table (:func:`names`).
    path : str, optional
        The file's name in the messages (default: ``result`` when it is a path).

    Returns
    -------
    Comparison

    Raises
    ------
    uqmetrics.InputError
        An unknown table (listing the known ones); a result of another protocol than the
        table's (naming both, and the tables of the result's protocol); a result none of
        whose rows holds one of the table's checkpoints (listing the weights of the result's
        rows and the table's checkpoints with their model names).

    Notes
    -----
    A result's row holds a checkpoint when every model name of its weights (the table's
    ``match.weights``: the row's label, a coordinate of it, or the result's ``members``) is
    one of the checkpoint's (:meth:`Checkpoint.holds`) and a published row of the checkpoint
    is about it (the table's ``match.where``, e.g. the same ``method``). Each published row
    of a matched checkpoint is compared with the rows it is about; a published row about none
    of them is counted as not compared.
    """
    from uqmetrics import read_result

    table = load(name)
    if isinstance(result, (str, os.PathLike)):
        path = path or str(result)
        result = read_result(result)
    path = path or "<in memory>"
    protocol = str(result.attrs.get("protocol", ""))
    if protocol != table.protocol:
        others = [n for n in names() if load(n).protocol == protocol]
        raise InputError(f"result {path!r} is of protocol {protocol!r}, published table "
                         f"{name!r} of protocol {table.protocol!r} (tables for {protocol!r}: "
                         f"{', '.join(others) or 'none'})")
    dim = table.match["dim"]
    weights = _row_weights(result, table, dim)
    known = checkpoints()
    ids = table.checkpoint_ids()
    matched = {}
    for m, held in weights.items():
        hits = [c for c in ids if held and all(known[c].holds(w) for w in held)
                and any(r["checkpoint"] == c and _where(result, table, dim, m, r)
                        for r in table.rows)]
        if hits:
            matched[m] = hits[0]
    if not matched:
        how = table.match["weights"]
        what = {"label": f"the result's {dim}s", "members": "the result's members "
                "(its attr members)"}.get(how, f"the {how[6:]} of the result's {dim}s")
        shown = list(dict.fromkeys(w for held in weights.values() for w in held))
        raise InputError(
            f"no {dim} of result {path!r} holds a checkpoint of published table {name!r}: "
            f"{what} are {', '.join(shown) or 'none'}; the table's checkpoints "
            f"are {'; '.join(known[c].describe() for c in ids)}")
    config = decode_attr(result.attrs.get("config"))
    config = config if isinstance(config, dict) else {}
    out = Comparison(table, path, matched)
    seen, used = set(), set()
    for model, ckpt in matched.items():
        for i, row in enumerate(table.rows):
            if row["checkpoint"] != ckpt or not _where(result, table, dim, model, row):
                continue
            used.add(i)
            for column, spec in table.columns.items():
                if column not in row or "result" not in spec:
                    continue
                recipe = spec["result"]
                keyed = any(str(v).startswith("{") for v in (
                    *(recipe.get("select") or {}).values(), *table.match["where"].values()))
                if not keyed:  # read at no key: one row per distinct published value
                    if (model, column, row[column]) in seen:
                        continue
                    seen.add((model, column, row[column]))
                yours, why, what = _yours(result, model, row, recipe, config, _label(table, row),
                                          dim)
                if yours is None:
                    missing = out.unpaired.setdefault(why, {})
                    missing[what] = missing.get(what, 0) + 1
                    continue
                published = row[column]
                out.rows.append({"model": model,
                                 **{k: row.get(k) if keyed else None for k in table.keys[1:]},
                                 "column": column, "unit": spec["unit"],
                                 "published": published, "yours": yours,
                                 "difference": yours - published, "source": row["source"]})
    where = ", ".join(table.match["where"])
    for i, row in enumerate(table.rows):
        if i in used or row["checkpoint"] not in matched.values():
            continue
        n = sum(1 for c, spec in table.columns.items() if c in row and "result" in spec)
        if n:
            missing = out.unpaired.setdefault(f"the result has no row of this {where}", {})
            label = _label(table, row)
            missing[label] = missing.get(label, 0) + n
    return out


def _shown(value: Any, unit: str) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "–"
    if isinstance(value, float):
        return f"{value:.{_DIGITS.get(unit, 4)}f}"
    return str(value)


def _some(items: Mapping[str, int], most: int = 10) -> str:
    names = list(items)
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most
                                      else "")


def format_comparison(comp: Comparison) -> str:
    """The comparison as text (``uqvision compare``): what is compared, a row per number
    (published as the source prints it, yours and the difference in its unit), what was not
    compared and why, and the citations."""
    t = comp.table
    keys = comp.shown_keys()
    head = ["model", *keys, "column", "unit", "published", "yours", "difference", "source"]
    cells = [[str(r["model"]), *(("" if r.get(k) is None else str(r[k])) for k in keys),
              r["column"], r["unit"], str(r["published"]), _shown(r["yours"], r["unit"]),
              ("+" if r["difference"] > 0 else "") + _shown(r["difference"], r["unit"]),
              r["source"]] for r in comp.rows]
    width = [max(len(x) for x in col) for col in zip(head, *cells, strict=True)]
    wrap = textwrap.TextWrapper(width=100, subsequent_indent="  ")
    lines = [f"published table {t.name}: {t.title}",
             *wrap.wrap(f"paper: {t.paper}"),
             f"result: {comp.result} (protocol {t.protocol})",
             *(f"matched: {m} -> {checkpoints()[c].label}" for m, c in comp.matched.items()),
             *wrap.wrap(f"setting of the published numbers: {t.setting}"),
             ("published numbers are cited, not re-verifiable (no cache stands behind them); "
              "difference = yours - published, in the published unit"), ""]
    lines += ["  ".join(x.ljust(w) for x, w in zip(row, width, strict=True)).rstrip()
              for row in [head, *cells]]
    if comp.unpaired:
        item = textwrap.TextWrapper(width=100, initial_indent="  ", subsequent_indent="    ")
        lines += ["", (f"not compared: {comp.n_unpaired()} published numbers of the matched "
                       "checkpoints")]
        lines += [x for why, missing in comp.unpaired.items()
                  for x in item.wrap(f"{why} ({sum(missing.values())}): {_some(missing)}")]
    lines += ["", "sources:"]
    lines += [x for s in comp.sources() for x in wrap.wrap(f"[{s}] {t.citation(s)}")]
    return "\n".join(lines)


def report_blocks(ds: Any, tables: Sequence[str]) -> list[Any]:
    """The published tables of ``ds``'s protocol among ``tables``, as report blocks beside
    its rows (:class:`uqmetrics.report.PublishedRows`; ``uqvision report --published``).

    A table none of whose checkpoints a model of ``ds`` holds gives a block without rows,
    saying so.
    """
    from uqmetrics.report import PublishedRows

    blocks = []
    for name in tables:
        table = load(name)
        if table.protocol != ds.attrs.get("protocol"):
            continue
        try:
            comp = compare(ds, name)
        except InputError:  # no checkpoint of the table: said, without rows
            ckpts = "; ".join(checkpoints()[c].describe() for c in table.checkpoint_ids())
            blocks.append(PublishedRows(f"{name}: {table.title}", (), (), (),
                                        f"no {table.match['dim']} of this result holds a "
                                        f"checkpoint of the "
                                        f"table: {ckpts}"))
            continue
        keys = comp.shown_keys()
        columns = ("model", *keys, "column", "unit", "published", "yours", "difference",
                   "source")
        rows = tuple((r["model"], *(r.get(k) for k in keys), r["column"], r["unit"],
                      r["published"], r["yours"], r["difference"], r["source"])
                     for r in comp.rows)
        note = "; ".join(f"not compared ({sum(v.values())}): {why}: {_some(v)}"
                         for why, v in comp.unpaired.items())
        blocks.append(PublishedRows(
            f"{name}: {table.title}", columns, rows,
            tuple(f"[{s}] {table.citation(s)}" for s in comp.sources()),
            f"setting: {table.setting}" + (f" {note}." if note else "")))
    return blocks
