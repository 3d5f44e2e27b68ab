"""Scores of the distribution-shift protocol (Ovadia et al. 2019; docs/conventions.md#v-5).

:func:`score_shift` reads the prediction caches of one or more models on their clean test
distribution (caches of role ``clean``) and on corrupted copies of it (members of an
expanded evaluation set such as ``imagenet-c``: attrs ``corruption`` and ``severity``), and
scores every (model, corruption, severity) and the clean set, each un-scaled and after
temperature scaling with the temperature fitted on a held-out fraction of the model's clean
calibration caches (Ovadia's protocol: the temperature comes from clean validation data and is
never refitted under shift). With a ``baseline`` model it adds the mean corruption error and
the relative mean corruption error of every model (:mod:`uqmetrics.shift`).
"""

from __future__ import annotations

import os
import warnings
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import xarray as xr
from uqmetrics import InputError, UndefinedMetricWarning, input_checksum, stamp_result
from uqmetrics.calibration import fit_temperature, softmax
from uqmetrics.scoring import score_metrics
from uqmetrics.shift import mean_corruption_error, relative_mean_corruption_error

from ...cache import check_aligned, index_caches, read_cache
from ...evalsets import cache_eval_set

__all__ = ["CALIBRATIONS", "SHIFT_METRICS", "ShiftConfig", "score_shift"]

#: The metrics scored per (model, corruption, severity) and on the clean set (registered in
#: :data:`uqmetrics.registry.METRICS`).
SHIFT_METRICS = ("accuracy", "nll", "brier", "ece", "aurc", "auroc")
#: The ``calibration`` coordinate: un-scaled probabilities, then temperature-scaled ones.
CALIBRATIONS = ("none", "temperature")


@dataclass(frozen=True)
class ShiftConfig:
    """Options of :func:`score_shift`.

    Attributes
    ----------
    calibration_size : float
        Fraction (0, 1) of the calibration caches' samples the temperature is fitted on (drawn
        with ``seed``); where the calibration set is also the clean evaluation set, the clean
        row is scored on the rest.
    calibration_dataset : str or None
        The ``dataset_name`` of the clean caches the temperature is fitted on; default ``val``
        where a model has clean caches of that name, else its only clean dataset.
    clean_dataset : str or None
        The ``dataset_name`` of the clean caches of the clean row; default the clean dataset
        other than the calibration one (``test``), else the calibration set's held-out rest.
    baseline : str or None
        The model (``model`` attr) the corruption errors are normalised by (mCE, relative
        mCE); ``None``: no corruption errors.
    seed : int
        Seed of the calibration split.
    """

    calibration_size: float = 0.5
    calibration_dataset: str | None = None
    clean_dataset: str | None = None
    baseline: str | None = None
    seed: int = 0

    def __post_init__(self):
        if not 0.0 < float(self.calibration_size) < 1.0:
            raise InputError(f"calibration_size must be a fraction in (0, 1), got "
                             f"{self.calibration_size!r}")


def _probs(caches: list[xr.Dataset]) -> tuple[np.ndarray, np.ndarray]:
    """``(labels, probs)`` of one model on one dataset: the softmax averaged over every cache
    (TTA passes, samples) and the pass dim of each."""
    check_aligned(caches)
    total, count = None, 0
    for c in caches:
        p = softmax(c["logits"].values)
        p = p[None] if p.ndim == 2 else p
        s = p.sum(axis=0)
        total = s if total is None else total + s
        count += p.shape[0]
    return np.asarray(caches[0]["label"].values, np.int64), total / count


def _log(p: np.ndarray) -> np.ndarray:
    return np.log(np.clip(p, 1e-300, None))


def _scaled(p: np.ndarray, t: float) -> np.ndarray:
    return softmax(_log(p), temperature=t)


def _scores(labels: np.ndarray, p: np.ndarray, t: float) -> np.ndarray:
    """(metric, calibration) values."""
    out = np.empty((len(SHIFT_METRICS), len(CALIBRATIONS)))
    for j, q in enumerate((p, _scaled(p, t))):
        vals = score_metrics(labels, q, metrics=SHIFT_METRICS)
        out[:, j] = [vals[m] for m in SHIFT_METRICS]
    return out


def _relative_mce(err, clean_err, base_err, base_clean_err, baseline: str) -> float:
    """:func:`uqmetrics.shift.relative_mean_corruption_error`; NaN with an
    :class:`~uqmetrics.UndefinedMetricWarning` where the baseline's errors under some
    corruption do not exceed its clean error (the denominator)."""
    try:
        return relative_mean_corruption_error(err, clean_err, base_err, base_clean_err)
    except ValueError as exc:
        warnings.warn(f"relative mCE against baseline {baseline!r} is undefined ({exc}); "
                      "returning nan", UndefinedMetricWarning, stacklevel=3)
        return float("nan")


def _pick(kind: str, given: str | None, names: list[str], default: str | None,
          model: str) -> str:
    if given is not None:
        if given not in names:
            raise InputError(f"model {model!r} has no clean caches of {kind} dataset {given!r}; "
                             f"its clean datasets: {names}")
        return given
    if default is not None and default in names:
        return default
    if len(names) == 1:
        return names[0]
    raise InputError(f"model {model!r} has clean caches of several datasets {names}: choose "
                     f"the {kind} dataset (--{kind}-dataset)")


def score_shift(caches: Iterable[str | os.PathLike] | str | os.PathLike,
                config: ShiftConfig | None = None) -> xr.Dataset:
    """Score models under distribution shift (module docstring).

    Parameters
    ----------
    caches : path or iterable of paths
        Cache files or folders of them (:func:`uqvision.cache.index_caches`).
    config : ShiftConfig, optional

    Returns
    -------
    xarray.Dataset
        ``<metric>`` (model, corruption, severity, calibration) for each of
        :data:`SHIFT_METRICS` (NaN where a member is missing), ``clean_<metric>`` (model,
        calibration), ``temperature`` and ``n_calibration`` (model); with a baseline
        ``mean_corruption_error`` and ``relative_mean_corruption_error`` (model, over the
        corruptions with every severity for all models). A result file of protocol ``shift``.

    Raises
    ------
    uqmetrics.InputError
        No caches, a model without clean caches (named), caches of several modes for one
        model, an unknown baseline, no corrupted caches.
    """
    config = config or ShiftConfig()
    # complete caches only (index_caches skips the others with a SkippedCacheWarning)
    paths = [i.path for i in index_caches(
        [caches] if isinstance(caches, (str, os.PathLike)) else caches)]
    if not paths:
        raise InputError("no complete prediction cache found")
    # (model, dataset_name) -> caches; dataset_name -> eval-set record
    groups: dict[tuple[str, str], list[xr.Dataset]] = defaultdict(list)
    sets: dict[str, dict] = {}
    modes: dict[str, set] = defaultdict(set)
    checksums = []
    for path in paths:
        ds = read_cache(path)
        if "logits" not in ds:
            raise InputError(f"cache {Path(path).name!r} has no logits")
        model, name = str(ds.attrs["model"]), str(ds.attrs["dataset_name"])
        groups[model, name].append(ds)
        sets[name] = cache_eval_set(ds.attrs)
        modes[model].add(str(ds.attrs["mode"]))
        checksums.append(input_checksum(ds))
    for model, m in modes.items():
        if len(m) > 1:
            raise InputError(f"model {model!r} has caches of several prediction modes "
                             f"{sorted(m)}: score the caches of one mode")
    models = sorted(modes)
    shifted = {n: s for n, s in sets.items() if s["corruption"]}
    if not shifted:
        raise InputError("no caches of a corrupted evaluation set (attrs corruption and "
                         "severity, e.g. uqvision predict --eval-set imagenet-c)")
    corruptions = sorted({s["corruption"] for s in shifted.values()})
    severities = sorted({s["severity"] for s in shifted.values()})
    if config.baseline is not None and config.baseline not in models:
        raise InputError(f"baseline model {config.baseline!r} has no caches; models: {models}")

    rng = np.random.default_rng(config.seed)
    shape = (len(models), len(corruptions), len(severities), len(CALIBRATIONS))
    shift_vals = np.full((len(SHIFT_METRICS),) + shape, np.nan)
    clean_vals = np.full((len(SHIFT_METRICS), len(models), len(CALIBRATIONS)), np.nan)
    temps, n_cal = np.empty(len(models)), np.empty(len(models), np.int64)
    for i, model in enumerate(models):
        clean = sorted(n for (m, n) in groups if m == model and sets[n]["role"] == "clean")
        if not clean:
            raise InputError(f"model {model!r} has no clean caches (role 'clean', e.g. its "
                             "validation and test folders): its temperature is fitted on clean "
                             "data, predict them first")
        cal = _pick("calibration", config.calibration_dataset, clean, "val", model)
        labels, p = _probs(groups[model, cal])
        n = labels.shape[0]
        if n < 2:
            raise InputError(f"model {model!r}: calibration dataset {cal!r} has {n} sample(s), "
                             "need at least 2")
        k = min(max(1, round(config.calibration_size * n)), n - 1)
        perm = rng.permutation(n)
        fit, rest = np.sort(perm[:k]), np.sort(perm[k:])
        temps[i] = fit_temperature(_log(p[fit]), labels[fit])
        n_cal[i] = k
        others = [c for c in clean if c != cal]
        if config.clean_dataset is not None or others:
            ev = _pick("clean", config.clean_dataset, others or clean, None, model)
        else:
            ev = cal
        if ev == cal:
            clean_vals[:, i] = _scores(labels[rest], p[rest], temps[i])
        else:
            clean_vals[:, i] = _scores(*_probs(groups[model, ev]), temps[i])
        for name, s in shifted.items():
            if (model, name) not in groups:
                continue
            c, v = corruptions.index(s["corruption"]), severities.index(s["severity"])
            shift_vals[:, i, c, v] = _scores(*_probs(groups[model, name]), temps[i])

    dims = ("model", "corruption", "severity", "calibration")
    data = {m: (dims, shift_vals[j]) for j, m in enumerate(SHIFT_METRICS)}
    data.update({f"clean_{m}": (("model", "calibration"), clean_vals[j])
                 for j, m in enumerate(SHIFT_METRICS)})
    data["temperature"] = ("model", temps)
    data["n_calibration"] = ("model", n_cal)
    metrics: dict = {m: m for m in SHIFT_METRICS}
    metrics.update({f"clean_{m}": m for m in SHIFT_METRICS})
    if config.baseline is not None:
        acc = shift_vals[SHIFT_METRICS.index("accuracy"), ..., 0]  # (model, corr, sev)
        complete = ~np.isnan(acc).any(axis=(0, 2))
        if not complete.any():
            raise InputError("no corruption has caches of every severity for every model: "
                             "the corruption errors are undefined")
        err = 1.0 - acc[:, complete]
        clean_err = 1.0 - clean_vals[SHIFT_METRICS.index("accuracy"), :, 0]
        b = models.index(config.baseline)
        data["mean_corruption_error"] = ("model", np.array(
            [mean_corruption_error(err[i], err[b]) for i in range(len(models))]))
        data["relative_mean_corruption_error"] = ("model", np.array(
            [_relative_mce(err[i], clean_err[i], err[b], clean_err[b], config.baseline)
             for i in range(len(models))]))
        metrics["mean_corruption_error"] = ("mean_corruption_error", False)
        metrics["relative_mean_corruption_error"] = ("relative_mean_corruption_error", False)
    ds = xr.Dataset(data, coords={"model": models, "corruption": corruptions,
                                  "severity": np.array(severities, np.int64),
                                  "calibration": list(CALIBRATIONS)})
    return stamp_result(ds, "shift", input_checksums=sorted(set(checksums)), metrics=metrics,
                        config=asdict(config), seed=config.seed)
