"""The URL transfer protocol (V.4): caches of (embedding, u) -> uqmetrics -> ``transfer.nc``.

Data layout (one code path for the stand-in and real folders):

- upstream: an ImageNet-style root with ``train/``, ``val/``, ``test/`` class folders;
- each downstream dataset: a root with ``val/`` and ``test/`` class folders (classes never
  seen upstream; zero-shot);
- optionally the soft-label set: an image folder and its label distributions (the
  ``hierarchy`` set's ``mixed`` images; CIFAR-10H on real data).

:func:`hierarchy_layout` writes this layout for the generated ``hierarchy`` set as symlinks
(upstream = the first half of the superclasses, one root per downstream group). The caches —
one per (run, dataset, split, mode) with ``embedding``, ``uncertainty`` and, for ``crop``,
``crop_fraction`` — come from the one prediction path, :func:`uqvision.predict.predict`
(``PredictConfig(embeddings=True, logits=False)``, modes ``plain`` and ``crop``), which asks a
trained :class:`~uqvision.protocols.url.heads.URLModel` for ``(logits, u, embedding)``; this module never
runs a model. :func:`score_transfer` reads the caches
and calls uqmetrics' retrieval and OOD metrics only; it selects, per method, the
configuration with the best validation R-AUROC among those with validation R@1 >= 0.1 (the
paper's rule) and adds a constant-u control row.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xarray as xr
from uqmetrics import (
    crop_consistency_score,
    ood_auroc_score,
    provenance_attrs,
    r_auroc_score,
    recall_at_1_score,
)
from uqmetrics.exceptions import UndefinedMetricWarning
from uqmetrics.retrieval import human_alignment_score

from ...cache import index_caches, read_cache
from ...data import ImageFolderDataset
from ...hierarchy import MIXED, read_hierarchy

__all__ = [
    "CONSTANT_U",
    "TransferLayout",
    "hierarchy_layout",
    "read_soft_labels",
    "score_transfer",
    "score_transfer_caches",
    "select_configs",
]

#: Name of the control row: the CE run's embeddings with a constant u (R-AUROC exactly 0.5).
CONSTANT_U = "constant_u"
#: The paper's filter: configurations with a validation R@1 below this are not selected.
MIN_RECALL = 0.1


@dataclass(frozen=True)
class TransferLayout:
    """Where the data of a transfer run live (see the module docstring)."""

    upstream: Path
    downstream: dict[str, Path]
    mixed: Path | None = None
    soft_labels: np.ndarray | None = None
    soft_labels_root: Path | None = None


def _link_tree(src: Path, dst: Path, classes: Sequence[str]) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for c in classes:
        link = dst / c
        if not link.exists():
            os.symlink((src / c).resolve(), link, target_is_directory=True)


def hierarchy_layout(root: str | os.PathLike, out: str | os.PathLike) -> TransferLayout:
    """Symlink views of a ``hierarchy`` folder: ``out/upstream/{train,val,test}`` with the
    upstream classes and ``out/<group>/{val,test}`` per downstream group; the ``mixed`` set
    with its soft labels (:func:`read_soft_labels`)."""
    info = read_hierarchy(root)
    out = Path(out)
    for split in ("train", "val", "test"):
        _link_tree(info.splits[split], out / "upstream" / split, info.upstream_classes)
    down = {}
    for group, classes in info.downstream_groups.items():
        for split in ("val", "test"):
            _link_tree(info.splits[split], out / group / split, classes)
        down[group] = out / group
    return TransferLayout(out / "upstream", down, info.splits[MIXED], read_soft_labels(root),
                          Path(root))


def read_soft_labels(root: str | os.PathLike) -> np.ndarray:
    """Human label distributions of the ``mixed`` images, shape (n_mixed, n_classes), in the
    sample order of ``ImageFolderDataset(root/mixed)`` (the CIFAR-10H stand-in, V.0)."""
    info = read_hierarchy(root)
    folder = ImageFolderDataset(info.splits[MIXED])
    if list(folder.sample_ids) != list(info.mixed_files):
        raise ValueError("the mixed folder's images do not match its soft-label file")
    return info.soft_labels


# -- scoring -------------------------------------------------------------------------------
def _quiet(f, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        return f(*args)


def _run_metrics(c: Mapping[str, xr.Dataset], datasets: Sequence[str],
                 soft_labels: np.ndarray | None, constant: bool = False) -> dict:
    """Every metric of one run from its caches ``c[(dataset, split, mode)]``."""
    def u(ds):
        return np.zeros(ds.sizes["sample"]) if constant else ds["uncertainty"].values

    up = c[("upstream", "test", "plain")]
    res: dict = {"upstream_r_auroc": _quiet(r_auroc_score, up["embedding"].values,
                                            up["label"].values, u(up))}
    if ("mixed", "test", "plain") in c and soft_labels is not None:
        res["human_alignment"] = _quiet(human_alignment_score,
                                        u(c[("mixed", "test", "plain")]), soft_labels)
    else:
        res["human_alignment"] = np.nan
    for name in datasets:
        for split in ("val", "test"):
            ds = c[(name, split, "plain")]
            e, y = ds["embedding"].values, ds["label"].values
            pre = "" if split == "test" else "val_"
            res[(name, pre + "recall_at_1")] = recall_at_1_score(e, y)
            res[(name, pre + "r_auroc")] = _quiet(r_auroc_score, e, y, u(ds))
        test = c[(name, "test", "plain")]
        res[(name, "crop_consistency")] = crop_consistency_score(
            u(test), u(c[(name, "test", "crop")]))
        res[(name, "auroc")] = ood_auroc_score(u(up), u(test))
    return res


PER_DATASET = ("recall_at_1", "r_auroc", "crop_consistency", "auroc", "val_recall_at_1",
               "val_r_auroc")
PER_RUN = ("upstream_r_auroc", "human_alignment")


def select_configs(val_recall: xr.DataArray, val_r_auroc: xr.DataArray,
                   min_recall: float = MIN_RECALL) -> xr.DataArray:
    """Per method, the config with the best mean validation R-AUROC among configs whose mean
    validation R@1 is >= ``min_recall``; -1 where none qualifies.

    Parameters
    ----------
    val_recall, val_r_auroc : DataArray, dims (method, config, dataset, seed)

    Returns
    -------
    DataArray of int, dims (method,)
    """
    rec = val_recall.mean(("dataset", "seed"))
    score = val_r_auroc.mean(("dataset", "seed")).where(rec >= min_recall)
    best = score.fillna(-np.inf).argmax("config")
    return xr.where(score.notnull().any("config"), best, -1)


def score_transfer(runs: Mapping[tuple[str, int, int], Mapping], datasets: Sequence[str], *,
                   soft_labels: np.ndarray | None = None, control_from: str = "ce",
                   attrs: Mapping | None = None) -> xr.Dataset:
    """Score every run and select configurations: the ``transfer.nc`` Dataset.

    Parameters
    ----------
    runs : mapping
        ``(method, config, seed) -> {(dataset, split, mode): cache path or Dataset}`` with
        ``("upstream", "test", "plain")``, ``(name, "val"|"test", "plain")``,
        ``(name, "test", "crop")`` for each downstream ``name`` and optionally
        ``("mixed", "test", "plain")``.
    datasets : sequence of str
        Downstream dataset names.
    soft_labels : ndarray, shape (n_mixed, n_classes), optional
    control_from : str
        Method whose selected runs' embeddings give the constant-u control row.

    Returns
    -------
    xarray.Dataset
        ``all_<metric>`` over (method, config, dataset, seed) for every run; the selected
        configuration's ``recall_at_1``, ``r_auroc``, ``crop_consistency``, ``auroc`` (OOD:
        upstream test vs downstream test) over (method, dataset, seed), ``upstream_r_auroc``
        and ``human_alignment`` over (method, seed), ``selected_config`` (method), and
        ``<metric>_mean`` averaged over seeds (and datasets). The control row
        ``constant_u`` is last.
    """
    methods = list(dict.fromkeys(k[0] for k in runs))
    configs = sorted({k[1] for k in runs})
    seeds = sorted({k[2] for k in runs})
    shape = (len(methods), len(configs), len(datasets), len(seeds))
    per_ds = {m: np.full(shape, np.nan) for m in PER_DATASET}
    per_run = {m: np.full((shape[0], shape[1], shape[3]), np.nan) for m in PER_RUN}
    loaded: dict = {}

    def load(key):
        return {k: (v if isinstance(v, xr.Dataset) else read_cache(v))
                for k, v in runs[key].items()}

    for key in runs:
        m, c, s = key
        i, j, k = methods.index(m), configs.index(c), seeds.index(s)
        loaded[key] = caches = load(key)
        res = _run_metrics(caches, datasets, soft_labels)
        for name in PER_RUN:
            per_run[name][i, j, k] = res[name]
        for d, name in enumerate(datasets):
            for metric in PER_DATASET:
                per_ds[metric][i, j, d, k] = res[(name, metric)]
    coords = {"method": methods, "config": configs, "dataset": list(datasets), "seed": seeds}
    full = xr.Dataset(
        {**{f"all_{m}": (("method", "config", "dataset", "seed"), v) for m, v in per_ds.items()},
         **{f"all_{m}": (("method", "config", "seed"), v) for m, v in per_run.items()}},
        coords=coords)
    sel = select_configs(full["all_val_recall_at_1"], full["all_val_r_auroc"]).values
    control: dict = {}
    ci = methods.index(control_from) if control_from in methods else -1
    if ci >= 0 and sel[ci] >= 0:
        for k, s in enumerate(seeds):
            key = (control_from, configs[sel[ci]], s)
            if key in loaded:
                control[k] = _run_metrics(loaded[key], datasets, soft_labels, constant=True)
    out = xr.Dataset(coords={"method": [*methods, CONSTANT_U], "dataset": list(datasets),
                             "seed": seeds})
    for metric in (*PER_DATASET, *PER_RUN):
        src = full[f"all_{metric}"].values  # (method, config[, dataset], seed)
        rows = np.full((len(methods) + 1, *src.shape[2:]), np.nan)
        for i in range(len(methods)):
            if sel[i] >= 0:
                rows[i] = src[i, sel[i]]
        for k, res in control.items():
            if metric in PER_RUN:
                rows[-1, k] = res[metric]
            else:
                rows[-1, :, k] = [res[(d, metric)] for d in datasets]
        dims = ("method", "seed") if metric in PER_RUN else ("method", "dataset", "seed")
        out[metric] = (dims, rows)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out[f"{metric}_mean"] = out[metric].mean(dims[1:])
    out["selected_config"] = ("method", np.array([*sel, -1], dtype=np.int64))
    for name in full.data_vars:
        out[name] = full[name]
    out.attrs = provenance_attrs(extra={
        "protocol": "transfer (URL, docs/conventions.md#v-4)",
        "selection": f"per method: best mean validation r_auroc among configs with mean "
                     f"validation recall_at_1 >= {MIN_RECALL}",
        "conventions": "S.5: cosine R@1 excluding the query; R-AUROC positives = wrong "
                       "neighbour; crop consistency = mean(u_crop > u_full), crops in [0.1, "
                       "0.75] of the short side; OOD auroc = S.4 with downstream positive",
        **dict(attrs or {})})
    return out


def score_transfer_caches(paths: Sequence[str | os.PathLike]) -> xr.Dataset:
    """:func:`score_transfer` over the cache files or folders ``paths`` written by
    ``uqvision reproduce url`` (runs and datasets read from the caches' attrs; soft labels
    from the ``soft_labels_root`` attr of the ``mixed`` caches)."""
    runs: dict = {}
    soft_root = None
    for info in index_caches(paths):
        with xr.open_dataset(info.path) as ds:
            a = dict(ds.attrs)
        if "run_seed" not in a:  # not a transfer cache
            continue
        name, _, split = str(a["dataset_name"]).rpartition("-")
        key = (str(a["method"]), int(a["config"]), int(a["run_seed"]))
        runs.setdefault(key, {})[(name, split, str(a["mode"]))] = info.path
        soft_root = a.get("soft_labels_root") or soft_root
    if not runs:
        raise ValueError("no transfer caches (written by uqvision reproduce url) found")
    datasets = sorted({k[0] for r in runs.values() for k in r} - {"upstream", "mixed"})
    soft = read_soft_labels(soft_root) if soft_root else None
    return score_transfer(runs, datasets, soft_labels=soft)
