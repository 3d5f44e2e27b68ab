"""The run a process is recording: the configuration of the command running (set by
:func:`recording`, read by :func:`current_run_config`) and the result-file attr it is written
under (:data:`RUN_CONFIG_ATTR`).

Both :mod:`uqmetrics.runs.io` (whose :func:`~uqmetrics.runs.io.provenance_attrs` records it)
and :mod:`uqmetrics.runs.run_config` (which sets it while a command runs and reads it back from
result files) need these names; they live here, below both, so that neither imports the other
for them. :mod:`uqmetrics.runs.run_config` re-exports them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["RUN_CONFIG_ATTR", "current_run_config", "recording"]

#: The attr of a result file that records the run that made it (JSON:
#: :func:`uqmetrics.runs.run_config.resolved_config`).
RUN_CONFIG_ATTR = "run_config"

#: The configuration of the command running (:func:`recording`), read by
#: :func:`uqmetrics.runs.io.provenance_attrs`.
_CURRENT: dict[str, Any] | None = None


@contextlib.contextmanager
def recording(config: Mapping[str, Any] | None) -> Iterator[None]:
    """While the block runs, :func:`current_run_config` is ``config``: every result written
    with :func:`uqmetrics.runs.io.provenance_attrs` records it (:data:`RUN_CONFIG_ATTR`)."""
    global _CURRENT
    before, _CURRENT = _CURRENT, (dict(config) if config is not None else None)
    try:
        yield
    finally:
        _CURRENT = before


def current_run_config() -> dict[str, Any] | None:
    """The configuration of the command running in this process (:func:`recording`), or
    ``None``."""
    return _CURRENT
