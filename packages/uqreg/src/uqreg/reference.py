"""Exact Bayesian linear regression under the flat reference prior, σ known (R.2).

``γ | D ~ N(γ̂, σ² V)`` with ``V = (ΦᵀΦ)⁻¹`` and ``γ̂ = V Φᵀ y``. At test inputs the prediction is
``G(x*)ᵀγ̂`` with epistemic standard deviation ``σ·sqrt(G(x*)ᵀ V G(x*))``. Both come from a
thin QR decomposition ``Φ = QR`` (never an explicit inverse): ``γ̂ = R⁻¹Qᵀy`` and
``G(x*)ᵀ V G(x*) = ‖R⁻ᵀ G(x*)‖²``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import qr, solve_triangular


@dataclass(frozen=True)
class ReferencePosterior:
    """The exact posterior for one design and one or more target vectors.

    Attributes
    ----------
    mean : ndarray, shape (R, p)
        Posterior means γ̂, one per target vector (repetition).
    sigma : float
        Known noise standard deviation.
    r : ndarray, shape (p, p)
        Upper-triangular factor of the column-pivoted QR ``Φ[:, perm] = QR``.
    perm : ndarray of int, shape (p,)
        Column permutation of the pivoted QR.
    """

    mean: np.ndarray
    sigma: float
    r: np.ndarray
    perm: np.ndarray

    @property
    def covariance(self) -> np.ndarray:
        """Posterior covariance σ²(ΦᵀΦ)⁻¹, shape (p, p) (for inspection; not used internally)."""
        p = self.r.shape[0]
        rinv = solve_triangular(self.r, np.eye(p))
        cov = np.empty((p, p))
        cov[np.ix_(self.perm, self.perm)] = self.sigma**2 * rinv @ rinv.T
        return cov

    def predict(self, phi_test: np.ndarray, *, aleatoric: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Predictive mean and standard deviation at test features.

        Parameters
        ----------
        phi_test : ndarray, shape (T, p)
            Features G(x*) of the test inputs.
        aleatoric : bool
            Add σ² to the variance (predictive for a new noisy observation). Default off: the
            epistemic std, as used for coverage of the noise-free truth.

        Returns
        -------
        mean : ndarray, shape (R, T)
        std : ndarray, shape (T,)
        """
        phi_test = np.asarray(phi_test, dtype=np.float64)
        if phi_test.ndim != 2 or phi_test.shape[1] != self.r.shape[0]:
            raise ValueError(f"phi_test must have shape (T, {self.r.shape[0]}), got {phi_test.shape}")
        w = solve_triangular(self.r, phi_test[:, self.perm].T, trans="T")  # R⁻ᵀ φ, shape (p, T)
        var = self.sigma**2 * np.einsum("pt,pt->t", w, w)
        if aleatoric:
            var = var + self.sigma**2
        # row by row: a repetition's prediction must not depend on the other repetitions computed
        # with it (a BLAS GEMM may change its summation order with the number of columns)
        mean = np.stack([phi_test @ g for g in self.mean]) if len(self.mean) else np.empty((0, len(phi_test)))
        return mean, np.sqrt(var)


def fit_reference(phi: np.ndarray, y: np.ndarray, sigma: float, *, rtol: float | None = None) -> ReferencePosterior:
    """Fit the exact flat-prior posterior.

    Parameters
    ----------
    phi : ndarray, shape (N, p)
        Design matrix Φ = G(x_train).
    y : ndarray, shape (N,) or (R, N)
        Training targets (one row per repetition).
    sigma : float
        Known noise standard deviation (> 0).
    rtol : float, optional
        Relative tolerance on the diagonal of R below which the design counts as
        rank-deficient (default ``max(N, p) · eps``).

    Raises
    ------
    ValueError
        If the design is rank-deficient (naming the numerical rank), or shapes disagree.
    """
    phi = np.asarray(phi, dtype=np.float64)
    y = np.atleast_2d(np.asarray(y, dtype=np.float64))
    if phi.ndim != 2:
        raise ValueError(f"phi must have shape (N, p), got {phi.shape}")
    n, p = phi.shape
    if y.shape[1] != n:
        raise ValueError(f"y must have shape (N,) or (R, N) with N={n}, got {y.shape}")
    if not (np.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be a positive number, got {sigma!r}")
    if not (np.all(np.isfinite(phi)) and np.all(np.isfinite(y))):
        raise ValueError("phi and y must be finite")
    if n < p:
        raise ValueError(f"the design is rank-deficient: N={n} training points < p={p} parameters")
    q, r, piv = qr(phi, mode="economic", pivoting=True)  # Φ[:, piv] = QR, |diag R| decreasing
    diag = np.abs(np.diag(r))
    tol = (rtol if rtol is not None else max(n, p) * np.finfo(float).eps) * diag.max(initial=0.0)
    rank = int(np.sum(diag > tol))
    if rank < p:
        raise ValueError(f"the design is rank-deficient: rank {rank} < p={p} parameters")
    mean = np.empty((y.shape[0], p))
    for i, yi in enumerate(y):  # row by row, as in ReferencePosterior.predict
        mean[i, piv] = solve_triangular(r, q.T @ yi)
    return ReferencePosterior(mean=mean, sigma=float(sigma), r=r, perm=piv)


def reference_prediction(instance, y: np.ndarray, *, aleatoric: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Reference mean (R, T) and std (T,) at ``instance.x_test`` for targets ``y`` (R, N)."""
    post = fit_reference(instance.features(instance.x_train), y, instance.sigma)
    return post.predict(instance.features(instance.x_test), aleatoric=aleatoric)
