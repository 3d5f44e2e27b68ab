"""uqmetrics.metrics.stats: the one-sided sign test of the protocols' findings, checked by hand."""

import math

import pytest

from uqmetrics.metrics.stats import sign_test


@pytest.mark.parametrize(("k", "n", "expected"), [
    (5, 5, 1 / 32),                  # P(X >= 5) = 1/32
    (4, 5, 6 / 32),                  # (C(5,4) + C(5,5)) / 32
    (0, 5, 1.0),                     # P(X >= 0)
    (3, 4, 5 / 16),                  # (C(4,3) + C(4,4)) / 16
    (15, 15, 2.0 ** -15),
    (39, 45, sum(math.comb(45, i) for i in range(39, 46)) / 2 ** 45),
])
def test_sign_test_is_the_upper_binomial_tail_at_one_half(k, n, expected):
    assert sign_test(k, n) == pytest.approx(expected, rel=1e-12)


def test_sign_test_of_nothing_compared_is_nan():
    assert math.isnan(sign_test(0, 0))


def test_sign_test_is_one_sided():
    # fewer successes than half: no evidence for the claim (p near 1), not a two-sided p
    assert sign_test(1, 10) == pytest.approx(1 - 1 / 1024)
    assert sign_test(10, 10) < 0.05 < sign_test(8, 10)
