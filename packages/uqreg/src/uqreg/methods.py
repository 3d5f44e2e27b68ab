"""The UQ methods under test (R.3), registered by name.

A method is a small declarative :class:`Method`: which stochastic head the network has, how
batches are drawn, whether FGSM inputs are added, and whether a repetition trains an ensemble
of ``members`` networks or a single network predicted by Monte-Carlo passes. The same batched
engine (:mod:`uqreg.engine`) trains all of them; ``blr`` is the exact reference (R.2).

Register a new method with::

    register_method(Method("ens_wide", "ensemble of wider nets", head="deterministic",
                           ensemble=True, overrides={"hidden": (256, 128, 64)}))

Every method also has a split-conformal version per registered conformal score
(:data:`uqreg.conformal.SCORES`), named ``<method>+<score>`` (``ens+cp_abs``, ``bd+cp_std``):
:func:`get_method` builds it as a :class:`ConformalMethod`, which trains exactly the networks of
its base method (same configuration, same random streams) and calibrates their predictions on
the study's calibration points (docs/conventions.md#r-6).

Every trained method also has a mean–variance version ``<method>+mv`` (``ens+mv``, ``bd+mv``;
docs/conventions.md#r-7): :func:`get_method` builds it as a :class:`MeanVarianceMethod`, the same
method whose networks also output a variance σ²(x) and train on the Gaussian (β-)NLL; its result
holds the predicted aleatoric variance, and :meth:`MethodResult.decompose` splits its predictive
variance into the aleatoric and the epistemic part. ``<method>+mv+<score>`` is its conformal
version.

The ensembles and Bernoulli dropout also have a quantile version ``<method>+qr`` (``ens+qr``,
``bd+qr``; docs/conventions.md#r-6): :func:`get_method` builds it as a :class:`QuantileMethod`,
whose networks output the α/2 and 1 − α/2 conditional quantiles (α the study's) trained on the
pinball loss, and its conformalized version ``<method>+cqr`` (:class:`CQRMethod`, Romano,
Patterson & Candès 2019), which trains the networks of ``<method>+qr``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
from uqmetrics.metrics.exceptions import InputError
from uqmetrics.metrics.registry import Registry

from . import conformal
from .diagnostics import collapsed, constant_loss, half_mse
from .engine import (
    HEADS,
    OBJECTIVES,
    SAMPLERS,
    NetworkBatch,
    TrainConfig,
    TrainJob,
    execute,
    make_plan,
)
from .reference import Decomposition, fit_reference
from .tasks import TaskInstance


@dataclass(frozen=True)
class MethodResult:
    """What a method returns for R repetitions.

    Attributes
    ----------
    prediction, uncertainty : ndarray, shape (R, T)
        Mean and epistemic std at the test inputs.
    train_loss : ndarray, shape (R,)
        Final ½·MSE on the training set (of each network's mean prediction; ensemble members
        averaged).
    collapsed_fraction : ndarray, shape (R,)
        Fraction of the repetition's networks that are collapsed (:mod:`uqreg.diagnostics`).
    cal_prediction, cal_uncertainty : ndarray, shape (R, C), optional
        Mean and epistemic std at each repetition's calibration points (None without them).
    interval_low, interval_high : ndarray, shape (R, T), optional
        The method's 1 − α interval for a new observation at the test inputs: the
        split-conformal interval of a :class:`ConformalMethod`, else the Gaussian predictive
        interval ``prediction ± z_{1−α/2}·sqrt(uncertainty² + σ²)`` (:meth:`Method.intervals`).
    conformal_quantile : ndarray, shape (R,), optional
        The conformal quantile q of each repetition (NaN for a method that is not conformal).
    aleatoric_variance, cal_aleatoric_variance : ndarray, shape (R, T) and (R, C), optional
        A mean–variance method's aleatoric variance at the test (and calibration) inputs: the
        mean over its members (ensembles) or MC passes (dropout) of the predicted σ²ₘ(x); None
        for a mean-only method.
    quantile_low, quantile_high, cal_quantile_low, cal_quantile_high : ndarray, optional
        A quantile method's (:class:`QuantileMethod`) α/2 and 1 − α/2 quantiles at the test
        (R, T) and calibration (R, C) inputs: the mean over its members (ensembles) or MC passes
        (dropout) of each network's quantile outputs; None for the other methods.
    """

    prediction: np.ndarray
    uncertainty: np.ndarray
    train_loss: np.ndarray
    collapsed_fraction: np.ndarray
    cal_prediction: np.ndarray | None = None
    cal_uncertainty: np.ndarray | None = None
    interval_low: np.ndarray | None = None
    interval_high: np.ndarray | None = None
    conformal_quantile: np.ndarray | None = None
    aleatoric_variance: np.ndarray | None = None
    cal_aleatoric_variance: np.ndarray | None = None
    quantile_low: np.ndarray | None = None
    quantile_high: np.ndarray | None = None
    cal_quantile_low: np.ndarray | None = None
    cal_quantile_high: np.ndarray | None = None

    def decompose(self) -> Decomposition:
        """The predictive variance split into its two sources (docs/conventions.md#r-7).

        Returns
        -------
        Decomposition
            The type of the exact oracle (:func:`uqreg.reference.reference_decomposition`), with
            every field of shape (R, T): ``mean`` = :attr:`prediction`; ``epistemic_variance`` =
            :attr:`uncertainty` ², the variance over members (ensembles) or MC passes (dropout)
            of the means μₘ(x), with ``std_ddof`` (1: the sample variance, as the std);
            ``aleatoric_variance`` = the mean over the same members or passes of σ²ₘ(x);
            ``predictive_variance`` their sum.

        Raises
        ------
        InputError
            For a mean-only method (no aleatoric estimate).
        """
        if self.aleatoric_variance is None:
            raise InputError("decompose needs a mean-variance method (<method>+mv), got a result without "
                             "aleatoric_variance")
        return Decomposition(self.prediction, np.square(self.uncertainty), self.aleatoric_variance)

    @classmethod
    def from_networks(cls, prediction, uncertainty, fit: np.ndarray, y: np.ndarray, **cal) -> MethodResult:
        """Diagnostics from the networks' fits ``fit (R, M, N)`` to the targets ``y (R, N)``;
        ``cal`` holds ``cal_prediction`` and ``cal_uncertainty`` (R, C) where there are
        calibration points."""
        loss = half_mse(fit, y[:, None, :])  # (R, M)
        bad = collapsed(loss, constant_loss(y)[:, None])
        return cls(prediction, uncertainty, loss.mean(axis=1), bad.mean(axis=1), **cal)


@dataclass(frozen=True)
class Method:
    """A registered UQ method.

    Attributes
    ----------
    name, description : str
    head : str
        Stochastic head of the network (:data:`uqreg.engine.HEADS`).
    ensemble : bool
        True: ``members`` networks per repetition, predicted by mean/std over members.
        False: one network per repetition, predicted by mean/std over MC passes.
    sampler : str
        Batch sampler (:data:`uqreg.engine.SAMPLERS`).
    adversarial : bool
        Add FGSM inputs to the loss.
    closed_form : callable, optional
        ``(instance, y (R, N), cfg, x_cal=None) -> (mean (R, T), std (R, T), fit (R, N), cal_mean,
        cal_std)`` for methods that need no training (the reference); ``fit`` is the prediction at
        the training inputs, ``cal_mean``/``cal_std`` (R, C) those at the calibration inputs
        ``x_cal (R, C, d)`` (None when ``x_cal`` is None).
    overrides : dict
        TrainConfig fields this method changes.
    objective : str
        Training objective (:data:`uqreg.engine.OBJECTIVES`): ``"mse"`` (the networks predict a
        mean), ``"gaussian_nll"`` (a mean and a variance: the ``<method>+mv`` versions).
    """

    name: str
    description: str
    head: str = "deterministic"
    ensemble: bool = False
    sampler: str = "full"
    adversarial: bool = False
    closed_form: Callable | None = None
    overrides: dict = field(default_factory=dict)
    objective: str = "mse"

    def __post_init__(self):
        HEADS.lookup(self.head)
        SAMPLERS.lookup(self.sampler)
        OBJECTIVES.lookup(self.objective)

    def networks(self, repetitions, cfg: TrainConfig) -> NetworkBatch:
        """The (repetition, member) pairs this method trains, repetition-major."""
        reps = np.asarray(repetitions, dtype=np.int64)
        m = cfg.members if self.ensemble else 1
        return NetworkBatch(np.repeat(reps, m), np.tile(np.arange(m, dtype=np.int64), len(reps)))

    def job(self, instance: TaskInstance, y: np.ndarray, repetitions, cfg: TrainConfig, *,
            epochs: int | None = None, x_cal: np.ndarray | None = None, alpha: float | None = None) -> TrainJob:
        """What this method trains on ``instance`` (the engine's plan decides how).

        Parameters
        ----------
        instance : TaskInstance
        y : ndarray, shape (R, N)
            Training targets of the repetitions ``repetitions`` (row i ↔ repetitions[i]).
        repetitions : array_like of int, shape (R,)
        cfg : TrainConfig
            Before this method's overrides.
        epochs : int, optional
            Defaults to ``cfg.epochs`` or 300·c.
        x_cal : ndarray, shape (R, C, d), optional
            Calibration inputs of the repetitions (row i ↔ repetitions[i]), predicted as well.
        alpha : float, optional
            The study's miscoverage level: the levels α/2, 1 − α/2 of a quantile method's
            networks (objective ``pinball``); unused by the other objectives.
        """
        cfg = replace(cfg, **self.overrides)
        reps = np.asarray(repetitions, dtype=np.int64)
        y_full = np.zeros((int(reps.max()) + 1, y.shape[1]))  # rows indexed by repetition number
        y_full[reps] = y
        cal_full = None
        if x_cal is not None:
            cal_full = np.zeros((int(reps.max()) + 1, *np.shape(x_cal)[1:]))
            cal_full[reps] = x_cal
        weights = None
        if HEADS.lookup(self.head).known_noise and not OBJECTIVES.lookup(self.objective).mean_variance:
            # the likelihood of the known σ(x_n), times σ²: squared errors weighted by σ²/σ(x_n)² (R.7)
            w = (instance.sigma / instance.noise_std(instance.x_train)) ** 2
            weights = None if np.all(w == 1.0) else w
        return TrainJob(x_train=instance.x_train, y=y_full, x_test=instance.x_test, nets=self.networks(reps, cfg),
                        seed=instance.seed, sigma=instance.sigma, head=self.head, sampler=self.sampler,
                        adversarial=self.adversarial, cfg=cfg, epochs=epochs or cfg.epochs or instance.epochs,
                        x_cal=cal_full, objective=self.objective, noise_weights=weights,
                        alpha=alpha if OBJECTIVES.lookup(self.objective).uses_alpha else None)

    def run(self, instance: TaskInstance, y: np.ndarray, repetitions, cfg: TrainConfig, *,
            epochs: int | None = None, progress=None, calibration=None, alpha: float = 0.05) -> MethodResult:
        """Train on every repetition and predict at ``instance.x_test``.

        Parameters are those of :meth:`job`; ``progress`` receives finished epochs;
        ``calibration`` is ``(x_cal (R, C, d), y_cal (R, C))`` (:meth:`TaskInstance.calibration`)
        or None, and ``alpha`` the miscoverage level of the intervals (:meth:`intervals`, with the
        task's σ(x) at the test inputs).
        """
        return self.intervals(self.train_predict(instance, y, repetitions, cfg, epochs=epochs, progress=progress,
                                                 x_cal=None if calibration is None else calibration[0], alpha=alpha),
                              instance.noise_std(instance.x_test), calibration, alpha)

    def train_predict(self, instance: TaskInstance, y: np.ndarray, repetitions, cfg: TrainConfig, *,
                      epochs: int | None = None, progress=None, x_cal: np.ndarray | None = None,
                      alpha: float = 0.05) -> MethodResult:
        """Train and predict at the test (and calibration) inputs, without intervals: what a
        method and its conformal versions share (a study computes it once for all of them).
        ``alpha`` reaches the networks of a quantile method only (:meth:`job`)."""
        y = np.asarray(y, dtype=np.float64)
        r = y.shape[0]
        if self.closed_form is not None:
            mean, std, fit, cal_mean, cal_std = self.closed_form(instance, y, replace(cfg, **self.overrides),
                                                                 x_cal=x_cal)
            return MethodResult.from_networks(mean, std, fit[:, None, :], y, cal_prediction=cal_mean,
                                              cal_uncertainty=cal_std)
        job = self.job(instance, y, repetitions, cfg, epochs=epochs, x_cal=x_cal, alpha=alpha)
        result = execute(job, progress=progress)
        fit = result.fit.reshape(r, -1, result.fit.shape[1])  # (R, M, N), M = 1 without an ensemble
        m = job.cfg.members if self.ensemble else 1

        def over_members(a):  # aleatoric: mean over members of σ²ₘ (a network's is already over its passes)
            return None if a is None else a.reshape(r, m, -1).mean(axis=1)

        ale = {"aleatoric_variance": over_members(result.aleatoric),
               "cal_aleatoric_variance": over_members(result.cal_aleatoric)}
        if not self.ensemble:
            return MethodResult.from_networks(result.mean, result.std, fit, y, cal_prediction=result.cal_mean,
                                              cal_uncertainty=result.cal_std, **ale)
        ddof = job.cfg.std_ddof
        members = result.mean.reshape(r, m, -1)  # (R, M, T)
        cal = {}
        if result.cal_mean is not None:
            cal_m = result.cal_mean.reshape(r, m, -1)  # (R, M, C)
            cal = {"cal_prediction": cal_m.mean(axis=1), "cal_uncertainty": cal_m.std(axis=1, ddof=ddof)}
        return MethodResult.from_networks(members.mean(axis=1), members.std(axis=1, ddof=ddof), fit, y, **cal, **ale)

    def intervals(self, result: MethodResult, sigma, calibration=None, alpha: float = 0.05) -> MethodResult:
        """``result`` with its 1 − α intervals for a new observation: the Gaussian predictive
        interval ``mean ± z_{1−α/2}·sqrt(std² + σ²)`` (for ``blr`` the exact posterior
        predictive one); :class:`ConformalMethod` overrides it with its split-conformal interval.

        ``sigma`` is the task's known noise std, a number or σ(x) at the test inputs (T,) (R.7);
        a mean–variance method uses its own aleatoric variance instead (``sigma`` unused).
        ``calibration`` is unused here."""
        if result.aleatoric_variance is not None:
            sigma = np.sqrt(result.aleatoric_variance)
        low, high = conformal.gaussian_interval(result.prediction, result.uncertainty, sigma, alpha)
        return replace(result, interval_low=low, interval_high=high,
                       conformal_quantile=np.full(result.prediction.shape[0], np.nan))

    @property
    def trains_as(self) -> str:
        """The name of the method whose networks this one trains (itself; a conformal version's
        base), so a study trains them once."""
        return self.name

    @property
    def revision(self) -> int:
        """The revision of what this method computes: 0, raised by a fix that changes its results
        (:class:`MeanVarianceMethod`), so that a result cached by an earlier revision is never
        reused (:func:`method_revisions`)."""
        return 0

    def n_epochs_total(self, instance: TaskInstance, cfg: TrainConfig, n_reps: int,
                       epochs: int | None = None) -> int:
        """Epochs the progress bar counts for this method (chunks × epochs)."""
        if self.closed_form is not None:
            return 0
        job = self.job(instance, np.zeros((n_reps, instance.x_train.shape[0])), range(n_reps), cfg, epochs=epochs)
        return job.epochs * make_plan(job).n_chunks


@dataclass(frozen=True)
class ConformalMethod(Method):
    """The split-conformal version ``<base>+<score>`` of a registered method (R.6).

    It trains exactly the networks of ``base`` (its head, sampler, FGSM flag, ensemble flag,
    closed form and overrides are copied from it) and replaces the base's interval by the
    split-conformal interval of the score ``score`` (:data:`uqreg.conformal.SCORES`) calibrated
    on the repetition's calibration points. Its ``prediction`` is the base's mean and its
    ``uncertainty`` the interval's half-width divided by ``z_{1−α/2}`` (the std of the Gaussian
    with the same central interval), so the coverage summary of R.4 reads the conformal interval.
    Build it with :func:`get_method` (``get_method("ens+cp_abs")``).
    """

    base: str = ""
    score: str = ""

    def __post_init__(self):
        b = get_method(self.base)
        conformal.get_score(self.score)
        for f in ("head", "ensemble", "sampler", "adversarial", "closed_form", "overrides", "objective"):
            object.__setattr__(self, f, getattr(b, f))
        super().__post_init__()

    @property
    def trains_as(self) -> str:
        return self.base

    @property
    def revision(self) -> int:
        """Its base's (it computes from the base's networks)."""
        return get_method(self.base).revision

    def intervals(self, result: MethodResult, sigma, calibration=None, alpha: float = 0.05) -> MethodResult:
        """``result`` (the base's predictions, with those at the calibration points) with the
        split-conformal interval calibrated on ``calibration = (x_cal, y_cal (R, C))``.

        Raises
        ------
        InputError
            Without calibration points (``calibration`` None or ``n_cal`` 0).
        """
        if calibration is None or result.cal_prediction is None:
            raise InputError(f"method {self.name!r} needs calibration points (n_cal >= 1), got none")
        cal_std = result.cal_uncertainty
        if cal_std is None:
            cal_std = np.zeros_like(result.cal_prediction)
        low, high, q = conformal.calibrate(conformal.get_score(self.score), calibration[1], result.cal_prediction,
                                           cal_std, result.prediction, result.uncertainty, alpha)
        with np.errstate(invalid="ignore"):
            unc = (high - low) / (2 * conformal.interval_z(alpha))
        return replace(result, uncertainty=unc, interval_low=low, interval_high=high, conformal_quantile=q)


#: The suffix of a method's mean–variance version, ``<method>+mv``.
MEAN_VARIANCE = "mv"
#: The revision of the mean–variance versions of the heads with a KL regulariser (``cd+mv``,
#: ``vd+mv``): 1, their KL/N enters the NLL unscaled (revision 0: times the task's σ²).
MEAN_VARIANCE_KL_REVISION = 1


@dataclass(frozen=True)
class MeanVarianceMethod(Method):
    """The mean–variance version ``<base>+mv`` of a registered trained method (R.7).

    The same networks as ``base`` (head, sampler, FGSM flag, ensemble flag and overrides copied
    from it) with a second output layer giving σ²(x) = softplus(s) + 10⁻⁶, trained on the
    Gaussian β-NLL (``TrainConfig.nll_beta``; objective ``"gaussian_nll"``): a deep ensemble as
    Lakshminarayanan et al. (2017), the dropout methods as Kendall & Gal (2017). Its result holds
    ``aleatoric_variance`` (mean over members or passes of σ²ₘ), its ``uncertainty`` stays the
    epistemic std over members or passes, and its Gaussian interval uses its own aleatoric
    variance in place of the task's σ². Build it with :func:`get_method` (``get_method("ens+mv")``).
    """

    base: str = ""

    def __post_init__(self):
        b = METHODS.lookup(self.base)
        if b.closed_form is not None:
            raise InputError(f"method {self.name!r}: {self.base!r} trains no network, so it has no mean-variance "
                             f"version")
        for f in ("head", "ensemble", "sampler", "adversarial", "overrides"):
            object.__setattr__(self, f, getattr(b, f))
        object.__setattr__(self, "objective", "gaussian_nll")
        super().__post_init__()

    @property
    def revision(self) -> int:
        """1 for a head with a KL regulariser (``cd+mv``, ``vd+mv``): since revision 1 it is KL/N
        against the NLL, where revision 0 scaled it by the task's σ² as for the mean-only heads
        (docs/conventions.md#r-7); 0 for the others, whose results did not change."""
        return MEAN_VARIANCE_KL_REVISION if HEADS.lookup(self.head).known_noise else 0


#: The suffixes of a method's quantile version ``<method>+qr`` and its conformalized version
#: ``<method>+cqr``.
QUANTILE, CQR = "qr", "cqr"


def _quantile_base(name: str, base: str) -> Method:
    """The registered method ``base`` if it can have a quantile version; InputError otherwise."""
    b = METHODS.lookup(base)
    head = HEADS.lookup(b.head)
    if b.closed_form is not None or head.known_noise or not head.linear_output:
        raise InputError(f"method {name!r}: {base!r} has no quantile version (those of "
                         f"{', '.join(quantile_bases())}: {base!r} "
                         + ("trains no network)" if b.closed_form is not None else
                            "regularises against the Gaussian likelihood of the known noise)"))
    return b


def quantile_bases() -> list[str]:
    """The registered methods that have a quantile version: those that train networks whose head
    neither weighs a regulariser against the Gaussian likelihood of the known noise (``cd``,
    ``vd``: ``known_noise``) nor puts its noise on the output itself (``linear_output``)."""
    return [n for n, m in METHODS.items() if m.closed_form is None and not HEADS.lookup(m.head).known_noise
            and HEADS.lookup(m.head).linear_output]


def _rearranged(low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two quantile predictions without crossing: ``(min, max)`` elementwise (NaN stays NaN)."""
    return np.minimum(low, high), np.maximum(low, high)


@dataclass(frozen=True)
class QuantileMethod(Method):
    """The quantile version ``<base>+qr`` of a registered method (R.6): quantile regression.

    The same networks as ``base`` (head, sampler, FGSM flag, ensemble flag and overrides copied
    from it) with two linear outputs, the α/2 and 1 − α/2 conditional quantiles ``q_lo(x)`` and
    ``q_hi(x)`` of y (α the study's ``alpha``), trained on the sum of their pinball losses
    (objective ``"pinball"``; the second output layer of the mean–variance networks, R.7).
    Ensemble members' quantiles, or a dropout network's MC passes', are averaged:
    ``q_lo = mean_m q_lo,m``, ``q_hi = mean_m q_hi,m``; where the two averages cross they are
    swapped (the monotone rearrangement of Chernozhukov, Fernández-Val & Galichon 2010, which
    for two levels is sorting them), so ``q_lo <= q_hi`` everywhere.

    Its interval is ``[q_lo, q_hi]`` itself (a quantile method predicts y, noise included, so
    nothing is added). Its ``prediction`` is the midpoint ``(q_lo + q_hi)/2`` and its
    ``uncertainty`` the half-width divided by ``z_{1−α/2}`` (the std of the Gaussian with the
    same central interval), at the test and the calibration inputs; ``train_loss`` is the
    ½·MSE of the midpoint.
    Build it with :func:`get_method` (``get_method("ens+qr")``).
    """

    base: str = ""

    def __post_init__(self):
        b = _quantile_base(self.name, self.base)
        for f in ("head", "ensemble", "sampler", "adversarial", "overrides"):
            object.__setattr__(self, f, getattr(b, f))
        object.__setattr__(self, "objective", "pinball")
        super().__post_init__()

    def train_predict(self, instance: TaskInstance, y: np.ndarray, repetitions, cfg: TrainConfig, *,
                      epochs: int | None = None, progress=None, x_cal: np.ndarray | None = None,
                      alpha: float = 0.05) -> MethodResult:
        """:meth:`Method.train_predict` with the networks' quantiles at the levels α/2 and
        1 − α/2 in ``quantile_low``/``quantile_high`` (and ``cal_``), and the midpoint and
        half-width / z as ``prediction`` and ``uncertainty``."""
        alpha = conformal.check_alpha(alpha)
        res = super().train_predict(instance, y, repetitions, cfg, epochs=epochs, progress=progress, x_cal=x_cal,
                                    alpha=alpha)
        # the engine's two outputs: mean over members / passes of q_lo (``prediction``) and of q_hi
        z2 = 2 * conformal.interval_z(alpha)
        lo, hi = _rearranged(res.prediction, res.aleatoric_variance)
        cal = {"cal_prediction": None, "cal_uncertainty": None}
        c_lo = c_hi = None
        if res.cal_prediction is not None:
            c_lo, c_hi = _rearranged(res.cal_prediction, res.cal_aleatoric_variance)
            cal = {"cal_prediction": 0.5 * (c_lo + c_hi), "cal_uncertainty": (c_hi - c_lo) / z2}
        return replace(res, prediction=0.5 * (lo + hi), uncertainty=(hi - lo) / z2, **cal, aleatoric_variance=None,
                       cal_aleatoric_variance=None, quantile_low=lo, quantile_high=hi, cal_quantile_low=c_lo,
                       cal_quantile_high=c_hi)

    def intervals(self, result: MethodResult, sigma, calibration=None, alpha: float = 0.05) -> MethodResult:
        """``result`` with its interval ``[q_lo, q_hi]`` (``sigma`` and ``calibration`` unused)."""
        return replace(result, interval_low=result.quantile_low, interval_high=result.quantile_high,
                       conformal_quantile=np.full(result.prediction.shape[0], np.nan))


@dataclass(frozen=True)
class CQRMethod(QuantileMethod):
    """Conformalized quantile regression ``<base>+cqr`` (Romano, Patterson & Candès 2019; R.6).

    It trains exactly the networks of ``<base>+qr`` (:class:`QuantileMethod`, same streams: a
    study trains them once for both) and calibrates their quantiles on the repetition's
    calibration points: scores ``s = max(q_lo − y, y − q_hi)``, ``q`` their
    ⌈(n_cal + 1)(1 − α)⌉-th smallest, interval ``[q_lo − q, q_hi + q]``
    (:func:`uqreg.conformal.cqr_calibrate`). ``prediction`` stays the midpoint of the quantiles
    (also the interval's), ``uncertainty`` is the interval's half-width / ``z_{1−α/2}``, and
    ``conformal_quantile`` is q. Build it with :func:`get_method` (``get_method("ens+cqr")``).
    """

    @property
    def trains_as(self) -> str:
        return f"{self.base}+{QUANTILE}"

    def intervals(self, result: MethodResult, sigma, calibration=None, alpha: float = 0.05) -> MethodResult:
        """``result`` (the quantile version's, with its quantiles at the calibration points) with
        the CQR interval calibrated on ``calibration = (x_cal, y_cal (R, C))``.

        Raises
        ------
        InputError
            Without calibration points (``calibration`` None or ``n_cal`` 0).
        """
        if calibration is None or result.cal_quantile_low is None:
            raise InputError(f"method {self.name!r} needs calibration points (n_cal >= 1), got none")
        low, high, q = conformal.cqr_calibrate(calibration[1], result.cal_quantile_low, result.cal_quantile_high,
                                               result.quantile_low, result.quantile_high, alpha)
        with np.errstate(invalid="ignore"):
            unc = (high - low) / (2 * conformal.interval_z(alpha))
        return replace(result, uncertainty=unc, interval_low=low, interval_high=high, conformal_quantile=q)


def _blr(instance: TaskInstance, y: np.ndarray, cfg: TrainConfig, x_cal: np.ndarray | None = None):
    post = fit_reference(instance.features(instance.x_train), y, instance.noise_std(instance.x_train))
    mean, std = post.predict(instance.features(instance.x_test))
    cal_mean = cal_std = None
    if x_cal is not None:  # each repetition's posterior at its own calibration inputs
        pairs = [post.predict(instance.features(x))
                 for x in np.asarray(x_cal, dtype=np.float64)]
        cal_mean = np.stack([m[r] for r, (m, _) in enumerate(pairs)])
        cal_std = np.stack([sd for _, sd in pairs])
    return (mean, np.broadcast_to(std, mean.shape).copy(), post.predict(instance.features(instance.x_train))[0],
            cal_mean, cal_std)


METHODS: Registry[Method] = Registry("method")
register_method = METHODS.register
list_methods = METHODS.names


def get_method(name: str) -> Method:
    """The registered method ``name``, its mean–variance version ``<method>+mv``
    (:class:`MeanVarianceMethod`), or the split-conformal version ``<method>+<score>`` of either
    (:class:`ConformalMethod`, e.g. ``ens+cp_abs``, ``ens+mv+cp_std``); ``ValueError`` naming the
    valid methods and scores otherwise."""
    if isinstance(name, str) and "+" in name:
        base, suffix = name.rsplit("+", 1)
        if suffix in (QUANTILE, CQR) and base in METHODS:
            if suffix == QUANTILE:
                return QuantileMethod(name, f"quantile regression {base}: alpha/2 and 1-alpha/2 quantile outputs, "
                                      f"pinball loss", base=base)
            return CQRMethod(name, f"conformalized quantile regression (Romano et al. 2019) around {base}+{QUANTILE}",
                             base=base)
        trained = base in METHODS and METHODS[base].closed_form is None
        if suffix == MEAN_VARIANCE and trained:
            return MeanVarianceMethod(name, f"mean-variance {base}: mu and sigma^2 outputs, Gaussian beta-NLL",
                                      base=base)
        mv_base = base.endswith("+" + MEAN_VARIANCE) and base[:-len(MEAN_VARIANCE) - 1] in METHODS
        if suffix not in conformal.SCORES or not (base in METHODS or mv_base):
            raise InputError(f"unknown method {name!r}: a conformal version is <method>+<score> with a method of "
                             f"{', '.join(list_methods())} and a score of {', '.join(conformal.SCORES.names())}; "
                             f"a mean-variance version is <method>+{MEAN_VARIANCE} (then +<score>); a quantile "
                             f"version <method>+{QUANTILE}, its conformalized one <method>+{CQR} "
                             f"({', '.join(quantile_bases())})")
        sc = conformal.SCORES[suffix]
        return ConformalMethod(name, f"{sc.description}, around {base}", base=base, score=suffix)
    return METHODS.lookup(name)


def method_revisions(names) -> dict[str, int]:
    """``{name: revision}`` of the methods ``names`` whose :attr:`Method.revision` is not 0: what
    a cached result's identity records (a sweep cell's digest, :func:`uqreg.sweep.cell_digest`;
    a disentangle cell's configuration, :func:`uqreg.disentangle.run_task`), so that a result of
    an earlier revision is never reused, and the identity of every other method's results stays
    as it was."""
    return {str(n): r for n in names if (r := get_method(n).revision)}


def mean_variance_method_names() -> list[str]:
    """Every ``<method>+mv`` name (the trained methods in registration order)."""
    return [f"{n}+{MEAN_VARIANCE}" for n, m in METHODS.items() if m.closed_form is None]


def quantile_method_names() -> list[str]:
    """Every ``<method>+qr`` and ``<method>+cqr`` name (:func:`quantile_bases` in registration
    order, each with its two versions)."""
    return [f"{n}+{s}" for n in quantile_bases() for s in (QUANTILE, CQR)]


def method_versions() -> dict[str, tuple[str, ...]]:
    """suffix -> the methods that have that version (``mv``, ``qr``, ``cqr``), in registration
    order: what :data:`uqreg.catalog.VERSIONS` records for ``--help`` without torch."""
    out: dict[str, tuple[str, ...]] = {"mv": (), "qr": (), "cqr": ()}
    for name in [*mean_variance_method_names(), *quantile_method_names()]:
        base, suffix = name.rsplit("+", 1)
        out[suffix] += (base,)
    return out


def conformal_method_names() -> list[str]:
    """Every ``<method>+<score>`` name (methods in registration order, then scores)."""
    return [f"{m}+{s}" for m in list_methods() for s in conformal.SCORES.names()]


for _m in (
    Method("blr", "exact Bayesian linear regression, flat prior (reference, R.2)", closed_form=_blr),
    Method("bd", "Bernoulli (MC) dropout on the last hidden layer", head="bernoulli"),
    Method("cd", "concrete dropout, learned rate (Gal et al. 2017)", head="concrete"),
    Method("vd", "variational Gaussian dropout, local reparameterisation (Kingma et al. 2015)", head="variational"),
    Method("ens", "deep ensemble", ensemble=True),
    Method("ens_adv", "deep ensemble with FGSM adversarial training", ensemble=True, adversarial=True),
    Method("ens_bs", "bootstrap ensemble: two N/2 batches with replacement per epoch", ensemble=True, sampler="bootstrap"),
):
    register_method(_m)
del _m

