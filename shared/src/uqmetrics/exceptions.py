"""Warnings and exceptions raised by uqmetrics.

Every warning uqmetrics raises is a :class:`UqmetricsWarning`, so that one filter selects them
all, whichever module the warning is attributed to. Test configurations turn them into errors
by category, not by module::

    filterwarnings = ["error::uqmetrics.exceptions.UqmetricsWarning"]

(a module filter such as ``error::UserWarning:uqmetrics.*`` misses every warning raised with
``stacklevel > 1``, which Python attributes to the caller's module).
"""

from __future__ import annotations

__all__ = ["UndefinedMetricWarning", "UqmetricsWarning"]


class UqmetricsWarning(UserWarning):
    """Base class of every warning raised by uqmetrics (a :class:`UserWarning` subclass)."""


class UndefinedMetricWarning(UqmetricsWarning):
    """A metric is undefined for the given input and NaN is returned.

    Raised, for example, by :func:`uqmetrics.auroc_score` when only correct (or only wrong)
    predictions are present, so that the Mann-Whitney estimate has an empty class. Like
    scikit-learn's warning of the same name, it is a :class:`UserWarning` subclass and the metric
    returns ``nan`` instead of raising.
    """
