"""Scores of the OOD-detection protocol (OpenOOD v1.5, Zhang et al. 2023;
docs/conventions.md#v-6).

:func:`score_ood` reads the prediction caches of one or more models on their in-distribution
(ID) test set (:attr:`OodConfig.test`, else the only set of role ``test``), on
out-of-distribution (OOD) sets (caches of role ``ood``, each a ``near`` or ``far`` set by its
``ood_split``) and, for the detectors that fit (:class:`uqmetrics.metrics.detectors.Detector` with
the ``fit`` need, plugins included), on an ID training subset (:attr:`OodConfig.fit`, else
the only set of role ``fit``): a detector is only ever handed the fit set's images to fit on,
never the test set's (:func:`uqvision.predictors.pick_set`). Every detector of :data:`uqmetrics.metrics.detectors.
DETECTORS` turns what a predictor left in its caches into an uncertainty ``u`` per image, and
the OpenOOD v1.5 metrics of :mod:`uqmetrics.metrics.ood` score ``u`` of the ID test images against
``u`` of each OOD set (OOD positive): FPR@95TPR, AUROC, AUPR-In, AUPR-Out.

The predictors (the ``model`` dimension) are every model (the caches' ``model`` attr) and one
*ensemble* row per group of models declared together: the members of one ``uqvision train
--members K`` run (``<method>[<k>]``) and each of :attr:`OodConfig.ensembles`
(:func:`uqvision.predictors.group_predictors`). What a
detector reads of a predictor:

- ``logits``: the predictor's logits by the detector's ensemble rule
  (:data:`uqmetrics.metrics.detectors.ENSEMBLE_RULES`): for ``msp``, ``entropy`` and ``gen``
  (``predictive``) log p̄, p̄ the predictor's predictive distribution (the mean over its members
  of each member's softmax averaged over its passes, as the shift and conformal protocols
  score it: ``max p̄`` is the ensemble's MSP); for ``maxlogit`` and ``energy``
  (``mean_logits``) the mean of the members' pass-mean logits (OpenOOD v1.5's ensemble and
  MC-dropout postprocessors). For a model of one forward pass, both are its logits; a model's
  MC-dropout or TTA passes are combined the same way as an ensemble's members;
- ``members``: the logits of every pass of every member model, stacked (member, sample,
  class): the deep ensemble's members, the MC-dropout passes;
- ``embedding``, ``head_weight``, ``head_bias``: a model's penultimate features and linear head
  (``uqvision predict --embeddings --cache-variables head_weight head_bias``);
- ``fit``: the same model's ``embedding`` and ``labels`` on the fit set (and its head).

A detector of rule ``mean_u`` (the feature detectors ``react``, ``mahalanobis``, ``knn``,
``vim``) scores an ensemble row as the mean of its members' ``u``, each member fitted on its
own features; a detector that reads ``members`` is not defined for a predictor of one forward
pass (NaN there, said in the attr ``notes``).

With :attr:`OodConfig.tune_detectors`, every detector with a search grid
(:attr:`uqmetrics.metrics.detectors.Detector.grid`: OpenOOD v1.5's, e.g. ReAct's percentile, KNN's
k, ViM's D, GEN's gamma and M, Energy's T) is tuned per predictor as OpenOOD v1.5's automatic
parameter search does (:func:`uqmetrics.metrics.detectors.search_params`): the grid point of the
highest AUROC of an OOD validation set (role ``ood-val``, :attr:`OodConfig.ood_validation`)
against an ID validation set (role ``calibration``, :attr:`OodConfig.validation`); a set of
role ``ood-val`` is never scored as a test OOD set. The grids and the chosen values are
recorded in the attr ``detector_search``. Without it, every detector keeps its fixed defaults.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import numpy as np
import xarray as xr
from uqmetrics import InputError, stamp_result
from uqmetrics.metrics.calibration import softmax
from uqmetrics.metrics.classification import accuracy_score
from uqmetrics.metrics.detectors import NEED_KEYS, get_detector, list_detectors, search_params
from uqmetrics.metrics.registry import get_metric

from ...cache import check_aligned
from ...evalsets import cache_eval_set
from ...predictors import (
    Predictor,
    declared_ensembles,
    group_predictors,
    pick_set,
    read_cache_groups,
)
from ...provenance import entry_provenance, predictor_rows

__all__ = ["DEFAULT_DETECTORS", "FEATURE_DETECTORS", "FPR_POSITIVES", "MEMBER_DETECTORS",
           "OOD_METRICS", "OOD_SPLITS", "OodConfig", "score_ood"]

#: The result variable of each OpenOOD v1.5 metric -> its name in
#: :data:`uqmetrics.metrics.registry.METRICS` (a metric not registered is left out of the result).
OOD_METRICS = {"fpr_at_95_tpr": "fpr_at_95_tpr", "auroc": "ood_auroc", "aupr_in": "aupr_in",
               "aupr_out": "aupr_out"}
#: The OOD splits of OpenOOD v1.5 (an OOD set's ``ood_split``), each averaged into
#: ``<split>_<metric>``.
OOD_SPLITS = ("near", "far")
#: The positives of FPR@95 (:attr:`OodConfig.fpr_positive`): ``out`` is OpenOOD v1.5's
#: convention and the default, ``in`` OpenOOD v1.0's and the older literature's.
FPR_POSITIVES = ("out", "in")
#: The detectors scored by default (those registered; detectors whose inputs the caches lack are
#: then skipped, said in the attr ``skipped_detectors``), in OpenOOD's order: post-hoc on
#: logits, on features, then the UQ measures of several members.
DEFAULT_DETECTORS = ("msp", "maxlogit", "energy", "entropy", "gen", "react", "mahalanobis",
                     "knn", "vim", "ensemble_entropy", "mutual_information", "disagreement")
#: Detectors that read the features (the findings' "feature-based" group).
FEATURE_DETECTORS = ("mahalanobis", "knn", "vim")
#: Detectors that read several members or passes (the findings' "UQ" group).
MEMBER_DETECTORS = ("ensemble_entropy", "mutual_information", "disagreement")
#: The role of an OOD validation set (:data:`uqvision.roles.SET_ROLES`): tuned on with
#: ``tune_detectors``, never scored as a test OOD set.
OOD_VALIDATION_ROLE = "ood-val"
#: The criterion of the parameter search (attr ``detector_search``).
SEARCH_CRITERION = ("OpenOOD v1.5's automatic parameter search: per predictor and detector, "
                    "the grid point of the highest AUROC of the OOD validation set against "
                    "the ID validation set (the first of equal ones, the last parameter "
                    "varying slowest)")
#: What each validation set is, in the refusals.
_TUNE_SETS = ("ID validation set (--validation)", "OOD validation set (--ood-validation)")
#: How to get each input a detector may need, for the refusals.
_HOW = {"embedding": "uqvision predict --embeddings",
        "head_weight": "uqvision predict --cache-variables head_weight head_bias",
        "head_bias": "uqvision predict --cache-variables head_weight head_bias"}


@dataclass(frozen=True)
class OodConfig:
    """Options of :func:`score_ood`.

    Attributes
    ----------
    detectors : tuple of str or None
        Registered detectors (:func:`uqmetrics.metrics.detectors.list_detectors`) to score; each must
        find its inputs in every model's caches (else refused, naming what is missing and how
        to get it). ``None``: :data:`DEFAULT_DETECTORS` that are registered, those whose
        inputs the caches lack skipped (attr ``skipped_detectors``).
    test : str or None
        The ``dataset_name`` of the ID test set (``--test``); default the only set of role
        ``test`` (but the fit set). Never a set of role ``fit``.
    fit : str or None
        The ``dataset_name`` of the ID training subset the detectors that fit are fitted on
        (embedding and labels; ``--fit``); default the only set of role ``fit``; none: no
        such detector can be scored.
    ensembles : dict
        Declared ensemble rows, ``{name: (member, ...)}`` (or ``NAME=M1,M2`` strings:
        :func:`uqvision.roles.declared_ensembles`), besides the members of each ``uqvision
        train --members K`` run.
    keep_scores : bool
        Also keep every predictor's ``u`` per image (variables ``u_id``, ``u_ood``; float32),
        for the score histograms of :mod:`~.figures`.
    fit_info : dict
        How the fit subset was drawn (e.g. ``{"per_class": 10, "seed": 0, "split":
        "train"}``), recorded in the result's attr ``fit_data``.
    seed : int
        Recorded (no step of the scoring is random).
    tune_detectors : bool
        Select the hyper-parameters of every detector with a search grid per predictor on
        validation data (``--tune-detectors``; module docstring); default the fixed defaults.
    validation : str or None
        With ``tune_detectors``: the ``dataset_name`` of the ID validation set
        (``--validation``); default the only set of role ``calibration``. Never the test or
        the fit set.
    ood_validation : str or None
        With ``tune_detectors``: the ``dataset_name`` of the OOD validation set
        (``--ood-validation``), a set of role ``ood-val``; default the only one.
    fpr_positive : {"out", "in"}
        The positives of ``fpr_at_95_tpr`` (``--fpr-positive``;
        :func:`uqmetrics.metrics.ood.fpr_at_95_tpr`): ``"out"`` (default, OpenOOD v1.5):
        the fraction of ID images flagged at 95 % OOD recall; ``"in"`` (OpenOOD v1.0, ODIN,
        Hendrycks et al.): the fraction of OOD images kept at 95 % ID recall, a different
        number. Recorded in the attr ``fpr_positive`` and the variable's ``positive`` attr.
    """

    detectors: tuple[str, ...] | None = None
    test: str | None = None
    fit: str | None = None
    ensembles: dict | None = None
    keep_scores: bool = False
    fit_info: dict = field(default_factory=dict)
    seed: int = 0
    tune_detectors: bool = False
    validation: str | None = None
    ood_validation: str | None = None
    fpr_positive: str = "out"

    def __post_init__(self):
        if self.fpr_positive not in FPR_POSITIVES:
            raise InputError(f"fpr_positive must be one of {', '.join(FPR_POSITIVES)} "
                             f"('out': OpenOOD v1.5, the default; 'in': OpenOOD v1.0 and "
                             f"ODIN), got {self.fpr_positive!r} (option --fpr-positive)")
        if self.detectors is not None:
            value = (self.detectors,) if isinstance(self.detectors, str) \
                else tuple(self.detectors)
            bad = [v for v in value if not isinstance(v, str) or not v]
            if bad:
                raise InputError(f"detectors must be names, got {bad!r} in {value!r}")
            object.__setattr__(self, "detectors", value)
        object.__setattr__(self, "ensembles", declared_ensembles(self.ensembles))
        if self.detectors is not None and not self.detectors:
            raise InputError("detectors is empty: name at least one detector (or None for the "
                             "defaults)")
        object.__setattr__(self, "fit_info", dict(self.fit_info or {}))
        given = [f for f in ("validation", "ood_validation") if getattr(self, f) is not None]
        if given and not self.tune_detectors:
            raise InputError(f"{given[0]} (--{given[0].replace('_', '-')}) "
                             f"{getattr(self, given[0])!r} names a validation set, which only "
                             "--tune-detectors reads: add it, or leave the set out")


class _Arrays:
    """One model's arrays on one dataset (its caches merged: passes stacked)."""

    def __init__(self, caches: list[xr.Dataset]):
        check_aligned(caches)
        first = caches[0]
        passes = [c["logits"].values if c["logits"].ndim == 3 else c["logits"].values[None]
                  for c in caches]
        self.passes = np.concatenate(passes).astype(np.float64)  # (pass, sample, class)
        self.labels = np.asarray(first["label"].values, np.int64)
        self.samples = [str(s) for s in first["sample"].values]
        self.extra = {k: np.asarray(first[k].values, np.float64)
                      for k in ("embedding", "head_weight", "head_bias") if k in first}

    @property
    def logits(self) -> np.ndarray:
        return self.passes.mean(axis=0)

    def inputs(self) -> dict[str, np.ndarray]:
        """The detector inputs (:data:`uqmetrics.metrics.detectors.NEED_KEYS`), ``members`` aside."""
        return {"logits": self.logits, **self.extra}

    def fit(self) -> dict[str, np.ndarray]:
        """The ``fit`` mapping (:data:`uqmetrics.metrics.detectors.FIT_KEYS`)."""
        return {"labels": self.labels, **self.extra}


class _Scoring:
    """``scoring(p, det, names) -> [u, ...]``: predictor ``p``'s ``u`` by detector ``det``
    (with its parameters) on each dataset of ``names``, by the detector's ensemble rule
    (module docstring); None where a member lacks the dataset or a member detector meets one
    forward pass. A member is fitted once per parameters and group of datasets (the fitted
    state, e.g. KNN's bank, is not kept); its ``u`` are kept."""

    def __init__(self, data: dict, groups: dict, id_name: str, fit_name: str | None,
                 n_passes: dict[str, int]):
        self.data, self.groups, self.id_name, self.fit_name = data, groups, id_name, fit_name
        self.n_passes = n_passes
        self._u: dict[tuple, dict[str, np.ndarray]] = {}

    def member(self, m: str, det, names: list[str]) -> dict[str, np.ndarray]:
        """Model ``m``'s own ``u`` on ``names`` (fitted on its own fit data), by dataset."""
        key = (m, det.name, json.dumps(det.params, sort_keys=True, default=str))
        cached = self._u.setdefault(key, {})
        missing = [n for n in names if n not in cached]
        if missing:
            fit = self.data[m][self.fit_name].fit() if "fit" in det.needs else None
            head = {k: v for k, v in self.data[m][self.id_name].extra.items()
                    if k in NEED_KEYS["head"]}
            scorer = det.fitted(None if fit is None else {**head, **fit})
            for n in missing:
                cached[n] = scorer(self.data[m][n].inputs())
        return cached

    def __call__(self, p: Predictor, det, names: list[str]) -> list[np.ndarray | None]:
        have = [n for n in names if all(self.data[m][n] is not None for m in p.members)]
        out: dict[str, np.ndarray | None] = dict.fromkeys(names)
        if det.ensemble == "mean_u":
            per = [self.member(m, det, have) for m in p.members]
            out.update({n: np.mean([u[n] for u in per], axis=0) for n in have})
            return [out[n] for n in names]
        if det.ensemble == "members" and self.n_passes[p.name] < 2:
            return [None] * len(names)
        for n in have:
            if len(p.members) > 1:
                check_aligned([self.groups[m, n][0] for m in p.members])
            passes = [self.data[m][n].passes for m in p.members]
            out[n] = det.fitted(None)({"members": np.concatenate(passes)}
                                      if det.ensemble == "members" else
                                      {"logits": det.ensemble_logits(passes)})
        return [out[n] for n in names]


def _validation_sets(config: OodConfig, sets: dict, id_name: str,
                     fit_name: str | None) -> tuple[str, ...]:
    """``(ID validation, OOD validation)`` dataset names with ``tune_detectors``, else ``()``.

    Raises
    ------
    uqmetrics.InputError
        A missing or ambiguous set (naming its option and how to declare it), or an ID
        validation set that is the test or the fit set.
    """
    if not config.tune_detectors:
        return ()
    val = pick_set("calibration", config.validation, sets, option="--validation",
                   exclude=(id_name, fit_name))
    if val is None:
        raise InputError("--tune-detectors selects the detectors' parameters on an ID "
                         "validation set: predict held-out ID images as a set of role "
                         "calibration (uqvision sweep --sets calibration:val=PATH) or name it "
                         "(--validation NAME)")
    if val in (id_name, fit_name):
        raise InputError(f"--validation {val!r} is the {'test' if val == id_name else 'fit'} "
                         "set: tune the detectors on other ID images (a set of role "
                         "calibration)")
    ood_val = pick_set(OOD_VALIDATION_ROLE, config.ood_validation, sets,
                       option="--ood-validation", accept=(OOD_VALIDATION_ROLE,))
    if ood_val is None:
        raise InputError("--tune-detectors selects the detectors' parameters on an OOD "
                         f"validation set: predict one as a set of role {OOD_VALIDATION_ROLE} "
                         f"(uqvision sweep --ood-sets {OOD_VALIDATION_ROLE}:ood-far:NAME=PATH), "
                         "never a test OOD set")
    return val, ood_val


def _ood_split(record: dict, attrs: dict) -> str:
    """An OOD set's split: its evaluation set's ``ood_split``, else the cache's own attr."""
    split = record.get("ood_split", "") or attrs.get("ood_split", "")
    return str(split)


def _record(ds: xr.Dataset) -> dict:
    """A cache's evaluation-set record, with its OOD set's split (:func:`_ood_split`)."""
    record = dict(cache_eval_set(ds.attrs))
    record["ood_split"] = _ood_split(record, ds.attrs)
    return record


def _missing(arrays: _Arrays | None, keys: Iterable[str]) -> list[str]:
    return ["caches" if arrays is None else k for k in keys
            if arrays is None or (k not in arrays.extra and k != "logits")]


def _fit_keys(det) -> set[str]:
    """The fit keys a detector reads from the fit caches (``labels`` come with every cache)."""
    return set(det.fit_keys) - {"labels"} - (
        set(NEED_KEYS["head"]) if "head" in det.needs else set())


def _problem(det, model: str, data: dict[str, _Arrays | None], scored: list[str],
             fit_name: str | None) -> str:
    """What model ``model``'s caches (``data``: dataset -> arrays) lack for detector ``det`` on
    the datasets ``scored`` and the fit data ("" for nothing)."""
    keys = [k for need in sorted(det.needs - {"fit", "members"}) for k in NEED_KEYS[need]]
    for name in scored:
        lack = _missing(data[name], keys)
        if lack:
            return _lack_text(det.name, model, name, lack)
    if "fit" in det.needs:
        if fit_name is None:
            return (f"detector {det.name!r} fits on ID training data: predict an ID training "
                    "subset as a set of role fit (uqvision sweep --sets fit:fit=PATH) or name "
                    "its dataset_name (fit, --fit)")
        lack = _missing(data.get(fit_name), sorted(_fit_keys(det)))
        if data.get(fit_name) is None:
            return (f"detector {det.name!r} fits on fit set {fit_name!r}, but model {model!r} "
                    f"has no caches of it (uqvision predict the ID training subset)")
        if lack:
            return _lack_text(det.name, model, fit_name, lack)
    return ""


def _lack_text(detector: str, model: str, dataset: str, lack: list[str]) -> str:
    if lack == ["caches"]:
        return f"detector {detector!r}: model {model!r} has no caches of dataset {dataset!r}"
    how = sorted({_HOW.get(k, "uqvision predict") for k in lack})
    return (f"detector {detector!r} needs {lack}, which the caches of model {model!r} on "
            f"dataset {dataset!r} lack: predict them with {' and '.join(how)}")


def _check_same_images(name: str, caches: list[xr.Dataset]) -> None:
    """Refuse caches of dataset ``name`` of several models that hold other images (other
    sample ids, in order): every predictor is scored on the same ID and OOD images (a cache of
    another folder under that name, e.g. a shifted set's, is named with the first model's)."""
    first = caches[0]
    for c in caches[1:]:
        if not np.array_equal(c["sample"].values, first["sample"].values):
            raise InputError(
                f"caches {str(first.encoding.get('source', first.attrs['model']))!r} and "
                f"{str(c.encoding.get('source', c.attrs['model']))!r} of dataset {name!r} hold "
                f"other images ({first.sizes['sample']} and {c.sizes['sample']} samples, or "
                "another order): every model is scored on the same ID and OOD images (is one "
                "of them a cache of another folder, e.g. a shifted set's?)")


def _train_wall(attrs: dict) -> float:
    """The training wall time of a cache's checkpoint (its sidecar's ``cost``), NaN where
    none is recorded."""
    from ...models.checkpoints import read_sidecar, sidecar_path  # torch: imported on use

    ckpt = str(attrs.get("checkpoint", ""))
    if not ckpt or not sidecar_path(ckpt).is_file():
        return math.nan
    try:
        cost = read_sidecar(ckpt).get("cost", {})
    except Exception:  # noqa: BLE001 - an unreadable sidecar records no cost
        return math.nan
    return float(cost.get("total_wall_time_s", cost.get("wall_time_s", math.nan)))


def _detectors(config: OodConfig) -> tuple[list[str], bool]:
    """``(names, explicit)``: the detectors to score, and whether they were named."""
    known = list_detectors()
    if config.detectors is None:
        return [d for d in DEFAULT_DETECTORS if d in known], False
    unknown = [d for d in config.detectors if d not in known]
    if unknown:
        raise InputError(f"detectors: unknown {unknown}; registered: {known}")
    return list(dict.fromkeys(config.detectors)), True


def score_ood(caches: Iterable[str | os.PathLike] | str | os.PathLike,
              config: OodConfig | None = None) -> xr.Dataset:
    """Score OOD detectors on models and ensembles of them (module docstring).

    Parameters
    ----------
    caches : path or iterable of paths
        Cache files or folders of them (:func:`uqvision.cache.index_caches`).
    config : OodConfig, optional

    Returns
    -------
    xarray.Dataset
        A result file of protocol ``ood``. Dimensions: ``model`` (every model, then the
        ensemble rows), ``detector``, ``ood_set`` (the ``dataset_name`` of every OOD set,
        near sets first). Coordinates: on ``model`` ``kind`` (``single``/``ensemble``),
        ``mode``; on ``ood_set`` ``ood_split`` (``near``, ``far`` or "") and ``ood_eval_set``.
        Variables:

        ``<metric>`` (model, detector, ood_set)
            Each registered metric of :data:`OOD_METRICS`: ``fpr_at_95_tpr``, ``auroc``,
            ``aupr_in``, ``aupr_out``; NaN where the detector is not defined for the
            predictor or a member lacks the set.
        ``near_<metric>``, ``far_<metric>`` (model, detector)
            The mean over the sets of that split (NaN where a set is NaN or none is of it).
        ``id_accuracy`` (model)
            Accuracy on the ID test set (arg-max of the mean softmax over passes and members).
        ``forward_passes`` (model)
            Forward passes per image at test time (every pass of every member).
        ``members``, ``training_runs`` (model)
            Networks, and training runs (distinct ``run`` attrs: an MC-dropout network is
            one run).
        ``train_wall_s`` (model)
            The summed training wall time of the member checkpoints (their sidecars' cost),
            NaN where one is not recorded.
        ``predict_wall_s`` (model)
            The summed prediction wall time on the ID test set (the caches' ``wall_time_s``),
            NaN where one is not recorded.
        ``u_id`` (model, detector, id_sample), ``u_ood`` (model, detector, ood_sample)
            With ``keep_scores``: each image's ``u`` (float32); coordinate ``ood_sample_set``
            on ``ood_sample`` names its OOD set.

        Attrs (JSON): ``ensemble_members`` (row -> its models), ``fit_data`` (dataset name
        and ``fit_info``), ``skipped_detectors`` (name -> why), ``id_dataset`` (the test set),
        ``scored_sets`` (``test`` and ``fit``, with ``tune_detectors`` ``validation`` and
        ``ood_validation`` -> the dataset), ``notes``, with ``tune_detectors``
        ``detector_search`` (the criterion, the validation sets, every detector's grid, and
        per predictor and detector the chosen ``params``, their ``val_auroc`` and the
        ``errors`` of grid points the data refused),
        ``caches`` and ``entries`` (each row's caches, an ensemble's: its members', and their
        provenance: :mod:`uqvision.provenance`).

    Raises
    ------
    uqmetrics.InputError
        No caches; caches of several modes for one model; no OOD caches; no ID test set, two
        sets of role ``test`` (or ``fit``) without a choice, a named test set of role ``fit``
        or the fit set as the test set (:func:`uqvision.predictors.pick_set`); caches of one dataset that hold
        other images for two models (naming both files); an ensemble row whose members' ID
        test caches are in two class spaces or hold other labels (naming both files; a
        :class:`uqvision.cache.CacheError`); an unknown detector; a named
        detector whose inputs a model's caches lack (naming the model, the dataset, what is
        missing and the ``uqvision predict`` options that record it), or that fits without
        a fit set; a member detector with no predictor of several passes or members; with
        ``tune_detectors``, no or two ID validation sets (role ``calibration``) or OOD
        validation sets (role ``ood-val``) without a name, a named OOD validation set of
        another role (a test OOD set), the test or fit set as the ID validation set, or a
        model without caches of a validation set; ``validation``/``ood_validation`` without
        ``tune_detectors``.
    """
    config = config or OodConfig()
    read = read_cache_groups(caches, record=_record)
    groups, sets, checksums, models = read.groups, read.sets, read.checksums, read.models
    fit_name = pick_set("fit", config.fit, sets, option="--fit",
                        accept=("fit", "test", "calibration"))
    id_name = pick_set("test", config.test, sets, option="--test", exclude=(fit_name,))
    if id_name is None:
        listed = ", ".join(f"{n} ({sets[n]['set_role'] or '?'})" for n in sorted(sets))
        raise InputError(f"no ID test set (role test) among the caches' sets (role): {listed}; "
                         "predict it (a clean folder's default role is test) or name it "
                         "(--test NAME)")
    if id_name == fit_name:
        raise InputError(f"--test and --fit are both {id_name!r}: fit the detectors on ID "
                         "training images, not on the test set")
    order = {s: i for i, s in enumerate(OOD_SPLITS)}
    ood = sorted((n for n, s in sets.items() if s["role"] == "ood"
                  and s["set_role"] != OOD_VALIDATION_ROLE),
                 key=lambda n: (order.get(sets[n]["ood_split"], len(order)), n))
    if not ood:
        val = sorted(n for n, s in sets.items() if s["set_role"] == OOD_VALIDATION_ROLE)
        raise InputError("no caches of an OOD set (role ood, e.g. uqvision predict --eval-set "
                         "ood-near / ood-far / imagenet-o)"
                         + (f"; {', '.join(map(repr, val))} of role {OOD_VALIDATION_ROLE!r} only "
                            "tunes the detectors, never scored as a test OOD set: give an OOD "
                            "set of role ood-near or ood-far" if val else ""))
    tune = _validation_sets(config, sets, id_name, fit_name)
    preds, ensemble_notes = group_predictors(read, config.ensembles, models=models)
    notes: list[str] = list(ensemble_notes)
    names, explicit = _detectors(config)

    # every model's arrays (None: no caches of that dataset)
    wanted = [id_name, *ood, *tune] + ([fit_name] if fit_name else [])
    data = {m: {n: _Arrays(groups[m, n]) if (m, n) in groups else None for n in wanted}
            for m in models}
    for m in models:
        for name, what in ((id_name, "ID test set"), *zip(tune, _TUNE_SETS, strict=False)):
            if data[m][name] is None:
                raise InputError(f"model {m!r} has no caches of the {what} {name!r}")
    for name in wanted:
        _check_same_images(name, [groups[m, name][0] for m in models if data[m][name]])
    for p in preds:  # an ensemble's members share one class space (whatever the detectors)
        if len(p.members) > 1:
            check_aligned([groups[m, id_name][0] for m in p.members])
    n_passes = {p.name: sum(data[m][id_name].passes.shape[0] for m in p.members) for p in preds}

    # the detectors each predictor can be scored by
    skipped: dict[str, str] = {}
    dets = []
    for d in names:
        det = get_detector(d)
        scored = [id_name, *ood, *(tune if det.grid else [])]
        problems = [p for p in (_problem(det, m, data[m], scored, fit_name)
                                for m in models) if p]
        if "members" in det.needs and not any(v > 1 for v in n_passes.values()):
            problems.append(f"detector {d!r} reads several members or passes, but every "
                            "predictor has one forward pass (score a deep ensemble's members, "
                            "or MC-dropout caches: uqvision predict --mode mc_dropout)")
        if problems:
            if explicit:
                raise InputError(problems[0])
            skipped[d] = problems[0]
            continue
        dets.append(det)
    if not dets:
        raise InputError(f"no detector can be scored on these caches: {skipped}")

    # each predictor's detectors: tuned on the validation sets, or the fixed defaults
    scoring = _Scoring(data, groups, id_name, fit_name, n_passes)
    tuned: dict[tuple[str, str], object] = {}
    search: dict[str, dict] = {}
    for p in preds if tune else []:
        for det in (d for d in dets if d.grid):
            params, trials = search_params(det, lambda d, p=p: tuple(scoring(p, d, tune)))
            tuned[p.name, det.name] = det.with_params(**params)
            scores = [t["auroc"] for t in trials if "auroc" in t]
            errors = sorted({t["error"] for t in trials if "error" in t})
            search.setdefault(p.name, {})[det.name] = {
                "params": {k: params[k] for k in det.grid}, "val_auroc": max(scores, default=None),
                **({"errors": errors} if errors else {})}
            if not scores:
                notes.append(f"{det.name} on {p.name}: no value of its grid {det.grid} can be "
                             f"scored on the validation sets ({errors[0]}); its defaults kept")

    metrics = {v: get_metric(k).func for v, k in OOD_METRICS.items() if _registered(k)}
    if "fpr_at_95_tpr" in metrics:  # the convention named by the config (OpenOOD v1.5's default)
        metrics["fpr_at_95_tpr"] = functools.partial(metrics["fpr_at_95_tpr"],
                                                     positive=config.fpr_positive)
    shape = (len(preds), len(dets), len(ood))
    values = {v: np.full(shape, np.nan) for v in metrics}
    u_id = np.full((len(preds), len(dets), len(data[models[0]][id_name].labels)), np.nan)
    ood_sizes = [_size(data, n) for n in ood]
    u_ood = np.full((len(preds), len(dets), sum(ood_sizes)), np.nan)
    offsets = np.concatenate([[0], np.cumsum(ood_sizes)])
    for i, p in enumerate(preds):
        for j, det in enumerate(dets):
            ui, *uos = scoring(p, tuned.get((p.name, det.name), det), [id_name, *ood])
            if ui is None:
                notes.append(f"{det.name} on {p.name}: one forward pass, no members (NaN)")
                continue
            u_id[i, j, :ui.size] = ui
            for k, uo in enumerate(uos):
                if uo is None:
                    continue
                u_ood[i, j, offsets[k]:offsets[k] + uo.size] = uo
                for v, func in metrics.items():
                    values[v][i, j, k] = func(ui, uo)

    # accuracy and cost per predictor
    acc = np.empty(len(preds))
    cost = {k: np.empty(len(preds)) for k in ("train_wall_s", "predict_wall_s")}
    runs = np.empty(len(preds), np.int64)
    for i, p in enumerate(preds):
        probs = np.mean([softmax(data[m][id_name].passes, temperature=1.0).mean(axis=0)
                         if data[m][id_name].passes.shape[0] > 1 else
                         softmax(data[m][id_name].logits) for m in p.members], axis=0)
        acc[i] = accuracy_score(data[p.members[0]][id_name].labels, probs)
        attrs = [c.attrs for m in p.members for c in groups[m, id_name]]
        run_ids = {str(a.get("run", a["model"])) for a in attrs}
        runs[i] = len(run_ids)
        by_run = {str(a.get("run", a["model"])): a for a in attrs}
        cost["train_wall_s"][i] = sum(_train_wall(a) for a in by_run.values())
        cost["predict_wall_s"][i] = sum(
            max(float(c.attrs.get("wall_time_s", math.nan)) for c in groups[m, id_name])
            for m in p.members)

    ood_names = ood
    data_vars: dict = {v: (("model", "detector", "ood_set"), values[v]) for v in metrics}
    tags: dict = {v: OOD_METRICS[v] for v in metrics}
    splits = np.array([sets[n]["ood_split"] for n in ood_names], dtype=object)
    for split in OOD_SPLITS:
        sel = splits == split
        for v in metrics:
            mean = values[v][..., sel].mean(axis=-1) if sel.any() else \
                np.full(shape[:2], np.nan)
            data_vars[f"{split}_{v}"] = (("model", "detector"), mean)
            tags[f"{split}_{v}"] = OOD_METRICS[v]
    data_vars["id_accuracy"] = ("model", acc)
    tags["id_accuracy"] = "accuracy"
    data_vars["forward_passes"] = ("model", np.array([n_passes[p.name] for p in preds],
                                                     np.int64))
    data_vars["members"] = ("model", np.array([len(p.members) for p in preds], np.int64))
    data_vars["training_runs"] = ("model", runs)
    data_vars.update({k: ("model", v) for k, v in cost.items()})
    coords = {"model": [p.name for p in preds], "kind": ("model", [p.kind for p in preds]),
              "mode": ("model", [p.mode for p in preds]), "detector": [d.name for d in dets],
              "ood_set": ood_names, "ood_split": ("ood_set", [str(s) for s in splits]),
              "ood_eval_set": ("ood_set", [sets[n]["eval_set"] for n in ood_names])}
    if config.keep_scores:
        data_vars["u_id"] = (("model", "detector", "id_sample"), u_id.astype(np.float32))
        data_vars["u_ood"] = (("model", "detector", "ood_sample"), u_ood.astype(np.float32))
        coords["id_sample"] = data[models[0]][id_name].samples
        coords["ood_sample"] = np.arange(sum(ood_sizes))
        coords["ood_sample_set"] = ("ood_sample", [n for n, s in zip(ood, ood_sizes,
                                                                    strict=True)
                                                   for _ in range(s)])
    ds = xr.Dataset(data_vars, coords=coords)
    for v in ("fpr_at_95_tpr", *(f"{s}_fpr_at_95_tpr" for s in OOD_SPLITS)):
        if v in ds:
            ds[v].attrs["positive"] = config.fpr_positive
    ensembles = {p.name: list(p.members) for p in preds if p.kind == "ensemble"}
    fit_record = {"dataset_name": fit_name, **config.fit_info}
    return stamp_result(
        ds, "ood", input_checksums=sorted(set(checksums)), metrics=tags, config=asdict(config),
        seed=config.seed, notes="; ".join(dict.fromkeys(notes)) or None,
        extra={"ensemble_members": json.dumps(ensembles), "fit_data": json.dumps(fit_record),
               "skipped_detectors": json.dumps(skipped), "id_dataset": id_name,
               "fpr_positive": config.fpr_positive,
               "scored_sets": json.dumps({"test": id_name, "fit": fit_name,
                                          **dict(zip(("validation", "ood_validation"), tune,
                                                     strict=False))}),
               **({"detector_search": json.dumps({
                   "criterion": SEARCH_CRITERION, "validation": tune[0],
                   "ood_validation": tune[1],
                   "grids": {d.name: d.grid for d in dets if d.grid},
                   "chosen": search})} if tune else {}),
               **entry_provenance(predictor_rows(preds, groups), "model")})


def _registered(name: str) -> bool:
    """Whether ``name`` is a registered metric (the metric modules imported)."""
    try:
        get_metric(name)
    except (KeyError, ValueError):
        return False
    return True


def _size(data: dict, name: str) -> int:
    """The number of images of dataset ``name`` (its first model with caches of it)."""
    return next(len(d[name].labels) for d in data.values() if d[name] is not None)

