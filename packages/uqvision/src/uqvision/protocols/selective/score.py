"""Selective-prediction protocol (docs/conventions.md#v-1): one row per model, from cached logits.

The models are scored on one set, taken by role and name (:attr:`SelectiveConfig.test`,
``--test``; else the only set of role ``test``: :func:`uqvision.predictors.pick_set`): a set
of role ``test``, ``calibration`` or ``shift`` (selective prediction on ImageNet-V2 names it),
never one of role ``fit`` (training images) or an OOD set.

The test set is split once per dataset (``stratified_holdout``: a label-stratified calibration
subset of ``calibration_size`` samples; the split is a function of the labels and the seed, so
every model of the dataset shares it). ``calibration = "temperature"`` is scored on the
held-out samples (the calibration subset excluded), with T fitted on the calibration subset by
``uqmetrics.temperature_scaled_metrics``. ``calibration = "none"`` is scored on the same
held-out samples by default, so that the two rows are comparable (:data:`SAMPLE_SET_RULES`,
``--none-samples heldout``); ``--none-samples all`` scores it on **every** test sample, as
Galil et al.'s official ``benchmark_models.py`` does. The unscaled metrics on the held-out
samples are kept in ``none_heldout`` under either rule, so that the effect of temperature
scaling is measured on the same samples
(:func:`uqvision.protocols.selective.analysis.temperature_effect`).

Rows come from :data:`ROW_KINDS`: softmax response on the plain cache, and MC dropout (negative
predictive entropy of the mean over passes; ECE not reported, as in Galil et al.) where the
model has an MC-dropout cache.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np
import xarray as xr
from uqmetrics import (
    CONVENTIONS,
    SAC_RULES,
    InputError,
    aurc_c_loss,
    calibration_splits,
    eaurc_c_loss,
    ensemble_log_probs,
    get_confidence_function,
    log_softmax,
    score_metrics,
    softmax,
    stamp_result,
    temperature_scaled_metrics,
)
from uqmetrics.metrics.registry import Registry
from uqmetrics.runs.io import open_netcdf

from ...cache import (
    check_aligned,
    check_finite_logits,
    incomplete_caches,
    index_caches,
    read_cache,
    select_dataset,
)
from ...predict import DEFAULT_PASSES
from ...predictors import pick_set, set_roles
from ...provenance import entry_provenance
from .metadata import attach_metadata, load_metadata, metadata_key

__all__ = [
    "DEFAULT_AURC_COVERAGE",
    "ROW_KINDS",
    "SAMPLE_SET_RULES",
    "SELECTIVE_METRICS",
    "RowKind",
    "SelectiveConfig",
    "cache_metadata_key",
    "incomplete_caches",
    "predictive_log_probs",
    "resolve_calibration_size",
    "score_selective",
    "select_dataset",
]

#: The metric variables of a selective score file (registered uqmetrics names; ``sac_99`` and
#: ``sac_95`` are computed with the SAC rule of :attr:`SelectiveConfig.sac_rule`, ``aurc_c``
#: and ``eaurc_c`` over the coverages ``[0, SelectiveConfig.aurc_coverage]``).
SELECTIVE_METRICS = ("accuracy", "auroc", "aurc", "eaurc", "aurc_c", "eaurc_c", "sac_99",
                     "sac_95", "ece", "nll", "brier")
_SAC = ("sac_99", "sac_95")
#: Metrics over a coverage range, computed here with :attr:`SelectiveConfig.aurc_coverage`.
_COVERAGE = {"aurc_c": aurc_c_loss, "eaurc_c": eaurc_c_loss}
#: Their ``convention`` attrs (docs/conventions.md#s-2), with the range scored.
_COVERAGE_CONVENTIONS = {
    "aurc_c": "S.2: mean selective risk e_i/i over the coverages i/N in [0, {c}] "
              "(aurc_coverage), kappa descending, errors spread evenly over tied blocks",
    "eaurc_c": "S.2: aurc_c minus aurc_c of the exact empirical oracle ranking, coverages i/N "
               "in [0, {c}] (aurc_coverage)"}
#: Upper end of the AURC_C coverage range [0, c]. Galil et al. define AURC over a set of
#: coverages but fix no range for it: 0.5 (the most confident half) is this project's choice.
DEFAULT_AURC_COVERAGE = 0.5
#: The samples the ``calibration = "none"`` row is scored on (:attr:`SelectiveConfig.
#: none_samples`, coord ``sample_set``), by rule, with the score-file attr ``sample_set_rule``
#: describing it. ``temperature`` is always scored on ``heldout``, the test samples outside the
#: stratified calibration subset; ``all`` is every test sample.
SAMPLE_SET_RULES = {
    "heldout": "heldout: calibration='none' and 'temperature' on the same samples, those "
               "outside the calibration subset (S.1 stratified_holdout); none_heldout: "
               "calibration='none' on the temperature row's samples",
    "all": "official_code: calibration='none' on every test sample, calibration='temperature' "
           "on the samples outside the calibration subset (Galil et al. 2023, "
           "benchmark_models.py); none_heldout: calibration='none' on the temperature row's "
           "samples"}


@dataclass(frozen=True)
class RowKind:
    """How a cache becomes a row: the cache mode it reads, its κ (a ``uqmetrics`` confidence
    function), metrics it does not report, the suffix of its row name."""

    mode: str
    confidence: str
    skip: tuple[str, ...] = ()
    suffix: str = ""
    description: str = ""


#: Row kinds by method name (one row per model and kind that has a cache).
ROW_KINDS: Registry[RowKind] = Registry("row kind")
ROW_KINDS.add("softmax", RowKind("plain", "softmax_response",
                                 description="softmax response on the plain cache"))
ROW_KINDS.add("mc_dropout", RowKind(
    "mc_dropout", "negative_entropy", skip=("ece",), suffix="+mc_dropout",
    description="negative entropy of the mean over MC-dropout passes (no ECE)"))


@dataclass
class SelectiveConfig:
    """Options of :func:`score_selective`.

    ``calibration_size``: calibration samples for ``stratified_holdout`` — a count (5000 on
    ImageNet) or a fraction in (0, 1) of the test set (small development sets).
    ``sac_rule``: ``"largest"`` (the paper's definition) or ``"first_drop"`` (its official
    code, to reproduce its published SAC values; :func:`uqmetrics.sac_score`).
    ``mc_passes``: MC-dropout passes a ``+mc_dropout`` row is scored from (the first
    ``mc_passes`` of its cache); a cache with fewer is refused. ``aurc_coverage``: the upper
    end c of the coverage range [0, c] of ``aurc_c``/``eaurc_c``, in (0, 1]; the paper fixes
    no range, and the default 0.5 is this project's choice (:data:`DEFAULT_AURC_COVERAGE`).
    ``none_samples``: the samples the ``calibration = "none"`` row is scored on
    (:data:`SAMPLE_SET_RULES`): ``"heldout"`` (default; those of the ``temperature`` row, so
    the two rows compare) or ``"all"`` (every test sample, as the paper's official code).
    ``metadata``: extra model metadata tables
    (:func:`uqvision.protocols.selective.metadata.load_metadata`; the shipped table and
    ``$UQVISION_MODEL_METADATA`` are always read). ``test``: the ``dataset_name`` of the set
    scored (``--test``; default the only set of role ``test``; never a set of role ``fit``).
    """

    calibration_size: float = 5000
    seed: int = 0
    test: str | None = None
    kinds: tuple[str, ...] = tuple(ROW_KINDS)
    sac_rule: str = "largest"
    mc_passes: int = DEFAULT_PASSES["mc_dropout"]
    aurc_coverage: float = DEFAULT_AURC_COVERAGE
    none_samples: str = "heldout"
    metadata: tuple[str, ...] = ()


def resolve_calibration_size(size: float, n: int) -> int:
    """A count or a fraction of ``n`` -> a count in [1, n - 1]; ``ValueError`` otherwise.

    Examples
    --------
    >>> resolve_calibration_size(5000, 50000), resolve_calibration_size(0.3, 899)
    (5000, 270)
    """
    k = round(size * n) if 0 < size < 1 else int(size)
    if not 1 <= k < n or (size >= 1 and size != int(size)):
        raise ValueError(f"calibration size {size:g} gives {k} calibration samples of {n}; use a "
                         f"count in [1, {n - 1}] or a fraction in (0, 1) (option "
                         "--calibration-size)")
    return k


def predictive_log_probs(logits: np.ndarray) -> np.ndarray:
    """Log predictive distribution, shape (sample, class), of (sample, class) logits or of
    (pass, sample, class) logits of several passes (log of the mean of their softmaxes)."""
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim == 2:
        return log_softmax(z)
    return ensemble_log_probs(log_softmax(z))


def _registered(metric: str, sac_rule: str) -> str:
    """The registered metric computing score-file variable ``metric`` under ``sac_rule``."""
    return f"{metric}_{sac_rule}" if metric in _SAC and sac_rule != "largest" else metric


def _coverage_scores(y: np.ndarray, p: np.ndarray, confidence: str,
                     names: tuple[str, ...], coverage: float) -> dict[str, float]:
    """``aurc_c``/``eaurc_c`` (those in ``names``) over coverages ``[0, coverage]``, from
    ``correct = argmax p = y`` and ``κ = confidence(p)`` as :func:`uqmetrics.score_metrics`."""
    if not names:
        return {}
    correct = np.argmax(p, axis=1) == y
    kappa = np.asarray(get_confidence_function(confidence)(p), dtype=np.float64)
    return {n: float(_COVERAGE[n](correct, kappa, coverage=(0.0, coverage))) for n in names}


def _row(z: np.ndarray, y: np.ndarray, held: np.ndarray, n_calib: int, kind: RowKind,
         metrics: tuple[str, ...], config: SelectiveConfig) -> tuple[np.ndarray, xr.Dataset]:
    """Values (cell=3, metric), NaN for the kind's skipped metrics, and the
    ``temperature_scaled_metrics`` result (one ``stratified_holdout`` fold).

    Cells: 0 = ``none`` on the samples of ``config.none_samples`` (every sample, or the
    held-out ones), 1 = ``temperature`` on the held-out samples ``held``, 2 = ``none`` on the
    held-out samples (``none_heldout``).
    """
    kept = [m for m in metrics if m not in kind.skip]
    scored = tuple(_registered(m, config.sac_rule) for m in kept if m not in _COVERAGE)
    ranged = tuple(m for m in kept if m in _COVERAGE)
    res = temperature_scaled_metrics(z, y, protocol="stratified_holdout", metrics=scored,
                                     confidence=kind.confidence, n_calib=n_calib,
                                     seed=config.seed)
    if int(res["n_eval"][0]) != held.size:  # the split below is the protocol's own
        raise RuntimeError("the held-out samples differ from temperature_scaled_metrics' split")
    t = float(res["temperature"][0])
    heldout = ({n: float(res[n].sel(calibration="none")) for n in scored}, y[held],
               softmax(z[held]))
    if config.none_samples == "all":
        p_all = softmax(z)
        first = (score_metrics(y, p_all, metrics=scored, confidence=kind.confidence), y, p_all)
    else:
        first = (dict(heldout[0]), *heldout[1:])
    cells = [first,
             ({n: float(res[n].sel(calibration="temperature")) for n in scored}, y[held],
              softmax(z[held], temperature=t)),
             heldout]
    for cell, labels, p in cells:
        cell.update(_coverage_scores(labels, p, kind.confidence, ranged, config.aurc_coverage))
    values = np.array([[c.get(m, np.nan) if m in _COVERAGE else
                        c.get(_registered(m, config.sac_rule), np.nan) for m in metrics]
                       for c, _, _ in cells])
    return values, res


def _passes(info, kind_name: str, config: SelectiveConfig) -> int:
    """Passes a row is scored from; ``ValueError`` for an MC cache with too few."""
    if ROW_KINDS[kind_name].mode != "mc_dropout":
        return 1
    if info.n_passes < config.mc_passes:
        raise ValueError(f"MC-dropout cache {str(info.path)!r} has {info.n_passes} passes; the "
                         f"+mc_dropout row needs {config.mc_passes} (--mc-passes; "
                         "uqvision predict --mode mc_dropout --passes N)")
    return config.mc_passes


def cache_metadata_key(attrs: dict) -> str:
    """``arch.tag`` of a cache's model (its model name when the cache names no architecture)."""
    if not attrs.get("architecture"):
        return str(attrs.get("model_name") or attrs["model"])
    return metadata_key(str(attrs.get("source", "timm")), str(attrs["architecture"]),
                        str(attrs.get("tag", "")))


def _measured(attrs: dict) -> tuple[float, float]:
    """(parameter count, input side) recorded in a cache, NaN where absent."""
    params = float(attrs["num_params"]) if "num_params" in attrs else np.nan
    try:
        side = float(json.loads(attrs["data_config"])["input_size"][-1])
    except (KeyError, ValueError, TypeError, IndexError):
        side = np.nan
    return params, side


def _one_cache(hits: list) -> None:
    """Refuse several cache files of one row (model, mode, pass 0) with other logits, naming
    two of them (a copy of a file is the same cache: the first is scored)."""
    files: dict[str, str] = {}
    for info in hits:
        with open_netcdf(info.path) as ds:  # the header only
            files.setdefault(str(ds.attrs.get("checksum")), str(info.path))
    if len(files) > 1:
        a, b = list(files.values())[:2]
        raise InputError(f"caches {a!r} and {b!r} are both model {hits[0].model!r} on dataset "
                         f"{hits[0].dataset_name!r} (mode {hits[0].mode!r}) with other logits: "
                         "score one of them (two predictions of one model under one name are "
                         "never scored as one)")


def score_selective(caches: Iterable[str | os.PathLike],
                    config: SelectiveConfig | None = None) -> xr.Dataset:
    """Score every model's cache: dims (model, calibration), one variable per metric.

    ``calibration = "temperature"`` is scored on the held-out samples, ``"none"`` on the same
    ones (``config.none_samples = "heldout"``, the default) or on every test sample (``"all"``,
    as Galil et al.'s official code; :data:`SAMPLE_SET_RULES`); the unscaled metrics on the
    held-out samples are in ``none_heldout`` under either rule.

    Parameters
    ----------
    caches : iterable of path
        Cache files or directories (see :mod:`uqvision.cache`); partial or corrupt files are
        skipped by the index and rejected by the loader.
    config : SelectiveConfig

    Returns
    -------
    xarray.Dataset
        Variables :data:`SELECTIVE_METRICS` (``accuracy``, ``auroc``, ``aurc``, ``eaurc``,
        ``aurc_c``/``eaurc_c`` over coverages [0, ``aurc_coverage``] (attr ``coverage``),
        ``sac_99``, ``sac_95``, ``ece``, ``nll``, ``brier``; each with attrs ``metric`` (the
        registered metric computing it), ``convention``, ``greater_is_better``: the metric
        variables of the result-file schema, :mod:`uqmetrics.runs.result_schema`) and
        ``temperature`` over (model, calibration) with ``calibration = ["none",
        "temperature"]`` (``temperature`` is 1 for ``none``) and per-calibration coords
        ``sample_set`` (``all``, ``heldout``) and ``n_scored`` (the samples each row is scored
        on); ``none_heldout`` over (model, metric): the
        ``calibration = "none"`` values on the held-out samples (coord ``metric`` =
        :data:`SELECTIVE_METRICS`); ``temperature_converged`` (model); per-row coords
        ``method``, ``base_model``, ``passes`` (MC-dropout passes scored, 1 otherwise),
        ``architecture``, ``tag``, ``checkpoint_sha256``, ``metadata_key`` (``arch.tag``) and
        the model metadata of :func:`uqvision.protocols.selective.metadata.attach_metadata`
        (``family``, ``params``, ``input_size``, ``distillation``, ``teacher``,
        ``pretraining_data``, …; ``unknown`` where no table knows the model; ``params``/``input_size`` measured from the model when its cache
        records them). Attrs: the result-file schema's (``protocol = "selective"``,
        ``conventions``, ``input_checksums``: :func:`uqmetrics.stamp_result`), provenance,
        protocol options, ``sac_rule``, ``mc_passes``,
        ``aurc_coverage`` ([0, c]), ``n_images``, ``n_calib``/``n_eval`` (the split),
        ``sample_set_rule`` (:data:`SAMPLE_SET_RULES`), the metadata tables used and
        ``caches`` (JSON: path -> checksum of each scored cache) and ``entries`` (each row's
        provenance: :func:`uqvision.provenance.entry_provenance`).

    Raises
    ------
    ValueError
        An unknown SAC rule or ``none_samples``, ``mc_passes < 1``, ``aurc_coverage`` outside (0, 1] or below one
        held-out sample, a calibration size that leaves no sample on either side, no cache;
        two cache files of one row with other logits (:class:`uqmetrics.InputError`, naming
        both); no test set, two sets of role ``test`` without ``test``, or a ``test`` of role
        ``fit`` or OOD (:class:`uqmetrics.InputError`, naming the candidates and ``--test``).

    Notes
    -----
    With ``(C, E)`` the stratified calibration/evaluation split of the ``N`` test samples and
    ``z`` a row's logits (MC dropout: ``log mean_s softmax(z_s)``):
    ``T = argmin NLL(softmax(z[C]/T))``; ``temperature`` is every metric of ``softmax(z[E]/T)``
    over ``E``, ``none_heldout`` of ``softmax(z[E])`` over ``E``, and ``none`` the same as
    ``none_heldout`` (rule ``heldout``) or of ``softmax(z)`` over all ``N`` samples (rule
    ``all``); selective metrics use ``correct = argmax p = y`` and the row's κ; accuracy and
    top-k are the same in both rows (``uqmetrics.temperature_scaled_metrics``). Under rule
    ``all``, ``none`` and ``temperature`` differ by the samples as well as by T (by the
    sampling noise of the calibration subset: small for 5,000 of 50,000 images, not for a small
    test set); ``temperature`` − ``none_heldout`` is the effect of T alone under either rule.

    References
    ----------
    Galil, Dabbah, El-Yaniv. What can we learn from the selective prediction and uncertainty
    estimation performance of 523 ImageNet classifiers? ICLR 2023.
    """
    config = config or SelectiveConfig()
    kinds = {k: ROW_KINDS.lookup(k) for k in config.kinds}
    if config.sac_rule not in SAC_RULES:
        raise ValueError(f"sac_rule must be one of {', '.join(SAC_RULES)}, got "
                         f"{config.sac_rule!r} (option --sac-rule)")
    if config.none_samples not in SAMPLE_SET_RULES:
        raise ValueError(f"none_samples must be one of {', '.join(SAMPLE_SET_RULES)}, got "
                         f"{config.none_samples!r} (option --none-samples)")
    if config.mc_passes < 1:
        raise ValueError(f"mc_passes must be >= 1, got {config.mc_passes!r}")
    if not 0 < config.aurc_coverage <= 1:
        raise ValueError(f"aurc_coverage must be in (0, 1], got {config.aurc_coverage!r} "
                         "(option --aurc-coverage)")
    tables = load_metadata(config.metadata)
    infos = index_caches(caches)
    if not infos:
        raise ValueError("no complete prediction cache found")
    roles = set_roles(infos)
    test = pick_set("test", config.test, roles, option="--test",
                    accept=("test", "calibration", "shift"))
    if test is None:
        listed = ", ".join(f"{n} ({r['set_role'] or '?'})" for n, r in sorted(roles.items()))
        raise InputError(f"no set of role 'test' among the caches' sets (role): {listed}; name "
                         "the set to score (--test NAME)")
    infos = select_dataset(infos, test)
    models = list(dict.fromkeys(i.model for i in sorted(infos, key=lambda i: i.model)))
    rows = []  # (row name, kind name, CacheInfo)
    for m in models:
        for kname, kind in kinds.items():
            hits = [i for i in infos if i.model == m and i.mode == kind.mode and i.pass_index == 0]
            if hits:
                _one_cache(hits)
                rows.append((m + kind.suffix, kname, hits[0]))
    if not rows:
        raise ValueError("no plain or MC-dropout cache to score")
    metrics = SELECTIVE_METRICS
    values = np.full((len(rows), 3, len(metrics)), np.nan)  # none, temperature, none_heldout
    temps, conv = np.ones((len(rows), 2)), np.zeros(len(rows), dtype=bool)
    meta: dict[str, list[str]] = {k: [] for k in ("architecture", "tag", "checkpoint_sha256",
                                                  "metadata_key")}
    passes, measured = np.ones(len(rows), dtype=np.int64), np.full((len(rows), 2), np.nan)
    checksums = {}
    row_caches: dict[str, list] = {}  # row -> the cache it was scored from (entries attr)
    ref = None
    for r, (row, kname, info) in enumerate(rows):
        passes[r] = _passes(info, kname, config)
        ds = read_cache(info.path)
        if ref is None:
            ref = ds.drop_vars([v for v in ds.data_vars if v != "label"])
            y = ref["label"].values
            n_calib = resolve_calibration_size(config.calibration_size, y.size)
            (_, held), = calibration_splits(y, protocol="stratified_holdout", n_calib=n_calib,
                                            seed=config.seed)
            if math.floor(round(config.aurc_coverage * held.size, 9)) < 1:
                raise ValueError(f"aurc_coverage {config.aurc_coverage:g} covers no sample of "
                                 f"the {held.size} held-out samples (option --aurc-coverage)")
        check_aligned([ref, ds], [rows[0][0], row])
        check_finite_logits(ds, info.path)
        logits = ds["logits"].values
        z = predictive_log_probs(logits[:passes[r]] if logits.ndim == 3 else logits)
        values[r], res = _row(z, y, held, n_calib, kinds[kname], metrics, config)
        temps[r, 1], conv[r] = float(res["temperature"][0]), bool(res["converged"][0])
        for k, values_k in meta.items():
            values_k.append(cache_metadata_key(ds.attrs) if k == "metadata_key"
                            else str(ds.attrs.get(k, "")))
        measured[r] = _measured(ds.attrs)
        checksums[str(info.path)] = ds.attrs["checksum"]
        row_caches[row] = [ds]
    data = {name: (("model", "calibration"), values[:, :2, j])
            for j, name in enumerate(metrics)}
    data["temperature"] = (("model", "calibration"), temps)
    data["none_heldout"] = (("model", "metric"), values[:, 2], {
        "description": "calibration='none' values on the held-out samples (those of the "
                       "temperature row): the unscaled side of a paired before/after "
                       "comparison", "sample_set": "heldout", "n_scored": held.size})
    data["temperature_converged"] = ("model", conv)
    out = xr.Dataset(data, coords={
        "model": [r[0] for r in rows], "calibration": ["none", "temperature"],
        "sample_set": ("calibration", [config.none_samples, "heldout"]),
        "n_scored": ("calibration", np.array(
            [y.size if config.none_samples == "all" else held.size, held.size], dtype=np.int64)),
        "metric": list(metrics),
        "method": ("model", [r[1] for r in rows]),
        "base_model": ("model", [r[2].model for r in rows]),
        "passes": ("model", passes), **{k: ("model", v) for k, v in meta.items()}})
    for name in metrics:
        out[name].attrs["convention"] = CONVENTIONS[_registered(name, config.sac_rule)]
    coverage = [0.0, float(config.aurc_coverage)]
    ranged = {k: v.format(c=f"{config.aurc_coverage:g}") for k, v in _COVERAGE_CONVENTIONS.items()}
    for name, text in ranged.items():
        out[name].attrs.update(coverage=coverage, convention=text)
    extra = {"calibration_protocol": "stratified_holdout",
             "n_images": int(y.size), "n_calib": int(n_calib), "n_eval": int(held.size),
             "sample_set_rule": SAMPLE_SET_RULES[config.none_samples],
             "dataset_name": rows[0][2].dataset_name, "sac_rule": config.sac_rule,
             "mc_passes": config.mc_passes, "aurc_coverage": coverage,
             "confidence_functions": json.dumps({k: v.confidence for k, v in kinds.items()}),
             **entry_provenance(row_caches, "model")}
    out = attach_metadata(out, tables, measured={"params": measured[:, 0],
                                                 "input_size": measured[:, 1]})
    return stamp_result(out, "selective", input_checksums=checksums.values(),
                        metrics={name: _registered(name, config.sac_rule) for name in metrics},
                        config=asdict(config), seed=config.seed,
                        conventions={**CONVENTIONS, **ranged}, extra={**extra, **tables.attrs})
