"""Registries: one :class:`Registry` class for everything pluggable, and the metric registry.

:class:`Registry` is the one name → item registry of the project: uqmetrics' metrics, uqreg's
tasks/methods/heads/samplers and uqvision's model sources, pass modes, TTA policies, … all use
it, and every CLI builds its choices and help from one (``registry.names()``,
``registry.describe()``).

The metric registry holds scalar metrics with their signature kind and invariance properties.

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
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(dict, Generic[T]):
    """A dict of named items that refuses duplicates and answers an unknown name with the valid
    ones (a ``ValueError`` naming the argument, the bad value and the choices).

    Parameters
    ----------
    kind : str
        What the items are, for messages ("task", "method", "pass mode").
    sort : bool
        List names sorted (else in registration order).

    Examples
    --------
    >>> r = Registry("colour")
    >>> r.add("red", 1)
    1
    >>> r.lookup("red")
    1
    >>> r.lookup("blue")
    Traceback (most recent call last):
    ...
    ValueError: unknown colour 'blue'; valid colours: red
    """

    def __init__(self, kind: str, *, sort: bool = False):
        super().__init__()
        self.kind = kind
        self.sort = sort

    def add(self, name: str, item: T) -> T:
        """Register ``item`` under ``name`` (returns it, so it can be used inline)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if name in self:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self[name] = item
        return item

    def register(self, item: T | None = None, *, name: str | None = None):
        """Register ``item`` under ``name`` or ``item.name``; without ``item``, a decorator.

        ``registry.register(obj)`` (an object with a ``name``), ``registry.register(obj,
        name="x")`` or ``@registry.register(name="x")`` over a function or class.
        """
        if item is None:
            if name is None:
                raise ValueError("register() as a decorator needs name=")
            return lambda obj: self.add(name, obj)
        return self.add(name if name is not None else item.name, item)

    def lookup(self, name: str) -> T:
        """The item called ``name``; ``ValueError`` listing the valid names otherwise."""
        try:
            return self[name]
        except (KeyError, TypeError):
            raise ValueError(
                f"unknown {self.kind} {name!r}; valid {self.kind}s: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        """Registered names (sorted, or in registration order)."""
        return sorted(self) if self.sort else list(self)

    def items_ordered(self) -> Iterator[tuple[str, T]]:
        """``(name, item)`` pairs in :meth:`names` order."""
        return ((n, self[n]) for n in self.names())

    def describe(self) -> str:
        """One line per item, ``name: first line of its description or docstring`` (CLI help)."""
        lines = []
        for n, item in self.items_ordered():
            text = getattr(item, "description", None) or (getattr(item, "__doc__", None) or "")
            lines.append(f"{n}: {text.strip().splitlines()[0] if text.strip() else ''}")
        return "\n".join(lines)

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
