"""Statistical tests shared by the protocols' findings.

:func:`sign_test` is the one-sided sign test a finding uses to say whether a claim holds in
more cells than chance would give: ``k`` cells of ``n`` where the claim's inequality holds,
tested against probability 1/2 (:func:`scipy.stats.binomtest`). Where the cells share their
data (every corruption of one test set, every detector on one model) they are not independent
draws, and the p-value is a guide, not an exact error rate.
"""

from __future__ import annotations

import math

__all__ = ["sign_test"]


def sign_test(k: int, n: int) -> float:
    """One-sided sign test: the p-value of ``k`` or more successes in ``n`` at probability 1/2.

    Parameters
    ----------
    k : int
        Successes: the cells where the claim's inequality holds (``0 <= k <= n``).
    n : int
        Cells with both values compared.

    Returns
    -------
    float
        ``P(X >= k)`` for ``X ~ Binomial(n, 1/2)`` (:func:`scipy.stats.binomtest` with
        ``alternative="greater"``); NaN where ``n`` is 0 (nothing was compared).

    Examples
    --------
    >>> sign_test(5, 5)
    0.03125
    >>> sign_test(0, 0)
    nan
    """
    from scipy.stats import binomtest  # imported on use (about a second)

    return float(binomtest(k, n, 0.5, alternative="greater").pvalue) if n else math.nan
