"""A registry of scalar metrics with their signature kind and invariance properties.

Like scikit-learn's ``test_common.py``, the generic property tests iterate this registry, so a
new metric is tested for every property it declares by registering it once::

    @register_metric("auroc", kind="selective", properties={"permutation_invariant",
                                                            "monotone_invariant"})
    def auroc_score(correct, confidence): ...

Kinds (the positional signature):

``"classification"``  ``f(labels (n,), probs (n, C)) -> float``
``"selective"``       ``f(correct (n,), confidence (n,)) -> float``
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

KINDS = ("classification", "selective")
PROPERTIES = ("permutation_invariant", "monotone_invariant", "proper_scoring_rule")


@dataclass(frozen=True)
class MetricSpec:
    name: str
    func: Callable
    kind: str
    properties: frozenset = field(default_factory=frozenset)
    greater_is_better: bool = True


METRICS: dict[str, MetricSpec] = {}


def register_metric(name: str, *, kind: str, properties=(), greater_is_better: bool | None = None):
    """Decorator registering a scalar metric under ``name``.

    ``greater_is_better`` defaults from the sklearn naming convention: ``*_score`` higher is
    better, ``*_loss``/``*_error`` lower is better.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    unknown = set(properties) - set(PROPERTIES)
    if unknown:
        raise ValueError(f"unknown properties {sorted(unknown)}; valid: {PROPERTIES}")

    def deco(func):
        gib = greater_is_better
        if gib is None:
            gib = not func.__name__.endswith(("_loss", "_error"))
        if name in METRICS:
            raise ValueError(f"metric {name!r} is already registered")
        METRICS[name] = MetricSpec(name, func, kind, frozenset(properties), gib)
        return func

    return deco


def list_metrics(kind: str | None = None, prop: str | None = None) -> list[str]:
    """Names of registered metrics, optionally filtered by kind and property."""
    return sorted(
        n for n, s in METRICS.items()
        if (kind is None or s.kind == kind) and (prop is None or prop in s.properties)
    )


def get_metric(name: str) -> MetricSpec:
    try:
        return METRICS[name]
    except KeyError:
        raise ValueError(f"unknown metric {name!r}; registered: {sorted(METRICS)}") from None
