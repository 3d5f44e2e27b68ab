"""Results table of a model zoo: one row per model, timm's results-CSV columns and the selective
protocol's (docs/conventions.md#v-1-table).

:func:`results_table` reads prediction caches (and, when given, the selective score file of
:func:`uqvision.protocols.selective.score.score_selective`) and returns a
:class:`ResultsTable`: ``format()`` is the aligned plain-text table ``uqvision score
selective``, ``sweep`` and ``predict`` print, ``write()`` the ``<stem>.csv`` / ``<stem>.json``
files. Columns (:data:`COLUMNS`):

- ``model``: the row of the selective protocol (``<model>`` for the plain cache,
  ``<model>+mc_dropout`` for an MC-dropout cache);
- ``top1``, ``top5``: accuracy in percent on every image of the cache, as timm's results CSVs
  (registered metrics ``accuracy``, ``top5_accuracy``; MC dropout: of the mean over passes);
- ``auroc``, ``ece``, ``aurc``: the selective protocol's values without temperature scaling
  (``calibration = "none"``), fractions as in the score file; κ is the row kind's confidence
  (softmax response; negative entropy of the mean for ``+mc_dropout``, whose ECE is not
  reported). From the score file when it is given (its ``none`` row, over the images of its
  ``none_samples`` rule: the held-out images by default, every image under ``all``;
  ``n_scored`` is the file's ``n_scored`` of ``none``, or its ``n_eval`` for a file written
  before that coord), else computed here through the same scoring call, over every image of
  the cache like ``top1``/``top5``;
- ``images_per_s`` = ``n_images / wall_time_s``; ``wall_time_s`` is the cache's: the
  prediction call that wrote it, model build included;
- ``param_count`` (millions), ``img_size``, ``crop_pct``, ``interpolation``: timm's columns,
  from the cache's ``num_params`` and ``data_config`` attrs;
- ``n_images``, ``n_scored``, ``dataset``.

Metric modules and the selective scorer are imported on use: ``results_table(...,
metrics=False)`` (what ``uqvision predict`` prints) computes top-1/top-5 only, with the
accuracy functions of ``uqmetrics.metrics.classification`` (16 ms to import after xarray), and imports
no other scoring code: the selective metrics need scipy and the selective scorer, about 2.3 s
of imports that the prediction command does not pay (docs/conventions.md#v-predict-speed).
"""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uqmetrics.runs.io import open_netcdf, write_text_file

from .cache import index_caches, read_cache, select_dataset

if TYPE_CHECKING:
    import xarray as xr

    from .protocols.selective.score import SelectiveConfig

__all__ = ["COLUMNS", "ResultsTable", "results_table"]

#: Columns of a results table, in order: timm's results-CSV names where they overlap
#: (``model``, ``top1``, ``top5``, ``param_count``, ``img_size``, ``crop_pct``,
#: ``interpolation``); docs/conventions.md#v-1-table defines each.
COLUMNS = ("model", "top1", "top5", "auroc", "ece", "aurc", "images_per_s", "wall_time_s",
           "param_count", "img_size", "crop_pct", "interpolation", "n_images", "n_scored",
           "dataset")
#: Selective score-file variables behind the metric columns taken from it.
_FROM_SCORES = ("auroc", "ece", "aurc")
_INT_COLUMNS = ("img_size", "n_images", "n_scored")
_STR_COLUMNS = ("model", "interpolation", "dataset")
#: Console precision of the float columns (digits after the point).
_DIGITS = {"top1": 2, "top5": 2, "auroc": 4, "ece": 4, "aurc": 4, "images_per_s": 1,
           "wall_time_s": 2, "param_count": 2, "crop_pct": 3}
CONVENTION = "docs/conventions.md#v-1-table"


def _missing(value: Any) -> bool:
    return value is None or value == "" or (isinstance(value, float) and math.isnan(value))


@dataclass
class ResultsTable:
    """Rows of :data:`COLUMNS`, sorted by ``top1`` descending (timm's order).

    Attributes
    ----------
    rows : list of dict
        One dict per row, keys :data:`COLUMNS`; a value that is not known is NaN (float
        columns), None (``img_size``, ``n_images``, ``n_scored``) or ``""`` (``model``,
        ``interpolation``, ``dataset``).
    source : str
        Where ``auroc``/``ece``/``aurc`` come from: ``"scores"`` (a selective score file),
        ``"caches"`` (computed from the caches) or ``"none"`` (not computed: ``top1``/``top5``
        only).
    """

    rows: list[dict[str, Any]] = field(default_factory=list)
    source: str = "caches"

    def __len__(self) -> int:
        return len(self.rows)

    def column(self, name: str) -> list[Any]:
        """The values of column ``name``, shape (row,)."""
        if name not in COLUMNS:
            raise KeyError(f"unknown column {name!r}; columns: {', '.join(COLUMNS)}")
        return [r[name] for r in self.rows]

    def format(self) -> str:
        """The table as aligned plain text: a caption line, a header line, one line per row.

        ``dataset``, ``n_images`` and ``n_scored`` go to the caption when every row has the
        same value; columns with no known value are left out; unknown values print as ``-``.
        Numbers are right-aligned with the precision of their column (percent to 0.01,
        AUROC/ECE/AURC to 1e-4, images/s to 0.1, seconds and millions of parameters to 0.01).
        """
        shared = {c: self.rows[0][c] for c in ("dataset", "n_images", "n_scored")
                  if self.rows and not _missing(self.rows[0][c])
                  and all(r[c] == self.rows[0][c] for r in self.rows)}
        cols = [c for c in COLUMNS if c == "model" or c not in shared
                and any(not _missing(r[c]) for r in self.rows)]
        cells = [[_cell(c, r[c]) for c in cols] for r in self.rows]
        widths = [max([len(c)] + [len(row[j]) for row in cells]) for j, c in enumerate(cols)]

        def line(values: list[str]) -> str:
            return "  ".join(v.ljust(w) if c in _STR_COLUMNS else v.rjust(w)
                             for c, v, w in zip(cols, values, widths, strict=True)).rstrip()

        return "\n".join([self._caption(shared), line(list(cols))]
                         + [line(row) for row in cells])

    def _caption(self, shared: Mapping[str, Any]) -> str:
        """E.g. ``dataset 'val', 50000 images; top1/top5 in %; auroc/ece/aurc before
        temperature scaling, over all images`` (a score file that scored them on fewer
        images than the cache holds: ``over the score file's 45000 evaluation images``)."""
        parts = [f"dataset {shared['dataset']!r}" if "dataset" in shared else "",
                 f"{shared['n_images']} images" if "n_images" in shared else ""]
        text = ", ".join(p for p in parts if p)
        if any(not _missing(r["top1"]) for r in self.rows) and self.source == "none":
            text += "; top1/top5 in %, over all images"
        elif any(not _missing(r["top1"]) for r in self.rows):
            every = all(r["n_scored"] == r["n_images"] for r in self.rows)
            over = "all images" if self.source != "scores" or every else (
                f"the score file's {shared['n_scored']} evaluation images"
                if "n_scored" in shared else "the score file's evaluation images")
            text += f"; top1/top5 in %; auroc/ece/aurc before temperature scaling, over {over}"
        return text.lstrip("; ")

    def to_csv(self) -> str:
        """The CSV text: header :data:`COLUMNS`, floats at full precision, unknown values
        empty, a label a spreadsheet would run as a formula quoted
        (:func:`uqmetrics.report.csv_cell`)."""
        from uqmetrics.report import csv_cell

        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(COLUMNS)
        for r in self.rows:
            writer.writerow([csv_cell(None if _missing(r[c]) else r[c]) for c in COLUMNS])
        return buf.getvalue()

    def to_json(self) -> str:
        """The JSON text: ``{"columns", "rows", "source", "convention"}``, unknown values null."""
        rows = [{c: None if _missing(r[c]) else r[c] for c in COLUMNS} for r in self.rows]
        return json.dumps({"columns": list(COLUMNS), "rows": rows, "source": self.source,
                           "convention": CONVENTION}, indent=1) + "\n"

    @classmethod
    def read(cls, path: str | os.PathLike) -> ResultsTable:
        """A table back from the ``.json`` file :meth:`write` wrote."""
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        unknown = {c: None if c in _INT_COLUMNS else "" if c in _STR_COLUMNS else math.nan
                   for c in COLUMNS}
        rows = [{c: unknown[c] if r.get(c) is None else r[c] for c in COLUMNS}
                for r in data["rows"]]
        return cls(rows, data.get("source", "caches"))

    def write(self, folder: str | os.PathLike, stem: str = "results", *,
              overwrite: bool = False) -> tuple[Path, Path]:
        """Write ``folder/<stem>.csv`` and ``folder/<stem>.json`` atomically.

        Each file is written to a temporary file beside it and moved into place
        (``os.replace``; without ``overwrite`` a hard link, which never replaces a file made
        meanwhile). The folder is created if needed.

        Returns
        -------
        (Path, Path)
            The CSV and JSON paths.

        Raises
        ------
        FileExistsError
            Either file exists and ``overwrite`` is false (``filename`` names it; nothing is
            written).
        """
        folder = Path(folder)
        paths = folder / f"{stem}.csv", folder / f"{stem}.json"
        if not overwrite:
            for p in paths:
                if p.exists() or p.is_symlink():
                    raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(p))
        for p, text in zip(paths, (self.to_csv(), self.to_json()), strict=True):
            write_text_file(p, text, overwrite=overwrite)
        return paths


def _cell(column: str, value: Any) -> str:
    if _missing(value):
        return "-"
    if column in _DIGITS:
        return f"{float(value):.{_DIGITS[column]}f}"
    return str(value)


def _cache_columns(attrs: Mapping[str, Any], n_images: int) -> dict[str, Any]:
    """Cost and timm columns from a cache's attrs (NaN/None where it does not record them)."""
    wall = float(attrs.get("wall_time_s", math.nan))
    try:
        data_config = json.loads(attrs["data_config"])
    except (KeyError, TypeError, ValueError):
        data_config = {}
    size = data_config.get("input_size") or [None]
    return {"images_per_s": n_images / wall if wall > 0 else math.nan,
            "wall_time_s": wall,
            "param_count": int(attrs["num_params"]) / 1e6 if "num_params" in attrs
            else math.nan,
            "img_size": None if size[-1] is None else int(size[-1]),
            "crop_pct": float(data_config.get("crop_pct", math.nan)),
            "interpolation": str(data_config.get("interpolation", "")),
            "n_images": int(n_images), "dataset": str(attrs.get("dataset_name", ""))}


def _row(label: str, **values: Any) -> dict[str, Any]:
    row = {c: math.nan for c in COLUMNS}
    row.update(model=label, img_size=None, n_scored=None, interpolation="", dataset="")
    row.update(values)
    return row


def _sorted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """By ``top1`` descending, rows without one last; ties by model name."""
    return sorted(rows, key=lambda r: (_missing(r["top1"]),
                                       0.0 if _missing(r["top1"]) else -r["top1"], r["model"]))


def _accuracy_columns(ds: xr.Dataset) -> dict[str, float]:
    """``top1``/``top5`` (percent) of a cache's logits against its labels, NaN without either.

    The probabilities are the softmax of the logits (the mean of the passes' softmaxes for
    (pass, sample, class) logits, as the selective protocol's predictive distribution), in
    float64; the metric is :func:`uqmetrics.metrics.classification.top_k_accuracy_score`, the function
    behind the registered ``accuracy``/``top5_accuracy``, imported alone (no scipy).
    """
    if "logits" not in ds or "label" not in ds or ds.sizes.get("sample", 0) == 0:
        return {}
    import torch
    from uqmetrics.metrics.classification import top_k_accuracy_score

    z = torch.from_numpy(ds["logits"].values.astype("float64"))
    p = torch.softmax(z, dim=-1)
    p = (p.mean(dim=0) if p.ndim == 3 else p).numpy()
    y = ds["label"].values
    return {"top1": 100 * top_k_accuracy_score(y, p, k=1),
            "top5": 100 * top_k_accuracy_score(y, p, k=5)}


def _cost_rows(caches: Iterable[str | os.PathLike]) -> list[dict[str, Any]]:
    """One row per model and mode (its pass-0 cache): costs, timm's columns, top-1/top-5."""
    rows = {}
    for info in index_caches(caches):
        if info.pass_index != 0 or (info.model, info.mode, info.dataset_name) in rows:
            continue
        label = info.model if info.mode == "plain" else f"{info.model}+{info.mode}"
        with open_netcdf(info.path) as ds:
            rows[info.model, info.mode, info.dataset_name] = _row(
                label, **_cache_columns(dict(ds.attrs), int(ds.sizes["sample"])),
                **_accuracy_columns(ds))
    return list(rows.values())


def results_table(caches: Iterable[str | os.PathLike], *, scores: xr.Dataset | None = None,
                  config: SelectiveConfig | None = None, metrics: bool = True) -> ResultsTable:
    """The results table of the models whose caches are given (docs/conventions.md#v-1-table).

    Parameters
    ----------
    caches : iterable of path
        Cache files or folders (:func:`uqvision.cache.find_caches`); unfinished or foreign
        files are skipped with a :class:`~uqvision.exceptions.SkippedCacheWarning`.
    scores : xarray.Dataset, optional
        A selective score file (:func:`~uqvision.protocols.selective.score.score_selective`,
        dims (model, calibration)). Its rows whose cache is among ``caches`` are the table's
        rows, and ``auroc``, ``ece``, ``aurc`` are its ``calibration = "none"`` values
        (equal to the file's, over its ``n_scored`` of ``none`` images: its held-out images
        by default, every image under ``none_samples="all"``; a file without that coord:
        its ``n_eval`` held-out images);
        ``top1``/``top5`` are computed from the same passes (its ``passes`` coord). A cache
        whose checksum the score file does not list (other logits than those scored) is
        refused.
    config : SelectiveConfig, optional
        Without ``scores``: the row kinds, MC-dropout passes and dataset of the selective
        protocol (default ``SelectiveConfig()``: both row kinds, 30 passes, the one dataset
        of the caches); the metrics are then computed on every image of the cache.
    metrics : bool, default True
        False: only ``top1``/``top5`` are computed (from each model and mode's pass-0 cache,
        :func:`uqmetrics.metrics.classification.top_k_accuracy_score`; NaN without labels), the
        selective metrics are NaN and no scoring code (scipy, the selective scorer) is
        imported; one row per model and prediction mode (``<model>+<mode>`` for modes other
        than plain), as ``uqvision predict`` prints.

    Returns
    -------
    ResultsTable
        Rows (one per model and row kind) sorted by ``top1`` descending.

    Raises
    ------
    ValueError
        No cache to tabulate; an MC-dropout cache with fewer passes than the row needs; a cache
        the score file did not score.

    Notes
    -----
    Every metric goes through :func:`uqmetrics.score_metrics` on ``p = softmax(z)`` with ``z``
    the row's log predictive distribution (:func:`~uqvision.protocols.selective.score.
    predictive_log_probs`, shape (sample, class)), as the selective scorer's ``none`` row:
    ``top1 = 100 · accuracy``, ``top5 = 100 · top5_accuracy``; without ``scores`` also
    ``auroc``, ``aurc`` and ``ece`` (κ the row kind's confidence).
    """
    if not metrics:
        rows = _cost_rows(caches)
        if not rows:
            raise ValueError("no complete prediction cache found")
        return ResultsTable(_sorted(rows), "none")
    from uqmetrics import score_metrics, softmax  # scoring: imported on use

    from .protocols.selective.score import (
        ROW_KINDS,
        SelectiveConfig,
        _passes,
        predictive_log_probs,
    )

    config = config or SelectiveConfig()
    dataset = config.test if scores is None else str(scores.attrs["dataset_name"])
    infos = select_dataset(index_caches(caches), dataset)

    def cache_of(model: str, mode: str):
        return next((i for i in infos if i.model == model and i.mode == mode
                     and i.pass_index == 0), None)

    plan = []  # (row label, kind name, CacheInfo, passes)
    if scores is None:
        for model in sorted({i.model for i in infos}):
            for kname in config.kinds:
                kind = ROW_KINDS.lookup(kname)
                info = cache_of(model, kind.mode)
                if info is not None:
                    plan.append((model + kind.suffix, kname, info, _passes(info, kname, config)))
    else:
        for label, kname, base, passes in zip(
                scores["model"].values, scores["method"].values, scores["base_model"].values,
                scores["passes"].values, strict=True):
            info = cache_of(str(base), ROW_KINDS.lookup(str(kname)).mode)
            if info is not None:
                plan.append((str(label), str(kname), info, int(passes)))
        scored = set(json.loads(scores.attrs["caches"]).values())
        # the images behind the file's "none" row (its n_scored coord), or, in a file written
        # before that coord, its n_eval held-out images
        n_scored = (int(scores["n_scored"].sel(calibration="none")) if "n_scored" in
                    scores.coords else int(scores.attrs["n_eval"]))
    if not plan:
        raise ValueError("no plain or MC-dropout cache to tabulate"
                         + ("" if scores is None else " among the score file's rows"))
    rows = []
    for label, kname, info, passes in plan:
        kind = ROW_KINDS[kname]
        ds = read_cache(info.path)
        if scores is not None and ds.attrs["checksum"] not in scored:
            raise ValueError(f"cache {str(info.path)!r} is not one the score file scored (other "
                             "logits under the same name); score the caches again")
        logits, y = ds["logits"].values, ds["label"].values
        p = softmax(predictive_log_probs(logits[:passes] if logits.ndim == 3 else logits))
        names = ("accuracy", "top5_accuracy") if scores is not None else (
            "accuracy", "top5_accuracy",
            *(m for m in _FROM_SCORES if m not in kind.skip))
        got = score_metrics(y, p, metrics=names, confidence=kind.confidence)
        values = {"top1": 100 * got["accuracy"], "top5": 100 * got["top5_accuracy"]}
        if scores is None:
            values.update({m: got.get(m, math.nan) for m in _FROM_SCORES},
                          n_scored=int(y.size))
        else:
            sel = scores.sel(model=label, calibration="none")
            values.update({m: float(sel[m]) for m in _FROM_SCORES}, n_scored=n_scored)
        rows.append(_row(label, **_cache_columns(ds.attrs, int(y.size)), **values))
    return ResultsTable(_sorted(rows), "caches" if scores is None else "scores")
