"""Ensembles protocol (docs/conventions.md#v-2): metrics vs number of samples and the Deep Ensemble
Equivalent of every method, from cached predictions.

Caches are grouped by what they are, never by where they lie: a cache's ``method`` attr (the
training method of its run, written by ``uqvision predict`` from the checkpoint's sidecar)
decides its group, its ``mode`` whether the group is plain (centre crop) or TTA. A group is a
list of members, each with one or more draws:

- ``<method>``: the plain caches of that method, one member per (run, sample) in that order:
  deep-ensemble members (one run per seed), snapshots, posterior draws, stochastic passes; a
  pass-dim MC-dropout cache (``mode=mc_dropout``) gives one member per pass;
- ``<method>_tta``: the TTA caches of the same members, each member's TTA passes being its
  draws: order ``o`` of the size curve applies every member to its draw ``o mod n_draws``
  (one random augmentation per member and order; Pitfalls Fig. 4);
- ``single_tta``: the first deep-ensemble member under each of its augmentations.

Caches without a ``method`` (networks uqvision did not train) join no group unless
``EnsembleConfig.members`` names them as the deep ensemble. The group builders are the
entries of :data:`ENSEMBLE_METHODS` (two per method of
:data:`uqvision.methods.GENERAL_METHODS` — the Pitfalls methods, not the learners other
protocols register — and ``single_tta``).

Every group is scored by ``uqmetrics.ensemble_size_curve`` (the one scoring path: metrics of
every prefix ensemble over ``n_orders`` member orders, CLL and calibrated Brier by ``test_cv``,
each order with its own test-CV halves); ``uqmetrics.deep_ensemble_equivalent_curve`` maps
each group's mean curve onto the deep ensemble's (bounds: the deep ensemble's mean ∓ sample
std over orders, docs/conventions.md#s-3), on the CLL and on the other metrics of
:data:`DEE_METRICS`, against the plain deep ensemble and, for TTA groups, also against the
deep ensemble with TTA (the paper's table).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
import xarray as xr
from uqmetrics import (
    DEE_BOUNDS_CONVENTION,
    InputError,
    deep_ensemble_equivalent_curve,
    ensemble_size_curve,
    log_softmax,
    stamp_result,
)
from uqmetrics.metrics.registry import Registry

from ... import catalog
from ...cache import CacheError, CacheInfo, check_aligned, index_caches, read_cache, select_dataset
from ...methods import GENERAL_METHODS
from ...predictors import set_roles
from ...provenance import entry_provenance

__all__ = [
    "CURVE_METRICS",
    "DEE_METRICS",
    "DERIVED_METRICS",
    "ENSEMBLE_METHODS",
    "PREFIX_METRICS",
    "EnsembleConfig",
    "Group",
    "Source",
    "load_group",
    "load_sources",
    "score_ensembles",
]

#: Classification metrics of every prefix ensemble (plus ``cll`` and ``calibrated_brier``).
CURVE_METRICS = ("accuracy", "nll", "brier", "ece")
#: Selective metrics (correct, κ) of the same prefixes, κ = ``EnsembleConfig.confidence``.
PREFIX_METRICS = ("auroc", "aurc", "eaurc")
#: Metrics reported after ``test_cv`` temperature scaling besides the CLL.
CALIBRATED_METRICS = ("brier",)
#: Metrics the DEE is computed on: the CLL (the paper's DEE) and the other metrics of its
#: appendix C figures (defined the same way; the direction is each metric's own).
DEE_METRICS = ("cll", "accuracy", "calibrated_brier", "nll")
#: The metric variables of ``ensembles.nc`` that uqmetrics does not register, with their
#: metric tag (:func:`uqmetrics.tag_metric`): the CLL, the Brier score after temperature
#: scaling (values of the registered ``brier``) and the DEE with its bounds (a method that
#: matches a larger deep ensemble is better); the curve metrics are tagged by their own names.
DERIVED_METRICS: dict[str, tuple[str, bool] | str] = {
    "cll": ("cll", True), "calibrated_brier": "brier",
    **{f"{head}{bound}": ("dee", True) for head in ("dee", "equivalent")
       for bound in ("", "_lower", "_upper")}}
_TTA = "_tta"


@dataclass(frozen=True)
class Source:
    """One sample set: a cache file, and the pass inside it for an MC-dropout cache."""

    path: str
    pass_in_file: int | None = None


@dataclass
class Group:
    """One scored method: ``members[j]`` are member ``j``'s draws (one per augmentation for a
    TTA group), all over the same test order."""

    members: list[list[Source]]
    training_method: str = ""
    tta: bool = False
    runs: list[str] | None = None

    @property
    def ordered(self) -> bool:
        """Members are snapshots of a trajectory (SSE, FGE, cSGLD: the training method
        samples :func:`~uqvision.training.method.snapshot_samples`), not exchangeable: its
        size-``k`` ensemble is the first ``k`` snapshots of a run, in training order."""
        from ...training.method import TRAINING_METHODS, snapshot_samples  # torch: on use

        if not self.training_method or self.training_method not in TRAINING_METHODS.names():
            return False
        return TRAINING_METHODS.lookup(self.training_method).samples is snapshot_samples

    @property
    def n_draws(self) -> int:
        return min(len(m) for m in self.members)


#: Group builders: name -> builder(cache infos of one dataset, members or None) -> Group or
#: None (None: the caches it needs are absent; the group is left out).
ENSEMBLE_METHODS: Registry[Callable[[list[CacheInfo], list[str] | None], Group | None]] = \
    Registry("ensemble method")


#: The roles of a set :func:`score_ensembles` scores (docs/conventions.md#v-sets-roles): never
#: ``fit`` (training images) nor an OOD set.
_SCORED_ROLES = ("test", "calibration", "shift")


def _members_of(infos: list[CacheInfo], method: str, mode: str,
                members: list[str] | None) -> dict[tuple[str, int], list[CacheInfo]]:
    """(run, sample) -> that member's caches in ``mode``, sorted by pass; ``members`` (model
    names) replaces the ``method`` attr as the selection."""
    if members is not None:
        hits = [i for i in infos if i.mode == mode and i.model in members]
        key = {m: (f"{j:06d}", 0) for j, m in enumerate(members)}
        out: dict[tuple[str, int], list[CacheInfo]] = {}
        for i in hits:
            out.setdefault(key[i.model], []).append(i)
    else:
        out = {}
        for i in infos:
            if i.method == method and i.mode == mode:
                out.setdefault((i.run, i.sample_index), []).append(i)
    return {k: sorted(v, key=lambda i: i.pass_index) for k, v in sorted(out.items())}


def _method_builder(method: str, tta: bool):
    def build(infos: list[CacheInfo], members: list[str] | None) -> Group | None:
        chosen = members if method == "deep_ensemble" else None
        found = _members_of(infos, method, "tta" if tta else "plain", chosen)
        if chosen is not None and not tta and len(found) != len(chosen):
            raise ValueError(f"no plain cache for members "
                             f"{[m for j, m in enumerate(chosen) if (f'{j:06d}', 0) not in found]}")
        if found:
            draws = [[Source(str(i.path)) for i in caches] for caches in found.values()]
            return Group(draws if tta else [d[:1] for d in draws], method, tta,
                         [run for run, _ in found])
        if tta or chosen is not None:
            return None
        passes = sorted((i for i in infos if i.method == method and i.mode == "mc_dropout"),
                        key=lambda i: i.run)
        if not passes:
            return None
        return Group([[Source(str(passes[0].path), p)] for p in range(passes[0].n_passes)],
                     method)

    build.__doc__ = (f"{method} members{' under TTA (draw o of every member in order o)' if tta else ''}"
                     f": {catalog.BUILT_IN['training method'][method]}")
    return build


for _name in GENERAL_METHODS:  # the Pitfalls methods, not other protocols' learners
    ENSEMBLE_METHODS.add(_name, _method_builder(_name, False))
    ENSEMBLE_METHODS.add(_name + _TTA, _method_builder(_name, True))
del _name


@ENSEMBLE_METHODS.register(name="single_tta")
def _single_tta(infos: list[CacheInfo], members: list[str] | None) -> Group | None:
    """The first deep-ensemble member under each of its augmentations (TTA of one model)."""
    group = ENSEMBLE_METHODS["deep_ensemble" + _TTA](infos, members)
    if group is None or len(group.members[0]) < 2:
        return None
    return Group([[s] for s in group.members[0]], "deep_ensemble", True)


@dataclass
class EnsembleConfig:
    """Options of :func:`score_ensembles`.

    ``members``: model names (cache ``model`` attrs) of the deep ensemble in order, whatever
    their ``method`` attr (default: the caches whose method is ``deep_ensemble``).
    ``methods``: group names to score (default: every group with caches). ``reference``: the
    method DEE is measured against (its TTA group, if present, is the reference of the TTA
    groups too). ``dee_metrics``: the metrics the DEE is computed on.
    """

    members: list[str] | None = None
    methods: tuple[str, ...] | None = None
    reference: str = "deep_ensemble"
    n_orders: int = 5
    n_repeats: int = 5
    seed: int = 0
    dataset: str | None = None
    confidence: str = "softmax_response"
    dee_metrics: tuple[str, ...] = DEE_METRICS
    extra_methods: dict[str, list[Source]] = field(default_factory=dict)


def load_sources(sources: Sequence[Source]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Member log-probabilities (member, sample, class), labels (sample,), cache checksums.

    All sources must share classes, sample order and labels (:class:`CacheError` otherwise,
    before any metric is computed).
    """
    caches, checks = {}, []
    for s in sources:
        if s.path not in caches:
            caches[s.path] = read_cache(s.path)
            checks.append(caches[s.path].attrs["checksum"])
    uniq = list(caches.values())
    check_aligned(uniq, [os.path.basename(p) for p in caches])
    lps = []
    for s in sources:
        z = caches[s.path]["logits"].values
        if s.pass_in_file is not None:
            if z.ndim != 3:
                raise CacheError(f"{s.path} has no pass dim")
            z = z[s.pass_in_file]
        elif z.ndim != 2:
            raise CacheError(f"{s.path} has several passes; name one (Source.pass_in_file)")
        lps.append(log_softmax(z))
    return np.stack(lps), uniq[0]["label"].values, checks


def load_group(group: Group) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """A group's log-probabilities (draw, member, sample, class) — the first ``n_draws`` draws
    of every member —, labels (sample,) and cache checksums."""
    d = group.n_draws
    flat = [m[j] for j in range(d) for m in group.members]
    lp, y, checks = load_sources(flat)
    return lp.reshape(d, len(group.members), *lp.shape[1:]), y, checks


def _curve(lp: np.ndarray, y: np.ndarray, config: EnsembleConfig,
           group: Group | None = None) -> xr.Dataset:
    """The size curve of one group: random member orders (order 0: the identity) for
    exchangeable members; for snapshot methods (:attr:`Group.ordered`) every order is the
    training order of one run (order ``o``: run ``o mod n_runs``, draw ``o mod n_draws``,
    ``test_cv`` seed ``seed + o``), sizes up to the shortest run's snapshot count."""
    kw = {"metrics": CURVE_METRICS + PREFIX_METRICS, "confidence": config.confidence,
              "calibrated": True, "n_repeats": config.n_repeats,
              "calibrated_metrics": CALIBRATED_METRICS}
    if group is None or not group.ordered:
        curve = ensemble_size_curve(lp, y, n_orders=config.n_orders, seed=config.seed, **kw)
        return curve.drop_vars(["member_order", "position", "split_seed", "draw"])
    runs = group.runs or [""] * lp.shape[1]
    by_run: dict[str, list[int]] = {}
    for j, run in enumerate(runs):
        by_run.setdefault(run, []).append(j)
    members = list(by_run.values())
    k = min(len(m) for m in members)
    curves = [ensemble_size_curve(
        lp[o % lp.shape[0]][None][:, members[o % len(members)][:k]], y, n_orders=1,
        seed=config.seed + o, **kw).isel(order=0, drop=True)
        for o in range(config.n_orders)]
    curve = xr.concat(curves, dim=pd.Index(range(config.n_orders), name="order"),
                      combine_attrs="drop_conflicts")
    return curve.drop_vars(["member_order", "position", "split_seed", "draw"],
                           errors="ignore")


def _groups(infos: list[CacheInfo], config: EnsembleConfig) -> dict[str, Group]:
    names = ENSEMBLE_METHODS.names() if config.methods is None else list(config.methods)
    for n in names:
        ENSEMBLE_METHODS.lookup(n)
    wanted = set(names) | {config.reference, config.reference + _TTA}
    groups = {}
    for n in ENSEMBLE_METHODS.names():
        if n in wanted:
            g = ENSEMBLE_METHODS[n](infos, config.members)
            if g is not None:
                groups[n] = g
    groups.update({m: Group([[s] for s in v], m) for m, v in config.extra_methods.items()})
    return {n: g for n, g in groups.items()
            if n in names or n in config.extra_methods or n.startswith(config.reference)}


def score_ensembles(caches: Iterable[str | os.PathLike],
                    config: EnsembleConfig | None = None) -> xr.Dataset:
    """Metrics vs number of samples for every method with caches, and each method's DEE.

    Parameters
    ----------
    caches : iterable of path
        Cache files or directories of one dataset.
    config : EnsembleConfig

    Returns
    -------
    xarray.Dataset
        ``accuracy``, ``nll``, ``brier``, ``ece``, ``cll`` (calibrated log-likelihood,
        ``test_cv``; higher is better), ``calibrated_brier``, ``auroc``, ``aurc``, ``eaurc``
        over (method, order, size) — NaN beyond a method's own size. ``equivalent``,
        ``equivalent_lower``, ``equivalent_upper``, ``equivalent_capped`` over (reference,
        dee_metric, method, size): the DEE of each method's mean curve on each metric of
        ``dee_metrics`` against the plain deep ensemble and the deep ensemble with TTA (NaN
        for a plain method against the TTA reference); ``dee``, ``dee_lower``, ``dee_upper``,
        ``dee_capped`` (method, size): the headline, CLL against the plain deep ensemble.
        ``n_members``, ``n_draws`` and coords ``training_method``, ``tta`` over method.
        The metric variables carry the result-file schema's tag (``metric``,
        ``greater_is_better``; :data:`DERIVED_METRICS`). Attrs: the schema's (``protocol =
        "pitfalls"``, ``conventions``, ``input_checksums``: the checksums of the scored caches;
        :func:`uqmetrics.stamp_result`), provenance, the sources of every method, the DEE caps
        (``dee_cap``, ``dee_cap_tta``), the bounds' convention, ``caches`` and ``entries``
        (each method's caches and their provenance, :mod:`uqvision.provenance`). Select a
        method with ``ds.sel({"method": "deep_ensemble"})`` (``method=`` is a keyword of
        ``sel`` itself).

    Raises
    ------
    ValueError
        No deep-ensemble caches, unknown methods, or caches that do not align; caches of one
        dataset that record two roles (naming both files), or a scored dataset of role
        ``fit``, ``ood-near``, ``ood-far`` or ``ood-val`` (naming it, its role and a cache
        file): training images and OOD sets are never scored (:class:`uqmetrics.InputError`).

    References
    ----------
    Ashukha, Lyzhov, Molchanov, Vetrov. Pitfalls of in-domain uncertainty estimation and
    ensembling in deep learning. ICLR 2020.
    """
    config = config or EnsembleConfig()
    for m in config.dee_metrics:
        if m not in CURVE_METRICS + PREFIX_METRICS + ("cll",) + tuple(
                f"calibrated_{c}" for c in CALIBRATED_METRICS):
            raise ValueError(f"dee_metrics: {m!r} is not a curve metric")
    infos = index_caches(caches)
    roles = set_roles(infos)  # caches of one dataset that record two roles: refused
    infos = select_dataset(infos, config.dataset)
    role = roles[infos[0].dataset_name]["set_role"]
    if role not in _SCORED_ROLES:
        raise InputError(f"dataset {infos[0].dataset_name!r} (--dataset) has role {role!r} "
                         f"(cache {str(infos[0].path)!r}), never scored by pitfalls (a scored "
                         f"set has role {' or '.join(map(repr, _SCORED_ROLES))}: training "
                         "images and OOD sets are never scored); name another set (--dataset "
                         "NAME)")
    groups = _groups(infos, config)
    if config.reference not in groups:
        raise ValueError(f"reference method {config.reference!r} has no caches (caches carry "
                         "their training method in the attr 'method'; name untagged models "
                         "with members)")
    # load each group once, check every group against the reference's samples and labels
    curves, meta, ref_y = {}, {}, None
    for name in sorted(groups, key=lambda n: n != config.reference):
        lp, y, checks = load_group(groups[name])
        if ref_y is None:
            ref_y = y
        elif y.shape != ref_y.shape or not np.array_equal(y, ref_y):
            raise CacheError(f"method {name!r} has a different sample order or labels than "
                             f"{config.reference!r}")
        curves[name] = _curve(lp, y, config, groups[name])
        meta[name] = (lp.shape[1], lp.shape[0], checks)
    order = [n for n in groups if n in curves]
    ds = xr.concat([curves[n] for n in order], dim=pd.Index(order, name="method"),
                   join="outer", combine_attrs="drop_conflicts")
    ds = ds.assign(n_members=("method", [meta[n][0] for n in order]),
                   n_draws=("method", [meta[n][1] for n in order]))
    ds = ds.assign_coords(training_method=("method", [groups[n].training_method for n in order]),
                          tta=("method", [groups[n].tta for n in order]))
    ds = _add_dee(ds, groups, config)
    cfg = asdict(config)
    cfg["extra_methods"] = {m: [asdict(s) for s in v] for m, v in config.extra_methods.items()}
    extra = {"calibration_protocol": "test_cv",
             "reference": config.reference, "members": json.dumps(config.members or []),
             "dataset_name": infos[0].dataset_name, "dee_bounds": DEE_BOUNDS_CONVENTION,
             "sources": json.dumps({n: [[asdict(s) for s in m] for m in groups[n].members]
                                    for n in order}),
             **{k: v for k, v in ds.attrs.items() if k.startswith("dee_cap")},
             **entry_provenance({n: list(dict.fromkeys(s.path for m in groups[n].members
                                                       for s in m)) for n in order}, "method")}
    metrics = {**{m: m for m in CURVE_METRICS + PREFIX_METRICS}, **DERIVED_METRICS}
    return stamp_result(ds, "pitfalls",
                        input_checksums=[c for _, _, cs in meta.values() for c in cs],
                        metrics={v: m for v, m in metrics.items() if v in ds.data_vars},
                        config=cfg, seed=config.seed, extra=extra)


def _add_dee(ds: xr.Dataset, groups: dict[str, Group], config: EnsembleConfig) -> xr.Dataset:
    refs = [r for r in (config.reference, config.reference + _TTA) if r in ds["method"].values]
    methods, sizes = list(ds["method"].values), ds.sizes["size"]
    shape = (len(refs), len(config.dee_metrics), len(methods), sizes)
    values = {k: np.full(shape, np.nan) for k in ("dee", "lower", "upper", "capped")}
    caps = {}
    for a, ref in enumerate(refs):
        for b, metric in enumerate(config.dee_metrics):
            de = ds[metric].sel({"method": ref}).values
            better = bool(ds[metric].attrs.get("greater_is_better", 1))
            for c, m in enumerate(methods):
                if ref.endswith(_TTA) and not groups[m].tta:
                    continue
                r = deep_ensemble_equivalent_curve(ds[metric].sel({"method": m}).values, de,
                                                   greater_is_better=better)
                k = len(r.dee)
                values["dee"][a, b, c, :k], values["lower"][a, b, c, :k] = r.dee, r.lower
                values["upper"][a, b, c, :k] = r.upper
                values["capped"][a, b, c, :k] = r.capped
                caps[ref] = r.cap
    dims = ("reference", "dee_metric", "method", "size")
    ds = ds.assign_coords(reference=refs, dee_metric=list(config.dee_metrics))
    ds["equivalent"] = (dims, values["dee"])
    for k in ("lower", "upper", "capped"):
        ds[f"equivalent_{k}"] = (dims, values[k])
    head = {"reference": config.reference, "dee_metric": "cll"}
    if "cll" in config.dee_metrics:
        ds["dee"] = ds["equivalent"].sel(head, drop=True)
        for k in ("lower", "upper", "capped"):
            ds[f"dee_{k}"] = ds[f"equivalent_{k}"].sel(head, drop=True)
    ds.attrs["dee_cap"] = caps.get(config.reference, np.nan)
    ds.attrs["dee_cap_tta"] = caps.get(config.reference + _TTA, np.nan)
    return ds
