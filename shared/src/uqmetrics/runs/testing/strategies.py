"""Hypothesis strategies for metric inputs (importable, like xarray.testing.strategies).

All strategies draw numpy arrays with the shapes documented by the metrics:
``labels`` (n,), ``probs`` (n, C), ``logits`` (n, C), ``correct`` (n,), ``confidence`` (n,),
and the inputs of the other metric kinds of :mod:`uqmetrics.metrics.registry` (regression
``(y, mean, std)``, ood ``(u_in, u_out)``, retrieval ``(embeddings, labels, uncertainty)``).
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
    without, they are distinct. With ``both_classes`` at least one correct and one wrong sample
    are present.
    """
    n = draw(st.integers(min_n, max_n))
    correct = draw(hnp.arrays(bool, (n,)))
    if both_classes:
        correct[0], correct[-1] = True, False
    # Confidences on a grid of 1/1000 so that strictly increasing transforms stay strictly
    # increasing in floating point (no two values closer than 1e-3).
    n_levels = draw(st.integers(1, 5)) if ties and draw(st.booleans()) else 1001
    grid = draw(hnp.arrays(np.int64, (n,), elements=st.integers(0, 1000), unique=not ties))
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


@st.composite
def member_probs(draw, min_members: int = 1, max_members: int = 5, min_n: int = 1,
                 max_n: int = 30, min_c: int = 2, max_c: int = 6):
    """Draw ``member_probs (n_members, n, C)``: softmax of drawn logits for each member.

    Logits lie in [-8, 8], so probabilities are bounded away from exact 0/1. In about half of
    the draws every member equals the first (members agree), so that MI = 0 cases occur.
    """
    m = draw(st.integers(min_members, max_members))
    n = draw(st.integers(min_n, max_n))
    c = draw(st.integers(min_c, max_c))
    logits = draw(hnp.arrays(np.float64, (m, n, c), elements=st.floats(-8, 8, width=64)))
    if draw(st.booleans()):
        logits[1:] = logits[0]
    z = logits - logits.max(axis=-1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=-1, keepdims=True)


@st.composite
def grid_logits_and_labels(draw, min_n: int = 2, max_n: int = 60, min_c: int = 2,
                           max_c: int = 6, step: float = 0.25, bound: float = 8.0):
    """Draw ``(labels (n,), logits (n, C))`` with logits on a grid of spacing ``step``.

    Distinct logits differ by at least ``step``, so their order survives ``z / T`` and the
    softmax in float64 for moderate ``T`` (no rounding to ties); used for invariance of
    rankings (e.g. top-k accuracy under temperature scaling).
    """
    n = draw(st.integers(min_n, max_n))
    c = draw(st.integers(min_c, max_c))
    m = round(bound / step)
    grid = draw(hnp.arrays(np.int64, (n, c), elements=st.integers(-m, m)))
    labels = draw(hnp.arrays(np.int64, (n,), elements=st.integers(0, c - 1)))
    return labels, grid * step


@st.composite
def member_log_probs_and_labels(draw, min_members: int = 1, max_members: int = 5,
                                min_n: int = 1, max_n: int = 30, min_c: int = 2,
                                max_c: int = 5):
    """Draw ``(labels (n,), member_log_probs (member, n, C))``: log-softmax of logits in [-8, 8]."""
    k = draw(st.integers(min_members, max_members))
    n = draw(st.integers(min_n, max_n))
    c = draw(st.integers(min_c, max_c))
    z = draw(hnp.arrays(np.float64, (k, n, c), elements=st.floats(-8, 8, width=64)))
    z = z - z.max(axis=2, keepdims=True)
    lp = z - np.log(np.exp(z).sum(axis=2, keepdims=True))
    labels = draw(hnp.arrays(np.int64, (n,), elements=st.integers(0, c - 1)))
    return labels, lp


@st.composite
def gaussian_forecasts(draw, min_n: int = 1, max_n: int = 40):
    """Draw ``(y (n,), mean (n,), std (n,))``: targets and Gaussian forecasts, ``std > 0``.

    Values on coarse grids: ``y`` and ``mean`` in [-10, 10] (step 1/8), ``std`` in
    [1/16, 5] (step 1/64).
    """
    n = draw(st.integers(min_n, max_n))
    y = draw(hnp.arrays(np.int64, (n,), elements=st.integers(-80, 80))) / 8.0
    mean = draw(hnp.arrays(np.int64, (n,), elements=st.integers(-80, 80))) / 8.0
    std = draw(hnp.arrays(np.int64, (n,), elements=st.integers(4, 320))) / 64.0
    return y, mean, std


def _uncertainty_grid(draw, n: int) -> np.ndarray:
    """``n`` values on the 1/1000 grid of [0, 1] (ties likely), as ``correct_and_confidence``."""
    return draw(hnp.arrays(np.int64, (n,), elements=st.integers(0, 1000))) / 1000.0


@st.composite
def ood_uncertainties(draw, max_n: int = 40):
    """Draw ``(u_in (n_in,), u_out (n_out,))`` on the 1/1000 grid of [0, 1]."""
    n_in, n_out = draw(st.integers(1, max_n)), draw(st.integers(1, max_n))
    return _uncertainty_grid(draw, n_in), _uncertainty_grid(draw, n_out)


@st.composite
def retrieval_inputs(draw, min_n: int = 2, max_n: int = 30, max_classes: int = 4):
    """Draw ``(embeddings (n, d), labels (n,), uncertainty (n,))``, ``d`` in 2..5.

    Embeddings are standard normal from a drawn seed, so no two cosine similarities tie (the
    nearest neighbour is unique with probability 1); uncertainties lie on the 1/1000 grid.
    """
    n = draw(st.integers(min_n, max_n))
    d = draw(st.integers(2, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    labels = draw(hnp.arrays(np.int64, (n,), elements=st.integers(0, max_classes - 1)))
    return rng.standard_normal((n, d)), labels, _uncertainty_grid(draw, n)
