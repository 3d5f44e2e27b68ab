"""Out-of-domain detection metrics of an uncertainty score (docs/conventions.md#s-4).

Every function takes uncertainties ``u`` (higher = more uncertain = more likely out-domain),
one value per sample, shape (n_samples,), of the in-domain and of the out-domain samples
separately. The out-domain samples are the positive class unless a metric says otherwise
(AUPR-In). Two families:

- the threshold-free metrics of OpenOOD v1.5 (Zhang et al. 2023, "OpenOOD v1.5: enhanced
  benchmark for out-of-distribution detection"): :func:`ood_auroc_score`, :func:`aupr_in`,
  :func:`aupr_out` and :func:`fpr_at_95_tpr` (all four at once: :func:`ood_detection_scores`);
- the UIMNET thresholded metrics: :func:`ood_threshold`, :func:`in_as_in_score`,
  :func:`out_as_out_score` (:func:`ood_scores`).

All are rank-based: invariant to the order of the samples and to a strictly increasing
transform of u; samples with equal u are always accepted or rejected together (ties grouped,
never broken by position).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from ._validation import check_choice, check_fraction, float_array
from .registry import register_metric
from .selective import _tie_blocks, aupr_score, auroc_score

__all__ = [
    "aupr_in",
    "aupr_out",
    "fpr_at_95_tpr",
    "in_as_in_score",
    "ood_auroc_score",
    "ood_detection_scores",
    "ood_scores",
    "ood_threshold",
    "out_as_out_score",
]

_SHAPE = "(n_samples,)"


def _u(x: Any, name: str) -> np.ndarray:
    return float_array(x, name, 1, _SHAPE)


@register_metric("ood_auroc", kind="ood",
                 properties={"permutation_invariant", "monotone_invariant"})
def ood_auroc_score(u_in: Any, u_out: Any) -> float:
    """AUROC of the uncertainty for detecting out-domain samples (out-domain positive).

    Parameters
    ----------
    u_in : array_like of float, shape (n_in,)
        Uncertainty on in-domain samples.
    u_out : array_like of float, shape (n_out,)
        Uncertainty on out-domain samples.

    Returns
    -------
    float
        ``P(u_out > u_in) + ½ P(u_out = u_in)``; 0.5 for an uninformative u.

    Notes
    -----
    Computed by :func:`uqmetrics.auroc_score` with the out-domain samples as the positive
    class and u as the score (the package has one definition of AUROC).

    References
    ----------
    "What classifiers know what they don't know?" (UIMNET, ImageNot benchmark), Section 5.

    Examples
    --------
    >>> ood_auroc_score([0.1, 0.2, 0.3], [0.25, 0.9])
    0.8333333333333334
    """
    ui, uo = _u(u_in, "u_in"), _u(u_out, "u_out")
    is_out = np.concatenate([np.zeros(ui.size, bool), np.ones(uo.size, bool)])
    return auroc_score(is_out, np.concatenate([ui, uo]))


def _counts(u_pos: np.ndarray, u_neg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positives and negatives with a score >= each distinct score, scores descending.

    Returns ``(tps (B,), fps (B,))`` over the B distinct values of the pooled scores: one
    point per threshold, a tied block entering at once (scikit-learn's ``_binary_clf_curve``
    without sample weights).
    """
    is_pos = np.concatenate([np.ones(u_pos.size), np.zeros(u_neg.size)])
    _, sizes, n_pos = _tie_blocks(is_pos, np.concatenate([u_pos, u_neg]))
    tps = np.cumsum(n_pos)
    return tps, np.cumsum(sizes) - tps


@register_metric("fpr_at_95_tpr", kind="ood", greater_is_better=False,
                 properties={"permutation_invariant", "monotone_invariant"})
def fpr_at_95_tpr(u_in: Any, u_out: Any, *, tpr: float = 0.95, positive: str = "out"
                  ) -> float:
    """False positive rate at 95% true positive rate (FPR@95), OpenOOD v1.5's convention.

    Parameters
    ----------
    u_in : array_like of float, shape (n_in,)
        Uncertainty on in-domain samples.
    u_out : array_like of float, shape (n_out,)
        Uncertainty on out-domain samples.
    tpr : float in [0, 1], default 0.95
        The true positive rate to reach.
    positive : {"out", "in"}, default "out"
        ``"out"`` (OpenOOD v1.5 and pytorch-ood): out-domain samples are the positives, scored
        by u; the value is the fraction of **in-domain** samples flagged out-domain when at
        least ``tpr`` of the out-domain samples are. ``"in"`` (Hendrycks & Gimpel 2017, ODIN,
        Energy, KNN papers; OpenOOD v1.0's ``fpr_recall``): in-domain samples are the
        positives, scored by -u; the fraction of **out-domain** samples accepted as in-domain
        when at least ``tpr`` of the in-domain samples are.

    Returns
    -------
    float
        In [0, 1]; lower is better. 0 for a perfect separation, about ``tpr`` for an
        uninformative continuous u.

    Notes
    -----
    The ROC curve of the positives has one point per distinct score (tied samples enter
    together) and starts at (0, 0); the value is the FPR of its first point, thresholds
    descending, with ``TPR >= tpr``: the highest threshold that reaches ``tpr``, no
    interpolation. ``TPR = tps / n_pos`` is evaluated in floating point as scikit-learn does.
    This is ``fpr[np.argmax(tpr_curve >= tpr)]`` of ``sklearn.metrics.roc_curve(is_out, u,
    drop_intermediate=False)`` and ``pytorch_ood.metrics.FPRAtTPR``; OpenOOD's
    ``auc_and_fpr_recall`` uses ``roc_curve``'s default ``drop_intermediate=True``, which can
    drop the first point reaching ``tpr`` when it lies on a straight segment (possible only
    with tied scores) and then returns a larger FPR.

    Examples
    --------
    >>> fpr_at_95_tpr([0.0, 1.0, 2.0, 3.0], [2.5, 4.0])  # both OOD above 2.5: 1 of 4 ID too
    0.25
    >>> fpr_at_95_tpr([0.0, 1.0, 2.0, 3.0], [2.5, 4.0], positive="in")  # u <= 3: 2.5 of OOD
    0.5
    """
    ui, uo = _u(u_in, "u_in"), _u(u_out, "u_out")
    t = check_fraction(tpr, "tpr")
    check_choice(positive, "positive", {"out", "in"})
    pos, neg = (uo, ui) if positive == "out" else (-ui, -uo)
    tps, fps = _counts(pos, neg)
    tpr_curve = np.concatenate([[0.0], tps / tps[-1]])
    fpr_curve = np.concatenate([[0.0], fps / fps[-1]])
    return float(fpr_curve[np.argmax(tpr_curve >= t)])


def _aupr_trapezoid(u_pos: np.ndarray, u_neg: np.ndarray) -> float:
    """``sklearn.metrics.auc(recall, precision)`` of ``precision_recall_curve`` (positives
    scored by ``u_pos``): the trapezoidal area through (0, 1) and one point per threshold."""
    tps, fps = _counts(u_pos, u_neg)
    precision = np.concatenate([[1.0], tps / (tps + fps)])
    recall = np.concatenate([[0.0], tps / tps[-1]])
    return float(np.sum(np.diff(recall) * (precision[1:] + precision[:-1])) / 2)


_CURVES = {"step", "trapezoid"}


def _aupr(u_pos: np.ndarray, u_neg: np.ndarray, curve: str) -> float:
    check_choice(curve, "curve", _CURVES)
    if curve == "trapezoid":
        return _aupr_trapezoid(u_pos, u_neg)
    is_pos = np.concatenate([np.ones(u_pos.size, bool), np.zeros(u_neg.size, bool)])
    return aupr_score(is_pos, np.concatenate([u_pos, u_neg]))


@register_metric("aupr_in", kind="ood",
                 properties={"permutation_invariant", "monotone_invariant"})
def aupr_in(u_in: Any, u_out: Any, *, curve: str = "step") -> float:
    """AUPR-In: area under the precision-recall curve with the in-domain samples positive.

    Parameters
    ----------
    u_in : array_like of float, shape (n_in,)
        Uncertainty on in-domain samples (the positives, ranked by -u).
    u_out : array_like of float, shape (n_out,)
        Uncertainty on out-domain samples.
    curve : {"step", "trapezoid"}, default "step"
        ``"step"``: average precision ``AP = sum_k (R_k - R_{k-1}) P_k`` over the distinct
        scores, as ``sklearn.metrics.average_precision_score(is_in, -u)`` (and this package's
        :func:`uqmetrics.aupr_score`). ``"trapezoid"``: the trapezoidal area under
        ``precision_recall_curve(is_in, -u)``, i.e. ``sklearn.metrics.auc(recall, precision)``,
        which OpenOOD v1.5 and ``pytorch_ood.metrics.AUPR(positive="id")`` report.

    Returns
    -------
    float
        In [0, 1]; about ``n_in / (n_in + n_out)`` for an uninformative u.

    Examples
    --------
    >>> aupr_in([0.1, 0.2], [0.15, 0.9])  # -u ranks: in, out, in, out -> (1 + 2/3) / 2
    0.8333333333333333
    >>> aupr_in([0.1, 0.2], [0.15, 0.9], curve="trapezoid")  # (1 + 1)/4 + (1/2 + 2/3)/4
    0.7916666666666666
    """
    ui, uo = _u(u_in, "u_in"), _u(u_out, "u_out")
    return _aupr(-ui, -uo, curve)


@register_metric("aupr_out", kind="ood",
                 properties={"permutation_invariant", "monotone_invariant"})
def aupr_out(u_in: Any, u_out: Any, *, curve: str = "step") -> float:
    """AUPR-Out: area under the precision-recall curve with the out-domain samples positive.

    Parameters
    ----------
    u_in : array_like of float, shape (n_in,)
        Uncertainty on in-domain samples.
    u_out : array_like of float, shape (n_out,)
        Uncertainty on out-domain samples (the positives, ranked by u).
    curve : {"step", "trapezoid"}, default "step"
        As :func:`aupr_in`: average precision (``average_precision_score(is_out, u)``), or the
        trapezoidal area of OpenOOD v1.5 and ``pytorch_ood.metrics.AUPR(positive="ood")``.

    Returns
    -------
    float
        In [0, 1]; about ``n_out / (n_in + n_out)`` for an uninformative u.

    Examples
    --------
    >>> aupr_out([0.1, 0.2], [0.15, 0.9])  # u ranks: out, in, out, in -> (1 + 2/3) / 2
    0.8333333333333333
    >>> aupr_out([0.5, 0.5], [0.5, 0.5])  # one tied block: precision 1/2 at recall 1
    0.5
    """
    ui, uo = _u(u_in, "u_in"), _u(u_out, "u_out")
    return _aupr(uo, ui, curve)


def ood_detection_scores(u_in: Any, u_out: Any, *, curve: str = "step",
                         positive: str = "out") -> dict[str, float]:
    """The four OpenOOD v1.5 metrics of one in-domain and one out-domain set.

    Parameters
    ----------
    u_in, u_out : array_like of float, shapes (n_in,), (n_out,)
        Uncertainty on the in-domain and on the out-domain samples.
    curve : {"step", "trapezoid"}, default "step"
        The AUPR area (:func:`aupr_in`); ``"trapezoid"`` reproduces OpenOOD's numbers.
    positive : {"out", "in"}, default "out"
        The positives of FPR@95 (:func:`fpr_at_95_tpr`).

    Returns
    -------
    dict
        ``{"ood_auroc", "aupr_in", "aupr_out", "fpr_at_95_tpr"}`` -> float (the registered
        metric names).

    Examples
    --------
    >>> ood_detection_scores([0.1, 0.2], [0.3, 0.4])
    {'ood_auroc': 1.0, 'aupr_in': 1.0, 'aupr_out': 1.0, 'fpr_at_95_tpr': 0.0}
    """
    ui, uo = _u(u_in, "u_in"), _u(u_out, "u_out")
    return {
        "ood_auroc": ood_auroc_score(ui, uo),
        "aupr_in": aupr_in(ui, uo, curve=curve),
        "aupr_out": aupr_out(ui, uo, curve=curve),
        "fpr_at_95_tpr": fpr_at_95_tpr(ui, uo, positive=positive),
    }


def ood_threshold(u_in_val: Any, *, quantile: float = 0.95) -> float:
    """Detection threshold θ: a quantile of the uncertainty on in-domain validation data.

    Parameters
    ----------
    u_in_val : array_like of float, shape (n_val,)
        Uncertainty on in-domain validation samples.
    quantile : float in (0, 1], default 0.95
        The quantile (numpy's default linear interpolation).

    Returns
    -------
    float
        θ; samples with ``u > θ`` are flagged out-domain.

    Examples
    --------
    >>> ood_threshold(np.arange(101.0))
    95.0
    """
    q = check_fraction(quantile, "quantile", low=0.0, high=1.0, closed="right")
    return float(np.quantile(_u(u_in_val, "u_in_val"), q))


def _threshold(threshold: Any) -> float:
    try:
        t = float(threshold)
    except (TypeError, ValueError):
        raise ValueError(f"threshold must be a number, got {threshold!r}") from None
    if np.isnan(t):
        raise ValueError(f"threshold must not be nan, got {threshold!r}")
    return t


def in_as_in_score(u_in_test: Any, threshold: float) -> float:
    """Fraction of in-domain test samples kept as in-domain, ``mean(u <= θ)``.

    Parameters
    ----------
    u_in_test : array_like of float, shape (n_in,)
        Uncertainty on in-domain test samples.
    threshold : float
        θ, usually :func:`ood_threshold` of in-domain validation data.

    Returns
    -------
    float

    Examples
    --------
    >>> in_as_in_score([0.1, 0.5, 0.9, 0.5], 0.5)
    0.75
    """
    return float(np.mean(_u(u_in_test, "u_in_test") <= _threshold(threshold)))


def out_as_out_score(u_out_test: Any, threshold: float) -> float:
    """Fraction of OUT-domain test samples flagged as out-domain, ``mean(u > θ)``.

    Parameters
    ----------
    u_out_test : array_like of float, shape (n_out,)
        Uncertainty on out-domain test samples.
    threshold : float
        θ, usually :func:`ood_threshold` of in-domain validation data.

    Returns
    -------
    float

    Notes
    -----
    The UIMNET paper's text says "in-domain" here; that is a typo (docs/conventions.md#v-3).

    Examples
    --------
    >>> out_as_out_score([0.1, 0.5, 0.9, 0.7], 0.5)
    0.5
    """
    return float(np.mean(_u(u_out_test, "u_out_test") > _threshold(threshold)))


def ood_scores(u_in_val: Any, u_in_test: Any, u_out_test: Any, *,
               quantile: float = 0.95) -> xr.Dataset:
    """All OOD metrics of S.4 in one :class:`xarray.Dataset`.

    Parameters
    ----------
    u_in_val : array_like of float, shape (n_val,)
        Uncertainty on in-domain validation samples (sets θ).
    u_in_test : array_like of float, shape (n_in,)
        Uncertainty on in-domain test samples.
    u_out_test : array_like of float, shape (n_out,)
        Uncertainty on out-domain test samples.
    quantile : float in (0, 1], default 0.95
        Quantile of ``u_in_val`` used as θ.

    Returns
    -------
    xarray.Dataset
        Scalar variables ``auroc`` (:func:`ood_auroc_score` of the test sets), ``threshold``,
        ``in_as_in`` and ``out_as_out``; attrs record the quantile, the sample counts and the
        convention.

    Examples
    --------
    >>> ds = ood_scores(np.arange(101.0), [10.0, 99.0], [50.0, 96.0, 100.0])
    >>> float(ds.threshold), float(ds.in_as_in), float(ds.out_as_out)
    (95.0, 0.5, 0.6666666666666666)
    """
    q = check_fraction(quantile, "quantile", low=0.0, high=1.0, closed="right")
    uv = _u(u_in_val, "u_in_val")
    ui, uo = _u(u_in_test, "u_in_test"), _u(u_out_test, "u_out_test")
    theta = ood_threshold(uv, quantile=q)
    return xr.Dataset(
        {
            "auroc": ood_auroc_score(ui, uo),
            "threshold": theta,
            "in_as_in": in_as_in_score(ui, theta),
            "out_as_out": out_as_out_score(uo, theta),
        },
        attrs={
            "quantile": q,
            "n_in_val": int(uv.size),
            "n_in_test": int(ui.size),
            "n_out_test": int(uo.size),
            "convention": "S.4: out-domain positive; theta = quantile of in-domain validation u; "
                          "in_as_in = mean(u_in <= theta); out_as_out = mean(u_out > theta)",
        },
    )
