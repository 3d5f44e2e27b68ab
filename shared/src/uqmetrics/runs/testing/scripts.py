"""A script or test file that is not in an importable package, loaded as a module
(:func:`load_script`): a package's benchmark scripts and its tests' builders read by another
test file."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType


def load_script(path: str | os.PathLike, prefix: str = "_script") -> ModuleType:
    """The Python file at ``path`` executed as a fresh module named ``<prefix>_<stem>``
    (not entered in ``sys.modules``: each call loads it anew).

    Parameters
    ----------
    path : path-like
        A ``.py`` file.
    prefix : str
        Start of the module's name, which shows in its objects' ``__module__``.

    Returns
    -------
    types.ModuleType

    Raises
    ------
    FileNotFoundError
        ``path`` is not a file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"script path {str(path)!r} is not a file")
    spec = importlib.util.spec_from_file_location(f"{prefix}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
