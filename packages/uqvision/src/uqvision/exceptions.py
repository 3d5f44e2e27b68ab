"""Warnings and exceptions raised by uqvision.

Every warning uqvision raises is a :class:`UqvisionWarning`, so that one filter selects them all
whichever module a warning is attributed to (``warnings.warn(..., stacklevel=2)`` attributes it
to the caller). The package's tests turn them into errors by category::

    filterwarnings = ["error::uqvision.exceptions.UqvisionWarning"]

The errors a user's input causes are :class:`uqmetrics.InputError` subclasses (themselves
:class:`ValueError` subclasses): the command line prints their message, which names the file
or option and the problem, as one line and exits with code 2.
"""

from __future__ import annotations

import os

from uqmetrics import InputError

__all__ = ["BadImageError", "CacheError", "CheckpointError", "SkippedCacheWarning",
           "UqvisionWarning", "WeightsUnavailableError"]


class UqvisionWarning(UserWarning):
    """Base class of every warning raised by uqvision (a :class:`UserWarning` subclass)."""


class SkippedCacheWarning(UqvisionWarning):
    """A file among the given caches is unreadable, partial or not a prediction cache; it is
    left out of the index (and so never scored)."""


class CacheError(ValueError):
    """A cache is partial, corrupt, not a cache, or does not match the other caches."""


class BadImageError(InputError):
    """An image file that cannot be read as an image: empty, not an image, truncated or
    corrupt, or of a pixel format uqvision does not convert.

    Parameters
    ----------
    message : str
        Names the file and what is wrong with it.
    path : path, optional
        The image file (``None`` when the error was re-raised from a DataLoader worker).
    """

    def __init__(self, message: str, path: str | os.PathLike | None = None):
        super().__init__(message)
        self.path = None if path is None else str(path)


class CheckpointError(InputError):
    """A checkpoint or its sidecar that cannot be read, is not what it claims to be, or does
    not match the model it is given for (the message names the file)."""


class WeightsUnavailableError(InputError):
    """A model named without a local weight file whose pretrained weights cannot be had: not
    in the cache (Hugging Face hub cache, or torch.hub's ``checkpoints`` folder) while
    ``HF_HUB_OFFLINE`` is set, a download that failed, or a name with no pretrained source at
    all (the message names the model and the cache directory)."""
