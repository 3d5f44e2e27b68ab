"""Uncertainty disentanglement estimators: aleatoric, epistemic and total (docs/conventions.md#s-9).

The estimators of Mucsányi, Kirchhof & Oh (2024), "Benchmarking Uncertainty Disentanglement:
Specialized Uncertainties for Specialized Tasks" (code: github.com/bmucsanyi/untangle), for any
predictor whose caches hold members or passes, in numpy, float64, natural logarithms:

- :func:`information_decomposition`: the information-theoretic split of the predictive entropy,
  total ``H(p̄)`` = aleatoric ``mean_s H(p_s)`` + epistemic (mutual information), built on
  :func:`~uqmetrics.metrics.confidence.expected_entropy` and
  :func:`~uqmetrics.metrics.confidence.mutual_information`;
- :func:`bregman_decomposition`: the Bregman (log-score) decomposition about the *central*
  prediction ``p̃ = softmax(mean_s log p_s)`` (the normalised geometric mean, untangle's "dual
  BMA"): epistemic ``mean_s KL(p̃ ‖ p_s)``, and, with the true label distribution ``q``,
  aleatoric ``H(q)`` and bias ``KL(q ‖ p̃)``, summing exactly to the members' expected log loss;
- single-pass estimators: :func:`one_minus_max_probability` (and the entropy,
  :func:`~uqmetrics.metrics.confidence.entropy`), and the DDU feature density
  (:func:`fit_class_gaussians`, :func:`gmm_neg_log_density`, :data:`DDU_DETECTOR`: a
  class-conditional Gaussian mixture on training features);
- :data:`ESTIMATORS`: the registry of estimators (name -> what it estimates, what it reads, its
  function and citation), which a protocol iterates to score every estimator, with a
  passthrough entry (``learned``) for an estimate a method provides itself (a loss-prediction
  head's output).

Shapes: ``member_probs`` (n_members, n_samples, n_classes), the class probabilities of each
ensemble member, MC-dropout pass or posterior sample (logits with ``from_logits=True``, whose
softmax is taken in float64); every estimate has shape (n_samples,).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.linalg import solve_triangular
from scipy.special import log_softmax, logsumexp, rel_entr

from ._validation import as_numpy, check_probs
from .confidence import _distributions, _entropy, softmax_response
from .detectors import Detector
from .exceptions import InputError
from .registry import Registry

__all__ = [
    "DDU_DETECTOR",
    "DDU_JITTERS",
    "ESTIMATES",
    "ESTIMATORS",
    "ESTIMATOR_NEEDS",
    "BregmanSplit",
    "ClassGaussians",
    "Estimator",
    "UncertaintySplit",
    "bregman_decomposition",
    "fit_class_gaussians",
    "get_estimator",
    "gmm_neg_log_density",
    "information_decomposition",
    "list_estimators",
    "one_minus_max_probability",
]

_UNTANGLE = ("Mucsányi, Kirchhof & Oh (2024), Benchmarking uncertainty disentanglement: "
             "specialized uncertainties for specialized tasks")


# ------------------------------------------------------------------------------ decompositions


@dataclass(frozen=True)
class UncertaintySplit:
    """A decomposition of one total uncertainty per sample into aleatoric and epistemic parts.

    Attributes
    ----------
    total, aleatoric, epistemic : ndarray of float64, shape (n_samples,)
        ``total == aleatoric + epistemic`` exactly (the sum is how ``total`` is formed).
    """

    total: np.ndarray
    aleatoric: np.ndarray
    epistemic: np.ndarray


@dataclass(frozen=True)
class BregmanSplit(UncertaintySplit):
    """The Bregman (log-score) decomposition (:func:`bregman_decomposition`).

    Attributes
    ----------
    total, aleatoric, epistemic : ndarray of float64, shape (n_samples,)
        ``total == aleatoric + bias + epistemic`` (the bias counted as 0 without labels).
    bias : ndarray of float64, shape (n_samples,), or None
        ``KL(q ‖ p̃)``; None when no label distribution was given.
    central : ndarray of float64, shape (n_samples, n_classes)
        The central prediction ``p̃ = softmax(mean_s log p_s)`` (NaN rows where the members
        share no class of positive probability).
    """

    bias: np.ndarray | None = None
    central: np.ndarray = field(default=None, repr=False)


def _check_from_logits(from_logits: Any) -> bool:
    if not isinstance(from_logits, (bool, np.bool_)):
        raise InputError(f"from_logits must be a bool, got {from_logits!r}")
    return bool(from_logits)


def _members(member_probs: Any, from_logits: Any, name: str = "member_probs"
             ) -> tuple[np.ndarray, np.ndarray]:
    """Validated ``(p, log p)``, each (n_members, n_samples, n_classes) float64."""
    from_logits = _check_from_logits(from_logits)
    p = _distributions(member_probs, name, from_logits, samples=True)
    if from_logits:
        logp = log_softmax(as_numpy(member_probs, name).astype(np.float64), axis=-1)
    else:
        with np.errstate(divide="ignore"):
            logp = np.log(p)  # -inf where p = 0
    return p, logp


def information_decomposition(member_probs: Any, *, from_logits: bool = False
                              ) -> UncertaintySplit:
    """The information-theoretic split: predictive entropy = expected entropy + mutual information.

    Parameters
    ----------
    member_probs : array_like, shape (n_members, n_samples, n_classes)
        Class probabilities of each member or pass (logits with ``from_logits=True``).
    from_logits : bool, default False
        Whether ``member_probs`` holds logits.

    Returns
    -------
    UncertaintySplit
        ``aleatoric = mean_s H(p_s)`` (:func:`~uqmetrics.metrics.confidence.expected_entropy`),
        ``epistemic = max(H(p̄) − mean_s H(p_s), 0)``
        (:func:`~uqmetrics.metrics.confidence.mutual_information`) and ``total = aleatoric +
        epistemic``, which is ``H(p̄)`` (:func:`~uqmetrics.metrics.confidence.predictive_entropy`)
        to rounding; all in [0, ln C], shape (n_samples,).

    Notes
    -----
    Natural logarithms, ``0 log 0 = 0``, no epsilon. Forming ``total`` as the sum makes the
    identity exact in float64 and keeps the epistemic part non-negative where rounding would
    make ``H(p̄) − mean_s H(p_s)`` a tiny negative number. Untangle's "entropy of the BMA",
    "expected entropy" and "Jensen-Shannon divergence".

    References
    ----------
    Depeweg, Hernández-Lobato, Doshi-Velez & Udluft (2018), Decomposition of uncertainty in
    Bayesian deep learning for efficient and risk-sensitive learning. Houlsby, Huszár,
    Ghahramani & Lengyel (2011), Bayesian active learning for classification and preference
    learning.

    Examples
    --------
    >>> split = information_decomposition([[[1.0, 0.0], [0.5, 0.5]], [[0.0, 1.0], [0.5, 0.5]]])
    >>> split.aleatoric.tolist(), split.epistemic.tolist()
    ([0.0, 0.6931471805599453], [0.6931471805599453, 0.0])
    """
    p, _ = _members(member_probs, from_logits)
    aleatoric = _entropy(p).mean(axis=0)
    epistemic = np.maximum(_entropy(p.mean(axis=0)) - aleatoric, 0.0)
    return UncertaintySplit(aleatoric + epistemic, aleatoric, epistemic)


def bregman_decomposition(member_probs: Any, label_probs: Any = None, *,
                          from_logits: bool = False) -> BregmanSplit:
    """The Bregman (log-score) decomposition about the members' central prediction.

    Parameters
    ----------
    member_probs : array_like, shape (n_members, n_samples, n_classes)
        Class probabilities of each member or pass (logits with ``from_logits=True``).
    label_probs : array_like, shape (n_samples, n_classes), optional
        The true label distribution ``q`` of each sample (one-hot rows for hard labels). Without
        it the aleatoric part is estimated by the expected entropy and the bias is unknown.
    from_logits : bool, default False
        Whether ``member_probs`` holds logits.

    Returns
    -------
    BregmanSplit
        With ``p̃ = softmax(mean_s log p_s)`` (the central prediction):

        - ``epistemic = mean_s KL(p̃ ‖ p_s) = −log Σ_c exp(mean_s log p_s,c)`` (>= 0);
        - with ``q``: ``aleatoric = H(q)``, ``bias = KL(q ‖ p̃)`` and ``total = aleatoric +
          bias + epistemic``, which equals the members' expected log loss ``mean_s (−Σ_c q_c
          log p_s,c)``;
        - without ``q``: ``aleatoric = mean_s H(p_s)``, ``bias = None`` and ``total =
          aleatoric + epistemic``.

    Notes
    -----
    The epistemic part and the bias are clipped at 0 against rounding; ``total`` is the sum of
    the parts, so the identity is exact in float64.
    Natural logarithms, no epsilon: ``0 log 0 = 0``; a divergence is ``+inf`` where its first
    argument has mass that its second lacks. Where the members share no class of positive
    probability, ``p̃`` is undefined (NaN), the epistemic part and (with ``q``) the bias and
    total are ``+inf``. From logits every probability is positive and all parts are finite.
    Untangle (``validate.py``) names these ``gt_epistemics_bregman`` (its
    ``expected_divergence``), ``gt_aleatorics_bregman``, ``gt_biases_bregman_dual_bma``,
    ``gt_total_predictives_bregman_dual_bma`` and, without labels,
    ``expected_entropies_plus_expected_divergences``.

    References
    ----------
    Gruber & Buettner (2023), Uncertainty estimates of predictions via a general bias-variance
    decomposition. Mucsányi, Kirchhof & Oh (2024), Benchmarking uncertainty disentanglement:
    specialized uncertainties for specialized tasks.

    Examples
    --------
    >>> members = [[[0.5, 0.5]], [[0.9, 0.1]]]
    >>> split = bregman_decomposition(members, [[1.0, 0.0]])
    >>> bool(np.isclose(split.total[0], -(np.log(0.5) + np.log(0.9)) / 2))  # mean log loss
    True
    >>> split.central.round(4).tolist()
    [[0.75, 0.25]]
    """
    p, logp = _members(member_probs, from_logits)
    mean_logp = logp.mean(axis=0)
    log_z = logsumexp(mean_logp, axis=-1)
    shared = np.isfinite(log_z)
    epistemic = np.where(shared, np.maximum(-log_z, 0.0), np.inf)
    with np.errstate(invalid="ignore"):
        central = np.where(shared[:, None], np.exp(mean_logp - log_z[:, None]), np.nan)
    if label_probs is None:
        aleatoric = _entropy(p).mean(axis=0)
        return BregmanSplit(aleatoric + epistemic, aleatoric, epistemic, None, central)
    q = check_probs(label_probs, "label_probs")
    if q.shape != central.shape:
        raise InputError(f"label_probs must have shape {central.shape} (n_samples, n_classes) "
                         f"like member_probs, got {q.shape}")
    aleatoric = _entropy(q)
    with np.errstate(invalid="ignore"):
        kl = rel_entr(q, np.where(shared[:, None], central, 1.0)).sum(axis=-1)
    bias = np.where(shared, np.maximum(kl, 0.0), np.inf)  # >= 0: no rounding below it
    return BregmanSplit(aleatoric + bias + epistemic, aleatoric, epistemic, bias, central)


def one_minus_max_probability(probs: Any, *, from_logits: bool = False) -> np.ndarray:
    """``1 − max_c p_c``, the max-probability uncertainty of one predictive distribution.

    Parameters
    ----------
    probs : array_like, shape (n_samples, n_classes) or (n_members, n_samples, n_classes)
        Class probabilities (logits with ``from_logits=True``); a leading member axis is
        averaged first (``1 − max p̄``).
    from_logits : bool, default False
        Whether ``probs`` holds logits.

    Returns
    -------
    ndarray of float64, shape (n_samples,)
        In [0, 1 − 1/C] (an uncertainty: higher = more uncertain).

    Examples
    --------
    >>> one_minus_max_probability([[0.7, 0.2, 0.1], [0.4, 0.5, 0.1]]).round(12).tolist()
    [0.3, 0.5]
    """
    return 1.0 - softmax_response(probs, from_logits=_check_from_logits(from_logits))


# ------------------------------------------------------------------------- DDU feature density

#: DDU's jitter rule (Mukhoti et al. 2023, its code ``utils/gmm_utils.py``): the first ``ε`` of
#: ``0, the smallest normal float64, 1e-308, 1e-307, ..., 1e-1`` for which every class
#: covariance plus ``ε I`` has a Cholesky factor (one ``ε`` for all classes).
DDU_JITTERS: tuple[float, ...] = (0.0, float(np.finfo(np.float64).tiny),
                                  *(10.0 ** e for e in range(-308, 0)))

#: How :func:`gmm_neg_log_density` weights the classes: ``empirical`` the class frequencies of
#: the fit set (the mixture density ``q(z) = Σ_c π_c N(z; μ_c, Σ_c)``, DDU's paper); ``none``
#: weight 1 each (``Σ_c N(z; μ_c, Σ_c)``, as DDU's and untangle's code; for balanced classes
#: this adds ``log C`` to the log density and ranks the same).
_PRIORS = ("empirical", "none")


@dataclass(frozen=True)
class ClassGaussians:
    """A class-conditional Gaussian mixture on features (:func:`fit_class_gaussians`).

    Attributes
    ----------
    classes : ndarray of int, shape (n_components,)
        The classes of the fit labels, one component each.
    means : ndarray of float64, shape (n_components, n_features)
    cholesky : ndarray of float64, shape (n_components, n_features, n_features)
        Lower Cholesky factors ``L_c`` of the jittered covariances ``Σ_c + ε I = L_c L_cᵀ``.
    log_priors : ndarray of float64, shape (n_components,)
        ``log(n_c / n)``, the empirical class frequencies.
    jitter : float
        The ``ε`` of :data:`DDU_JITTERS` used.
    """

    classes: np.ndarray
    means: np.ndarray
    cholesky: np.ndarray
    log_priors: np.ndarray
    jitter: float


def fit_class_gaussians(embedding: Any, labels: Any) -> ClassGaussians:
    """Fit DDU's class-conditional Gaussians: one per class, its mean and covariance, jittered.

    Parameters
    ----------
    embedding : array_like, shape (n_fit, n_features)
        Features of in-distribution training images (float64).
    labels : array_like of int, shape (n_fit,)
        Their classes; every class present needs at least 2 samples.

    Returns
    -------
    ClassGaussians
        Class means ``μ_c``, covariances ``Σ_c = (X_c − μ_c)ᵀ(X_c − μ_c) / (n_c − 1)`` (as
        DDU's ``centered_cov_torch``) plus the first jitter of :data:`DDU_JITTERS` that makes
        every one positive definite (a Cholesky factor exists), and the class frequencies.

    Raises
    ------
    InputError
        Features not 2-D or not finite, labels of another length or not integers, a class
        with fewer than 2 samples, or no jitter of :data:`DDU_JITTERS` succeeding.

    References
    ----------
    Mukhoti, Kirsch, van Amersfoort, Torr & Gal (2023), Deep deterministic uncertainty: a new
    simple baseline.
    """
    x = as_numpy(embedding, "embedding").astype(np.float64)
    if x.ndim != 2 or x.shape[0] < 2 or not np.isfinite(x).all():
        raise InputError(f"embedding must be finite features of shape (n_fit >= 2, n_features), "
                         f"got shape {x.shape}")
    y = as_numpy(labels, "labels")
    if y.shape != (x.shape[0],) or y.dtype.kind not in "iu":
        raise InputError(f"labels must be integers of shape ({x.shape[0]},), got {y.dtype} "
                         f"{y.shape}")
    classes, inverse, counts = np.unique(y, return_inverse=True, return_counts=True)
    if counts.min() < 2:
        raise InputError(f"labels: every class needs >= 2 fit samples for a covariance, class "
                         f"{classes[np.argmin(counts)]} has {counts.min()}")
    d = x.shape[1]
    means = np.stack([x[inverse == k].mean(axis=0) for k in range(classes.size)])
    covs = np.empty((classes.size, d, d))
    for k in range(classes.size):
        r = x[inverse == k] - means[k]
        covs[k] = r.T @ r / (counts[k] - 1)
    eye = np.eye(d)
    start = 0  # the first class to try: the classes before it passed at a smaller jitter
    for jitter in DDU_JITTERS:
        try:
            for k in range(start, classes.size):
                np.linalg.cholesky(covs[k] + jitter * eye)
                start = k + 1
        except np.linalg.LinAlgError:
            start = k
            continue
        try:  # every class at this one jitter (the rule), keeping the factors
            factors = np.stack([np.linalg.cholesky(c + jitter * eye) for c in covs])
        except np.linalg.LinAlgError:
            start = 0
            continue
        return ClassGaussians(classes, means, factors, np.log(counts / counts.sum()),
                              float(jitter))
    raise InputError(f"embedding: no jitter up to {DDU_JITTERS[-1]} makes every class "
                     "covariance positive definite")


#: Rows per block when scoring (a block holds (rows, n_features) residuals per class).
_CHUNK = 4096


def gmm_neg_log_density(embedding: Any, gaussians: ClassGaussians, *, prior: str = "empirical"
                        ) -> np.ndarray:
    """DDU's epistemic estimate: the negative log density of the features under the mixture.

    Parameters
    ----------
    embedding : array_like, shape (n_samples, n_features)
        Features of the scored images.
    gaussians : ClassGaussians
        From :func:`fit_class_gaussians`.
    prior : {"empirical", "none"}, default "empirical"
        Class weights ``π_c``: the fit set's class frequencies (a mixture density, DDU's
        paper), or 1 each (the sum of the class densities, DDU's and untangle's code).

    Returns
    -------
    ndarray of float64, shape (n_samples,)
        ``−log Σ_c π_c N(z; μ_c, L_c L_cᵀ)`` (higher = less like the training features),
        computed from the Cholesky factors by triangular solves and a log-sum-exp.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> g = fit_class_gaussians(rng.normal(size=(40, 2)), np.repeat([0, 1], 20))
    >>> u = gmm_neg_log_density(np.array([[0.0, 0.0], [8.0, 8.0]]), g)
    >>> bool(u[0] < u[1])
    True
    """
    if prior not in _PRIORS:
        raise InputError(f"prior must be one of {', '.join(_PRIORS)}, got {prior!r}")
    means, factors = gaussians.means, gaussians.cholesky
    x = as_numpy(embedding, "embedding").astype(np.float64)
    if x.ndim != 2 or x.shape[1] != means.shape[1] or not np.isfinite(x).all():
        raise InputError(f"embedding must be finite features of shape (n_samples, "
                         f"{means.shape[1]}) like the fit embedding, got shape {x.shape}")
    d = means.shape[1]
    log_norm = (-0.5 * d * math.log(2 * math.pi)
                - np.log(np.diagonal(factors, axis1=1, axis2=2)).sum(axis=1))
    if prior == "empirical":
        log_norm = log_norm + gaussians.log_priors
    u = np.empty(x.shape[0])
    for i in range(0, x.shape[0], _CHUNK):
        block = x[i:i + _CHUNK]
        log_dens = np.empty((block.shape[0], means.shape[0]))
        for k in range(means.shape[0]):
            w = solve_triangular(factors[k], (block - means[k]).T, lower=True,
                                 check_finite=False)
            log_dens[:, k] = log_norm[k] - 0.5 * np.einsum("ij,ij->j", w, w)
        u[i:i + _CHUNK] = -logsumexp(log_dens, axis=1)
    return u


def _ddu_fit(fit: Mapping[str, np.ndarray], *, prior: str = "empirical") -> ClassGaussians:
    return fit_class_gaussians(fit["embedding"], fit["labels"])


def _ddu(inputs: Mapping[str, np.ndarray], state: ClassGaussians, *, prior: str = "empirical"
         ) -> np.ndarray:
    return gmm_neg_log_density(inputs["embedding"], state, prior=prior)


_DDU_REFERENCE = ("Mukhoti, Kirsch, van Amersfoort, Torr & Gal (2023), Deep deterministic "
                  "uncertainty: a new simple baseline")

#: DDU's feature density as a fitted :class:`~uqmetrics.metrics.detectors.Detector` (fit on
#: in-distribution ``embedding`` and ``labels``; ``u = −log q(z)``), so that it fits once and
#: scores any number of sets: ``DDU_DETECTOR.fitted(fit)({"embedding": z})``. Not in
#: :data:`~uqmetrics.metrics.detectors.DETECTORS`, which this module does not fill.
DDU_DETECTOR = Detector(
    "ddu", "negative log density of a class-conditional Gaussian mixture on the features "
    "(DDU; class weights: the fit frequencies)", frozenset({"embedding", "fit"}), _ddu,
    reference=_DDU_REFERENCE, fit_func=_ddu_fit, fit_keys=frozenset({"embedding", "labels"}),
    params={"prior": "empirical"})


# --------------------------------------------------------------------------------- the registry

#: What an estimator estimates.
ESTIMATES = ("aleatoric", "epistemic", "total")

#: What an estimator may read, each a key of its ``inputs`` (``fit``: of its fit mapping):
#: ``members`` (n_members, n_samples, n_classes) class probabilities of the members or passes
#: (logits with ``from_logits=True``; a single-pass predictor's (n_samples, n_classes) is one
#: member); ``embedding`` (n_samples, n_features) features before the classifier; ``learned``
#: (n_samples,) an uncertainty the method predicts itself (a loss-prediction head's output);
#: ``fit`` in-distribution fit data, ``{"embedding": (n_fit, n_features), "labels": (n_fit,)}``.
ESTIMATOR_NEEDS = ("members", "embedding", "learned", "fit")


@dataclass(frozen=True)
class Estimator:
    """One uncertainty estimator of :data:`ESTIMATORS`.

    Attributes
    ----------
    name, description : str
        Registered name and one line (CLI help).
    estimates : str
        One of :data:`ESTIMATES`: the uncertainty it is an estimate of.
    needs : frozenset of str
        A subset of :data:`ESTIMATOR_NEEDS`: the inputs it reads.
    func : callable
        ``func(inputs, state, from_logits=...) -> (n_samples,)`` float64, higher = more
        uncertain; ``inputs`` maps each need (but ``fit``) to its array (``members`` always
        3-D), ``state`` is what :attr:`fit_func` returned (None without one).
    reference : str
        The paper that defines it (authors, year, title).
    fit_func : callable, optional
        ``fit_func(fit) -> state``: fits once on in-distribution data (need ``fit``).
    min_members : int
        The fewest members for which it is informative (2 for the disagreement terms, which
        are 0 for one member); a protocol skips it for predictors with fewer.
    """

    name: str
    description: str
    estimates: str
    needs: frozenset[str]
    func: Callable[..., np.ndarray]
    reference: str
    fit_func: Callable[[Mapping[str, Any]], Any] | None = None
    min_members: int = 1

    def __post_init__(self) -> None:
        if self.estimates not in ESTIMATES:
            raise InputError(f"estimator {self.name!r}: estimates must be one of "
                             f"{', '.join(ESTIMATES)}, got {self.estimates!r}")
        unknown = set(self.needs) - set(ESTIMATOR_NEEDS)
        if unknown or not set(self.needs) - {"fit"}:
            raise InputError(f"estimator {self.name!r}: needs must be a subset of "
                             f"{', '.join(ESTIMATOR_NEEDS)} reading the scored samples, got "
                             f"{sorted(self.needs)}")
        if (self.fit_func is not None) != ("fit" in self.needs):
            raise InputError(f"estimator {self.name!r}: a fit_func goes with the need 'fit'")
        object.__setattr__(self, "needs", frozenset(self.needs))

    def fitted(self, fit: Mapping[str, Any] | None = None
               ) -> Callable[..., np.ndarray]:
        """Fit once (for need ``fit``); the returned ``scorer(inputs, *, from_logits=False)``
        scores any number of sets.

        Raises
        ------
        InputError
            ``fit`` missing for an estimator that fits.
        """
        state = None
        if self.fit_func is not None:
            if fit is None or not {"embedding", "labels"} <= set(fit):
                raise InputError(f"fit: estimator {self.name!r} fits on in-distribution data, "
                                 f"pass fit= with keys embedding, labels; got "
                                 f"{None if fit is None else sorted(fit)}")
            state = self.fit_func(fit)
        return lambda inputs, *, from_logits=False: self._score(inputs, state, from_logits)

    def _score(self, inputs: Mapping[str, Any], state: Any, from_logits: Any) -> np.ndarray:
        missing = sorted(self.needs - {"fit"} - set(inputs))
        if missing:
            raise InputError(f"inputs: estimator {self.name!r} needs {missing}, got "
                             f"{sorted(inputs)}")
        arrays = {k: inputs[k] for k in self.needs - {"fit"}}
        if "members" in arrays:
            m = as_numpy(arrays["members"], "members")
            arrays["members"] = m[None] if m.ndim == 2 else m
        u = np.asarray(self.func(arrays, state, from_logits=_check_from_logits(from_logits)),
                       dtype=np.float64)
        if u.ndim != 1 or np.isnan(u).any():
            raise InputError(f"estimator {self.name!r} returned shape {u.shape}"
                             f"{' with NaN' if np.isnan(u).any() else ''}, not (n_samples,)")
        return u

    def score(self, inputs: Mapping[str, Any], fit: Mapping[str, Any] | None = None, *,
              from_logits: bool = False) -> np.ndarray:
        """The estimate of each sample, shape (n_samples,): :meth:`fitted`, then the scorer.

        Parameters
        ----------
        inputs : mapping
            Each need (but ``fit``) of :data:`ESTIMATOR_NEEDS` -> its array.
        fit : mapping, optional
            ``{"embedding", "labels"}`` of in-distribution data, for an estimator that fits.
        from_logits : bool, default False
            Whether ``inputs["members"]`` holds logits.
        """
        return self.fitted(fit)(inputs, from_logits=from_logits)


#: Registered estimators, name -> :class:`Estimator` (a :class:`Registry`, registration order;
#: plugins: entry-point group ``uqmetrics.estimators``, loaded by :func:`get_estimator` and
#: :func:`list_estimators`).
ESTIMATORS: Registry[Estimator] = Registry("estimator", group="uqmetrics.estimators",
                                           item_type=Estimator)


def _learned(inputs: Mapping[str, Any], state: Any, *, from_logits: bool) -> np.ndarray:
    u = as_numpy(inputs["learned"], "learned").astype(np.float64)
    if u.ndim != 1 or not np.isfinite(u).all():
        raise InputError(f"learned must be a finite uncertainty of shape (n_samples,), got "
                         f"shape {u.shape}")
    return u


def _members_estimator(f: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    return lambda inputs, state, *, from_logits: f(inputs["members"], from_logits=from_logits)


for _e in (
    Estimator("one_minus_max_prob", "1 - max p of the predictive (mean) distribution",
              "total", frozenset({"members"}), _members_estimator(one_minus_max_probability),
              "Hendrycks & Gimpel (2017), A baseline for detecting misclassified and "
              "out-of-distribution examples in neural networks"),
    Estimator("entropy", "entropy of the predictive (mean) distribution H(p̄)", "total",
              frozenset({"members"}),
              _members_estimator(lambda m, from_logits: information_decomposition(
                  m, from_logits=from_logits).total),
              "Depeweg, Hernández-Lobato, Doshi-Velez & Udluft (2018), Decomposition of "
              "uncertainty in Bayesian deep learning for efficient and risk-sensitive learning"),
    Estimator("expected_entropy", "mean entropy of the members mean_s H(p_s)", "aleatoric",
              frozenset({"members"}),
              _members_estimator(lambda m, from_logits: information_decomposition(
                  m, from_logits=from_logits).aleatoric),
              "Depeweg, Hernández-Lobato, Doshi-Velez & Udluft (2018), Decomposition of "
              "uncertainty in Bayesian deep learning for efficient and risk-sensitive learning"),
    Estimator("mutual_information", "H(p̄) - mean_s H(p_s), the members' disagreement",
              "epistemic", frozenset({"members"}),
              _members_estimator(lambda m, from_logits: information_decomposition(
                  m, from_logits=from_logits).epistemic),
              "Houlsby, Huszár, Ghahramani & Lengyel (2011), Bayesian active learning for "
              "classification and preference learning", min_members=2),
    Estimator("bregman_epistemic", "mean_s KL(p̃ || p_s) about the central prediction p̃ "
              "(untangle's expected divergence)", "epistemic", frozenset({"members"}),
              _members_estimator(lambda m, from_logits: bregman_decomposition(
                  m, from_logits=from_logits).epistemic),
              "Gruber & Buettner (2023), Uncertainty estimates of predictions via a general "
              f"bias-variance decomposition; {_UNTANGLE}", min_members=2),
    Estimator("bregman_total", "mean_s H(p_s) + mean_s KL(p̃ || p_s) (untangle's expected "
              "entropy plus expected divergence)", "total", frozenset({"members"}),
              _members_estimator(lambda m, from_logits: bregman_decomposition(
                  m, from_logits=from_logits).total), _UNTANGLE),
    Estimator("ddu_density", "negative log density of the features under a class-conditional "
              "Gaussian mixture fitted on training features", "epistemic",
              frozenset({"embedding", "fit"}),
              lambda inputs, scorer, *, from_logits: scorer({"embedding": inputs["embedding"]}),
              _DDU_REFERENCE, fit_func=DDU_DETECTOR.fitted),
    Estimator("learned", "an uncertainty the method predicts itself (a loss-prediction head's "
              "output), passed through", "total", frozenset({"learned"}), _learned,
              "Yoo & Kweon (2019), Learning loss for active learning (loss prediction); "
              f"{_UNTANGLE}"),
):
    ESTIMATORS.register(_e)
del _e


def get_estimator(name: str) -> Estimator:
    """The estimator registered as ``name`` (plugins included); ``ValueError`` listing the
    names otherwise.

    >>> get_estimator("mutual_information").estimates
    'epistemic'
    """
    ESTIMATORS.load_plugins()
    return ESTIMATORS.lookup(name)


def list_estimators(estimates: str | None = None, needs: str | None = None) -> list[str]:
    """Names of the registered estimators (plugins included), optionally only those estimating
    ``estimates`` or reading ``needs``.

    >>> list_estimators("aleatoric")
    ['expected_entropy']
    """
    if estimates is not None and estimates not in ESTIMATES:
        raise InputError(f"estimates must be one of {', '.join(ESTIMATES)}, got {estimates!r}")
    ESTIMATORS.load_plugins()
    return [n for n, e in ESTIMATORS.items_ordered()
            if (estimates is None or e.estimates == estimates)
            and (needs is None or needs in e.needs)]
