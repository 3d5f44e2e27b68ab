"""Confidence and uncertainty functions of class probabilities (docs/conventions.md#s-2).

Shapes:

- ``probs`` (n_samples, n_classes): one predictive distribution per sample, or
  (n_samples_drawn, n_samples, n_classes) with a leading sample axis -- ensemble members or
  MC-dropout passes -- in which case the single-distribution functions (softmax response,
  margin, entropy) use the mean distribution ``p̄ = mean_s p_s`` (the predictive distribution).
- ``member_probs`` (n_members, n_samples, n_classes): the sample axis is required.

With ``from_logits=True`` the input is logits of the same shape and each distribution is
``softmax(z)`` computed in float64. Every function returns one value per sample, shape
(n_samples,), in float64.

:data:`CONFIDENCE_FUNCTIONS` maps a name to a confidence function (higher = more confident;
uncertainties are negated), so that callers choose a κ by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.special import log_softmax, softmax, xlogy

from ._validation import as_numpy, check_choice, check_logits, check_probs, float_array

__all__ = [
    "CONFIDENCE_FUNCTIONS",
    "SAMPLE_CONFIDENCE_FUNCTIONS",
    "entropy",
    "expected_entropy",
    "get_confidence_function",
    "margin",
    "mutual_information",
    "negative_entropy",
    "predictive_entropy",
    "softmax_response",
]


def _check_3d(x: Any, name: str, from_logits: bool) -> np.ndarray:
    arr = float_array(x, name, 3, "(n_samples_drawn, n_samples, n_classes)")
    check = check_logits if from_logits else check_probs
    for s in range(arr.shape[0]):
        check(arr[s], f"{name}[{s}]")
    return softmax(arr, axis=-1) if from_logits else arr


def _distributions(probs: Any, name: str, from_logits: bool, *, samples: bool = False):
    """Validate ``probs`` and return float64 probabilities, (n, C) or (S, n, C).

    With ``samples`` the leading sample axis is required and kept; otherwise a 3-D input is
    averaged over its leading axis.
    """
    if not isinstance(from_logits, (bool, np.bool_)):
        raise TypeError(f"from_logits must be a bool, got {from_logits!r}")
    arr = as_numpy(probs, name)
    if samples or arr.ndim == 3:
        p = _check_3d(arr, name, bool(from_logits))
        return p if samples else p.mean(axis=0)
    if from_logits:
        return softmax(check_logits(arr, name), axis=-1)
    return check_probs(arr, name)


def _entropy(p: np.ndarray) -> np.ndarray:
    return 0.0 - np.sum(xlogy(p, p), axis=-1)  # 0.0 - 0.0 is +0.0, not -0.0


def softmax_response(probs: Any, *, from_logits: bool = False) -> np.ndarray:
    """Softmax response: the largest class probability, computed in float64.

    Parameters
    ----------
    probs : array_like, shape (n_samples, n_classes) or (n_samples_drawn, n_samples, n_classes)
        Class probabilities (logits with ``from_logits=True``); a leading sample axis is
        averaged first.
    from_logits : bool, default False
        Whether ``probs`` holds logits (softmax taken in float64).

    Returns
    -------
    ndarray of float64, shape (n_samples,)
        ``max_c p_c`` (a confidence: higher = more confident).

    Notes
    -----
    Computing in float64 matters for float16/float32 logits, whose softmax saturates at 1 for
    many confident samples and so creates spurious ties in κ.

    Examples
    --------
    >>> softmax_response([[0.7, 0.2, 0.1], [0.4, 0.5, 0.1]]).tolist()
    [0.7, 0.5]
    """
    return _distributions(probs, "probs", from_logits).max(axis=-1)


def margin(probs: Any, *, from_logits: bool = False) -> np.ndarray:
    """Margin between the largest and second-largest class probabilities.

    Parameters
    ----------
    probs : array_like, shape (n_samples, n_classes) or (n_samples_drawn, n_samples, n_classes)
        Class probabilities (logits with ``from_logits=True``); a leading sample axis is
        averaged first.
    from_logits : bool, default False
        Whether ``probs`` holds logits.

    Returns
    -------
    ndarray of float64, shape (n_samples,)
        ``p_(1) − p_(2)`` in [0, 1] (a confidence).

    Examples
    --------
    >>> margin([[0.7, 0.2, 0.1], [0.4, 0.5, 0.1]]).round(12).tolist()
    [0.5, 0.1]
    """
    p = _distributions(probs, "probs", from_logits)
    top2 = np.partition(p, p.shape[-1] - 2, axis=-1)[..., -2:]
    return top2[..., 1] - top2[..., 0]


def entropy(probs: Any, *, from_logits: bool = False) -> np.ndarray:
    """Shannon entropy of the predictive distribution (natural log, 0·log 0 = 0).

    Parameters
    ----------
    probs : array_like, shape (n_samples, n_classes) or (n_samples_drawn, n_samples, n_classes)
        Class probabilities (logits with ``from_logits=True``); a leading sample axis is
        averaged first, giving the predictive entropy (e.g. MC-dropout entropy).
    from_logits : bool, default False
        Whether ``probs`` holds logits.

    Returns
    -------
    ndarray of float64, shape (n_samples,)
        ``H(p) = −Σ_c p_c ln p_c`` in [0, ln C] (an uncertainty).

    Examples
    --------
    >>> entropy([[1.0, 0.0], [0.5, 0.5]]).tolist()
    [0.0, 0.6931471805599453]
    """
    arr = as_numpy(probs, "probs")
    if from_logits is True and arr.ndim == 2:  # log-softmax: accurate for confident logits
        logp = log_softmax(check_logits(arr, "probs"), axis=-1)
        return 0.0 - np.sum(np.exp(logp) * logp, axis=-1)
    return _entropy(_distributions(arr, "probs", from_logits))


def negative_entropy(probs: Any, *, from_logits: bool = False) -> np.ndarray:
    """Negative entropy ``−H(p)``, a confidence (higher = more confident).

    Parameters
    ----------
    probs : array_like, shape (n_samples, n_classes) or (n_samples_drawn, n_samples, n_classes)
        As for :func:`entropy`.
    from_logits : bool, default False
        Whether ``probs`` holds logits.

    Returns
    -------
    ndarray of float64, shape (n_samples,)

    Examples
    --------
    >>> negative_entropy([[0.5, 0.5]]).tolist()
    [-0.6931471805599453]
    """
    return -entropy(probs, from_logits=from_logits)


def predictive_entropy(member_probs: Any, *, from_logits: bool = False) -> np.ndarray:
    """Entropy of the mean distribution of several members or passes, ``H(mean_s p_s)``.

    Parameters
    ----------
    member_probs : array_like, shape (n_members, n_samples, n_classes)
        Class probabilities of each ensemble member or MC-dropout pass (logits with
        ``from_logits=True``).
    from_logits : bool, default False
        Whether ``member_probs`` holds logits.

    Returns
    -------
    ndarray of float64, shape (n_samples,)
        Total uncertainty in [0, ln C].

    Examples
    --------
    >>> predictive_entropy([[[1.0, 0.0]], [[0.0, 1.0]]]).tolist()
    [0.6931471805599453]
    """
    p = _distributions(member_probs, "member_probs", from_logits, samples=True)
    return _entropy(p.mean(axis=0))


def expected_entropy(member_probs: Any, *, from_logits: bool = False) -> np.ndarray:
    """Mean entropy of the members, ``mean_s H(p_s)`` (aleatoric part).

    Parameters
    ----------
    member_probs : array_like, shape (n_members, n_samples, n_classes)
        Class probabilities of each ensemble member or MC-dropout pass (logits with
        ``from_logits=True``).
    from_logits : bool, default False
        Whether ``member_probs`` holds logits.

    Returns
    -------
    ndarray of float64, shape (n_samples,)

    Examples
    --------
    >>> expected_entropy([[[1.0, 0.0]], [[0.0, 1.0]]]).tolist()
    [0.0]
    """
    p = _distributions(member_probs, "member_probs", from_logits, samples=True)
    return _entropy(p).mean(axis=0)


def mutual_information(member_probs: Any, *, from_logits: bool = False) -> np.ndarray:
    """Mutual information between the prediction and the member (epistemic uncertainty).

    Parameters
    ----------
    member_probs : array_like, shape (n_members, n_samples, n_classes)
        Class probabilities of each ensemble member or MC-dropout pass (logits with
        ``from_logits=True``).
    from_logits : bool, default False
        Whether ``member_probs`` holds logits.

    Returns
    -------
    ndarray of float64, shape (n_samples,)
        ``MI = H(mean_s p_s) − mean_s H(p_s)`` in [0, ln C]; 0 when all members agree.

    Notes
    -----
    MI >= 0 by Jensen's inequality (H is concave); negative values within rounding error are
    clipped to 0.

    References
    ----------
    Y. Gal, "Uncertainty in deep learning", PhD thesis, 2016 (BALD). A. Ashukha et al.,
    "Pitfalls of in-domain uncertainty estimation and ensembling in deep learning", ICLR 2020.

    Examples
    --------
    >>> mutual_information([[[1.0, 0.0], [0.5, 0.5]], [[0.0, 1.0], [0.5, 0.5]]]).tolist()
    [0.6931471805599453, 0.0]
    """
    p = _distributions(member_probs, "member_probs", from_logits, samples=True)
    mi = _entropy(p.mean(axis=0)) - _entropy(p).mean(axis=0)
    return np.maximum(mi, 0.0)


def _negative_expected_entropy(member_probs: Any, *, from_logits: bool = False) -> np.ndarray:
    """Confidence ``−mean_s H(p_s)``; member_probs of shape (n_members, n_samples, n_classes)."""
    return -expected_entropy(member_probs, from_logits=from_logits)


def _negative_mutual_information(member_probs: Any, *, from_logits: bool = False) -> np.ndarray:
    """Confidence ``−MI``; member_probs of shape (n_members, n_samples, n_classes)."""
    return -mutual_information(member_probs, from_logits=from_logits)


_negative_expected_entropy.__name__ = "negative_expected_entropy"
_negative_mutual_information.__name__ = "negative_mutual_information"

#: Confidence functions by name (higher = more confident). Each takes ``probs`` of shape
#: (n_samples, n_classes) or (n_samples_drawn, n_samples, n_classes) (the mean over the leading
#: axis is used) and the keyword ``from_logits``, and returns shape (n_samples,). The entries
#: named in :data:`SAMPLE_CONFIDENCE_FUNCTIONS` require the leading sample axis.
CONFIDENCE_FUNCTIONS: dict[str, Callable[..., np.ndarray]] = {
    "softmax_response": softmax_response,
    "margin": margin,
    "negative_entropy": negative_entropy,
    "negative_expected_entropy": _negative_expected_entropy,
    "negative_mutual_information": _negative_mutual_information,
}

#: Names in :data:`CONFIDENCE_FUNCTIONS` that need members/passes, shape (S, n, C).
SAMPLE_CONFIDENCE_FUNCTIONS = frozenset({"negative_expected_entropy",
                                         "negative_mutual_information"})


def get_confidence_function(name: str) -> Callable[..., np.ndarray]:
    """Look up a confidence function of :data:`CONFIDENCE_FUNCTIONS` by name.

    Examples
    --------
    >>> get_confidence_function("margin")([[0.6, 0.4]]).round(12).tolist()
    [0.2]
    """
    check_choice(name, "name", CONFIDENCE_FUNCTIONS)
    return CONFIDENCE_FUNCTIONS[name]
