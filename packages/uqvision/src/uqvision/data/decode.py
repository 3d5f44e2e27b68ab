"""Decoding an image file to 8-bit RGB (:func:`load_image`; 16-bit grey scaled, not clipped;
a sample of an image source, :func:`_load_sample`; bytes already read, in memory) and what is
wrong with one that does not decode, in a few words (:func:`_problem`): the loader of
:class:`~uqvision.data.ImageFolderDataset`, and what the checks of :mod:`~uqvision.data.images`
read a damaged file with.
"""

from __future__ import annotations

import io
import os

import numpy as np
from PIL import Image

from ..exceptions import BadImageError

__all__ = ["load_image"]

#: 16-bit grey modes: levels scaled 65535 -> 255 (PIL's ``convert`` clips them at 255 instead).
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")
#: Formats whose mode ``I`` (32-bit integer) holds 16-bit grey levels: Pillow before 11 opened a
#: 16-bit PNG as ``I``, and it opens a PGM/PPM of more than 8 bits as ``I`` scaled to 0 ... 65535.
_SIXTEEN_BIT_AS_I = ("PNG", "PPM")


def _to_rgb(im: Image.Image, path: str | os.PathLike) -> Image.Image:
    """An opened image as 8-bit RGB: 16-bit grey levels scaled, not clipped; a 32-bit integer
    image's levels taken as 8-bit ones (what torchvision's and timm's loaders read from it)
    when they lie in 0 ... 255, refused otherwise, as floating-point pixels are (neither has a
    range that says what white is)."""
    if im.mode == "F":
        raise BadImageError(f"image {str(path)!r}: floating-point pixels (mode F) have no "
                            "defined range; convert the file to 8 or 16 bits", path)
    sixteen = im.mode in _SIXTEEN_BIT_MODES or (im.mode == "I" and im.format in _SIXTEEN_BIT_AS_I)
    if not sixteen and im.mode != "I":
        return im.convert("RGB")
    a = np.asarray(im).astype(np.int64)
    top = 65535 if sixteen else 255
    if a.size and (a.min() < 0 or a.max() > top):
        why = "" if sixteen else (": a 32-bit integer image is read as 8-bit levels, as "
                                  "torchvision's loader reads it, and these would be clipped")
        raise BadImageError(f"image {str(path)!r}: integer pixel values outside [0, {top}] "
                            f"(mode {im.mode}, range {a.min()}..{a.max()}){why}; convert the "
                            "file to 8 or 16 bits", path)
    grey = ((a * 255 + 32767) // 65535).astype(np.uint8) if sixteen else a.astype(np.uint8)
    return Image.fromarray(grey).convert("RGB")  # round(v * 255 / 65535) for 16 bits


def _problem(path: str | os.PathLike | io.BytesIO, err: BaseException) -> str:
    """What an error of PIL says about an image file (or its bytes), in a few words."""
    if isinstance(err, FileNotFoundError):
        if getattr(err, "why", None):  # uqvision.layouts.UnreadableFileError: a tar link
            return err.why
        if isinstance(path, str | os.PathLike) and os.path.islink(path):
            return f"a symbolic link to {os.readlink(path)!r}, which does not exist"
        return "does not exist"
    if isinstance(err, Image.UnidentifiedImageError):
        try:
            empty = (path.getbuffer().nbytes if isinstance(path, io.BytesIO)
                     else os.path.getsize(path)) == 0
        except OSError:
            empty = False
        return "empty file (0 bytes)" if empty else "not an image file (PIL cannot identify it)"
    if isinstance(err, Image.DecompressionBombError):
        return f"too many pixels ({err})"
    text = " ".join(str(err).split()) or type(err).__name__
    return f"truncated or corrupt ({text})"


#: What reading a damaged image file raises in PIL.
_PIL_ERRORS = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)


def load_image(path: str | os.PathLike, *, content: bytes | None = None) -> Image.Image:
    """Read an image file as 8-bit RGB (the loader of :class:`ImageFolderDataset`); with
    ``content``, the file's bytes already read (and checked: a sweep's cell), decoded from
    memory and named ``path``.

    16-bit grey images (PNG mode ``I;16``, a PGM of more than 8 bits) are scaled, 65535 -> 255
    rounded, where PIL's ``convert("RGB")`` saturates every value above 255. A 32-bit integer
    image (mode ``I``: a TIFF) has no defined range: its values are taken as 8-bit levels, as
    torchvision's and timm's loaders take them, when they lie in 0 ... 255, and it is refused
    otherwise; floating-point images are refused.

    Raises
    ------
    uqvision.exceptions.BadImageError
        The file is missing, empty, not an image, truncated or corrupt; the message names it.
    """
    return _load(path if content is None else io.BytesIO(content), path)


def _load(src: str | os.PathLike | io.BytesIO, where: str | os.PathLike) -> Image.Image:
    """:func:`load_image` of a path or of bytes in memory (an archive member), named ``where``
    in messages."""
    try:
        with Image.open(src) as im:
            return _to_rgb(im, where)
    except BadImageError:
        raise
    except _PIL_ERRORS as err:
        raise BadImageError(f"image {str(where)!r}: {_problem(src, err)}", where) from None


def _load_sample(source, rel: str, *, content: bytes | None = None) -> Image.Image:
    """Sample ``rel`` of an image source (:mod:`uqvision.layouts`) as 8-bit RGB; ``content``:
    its bytes already read."""
    if content is not None:
        return _load(io.BytesIO(content), source.where(rel))
    try:
        src = source.open(rel)
    except OSError as err:
        raise BadImageError(f"image {source.where(rel)!r}: {_problem(source.where(rel), err)}",
                            source.where(rel)) from None
    return _load(src, source.where(rel))
