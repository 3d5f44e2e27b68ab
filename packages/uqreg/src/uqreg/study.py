"""The repeated-retrain coverage study (R.4): task × complexity × method × repetition.

:func:`run_study` trains every method on k noise draws per complexity level and returns ONE
:class:`xarray.Dataset` holding

* raw results ``prediction``, ``uncertainty`` over ``(recipe, method, complexity, repetition,
  point)`` and ``truth`` over ``(complexity, point)``, with the test inputs ``x_test`` and their
  plot coordinates (a single-recipe study keeps a length-1 ``recipe`` dim);
* the collapse diagnostics of docs/conventions.md#r-3b over ``(recipe, method, complexity,
  repetition)``: ``train_loss``, ``constant_loss``, ``collapsed_fraction`` and ``fit_r2``
  (:mod:`uqreg.diagnostics`);
* everything needed to recompute the reference from the file alone: ``x_train``, every
  repetition's ``y_train``, ``gamma``, ``sigma``, the task name;
* the exact ``reference_uncertainty`` and the derived summary of
  :func:`uqmetrics.coverage_summary` (coverage with Wilson/Clopper–Pearson bounds and the
  paper's bars, mean deviation and uncertainty with standard errors, the ratio to the reference,
  in-/out-of-distribution summaries);
* every method's 1 − α interval for a new observation, ``interval_low``/``interval_high``
  (recipe, method, complexity, repetition, point), with ``conformal_quantile`` per repetition for
  the split-conformal methods ``<method>+<score>`` (their calibration points are drawn per
  repetition, ``n_cal`` of them), and the exact conditional coverage of those intervals and of
  the reference's, :func:`conditional_diagnostics` (docs/conventions.md#r-6);
* the user's view (docs/conventions.md#r-8, :func:`score_diagnostics`): the new noisy targets
  ``y_test`` (complexity, repetition, point) from the stream ``test_noise``, every method's
  Gaussian predictive scored against them with the registered uqmetrics regression metrics,
  ``score_<metric>`` (recipe, method, complexity, repetition), and the exact reference's
  predictive on the same draws, ``reference_score_<metric>`` (complexity, repetition), each
  with ``_mean``/``_se`` over repetitions;
* provenance attrs (config, seeds, versions, device, wall time per method, and each recipe's
  definition; ``n_cal``, ``alpha``).

Arrays whose size changes with the complexity (test inputs of growing dimension, training sets
of growing size) are NaN-padded along ``input_dim`` / ``train_point``; ``n_train`` and
``input_size`` give the valid extents.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import uqmetrics
from uqmetrics.runs.sweep import progress_bar as _progress_bar

from .diagnostics import COLLAPSE_THRESHOLD, constant_loss, fit_r2
from .engine import RECIPES, TrainConfig
from .engine.config import DEFAULT_MAX_MEMORY, ConfigError, is_auto, is_finite, is_int, registered
from .rng import SEED_REQUIREMENT, valid_seed
from .tasks import TaskInstance, get_task

if TYPE_CHECKING:
    import xarray as xr

#: The variables a study (or a sweep cell) computes; everything else is task data or derived.
RAW_VARS = ("prediction", "uncertainty", "train_loss", "collapsed_fraction", "interval_low", "interval_high",
            "conformal_quantile")
#: The raw variables over (..., repetition, point); the others are over (..., repetition).
_POINT_VARS = ("prediction", "uncertainty", "interval_low", "interval_high")


@dataclass(frozen=True)
class StudyConfig:
    """What a coverage study runs.

    Attributes
    ----------
    task : str
        Registered task name.
    complexities : tuple of int, optional
        Complexity levels (default: the task's ``default_complexities``).
    methods : tuple of str, optional
        Registered method names (default: all).
    recipes : tuple of str, optional
        Training recipes (:data:`uqreg.engine.RECIPES`) to run every method under (default:
        ``train.recipe`` alone).
    repetitions : int
        Number k of noise redraws / retrainings per cell.
    first_repetition : int
        Index of the first repetition (a sweep cell runs a slice of repetitions).
    seed : int
        Task seed (γ, training inputs, noise, initialisations ... all derive from it).
    n_train, sigma : optional
        Overrides of the task's training-set size and noise level.
    n_cal : int
        Calibration points per repetition of the split-conformal methods (``<method>+<score>``),
        drawn like the training points from the repetition's own stream (R.6); 0: none (then
        no conformal method can run).
    alpha : float
        Miscoverage level of every method's interval for a new observation (R.6); the
        intervals have nominal coverage 1 − alpha.
    train : TrainConfig
        Network/optimiser/method hyper-parameters.
    """

    task: str = "sinusoid"
    complexities: tuple[int, ...] | None = None
    methods: tuple[str, ...] | None = None
    recipes: tuple[str, ...] | None = None
    repetitions: int = 50
    first_repetition: int = 0
    seed: int = 0
    n_train: int | None = None
    sigma: float | None = None
    n_cal: int = 100
    alpha: float = 0.05
    train: TrainConfig = field(default_factory=TrainConfig)

    def resolved(self) -> StudyConfig:
        """Fill defaults and validate every field before any training.

        Raises
        ------
        ValueError
            :class:`~uqreg.engine.config.ConfigError` naming the field for a value it cannot
            take (a repeated complexity, a seed out of range, an ensemble of one member, an
            unknown task, method or recipe: the registry's error inside); and the task's or the
            memory check's errors.
        """
        from uqmetrics.metrics.conformal import min_calibration_size

        from .methods import get_method, list_methods  # torch: imported on use

        task = registered("task", self.task, get_task, what="a registered task")
        levels = task.default_complexities if self.complexities is None else self.complexities
        comps = tuple(levels)
        if not comps or not all(is_int(c) and c >= 1 for c in comps):
            raise ConfigError("complexities", "must be integers >= 1", comps)
        comps = tuple(int(c) for c in comps)
        if len(set(comps)) != len(comps):
            raise ConfigError("complexities", "must not repeat", comps)
        methods = tuple(list_methods() if self.methods is None else self.methods)
        if not methods:
            raise ConfigError("methods", "must name at least one method (None means all)", methods)
        for m in methods:
            registered("methods", methods, get_method, m, what="registered methods")
        if len(set(methods)) != len(methods):
            raise ConfigError("methods", "must not repeat", methods)
        if not is_int(self.repetitions) or self.repetitions < 1:
            raise ConfigError("repetitions", "must be an integer >= 1", self.repetitions)
        if not is_int(self.first_repetition) or self.first_repetition < 0:
            raise ConfigError("first_repetition", "must be an integer >= 0", self.first_repetition)
        if not valid_seed(self.seed):
            raise ConfigError("seed", SEED_REQUIREMENT, self.seed)
        if self.n_train is not None and not (is_int(self.n_train) and self.n_train >= 1):
            raise ConfigError("n_train", "must be an integer >= 1", self.n_train)
        if self.sigma is not None and not (is_finite(self.sigma) and self.sigma > 0):
            raise ConfigError("sigma", "must be a positive number", self.sigma)
        if not is_int(self.n_cal) or self.n_cal < 0:
            raise ConfigError("n_cal", "must be an integer >= 0", self.n_cal)
        if not (is_finite(self.alpha) and 0 < self.alpha < 1):
            raise ConfigError("alpha", "must be a number in (0, 1)", self.alpha)
        conformal = [m for m in methods if get_method(m).trains_as != m]
        if conformal and self.n_cal < 1:
            raise ConfigError("n_cal", f"must be >= 1 for the conformal methods {', '.join(conformal)}", self.n_cal)
        need = min_calibration_size(self.alpha)
        if conformal and self.n_cal < need:  # else q = +inf: infinite intervals, which no summary can score
            raise ConfigError("n_cal", f"must be >= {need} for the conformal methods {', '.join(conformal)} at "
                              f"alpha {self.alpha:g} (with fewer calibration points the rank "
                              f"ceil((n_cal + 1)(1 - alpha)) exceeds n_cal and every interval is infinite)",
                              self.n_cal)
        ensembles = [m for m in methods if get_method(m).ensemble]
        if ensembles and self.train.members < 2:
            raise ConfigError("members", f"must be >= 2 (an ensemble of one network has no spread; ensemble "
                              f"methods run: {', '.join(ensembles)})", self.train.members)
        recipes = (self.train.recipe,) if self.recipes is None else tuple(self.recipes)
        if not recipes:
            raise ConfigError("recipes", "must name at least one recipe (None means train.recipe)", recipes)
        for r in recipes:
            registered("recipes", recipes, RECIPES.lookup, r, what="registered recipes")
        if len(set(recipes)) != len(recipes):
            raise ConfigError("recipes", "must not repeat", recipes)
        cfg = replace(self, complexities=comps, methods=methods, recipes=recipes)
        cfg.check_memory()
        for c in comps:  # validates n_train >= p, sigma > 0, complexity
            cfg.instance(c)
        return cfg

    def train_config(self, recipe: str) -> TrainConfig:
        """The training configuration of one recipe of the study."""
        return replace(self.train, recipe=recipe)

    def memory_estimate(self, complexity: int) -> dict:
        """Bytes a complexity level needs, estimated from the task's sizes alone (nothing is
        drawn or allocated): ``data`` (training inputs, every repetition's targets, the
        reference's design and its QR factor, the results), ``network`` (the largest bytes one
        network of a trained method needs) and ``training`` (the networks trained at once, at
        most the memory budget), with the sizes used. ``max_memory="auto"`` is resolved where
        the work runs (a CUDA device's memory: :meth:`~uqreg.engine.TrainConfig.memory_budget`);
        the estimate takes :data:`~uqreg.engine.config.DEFAULT_MAX_MEMORY` in its place."""
        from .engine.plan import MIN_BATCH, job_bytes_per_network  # torch: imported on use
        from .methods import get_method, list_methods

        task = get_task(self.task)
        z = task.sizes(complexity, n_train=self.n_train)
        n, d, t, p = z["n_train"], z["input_dim"], z["n_test"], z["n_params"]
        r = self.repetitions
        n_rows = len(self.recipes or (None,)) * len(self.methods or list_methods())
        data = 8 * (n * (d + 3 * r + 3 * p) + t * (d + p) + 4 * n_rows * r * t)
        network = training = 0
        for m in (get_method(name) for name in (self.methods or list_methods())):
            if m.closed_form is not None:
                continue
            per_net = job_bytes_per_network(n, t, d, replace(self.train, **m.overrides), head=m.head,
                                            sampler=m.sampler, adversarial=m.adversarial)
            network = max(network, per_net)
            nets = r * (self.train.members if m.ensemble else 1)
            training = max(training, min(self._nominal_budget(), max(nets, MIN_BATCH) * per_net))
        return {**z, "repetitions": r, "data": data, "network": network, "training": training}

    def _nominal_budget(self) -> float:
        return DEFAULT_MAX_MEMORY if is_auto(self.train.max_memory) else self.train.max_memory

    def check_memory(self, available: int | None = None) -> None:
        """Raise ``ValueError`` before any allocation if a complexity level cannot fit: one
        network above the ``max_memory`` budget, or data plus training above ``available``
        bytes (default: this machine's physical memory). The message names the size and the
        options."""
        from .engine.plan import chunk_size, physical_memory  # torch: imported on use

        available = physical_memory() if available is None else available
        task = get_task(self.task)
        for c in self.complexities or task.default_complexities:
            est = self.memory_estimate(c)
            where = (f"{self.task} at {task.complexity_name}={c} (N={est['n_train']:,} training points × "
                     f"{est['input_dim']} inputs, {est['n_test']:,} test points, {est['repetitions']} repetitions)")
            if est["network"]:
                try:
                    chunk_size(est["network"], replace(self.train, max_memory=self._nominal_budget()))
                except ValueError as exc:
                    raise ValueError(f"{where}: {exc}") from None
            total = est["data"] + est["training"]
            if available is not None and total > available:
                raise ValueError(
                    f"{where} needs about {total / 2**30:,.1f} GiB of memory, more than the "
                    f"{available / 2**30:,.1f} GiB available; use fewer training points (--n-train), "
                    f"fewer repetitions or test points, a lower complexity, or a smaller training budget "
                    f"(--max-memory, now {self._nominal_budget() / 2**30:.3g} GiB)")

    def instance(self, complexity: int) -> TaskInstance:
        return get_task(self.task).instance(complexity, self.seed, n_train=self.n_train, sigma=self.sigma)

    @property
    def repetition_index(self) -> np.ndarray:
        return np.arange(self.first_repetition, self.first_repetition + self.repetitions)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> StudyConfig:
        d = dict(d)
        train = d.pop("train", {}) or {}
        for k in ("hidden", "betas"):
            if k in train and train[k] is not None:
                train[k] = tuple(train[k])
        for k in ("complexities", "methods", "recipes"):
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        return cls(**d, train=TrainConfig(**train))


def _pad(arrays: list[np.ndarray], fill=np.nan) -> np.ndarray:
    """Stack arrays of different shapes, padding every axis to the largest with ``fill``."""
    shape = tuple(max(s) for s in zip(*(a.shape for a in arrays)))
    out = np.full((len(arrays), *shape), fill, dtype=np.float64)
    for i, a in enumerate(arrays):
        out[(i, *tuple(slice(0, s) for s in a.shape))] = a
    return out


def progress_bar(total: int, desc: str, *, enabled: bool = True):
    """A tqdm bar on a terminal; periodic one-line updates otherwise; nothing if disabled
    (:func:`uqmetrics.runs.sweep.progress_bar`, shared with the sweeps)."""
    return _progress_bar(total, desc, unit="epoch", enabled=enabled, leave=False)


def run_raw(config: StudyConfig, *, progress: bool = True) -> xr.Dataset:
    """Train and predict every (recipe, complexity, method) of ``config``: the raw dataset, no
    summary.

    Returns
    -------
    xarray.Dataset
        ``prediction``, ``uncertainty`` (recipe, method, complexity, repetition, point),
        ``train_loss``, ``collapsed_fraction`` (recipe, method, complexity, repetition) and the
        task data (see the module docstring). Attr ``wall_time_s`` maps method to seconds;
        ``engine_plans`` (only when a measured plan was used: ``chunk_networks="auto"``) lists
        the chunk and concurrency the engine used per shape class (execution only).
    """
    from .engine.plan import recording_plans  # torch: imported on use

    with recording_plans() as plans:
        ds = _run_raw(config, progress=progress)
    if plans:
        ds.attrs["engine_plans"] = json.dumps(plans)
    return ds


def _run_raw(config: StudyConfig, *, progress: bool) -> xr.Dataset:
    from .methods import get_method  # torch: imported on use

    cfg = config.resolved()
    reps = cfg.repetition_index
    instances = [cfg.instance(c) for c in cfg.complexities]
    n_points = {inst.x_test.shape[0] for inst in instances}
    if len(n_points) != 1:
        raise ValueError(f"task {cfg.task!r} has a varying number of test points across complexities: {n_points}")
    methods = [get_method(m) for m in cfg.methods]
    trained = list({m.trains_as: m for m in methods if m.closed_form is None}.values())  # each base once
    calibrated = {m.trains_as for m in methods if m.trains_as != m.name}  # bases predicted at calibration points
    total = sum(m.n_epochs_total(inst, cfg.train_config(r), len(reps))
                for r in cfg.recipes for inst in instances for m in trained)
    bar = progress_bar(total, f"{cfg.task} study", enabled=progress)
    wall = {m.name: 0.0 for m in methods}
    shape = (len(cfg.recipes), len(methods), len(instances), len(reps))
    n_test = n_points.pop()
    out = {name: np.full((*shape, n_test) if name in _POINT_VARS else shape, np.nan) for name in RAW_VARS}
    ys = []
    for j, inst in enumerate(instances):
        y = inst.targets(reps)
        ys.append(y)
        calibration = inst.calibration(reps, cfg.n_cal) if cfg.n_cal else None
        for k, recipe in enumerate(cfg.recipes):
            shared = {}  # trains_as -> predictions: a method and its conformal versions train once
            for i, method in enumerate(methods):
                if method.closed_form is not None and k > 0:  # the reference has no recipe
                    for name in RAW_VARS:
                        out[name][k, i, j] = out[name][0, i, j]
                    continue
                bar.set_postfix_str(f"{inst.task.complexity_name}={inst.complexity} {recipe} {method.name}")
                t0 = time.perf_counter()
                if method.trains_as not in shared:  # the base method's run: its predictions, and its own interval
                    shared[method.trains_as] = get_method(method.trains_as).run(
                        inst, y, reps, cfg.train_config(recipe), progress=bar.update, alpha=cfg.alpha,
                        calibration=calibration if method.trains_as in calibrated else None)
                res = method.intervals(shared[method.trains_as], inst.noise_std(inst.x_test), calibration,
                                       cfg.alpha)
                wall[method.name] += time.perf_counter() - t0
                for name in RAW_VARS:
                    out[name][k, i, j] = getattr(res, name)
    bar.close()
    return _assemble(cfg, instances, ys, out, wall)


def _assemble(cfg, instances, ys, out, wall) -> xr.Dataset:
    import xarray as xr  # imported on use (a configuration needs none)

    from .reference import reference_prediction

    task = get_task(cfg.task)
    reps = cfg.repetition_index
    first = instances[0]
    pred = out["prediction"]
    coords = {
        "recipe": list(cfg.recipes),
        "method": list(cfg.methods),
        "complexity": list(cfg.complexities),
        "repetition": reps,
        "point": np.arange(pred.shape[-1]),
    }
    # index coordinates on the padded dims, so cells of different sizes combine with NaN padding
    sizes = {"train_point": max(i.x_train.shape[0] for i in instances),
             "input_dim": max(i.x_train.shape[1] for i in instances),
             "param": max(i.gamma.shape[0] for i in instances)}
    coords.update({k: np.arange(v) for k, v in sizes.items()})
    same = all(set(i.test_coords) == set(first.test_coords)
               and all(np.array_equal(i.test_coords[k], first.test_coords[k]) for k in first.test_coords)
               for i in instances)
    if same:
        for k, v in first.test_coords.items():
            coords[k] = ("point", np.asarray(v))
    ref_std = np.stack([reference_prediction(inst, y)[1] for inst, y in zip(instances, ys)])
    per_rep = ("recipe", "method", "complexity", "repetition")
    ds = xr.Dataset(
        {
            "prediction": ((*per_rep, "point"), pred),
            "uncertainty": ((*per_rep, "point"), out["uncertainty"]),
            "interval_low": ((*per_rep, "point"), out["interval_low"]),
            "interval_high": ((*per_rep, "point"), out["interval_high"]),
            "conformal_quantile": (per_rep, out["conformal_quantile"]),
            "train_loss": (per_rep, out["train_loss"]),
            "collapsed_fraction": (per_rep, out["collapsed_fraction"]),
            "truth": (("complexity", "point"), np.stack([i.f_test for i in instances])),
            "reference_uncertainty": (("complexity", "point"), ref_std),
            "in_distribution": (("complexity", "point"), np.stack([i.in_distribution for i in instances])),
            "x_test": (("complexity", "point", "input_dim"), _pad([i.x_test for i in instances])),
            "x_train": (("complexity", "train_point", "input_dim"), _pad([i.x_train for i in instances])),
            "y_train": (("complexity", "repetition", "train_point"), _pad(ys)),
            # fresh noisy targets at the test inputs (stream "test_noise"), scored by score_diagnostics
            "y_test": (("complexity", "repetition", "point"), np.stack([i.test_targets(reps) for i in instances])),
            "gamma": (("complexity", "param"), _pad([i.gamma for i in instances])),
            "n_train": (("complexity",), np.array([i.x_train.shape[0] for i in instances])),
            "input_size": (("complexity",), np.array([i.x_train.shape[1] for i in instances])),
        },
        coords=coords,
        attrs={
            "title": f"uqreg coverage study: {task.name}",
            "task": task.name,
            "task_description": task.description,
            "complexity_name": task.complexity_name,
            "sigma": float(first.sigma),
            "train_box": list(task.train_box),
            "probes": json.dumps(task.probes),
            "uncertainty_convention": "epistemic std only (no sigma added); ensembles: std over members, "
                                      f"dropout: std over MC passes, ddof={cfg.train.std_ddof}",
            "reference_convention": "R.2: flat prior, known sigma, pivoted QR; epistemic std",
            "n_cal": int(cfg.n_cal),
            "alpha": float(cfg.alpha),
            "interval_convention": CONFORMAL_CONVENTION,
            "wall_time_s": json.dumps(wall),
            "device": cfg.train.device,
            "recipes": json.dumps({r: RECIPES.lookup(r).to_dict() for r in cfg.recipes}),
            "collapse_convention": (f"R.3b: a network is collapsed when its final training loss (1/2 MSE of its "
                                    f"mean prediction) >= {COLLAPSE_THRESHOLD} x the best constant's "
                                    f"(1/2 var of its targets); fit_r2 = 1 - mean (prediction - truth)^2 / "
                                    f"var truth over in-distribution test points"),
        },
    )
    ds["prediction"].attrs["long_name"] = "predicted mean at the test point"
    ds["uncertainty"].attrs["long_name"] = "predicted epistemic standard deviation"
    ds["truth"].attrs["long_name"] = "noise-free ground truth G(x)ᵀγ"
    ds["y_test"].attrs["long_name"] = "new noisy target f(x*) + sigma(x*)·eps at the test point (stream test_noise)"
    ds["train_loss"].attrs["long_name"] = "final 1/2 MSE on the training set (ensemble members averaged)"
    ds["collapsed_fraction"].attrs["long_name"] = "fraction of the repetition's networks that are collapsed (R.3b)"
    ds["interval_low"].attrs["long_name"] = "lower end of the method's 1 - alpha interval for a new observation"
    ds["interval_high"].attrs["long_name"] = "upper end of the method's 1 - alpha interval for a new observation"
    ds["conformal_quantile"].attrs["long_name"] = "split-conformal quantile q of the repetition (NaN: not conformal)"
    return ds


#: What the intervals and the conditional coverage of a study are (attr ``interval_convention``).
CONFORMAL_CONVENTION = (
    "R.6: interval_low/high = a method's 1 - alpha interval for a new observation y ~ N(f(x), sigma^2): "
    "<method>+cp_abs: mean +- q, q the ceil((n_cal+1)(1-alpha))-th smallest |y - mean| on the repetition's "
    "n_cal calibration points (+inf beyond n_cal); <method>+cp_std: mean +- q*std, q from |y - mean|/std; "
    "other methods: mean +- z_(1-alpha/2)*sqrt(std^2 + sigma^2) (blr: the exact posterior predictive "
    "interval; <method>+mv: its own aleatoric variance in place of sigma^2); <method>+qr: [q_lo, q_hi], its "
    "pinball-trained alpha/2 and 1 - alpha/2 quantiles; <method>+cqr: [q_lo - q, q_hi + q], q from "
    "max(q_lo - y, y - q_hi) at the same rank (R.6, CQR). A conformal or quantile method's uncertainty "
    "is its half-width / z_(1-alpha/2). conditional_coverage = "
    "Phi((high - f)/sigma) - Phi((low - f)/sigma), exact given the interval. sigma = sigma(x) at each point "
    "for a heteroscedastic task (R.7)")


def conditional_diagnostics(raw: xr.Dataset) -> xr.Dataset:
    """The exact conditional coverage of every interval of a study and of the reference's (R.6).

    Returns
    -------
    xarray.Dataset
        ``conditional_coverage`` and ``interval_width`` (recipe, method, complexity, repetition,
        point); ``reference_conditional_coverage`` (complexity, repetition, point) of the
        Bayesian posterior predictive interval ``mean ± z_{1−α/2}·sqrt(std² + σ²)`` recomputed
        from the file's data (:func:`recompute_reference`); ``reference_interval_width``
        (complexity, point); ``width_ratio`` = width / reference width; and the region means
        over points per repetition, ``region_conditional_coverage`` (recipe, method,
        complexity, repetition, region) and ``region_reference_conditional_coverage``
        (complexity, repetition, region), region ``in``/``out`` of the training box.
    """
    import xarray as xr  # imported on use (a configuration needs none)

    from .conformal import conditional_coverage, gaussian_interval

    alpha = float(raw.attrs.get("alpha", 0.05))
    truth = raw["truth"]
    # σ(x*) at the test inputs of every complexity (R.7; σ everywhere for a homoscedastic task)
    sigma = xr.DataArray(np.stack([noise_std_at_test(raw, c) for c in raw.complexity.values]),
                         dims=("complexity", "point"), coords={d: raw[d] for d in ("complexity", "point")})
    cov = xr.apply_ufunc(conditional_coverage, raw["interval_low"], raw["interval_high"], truth, sigma)
    ref_cov, ref_width = [], []
    for c in raw.complexity.values:
        mean, std = recompute_reference(raw, c)
        sig = sigma.sel(complexity=c).values
        low, high = gaussian_interval(mean, std[None, :], sig, alpha)
        ref_cov.append(conditional_coverage(low, high, raw["truth"].sel(complexity=c).values[None, :], sig))
        ref_width.append((high - low)[0])
    ref_cov_da = xr.DataArray(np.stack(ref_cov), dims=("complexity", "repetition", "point"),
                              coords={d: raw[d] for d in ("complexity", "repetition", "point")})
    ref_width_da = xr.DataArray(np.stack(ref_width), dims=("complexity", "point"),
                                coords={d: raw[d] for d in ("complexity", "point")})
    width = raw["interval_high"] - raw["interval_low"]
    inside = raw["in_distribution"].astype(bool)

    def regions(da):
        parts = [da.where(inside).mean("point"), da.where(~inside).mean("point")]
        return xr.concat(parts, dim=xr.DataArray(["in", "out"], dims="region", name="region")).transpose(..., "region")

    out = xr.Dataset({
        "conditional_coverage": cov,
        "interval_width": width,
        "reference_conditional_coverage": ref_cov_da,
        "reference_interval_width": ref_width_da,
        "width_ratio": width / ref_width_da,
        "region_conditional_coverage": regions(cov),
        "region_reference_conditional_coverage": regions(ref_cov_da),
    })
    out["conditional_coverage"].attrs["long_name"] = "exact P(y in interval | x), y ~ N(f(x), sigma^2) (R.6)"
    out["interval_width"].attrs["long_name"] = "width of the method's 1 - alpha interval"
    out["reference_conditional_coverage"].attrs["long_name"] = (
        "exact P(y in interval | x) of the reference's posterior predictive interval")
    out["reference_interval_width"].attrs["long_name"] = "width of the reference's posterior predictive interval"
    out["width_ratio"].attrs["long_name"] = "interval width / the reference's width"
    out["region_conditional_coverage"].attrs["long_name"] = "conditional coverage, mean over the region's points"
    out["region_reference_conditional_coverage"].attrs["long_name"] = (
        "the reference's conditional coverage, mean over the region's points")
    return out


#: The registered uqmetrics regression metrics a study scores every method's Gaussian predictive
#: with against the new noisy targets ``y_test`` (variable suffix -> registered name).
SCORE_METRICS = {
    "mace": "mace",
    "rmsce": "rmsce",
    "miscalibration_area": "miscalibration_area",
    "sharpness": "sharpness",
    "nll": "gaussian_nll",
    "crps": "crps",
    "check_score": "check_score",
    "interval_score": "interval_score",
}

#: What the scores of a study are (attr ``score_convention``).
SCORE_CONVENTION = (
    "R.8: the user's view. score_<metric> = the registered uqmetrics regression metric (uncertainty-toolbox's "
    "definitions and defaults, S.6) of a method's Gaussian predictive N(prediction, s^2) against the new noisy "
    "targets y_test = f(x*) + sigma(x*)·eps (stream test_noise) over the test points, per repetition; "
    "s = (interval_high - interval_low) / (2 z_(1-alpha/2)), the std of the predictive its 1 - alpha interval "
    "states (sqrt(std^2 + sigma^2); +mv: its own aleatoric variance; conformal: q / z or q*std / z); NaN where "
    "s is not finite. reference_score_<metric> = the same metric of the exact predictive N(reference mean, "
    "epistemic + aleatoric variance) on the same draws: the attainable value, not a perfect one. "
    "_mean/_se: mean and standard error over repetitions")


def score_gaussian(name: str, y: np.ndarray, mean: np.ndarray, std: np.ndarray) -> float:
    """The registered uqmetrics metric ``name`` of the Gaussian predictive ``N(mean, std²)``
    against ``y`` (arrays of shape (T,)), the one scoring path of R.8 and R.9: NaN where a mean
    or std is not finite or a std is not positive (a conformal ``q = +inf``)."""
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std)) and np.all(std > 0)):
        return np.nan
    from uqmetrics.metrics.registry import get_metric

    return float(get_metric(name).func(y, mean, std))


def score_diagnostics(raw: xr.Dataset) -> xr.Dataset:
    """Every method's and the exact reference's Gaussian predictive scored against the new noisy
    targets ``y_test`` (R.8, :data:`SCORE_CONVENTION`), with the registered uqmetrics metrics
    :data:`SCORE_METRICS`.

    Returns
    -------
    xarray.Dataset
        ``score_<metric>`` (recipe, method, complexity, repetition) and
        ``reference_score_<metric>`` (complexity, repetition), each with its ``_mean`` and
        ``_se`` over repetitions (standard error: std with ddof=1 / sqrt(k), k the repetitions
        with a finite score).
    """
    import xarray as xr  # imported on use (a configuration needs none)
    from scipy.special import ndtri

    alpha = float(raw.attrs.get("alpha", 0.05))
    z = float(ndtri(1 - alpha / 2))
    per_rep = raw["interval_low"].dims[:-1]
    shape = raw["interval_low"].shape[:-1]
    ref_dims = ("complexity", "repetition")
    scores = {k: np.full(shape, np.nan) for k in SCORE_METRICS}
    ref = {k: np.full((raw.sizes["complexity"], raw.sizes["repetition"]), np.nan) for k in SCORE_METRICS}
    c_axis = per_rep.index("complexity")
    for j, c in enumerate(raw.complexity.values):
        sub = raw.sel(complexity=c)
        y = sub["y_test"].transpose("repetition", "point").values
        mean, std = recompute_reference(raw, c)
        pred_std = np.sqrt(std**2 + noise_std_at_test(raw, c) ** 2)
        for r in range(y.shape[0]):
            for k, name in SCORE_METRICS.items():
                ref[k][j, r] = score_gaussian(name, y[r], mean[r], pred_std)
        dims = (*(d for d in per_rep if d != "complexity"), "point")
        pred = sub["prediction"].transpose(*dims).values
        half = (sub["interval_high"] - sub["interval_low"]).transpose(*dims).values / (2 * z)
        for idx in np.ndindex(pred.shape[:-1]):
            r = idx[-1]
            full = (*idx[:c_axis], j, *idx[c_axis:])
            for k, name in SCORE_METRICS.items():
                scores[k][full] = score_gaussian(name, y[r], pred[idx], half[idx])
    coords = {d: raw[d] for d in per_rep}
    out = {}

    def add(var, values, dims, long_name):
        da = xr.DataArray(values, dims=dims, coords={d: coords[d] for d in dims})
        valid = da.notnull()
        k = valid.sum("repetition")
        mean_ = da.where(valid).mean("repetition")
        se = (da.where(valid).std("repetition", ddof=1) / np.sqrt(k)).where(k > 1)
        da.attrs["long_name"] = long_name
        out[var], out[f"{var}_mean"], out[f"{var}_se"] = da, mean_, se
        out[f"{var}_mean"].attrs["long_name"] = f"{long_name}, mean over repetitions"
        out[f"{var}_se"].attrs["long_name"] = f"{long_name}, standard error of the mean over repetitions"

    for k, name in SCORE_METRICS.items():
        add(f"score_{k}", scores[k], per_rep,
            f"{name} of the method's Gaussian predictive against the new noisy targets y_test (R.8)")
        add(f"reference_score_{k}", ref[k], ref_dims,
            f"{name} of the exact reference's predictive against the same y_test (R.8: the attainable value)")
    return xr.Dataset(out)


def collapse_diagnostics(raw: xr.Dataset) -> xr.Dataset:
    """``constant_loss`` and ``fit_r2`` over (recipe, method, complexity, repetition), derived
    from the raw variables and the task data of a study (:mod:`uqreg.diagnostics`)."""
    import xarray as xr  # imported on use (a configuration needs none)

    dims = raw["train_loss"].dims
    const, r2 = [], []
    for c in raw.complexity.values:
        sub = raw.sel(complexity=c)
        y = sub["y_train"].values[:, :int(sub["n_train"])]  # (R, N) without padding
        const.append(xr.DataArray(constant_loss(y), dims=("repetition",)))
        mask = sub["in_distribution"].values.astype(bool)
        pred = sub["prediction"]
        r2.append(xr.DataArray(fit_r2(pred.values[..., mask], sub["truth"].values[mask]), dims=pred.dims[:-1]))
    const_da = xr.concat(const, dim="complexity").broadcast_like(raw["train_loss"]).transpose(*dims)
    r2_da = xr.concat(r2, dim="complexity").transpose(*dims)
    coords = {d: raw[d] for d in dims}
    const_da = const_da.assign_coords(coords)
    r2_da = r2_da.assign_coords(coords)
    const_da.attrs["long_name"] = "1/2 var of the repetition's training targets (loss of the best constant)"
    r2_da.attrs["long_name"] = "R2 of the prediction against the truth over in-distribution test points"
    return xr.Dataset({"constant_loss": const_da, "fit_r2": r2_da})


def summarize(raw: xr.Dataset) -> xr.Dataset:
    """Add the derived coverage summary (per complexity, with in/out regions) and the collapse
    diagnostics to a raw dataset.

    A repetition whose networks diverged (a prediction or an uncertainty that is not finite at
    some test point) is marked in ``diverged`` (recipe, method, complexity, repetition) and left
    out of the coverage summary's counts, as a missing repetition: the study is summarised
    whatever one method's training did, and the printed summary names the diverged repetitions
    (their fraction is the finding, beside the coverage of the others).
    """
    pred, unc = raw["prediction"], raw["uncertainty"]
    finite = (np.isfinite(pred) & np.isfinite(unc)).all("point")
    diverged = ~finite
    diverged.attrs["long_name"] = ("the repetition's prediction or uncertainty is not finite at some test "
                                   "point (diverged networks): left out of the coverage summary")
    summary = uqmetrics.coverage_summary(
        raw[["prediction", "uncertainty", "truth"]].assign(prediction=pred.where(finite),
                                                            uncertainty=unc.where(finite)),
        reference=raw["reference_uncertainty"],
        regions=raw["in_distribution"].astype(bool),
        region_dims="point",
        skipna=bool(diverged.any()),
    )
    derived = {k: v for k, v in summary.data_vars.items() if k not in raw.data_vars}
    derived["diverged"] = diverged
    derived.update(collapse_diagnostics(raw).data_vars)
    if "interval_low" in raw.data_vars:  # files written before R.6 have no intervals
        cond = conditional_diagnostics(raw)
        derived.update({k: v for k, v in cond.data_vars.items() if k not in raw.data_vars})
    scored = "interval_low" in raw.data_vars and "y_test" in raw.data_vars  # files before R.8 have no y_test
    if scored:
        derived.update({k: v for k, v in score_diagnostics(raw).data_vars.items() if k not in raw.data_vars})
    out = raw.assign(derived)
    out.attrs.update({k: v for k, v in summary.attrs.items() if k not in raw.attrs})
    if scored:
        out.attrs.setdefault("score_convention", SCORE_CONVENTION)
    return out


def study_entries(ds: xr.Dataset, config: StudyConfig, caches: dict[str, list[str]] | None = None) -> dict[str, str]:
    """The ``entries`` attr of a study (per-entry provenance, rows = methods; ``uqreg report``,
    ``uqreg verify``).

    Parameters
    ----------
    ds : xarray.Dataset
        The study (its attr ``wall_time_s``: method -> seconds).
    config : StudyConfig
        Its resolved configuration.
    caches : dict, optional
        Method -> the cell files its values were combined from (a swept study).

    Returns
    -------
    dict
        ``{"entries": JSON}``: ``{"dim": "method", "provenance": {method: {"seeds": {"seed",
        "repetitions": [first, last]}, "recipes": {recipe: its training config, the method's
        overrides applied}, "wall_time_s", "caches"}}, "conflicts": {}}``.
    """
    from .methods import get_method  # torch: imported on use

    wall = json.loads(ds.attrs.get("wall_time_s", "{}"))
    reps = config.repetition_index
    prov = {}
    for m in config.methods:
        method = get_method(m)
        training = {r: asdict(replace(config.train_config(r), **method.overrides)) for r in config.recipes}
        row = {"seeds": {"seed": int(config.seed), "repetitions": [int(reps[0]), int(reps[-1])]},
               "recipes": training if method.closed_form is None else {},
               **({"wall_time_s": float(wall[m])} if m in wall else {})}
        if caches is not None:
            row["caches"] = sorted(caches.get(m, []))
        prov[m] = row
    return {"entries": json.dumps({"dim": "method", "provenance": prov, "conflicts": {}}, default=str)}


def run_study(config: StudyConfig, *, progress: bool = True) -> xr.Dataset:
    """Run a coverage study: :func:`run_raw` then :func:`summarize`, with provenance attrs (and
    the per-method ``entries``, :func:`study_entries`)."""
    cfg = config.resolved()
    t0 = time.perf_counter()
    ds = summarize(run_raw(cfg, progress=progress))
    ds.attrs.update(uqmetrics.provenance_attrs(config=cfg.to_dict(), seed=cfg.seed,
                                               extra={"study_wall_time_s": time.perf_counter() - t0,
                                                      **study_entries(ds, cfg)}))
    return ds


def covered(center, std, target, z: float) -> np.ndarray:
    """Whether each band ``center ± z·std`` covers its ``target``, one draw at a time: R.4's
    coverage (:func:`uqmetrics.coverage`, docs/conventions.md#r-4: ``|center − target| < z·std``,
    strict, so a band of width 0 covers nothing), 1.0 or 0.0; a band or target that is not
    finite (a diverged estimate) covers nothing.

    Parameters
    ----------
    center, std, target : ndarray, broadcast to one shape (R, T)
    z : float

    Returns
    -------
    ndarray of float, the broadcast shape
    """
    center, std, target = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in (center, std, target)))
    hit = np.zeros(center.shape)
    ok = np.isfinite(center) & np.isfinite(std) & np.isfinite(target)
    if ok.any():
        hit[ok] = uqmetrics.coverage(center[ok][None], std[ok][None], target[ok][None], z=z, axis=0)
    return hit


#: Training fields of execution only in every configuration: no bit of a result depends on them,
#: so that a result computed with or without them is reused (left out of a sweep cell's digest,
#: :func:`uqreg.sweep.cell_digest`, and of a reproduced study's identity, :func:`reproduced_study`;
#: both take them from :func:`execution_only_train_fields`).
EXECUTION_ONLY_TRAIN_FIELDS = ("cuda_graphs",)
#: Training fields that set how the network axis is cut and run (networks per chunk, chunks at
#: once, the memory budget that bounds the chunk, and from which ``"auto"`` measures it): execution
#: only where a network's bits do not depend on its chunk (:func:`execution_only_train_fields`).
CHUNKING_TRAIN_FIELDS = ("max_memory", "chunk_networks", "parallel_chunks")


def execution_only_train_fields(train) -> tuple[str, ...]:
    """The training fields no bit of a result computed under ``train`` depends on:
    :data:`EXECUTION_ONLY_TRAIN_FIELDS`, and :data:`CHUNKING_TRAIN_FIELDS` on the CPU with the
    engine's own Adam (backend ``fused``, or ``autograd`` with the ``foreach`` Adam), where a
    network's arithmetic does not depend on its chunk nor on the concurrent chunks, bit for bit
    (docs/conventions.md#r-5; tests/test_sweep.py checks it on study cells). Not on CUDA, where
    cuBLAS may choose its kernels by batch size (docs/conventions.md#r-5-plan), nor with
    PyTorch's fused CPU Adam (``backend="autograd", adam="fused"``), whose rounding depends on a
    network's place in its chunk: there a chunking field stays part of a result's identity.

    Parameters
    ----------
    train : TrainConfig or dict
        The training configuration (a dict: its ``to_dict()`` form, as a cell or a study
        records it).

    Returns
    -------
    tuple of str
    """
    t = train if isinstance(train, dict) else vars(train)
    cpu = not str(t.get("device", "cpu")).startswith("cuda")
    chunk_free = t.get("backend", "fused") != "autograd" or t.get("adam", "foreach") != "fused"
    return EXECUTION_ONLY_TRAIN_FIELDS + (CHUNKING_TRAIN_FIELDS if cpu and chunk_free else ())


def reproduce_identity(config, **attrs) -> dict:
    """What a reproduction's study is computed from, by the attr that records it
    (:func:`reproduced_study`'s ``identity``; :func:`record_identity` records it).

    Parameters
    ----------
    config : dataclass
        The study's configuration as it runs, resolved (its ``to_dict()`` is what
        :func:`uqmetrics.provenance_attrs` records as ``config``); the revisions of its
        ``methods`` that are not 0 (:func:`uqreg.methods.method_revisions`) are recorded as
        ``method_revisions`` (absent where every method is at revision 0, as in a study written
        before revisions were recorded).
    **attrs
        Further attrs of the study that say how it was computed (e.g. ``sigma_scaling_criterion``).

    Returns
    -------
    dict
        ``{attr: value}``, JSON values.
    """
    from .methods import method_revisions  # torch: imported on use

    return json.loads(json.dumps({"config": config.to_dict(), "method_revisions": method_revisions(config.methods),
                                  **attrs}, default=str))


def record_identity(ds: xr.Dataset, identity: dict) -> None:
    """Record in ``ds``'s attrs what :func:`reproduce_identity` says it was computed from (``config``
    is recorded by its provenance already; an attr whose value is None or empty is left out)."""
    ds.attrs.update({k: v for k, v in identity.items() if k != "config" and v not in (None, {})})


def flat_json(value, prefix: str = "") -> dict:
    """A JSON value as ``{dotted key: leaf}`` (dicts flattened, an empty one to no key, everything
    else a leaf)."""
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict = {}
    for k, v in value.items():
        out.update(flat_json(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _identity_differences(attrs, identity: dict) -> list[str]:
    """The fields where the study's ``attrs`` record other than ``identity`` (``found (asked)``),
    the execution-only training fields of the configuration asked
    (:func:`execution_only_train_fields`) left out."""
    from uqmetrics.runs.io import decode_attr

    found = flat_json({k: decode_attr(attrs[k]) for k in identity if k in attrs})
    asked = flat_json(identity)
    train = (identity.get("config") or {}).get("train") or {}
    skip = {f"config.train.{f}" for f in execution_only_train_fields(train)}

    def show(flat: dict, k: str) -> str:
        return json.dumps(flat[k]) if k in flat else "(not recorded)"

    return [f"{k} {show(found, k)} (asked {show(asked, k)})" for k in sorted(found.keys() | asked.keys())
            if k not in skip and show(found, k) != show(asked, k)]


def reproduced_study(path, scale: str, *, overwrite: bool = False, identity: dict | None = None) -> xr.Dataset | None:
    """The study a reproduction (``uqreg reproduce``) wrote to ``path`` at ``scale`` in an earlier
    run, reused as it is when it was computed from what this run computes.

    Parameters
    ----------
    path : path-like
        A combined study file (``study.nc``), which exists.
    scale : str
        The scale asked for now.
    overwrite : bool
        ``--overwrite``: a file of another scale (or none), or of another ``identity``, is to be
        replaced; None is returned for it, and the caller computes the study at ``scale`` and
        writes it over the file.
    identity : dict, optional
        What the study is computed from now (:func:`reproduce_identity`: its configuration,
        device included, its methods' revisions, ...): a study whose attrs record anything else
        (an earlier run on another device, a scale's configuration or a method revised since)
        is not this run's. Execution-only training fields (:func:`execution_only_train_fields`:
        ``cuda_graphs``, and on the CPU ``max_memory``, ``chunk_networks`` and
        ``parallel_chunks``) are not compared.

    Returns
    -------
    xarray.Dataset or None
        The study, when it records ``scale`` and ``identity``; None for another one under
        ``overwrite``.

    Raises
    ------
    uqmetrics.InputError
        When the file records another scale (attr ``reproduce_scale``) or none (a study written
        there by another command), or another ``identity`` (naming each field that differs), and
        not ``overwrite``: its numbers are not this run's, so it is never reused, and never
        replaced without ``--overwrite`` either.
    """
    ds = uqmetrics.read_dataset(path)
    got = ds.attrs.get("reproduce_scale")
    differ = _identity_differences(ds.attrs, identity) if identity is not None and got == scale else []
    if got != scale or differ:
        ds.close()
        if overwrite:
            return None
        if differ:
            raise uqmetrics.InputError(
                f"--scale {scale}: {path} holds a study computed at scale {scale!r} from another configuration "
                f"than this run's ({'; '.join(differ)}); pass --overwrite to replace it, or write to another --out")
        what = f"at scale {got!r}" if got is not None else "by another command than uqreg reproduce"
        raise uqmetrics.InputError(f"--scale {scale}: {path} holds a study computed {what}; pass --overwrite to "
                                   f"replace it by one at scale {scale!r}, or write to another --out")
    return ds


def noise_std_at_test(ds: xr.Dataset, complexity) -> np.ndarray:
    """σ(x*) at the test inputs of ``complexity`` (T,), from the file's task name, ``x_test`` and
    ``sigma`` (R.7: the task's noise profile times ``sigma``; ``sigma`` everywhere without one)."""
    sub = ds.sel(complexity=complexity)
    x_test = sub.x_test.values[:, :int(sub.input_size)]
    return get_task(ds.attrs["task"]).noise_std(x_test, int(complexity), float(ds.attrs["sigma"]))


def recompute_reference(ds: xr.Dataset, complexity) -> tuple[np.ndarray, np.ndarray]:
    """Recompute the exact reference (mean (R, T), std (T,)) from a study file alone.

    Uses the file's task name (its registered feature map), ``x_train``, ``y_train``,
    ``x_test`` and ``sigma``.
    """
    from .reference import fit_reference

    task = get_task(ds.attrs["task"])
    sub = ds.sel(complexity=complexity)
    n, d = int(sub.n_train), int(sub.input_size)
    x_train = sub.x_train.values[:n, :d]
    x_test = sub.x_test.values[:, :d]
    sigma = task.noise_std(x_train, int(complexity), float(ds.attrs["sigma"]))  # σ(x_i): R.7
    post = fit_reference(task.feature_map(x_train, int(complexity)), sub.y_train.values[:, :n], sigma)
    return post.predict(task.feature_map(x_test, int(complexity)))
