"""Regression tasks linear in their parameters: ``y = G(x)ᵀγ + ε``, ``ε ~ N(0, σ(x)²)`` (R.1, R.7).

A task is a :class:`LinearTask` registered by name. Registering a new feature map takes a few
lines and the reference, the study, the CLI and the plots pick it up::

    from uqreg.tasks import LinearTask, register_task, uniform_box

    register_task(LinearTask(
        name="cubic",
        input_dim=lambda c: 1,
        feature_map=lambda x, c: x ** np.arange(c + 2),      # (n, 1) -> (n, c + 2)
        gamma=lambda rng, c: rng.uniform(0, 1, c + 2),
        sigma=0.5,
        n_train=lambda c: 60,
        train_inputs=uniform_box(-2, 2),
        test_inputs=lambda c: np.linspace(-3, 3, 500)[:, None],
        train_box=(-2, 2),
    ))

A heteroscedastic task registers its noise profile the same way (R.7): adding
``noise=lambda x, c: 0.2 + x[:, 0] ** 2`` above makes the noise standard deviation
``σ(x) = 0.5 · (0.2 + x²)`` (:meth:`LinearTask.noise_std`); without it, ``σ(x) = sigma``.

:meth:`LinearTask.instance` fixes γ, the training inputs (drawn once from the task seed) and
the test inputs; only the training noise is redrawn per repetition
(:meth:`TaskInstance.targets`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
from uqmetrics.metrics.registry import Registry

from .rng import SEED_REQUIREMENT, numpy_stream, valid_seed

FeatureMap = Callable[[np.ndarray, int], np.ndarray]
#: ``(x (n, d), c) -> s(x) (n,)``: a task's relative noise profile, ``σ(x) = sigma · s(x)``.
NoiseProfile = Callable[[np.ndarray, int], np.ndarray]


def uniform_box(low: float, high: float) -> Callable[[np.random.Generator, int, int, int], np.ndarray]:
    """Training-input sampler: ``n`` points uniform in ``[low, high]^d``."""

    def sample(rng: np.random.Generator, n: int, d: int, c: int) -> np.ndarray:
        return rng.uniform(low, high, size=(n, d))

    return sample


@dataclass(frozen=True)
class LinearTask:
    """A family of linear-in-parameter regression tasks indexed by a complexity level ``c``.

    Parameters
    ----------
    name : str
        Registry name.
    input_dim : callable ``c -> d``
        Input dimension at complexity ``c``.
    feature_map : callable ``(x (n, d), c) -> Φ (n, p)``
        The fixed feature map G.
    gamma : callable ``(rng, c) -> γ (p,)``
        Draws (or returns) the true parameters.
    sigma : float
        Known noise standard deviation σ; for a heteroscedastic task the scale of σ(x) (see
        ``noise``). ``instance(sigma=...)`` overrides it.
    n_train : callable ``c -> N``
        Number of training points.
    train_inputs : callable ``(rng, N, d, c) -> x (N, d)``
        Training-input sampler (drawn once per task instance).
    test_inputs : callable ``c -> x* (T, d)``
        Test inputs.
    train_box : (float, float)
        Training box (per dimension); test points inside it are in-distribution.
    test_coords : callable ``(x* (T, d), c) -> dict[str, (T,) array]``, optional
        Coordinates used to plot test points (default: ``x`` for 1-D inputs, else the index).
    complexity_name : str
        Name of the complexity axis (``f_main``, ``d``, ...).
    default_complexities : tuple of int
        Levels used when a study names none.
    probes : dict[str, float]
        Named probe points of the paper, as a value of the first test coordinate.
    description : str
        One line for ``uqreg tasks`` and the help.
    noise : callable ``(x (n, d), c) -> s(x) (n,)``, optional
        Relative noise profile of a heteroscedastic task (R.7): the noise standard deviation at
        x is ``σ(x) = sigma · s(x)``; s must be finite and positive at every input it is asked
        for (training, calibration and test inputs). None (default): homoscedastic, σ(x) =
        sigma.
    """

    name: str
    input_dim: Callable[[int], int]
    feature_map: FeatureMap
    gamma: Callable[[np.random.Generator, int], np.ndarray]
    sigma: float
    n_train: Callable[[int], int]
    train_inputs: Callable[[np.random.Generator, int, int, int], np.ndarray]
    test_inputs: Callable[[int], np.ndarray]
    train_box: tuple[float, float]
    test_coords: Callable[[np.ndarray, int], dict] | None = None
    complexity_name: str = "complexity"
    default_complexities: tuple[int, ...] = (1, 2, 3)
    probes: dict = field(default_factory=dict)
    description: str = ""
    noise: NoiseProfile | None = None

    @property
    def heteroscedastic(self) -> bool:
        """True when the task registers a noise profile (its σ depends on x)."""
        return self.noise is not None

    def noise_std(self, x: np.ndarray, complexity: int, sigma: float | None = None) -> np.ndarray:
        """The known noise standard deviation σ(x) at inputs ``x`` (n, d), shape (n,).

        ``sigma · noise(x, c)`` for a heteroscedastic task, ``sigma`` at every point otherwise;
        ``sigma`` defaults to the task's.

        Raises
        ------
        ValueError
            If the noise profile returns a shape other than (n,) or a value that is not finite
            and positive (naming the task and the first such input).
        """
        x = np.asarray(x, dtype=np.float64)
        sigma = self.sigma if sigma is None else float(sigma)
        if self.noise is None:
            return np.full(x.shape[0], sigma)
        s = np.asarray(self.noise(x, int(complexity)), dtype=np.float64)
        if s.shape != (x.shape[0],):
            raise ValueError(f"noise of task {self.name!r} returned shape {s.shape}, expected ({x.shape[0]},)")
        bad = ~(np.isfinite(s) & (s > 0))
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"noise of task {self.name!r} must be finite and positive, got {float(s[i])} "
                             f"at x={x[i].tolist()}")
        return sigma * s

    def sizes(self, complexity: int, *, n_train: int | None = None) -> dict[str, int]:
        """The sizes of an instance, without drawing it: ``n_train`` N, ``input_dim`` d,
        ``n_test`` T and ``n_params`` p (for memory estimates before any allocation)."""
        c = int(complexity)
        d = int(self.input_dim(c))
        n = int(self.n_train(c) if n_train is None else n_train)
        p = int(np.asarray(self.gamma(numpy_stream(0, "gamma", 0, c), c)).shape[0])
        return {"n_train": n, "input_dim": d, "n_test": int(np.asarray(self.test_inputs(c)).shape[0]), "n_params": p}

    def instance(self, complexity: int, seed: int = 0, *, n_train: int | None = None,
                 sigma: float | None = None) -> TaskInstance:
        """Fix γ, the training inputs and the test inputs for one complexity level.

        Parameters
        ----------
        complexity : int
            Complexity level ``c >= 1``.
        seed : int
            Task seed; γ and the training inputs come from streams keyed by it.
        n_train, sigma : optional
            Overrides of the training-set size and the noise level.
        """
        if isinstance(complexity, bool) or not isinstance(complexity, (int, np.integer)) or complexity < 1:
            raise ValueError(f"complexity must be an integer >= 1, got {complexity!r}")
        if not valid_seed(seed):
            raise ValueError(f"seed {SEED_REQUIREMENT}, got {seed!r}")
        c = int(complexity)
        sigma = self.sigma if sigma is None else float(sigma)
        if not np.isfinite(sigma) or sigma <= 0:
            raise ValueError(f"sigma must be a positive number, got {sigma!r}")
        d = int(self.input_dim(c))
        n = int(self.n_train(c) if n_train is None else n_train)
        gamma = np.asarray(self.gamma(numpy_stream(seed, "gamma", 0, c), c), dtype=np.float64)
        p = gamma.shape[0]
        if n < p:
            raise ValueError(
                f"n_train must be at least the number of parameters p={p} of task "
                f"{self.name!r} at complexity {c}, got {n}"
            )
        x_train = np.asarray(self.train_inputs(numpy_stream(seed, "x_train", 0, c), n, d, c), dtype=np.float64)
        x_test = np.asarray(self.test_inputs(c), dtype=np.float64)
        if self.noise is not None:  # a bad noise profile fails here, not in the middle of a study
            for x in (x_train, x_test):
                self.noise_std(x, c, sigma)
        lo, hi = self.train_box
        in_dist = np.all((x_test >= lo) & (x_test <= hi), axis=1)
        coords = (self.test_coords or _default_coords)(x_test, c)
        return TaskInstance(
            task=self, complexity=c, seed=int(seed), sigma=sigma, gamma=gamma,
            x_train=x_train, x_test=x_test, in_distribution=in_dist, test_coords=coords,
        )


def _default_coords(x: np.ndarray, c: int) -> dict:
    if x.shape[1] == 1:
        return {"x": x[:, 0]}
    return {f"x{j + 1}": x[:, j] for j in range(x.shape[1])}


@dataclass(frozen=True, eq=False)
class TaskInstance:
    """One task instance: fixed γ, σ, training inputs and test inputs.

    Attributes
    ----------
    x_train : ndarray, shape (N, d)
    x_test : ndarray, shape (T, d)
    in_distribution : ndarray of bool, shape (T,)
    gamma : ndarray, shape (p,)
    """

    task: LinearTask
    complexity: int
    seed: int
    sigma: float
    gamma: np.ndarray
    x_train: np.ndarray
    x_test: np.ndarray
    in_distribution: np.ndarray
    test_coords: dict

    @property
    def heteroscedastic(self) -> bool:
        """True when σ depends on x (the task registers a noise profile)."""
        return self.task.heteroscedastic

    def noise_std(self, x: np.ndarray) -> np.ndarray:
        """Known noise standard deviation σ(x) at inputs ``x`` (n, d), shape (n,) (R.7): the
        square root of the exact aleatoric variance."""
        return self.task.noise_std(x, self.complexity, self.sigma)

    @property
    def epochs(self) -> int:
        """The paper's default training length, 300·c epochs."""
        return 300 * self.complexity

    def features(self, x: np.ndarray) -> np.ndarray:
        """Φ = G(x), shape (n, p)."""
        phi = np.asarray(self.task.feature_map(np.asarray(x, dtype=np.float64), self.complexity), dtype=np.float64)
        if phi.ndim != 2 or phi.shape[1] != self.gamma.shape[0]:
            raise ValueError(
                f"feature_map of task {self.task.name!r} returned shape {phi.shape}, expected "
                f"(n, {self.gamma.shape[0]})"
            )
        return phi

    def truth(self, x: np.ndarray) -> np.ndarray:
        """Noise-free ground truth G(x)ᵀγ, shape (n,)."""
        return self.features(x) @ self.gamma

    @property
    def f_train(self) -> np.ndarray:
        return self.truth(self.x_train)

    @property
    def f_test(self) -> np.ndarray:
        return self.truth(self.x_test)

    def targets(self, repetitions) -> np.ndarray:
        """Noisy training targets of the given repetitions, shape (R, N): ``f(x_i) + σ(x_i)·ε``.

        Repetition ``r`` draws its noise from the stream ``(seed, "noise", r, complexity)``.
        """
        return self._noisy(self.x_train, self.f_train, repetitions, "noise")

    def test_targets(self, repetitions) -> np.ndarray:
        """Fresh noisy targets at the test inputs, shape (R, T): ``f(x*) + σ(x*)·ε``, what a
        predictive interval must cover (R.7).

        Repetition ``r`` draws its noise from the stream ``(seed, "test_noise", r, complexity)``,
        independent of its training noise.
        """
        return self._noisy(self.x_test, self.f_test, repetitions, "test_noise")

    def _noisy(self, x: np.ndarray, f: np.ndarray, repetitions, purpose: str) -> np.ndarray:
        reps = np.atleast_1d(np.asarray(repetitions, dtype=np.int64))
        noise = np.stack([numpy_stream(self.seed, purpose, int(r), self.complexity).standard_normal(f.shape[0])
                          for r in reps]).reshape(len(reps), f.shape[0])
        # σ(x_i)·ε: for a homoscedastic task the same products as σ·ε (bit for bit)
        return f[None, :] + self.noise_std(x)[None, :] * noise

    def calibration(self, repetitions, n_cal: int) -> tuple[np.ndarray, np.ndarray]:
        """Calibration points of split-conformal methods, drawn like the training points.

        Repetition ``r`` draws ``n_cal`` inputs from the task's training-input distribution and
        their noise from its own stream ``(seed, "calibration", r, complexity)``, so its points
        do not depend on which other repetitions are drawn with it (batch size, sweep cells).

        Parameters
        ----------
        repetitions : array_like of int, shape (R,)
        n_cal : int
            Calibration points per repetition (>= 1).

        Returns
        -------
        x_cal : ndarray, shape (R, n_cal, d)
        y_cal : ndarray, shape (R, n_cal)
            ``G(x_cal)ᵀγ + σ(x_cal)·ε``, ε standard normal.
        """
        reps = np.atleast_1d(np.asarray(repetitions, dtype=np.int64))
        if isinstance(n_cal, bool) or not isinstance(n_cal, (int, np.integer)) or n_cal < 1:
            raise ValueError(f"n_cal must be an integer >= 1, got {n_cal!r}")
        d = self.x_train.shape[1]
        xs, ys = [], []
        for r in reps:
            rng = numpy_stream(self.seed, "calibration", int(r), self.complexity)
            x = np.asarray(self.task.train_inputs(rng, int(n_cal), d, self.complexity), dtype=np.float64)
            xs.append(x)
            ys.append(self.truth(x) + self.noise_std(x) * rng.standard_normal(int(n_cal)))
        return np.stack(xs).reshape(len(reps), int(n_cal), d), np.stack(ys).reshape(len(reps), int(n_cal))


TASKS: Registry[LinearTask] = Registry("task", sort=True)
register_task = TASKS.register
get_task = TASKS.lookup
list_tasks = TASKS.names


# --- E.1 sinusoid --------------------------------------------------------------------------
def _sinusoid_features(x: np.ndarray, c: int) -> np.ndarray:
    f = np.linspace(0.9, 1.1, 4) * c
    rho = np.linspace(0, 2 * np.pi, 4, endpoint=False)  # Decision R.1: no repeated phase 0 = 2π
    return np.sin(2 * np.pi * f[None, :] * x[:, :1] + rho[None, :])


register_task(LinearTask(
    name="sinusoid",
    description="E.1: sum of 4 sinusoids, frequencies in [0.9, 1.1]·f_main",
    input_dim=lambda c: 1,
    feature_map=_sinusoid_features,
    gamma=lambda rng, c: rng.uniform(0, 1, 4),
    sigma=0.75,
    n_train=lambda c: 50,
    train_inputs=uniform_box(-4, 4),
    test_inputs=lambda c: np.linspace(-6, 6, 1000)[:, None],
    train_box=(-4.0, 4.0),
    complexity_name="f_main",
    default_complexities=(1, 2, 3, 4, 5),
    probes={"in_-2.38": -2.38, "in_1.2": 1.2, "out_-5.11": -5.11},
))


# --- E.2 Styblinski–Tang ---------------------------------------------------------------------
def _st_features(x: np.ndarray, c: int) -> np.ndarray:
    return np.concatenate([np.stack([x[:, j], x[:, j] ** 2, x[:, j] ** 4], axis=1) for j in range(x.shape[1])], axis=1)


_LAMBDA = np.linspace(0.0, 1.0, 1000)

register_task(LinearTask(
    name="styblinski_tang",
    description="E.2: Styblinski–Tang in d dimensions, features (x_j, x_j², x_j⁴)",
    input_dim=lambda c: c,
    feature_map=_st_features,
    gamma=lambda rng, c: np.tile([2.5, -8.0, 0.5], c),
    sigma=3.0,
    n_train=lambda c: 100 * 9 ** (c - 1),
    train_inputs=uniform_box(-4, 4),
    test_inputs=lambda c: (-5.0 + 10.0 * _LAMBDA)[:, None] * np.ones((1, c)),
    train_box=(-4.0, 4.0),
    test_coords=lambda x, c: {"lambda": _LAMBDA.copy()},
    complexity_name="d",
    default_complexities=(1, 2, 3),
    probes={"in_0.5996": 0.5996, "out_0.074": 0.074},
))


# --- E.3 2-D polynomial ----------------------------------------------------------------------
def _poly_features(x: np.ndarray, c: int) -> np.ndarray:
    x1, x2 = x[:, 0], x[:, 1]
    return np.stack([np.ones_like(x1), x1, x2, x1 * x2, x1**2, x2**2], axis=1)


_GRID = np.linspace(-5, 5, 41)

register_task(LinearTask(
    name="polynomial",
    description="E.3: 2-D polynomial (1, x1, x2, x1·x2, x1², x2²), p = 6",
    input_dim=lambda c: 2,
    feature_map=_poly_features,
    gamma=lambda rng, c: rng.uniform(0, 1, 6),
    sigma=0.5,
    n_train=lambda c: 450,
    train_inputs=uniform_box(1, 4),  # Decision R.1: the box of the reported heat maps
    test_inputs=lambda c: np.stack(np.meshgrid(_GRID, _GRID, indexing="ij"), axis=-1).reshape(-1, 2),
    train_box=(1.0, 4.0),
    complexity_name="d",
    default_complexities=(2,),
))


# --- heteroscedastic versions (R.7): the same tasks, σ(x) = sigma · s(x) -----------------------
def _rising(x: np.ndarray, c: int) -> np.ndarray:
    """0.2 + 1.8·logistic(x): from 0.2 (left of the box) to 2.0 (right of it), flat outside."""
    return 0.2 + 0.9 * (1.0 + np.tanh(x[:, 0] / 2.0))  # logistic(x) = (1 + tanh(x/2))/2


#: Centres (on the diagonal, every coordinate equal) and width of the Styblinski–Tang noise bumps.
ST_BUMPS, ST_BUMP_WIDTH = (-2.0, 2.5), 0.5


def _bumps(x: np.ndarray, c: int) -> np.ndarray:
    """0.25 + 1.75·Σ_b exp(−r_b²/(2w²)), r_b² = mean_j (x_j − c_b)²: floor 0.25, peaks ≈ 2."""
    return 0.25 + 1.75 * sum(np.exp(-np.mean((x - cb) ** 2, axis=1) / (2 * ST_BUMP_WIDTH**2)) for cb in ST_BUMPS)


def _radial(x: np.ndarray, c: int) -> np.ndarray:
    """0.1 + ‖x‖₂/4: proportional to |x|, with a floor 0.1 so that σ > 0 at the origin."""
    return 0.1 + np.sqrt(np.sum(x**2, axis=1)) / 4.0


for _base, _noise, _what in (
    ("sinusoid", _rising, "σ(x) = 0.75·(0.2 + 1.8·logistic(x)), rising from 0.17 to 1.48 across the box"),
    ("styblinski_tang", _bumps, "σ(x) = 3·(0.25 + 1.75·Σ bumps at x_j = −2 and 2.5, width 0.5)"),
    ("polynomial", _radial, "σ(x) = 0.5·(0.1 + ‖x‖/4), proportional to ‖x‖ plus a floor"),
):
    _task = TASKS[_base]
    register_task(replace(_task, name=f"{_base}_het", noise=_noise,
                          description=f"{_task.description.split(':')[0]} heteroscedastic: {_what}"))
del _base, _noise, _what, _task
