"""Boundary cases of the S.9 disentanglement estimators (docs/conventions.md#s-9) that the
property tests of ``test_disentangle_estimators.py`` do not reach: the clips at 0 that keep the
epistemic parts and the bias non-negative where float64 rounding would give a few ulps below 0.
"""

import numpy as np
from scipy.special import logsumexp, rel_entr, xlogy

from uqmetrics import bregman_decomposition, information_decomposition


def _identical_members():
    """(members, p): 200 random distributions over 4 classes, each repeated by 3, 5 and 7
    members. The members agree, so every epistemic part and, with q = p, the bias is 0; in
    float64 the mean of equal rows is not always bit-equal to them, and the unclipped parts
    come out a few ulps below 0 for many rows (asserted where used, so the tests are not
    empty)."""
    p = np.random.default_rng(0).dirichlet(np.ones(4), size=200)
    return [(np.repeat(p[None], m, axis=0), p) for m in (3, 5, 7)]


def _entropy(p):
    return -np.sum(xlogy(p, p), axis=-1)


def test_mutual_information_of_agreeing_members_is_never_negative():
    """E = max(H(p̄) − mean_s H(p_s), 0) >= 0 exactly, and T = A + E exactly."""
    for members, _ in _identical_members():
        raw = _entropy(members.mean(axis=0)) - _entropy(members).mean(axis=0)
        assert (raw < 0).any()  # rounding below 0 occurs on these inputs
        split = information_decomposition(members)
        assert np.all(split.epistemic >= 0)
        np.testing.assert_array_equal(split.epistemic[raw < 0], 0.0)
        np.testing.assert_array_equal(split.total, split.aleatoric + split.epistemic)


def test_bregman_epistemic_part_and_bias_of_agreeing_members_are_never_negative():
    """E = −log Σ_c exp(mean_s log p_s,c) and B = KL(q ‖ p̃), both clipped at 0: >= 0 exactly
    for members that agree and labels equal to their prediction."""
    for members, p in _identical_members():
        mean_logp = np.log(members).mean(axis=0)
        log_z = logsumexp(mean_logp, axis=-1)
        raw_e = -log_z
        raw_b = rel_entr(p, np.exp(mean_logp - log_z[:, None])).sum(axis=-1)
        assert (raw_e < 0).any() and (raw_b < 0).any()  # rounding below 0 occurs
        split = bregman_decomposition(members, p)
        assert np.all(split.epistemic >= 0) and np.all(split.bias >= 0)
        np.testing.assert_array_equal(split.epistemic[raw_e < 0], 0.0)
        np.testing.assert_array_equal(split.total, split.aleatoric + split.bias + split.epistemic)
