"""Collapse and fit diagnostics (docs/conventions.md#r-3b): did a trained network learn anything,
and did it learn the function?

Under the paper's literal recipe the E.1 networks decay to a constant (the mean of their
targets) and barely beat it. A network is *collapsed* when its final training loss is at least
:data:`COLLAPSE_THRESHOLD` × the loss of the best constant, ½·var of its targets. (A threshold on
the prediction's variance does not work: collapsed E.1 networks keep ~13 % of the truth's
variance in wiggles uncorrelated with it.)

A network that does not collapse need not have learned the function: it can follow the noise of
its 50 targets instead. :func:`fit_r2` measures the fit against the noise-free truth and
:func:`fit_verdict` names it: R² < 0 (worse than the truth's own mean) *fits the noise, not the
function*; R² >= :data:`FIT_R2` fits the function.

Examples
--------
>>> import numpy as np
>>> y = np.array([[0.0, 1.0, 2.0, 3.0]])
>>> constant_loss(y)
array([0.625])
>>> collapsed(half_mse(np.full((1, 4), 1.5), y), constant_loss(y))
array([ True])
>>> collapsed(half_mse(y, y), constant_loss(y))
array([False])
>>> [fit_verdict(r2) for r2 in (-0.3, 0.2, 0.9)]
['noise', 'poor', 'fits']
"""

from __future__ import annotations

import numpy as np

#: A network whose training loss is at least this fraction of the best constant's is collapsed.
COLLAPSE_THRESHOLD = 0.95

#: R² against the truth from which a prediction is said to fit the function (the threshold of the
#: findings' diagnostic, docs/conventions.md#r-4). Below 0 it fits the noise, not the function.
FIT_R2 = 0.5

#: What each :func:`fit_verdict` means, in the words the summaries print.
FIT_VERDICTS = {
    "noise": "fits the noise, not the function",
    "poor": "fits the function poorly",
    "fits": "fits the function",
    "unknown": "no fit measured (R² is not a number: the predictions are not finite)",
}


def half_mse(prediction: np.ndarray, y: np.ndarray) -> np.ndarray:
    """½·mean (y − ŷ)² over the last axis: ``prediction``, ``y`` (..., N) → (...)."""
    return 0.5 * np.mean((np.asarray(prediction, dtype=np.float64) - np.asarray(y, dtype=np.float64)) ** 2,
                         axis=-1)


def constant_loss(y: np.ndarray) -> np.ndarray:
    """The training loss of the best constant prediction (the mean): ½·var of the targets,
    ``y (..., N)`` → (...)."""
    return 0.5 * np.var(np.asarray(y, dtype=np.float64), axis=-1)


def collapsed(train_loss: np.ndarray, constant: np.ndarray, *,
              threshold: float = COLLAPSE_THRESHOLD) -> np.ndarray:
    """True where ``train_loss >= threshold · constant`` (the network barely beats a constant)."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    return np.asarray(train_loss) >= threshold * np.asarray(constant)


def fit_r2(prediction: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """R² of a prediction against the noise-free truth: 1 − mean (ŷ − f)² / var f over the last
    axis (the in-distribution test points), ``prediction (..., T)``, ``truth (T,)`` → (...)."""
    truth = np.asarray(truth, dtype=np.float64)
    return 1.0 - np.mean((np.asarray(prediction, dtype=np.float64) - truth) ** 2, axis=-1) / np.var(truth)


def fit_verdict(r2: float, *, threshold: float = FIT_R2) -> str:
    """Name a prediction's R² against the truth (:data:`FIT_VERDICTS`): ``"noise"`` when R² < 0
    (its squared error exceeds the truth's variance: what it learned is noise, not the function),
    ``"fits"`` when R² >= ``threshold``, ``"poor"`` in between, ``"unknown"`` when R² is NaN (a
    diverged network's predictions)."""
    r2 = float(r2)
    if np.isnan(r2):
        return "unknown"
    if r2 < 0.0:
        return "noise"
    return "fits" if r2 >= threshold else "poor"


__all__ = ["COLLAPSE_THRESHOLD", "FIT_R2", "FIT_VERDICTS", "collapsed", "constant_loss", "fit_r2", "fit_verdict",
           "half_mse"]
