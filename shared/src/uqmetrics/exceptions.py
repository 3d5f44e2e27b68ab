"""Warnings and exceptions raised by uqmetrics."""

from __future__ import annotations

__all__ = ["UndefinedMetricWarning"]


class UndefinedMetricWarning(UserWarning):
    """A metric is undefined for the given input and NaN is returned.

    Raised, for example, by :func:`uqmetrics.auroc_score` when only correct (or only wrong)
    predictions are present, so that the Mann-Whitney estimate has an empty class. Like
    scikit-learn's warning of the same name, it is a :class:`UserWarning` subclass and the metric
    returns ``nan`` instead of raising.
    """
