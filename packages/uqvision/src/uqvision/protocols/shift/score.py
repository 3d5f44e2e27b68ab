"""Scores of the distribution-shift protocol (Ovadia et al. 2019; docs/conventions.md#v-5).

:func:`score_shift` reads the prediction caches of one or more models on their clean test
distribution (caches of role ``clean``), on corrupted copies of it (members of an expanded
evaluation set such as ``imagenet-c``: attrs ``corruption`` and ``severity``), on natural shift
sets (role ``shifted`` without a corruption: ImageNet-V2, -Sketch, -A, -R) and on relabelled
clean images (role ``relabelled``: ImageNet ReaL, an overlay of label sets), and scores every
predictor on each, un-scaled and after temperature scaling with the temperature fitted on a
held-out fraction of the predictor's clean calibration caches (Ovadia's protocol: the
temperature comes from clean validation data and is never refitted under shift).

The clean sets are taken by role and name (:func:`uqvision.predictors.
pick_test_and_calibration`): the test set (:attr:`ShiftConfig.test`, else the only set of role
``test``) and the calibration set (:attr:`ShiftConfig.calibration`, else the only set of role
``calibration``, else a held-out split of the test set); never a set of role ``fit``, and two
candidates are refused, naming them.

The predictors (the ``model`` dimension) are every model (the caches' ``model`` attr; its TTA
passes and MC-dropout samples are averaged into one softmax) and, next to them, one *ensemble*
row per group of models declared together (:func:`uqvision.predictors.group_predictors`): the
members of one ``uqvision train --members K`` run (``deep_ensemble[5]``;
``deep_ensemble_tta[5]`` for TTA caches) and each of :attr:`ShiftConfig.ensembles`
(``--ensemble NAME=M1,M2``), scored as ONE predictor on the mean of the members' softmaxes.
With a ``baseline`` model it adds the mean corruption error and the relative mean corruption
error of every predictor (:mod:`uqmetrics.metrics.shift`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import xarray as xr
from uqmetrics import InputError, stamp_result
from uqmetrics.metrics.calibration import softmax
from uqmetrics.metrics.scoring import score_metrics
from uqmetrics.metrics.shift import (
    masked_accuracy,
    mean_corruption_error,
    real_accuracy,
    relative_mean_corruption_error,
)

from ...data.corruptions import BENCHMARK_CORRUPTIONS, CORRUPTIONS
from ...evalsets import Overlay, apply_overlay, read_overlay, real_overlay
from ...predictors import (
    PredictorProbs,
    declared_ensembles,
    fit_predictor_temperature,
)
from ...provenance import entry_provenance, predictor_rows
from ...published import PUBLISHED_BASELINES, published_baseline_errors
from ..base import check_clean_members, clean_study_predictors

__all__ = ["CALIBRATIONS", "MASKED_EVAL_SETS", "MCE_EXCLUDED", "SHIFT_METRICS", "ShiftConfig",
           "score_shift"]

#: The metrics scored per (model, corruption, severity), per natural shift set and on the
#: clean set (registered in :data:`uqmetrics.metrics.registry.METRICS`).
SHIFT_METRICS = ("accuracy", "nll", "brier", "ece", "aurc", "auroc")
#: The ``calibration`` coordinate: un-scaled probabilities, then temperature-scaled ones.
CALIBRATIONS = ("none", "temperature")
#: Natural shift sets of a subset of the model's classes, also scored by
#: :func:`uqmetrics.metrics.shift.masked_accuracy` over the classes the set has (ImageNet-A and -R:
#: 200 of the 1,000; Hendrycks et al. 2021).
MASKED_EVAL_SETS = ("imagenet-a", "imagenet-r")
#: ImageNet-C's 4 held-out corruptions (speckle noise, Gaussian blur, spatter, saturate):
#: Hendrycks & Dietterich (2019) keep them for validation, so they are scored like every
#: corruption but never enter the (relative) mCE, the mean over the 15 benchmark ones.
MCE_EXCLUDED = tuple(c for c in CORRUPTIONS if c not in BENCHMARK_CORRUPTIONS)


@dataclass(frozen=True)
class ShiftConfig:
    """Options of :func:`score_shift`.

    Attributes
    ----------
    calibration_size : float
        Fraction (0, 1) of the calibration caches' samples the temperature is fitted on (drawn
        with ``seed``, the same samples for every predictor); where the calibration set is
        also the test set, the clean row is scored on the rest. At least
        :data:`uqmetrics.metrics.calibration.MIN_TEMPERATURE_SAMPLES` samples (5), else refused; a
        temperature fitted on a bound of the search (0.01 or 100) is refused too
        (:func:`uqvision.predictors.fit_predictor_temperature`).
    calibration : str or None
        The ``dataset_name`` of the clean set the temperature is fitted on (``--calibration``);
        default the only set of role ``calibration``, else the test set (split).
    test : str or None
        The ``dataset_name`` of the clean test set, the clean row (``--test``); default the
        only set of role ``test`` (but the calibration set named), else the calibration set's
        held-out rest. Never a set of role ``fit``.
    baseline : str or None
        The predictor (a ``model`` attr, or an ensemble row's name) the corruption errors are
        normalised by (mCE, relative mCE), or a published baseline
        (:data:`uqvision.published.PUBLISHED_BASELINES`: ``published:alexnet``, AlexNet's
        published top-1 errors per corruption and severity: mCE only, its clean error is not
        published with them); ``None``: no corruption errors.
    seed : int
        Seed of the calibration split.
    ensembles : dict
        Declared ensemble rows, ``{name: (member, ...)}`` (or ``NAME=M1,M2`` strings:
        :func:`uqvision.roles.declared_ensembles`), besides the members of each ``uqvision
        train --members K`` run.
    overlay : str or None
        The label sets of the caches of role ``relabelled``: ReaL's ``real.json`` (a JSON
        list, :func:`uqvision.evalsets.real_overlay`) or a label-overlay file
        (:func:`uqvision.evalsets.read_overlay`); not needed for caches that hold a
        ``label_set`` already (:func:`uqvision.evalsets.apply_overlay`).
    """

    calibration_size: float = 0.5
    calibration: str | None = None
    test: str | None = None
    baseline: str | None = None
    seed: int = 0
    ensembles: dict | None = None
    overlay: str | None = None

    def __post_init__(self):
        if not 0.0 < float(self.calibration_size) < 1.0:
            raise InputError(f"calibration_size must be a fraction in (0, 1), got "
                             f"{self.calibration_size!r}")
        object.__setattr__(self, "ensembles", declared_ensembles(self.ensembles))
        if self.overlay is not None:
            object.__setattr__(self, "overlay", os.fspath(self.overlay))


def _log(p: np.ndarray) -> np.ndarray:
    return np.log(np.clip(p, 1e-300, None))


def _scaled(p: np.ndarray, t: float) -> np.ndarray:
    return softmax(_log(p), temperature=t)


def _scores(labels: np.ndarray, p: np.ndarray, t: float) -> np.ndarray:
    """(metric, calibration) values; accuracy is the same in both columns (temperature
    scaling keeps the order of the classes: ``score_metrics(..., unscaled=...)``)."""
    unscaled = score_metrics(labels, p, metrics=SHIFT_METRICS)
    scaled = score_metrics(labels, _scaled(p, t), metrics=SHIFT_METRICS, unscaled=unscaled)
    return np.array([[c[m] for c in (unscaled, scaled)] for m in SHIFT_METRICS])


def _split(n: int, config: ShiftConfig) -> tuple[np.ndarray, np.ndarray]:
    """``(fit, rest)`` sample indices of a calibration set of ``n`` samples: a function of
    ``(seed, n)`` only, so every predictor on the same calibration folder (an ensemble and its
    members) is fitted on the same samples, whatever the other predictors."""
    k = min(max(1, round(config.calibration_size * n)), n - 1)
    perm = np.random.default_rng(config.seed).permutation(n)
    return np.sort(perm[:k]), np.sort(perm[k:])


def _load_overlay(path: str, sample_ids: list[str]) -> Overlay:
    """ReaL's ``real.json`` (a JSON list) or a label-overlay file (a JSON object)."""
    try:
        head = Path(path).read_text(encoding="utf-8").lstrip()[:1]
    except FileNotFoundError:
        raise InputError(f"overlay file {path!r} does not exist (overlay: ReaL's real.json or "
                         "a label-overlay file)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"overlay file {path!r} cannot be read: {exc}") from None
    return real_overlay(path, sample_ids) if head == "[" else read_overlay(path)


def _class_mask(cache: xr.Dataset) -> np.ndarray:
    """The classes of a natural shift set: the cache's ``in_folder`` (the classes with an image
    folder, written by ``uqvision predict``), else the classes among its labels."""
    if "in_folder" in cache.coords or "in_folder" in cache:
        return np.asarray(cache["in_folder"].values).astype(bool)
    mask = np.zeros(cache.sizes["class"], bool)
    labels = np.asarray(cache["label"].values, np.int64)
    mask[labels[labels >= 0]] = True
    return mask


def score_shift(caches: Iterable[str | os.PathLike] | str | os.PathLike,
                config: ShiftConfig | None = None) -> xr.Dataset:
    """Score models, and ensembles of them, under distribution shift (module docstring).

    Parameters
    ----------
    caches : path or iterable of paths
        Cache files or folders of them (:func:`uqvision.cache.index_caches`), each model's of
        the test and calibration sets and of the shifted or relabelled ones.
    config : ShiftConfig, optional

    Returns
    -------
    xarray.Dataset
        A result file of protocol ``shift``. Dimensions: ``model`` (every model, then the
        ensemble rows), ``corruption``, ``severity`` (of the corrupted caches; empty without
        any), ``shift_set`` (the ``dataset_name`` of every natural shift set; empty without
        any), ``calibration`` (:data:`CALIBRATIONS`). Coordinates on ``model``: ``kind``
        (``single`` or ``ensemble``), ``mode`` (the prediction mode) and ``members`` (int, 1
        for a model); on ``shift_set``: ``shift_eval_set`` (its evaluation set). Variables:

        ``<metric>`` (model, corruption, severity, calibration)
            Each of :data:`SHIFT_METRICS`; NaN where a member is missing.
        ``clean_<metric>`` (model, calibration)
            On the clean set.
        ``set_<metric>`` (model, shift_set, calibration)
            On each natural shift set (all the model's classes: ``set_accuracy`` is the
            1000-class accuracy); NaN where the predictor has no caches of the set.
        ``masked_accuracy`` (model, shift_set)
            :func:`uqmetrics.metrics.shift.masked_accuracy`, the arg-max over the set's classes only,
            for the sets of :data:`MASKED_EVAL_SETS` (NaN for the others); the mask is the
            cache's ``in_folder`` (the classes with an image folder: ImageNet-A/R's 200),
            else the classes among its labels. No calibration dim: a temperature never moves
            the arg-max.
        ``n_masked_classes`` (model, shift_set)
            The size of that mask (0 where no masked accuracy).
        ``real_accuracy`` (model)
            With caches of role ``relabelled`` (one dataset): :func:`uqmetrics.metrics.shift.
            real_accuracy` under the overlay's label sets (ReaL), images without a label left
            out; NaN where the predictor has no such caches.
        ``n_real_labelled`` (model)
            The images with at least one valid label (ReaL accuracy's denominator).
        ``temperature``, ``n_calibration`` (model)
            The fitted temperature and the samples it was fitted on.
        ``mean_corruption_error``, ``relative_mean_corruption_error`` (model)
            With a baseline: over the corruptions with every severity for all predictors,
            except ImageNet-C's held-out ones (:data:`MCE_EXCLUDED`; attr
            ``mce_corruptions`` lists those averaged); the
            relative one is NaN with an ``UndefinedMetricWarning`` where the baseline's errors
            under a corruption do not exceed its clean error, and absent with a published
            baseline (said in ``notes``).

        Attr ``ensemble_members``: JSON object, ensemble row -> its member models;
        ``scored_sets``: JSON object, ``test`` and ``calibration`` -> the dataset scored;
        ``notes``: ensembles of several architectures; ``caches`` and ``entries``: each row's
        caches (an ensemble's: its members') and their provenance (:mod:`uqvision.provenance`).

    Raises
    ------
    uqmetrics.InputError
        No caches; no test or calibration set, or two candidates of a role, or a named one
        of another role (``fit``) (:func:`uqvision.predictors.pick_test_and_calibration`); a
        model without caches of them (named); caches of several modes for one
        model, a temperature fitted on fewer than
        :data:`uqmetrics.metrics.calibration.MIN_TEMPERATURE_SAMPLES` images or on a bound of the
        search (naming the model and the bound), an unknown baseline, no shifted or relabelled caches, caches of several
        relabelled datasets, relabelled caches without label sets and no ``overlay``.
    """
    config = config or ShiftConfig()
    # complete caches only (index_caches skips the others with a SkippedCacheWarning):
    # (model, dataset_name) -> caches; dataset_name -> eval-set record
    read, test, cal, preds, notes = clean_study_predictors(caches, config)
    groups, sets, checksums = read.groups, read.sets, read.checksums
    names = [p.name for p in preds]
    corrupted = {n: s for n, s in sets.items() if s["role"] == "shifted" and s["corruption"]}
    natural = sorted(n for n, s in sets.items() if s["role"] == "shifted" and not s["corruption"])
    relabelled = sorted(n for n, s in sets.items() if s["role"] == "relabelled")
    if not (corrupted or natural or relabelled):
        raise InputError("no caches of a shifted or relabelled evaluation set: corrupted "
                         "members (attrs corruption and severity, e.g. uqvision predict "
                         "--eval-set imagenet-c), natural shift sets (role shifted, e.g. "
                         "--eval-set imagenet-v2) or relabelled ones (--eval-set imagenet-real)")
    if len(relabelled) > 1:
        raise InputError(f"caches of several relabelled datasets {relabelled}: score one at a "
                         "time (one overlay)")
    corruptions = sorted({s["corruption"] for s in corrupted.values()})
    severities = sorted({s["severity"] for s in corrupted.values()})
    published = config.baseline in PUBLISHED_BASELINES
    if config.baseline is not None and not published and config.baseline not in names:
        raise InputError(f"baseline model {config.baseline!r} has no caches; models: {names}; "
                         f"or a published baseline: {', '.join(PUBLISHED_BASELINES)}")

    n_pred, n_cal_dim = len(preds), len(CALIBRATIONS)
    shift_vals = np.full((len(SHIFT_METRICS), n_pred, len(corruptions), len(severities),
                          n_cal_dim), np.nan)
    clean_vals = np.full((len(SHIFT_METRICS), n_pred, n_cal_dim), np.nan)
    set_vals = np.full((len(SHIFT_METRICS), n_pred, len(natural), n_cal_dim), np.nan)
    masked = np.full((n_pred, len(natural)), np.nan)
    n_masked = np.zeros((n_pred, len(natural)), np.int64)
    real = np.full(n_pred, np.nan)
    n_real = np.zeros(n_pred, np.int64)
    temps, n_cal = np.empty(n_pred), np.empty(n_pred, np.int64)

    # clean data: every predictor's temperature and clean row
    check_clean_members(preds, groups, test, cal)
    for i, pred in enumerate(preds):
        labels, p = PredictorProbs(groups, cal)(pred)
        n = labels.shape[0]
        if n < 2:
            raise InputError(f"model {pred.name!r}: calibration dataset {cal!r} has {n} "
                             "sample(s), need at least 2")
        fit, rest = _split(n, config)
        temps[i] = fit_predictor_temperature(pred.name, cal, _log(p[fit]), labels[fit],
                                             "calibration_size", config.calibration_size, n)
        n_cal[i] = fit.size
        if test == cal:
            clean_vals[:, i] = _scores(labels[rest], p[rest], temps[i])
        else:
            clean_vals[:, i] = _scores(*PredictorProbs(groups, test)(pred), temps[i])

    # shifted and relabelled data, one dataset at a time (its member probabilities shared)
    overlay = None
    for name in sorted(corrupted) + natural + relabelled:
        s, probs = sets[name], PredictorProbs(groups, name)
        for i, pred in enumerate(preds):
            if not probs.has(pred):
                continue
            labels, p = probs(pred)
            if name in corrupted:
                c, v = corruptions.index(s["corruption"]), severities.index(s["severity"])
                shift_vals[:, i, c, v] = _scores(labels, p, temps[i])
            elif name in natural:
                j = natural.index(name)
                set_vals[:, i, j] = _scores(labels, p, temps[i])
                if s["eval_set"] in MASKED_EVAL_SETS:
                    mask = _class_mask(probs.first(pred))
                    masked[i, j] = masked_accuracy(labels, p, mask)
                    n_masked[i, j] = int(mask.sum())
            else:
                cache = probs.first(pred)
                if "label_set" not in cache:
                    if config.overlay is None:
                        raise InputError(
                            f"caches of relabelled dataset {name!r} (eval set "
                            f"{s['eval_set']!r}) hold no label sets: give their labels "
                            "(overlay: ReaL's real.json or a label-overlay file)")
                    if overlay is None:
                        overlay = _load_overlay(config.overlay,
                                                [str(x) for x in cache["sample"].values])
                    cache = apply_overlay(cache, overlay)
                label_sets = np.asarray(cache["label_set"].values, bool)
                real[i] = real_accuracy(p, label_sets)
                n_real[i] = int(label_sets.any(axis=1).sum())

    dims = ("model", "corruption", "severity", "calibration")
    data = {m: (dims, shift_vals[j]) for j, m in enumerate(SHIFT_METRICS)}
    data.update({f"clean_{m}": (("model", "calibration"), clean_vals[j])
                 for j, m in enumerate(SHIFT_METRICS)})
    data.update({f"set_{m}": (("model", "shift_set", "calibration"), set_vals[j])
                 for j, m in enumerate(SHIFT_METRICS)})
    data["masked_accuracy"] = (("model", "shift_set"), masked)
    data["n_masked_classes"] = (("model", "shift_set"), n_masked)
    data["temperature"] = ("model", temps)
    data["n_calibration"] = ("model", n_cal)
    metrics: dict = {m: m for m in SHIFT_METRICS}
    metrics.update({f"clean_{m}": m for m in SHIFT_METRICS})
    metrics.update({f"set_{m}": m for m in SHIFT_METRICS})
    metrics["masked_accuracy"] = ("masked_accuracy", True)
    if relabelled:
        data["real_accuracy"] = ("model", real)
        data["n_real_labelled"] = ("model", n_real)
        metrics["real_accuracy"] = ("real_accuracy", True)
    if config.baseline is not None:
        acc = shift_vals[SHIFT_METRICS.index("accuracy"), ..., 0]  # (model, corr, sev)
        complete = ~np.isnan(acc).any(axis=(0, 2)) & np.array(
            [c not in MCE_EXCLUDED for c in corruptions], dtype=bool)
        if not complete.any():
            raise InputError("no corruption outside ImageNet-C's held-out ones ("
                             f"{', '.join(MCE_EXCLUDED)}) has caches of every severity for "
                             "every model: the corruption errors are undefined")
        mce_corruptions = [c for c, k in zip(corruptions, complete, strict=True) if k]
        left_out = sorted(set(corruptions) & set(MCE_EXCLUDED))
        if left_out:
            notes.append(f"mCE over {len(mce_corruptions)} corruptions; ImageNet-C's "
                         f"held-out {', '.join(left_out)} scored but not in the mCE "
                         "(Hendrycks & Dietterich 2019)")
        err = 1.0 - acc[:, complete]
        clean_err = 1.0 - clean_vals[SHIFT_METRICS.index("accuracy"), :, 0]
        if published:  # AlexNet's published errors; no clean error: no relative mCE
            base = published_baseline_errors(config.baseline, mce_corruptions, severities)
            notes.append(f"mCE against {config.baseline} (AlexNet's published errors, "
                         "uqvision.published); relative mCE not computed: AlexNet's clean "
                         "error is not published with them")
        else:
            b = names.index(config.baseline)
            base = err[b]
        data["mean_corruption_error"] = ("model", np.array(
            [mean_corruption_error(err[i], base) for i in range(n_pred)]))
        metrics["mean_corruption_error"] = ("mean_corruption_error", False)
        if not published:
            data["relative_mean_corruption_error"] = ("model", np.array(
                [relative_mean_corruption_error(err[i], clean_err[i], err[b], clean_err[b])
                 for i in range(n_pred)]))
            metrics["relative_mean_corruption_error"] = ("relative_mean_corruption_error",
                                                         False)
    ds = xr.Dataset(data, coords={
        "model": names, "kind": ("model", [p.kind for p in preds]),
        "mode": ("model", [p.mode for p in preds]),
        "members": ("model", np.array([len(p.members) for p in preds], np.int64)),
        "corruption": corruptions, "severity": np.array(severities, np.int64),
        "shift_set": natural,
        "shift_eval_set": ("shift_set", [sets[n]["eval_set"] for n in natural]),
        "calibration": list(CALIBRATIONS)})
    ensembles = {p.name: list(p.members) for p in preds if p.kind == "ensemble"}
    return stamp_result(ds, "shift", input_checksums=sorted(set(checksums)), metrics=metrics,
                        config=asdict(config), seed=config.seed, notes="; ".join(notes) or None,
                        extra={"ensemble_members": json.dumps(ensembles),
                               **({"mce_corruptions": json.dumps(mce_corruptions)}
                                  if config.baseline is not None else {}),
                               "scored_sets": json.dumps({"test": test, "calibration": cal}),
                               **entry_provenance(predictor_rows(preds, groups), "model")})
