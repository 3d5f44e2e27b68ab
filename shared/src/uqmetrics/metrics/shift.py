"""Metrics of a distribution-shift protocol (docs/conventions.md#s-7).

Two groups:

- **Corruption errors** (ImageNet-C, Hendrycks and Dietterich 2019): :func:`corruption_error`,
  :func:`mean_corruption_error` and :func:`relative_mean_corruption_error` aggregate top-1
  *error rates* already measured per corruption and severity, normalised by a baseline
  model's (AlexNet in the paper). They are returned as fractions (the paper's tables print
  100 times these values).
- **Accuracies under a changed label space**: :func:`real_accuracy` (ImageNet ReaL, Beyer et
  al. 2020: each image has a set of valid labels, possibly empty) and :func:`masked_accuracy`
  (ImageNet-A/R, Hendrycks et al. 2021: the arg-max is taken over a subset of the classes).

None of these functions is in the metric registry (:mod:`uqmetrics.metrics.registry`): the corruption
errors are aggregates over error arrays, not per-sample metrics, and the two accuracies need an
argument no metric kind has (the label sets, the class mask), so none of them has the
signature of a registered kind. Their conventions are still recorded in
:data:`uqmetrics.CONVENTIONS` (``corruption_error``, ``mean_corruption_error``,
``relative_mean_corruption_error``, ``real_accuracy``, ``masked_accuracy``).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ._validation import (
    as_numpy,
    check_fraction,
    check_labels,
    check_logits,
    check_ndim,
    check_nonempty,
    check_same_length,
    check_same_shape,
    float_array,
)
from .exceptions import UndefinedMetricWarning

__all__ = [
    "corruption_error",
    "masked_accuracy",
    "mean_corruption_error",
    "real_accuracy",
    "relative_mean_corruption_error",
]


def _warn_undefined(message: str) -> float:
    warnings.warn(message, UndefinedMetricWarning, stacklevel=3)
    return float("nan")


# --------------------------------------------------------------------------------------------
# Corruption errors (ImageNet-C)
# --------------------------------------------------------------------------------------------


def _error_rates(x: Any, name: str, ndim: int, shape_doc: str) -> np.ndarray:
    """Finite, non-empty error rates in [0, 1] with ``ndim`` dimensions."""
    arr = float_array(x, name, ndim, shape_doc)
    if arr.min() < 0 or arr.max() > 1:
        i = tuple(int(j) for j in np.argwhere((arr < 0) | (arr > 1))[0])
        raise ValueError(f"{name} must be error rates in [0, 1], got {float(arr[i])!r} at index "
                         f"{i}")
    return arr


def _ce_per_corruption(errors: np.ndarray, baseline: np.ndarray, name: str) -> np.ndarray:
    """``sum_s errors[c, s] / sum_s baseline[c, s]`` for each row c, denominators > 0."""
    num = errors.sum(axis=1)
    den = baseline.sum(axis=1)
    bad = den <= 0
    if bad.any():
        c = int(np.argmax(bad))
        raise ValueError(f"{name} of corruption {c} must have a positive sum over severities "
                         f"(the CE denominator), got {float(den[c])!r}")
    return num / den


def corruption_error(errors: Any, baseline_errors: Any) -> float:
    """Corruption Error CE_c of one corruption: the model's errors over the severities
    divided by the baseline model's.

    Parameters
    ----------
    errors : array_like of float, shape (n_severities,)
        Top-1 error rates in ``[0, 1]`` of the model on the corruption at each severity
        (severities 1..5 in ImageNet-C).
    baseline_errors : array_like of float, shape (n_severities,)
        The baseline model's error rates (AlexNet in the paper) at the same severities; their
        sum must be > 0.

    Returns
    -------
    float
        CE_c as a fraction (1.0 = as many errors as the baseline), lower is better; the paper's
        tables print ``100 * CE_c``.

    Notes
    -----
    ``CE_c = sum_s E_{s,c} / sum_s E^base_{s,c}`` (Hendrycks and Dietterich 2019, Section 4),
    equal to the ratio of the mean errors over the severities. Checked against the official
    code (github.com/hendrycks/robustness, ``ImageNet-C/test.py``): its ``show_performance``
    returns the unnormalised ``mean_s E_{s,c}`` over severities 1..5, which this divides by the
    baseline's.

    References
    ----------
    D. Hendrycks and T. Dietterich, "Benchmarking neural network robustness to common
    corruptions and perturbations", ICLR 2019.

    Examples
    --------
    >>> corruption_error([0.2, 0.3, 0.4, 0.5, 0.6], [0.4, 0.6, 0.8, 0.9, 0.8])
    0.5714285714285714
    """
    e = _error_rates(errors, "errors", 1, "(n_severities,)")
    b = _error_rates(baseline_errors, "baseline_errors", 1, "(n_severities,)")
    check_same_shape(errors=e, baseline_errors=b)
    return float(_ce_per_corruption(e[None, :], b[None, :], "baseline_errors")[0])


def mean_corruption_error(errors: Any, baseline_errors: Any) -> float:
    """Mean Corruption Error (mCE): the mean over corruptions of :func:`corruption_error`.

    Parameters
    ----------
    errors : array_like of float, shape (n_corruptions, n_severities)
        Top-1 error rates in ``[0, 1]`` of the model, one row per corruption (15 corruptions
        by 5 severities for the ImageNet-C mCE).
    baseline_errors : array_like of float, shape (n_corruptions, n_severities)
        The baseline model's error rates (AlexNet in the paper); each row must have a positive
        sum.

    Returns
    -------
    float
        mCE as a fraction (1.0 = the baseline's), lower is better; the paper prints
        ``100 * mCE``.

    Notes
    -----
    ``mCE = (1/|C|) sum_c CE_c`` with ``CE_c = sum_s E_{s,c} / sum_s E^base_{s,c}``: each
    corruption is normalised by the baseline before averaging (not a ratio of grand totals).
    Which corruptions enter is the caller's choice (the paper's mCE uses the 15 main ones, not
    the 4 held-out ones). The official code (``ImageNet-C/test.py``) prints the unnormalised
    mean of the per-corruption mean errors; the AlexNet normalisation is the paper's.

    References
    ----------
    D. Hendrycks and T. Dietterich, "Benchmarking neural network robustness to common
    corruptions and perturbations", ICLR 2019.

    Examples
    --------
    >>> mean_corruption_error([[0.2, 0.4], [0.3, 0.3]], [[0.4, 0.8], [0.3, 0.9]])
    0.5
    """
    shape = "(n_corruptions, n_severities)"
    e = _error_rates(errors, "errors", 2, shape)
    b = _error_rates(baseline_errors, "baseline_errors", 2, shape)
    check_same_shape(errors=e, baseline_errors=b)
    return float(np.mean(_ce_per_corruption(e, b, "baseline_errors")))


def relative_mean_corruption_error(errors: Any, clean_error: Any, baseline_errors: Any,
                                   baseline_clean_error: Any) -> float:
    """Relative mCE: the mean over corruptions of the error *added* by each corruption,
    relative to the baseline's.

    Parameters
    ----------
    errors : array_like of float, shape (n_corruptions, n_severities)
        Top-1 error rates in ``[0, 1]`` of the model on the corrupted data.
    clean_error : float
        The model's top-1 error rate in ``[0, 1]`` on the clean data.
    baseline_errors : array_like of float, shape (n_corruptions, n_severities)
        The baseline model's corrupted error rates (AlexNet in the paper).
    baseline_clean_error : float
        The baseline model's clean error rate in ``[0, 1]``. For every corruption,
        ``sum_s (E^base_{s,c} - E^base_clean)`` must be > 0 for the relative mCE to be
        defined.

    Returns
    -------
    float
        Relative mCE as a fraction, lower is better (it may be negative when the model gets
        better under corruption); the paper prints ``100 *`` this. NaN with an
        :class:`~uqmetrics.UndefinedMetricWarning` when the baseline's errors under some
        corruption do not exceed its clean error (a denominator <= 0: the baseline is not
        degraded by that corruption, so no degradation can be measured relative to it).

    Notes
    -----
    ``Relative CE_c = sum_s (E_{s,c} - E_clean) / sum_s (E^base_{s,c} - E^base_clean)`` and
    relative mCE is its mean over the corruptions (Hendrycks and Dietterich 2019, Section 4).
    It measures the degradation a corruption causes, not the corrupted error itself.

    References
    ----------
    D. Hendrycks and T. Dietterich, "Benchmarking neural network robustness to common
    corruptions and perturbations", ICLR 2019.

    Examples
    --------
    >>> relative_mean_corruption_error([[0.375, 0.5]], 0.25, [[0.75, 1.0]], 0.5)
    0.5
    """
    shape = "(n_corruptions, n_severities)"
    e = _error_rates(errors, "errors", 2, shape)
    b = _error_rates(baseline_errors, "baseline_errors", 2, shape)
    check_same_shape(errors=e, baseline_errors=b)
    e0 = check_fraction(clean_error, "clean_error")
    b0 = check_fraction(baseline_clean_error, "baseline_clean_error")
    den = (b - b0).sum(axis=1)
    bad = den <= 0
    if bad.any():
        c = int(np.argmax(bad))
        return _warn_undefined(
            f"relative mCE is undefined: baseline_errors of corruption {c} do not exceed "
            f"baseline_clean_error {b0!r} on the sum over severities (the relative CE "
            f"denominator sum_s (E_base - E_base_clean) = {float(den[c])!r}, "
            f"{int(bad.sum())} such corruption(s)); returning nan")
    return float(np.mean((e - e0).sum(axis=1) / den))


# --------------------------------------------------------------------------------------------
# Accuracies under a changed label space (ImageNet ReaL, ImageNet-A/R)
# --------------------------------------------------------------------------------------------


def _bool_mask(x: Any, name: str, ndim: int, shape_doc: str) -> np.ndarray:
    """A boolean array (0/1 integers accepted) with ``ndim`` dimensions, non-empty."""
    m = as_numpy(x, name)
    check_ndim(m, name, ndim, shape_doc)
    check_nonempty(m, name)
    if m.dtype != bool:
        if m.dtype.kind not in "iuf" or not np.all(np.isin(m, (0, 1))):
            raise ValueError(f"{name} must be boolean (or 0/1), got dtype {m.dtype} with "
                             f"values {np.unique(m)[:5]}")
        m = m.astype(bool)
    return m


def real_accuracy(predictions: Any, label_sets: Any) -> float:
    """ReaL accuracy: the fraction of images whose top-1 prediction is one of its valid labels,
    over the images that have at least one.

    Parameters
    ----------
    predictions : array_like, shape (n,) of int, or shape (n, C) of float
        The predicted classes in ``[0, C)``, or class scores (probabilities or logits), whose
        ``argmax`` (the first maximum on ties) is the prediction.
    label_sets : array_like of bool, shape (n, C)
        ``label_sets[i, c]`` is True when class c is a valid label of image i (the ReaL
        labels); a row may be all False (no valid label).

    Returns
    -------
    float
        ReaL accuracy in ``[0, 1]``, higher is better; NaN with an
        :class:`~uqmetrics.UndefinedMetricWarning` when no image has a label.

    Notes
    -----
    ``acc = (1/|I|) sum_{i in I} 1[yhat_i in L_i]`` with ``I = {i : L_i non-empty}``: images
    with an empty label set are left out of both counts, as the paper prescribes. Checked
    against the reference code of github.com/google-research/reassessed-imagenet (README,
    NumPy): ``np.mean([pred in real_labels[i] for i, pred in enumerate(predictions) if
    real_labels[i]])``. Not in the metric registry: ``label_sets`` is not the ``labels (n,)``
    of the classification kind, so scores are accepted only as a convenience.

    References
    ----------
    L. Beyer, O. J. Hénaff, A. Kolesnikov, X. Zhai and A. van den Oord, "Are we done with
    ImageNet?", arXiv:2006.07159, 2020.

    Examples
    --------
    >>> sets = [[1, 0, 0], [0, 1, 1], [0, 0, 0], [0, 0, 1]]
    >>> real_accuracy([0, 2, 1, 0], sets)  # image 2 has no label: 2 right of 3
    0.6666666666666666
    """
    sets = _bool_mask(label_sets, "label_sets", 2, "(n_samples, n_classes)")
    n_classes = sets.shape[1]
    pred_arr = as_numpy(predictions, "predictions")
    if pred_arr.ndim == 2:
        scores = float_array(pred_arr, "predictions", 2, "(n_samples,) or (n_samples, n_classes)")
        if scores.shape[1] != n_classes:
            raise ValueError(f"predictions must have {n_classes} classes (columns) like "
                             f"label_sets {sets.shape}, got shape {scores.shape}")
        pred = np.argmax(scores, axis=1)
    elif pred_arr.ndim == 1:
        pred = check_labels(pred_arr, n_classes, name="predictions")
    else:
        raise ValueError(f"predictions must have shape (n_samples,) or (n_samples, n_classes), "
                         f"got shape {pred_arr.shape}")
    check_same_length(predictions=pred, label_sets=sets)
    keep = sets.any(axis=1)
    if not keep.any():
        return _warn_undefined(f"ReaL accuracy is undefined: none of the {sets.shape[0]} images "
                               "has a valid label; returning nan")
    return float(np.mean(sets[np.flatnonzero(keep), pred[keep]]))


def masked_accuracy(labels: Any, logits_or_probs: Any, mask: Any) -> float:
    """Top-1 accuracy with the arg-max restricted to the classes of a mask (ImageNet-A/R).

    Parameters
    ----------
    labels : array_like of int, shape (n,)
        True classes in the full class space ``[0, C)``; each must be inside ``mask``. (Labels
        numbered inside the subset, 0..k-1, map to the full space as
        ``np.flatnonzero(mask)[labels]``.)
    logits_or_probs : array_like of float, shape (n, C)
        Scores of all C classes: logits or probabilities (the arg-max is the same; any real
        values are accepted).
    mask : array_like of bool, shape (C,)
        The classes of the evaluation set (the 200 ImageNet-A or ImageNet-R classes among the
        1000); at least one True.

    Returns
    -------
    float
        Accuracy in ``[0, 1]``, higher is better.

    Notes
    -----
    ``acc = (1/n) sum_i 1[argmax_{c in M} z_ic = y_i]``: classes outside the mask are removed
    before the arg-max, as Hendrycks et al. do (``net(images)[:, indices_in_1k]``) and timm's
    ``validate.py`` with ``imagenet_r_indices`` / ``imagenet_a_indices``; ties go to the lowest
    class index among the masked classes (numpy's first maximum). With probabilities this is
    the same as renormalising them over the mask.

    References
    ----------
    D. Hendrycks, K. Zhao, S. Basart, J. Steinhardt and D. Song, "Natural adversarial
    examples", CVPR 2021; D. Hendrycks et al., "The many faces of robustness: a critical
    analysis of out-of-distribution generalization", ICCV 2021.

    Examples
    --------
    >>> z = [[5.0, 1.0, 2.0], [0.0, 3.0, 1.0]]
    >>> masked_accuracy([2, 1], z, [False, True, True])  # class 0 is not a candidate
    1.0
    """
    z = check_logits(logits_or_probs, "logits_or_probs")
    m = _bool_mask(mask, "mask", 1, "(n_classes,)")
    if m.shape[0] != z.shape[1]:
        raise ValueError(f"mask must have one entry per class of logits_or_probs "
                         f"({z.shape[1]}), got shape {m.shape}")
    if not m.any():
        raise ValueError("mask must select at least one class, got all False")
    y = check_labels(labels, z.shape[1])
    check_same_length(labels=y, logits_or_probs=z)
    outside = ~m[y]
    if outside.any():
        i = int(np.argmax(outside))
        raise ValueError(f"labels must lie inside mask: sample {i} has label {int(y[i])}, "
                         f"which mask excludes ({int(outside.sum())} such samples)")
    classes = np.flatnonzero(m)
    pred = classes[np.argmax(z[:, classes], axis=1)]
    return float(np.mean(pred == y))
