"""The failures file of a sweep: the cells that raised, written atomically as JSON
(:func:`write_failures`) and read back (:func:`read_failures`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..io import temporary_beside

#: ``format`` of a failures file (:func:`write_failures`).
FAILURES_FORMAT = "uqmetrics.sweep_failures/1"


def write_failures(path: str | os.PathLike, failures: Sequence[Mapping[str, Any]]) -> Path:
    """Write a sweep's failures atomically as JSON (``{"format": ..., "failures": [...]}``).

    Parameters
    ----------
    path : path
        The file; written through a temporary file beside it, ``fsync`` and ``os.replace``, so a
        reader sees the old list or the new one, never half of one.
    failures : sequence of mapping
        One JSON-serialisable record per failed unit (e.g. ``{"model", "error", "time"}``).

    Returns
    -------
    pathlib.Path

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = write_failures(Path(d) / "f.json", [{"model": "m", "error": "OOM"}])
    ...     read_failures(p), sorted(q.name for q in Path(d).iterdir())
    ([{'model': 'm', 'error': 'OOM'}], ['f.json'])
    """
    path = Path(path)
    text = json.dumps({"format": FAILURES_FORMAT, "failures": [dict(f) for f in failures]},
                      indent=1, sort_keys=False) + "\n"
    with temporary_beside(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    return path


def read_failures(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a failures file (:func:`write_failures`); ``[]`` when it does not exist.

    Raises
    ------
    ValueError
        The file is not a failures file (not JSON, another format); the message names it.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"failures file {str(path)!r} is not JSON ({exc}); delete it to start "
                         "its record afresh") from None
    if (not isinstance(data, dict) or data.get("format") != FAILURES_FORMAT
            or not isinstance(data.get("failures"), list)
            or not all(isinstance(f, dict) for f in data["failures"])):
        raise ValueError(f"{str(path)!r} is not a sweep failures file (format "
                         f"{FAILURES_FORMAT!r}); delete it or give another path")
    return data["failures"]
