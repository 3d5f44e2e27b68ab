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

import contextlib
import os
from collections.abc import Iterator

from uqmetrics import InputError

__all__ = ["BadImageError", "CacheError", "CheckpointError", "SkippedCacheWarning",
           "UqvisionWarning", "WeightsUnavailableError", "worker_errors"]


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
        The image file (``None`` when the error was re-raised from a DataLoader worker:
        :func:`worker_errors`).
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


def _from_worker(err: InputError) -> InputError:
    """``err`` as raised in the worker process, when torch's DataLoader re-raised it in this
    one: the same type, with the worker's one-line message instead of torch's wrapping
    (``Caught BadImageError in DataLoader worker process 0.`` and the worker's traceback,
    whose last line is ``<module>.<type>: <message>``); ``err`` itself otherwise."""
    text = str(err)
    if not text.startswith(f"Caught {type(err).__name__} in DataLoader worker process"):
        return err
    said = f"{type(err).__module__}.{type(err).__qualname__}: "
    lines = [line for line in text.splitlines() if line.startswith(said)]
    return type(err)(lines[-1][len(said):]) if lines else err


@contextlib.contextmanager
def worker_errors() -> Iterator[None]:
    """Inside, a user's-input error raised in a DataLoader worker (an image that does not
    decode: :class:`BadImageError`, an image changed since a sweep planned) reaches the
    caller as the one line it is with no worker (``--workers 0``), its type kept, instead of
    torch's message of several lines with the worker's traceback.
    """
    try:
        yield
    except InputError as err:
        said = _from_worker(err)
        if said is err:
            raise
        raise said from None
