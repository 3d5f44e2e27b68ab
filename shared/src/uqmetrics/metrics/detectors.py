"""Out-of-distribution detectors: :class:`Detector` and the :data:`DETECTORS` registry.

A detector turns what a network left in its cache into an uncertainty ``u`` per sample (higher =
more likely out of distribution), which the ``ood`` metrics of :mod:`uqmetrics.metrics.ood` then score.
It is numpy only and never holds the network: it declares what it reads (:data:`NEEDS`), so a
protocol can check the caches before any work and score any zoo from stored outputs. A detector
that must fit (class means, a covariance, a threshold) fits on in-distribution data only; no
detector is tuned on out-of-distribution samples.

Registered (docs/conventions.md#s-4; each :attr:`Detector.reference` names its paper):

========================  ==================================  =========================
name                      u (higher = more OOD)               reads (``fit`` keys)
========================  ==================================  =========================
``msp``                   -max softmax                        logits
``maxlogit``              -max logit                          logits
``energy``                -T logsumexp(z / T), T = 1          logits
``entropy``               entropy of the softmax              logits
``gen``                   sum_top-M p^g (1 - p)^g             logits
``mahalanobis``           min_c squared Mahalanobis distance  embedding (embedding, labels)
``knn``                   distance to the k-th neighbour      embedding (embedding)
``vim``                   alpha ||residual|| - logsumexp(z)   embedding, head (embedding, head)
``react``                 energy of the clipped features      embedding, head (embedding)
``ensemble_entropy``      entropy of the mean softmax         members
``mutual_information``    H(mean p) - mean H(p)               members
``disagreement``          members off the ensemble's argmax   members
========================  ==================================  =========================

Fitting is separate from scoring: :meth:`Detector.fitted` fits once and returns a scorer for any
number of sets (``scorer = get_detector("knn").fitted(fit); scorer(inputs_a); scorer(inputs_b)``);
:meth:`Detector.score` fits and scores in one call. Hyper-parameters have the defaults of the
papers and OpenOOD v1.5 (:attr:`Detector.params`); :meth:`Detector.with_params` gives a copy with
others (``get_detector("knn").with_params(k=200)``). :attr:`Detector.grid` holds OpenOOD v1.5's
search grid of each hyper-parameter, and :func:`search_params` its automatic parameter search
(the grid point of the highest AUROC on validation ID and OOD data).

A predictor of several members or passes (a deep ensemble, MC-dropout passes) is scored by the
detector's :attr:`Detector.ensemble` rule (:data:`ENSEMBLE_RULES`): ``msp``, ``entropy`` and
``gen``, functions of the softmax alone, score the predictive p̄ (the mean of the members'
softmaxes, docs/conventions.md#s-3); ``maxlogit`` and ``energy`` the mean of the members'
logits, as OpenOOD v1.5's ensemble postprocessor; the feature detectors the mean of the members'
``u``, each member fitted on its own features (:meth:`Detector.ensemble_logits`).

KNN searches its fit features with the backend of its ``backend`` parameter
(:data:`KNN_BACKENDS`): ``auto`` (the default) is faiss when it is importable (the extra
``uqmetrics[faiss]``), else the same float32 search in numpy; ``numpy`` is the float64
reference; ``torch`` / ``torch:cuda`` search with torch. The
float32 searches (faiss, torch) only find candidates: the k-th similarity is recomputed exactly,
so their scores are the same bits whatever the backend or the blocks of queries, and differ from
numpy's float64 by one float32 rounding of each unit vector (docs/conventions.md#s-4). ViM runs
its feature products in float32 BLAS, float64 where accuracy needs it (:func:`_vim_fit`).

Mahalanobis and ViM have a ``backend`` parameter too (:data:`FEATURE_BACKENDS`, parsed as KNN's):
``auto`` (the default) is ``numpy``, whose results are those above, bit for bit; ``torch`` fits
and scores with torch on the CPU, ``torch:<device>`` (``torch:cuda``) on that device, and
returns numpy scores. The torch backends round the fit features once to float32 and move them
to the device whole; their products are float32 (IEEE: no TF32 during the call): the
covariance's X^T X per block of residuals (Mahalanobis: x - mu_y; ViM: x - mean, each formed in
float64 and then rounded) and the scoring's one product per block (Mahalanobis: of x - m, m the
fit mean rounded to float32, with [P, P (mu_c - m)^T]; ViM: of x with [W^T, residual space]).
float64 where accuracy needs it: the class means and the mean, the sum of the blocks' products,
the pseudo-inverse and the eigendecomposition (on one CPU thread: LAPACK's threaded result
changes with the thread count), ViM's origin and alpha, and every combination after the
products (the quadratic form's sum and the minimum; the logsumexp and the residual norm). A
scored block is always the same number of rows (:func:`_torch_rows`, the last one padded), so
a sample's score does not depend on the rows scored with it; it depends on the device (its
BLAS), within float32 rounding of numpy's, and ranks the samples alike
(packages/uqvision/tests/test_detectors_torch_backends.py).

Detectors from installed packages join through the ``uqmetrics.detectors`` entry-point group
(:meth:`uqmetrics.metrics.registry.Registry.load_plugins`); :func:`get_detector` and
:func:`list_detectors` load them.

Examples
--------
>>> import numpy as np
>>> u = get_detector("msp").score({"logits": np.array([[4.0, 0.0], [0.0, 0.0]])})
>>> bool(u[0] < u[1])
True
>>> rng = np.random.default_rng(0)
>>> fit = {"embedding": rng.normal(size=(100, 8)), "labels": rng.integers(0, 3, 100)}
>>> scorer = get_detector("mahalanobis").fitted(fit)
>>> scorer({"embedding": rng.normal(size=(5, 8))}).shape
(5,)
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .registry import Registry

__all__ = [
    "DETECTORS",
    "ENSEMBLE_RULES",
    "FEATURE_BACKENDS",
    "FIT_KEYS",
    "KNN_BACKENDS",
    "NEEDS",
    "NEED_KEYS",
    "Detector",
    "get_detector",
    "list_detectors",
    "search_params",
    "vim_dimension",
]

#: What a detector may read, each an array of a cache (or of the in-distribution fit set):
#: ``logits`` (sample, class) of one network or pass; ``members`` (member, sample, class), the
#: logits of several members, passes or posterior samples; ``embedding`` (sample, feature), the
#: features before the classifier (penultimate layer, after pooling); ``head`` the classifier's
#: ``head_weight`` (class, feature) and ``head_bias`` (class,), as the cache variables of those
#: names (logits = embedding @ head_weight.T + head_bias); ``fit`` the in-distribution fit data
#: (:data:`FIT_KEYS`), for detectors that fit.
NEEDS = ("logits", "members", "embedding", "head", "fit")

#: The keys of the ``inputs`` mapping that each need (but ``fit``) stands for.
NEED_KEYS: dict[str, tuple[str, ...]] = {
    "logits": ("logits",),
    "members": ("members",),
    "embedding": ("embedding",),
    "head": ("head_weight", "head_bias"),
}

#: The keys a ``fit`` mapping may hold (a detector reads those in :attr:`Detector.fit_keys`):
#: ``embedding`` (n_fit, feature) features of in-distribution training (or validation) images;
#: ``labels`` (n_fit,) their integer classes; ``head_weight``, ``head_bias`` the classifier (the
#: same as the scored network's; :meth:`Detector.score` copies them from ``inputs`` when the fit
#: mapping lacks them).
FIT_KEYS = ("embedding", "labels", "head_weight", "head_bias")

#: How a detector scores a predictor of several members or passes (:attr:`Detector.ensemble`):
#: rule -> what it is handed. ``predictive``: a detector that reads only ``logits`` and is a
#: function of their softmax alone is handed log p̄, p̄ the mean over the members of each
#: member's softmax averaged over its passes (docs/conventions.md#s-3), so that its score is the
#: predictive's (MSP = max p̄); ``mean_logits``: a detector that reads only ``logits`` is handed
#: the mean over the members of each member's pass-mean logits (OpenOOD v1.5's ensemble and
#: MC-dropout postprocessors: ``logits_mean``); ``mean_u``: each member is scored on its own
#: inputs (a fitting detector fitted on its own fit data) and the members' ``u`` are averaged;
#: ``members``: the detector reads every member's logits itself (need ``members``).
ENSEMBLE_RULES = ("predictive", "mean_logits", "mean_u", "members")

# numpy only, no scipy: uqvision imports this module (its plugins) on every command, and its
# train and predict commands import no scipy (packages/uqvision/tests/test_import.py).


def _logsumexp(z: np.ndarray, axis: int) -> np.ndarray:
    m = np.max(z, axis=axis, keepdims=True)
    return np.squeeze(m, axis=axis) + np.log(np.sum(np.exp(z - m), axis=axis))


def _log_softmax(z: np.ndarray, axis: int) -> np.ndarray:
    return z - np.expand_dims(_logsumexp(z, axis), axis)


def _softmax(z: np.ndarray, axis: int) -> np.ndarray:
    return np.exp(_log_softmax(z, axis))


#: Rows per block where a detector computes (rows x fit size) or (rows x classes) arrays.
_CHUNK = 4096


@dataclass(frozen=True)
class Detector:
    """One out-of-distribution detector.

    Attributes
    ----------
    name, description : str
        Registered name and one line (CLI help).
    needs : frozenset of str
        A subset of :data:`NEEDS`: the inputs :meth:`score` reads (:data:`NEED_KEYS` names the
        keys of each).
    func : callable
        ``func(inputs, state, **params) -> u``: ``inputs`` maps the keys of each need (but
        ``fit``) to its array for the scored samples (float64); ``state`` is what
        :attr:`fit_func` returned, or, without one, the ``fit`` mapping itself (None for a
        detector that does not fit). Returns ``u``, shape (sample,), higher = more likely out
        of distribution.
    reference : str
        The paper that defines it (authors, year, title).
    fit_func : callable, optional
        ``fit_func(fit, **params) -> state``: fits on the in-distribution ``fit`` mapping
        (numpy arrays, keys :attr:`fit_keys`), once per :meth:`fitted`.
    fit_keys : frozenset of str
        The keys of the ``fit`` mapping it reads (a subset of :data:`FIT_KEYS`); needs ``fit``.
    params : mapping
        Hyper-parameter name -> value, passed to :attr:`fit_func` and :attr:`func` as keywords
        (:meth:`with_params` changes them).
    grid : mapping
        Hyper-parameter name -> the values :func:`search_params` tries (OpenOOD v1.5's
        ``postprocessor_sweep``); names of :attr:`params`, each a non-empty tuple. Empty: the
        detector is never tuned.
    ensemble : str, optional
        How a predictor of several members or passes is scored, one of
        :data:`ENSEMBLE_RULES`; ``None``: ``members`` for a detector that reads ``members``,
        ``mean_logits`` for one that reads only ``logits``, else ``mean_u``.
    """

    name: str
    description: str
    needs: frozenset[str]
    func: Callable[..., np.ndarray]
    reference: str = ""
    fit_func: Callable[..., Any] | None = None
    fit_keys: frozenset[str] = frozenset()
    params: Mapping[str, Any] = field(default_factory=dict)
    grid: Mapping[str, tuple] = field(default_factory=dict)
    ensemble: str | None = None

    def __post_init__(self) -> None:
        unknown = set(self.needs) - set(NEEDS)
        if unknown:
            raise ValueError(f"detector {self.name!r}: unknown needs {sorted(unknown)}; "
                             f"valid: {', '.join(NEEDS)}")
        if not set(self.needs) - {"fit", "head"}:
            raise ValueError(f"detector {self.name!r} must read the scored samples: needs one "
                             f"of logits, members, embedding; got {sorted(self.needs)}")
        unknown = set(self.fit_keys) - set(FIT_KEYS)
        if unknown:
            raise ValueError(f"detector {self.name!r}: unknown fit keys {sorted(unknown)}; "
                             f"valid: {', '.join(FIT_KEYS)}")
        if (self.fit_keys or self.fit_func is not None) and "fit" not in self.needs:
            raise ValueError(f"detector {self.name!r} fits: add 'fit' to its needs")
        object.__setattr__(self, "needs", frozenset(self.needs))
        object.__setattr__(self, "fit_keys", frozenset(self.fit_keys))
        object.__setattr__(self, "params", dict(self.params))
        grid = {k: tuple(v) for k, v in dict(self.grid).items()}
        if set(grid) - set(self.params) or not all(grid.values()):
            raise ValueError(f"detector {self.name!r}: grid {grid} must give values of its "
                             f"parameters {sorted(self.params)}, at least one each")
        object.__setattr__(self, "grid", grid)
        only_logits = self.needs == {"logits"}
        rule = self.ensemble or ("members" if "members" in self.needs else
                                 "mean_logits" if only_logits else "mean_u")
        fits = {"predictive": only_logits, "mean_logits": only_logits,
                "mean_u": "members" not in self.needs, "members": "members" in self.needs}
        if not fits.get(rule, False):
            raise ValueError(f"detector {self.name!r}: ensemble rule {rule!r} does not fit its "
                             f"needs {sorted(self.needs)} (rules: {', '.join(ENSEMBLE_RULES)}; "
                             "predictive and mean_logits read only logits)")
        object.__setattr__(self, "ensemble", rule)

    def with_params(self, **params: Any) -> Detector:
        """A copy with other hyper-parameters (only names of :attr:`params`).

        >>> get_detector("knn").with_params(k=5).params
        {'k': 5, 'backend': 'auto'}
        """
        unknown = set(params) - set(self.params)
        if unknown:
            raise ValueError(f"detector {self.name!r} has no parameters {sorted(unknown)}; "
                             f"its parameters: {sorted(self.params) or 'none'}")
        return dataclasses.replace(self, params={**self.params, **params})

    def ensemble_logits(self, members: Sequence[Any]) -> np.ndarray:
        """The logits a detector of rule ``predictive`` or ``mean_logits`` scores a predictor
        on (:data:`ENSEMBLE_RULES`).

        Parameters
        ----------
        members : sequence of array_like
            Each member's logits, (pass, sample, class) or (sample, class) for one pass; every
            member weighted equally, whatever its number of passes.

        Returns
        -------
        numpy.ndarray
            (sample, class): ``predictive``: log p̄, p̄ = mean over members of the mean over
            passes of the softmax; ``mean_logits``: the mean over members of the pass-mean
            logits. For one member of one pass, its logits unchanged.

        Raises
        ------
        ValueError
            A detector of another rule, or members of other shapes.

        Examples
        --------
        >>> a, b = np.array([[4.0, 0.0]]), np.array([[0.0, 0.0]])
        >>> p = np.exp(get_detector("msp").ensemble_logits([a, b]))  # the mean softmax
        >>> bool(np.allclose(p, (np.exp(a) / np.exp(a).sum() + 0.5) / 2))
        True
        >>> get_detector("energy").ensemble_logits([a, b])
        array([[2., 0.]])
        """
        if self.ensemble not in ("predictive", "mean_logits"):
            raise ValueError(f"detector {self.name!r} (ensemble rule {self.ensemble!r}) is not "
                             "scored on a predictor's logits")
        stacks = [np.asarray(m, dtype=np.float64) for m in members]
        stacks = [z[None] if z.ndim == 2 else z for z in stacks]
        if not stacks or any(z.ndim != 3 or z.shape[1:] != stacks[0].shape[1:] for z in stacks):
            raise ValueError(f"detector {self.name!r}: members must be (pass, sample, class) or "
                             f"(sample, class) logits of one shape, got "
                             f"{[z.shape for z in stacks]}")
        if len(stacks) == 1 and stacks[0].shape[0] == 1:
            return stacks[0][0]
        if self.ensemble == "mean_logits":
            return np.mean([z.mean(axis=0) for z in stacks], axis=0)
        logp = np.stack([_logsumexp(_log_softmax(z, axis=2), axis=0) - np.log(z.shape[0])
                         for z in stacks])
        return _logsumexp(logp, axis=0) - np.log(len(stacks))

    def fitted(self, fit: Mapping[str, Any] | None = None
               ) -> Callable[[Mapping[str, Any]], np.ndarray]:
        """Fit once on in-distribution data; the returned ``scorer(inputs) -> u`` scores any
        number of sets without fitting again.

        Parameters
        ----------
        fit : mapping, optional
            Required when ``"fit"`` is a need: at least the keys :attr:`fit_keys`
            (:data:`FIT_KEYS`). Ignored otherwise.

        Raises
        ------
        ValueError
            Naming the missing fit keys.
        """
        if "fit" not in self.needs:
            state = None
        else:
            if fit is None:
                raise ValueError(f"detector {self.name!r} fits on in-distribution data: pass "
                                 f"fit= with keys {sorted(self.fit_keys)}")
            missing = sorted(self.fit_keys - set(fit))
            if missing:
                raise ValueError(f"detector {self.name!r}: fit lacks {missing}; got "
                                 f"{sorted(fit)}")
            if self.fit_func is None:
                state = fit
            else:
                state = self.fit_func({k: np.asarray(fit[k]) for k in self.fit_keys},
                                      **self.params)
        return lambda inputs: self._score(inputs, state)

    def _score(self, inputs: Mapping[str, Any], state: Any) -> np.ndarray:
        keys = [k for need in sorted(self.needs - {"fit"}) for k in NEED_KEYS[need]]
        missing = sorted({need for need in self.needs - {"fit"}
                          if any(k not in inputs for k in NEED_KEYS[need])})
        if missing:
            lacking = sorted(k for need in missing for k in NEED_KEYS[need] if k not in inputs)
            raise ValueError(f"detector {self.name!r} needs {missing} (keys {lacking}); got "
                             f"{sorted(inputs)}")
        arrays = {k: np.asarray(inputs[k], dtype=np.float64) for k in keys}
        u = np.asarray(self.func(arrays, state, **self.params), dtype=np.float64)
        if "members" in arrays:
            n = arrays["members"].shape[1]
        else:
            n = next(arrays[k] for k in ("logits", "embedding") if k in arrays).shape[0]
        if u.shape != (n,) or np.isnan(u).any():
            raise ValueError(f"detector {self.name!r} returned shape {u.shape} "
                             f"{'with NaN ' if np.isnan(u).any() else ''}for {n} samples")
        return u

    def score(self, inputs: Mapping[str, Any], fit: Mapping[str, Any] | None = None
              ) -> np.ndarray:
        """The uncertainty of each sample, shape (sample,): :meth:`fitted` then the scorer.

        Parameters
        ----------
        inputs : mapping
            The keys of each need of the detector (but ``fit``, :data:`NEED_KEYS`) -> its array
            for the scored samples.
        fit : mapping, optional
            In-distribution fit data (required when ``"fit"`` is a need), keys
            :attr:`fit_keys`; ``head_weight`` and ``head_bias`` are taken from ``inputs`` when
            it lacks them. To score several sets, fit once with :meth:`fitted`.

        Raises
        ------
        ValueError
            Naming the missing inputs, or a result of the wrong shape or with NaN.
        """
        missing = sorted((self.needs - {"fit"}) - {
            need for need in NEED_KEYS if all(k in inputs for k in NEED_KEYS[need])})
        if missing:
            lacking = sorted(k for need in missing for k in NEED_KEYS[need] if k not in inputs)
            raise ValueError(f"detector {self.name!r} needs {missing} (keys {lacking}); got "
                             f"{sorted(inputs)}")
        if fit is not None and "fit" in self.needs:
            fit = {**{k: inputs[k] for k in NEED_KEYS["head"]
                      if k in self.fit_keys and k in inputs}, **fit}
        return self.fitted(fit)(inputs)


#: Registered detectors, name -> :class:`Detector` (plugins: entry-point group
#: ``uqmetrics.detectors``).
DETECTORS: Registry[Detector] = Registry("detector", group="uqmetrics.detectors",
                                         item_type=Detector)


# ----------------------------------------------------------------------------- from logits


def _msp(inputs: Mapping[str, np.ndarray], fit: Any) -> np.ndarray:
    return -_softmax(inputs["logits"], axis=1).max(axis=1)


def _maxlogit(inputs: Mapping[str, np.ndarray], fit: Any) -> np.ndarray:
    return -inputs["logits"].max(axis=1)


def _energy(inputs: Mapping[str, np.ndarray], fit: Any, *, temperature: float = 1.0
            ) -> np.ndarray:
    t = float(temperature)
    return -t * _logsumexp(inputs["logits"] / t, axis=1)


def _entropy_of_logits(z: np.ndarray) -> np.ndarray:
    """Entropy of softmax(z) along the last axis, 0 log 0 = 0, computed from log-probabilities."""
    logp = _log_softmax(z, axis=-1)
    return -np.sum(np.exp(logp) * logp, axis=-1)


def _entropy(inputs: Mapping[str, np.ndarray], fit: Any) -> np.ndarray:
    return _entropy_of_logits(inputs["logits"])


def _gen(inputs: Mapping[str, np.ndarray], fit: Any, *, gamma: float = 0.1, M: int = 100
         ) -> np.ndarray:
    p = _softmax(inputs["logits"], axis=1)
    m = min(int(M), p.shape[1])
    top = -np.partition(-p, m - 1, axis=1)[:, :m]
    return np.sum(top**gamma * (1.0 - top)**gamma, axis=1)


def _register(name: str, description: str, needs: set[str], func: Callable, reference: str,
              **kwargs: Any) -> None:
    DETECTORS.register(Detector(name, description, frozenset(needs), func, reference=reference,
                                **kwargs))


_register("msp", "maximum softmax probability, negated (the baseline)", {"logits"}, _msp,
          "Hendrycks & Gimpel (2017), A baseline for detecting misclassified and "
          "out-of-distribution examples in neural networks", ensemble="predictive")
_register("maxlogit", "maximum logit, negated", {"logits"}, _maxlogit,
          "Hendrycks, Basart, Mazeika, Zou, Kwon, Mostajabi, Steinhardt & Song (2022), Scaling "
          "out-of-distribution detection for real-world settings")
_register("energy", "free energy -T logsumexp(z/T), T = 1", {"logits"}, _energy,
          "Liu, Wang, Owens & Li (2020), Energy-based out-of-distribution detection",
          params={"temperature": 1.0}, grid={"temperature": (1.0,)})
_register("entropy", "entropy of the softmax", {"logits"}, _entropy,
          "Hendrycks & Gimpel (2017), A baseline for detecting misclassified and "
          "out-of-distribution examples in neural networks (the softmax entropy as a score)",
          ensemble="predictive")
_register("gen", "generalized entropy of the top-M softmax probabilities (gamma 0.1, M 100)",
          {"logits"}, _gen,
          "Liu, Lochman & Zach (2023), GEN: pushing the limits of softmax-based "
          "out-of-distribution detection", params={"gamma": 0.1, "M": 100},
          grid={"gamma": (0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0),
                "M": (10, 50, 100, 200, 500, 1000)}, ensemble="predictive")


# --------------------------------------------------------------------------- from features


def _features(x: np.ndarray, d: int, what: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != d:
        raise ValueError(f"{what} must have shape (sample, {d}) like the fit embedding, got "
                         f"{x.shape}")
    return x


def _fit_embedding(fit: Mapping[str, np.ndarray], keep_float32: bool = False,
                   check_finite: bool = True) -> np.ndarray:
    x = np.asarray(fit["embedding"])
    if not (keep_float32 and x.dtype == np.float32):  # (no float64 copy of float32 features)
        x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"fit embedding must have shape (n_fit >= 1, feature), got {x.shape}")
    if check_finite:
        _check_finite(x)
    return x


def _check_finite(x: Any) -> None:
    """``ValueError`` unless the fit embedding ``x`` (numpy, or a tensor: the torch backends
    check it where it lies) is finite."""
    finite = x.isfinite().all() if hasattr(x, "isfinite") else np.isfinite(x).all()
    if not finite:
        raise ValueError("fit embedding must be finite")


#: The backends of ``mahalanobis`` and ``vim`` (their ``backend`` parameter): ``auto`` (the
#: default) is ``numpy``, the reference (its scores never change with torch installed or not);
#: ``torch`` fits and scores with torch on the CPU, ``torch:<device>`` (``torch:cuda``) on that
#: device: float32 products, float64 where accuracy needs it (:func:`_torch_rows`).
FEATURE_BACKENDS = ("auto", "numpy", "torch")


def _torch_rows(dev: Any) -> int:
    """Rows per block of the torch backends of ``mahalanobis`` and ``vim``: 2^11 on the CPU,
    2^14 on a CUDA device. A scored block is always this many rows (the last one padded with
    zeros), so that every product has one shape: a row's score never depends on the rows scored
    with it (the BLAS picks its kernel, and so its order of summation, by the shape)."""
    return 1 << 14 if dev.type == "cuda" else 1 << 11


class _Float32Products:
    """Within: torch's float32 products in IEEE float32 (no TF32, no reduced precision), the
    user's setting restored on exit: by ``torch.set_float32_matmul_precision``, or, where the
    user set the per-backend ``fp32_precision`` of torch >= 2.9 (torch then refuses the first
    API), by those."""

    def __init__(self, torch: Any):
        self.torch = torch

    def __enter__(self) -> None:
        t = self.torch
        try:
            self.saved: Any = t.get_float32_matmul_precision()
            t.set_float32_matmul_precision("highest")
        except RuntimeError:  # "mix of the legacy and new APIs"
            backends = [b for b in (t.backends.cuda.matmul, t.backends.mkldnn.matmul)
                        if hasattr(b, "fp32_precision")]
            self.saved = [(b, b.fp32_precision) for b in backends]
            for b in backends:
                b.fp32_precision = "ieee"

    def __exit__(self, *exc: object) -> None:
        if isinstance(self.saved, str):
            self.torch.set_float32_matmul_precision(self.saved)
        else:
            for b, value in self.saved:
                b.fp32_precision = value


class _OneThread:
    """Within: torch on one CPU thread (nothing changes for a CUDA device), for its float64
    eigendecompositions, as :func:`_eigh_one_thread` for numpy: LAPACK's result then does not
    depend on the thread count, and its tridiagonal reduction is no slower."""

    def __init__(self, torch: Any, dev: Any):
        self.torch, self.cpu = torch, dev.type == "cpu"

    def __enter__(self) -> None:
        if self.cpu:
            self.saved = self.torch.get_num_threads()
            self.torch.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        if self.cpu:
            self.torch.set_num_threads(self.saved)


def _torch_blocks(x: Any, dev: Any, rows: int):
    """``(start, n, block)`` over ``x`` (numpy or a tensor on ``dev``): ``block`` a float32
    tensor on ``dev`` of exactly ``rows`` rows, its first ``n`` those of ``x[start:]``, the rest
    zero."""
    import torch

    for i in range(0, x.shape[0], rows):
        part = x[i:i + rows]
        n = part.shape[0]
        if isinstance(part, np.ndarray):
            part = torch.from_numpy(np.ascontiguousarray(part, dtype=np.float32))
        part = part.to(dev, torch.float32)
        if n < rows:
            part = torch.cat([part, part.new_zeros((rows - n, part.shape[1]))])
        yield i, n, part



def _mahalanobis_fit(fit: Mapping[str, np.ndarray], *, backend: str = "auto"
                     ) -> dict[str, Any]:
    name, device = _backend(backend, "mahalanobis", FEATURE_BACKENDS)
    x = _fit_embedding(fit, keep_float32=name == "torch", check_finite=name != "torch")
    y = np.asarray(fit["labels"])
    if y.shape != (x.shape[0],) or y.dtype.kind not in "iub":
        raise ValueError(f"fit labels must be integers of shape ({x.shape[0]},), got "
                         f"{y.dtype} {y.shape}")
    classes, inverse, counts = np.unique(y, return_inverse=True, return_counts=True)
    if name == "torch":
        return _mahalanobis_fit_torch(x, inverse, counts, device)
    means = np.zeros((classes.size, x.shape[1]))
    np.add.at(means, inverse, x)
    means /= counts[:, None]
    cov = np.zeros((x.shape[1], x.shape[1]))
    for i in range(0, x.shape[0], _CHUNK):
        r = x[i:i + _CHUNK] - means[inverse[i:i + _CHUNK]]
        cov += r.T @ r
    cov /= x.shape[0]
    precision = np.linalg.pinv(cov, hermitian=True)
    return {"backend": "numpy", "means": means, "precision": precision,
            "mpm": np.einsum("cd,de,ce->c", means, precision, means)}


def _mahalanobis_fit_torch(x: np.ndarray, inverse: np.ndarray, counts: np.ndarray,
                           device: str) -> dict[str, Any]:
    """The torch backend's fit (docs/conventions.md#s-4): the features rounded once to float32
    and moved to the device whole; the class means summed in float64 (a float64 one-hot
    product on CUDA, whose order of summation is fixed, unlike its atomic ``index_add_``);
    the covariance as the float64 sum of float32 products R^T R of blocks of residuals R
    (each x - mu_y computed in float64, then rounded); its pseudo-inverse in float64 (``pinv``,
    Hermitian, numpy's cut 1e-15 of the largest eigenvalue). Scoring centres the features at
    their float32-rounded mean m and multiplies them by [P, P (mu_c - m)^T] in float32."""
    import torch

    dev = torch.device(device)
    rows = _torch_rows(dev)
    n, d = x.shape
    n_cls = counts.size
    with torch.no_grad(), _Float32Products(torch):
        xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(dev)
        yt = torch.from_numpy(inverse.astype(np.int64)).to(dev)
        _check_finite(xt)
        sums = _class_sums(xt, yt, n_cls, rows, one_hot=dev.type == "cuda")
        means = sums / torch.from_numpy(counts.astype(np.float64)).to(dev)[:, None]
        cov = torch.zeros((d, d), dtype=torch.float64, device=dev)
        for i in range(0, n, rows):
            r = (xt[i:i + rows].double() - means[yt[i:i + rows]]).float()
            cov += (r.T @ r).double()
        cov /= n
        with _OneThread(torch, dev):
            precision = torch.linalg.pinv(cov, hermitian=True, rtol=1e-15)
        centre = (sums.sum(dim=0) / n).float()  # m, rounded to float32
        pm = (means - centre.double()) @ precision  # P (mu_c - m), (class, feature)
        return {"backend": "torch", "device": dev, "rows": rows, "n_features": d,
                "centre": centre, "mpm": (pm * (means - centre.double())).sum(dim=1),
                "proj": torch.cat([precision, pm.T], dim=1).float().contiguous()}


def _class_sums(x: Any, y: Any, n_cls: int, rows: int, one_hot: bool) -> Any:
    """The float64 sum of the rows of ``x`` (float32 tensor) of each class ``y`` (0 ..
    n_cls - 1), by blocks of ``rows``: ``index_add_`` (CPU), or a float64 product with the
    one-hot labels (``one_hot``, for CUDA, whose ``index_add_`` adds in no fixed order)."""
    import torch

    sums = torch.zeros((n_cls, x.shape[1]), dtype=torch.float64, device=x.device)
    for i in range(0, x.shape[0], rows):
        xb, yb = x[i:i + rows].double(), y[i:i + rows]
        if one_hot:
            sums += torch.nn.functional.one_hot(yb, n_cls).double().T @ xb
        else:
            sums.index_add_(0, yb, xb)
    return sums


def _mahalanobis(inputs: Mapping[str, np.ndarray], state: Mapping[str, Any], *,
                 backend: str = "auto") -> np.ndarray:
    if state["backend"] == "torch":
        return _mahalanobis_torch(inputs, state)
    means, precision = state["means"], state["precision"]
    x = _features(inputs["embedding"], means.shape[1], "embedding")
    u = np.empty(x.shape[0])
    for i in range(0, x.shape[0], _CHUNK):
        xp = x[i:i + _CHUNK] @ precision
        d2 = (np.sum(xp * x[i:i + _CHUNK], axis=1)[:, None] - 2 * xp @ means.T
              + state["mpm"][None, :])
        u[i:i + _CHUNK] = np.maximum(d2.min(axis=1), 0.0)
    return u


def _mahalanobis_torch(inputs: Mapping[str, np.ndarray], state: Mapping[str, Any]
                       ) -> np.ndarray:
    """u = min_c (xc P xc - 2 xc P (mu_c - m) + (mu_c - m) P (mu_c - m)), xc = x - m: one
    float32 product of each block with [P, P (mu_c - m)^T]; the quadratic form's sum, the
    combination and the minimum in float64."""
    import torch

    d = state["n_features"]
    x = _features(inputs["embedding"], d, "embedding")
    u = np.empty(x.shape[0])
    with torch.no_grad(), _Float32Products(torch):
        for i, n, xb in _torch_blocks(x, state["device"], state["rows"]):
            xc = xb - state["centre"]
            out = xc @ state["proj"]
            quad = (out[:, :d].double() * xc.double()).sum(dim=1)
            d2 = quad[:, None] - 2.0 * out[:, d:].double() + state["mpm"][None, :]
            u[i:i + n] = d2.min(dim=1).values.clamp_min(0.0)[:n].cpu().numpy()
    return u


def _unit(x: np.ndarray, what: str) -> np.ndarray:
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    if (norm == 0).any():
        raise ValueError(f"{what}: a feature vector is all zero, it has no direction (knn "
                         "normalises every feature)")
    return x / norm


#: KNN's search backends (the ``backend`` parameter of ``knn``): ``auto`` is ``faiss`` when faiss
#: is importable (``pip install 'uqmetrics[faiss]'``), else the same float32 search in numpy
#: (whose scores are the same bits: a result never depends on whether faiss is installed);
#: ``numpy`` is the float64 reference; ``torch`` runs on the CPU, ``torch:<device>``
#: (``torch:cuda``) on that torch device.
KNN_BACKENDS = ("auto", "numpy", "faiss", "torch")

#: Bank rows x query rows of similarities computed at once by the numpy and torch searches (the
#: CPU's bound: 2^24, 64 MiB in float32; a CUDA device holds 2^27 at once).
_KNN_BLOCK = 1 << 24


def _knn_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or int(k) < 1:
        raise ValueError(f"knn: k must be an integer >= 1, got {k!r}")
    return int(k)


def _backend(backend: Any, detector: str, names: Sequence[str]) -> tuple[str, str]:
    """``(name, device)`` of a detector's ``backend`` parameter (one of ``names`` or
    ``torch:<device>``); ``auto`` is returned unresolved. ``ValueError`` naming the detector and
    the bad value, torch when it cannot be imported, or a CUDA device where there is none."""
    name, _, device = backend.partition(":") if isinstance(backend, str) else ("?", "", "")
    if name not in names or (device and name != "torch") or backend == "torch:":
        raise ValueError(f"{detector}: backend must be one of {', '.join(names)} or "
                         f"torch:<device> (e.g. torch:cuda), got {backend!r}")
    if name == "torch":
        try:
            import torch
        except ImportError as exc:
            raise ValueError(f"{detector}: backend {backend!r} needs torch ({exc})") from exc
        try:
            dev = torch.device(device or "cpu")
        except RuntimeError as exc:
            raise ValueError(f"{detector}: backend {backend!r} names no torch device "
                             f"({exc})") from exc
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"{detector}: backend {backend!r} needs a CUDA device; torch "
                             "sees none")
    return name, device or "cpu"


def _knn_backend(backend: Any) -> tuple[str, str]:
    """``(name, device)`` of a ``backend`` parameter (:data:`KNN_BACKENDS`), ``auto`` resolved;
    ``ValueError`` naming the bad value, or the package a backend lacks."""
    name, device = _backend(backend, "knn", KNN_BACKENDS)
    if name == "auto":  # faiss, else the same float32 search in numpy (the same bits)
        import importlib.util

        name = "faiss" if importlib.util.find_spec("faiss") is not None else "numpy32"
    if name == "faiss":
        try:
            import faiss  # noqa: F401
        except ImportError as exc:
            raise ValueError(f"knn: backend {backend!r} needs faiss, which cannot be "
                             f"imported ({exc}); install uqmetrics[faiss]") from exc
    return name, device


def _knn_fit(fit: Mapping[str, np.ndarray], *, k: int = 50, backend: str = "auto"
             ) -> dict[str, Any]:
    _knn_k(k)
    name, device = _knn_backend(backend)
    bank = _unit(_fit_embedding(fit), "fit embedding")
    if name == "numpy":
        return {"backend": name, "bank": bank, "delta": _dot_error(bank.shape[1], 0.0, 2.0**-53)}
    bank = np.ascontiguousarray(bank, dtype=np.float32)  # one rounding of each unit vector
    state = {"backend": name, "device": device, "bank": bank}
    if name == "numpy32":  # auto without faiss
        pass
    elif name == "faiss":
        import faiss

        index = faiss.IndexFlatIP(bank.shape[1])  # exact inner-product search, float32
        index.add(bank)
        # the index's own copy of the bank, viewed (no second copy kept)
        state.update(index=index, bank=faiss.rev_swig_ptr(index.get_xb(), bank.size)
                     .reshape(bank.shape))
    else:
        import torch

        state["tensor"] = torch.from_numpy(bank).to(device)
    return state


def _dot_error(d: int, u_in: float, u_acc: float) -> float:
    """A bound on |computed - exact| of the inner product of two vectors of norm <= 1 + 2^-20
    with ``d`` elements, inputs rounded with unit roundoff ``u_in`` (0: exact inputs) and
    products and sums with ``u_acc``: (2 u_in + gamma_d) (1 + 2^-20)^2, gamma_d = d u / (1 - d
    u), whatever the order of the summation (Higham 2002, Accuracy and stability of numerical
    algorithms, section 3.1); plus the same bound in float64 for the exact recomputation."""
    def gamma(u: float) -> float:
        return d * u / (1.0 - d * u)
    return (2.0 * u_in + gamma(u_acc) + gamma(2.0**-53)) * (1.0 + 2.0**-20) ** 2


def _exact_dots(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise inner products in float64, each by one fixed order of summation (numpy's
    pairwise sum along the row): a pair's value depends on nothing but the pair. Products of
    float32 values are exact in float64."""
    return np.sum(a.astype(np.float64, copy=False) * b.astype(np.float64, copy=False), axis=1)


def _kth_similarity(z: np.ndarray, state: Mapping[str, Any], kk: int, m: int,
                    search: Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]],
                    delta: float) -> np.ndarray:
    """The k-th largest similarity of each row of ``z`` to the bank, recomputed exactly.

    ``search(z, m)`` returns the m largest similarities (any order) and their bank indices,
    each within ``delta`` of its exact value (:func:`_exact_dots`). With t the k-th largest
    found, every bank row above t + 2 delta is surely among the k nearest and every row below
    t - 2 delta surely not; the k-th largest exact similarity is the one of rank k - (rows above)
    among the rows in between, whose similarities are recomputed exactly. When the m found do not
    reach below t - 2 delta, the row is searched again with 4 m. The result is therefore the
    same, bit for bit, whichever search (backend, block of queries) ran."""
    bank = state["bank"]
    n_bank = bank.shape[0]
    vals, idx = search(z, m)
    vals = np.asarray(vals, dtype=np.float64)  # the band's edges in float64
    t = np.partition(vals, vals.shape[1] - kk, axis=1)[:, vals.shape[1] - kk]
    done = (m >= n_bank) | (vals.min(axis=1) < t - 2 * delta)
    kth = np.empty(z.shape[0])
    if not done.all():  # the band around t reaches beyond the m found: search wider
        m2 = min(n_bank, 4 * m)
        wide = search if m2 <= 2048 else _knn_numpy_search(bank)
        kth[~done] = _kth_similarity(z[~done], state, kk, m2, wide, delta)
    vals, idx, t, zd = vals[done], idx[done], t[done], z[done]
    above = np.sum(vals > t[:, None] + 2 * delta, axis=1)
    rows, cols = np.nonzero(np.abs(vals - t[:, None]) <= 2 * delta)  # rows ascending
    exact = _exact_dots(zd[rows], bank[idx[rows, cols]])
    order = np.lexsort((-exact, rows))
    first = np.searchsorted(rows, np.arange(zd.shape[0]))
    kth[done] = exact[order][first + kk - above - 1]
    return kth


def _knn_numpy_search(bank: np.ndarray) -> Callable[[np.ndarray, int], tuple]:
    def search(z: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
        sim = z @ bank.T
        if m >= bank.shape[0]:
            return sim, np.broadcast_to(np.arange(bank.shape[0]), sim.shape)
        idx = np.argpartition(sim, sim.shape[1] - m, axis=1)[:, sim.shape[1] - m:]
        return np.take_along_axis(sim, idx, axis=1), idx
    return search


def _knn_torch_search(state: Mapping[str, Any]) -> Callable[[np.ndarray, int], tuple]:
    import torch

    bank = state["tensor"]

    def search(z: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
        sim = torch.from_numpy(z).to(bank.device) @ bank.T
        vals, idx = torch.topk(sim, min(m, bank.shape[0]), dim=1, sorted=False)
        return vals.cpu().numpy(), idx.cpu().numpy()
    return search


def _knn(inputs: Mapping[str, np.ndarray], state: Mapping[str, Any], *, k: int = 50,
         backend: str = "auto") -> np.ndarray:
    bank = state["bank"]
    n_bank, d = bank.shape
    kk = min(_knn_k(k), n_bank)
    z = _unit(_features(inputs["embedding"], d, "embedding"), "embedding")
    name = state["backend"]
    rows = max(1, _KNN_BLOCK // n_bank)
    products: Any = contextlib.nullcontext()
    if name == "numpy":
        search, delta = _knn_numpy_search(bank), state["delta"]
    else:
        z = np.ascontiguousarray(z, dtype=np.float32)  # the bank's rounding
        if name == "numpy32":
            search = _knn_numpy_search(bank)
        elif name == "faiss":
            def search(z: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
                return state["index"].search(z, m)
            rows = 1 << 14
        else:
            import torch

            search = _knn_torch_search(state)
            products = _Float32Products(torch)  # IEEE float32 (no TF32) whatever the user set
            if state["tensor"].is_cuda:
                rows = max(1, (_KNN_BLOCK << 3) // n_bank)
        delta = _dot_error(d, 0.0, 2.0**-24)
    m = min(n_bank, kk + max(8, kk // 4))  # a margin of candidates beyond the k-th
    u = np.empty(z.shape[0])
    with products:
        for i in range(0, z.shape[0], rows):
            kth = _kth_similarity(z[i:i + rows], state, kk, m, search, delta)
            u[i:i + rows] = np.sqrt(np.maximum(2.0 - 2.0 * kth, 0.0))
    return u


def vim_dimension(n_features: int) -> int:
    """ViM's principal-space dimension D for a feature dimension N, as the ViM reference code
    (haoqiwang/vim): 1000 if N >= 2048, 512 if N >= 768, else N // 2.

    >>> vim_dimension(2048), vim_dimension(768), vim_dimension(512), vim_dimension(3)
    (1000, 512, 256, 1)
    """
    n = int(n_features)
    return 1000 if n >= 2048 else 512 if n >= 768 else n // 2


def _head(w: Any, b: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    w, b = np.asarray(w, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if w.ndim != 2 or b.shape != (w.shape[0],):
        raise ValueError(f"{what}: head_weight must be (class, feature) and head_bias (class,), "
                         f"got {w.shape} and {b.shape}")
    return w, b


def _with_alpha(state: dict[str, Any], max_logit: Any, residual: Any) -> dict[str, Any]:
    """``state`` with ViM's alpha: the fit features' summed max logit over their summed
    residual norm (both of shape (n,), numpy or torch)."""
    if residual.sum() <= 0:
        raise ValueError("vim: the fit features have no residual outside the principal space; "
                         "alpha is undefined (lower dim)")
    state["alpha"] = float(max_logit.sum() / residual.sum())
    return state


def _vim_fit(fit: Mapping[str, np.ndarray], *, dim: int | None = None, backend: str = "auto"
             ) -> dict[str, Any]:
    # Precision (docs/conventions.md#s-4): the products of the features (the covariance's
    # X^T X per block, the projections onto the residual space and onto the head) run in
    # float32 BLAS; float64 where accuracy needs it: the origin -pinv(W) b (a small least-
    # squares problem, ill-conditioned when W is), the mean of the features and the sum of the
    # blocks' X^T X, the eigendecomposition of the covariance (the residual space is the span of
    # its smallest eigenvalues, which float32 resolves poorly), and alpha (a ratio of sums over
    # every fit sample).
    name, device = _backend(backend, "vim", FEATURE_BACKENDS)
    x = _fit_embedding(fit, keep_float32=True, check_finite=name != "torch")
    w, b = _head(fit["head_weight"], fit["head_bias"], "vim fit")
    n_feat = x.shape[1]
    if w.shape[1] != n_feat:
        raise ValueError(f"vim: head_weight has {w.shape[1]} features, the fit embedding "
                         f"{n_feat}")
    d = vim_dimension(n_feat) if dim is None else int(dim)
    if not 0 <= d < n_feat:
        raise ValueError(f"vim: the principal dimension must lie in [0, {n_feat}) for "
                         f"{n_feat} features, got {d}")
    if name == "torch":
        return _vim_fit_torch(x, w, b, d, device)
    # -pinv(W) b as the minimum-norm least-squares solution of W u = -b (LAPACK gelsd: the
    # same cut of small singular values as pinv's default, without forming pinv(W), whose
    # gesdd is slow on a busy machine: 2 s for a 100 x 512 head on 2 threads)
    origin = -np.linalg.lstsq(w, b, rcond=None)[0]
    # E[(x - origin)(x - origin)^T] = the covariance about the mean (float32 products of the
    # features centred in float64) + the mean's offset from the origin (a float64 outer product):
    # the float32 rounding then scales with the spread of the features, not with their offset
    mean = x.mean(axis=0, dtype=np.float64)
    buf = np.empty((min(_CHUNK, x.shape[0]), n_feat), np.float32)
    cov = np.zeros((n_feat, n_feat))
    for i in range(0, x.shape[0], _CHUNK):
        c = buf[:min(_CHUNK, x.shape[0] - i)]
        np.subtract(x[i:i + _CHUNK], mean, out=c, casting="same_kind")
        cov += c.T @ c
    cov = cov / x.shape[0] + np.outer(mean - origin, mean - origin)
    _, vectors = _eigh_one_thread(cov)  # ascending eigenvalues
    state = {"backend": "numpy", "origin": origin, "residual_space": np.ascontiguousarray(
        vectors[:, :n_feat - d], dtype=np.float32), "alpha": 1.0, "dim": d}
    max_logit, residual = _vim_parts(x, w, b, state)
    return _with_alpha(state, max_logit, residual)


def _vim_origin_torch(w: np.ndarray, b: np.ndarray, dev: Any, qr: bool | None = None) -> Any:
    """-pinv(W) b, float64, on ``dev``: on the CPU numpy's (``lstsq``, the numpy backend's
    bits); on CUDA by a QR factorisation on the device (W^T = QR for C <= N classes and features,
    W = QR for C > N: the minimum-norm, resp. least-squares, solution, as accurate as ``lstsq``
    where W has full rank, without its host SVD: 0.4 s for 1000 x 2048 on 2 threads), numpy's
    ``lstsq`` when the triangle shows W (numerically) rank-deficient. ``qr``: force the choice
    (None: QR on CUDA)."""
    import torch

    if dev.type == "cuda" if qr is None else qr:
        wt, bt = torch.from_numpy(w).to(dev), torch.from_numpy(b).to(dev)
        tall = w.shape[0] > w.shape[1]
        q, r = torch.linalg.qr(wt if tall else wt.T)
        diag = torch.diagonal(r).abs()
        if float(diag.min()) > max(w.shape) * np.finfo(np.float64).eps * float(diag.max()):
            if tall:  # least squares: R u = -Q^T b
                return torch.linalg.solve_triangular(r, -(q.T @ bt)[:, None], upper=True)[:, 0]
            y = torch.linalg.solve_triangular(r.T, -bt[:, None], upper=False)
            return (q @ y)[:, 0]  # minimum norm: u = Q R^-T (-b)
    return torch.from_numpy(-np.linalg.lstsq(w, b, rcond=None)[0]).to(dev)


def _vim_fit_torch(x: np.ndarray, w: np.ndarray, b: np.ndarray, d: int, device: str
                   ) -> dict[str, Any]:
    """The torch backend's fit: the numpy backend's computation (:func:`_vim_fit`) on the
    device, the features rounded once to float32 and moved there whole; float32 products, float64
    for the mean, the sum of the blocks' X^T X, the eigendecomposition (``torch.linalg.eigh``),
    the origin (:func:`_vim_origin_torch`) and alpha."""
    import torch

    dev = torch.device(device)
    rows = _torch_rows(dev)
    n, n_feat = x.shape
    with torch.no_grad(), _Float32Products(torch):
        origin = _vim_origin_torch(w, b, dev)
        xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(dev)
        _check_finite(xt)
        mean = torch.zeros(n_feat, dtype=torch.float64, device=dev)
        for i in range(0, n, rows):
            mean += xt[i:i + rows].double().sum(dim=0)
        mean /= n
        cov = torch.zeros((n_feat, n_feat), dtype=torch.float64, device=dev)
        for i in range(0, n, rows):
            c = (xt[i:i + rows].double() - mean).float()
            cov += (c.T @ c).double()
        offset = mean - origin
        cov = cov / n + torch.outer(offset, offset)
        with _OneThread(torch, dev):
            vectors = torch.linalg.eigh(cov)[1]  # ascending eigenvalues
        space = vectors[:, :n_feat - d].float()
        state = {"backend": "torch", "device": dev, "rows": rows, "dim": d, "alpha": 1.0,
                 "n_features": n_feat, "origin": origin, "residual_space": space}
        max_logit, residual = _vim_parts_torch(xt, w, b, state)
    return _with_alpha(state, max_logit, residual)


def _vim_parts_torch(x: Any, w: np.ndarray, b: np.ndarray, state: Mapping[str, Any],
                     energy: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_vim_parts` on the device: one float32 product of each block (of
    :func:`_torch_rows` rows, padded) with [W^T, residual space], then float64."""
    import torch

    dev, space = state["device"], state["residual_space"]
    n_cls = w.shape[0]
    proj = torch.cat([torch.from_numpy(w.T.astype(np.float32)).to(dev), space], dim=1)
    shift = torch.cat([torch.from_numpy(b).to(dev), -(state["origin"] @ space.double())])
    first, residual = np.empty(x.shape[0]), np.empty(x.shape[0])
    for i, n, xb in _torch_blocks(x, dev, state["rows"]):
        out = (xb @ proj).double() + shift
        head = (torch.logsumexp(out[:, :n_cls], dim=1) if energy
                else out[:, :n_cls].max(dim=1).values)
        first[i:i + n] = head[:n].cpu().numpy()
        residual[i:i + n] = torch.linalg.vector_norm(out[:n, n_cls:], dim=1).cpu().numpy()
    return first, residual


def _eigh_one_thread(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``numpy.linalg.eigh`` on one BLAS thread: LAPACK's tridiagonal reduction is a chain of
    small matrix-vector products that threads only slow down (3-4x on 2 busy cores, at 512 and
    2048 features), and one thread makes the result independent of the thread count."""
    from threadpoolctl import threadpool_limits  # (imported on use: this module is numpy only)

    with threadpool_limits(1, user_api="blas"):
        return np.linalg.eigh(a)


def _vim_parts(x: np.ndarray, w: np.ndarray, b: np.ndarray, state: Mapping[str, Any],
               energy: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(max logit or logsumexp of the logits, residual norm)`` of each row of ``x`` (float64):
    one float32 product per block of rows with [W^T, residual space], then float64."""
    space = state["residual_space"]
    n_cls = w.shape[0]
    proj = np.ascontiguousarray(np.concatenate([w.T.astype(np.float32), space], axis=1))
    shift = np.concatenate([b, -(state["origin"] @ space.astype(np.float64))])
    rows = min(_CHUNK, x.shape[0])
    # three buffers for every block: the rows in float32, their float32 product, and the
    # product plus the shift in float64 (a new float64 array per block cost a fifth of the fit
    # at 200,000 x 2048 features: allocating and casting, not computing)
    buf, prod = np.empty((rows, x.shape[1]), np.float32), np.empty((rows, proj.shape[1]), np.float32)
    wide = np.empty((rows, proj.shape[1]))
    first, residual = np.empty(x.shape[0]), np.empty(x.shape[0])
    for i in range(0, x.shape[0], _CHUNK):
        m = min(_CHUNK, x.shape[0] - i)
        np.copyto(buf[:m], x[i:i + m], casting="same_kind")
        np.matmul(buf[:m], proj, out=prod[:m])
        out = np.add(prod[:m], shift, out=wide[:m])  # [logits, (x - origin) @ space]
        logits, res = out[:, :n_cls], out[:, n_cls:]
        first[i:i + m] = _logsumexp(logits, axis=1) if energy else logits.max(axis=1)
        residual[i:i + m] = np.sqrt(np.einsum("ij,ij->i", res, res))
    return first, residual


def _vim(inputs: Mapping[str, np.ndarray], state: Mapping[str, Any], *,
         dim: int | None = None, backend: str = "auto") -> np.ndarray:
    w, b = _head(inputs["head_weight"], inputs["head_bias"], "vim")
    if state["backend"] == "torch":
        import torch

        x = _features(inputs["embedding"], state["n_features"], "embedding")
        with torch.no_grad(), _Float32Products(torch):
            energy, residual = _vim_parts_torch(x, w, b, state, energy=True)
        return state["alpha"] * residual - energy
    x = _features(inputs["embedding"], state["origin"].size, "embedding")
    energy, residual = _vim_parts(x, w, b, state, energy=True)
    return state["alpha"] * residual - energy


def _react_fit(fit: Mapping[str, np.ndarray], *, percentile: float = 90.0) -> dict[str, Any]:
    x = _fit_embedding(fit)
    p = float(percentile)
    if not 0 <= p <= 100:
        raise ValueError(f"react: percentile must lie in [0, 100], got {percentile!r}")
    return {"threshold": float(np.percentile(x, p)), "n_features": x.shape[1]}


def _react(inputs: Mapping[str, np.ndarray], state: Mapping[str, Any], *,
           percentile: float = 90.0) -> np.ndarray:
    w, b = _head(inputs["head_weight"], inputs["head_bias"], "react")
    x = _features(inputs["embedding"], state["n_features"], "embedding")
    return -_logsumexp(np.minimum(x, state["threshold"]) @ w.T + b, axis=1)


_register("mahalanobis", "minimum squared Mahalanobis distance to the class means, one shared "
          "covariance (no input preprocessing)", {"embedding", "fit"},
          _mahalanobis,
          "Lee, Lee, Lee & Shin (2018), A simple unified framework for detecting "
          "out-of-distribution samples and adversarial attacks",
          fit_func=_mahalanobis_fit, fit_keys=frozenset({"embedding", "labels"}),
          params={"backend": "auto"})
_register("knn", "distance to the k-th nearest fit feature, L2-normalised features (k = 50)",
          {"embedding", "fit"}, _knn,
          "Sun, Ming, Zhu & Li (2022), Out-of-distribution detection with deep nearest "
          "neighbors", fit_func=_knn_fit, fit_keys=frozenset({"embedding"}),
          params={"k": 50, "backend": "auto"},
          grid={"k": (50, 100, 200, 500, 1000)})
_register("vim", "virtual logit (alpha x residual norm) minus energy", {"embedding", "head", "fit"},
          _vim, "Wang, Li, Feng & Zhang (2022), ViM: out-of-distribution with virtual-logit "
          "matching", fit_func=_vim_fit,
          fit_keys=frozenset({"embedding", "head_weight", "head_bias"}), params={"dim": None, "backend": "auto"},
          grid={"dim": (256, 1000)})
_register("react", "energy of the logits of features clipped at their 90th fit percentile",
          {"embedding", "head", "fit"}, _react,
          "Sun, Guo & Li (2021), ReAct: out-of-distribution detection with rectified "
          "activations", fit_func=_react_fit, fit_keys=frozenset({"embedding"}),
          params={"percentile": 90.0}, grid={"percentile": (85.0, 90.0, 95.0, 99.0)})


# ---------------------------------------------------------------------------- from members


def _members(inputs: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``(log p (member, sample, class), log mean p (sample, class))``."""
    z = inputs["members"]
    if z.ndim != 3:
        raise ValueError(f"members must be (member, sample, class) logits, got shape {z.shape}")
    logp = _log_softmax(z, axis=2)
    return logp, _logsumexp(logp, axis=0) - np.log(z.shape[0])


def _entropy_of_log(logp: np.ndarray) -> np.ndarray:
    return -np.sum(np.exp(logp) * logp, axis=-1)


def _ensemble_entropy(inputs: Mapping[str, np.ndarray], fit: Any) -> np.ndarray:
    return _entropy_of_log(_members(inputs)[1])


def _mutual_information(inputs: Mapping[str, np.ndarray], fit: Any) -> np.ndarray:
    logp, logbar = _members(inputs)
    return np.maximum(_entropy_of_log(logbar) - _entropy_of_log(logp).mean(axis=0), 0.0)


def _disagreement(inputs: Mapping[str, np.ndarray], fit: Any) -> np.ndarray:
    logp, logbar = _members(inputs)
    return np.mean(logp.argmax(axis=2) != logbar.argmax(axis=1)[None, :], axis=0)


_register("ensemble_entropy", "entropy of the mean softmax of the members (total uncertainty)",
          {"members"}, _ensemble_entropy,
          "Lakshminarayanan, Pritzel & Blundell (2017), Simple and scalable predictive "
          "uncertainty estimation using deep ensembles")
_register("mutual_information", "entropy of the mean softmax minus the mean member entropy "
          "(epistemic)", {"members"}, _mutual_information,
          "Houlsby, Huszar, Ghahramani & Lengyel (2011), Bayesian active learning for "
          "classification and preference learning; Depeweg et al. (2018), Decomposition of "
          "uncertainty in Bayesian deep learning")
_register("disagreement", "fraction of members whose arg-max differs from the ensemble's",
          {"members"}, _disagreement,
          "Lakshminarayanan, Pritzel & Blundell (2017), Simple and scalable predictive "
          "uncertainty estimation using deep ensembles (agreement of members)")


def search_params(detector: Detector, val_scores: Callable[[Detector], tuple[Any, Any]],
                  grid: Mapping[str, Sequence[Any]] | None = None
                  ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """OpenOOD v1.5's automatic parameter search (``Evaluator.hyperparam_search``): the grid
    point whose detector has the highest AUROC of validation OOD against validation ID data.

    Parameters
    ----------
    detector : Detector
    val_scores : callable
        ``val_scores(d) -> (u_id, u_ood)``: the detector ``d`` (``detector`` with one grid
        point's parameters) scored on the ID and on the OOD validation data. A ``ValueError``
        (a value the data do not admit, e.g. ViM's D at or above the feature dimension) skips
        that grid point.
    grid : mapping, optional
        Parameter name -> values; default :attr:`Detector.grid`.

    Returns
    -------
    params : dict
        The detector's parameters with the chosen grid point; :attr:`Detector.params`
        unchanged where the grid is empty or no grid point could be scored.
    trials : list of dict
        One per grid point, in the search's order: ``{"params": point, "auroc": value}``, or
        ``{"params": point, "error": message}`` for a skipped one.

    Notes
    -----
    As OpenOOD's ``recursive_generator`` and criterion: the grid points are the product of
    the values with the last parameter varying slowest (GEN: M outside, gamma inside), and
    the first point of the largest AUROC (OOD positive, :func:`uqmetrics.metrics.ood.ood_auroc_score`)
    is kept.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> fit = {"embedding": rng.normal(size=(60, 4))}
    >>> ids, oods = rng.normal(size=(20, 4)), 3 + rng.normal(size=(20, 4))
    >>> def val(d):
    ...     s = d.fitted(fit)
    ...     return s({"embedding": ids}), s({"embedding": oods})
    >>> params, trials = search_params(get_detector("knn"), val, {"k": (1, 5)})
    >>> params["k"] in (1, 5), [t["params"] for t in trials]
    (True, [{'k': 1}, {'k': 5}])
    """
    from .ood import ood_auroc_score  # xarray: imported on use (this module is numpy only)

    grid = {k: tuple(v) for k, v in (detector.grid if grid is None else grid).items()}
    names = list(grid)
    points = [dict(zip(names[::-1], values, strict=True))
              for values in itertools.product(*(grid[n] for n in names[::-1]))]
    best, best_auroc, trials = dict(detector.params), -np.inf, []
    for point in points:
        point = {n: point[n] for n in names}
        try:
            u_id, u_ood = val_scores(detector.with_params(**point))
        except ValueError as exc:
            trials.append({"params": point, "error": str(exc)})
            continue
        auroc = float(ood_auroc_score(u_id, u_ood))
        trials.append({"params": point, "auroc": auroc})
        if auroc > best_auroc:
            best, best_auroc = {**detector.params, **point}, auroc
    return best, trials


def get_detector(name: str) -> Detector:
    """The detector registered as ``name`` (plugins included); ``ValueError`` listing the
    names otherwise."""
    DETECTORS.load_plugins()
    return DETECTORS.lookup(name)


def list_detectors() -> list[str]:
    """Names of the registered detectors, plugins included."""
    DETECTORS.load_plugins()
    return DETECTORS.names()
