"""The one scoring path: any registered metric from ``(labels, probs, confidence)``.

Every protocol that scores predictions — temperature scaling (:func:`uqmetrics.
temperature_scaled_metrics`), ensemble-size curves (:func:`uqmetrics.ensemble_size_curve`) and
the uqvision protocols built on them — evaluates its metrics through :func:`score_metrics`:

- a ``"classification"`` metric is called as ``f(labels, probs)``;
- a ``"selective"`` metric as ``f(correct, kappa)`` with ``correct = argmax(probs) == labels``
  (the first maximum on ties) and ``kappa = confidence(probs)``.

So a calibration protocol or an ensemble size is chosen by the caller, and the metric names
alone decide what is computed. Loops over many folds or prefixes build a :class:`Scorer` once
(names and κ resolved and validated) and call it per cell; :func:`score_metrics` is the same
for one set of predictions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._validation import float_array, labels_probs
from .confidence import SAMPLE_CONFIDENCE_FUNCTIONS, get_confidence_function
from .conventions import CONVENTIONS
from .registry import MetricSpec, get_metric

__all__ = ["SCORABLE_KINDS", "Scorer", "score_metrics"]

#: Metric kinds :func:`score_metrics` can evaluate from ``(labels, probs, confidence)``.
SCORABLE_KINDS = ("classification", "selective")

Confidence = str | Callable[[np.ndarray], Any]


def _resolve_metrics(metrics: Sequence[str]) -> tuple[MetricSpec, ...]:
    """The registered specs of ``metrics``: a non-empty sequence of distinct scorable names."""
    if isinstance(metrics, str) or not isinstance(metrics, Sequence) or len(metrics) == 0:
        raise ValueError(f"metrics must be a non-empty sequence of metric names, got {metrics!r}")
    specs = tuple(get_metric(m) for m in metrics)
    for s in specs:
        if s.kind not in SCORABLE_KINDS:
            raise ValueError(
                f"metrics must be classification metrics f(labels, probs) or selective metrics "
                f"f(correct, confidence); {s.name!r} is {s.kind!r}"
            )
    if len({s.name for s in specs}) != len(specs):
        raise ValueError(f"metrics contains duplicates: {list(metrics)!r}")
    return specs


def _resolve_confidence(confidence: Confidence) -> Callable[[np.ndarray], Any]:
    """A confidence function ``probs (n, C) -> kappa (n,)``: a name or a callable."""
    if callable(confidence):
        return confidence
    if confidence in SAMPLE_CONFIDENCE_FUNCTIONS:
        raise ValueError(
            f"confidence {confidence!r} needs member probabilities (S, n, C); scoring sees the "
            "predictive distribution (n, C) only: pass a callable instead"
        )
    return get_confidence_function(confidence)


@dataclass(frozen=True)
class Scorer:
    """Metrics and confidence resolved once, for protocols that score many folds or prefixes.

    ``Scorer.build(metrics, confidence)`` validates the names (as :func:`score_metrics`);
    calling it on validated ``labels (n,)`` int and ``probs (n, C)`` float64 arrays returns
    ``{name: value}``.
    """

    specs: tuple[MetricSpec, ...]
    confidence: Confidence
    kappa_fn: Callable[[np.ndarray], Any]

    @classmethod
    def build(cls, metrics: Sequence[str], confidence: Confidence = "softmax_response") -> Scorer:
        return cls(_resolve_metrics(metrics), confidence, _resolve_confidence(confidence))

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    def __call__(self, labels: np.ndarray, probs: np.ndarray, *,
                 unscaled: Mapping[str, float] | None = None) -> dict[str, float]:
        """``{name: value}``; with ``unscaled`` (this scorer's values on the same samples before
        temperature scaling), each ``temperature_invariant`` metric takes its value from it."""
        out: dict[str, float] = {}
        correct = kappa = None
        for spec in self.specs:
            if unscaled is not None and "temperature_invariant" in spec.properties:
                out[spec.name] = unscaled[spec.name]
                continue
            if spec.kind == "classification":
                out[spec.name] = float(spec.func(labels, probs))
                continue
            if kappa is None:
                correct = np.argmax(probs, axis=1) == labels
                kappa = float_array(self.kappa_fn(probs), "confidence(probs)", 1, "(n_samples,)")
                if kappa.shape[0] != labels.shape[0]:
                    raise ValueError(f"confidence(probs) must have shape ({labels.shape[0]},), "
                                     f"got shape {kappa.shape}")
            out[spec.name] = float(spec.func(correct, kappa))
        return out

    def metric_attrs(self, spec: MetricSpec) -> dict[str, Any]:
        """Attrs of a result variable holding ``spec``'s values."""
        return {"greater_is_better": int(spec.greater_is_better),
                "convention": CONVENTIONS[spec.name]}

    @property
    def attrs(self) -> dict[str, str]:
        """Result attrs naming κ (``{"confidence": name}``) when a selective metric is scored."""
        if not any(s.kind == "selective" for s in self.specs):
            return {}
        c = self.confidence
        return {"confidence": c if isinstance(c, str) else getattr(c, "__name__", repr(c))}


def score_metrics(labels: Any, probs: Any, *, metrics: Sequence[str],
                  confidence: Confidence = "softmax_response",
                  unscaled: Mapping[str, float] | None = None) -> dict[str, float]:
    """Evaluate registered classification and selective metrics on one set of predictions.

    Parameters
    ----------
    labels : array_like of int, shape (n,)
        True classes in ``[0, C)``.
    probs : array_like of float, shape (n, C)
        Predictive class probabilities, rows summing to 1.
    metrics : sequence of str
        Registered metric names of kind ``"classification"`` or ``"selective"``
        (:func:`uqmetrics.metrics.registry.list_metrics`).
    confidence : str or callable, default "softmax_response"
        The confidence κ of the selective metrics: a name in
        :data:`uqmetrics.CONFIDENCE_FUNCTIONS` (not one needing members), or a function
        ``probs (n, C) -> (n,)`` (higher = more confident).
    unscaled : mapping of str to float, optional
        When ``probs`` are temperature-scaled: the values of these metrics on the unscaled
        probabilities of the same samples. Each metric of property ``temperature_invariant``
        (top-k accuracy) takes its value from it, so temperature scaling never changes it,
        even where a small temperature underflows probabilities to 0.

    Returns
    -------
    dict of str to float
        ``{name: value}`` in the order of ``metrics``.

    Notes
    -----
    Classification metrics: ``f(labels, probs)``. Selective metrics: ``f(correct, κ)`` with
    ``correct_i = 1[argmax_c p_ic = y_i]`` (first maximum on ties) and ``κ = confidence(p)``
    (docs/conventions.md#s-2).

    Examples
    --------
    >>> p = [[0.9, 0.1], [0.4, 0.6], [0.7, 0.3], [0.2, 0.8]]
    >>> score_metrics([0, 1, 1, 1], p, metrics=("accuracy", "auroc"))
    {'accuracy': 0.75, 'auroc': 0.6666666666666666}
    """
    scorer = Scorer.build(metrics, confidence)
    return scorer(*labels_probs(labels, probs), unscaled=unscaled)
