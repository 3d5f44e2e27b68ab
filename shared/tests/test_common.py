"""Generic property tests over every registered metric (like scikit-learn's test_common.py).

The tests iterate :mod:`uqmetrics.registry`, so a metric is checked for every property it
declares as soon as it is registered; nothing here names individual metrics except the
S.2 properties specific to AUROC, AURC and E-AURC.
"""

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uqmetrics import UndefinedMetricWarning, aurc_loss, auroc_score, eaurc_loss
from uqmetrics.registry import KINDS, get_metric, list_metrics
from uqmetrics.testing import strategies

SELECTIVE = list_metrics(kind="selective")
PERMUTATION = {kind: list_metrics(kind=kind, prop="permutation_invariant") for kind in KINDS}
MONOTONE = list_metrics(kind="selective", prop="monotone_invariant")


def _call(name, *args):
    """Evaluate a registered metric, allowing the documented NaN-with-warning outcome."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        return get_metric(name).func(*args)


def _assert_same(a, b, name):
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        assert math.isnan(a) and math.isnan(b), f"{name}: {a} vs {b}"
    else:
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), f"{name}: {a} vs {b}"


@pytest.mark.parametrize("kind", KINDS)
def test_registry_has_metrics_of_every_kind(kind):
    assert list_metrics(kind=kind), f"no {kind} metric is registered"


# Per-metric tests run once per registered metric: fewer examples each.
@pytest.mark.parametrize("name", PERMUTATION["selective"])
@settings(max_examples=30)
@given(data=strategies.correct_and_confidence(both_classes=False), seed=st.integers(0, 2**32 - 1))
def test_selective_permutation_invariance(name, data, seed):
    c, k = data
    perm = np.random.default_rng(seed).permutation(c.size)
    _assert_same(_call(name, c[perm], k[perm]), _call(name, c, k), name)


@pytest.mark.parametrize("name", PERMUTATION["classification"])
@settings(max_examples=20)
@given(data=strategies.probs_and_labels(), seed=st.integers(0, 2**32 - 1))
def test_classification_permutation_invariance(name, data, seed):
    labels, probs = data
    perm = np.random.default_rng(seed).permutation(labels.size)
    _assert_same(_call(name, labels[perm], probs[perm]), _call(name, labels, probs), name)


@pytest.mark.parametrize("name", MONOTONE)
@settings(max_examples=30)
@given(data=strategies.correct_and_confidence(both_classes=False),
       transform=strategies.strictly_increasing_transforms)
def test_monotone_invariance(name, data, transform):
    c, k = data
    _, f = transform
    _assert_same(_call(name, c, f(k)), _call(name, c, k), name)


@given(strategies.correct_and_confidence(ties=False))
def test_auroc_of_perfect_ranking_is_one(data):
    c, _ = data
    perfect = c + np.linspace(0, 0.5, c.size)  # any κ with every correct above every wrong
    assert auroc_score(c, perfect) == 1.0
    assert auroc_score(c, -perfect) == 0.0


@given(strategies.correct_and_confidence(), st.floats(-10, 10))
def test_auroc_of_constant_confidence_is_half(data, value):
    c, _ = data
    assert auroc_score(c, np.full(c.size, value)) == 0.5


@given(strategies.correct_and_confidence(both_classes=False))
def test_eaurc_nonnegative(data):
    c, k = data
    assert eaurc_loss(c, k) >= -1e-12


@given(strategies.correct_and_confidence(both_classes=False))
def test_eaurc_zero_for_perfect_ranking(data):
    c, k = data
    perfect = np.where(c, 2.0 + k, k)  # k in [0, 1]: correct strictly above wrong, ties kept
    assert eaurc_loss(c, perfect) == pytest.approx(0.0, abs=1e-12)


@given(strategies.correct_and_confidence(both_classes=False), st.integers(0, 2**32 - 1))
def test_aurc_independent_of_tie_order(data, seed):
    """Reordering the samples inside each tied block gives exactly the same AURC."""
    c, k = data
    rng = np.random.default_rng(seed)
    order = np.lexsort((rng.random(c.size), k))  # sorted by κ, ties in random order
    assert aurc_loss(c[order], k[order]) == aurc_loss(c, k)
    # errors first vs errors last inside every tied block
    first = np.lexsort((c, k))
    last = np.lexsort((~c, k))
    assert aurc_loss(c[first], k[first]) == aurc_loss(c[last], k[last])
