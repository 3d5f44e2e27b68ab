"""The project's Brier score against Ovadia et al. (2019)'s: theirs + 1 (docs/conventions.md#s-1).

Ovadia et al.'s code (google-research/google-research, ``uq_benchmark_2019/metrics_lib.py``,
``brier_scores``; ``imagenet/run_metrics.py`` averages it into ``brier_score``) scores a
sample ``sum_c p_c^2 - 2 p_y``: the squared distance to the one-hot label without its constant
``+1``. The project's ``sum_c (p_c - 1[c = y])^2`` is that value + 1, sample by sample, so a
published Brier score of theirs compares with the project's minus 1.
"""

from __future__ import annotations

import numpy as np
import pytest

from uqmetrics.metrics.classification import brier_loss
from uqmetrics.metrics.scoring import score_metrics


def _ovadia_brier_scores(labels: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """``metrics_lib.brier_scores(labels, probs)`` restated: per sample
    ``sum_c p_c^2 - 2 p_y``."""
    return np.square(probs).sum(axis=-1) - 2 * probs[np.arange(len(labels)), labels]


@pytest.mark.parametrize("n_classes", [2, 10, 1000])
def test_brier_is_ovadias_metrics_lib_value_plus_one(n_classes):
    rng = np.random.default_rng(n_classes)
    probs = rng.dirichlet(np.full(n_classes, 0.3), size=500)
    labels = rng.integers(0, n_classes, 500)
    theirs = float(np.mean(_ovadia_brier_scores(labels, probs)))
    assert -1.0 <= theirs <= 1.0  # theirs can be negative: no constant term
    assert brier_loss(labels, probs) == pytest.approx(theirs + 1.0, rel=0, abs=1e-12)
    # the registered metric the protocols score (shift's ``brier``) is the same value
    assert score_metrics(labels, probs, metrics=("brier",))["brier"] == pytest.approx(
        theirs + 1.0, rel=0, abs=1e-12)


def test_brier_by_hand():
    """Two samples: theirs (-0.5 - 0.92) / 2 = -0.71, the project's 0.29."""
    assert _ovadia_brier_scores(np.array([0, 1]), np.array([[0.5, 0.5], [0.2, 0.8]])).mean() \
        == pytest.approx(-0.71)
    assert brier_loss([0, 1], [[0.5, 0.5], [0.2, 0.8]]) == pytest.approx(0.29)
