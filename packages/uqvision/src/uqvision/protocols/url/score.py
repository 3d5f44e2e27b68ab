"""The URL transfer protocol (V.4): caches of (embedding, u) -> uqmetrics -> ``transfer.nc``.

Data layout (one code path for the stand-in and real folders):

- upstream: an ImageNet-style root with ``train/``, ``val/``, ``test/`` class folders;
- each downstream dataset: a root with ``val/`` and ``test/`` class folders (classes never
  seen upstream; zero-shot). Its classes are split into disjoint validation and test classes
  (:func:`split_classes`, seeded; Roth et al.'s protocol): validation classes are read from
  ``val/``, test classes from ``test/`` (:func:`split_downstream` writes these views), so
  selection never sees a test class;
- optionally the soft-label set: an image folder and its label distributions (the
  ``hierarchy`` set's ``mixed`` images; CIFAR-10H on real data).

:func:`hierarchy_layout` writes this layout for the generated ``hierarchy`` set as symlinks
(upstream = the first half of the superclasses, one root per downstream group). The caches —
one per (run, dataset, split, mode) with ``embedding``, ``uncertainty`` and, for ``crop``,
``crop_fraction`` — come from the one prediction path, :func:`uqvision.predict.predict`
(``PredictConfig(embeddings=True, logits=False)``, modes ``plain`` and ``crop``; ``crop`` on
the downstream and the upstream test sets), which asks a
trained :class:`~uqvision.methods.uncertainty_heads.URLModel` for ``(logits, u, embedding)``; this module never
runs a model. :func:`score_transfer` reads the caches
and calls uqmetrics' retrieval and OOD metrics only; it selects, per method, the
configuration with the best validation R-AUROC among those with validation R@1 >= 0.1 (the
paper's rule) and adds a constant-u control row. :func:`rank_correlations` tests the paper's
Fig. 4: whether upstream quantities (the upstream crop consistency, the upstream R-AUROC) rank
the runs as their downstream test R-AUROC does.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import xarray as xr
from scipy.stats import spearmanr
from uqmetrics import (
    crop_consistency_score,
    input_checksum,
    ood_auroc_score,
    r_auroc_score,
    recall_at_1_score,
    stamp_result,
)
from uqmetrics.metrics.exceptions import UndefinedMetricWarning
from uqmetrics.metrics.retrieval import human_alignment_score
from uqmetrics.runs.io import open_netcdf

from ...cache import index_caches, read_cache
from ...data import ImageFolderDataset, derive_seed
from ...hierarchy import MIXED, read_hierarchy
from ...provenance import cache_path, entry_provenance

__all__ = [
    "CONSTANT_U",
    "METRIC_TAGS",
    "TransferLayout",
    "hierarchy_layout",
    "rank_correlation",
    "rank_correlations",
    "read_soft_labels",
    "rescore_transfer",
    "score_transfer",
    "score_transfer_caches",
    "select_configs",
    "split_classes",
    "split_downstream",
]

#: Name of the control row: the CE run's embeddings with a constant u (R-AUROC exactly 0.5).
CONSTANT_U = "constant_u"
#: The paper's filter: configurations with a validation R@1 below this are not selected.
MIN_RECALL = 0.1
#: Key mixed into the class split's seed (keeps its stream apart from the other seeded draws).
SPLIT_KEY = 0x53504C  # "SPL"


@dataclass(frozen=True)
class TransferLayout:
    """Where the data of a transfer run live (see the module docstring)."""

    upstream: Path
    downstream: dict[str, Path]
    mixed: Path | None = None
    soft_labels: np.ndarray | None = None
    soft_labels_root: Path | None = None
    #: ``{dataset: {"val": [classes], "test": [classes]}}`` once :func:`split_downstream` ran
    class_split: dict | None = None


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


def _class_dirs(folder: Path) -> list[str]:
    return sorted(p.name for p in Path(folder).iterdir() if p.is_dir())


def split_classes(val_classes: Sequence[str], test_classes: Sequence[str],
                  seed: int) -> tuple[list[str], list[str]]:
    """Disjoint validation and test classes of one downstream dataset.

    The classes present in both splits are permuted by a generator seeded with
    ``derive_seed(seed, SPLIT_KEY)`` (in sorted order first, so the result depends only on the
    class names and the seed); the first half (rounded down) become validation classes, the
    rest test classes (Roth et al. 2020, the protocol URL follows: the classes are divided
    equally). Classes only in ``val_classes`` stay validation classes, classes only in
    ``test_classes`` stay test classes, so a dataset whose splits are already disjoint (the
    official CUB/CARS/SOP splits) is kept as given.

    Parameters
    ----------
    val_classes, test_classes : sequence of str
        The class folders of the dataset's ``val/`` and ``test/`` splits.
    seed : int

    Returns
    -------
    (list of str, list of str)
        The validation and the test classes, each sorted; disjoint, both non-empty.

    Examples
    --------
    >>> v, t = split_classes(list("abcdef"), list("abcdef"), seed=0)
    >>> len(v), len(t), set(v).isdisjoint(t), split_classes(list("abcdef"), list("abcdef"), 0) == (v, t)
    (3, 3, True, True)
    """
    val, test = set(val_classes), set(test_classes)
    shared = sorted(val & test)
    rng = np.random.default_rng(derive_seed(int(seed), SPLIT_KEY))
    order = [shared[i] for i in rng.permutation(len(shared))]
    half = len(shared) // 2
    v = sorted((val - test) | set(order[:half]))
    t = sorted((test - val) | set(order[half:]))
    if not v or not t:
        raise ValueError(f"cannot split the classes into non-empty validation and test classes "
                         f"(val/: {sorted(val)}, test/: {sorted(test)})")
    return v, t


def split_downstream(layout: TransferLayout, out: str | os.PathLike,
                     seed: int) -> TransferLayout:
    """The layout with each downstream dataset replaced by symlink views of its class split.

    ``out/<name>/val`` links the validation classes' folders of ``<root>/val``, ``out/<name>/
    test`` the test classes' folders of ``<root>/test`` (:func:`split_classes`); links of other
    classes left in ``out`` by an earlier split are removed. The split is recorded in the
    returned layout's ``class_split``.
    """
    out = Path(out)
    down, split = {}, {}
    for name, root in layout.downstream.items():
        val, test = split_classes(_class_dirs(root / "val"), _class_dirs(root / "test"), seed)
        for sp, classes in (("val", val), ("test", test)):
            view = out / name / sp
            if view.is_dir():
                for link in view.iterdir():
                    if link.is_symlink() and link.name not in classes:
                        link.unlink()
            _link_tree(root / sp, view, classes)
        down[name] = out / name
        split[name] = {"val": val, "test": test}
    return replace(layout, downstream=down, class_split=split)


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
    up_crop = c.get(("upstream", "test", "crop"))
    res["upstream_crop_consistency"] = (np.nan if up_crop is None else
                                        crop_consistency_score(u(up), u(up_crop)))
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
PER_RUN = ("upstream_r_auroc", "upstream_crop_consistency", "human_alignment")
#: The metric tag (:func:`uqmetrics.tag_metric`) of each quantity of :data:`PER_DATASET` and
#: :data:`PER_RUN`, on its variables ``<name>``, ``<name>_mean`` and ``all_<name>``: the
#: registered metric that computes it, or, for the crop consistency and the human alignment
#: (not registered; both better higher), the protocol's name.
METRIC_TAGS: dict[str, str | tuple[str, bool]] = {
    "recall_at_1": "recall_at_1", "r_auroc": "r_auroc",
    "crop_consistency": ("crop_consistency", True), "auroc": "ood_auroc",
    "val_recall_at_1": "recall_at_1", "val_r_auroc": "r_auroc", "upstream_r_auroc": "r_auroc",
    "upstream_crop_consistency": ("crop_consistency", True),
    "human_alignment": ("human_alignment", True)}
#: :func:`rank_correlations`: each run-level quantity against the downstream test R-AUROC.
RANK_CORRELATED = ("upstream_crop_consistency", "upstream_r_auroc", "crop_consistency",
                   "recall_at_1")


def rank_correlation(x, y) -> tuple[float, int]:
    """Spearman's rank correlation of the finite pairs of ``x`` and ``y`` and their number.

    Ties get average ranks. NaN (and the count) when fewer than 3 pairs are finite or either
    side is constant there.

    Examples
    --------
    >>> rho, n = rank_correlation([1, 2, 3, 4, 5], [2, 1, 4, 3, 5])  # 1 - 6 * 4 / (5 * 24)
    >>> round(rho, 12), n
    (0.8, 5)
    """
    x, y = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    ok = np.isfinite(x) & np.isfinite(y)
    n = int(ok.sum())
    if n < 3 or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
        return float("nan"), n
    return float(spearmanr(x[ok], y[ok]).statistic), n


def rank_correlations(ds: xr.Dataset) -> xr.Dataset:
    """The paper's Fig. 4 over every run: Spearman's rho of each :data:`RANK_CORRELATED`
    quantity with the downstream test R-AUROC (both averaged over the downstream datasets).

    The paper: upstream R-AUROC 0.09 (left: does not predict the downstream R-AUROC), upstream
    crop consistency 0.54 (right: does, so a model can be chosen from upstream data alone).

    Parameters
    ----------
    ds : xarray.Dataset
        With ``all_r_auroc`` (method, config, dataset, seed) and ``all_<name>`` of each
        :data:`RANK_CORRELATED` name, over (method, config[, dataset], seed); runs that were not
        made are NaN and left out.

    Returns
    -------
    xarray.Dataset
        ``rank_correlation`` and ``rank_correlation_n`` (the number of runs) over the
        coordinate ``quantity``.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # runs not made: all-NaN means
        target = ds["all_r_auroc"].mean("dataset")
        rho, n = [], []
        for name in RANK_CORRELATED:
            v = ds[f"all_{name}"]
            v = v.mean("dataset") if "dataset" in v.dims else v
            r, k = rank_correlation(*(a.values for a in xr.broadcast(v, target)))
            rho.append(r)
            n.append(k)
    return xr.Dataset({"rank_correlation": ("quantity", np.array(rho)),
                       "rank_correlation_n": ("quantity", np.array(n, dtype=np.int64))},
                      coords={"quantity": list(RANK_CORRELATED)},
                      attrs={"target": "downstream test r_auroc (mean over datasets)",
                             "method": "Spearman over every run (method x config x seed)"})


def select_configs(val_recall: xr.DataArray, val_r_auroc: xr.DataArray,
                   min_recall: float = MIN_RECALL) -> xr.DataArray:
    """Per method, the config with the best mean validation R-AUROC among configs whose mean
    validation R@1 is >= ``min_recall``; -1 where none qualifies.

    **Decision** (the paper's rule cannot rank them): where every qualifying config's
    validation R-AUROC is undefined (NaN: no retrieval error, or only one class, in every
    validation set; tiny stand-in scales), the qualifying config with the best mean
    validation R@1 (the first on ties).

    Parameters
    ----------
    val_recall, val_r_auroc : DataArray, dims (method, config, dataset, seed)
        Of the validation classes only (disjoint from the test classes).

    Returns
    -------
    DataArray of int, dims (method,)
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN means
        rec = val_recall.mean(("dataset", "seed"))
        ok = rec >= min_recall
        score = val_r_auroc.mean(("dataset", "seed")).where(ok)
    by_r_auroc = score.fillna(-np.inf).argmax("config")
    by_recall = rec.where(ok).fillna(-np.inf).argmax("config")
    best = xr.where(score.notnull().any("config"), by_r_auroc, by_recall)
    return xr.where(ok.any("config"), best, -1)


def _check_class_split(caches: Mapping, datasets: Sequence[str], seen: dict, key) -> None:
    """Record each dataset's validation and test classes (from the caches' ``class``
    coordinate) in ``seen``; refuse overlapping ones and runs that disagree."""
    for name in datasets:
        split = {sp: sorted(str(v) for v in caches[(name, sp, "plain")]["class"].values)
                 for sp in ("val", "test")}
        both = sorted(set(split["val"]) & set(split["test"]))
        if both:
            raise ValueError(f"run {key}: the validation caches of {name!r} hold test classes "
                             f"{both}; selection must not see the test classes (split the "
                             f"classes with split_downstream; caches written before the split "
                             f"need a fresh output directory)")
        if seen.setdefault(name, split) != split:
            raise ValueError(f"run {key}: the class split of {name!r} differs from the other "
                             f"runs' ({split} vs {seen[name]})")


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
        ``("upstream", "test", "crop")`` and ``("mixed", "test", "plain")``. The ``val``
        caches of a dataset must hold only its validation classes, disjoint from the classes
        of its ``test`` caches (:func:`split_downstream`): else a ValueError.
    datasets : sequence of str
        Downstream dataset names.
    soft_labels : ndarray, shape (n_mixed, n_classes), optional
    control_from : str
        Method whose selected runs' embeddings give the constant-u control row.
    attrs : mapping, optional
        Further attrs of the result (the driver's scale, architecture, ...).

    Returns
    -------
    xarray.Dataset
        ``all_<metric>`` over (method, config, dataset, seed) for every run; the selected
        configuration's ``recall_at_1``, ``r_auroc``, ``crop_consistency``, ``auroc`` (OOD:
        upstream test vs downstream test) over (method, dataset, seed), ``upstream_r_auroc``
        and ``human_alignment`` over (method, seed), ``selected_config`` (method), and
        ``<metric>_mean`` averaged over seeds (and datasets), ``upstream_crop_consistency``
        over (method, seed), :func:`rank_correlations` (``rank_correlation`` over
        ``quantity``). The control row ``constant_u`` is last. The metric variables carry the
        result-file schema's tag (:data:`METRIC_TAGS`), the attrs the schema's (``protocol =
        "url"``, ``conventions``, ``input_checksums``: of every cache scored;
        :func:`uqmetrics.stamp_result`) and ``notes``, the protocol's conventions in words;
        ``attrs`` are added (not the schema's). The attr ``class_split``
        (JSON) records each dataset's validation and test classes as read from the caches;
        ``config`` the datasets, ``control_from`` and every run's caches (what ``uqvision
        verify`` rescores from); ``caches`` and ``entries`` each method's caches and their
        provenance (:mod:`uqvision.provenance`).
    """
    methods = list(dict.fromkeys(k[0] for k in runs))
    configs = sorted({k[1] for k in runs})
    seeds = sorted({k[2] for k in runs})
    shape = (len(methods), len(configs), len(datasets), len(seeds))
    per_ds = {m: np.full(shape, np.nan) for m in PER_DATASET}
    per_run = {m: np.full((shape[0], shape[1], shape[3]), np.nan) for m in PER_RUN}
    loaded: dict = {}
    checksums: set[str] = set()  # of every cache scored

    def load(key):
        caches = {k: (v if isinstance(v, xr.Dataset) else read_cache(v))
                  for k, v in runs[key].items()}
        checksums.update(input_checksum(ds) for ds in caches.values())
        return caches

    class_split: dict = {}
    for key in runs:
        m, c, s = key
        i, j, k = methods.index(m), configs.index(c), seeds.index(s)
        loaded[key] = caches = load(key)
        _check_class_split(caches, datasets, class_split, key)
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
    out = out.merge(rank_correlations(full), combine_attrs="override")
    metrics = {f"{pre}{name}{post}": tag for name, tag in METRIC_TAGS.items()
               for pre, post in (("", ""), ("", "_mean"), ("all_", ""))}
    rows: dict[str, list] = {m: [] for m in methods}  # every run of a method, all configs
    for (m, _, _), caches in loaded.items():
        rows[m] += list(caches.values())
    if control:
        rows[CONSTANT_U] = [ds for k in control for ds in
                            loaded[(control_from, configs[sel[ci]], seeds[k])].values()]
    # what rescoring needs (uqvision verify): the runs' caches by key, the datasets, the control
    config = {"datasets": list(datasets), "control_from": control_from,
              "runs": [[m, c, s, [[d, sp, mode, cache_path(ds)] for (d, sp, mode), ds in
                                  loaded[(m, c, s)].items()]] for (m, c, s) in loaded]}
    return stamp_result(out, "url", input_checksums=checksums, metrics=metrics, config=config,
                        notes=(
        "URL transfer (docs/conventions.md#v-4): S.5: cosine R@1 excluding the query; R-AUROC "
        "positives = wrong neighbour; crop consistency = mean(u_crop > u_full), crops in "
        "[0.1, 0.75] of the short side; OOD auroc = S.4 with downstream positive"), extra={
        "selection": f"per method: best mean validation r_auroc among configs with mean "
                     f"validation recall_at_1 >= {MIN_RECALL}; validation classes disjoint "
                     f"from the test classes",
        "class_split": json.dumps(class_split, sort_keys=True),
        **entry_provenance(rows, "method"), **dict(attrs or {})})


def score_transfer_caches(paths: Sequence[str | os.PathLike]) -> xr.Dataset:
    """:func:`score_transfer` over the cache files or folders ``paths`` written by
    ``uqvision reproduce url`` (runs and datasets read from the caches' attrs; soft labels
    from the ``soft_labels_root`` attr of the ``mixed`` caches)."""
    runs: dict = {}
    soft_root = None
    for info in index_caches(paths):
        with open_netcdf(info.path) as ds:
            a = dict(ds.attrs)
        if "run_seed" not in a:  # not a transfer cache
            continue
        name, _, split = str(a["dataset_name"]).rpartition("-")
        # the run's configuration index (url_config; "config" in caches written before it
        # was named so, where it replaced the cache's own config: those lack an identity)
        key = (str(a["method"]), int(a.get("url_config", a.get("config"))), int(a["run_seed"]))
        runs.setdefault(key, {})[(name, split, str(a["mode"]))] = info.path
        soft_root = a.get("soft_labels_root") or soft_root
    if not runs:
        raise ValueError("no transfer caches (written by uqvision reproduce url) found")
    datasets = sorted({k[0] for r in runs.values() for k in r} - {"upstream", "mixed"})
    soft = read_soft_labels(soft_root) if soft_root else None
    return score_transfer(runs, datasets, soft_labels=soft)


def rescore_transfer(result: xr.Dataset) -> xr.Dataset:
    """A ``transfer.nc`` recomputed by :func:`score_transfer` from the runs' caches, datasets
    and control it records (attr ``config``), the soft labels read from the ``soft_labels_root``
    of its ``mixed`` caches, as :func:`score_transfer_caches` reads them (``uqvision
    verify``)."""
    from uqmetrics.runs.io import decode_attr

    cfg = decode_attr(result.attrs.get("config"))
    if not isinstance(cfg, dict) or "runs" not in cfg:
        raise ValueError("the result records no runs (attr 'config'): it was scored before "
                         "they were recorded; rescore it to verify it")
    runs, soft_root = {}, None
    for m, c, s, caches in cfg["runs"]:
        runs[(m, int(c), int(s))] = {(d, sp, mode): path for d, sp, mode, path in caches}
        for d, _, _, path in caches:
            if d == "mixed":
                with open_netcdf(path) as ds:
                    soft_root = ds.attrs.get("soft_labels_root") or soft_root
    soft = read_soft_labels(soft_root) if soft_root else None
    return score_transfer(runs, cfg["datasets"], soft_labels=soft,
                          control_from=cfg["control_from"])
