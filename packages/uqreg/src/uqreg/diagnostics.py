"""Collapse diagnostics (docs/conventions.md#r-3b): did a trained network learn anything?

Under the paper's literal recipe the E.1 networks decay to a constant (the mean of their
targets) and barely beat it. A network is *collapsed* when its final training loss is at least
:data:`COLLAPSE_THRESHOLD` × the loss of the best constant, ½·var of its targets. (A threshold on
the prediction's variance does not work: collapsed E.1 networks keep ~13 % of the truth's
variance in wiggles uncorrelated with it.)

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
"""

from __future__ import annotations

import numpy as np

#: A network whose training loss is at least this fraction of the best constant's is collapsed.
COLLAPSE_THRESHOLD = 0.95


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


__all__ = ["COLLAPSE_THRESHOLD", "collapsed", "constant_loss", "fit_r2", "half_mse"]
