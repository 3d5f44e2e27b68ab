"""Agreement of uqmetrics.metrics.conformal with MAPIE 1.x (LAC and APS thresholds and sets).

A cross-check against an optional library, in a file of its own: without MAPIE this file is
skipped, and the conformal tests of test_conformal.py still run.
"""

from __future__ import annotations

import numpy as np
import pytest

from uqmetrics.metrics.conformal import aps_scores, conformal_quantile, prediction_sets, thr_scores

mapie_classification = pytest.importorskip("mapie.classification")


def _dirichlet(n, c, seed, conc=0.5):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(c, conc), size=n)
    y = (rng.random(n)[:, None] > np.cumsum(p, axis=1)).sum(axis=1).clip(0, c - 1)
    return p, y


def _stored_classifier(probs):
    from sklearn.base import BaseEstimator, ClassifierMixin

    class Stored(ClassifierMixin, BaseEstimator):
        """Prefit classifier: X is a column of row indices into stored probabilities."""

        def __init__(self, probs=None):
            self.probs = probs

        def fit(self, X, y):  # never called: prefit
            return self

        def predict_proba(self, X):
            return self.probs[np.asarray(X)[:, 0].astype(int)]

        def predict(self, X):
            return self.predict_proba(X).argmax(axis=1)

    clf = Stored(probs)
    clf.classes_ = np.arange(probs.shape[1])
    clf.n_features_in_ = 1
    return clf


def _mapie(probs, conformity_score, alpha, random_state):
    return mapie_classification.SplitConformalClassifier(
        estimator=_stored_classifier(probs), confidence_level=1 - alpha,
        conformity_score=conformity_score, prefit=True, random_state=random_state)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
def test_lac_agrees_with_mapie(seed, alpha):
    """MAPIE's LAC: the ceil((n+1)(1-alpha))-th smallest 1 - p_y (np.quantile at
    ceil((n+1)(1-alpha))/n, method="lower") and sets 1 - p - qhat <= 1e-8: same qhat exactly;
    the same sets unless a test score lies within 1e-8 above qhat (probability ~0 here)."""
    p, y = _dirichlet(600, 8, seed)
    X = np.arange(600)[:, None]
    cal, test = np.arange(300), np.arange(300, 600)
    m = _mapie(p, "lac", alpha, seed).conformalize(X[cal], y[cal])
    _, msets = m.predict_set(X[test])  # MAPIE computes its quantile at prediction
    q = conformal_quantile(thr_scores(p[cal], y[cal]), alpha)
    assert q == m._mapie_classifier.quantiles_[0]
    np.testing.assert_array_equal(prediction_sets(thr_scores(p[test]), q), msets[:, :, 0])


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
def test_aps_agrees_with_mapie(seed, alpha):
    """MAPIE's APS calibration score is always randomized: cumsum up to and including y
    minus V p_y with V = RandomState(random_state).uniform(size=n), i.e. ours with
    u = 1 - V. Its sets with include_last_label=True are the deterministic sets
    {y: mass ranked above y < qhat}: ours with u = 0 (equal but at the 1e-8 boundary);
    include_last_label=False gives ours with u = 1 plus the top class (MAPIE never returns an
    empty set). include_last_label="randomized" draws its own uniforms at prediction time (the
    same distribution as ours, not the same draws): not compared."""
    p, y = _dirichlet(600, 8, seed)
    X = np.arange(600)[:, None]
    cal, test = np.arange(300), np.arange(300, 600)
    m = _mapie(p, "aps", alpha, seed).conformalize(X[cal], y[cal])
    v = np.random.RandomState(seed).uniform(size=300)
    s_cal = aps_scores(p[cal], y[cal], u=1 - v)
    np.testing.assert_allclose(s_cal, m.conformity_scores.ravel(), rtol=0, atol=1e-12)
    _, msets = m.predict_set(X[test], conformity_score_params={"include_last_label": True})
    q = conformal_quantile(s_cal, alpha)
    assert q == pytest.approx(m._mapie_classifier.quantiles_[0], abs=1e-12)
    np.testing.assert_array_equal(prediction_sets(aps_scores(p[test], u=np.zeros(300)), q),
                                  msets[:, :, 0])
    _, msets = m.predict_set(X[test], conformity_score_params={"include_last_label": False})
    ours = prediction_sets(aps_scores(p[test]), q)
    ours[np.arange(300), p[test].argmax(axis=1)] = True
    np.testing.assert_array_equal(ours, msets[:, :, 0])
