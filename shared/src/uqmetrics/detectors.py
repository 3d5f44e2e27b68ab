"""Out-of-distribution detectors: :class:`Detector` and the :data:`DETECTORS` registry.

A detector turns what a network left in its cache into an uncertainty ``u`` per sample (higher =
more likely out of distribution), which the ``ood`` metrics of :mod:`uqmetrics.ood` then score.
It is numpy only and never holds the network: it declares what it reads (:data:`NEEDS`), so a
protocol can check the caches before any work and score any zoo from stored outputs. A detector
that must fit (class means, a covariance, a threshold) fits on in-distribution data only; no
detector is tuned on out-of-distribution samples.

Detectors from installed packages join through the ``uqmetrics.detectors`` entry-point group
(:meth:`uqmetrics.registry.Registry.load_plugins`); :func:`get_detector` and
:func:`list_detectors` load them.

Examples
--------
>>> import numpy as np
>>> u = get_detector("msp").score({"logits": np.array([[4.0, 0.0], [0.0, 0.0]])})
>>> bool(u[0] < u[1])
True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .registry import Registry

__all__ = ["DETECTORS", "NEEDS", "Detector", "get_detector", "list_detectors"]

#: What a detector may read, each an array of a cache (or of the in-distribution fit set):
#: ``logits`` (sample, class) of one network or pass; ``members`` (member, sample, class), the
#: logits of several members, passes or posterior samples; ``embedding`` (sample, feature), the
#: features before the classifier; ``head`` the classifier's ``head_weight`` (class, feature) and
#: ``head_bias`` (class,); ``fit`` the same inputs on in-distribution training or validation
#: data, for detectors that fit.
NEEDS = ("logits", "members", "embedding", "head", "fit")


@dataclass(frozen=True)
class Detector:
    """One out-of-distribution detector.

    Attributes
    ----------
    name, description : str
        Registered name and one line (CLI help).
    needs : frozenset of str
        A subset of :data:`NEEDS`: the inputs :meth:`score` reads.
    func : callable
        ``func(inputs, fit) -> u``: ``inputs`` maps each need (but ``fit``) to its array of
        the scored samples; ``fit`` is the same mapping on in-distribution data, or None for a
        detector that does not fit. Returns ``u``, shape (sample,), higher = more likely out of
        distribution.
    reference : str
        The paper that defines it (authors, year, title).
    """

    name: str
    description: str
    needs: frozenset[str]
    func: Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray] | None], np.ndarray]
    reference: str = ""

    def __post_init__(self) -> None:
        unknown = set(self.needs) - set(NEEDS)
        if unknown:
            raise ValueError(f"detector {self.name!r}: unknown needs {sorted(unknown)}; "
                             f"valid: {', '.join(NEEDS)}")
        if not set(self.needs) - {"fit", "head"}:
            raise ValueError(f"detector {self.name!r} must read the scored samples: needs one "
                             f"of logits, members, embedding; got {sorted(self.needs)}")
        object.__setattr__(self, "needs", frozenset(self.needs))

    def score(self, inputs: Mapping[str, Any], fit: Mapping[str, Any] | None = None
              ) -> np.ndarray:
        """The uncertainty of each sample, shape (sample,).

        Parameters
        ----------
        inputs : mapping
            Each need of the detector (but ``fit``) -> its array for the scored samples.
        fit : mapping, optional
            The same on in-distribution data (required when ``"fit"`` is a need).

        Raises
        ------
        ValueError
            Naming the missing inputs, or a result of the wrong shape or with NaN.
        """
        missing = sorted((self.needs - {"fit"}) - set(inputs))
        if missing:
            raise ValueError(f"detector {self.name!r} needs {missing}; got {sorted(inputs)}")
        if "fit" in self.needs and fit is None:
            raise ValueError(f"detector {self.name!r} fits on in-distribution data: pass fit=")
        arrays = {k: np.asarray(v) for k, v in inputs.items()}
        u = np.asarray(self.func(arrays, fit), dtype=np.float64)
        n = arrays["members"].shape[1] if "members" in arrays else \
            next(iter(arrays.values())).shape[0]
        if u.shape != (n,) or np.isnan(u).any():
            raise ValueError(f"detector {self.name!r} returned shape {u.shape} "
                             f"{'with NaN ' if np.isnan(u).any() else ''}for {n} samples")
        return u


#: Registered detectors, name -> :class:`Detector` (plugins: entry-point group
#: ``uqmetrics.detectors``).
DETECTORS: Registry[Detector] = Registry("detector", group="uqmetrics.detectors",
                                         item_type=Detector)


def _msp(inputs: Mapping[str, np.ndarray], fit: Mapping[str, np.ndarray] | None) -> np.ndarray:
    z = inputs["logits"].astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    return -(p.max(axis=1) / p.sum(axis=1))


DETECTORS.register(Detector(
    "msp", "maximum softmax probability, negated (the baseline)", frozenset({"logits"}), _msp,
    reference="Hendrycks & Gimpel (2017), A baseline for detecting misclassified and "
              "out-of-distribution examples in neural networks"))


def get_detector(name: str) -> Detector:
    """The detector registered as ``name`` (plugins included); ``ValueError`` listing the
    names otherwise."""
    DETECTORS.load_plugins()
    return DETECTORS.lookup(name)


def list_detectors() -> list[str]:
    """Names of the registered detectors, plugins included."""
    DETECTORS.load_plugins()
    return DETECTORS.names()
