"""Worked examples of the selective metrics (docs/conventions.md#s-2): the Selective paper's
Appendix C.

K = 3 classes, N = 100 samples, the probability mass off the predicted class split evenly
between the two other classes. The predicted class is 0 for every sample; the label is 0 when
the prediction is right and 1 when it is wrong.
"""

from __future__ import annotations

import numpy as np


def _probs_from_confidence(kappa: np.ndarray) -> np.ndarray:
    rest = (1.0 - kappa) / 2.0
    return np.stack([kappa, rest, rest], axis=1)


def _example(correct: np.ndarray, kappa: np.ndarray):
    labels = np.where(correct, 0, 1).astype(np.int64)
    return labels, _probs_from_confidence(kappa), correct, kappa


def model_a(n: int = 100):
    """Accuracy 0.95, kappa = 0.95 for every sample.

    Returns ``(labels (n,), probs (n, 3), correct (n,), confidence (n,))``.
    Expected: NLL 0.23, Brier 0.096, ECE 0, AUROC 0.5, AURC 0.05, SAC(0.96) = 0.
    """
    correct = np.arange(n) < round(0.95 * n)
    return _example(correct, np.full(n, 0.95))


def model_b(n: int = 100):
    """Accuracy 0.40, kappa = 0.6 when right, 0.4 when wrong.

    Expected: NLL 0.93, Brier 0.54, ECE 0.4, AUROC 1, E-AURC 0, SAC(0.96) = 0.4.
    """
    correct = np.arange(n) < round(0.40 * n)
    return _example(correct, np.where(correct, 0.6, 0.4))


def flat(accuracy: float, n: int = 100):
    """Flat kappa (Appendix C): every sample has the same confidence.

    accuracy 0.2 -> AURC 0.8, oracle 0.482, E-AURC 0.318;
    accuracy 0.8 -> AURC 0.2, oracle 0.022, E-AURC 0.178.
    """
    correct = np.arange(n) < round(accuracy * n)
    return _example(correct, np.full(n, 0.5))
