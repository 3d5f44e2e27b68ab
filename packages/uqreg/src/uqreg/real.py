"""The real-data study (docs/conventions.md#r-9): every method on the splits of a real data set,
scored as users score it, before and after recalibration.

There is no exact reference and no noise-free truth on real data: :func:`run_real` reports, per
method and split, the S.6 scores of :data:`uqreg.study.SCORE_METRICS` (the same registered
uqmetrics metrics and the same scoring path as R.8) and the coverage of the held-out targets by
the method's 1 − α interval (uqmetrics' one coverage, :func:`uqmetrics.coverage`: the fraction of
targets with ``|y − mean| < half-width``, strict; every interval here is centred on the method's
prediction), each with its mean and standard error over splits, and no reference ratio.

Per split ``k`` of :meth:`uqreg.datasets.RealDataset.splits`:

1. **Calibration part.** ``round(cal_fraction · n)`` rows of the training part, drawn by the
   permutation of ``numpy_stream(seed, "calibration", k)``, are set aside: the split-conformal
   methods calibrate on them and the recalibrators are fitted on them. The rest is the *fit*
   part the networks train on.
2. **Standardisation** (the UCI protocol): inputs and targets are standardised with the mean and
   std (ddof 0) of the fit part (a constant column: std 1); every method trains and predicts in
   those units, and its mean, std and interval are mapped back: all scores are in the target's
   own units.
3. **Methods.** A :class:`RealInstance` (a :class:`~uqreg.tasks.TaskInstance`-like object) holds
   the split; every registered method name runs through the method machinery as in a study
   (:mod:`uqreg.methods`; conformal ``<method>+<score>`` and mean–variance ``<method>+mv``
   versions included), split ``k`` being the engine's repetition ``k`` (so each split has its
   own initialisation, dropout and MC streams). ``blr`` is Bayesian linear regression on the
   standardised inputs with an intercept (flat prior), not an exact reference. ``cd``/``vd``
   (whose regularisers need a noise level) and ``blr`` take σ̂_lin, the residual std of the
   least-squares linear fit on the fit part (RSS / (n − p)).
4. **Aleatoric σ of a mean-only method** (everything but ``+mv`` and the conformal versions):
   σ̂_m = its root mean squared training residual, ``sqrt(2 · train_loss)`` (the mean over its
   networks of their MSE on the fit part). Its predictive is ``N(mean, std² + σ̂_m²)``. A
   ``+mv`` method uses its own aleatoric variance, a conformal one its interval (R.8: the std
   ``(high − low) / (2 z_{1−α/2})``).
5. **Recalibration** (``recal`` dim): ``none``; ``isotonic``, Kuleshov et al. (2018),
   :class:`uqmetrics.metrics.regression.IsotonicRecalibrator` fitted on the calibration part's
   predictive and applied to the test part: the calibration scores (MACE, RMSCE,
   miscalibration area) at the recalibrated levels and the coverage of the recalibrated 1 − α
   interval (the other scores are NaN: the recalibrated predictive is not a Gaussian);
   ``sigma_scaling``, :class:`~uqmetrics.metrics.regression.SigmaScaling` with its default
   criterion, the NLL-optimal factor ``s = sqrt(mean((y_cal − mean_cal)/std_cal)²)`` (Laves et
   al. 2020; the criterion is the attr ``sigma_scaling_criterion``), fitted likewise, every
   score of the scaled Gaussian. A conformal method is not recalibrated (its interval is
   already calibrated on the same part): NaN.

Results (one file per data set and split kind, :func:`write_real`): ``score_<metric>`` and
``coverage`` (method, split, recal) with ``_mean``/``_se`` over splits; ``calibration_observed``
(method, split, recal, level) for the curves; the test predictions (method, split, point),
``y_test`` (split, point), NaN-padded; ``sigma_hat`` and ``sigma_scaling_factor`` (method, split);
attr ``sigma_scaling_criterion``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
from uqmetrics.metrics.exceptions import InputError
from uqmetrics.runs.io import write_text_file

from .datasets import SPLIT_KINDS, RealDataset, Split, get_dataset, uci_dataset
from .engine import TrainConfig
from .engine.config import ConfigError, is_finite, is_int, registered
from .rng import SEED_REQUIREMENT, numpy_stream, valid_seed
from .study import SCORE_METRICS, covered, record_identity, reproduce_identity, reproduced_study

#: The recalibration states of every score (``recal`` dim).
RECALIBRATIONS = ("none", "isotonic", "sigma_scaling")
#: The scores an isotonic recalibrator gives (the others need a Gaussian predictive).
CALIBRATION_SCORES = ("mace", "rmsce", "miscalibration_area")
#: The training of a real study unless told otherwise: the ``paper`` recipe (its coupled L2 overfits
#: diabetes least of the recipes), 10 members, 100 MC passes, 100 epochs.
REAL_TRAIN = TrainConfig(recipe="paper", members=10, mc_samples=100, epochs=100)
#: The default methods: every base method.
DEFAULT_METHODS = ("blr", "bd", "cd", "vd", "ens", "ens_adv", "ens_bs")


@dataclass(frozen=True, eq=False)
class RealInstance:
    """One split of a real data set, standardised, in the shape the methods take
    (:class:`~uqreg.tasks.TaskInstance`'s attributes the method machinery reads).

    Attributes
    ----------
    x_train : ndarray, shape (N, d)
        Standardised inputs of the fit part.
    x_test : ndarray, shape (T, d)
        Standardised inputs of the test part.
    sigma : float
        σ̂_lin, the residual std of the linear least-squares fit on the fit part (standardised
        units): the noise level of ``blr`` and of the ``cd``/``vd`` regularisers.
    seed : int
        The study seed (the engine's streams: the split is the repetition).
    keep : ndarray of bool, shape (d,)
        The columns that are not constant on the fit part (the features of ``blr``).
    """

    x_train: np.ndarray
    x_test: np.ndarray
    sigma: float
    seed: int
    keep: np.ndarray
    epochs: int = 300
    complexity: int = 1
    heteroscedastic: bool = False

    def noise_std(self, x: np.ndarray) -> np.ndarray:
        """σ̂_lin at every input, shape (n,)."""
        return np.full(np.asarray(x).shape[0], self.sigma)

    def features(self, x: np.ndarray) -> np.ndarray:
        """``blr``'s design: an intercept and the non-constant standardised inputs, (n, 1 + d')."""
        x = np.asarray(x, dtype=np.float64)
        return np.concatenate([np.ones((x.shape[0], 1)), x[:, self.keep]], axis=1)


@dataclass(frozen=True)
class Prepared:
    """A split made ready: the instance, its targets and calibration part (standardised), the
    test targets (original units) and the affine map back."""

    instance: RealInstance
    y_fit: np.ndarray          # (1, N) standardised
    calibration: tuple         # (x_cal (1, C, d), y_cal (1, C)) standardised
    y_cal: np.ndarray          # (C,) original units
    y_test: np.ndarray         # (T,) original units
    test_rows: np.ndarray      # (T,)
    y_mean: float
    y_std: float
    n_fit: int


def prepare_split(x: np.ndarray, y: np.ndarray, split: Split, k: int, *, cal_fraction: float = 0.2,
                  seed: int = 0) -> Prepared:
    """Carve the calibration part of split ``k`` (stream ``numpy_stream(seed, "calibration",
    k)``), standardise on the fit part and build its :class:`RealInstance`."""
    tr = np.asarray(split.train, dtype=np.int64)
    n_cal = round(cal_fraction * tr.size)
    if n_cal < 1 or tr.size - n_cal < 2:
        raise InputError(f"cal_fraction (--cal-fraction) {cal_fraction!r} leaves {n_cal} calibration and {tr.size - n_cal} fit rows "
                         f"of the {tr.size} training rows of split {split.name!r}; each part needs rows")
    perm = numpy_stream(seed, "calibration", k).permutation(tr.size)
    cal, fit = np.sort(tr[perm[:n_cal]]), np.sort(tr[perm[n_cal:]])
    mx, sx = x[fit].mean(axis=0), x[fit].std(axis=0)
    keep = sx > 0
    sx = np.where(keep, sx, 1.0)
    my, sy = float(y[fit].mean()), float(y[fit].std())
    if not sy > 0:
        raise InputError(f"the targets of the fit part of split {split.name!r} are constant ({my!r})")

    def zx(rows):
        return (x[rows] - mx) / sx

    z_fit, y_fit = zx(fit), (y[fit] - my) / sy
    design = np.concatenate([np.ones((fit.size, 1)), z_fit[:, keep]], axis=1)
    coef, *_ = np.linalg.lstsq(design, y_fit, rcond=None)
    rss = float(np.sum((y_fit - design @ coef) ** 2))
    dof = max(fit.size - int(np.linalg.matrix_rank(design)), 1)
    sigma_lin = max(np.sqrt(rss / dof), 1e-6)
    inst = RealInstance(z_fit, zx(split.test), float(sigma_lin), int(seed), keep)
    return Prepared(inst, y_fit[None, :], (zx(cal)[None], ((y[cal] - my) / sy)[None, :]), y[cal],
                    y[split.test], np.asarray(split.test), my, sy, int(fit.size))


@dataclass(frozen=True)
class RealConfig:
    """What a real-data study runs.

    Attributes
    ----------
    dataset : str, optional
        A registered data set (:data:`uqreg.datasets.DATASETS`), or the name given to ``data``
        (None: the folder's name).
    data : str, optional
        A UCI folder (:func:`uqreg.datasets.load_uci_folder`), read instead of the registry.
    splits : {"standard", "gap"}
    n_splits : int, optional
        At most this many splits (the first ones); None: all (20 random ones without own splits).
    methods : tuple of str, optional
        Registered method names, any version (default :data:`DEFAULT_METHODS`).
    cal_fraction : float
        Fraction of each training part set aside for calibration (default 0.2).
    alpha : float
        Miscoverage of the intervals (default 0.05).
    seed : int
    train : TrainConfig
        Default :data:`REAL_TRAIN`.
    """

    dataset: str | None = "diabetes"
    data: str | None = None
    splits: str = "standard"
    n_splits: int | None = None
    methods: tuple[str, ...] | None = None
    cal_fraction: float = 0.2
    alpha: float = 0.05
    seed: int = 0
    train: TrainConfig = field(default_factory=lambda: REAL_TRAIN)

    def resolved(self) -> RealConfig:
        """Defaults filled and every field validated before any training (:class:`ConfigError`
        naming the field, an unknown method's included; the registry's error for an unknown
        data set)."""
        from .methods import get_method

        if self.data is None:
            get_dataset(self.dataset)
        elif self.dataset is not None and not (isinstance(self.dataset, str) and self.dataset):
            raise ConfigError("dataset", "must be a non-empty name", self.dataset)
        if self.splits not in SPLIT_KINDS:
            raise ConfigError("splits", f"must be one of {', '.join(SPLIT_KINDS)}", self.splits)
        if self.n_splits is not None and not (is_int(self.n_splits) and self.n_splits >= 1):
            raise ConfigError("n_splits", "must be an integer >= 1", self.n_splits)
        methods = tuple(DEFAULT_METHODS if self.methods is None else self.methods)
        if not methods:
            raise ConfigError("methods", "must name at least one method (None means the base methods)", methods)
        if len(set(methods)) != len(methods):
            raise ConfigError("methods", "must not repeat", methods)
        for m in methods:
            registered("methods", methods, get_method, m, what="registered methods")
        if not (is_finite(self.cal_fraction) and 0 < self.cal_fraction < 1):
            raise ConfigError("cal_fraction", "must be a number in (0, 1)", self.cal_fraction)
        if not (is_finite(self.alpha) and 0 < self.alpha < 1):
            raise ConfigError("alpha", "must be a number in (0, 1)", self.alpha)
        if not valid_seed(self.seed):
            raise ConfigError("seed", SEED_REQUIREMENT, self.seed)
        ensembles = [m for m in methods if get_method(m).ensemble]
        if ensembles and self.train.members < 2:
            raise ConfigError("members", f"must be >= 2 (an ensemble of one network has no spread; ensemble "
                              f"methods run: {', '.join(ensembles)})", self.train.members)
        return replace(self, methods=methods)

    def dataset_object(self) -> RealDataset:
        """The data set: the UCI folder ``data`` (named ``dataset``) or the registered one."""
        if self.data is not None:
            return uci_dataset(self.data, self.dataset)
        return get_dataset(self.dataset)

    def to_dict(self) -> dict:
        return asdict(self)


def _scores(y, mean, std, recalibrator=None) -> dict[str, float]:
    """Every score of :data:`SCORE_METRICS` of ``N(mean, std²)`` against ``y`` (the registered
    uqmetrics metrics; NaN where the std is not finite and positive); with an isotonic
    ``recalibrator`` only the calibration scores, at its levels."""
    from uqmetrics.metrics.registry import get_metric

    from .study import score_gaussian

    if recalibrator is None:
        return {k: score_gaussian(name, y, mean, std) for k, name in SCORE_METRICS.items()}
    ok = np.all(np.isfinite(std)) and np.all(std > 0)
    return {k: (float(get_metric(name).func(y, mean, std, recalibrator=recalibrator))
                if k in CALIBRATION_SCORES and ok else np.nan) for k, name in SCORE_METRICS.items()}


def _curve(y, mean, std, recalibrator=None) -> np.ndarray:
    from uqmetrics.metrics.regression import CALIBRATION_BINS, calibration_curve

    if not (np.all(np.isfinite(std)) and np.all(std > 0)):
        return np.full(CALIBRATION_BINS, np.nan)
    return calibration_curve(y, mean, std, recalibrator=recalibrator)[1]


def _gaussian_ok(std) -> bool:
    return bool(np.all(np.isfinite(std)) and np.all(std > 0))


def _coverage(y, center, half) -> float:
    """Fraction of the targets ``y`` inside their band ``center ± half``: uqmetrics' one coverage
    (:func:`uqmetrics.coverage` with ``z = 1``, CONVENTIONS["coverage"]: ``|center − y| < half``,
    strict, so a target on the band's edge is not covered), taken point by point.

    ``half`` is the band's half-width, ``z · std`` for a Gaussian 1 − α interval. A band whose
    centre or half-width is NaN (a diverged network) covers nothing, and so does a negative
    half-width (crossed bounds: an empty interval); an infinite half-width (a conformal quantile
    beyond its calibration rank: the whole line) covers every finite target.
    """
    y, center, half = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in (y, center, half)))
    hit = covered(center, np.maximum(half, 0.0), y, 1.0)  # not finite: not covered, but
    hit[np.isfinite(y) & np.isfinite(center) & np.isposinf(half)] = 1.0  # the whole line
    return float(hit.mean())


def recalibrated(y_cal, mean_cal, std_cal, y, mean, std, *, alpha: float = 0.05) -> dict:
    """A Gaussian predictive scored on a test part before and after recalibration fitted on a
    calibration part (module docstring, step 5).

    Parameters
    ----------
    y_cal, mean_cal, std_cal : array_like, shape (C,)
        The calibration part's targets and predictive (std > 0).
    y, mean, std : array_like, shape (T,)
        The test part's.
    alpha : float
        Miscoverage of the interval whose coverage is reported.

    Returns
    -------
    dict
        ``scores`` (recal -> {score: value}), ``coverage`` (recal -> fraction of ``y`` strictly
        inside the 1 − α interval, :func:`_coverage`), ``curve`` (recal -> observed proportions,
        :data:`CALIBRATION_BINS` levels) for recal in :data:`RECALIBRATIONS`, ``sigma_scaling_factor`` and
        ``sigma_scaling_criterion`` (:class:`~uqmetrics.metrics.regression.SigmaScaling`'s
        default, ``"nll"``).
    """
    from scipy.special import ndtri
    from uqmetrics.metrics.regression import IsotonicRecalibrator, SigmaScaling

    z = float(ndtri(1 - alpha / 2))
    y, mean, std = (np.asarray(a, dtype=np.float64) for a in (y, mean, std))
    out = {"scores": {"none": _scores(y, mean, std)}, "coverage": {"none": _coverage(y, mean, z * std)},
           "curve": {"none": _curve(y, mean, std)}, "sigma_scaling_factor": np.nan}
    iso = IsotonicRecalibrator().fit(y_cal, mean_cal, std_cal)
    out["scores"]["isotonic"] = _scores(y, mean, std, recalibrator=iso)
    # the recalibrated interval, mean ± std Φ⁻¹(1/2 + R(1 − α)/2): symmetric about the mean
    _, hi = iso.interval(mean, std, 1 - alpha)
    out["coverage"]["isotonic"] = _coverage(y, mean, hi - mean)
    out["curve"]["isotonic"] = _curve(y, mean, std, recalibrator=iso)
    sc = SigmaScaling().fit(y_cal, mean_cal, std_cal)
    s2 = sc.apply(std)
    out["sigma_scaling_factor"], out["sigma_scaling_criterion"] = sc.factor_, sc.criterion
    out["scores"]["sigma_scaling"] = _scores(y, mean, s2)
    out["coverage"]["sigma_scaling"] = _coverage(y, mean, z * s2)
    out["curve"]["sigma_scaling"] = _curve(y, mean, s2)
    return out


def _at_calibration(result):
    """``result`` with every field that has a ``cal_`` counterpart replaced by it (prediction,
    uncertainty, aleatoric variance, quantiles...): what the method predicted at the calibration
    points, for its own ``intervals``; None where a field has no value at them."""
    names = {f.name for f in dataclasses.fields(result)}
    swap = {}
    for n in names:
        if f"cal_{n}" in names and getattr(result, n) is not None:
            cal = getattr(result, f"cal_{n}")
            if cal is None:
                return None
            swap[n] = cal
    return replace(result, **swap) if "prediction" in swap else None


def run_split(prep: Prepared, methods, k: int, cfg: RealConfig) -> dict:
    """Train and score every method on one prepared split (the engine's repetition ``k``); per
    method a dict of its test predictive (target units), σ̂, and the scores, coverages and
    curves per recalibration (:func:`recalibrated`; a conformal method's before only)."""
    from scipy.special import ndtri

    from .methods import Method, get_method

    z = float(ndtri(1 - cfg.alpha / 2))
    inst, reps = prep.instance, [k]
    shared, out = {}, {}
    for name in methods:
        method = get_method(name)
        t0 = time.perf_counter()
        if method.trains_as not in shared:
            shared[method.trains_as] = get_method(method.trains_as).run(
                inst, prep.y_fit, reps, cfg.train, calibration=prep.calibration, alpha=cfg.alpha)
        base = shared[method.trains_as]
        own = method.trains_as == method.name      # not a conformal version: a predictive of its own
        # a mean-only method whose interval is the Gaussian one around its mean takes σ̂_m (step 4)
        uses_sigma = base.aleatoric_variance is None and type(method).intervals is Method.intervals
        sigma_hat = float(np.sqrt(2.0 * base.train_loss[0])) if uses_sigma else inst.sigma
        res = method.intervals(base, sigma_hat, prep.calibration, cfg.alpha)
        a, b = prep.y_std, prep.y_mean
        mean = res.prediction[0] * a + b
        low, high = res.interval_low[0] * a + b, res.interval_high[0] * a + b
        with np.errstate(invalid="ignore"):
            std = (high - low) / (2 * z)                     # R.8: the std the interval states
        y = prep.y_test
        row = {"prediction": mean, "predictive_std": std, "interval_low": low, "interval_high": high,
               "sigma_hat": sigma_hat * a if uses_sigma else np.nan, "sigma_scaling_factor": np.nan}
        cal_std = None
        view = _at_calibration(base) if own else None
        if view is not None:  # the calibration part's predictive, the same rule as the test part's, target units
            cal = method.intervals(view, sigma_hat, None, cfg.alpha)
            cal_mean = cal.prediction[0] * a + b
            with np.errstate(invalid="ignore"):
                cal_std = (cal.interval_high[0] - cal.interval_low[0]) * a / (2 * z)
        if cal_std is not None and _gaussian_ok(cal_std) and _gaussian_ok(std):
            row.update(recalibrated(prep.y_cal, cal_mean, cal_std, y, mean, std, alpha=cfg.alpha))
        else:
            # every interval is centred on its prediction (Gaussian, conformal, CQR's quantile midpoint)
            row.update({"scores": {"none": _scores(y, mean, std)},
                        "coverage": {"none": _coverage(y, mean, (high - low) / 2)},
                        "curve": {"none": _curve(y, mean, std)}})
        row["wall_time_s"] = time.perf_counter() - t0
        out[name] = row
    return out


#: What the results of a real study are (attr ``real_convention``).
REAL_CONVENTION = (
    "R.9: real data, no reference. Per split: a seeded calibration part (cal_fraction of the training rows, stream "
    "calibration, repetition = split), inputs and targets standardised on the fit part, scores in target units. "
    "score_<metric> = the registered uqmetrics metric (S.6, the R.8 set) of N(prediction, predictive_std^2) "
    "against the held-out targets y_test; predictive_std = (interval_high - interval_low)/(2 z_(1-alpha/2)); "
    "mean-only methods: sqrt(std^2 + sigma_hat^2), sigma_hat = root mean squared training residual; +mv: own "
    "aleatoric variance; conformal: their interval. recal = none | isotonic (Kuleshov et al. 2018, fitted on the "
    "calibration part; calibration scores only) | sigma_scaling (uqmetrics SigmaScaling, default criterion, attr "
    "sigma_scaling_criterion: 'nll', std * s with the NLL-optimal s = sqrt(mean(((y_cal - mean)/std)^2)) on the "
    "calibration part, Laves et al. 2020). coverage = fraction of y_test strictly inside the 1 - alpha interval "
    "(uqmetrics coverage: |y_test - prediction| < half-width, strict; every interval is centred on the "
    "prediction). _mean/_se over splits (se = std ddof 1 / sqrt(k)). No reference ratio.")


def run_real(config: RealConfig, *, progress: bool = True):
    """Run a real-data study (module docstring).

    Returns
    -------
    xarray.Dataset
        See the module docstring; attrs ``dataset``, ``split_kind``, ``alpha``, ``cal_fraction``,
        ``sigma_scaling_criterion`` (the criterion of the ``sigma_scaling`` factor),
        ``real_convention``, ``wall_time_s`` and provenance.
    """
    import uqmetrics
    import xarray as xr
    from uqmetrics.metrics.regression import CALIBRATION_BINS, SigmaScaling

    t_start = time.perf_counter()
    cfg = config.resolved()
    data = cfg.dataset_object()
    arrays = data.arrays()
    splits = data.splits(cfg.splits, n_splits=cfg.n_splits, seed=cfg.seed)
    methods = list(cfg.methods)
    # every split is carved and checked before any training (a split too small for cal_fraction,
    # constant targets: the error comes before the work, not after the splits before it)
    preps = [prepare_split(arrays.x, arrays.y, sp, k, cal_fraction=cfg.cal_fraction, seed=cfg.seed)
             for k, sp in enumerate(splits)]
    rows = []
    for k, (sp, prep) in enumerate(zip(splits, preps)):
        if progress:
            print(f"real: {data.name} {sp.name} ({k + 1}/{len(splits)})", flush=True)
        rows.append(run_split(prep, methods, k, cfg))
    n_m, n_s = len(methods), len(splits)
    n_p = max(p.y_test.size for p in preps)
    n_r = len(RECALIBRATIONS)
    pt = {v: np.full((n_m, n_s, n_p), np.nan) for v in ("prediction", "predictive_std", "interval_low",
                                                        "interval_high")}
    per = {v: np.full((n_m, n_s), np.nan) for v in ("sigma_hat", "sigma_scaling_factor")}
    scores = {k: np.full((n_m, n_s, n_r), np.nan) for k in SCORE_METRICS}
    cov = np.full((n_m, n_s, n_r), np.nan)
    curves = np.full((n_m, n_s, n_r, CALIBRATION_BINS), np.nan)
    y_test = np.full((n_s, n_p), np.nan)
    test_row = np.full((n_s, n_p), -1, dtype=np.int64)
    wall = {m: 0.0 for m in methods}
    for j, (prep, row) in enumerate(zip(preps, rows)):
        t = prep.y_test.size
        y_test[j, :t], test_row[j, :t] = prep.y_test, prep.test_rows
        for i, m in enumerate(methods):
            r = row[m]
            wall[m] += r["wall_time_s"]
            for v, arr in pt.items():
                arr[i, j, :t] = r[v]
            for v, arr in per.items():
                arr[i, j] = r[v]
            for q, rc in enumerate(RECALIBRATIONS):
                if rc in r["scores"]:
                    for k2 in SCORE_METRICS:
                        scores[k2][i, j, q] = r["scores"][rc][k2]
                    cov[i, j, q] = r["coverage"][rc]
                    curves[i, j, q] = r["curve"][rc]
    coords = {"method": methods, "split": [s.name for s in splits], "recal": list(RECALIBRATIONS),
              "point": np.arange(n_p), "level": np.linspace(0.0, 1.0, CALIBRATION_BINS)}
    mp, ms, msr = ("method", "split", "point"), ("method", "split"), ("method", "split", "recal")
    ds = xr.Dataset(
        {**{v: (mp, a) for v, a in pt.items()},
         **{v: (ms, a) for v, a in per.items()},
         "coverage": (msr, cov),
         **{f"score_{k2}": (msr, a) for k2, a in scores.items()},
         "calibration_observed": ((*msr, "level"), curves),
         "y_test": (("split", "point"), y_test),
         "test_row": (("split", "point"), test_row),
         "split_kind": (("split",), np.array([s.kind for s in splits])),
         "split_feature": (("split",), np.array([s.feature for s in splits], dtype=np.int64)),
         "n_fit": (("split",), np.array([p.n_fit for p in preps])),
         "n_cal": (("split",), np.array([p.y_cal.size for p in preps])),
         "n_test": (("split",), np.array([p.y_test.size for p in preps])),
         "sigma_lin": (("split",), np.array([p.instance.sigma * p.y_std for p in preps]))},
        coords=coords,
        attrs={"title": f"uqreg real-data study: {data.name} ({cfg.splits} splits)", "dataset": data.name,
               "dataset_description": data.description, "dataset_source": data.source,
               "feature_names": json.dumps(list(arrays.feature_names)), "split_kind": cfg.splits,
               "alpha": float(cfg.alpha), "cal_fraction": float(cfg.cal_fraction),
               "sigma_scaling_criterion": SigmaScaling().criterion, "real_convention": REAL_CONVENTION,
               "wall_time_s": json.dumps(wall)})
    for name in ("coverage", *(f"score_{k2}" for k2 in SCORE_METRICS)):
        da = ds[name]
        valid = da.notnull()
        n = valid.sum("split")
        ds[f"{name}_mean"] = da.where(valid).mean("split")
        ds[f"{name}_se"] = (da.where(valid).std("split", ddof=1) / np.sqrt(n)).where(n > 1)
    ds["coverage"].attrs["long_name"] = "fraction of the held-out targets in the method's 1 - alpha interval"
    ds["y_test"].attrs["long_name"] = "held-out target (NaN: padding)"
    ds["test_row"].attrs["long_name"] = "row of the held-out target in the data set (-1: padding)"
    ds["sigma_hat"].attrs["long_name"] = "aleatoric std of a mean-only method: its RMS training residual (target units)"
    ds["sigma_scaling_factor"].attrs["long_name"] = (
        f"sigma-scaling factor s fitted on the calibration part (criterion {SigmaScaling().criterion!r})")
    ds["sigma_lin"].attrs["long_name"] = "residual std of the linear least-squares fit on the fit part (target units)"
    ds["calibration_observed"].attrs["long_name"] = "observed proportion in the central interval of expected level"
    ds.attrs.update(uqmetrics.provenance_attrs(config=cfg.to_dict(), seed=cfg.seed,
                                               extra={"study_wall_time_s": time.perf_counter() - t_start}))
    return ds


def write_real(ds, target, *, overwrite: bool = False) -> Path:
    """Write a real study atomically (:func:`uqmetrics.write_dataset`); an existing file is
    refused unless ``overwrite``."""
    import uqmetrics

    return uqmetrics.write_dataset(ds, target, overwrite=overwrite)


# --- findings ----------------------------------------------------------------------------------


def paired_sign_test(before: np.ndarray, after: np.ndarray) -> tuple[int, int, float]:
    """``(k, n, p)``: of the ``n`` splits where both are finite and differ, ``k`` have
    ``after < before``; ``p`` the two-sided sign-test p-value (twice
    :func:`uqmetrics.metrics.stats.sign_test` of the majority side, at most 1; NaN for n = 0)."""
    from uqmetrics.metrics.stats import sign_test

    b, a = np.asarray(before, float), np.asarray(after, float)
    ok = np.isfinite(a) & np.isfinite(b) & (a != b)
    n, k = int(ok.sum()), int((a[ok] < b[ok]).sum())
    return k, n, (min(1.0, 2 * sign_test(max(k, n - k), n)) if n else np.nan)


def findings(ds) -> list[tuple[str, str, str]]:
    """``[(method, finding, statistics)]`` of one real study: the coverage of the held-out targets
    against 1 − α (mean over splits ± 2 s.e., the s.e. the larger of the splits' and the binomial
    one of all held-out targets pooled at coverage 1 − α), and for every recalibration and score
    (MACE, NLL, CRPS) whether it lowers the score in a paired sign test across splits (a claim
    only where p < 0.05)."""
    rows = []
    nominal = 1 - float(ds.attrs["alpha"])
    for m in [str(v) for v in ds.method.values]:
        at = {"method": m, "recal": "none"}
        c = float(ds.coverage_mean.sel(at))
        k_splits = int(ds.coverage.sel(at).notnull().sum())
        pooled = int(ds.n_test.sum())
        # the larger of the splits' s.e. and the binomial s.e. of the pooled held-out targets (few splits),
        # the latter at the nominal 1 - alpha (at the observed c it is 0 for c = 1: 44 of 44 held-out
        # targets covered would be called over-covering, though 0.95**44 = 0.10)
        se = max(float(np.nan_to_num(ds.coverage_se.sel(at).values)), float(np.sqrt(nominal * (1 - nominal) / pooled)))
        word = ("under-covers" if c < nominal - 2 * se else "over-covers" if c > nominal + 2 * se
                else "covers within 2 s.e. of")
        rows.append((m, f"coverage of held-out targets {c:.3f} ± {se:.3f}: {word} {nominal:.2f}",
                     (f"mean over {k_splits} splits ± the larger of their s.e. and the binomial s.e. at "
                      f"{nominal:.2f} of the {pooled} held-out targets pooled")))
        for rc in ("isotonic", "sigma_scaling"):
            for score in ("mace", "nll", "crps"):
                before = ds[f"score_{score}"].sel({"method": m, "recal": "none"}).values
                after = ds[f"score_{score}"].sel({"method": m, "recal": rc}).values
                k, n, p = paired_sign_test(before, after)
                if n == 0:
                    continue
                word = ("lowers" if k * 2 > n else "raises") if p < 0.05 else "does not distinguishably change"
                rows.append((m, f"{rc} {word} {score.upper()}: {np.nanmean(before):.4g} → {np.nanmean(after):.4g}",
                             f"paired sign test: lower on {k} of {n} splits, two-sided p = {p:.2g}"))
    return rows


def score_table(ds, scores=("mace", "rmsce", "miscalibration_area", "nll", "crps", "interval_score")) -> str:
    """A markdown table per method and recalibration: coverage and the scores, mean ± s.e. over
    splits."""
    head = "| method | recal | coverage | " + " | ".join(scores) + " |"
    lines = [head, "|---|---|---|" + "---|" * len(scores)]

    def cell(var, m, rc):
        at = {"method": m, "recal": rc}
        v, e = float(ds[f"{var}_mean"].sel(at)), float(ds[f"{var}_se"].sel(at))
        return "–" if not np.isfinite(v) else f"{v:.3g} ± {e:.2g}"

    for m in ds.method.values:
        for rc in ds.recal.values:
            if not np.isfinite(float(ds.coverage_mean.sel({"method": m, "recal": rc}))):
                continue
            lines.append(f"| {m} | {rc} | {cell('coverage', m, rc)} | "
                         + " | ".join(cell(f"score_{s}", m, rc) for s in scores) + " |")
    return "\n".join(lines)


# --- uqreg reproduce real -------------------------------------------------------------------------


@dataclass(frozen=True)
class RealScale:
    """A named size of ``uqreg reproduce real``: per split kind the number of splits, and the
    training configuration."""

    name: str
    description: str
    n_splits: dict
    methods: tuple[str, ...] = DEFAULT_METHODS
    train: TrainConfig = field(default_factory=lambda: REAL_TRAIN)


def _scales():
    from uqmetrics.metrics.registry import Registry

    reg: Registry[RealScale] = Registry("scale")
    reg.register(RealScale("cpu", "diabetes, 20 random and 10 gap splits, every base method, ens+mv, ens+cp_abs, "
                           "ens+cqr and bd+cqr, 10 members, 100 epochs: minutes on 2 CPU cores",
                           {"standard": 20, "gap": None},
                           methods=(*DEFAULT_METHODS, "ens+mv", "ens+cp_abs", "ens+cqr", "bd+cqr"), train=REAL_TRAIN))
    reg.register(RealScale("smoke", "seconds: blr, bd, ens, ens+cp_abs, ens+cqr on 2 random and 2 gap splits, "
                           "2 members, 3 epochs (tests)", {"standard": 2, "gap": 2},
                           methods=("blr", "bd", "ens", "ens+cp_abs", "ens+cqr"),
                           train=replace(REAL_TRAIN, members=2, epochs=3, mc_samples=3)))
    return reg


#: The scales of ``uqreg reproduce real``.
SCALES = _scales()


def reproduce_real(out_dir, *, scale: str = "cpu", device: str = "cpu", progress: bool = True,
                   dataset: str = "diabetes", overwrite: bool = False) -> list[Path]:
    """``uqreg reproduce real``: every method of the scale on ``dataset`` (diabetes) under its
    standard (random) and its gap splits; ``OUT/<dataset>_<kind>/study.nc`` (an existing file of
    the same scale and configuration, device, methods' revisions and sigma-scaling criterion
    included, is reused, one of another is an error, or replaced under ``overwrite``:
    :func:`uqreg.study.reproduced_study`), the figures (:func:`uqreg.plots.plot_real_calibration`,
    :func:`uqreg.plots.plot_real_scores`) and ``findings.md`` (:func:`score_table` and
    :func:`findings`). Returns the paths written."""
    import matplotlib.pyplot as plt
    from uqmetrics.metrics.regression import SigmaScaling
    from uqmetrics.report.plotting import save_figure

    from .plots import plot_real_calibration, plot_real_scores

    sc = SCALES.lookup(scale)
    out = Path(out_dir)
    t0 = time.perf_counter()
    studies, paths = {}, []
    configs = {kind: RealConfig(dataset=dataset, splits=kind, n_splits=n, methods=sc.methods,
                                train=replace(sc.train, device=device)).resolved() for kind, n in sc.n_splits.items()}
    identity = {kind: reproduce_identity(cfg, sigma_scaling_criterion=SigmaScaling().criterion)
                for kind, cfg in configs.items()}
    # the studies already there, of this scale and configuration (another's: refused before any work)
    done = {kind: ds for kind in sc.n_splits if (out / f"{dataset}_{kind}" / "study.nc").exists()
            and (ds := reproduced_study(out / f"{dataset}_{kind}" / "study.nc", scale, overwrite=overwrite,
                                        identity=identity[kind])) is not None}
    for kind in sc.n_splits:
        target = out / f"{dataset}_{kind}" / "study.nc"
        if kind in done:
            ds = done[kind]
        else:
            ds = run_real(configs[kind], progress=progress)
            ds.attrs["reproduce_scale"] = scale
            record_identity(ds, identity[kind])
            write_real(ds, target, overwrite=overwrite)  # another scale's: refused above unless overwrite
        studies[kind] = ds
        paths.append(target)
        for name, fig in ((f"real_{dataset}_{kind}_calibration", plot_real_calibration(ds)),
                          (f"real_{dataset}_{kind}_scores", plot_real_scores(ds))):
            paths.append(save_figure(fig, out / "figures" / f"{name}.png"))
            plt.close(fig)
    text = [f"# Real data: {dataset}, scale {scale}", "",
            f"wall time of this run {time.perf_counter() - t0:.0f} s (studies resumed from disk cost nothing)", ""]
    for kind, ds in studies.items():
        text += [f"## {kind} splits ({ds.sizes['split']})", "", score_table(ds), "", "### Findings", "",
                 "| method | finding | statistics |", "|---|---|---|"]
        text += [f"| {' | '.join(row)} |" for row in findings(ds)]
        text.append("")
    target = write_text_file(out / "findings.md", "\n".join(text) + "\n", overwrite=True)  # atomic
    paths.append(target)
    return paths


__all__ = ["CALIBRATION_SCORES", "DEFAULT_METHODS", "REAL_CONVENTION", "REAL_TRAIN", "RECALIBRATIONS", "SCALES",
           "Prepared", "RealConfig", "RealInstance", "RealScale", "findings", "paired_sign_test", "prepare_split", "recalibrated",
           "reproduce_real", "run_real", "run_split", "score_table", "write_real"]
