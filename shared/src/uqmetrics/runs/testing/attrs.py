"""Comparing result files' attrs across runs: what a re-run must reproduce."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

__all__ = ["steady_attrs"]


def steady_attrs(value: Any, volatile: Collection[str]) -> Any:
    """``value`` (an attrs mapping, or one attr) with JSON strings decoded and the keys in
    ``volatile`` (time, host, wall time ...) dropped at any depth, numpy values as lists: two
    runs of the same configuration give equal results.

    Parameters
    ----------
    value : any
        A mapping of attrs, a list, a JSON string or a scalar.
    volatile : collection of str
        The keys that legitimately differ between two runs.

    Returns
    -------
    any
        Plain Python values, comparable with ``==``.

    Examples
    --------
    >>> steady_attrs({"seed": 1, "created_utc": "now", "config": '{"wall_time_s": 2, "n": 3}'},
    ...              {"created_utc", "wall_time_s"})
    {'seed': 1, 'config': {'n': 3}}
    """
    if isinstance(value, str) and value[:1] in "{[":
        try:
            value = json.loads(value)
        except ValueError:
            return value
    if isinstance(value, dict):
        return {k: steady_attrs(v, volatile) for k, v in value.items() if k not in volatile}
    if isinstance(value, list):
        return [steady_attrs(v, volatile) for v in value]
    return value.tolist() if hasattr(value, "tolist") else value
