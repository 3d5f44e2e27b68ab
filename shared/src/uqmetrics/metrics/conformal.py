"""Split conformal prediction sets for classification (docs/conventions.md#s-8).

Conformity scores (higher = less conforming), the finite-sample conformal quantile, prediction
sets, the RAPS parameter choice, Mondrian (class-conditional) calibration, the two baselines
of RAPS's Table 1 (Naive and Top-K, :data:`CONFORMAL_BASELINES`), a temperature fitted on each
trial's calibration draw (the official code's "Platt" scaling, :func:`trial_temperatures`), and
the set metrics (coverage, size, SSCV, CovGap, empty sets), all vectorised over a leading axis
of repeated random splits (``trials``). :func:`conformal_trials` runs the whole protocol in one
call; :func:`conformal_calibrations` is its calibration half (each trial's split, uniforms,
temperature, RAPS parameters and thresholds), and :func:`calibrated_sets` applies it to other
data.

Conventions (also in :data:`uqmetrics.CONVENTIONS`, the ``conformal_*`` entries):

- **Ranks and ties.** Classes are ranked by decreasing probability; classes with equal
  probability are ranked by class index (the lower index first, a stable sort of ``-p``). The
  rank of the true label ``o(x, y)`` is 1-based, as in Angelopoulos et al. (2021).
- **Randomization.** Randomized APS/RAPS use ONE uniform ``U`` per sample (not per class),
  ``s(x, y) = sum_{classes ranked above y} p + U p_y (+ penalty)``. The all-class scores of a
  sample must use the same ``U`` as each other (the sets are then prefixes of the ranking, and
  ``{y: s(x, y) <= qhat}`` is exactly the randomized set of Romano et al. 2020). Pass the
  uniforms explicitly (``u=``, shape (n,)) for reproducibility; ``rng=`` (a
  :class:`numpy.random.Generator`) draws them (``rng.uniform(size=n)``) as a convenience.
  Non-randomized scores use ``U = 1`` (the cumulative mass up to and including ``y``).
- **Quantile.** ``qhat`` = the ``k = ceil((n + 1)(1 - alpha))``-th smallest of the ``n``
  calibration scores (+inf when ``k > n``); sets are ``{y: s(x, y) <= qhat}`` (non-strict,
  empty sets allowed). ``k <= n`` needs ``n >= 1/alpha - 1`` calibration samples
  (:func:`min_calibration_size`: 9 at ``alpha = 0.1``, 19 at 0.05); with fewer every set
  holds every class and the coverage is 1 whatever the model.
- **RAPS tuning** (:func:`choose_raps_params`, after ``pick_kreg``/``pick_lamda_size`` of the
  official code): on a tuning split, ``k_reg`` = 1 + the ``1 - alpha`` quantile (numpy
  ``method="higher"``) of the 0-based true-label ranks, then the ``lam`` of the grid with the
  smallest mean set size when calibrated and evaluated on the tuning split itself.
- **Baselines** (not conformal, no guarantee; aangelopoulos/conformal_classification,
  ``experiments/table1.py``): ``naive`` is the official ``gcq`` at ``tau = 1 - alpha``, the APS
  set ``{y: s_APS(x, y) <= 1 - alpha}`` with no calibration (randomized: sets can be empty;
  not randomized: ``U = 0``, the class that crosses ``1 - alpha`` kept); ``topk`` is the
  official "Fixed" set, the ``k`` top classes with ``k`` and a randomization fraction chosen
  on the calibration draw (:func:`topk_threshold`, :func:`rank_scores`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._validation import as_numpy, check_labels, check_probs, check_same_length
from .exceptions import InputError
from .registry import Registry

__all__ = [
    "CONFORMAL_BASELINES",
    "CONFORMAL_SCORES",
    "RAPS_LAM_GRID",
    "RAPS_TUNE_FRACTION",
    "SSCV_SIZE_BINS",
    "ConformalCalibrations",
    "RankedProbs",
    "aps_scores",
    "calibrated_sets",
    "choose_raps_params",
    "conformal_calibrations",
    "conformal_quantile",
    "conformal_quantile_by_class",
    "conformal_trials",
    "coverage",
    "covgap",
    "empty_fraction",
    "evaluate_calibrations",
    "mean_set_size",
    "median_set_size",
    "min_calibration_size",
    "prediction_sets",
    "random_splits",
    "rank_scores",
    "raps_scores",
    "set_sizes",
    "sscv",
    "thr_scores",
    "topk_threshold",
    "trial_temperatures",
]

#: Set-size strata of the size-stratified coverage violation, as the official RAPS code
#: (``get_violation``/``table11.py`` of aangelopoulos/conformal_classification): inclusive
#: ``(low, high)`` ranges of set sizes.
SSCV_SIZE_BINS: tuple[tuple[int, int], ...] = ((0, 1), (2, 3), (4, 6), (7, 10), (11, 100),
                                               (101, 1000))

#: The lam grid of :func:`choose_raps_params`: the official ``pick_lamda_size`` grid (no 0, so
#: RAPS is never plain APS).
RAPS_LAM_GRID: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 0.2, 0.5)

#: The fraction of each trial's calibration samples that tune RAPS by default: the official
#: ``pct_paramtune`` of RAPS's Table 1 (``experiments/table1.py``; 0.3 is only the default of
#: its ``ConformalModel``): ``n_tune = ceil(RAPS_TUNE_FRACTION * n_cal)``.
RAPS_TUNE_FRACTION = 0.33

#: The baselines of RAPS's Table 1 that :func:`conformal_trials` takes as a ``score`` besides
#: :data:`CONFORMAL_SCORES`: their thresholds are not conformal quantiles (module docstring).
CONFORMAL_BASELINES: tuple[str, ...] = ("naive", "topk")

#: Elements of the all-class score array one chunk of trials of :func:`conformal_trials` may hold.
_CHUNK_ELEMENTS = 2 ** 24


# --------------------------------------------------------------------------------------------
# validation (InputError naming the argument and the value)


def _wrap(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Call a ``_validation`` helper, raising its ValueError as an :class:`InputError`."""
    try:
        return fn(*args, **kwargs)
    except InputError:
        raise
    except ValueError as err:
        raise InputError(str(err)) from None


def _probs(probs: Any, name: str = "probs") -> np.ndarray:
    return _wrap(check_probs, probs, name)


def _labels(labels: Any, n_classes: int | None, name: str = "labels") -> np.ndarray:
    return _wrap(check_labels, labels, n_classes, name)


def _alpha(alpha: Any, name: str = "alpha") -> float:
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a number in (0, 1), got {alpha!r}") from None
    if not (0.0 < a < 1.0):
        raise InputError(f"{name} must lie in (0, 1), got {alpha!r}")
    return a


def _int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _sets(sets: Any, name: str = "sets") -> np.ndarray:
    s = _wrap(as_numpy, sets, name)
    if s.dtype != bool:
        raise InputError(f"{name} must be a boolean array of shape (..., n, C), got dtype "
                         f"{s.dtype}")
    if s.ndim < 2 or s.shape[-1] < 1 or s.shape[-2] < 1:
        raise InputError(f"{name} must have shape (..., n_samples, n_classes), got shape "
                         f"{s.shape}")
    return s


def _set_labels(sets: np.ndarray, labels: Any, name: str = "labels") -> np.ndarray:
    y = _wrap(as_numpy, labels, name)
    if y.dtype.kind not in "iu":
        raise InputError(f"{name} must be integer class indices, got dtype {y.dtype}")
    if y.shape != sets.shape[:-1]:
        raise InputError(f"{name} must have shape {sets.shape[:-1]} (the sets' (..., n)), got "
                         f"shape {y.shape}")
    c = sets.shape[-1]
    if y.min() < 0 or y.max() >= c:
        bad = y[(y < 0) | (y >= c)].ravel()[0]
        raise InputError(f"{name} must lie in [0, {c}), got {int(bad)}")
    return y.astype(np.int64)


def _scalar(x: np.ndarray):
    """A 0-d result as a Python float, anything else unchanged."""
    return float(x) if np.ndim(x) == 0 else x


# --------------------------------------------------------------------------------------------
# conformity scores


def _ranked(p: np.ndarray, order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per class: the probability mass ranked strictly above it, and its 1-based rank.

    Ranks by decreasing probability, ties by class index (a stable sort of ``-p``; ``order``:
    that sort, when already made).
    """
    if order is None:
        order = np.argsort(-p, axis=-1, kind="stable")
    p_sorted = np.take_along_axis(p, order, axis=-1)
    above_sorted = np.zeros_like(p_sorted)
    np.cumsum(p_sorted[..., :-1], axis=-1, out=above_sorted[..., 1:])
    above = np.empty_like(p)
    np.put_along_axis(above, order, above_sorted, axis=-1)
    rank = np.empty(p.shape, dtype=np.int64)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(1, p.shape[-1] + 1), p.shape),
                      axis=-1)
    return above, rank


def _uniforms(n: int, u: Any, rng: Any, randomized: bool) -> np.ndarray:
    """The per-sample U, shape (n,): ``u`` when given, else drawn from ``rng``, else ones."""
    if u is not None:
        uu = _wrap(as_numpy, u, "u").astype(np.float64)
        if uu.shape != (n,):
            raise InputError(f"u must have shape ({n},) (one uniform per sample), got shape "
                             f"{uu.shape}")
        if not np.all((uu >= 0) & (uu <= 1)):
            raise InputError(f"u must lie in [0, 1], got {uu[~((uu >= 0) & (uu <= 1))][0]!r}")
        return uu
    if not randomized:
        return np.ones(n)
    if not isinstance(rng, np.random.Generator):
        raise InputError("randomized scores need u= (the uniforms, shape (n,)) or rng= (a "
                         f"numpy.random.Generator), got rng={rng!r}")
    return rng.uniform(size=n)


def _at_labels(scores: np.ndarray, labels: Any) -> np.ndarray:
    if labels is None:
        return scores
    y = _labels(labels, scores.shape[1])
    _wrap(check_same_length, labels=y, probs=scores)
    return np.take_along_axis(scores, y[:, None], axis=1)[:, 0]


def thr_scores(probs: Any, labels: Any = None, *, rng: Any = None, randomized: bool = False,
               u: Any = None) -> np.ndarray:
    """THR/LAC conformity scores ``1 - p_y`` (Sadinle, Lei & Wasserman 2019).

    Parameters
    ----------
    probs : array_like of float, shape (n, C)
        Class probabilities, rows summing to 1.
    labels : array_like of int, shape (n,), optional
        True labels; without them the score of every class is returned.
    rng, randomized, u
        Accepted for a common signature with :func:`aps_scores` and ignored (THR is not
        randomized).

    Returns
    -------
    numpy.ndarray of float
        Shape (n,) with ``labels``, else (n, C).

    Raises
    ------
    InputError
        If ``probs`` or ``labels`` are invalid (the message names the argument and value).

    Examples
    --------
    >>> thr_scores([[0.7, 0.2, 0.1]], [1])
    array([0.8])
    """
    p = _probs(probs)
    return _at_labels(1.0 - p, labels)


def aps_scores(probs: Any, labels: Any = None, *, rng: Any = None, randomized: bool = False,
               u: Any = None) -> np.ndarray:
    """APS conformity scores (Romano, Sesia & Candès 2020).

    ``s(x, y) = sum of p over the classes ranked above y + U p_y``: the classes are ranked by
    decreasing probability, ties by class index (the lower index ranks higher); ``U = 1``
    unless randomized.

    Parameters
    ----------
    probs : array_like of float, shape (n, C)
        Class probabilities, rows summing to 1.
    labels : array_like of int, shape (n,), optional
        True labels; without them the score of every class is returned.
    rng : numpy.random.Generator, optional
        Draws the uniforms (``rng.uniform(size=n)``) when ``randomized`` and ``u`` is not given.
    randomized : bool
        Multiply ``p_y`` by one uniform ``U`` per sample (the same ``U`` for every class of the
        sample).
    u : array_like of float in [0, 1], shape (n,), optional
        The per-sample uniforms, explicitly (preferred for reproducibility; implies
        randomized). Calibration scores and all-class test scores computed with the same ``u``
        give the same randomized sets as Romano et al.'s procedure.

    Returns
    -------
    numpy.ndarray of float
        Shape (n,) with ``labels``, else (n, C).

    Raises
    ------
    InputError
        If an input is invalid, or ``randomized`` without ``u`` or a Generator ``rng``.

    Examples
    --------
    >>> aps_scores([[0.2, 0.5, 0.3]], [0])
    array([1.])
    >>> aps_scores([[0.2, 0.5, 0.3]], u=[0.5])
    array([[0.9 , 0.25, 0.65]])
    """
    return raps_scores(probs, labels, k_reg=0, lam=0.0, rng=rng, randomized=randomized, u=u)


def raps_scores(probs: Any, labels: Any = None, *, k_reg: int, lam: float, rng: Any = None,
                randomized: bool = False, u: Any = None) -> np.ndarray:
    """RAPS conformity scores (Angelopoulos, Bates, Malik & Jordan 2021).

    ``s(x, y) = APS(x, y) + lam * max(0, o(x, y) - k_reg)`` with ``o(x, y)`` the 1-based rank
    of ``y`` (ties by class index) and the APS part as :func:`aps_scores` (the uniform
    multiplies ``p_y`` only, never the penalty, as the official ``get_tau``).

    Parameters
    ----------
    probs : array_like of float, shape (n, C)
        Class probabilities, rows summing to 1.
    labels : array_like of int, shape (n,), optional
        True labels; without them the score of every class is returned.
    k_reg : int
        Ranks ``<= k_reg`` are not penalised (``>= 0``).
    lam : float
        Penalty per rank beyond ``k_reg`` (``>= 0``).
    rng, randomized, u
        As :func:`aps_scores`.

    Returns
    -------
    numpy.ndarray of float
        Shape (n,) with ``labels``, else (n, C).

    Raises
    ------
    InputError
        If an input is invalid (names the argument and the value).

    Examples
    --------
    >>> raps_scores([[0.5, 0.3, 0.2]], [2], k_reg=1, lam=0.1)
    array([1.2])
    """
    p = _probs(probs)
    k = _int(k_reg, "k_reg", 0)
    try:
        lam_f = float(lam)
    except (TypeError, ValueError):
        raise InputError(f"lam must be a number >= 0, got {lam!r}") from None
    if not (np.isfinite(lam_f) and lam_f >= 0):
        raise InputError(f"lam must be a finite number >= 0, got {lam!r}")
    uu = _uniforms(p.shape[0], u, rng, randomized)
    if labels is not None:
        y = _labels(labels, p.shape[1])
        _wrap(check_same_length, labels=y, probs=p)
    above, rank = _ranked(p)
    s = above + uu[:, None] * p
    if lam_f:
        s = s + lam_f * np.maximum(0, rank - k)
    return s if labels is None else np.take_along_axis(s, y[:, None], axis=1)[:, 0]


#: Classification conformity scores by name: ``score(probs, labels=None, *, rng=None,
#: randomized=False, u=None, **params)``; "raps" needs ``k_reg=`` and ``lam=``.
CONFORMAL_SCORES: Registry[Callable[..., np.ndarray]] = Registry("conformal score")
CONFORMAL_SCORES.add("thr", thr_scores)
CONFORMAL_SCORES.add("aps", aps_scores)
CONFORMAL_SCORES.add("raps", raps_scores)


def rank_scores(probs: Any, labels: Any = None, *, rng: Any = None, randomized: bool = False,
                u: Any = None) -> np.ndarray:
    """Top-K (fixed set size) scores ``o(x, y) - U``: the 1-based rank of ``y`` less ``U``.

    With the threshold ``k - f`` of :func:`topk_threshold`, ``{y: o(x, y) - U <= k - f}``
    holds the ``k - 1`` top classes, and the ``k``-th where ``U >= f``: the official
    randomized "Fixed" set of RAPS's Table 1 (size ``k - 1`` with probability ``f``, else
    ``k``). ``U = 1`` unless randomized: the ``k`` top classes.

    Parameters
    ----------
    probs : array_like of float, shape (n, C)
        Class probabilities, rows summing to 1 (ranked as :func:`aps_scores`).
    labels : array_like of int, shape (n,), optional
        True labels; without them the score of every class is returned.
    rng, randomized, u
        As :func:`aps_scores`.

    Returns
    -------
    numpy.ndarray of float
        Shape (n,) with ``labels``, else (n, C).

    Raises
    ------
    InputError
        If an input is invalid (names the argument and the value).

    Examples
    --------
    >>> rank_scores([[0.2, 0.5, 0.3]], u=[0.25])
    array([[2.75, 0.75, 1.75]])
    """
    p = _probs(probs)
    uu = _uniforms(p.shape[0], u, rng, randomized)
    return _at_labels(_ranked(p)[1] - uu[:, None], labels)


# --------------------------------------------------------------------------------------------
# quantile and sets


def _quantile_rank(n: np.ndarray | int, alpha: float) -> np.ndarray:
    """``k = ceil((n + 1)(1 - alpha))`` (rounded to 10 decimals first so that a float product
    such as ``100 * 0.9 = 90.00000000000001`` is not pushed to the next integer)."""
    return np.ceil(np.round((np.asarray(n) + 1) * (1.0 - alpha), 10)).astype(np.int64)


def min_calibration_size(alpha: float) -> int:
    """The fewest calibration samples whose conformal threshold is finite at level ``alpha``.

    Parameters
    ----------
    alpha : float
        Miscoverage level in (0, 1).

    Returns
    -------
    int
        The smallest ``n`` with ``ceil((n + 1)(1 - alpha)) <= n`` (:func:`conformal_quantile`),
        i.e. ``n >= 1/alpha - 1``. With fewer samples (of a class, for
        :func:`conformal_quantile_by_class`) ``qhat`` is ``+inf``: every set holds every class
        (that class), a coverage of 1 that says nothing about the model.

    Raises
    ------
    InputError
        If ``alpha`` is not in (0, 1).

    Examples
    --------
    >>> min_calibration_size(0.1), min_calibration_size(0.05), min_calibration_size(0.01)
    (9, 19, 99)
    """
    a = _alpha(alpha)
    n = max(1, math.ceil(1.0 / a) - 2)  # never above the answer: ceil(1/a) < 1/a + 1
    while int(_quantile_rank(n, a)) > n:
        n += 1
    return n


def conformal_quantile(scores: Any, alpha: float) -> float | np.ndarray:
    """The split-conformal threshold: the ``ceil((n + 1)(1 - alpha))``-th smallest score.

    Parameters
    ----------
    scores : array_like of float, shape (..., n)
        Calibration scores of the true labels; leading axes (trials) are kept.
    alpha : float
        Miscoverage level in (0, 1).

    Returns
    -------
    float or numpy.ndarray, shape (...)
        ``qhat``; ``+inf`` when ``ceil((n + 1)(1 - alpha)) > n`` (too few calibration
        samples: the sets are then every class). This is numpy's ``quantile`` at level
        ``ceil((n + 1)(1 - alpha)) / n`` with ``method="lower"`` (MAPIE's definition); the
        order of the samples does not matter.

    Raises
    ------
    InputError
        If ``scores`` is not a non-empty numeric array with ``ndim >= 1`` or contains NaN, or
        ``alpha`` is not in (0, 1). Infinite scores are ordered as any other (a score of
        ``+inf``, e.g. ``-log 0``, may be the threshold).

    Examples
    --------
    >>> conformal_quantile([0.5, 0.1, 0.4, 0.2, 0.3], 0.4)  # k = ceil(6 * 0.6) = 4
    0.4
    >>> conformal_quantile([0.5, 0.1], 0.1)
    inf
    """
    s = _wrap(as_numpy, scores, "scores")
    if s.dtype.kind not in "biuf" or s.ndim < 1 or s.shape[-1] == 0:
        raise InputError(f"scores must be a non-empty numeric array of shape (..., n), got "
                         f"dtype {s.dtype} and shape {s.shape}")
    s = s.astype(np.float64)
    if np.isnan(s).any():
        raise InputError("scores contain NaN")
    a = _alpha(alpha)
    n = s.shape[-1]
    k = int(_quantile_rank(n, a))
    if k > n:
        return _scalar(np.full(s.shape[:-1], np.inf))
    return _scalar(np.partition(s, k - 1, axis=-1)[..., k - 1])


def conformal_quantile_by_class(scores: Any, labels: Any, alpha: float,
                                n_classes: int) -> np.ndarray:
    """Mondrian (class-conditional) thresholds: :func:`conformal_quantile` within each class.

    Parameters
    ----------
    scores : array_like of float, shape (..., n)
        Calibration scores of the true labels.
    labels : array_like of int, shape (..., n)
        Their labels, in ``[0, n_classes)``.
    alpha : float
        Miscoverage level in (0, 1).
    n_classes : int
        Number of classes ``C``.

    Returns
    -------
    numpy.ndarray of float, shape (..., n_classes)
        ``qhat_c`` = the ``ceil((n_c + 1)(1 - alpha))``-th smallest score among the ``n_c``
        calibration samples of class ``c``; ``+inf`` where that exceeds ``n_c`` (a class with
        no or too few calibration samples gets the full set of that label).

    Raises
    ------
    InputError
        If the shapes differ, a label is out of range, or ``alpha``/``n_classes`` is invalid.

    Examples
    --------
    >>> conformal_quantile_by_class([0.1, 0.2, 0.3, 0.9], [0, 0, 0, 1], 0.5, 3)
    array([0.2, 0.9, inf])
    """
    s = _wrap(as_numpy, scores, "scores")
    if s.dtype.kind not in "biuf" or s.ndim < 1 or s.shape[-1] == 0:
        raise InputError(f"scores must be a non-empty numeric array of shape (..., n), got "
                         f"dtype {s.dtype} and shape {s.shape}")
    s = s.astype(np.float64)
    c = _int(n_classes, "n_classes", 1)
    a = _alpha(alpha)
    y = _wrap(as_numpy, labels, "labels")
    if y.shape != s.shape or y.dtype.kind not in "iu":
        raise InputError(f"labels must be integers of the scores' shape {s.shape}, got dtype "
                         f"{y.dtype} and shape {y.shape}")
    if y.min() < 0 or y.max() >= c:
        raise InputError(f"labels must lie in [0, {c}), got {int(y[(y < 0) | (y >= c)][0])}")
    lead = s.shape[:-1]
    s2 = s.reshape(-1, s.shape[-1])
    y2 = y.reshape(-1, s.shape[-1]).astype(np.int64)
    t = s2.shape[0]
    order = np.lexsort((s2, y2), axis=-1)  # by label, then score
    s_sorted = np.take_along_axis(s2, order, axis=-1)
    counts = np.bincount((np.arange(t)[:, None] * c + y2).ravel(), minlength=t * c).reshape(t, c)
    start = np.cumsum(counts, axis=1) - counts
    k = _quantile_rank(counts, a)
    ok = k <= counts
    idx = np.where(ok, start + k - 1, 0)
    q = np.where(ok, np.take_along_axis(s_sorted, idx, axis=-1), np.inf)
    return q.reshape(*lead, c)


def prediction_sets(scores_all: Any, qhat: Any) -> np.ndarray:
    """Conformal prediction sets ``{y: s(x, y) <= qhat}`` (non-strict; empty sets allowed).

    Parameters
    ----------
    scores_all : array_like of float, shape (..., n, C)
        The scores of every class (for randomized APS/RAPS computed with one ``U`` per sample,
        the same for all its classes: ``aps_scores(probs, u=u)``).
    qhat : float or array_like of float
        Shape ``(...)`` (one threshold per leading index: marginal) or ``(..., C)``
        (class-wise, Mondrian: ``y`` is in the set iff ``s(x, y) <= qhat[..., y]``). The
        number of dimensions decides: ``scores_all.ndim - 2`` is marginal,
        ``scores_all.ndim - 1`` class-wise.

    Returns
    -------
    numpy.ndarray of bool, shape (..., n, C)

    Raises
    ------
    InputError
        If the shapes do not fit.

    Examples
    --------
    >>> prediction_sets([[0.1, 0.5, 0.9]], 0.5)
    array([[ True,  True, False]])
    >>> prediction_sets([[0.1, 0.5, 0.9]], [0.0, 0.5, 1.0])
    array([[False,  True,  True]])
    """
    s = _wrap(as_numpy, scores_all, "scores_all")
    if s.dtype.kind not in "biuf" or s.ndim < 2:
        raise InputError(f"scores_all must be numeric of shape (..., n, C), got dtype {s.dtype} "
                         f"and shape {s.shape}")
    q = _wrap(as_numpy, qhat, "qhat").astype(np.float64)
    if np.isnan(q).any():
        raise InputError("qhat contains NaN")
    lead = s.shape[:-2]
    if q.ndim == s.ndim - 2 and q.shape == lead:
        return s <= q[..., None, None]
    if q.ndim == s.ndim - 1 and q.shape == (*lead, s.shape[-1]):
        return s <= q[..., None, :]
    raise InputError(f"qhat must have shape {lead} (marginal) or {(*lead, s.shape[-1])} "
                     f"(class-wise) for scores_all of shape {s.shape}, got shape {q.shape}")


def topk_threshold(ranks: Any, alpha: float) -> float | np.ndarray:
    """The official Top-K ("Fixed") threshold ``k - f`` of the calibration ranks (for
    :func:`rank_scores`).

    ``k = 1 + quantile(ranks - 1, 1 - alpha, method="higher")`` and ``f = (F(k) - (1 - alpha))
    / (F(k) - F(k - 1))``, ``F(j)`` the fraction of calibration ranks ``<= j``: sets of size
    ``k - 1`` with probability ``f``, else ``k``, cover the calibration samples ``1 - alpha``
    on average, exactly (``experiments/table1.py``, ``trial`` with ``fixed_bool``). No
    ``n + 1`` correction: a baseline, not a conformal threshold.

    Parameters
    ----------
    ranks : array_like of int, shape (..., n)
        The 1-based ranks of the calibration samples' true labels (leading axes: trials).
    alpha : float
        Miscoverage level in (0, 1).

    Returns
    -------
    float or numpy.ndarray, shape (...)
        ``k - f``, with ``f`` in [0, 1].

    Raises
    ------
    InputError
        If ``ranks`` are not positive integers of shape (..., n >= 1), or ``alpha`` is invalid.

    Examples
    --------
    >>> round(topk_threshold([1, 1, 1, 2, 3], 0.5), 6)  # k = 1, f = (0.6 - 0.5) / 0.6
    0.833333
    """
    r = _wrap(as_numpy, ranks, "ranks")
    if r.dtype.kind not in "iu" or r.ndim < 1 or r.shape[-1] == 0 or (r < 1).any():
        raise InputError(f"ranks must be 1-based integer ranks of shape (..., n), got dtype "
                         f"{r.dtype} and shape {r.shape}")
    a = _alpha(alpha)
    k = np.quantile(r - 1, 1.0 - a, axis=-1, method="higher").astype(np.int64) + 1
    at_k = (r <= k[..., None]).mean(axis=-1)
    below = (r <= k[..., None] - 1).mean(axis=-1)
    return _scalar(k - (at_k - (1.0 - a)) / (at_k - below))


# --------------------------------------------------------------------------------------------
# RAPS parameters


def choose_raps_params(probs_tune: Any, labels_tune: Any, alpha: float, *,
                       lam_grid: Sequence[float] = RAPS_LAM_GRID,
                       kreg_quantile: float | None = None, randomized: bool = True,
                       u: Any = None, rng: Any = None) -> tuple[int, float]:
    """Choose RAPS's ``(k_reg, lam)`` on a tuning split, as the official code.

    ``k_reg = 1 + quantile(true-label 0-based ranks, 1 - kreg_quantile, method="higher")``
    (``pick_kreg``: no ``n + 1`` correction); then, for each ``lam`` of ``lam_grid`` in order,
    RAPS is calibrated on the tuning split (:func:`conformal_quantile`) and its sets on the
    same tuning split are measured; the ``lam`` with the smallest mean set size wins, the first
    in grid order on ties (``pick_lamda_size``, strict ``<``).

    Parameters
    ----------
    probs_tune : array_like of float, shape (n, C)
        Tuning-split probabilities.
    labels_tune : array_like of int, shape (n,)
        Tuning-split labels.
    alpha : float
        Miscoverage level in (0, 1).
    lam_grid : sequence of float
        Candidate penalties (``>= 0``); default ``(0, 1e-3, 1e-2, 1e-1, 0.2, 0.5)`` (the
        official grid plus 0).
    kreg_quantile : float, optional
        ``k_reg`` is the ``1 - kreg_quantile`` rank quantile; default ``alpha``.
    randomized : bool
        Randomized scores (one ``U`` per sample, the same ``U`` in the calibration and the set
        of that sample).
    u : array_like of float, shape (n,), optional
        The uniforms (else drawn from ``rng``).
    rng : numpy.random.Generator, optional
        Draws ``u`` when needed.

    Returns
    -------
    (int, float)
        ``(k_reg, lam)``.

    Raises
    ------
    InputError
        If an input is invalid.
    """
    p = _probs(probs_tune, "probs_tune")
    y = _labels(labels_tune, p.shape[1], "labels_tune")
    _wrap(check_same_length, labels_tune=y, probs_tune=p)
    a = _alpha(alpha)
    kq = a if kreg_quantile is None else _alpha(kreg_quantile, "kreg_quantile")
    grid = np.asarray(lam_grid, dtype=np.float64).ravel()
    if grid.size == 0 or not np.all(np.isfinite(grid) & (grid >= 0)):
        raise InputError(f"lam_grid must be a non-empty sequence of numbers >= 0, got "
                         f"{lam_grid!r}")
    uu = _uniforms(p.shape[0], u, rng, randomized)
    above, rank = _ranked(p)
    k_reg = int(np.quantile(rank[np.arange(len(y)), y] - 1, 1 - kq, method="higher")) + 1
    base = above + uu[:, None] * p
    excess = np.maximum(0, rank - k_reg)
    best, best_lam = np.inf, float(grid[0])
    for lam in grid:
        s_all = base + lam * excess
        q = conformal_quantile(s_all[np.arange(len(y)), y], a)
        size = float((s_all <= q).sum(axis=1).mean())
        if size < best:
            best, best_lam = size, float(lam)
    return k_reg, best_lam


# --------------------------------------------------------------------------------------------
# splits and metrics


def random_splits(n: int, n_cal: int, trials: int, rng: Any) -> np.ndarray:
    """Random permutations of ``range(n)``, one per trial: the first ``n_cal`` calibrate.

    Parameters
    ----------
    n : int
        Number of samples.
    n_cal : int
        Calibration samples per split (``1 <= n_cal < n``).
    trials : int
        Number of splits.
    rng : numpy.random.Generator or int
        The generator (or a seed for :func:`numpy.random.default_rng`).

    Returns
    -------
    numpy.ndarray of int64, shape (trials, n)
        Row ``t``: ``[:n_cal]`` calibration indices, ``[n_cal:]`` test indices.

    Raises
    ------
    InputError
        If a size is invalid.
    """
    n = _int(n, "n", 2)
    n_cal = _int(n_cal, "n_cal", 1)
    if n_cal >= n:
        raise InputError(f"n_cal must be < n = {n} (test samples are needed), got {n_cal}")
    trials = _int(trials, "trials", 1)
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(_int(rng, "rng", 0))
    return rng.permuted(np.tile(np.arange(n, dtype=np.int64), (trials, 1)), axis=1)


def _covered(sets: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.take_along_axis(sets, y[..., None], axis=-1)[..., 0]


def coverage(sets: Any, labels: Any) -> float | np.ndarray:
    """Marginal coverage: the fraction of samples whose label is in its set.

    Parameters
    ----------
    sets : array_like of bool, shape (..., n, C)
        Prediction sets.
    labels : array_like of int, shape (..., n)
        True labels.

    Returns
    -------
    float or numpy.ndarray, shape (...)

    Examples
    --------
    >>> coverage([[True, False], [False, False]], [0, 1])
    0.5
    """
    s = _sets(sets)
    return _scalar(_covered(s, _set_labels(s, labels)).mean(axis=-1))


def set_sizes(sets: Any) -> np.ndarray:
    """Size of every prediction set.

    Parameters
    ----------
    sets : array_like of bool, shape (..., n, C)

    Returns
    -------
    numpy.ndarray of int64, shape (..., n)
    """
    return _sets(sets).sum(axis=-1, dtype=np.int64)


def mean_set_size(sets: Any) -> float | np.ndarray:
    """Mean set size over the samples; shape (...) for sets of shape (..., n, C)."""
    return _scalar(set_sizes(sets).mean(axis=-1))


def median_set_size(sets: Any) -> float | np.ndarray:
    """Median set size over the samples (numpy's median: the mean of the two middle sizes for
    an even n); shape (...) for sets of shape (..., n, C)."""
    return _scalar(np.median(set_sizes(sets), axis=-1))


def empty_fraction(sets: Any) -> float | np.ndarray:
    """Fraction of empty prediction sets; shape (...) for sets of shape (..., n, C)."""
    return _scalar((set_sizes(sets) == 0).mean(axis=-1))


def sscv(sets: Any, labels: Any, alpha: float,
         size_bins: Sequence[tuple[int, int]] = SSCV_SIZE_BINS) -> float | np.ndarray:
    """Size-stratified coverage violation (Angelopoulos et al. 2021, official ``get_violation``).

    ``max over non-empty strata j of |coverage of the samples with set size in S_j - (1 - a)|``.

    Parameters
    ----------
    sets : array_like of bool, shape (..., n, C)
        Prediction sets.
    labels : array_like of int, shape (..., n)
        True labels.
    alpha : float
        Miscoverage level in (0, 1).
    size_bins : sequence of (int, int)
        Inclusive set-size ranges ``(low, high)``; default :data:`SSCV_SIZE_BINS`
        ``(0-1, 2-3, 4-6, 7-10, 11-100, 101-1000)`` as the official code. Samples whose size
        is in no stratum do not count; strata without samples are skipped.

    Returns
    -------
    float or numpy.ndarray, shape (...)
        A fraction in [0, 1]; NaN if every stratum is empty.

    Examples
    --------
    >>> sets = [[True, False, False], [True, True, False], [False, True, True]]
    >>> round(sscv(sets, [1, 0, 0], 0.5), 6)  # size 1: 0/1 covered, size 2: 1/2
    0.5
    """
    s = _sets(sets)
    y = _set_labels(s, labels)
    a = _alpha(alpha)
    bins = [(int(lo), int(hi)) for lo, hi in size_bins]
    if not bins or any(lo > hi for lo, hi in bins):
        raise InputError(f"size_bins must be non-empty (low, high) pairs with low <= high, got "
                         f"{size_bins!r}")
    size = s.sum(axis=-1)
    cov = _covered(s, y)
    worst = np.full(size.shape[:-1], -np.inf)
    for lo, hi in bins:
        inside = (size >= lo) & (size <= hi)
        count = inside.sum(axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            viol = np.abs((inside & cov).sum(axis=-1) / count - (1 - a))
        worst = np.where(count > 0, np.maximum(worst, viol), worst)
    return _scalar(np.where(np.isfinite(worst), worst, np.nan))


def covgap(sets: Any, labels: Any, alpha: float, n_classes: int) -> float | np.ndarray:
    """Class-conditional coverage gap (Ding et al. 2023), a fraction (not x100).

    ``mean over the classes present in labels of |coverage of class c - (1 - alpha)|``.

    Parameters
    ----------
    sets : array_like of bool, shape (..., n, C)
        Prediction sets.
    labels : array_like of int, shape (..., n)
        True labels.
    alpha : float
        Miscoverage level in (0, 1).
    n_classes : int
        Number of classes (must equal C).

    Returns
    -------
    float or numpy.ndarray, shape (...)
        Classes with no sample (in that trial) are left out of the mean.

    Examples
    --------
    >>> sets = [[True, False], [False, True], [True, True]]
    >>> covgap(sets, [0, 0, 1], 0.5, 2)  # class 0: 1/2 covered, class 1: 1/1
    0.25
    """
    s = _sets(sets)
    c = _int(n_classes, "n_classes", 1)
    if s.shape[-1] != c:
        raise InputError(f"n_classes must equal the sets' number of classes {s.shape[-1]}, got "
                         f"{n_classes!r}")
    y = _set_labels(s, labels)
    a = _alpha(alpha)
    cov = _covered(s, y)
    lead = y.shape[:-1]
    y2 = y.reshape(-1, y.shape[-1])
    t = y2.shape[0]
    flat = (np.arange(t)[:, None] * c + y2).ravel()
    counts = np.bincount(flat, minlength=t * c).reshape(t, c)
    hits = np.bincount(flat, weights=cov.reshape(-1).astype(np.float64),
                       minlength=t * c).reshape(t, c)
    present = counts > 0
    gap = np.abs(np.divide(hits, counts, out=np.zeros_like(hits), where=present) - (1 - a))
    out = (gap * present).sum(axis=1) / present.sum(axis=1)
    return _scalar(out.reshape(lead))


# --------------------------------------------------------------------------------------------
# driver


@dataclass(frozen=True, eq=False)
class ConformalCalibrations:
    """Thresholds of ``trials`` random splits (:func:`conformal_calibrations`).

    Attributes
    ----------
    score : str
        The conformity score (:data:`CONFORMAL_SCORES`) or baseline
        (:data:`CONFORMAL_BASELINES`).
    mondrian : bool
        Class-conditional thresholds.
    n_cal : int
        Calibration samples per trial, tuning samples included.
    n_tune : int
        The first ``n_tune`` of them tune RAPS (held out of the calibration for every score).
    perms : numpy.ndarray of int64, shape (trials, n)
        Each trial's permutation (:func:`random_splits`): ``[:n_tune]`` tune, ``[n_tune:n_cal]``
        calibrate, ``[n_cal:]`` test.
    u : numpy.ndarray of float, shape (trials, n)
        Each trial's uniform per sample (not randomized: ones, zeros for ``naive``).
    k_reg : numpy.ndarray of int64, shape (trials,)
        RAPS ``k_reg`` per trial (0 for the other scores).
    lam : numpy.ndarray of float, shape (trials,)
        RAPS ``lam`` per trial (0 for the other scores).
    qhat : numpy.ndarray of float, shape (trials,) or (trials, C)
        The thresholds (per class when ``mondrian``): ``1 - alpha`` for ``naive``,
        :func:`topk_threshold` for ``topk``.
    temperature : numpy.ndarray of float, shape (trials,)
        The temperature of each trial's probabilities (``softmax(log p / T)``); ones when none
        was given.
    alpha : float
        The miscoverage level.
    """

    score: str
    mondrian: bool
    n_cal: int
    n_tune: int
    perms: np.ndarray
    u: np.ndarray
    k_reg: np.ndarray
    lam: np.ndarray
    qhat: np.ndarray
    temperature: np.ndarray | None = None
    alpha: float | None = None

    @property
    def tune(self) -> np.ndarray:
        """(trials, n_tune): each trial's RAPS tuning samples."""
        return self.perms[:, :self.n_tune]

    @property
    def calibration(self) -> np.ndarray:
        """(trials, n_cal - n_tune): each trial's calibration samples."""
        return self.perms[:, self.n_tune:self.n_cal]

    @property
    def test(self) -> np.ndarray:
        """(trials, n - n_cal): each trial's test samples."""
        return self.perms[:, self.n_cal:]


def _softmax_t(logp: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``softmax(logp / t)`` over the last axis, ``t`` broadcast on the leading axis (as
    :func:`uqmetrics.metrics.calibration.softmax` computes it, so bit for bit the same)."""
    z = logp / t.reshape(t.shape + (1,) * (logp.ndim - t.ndim))
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class RankedProbs:
    """Class probabilities (n, C), checked and ranked once, for repeated
    :func:`calibrated_sets` and :func:`evaluate_calibrations` calls on the same samples.

    Parameters
    ----------
    probs : array_like of float, shape (n, C)
        Class probabilities, rows summing to 1 (un-tempered: each trial tempers them).

    Attributes
    ----------
    p : numpy.ndarray
        The probabilities.
    order, rank : numpy.ndarray of int64, shape (n, C)
        The classes by decreasing probability (ties by class index) and each class's 1-based
        rank; a temperature changes neither.
    above : numpy.ndarray
        The mass ranked above each class.

    Raises
    ------
    InputError
        If ``probs`` is invalid (named).
    """

    def __init__(self, probs: Any):
        self.p = _probs(probs)
        self.order = np.argsort(-self.p, axis=-1, kind="stable")
        self.above, self.rank = _ranked(self.p, self.order)
        self.logp = np.log(np.clip(self.p, 1e-300, None))
        self._tempered: tuple[bytes, tuple[np.ndarray, np.ndarray]] | None = None

    def probs(self, idx: np.ndarray | None,
              temps: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """``(p, above)`` of samples ``idx`` (T, m), shape (T, m, C), trial ``i`` tempered by
        ``temps[i]`` (None: un-tempered); ``idx`` None: every sample in every trial (then
        shape (1, n, C) un-tempered, a view). The order of the classes is the un-tempered one.

        Every sample tempered by ``temps`` is kept (the last ``temps`` only) where that is at
        most ``_CHUNK_ELEMENTS`` values: the methods and levels that share the trials'
        temperatures temper once."""
        if temps is None:
            return (self.p[None], self.above[None]) if idx is None else \
                (self.p[idx], self.above[idx])
        n, c = self.p.shape
        every = np.broadcast_to(np.arange(n), (temps.size, n))
        if temps.size * n * c <= _CHUNK_ELEMENTS:
            key = temps.tobytes()
            if self._tempered is None or self._tempered[0] != key:
                self._tempered = (key, self._temper(every, temps))
            p_all, above_all = self._tempered[1]
            if idx is None:
                return p_all, above_all
            rows = np.arange(temps.size)[:, None]
            return p_all[rows, idx], above_all[rows, idx]
        return self._temper(every if idx is None else idx, temps)

    def _temper(self, idx: np.ndarray, temps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p = _softmax_t(self.logp[idx], temps)
        p_sorted = np.take_along_axis(p, self.order[idx], axis=-1)
        above_sorted = np.zeros_like(p_sorted)
        np.cumsum(p_sorted[..., :-1], axis=-1, out=above_sorted[..., 1:])
        return p, np.take_along_axis(above_sorted, self.rank[idx] - 1, axis=-1)

    def scores(self, score: str, idx: np.ndarray, temps: np.ndarray | None, u: np.ndarray,
               k_reg: np.ndarray, lam: np.ndarray, cls: np.ndarray | None = None) -> np.ndarray:
        """Scores of samples ``idx`` (T, m) (None: every sample in every trial): of class
        ``cls`` (T, m), else of every class (T, m, C); per trial its temperature ``temps``
        (T,) or None, uniforms ``u`` (T, m), ``k_reg`` and ``lam`` (T,)."""
        if cls is None:
            rank, u, k_reg, lam = (self.rank[None] if idx is None else self.rank[idx],
                                   u[..., None], k_reg[:, None, None], lam[:, None, None])
            p, above = (None, None) if score == "topk" else self.probs(idx, temps)
        else:
            rank, k_reg, lam = self.rank[idx, cls], k_reg[:, None], lam[:, None]
            if temps is None or score == "topk":
                p, above = self.p[idx, cls], self.above[idx, cls]
            else:
                p, above = (np.take_along_axis(a, cls[..., None], axis=-1)[..., 0]
                            for a in self.probs(idx, temps))
        if score == "topk":
            return rank - u
        if score == "thr":  # (un-tempered, every sample: one array for every trial)
            return np.broadcast_to(1.0 - p, (u.shape[0], *p.shape[1:]))
        s = u * p
        s += above
        if score == "raps":
            excess = rank - k_reg
            np.maximum(excess, 0, out=excess)
            s += lam * excess
        return s


def _check_temperatures(temperatures: Any, trials: int) -> np.ndarray | None:
    if temperatures is None:
        return None
    t = _wrap(as_numpy, temperatures, "temperatures").astype(np.float64)
    if t.shape != (trials,) or not np.all(np.isfinite(t) & (t > 0)):
        raise InputError(f"temperatures must be {trials} finite numbers > 0 (one per trial), "
                         f"got shape {t.shape}" + (f" and {t.ravel()[0]!r}" if t.size else ""))
    return t


def _calibrate(probs: Any, labels: Any, *, score: str, alpha: float, n_cal: int, trials: int,
               seed: int, mondrian: bool, randomized: bool, n_tune: int | None,
               raps_params: tuple[int, float] | None, temperatures: Any
               ) -> tuple[ConformalCalibrations, RankedProbs, np.ndarray, float]:
    """The calibrations of :func:`conformal_calibrations`, with the ranked probabilities, the
    validated labels and ``alpha``."""
    ranking = probs if isinstance(probs, RankedProbs) else RankedProbs(probs)
    p = ranking.p
    y = _labels(labels, p.shape[1])
    _wrap(check_same_length, labels=y, probs=p)
    n, c = p.shape
    known = [*CONFORMAL_SCORES.names(), *CONFORMAL_BASELINES]
    if score not in known:
        raise InputError(f"score must be one of {known}, got {score!r}")
    if mondrian and score in CONFORMAL_BASELINES:
        raise InputError(f"mondrian is for the conformal scores {CONFORMAL_SCORES.names()}, "
                         f"got score={score!r}")
    a = _alpha(alpha)
    seed = _int(seed, "seed", 0)
    trials = _int(trials, "trials", 1)
    temps = _check_temperatures(temperatures, trials)
    given = np.ones(trials) if temps is None else temps
    if temps is not None and np.all(temps == 1.0):
        temps = None  # softmax(log p) is p, up to rounding: p itself
    rng = np.random.default_rng(seed)
    perms = random_splits(n, n_cal, trials, rng)
    if randomized and score != "thr":
        u_all = rng.uniform(size=(trials, n))
    else:  # not randomized: the larger set (naive: gcq's, the class crossing 1 - alpha kept)
        u_all = np.zeros((trials, n)) if score == "naive" else np.ones((trials, n))
    tune_needed = score == "raps" and raps_params is None
    if n_tune is None:
        n_tune = math.ceil(RAPS_TUNE_FRACTION * n_cal) if tune_needed else 0
    n_tune = _int(n_tune, "n_tune", 1 if tune_needed else 0)
    if n_tune >= n_cal:
        raise InputError(f"n_tune must be < n_cal = {n_cal} (calibration samples are needed), "
                         f"got {n_tune}")
    if raps_params is not None:
        if score != "raps":
            raise InputError(f"raps_params is only for score='raps', got score={score!r}")
        try:
            k_fix, lam_fix = int(raps_params[0]), float(raps_params[1])
        except (TypeError, ValueError, IndexError):
            raise InputError(f"raps_params must be (k_reg, lam), got {raps_params!r}") from None
        _int(k_fix, "raps_params k_reg", 0)
        if not (np.isfinite(lam_fix) and lam_fix >= 0):
            raise InputError(f"raps_params lam must be >= 0, got {raps_params!r}")

    k_reg = np.zeros(trials, dtype=np.int64)
    lam = np.zeros(trials)
    if score == "raps":
        if tune_needed:
            tune = perms[:, :n_tune]
            # tempered: every trial's at once where RankedProbs keeps them, else one by one
            kept = temps is not None and temps.size * p.size <= _CHUNK_ELEMENTS
            p_tune = ranking.probs(tune, temps)[0] if kept else None
            for t in range(trials):
                pt = (ranking.p[tune[t]] if temps is None else p_tune[t] if kept
                      else ranking._temper(tune[t:t + 1], temps[t:t + 1])[0][0])
                k_reg[t], lam[t] = choose_raps_params(pt, y[tune[t]], a, randomized=True,
                                                      u=u_all[t, tune[t]])
        else:
            k_reg[:], lam[:] = k_fix, lam_fix

    cal = perms[:, n_tune:n_cal]
    if score == "naive":
        qhat = np.full(trials, 1.0 - a)
    elif score == "topk":
        qhat = np.asarray(topk_threshold(ranking.rank[cal, y[cal]], a)).reshape(trials)
    else:
        chunk = trials if temps is None else max(1, _CHUNK_ELEMENTS // (cal.shape[1] * c))
        s_cal = np.concatenate([
            ranking.scores(score, cal[t0:t0 + chunk],
                           None if temps is None else temps[t0:t0 + chunk],
                           u_all[np.arange(t0, min(t0 + chunk, trials))[:, None],
                                 cal[t0:t0 + chunk]],
                           k_reg[t0:t0 + chunk], lam[t0:t0 + chunk], cls=y[cal[t0:t0 + chunk]])
            for t0 in range(0, trials, chunk)])
        qhat = (conformal_quantile_by_class(s_cal, y[cal], a, c) if mondrian
                else np.asarray(conformal_quantile(s_cal, a)).reshape(trials))
    return (ConformalCalibrations(score, bool(mondrian), int(n_cal), n_tune, perms, u_all, k_reg,
                                  lam, qhat, given, a),
            ranking, y, a)


def _trial_sets(cal: ConformalCalibrations, ranking: RankedProbs, idx: np.ndarray,
                u: np.ndarray, tt: np.ndarray) -> np.ndarray:
    """(T, m, C) bool: the sets of samples ``idx`` (T, m) of ``ranking`` with uniforms ``u``
    (T, m) under the calibrations of trials ``tt`` (T,)."""
    temps = None if cal.temperature is None or np.all(cal.temperature == 1.0) \
        else cal.temperature[tt]  # as _calibrate: temperatures all 1 are none
    return prediction_sets(ranking.scores(cal.score, idx, temps, u, cal.k_reg[tt], cal.lam[tt]),
                           cal.qhat[tt])


def conformal_calibrations(probs: Any, labels: Any, *, score: str = "aps", alpha: float = 0.1,
                           n_cal: int, trials: int, seed: int, mondrian: bool = False,
                           randomized: bool = True, n_tune: int | None = None,
                           raps_params: tuple[int, float] | None = None,
                           temperatures: Any = None) -> ConformalCalibrations:
    """The per-trial calibrations of :func:`conformal_trials`, without evaluating them.

    The same splits, uniforms, RAPS parameters and thresholds as :func:`conformal_trials` with
    the same arguments (which calls this), for sets evaluated on other samples (e.g. shifted
    copies of the test samples: :func:`calibrated_sets`).

    Parameters
    ----------
    probs, labels, score, alpha, n_cal, trials, seed, mondrian, randomized, n_tune, raps_params, temperatures
        As :func:`conformal_trials`.

    Returns
    -------
    ConformalCalibrations
        Per trial: the split (``perms``; ``tune``, ``calibration`` and ``test`` indices), the
        uniforms ``u``, ``k_reg`` and ``lam`` (RAPS; zeros otherwise), ``qhat`` and
        ``temperature``.

    Raises
    ------
    InputError
        If an input is invalid (names the argument and the value).

    Examples
    --------
    >>> p = np.array([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.1, 0.2, 0.7], [0.5, 0.4, 0.1]])
    >>> cal = conformal_calibrations(p, [0, 1, 2, 1], score="thr", alpha=0.5, n_cal=2,
    ...                              trials=3, seed=0)
    >>> cal.qhat.shape, cal.calibration.shape, cal.test.shape
    ((3,), (3, 2), (3, 2))
    """
    return _calibrate(probs, labels, score=score, alpha=alpha, n_cal=n_cal, trials=trials,
                      seed=seed, mondrian=mondrian, randomized=randomized, n_tune=n_tune,
                      raps_params=raps_params, temperatures=temperatures)[0]


def calibrated_sets(calibrations: ConformalCalibrations, probs: Any, u: Any,
                    idx: Any = None) -> np.ndarray:
    """Each trial's prediction sets of other samples under its calibration.

    Parameters
    ----------
    calibrations : ConformalCalibrations
        Of :func:`conformal_calibrations`: per trial the score or baseline, its temperature,
        RAPS parameters and threshold.
    probs : array_like of float, shape (n, C), or RankedProbs
        The samples' un-tempered probabilities (each trial tempers them by its temperature).
    u : array_like of float, shape (trials, m)
        Each trial's uniform per evaluated sample (ignored by THR; for reproducibility, drawn
        by the caller).
    idx : array_like of int, shape (trials, m), optional
        The rows of ``probs`` each trial evaluates; default every row (``m = n``).

    Returns
    -------
    numpy.ndarray of bool, shape (trials, m, C)

    Raises
    ------
    InputError
        If the shapes do not fit (names the argument).

    Examples
    --------
    >>> p = np.array([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.1, 0.2, 0.7], [0.5, 0.4, 0.1]])
    >>> cal = conformal_calibrations(p, [0, 1, 2, 1], score="naive", alpha=0.5, n_cal=2,
    ...                              trials=1, seed=0)
    >>> calibrated_sets(cal, [[0.3, 0.3, 0.4]], [[0.5]]).astype(int)  # 0.15, 0.55, 0.85
    array([[[0, 0, 1]]])
    """
    if not isinstance(calibrations, ConformalCalibrations):
        raise InputError(f"calibrations must be a ConformalCalibrations, got "
                         f"{type(calibrations).__name__}")
    ranking = probs if isinstance(probs, RankedProbs) else RankedProbs(probs)
    p = ranking.p
    trials = calibrations.perms.shape[0]
    rows = (np.broadcast_to(np.arange(p.shape[0]), (trials, p.shape[0])) if idx is None
            else _wrap(as_numpy, idx, "idx"))
    if rows.ndim != 2 or rows.shape[0] != trials or rows.dtype.kind not in "iu" or (
            rows.size and (rows.min() < 0 or rows.max() >= p.shape[0])):
        raise InputError(f"idx must be row indices into probs (< {p.shape[0]}) of shape "
                         f"({trials}, m), got shape {rows.shape}")
    uu = _wrap(as_numpy, u, "u").astype(np.float64)
    if uu.shape != rows.shape:
        raise InputError(f"u must have shape {rows.shape} (a uniform per trial and evaluated "
                         f"sample), got shape {uu.shape}")
    if calibrations.mondrian and calibrations.qhat.shape[-1] != p.shape[1]:
        raise InputError(f"probs must have the calibration's {calibrations.qhat.shape[-1]} "
                         f"classes, got {p.shape[1]}")
    return _trial_sets(calibrations, ranking, None if idx is None else rows, uu,
                       np.arange(trials))


def trial_temperatures(probs: Any, labels: Any, *, n_cal: int, trials: int,
                       seed: int) -> np.ndarray:
    """A temperature fitted on each trial's calibration draw: the official code's "Platt".

    Trial ``t``'s temperature minimises the NLL of ``softmax(log p / T)`` on its ``n_cal``
    calibration samples (:func:`uqmetrics.metrics.calibration.fit_temperature`, bounded Brent search;
    the RAPS tuning samples included, as ``ConformalModelLogits`` fits ``T`` before
    ``pick_parameters`` splits them off), the splits of :func:`conformal_trials` with the same
    ``n_cal``, ``trials`` and ``seed``. Pass them as its ``temperatures=``.

    Parameters
    ----------
    probs : array_like of float, shape (n, C), or RankedProbs
        Un-tempered class probabilities (their logarithms are the logits, up to a per-sample
        constant that the softmax ignores).
    labels : array_like of int, shape (n,)
        True labels.
    n_cal, trials, seed
        As :func:`conformal_trials`.

    Returns
    -------
    numpy.ndarray of float, shape (trials,)

    Raises
    ------
    InputError
        If an input is invalid (names the argument and the value).

    Notes
    -----
    The official ``platt_logits`` takes at most 10 epochs of SGD (learning rate 0.01, batches
    of 32, from ``T = 1.3``, stopping when an epoch moves ``T`` by less than 0.01): near the
    same optimum, not at it.
    """
    from .calibration import fit_temperature  # scipy: imported on use

    ranking = probs if isinstance(probs, RankedProbs) else RankedProbs(probs)
    y = _labels(labels, ranking.p.shape[1])
    _wrap(check_same_length, labels=y, probs=ranking.p)
    perms = random_splits(ranking.p.shape[0], n_cal, trials,
                          np.random.default_rng(_int(seed, "seed", 0)))
    return np.array([fit_temperature(ranking.logp[row[:n_cal]], y[row[:n_cal]])
                     for row in perms])


def conformal_trials(probs: Any, labels: Any, *, score: str = "aps", alpha: float = 0.1,
                     n_cal: int, trials: int, seed: int, mondrian: bool = False,
                     randomized: bool = True, n_tune: int | None = None,
                     raps_params: tuple[int, float] | None = None,
                     size_bins: Sequence[tuple[int, int]] = SSCV_SIZE_BINS,
                     temperatures: Any = None) -> dict[str, np.ndarray]:
    """Split conformal prediction over ``trials`` random calibration/test splits.

    Per trial (``random_splits(n, n_cal, trials, default_rng(seed))``): the first ``n_tune``
    of the ``n_cal`` calibration samples tune RAPS (:func:`choose_raps_params`, as the
    official code's ``pick_parameters`` tunes on a split of the calibration data), the other
    ``n_cal - n_tune`` calibrate (:func:`conformal_quantile`, or
    :func:`conformal_quantile_by_class` when ``mondrian``), and the ``n - n_cal`` test samples
    are evaluated. One uniform per sample and trial (``default_rng(seed)`` after the splits,
    shape (trials, n)) serves the sample's calibration, tuning or all-class test scores.

    Parameters
    ----------
    probs : array_like of float, shape (n, C), or RankedProbs
        Class probabilities (a :class:`RankedProbs` is not checked and ranked again).
    labels : array_like of int, shape (n,)
        True labels.
    score : {"thr", "aps", "raps", "naive", "topk"}
        Conformity score (:data:`CONFORMAL_SCORES`), or a baseline of RAPS's Table 1
        (:data:`CONFORMAL_BASELINES`): ``naive``, the APS sets at ``qhat = 1 - alpha``, no
        calibration; ``topk``, :func:`rank_scores` at :func:`topk_threshold` of the
        calibration samples' ranks.
    alpha : float
        Miscoverage level in (0, 1).
    n_cal : int
        Calibration samples per trial, tuning samples included (``1 <= n_cal < n``).
    trials : int
        Number of random splits.
    seed : int
        Seed of :func:`numpy.random.default_rng` (splits, then uniforms).
    mondrian : bool
        Class-conditional thresholds (Mondrian conformal prediction by label; not for the
        baselines). No tuning split is held out unless ``score="raps"``.
    randomized : bool
        Randomized APS/RAPS/Naive/Top-K (THR ignores it). Not randomized, ``U = 1``, but
        ``U = 0`` for ``naive`` (the official ``gcq(randomized=False)``: the class whose
        cumulative mass crosses ``1 - alpha`` is kept, never an empty set).
    n_tune : int, optional
        Tuning samples held out of the calibration part. Default:
        ``ceil(RAPS_TUNE_FRACTION n_cal)`` (the official ``pct_paramtune = 0.33`` of Table 1)
        for RAPS without ``raps_params``, else 0. With another score (or given ``raps_params``)
        the tuning samples are held out but unused.
    raps_params : (int, float), optional
        Fixed ``(k_reg, lam)`` for RAPS (no tuning).
    size_bins : sequence of (int, int)
        SSCV strata (:func:`sscv`).
    temperatures : array_like of float, shape (trials,), optional
        Trial ``t`` scores ``softmax(log p / temperatures[t])`` (tuning, calibration and test
        alike), e.g. :func:`trial_temperatures`: the official "Platt" scaling on each
        trial's calibration draw. The classes' ranks are those of ``probs``.

    Returns
    -------
    dict of numpy.ndarray
        ``coverage``, ``mean_set_size``, ``median_set_size``, ``sscv``, ``covgap``,
        ``empty_fraction``, ``top1``, ``top5`` (the fraction of test samples whose label ranks
        first, in the first five): shape (trials,); ``qhat``: (trials,), or (trials, C) when
        ``mondrian``; for RAPS also ``k_reg`` (int) and ``lam`` (float), shape (trials,).

    Raises
    ------
    InputError
        If an input is invalid (names the argument and the value).
    """
    cals, ranking, y, _ = _calibrate(
        probs, labels, score=score, alpha=alpha, n_cal=n_cal, trials=trials, seed=seed,
        mondrian=mondrian, randomized=randomized, n_tune=n_tune, raps_params=raps_params,
        temperatures=temperatures)
    return _evaluate(cals, ranking, y, size_bins)


def evaluate_calibrations(calibrations: ConformalCalibrations, probs: Any, labels: Any, *,
                          size_bins: Sequence[tuple[int, int]] = SSCV_SIZE_BINS
                          ) -> dict[str, np.ndarray]:
    """The statistics :func:`conformal_trials` returns, of calibrations already made.

    ``conformal_trials(probs, labels, **kw)`` is ``evaluate_calibrations(
    conformal_calibrations(probs, labels, **kw), probs, labels)`` (``size_bins`` apart): for
    a caller that also applies the calibrations to other data (:func:`calibrated_sets`),
    calibrating once.

    Parameters
    ----------
    calibrations : ConformalCalibrations
        Of :func:`conformal_calibrations` on ``probs`` and ``labels``.
    probs : array_like of float, shape (n, C), or RankedProbs
        The samples they were calibrated on (their test samples are evaluated).
    labels : array_like of int, shape (n,)
        Their labels.
    size_bins : sequence of (int, int)
        SSCV strata (:func:`sscv`).

    Returns
    -------
    dict of numpy.ndarray
        As :func:`conformal_trials`.

    Raises
    ------
    InputError
        If the samples are not those the calibrations split (their number), or an input is
        invalid.
    """
    if not isinstance(calibrations, ConformalCalibrations) or calibrations.alpha is None:
        raise InputError(f"calibrations must be a ConformalCalibrations of "
                         f"conformal_calibrations, got {type(calibrations).__name__}")
    ranking = probs if isinstance(probs, RankedProbs) else RankedProbs(probs)
    y = _labels(labels, ranking.p.shape[1])
    _wrap(check_same_length, labels=y, probs=ranking.p)
    if calibrations.perms.shape[1] != ranking.p.shape[0]:
        raise InputError(f"probs must be the {calibrations.perms.shape[1]} samples the "
                         f"calibrations split, got {ranking.p.shape[0]}")
    return _evaluate(calibrations, ranking, y, size_bins)


def _evaluate(cals: ConformalCalibrations, ranking: RankedProbs, y: np.ndarray,
              size_bins: Sequence[tuple[int, int]]) -> dict[str, np.ndarray]:
    """The per-trial statistics of the calibrations ``cals`` on their test samples."""
    a, trials, score = cals.alpha, cals.perms.shape[0], cals.score
    c = ranking.p.shape[1]
    all_t = np.arange(trials)
    names = ("coverage", "mean_set_size", "median_set_size", "sscv", "covgap", "empty_fraction")
    out = {k: np.empty(trials) for k in names}
    test = cals.test
    chunk = max(1, _CHUNK_ELEMENTS // (test.shape[1] * c))
    for t0 in range(0, trials, chunk):
        tt = all_t[t0:t0 + chunk]
        sets = _trial_sets(cals, ranking, test[tt], cals.u[tt[:, None], test[tt]], tt)
        yt = y[test[tt]]
        out["coverage"][tt] = coverage(sets, yt)
        out["mean_set_size"][tt] = mean_set_size(sets)
        out["median_set_size"][tt] = median_set_size(sets)
        out["sscv"][tt] = sscv(sets, yt, a, size_bins)
        out["covgap"][tt] = covgap(sets, yt, a, c)
        out["empty_fraction"][tt] = empty_fraction(sets)
    true_rank = ranking.rank[test, y[test]]
    out["top1"], out["top5"] = (true_rank == 1).mean(axis=1), (true_rank <= 5).mean(axis=1)
    out["qhat"] = cals.qhat
    if score == "raps":
        out["k_reg"], out["lam"] = cals.k_reg, cals.lam
    return out
