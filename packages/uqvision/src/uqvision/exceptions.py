"""Warnings and exceptions raised by uqvision.

Every warning uqvision raises is a :class:`UqvisionWarning`, so that one filter selects them all
whichever module a warning is attributed to (``warnings.warn(..., stacklevel=2)`` attributes it
to the caller). The package's tests turn them into errors by category::

    filterwarnings = ["error::uqvision.exceptions.UqvisionWarning"]
"""

from __future__ import annotations

__all__ = ["CacheError", "SkippedCacheWarning", "UqvisionWarning"]


class UqvisionWarning(UserWarning):
    """Base class of every warning raised by uqvision (a :class:`UserWarning` subclass)."""


class SkippedCacheWarning(UqvisionWarning):
    """A file among the given caches is unreadable, partial or not a prediction cache; it is
    left out of the index (and so never scored)."""


class CacheError(ValueError):
    """A cache is partial, corrupt, not a cache, or does not match the other caches."""
