"""Out-of-domain detection metrics of an uncertainty score (docs/conventions.md#s-4, UIMNET).

Every function takes uncertainties ``u`` (higher = more uncertain = more likely out-domain),
one value per sample, shape (n_samples,). The out-domain samples are the positive class.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from ._validation import check_fraction, float_array
from .registry import register_metric
from .selective import auroc_score

__all__ = [
    "in_as_in_score",
    "ood_auroc_score",
    "ood_scores",
    "ood_threshold",
    "out_as_out_score",
]

_SHAPE = "(n_samples,)"


def _u(x: Any, name: str) -> np.ndarray:
    return float_array(x, name, 1, _SHAPE)


@register_metric("ood_auroc", kind="ood",
                 properties={"permutation_invariant", "monotone_invariant"})
def ood_auroc_score(u_in: Any, u_out: Any) -> float:
    """AUROC of the uncertainty for detecting out-domain samples (out-domain positive).

    Parameters
    ----------
    u_in : array_like of float, shape (n_in,)
        Uncertainty on in-domain samples.
    u_out : array_like of float, shape (n_out,)
        Uncertainty on out-domain samples.

    Returns
    -------
    float
        ``P(u_out > u_in) + ½ P(u_out = u_in)``; 0.5 for an uninformative u.

    Notes
    -----
    Computed by :func:`uqmetrics.auroc_score` with the out-domain samples as the positive
    class and u as the score (the package has one definition of AUROC).

    References
    ----------
    "What classifiers know what they don't know?" (UIMNET, ImageNot benchmark), Section 5.

    Examples
    --------
    >>> ood_auroc_score([0.1, 0.2, 0.3], [0.25, 0.9])
    0.8333333333333334
    """
    ui, uo = _u(u_in, "u_in"), _u(u_out, "u_out")
    is_out = np.concatenate([np.zeros(ui.size, bool), np.ones(uo.size, bool)])
    return auroc_score(is_out, np.concatenate([ui, uo]))


def ood_threshold(u_in_val: Any, *, quantile: float = 0.95) -> float:
    """Detection threshold θ: a quantile of the uncertainty on in-domain validation data.

    Parameters
    ----------
    u_in_val : array_like of float, shape (n_val,)
        Uncertainty on in-domain validation samples.
    quantile : float in (0, 1], default 0.95
        The quantile (numpy's default linear interpolation).

    Returns
    -------
    float
        θ; samples with ``u > θ`` are flagged out-domain.

    Examples
    --------
    >>> ood_threshold(np.arange(101.0))
    95.0
    """
    q = check_fraction(quantile, "quantile", low=0.0, high=1.0, closed="right")
    return float(np.quantile(_u(u_in_val, "u_in_val"), q))


def _threshold(threshold: Any) -> float:
    try:
        t = float(threshold)
    except (TypeError, ValueError):
        raise ValueError(f"threshold must be a number, got {threshold!r}") from None
    if np.isnan(t):
        raise ValueError(f"threshold must not be nan, got {threshold!r}")
    return t


def in_as_in_score(u_in_test: Any, threshold: float) -> float:
    """Fraction of in-domain test samples kept as in-domain, ``mean(u <= θ)``.

    Parameters
    ----------
    u_in_test : array_like of float, shape (n_in,)
        Uncertainty on in-domain test samples.
    threshold : float
        θ, usually :func:`ood_threshold` of in-domain validation data.

    Returns
    -------
    float

    Examples
    --------
    >>> in_as_in_score([0.1, 0.5, 0.9, 0.5], 0.5)
    0.75
    """
    return float(np.mean(_u(u_in_test, "u_in_test") <= _threshold(threshold)))


def out_as_out_score(u_out_test: Any, threshold: float) -> float:
    """Fraction of OUT-domain test samples flagged as out-domain, ``mean(u > θ)``.

    Parameters
    ----------
    u_out_test : array_like of float, shape (n_out,)
        Uncertainty on out-domain test samples.
    threshold : float
        θ, usually :func:`ood_threshold` of in-domain validation data.

    Returns
    -------
    float

    Notes
    -----
    The UIMNET paper's text says "in-domain" here; that is a typo (docs/conventions.md#v-3).

    Examples
    --------
    >>> out_as_out_score([0.1, 0.5, 0.9, 0.7], 0.5)
    0.5
    """
    return float(np.mean(_u(u_out_test, "u_out_test") > _threshold(threshold)))


def ood_scores(u_in_val: Any, u_in_test: Any, u_out_test: Any, *,
               quantile: float = 0.95) -> xr.Dataset:
    """All OOD metrics of S.4 in one :class:`xarray.Dataset`.

    Parameters
    ----------
    u_in_val : array_like of float, shape (n_val,)
        Uncertainty on in-domain validation samples (sets θ).
    u_in_test : array_like of float, shape (n_in,)
        Uncertainty on in-domain test samples.
    u_out_test : array_like of float, shape (n_out,)
        Uncertainty on out-domain test samples.
    quantile : float in (0, 1], default 0.95
        Quantile of ``u_in_val`` used as θ.

    Returns
    -------
    xarray.Dataset
        Scalar variables ``auroc`` (:func:`ood_auroc_score` of the test sets), ``threshold``,
        ``in_as_in`` and ``out_as_out``; attrs record the quantile, the sample counts and the
        convention.

    Examples
    --------
    >>> ds = ood_scores(np.arange(101.0), [10.0, 99.0], [50.0, 96.0, 100.0])
    >>> float(ds.threshold), float(ds.in_as_in), float(ds.out_as_out)
    (95.0, 0.5, 0.6666666666666666)
    """
    q = check_fraction(quantile, "quantile", low=0.0, high=1.0, closed="right")
    uv = _u(u_in_val, "u_in_val")
    ui, uo = _u(u_in_test, "u_in_test"), _u(u_out_test, "u_out_test")
    theta = ood_threshold(uv, quantile=q)
    return xr.Dataset(
        {
            "auroc": ood_auroc_score(ui, uo),
            "threshold": theta,
            "in_as_in": in_as_in_score(ui, theta),
            "out_as_out": out_as_out_score(uo, theta),
        },
        attrs={
            "quantile": q,
            "n_in_val": int(uv.size),
            "n_in_test": int(ui.size),
            "n_out_test": int(uo.size),
            "convention": "S.4: out-domain positive; theta = quantile of in-domain validation u; "
                          "in_as_in = mean(u_in <= theta); out_as_out = mean(u_out > theta)",
        },
    )
