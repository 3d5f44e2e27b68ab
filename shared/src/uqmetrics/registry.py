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

Kinds (the positional signature, :data:`METRIC_KINDS`):

``"classification"``  ``f(labels (n,), probs (n, C)) -> float``
``"selective"``       ``f(correct (n,), confidence (n,)) -> float``
``"regression"``      ``f(y (n,), mean (n,), std (n,)) -> float``
``"ood"``             ``f(u_in (n_in,), u_out (n_out,)) -> float``
``"retrieval"``       ``f(embeddings (n, d), labels (n,), uncertainty (n,)) -> float``

Families (what is measured, :data:`FAMILIES`): classification, calibration, selective,
regression, ood, retrieval. :func:`uqmetrics.score_metrics` scores any classification or
selective metric from ``(labels, probs, confidence)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

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



# --------------------------------------------------------------------------------------------
# The metric registry


@dataclass(frozen=True)
class MetricKind:
    """A metric signature: what a registered metric of this kind is called with."""

    name: str
    signature: str
    description: str


#: Metric kinds: name -> :class:`MetricKind` (the positional signature of its metrics).
METRIC_KINDS: Registry[MetricKind] = Registry("metric kind")
for _kind in (
    MetricKind("classification", "f(labels (n,), probs (n, C)) -> float",
               "integer labels in [0, C) and class probabilities, rows summing to 1"),
    MetricKind("selective", "f(correct (n,), confidence (n,)) -> float",
               "whether each prediction is right and its confidence kappa (higher = more "
               "confident)"),
    MetricKind("regression", "f(y (n,), mean (n,), std (n,)) -> float",
               "targets and Gaussian predictive means and standard deviations (std > 0)"),
    MetricKind("ood", "f(u_in (n_in,), u_out (n_out,)) -> float",
               "uncertainties of in-domain and out-domain samples (higher = more uncertain)"),
    MetricKind("retrieval", "f(embeddings (n, d), labels (n,), uncertainty (n,)) -> float",
               "embeddings, their classes and their uncertainties; metrics of the embeddings "
               "alone ignore the uncertainty"),
):
    METRIC_KINDS.register(_kind)
del _kind

#: Names of the metric kinds, in registration order.
KINDS: tuple[str, ...] = tuple(METRIC_KINDS.names())
#: Metric families (what a metric measures); a family may span kinds (``confidence_ece`` is a
#: selective-kind calibration metric).
FAMILIES = ("classification", "calibration", "selective", "regression", "ood", "retrieval")
#: Properties a metric may declare; :mod:`test_common` checks each for every metric declaring it.
#: ``permutation_invariant``: the value does not depend on the order of the samples.
#: ``monotone_invariant``: unchanged by a strictly increasing transform of the confidence or
#: uncertainty argument (selective, ood, retrieval kinds).
#: ``proper_scoring_rule``: the expected score under the true distribution is best for the true
#: distribution (classification and regression kinds).
PROPERTIES = ("permutation_invariant", "monotone_invariant", "proper_scoring_rule")


@dataclass(frozen=True)
class MetricSpec:
    """A registered scalar metric: its function, kind (signature), family and properties."""

    name: str
    func: Callable
    kind: str
    properties: frozenset = field(default_factory=frozenset)
    greater_is_better: bool = True
    family: str = ""

    @property
    def description(self) -> str:
        """First line of the metric function's docstring (for CLI help)."""
        doc = (self.func.__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""


#: Registered metrics: name -> :class:`MetricSpec` (a :class:`Registry`, sorted by name).
METRICS: Registry[MetricSpec] = Registry("metric", sort=True)


def register_metric(name: str, *, kind: str, properties=(), greater_is_better: bool | None = None,
                    family: str | None = None):
    """Decorator registering a scalar metric under ``name``.

    Parameters
    ----------
    name : str
        Registered name; it must have an entry in :data:`uqmetrics.CONVENTIONS`.
    kind : str
        One of :data:`KINDS`, the positional signature (see :data:`METRIC_KINDS`).
    properties : iterable of str
        A subset of :data:`PROPERTIES`.
    greater_is_better : bool, optional
        Defaults from the sklearn naming convention of the function: ``*_score`` higher is
        better, ``*_loss``/``*_error`` lower is better.
    family : str, optional
        One of :data:`FAMILIES`; defaults to ``kind``.
    """
    METRIC_KINDS.lookup(kind)
    unknown = set(properties) - set(PROPERTIES)
    if unknown:
        raise ValueError(f"unknown properties {sorted(unknown)}; valid: {PROPERTIES}")
    family = kind if family is None else family
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")

    def deco(func):
        gib = greater_is_better
        if gib is None:
            gib = not func.__name__.endswith(("_loss", "_error"))
        METRICS.add(name, MetricSpec(name, func, kind, frozenset(properties), gib, family))
        return func

    return deco


def _register_all() -> None:
    """Import the metric modules (:mod:`uqmetrics` imports them on first use), which register
    every metric."""
    import uqmetrics

    uqmetrics._load_metrics()


def list_metrics(kind: str | None = None, prop: str | None = None,
                 family: str | None = None) -> list[str]:
    """Names of registered metrics, optionally filtered by kind, property and family."""
    _register_all()
    return [
        n for n, s in METRICS.items_ordered()
        if (kind is None or s.kind == kind) and (prop is None or prop in s.properties)
        and (family is None or s.family == family)
    ]


def get_metric(name: str) -> MetricSpec:
    """The :class:`MetricSpec` registered as ``name``; ``ValueError`` listing the names."""
    _register_all()
    return METRICS.lookup(name)
