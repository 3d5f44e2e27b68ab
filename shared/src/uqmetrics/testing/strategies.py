"""Hypothesis strategies for metric inputs (importable, like xarray.testing.strategies).

All strategies draw numpy arrays with the shapes documented by the metrics:
``labels`` (n,), ``probs`` (n, C), ``logits`` (n, C), ``correct`` (n,), ``confidence`` (n,).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

finite_floats = st.floats(-50, 50, allow_nan=False, allow_infinity=False, width=64)


@st.composite
def logits_and_labels(draw, min_n: int = 2, max_n: int = 60, min_c: int = 2, max_c: int = 6):
    """Draw ``(labels (n,), logits (n, C))``."""
    n = draw(st.integers(min_n, max_n))
    c = draw(st.integers(min_c, max_c))
    logits = draw(hnp.arrays(np.float64, (n, c), elements=st.floats(-8, 8, width=64)))
    labels = draw(hnp.arrays(np.int64, (n,), elements=st.integers(0, c - 1)))
    return labels, logits


@st.composite
def probs_and_labels(draw, **kwargs):
    """Draw ``(labels (n,), probs (n, C))`` with probs = softmax of drawn logits."""
    labels, logits = draw(logits_and_labels(**kwargs))
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    return labels, p / p.sum(axis=1, keepdims=True)


@st.composite
def correct_and_confidence(draw, min_n: int = 2, max_n: int = 80, both_classes: bool = True,
                           ties: bool = True):
    """Draw ``(correct (n,) bool, confidence (n,) float)``.

    With ``ties`` the confidences come from a small set of values so that tied blocks occur;
    with ``both_classes`` at least one correct and one wrong sample are present.
    """
    n = draw(st.integers(min_n, max_n))
    correct = draw(hnp.arrays(bool, (n,)))
    if both_classes:
        correct[0], correct[-1] = True, False
    # Confidences on a grid of 1/1000 so that strictly increasing transforms stay strictly
    # increasing in floating point (no two values closer than 1e-3).
    n_levels = draw(st.integers(1, 5)) if ties and draw(st.booleans()) else 1001
    grid = draw(hnp.arrays(np.int64, (n,), elements=st.integers(0, 1000)))
    if n_levels < 1001:
        levels = np.array(draw(st.lists(st.integers(0, 1000), min_size=n_levels, max_size=n_levels)))
        grid = levels[grid % n_levels]
    conf = grid / 1000.0
    return correct, conf


strictly_increasing_transforms = st.sampled_from(
    [
        ("identity", lambda x: x),
        ("exp", np.exp),
        ("affine", lambda x: 3.0 * x + 7.0),
        ("cube", lambda x: x**3),
        ("arctan", np.arctan),
        ("logit-ish", lambda x: np.log1p(x) * 5 - 2),
    ]
)
"""(name, f) pairs of strictly increasing functions on [0, 1]."""
