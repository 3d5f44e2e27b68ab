"""Names in an image layout: which files are images, the class folders of a folder, WordNet
ids and their descriptions, and file names that are not UTF-8 (refused as class names,
reported as unreadable images, shown with their bytes as ``\\xNN``).
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from uqmetrics import InputError

__all__ = [
    "IMG_EXTENSIONS",
    "list_classes",
    "wnid_description",
]

#: File suffixes read as images (torchvision's list).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_WNID = re.compile(r"n\d{8}")


def list_classes(root: str | os.PathLike) -> list[str]:
    """The class sub-folders of an image folder (a link to a folder is one), sorted by their
    names as stored (code point order, as torchvision's ImageFolder sorts them); hidden
    folders (:func:`_hidden`) are not classes.

    Only the top level is listed (cheap on ImageNet); an empty list when there is none.

    Raises
    ------
    FileNotFoundError
        ``root`` is not a folder.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {str(root)!r} does not exist")
    with os.scandir(root) as entries:
        return sorted(e.name for e in entries if e.is_dir() and not _hidden(e.name))


def _hidden(name: str) -> bool:
    """Whether a file or folder name is hidden (starts with ``.``: ``.DS_Store``, macOS's
    ``._<name>`` resource forks, ``.ipynb_checkpoints``, a trash folder, a writer's temporary
    file). The one rule at every depth of every layout: a hidden name is no class and no
    sample, and nothing below a hidden folder is read (a hidden folder at the class level
    that holds images is refused instead: :mod:`uqvision.layouts.folders`)."""
    return name.startswith(".")


def _is_image(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMG_EXTENSIONS


def _utf8(name: str) -> bool:
    """Whether a file name decoded by the OS (undecodable bytes kept as surrogates,
    ``os.fsdecode``) is valid UTF-8, i.e. can be written to a cache and a message."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(name: str) -> str:
    """A file name for messages and records: its bytes that are not UTF-8 as ``\\xNN``."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _not_utf8(name: str) -> str:
    """The problem recorded for a file whose name is not valid UTF-8 (its bytes shown)."""
    raw = name.rsplit("/", 1)[-1].encode("utf-8", "surrogateescape")
    return f"file name is not valid UTF-8 ({raw!r}); rename the file"


def _refuse_class_name(root: Path, name: str) -> None:
    if not _utf8(name):
        raise InputError(f"image folder {_shown(str(root))!r}: class folder {_shown(name)!r} has "
                         "a name that is not valid UTF-8; rename it (class names are recorded "
                         "in every cache and matched to the model's)")


@functools.lru_cache(maxsize=1)
def _imagenet_info():
    from timm.data import ImageNetInfo  # timm's class info: WordNet ids, lemmas, definitions

    return ImageNetInfo("imagenet-1k")


def wnid_description(wnid: str) -> str | None:
    """The lemmas of a WordNet id (``n01440764`` -> ``tench, Tinca tinca``) from timm's ImageNet
    class info (``timm.data.ImageNetInfo``), ``None`` for a name it does not know.

    Examples
    --------
    >>> wnid_description("n01440764")
    'tench, Tinca tinca'
    >>> wnid_description("cat") is None
    True
    """
    if not _WNID.fullmatch(str(wnid)):
        return None
    try:
        return _imagenet_info().label_name_to_description(str(wnid))
    except KeyError:
        return None


def _tar_names(path: Path) -> bool:
    return path.name.endswith((".tar.gz", ".tgz", ".tar"))

