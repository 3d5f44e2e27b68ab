"""Uncertainty measures of the UIMNET protocol (docs/conventions.md#v-3), one registry entry each.

A measure maps what a predictor produced on a set of images (:class:`MeasureInput`) to one
uncertainty per image, higher = more likely out-domain. :data:`MEASURES` holds the paper's
seven, ``largest``, ``gap``, ``entropy``, ``jacobian``, ``gmm``, ``tta`` and ``native``, and one
variant, ``jacobian_softmax``. Every measure reads cached arrays; the ones that need a model
pass (``jacobian`` and ``jacobian_softmax``: input gradients; ``tta``: augmented passes;
``gmm``'s training-split fits: the training images' features) and the algorithm's own ``native`` value
are computed when the caches are written (:func:`jacobian_logits`, :func:`jacobian_norm`,
:func:`gmm_train_uncertainty`, :mod:`uqvision.protocols.uimnet.reproduce`).

``jacobian`` is UIMNET's released one (``uimnet/measures/jacobian.py``): the mean over input
elements of the squared gradient of the sum of the τ-scaled logits, NaN for ensembles and MC
dropout; ``jacobian_softmax`` is ‖∂q/∂x‖²_F of the calibrated predictor q.

``gmm`` has three fits (:data:`GMM_FITS`): ``train-ledoit-wolf`` (the default: class Gaussians
on the in-domain *training* split, Ledoit–Wolf covariances), ``official`` (the released code:
the same fit set, sample covariance + 0.1 I) and ``validation-ledoit-wolf`` (on half of
in-domain validation, Ledoit–Wolf covariances). The two training-split fits are computed when a
run cache is written (:data:`GMM_TRAIN_FITS`). The validation fit is *fitted* on the reference
(:attr:`Measure.fitted`): its u on those same samples is in-sample — systematically lower than
on unseen in-domain images — and a 95 % quantile taken there is no 5 % type-I threshold. A
protocol fits such a measure on one part of in-domain validation and sets its thresholds on
the other (:func:`reference_split`, class-stratified and seeded;
:func:`uqvision.protocols.uimnet.score.score_ood`). The other measures fit nothing on
validation, so their u on validation and on in-domain test are exchangeable and their
thresholds use all of it.

The probability-based measures call uqmetrics' confidence functions (one definition each).

Examples
--------
>>> import numpy as np
>>> inp = MeasureInput(np.log([[[0.5, 0.25, 0.25]]]))  # (member 1, n 1, C 3)
>>> MEASURES.lookup("largest")(inp).tolist(), MEASURES.lookup("gap")(inp).tolist()
([-0.5], [-0.25])

References
----------
.. [1] Bouchacourt et al. UIMNET, Section 4 (measures) and Section 3 (native measures);
   its code, github.com/facebookresearch/uimnet.
.. [2] Mukhoti et al. Deterministic neural networks with appropriate inductive biases capture
   epistemic and aleatoric uncertainty (DDU), 2021 (GMM on features).
.. [3] Novak et al. Sensitivity and generalization in neural networks: an empirical study,
   2018 (the input-Jacobian norm).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy.special import logsumexp
from sklearn.covariance import LedoitWolf
from uqmetrics import (
    calibration_splits,
    entropy,
    margin,
    mutual_information,
    softmax_response,
)
from uqmetrics.metrics.calibration import softmax
from uqmetrics.metrics.registry import Registry

from . import DEFAULT_GMM_FIT

__all__ = ["DEFAULT_GMM_FIT", "GMM_COVARIANCE", "GMM_FITS", "GMM_TRAIN_FITS", "MEASURES",
           "OFFICIAL_GMM_EPS",
           "GaussianClasses", "Measure", "MeasureInput", "calibrated_log_probs",
           "gmm_train_uncertainty", "jacobian_logits", "jacobian_norm", "measures_for",
           "reference_split", "stratified_subset"]

#: The released code's ridge on each class's sample covariance (``eps`` of
#: ``configs/release/06_mog.yaml``), in feature units.
OFFICIAL_GMM_EPS = 0.1
#: How each GMM fit estimates its class Gaussians (recorded in ``ood.nc``, attr
#: ``gmm_covariance``), by fit name (:data:`GMM_FITS`).
GMM_COVARIANCE = {
    "train-ledoit-wolf": "per class of the in-domain training split (the runs' 90 %, "
                         "evaluation transform): sklearn.covariance.LedoitWolf (shrinkage "
                         "towards a scaled identity), plus a ridge of 1e-6 x the mean feature "
                         "variance",
    "official": "per class of the in-domain training split (the runs' 90 %, evaluation "
                "transform): the sample covariance (ddof 1) plus 0.1 I, as "
                "uimnet/modules/gaussian_mixture.py with eps = 0.1 (configs/release/06_mog.yaml)",
    "validation-ledoit-wolf": "per class of the reference_split 'fit' half of in-domain "
                              "validation: sklearn.covariance.LedoitWolf (shrinkage towards a "
                              "scaled identity), plus a ridge of 1e-6 x the mean feature "
                              "variance"}
#: The GMM fits on the in-domain *training* split, computed when a run cache is written
#: (:func:`gmm_train_uncertainty`): fit name -> (the :class:`MeasureInput` field and run-cache
#: variable ``<set>_<field>`` that hold its u, the ``covariance`` of
#: :meth:`GaussianClasses.fit`). A run cache records each variable's estimator
#: (:data:`GMM_COVARIANCE`) in its attr ``uimnet`` (``gmm_train.covariance``).
GMM_TRAIN_FITS = {"train-ledoit-wolf": ("gmm_train_ledoit_wolf", "ledoit-wolf"),
                  "official": ("gmm_train", "sample")}


def calibrated_log_probs(member_logits, temperature: float = 1.0) -> np.ndarray:
    """Log-probabilities of the calibrated predictor ``softmax(log p̄ / τ)``, ``p̄ = mean_k
    softmax(z_k)``, shape (n, C) (or (..., n, C) for leading axes after the member axis).

    The one predictor of a (K-member) ensemble at temperature τ: τ is fitted on it, and
    every measure and metric reads it. For K = 1 it is ``softmax(z / τ)``.

    Parameters
    ----------
    member_logits : array_like, shape (member, ..., n, C)
    temperature : float, default 1.0

    Returns
    -------
    numpy.ndarray of float64, shape (..., n, C)

    Examples
    --------
    >>> z = np.log([[[0.5, 0.25, 0.25]]])
    >>> np.exp(calibrated_log_probs(z, 1.0)).round(3).tolist()
    [[0.5, 0.25, 0.25]]
    """
    z = np.asarray(member_logits, np.float64)
    lp = z - logsumexp(z, axis=-1, keepdims=True)
    log_mean = logsumexp(lp, axis=0) - np.log(lp.shape[0])
    scaled = log_mean / float(temperature)
    return scaled - logsumexp(scaled, axis=-1, keepdims=True)


@dataclass(frozen=True)
class MeasureInput:
    """What a predictor (an ensemble of ``member`` networks) produced on one set of images.

    Attributes
    ----------
    logits : numpy.ndarray, shape (member, n, C)
        Logits at τ = 1 (a stochastic-pass method: log of its mean pass probabilities).
    temperature : float
        τ of the calibrated predictor ``softmax(log p̄ / τ)``, ``p̄`` the members' mean
        softmax at τ = 1 (:attr:`probs`; :func:`calibrated_log_probs`).
    labels : numpy.ndarray of int, shape (n,), optional
        Needed on the reference (validation) set by ``gmm``.
    features : numpy.ndarray, shape (member, n, d), optional
        Penultimate features φ(x) (``gmm``).
    tta : numpy.ndarray, shape (member, aug, n, C), optional
        Logits of random augmentations of each image (``tta``).
    native : numpy.ndarray, shape (member, n), optional
        Each member's own uncertainty (NaN where the algorithm has none).
    jacobian : numpy.ndarray, shape (n,), optional
        UIMNET's Jacobian measure of this ensemble at this τ, NaN for an ensemble of several
        networks or MC dropout (:func:`jacobian_logits`).
    jacobian_softmax : numpy.ndarray, shape (n,), optional
        ``||∂q(x)/∂x||_F²`` of the calibrated predictor q at this τ (:func:`jacobian_norm`).
    gmm_train : numpy.ndarray, shape (member, n), optional
        Each member's ``-log Σ_c λ_c N(φ(x); μ_c, Σ_c)`` under its class Gaussians fitted on
        the in-domain training split, sample covariance + 0.1 I
        (:func:`gmm_train_uncertainty`; ``gmm``, fit ``official``).
    gmm_train_ledoit_wolf : numpy.ndarray, shape (member, n), optional
        The same with Ledoit–Wolf class covariances (``gmm``, fit ``train-ledoit-wolf``).
    """

    logits: np.ndarray
    temperature: float = 1.0
    labels: np.ndarray | None = None
    features: np.ndarray | None = None
    tta: np.ndarray | None = None
    native: np.ndarray | None = None
    jacobian: np.ndarray | None = None
    jacobian_softmax: np.ndarray | None = None
    gmm_train: np.ndarray | None = None
    gmm_train_ledoit_wolf: np.ndarray | None = None

    def __post_init__(self):
        z = np.asarray(self.logits)
        if z.ndim != 3:
            raise ValueError(f"logits must have shape (member, n, C), got {z.shape}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature!r}")

    @property
    def member_probs(self) -> np.ndarray:
        """``softmax(logits / τ)``, shape (member, n, C), float64: each member on its own
        (the native disagreement between members); the predictor is :attr:`probs`."""
        return softmax(np.asarray(self.logits, np.float64), temperature=self.temperature)

    @property
    def probs(self) -> np.ndarray:
        """The calibrated predictor ``softmax(log p̄ / τ)``, shape (n, C), float64
        (:func:`calibrated_log_probs`)."""
        return np.exp(calibrated_log_probs(self.logits, self.temperature))

    def subset(self, index) -> MeasureInput:
        """The same input restricted to images ``index`` (int array of shape (m,) or a boolean
        mask of shape (n,)), every per-image array indexed along its image axis.

        ``jacobian`` and ``jacobian_softmax`` are not carried (set to None): the UIMNET
        caches hold them for a ``jacobian_max``-image subset of a set only
        (:func:`stratified_subset`), so they are not aligned with ``index``.
        """
        idx = np.asarray(index)
        n = np.asarray(self.logits).shape[1]
        if idx.dtype == bool and idx.shape == (n,):
            idx = np.flatnonzero(idx)
        if idx.ndim != 1 or not (idx.size == 0 or np.issubdtype(idx.dtype, np.integer)
                                 and 0 <= idx.min() and idx.max() < n):
            raise ValueError(f"index must be a 1-d int array in [0, {n}) or a boolean mask of "
                             f"shape ({n},), got {index!r}")
        idx = idx.astype(np.intp)

        def take(value, axis):
            return None if value is None else np.take(np.asarray(value), idx, axis=axis)
        return MeasureInput(logits=take(self.logits, 1), temperature=self.temperature,
                            labels=take(self.labels, 0), features=take(self.features, 1),
                            tta=take(self.tta, 2), native=take(self.native, 1),
                            gmm_train=take(self.gmm_train, 1),
                            gmm_train_ledoit_wolf=take(self.gmm_train_ledoit_wolf, 1))

    def need(self, name: str) -> np.ndarray:
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"this measure needs {name!r}, which the input does not hold")
        return np.asarray(value)


@dataclass(frozen=True)
class Measure:
    """A registered measure: ``func(inp, reference) -> u`` of shape (n,); ``reference`` is the
    in-domain validation input (only ``gmm`` uses it).

    Attributes
    ----------
    fitted : bool
        True when ``func`` estimates something from ``reference`` (``gmm``): u of the
        reference's own samples is then in-sample, and thresholds must be set on samples the
        fit did not see (:func:`reference_split`).
    """

    name: str
    description: str
    func: Callable[[MeasureInput, MeasureInput], np.ndarray]
    fitted: bool = False

    def __call__(self, inp: MeasureInput, reference: MeasureInput | None = None) -> np.ndarray:
        return np.asarray(self.func(inp, reference if reference is not None else inp),
                          dtype=np.float64)


#: The seven UIMNET measures, in the paper's order, then ``jacobian_softmax``; ``gmm`` is the
#: :data:`DEFAULT_GMM_FIT` (:func:`measures_for` picks another).
MEASURES: Registry[Measure] = Registry("uncertainty measure")
#: The three fits of ``gmm``: fit name -> :class:`Measure` (named ``gmm``), the default
#: (:data:`DEFAULT_GMM_FIT`) first.
GMM_FITS: Registry[Measure] = Registry("GMM fit")


def _measure(name: str, description: str, *, fitted: bool = False):
    def deco(func):
        MEASURES.add(name, Measure(name, description, func, fitted))
        return func
    return deco


@_measure("largest", "minus the largest score of the predictor, -s_(1)")
def _largest(inp, ref):
    return -softmax_response(inp.probs)


@_measure("gap", "softmax gap s_(2) - s_(1)")
def _gap(inp, ref):
    return -margin(inp.probs)


@_measure("entropy", "Shannon entropy of the predictor, -sum_c s_c log s_c")
def _entropy(inp, ref):
    return entropy(inp.probs)


@_measure("jacobian", "mean over input elements of (d sum_c z_c(x)/tau / dx)^2 (UIMNET's code), "
                      "NaN for ensembles and MC dropout; from a model pass")
def _jacobian(inp, ref):
    return inp.need("jacobian")


def _gmm_train(field: str):
    """The measure of a training-split fit: each member's cached u (``field``), averaged."""
    def func(inp, ref):
        return np.mean(inp.need(field), axis=0)
    return func


def _gmm_validation(inp, ref):
    feats, ref_feats = inp.need("features"), ref.need("features")
    labels = ref.need("labels")
    return np.mean([GaussianClasses.fit(r, labels).uncertainty(f)
                    for f, r in zip(feats, ref_feats, strict=True)], axis=0)


GMM_FITS.add("train-ledoit-wolf", Measure(
    "gmm", "-log sum_c lambda_c N(phi(x); mu_c, Sigma_c), class Gaussians fitted on the "
           "in-domain training split, Ledoit-Wolf covariances (mean over members)",
    _gmm_train(GMM_TRAIN_FITS["train-ledoit-wolf"][0])))
GMM_FITS.add("official", Measure(
    "gmm", "-log sum_c lambda_c N(phi(x); mu_c, Sigma_c), class Gaussians fitted on the "
           "in-domain training split, sample covariance + 0.1 I (mean over members)",
    _gmm_train(GMM_TRAIN_FITS["official"][0])))
GMM_FITS.add("validation-ledoit-wolf", Measure(
    "gmm", "-log sum_c lambda_c N(phi(x); mu_c, Sigma_c), Ledoit-Wolf class Gaussians fitted "
           "on half of in-domain validation (mean over members)", _gmm_validation, fitted=True))
MEASURES.add("gmm", GMM_FITS.lookup(DEFAULT_GMM_FIT))


@_measure("tta", "-max_c of the predictor's softmax averaged over random augmentations")
def _tta(inp, ref):
    z = inp.need("tta")  # (member, aug, n, C): the predictor on each augmentation
    return -softmax_response(np.exp(calibrated_log_probs(z, inp.temperature)))


@_measure("native", "the algorithm's own: Jensen-Shannon between members (ensembles, "
                    "MC dropout) or the single network's native value")
def _native(inp, ref):
    if np.asarray(inp.logits).shape[0] > 1:
        return mutual_information(inp.member_probs)
    return inp.need("native")[0]


@_measure("jacobian_softmax", "||d softmax(log pbar(x)/tau) / dx||_F^2 of the calibrated "
                              "predictor (Novak et al.), from a model pass")
def _jacobian_softmax(inp, ref):
    return inp.need("jacobian_softmax")


def measures_for(gmm_fit: str = DEFAULT_GMM_FIT) -> dict[str, Measure]:
    """Every measure of :data:`MEASURES` by name, in its order, with ``gmm`` the fit
    ``gmm_fit`` (a name in :data:`GMM_FITS`).

    Examples
    --------
    >>> measures_for("validation-ledoit-wolf")["gmm"].fitted, measures_for()["gmm"].fitted
    (True, False)
    """
    chosen = GMM_FITS.lookup(gmm_fit)
    return {name: chosen if name == "gmm" else MEASURES.lookup(name) for name in MEASURES.names()}


def reference_split(labels, *, fit_fraction: float = 0.5,
                    seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Split a reference (in-domain validation) set for a fitted measure: fit on one part, set
    thresholds on the other.

    Parameters
    ----------
    labels : array_like of int, shape (n,)
        Reference labels; the split is stratified by them.
    fit_fraction : float in (0, 1), default 0.5
        Share of the samples the measure is fitted on (``round(fit_fraction * n)``, at least 1
        and at most ``n - 1``).
    seed : int, default 0
        Seed of the random choice within each class.

    Returns
    -------
    fit, held : numpy.ndarray of int, shapes (n_fit,), (n - n_fit,)
        Sorted, disjoint indices covering ``range(n)``; each class's count in ``fit`` is within
        1 of ``n_c * n_fit / n`` (:func:`uqmetrics.calibration_splits`, protocol
        ``stratified_holdout``).

    Notes
    -----
    Given the fit, u of the ``held`` samples and of in-domain test images are exchangeable,
    so the q-quantile of u on ``held`` keeps a fraction q of in-domain test in expectation (up
    to O(1 / n_held)); on the ``fit`` samples themselves u is in-sample and biased low.

    Examples
    --------
    >>> fit, held = reference_split([0, 0, 0, 0, 1, 1], seed=0)
    >>> len(fit), len(held), sorted(np.r_[fit, held].tolist()) == list(range(6))
    (3, 3, True)
    """
    y = np.asarray(labels)
    if y.ndim != 1 or y.size < 2:
        raise ValueError(f"labels must have shape (n,) with n >= 2, got shape {y.shape}")
    if not 0.0 < float(fit_fraction) < 1.0:
        raise ValueError(f"fit_fraction must lie in (0, 1), got {fit_fraction!r}")
    n_fit = min(max(round(float(fit_fraction) * y.size), 1), y.size - 1)
    ((fit, held),) = calibration_splits(y, protocol="stratified_holdout", n_calib=n_fit,
                                        seed=seed)
    return fit, held


def stratified_subset(labels, size: int, *, seed: int = 0) -> np.ndarray:
    """A seeded, class-stratified subset of ``size`` of the images (the Jacobian measure's
    images of a set: a set's folder order is class order, so its first images are a few
    classes only).

    Parameters
    ----------
    labels : array_like of int, shape (n,)
    size : int >= 1
        Images kept (all of them when ``size >= n``).
    seed : int, default 0

    Returns
    -------
    numpy.ndarray of int, shape (min(size, n),)
        Sorted indices; each class's count is within 1 of its proportional share
        ``n_c * size / n`` (:func:`uqmetrics.calibration_splits`, protocol
        ``stratified_holdout``).

    Examples
    --------
    >>> stratified_subset([0, 0, 0, 0, 1, 1, 1, 1], 4, seed=0).size
    4
    """
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"labels must have shape (n,), got shape {y.shape}")
    if int(size) < 1:
        raise ValueError(f"size must be >= 1, got {size!r}")
    if int(size) >= y.size:
        return np.arange(y.size)
    ((part, _),) = calibration_splits(y, protocol="stratified_holdout", n_calib=int(size),
                                      seed=seed)
    return np.sort(np.asarray(part, dtype=np.intp))


@dataclass(frozen=True)
class GaussianClasses:
    """Class-conditional Gaussians ``N(μ_c, Σ_c)`` with class weights ``λ_c`` (the class's
    share of the fit samples).

    Two estimates of Σ_c (:meth:`fit`, ``covariance``; :data:`GMM_COVARIANCE`):

    - ``"ledoit-wolf"``: the Ledoit–Wolf shrinkage estimate
      (:class:`sklearn.covariance.LedoitWolf`: the sample covariance shrunk towards
      ``trace/d · I`` by the analytically optimal weight), so a class with fewer fit samples
      than feature dimensions (``n_c < d``) gets a full-rank, well-conditioned covariance: a
      density, not a distance to the affine hull of its samples (which a tiny ridge on the
      singular sample covariance would be). ``reg`` (default ``1e-6`` times the mean feature
      variance) is added only as a floor for degenerate classes (one sample, or constant
      features);
    - ``"sample"``: UIMNET's released estimate, the unbiased sample covariance (divisor
      ``n_c - 1``) plus ``reg · I``, ``reg`` default :data:`OFFICIAL_GMM_EPS` = 0.1 in feature
      units. Every class needs at least 2 samples.
    """

    weights: np.ndarray
    means: np.ndarray
    chol: np.ndarray

    @classmethod
    def fit(cls, features, labels, *, covariance: str = "ledoit-wolf",
            reg: float | None = None) -> GaussianClasses:
        """Fit one Gaussian per class present in ``labels`` (shape (n,)) on ``features``
        (shape (n, d)); ``covariance`` is ``"ledoit-wolf"`` or ``"sample"``."""
        x = np.asarray(features, np.float64)
        y = np.asarray(labels)
        if x.ndim != 2 or y.shape != (x.shape[0],):
            raise ValueError(f"features must be (n, d) and labels (n,), got {x.shape}, {y.shape}")
        if covariance not in ("ledoit-wolf", "sample"):
            raise ValueError(f"covariance must be 'ledoit-wolf' or 'sample', got {covariance!r}")
        if reg is None:
            reg = (OFFICIAL_GMM_EPS if covariance == "sample"
                   else 1e-6 * float(x.var(axis=0).mean() or 1.0))
        classes = np.unique(y)
        d = x.shape[1]
        means, chols = [], []
        for c in classes:
            xc = x[y == c]
            mu = xc.mean(axis=0)
            if covariance == "sample":
                if len(xc) < 2:
                    raise ValueError(f"class {c!r} has {len(xc)} fit sample(s); the sample "
                                     "covariance (divisor n - 1) needs 2")
                centred = xc - mu
                base = centred.T @ centred / (len(xc) - 1)
            else:
                degenerate = len(xc) < 2 or not np.ptp(xc, axis=0).any()
                base = np.zeros((d, d)) if degenerate else LedoitWolf().fit(xc).covariance_
            means.append(mu)
            chols.append(np.linalg.cholesky(base + reg * np.eye(d)))
        w = np.array([(y == c).mean() for c in classes])
        return cls(w, np.array(means), np.array(chols))

    @property
    def covariances(self) -> np.ndarray:
        """Σ_c, shape (class, d, d)."""
        return self.chol @ np.swapaxes(self.chol, -1, -2)

    def log_density(self, features) -> np.ndarray:
        """``log Σ_c λ_c N(x; μ_c, Σ_c)``, shape (n,)."""
        x = np.asarray(features, np.float64)
        d = x.shape[1]
        terms = []
        for w, mu, lo in zip(self.weights, self.means, self.chol, strict=True):
            sol = np.linalg.solve(lo, (x - mu).T)
            logdet = 2 * np.log(np.diag(lo)).sum()
            terms.append(np.log(w) - 0.5 * (np.sum(sol ** 2, axis=0) + logdet
                                            + d * np.log(2 * np.pi)))
        return logsumexp(np.array(terms), axis=0)

    def uncertainty(self, features) -> np.ndarray:
        """``-log Σ_c λ_c N(x; μ_c, Σ_c)``: the paper's ``-Σ_c λ_c N`` under a monotone map
        (AUC and quantile thresholds are unchanged by it), without underflow."""
        return -self.log_density(features)


def gmm_train_uncertainty(train_features, train_labels, features: dict, *,
                          fit: str = "official") -> dict:
    """The GMM measure of one network fitted on its features of the in-domain *training*
    split, evaluated on other sets: with ``fit="official"`` UIMNET's released one (sample
    covariance + 0.1 I, :class:`GaussianClasses` with ``covariance="sample"``), with
    ``fit="train-ledoit-wolf"`` the Ledoit–Wolf class covariances (``covariance=
    "ledoit-wolf"``, its default floor).

    Parameters
    ----------
    train_features : array_like, shape (n_train, d)
        φ of the training split's images (evaluation transform).
    train_labels : array_like of int, shape (n_train,)
    features : dict
        Set name -> φ of its images, shape (n_set, d).
    fit : str, default "official"
        A training-split fit, a name in :data:`GMM_TRAIN_FITS`.

    Returns
    -------
    dict
        Set name -> ``-log Σ_c λ_c N(φ; μ_c, Σ_c)``, shape (n_set,), float64 (λ_c = the
        class's share of the training split). The released code returns ``+log`` of this
        density (``uimnet/modules/gaussian_mixture.py``); the sign here is the paper's
        ``-Σ_c λ_c N`` (higher = more likely out-domain), under a monotone map.
    """
    if fit not in GMM_TRAIN_FITS:
        raise ValueError(f"fit must be one of {sorted(GMM_TRAIN_FITS)} (the GMM fits on the "
                         f"training split), got {fit!r}")
    gmm = GaussianClasses.fit(train_features, train_labels,
                              covariance=GMM_TRAIN_FITS[fit][1])
    return {name: gmm.uncertainty(f) for name, f in features.items()}


def jacobian_logits(members, x, *, temperature: float = 1.0, stochastic: bool = False):
    """UIMNET's released Jacobian measure (``uimnet/measures/jacobian.py``): per image, the
    mean over the input elements of the squared gradient of the sum of the τ-scaled logits,
    ``mean_j (∂ Σ_c z_c(x) / τ / ∂x_j)²``.

    Parameters
    ----------
    members : sequence of torch.nn.Module
        The ensemble's networks in eval mode, each ``x -> logits`` of shape (n, C).
    x : torch.Tensor, shape (n, ...)
    temperature : float
    stochastic : bool
        True for a network whose predictions average stochastic passes (MC dropout).

    Returns
    -------
    torch.Tensor of float64, shape (n,)
        NaN for every image when ``members`` holds more than one network or ``stochastic``:
        the released code marks the measure invalid for its ``Ensemble`` and ``MCDropout``
        algorithms. Larger = more likely out-domain (the released code feeds the value to
        its AUC and thresholds unchanged).

    Notes
    -----
    For logits ``W x + b`` the gradient is ``Σ_c W_c / τ`` whatever x, so the measure is
    ``mean_j (Σ_c W_cj)² / τ²``. One backward pass; images do not interact in eval mode,
    so the gradient of the batch's sum is each image's own.
    """
    if len(members) != 1 or stochastic:
        return torch.full((x.shape[0],), math.nan, dtype=torch.float64, device=x.device)
    x = x.detach().clone().requires_grad_(True)
    (net,) = members
    scaled = net(x) / temperature
    (g,) = torch.autograd.grad(scaled.sum(), x)
    return g.flatten(1).double().pow(2).mean(1).detach()


def jacobian_norm(members, x, *, temperature: float = 1.0):
    """The ``jacobian_softmax`` measure: ``||∂ q(x) / ∂x||_F²`` per image,
    ``q = softmax(log p̄ / τ)`` the calibrated predictor,
    ``p̄ = mean_k softmax(f_k(x))`` (:func:`calibrated_log_probs`).

    Parameters
    ----------
    members : sequence of torch.nn.Module
        The ensemble's networks in eval mode, each ``x -> logits`` of shape (n, C).
    x : torch.Tensor, shape (n, ...)
    temperature : float

    Returns
    -------
    torch.Tensor, shape (n,)
        The squared Frobenius norm of each image's (C × input) Jacobian, from C backward
        passes (exact, no random projection).
    """
    x = x.detach().clone().requires_grad_(True)
    lp = torch.stack([torch.log_softmax(m(x), dim=-1) for m in members])
    log_mean = torch.logsumexp(lp, 0) - math.log(len(members))
    p = torch.softmax(log_mean / temperature, dim=-1)
    total = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
    for c in range(p.shape[1]):
        (g,) = torch.autograd.grad(p[:, c].sum(), x, retain_graph=c + 1 < p.shape[1])
        total += g.flatten(1).double().pow(2).sum(1)
    return total.detach()
