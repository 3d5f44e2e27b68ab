"""Exact Bayesian linear regression under the flat reference prior, noise known (R.2, R.7).

Homoscedastic noise σ: ``γ | D ~ N(γ̂, σ² V)`` with ``V = (ΦᵀΦ)⁻¹`` and ``γ̂ = V Φᵀ y``. At test
inputs the prediction is ``G(x*)ᵀγ̂`` with epistemic standard deviation ``σ·sqrt(G(x*)ᵀ V G(x*))``.
Both come from a thin QR decomposition ``Φ = QR`` (never an explicit inverse): ``γ̂ = R⁻¹Qᵀy``
and ``G(x*)ᵀ V G(x*) = ‖R⁻ᵀ G(x*)‖²``.

Heteroscedastic noise σ(x_i) (R.7): the posterior is weighted least squares with weights
``W = diag(1/σ(x_i)²)``, ``Σ_post = (ΦᵀWΦ)⁻¹`` and ``γ̂ = Σ_post ΦᵀW y``. It is the same
computation on the whitened problem ``Φ̃ = W^½Φ`` (row i divided by σ(x_i)), ``ỹ = W^½y`` with
unit noise: the same QR, rank check and solves. At a test input the exact predictive variance
is the epistemic ``G(x*)ᵀ Σ_post G(x*)`` plus the aleatoric ``σ(x*)²``
(:meth:`ReferencePosterior.decompose`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import qr, solve_triangular


@dataclass(frozen=True)
class Decomposition:
    """The exact predictive at T test points, split into its two sources (R.7).

    Attributes
    ----------
    mean : ndarray, shape (R, T)
        Posterior predictive mean ``G(x*)ᵀγ̂``, one row per target vector (repetition).
    epistemic_variance : ndarray, shape (T,)
        ``G(x*)ᵀ Σ_post G(x*)``: the posterior variance of the noise-free ``f(x*)`` (what the
        model does not know; shrinks as the data grow).
    aleatoric_variance : ndarray, shape (T,)
        ``σ(x*)²``: the variance of the noise of a new observation (does not shrink).
    """

    mean: np.ndarray
    epistemic_variance: np.ndarray
    aleatoric_variance: np.ndarray

    @property
    def predictive_variance(self) -> np.ndarray:
        """Exact predictive variance of a new noisy observation: epistemic + aleatoric, (T,)."""
        return self.epistemic_variance + self.aleatoric_variance

    @property
    def epistemic_std(self) -> np.ndarray:
        """Square root of :attr:`epistemic_variance` (the reference's ``uncertainty``)."""
        return np.sqrt(self.epistemic_variance)

    @property
    def predictive_std(self) -> np.ndarray:
        """Square root of :attr:`predictive_variance`."""
        return np.sqrt(self.predictive_variance)


@dataclass(frozen=True)
class ReferencePosterior:
    """The exact posterior for one design and one or more target vectors.

    Attributes
    ----------
    mean : ndarray, shape (R, p)
        Posterior means γ̂, one per target vector (repetition).
    sigma : float or ndarray of shape (N,)
        Known noise standard deviation of the training targets: a float when it is the same at
        every training point (homoscedastic), else σ(x_i) per point (heteroscedastic).
    r : ndarray, shape (p, p)
        Upper-triangular factor of the column-pivoted QR ``Φ[:, perm] = QR`` (of the whitened
        design ``Φ / σ(x_i)`` when heteroscedastic).
    perm : ndarray of int, shape (p,)
        Column permutation of the pivoted QR.
    """

    mean: np.ndarray
    sigma: float | np.ndarray
    r: np.ndarray
    perm: np.ndarray

    @property
    def heteroscedastic(self) -> bool:
        """True when the training noise differs between points (weighted least squares)."""
        return np.ndim(self.sigma) == 1

    @property
    def _scale2(self) -> float:
        """The factor of ``R⁻¹R⁻ᵀ`` in the covariance: σ², or 1 for the whitened design."""
        return 1.0 if self.heteroscedastic else self.sigma**2

    @property
    def covariance(self) -> np.ndarray:
        """Posterior covariance Σ_post: σ²(ΦᵀΦ)⁻¹, or (ΦᵀWΦ)⁻¹ when heteroscedastic; shape (p, p)
        (for inspection; not used internally)."""
        p = self.r.shape[0]
        rinv = solve_triangular(self.r, np.eye(p))
        cov = np.empty((p, p))
        cov[np.ix_(self.perm, self.perm)] = self._scale2 * rinv @ rinv.T
        return cov

    def _check(self, phi_test) -> np.ndarray:
        phi_test = np.asarray(phi_test, dtype=np.float64)
        if phi_test.ndim != 2 or phi_test.shape[1] != self.r.shape[0]:
            raise ValueError(f"phi_test must have shape (T, {self.r.shape[0]}), got {phi_test.shape}")
        return phi_test

    def _epistemic(self, phi_test: np.ndarray) -> np.ndarray:
        w = solve_triangular(self.r, phi_test[:, self.perm].T, trans="T")  # R⁻ᵀ φ, shape (p, T)
        return self._scale2 * np.einsum("pt,pt->t", w, w)

    def _mean(self, phi_test: np.ndarray) -> np.ndarray:
        # row by row: a repetition's prediction must not depend on the other repetitions computed
        # with it (a BLAS GEMM may change its summation order with the number of columns)
        return np.stack([phi_test @ g for g in self.mean]) if len(self.mean) else np.empty((0, len(phi_test)))

    def _test_noise(self, noise_std, n_test: int) -> np.ndarray:
        """σ(x*)² at the T test points; ``noise_std`` None: the homoscedastic σ."""
        if noise_std is None:
            if self.heteroscedastic:
                raise ValueError("noise_std (the noise std σ(x*) at the test points) is required: the "
                                 "posterior is heteroscedastic, its σ at new inputs is unknown to it")
            return np.full(n_test, self.sigma**2)
        s = np.asarray(noise_std, dtype=np.float64)
        if s.ndim > 1 or (s.ndim == 1 and s.shape[0] != n_test):
            raise ValueError(f"noise_std must be a number or have shape ({n_test},), got shape {s.shape}")
        bad = ~(np.isfinite(s) & (s > 0))
        if bad.any():
            raise ValueError(f"noise_std must be finite and positive, got {float(np.atleast_1d(s)[np.argmax(bad)])}")
        return np.broadcast_to(s**2, (n_test,)).copy()

    def predict(self, phi_test: np.ndarray, *, aleatoric: bool = False,
                noise_std=None) -> tuple[np.ndarray, np.ndarray]:
        """Predictive mean and standard deviation at test features.

        Parameters
        ----------
        phi_test : ndarray, shape (T, p)
            Features G(x*) of the test inputs.
        aleatoric : bool
            Add the noise variance σ(x*)² (predictive for a new noisy observation). Default off:
            the epistemic std, as used for coverage of the noise-free truth.
        noise_std : float or ndarray of shape (T,), optional
            σ(x*) at the test points, used when ``aleatoric``; default the posterior's σ (a
            heteroscedastic posterior requires it).

        Returns
        -------
        mean : ndarray, shape (R, T)
        std : ndarray, shape (T,)
        """
        phi_test = self._check(phi_test)
        var = self._epistemic(phi_test)
        if aleatoric:
            var = var + self._test_noise(noise_std, phi_test.shape[0])
        return self._mean(phi_test), np.sqrt(var)

    def decompose(self, phi_test: np.ndarray, noise_std=None) -> Decomposition:
        """The exact predictive at test features split into epistemic and aleatoric variance.

        Parameters
        ----------
        phi_test : ndarray, shape (T, p)
            Features G(x*) of the test inputs.
        noise_std : float or ndarray of shape (T,), optional
            σ(x*) at the test points (the truth of the aleatoric part); default the
            posterior's σ (a heteroscedastic posterior requires it).

        Returns
        -------
        Decomposition
            ``mean`` (R, T), ``epistemic_variance`` (T,), ``aleatoric_variance`` (T,).
        """
        phi_test = self._check(phi_test)
        return Decomposition(mean=self._mean(phi_test), epistemic_variance=self._epistemic(phi_test),
                             aleatoric_variance=self._test_noise(noise_std, phi_test.shape[0]))


def _noise(sigma, n: int) -> float | np.ndarray:
    """``sigma`` checked: a float (homoscedastic, also for a constant array) or an (N,) array."""
    s = np.asarray(sigma, dtype=np.float64) if not isinstance(sigma, (int, float)) else None
    if s is None or s.ndim == 0:
        value = float(sigma)
        if not (np.isfinite(value) and value > 0):
            raise ValueError(f"sigma must be a positive number, got {sigma!r}")
        return value
    if s.shape != (n,):
        raise ValueError(f"sigma must be a number or have shape (N,) with N={n}, got shape {s.shape}")
    bad = ~(np.isfinite(s) & (s > 0))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"sigma must be finite and positive at every training point, got {float(s[i])} at point {i}")
    if np.all(s == s[0]):  # σ constant: the homoscedastic computation, bit for bit
        return float(s[0])
    return s


def fit_reference(phi: np.ndarray, y: np.ndarray, sigma, *, rtol: float | None = None) -> ReferencePosterior:
    """Fit the exact flat-prior posterior.

    Parameters
    ----------
    phi : ndarray, shape (N, p)
        Design matrix Φ = G(x_train).
    y : ndarray, shape (N,) or (R, N)
        Training targets (one row per repetition).
    sigma : float or ndarray of shape (N,)
        Known noise standard deviation (> 0): one number, or σ(x_i) per training point
        (heteroscedastic: weighted least squares with weights 1/σ(x_i)²). An array whose
        entries are all equal is the homoscedastic case and gives exactly its numbers.
    rtol : float, optional
        Relative tolerance on the diagonal of R below which the design counts as
        rank-deficient (default ``max(N, p) · eps``); for heteroscedastic noise it applies to
        the whitened design ``Φ / σ(x_i)``.

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
    sigma = _noise(sigma, n)
    if not (np.all(np.isfinite(phi)) and np.all(np.isfinite(y))):
        raise ValueError("phi and y must be finite")
    if n < p:
        raise ValueError(f"the design is rank-deficient: N={n} training points < p={p} parameters")
    if np.ndim(sigma) == 1:  # whiten: row i / σ(x_i), then unit noise (WLS as OLS)
        phi, y = phi / sigma[:, None], y / sigma[None, :]
    q, r, piv = qr(phi, mode="economic", pivoting=True)  # Φ[:, piv] = QR, |diag R| decreasing
    diag = np.abs(np.diag(r))
    tol = (rtol if rtol is not None else max(n, p) * np.finfo(float).eps) * diag.max(initial=0.0)
    rank = int(np.sum(diag > tol))
    if rank < p:
        raise ValueError(f"the design is rank-deficient: rank {rank} < p={p} parameters")
    mean = np.empty((y.shape[0], p))
    for i, yi in enumerate(y):  # row by row, as in ReferencePosterior.predict
        mean[i, piv] = solve_triangular(r, q.T @ yi)
    return ReferencePosterior(mean=mean, sigma=sigma, r=r, perm=piv)


def reference_posterior(instance, y: np.ndarray) -> ReferencePosterior:
    """The exact posterior of a task instance for targets ``y`` (R, N), with its known noise
    σ(x_i) at the training inputs (weighted least squares for a heteroscedastic task)."""
    return fit_reference(instance.features(instance.x_train), y, instance.noise_std(instance.x_train))


def reference_prediction(instance, y: np.ndarray, *, aleatoric: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Reference mean (R, T) and std (T,) at ``instance.x_test`` for targets ``y`` (R, N);
    ``aleatoric`` adds σ(x*)² to the variance."""
    post = reference_posterior(instance, y)
    return post.predict(instance.features(instance.x_test), aleatoric=aleatoric,
                        noise_std=instance.noise_std(instance.x_test))


def reference_decomposition(instance, y: np.ndarray, x=None) -> Decomposition:
    """The exact oracle's decomposition (R.7) at ``x`` (default ``instance.x_test``): mean
    (R, T), epistemic variance ``G(x)ᵀ Σ_post G(x)`` and aleatoric variance ``σ(x)²`` (T,)."""
    x = instance.x_test if x is None else np.asarray(x, dtype=np.float64)
    return reference_posterior(instance, y).decompose(instance.features(x), instance.noise_std(x))


def reference_dataset(task: str, complexity: int, *, seed: int = 0, repetitions: int = 50, n_train: int | None = None,
                      sigma: float | None = None):
    """The exact posterior of ``task`` at ``complexity`` on ``repetitions`` noise draws, as the
    dataset ``uqreg reference --out FILE`` writes (:func:`reference_decomposition`, R.7).

    Parameters
    ----------
    task : str
        A registered task (:data:`uqreg.tasks.TASKS`).
    complexity : int
    seed : int, default 0
        The task seed.
    repetitions : int, default 50
        Noise draws of the training targets.
    n_train : int, optional
        Training-set size override.
    sigma : float, optional
        Noise std override (a heteroscedastic task's scale of sigma(x)).

    Returns
    -------
    xarray.Dataset
        ``prediction`` (repetition, point): the posterior mean of each draw; ``uncertainty``,
        ``epistemic_variance``, ``aleatoric_variance``, ``predictive_variance``, ``truth``,
        ``in_distribution`` (point); ``x_test`` (point, input_dim); the task's plotting
        coordinates (``x``, ``lambda``, ``x1``/``x2``) on ``point``; attrs ``task``,
        ``complexity``, ``sigma``, ``heteroscedastic``, ``train_box``, ``complexity_name``.
    """
    import xarray as xr

    from .tasks import get_task

    t = get_task(task)
    inst = t.instance(complexity, seed, n_train=n_train, sigma=sigma)
    y = inst.targets(np.arange(repetitions))
    dec = reference_decomposition(inst, y)  # R.7: the exact predictive in its two parts
    ds = xr.Dataset(
        {"prediction": (("repetition", "point"), dec.mean), "uncertainty": (("point",), dec.epistemic_std),
         "truth": (("point",), inst.f_test), "x_test": (("point", "input_dim"), inst.x_test),
         "in_distribution": (("point",), np.asarray(inst.in_distribution, dtype=bool)),
         "epistemic_variance": (("point",), dec.epistemic_variance, {
             "long_name": "exact epistemic variance G(x)^T Sigma_post G(x) of the noise-free f(x) (R.7)"}),
         "aleatoric_variance": (("point",), dec.aleatoric_variance, {
             "long_name": "exact aleatoric variance sigma(x)^2, the noise of a new observation (R.7)"}),
         "predictive_variance": (("point",), dec.predictive_variance, {
             "long_name": "exact predictive variance of a new observation: epistemic_variance + "
                          "aleatoric_variance (R.7)"})},
        coords={"repetition": np.arange(repetitions), **{k: ("point", v) for k, v in inst.test_coords.items()}},
        attrs={"task": task, "complexity": int(complexity), "sigma": inst.sigma,
               "heteroscedastic": int(inst.heteroscedastic), "train_box": [float(v) for v in t.train_box],
               "complexity_name": t.complexity_name},
    )
    ds["uncertainty"].attrs["long_name"] = "exact epistemic std: sqrt(epistemic_variance)"
    return ds
