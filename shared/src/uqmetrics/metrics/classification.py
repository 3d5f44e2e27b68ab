"""Classification and calibration metrics on ``(labels, probs)`` (docs/conventions.md#s-1).

Every metric takes integer ``labels`` of shape ``(n,)`` and class probabilities ``probs`` of shape
``(n, C)`` (rows summing to 1), as numpy arrays, torch tensors or xarray objects, and returns a
Python float. The top-1 predicted class is ``argmax(probs)`` (the first maximum on ties), its
probability is the confidence.

All binned calibration errors share one bin assignment (:func:`bin_edges` and
:func:`assign_bins`): ``M`` bins, bin ``j = (e_{j-1}, e_j]`` left-open and right-closed, a value
exactly equal to the lowest edge (a confidence of exactly 0) falls in the FIRST bin and a value
of exactly 1.0 in the LAST. Empty bins are skipped; non-empty bins are weighted by ``|B_j| / n``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import xarray as xr

from ._validation import (
    PROB_SUM_ATOL,
    check_choice,
    check_fraction,
    check_positive_int,
    correct_confidence,
    float_array,
    labels_probs,
)
from .registry import register_metric

__all__ = [
    "ACE_WEIGHTINGS",
    "BIN_STRATEGIES",
    "accuracy_score",
    "adaptive_calibration_error",
    "assign_bins",
    "bin_edges",
    "brier_loss",
    "confidence_calibration_error",
    "expected_calibration_error",
    "maximum_calibration_error",
    "nll_loss",
    "reliability_diagram",
    "static_calibration_error",
    "top_k_accuracy_score",
]


# --------------------------------------------------------------------------------------------
# Accuracy, NLL, Brier
# --------------------------------------------------------------------------------------------


def _label_rank(labels: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """0-based rank of the true class under "first maximum wins" tie-breaking."""
    n = labels.shape[0]
    p_y = probs[np.arange(n), labels][:, None]
    cls = np.arange(probs.shape[1])[None, :]
    ahead = (probs > p_y) | ((probs == p_y) & (cls < labels[:, None]))
    return ahead.sum(axis=1)


@register_metric("accuracy", kind="classification",
                 properties={"permutation_invariant", "temperature_invariant"})
def accuracy_score(labels: Any, probs: Any) -> float:
    """Top-1 accuracy: the fraction of samples whose ``argmax`` class is the label.

    Parameters
    ----------
    labels : array_like of int, shape (n,)
        True classes in ``[0, C)``.
    probs : array_like of float, shape (n, C)
        Predicted class probabilities, rows summing to 1.

    Returns
    -------
    float
        Accuracy in ``[0, 1]``, higher is better.

    Notes
    -----
    ``acc = (1/n) sum_i 1[argmax_c p_ic = y_i]`` with ``argmax`` returning the first maximum on
    ties (numpy's convention).

    Examples
    --------
    >>> accuracy_score([0, 1, 1], [[0.7, 0.3], [0.4, 0.6], [0.5, 0.5]])
    0.6666666666666666
    """
    y, p = labels_probs(labels, probs)
    return float(np.mean(np.argmax(p, axis=1) == y))


def top_k_accuracy_score(labels: Any, probs: Any, *, k: int = 1) -> float:
    """Top-k accuracy: the fraction of samples whose label is among the ``k`` most probable classes.

    Parameters
    ----------
    labels : array_like of int, shape (n,)
        True classes in ``[0, C)``.
    probs : array_like of float, shape (n, C)
        Predicted class probabilities, rows summing to 1.
    k : int, default 1
        Number of top classes; ``k >= C`` gives 1.0.

    Returns
    -------
    float
        Top-k accuracy in ``[0, 1]``, higher is better; ``k=1`` equals :func:`accuracy_score`.

    Notes
    -----
    The rank of the label is the number of classes with a larger probability plus the number of
    classes with an equal probability and a smaller index (ties broken towards the first class,
    as ``argmax`` does); the sample counts if that rank is below ``k``.

    Examples
    --------
    >>> top_k_accuracy_score([2, 2], [[0.5, 0.3, 0.2], [0.1, 0.2, 0.7]], k=2)
    0.5
    """
    k = check_positive_int(k, "k")
    y, p = labels_probs(labels, probs)
    return float(np.mean(_label_rank(y, p) < k))


@register_metric("top5_accuracy", kind="classification",
                 properties={"permutation_invariant", "temperature_invariant"})
def _top5_accuracy_score(labels: Any, probs: Any) -> float:
    """Top-5 accuracy (:func:`top_k_accuracy_score` with ``k=5``)."""
    return top_k_accuracy_score(labels, probs, k=5)


@register_metric(
    "nll", kind="classification", properties={"permutation_invariant", "proper_scoring_rule"}
)
def nll_loss(labels: Any, probs: Any, *, eps: float = 1e-12) -> float:
    """Negative log-likelihood (log loss) of the true class.

    Parameters
    ----------
    labels : array_like of int, shape (n,)
        True classes in ``[0, C)``.
    probs : array_like of float, shape (n, C)
        Predicted class probabilities, rows summing to 1.
    eps : float, default 1e-12
        The probability of the true class is clipped to ``[eps, 1]`` before the log.

    Returns
    -------
    float
        Mean NLL in nats, lower is better.

    Notes
    -----
    ``NLL = -(1/n) sum_i log max(p_{i, y_i}, eps)`` (docs/conventions.md#s-1).

    Examples
    --------
    >>> round(nll_loss([0, 1], [[0.5, 0.5], [0.2, 0.8]]), 6)
    0.458145
    """
    eps = check_fraction(eps, "eps", low=0.0, high=1.0, closed="neither")
    y, p = labels_probs(labels, probs)
    p_y = np.clip(p[np.arange(y.shape[0]), y], eps, 1.0)
    return float(-np.mean(np.log(p_y)))


@register_metric(
    "brier", kind="classification", properties={"permutation_invariant", "proper_scoring_rule"}
)
def brier_loss(labels: Any, probs: Any, *, normalize: bool = False) -> float:
    """Multi-class Brier score: squared distance between ``probs`` and the one-hot label.

    Parameters
    ----------
    labels : array_like of int, shape (n,)
        True classes in ``[0, C)``.
    probs : array_like of float, shape (n, C)
        Predicted class probabilities, rows summing to 1.
    normalize : bool, default False
        Divide by the number of classes ``C``.

    Returns
    -------
    float
        Brier score in ``[0, 2]`` (``[0, 2/C]`` normalised), lower is better.

    Notes
    -----
    ``BS = (1/n) sum_i sum_c (p_ic - 1[c = y_i])^2`` summed over classes, **not** divided by
    ``C`` unless ``normalize=True`` (docs/conventions.md#s-1). For two classes the un-normalised
    value is twice scikit-learn's ``brier_score_loss`` on the positive-class probability.

    Examples
    --------
    >>> round(brier_loss([0, 1], [[0.5, 0.5], [0.2, 0.8]]), 6)
    0.29
    """
    y, p = labels_probs(labels, probs)
    onehot = np.zeros_like(p)
    onehot[np.arange(y.shape[0]), y] = 1.0
    per_sample = np.sum((p - onehot) ** 2, axis=1)
    score = float(np.mean(per_sample))
    return score / p.shape[1] if normalize else score


# --------------------------------------------------------------------------------------------
# Binning (defined once, used by every binned calibration error)
# --------------------------------------------------------------------------------------------


def _uniform_edges(values: np.ndarray, n_bins: int) -> np.ndarray:
    # j / M computed by one correctly rounded division, so an edge equals the decimal literal
    # of j/M (e.g. 0.6 == 9/15) and right-closed bins behave as written.
    return np.arange(n_bins + 1, dtype=np.float64) / n_bins


def _quantile_edges(values: np.ndarray, n_bins: int) -> np.ndarray:
    edges = np.quantile(values, np.arange(n_bins + 1, dtype=np.float64) / n_bins)
    edges[0], edges[-1] = 0.0, 1.0
    return np.maximum.accumulate(edges)


#: Bin strategies: name -> function ``(values (n,), n_bins) -> edges (n_bins + 1,)``.
#: ``uniform``: equal-width bins on [0, 1]. ``quantile``: equal-mass bins whose inner edges are
#: the (linearly interpolated) ``j/M`` quantiles of the values; with distinct values and ``n``
#: divisible by ``M`` every bin holds exactly ``n/M`` values, tied values always share a bin.
BIN_STRATEGIES: dict[str, Callable[[np.ndarray, int], np.ndarray]] = {
    "uniform": _uniform_edges,
    "quantile": _quantile_edges,
}


def bin_edges(values: Any, *, n_bins: int = 15, strategy: str = "uniform") -> np.ndarray:
    """Bin edges on ``[0, 1]`` for the binned calibration errors.

    Parameters
    ----------
    values : array_like of float, shape (n,)
        Values in ``[0, 1]`` to be binned (only used by ``strategy="quantile"``).
    n_bins : int, default 15
        Number of bins ``M``.
    strategy : {"uniform", "quantile"}, default "uniform"
        Equal-width or equal-mass bins (see :data:`BIN_STRATEGIES`).

    Returns
    -------
    numpy.ndarray, shape (n_bins + 1,)
        Non-decreasing edges with ``edges[0] = 0`` and ``edges[-1] = 1``.

    Examples
    --------
    >>> bin_edges([0.1, 0.2], n_bins=4)
    array([0.  , 0.25, 0.5 , 0.75, 1.  ])
    >>> bin_edges([0.1, 0.2, 0.3, 0.4], n_bins=2, strategy="quantile")
    array([0.  , 0.25, 1.  ])
    """
    n_bins = check_positive_int(n_bins, "n_bins")
    check_choice(strategy, "strategy", BIN_STRATEGIES)
    v = _check_unit_interval(float_array(values, "values", 1, "(n_samples,)"), "values")
    return BIN_STRATEGIES[strategy](v, n_bins)


def assign_bins(values: Any, edges: Any) -> np.ndarray:
    """Index of the left-open, right-closed bin ``(edges[j], edges[j+1]]`` holding each value.

    Parameters
    ----------
    values : array_like of float, any shape
        Values in ``[edges[0], edges[-1]]``.
    edges : array_like of float, shape (M + 1,)
        Non-decreasing bin edges.

    Returns
    -------
    numpy.ndarray of int, same shape as ``values``
        Bin indices in ``[0, M)``. A value equal to ``edges[0]`` goes to the first bin (bin 0),
        a value equal to ``edges[-1]`` to the last; values outside are clipped to the end bins.

    Notes
    -----
    ``j = searchsorted(edges, v, side="left") - 1`` clipped to ``[0, M-1]``: ``side="left"``
    makes a value equal to an inner edge ``e_j`` land in the bin that ends at ``e_j``. With
    duplicated edges (ties in equal-mass binning) the zero-width bins stay empty.

    Examples
    --------
    >>> assign_bins([0.0, 0.2, 0.25, 0.26, 1.0], [0.0, 0.25, 0.5, 0.75, 1.0])
    array([0, 0, 0, 1, 3])
    """
    e = np.asarray(edges, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    idx = np.searchsorted(e, v, side="left") - 1
    return np.clip(idx, 0, e.shape[0] - 2)


def _check_unit_interval(v: np.ndarray, name: str) -> np.ndarray:
    if v.min() < 0 or v.max() > 1 + PROB_SUM_ATOL:
        raise ValueError(f"{name} must lie in [0, 1], got range [{v.min():.6g}, {v.max():.6g}]")
    return v


def _bin_stats(target: np.ndarray, value: np.ndarray, edges: np.ndarray):
    """Per-bin count, mean target (accuracy) and mean value (confidence); NaN where empty."""
    m = edges.shape[0] - 1
    idx = assign_bins(value, edges)
    count = np.bincount(idx, minlength=m)
    s_t = np.bincount(idx, weights=target.astype(np.float64), minlength=m)
    s_v = np.bincount(idx, weights=value, minlength=m)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.where(count > 0, s_t / np.maximum(count, 1), np.nan)
        conf = np.where(count > 0, s_v / np.maximum(count, 1), np.nan)
    return count, acc, conf


def _reduce_gaps(count: np.ndarray, acc: np.ndarray, conf: np.ndarray, norm: str) -> float:
    keep = count > 0
    w = count[keep] / count.sum()
    gap = np.abs(acc[keep] - conf[keep])
    return float(_NORMS[norm](w, gap))


_NORMS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "l1": lambda w, gap: np.sum(w * gap),
    "l2": lambda w, gap: np.sqrt(np.sum(w * gap**2)),
    "max": lambda w, gap: np.max(gap),
}


def _top1(labels: Any, probs: Any) -> tuple[np.ndarray, np.ndarray]:
    y, p = labels_probs(labels, probs)
    pred = np.argmax(p, axis=1)
    return pred == y, p[np.arange(y.shape[0]), pred]


# --------------------------------------------------------------------------------------------
# Top-1 (confidence) calibration errors
# --------------------------------------------------------------------------------------------


@register_metric("confidence_ece", kind="selective", family="calibration",
                 properties={"permutation_invariant"})
def confidence_calibration_error(
    correct: Any,
    confidence: Any,
    *,
    n_bins: int = 15,
    strategy: str = "uniform",
    norm: str = "l1",
) -> float:
    """Binned calibration error of a confidence in ``[0, 1]`` against correctness.

    The engine behind :func:`expected_calibration_error` and
    :func:`maximum_calibration_error`, usable on any ``(correct, confidence)`` pair.

    Parameters
    ----------
    correct : array_like of bool, shape (n,)
        Whether each prediction is right.
    confidence : array_like of float, shape (n,)
        Confidence in ``[0, 1]``.
    n_bins : int, default 15
        Number of bins ``M``.
    strategy : {"uniform", "quantile"}, default "uniform"
        Equal-width or equal-mass bins.
    norm : {"l1", "l2", "max"}, default "l1"
        ``l1``: ECE; ``l2``: root of the count-weighted mean squared gap; ``max``: MCE.

    Returns
    -------
    float
        Calibration error in ``[0, 1]``, lower is better.

    Notes
    -----
    ``ECE = sum_{j: B_j non-empty} |B_j|/n * |acc(B_j) - conf(B_j)|`` and
    ``MCE = max_{j: B_j non-empty} |acc(B_j) - conf(B_j)|`` with the bins of
    :func:`assign_bins`: a confidence of exactly 0 is in the first bin, exactly 1.0 in the last.

    Examples
    --------
    >>> c = confidence_calibration_error([True, False, True, True], [1.0, 0.0, 0.9, 0.7], n_bins=5)
    >>> round(c, 6)
    0.1
    """
    n_bins = check_positive_int(n_bins, "n_bins")
    check_choice(strategy, "strategy", BIN_STRATEGIES)
    check_choice(norm, "norm", _NORMS)
    c, k = correct_confidence(correct, confidence)
    _check_unit_interval(k, "confidence")
    count, acc, conf = _bin_stats(c, k, BIN_STRATEGIES[strategy](k, n_bins))
    return _reduce_gaps(count, acc, conf, norm)


@register_metric("ece", kind="classification", family="calibration",
                 properties={"permutation_invariant"})
def expected_calibration_error(
    labels: Any, probs: Any, *, n_bins: int = 15, strategy: str = "uniform"
) -> float:
    """Expected calibration error (ECE) of the top-1 confidence.

    Parameters
    ----------
    labels : array_like of int, shape (n,)
        True classes in ``[0, C)``.
    probs : array_like of float, shape (n, C)
        Predicted class probabilities, rows summing to 1.
    n_bins : int, default 15
        Number of bins ``M``.
    strategy : {"uniform", "quantile"}, default "uniform"
        ``uniform``: ``M`` equal-width bins ``((j-1)/M, j/M]``; ``quantile``: equal-mass bins
        (the adaptive ECE).

    Returns
    -------
    float
        ECE in ``[0, 1]``, lower is better.

    Notes
    -----
    ``ECE = sum_j |B_j|/n * |acc(B_j) - conf(B_j)|`` over non-empty bins, ``acc`` the fraction
    of correct top-1 predictions and ``conf`` the mean top-1 probability in the bin (Guo et al.,
    2017; docs/conventions.md#s-1). ECE is biased and minimised by ``T -> inf``; never rank
    methods by it alone (Ashukha et al., 2020).

    References
    ----------
    Guo, Pleiss, Sun, Weinberger. On calibration of modern neural networks. ICML 2017.
    Ashukha et al. Pitfalls of in-domain uncertainty estimation and ensembling in deep
    learning. ICLR 2020.

    Examples
    --------
    >>> round(expected_calibration_error([0, 1, 1], [[0.9, 0.1], [0.8, 0.2], [0.3, 0.7]]), 6)
    0.4
    """
    correct, conf = _top1(labels, probs)
    return confidence_calibration_error(correct, conf, n_bins=n_bins, strategy=strategy)


@register_metric("ece_quantile", kind="classification", family="calibration",
                 properties={"permutation_invariant"})
def _adaptive_expected_calibration_error(labels: Any, probs: Any) -> float:
    """ECE with 15 equal-mass bins (``strategy="quantile"``)."""
    return expected_calibration_error(labels, probs, strategy="quantile")


@register_metric("mce", kind="classification", family="calibration",
                 properties={"permutation_invariant"})
def maximum_calibration_error(
    labels: Any, probs: Any, *, n_bins: int = 15, strategy: str = "uniform"
) -> float:
    """Maximum calibration error (MCE): the largest gap over the non-empty bins.

    Parameters
    ----------
    labels : array_like of int, shape (n,)
        True classes in ``[0, C)``.
    probs : array_like of float, shape (n, C)
        Predicted class probabilities, rows summing to 1.
    n_bins : int, default 15
        Number of bins ``M``.
    strategy : {"uniform", "quantile"}, default "uniform"
        Equal-width or equal-mass bins.

    Returns
    -------
    float
        MCE in ``[0, 1]``, lower is better.

    Notes
    -----
    ``MCE = max_{j: |B_j| > 0} |acc(B_j) - conf(B_j)|``, bins as in
    :func:`expected_calibration_error`.

    References
    ----------
    Naeini, Cooper, Hauskrecht. Obtaining well calibrated probabilities using Bayesian
    binning. AAAI 2015.

    Examples
    --------
    >>> round(maximum_calibration_error([0, 1, 1], [[0.9, 0.1], [0.8, 0.2], [0.3, 0.7]]), 6)
    0.8
    """
    correct, conf = _top1(labels, probs)
    return confidence_calibration_error(correct, conf, n_bins=n_bins, strategy=strategy,
                                        norm="max")


# --------------------------------------------------------------------------------------------
# Classwise calibration errors (Nixon et al., 2019)
# --------------------------------------------------------------------------------------------


@register_metric("sce", kind="classification", family="calibration",
                 properties={"permutation_invariant"})
def static_calibration_error(labels: Any, probs: Any, *, n_bins: int = 15) -> float:
    """Static calibration error (SCE): classwise ECE with equal-width bins, averaged over classes.

    Parameters
    ----------
    labels : array_like of int, shape (n,)
        True classes in ``[0, C)``.
    probs : array_like of float, shape (n, C)
        Predicted class probabilities, rows summing to 1.
    n_bins : int, default 15
        Number of equal-width bins ``M`` per class.

    Returns
    -------
    float
        SCE in ``[0, 1]``, lower is better.

    Notes
    -----
    For every class ``k`` the ``n`` probabilities ``p_ik`` are binned (bins of
    :func:`assign_bins`, so ``p_ik = 0`` is in the first bin);
    ``SCE = (1/C) sum_k sum_b |B_bk|/n * |acc(b, k) - conf(b, k)|`` with ``acc(b, k)`` the
    fraction of samples in bin ``b`` whose label is ``k`` and ``conf(b, k)`` their mean ``p_ik``.

    References
    ----------
    Nixon, Dusenberry, Zhang, Jerfel, Tran. Measuring calibration in deep learning. CVPR
    Workshops 2019.

    Examples
    --------
    >>> static_calibration_error([0, 1], [[1.0, 0.0], [0.5, 0.5]], n_bins=2)
    0.25
    """
    n_bins = check_positive_int(n_bins, "n_bins")
    y, p = labels_probs(labels, probs)
    n, n_classes = p.shape
    edges = _uniform_edges(p, n_bins)
    target = (y[:, None] == np.arange(n_classes)[None, :]).astype(np.float64)
    # One bincount over (class, bin) pairs: flat index k * M + j.
    flat = (assign_bins(p, edges) + n_bins * np.arange(n_classes)[None, :]).ravel()
    size = n_classes * n_bins
    s_t = np.bincount(flat, weights=target.ravel(), minlength=size)
    s_v = np.bincount(flat, weights=p.ravel(), minlength=size)
    # sum_b |B_bk|/n |acc - conf| = sum_b |sum_t - sum_v| / n; empty bins contribute 0.
    return float(np.sum(np.abs(s_t - s_v)) / (n * n_classes))


#: How :func:`adaptive_calibration_error` weights a class's bins: ``"all"`` by ``|B|/n`` over all
#: ``n`` predictions, averaged over all ``C`` classes (Ashukha et al.'s TACE, their eq. 2 and
#: their code); ``"class"`` by ``|B|/n_k`` over the class's own ``n_k`` selected predictions,
#: averaged over the classes with a selection (each class's bins sum to weight 1).
ACE_WEIGHTINGS = ("all", "class")


def _index_bin_gap_sum(hit: np.ndarray, value: np.ndarray, n_bins: int) -> float:
    """``sum_r |B_r| |acc(B_r) - conf(B_r)|`` over the equal-count index bins of ``value``.

    The predictions are sorted by ``value``, ties by ``hit`` (misses first); bin ``r < R-1``
    holds sorted positions ``[r s, (r+1) s)`` with ``s = floor(n/R)`` and the last bin the rest
    ``[(R-1) s, n)``, so with ``n < R`` only the last bin is non-empty (empty bins add nothing).
    """
    order = np.lexsort((hit, value))  # by value, then misses before hits: order-free
    v, h = value[order], hit[order].astype(np.float64)
    per_bin = v.shape[0] // n_bins
    starts = np.arange(n_bins) * per_bin if per_bin else np.zeros(1, dtype=np.intp)
    # |B| |acc - conf| = |sum of hits - sum of values| over the bin's positions
    return float(np.sum(np.abs(np.add.reduceat(h, starts) - np.add.reduceat(v, starts))))


@register_metric("ace", kind="classification", family="calibration",
                 properties={"permutation_invariant"})
def adaptive_calibration_error(
    labels: Any, probs: Any, *, n_bins: int = 15, threshold: float = 0.0, weighting: str = "all"
) -> float:
    """Adaptive calibration error (ACE); ``threshold=1e-3`` gives the thresholded TACE.

    Parameters
    ----------
    labels : array_like of int, shape (n,)
        True classes in ``[0, C)``.
    probs : array_like of float, shape (n, C)
        Predicted class probabilities, rows summing to 1.
    n_bins : int, default 15
        Number ``R`` of equal-count bins per class.
    threshold : float, default 0.0
        Only predictions ``p_ik > threshold`` (strictly) enter class ``k``'s bins (0: every
        non-zero prediction, ACE; 1e-3: TACE).
    weighting : {"all", "class"}, default "all"
        A bin's weight (:data:`ACE_WEIGHTINGS`): ``|B|/n`` and the mean over all ``C`` classes,
        or ``|B|/n_k`` and the mean over the classes with a selected prediction. The two agree
        when every class selects all ``n`` predictions (``threshold`` 0 and no ``p_ik = 0``).

    Returns
    -------
    float
        ACE in ``[0, 1]``, lower is better.

    Notes
    -----
    For each class ``k`` the ``n_k`` selected probabilities ``p_ik`` are sorted and cut by
    position into ``R`` bins of ``floor(n_k/R)`` predictions, the last bin taking the
    remainder, as in Ashukha et al.'s code (``get_tace``, ``get_ace``); with
    ``weighting="all"``, ``ACE = (1/C) sum_k sum_r |B_rk|/n * |acc(r, k) - conf(r, k)|`` with
    ``acc(r, k)`` the fraction of bin ``r`` whose label is ``k`` and ``conf(r, k)`` its mean
    ``p_ik``. With ``threshold=1e-3`` this is TACE as their code computes it (the printed
    eq. 2 also divides by ``R``, which with the ``|B|/n`` weights would count the bins twice,
    and is not what produced their figures). Two choices where their code has none: a class
    with ``n_k < R`` selected predictions has them all in its last bin and the empty bins are
    skipped, and a class with none adds 0 (their code returns NaN: the mean of an empty
    bin); tied ``p_ik`` are ordered by their label, those of other classes first (their code
    takes a tie in whatever order ``argsort`` leaves it, so a tie cut by a bin boundary makes
    its value depend on the order of the samples): the value here does not, and each class's
    term is the one their code gives when the tie's samples come in that order. With ``weighting="class"``,
    ``ACE = (1/C') sum_k sum_r |B_rk|/n_k * |acc - conf|`` over the ``C'`` classes with a
    selection: with equal bins, Nixon et al.'s ``1/(C R) sum_k sum_r |acc - conf|``. Under a
    threshold a class selects few of the ``n`` predictions, so the per-class weights give it
    ``n/n_k`` times the weight (at ``C = 100``, about 3 times the TACE).

    References
    ----------
    Nixon, Dusenberry, Zhang, Jerfel, Tran. Measuring calibration in deep learning. CVPR
    Workshops 2019. Ashukha, Lyzhov, Molchanov, Vetrov. Pitfalls of in-domain uncertainty
    estimation and ensembling in deep learning. ICLR 2020.

    Examples
    --------
    >>> adaptive_calibration_error([0, 1], [[1.0, 0.0], [0.5, 0.5]], n_bins=1)
    0.25
    """
    n_bins = check_positive_int(n_bins, "n_bins")
    threshold = check_fraction(threshold, "threshold", low=0.0, high=1.0)
    check_choice(weighting, "weighting", ACE_WEIGHTINGS)
    y, p = labels_probs(labels, probs)
    n, n_classes = p.shape
    errors = []
    for k in range(n_classes):
        sel = p[:, k] > threshold
        if not sel.any():
            continue
        gaps = _index_bin_gap_sum(y[sel] == k, p[sel, k], n_bins)  # sum_r |B_r| |acc - conf|
        errors.append(gaps / sel.sum() if weighting == "class" else gaps / n)
    if not errors:
        raise ValueError(f"threshold={threshold!r} leaves no prediction to score")
    return float(np.mean(errors) if weighting == "class" else np.sum(errors) / n_classes)


@register_metric("tace", kind="classification", family="calibration",
                 properties={"permutation_invariant"})
def _thresholded_adaptive_calibration_error(labels: Any, probs: Any) -> float:
    """TACE (Ashukha et al. 2020): :func:`adaptive_calibration_error` over the predictions
    ``p > 1e-3`` (strictly), bins weighted by ``|B|/n``, the mean over all classes."""
    return adaptive_calibration_error(labels, probs, threshold=1e-3, weighting="all")


# --------------------------------------------------------------------------------------------
# Reliability diagram
# --------------------------------------------------------------------------------------------


def reliability_diagram(
    labels: Any, probs: Any, *, n_bins: int = 15, strategy: str = "uniform"
) -> xr.Dataset:
    """Per-bin accuracy and confidence of the top-1 prediction (the data of a reliability plot).

    Parameters
    ----------
    labels : array_like of int, shape (n,)
        True classes in ``[0, C)``.
    probs : array_like of float, shape (n, C)
        Predicted class probabilities, rows summing to 1.
    n_bins : int, default 15
        Number of bins ``M``.
    strategy : {"uniform", "quantile"}, default "uniform"
        Equal-width or equal-mass bins.

    Returns
    -------
    xarray.Dataset
        Over dim ``bin`` (``0 .. M-1``): ``lower``/``upper`` (bin edges ``(lower, upper]``),
        ``count`` (int), ``accuracy`` and ``confidence`` (NaN for empty bins) and ``gap``
        (``accuracy - confidence``). Attrs: ``n_bins``, ``strategy``, ``n_samples``, ``ece``
        and ``mce`` (consistent with :func:`expected_calibration_error`).

    Examples
    --------
    >>> rd = reliability_diagram([0, 1, 1], [[0.9, 0.1], [0.8, 0.2], [0.3, 0.7]], n_bins=5)
    >>> rd["count"].values
    array([0, 0, 0, 2, 1])
    >>> rd["accuracy"].values
    array([nan, nan, nan, 0.5, 1. ])
    """
    n_bins = check_positive_int(n_bins, "n_bins")
    check_choice(strategy, "strategy", BIN_STRATEGIES)
    correct, conf = _top1(labels, probs)
    edges = BIN_STRATEGIES[strategy](conf, n_bins)
    count, acc, mean_conf = _bin_stats(correct, conf, edges)
    return xr.Dataset(
        {
            "lower": ("bin", edges[:-1]),
            "upper": ("bin", edges[1:]),
            "count": ("bin", count.astype(np.int64)),
            "accuracy": ("bin", acc),
            "confidence": ("bin", mean_conf),
            "gap": ("bin", acc - mean_conf),
        },
        coords={"bin": np.arange(n_bins)},
        attrs={
            "n_bins": n_bins,
            "strategy": strategy,
            "n_samples": int(correct.shape[0]),
            "ece": _reduce_gaps(count, acc, mean_conf, "l1"),
            "mce": _reduce_gaps(count, acc, mean_conf, "max"),
            "convention": "bins (lower, upper], left-open right-closed; 0 in the first bin, "
            "1.0 in the last; empty bins skipped",
        },
    )
