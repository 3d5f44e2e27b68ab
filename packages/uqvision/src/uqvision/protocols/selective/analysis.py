"""The Selective paper's analyses as functions of a selective result (docs/conventions.md#v-1).

Every function takes the ``xarray.Dataset`` written by ``uqvision score selective``
(dims ``model`` × ``calibration``, per-model coords ``method``, ``base_model`` and the metadata
coords of :func:`uqvision.protocols.selective.metadata.attach_metadata`) and returns a small ``xarray.Dataset``;
nothing here re-runs a model or re-implements a metric.

- :func:`paired_comparisons` — models of one base architecture that differ in one training
  regime (distillation, pre-training data, adversarial training, supervision, label smoothing)
  and agree on the others: the change of each metric (Galil et al., Section 3.1, Figure 4).
- :func:`teacher_comparisons` — distilled students vs their teacher (Figure 5).
- :func:`method_comparisons` — the same model with another κ (MC dropout vs softmax response,
  Appendix M).
- :func:`temperature_effect` — what temperature scaling does to each metric, against the fitted
  T (Section 3.2, Figures 4, 6, 14), on the same (held-out) samples before and after;
  :func:`summarize_temperature_effect`.
- :func:`family_correlations` — Spearman correlations within each architecture family
  (AUROC vs accuracy, ECE vs AUROC, …; Appendix L, Table 2).
- :func:`metric_disagreement` — do two metrics order the models alike, and do they pick the same
  best model (Section 3.4, Figure 1)?
- :func:`improvements` — every pairwise improvement above in one table (Figure 4).

"Improvement" is the change oriented so that positive is better (``-Δ`` for lower-is-better
metrics such as ECE), read from the metric's ``greater_is_better`` attr or the uqmetrics
registry.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr
from scipy.stats import kendalltau, spearmanr
from uqmetrics.metrics.registry import METRICS

from .metadata import REGIME_FIELDS, UNKNOWN

__all__ = [
    "BASELINE_VALUES",
    "DEFAULT_CORRELATIONS",
    "family_correlations",
    "greater_is_better",
    "improvements",
    "method_comparisons",
    "metric_disagreement",
    "paired_comparisons",
    "summarize_temperature_effect",
    "teacher_comparisons",
    "temperature_effect",
]

#: The value of a regime column that means "without it"; any other known value is "with it".
BASELINE_VALUES: dict[str, str] = {"distillation": "no", "pretraining_data": "none",
                                   "adversarial_training": "no", "supervision": "supervised",
                                   "label_smoothing": "no"}
#: (x, y) pairs of :func:`family_correlations` (the paper's Table 2 and Section 3.4).
DEFAULT_CORRELATIONS: tuple[tuple[str, str], ...] = (
    ("auroc", "accuracy"), ("ece", "accuracy"), ("auroc", "params"), ("ece", "params"),
    ("auroc", "input_size"), ("ece", "input_size"), ("ece", "auroc"))


def greater_is_better(ds: xr.Dataset, name: str) -> bool:
    """Whether larger values of ``name`` are better (variable attr, else the metric registry;
    metadata such as ``params`` counts as greater-is-better)."""
    if name in ds.data_vars and "greater_is_better" in ds[name].attrs:
        return bool(int(ds[name].attrs["greater_is_better"]))
    spec = METRICS.get(name)
    return True if spec is None else spec.greater_is_better


def _rows(ds: xr.Dataset, method: str | None) -> xr.Dataset:
    """The rows of one κ method (all rows when ``method`` is None or there is no ``method``)."""
    if method is None or "method" not in ds.coords:
        return ds
    return ds.isel(model=np.flatnonzero(ds["method"].values == method))


def _values(ds: xr.Dataset, name: str, calibration: str) -> np.ndarray:
    """Per-model values of a metric (at ``calibration``) or of a numeric coord."""
    if name not in ds.variables:
        raise ValueError(f"{name!r} is neither a metric nor a coord of the result; available: "
                         f"{sorted(map(str, ds.variables))}")
    da = ds[name]
    if "calibration" in da.dims:
        if calibration not in ds["calibration"].values:
            raise ValueError(f"calibration must be one of {list(ds['calibration'].values)}, "
                             f"got {calibration!r}")
        da = da.sel(calibration=calibration)
    return np.asarray(da.values, dtype=np.float64)


def _check_metrics(ds: xr.Dataset, metrics: Sequence[str]) -> tuple[str, ...]:
    if isinstance(metrics, str) or not metrics:
        raise ValueError(f"metrics must be a non-empty sequence of names, got {metrics!r}")
    missing = [m for m in metrics if m not in ds.data_vars]
    if missing:
        raise ValueError(f"metrics {missing} are not in the result; available: "
                         f"{sorted(map(str, ds.data_vars))}")
    return tuple(metrics)


def _pairs_dataset(ds: xr.Dataset, pairs: list[tuple[int, int]], metrics: tuple[str, ...],
                   calibration: str, coords: dict) -> xr.Dataset:
    t = np.array([p[0] for p in pairs], dtype=np.int64)
    b = np.array([p[1] for p in pairs], dtype=np.int64)
    models = ds["model"].values
    data = {}
    for m in metrics:
        v = _values(ds, m, calibration)
        sign = 1.0 if greater_is_better(ds, m) else -1.0
        data[f"{m}_treated"] = ("pair", v[t])
        data[f"{m}_baseline"] = ("pair", v[b])
        data[f"delta_{m}"] = ("pair", v[t] - v[b])
        data[f"improvement_{m}"] = ("pair", sign * (v[t] - v[b]))
    out = xr.Dataset(data, coords={"pair": np.arange(len(pairs)),
                                   "treated": ("pair", models[t].astype(object)),
                                   "baseline": ("pair", models[b].astype(object)), **coords})
    out.attrs = {"calibration": calibration}
    return out


def paired_comparisons(ds: xr.Dataset, regime: str, *, metrics: Sequence[str] = ("auroc", "ece"),
                       calibration: str = "none", match: Sequence[str] | None = None,
                       method: str | None = "softmax") -> xr.Dataset:
    """Pairs of models that differ in one training regime and agree on everything else known.

    Parameters
    ----------
    ds : xarray.Dataset
        A selective result with metadata coords.
    regime : str
        A regime column of the metadata (:data:`uqvision.protocols.selective.metadata.REGIME_FIELDS`).
    metrics : sequence of str
        Metric variables to compare.
    calibration : {"none", "temperature"}
    match : sequence of str, optional
        Per-model coords both models of a pair must share besides ``base_architecture``.
        Default: the other regime columns, and ``replicate`` when the result has it (the
        seed of a trained zoo, so that each treated model meets the baseline of its own seed).
    method : str or None, default "softmax"
        Rows of this κ only (``None``: every row).

    Returns
    -------
    xarray.Dataset
        Dim ``pair``; coords ``treated``/``baseline`` (model names), ``base_architecture``,
        ``value`` (the treated model's regime value); per metric ``<m>_treated``,
        ``<m>_baseline``, ``delta_<m>`` (treated − baseline) and ``improvement_<m>`` (the
        delta oriented so that positive is better). Empty (``pair`` of length 0) when no
        pair exists.

    Notes
    -----
    A pair is (treated i, baseline j) with ``base_architecture_i = base_architecture_j`` (known),
    ``regime_j`` = :data:`BASELINE_VALUES` ``[regime]``, ``regime_i`` neither that nor unknown,
    and equal ``match`` coords. Models whose regime is ``unknown`` are never paired: unknown
    regimes are not guessed.
    """
    if regime not in REGIME_FIELDS:
        raise ValueError(f"regime must be one of {', '.join(REGIME_FIELDS)}, got {regime!r}")
    metrics = _check_metrics(ds, metrics)
    rows = _rows(ds, method)
    if match is None:
        match = [f for f in REGIME_FIELDS if f != regime]
        if "replicate" in rows.coords:
            match.append("replicate")
    needed = ["base_architecture", regime, *match]
    missing = [c for c in needed if c not in rows.coords]
    if missing:
        raise ValueError(f"the result lacks coords {missing}; attach metadata first "
                         "(uqvision.protocols.selective.metadata.attach_metadata)")
    arch = rows["base_architecture"].values.astype(str)
    value = rows[regime].values.astype(str)
    keys = [tuple(rows[c].values.astype(str)) for c in match]
    same = [tuple(k[i] for k in keys) for i in range(rows.sizes["model"])]
    base = BASELINE_VALUES[regime]
    pairs = [(i, j) for i in range(len(arch)) for j in range(len(arch))
             if arch[i] == arch[j] != UNKNOWN and value[j] == base
             and value[i] not in (base, UNKNOWN) and same[i] == same[j]]
    out = _pairs_dataset(rows, pairs, metrics, calibration, {
        "base_architecture": ("pair", np.array([arch[i] for i, _ in pairs], dtype=object)),
        "value": ("pair", np.array([value[i] for i, _ in pairs], dtype=object))})
    out.attrs.update(regime=regime, baseline_value=base, match=",".join(match))
    return out


def method_comparisons(ds: xr.Dataset, method: str = "mc_dropout", *, baseline: str = "softmax",
                       metrics: Sequence[str] = ("accuracy", "auroc"),
                       calibration: str = "none") -> xr.Dataset:
    """The same model scored with κ ``method`` vs ``baseline`` (MC dropout vs softmax response).

    Returns
    -------
    xarray.Dataset
        As :func:`paired_comparisons`, pairs matched on ``base_model``; coord ``base_model``.
    """
    metrics = _check_metrics(ds, metrics)
    kind = ds["method"].values.astype(str)
    base_model = ds["base_model"].values.astype(str)
    pairs = [(i, j) for i in np.flatnonzero(kind == method) for j in np.flatnonzero(kind == baseline)
             if base_model[i] == base_model[j]]
    out = _pairs_dataset(ds, pairs, metrics, calibration, {
        "base_model": ("pair", np.array([base_model[i] for i, _ in pairs], dtype=object))})
    out.attrs.update(method=method, baseline=baseline)
    return out


def teacher_comparisons(ds: xr.Dataset, *, metrics: Sequence[str] = ("auroc", "ece"),
                        calibration: str = "none", method: str | None = "softmax") -> xr.Dataset:
    """Distilled students vs their teacher, when the teacher is a row of the result (Figure 5).

    Returns
    -------
    xarray.Dataset
        As :func:`paired_comparisons`: pairs (student i, teacher j) with ``teacher_i`` equal to
        ``metadata_key_j``; ``treated`` is the student, ``baseline`` the teacher.
    """
    metrics = _check_metrics(ds, metrics)
    rows = _rows(ds, method)
    missing = [c for c in ("teacher", "metadata_key") if c not in rows.coords]
    if missing:
        raise ValueError(f"the result lacks coords {missing}; attach metadata first")
    teacher = rows["teacher"].values.astype(str)
    key = rows["metadata_key"].values.astype(str)
    pairs = [(i, j) for i in range(key.size) for j in range(key.size)
             if teacher[i] not in ("", UNKNOWN) and teacher[i] == key[j]]
    return _pairs_dataset(rows, pairs, metrics, calibration, {})


def _unscaled_heldout(ds: xr.Dataset, name: str) -> np.ndarray:
    """Per-model ``calibration = "none"`` values of ``name`` on the temperature row's samples.

    ``none_heldout`` when the file has it; a file without it and without a ``sample_set``
    coord scored both rows on the same held-out samples (the rule before ``none`` moved to
    every sample), so its ``none`` row is the one; anything else is refused.
    """
    if "none_heldout" in ds.data_vars:
        return np.asarray(ds["none_heldout"].sel(metric=name).values, dtype=np.float64)
    if "sample_set" not in ds.coords or len(set(ds["sample_set"].values.tolist())) == 1:
        return _values(ds, name, "none")
    raise ValueError("the result scores calibration='none' and 'temperature' on different "
                     "samples and has no none_heldout: use paired=False, or score it again")


def temperature_effect(ds: xr.Dataset, *, metrics: Sequence[str] = ("auroc", "ece"),
                       method: str | None = "softmax", paired: bool = True) -> xr.Dataset:
    """Per model: the fitted temperature and the change of each metric under temperature scaling.

    Parameters
    ----------
    ds : xarray.Dataset
        A selective result.
    metrics : sequence of str
        Metric variables.
    method : str or None, default "softmax"
        Rows of this κ only (``None``: every row).
    paired : bool, default True
        True: the change on the same samples, ``temperature`` − ``none_heldout`` (both on the
        held-out samples), the effect of T alone. False: ``temperature`` − ``none`` as the
        file's rows hold them, which for a file scored by the official rule (``none`` on
        every sample) is the quantity of Galil et al.'s published code (their ``AUROC_TS``
        minus ``AUROC``), with the sampling difference between the two sample sets in it.

    Returns
    -------
    xarray.Dataset
        Dim ``model``: ``temperature`` (fitted T), and per metric ``delta_<m>`` =
        m(temperature) − m(none) and ``improvement_<m>`` (positive = better); attr
        ``paired``.
    """
    metrics = _check_metrics(ds, metrics)
    rows = _rows(ds, method)
    data = {"temperature": ("model", _values(rows, "temperature", "temperature"))}
    for m in metrics:
        before = _unscaled_heldout(rows, m) if paired else _values(rows, m, "none")
        delta = _values(rows, m, "temperature") - before
        data[f"delta_{m}"] = ("model", delta)
        data[f"improvement_{m}"] = ("model", delta if greater_is_better(rows, m) else -delta)
    return xr.Dataset(data, coords={"model": rows["model"].values},
                      attrs={"paired": int(paired)})


def _fraction_positive(v: np.ndarray) -> float:
    return float(np.mean(v > 0)) if v.size else float("nan")


def summarize_temperature_effect(effect: xr.Dataset) -> dict[str, dict[str, float]]:
    """Per metric: how often temperature scaling helps, and how that relates to T.

    Returns
    -------
    dict
        ``{metric: {"n", "fraction_improved", "median_improvement", "spearman_t",
        "fraction_improved_t_below_1", "fraction_improved_t_above_1"}}`` where
        ``spearman_t`` is the Spearman correlation of T with the improvement (the paper:
        models with T < 1 tend to gain AUROC, Figure 6; no such relation for ECE, Figure 14).
        Fractions over an empty set are NaN; ties (improvement exactly 0) count as not improved.
    """
    t = effect["temperature"].values
    out = {}
    for var in effect.data_vars:
        if not str(var).startswith("improvement_"):
            continue
        v = effect[var].values
        ok = np.isfinite(v) & np.isfinite(t)
        v, tt = v[ok], t[ok]

        rho = spearmanr(tt, v).statistic if v.size >= 3 else float("nan")
        out[str(var)[len("improvement_"):]] = {
            "n": int(v.size), "fraction_improved": _fraction_positive(v),
            "median_improvement": float(np.median(v)) if v.size else float("nan"),
            "spearman_t": float(rho), "fraction_improved_t_below_1": _fraction_positive(v[tt < 1]),
            "fraction_improved_t_above_1": _fraction_positive(v[tt > 1])}
    return out


def family_correlations(ds: xr.Dataset, pairs: Sequence[tuple[str, str]] = DEFAULT_CORRELATIONS,
                        *, by: str | Sequence[str] = "family", calibration: str = "none",
                        min_models: int = 3, method: str | None = "softmax") -> xr.Dataset:
    """Spearman correlation of each (x, y) pair within each group of models and over all.

    Parameters
    ----------
    ds : xarray.Dataset
    pairs : sequence of (str, str)
        Metric variables or numeric coords (``params``, ``input_size``).
    by : str or sequence of str, default "family"
        Per-model coords defining the groups (several: joined with ``" / "``, e.g.
        ``("family", "distillation")`` for the paper's "XCiT distilled").
    calibration : {"none", "temperature"}
    min_models : int, default 3
        Groups with fewer models (with finite x and y) get NaN.
    method : str or None, default "softmax"

    Returns
    -------
    xarray.Dataset
        ``spearman``, ``pvalue`` and ``n`` over (group, pair); ``group`` starts with ``"all"``;
        ``pair`` labels are ``"x~y"``. Signs are of the raw values (ECE is lower-is-better: the
        paper's "-ECE & Accuracy" is minus the ``ece~accuracy`` entry).
    """
    rows = _rows(ds, method)
    by = (by,) if isinstance(by, str) else tuple(by)
    missing = [c for c in by if c not in rows.coords]
    if missing:
        raise ValueError(f"the result lacks group coords {missing}")
    labels = np.array([" / ".join(str(rows[c].values[i]) for c in by)
                       for i in range(rows.sizes["model"])], dtype=object)
    groups = ["all", *sorted(set(labels))]
    names = [f"{x}~{y}" for x, y in pairs]
    rho = np.full((len(groups), len(pairs)), np.nan)
    pval, count = rho.copy(), np.zeros_like(rho, dtype=np.int64)
    for p, (x, y) in enumerate(pairs):
        xv, yv = _values(rows, x, calibration), _values(rows, y, calibration)
        for g, group in enumerate(groups):
            sel = (labels == group) if group != "all" else np.ones(labels.size, bool)
            sel &= np.isfinite(xv) & np.isfinite(yv)
            count[g, p] = int(sel.sum())
            if count[g, p] >= max(min_models, 2) and np.ptp(xv[sel]) > 0 and np.ptp(yv[sel]) > 0:
                r = spearmanr(xv[sel], yv[sel])
                rho[g, p], pval[g, p] = r.statistic, r.pvalue
    out = xr.Dataset({"spearman": (("group", "pair"), rho), "pvalue": (("group", "pair"), pval),
                      "n": (("group", "pair"), count)},
                     coords={"group": np.array(groups, dtype=object),
                             "pair": np.array(names, dtype=object)})
    out.attrs = {"by": ",".join(by), "calibration": calibration, "min_models": min_models}
    return out


def metric_disagreement(ds: xr.Dataset, a: str = "auroc", b: str = "ece", *,
                        calibration: str = "none", method: str | None = "softmax") -> dict:
    """How far two metrics agree on the order of the models.

    Returns
    -------
    dict
        ``n``; ``spearman`` and ``kendall`` of the two metrics oriented so that larger is better
        (1 = the same order); ``discordant_fraction`` of model pairs ordered oppositely (pairs
        tied in either metric excluded); ``best_a``/``best_b`` (the best model by each) and
        ``same_best``.
    """
    rows = _rows(ds, method)
    va = _values(rows, a, calibration) * (1 if greater_is_better(rows, a) else -1)
    vb = _values(rows, b, calibration) * (1 if greater_is_better(rows, b) else -1)
    ok = np.isfinite(va) & np.isfinite(vb)
    va, vb, models = va[ok], vb[ok], rows["model"].values[ok]
    if va.size < 2:
        raise ValueError(f"need at least 2 models with finite {a} and {b}, got {va.size}")
    da, db = np.sign(va[:, None] - va[None, :]), np.sign(vb[:, None] - vb[None, :])
    upper = np.triu(np.ones_like(da, dtype=bool), 1) & (da != 0) & (db != 0)
    best_a, best_b = str(models[np.argmax(va)]), str(models[np.argmax(vb)])
    return {"n": int(va.size), "spearman": float(spearmanr(va, vb).statistic),
            "kendall": float(kendalltau(va, vb).statistic),
            "discordant_fraction": float(np.mean(da[upper] != db[upper])) if upper.any()
            else float("nan"),
            "best_" + a: best_a, "best_" + b: best_b, "same_best": best_a == best_b}


def improvements(ds: xr.Dataset, *, metrics: Sequence[str] = ("auroc", "ece"),
                 regimes: Sequence[str] = REGIME_FIELDS, calibration: str = "none") -> xr.Dataset:
    """Every pairwise improvement in one table: each regime, temperature scaling, MC dropout.

    Returns
    -------
    xarray.Dataset
        Dim ``entry``: coords ``technique`` (a regime name, ``temperature_scaling`` or
        ``mc_dropout``), ``treated``, ``baseline``; ``improvement_<m>`` per metric (NaN where a
        technique does not report it, e.g. ECE of MC dropout). ``temperature_scaling``
        entries compare the same held-out samples (:func:`temperature_effect`, ``paired``);
        the others compare two rows at ``calibration``.
    """
    metrics = _check_metrics(ds, metrics)
    parts = []
    for regime in regimes:
        if regime in ds.coords:
            parts.append((regime, paired_comparisons(ds, regime, metrics=metrics,
                                                      calibration=calibration)))
    effect = temperature_effect(ds, metrics=metrics)
    ts = effect.rename({"model": "pair"}).assign_coords(
        treated=("pair", [f"{m}+TS" for m in effect["model"].values]),
        baseline=("pair", effect["model"].values))
    parts.append(("temperature_scaling", ts))
    if "method" in ds.coords and "mc_dropout" in ds["method"].values:
        parts.append(("mc_dropout", method_comparisons(ds, metrics=metrics,
                                                       calibration=calibration)))
    technique, treated, baseline = [], [], []
    values: dict[str, list[float]] = {m: [] for m in metrics}
    for name, part in parts:
        n = part.sizes["pair"]
        technique += [name] * n
        treated += [str(x) for x in part["treated"].values]
        baseline += [str(x) for x in part["baseline"].values]
        for m in metrics:
            values[m] += list(part[f"improvement_{m}"].values)
    return xr.Dataset({f"improvement_{m}": ("entry", np.asarray(v, dtype=np.float64))
                       for m, v in values.items()},
                      coords={"entry": np.arange(len(technique)),
                              "technique": ("entry", np.array(technique, dtype=object)),
                              "treated": ("entry", np.array(treated, dtype=object)),
                              "baseline": ("entry", np.array(baseline, dtype=object))},
                      attrs={"calibration": calibration})
