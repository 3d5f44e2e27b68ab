"""Registries: one :class:`Registry` class for everything pluggable, and the metric registry.

:class:`Registry` is the one name → item registry of the project: uqmetrics' metrics, uqreg's
tasks/methods/heads/samplers and uqvision's model sources, pass modes, TTA policies, … all use
it, and every CLI builds its choices and help from one (``registry.names()``,
``registry.describe()``).

The metric registry holds scalar metrics with their signature kind and invariance properties.

Plugins: a registry with an entry-point ``group`` also takes items from installed packages
(:meth:`Registry.load_plugins`): a package declares, in its ``pyproject.toml``, ::

    [project.entry-points."uqvision.protocols"]
    toy = "my_package.toy:PROTOCOL"

and the object the entry point names is registered under the entry point's name. A plugin that
fails to load (an import error, an object of the wrong type, a name already taken, a
``sys.exit`` while it loads) is reported in one line naming it (the ``uqmetrics.plugins``
logger) and recorded in :attr:`Registry.broken`; it never stops the program.

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

import importlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from typing import Generic, TypeVar

T = TypeVar("T")

#: Where plugin problems are reported (one warning line per plugin that did not load).
PLUGIN_LOG = logging.getLogger("uqmetrics.plugins")


class Registry(dict, Generic[T]):
    """A dict of named items that refuses duplicates and answers an unknown name with the valid
    ones (a ``ValueError`` naming the argument, the bad value and the choices).

    Parameters
    ----------
    kind : str
        What the items are, for messages ("task", "method", "pass mode").
    sort : bool
        List names sorted (else in registration order).
    group : str, optional
        The entry-point group installed packages register items in (:meth:`load_plugins`),
        e.g. ``"uqvision.protocols"``.
    item_type : type or tuple of types, optional
        What a plugin's item must be an instance of (checked by :meth:`load_plugins`; built-in
        items are the registering module's responsibility).
    fill : str, optional
        ``"module:function"``: what registers the entries that other modules bring (a
        package's registries, filled when it is used rather than when it is imported), called
        once, the first time a name the registry does not hold is asked for (:meth:`lookup`,
        ``in``, ``get``).

    Attributes
    ----------
    plugins : dict
        Name -> ``"module:attr"`` of each item registered from an entry point.
    broken : dict
        Name -> one line saying why that entry point was not registered.

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

    def __init__(self, kind: str, *, sort: bool = False, group: str | None = None,
                 item_type: type | tuple[type, ...] | None = None, fill: str | None = None):
        super().__init__()
        self.kind = kind
        self.sort = sort
        self.group = group
        self.item_type = item_type
        self.fill = fill
        self.plugins: dict[str, str] = {}
        self.broken: dict[str, str] = {}

    def add(self, name: str, item: T) -> T:
        """Register ``item`` under ``name`` (returns it, so it can be used inline)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if dict.__contains__(self, name):
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self[name] = item
        return item

    def _fill_for(self, name: object) -> None:
        """Call :attr:`fill` (once) if ``name`` is not registered."""
        if self.fill is not None and isinstance(name, str) and not dict.__contains__(self, name):
            module, _, function = self.fill.partition(":")
            self.fill = None  # once
            getattr(importlib.import_module(module), function)()

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is registered (after :attr:`fill`, once, for a name not held)."""
        self._fill_for(name)
        return dict.__contains__(self, name)

    def get(self, name, default=None):
        """The item called ``name``, else ``default`` (after :attr:`fill`, as ``in``)."""
        self._fill_for(name)
        return dict.get(self, name, default)

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
            self._fill_for(name)
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

    def load_plugins(self, entry_points: metadata.EntryPoints | None = None) -> dict[str, str]:
        """Register the items of the installed packages' entry points of :attr:`group`.

        Each entry point ``name = "module:attr"`` is loaded and its object registered under
        ``name``. One that cannot be (its import or attribute fails, the object is not an
        :attr:`item_type`, the name is taken, it calls ``sys.exit``) is logged in one line
        naming it and the reason, recorded in :attr:`broken`, and skipped; nothing is raised
        (a ``KeyboardInterrupt`` while loading still propagates). Entry points already
        registered (or already found broken) are not loaded again, so calling this twice is
        harmless.

        Parameters
        ----------
        entry_points : importlib.metadata.EntryPoints, optional
            Every installed entry point (``importlib.metadata.entry_points()``), when the
            caller loads several registries: the installed packages are then listed once.

        Returns
        -------
        dict
            Name -> reason of every entry point of the group that is not registered.
        """
        if self.group is None:
            return {}
        found = (metadata.entry_points() if entry_points is None else entry_points).select(
            group=self.group)
        for ep in sorted(found, key=lambda e: e.name):
            if self.plugins.get(ep.name) == ep.value or ep.name in self.broken:
                continue
            try:
                item = ep.load()
                if self.item_type is not None and not isinstance(item, self.item_type):
                    raise TypeError(f"{ep.value} is of type {type(item).__name__}, not "
                                    f"{_type_names(self.item_type)}")
                if dict.__contains__(self, ep.name):
                    raise ValueError(f"{self.kind} {ep.name!r} is already registered")
                self.add(ep.name, item)
            except (Exception, SystemExit) as err:  # noqa: BLE001  (a plugin never stops it)
                why = (f"SystemExit: loading it called sys.exit({err.code!r})"
                       if isinstance(err, SystemExit) else
                       " ".join(f"{type(err).__name__}: {err}".split()))
                self.broken[ep.name] = why
                dist = getattr(ep.dist, "name", None)
                PLUGIN_LOG.warning("%s plugin %r (%s = %s%s) not loaded: %s", self.kind,
                                   ep.name, self.group, ep.value,
                                   f", package {dist}" if dist else "", why)
            else:
                self.plugins[ep.name] = ep.value
        return dict(self.broken)

    def describe(self) -> str:
        """One line per item, ``name: first line of its description or docstring`` (CLI help)."""
        lines = []
        for n, item in self.items_ordered():
            text = getattr(item, "description", None) or (getattr(item, "__doc__", None) or "")
            lines.append(f"{n}: {text.strip().splitlines()[0] if text.strip() else ''}")
        return "\n".join(lines)


def _type_names(types: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))


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
#: ``temperature_invariant``: a classification metric that depends on each row's probabilities
#: only through the order of its classes, so softmax(z / T) scores as softmax(z) for every
#: T > 0 (top-k accuracy); a temperature-scaled row takes its value from the unscaled one
#: (:func:`uqmetrics.temperature_scaled_metrics`), so probabilities that underflow to 0 at a
#: small T never reorder the classes.
PROPERTIES = ("permutation_invariant", "monotone_invariant", "proper_scoring_rule",
              "temperature_invariant")


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
    from . import import_metric_modules  # the package face of the metrics layer, not uqmetrics'

    import_metric_modules()


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
