"""Retrieval metrics of embeddings and their uncertainties (docs/conventions.md#s-5, URL).

Shapes: ``embeddings`` (n_samples, n_features), ``labels`` (n_samples,) integer classes,
``uncertainty`` / ``u_*`` (n_samples,) with higher = more uncertain.

Nearest neighbours use cosine similarity and never return the query itself. They are computed
in row chunks, so that the full n × n similarity matrix is never held in memory: the peak extra
memory is ``chunk_size × n_samples`` float64 values.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from ._validation import (
    check_labels,
    check_positive_int,
    check_probs,
    check_same_length,
    float_array,
)
from .confidence import entropy
from .exceptions import UndefinedMetricWarning
from .registry import register_metric
from .selective import auroc_score

__all__ = [
    "crop_consistency_score",
    "human_alignment_score",
    "nearest_neighbour_correct",
    "r_auroc_score",
    "recall_at_1_score",
]

#: Default number of similarity entries per chunk (2**22 float64 = 32 MiB).
_CHUNK_ELEMENTS = 2**22


def _nearest_neighbour(e: np.ndarray, chunk_size: int | None) -> np.ndarray:
    """Index of each sample's nearest other sample by cosine similarity, shape (n,).

    The chunk's matrix product only finds candidates: its rounding depends on the chunk's
    shape (BLAS picks the order of summation, and a one-row chunk is a matrix-vector product).
    With ``delta`` a bound on the error of a computed cosine of two rows normalised in float64,
    in any order of summation (``4 gamma_{d+2}``, gamma_k = k u / (1 - k u), u = 2^-53; Higham
    2002, *Accuracy and stability of numerical algorithms*, section 3.1), every row within
    ``6 delta`` of the chunk's row maximum is recomputed by one fixed order of summation
    (numpy's pairwise sum along the row), and the neighbour is the lowest index whose
    recomputed cosine is within ``2 delta`` (two roundings of one value) of the largest. So the
    result depends on the embeddings only, never on the chunks, and mathematically tied cosines
    go to the lowest index.
    """
    n = e.shape[0]
    if n < 2:
        raise ValueError(f"embeddings needs at least 2 samples to have a neighbour, got shape {e.shape}")
    norms = np.linalg.norm(e, axis=1)
    if np.any(norms == 0):
        raise ValueError(
            f"embeddings has a zero row (index {int(np.argmin(norms))}); cosine similarity "
            "is undefined"
        )
    e = e / norms[:, None]
    k = e.shape[1] + 2
    delta = 4.0 * k * 2.0**-53 / (1.0 - k * 2.0**-53)
    if chunk_size is None:
        chunk_size = max(1, _CHUNK_ELEMENTS // n)
    else:
        chunk_size = check_positive_int(chunk_size, "chunk_size")
    nn = np.empty(n, dtype=np.int64)
    for start in range(0, n, chunk_size):
        stop = min(start + chunk_size, n)
        sim = e[start:stop] @ e.T
        rows = np.arange(stop - start)
        sim[rows, start + rows] = -np.inf  # the query itself is not its own neighbour
        top = sim.max(axis=1)
        r, j = np.nonzero(sim >= (top - 6.0 * delta)[:, None])  # j ascending within a row
        exact = np.sum(e[start + r] * e[j], axis=1)  # one order of summation, any chunk
        best = np.full(stop - start, -np.inf)
        np.maximum.at(best, r, exact)
        tied = exact >= best[r] - 2.0 * delta
        first = np.full(stop - start, n, dtype=np.int64)
        np.minimum.at(first, r[tied], j[tied])
        nn[start:stop] = first
    return nn


def _embeddings_labels(embeddings: Any, labels: Any, chunk_size: int | None) -> np.ndarray:
    e = float_array(embeddings, "embeddings", 2, "(n_samples, n_features)")
    y = check_labels(labels)
    check_same_length(embeddings=e, labels=y)
    nn = _nearest_neighbour(e, chunk_size)
    return y[nn] == y


def nearest_neighbour_correct(embeddings: Any, labels: Any, *,
                              chunk_size: int | None = None) -> np.ndarray:
    """Whether each sample's nearest neighbour (cosine, itself excluded) has its class.

    Parameters
    ----------
    embeddings : array_like of float, shape (n_samples, n_features)
        Embeddings; rows must be non-zero.
    labels : array_like of int, shape (n_samples,)
        Class of each sample.
    chunk_size : int, optional
        Number of query rows per similarity block; the default keeps a block at 2**22 entries
        (32 MiB). The result does not depend on it.

    Returns
    -------
    ndarray of bool, shape (n_samples,)

    Notes
    -----
    ``nn(i) = argmax_{j ≠ i} <e_i, e_j> / (|e_i| |e_j|)``, ties broken towards the lowest index
    (cosines equal within their float64 rounding bound count as tied), whatever
    ``chunk_size``.

    Examples
    --------
    >>> emb = [[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.2, 0.9]]
    >>> nearest_neighbour_correct(emb, [0, 0, 1, 0]).tolist()
    [True, True, False, False]
    """
    return _embeddings_labels(embeddings, labels, chunk_size)


def recall_at_1_score(embeddings: Any, labels: Any, *, chunk_size: int | None = None) -> float:
    """Recall@1: fraction of samples whose nearest neighbour has the same class.

    Parameters
    ----------
    embeddings : array_like of float, shape (n_samples, n_features)
        Embeddings; rows must be non-zero.
    labels : array_like of int, shape (n_samples,)
        Class of each sample.
    chunk_size : int, optional
        Query rows per similarity block, see :func:`nearest_neighbour_correct`.

    Returns
    -------
    float

    Notes
    -----
    ``R@1 = mean_i 1[y_{nn(i)} = y_i]`` with cosine similarity, the query itself excluded.

    References
    ----------
    M. Kirchhof, B. Mucsányi, S. J. Oh, E. Kasneci, "URL: A representation learning benchmark
    for transferable uncertainty estimates", NeurIPS 2023 Datasets and Benchmarks.

    Examples
    --------
    >>> emb = [[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.2, 0.9]]
    >>> recall_at_1_score(emb, [0, 0, 1, 1])
    1.0
    >>> recall_at_1_score(emb, [0, 1, 0, 1])  # each sample's neighbour has the other class
    0.0
    """
    return float(np.mean(_embeddings_labels(embeddings, labels, chunk_size)))


@register_metric("r_auroc", kind="retrieval",
                 properties={"permutation_invariant", "monotone_invariant"})
def r_auroc_score(embeddings: Any, labels: Any, uncertainty: Any, *,
                  chunk_size: int | None = None) -> float:
    """R-AUROC: AUROC of the uncertainty for detecting Recall@1 errors.

    Parameters
    ----------
    embeddings : array_like of float, shape (n_samples, n_features)
        Embeddings; rows must be non-zero.
    labels : array_like of int, shape (n_samples,)
        Class of each sample.
    uncertainty : array_like of float, shape (n_samples,)
        Uncertainty u of each embedding; higher = more uncertain.
    chunk_size : int, optional
        Query rows per similarity block, see :func:`nearest_neighbour_correct`.

    Returns
    -------
    float
        ``P(u_wrong > u_right) + ½ P(tie)``, where "wrong" samples have a nearest neighbour of
        another class (the positives); exactly 0.5 for a constant u. ``nan`` with an
        :class:`UndefinedMetricWarning` if all neighbours are right or all are wrong.

    Notes
    -----
    Computed by :func:`uqmetrics.auroc_score` (the package's one AUROC) with
    ``correct = not nearest_neighbour_correct`` and ``confidence = u``.

    References
    ----------
    M. Kirchhof et al., "URL", NeurIPS 2023 Datasets and Benchmarks (Algorithm 1).

    Examples
    --------
    >>> emb = [[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.2, 0.9]]
    >>> r_auroc_score(emb, [0, 0, 1, 0], [0.1, 0.2, 0.9, 0.3])
    1.0
    >>> r_auroc_score(emb, [0, 0, 1, 0], [0.5, 0.5, 0.5, 0.5])
    0.5
    """
    u = float_array(uncertainty, "uncertainty", 1, "(n_samples,)")
    check_same_length(labels=check_labels(labels), uncertainty=u)
    right = _embeddings_labels(embeddings, labels, chunk_size)
    return auroc_score(~right, u)


@register_metric("recall_at_1", kind="retrieval",
                 properties={"permutation_invariant", "monotone_invariant"})
def _recall_at_1_metric(embeddings: Any, labels: Any, uncertainty: Any) -> float:
    """Recall@1 of the embeddings, :func:`recall_at_1_score` (``uncertainty`` is unused).

    Registered with the retrieval signature ``f(embeddings, labels, uncertainty)``; the
    uncertainty is validated (shape ``(n_samples,)``) and otherwise ignored.
    """
    u = float_array(uncertainty, "uncertainty", 1, "(n_samples,)")
    check_same_length(labels=check_labels(labels), uncertainty=u)
    return recall_at_1_score(embeddings, labels)


def crop_consistency_score(u_full: Any, u_cropped: Any) -> float:
    """Fraction of images whose uncertainty grows after cropping.

    Parameters
    ----------
    u_full : array_like of float, shape (n_samples,)
        Uncertainty of each full image.
    u_cropped : array_like of float, shape (n_samples,)
        Uncertainty of the same images after a centre crop (URL: to a fixed random fraction of
        the image in [0.1, 0.75]).

    Returns
    -------
    float
        ``mean_i 1[u_cropped_i > u_full_i]`` (strictly greater; ties do not count).

    Examples
    --------
    >>> crop_consistency_score([0.1, 0.5, 0.3, 0.2], [0.2, 0.4, 0.3, 0.9])
    0.5
    """
    uf = float_array(u_full, "u_full", 1, "(n_samples,)")
    uc = float_array(u_cropped, "u_cropped", 1, "(n_samples,)")
    check_same_length(u_full=uf, u_cropped=uc)
    return float(np.mean(uc > uf))


def human_alignment_score(uncertainty: Any, human_label_probs: Any) -> float:
    """Spearman correlation of the uncertainty with the entropy of the human label distribution.

    Parameters
    ----------
    uncertainty : array_like of float, shape (n_samples,)
        Model uncertainty u of each image.
    human_label_probs : array_like of float, shape (n_samples, n_classes)
        Distribution of the human annotations of each image (rows sum to 1).

    Returns
    -------
    float
        ``spearman(u, H(P_human))`` in [-1, 1]; ``nan`` with an
        :class:`UndefinedMetricWarning` when either is constant.

    References
    ----------
    M. Kirchhof et al., "URL", NeurIPS 2023 Datasets and Benchmarks, Section 4.6.

    Examples
    --------
    >>> human = [[1.0, 0.0], [0.5, 0.5], [0.9, 0.1]]
    >>> human_alignment_score([0.0, 1.0, 0.4], human)
    1.0
    """
    u = float_array(uncertainty, "uncertainty", 1, "(n_samples,)")
    h = entropy(check_probs(human_label_probs, "human_label_probs"))
    check_same_length(uncertainty=u, human_label_probs=h)
    if u.size < 2 or np.all(u == u[0]) or np.all(h == h[0]):
        warnings.warn(
            "human alignment is undefined when the uncertainty or the human entropy is "
            "constant (or n < 2); returning nan",
            UndefinedMetricWarning,
            stacklevel=2,
        )
        return float("nan")
    return float(spearmanr(u, h).statistic)
