"""Selective prediction and ranking metrics of a confidence function (docs/conventions.md#s-2).

Every metric here takes ``correct`` (n,) -- whether each prediction is right -- and
``confidence`` (n,) -- the confidence κ of each prediction, higher meaning more confident --
and depends on κ only through the order it induces (ties included), so the metrics are
invariant to strictly increasing transforms of κ and to permutations of the samples.

Ties in κ are handled so that no result depends on how a sort breaks them: AUROC counts a tie
as one half, and the risk-coverage quantities are evaluated only at the boundaries between
distinct κ values (AURC spreads the errors of a tied block evenly over its positions).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from scipy.special import xlogy
from scipy.stats import rankdata

from ._validation import (
    check_choice,
    check_correct,
    check_fraction,
    check_positive_int,
    correct_confidence,
)
from .exceptions import UndefinedMetricWarning
from .registry import register_metric

__all__ = [
    "AURC_C_COVERAGE",
    "SAC_RULES",
    "aupr_score",
    "aurc_c_loss",
    "aurc_loss",
    "auroc_score",
    "eaurc_c_loss",
    "eaurc_loss",
    "oracle_aurc",
    "risk_coverage_curve",
    "sac_score",
]

#: The coverage range of the registered ``aurc_c`` / ``eaurc_c`` metrics: coverages up to 50 %.
#: The Selective paper defines AURC over a set of coverages without fixing one; this range is
#: the project's choice (uqvision's selective protocol takes it as ``--aurc-coverage``).
AURC_C_COVERAGE: tuple[float, float] = (0.0, 0.5)
#: SAC rules (docs/conventions.md#s-2): ``"largest"`` (the paper's text, the default) and
#: ``"first_drop"`` (the paper's official code).
SAC_RULES = ("largest", "first_drop")

_SELECTIVE_PROPS = {"permutation_invariant", "monotone_invariant"}


def _tie_blocks(correct: np.ndarray, confidence: np.ndarray):
    """Group samples into blocks of equal κ, ordered by κ descending.

    Returns ``(thresholds (B,), sizes (B,), n_correct (B,))``: the distinct κ values in
    descending order, the number of samples in each block and the number of correct ones.
    """
    values, inverse, sizes = np.unique(confidence, return_inverse=True, return_counts=True)
    n_correct = np.bincount(inverse, weights=correct, minlength=values.size).astype(np.int64)
    return values[::-1], sizes[::-1].astype(np.int64), n_correct[::-1]


def _warn_undefined(message: str) -> float:
    warnings.warn(message, UndefinedMetricWarning, stacklevel=3)
    return float("nan")


def risk_coverage_curve(correct: Any, confidence: Any):
    """Risk-coverage curve of a confidence function.

    A selective classifier keeps the samples with ``confidence >= threshold`` and abstains on
    the others. Like :func:`sklearn.metrics.roc_curve`, the curve is evaluated at every
    boundary between distinct κ values, with κ descending, so that tied samples are always kept
    or rejected together.

    Parameters
    ----------
    correct : array_like of bool, shape (n_samples,)
        Whether each prediction is correct (0/1 accepted).
    confidence : array_like of float, shape (n_samples,)
        Confidence κ of each prediction; higher means more confident.

    Returns
    -------
    coverage : ndarray of float, shape (n_thresholds,)
        Fraction of samples kept, ``n_kept / n``, increasing; the last entry is 1.
    risk : ndarray of float, shape (n_thresholds,)
        Selective risk, the error rate among the kept samples.
    thresholds : ndarray of float, shape (n_thresholds,)
        The distinct κ values in descending order; entry k keeps ``confidence >= thresholds[k]``.

    Notes
    -----
    With distinct values κ_(1) > ... > κ_(B), coverage_k = |{i: κ_i >= κ_(k)}| / n and
    risk_k = |{i: κ_i >= κ_(k), not correct_i}| / |{i: κ_i >= κ_(k)}|.

    References
    ----------
    R. El-Yaniv and Y. Wiener, "On the foundations of noise-free selective classification",
    JMLR 2010. I. Galil, M. Dabbah, R. El-Yaniv, "What can we learn from the selective
    prediction and uncertainty estimation performance of 523 ImageNet classifiers?", ICLR 2023.

    Examples
    --------
    >>> cov, risk, thr = risk_coverage_curve([1, 1, 0, 1], [0.9, 0.8, 0.8, 0.1])
    >>> cov.tolist(), risk.tolist(), thr.tolist()
    ([0.25, 0.75, 1.0], [0.0, 0.3333333333333333, 0.25], [0.9, 0.8, 0.1])
    """
    c, k = correct_confidence(correct, confidence)
    thresholds, sizes, n_correct = _tie_blocks(c, k)
    kept = np.cumsum(sizes)
    errors = np.cumsum(sizes - n_correct)
    return kept / c.size, errors / kept, thresholds


@register_metric("auroc", kind="selective", properties=_SELECTIVE_PROPS)
def auroc_score(correct: Any, confidence: Any) -> float:
    """AUROC of the confidence for separating correct from incorrect predictions.

    Parameters
    ----------
    correct : array_like of bool, shape (n_samples,)
        Whether each prediction is correct (the positive class).
    confidence : array_like of float, shape (n_samples,)
        Confidence κ of each prediction; higher means more confident.

    Returns
    -------
    float
        The AUROC in [0, 1]; 0.5 for an uninformative (e.g. constant) κ, 1 for a perfect
        ranking. ``nan`` with an :class:`UndefinedMetricWarning` when all predictions are
        correct or all are wrong.

    Notes
    -----
    The tie-aware Mann-Whitney estimate

    .. math:: \\frac{1}{n_+ n_-}\\sum_{i: c_i} \\sum_{j: \\lnot c_j}
              \\left(1[\\kappa_i > \\kappa_j] + \\tfrac12 1[\\kappa_i = \\kappa_j]\\right),

    computed in O(n log n) from average ranks: ``(Σ_{i: c_i} rank_i - n_+(n_+ + 1)/2) /
    (n_+ n_-)``. It equals ``sklearn.metrics.roc_auc_score(correct, confidence)``. This is the
    one AUROC of the package: the OOD and retrieval AUROCs call it.

    References
    ----------
    I. Galil, M. Dabbah, R. El-Yaniv, "What can we learn from the selective prediction and
    uncertainty estimation performance of 523 ImageNet classifiers?", ICLR 2023.

    Examples
    --------
    >>> auroc_score([1, 1, 0, 0], [0.9, 0.5, 0.5, 0.1])
    0.875
    """
    c, k = correct_confidence(correct, confidence)
    n_pos = int(c.sum())
    n_neg = c.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return _warn_undefined(
            f"AUROC is undefined with {n_pos} correct and {n_neg} wrong predictions "
            "(both classes are needed); returning nan"
        )
    ranks = rankdata(k, method="average")
    u_stat = ranks[c].sum() - n_pos * (n_pos + 1) / 2
    return float(u_stat / (n_pos * n_neg))


def aupr_score(correct: Any, confidence: Any, *, positive: str = "correct") -> float:
    """Area under the precision-recall curve (average precision) of the confidence.

    Parameters
    ----------
    correct : array_like of bool, shape (n_samples,)
        Whether each prediction is correct.
    confidence : array_like of float, shape (n_samples,)
        Confidence κ of each prediction; higher means more confident.
    positive : {"correct", "wrong"}, default "correct"
        The positive class. ``"correct"`` ranks by κ (AUPR-In / AUPR-Success); ``"wrong"``
        detects errors, ranking by −κ (AUPR-Out / AUPR-Error).

    Returns
    -------
    float
        Average precision in [0, 1]; ``nan`` with an :class:`UndefinedMetricWarning` when no
        sample is positive.

    Notes
    -----
    With the positives y and the score s (κ, or −κ for ``positive="wrong"``), evaluated at the
    boundaries between distinct scores in descending order,
    ``AP = Σ_k (R_k − R_{k−1}) P_k`` with precision P_k and recall R_k at the k-th threshold and
    R_0 = 0 -- scikit-learn's ``average_precision_score(y, s)`` (no interpolation).

    Examples
    --------
    >>> aupr_score([1, 0, 1, 0, 1], [0.9, 0.8, 0.7, 0.1, 0.05])  # (1 + 2/3 + 3/5) / 3
    0.7555555555555555
    >>> aupr_score([1, 0, 1, 0, 1], [0.9, 0.8, 0.7, 0.1, 0.05], positive="wrong")
    0.5
    """
    c, k = correct_confidence(correct, confidence)
    check_choice(positive, "positive", {"correct", "wrong"})
    if positive == "wrong":
        c, k = ~c, -k
    n_pos = int(c.sum())
    if n_pos == 0:
        return _warn_undefined(
            f"AUPR with positive={positive!r} is undefined: no {positive} predictions; "
            "returning nan"
        )
    _, sizes, n_true = _tie_blocks(c, k)
    precision = np.cumsum(n_true) / np.cumsum(sizes)
    return float(np.sum(n_true * precision) / n_pos)


def _spread_cumsum(c: np.ndarray, k: np.ndarray, count_errors: bool) -> np.ndarray:
    """Expected errors (or correct predictions) among the top i, i = 1..N, shape (N,).

    Samples sorted by κ descending; the count of a tied block is spread evenly over its
    positions (linear within the block: the mean of the hypergeometric distribution under a
    uniformly random order of the block), so nothing depends on how a sort breaks ties.
    """
    _, sizes, n_correct = _tie_blocks(c, k)
    counts = sizes - n_correct if count_errors else n_correct
    before = np.cumsum(counts) - counts
    start = np.cumsum(sizes) - sizes
    block = np.repeat(np.arange(sizes.size), sizes)
    position = np.arange(1, c.size + 1)
    return before[block] + counts[block] * (position - start[block]) / sizes[block]


def _selective_risks(c: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Selective risk e_i / i of the top i, i = 1..N (ties spread), shape (N,)."""
    return _spread_cumsum(c, k, count_errors=True) / np.arange(1, c.size + 1)


def _aurc(c: np.ndarray, k: np.ndarray) -> float:
    return float(np.mean(_selective_risks(c, k)))


@register_metric("aurc", kind="selective", properties=_SELECTIVE_PROPS)
def aurc_loss(correct: Any, confidence: Any) -> float:
    """Area under the risk-coverage curve (lower is better).

    Parameters
    ----------
    correct : array_like of bool, shape (n_samples,)
        Whether each prediction is correct.
    confidence : array_like of float, shape (n_samples,)
        Confidence κ of each prediction; higher means more confident.

    Returns
    -------
    float
        AURC in [0, 1].

    Notes
    -----
    With the samples sorted by κ descending and e_i the number of errors among the top i,

    .. math:: \\mathrm{AURC} = \\frac{1}{N}\\sum_{i=1}^{N} \\frac{e_i}{i}

    (the Selective paper's estimator; the risk of the top i averaged over all coverages i/N).
    Ties: within a tied block occupying positions start+1..start+b with w errors,
    ``e_i = e_start + w (i − start) / b`` -- the expected error count under a uniformly random
    order of the block -- so the result does not depend on how the sort breaks ties. A constant
    κ therefore gives AURC = the error rate.

    References
    ----------
    Y. Geifman, G. Uziel, R. El-Yaniv, "Bias-reduced uncertainty estimation for deep neural
    classifiers", ICLR 2019. I. Galil, M. Dabbah, R. El-Yaniv, ICLR 2023 (Appendix C).

    Examples
    --------
    >>> aurc_loss([1, 1, 0, 0], [0.9, 0.8, 0.7, 0.6])  # (0 + 0 + 1/3 + 2/4) / 4
    0.20833333333333331
    >>> aurc_loss([1, 0, 1, 0], [0.5, 0.5, 0.5, 0.5])  # constant κ: the error rate
    0.5
    """
    c, k = correct_confidence(correct, confidence)
    return _aurc(c, k)


def oracle_aurc(correct: Any, *, method: str = "empirical") -> float:
    """AURC of the oracle ranking: the same predictions with every correct one ranked first.

    Parameters
    ----------
    correct : array_like of bool, shape (n_samples,)
        Whether each prediction is correct.
    method : {"empirical", "analytic"}, default "empirical"
        ``"empirical"``: the exact finite-sample AURC of the oracle ranking.
        ``"analytic"``: the continuous approximation ``r + (1 − r) ln(1 − r)`` of Geifman et
        al., with r the error rate (0 for r = 0, 1 for r = 1).

    Returns
    -------
    float

    Notes
    -----
    Empirical: with n_c correct predictions out of N, ``(1/N) Σ_{i=n_c+1}^{N} (i − n_c)/i``.

    Examples
    --------
    >>> round(oracle_aurc([True] * 20 + [False] * 80), 3)  # Selective paper, Appendix C
    0.482
    >>> round(oracle_aurc([True] * 20 + [False] * 80, method="analytic"), 3)
    0.478
    """
    c = check_correct(correct)
    check_choice(method, "method", {"empirical", "analytic"})
    if method == "analytic":
        r = 1.0 - float(c.mean())
        return float(r + xlogy(1.0 - r, 1.0 - r))
    return _aurc(c, c.astype(np.float64))


@register_metric("eaurc", kind="selective", properties=_SELECTIVE_PROPS)
def eaurc_loss(correct: Any, confidence: Any, *, oracle: str = "empirical") -> float:
    """Excess AURC: the AURC minus the AURC of the oracle ranking (lower is better).

    Parameters
    ----------
    correct : array_like of bool, shape (n_samples,)
        Whether each prediction is correct.
    confidence : array_like of float, shape (n_samples,)
        Confidence κ of each prediction; higher means more confident.
    oracle : {"empirical", "analytic"}, default "empirical"
        How the oracle AURC is computed, see :func:`oracle_aurc`.

    Returns
    -------
    float
        E-AURC; >= 0 with the empirical oracle, and 0 for a perfect ranking.

    Notes
    -----
    ``E-AURC = AURC(κ) − AURC(oracle)``. Since the tie-spread AURC is the mean over random
    orders of the tied blocks and the oracle minimises AURC over all orders, the empirical
    E-AURC is never negative. Still sensitive to accuracy (Selective paper, Appendix C): a
    constant κ gives 0.318 at accuracy 0.2 but 0.178 at accuracy 0.8 (N = 100).

    References
    ----------
    Y. Geifman, G. Uziel, R. El-Yaniv, ICLR 2019. I. Galil, M. Dabbah, R. El-Yaniv, ICLR 2023.

    Examples
    --------
    >>> eaurc_loss([1, 1, 0, 0], [0.9, 0.8, 0.7, 0.6])  # perfect ranking
    0.0
    >>> round(eaurc_loss([True] * 80 + [False] * 20, [0.5] * 100), 3)
    0.178
    """
    c, k = correct_confidence(correct, confidence)
    check_choice(oracle, "oracle", {"empirical", "analytic"})
    return _aurc(c, k) - oracle_aurc(c, method=oracle)


def _coverage_positions(coverage: Any, n: int) -> slice:
    """Positions i (0-based slice of 1..N) whose coverage i/N lies in ``coverage = (lo, hi)``."""
    try:
        lo, hi = (float(v) for v in coverage)
    except (TypeError, ValueError):
        raise ValueError(f"coverage must be a pair (low, high), got {coverage!r}") from None
    if not (0.0 <= lo < hi <= 1.0):
        raise ValueError(f"coverage must satisfy 0 <= low < high <= 1, got {coverage!r}")
    # i/N in [lo, hi], i >= 1; rounding guards products such as 0.3 * 10 = 3.0000000000000004
    first = max(1, math.ceil(round(lo * n, 9)))
    last = math.floor(round(hi * n, 9))
    if last < first:
        raise ValueError(f"coverage {coverage!r} contains no coverage i/N of the {n} samples")
    return slice(first - 1, last)


def aurc_c_loss(correct: Any, confidence: Any, *,
                coverage: tuple[float, float] = AURC_C_COVERAGE) -> float:
    """AURC over a range of coverages, AURC_C (lower is better).

    Parameters
    ----------
    correct : array_like of bool, shape (n_samples,)
        Whether each prediction is correct.
    confidence : array_like of float, shape (n_samples,)
        Confidence κ of each prediction; higher means more confident.
    coverage : (float, float), default (0.0, 0.5)
        The closed coverage range ``[low, high]``, ``0 <= low < high <= 1``; it must contain at
        least one coverage i/N.

    Returns
    -------
    float
        The mean selective risk over the coverages i/N in the range, in [0, 1].

    Notes
    -----
    The Selective paper's ``AURC_C = (1/|C|) Σ_{c ∈ C} r̂(f, g_c)`` with C the empirical
    coverages i/N (i = 1..N) inside ``[low, high]``, and r̂ the risk e_i/i of the top i with ties
    spread as in :func:`aurc_loss`. ``coverage=(0, 1)`` is exactly :func:`aurc_loss`.

    References
    ----------
    I. Galil, M. Dabbah, R. El-Yaniv, ICLR 2023 (Section 2).

    Examples
    --------
    >>> c, k = [1, 0, 1, 0], [0.9, 0.7, 0.5, 0.2]  # risks of the top i: 0, 1/2, 1/3, 1/2
    >>> aurc_c_loss(c, k, coverage=(0.5, 1.0))  # (1/2 + 1/3 + 1/2) / 3
    0.4444444444444444
    >>> aurc_c_loss(c, k, coverage=(0.0, 1.0)) == aurc_loss(c, k)
    True
    """
    c, k = correct_confidence(correct, confidence)
    return float(np.mean(_selective_risks(c, k)[_coverage_positions(coverage, c.size)]))


def eaurc_c_loss(correct: Any, confidence: Any, *,
                 coverage: tuple[float, float] = AURC_C_COVERAGE) -> float:
    """Excess AURC over a range of coverages: AURC_C minus that of the oracle ranking.

    Parameters
    ----------
    correct : array_like of bool, shape (n_samples,)
        Whether each prediction is correct.
    confidence : array_like of float, shape (n_samples,)
        Confidence κ of each prediction; higher means more confident.
    coverage : (float, float), default (0.0, 0.5)
        The closed coverage range, as in :func:`aurc_c_loss`.

    Returns
    -------
    float
        ``AURC_C(κ) − AURC_C(oracle)`` >= 0, 0 for a perfect ranking.

    Notes
    -----
    The oracle ranks every correct prediction first (the exact empirical oracle of
    :func:`oracle_aurc`); its risk is 0 at coverages up to the accuracy, so at such ranges
    E-AURC_C = AURC_C. ``coverage=(0, 1)`` is exactly :func:`eaurc_loss`.

    Examples
    --------
    >>> c, k = [1, 0, 1, 0], [0.9, 0.7, 0.5, 0.2]  # oracle risks: 0, 0, 1/3, 1/2
    >>> round(eaurc_c_loss(c, k, coverage=(0.5, 1.0)), 12)  # 4/9 - (0 + 1/3 + 1/2) / 3
    0.166666666667
    """
    c, k = correct_confidence(correct, confidence)
    at = _coverage_positions(coverage, c.size)
    oracle = _selective_risks(c, c.astype(np.float64))
    return float(np.mean(_selective_risks(c, k)[at]) - np.mean(oracle[at]))


def sac_score(correct: Any, confidence: Any, *, accuracy: float, rule: str = "largest",
              burn_in: int = 200) -> float:
    """Selective accuracy constraint: the largest coverage whose selective accuracy is enough.

    Parameters
    ----------
    correct : array_like of bool, shape (n_samples,)
        Whether each prediction is correct.
    confidence : array_like of float, shape (n_samples,)
        Confidence κ of each prediction; higher means more confident.
    accuracy : float in (0, 1]
        The required selective accuracy α.
    rule : {"largest", "first_drop"}, default "largest"
        ``"largest"``: the paper's definition (below). ``"first_drop"``: the rule of the
        paper's official code, to reproduce its published SAC values (Notes).
    burn_in : int, default 200
        ``first_drop`` only: samples skipped before a drop below α counts (the official
        ``start_index``).

    Returns
    -------
    float
        ``"largest"``: the largest coverage k/N, k at a boundary between distinct κ values
        (κ descending), at which the accuracy of the top k is >= α; 1.0 if it holds at full
        coverage, 0.0 if it holds at no coverage. ``"first_drop"``: see Notes.

    Notes
    -----
    ``largest``: ``SAC(α) = max({k/N : k ∈ K, acc(top k) >= α} ∪ {0})`` with K the block
    boundaries of :func:`risk_coverage_curve`. The comparison is exact: an accuracy of 19/20
    meets α = 0.95.

    ``first_drop`` transcribes ``coverage_for_desired_accuracy`` of the official code
    (IdoGalil/benchmarking-uncertainty-estimation-performance): with a_i the accuracy of the
    top i (i = 1..N), j_0 the 0-based index of the first i with a_i < α and j_b the same
    searched from index ``burn_in`` on, the result is ``j / (N + 1)`` with j = j_b if
    j_b > ``burn_in`` else j_0. As in that code, an index that does not exist counts as 0
    (``numpy.argmax`` of an all-false array): a model whose accuracy never drops below α gets
    0, and a first drop exactly at ``burn_in`` falls back to j_0. With N <= ``burn_in`` only
    j_0 is used (the official code raises there). Ties in κ: a_i uses the correct count
    spread evenly over a tied block, as :func:`aurc_loss` (the official code breaks ties in
    the arbitrary order of ``torch.argsort``). It exceeds ``largest`` by 0.5-1.7 points of
    SAC@0.99 at N = 45,000 (docs/conventions.md#s-2).

    References
    ----------
    I. Galil, M. Dabbah, R. El-Yaniv, ICLR 2023 (Section 2 and Appendix I).

    Examples
    --------
    >>> sac_score([1, 1, 0, 1, 0], [0.9, 0.8, 0.7, 0.6, 0.5], accuracy=0.75)
    0.8
    >>> sac_score([0, 1], [0.9, 0.1], accuracy=0.99)
    0.0
    >>> sac_score([1, 1, 0, 1, 0], [0.9, 0.8, 0.7, 0.6, 0.5], accuracy=0.75, rule="first_drop",
    ...           burn_in=1)  # first drop below 0.75 at index 2 (2/3): 2 / (5 + 1)
    0.3333333333333333
    """
    alpha = check_fraction(accuracy, "accuracy", low=0.0, high=1.0, closed="right")
    check_choice(rule, "rule", SAC_RULES)
    c, k = correct_confidence(correct, confidence)
    if rule == "first_drop":
        burn_in = check_positive_int(burn_in, "burn_in", minimum=0)
        below = _spread_cumsum(c, k, count_errors=False) / np.arange(1, c.size + 1) < alpha
        j = int(np.argmax(below))
        if c.size > burn_in:
            j_burn = int(np.argmax(below[burn_in:])) + burn_in
            j = j_burn if j_burn > burn_in else j
        return j / (c.size + 1)
    _, sizes, n_correct = _tie_blocks(c, k)
    kept = np.cumsum(sizes)
    ok = np.cumsum(n_correct) / kept >= alpha
    if not ok.any():
        return 0.0
    return float(kept[np.flatnonzero(ok)[-1]] / c.size)


def _sac_at(alpha: float, rule: str = "largest"):
    percent = round(alpha * 100)
    suffix = "" if rule == "largest" else f"_{rule}"

    def sac_at_score(correct, confidence):
        return sac_score(correct, confidence, accuracy=alpha, rule=rule)

    sac_at_score.__name__ = sac_at_score.__qualname__ = f"sac_{percent}{suffix}_score"
    sac_at_score.__doc__ = (f"SAC at selective accuracy {alpha}, rule {rule!r}: "
                            f"``sac_score(..., accuracy={alpha}, rule={rule!r})``.")
    return sac_at_score


def _aupr_wrong_score(correct, confidence):
    """AUPR with the wrong predictions as positives: ``aupr_score(..., positive="wrong")``."""
    return aupr_score(correct, confidence, positive="wrong")


register_metric("aupr", kind="selective", properties=_SELECTIVE_PROPS)(aupr_score)
register_metric("aupr_wrong", kind="selective", properties=_SELECTIVE_PROPS)(_aupr_wrong_score)
register_metric("aurc_c", kind="selective", properties=_SELECTIVE_PROPS)(aurc_c_loss)
register_metric("eaurc_c", kind="selective", properties=_SELECTIVE_PROPS)(eaurc_c_loss)
for _alpha in (0.95, 0.99):
    for _rule in SAC_RULES:
        _f = _sac_at(_alpha, _rule)
        register_metric(_f.__name__.removesuffix("_score"), kind="selective",
                        properties=_SELECTIVE_PROPS)(_f)
del _alpha, _rule, _f
