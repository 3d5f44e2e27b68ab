"""Ensembles protocol (PROTOCOLS.md V.2): metrics vs ensemble size and the Deep Ensemble
Equivalent, from cached member predictions.

A *method* is an ordered list of sample sets over the same test order — deep-ensemble members,
members each with its own random augmentation (TTA), TTA passes of one model, MC-dropout passes
— built from the cache index by a function in :data:`ENSEMBLE_METHODS`. For each method and
size ``s = 1..K`` over ``n_orders`` member orders, ``uqmetrics.ensemble_size_curve`` (the one
scoring path) gives the classification and selective metrics of every prefix ensemble and its
calibrated log-likelihood (``test_cv``). ``uqmetrics.deep_ensemble_equivalent`` then maps each
method's mean CLL onto the deep-ensemble curve.
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
    deep_ensemble_equivalent,
    ensemble_size_curve,
    log_softmax,
    provenance_attrs,
)
from uqmetrics.registry import Registry

from .cache import CacheError, CacheInfo, check_aligned, index_caches, read_cache, select_dataset

__all__ = [
    "CURVE_METRICS",
    "ENSEMBLE_METHODS",
    "PREFIX_METRICS",
    "EnsembleConfig",
    "Source",
    "load_sources",
    "score_ensembles",
]

#: Classification metrics of every prefix ensemble (plus ``cll``).
CURVE_METRICS = ("accuracy", "nll", "brier", "ece")
#: Selective metrics (correct, κ) of the same prefixes, κ = ``EnsembleConfig.confidence``.
PREFIX_METRICS = ("auroc", "aurc", "eaurc")


@dataclass(frozen=True)
class Source:
    """One sample set: a cache file, and the pass inside it for an MC-dropout cache."""

    path: str
    pass_in_file: int | None = None


#: Methods: name -> builder(cache infos of one dataset, member model names) -> sources or None
#: (None: the caches it needs are absent; the method is left out).
ENSEMBLE_METHODS: Registry[Callable[[list[CacheInfo], list[str]], list[Source] | None]] = \
    Registry("ensemble method")


def _find(infos, model, mode, pass_index):
    hits = [i for i in infos if i.model == model and i.mode == mode and i.pass_index == pass_index]
    return hits[0] if hits else None


@ENSEMBLE_METHODS.register(name="deep_ensemble")
def _deep_ensemble(infos: list[CacheInfo], members: list[str]) -> list[Source] | None:
    """Each member's plain (centre-crop) prediction."""
    found = [_find(infos, m, "plain", 0) for m in members]
    return None if None in found or not found else [Source(str(i.path)) for i in found]


@ENSEMBLE_METHODS.register(name="deep_ensemble_tta")
def _deep_ensemble_tta(infos, members):
    """Member ``k`` with its own random augmentation, TTA pass ``k`` (Pitfalls, Fig. 4)."""
    found = [_find(infos, m, "tta", k) for k, m in enumerate(members)]
    return None if None in found or not found else [Source(str(i.path)) for i in found]


@ENSEMBLE_METHODS.register(name="single_tta")
def _single_tta(infos, members):
    """The first member under every TTA pass it has (TTA of a single model)."""
    if not members:
        return None
    found = sorted((i for i in infos if i.model == members[0] and i.mode == "tta"),
                   key=lambda i: i.pass_index)
    return [Source(str(i.path)) for i in found] or None


@ENSEMBLE_METHODS.register(name="mc_dropout")
def _mc_dropout(infos, members):
    """The first member's MC-dropout passes."""
    if not members:
        return None
    hit = _find(infos, members[0], "mc_dropout", 0)
    return None if hit is None else [Source(str(hit.path), p) for p in range(hit.n_passes)]


@dataclass
class EnsembleConfig:
    """Options of :func:`score_ensembles`.

    ``members``: model names (cache ``model`` attrs) of the deep ensemble in order; default
    every model with a plain cache, sorted. ``reference``: the method DEE is measured against.
    """

    members: list[str] | None = None
    methods: tuple[str, ...] = tuple(ENSEMBLE_METHODS.names())
    reference: str = "deep_ensemble"
    n_orders: int = 5
    n_repeats: int = 5
    seed: int = 0
    dataset: str | None = None
    confidence: str = "softmax_response"
    extra_methods: dict[str, list[Source]] = field(default_factory=dict)


def load_sources(sources: Sequence[Source]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Member log-probabilities (member, sample, class), labels (sample,), cache checksums.

    All sources must share classes, sample order and labels (:class:`CacheError` otherwise,
    before any metric is computed).
    """
    caches, names, checks = {}, [], []
    for s in sources:
        if s.path not in caches:
            caches[s.path] = read_cache(s.path)
            checks.append(caches[s.path].attrs["checksum"])
        names.append(f"{caches[s.path].attrs.get('model')}:{os.path.basename(s.path)}")
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


def _method_curve(lp: np.ndarray, y: np.ndarray, config: EnsembleConfig) -> xr.Dataset:
    curve = ensemble_size_curve(lp, y, metrics=CURVE_METRICS + PREFIX_METRICS,
                                confidence=config.confidence, n_orders=config.n_orders,
                                seed=config.seed, calibrated=True, n_repeats=config.n_repeats)
    return curve.drop_vars(["member_order", "position"])


def score_ensembles(caches: Iterable[str | os.PathLike],
                    config: EnsembleConfig | None = None) -> xr.Dataset:
    """Metrics vs ensemble size for every available method, and each method's DEE.

    Parameters
    ----------
    caches : iterable of path
        Cache files or directories of one dataset.
    config : EnsembleConfig

    Returns
    -------
    xarray.Dataset
        ``accuracy``, ``nll``, ``brier``, ``ece``, ``cll`` (calibrated log-likelihood,
        ``test_cv``; higher is better), ``auroc``, ``aurc``, ``eaurc`` over
        (method, order, size) — NaN beyond a method's own size; ``dee``, ``dee_lower``,
        ``dee_upper``, ``dee_capped`` over (method, size): the deep-ensemble size whose mean CLL
        the method reaches with ``size`` samples (cap in attr ``dee_cap``); ``n_members``
        (method). Attrs: provenance, the sources of every method, the cache checksums.
        Select a method with ``ds.sel({"method": "deep_ensemble"})`` (``method=`` is a keyword
        of ``sel`` itself).

    Raises
    ------
    ValueError
        No deep-ensemble caches, unknown methods, or caches that do not align.

    References
    ----------
    Ashukha, Lyzhov, Molchanov, Vetrov. Pitfalls of in-domain uncertainty estimation and
    ensembling in deep learning. ICLR 2020.
    """
    config = config or EnsembleConfig()
    builders = {m: ENSEMBLE_METHODS.lookup(m) for m in config.methods}
    infos = select_dataset(index_caches(caches), config.dataset)
    members = config.members
    if members is None:
        members = sorted({i.model for i in infos if i.mode == "plain"})
    else:
        missing = [m for m in members if _find(infos, m, "plain", 0) is None]
        if missing:
            raise ValueError(f"no plain cache for members {missing}")
    sources = {m: build(infos, list(members)) for m, build in builders.items()}
    sources = {m: s for m, s in sources.items() if s}
    sources.update(config.extra_methods)
    if config.reference not in sources:
        raise ValueError(f"reference method {config.reference!r} has no caches "
                         f"(members: {members})")
    # load everything once and check alignment across methods before computing anything
    loaded = {m: load_sources(s) for m, s in sources.items()}
    ref_y = loaded[config.reference][1]
    for m, (_, y, _) in loaded.items():
        if y.shape != ref_y.shape or not np.array_equal(y, ref_y):
            raise CacheError(f"method {m!r} has a different sample order or labels than "
                             f"{config.reference!r}")
    curves = {m: _method_curve(lp, y, config) for m, (lp, y, _) in loaded.items()}
    ds = xr.concat(list(curves.values()), dim=pd.Index(list(curves), name="method"),
                   join="outer", combine_attrs="drop_conflicts")
    ds = ds.assign(n_members=("method", [loaded[m][0].shape[0] for m in curves]))
    ref = ds["cll"].sel({"method": config.reference}).dropna("size", how="all")
    de_sizes, de_mean = ref["size"].values.astype(float), ref.mean("order").values
    de_std = ref.std("order").values
    dee = np.full((ds.sizes["method"], ds.sizes["size"], 4), np.nan)
    for i, m in enumerate(ds["method"].values):
        mean = ds["cll"].sel({"method": m}).mean("order").dropna("size")
        r = deep_ensemble_equivalent(mean.values, de_sizes, de_mean, de_std)
        k = mean.sizes["size"]
        dee[i, :k] = np.stack([r.dee, r.lower, r.upper, r.capped.astype(float)], axis=-1)
    for j, name in enumerate(("dee", "dee_lower", "dee_upper", "dee_capped")):
        ds[name] = (("method", "size"), dee[..., j])
    cfg = asdict(config)
    cfg["extra_methods"] = {m: [asdict(s) for s in v] for m, v in config.extra_methods.items()}
    extra = {"protocol": "ensembles", "calibration_protocol": "test_cv",
             "reference": config.reference, "members": json.dumps(list(members)),
             "dee_cap": float(de_sizes[-1]), "dataset_name": infos[0].dataset_name,
             "sources": json.dumps({m: [asdict(s) for s in v] for m, v in sources.items()}),
             "caches": json.dumps(sorted({c for _, _, cs in loaded.values() for c in cs}))}
    ds.attrs = provenance_attrs(config=cfg, seed=config.seed, extra=extra)
    return ds
