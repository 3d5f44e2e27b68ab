"""Scores of the disentanglement protocol (Mucsányi, Kirchhof & Oh 2024, "Benchmarking
Uncertainty Disentanglement: Specialized Uncertainties for Specialized Tasks";
docs/conventions.md#v-8).

:func:`score_disentangle` reads the prediction caches of one or more predictors and scores every
registered uncertainty estimator (:data:`uqmetrics.metrics.disentangle.ESTIMATORS`) of every
predictor on the task each estimate should serve, as untangle does:

- **aleatoric**: the Spearman rank correlation of the estimate with the true label entropy of
  each test image (the ``truth``: the ``hierarchy`` stand-in's exact label distributions,
  :func:`uqvision.hierarchy.read_label_distributions`, or ImageNet-ReaL's label sets as
  distributions by untangle's rule, :func:`~.truth.real_label_distributions`);
- **OOD detection**: AUROC of the estimate separating the OOD sets' images (caches of an
  evaluation set of kind ``ood``) from the ID test images;
- **shift**: AUROC of the estimate separating the images of each corruption severity (members
  of an expanded set such as ``imagenet-c``, pooled over corruptions) from the clean test
  images, and the Spearman correlation of the estimate with the severity (0 for clean);
- **correctness**: AUROC of ``-estimate`` separating correct from wrong top-1 predictions
  (:func:`uqmetrics.metrics.selective.auroc_score`), the AURC (:func:`~uqmetrics.metrics.
  selective.aurc_loss`), untangle's cumulative abstinence AUC ``AUAC = 1 - AURC`` and the
  accuracy of the predictions retained at each :attr:`DisentangleConfig.coverages` level (the
  ``ceil(c n)`` least uncertain);
- **disentanglement**: the Spearman correlation between each aleatoric and each epistemic
  estimate of a predictor on the test images (untangle's main finding: close to 1);
- per predictor, not per estimator: accuracy, ECE, log score (NLL) and Brier score of the
  predictive distribution (:mod:`uqmetrics.metrics.classification`);
- **training-set size** (with :attr:`DisentangleConfig.train_sizes`): the mean estimate on the
  test images of each method at each training fraction, and its Spearman correlation with the
  fraction (an epistemic estimate should fall as the training set grows).

A predictor's members are its passes (MC dropout, TTA, SWAG or Laplace samples: the ``pass``
dim of its logits) or an ensemble row's members (each member's passes averaged); a single-pass
model is one member, and the estimators that need two (the disagreement terms) are NaN for it.
The other inputs of the estimators come from the caches: ``embedding`` (``uqvision predict
--embeddings``; with a fit set, the DDU density) and ``learned``, the ``uncertainty`` a method
that predicts its own writes (a loss-prediction head, :data:`uqvision.predict.OWN_UNCERTAINTY`);
an estimator whose input a predictor's caches lack is NaN for it.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import xarray as xr
from scipy.stats import spearmanr
from uqmetrics import InputError, stamp_result
from uqmetrics.metrics.calibration import fit_temperature, softmax
from uqmetrics.metrics.classification import (
    accuracy_score,
    brier_loss,
    expected_calibration_error,
    nll_loss,
)
from uqmetrics.metrics.disentangle import ESTIMATORS
from uqmetrics.metrics.ood import ood_auroc_score
from uqmetrics.metrics.selective import aurc_loss, auroc_score

from ...predictors import group_predictors, pick_set, read_cache_groups
from ...provenance import entry_provenance, predictor_rows
from ...roles import declared_ensembles

__all__ = ["COVERAGES", "PREDICTOR_METRICS", "TASKS", "DisentangleConfig", "predictor_members",
           "read_scores", "score_disentangle", "spearman"]

#: The per-estimator tasks of the heat map, each ``(variable, greater_is_better)``.
TASKS = (("aleatoric_spearman", True), ("ood_auroc", True), ("shift_auroc", True),
         ("correctness_auroc", True), ("aurc", False), ("auac", True))
#: The per-predictor metrics of the predictive distribution on the test images.
PREDICTOR_METRICS = (("accuracy", "accuracy"), ("ece", "ece"), ("nll", "nll"),
                     ("brier", "brier"))
#: Default coverage levels of the abstinence accuracy.
COVERAGES = (0.5, 0.8, 0.9)


@dataclass(frozen=True)
class DisentangleConfig:
    """Options of :func:`score_disentangle`.

    Attributes
    ----------
    truth : str or None
        The true label distributions of the test images: a ``hierarchy`` folder (its
        ``test`` split, :func:`uqvision.hierarchy.read_label_distributions`) or ReaL's
        ``real.json`` (:func:`~.truth.real_label_distributions`); None: no aleatoric task.
    test : str or None
        ``dataset_name`` of the ID test set (default: the only set of role ``test``).
    calibration : str or None
        ``dataset_name`` of the set temperatures are fitted on (``temperature``; default the
        only set of role ``calibration``).
    fit : str or None
        ``dataset_name`` of the ID training subset the feature-density estimator (DDU) fits on
        (default: the only set of role ``fit``; none: that estimator is NaN).
    ensembles : dict or None
        Declared ensemble rows ``{name: (member, ...)}`` (:func:`uqvision.roles.
        declared_ensembles`).
    temperature : bool
        Add a temperature-scaled row ``<model>+ts`` for every single-pass model, its
        temperature fitted on the calibration set.
    coverages : tuple of float
        The abstinence accuracy's coverage levels, each in (0, 1].
    train_sizes : dict or None
        ``{predictor: [method, fraction]}``: the training fraction of the predictors trained on
        nested subsets (the training-set-size task).
    seed : int
        Recorded (the scoring draws nothing).
    """

    truth: str | None = None
    test: str | None = None
    calibration: str | None = None
    fit: str | None = None
    ensembles: dict | None = None
    temperature: bool = False
    coverages: tuple[float, ...] = COVERAGES
    train_sizes: dict | None = None
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "ensembles", declared_ensembles(self.ensembles))
        cov = tuple(float(c) for c in self.coverages)
        if not cov or any(not 0.0 < c <= 1.0 for c in cov):
            raise InputError(f"coverages must be levels in (0, 1], got {self.coverages!r}")
        object.__setattr__(self, "coverages", cov)
        if self.truth is not None:
            object.__setattr__(self, "truth", os.fspath(self.truth))
        sizes = {str(k): (str(v[0]), float(v[1])) for k, v in (self.train_sizes or {}).items()}
        if any(not 0.0 < f <= 1.0 for _, f in sizes.values()):
            raise InputError(f"train_sizes fractions must be in (0, 1], got {self.train_sizes!r}")
        object.__setattr__(self, "train_sizes", sizes or None)


# --------------------------------------------------------------------------------------------
# the arrays


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation of ``x`` and ``y`` (:func:`scipy.stats.spearmanr`, average
    ranks for ties); NaN where either is constant or fewer than 2 finite pairs."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 2 or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
        return float("nan")
    return float(spearmanr(x[ok], y[ok])[0])


def _softmax_passes(cache: xr.Dataset) -> np.ndarray:
    """A cache's class probabilities, (pass, sample, class) float64."""
    p = softmax(np.asarray(cache["logits"].values, np.float64))
    return p[None] if p.ndim == 2 else p


def predictor_members(groups: dict, members: tuple[str, ...], dataset: str
                      ) -> tuple[np.ndarray, np.ndarray, dict, xr.Dataset]:
    """A predictor's members on one dataset.

    Parameters
    ----------
    groups : dict
        ``(model, dataset_name) -> [caches]`` (:attr:`uqvision.predictors.CacheGroups.groups`).
    members : tuple of str
        The predictor's models (one for a model).
    dataset : str

    Returns
    -------
    labels : ndarray of int64, shape (n,)
    member_probs : ndarray of float64, shape (n_members, n, n_classes)
        A model's passes (every pass of every cache), or one row per ensemble member (its
        passes averaged).
    extra : dict
        The estimators' other inputs the caches hold: ``embedding`` (n, n_features), the
        first member's first cache's; ``learned`` (n,), the ``uncertainty`` a method predicts
        itself (a loss-prediction head's), averaged over every cache of every member that
        holds it (absent unless all do).
    first : xarray.Dataset
        The first member's first cache.
    """
    rows = []
    for m in members:
        p = np.concatenate([_softmax_passes(c) for c in groups[m, dataset]])
        rows.append(p if len(members) == 1 else p.mean(0, keepdims=True))
    first = groups[members[0], dataset][0]
    extra = {}
    if "embedding" in first:
        extra["embedding"] = np.asarray(first["embedding"].values, np.float64)
    own = [c for m in members for c in groups[m, dataset]]
    if all("uncertainty" in c for c in own):
        extra["learned"] = np.mean([np.asarray(c["uncertainty"].values, np.float64)
                                    for c in own], axis=0)
    return np.asarray(first["label"].values, np.int64), np.concatenate(rows), extra, first


def _estimates(probs: np.ndarray, extra: dict, scorers: dict) -> dict[str, np.ndarray]:
    """Each estimator's estimate (NaN where it cannot be scored on these inputs: too few
    members, an input the caches lack, no fit data)."""
    out = {}
    n = probs.shape[1]
    inputs = {"members": probs, **extra}
    for name, (est, scorer) in scorers.items():
        if scorer is None or probs.shape[0] < est.min_members or not (
                est.needs - {"fit"}) <= set(inputs):
            out[name] = np.full(n, np.nan)
            continue
        out[name] = scorer({k: inputs[k] for k in est.needs - {"fit"}})
    return out


def _abstinence_accuracy(correct: np.ndarray, u: np.ndarray, coverage: float) -> float:
    """Accuracy of the ``ceil(coverage n)`` least uncertain predictions (stable order)."""
    k = max(1, math.ceil(coverage * correct.size - 1e-9))
    return float(correct[np.argsort(u, kind="stable")[:k]].mean())


def _auroc(u_in: np.ndarray, u_out: np.ndarray) -> float:
    if np.isnan(u_in).any() or np.isnan(u_out).any() or not u_in.size or not u_out.size:
        return float("nan")
    return float(ood_auroc_score(u_in, u_out))


def _quiet(f, *args) -> float:
    """A selective metric, NaN (not a warning) where undefined (all correct, say)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(f(*args))


def _truth(config: DisentangleConfig, cache: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """``(entropy, valid)`` of the test images in the cache's sample order."""
    from .truth import label_distribution_entropy, read_truth

    probs, valid = read_truth(config.truth, [str(s) for s in cache["sample"].values],
                              [str(c) for c in cache["class"].values])
    return label_distribution_entropy(probs), valid


# --------------------------------------------------------------------------------------------
# the scorer


def score_disentangle(caches: Iterable[str | os.PathLike] | str | os.PathLike,
                      config: DisentangleConfig | None = None) -> xr.Dataset:
    """Score every estimator of every predictor on untangle's tasks (module docstring).

    Parameters
    ----------
    caches : path or iterable of paths
        Cache files or folders of them: every predictor's of the ID test set, and of any OOD
        sets, corrupted members, calibration set and fit set.
    config : DisentangleConfig, optional

    Returns
    -------
    xarray.Dataset
        A result file of protocol ``disentangle``. Dimensions: ``model`` (every model, its
        temperature-scaled rows, then the ensemble rows), ``estimator`` (every registered
        estimator; coordinate ``estimates``: aleatoric, epistemic or total), ``severity``,
        ``coverage``, ``aleatoric`` and ``epistemic`` (the estimators of each kind), ``sample``
        (the test images). Variables:

        ``aleatoric_spearman``, ``ood_auroc``, ``shift_auroc``, ``correctness_auroc``,
        ``aurc``, ``auac`` (model, estimator)
            The tasks (:data:`TASKS`); ``shift_auroc`` averaged over the severities.
        ``severity_auroc`` (model, estimator, severity), ``severity_spearman`` (model,
        estimator)
            Per severity, and the rank correlation with the severity (0: clean).
        ``abstinence_accuracy`` (model, estimator, coverage)
        ``ae_spearman`` (model, aleatoric, epistemic)
            The disentanglement: rank correlation of the two estimates on the test images.
        ``accuracy``, ``ece``, ``nll``, ``brier`` (model)
        ``members`` (model): its members or passes.
        ``estimate`` (model, estimator, sample), ``true_entropy`` (sample)
            Every test image's estimate and true label entropy (the scatter figures).
        ``size_mean`` (method, fraction, estimator), ``size_spearman`` (method, estimator)
            With ``train_sizes``: the mean estimate per training fraction, and its rank
            correlation with the fraction.

    Raises
    ------
    uqmetrics.InputError
        No caches, no or two test sets, a predictor without test caches, a ``truth`` that
        does not cover the test images.
    """
    config = config or DisentangleConfig()
    read = read_cache_groups(caches)
    groups, sets = read.groups, read.sets
    test = pick_set("test", config.test, sets, option="--test")
    if test is None:
        raise InputError(f"no test set: predict the ID test images as a set of role test, or "
                         f"name it (test); sets: {sorted(sets)}")
    fit = pick_set("fit", config.fit, sets, option="--fit", accept=("fit",))
    cal = pick_set("calibration", config.calibration, sets, option="--calibration",
                   exclude=(test,)) if config.temperature else None
    if config.temperature and cal is None:
        raise InputError("temperature: no calibration set (a set of role calibration) to fit "
                         "the temperatures on")
    oods = sorted(n for n, s in sets.items()  # never an OOD validation set (V.6)
                  if s["role"] == "ood" and s.get("set_role") != "ood-val"
                  and n not in (test, fit))
    corrupted = {n: int(s["severity"]) for n, s in sets.items()
                 if s["role"] == "shifted" and s.get("corruption")}
    severities = sorted(set(corrupted.values()))
    preds, notes = group_predictors(read, config.ensembles)
    for p in preds:
        missing = [m for m in p.members if (m, test) not in groups]
        if missing:
            raise InputError(f"model {missing[0]!r} has no caches of the test set {test!r}")

    names = list(ESTIMATORS.names())
    est = {n: ESTIMATORS.lookup(n) for n in names}
    kinds = [est[n].estimates for n in names]
    ale = [n for n in names if est[n].estimates == "aleatoric"]
    epi = [n for n in names if est[n].estimates == "epistemic"]

    # rows: every predictor, plus a temperature-scaled row per single-pass model
    rows: list[tuple[str, object, float]] = []  # (name, predictor, temperature)
    for p in preds:
        rows.append((p.name, p, 1.0))
        if config.temperature and p.kind == "single" and (p.members[0], cal) in groups:
            labels_cal, cp, _, _ = predictor_members(groups, p.members, cal)
            if cp.shape[0] == 1:  # a single-pass model
                t = fit_temperature(np.log(np.clip(cp[0], 1e-300, None)), labels_cal)
                rows.append((f"{p.name}+ts", p, float(t)))

    first_test = groups[preds[0].members[0], test][0]
    n_test = first_test.sizes["sample"]
    if config.truth is not None:
        true_h, valid = _truth(config, first_test)
    else:
        true_h, valid = np.full(n_test, np.nan), np.zeros(n_test, bool)

    R, E, S, C = len(rows), len(names), len(severities), len(config.coverages)
    task = {v: np.full((R, E), np.nan) for v, _ in TASKS}
    sev_auroc = np.full((R, E, S), np.nan)
    sev_rho = np.full((R, E), np.nan)
    abst = np.full((R, E, C), np.nan)
    ae = np.full((R, len(ale), len(epi)), np.nan)
    pm = {v: np.full(R, np.nan) for v, _ in PREDICTOR_METRICS}
    n_members = np.zeros(R, np.int64)
    estimate = np.full((R, E, n_test), np.nan)

    def scaled(p: np.ndarray, t: float) -> np.ndarray:
        return p if t == 1.0 else softmax(np.log(np.clip(p, 1e-300, None)), temperature=t)

    for i, (row, pred, t) in enumerate(rows):
        # the estimators, fitted once per predictor (DDU on its first member's fit features)
        fit_data = None
        if fit is not None and (pred.members[0], fit) in groups:
            fl, _, fextra, _ = predictor_members(groups, pred.members[:1], fit)
            fit_data = ({"embedding": fextra["embedding"], "labels": fl}
                        if "embedding" in fextra else None)
        scorers = {}
        for n in names:
            if "fit" in est[n].needs and fit_data is None:
                scorers[n] = (est[n], None)
            else:
                scorers[n] = (est[n], est[n].fitted(fit_data if "fit" in est[n].needs
                                                    else None))

        labels, probs, extra, _ = predictor_members(groups, pred.members, test)
        probs = scaled(probs, t)
        n_members[i] = probs.shape[0]
        mean = probs.mean(0)
        correct = (mean.argmax(1) == labels).astype(np.float64)
        u_test = _estimates(probs, extra, scorers)
        pm["accuracy"][i] = accuracy_score(labels, mean)
        pm["ece"][i] = expected_calibration_error(labels, mean)
        pm["nll"][i] = nll_loss(labels, mean)
        pm["brier"][i] = brier_loss(labels, mean)

        u_ood = {n: [] for n in names}
        for o in oods:
            if all((m, o) in groups for m in pred.members):
                _, po, eo, _ = predictor_members(groups, pred.members, o)
                for n, u in _estimates(scaled(po, t), eo, scorers).items():
                    u_ood[n].append(u)
        u_sev: dict[int, dict[str, list]] = {s: {n: [] for n in names} for s in severities}
        for c, s in corrupted.items():
            if all((m, c) in groups for m in pred.members):
                _, pc, ec, _ = predictor_members(groups, pred.members, c)
                for n, u in _estimates(scaled(pc, t), ec, scorers).items():
                    u_sev[s][n].append(u)

        for j, n in enumerate(names):
            u = u_test[n]
            estimate[i, j] = u
            if np.isnan(u).any():
                continue
            task["aleatoric_spearman"][i, j] = spearman(u[valid], true_h[valid])
            if u_ood[n]:
                task["ood_auroc"][i, j] = _auroc(u, np.concatenate(u_ood[n]))
            sev_u, sev_x = [u], [np.zeros(u.size)]
            for k, s in enumerate(severities):
                if u_sev[s][n]:
                    us = np.concatenate(u_sev[s][n])
                    sev_auroc[i, j, k] = _auroc(u, us)
                    sev_u.append(us)
                    sev_x.append(np.full(us.size, float(s)))
            if len(sev_u) > 1:
                task["shift_auroc"][i, j] = float(np.nanmean(sev_auroc[i, j]))
                sev_rho[i, j] = spearman(np.concatenate(sev_u), np.concatenate(sev_x))
            task["correctness_auroc"][i, j] = _quiet(auroc_score, correct, -u)
            task["aurc"][i, j] = _quiet(aurc_loss, correct, -u)
            task["auac"][i, j] = 1.0 - task["aurc"][i, j]
            for k, c in enumerate(config.coverages):
                abst[i, j, k] = _abstinence_accuracy(correct, u, c)
        for a, na in enumerate(ale):
            for b, nb in enumerate(epi):
                ae[i, a, b] = spearman(u_test[na], u_test[nb])

    data = {v: (("model", "estimator"), task[v]) for v, _ in TASKS}
    data["severity_auroc"] = (("model", "estimator", "severity"), sev_auroc)
    data["severity_spearman"] = (("model", "estimator"), sev_rho)
    data["abstinence_accuracy"] = (("model", "estimator", "coverage"), abst)
    data["ae_spearman"] = (("model", "aleatoric", "epistemic"), ae)
    data.update({v: ("model", pm[v]) for v, _ in PREDICTOR_METRICS})
    data["estimate"] = (("model", "estimator", "sample"), estimate)
    data["true_entropy"] = ("sample", true_h)
    data["truth_valid"] = ("sample", valid)
    data["temperature"] = ("model", np.array([r[2] for r in rows]))
    coords = {"model": [r[0] for r in rows],
              "kind": ("model", [r[1].kind for r in rows]),
              "mode": ("model", [r[1].mode for r in rows]),
              "members": ("model", n_members),
              "estimator": names, "estimates": ("estimator", kinds),
              "severity": np.array(severities, np.int64),
              "coverage": np.array(config.coverages), "aleatoric": ale, "epistemic": epi,
              "sample": [str(s) for s in first_test["sample"].values]}
    metrics: dict = {v: (v, better) for v, better in TASKS if v != "aurc"}
    metrics["aurc"] = "aurc"
    metrics.update({"severity_auroc": ("severity_auroc", True),
                    "abstinence_accuracy": ("abstinence_accuracy", True),
                    **{v: m for v, m in PREDICTOR_METRICS}})
    if config.train_sizes:
        _size_task(data, coords, rows, estimate, names, config.train_sizes)
    ds = xr.Dataset(data, coords=coords)
    ensembles = {p.name: list(p.members) for p in preds if p.kind == "ensemble"}
    by_pred = predictor_rows(preds, groups)
    provenance = entry_provenance({r[0]: by_pred[r[1].name] for r in rows}, "model")
    return stamp_result(ds, "disentangle", input_checksums=sorted(set(read.checksums)),
                        metrics=metrics, config=asdict(config), seed=config.seed,
                        notes="; ".join(notes) or None,
                        extra={"ensemble_members": json.dumps(ensembles),
                               "scored_sets": json.dumps({"test": test, "fit": fit,
                                                          "calibration": cal, "ood": oods}),
                               "truth": str(config.truth), **provenance})


def _size_task(data: dict, coords: dict, rows: list, estimate: np.ndarray, names: list[str],
               sizes: dict) -> None:
    """``size_mean`` (method, fraction, estimator) and ``size_spearman`` (method, estimator)."""
    index = {r[0]: i for i, r in enumerate(rows)}
    methods = sorted({m for m, _ in sizes.values()})
    fractions = sorted({f for _, f in sizes.values()})
    mean = np.full((len(methods), len(fractions), len(names)), np.nan)
    for row, (m, f) in sizes.items():
        if row in index:
            u = estimate[index[row]]  # (estimator, sample): NaN rows where not scored
            mean[methods.index(m), fractions.index(f)] = [
                float(x.mean()) if not np.isnan(x).any() else np.nan for x in u]
    rho = np.full((len(methods), len(names)), np.nan)
    x = np.asarray(fractions)
    for a in range(len(methods)):
        for j in range(len(names)):
            rho[a, j] = spearman(x, mean[a, :, j])
    data["size_mean"] = (("method", "fraction", "estimator"), mean)
    data["size_spearman"] = (("method", "estimator"), rho)
    coords["method"] = methods
    coords["fraction"] = np.asarray(fractions)


def read_scores(path: str | os.PathLike | xr.Dataset) -> xr.Dataset:
    """A disentangle result (or its file), checked (:func:`~uqvision.protocols.base.
    protocol_result`)."""
    from ..base import protocol_result

    return protocol_result(path if isinstance(path, xr.Dataset) else Path(path),
                           "disentangle", ("model", "estimator"))
