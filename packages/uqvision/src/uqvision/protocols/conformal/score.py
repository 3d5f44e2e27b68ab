"""Scores of the conformal-prediction protocol (Angelopoulos et al. 2021; docs/conventions.md#v-7).

:func:`score_conformal` reads the prediction caches of one or more models on clean data (caches
of role ``clean``: a validation and a test folder), and optionally on corrupted copies of the
test images (members of an expanded evaluation set such as ``imagenet-c``: attrs
``corruption`` and ``severity``) and on natural shift sets (role ``shifted`` without a
corruption), and scores the prediction sets of every predictor (Angelopoulos et al. 2021,
Table 1):

- ``topk``: the Top-K baseline, a fixed set size ``k`` (randomized between ``k - 1`` and
  ``k``) chosen on each trial's calibration draw (:func:`uqmetrics.metrics.conformal.topk_threshold`);
- ``naive``: the Naive baseline as the official code computes it (``gcq`` at ``1 - alpha``):
  the classes in descending probability until their cumulative mass passes ``1 - alpha``, the
  last of them kept at random (the paper's randomization; sets can be empty); no calibration;
- ``naive_deterministic``: the same without randomization (the last class always kept, never
  empty): the protocol's Naive before issue 38;
- ``thr``, ``aps``, ``raps``: split-conformal sets of the score functions of
  :mod:`uqmetrics.metrics.conformal` (LAC/THR, adaptive prediction sets, regularised APS), calibrated
  on ``n_cal`` images drawn at random from the conformal pool and evaluated on the rest of it,
  over ``trials`` draws (:func:`uqmetrics.metrics.conformal.conformal_trials`);
- ``aps_mondrian``: class-conditional (Mondrian) APS, one quantile per class.

Each at every level of :attr:`ConformalConfig.alphas` and calibration (:data:`CALIBRATIONS`):
``none``, un-scaled; ``temperature``, the temperature fitted on a held-out fraction
(:attr:`ConformalConfig.temperature_size`) of the predictor's clean calibration caches, images
that never enter a conformal split; ``platt``, RAPS's Table 1: a temperature fitted on each
trial's calibration draw (:func:`uqmetrics.metrics.conformal.trial_temperatures`, the official code's
"Platt" scaling). Every statistic is kept as the mean, the standard deviation and the median
over the trials (Table 1 reports medians: :data:`TABLE1_METHODS`, ``calibration="platt"``).
The conformal pool is the test set where it is another set than the
calibration set, else the calibration set's rest. Both are taken by role and name
(:func:`uqvision.predictors.pick_test_and_calibration`: ``--test``, ``--calibration``, else
the only set of that role; never a set of role ``fit``; two candidates are refused).

Under shift, every trial's sets are calibrated on the trial's clean calibration draw and
evaluated on each corrupted member and each natural shift set: the coverage lost under shift.
Where the pool is a clean dataset of its own (``test``) and the corrupted images are copies of
its images (their sample ids are the pool's but for the suffix, as
:func:`uqvision.data.corruptions.make_corrupted_folder` names them, with the same labels), the
copies of the trial's calibration images are left out of its evaluation; otherwise (a natural
shift set, a pool that is the calibration dataset's rest) every shifted image is evaluated.

The predictors (the ``model`` dimension) are every model and one ensemble row per group of
models declared together: the members of one ``uqvision train --members K`` run, and each of
:attr:`ConformalConfig.ensembles` (:func:`uqvision.predictors.group_predictors`), as the shift
protocol builds them.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import PurePosixPath

import numpy as np
import xarray as xr
from uqmetrics import InputError, stamp_result
from uqmetrics.metrics import conformal as cp
from uqmetrics.metrics.calibration import softmax

from ...exceptions import UqvisionWarning
from ...predictors import Predictor, PredictorProbs, declared_ensembles, fit_predictor_temperature
from ...provenance import entry_provenance, predictor_rows
from ..base import check_clean_members, clean_study_predictors
from . import MAX_TRIALS

__all__ = ["CALIBRATIONS", "CLASS_ALPHA", "CLASS_METHOD", "CONFORMAL_METHODS", "CURVE_ALPHAS",
           "CURVE_METHODS", "TABLE1_METHODS", "TRIAL_STATS", "ConformalConfig",
           "ShortCalibrationWarning", "min_n_cal", "score_conformal"]

#: The ``method`` coordinate: the baselines (Top-K, Naive, the deterministic Naive), then the
#: conformal sets (Angelopoulos et al. 2021, Table 1, with THR and class-conditional APS).
CONFORMAL_METHODS = ("topk", "naive", "naive_deterministic", "thr", "aps", "raps",
                     "aps_mondrian")
#: The methods of RAPS's Table 1, in its column order.
TABLE1_METHODS = ("topk", "naive", "aps", "raps")
#: The ``calibration`` coordinate: un-scaled probabilities, the temperature fitted on held-out
#: calibration images, and (Table 1) a temperature fitted on each trial's calibration draw.
CALIBRATIONS = ("none", "temperature", "platt")
#: The per-trial statistics of :func:`uqmetrics.metrics.conformal.conformal_trials` kept (mean over the
#: trials as ``<stat>``, their standard deviation as ``<stat>_std``, their median as
#: ``<stat>_median``).
TRIAL_STATS = ("coverage", "mean_set_size", "median_set_size", "sscv", "covgap",
               "empty_fraction")
#: The levels of the coverage-and-size curve (variables ``curve_<stat>``), and its methods.
CURVE_ALPHAS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2)
CURVE_METHODS = ("naive", "aps", "raps")
#: The method and level of the per-class coverage (``class_coverage``).
CLASS_METHOD, CLASS_ALPHA = "aps", 0.1
#: Metric tags of the variables with a direction: (name, greater_is_better). Coverage has none
#: (its target is ``1 - alpha``), nor has the fraction of empty sets.
_METRIC_TAGS = {"mean_set_size": ("mean_set_size", False),
                "median_set_size": ("median_set_size", False), "sscv": ("sscv", False),
                "covgap": ("covgap", False)}


class ShortCalibrationWarning(UqvisionWarning):
    """Too few calibration images for a level: the conformal threshold is infinite and every
    set holds every class (coverage 1 whatever the model), for every trial at that ``n_cal``
    or, Mondrian, for the classes with too few images in a trial's draw
    (:func:`min_n_cal`). Said once per :func:`score_conformal`, and recorded in its result
    (``min_n_cal``, ``short_calibration``, the attr ``notes``)."""


@dataclass(frozen=True)
class ConformalConfig:
    """Options of :func:`score_conformal`.

    Attributes
    ----------
    alphas : tuple of float
        The miscoverage levels (each in (0, 1)); the sets target coverage ``1 - alpha``.
    n_cal : int or None
        Calibration images per trial, drawn from the conformal pool (the rest evaluate);
        ``None``: half the pool (rounded down).
    trials : int
        Random calibration/evaluation splits (those of
        :func:`uqmetrics.metrics.conformal.conformal_trials`), at most :data:`~uqvision.protocols.
        conformal.MAX_TRIALS`.
    temperature_size : float
        Fraction (0, 1) of the calibration dataset's images the temperature is fitted on (drawn
        with ``seed``, the same for every predictor); they never enter a conformal split. At
        least :data:`uqmetrics.metrics.calibration.MIN_TEMPERATURE_SAMPLES` images, and a temperature
        on a bound of the search is refused (:func:`uqvision.predictors.
        fit_predictor_temperature`).
    calibration : str or None
        The ``dataset_name`` of the clean set the temperature is fitted on (``--calibration``);
        default the only set of role ``calibration``, else the test set (split).
    test : str or None
        The ``dataset_name`` of the conformal pool (``--test``); default the only set of role
        ``test`` (but the calibration set named), else the calibration set's rest. Never a
        set of role ``fit``.
    ensembles : dict
        Declared ensemble rows, ``{name: (member, ...)}`` (or ``NAME=M1,M2`` strings:
        :func:`uqvision.roles.declared_ensembles`), besides the members of each ``uqvision
        train --members K`` run.
    randomized : bool
        Randomised Top-K, Naive, APS and RAPS sets (the paper's;
        :func:`uqmetrics.metrics.conformal.conformal_trials`); ``naive_deterministic`` never is.
    seed : int
        Seed of the temperature split and of the trials.
    """

    alphas: tuple[float, ...] = (0.1, 0.05)
    n_cal: int | None = None
    trials: int = 100
    temperature_size: float = 0.2
    calibration: str | None = None
    test: str | None = None
    ensembles: dict | None = None
    randomized: bool = True
    seed: int = 0

    def __post_init__(self):
        alphas = (self.alphas,) if isinstance(self.alphas, (int, float)) else tuple(self.alphas)
        if not alphas or any(not 0.0 < float(a) < 1.0 for a in alphas):
            raise InputError(f"alphas must be levels in (0, 1), got {self.alphas!r}")
        if len(set(alphas)) != len(alphas):
            raise InputError(f"alphas must be distinct, got {self.alphas!r}")
        object.__setattr__(self, "alphas", tuple(float(a) for a in alphas))
        if self.n_cal is not None and (isinstance(self.n_cal, bool) or int(self.n_cal) < 1):
            raise InputError(f"n_cal must be a positive number of images, got {self.n_cal!r}")
        if isinstance(self.trials, bool) or not 1 <= int(self.trials) <= MAX_TRIALS:
            raise InputError(f"trials must be a count in [1, {MAX_TRIALS}] (each trial holds a "
                             f"permutation of the conformal pool), got {self.trials!r}")
        if not 0.0 < float(self.temperature_size) < 1.0:
            raise InputError(f"temperature_size must be a fraction in (0, 1), got "
                             f"{self.temperature_size!r}")
        object.__setattr__(self, "ensembles", declared_ensembles(self.ensembles))


# ---------------------------------------------------------------------------------------------
# the sets


def _trial_args(method: str, alpha: float, n_cal: int, config: ConformalConfig,
                temperatures: np.ndarray | None = None) -> dict:
    """The keyword arguments of :func:`uqmetrics.metrics.conformal.conformal_trials` (and
    :func:`uqmetrics.metrics.conformal.conformal_calibrations`) for a method, each trial's probabilities
    tempered by ``temperatures`` (``platt``)."""
    kw = {"aps_mondrian": {"score": "aps", "mondrian": True},
          "naive_deterministic": {"score": "naive", "randomized": False}}.get(
        method, {"score": method})
    return {"alpha": alpha, "n_cal": n_cal, "trials": config.trials, "seed": config.seed,
            "randomized": config.randomized, "temperatures": temperatures, **kw}


def min_n_cal(method: str, alpha: float) -> int:
    """The smallest ``n_cal`` at which ``method``'s threshold at level ``alpha`` is finite.

    Parameters
    ----------
    method : str
        One of :data:`CONFORMAL_METHODS`.
    alpha : float
        The level in (0, 1).

    Returns
    -------
    int
        :func:`uqmetrics.metrics.conformal.min_calibration_size` of ``alpha``: the calibration images
        THR and APS need (``ceil((n + 1)(1 - alpha)) <= n``); RAPS's ``n_cal`` also holds its
        ``ceil(0.33 n_cal)`` tuning images (:data:`uqmetrics.metrics.conformal.RAPS_TUNE_FRACTION`);
        for ``aps_mondrian`` the images of each class a trial's draw needs; 0 for the baselines
        (``topk``, ``naive``, ``naive_deterministic``: no conformal threshold). Below it every
        set holds every class (every such class, Mondrian).

    Examples
    --------
    >>> [min_n_cal(m, 0.1) for m in CONFORMAL_METHODS]
    [0, 0, 0, 9, 9, 14, 9]
    """
    if method in ("topk", "naive", "naive_deterministic"):
        return 0
    need = cp.min_calibration_size(alpha)
    if method != "raps":
        return need
    n = need
    while n - math.ceil(cp.RAPS_TUNE_FRACTION * n) < need:
        n += 1
    return n


def _short_calibration(labels: np.ndarray, perms: np.ndarray, n_cal: int, method: str,
                       alpha: float) -> float:
    """The fraction of ``method``'s thresholds at ``alpha`` that are infinite for too few
    calibration images (:func:`min_n_cal`): 0 or 1 for a marginal method, for
    ``aps_mondrian`` the fraction of (trial, class) pairs, over the classes of the pool
    ``labels``, whose draw ``perms[:, :n_cal]`` holds too few images of the class."""
    need = min_n_cal(method, alpha)
    if method != "aps_mondrian":
        return float(n_cal < need)
    classes, y = np.unique(labels, return_inverse=True)
    drawn = y.reshape(labels.shape)[perms[:, :n_cal]]  # (trial, n_cal) class positions
    counts = np.stack([np.bincount(row, minlength=classes.size) for row in drawn])
    return float((counts < need).mean())


def _short_note(short: np.ndarray, preds: list[Predictor], n_cals: np.ndarray,
                alphas: tuple[float, ...]) -> str:
    """One line on the (method, level) pairs whose thresholds are infinite for too few
    calibration images (``short`` (model, method, alpha)), "" for none."""
    parts = []
    for k, method in enumerate(CONFORMAL_METHODS):
        for a, alpha in enumerate(alphas):
            hit = short[:, k, a] > 0
            if not hit.any():
                continue
            need = min_n_cal(method, alpha)
            if method == "aps_mondrian":
                parts.append(f"aps_mondrian at alpha {alpha:g}: up to "
                             f"{100 * short[hit, k, a].max():.0f}% of the classes' draws hold "
                             f"fewer than {need} images of their class (those classes are in "
                             "every set)")
            else:
                parts.append(f"{method} at alpha {alpha:g} needs n_cal >= {need}")
    if not parts:
        return ""
    models = [f"{p.name!r} (n_cal {n})" for p, n, s in zip(preds, n_cals, short, strict=True)
              if (s > 0).any()]
    return ("conformal: too few calibration images for some levels (the threshold, the "
            "ceil((n + 1)(1 - alpha))-th of n calibration scores, needs n >= 1/alpha - 1; "
            "below it every set holds every class and the coverage is 1 whatever the model): "
            + "; ".join(parts) + f"; models {', '.join(models)}. Give a larger --n-cal (or "
            "pool) or a larger alpha; recorded in the result (min_n_cal, short_calibration)")


def _set_stats(sets: np.ndarray, labels: np.ndarray, alpha: float) -> np.ndarray:
    """(stat, ...): the :data:`TRIAL_STATS` of sets (..., n, C) for labels (..., n)."""
    c = sets.shape[-1]
    return np.stack([np.asarray(v, np.float64) for v in (
        cp.coverage(sets, labels), cp.mean_set_size(sets), cp.median_set_size(sets),
        cp.sscv(sets, labels, alpha), cp.covgap(sets, labels, alpha, c),
        cp.empty_fraction(sets))])


# ---------------------------------------------------------------------------------------------
# the data


@dataclass
class _Data:
    """A predictor's arrays on one dataset: labels (n,), probs (n, C), and each image's sample
    id without its suffix (n,): a corrupted copy's is its source image's."""

    labels: np.ndarray
    probs: np.ndarray
    keys: list[str]

    def take(self, index: np.ndarray) -> _Data:
        return _Data(self.labels[index], self.probs[index], [self.keys[i] for i in index])


def _data(probs: PredictorProbs, pred: Predictor) -> _Data:
    """``pred``'s labels and probabilities on dataset ``probs.name``
    (:class:`~uqvision.predictors.PredictorProbs`), with its images' sample ids."""
    labels, p = probs(pred)
    return _Data(labels, p, [str(PurePosixPath(str(s)).with_suffix(""))
                             for s in probs.first(pred)["sample"].values])


def _scaled(p: np.ndarray, t: float) -> np.ndarray:
    return softmax(np.log(np.clip(p, 1e-300, None)), temperature=t)


def _temperature_split(n: int, config: ConformalConfig) -> tuple[np.ndarray, np.ndarray]:
    """``(fit, rest)`` indices of a calibration dataset of ``n`` images (a function of
    ``(seed, n)``: every predictor fits on the same images)."""
    k = min(max(1, round(config.temperature_size * n)), n - 1)
    perm = np.random.default_rng(config.seed).permutation(n)
    return np.sort(perm[:k]), np.sort(perm[k:])


def _twins(pool: _Data, shifted: _Data) -> np.ndarray | None:
    """For each shifted image, the pool image it is a copy of (the same sample id but for its
    suffix, and the same label), or None where the shifted set is not made of the pool's
    images."""
    where = {s: i for i, s in enumerate(pool.keys)}
    if len(where) != len(pool.keys):
        return None
    idx = np.array([where.get(s, -1) for s in shifted.keys], np.int64)
    if (idx < 0).any() or (pool.labels[idx] != shifted.labels).any():
        return None
    return idx


# ---------------------------------------------------------------------------------------------
# the scores


def _splits(n: int, n_cal: int, config: ConformalConfig) -> np.ndarray:
    """(T, n): the trials' permutations of the pool, as every method of
    :func:`uqmetrics.metrics.conformal.conformal_trials` draws them (the first ``n_cal`` calibrate)."""
    return cp.random_splits(n, n_cal, config.trials, np.random.default_rng(config.seed))


def _clean_stats(pool: _Data, p: cp.RankedProbs, config: ConformalConfig, n_cal: int,
                 method: str, alpha: float, temperatures: np.ndarray | None
                 ) -> tuple[np.ndarray, cp.ConformalCalibrations]:
    """(stat, trial) of ``method`` at ``alpha`` on the pool (probabilities ``p``, each trial's
    tempered by ``temperatures`` where given), those of
    :func:`uqmetrics.metrics.conformal.conformal_trials`, and the calibrations."""
    cal = cp.conformal_calibrations(p, pool.labels,
                                    **_trial_args(method, alpha, n_cal, config, temperatures))
    res = cp.evaluate_calibrations(cal, p, pool.labels)
    return np.stack([np.asarray(res[s], np.float64) for s in TRIAL_STATS]), cal


def _shift_stats(cal: cp.ConformalCalibrations, randomized: bool, labels: np.ndarray,
                 probs: cp.RankedProbs, keep: np.ndarray, config: ConformalConfig,
                 j: int) -> np.ndarray:
    """(2, trial): coverage and mean set size on a shifted set (``labels`` (m,), ``probs``:
    its probabilities, tempered by each trial's temperature of ``cal``) of each trial's sets
    calibrated on the trial's clean draw (``cal``), over the images ``keep`` (T, m) of each
    trial. The shifted images' uniforms come from ``default_rng((seed, 1 + j))`` (set ``j``);
    not ``randomized``, the constant of :func:`uqmetrics.metrics.conformal.conformal_trials` (1; 0 for
    Naive)."""
    trials, m = config.trials, labels.size
    u = (np.random.default_rng((config.seed, 1 + j)).uniform(size=(trials, m)) if randomized
         else np.full((trials, m), 0.0 if cal.score == "naive" else 1.0))
    sets = cp.calibrated_sets(cal, probs, u)
    covered = sets[:, np.arange(m), labels]
    n_kept = keep.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.stack([(covered & keep).sum(axis=1) / n_kept,
                         np.where(keep, sets.sum(axis=-1), 0).sum(axis=1) / n_kept])


def _keep(pool: _Data, shifted: _Data, perms: np.ndarray, n_cal: int) -> np.ndarray:
    """(T, m) bool: the shifted images each trial evaluates, all but the copies of the trial's
    calibration images (:func:`_twins`)."""
    trials, m = perms.shape[0], len(shifted.labels)
    twins = _twins(pool, shifted)
    if twins is None:
        return np.ones((trials, m), bool)
    drawn = np.zeros(perms.shape, bool)
    np.put_along_axis(drawn, perms[:, :n_cal], True, axis=1)
    return ~drawn[:, twins]


def _class_coverage(p: cp.RankedProbs, labels: np.ndarray, n_cal: int,
                    config: ConformalConfig) -> np.ndarray:
    """(C,): the coverage of each true class of :data:`CLASS_METHOD` sets at
    :data:`CLASS_ALPHA` over every trial's evaluation images (the trials of
    :func:`uqmetrics.metrics.conformal.conformal_trials`); NaN for a class never evaluated."""
    c = p.p.shape[1]
    cal = cp.conformal_calibrations(p, labels,
                                    **_trial_args(CLASS_METHOD, CLASS_ALPHA, n_cal, config))
    ev = cal.test
    sets = cp.calibrated_sets(cal, p, np.take_along_axis(cal.u, ev, axis=1), ev)
    y = labels[ev]
    covered = np.take_along_axis(sets, y[..., None], axis=-1)[..., 0]
    counts = np.bincount(y.ravel(), minlength=c)
    hits = np.bincount(y.ravel(), weights=covered.ravel().astype(np.float64), minlength=c)
    return np.where(counts > 0, hits / np.maximum(counts, 1), np.nan)


def score_conformal(caches: Iterable[str | os.PathLike] | str | os.PathLike,
                    config: ConformalConfig | None = None) -> xr.Dataset:
    """Score conformal prediction sets of models, and ensembles of them (module docstring).

    Parameters
    ----------
    caches : path or iterable of paths
        Cache files or folders of them (:func:`uqvision.cache.index_caches`): every model's
        clean caches, optionally its corrupted members and natural shift sets.
    config : ConformalConfig, optional

    Returns
    -------
    xarray.Dataset
        A result file of protocol ``conformal``. Dimensions: ``model`` (every model, then the
        ensemble rows), ``method`` (:data:`CONFORMAL_METHODS`), ``alpha``
        (:attr:`ConformalConfig.alphas`), ``calibration`` (:data:`CALIBRATIONS`),
        ``corruption``, ``severity`` (of the corrupted caches; empty without any),
        ``shift_set`` (natural shift sets; empty without any), ``curve_method``
        (:data:`CURVE_METHODS`), ``curve_alpha`` (:data:`CURVE_ALPHAS`), ``class``.
        Coordinates on ``model``: ``kind``, ``mode``, ``members``. Variables:

        ``<stat>``, ``<stat>_std``, ``<stat>_median`` (model, method, alpha, calibration)
            Each of :data:`TRIAL_STATS` on the clean pool: the mean over the trials, the
            trials' standard deviation (ddof 0) and their median (RAPS's Table 1 reports the
            medians of ``coverage`` and ``mean_set_size``, at ``calibration="platt"``).
        ``shift_<stat>``, ``shift_<stat>_std`` (model, method, alpha, corruption, severity,
        calibration)
            ``coverage`` and ``mean_set_size`` on each corrupted member, the sets calibrated
            on the clean draw of each trial; NaN where a member is missing.
        ``set_<stat>``, ``set_<stat>_std`` (model, method, alpha, shift_set, calibration)
            The same on each natural shift set.
        ``curve_coverage``, ``curve_mean_set_size`` (model, curve_method, curve_alpha)
            Un-scaled, mean over the trials.
        ``class_coverage`` (model, class)
            Un-scaled :data:`CLASS_METHOD` sets at :data:`CLASS_ALPHA`: the coverage of each
            true class over the trials' evaluation images (NaN for a class never evaluated).
        ``accuracy`` (model)
            Top-1 accuracy on the pool.
        ``accuracy_median``, ``top5_accuracy_median`` (model)
            Top-1 and top-5 accuracy on each trial's evaluation images, the median over the
            trials (Table 1's accuracy columns).
        ``temperature``, ``n_temperature`` (model)
            The fitted temperature (calibration ``temperature``) and the images it was fitted
            on.
        ``platt_temperature``, ``platt_temperature_std`` (model)
            The temperatures fitted on each trial's calibration draw (calibration ``platt``):
            their median and standard deviation over the trials.
        ``n_pool``, ``n_cal`` (model)
            The conformal pool's images and the calibration images per trial.
        ``min_n_cal`` (method, alpha)
            :func:`min_n_cal`: the smallest ``n_cal`` at which the method's threshold is
            finite (for ``aps_mondrian``: the images of each class a trial's draw needs).
        ``short_calibration`` (model, method, alpha)
            The fraction of the trials' thresholds (``aps_mondrian``: of the (trial, class)
            pairs, over the pool's classes) that are infinite for fewer calibration images
            than ``min_n_cal``: their sets hold every class (those classes), a coverage of 1
            that says nothing of the model. Any above 0 is also said in a
            :class:`ShortCalibrationWarning` and the attr ``notes``.

        Attrs: ``trials``, ``seed``, ``pool_dataset`` (JSON: model -> dataset),
        ``scored_sets`` (JSON: ``test`` and ``calibration`` -> the dataset), the config,
        ``ensemble_members`` (JSON), ``notes`` (too few calibration images; ensembles of
        several architectures), ``caches`` and ``entries`` (each row's caches, an ensemble's:
        its members', and their provenance: :mod:`uqvision.provenance`).

    Raises
    ------
    uqmetrics.InputError
        No caches; no test or calibration set, two candidates of a role without a choice, or
        a named one of another role (``fit``) (:func:`uqvision.predictors.
        pick_test_and_calibration`); a model without caches of them (named); caches of
        several modes for one model; caches in two class spaces (naming both files); a pool
        too small for ``n_cal``.

    Warns
    -----
    ShortCalibrationWarning
        ``n_cal`` below :func:`min_n_cal` of a method and level of ``alphas`` (or Mondrian
        classes with too few images in a draw): naming the smallest ``n_cal`` that reaches
        the level.
    """
    config = config or ConformalConfig()
    read, pool_name, cal_name, preds, ensemble_notes = clean_study_predictors(
        caches, config, one_class_space=True)
    groups, sets = read.groups, read.sets
    check_clean_members(preds, groups, pool_name, cal_name)
    corrupted = {n: s for n, s in sets.items() if s["role"] == "shifted" and s["corruption"]}
    natural = sorted(n for n, s in sets.items() if s["role"] == "shifted" and not s["corruption"])
    shift_names = sorted(corrupted) + natural
    corruptions = sorted({s["corruption"] for s in corrupted.values()})
    severities = sorted({s["severity"] for s in corrupted.values()})
    n_classes = next(iter(groups.values()))[0].sizes["class"]
    classes = [str(c) for c in next(iter(groups.values()))[0]["class"].values]

    n_pred, methods, alphas = len(preds), CONFORMAL_METHODS, config.alphas
    n_stats, shape = len(TRIAL_STATS), (len(preds), len(methods), len(alphas),
                                        len(CALIBRATIONS))
    mean, std, median = (np.full((n_stats, *shape), np.nan) for _ in range(3))
    sstat = ("coverage", "mean_set_size")
    grid = (len(sstat), n_pred, len(methods), len(alphas))
    shift_mean = np.full((*grid, len(corruptions), len(severities), len(CALIBRATIONS)), np.nan)
    shift_std = shift_mean.copy()
    set_mean = np.full((*grid, len(natural), len(CALIBRATIONS)), np.nan)
    set_std = set_mean.copy()
    curve = np.full((2, n_pred, len(CURVE_METHODS), len(CURVE_ALPHAS)), np.nan)
    class_cov = np.full((n_pred, n_classes), np.nan)
    accuracy, temps = np.empty(n_pred), np.empty(n_pred)
    top_k, platt_t = np.empty((2, n_pred)), np.empty((2, n_pred))
    n_temp, n_pool, n_cals = (np.empty(n_pred, np.int64) for _ in range(3))
    short = np.zeros((n_pred, len(methods), len(alphas)))
    pools: dict[str, str] = {}
    probs = {name: PredictorProbs(groups, name) for name in sets}
    pick = [TRIAL_STATS.index(s) for s in sstat]

    for i, pred in enumerate(preds):
        cal = _data(probs[cal_name], pred)
        if len(cal.labels) < 2:
            raise InputError(f"model {pred.name!r}: calibration dataset {cal_name!r} has "
                             f"{len(cal.labels)} image(s), need at least 2")
        fit, rest = _temperature_split(len(cal.labels), config)
        temps[i] = fit_predictor_temperature(
            pred.name, cal_name, np.log(np.clip(cal.probs[fit], 1e-300, None)),
            cal.labels[fit], "temperature_size", config.temperature_size, len(cal.labels))
        n_temp[i] = fit.size
        pool = (cal.take(rest) if pool_name == cal_name
                else _data(probs[pool_name], pred))
        pools[pred.name] = pool_name
        n = len(pool.labels)
        n_cal = n // 2 if config.n_cal is None else int(config.n_cal)
        if not 0 < n_cal < n:
            raise InputError(f"n_cal must leave images to evaluate: model {pred.name!r} has a "
                             f"conformal pool of {n} images (dataset {pool_name!r}), n_cal is "
                             f"{n_cal}")
        n_pool[i], n_cals[i] = n, n_cal
        accuracy[i] = float(np.mean(pool.probs.argmax(axis=1) == pool.labels))
        shifted = [(name, _data(probs[name], pred)) for name in shift_names
                   if probs[name].has(pred)]
        perms = _splits(n, n_cal, config)
        ranked = cp.RankedProbs(pool.probs)
        rank = ranked.rank[np.arange(n), pool.labels][perms[:, n_cal:]]
        top_k[:, i] = np.median((rank == 1).mean(axis=1)), np.median((rank <= 5).mean(axis=1))
        platt = cp.trial_temperatures(ranked, pool.labels, n_cal=n_cal, trials=config.trials,
                                      seed=config.seed)
        platt_t[:, i] = np.median(platt), platt.std()
        for k, method in enumerate(methods):
            for a, alpha in enumerate(alphas):
                short[i, k, a] = _short_calibration(pool.labels, perms, n_cal, method, alpha)
        # copies of the pool's images: corrupted members, where the pool is its own clean
        # dataset (test; val and test share sample ids, the caches do not name the source)
        keeps = [_keep(pool, d, perms, n_cal) if name in corrupted and pool_name != cal_name
                 else np.ones((config.trials, len(d.labels)), bool) for name, d in shifted]
        for c, cal_kind in enumerate(CALIBRATIONS):
            t = temps[i] if cal_kind == "temperature" else None
            p = ranked if t is None else cp.RankedProbs(_scaled(pool.probs, t))
            per_trial = platt if cal_kind == "platt" else None  # tempered in each trial
            calibs = {}
            for a, alpha in enumerate(alphas):
                for k, method in enumerate(methods):
                    trials, calibs[k, a] = _clean_stats(pool, p, config, n_cal, method, alpha,
                                                        per_trial)
                    mean[:, i, k, a, c], std[:, i, k, a, c] = trials.mean(1), trials.std(1)
                    median[:, i, k, a, c] = np.median(trials, axis=1)
            # one shifted set at a time, its probabilities ranked (and each trial's tempered)
            # once for every method and level
            for j, (name, d) in enumerate(shifted):
                moved = cp.RankedProbs(d.probs if t is None else _scaled(d.probs, t))
                for (k, a), calib in calibs.items():
                    args = _trial_args(methods[k], alphas[a], n_cal, config)
                    out = _shift_stats(calib, args["randomized"] and args["score"] != "thr",
                                       d.labels, moved, keeps[j], config,
                                       shift_names.index(name))
                    if name in corrupted:
                        at = (i, k, a, corruptions.index(corrupted[name]["corruption"]),
                              severities.index(corrupted[name]["severity"]), c)
                        shift_mean[(slice(None), *at)] = out.mean(axis=1)
                        shift_std[(slice(None), *at)] = out.std(axis=1)
                    else:
                        at = (i, k, a, natural.index(name), c)
                        set_mean[(slice(None), *at)] = out.mean(axis=1)
                        set_std[(slice(None), *at)] = out.std(axis=1)
            if cal_kind == "none":
                for k, method in enumerate(CURVE_METHODS):
                    for a, alpha in enumerate(CURVE_ALPHAS):
                        trials = _clean_stats(pool, p, config, n_cal, method, alpha, None)[0]
                        curve[:, i, k, a] = trials[pick].mean(axis=1)
                class_cov[i] = _class_coverage(p, pool.labels, n_cal, config)

    dims = ("model", "method", "alpha", "calibration")
    # Table 1's columns first (the report's and the printed table's order): accuracies, then
    # the medians over the trials
    data: dict = {"accuracy_median": ("model", top_k[0]),
                  "top5_accuracy_median": ("model", top_k[1])}
    for j, s in enumerate(TRIAL_STATS):
        data[f"{s}_median"] = (dims, median[j])
    for j, s in enumerate(TRIAL_STATS):
        data[s] = (dims, mean[j])
        data[f"{s}_std"] = (dims, std[j])
    sdims = ("model", "method", "alpha", "corruption", "severity", "calibration")
    ndims = ("model", "method", "alpha", "shift_set", "calibration")
    for j, s in enumerate(sstat):
        data[f"shift_{s}"] = (sdims, shift_mean[j])
        data[f"shift_{s}_std"] = (sdims, shift_std[j])
        data[f"set_{s}"] = (ndims, set_mean[j])
        data[f"set_{s}_std"] = (ndims, set_std[j])
        data[f"curve_{s}"] = (("model", "curve_method", "curve_alpha"), curve[j])
    data["class_coverage"] = (("model", "class"), class_cov)
    data["accuracy"] = ("model", accuracy)
    data["temperature"] = ("model", temps)
    data["platt_temperature"] = ("model", platt_t[0])
    data["platt_temperature_std"] = ("model", platt_t[1])
    data["n_temperature"] = ("model", n_temp)
    data["n_pool"] = ("model", n_pool)
    data["n_cal"] = ("model", n_cals)
    data["min_n_cal"] = (("method", "alpha"), np.array(
        [[min_n_cal(m, alpha) for alpha in alphas] for m in methods], np.int64))
    data["short_calibration"] = (("model", "method", "alpha"), short)
    note = _short_note(short, preds, n_cals, alphas)
    if note:
        warnings.warn(note, ShortCalibrationWarning, stacklevel=2)
    note = "; ".join([note] * bool(note) + ensemble_notes)
    metrics: dict = {"accuracy": "accuracy", "accuracy_median": "accuracy",
                     "top5_accuracy_median": ("top5_accuracy", True)}
    for var in list(data):
        base = var.removeprefix("shift_").removeprefix("set_").removeprefix("curve_")
        base = base.removesuffix("_median")
        if base in _METRIC_TAGS:
            metrics[var] = _METRIC_TAGS[base]
    ds = xr.Dataset(data, coords={
        "model": [p.name for p in preds], "kind": ("model", [p.kind for p in preds]),
        "mode": ("model", [p.mode for p in preds]),
        "members": ("model", np.array([len(p.members) for p in preds], np.int64)),
        "method": list(methods), "alpha": np.array(alphas), "calibration": list(CALIBRATIONS),
        "corruption": corruptions, "severity": np.array(severities, np.int64),
        "shift_set": np.array(natural, dtype=str), "curve_method": list(CURVE_METHODS),
        "curve_alpha": np.array(CURVE_ALPHAS), "class": classes})
    ensembles = {p.name: list(p.members) for p in preds if p.kind == "ensemble"}
    return stamp_result(ds, "conformal", input_checksums=sorted(set(read.checksums)),
                        metrics=metrics, config=asdict(config), seed=config.seed,
                        notes=note or None,
                        extra={"ensemble_members": json.dumps(ensembles),
                               "pool_dataset": json.dumps(pools), "trials": config.trials,
                               "scored_sets": json.dumps({"test": pool_name,
                                                          "calibration": cal_name}),
                               **entry_provenance(predictor_rows(preds, groups), "model")})
