"""The predictors a protocol scores, read from prediction caches: every model and its ensembles.

A protocol that scores models and ensembles of them (the ``model`` dimension of its result:
:mod:`uqvision.protocols.shift`, :mod:`uqvision.protocols.ood`) reads its caches with
:func:`read_cache_groups` (the caches grouped by ``(model, dataset_name)``, each dataset's
evaluation set, each model's one prediction mode and training method, the input checksums)
and builds its rows with :func:`group_predictors`: every model, then one *ensemble* row per
training method of its ``ensembles`` with two or more models in one prediction mode, named
``<method>[<k>]`` (``<method>_<mode>[<k>]`` for a mode other than ``plain``, e.g.
``deep_ensemble_tta[5]``). :func:`mean_softmax` is a model's predictive distribution on one
dataset: the softmax averaged over its caches and passes; :class:`PredictorProbs` that of every
predictor on one dataset (an ensemble's: the mean of its members'), :func:`pick_dataset`
chooses a predictor's clean calibration or evaluation dataset and
:func:`fit_predictor_temperature` fits its temperature there (refused on too few images or at
a bound of the search).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from uqmetrics import InputError, input_checksum

from .cache import check_aligned, check_finite_logits, index_caches, read_cache
from .evalsets import cache_eval_set

if TYPE_CHECKING:  # xarray is imported on use (by read_cache)
    import xarray as xr

__all__ = ["CacheGroups", "Predictor", "PredictorProbs", "ensemble_methods",
           "fit_predictor_temperature", "group_predictors", "mean_softmax", "pick_dataset",
           "read_cache_groups"]


def ensemble_methods(value: Any) -> tuple[str, ...]:
    """A config's ``ensembles`` (the training methods whose runs are scored as one ensemble
    predictor, :func:`group_predictors`) as a tuple: one name, a sequence of them or None.

    Raises
    ------
    uqmetrics.InputError
        A name that is not a non-empty string, naming it.
    """
    ensembles = (value,) if isinstance(value, str) else tuple(value or ())
    bad = [m for m in ensembles if not isinstance(m, str) or not m]
    if bad:
        raise InputError(f"ensembles must be training-method names, got {bad!r} in {value!r}")
    return ensembles


@dataclass(frozen=True)
class Predictor:
    """One row of a result's ``model`` dimension: a model, or an ensemble of models.

    Attributes
    ----------
    name : str
        The row's name: the model's (its caches' ``model`` attr), or the ensemble's
        ``<method>[<k>]`` / ``<method>_<mode>[<k>]``.
    kind : str
        ``single`` (a model) or ``ensemble``.
    mode : str
        The prediction mode of its caches (every member's).
    members : tuple of str
        The models it averages: ``(name,)`` for a model.
    """

    name: str
    kind: str  # "single" or "ensemble"
    mode: str
    members: tuple[str, ...]


@dataclass
class CacheGroups:
    """Prediction caches grouped by model and dataset (:func:`read_cache_groups`).

    Attributes
    ----------
    groups : dict
        ``(model, dataset_name) -> [xarray.Dataset, ...]``: every cache of that model on that
        dataset (TTA passes, MC-dropout caches), in the order read.
    sets : dict
        ``dataset_name -> record``: the dataset's evaluation set (the ``record`` function of
        :func:`read_cache_groups`, by default :func:`uqvision.evalsets.cache_eval_set`; the
        last cache read of the dataset).
    modes : dict
        ``model -> mode``: its one prediction mode.
    methods : dict
        ``model -> method``: its caches' training ``method`` attr (``""`` where none is
        recorded or its caches record several).
    checksums : list of str
        The input checksum of every cache (:func:`uqmetrics.input_checksum`), in the order
        read (a file given twice, or a copy of one, is read once).
    """

    groups: dict[tuple[str, str], list[xr.Dataset]]
    sets: dict[str, dict]
    modes: dict[str, str]
    methods: dict[str, str]
    checksums: list[str]

    @property
    def models(self) -> list[str]:
        """Every model, sorted."""
        return sorted(self.modes)

    def check_one_class_space(self) -> None:
        """Refuse caches of several class spaces among all the models (a result with a
        ``class`` dimension needs one), naming two files of different ones.

        Raises
        ------
        uqmetrics.InputError
        """
        caches = [c for group in self.groups.values() for c in group]
        for c in caches[1:]:
            _check_class_space(caches[0], c, "the caches are",
                               "score the models of one class space together")


def _eval_set(ds: xr.Dataset) -> dict:
    return cache_eval_set(ds.attrs)


def read_cache_groups(caches: Iterable[str | os.PathLike] | str | os.PathLike, *,
                      record: Callable[[xr.Dataset], dict] = _eval_set) -> CacheGroups:
    """Read prediction caches and group them by ``(model, dataset_name)``.

    Parameters
    ----------
    caches : path or iterable of paths
        Cache files or folders of them (:func:`uqvision.cache.index_caches`: complete caches
        only, the others skipped with a ``SkippedCacheWarning``).
    record : callable, optional
        ``record(cache) -> dict``: the evaluation-set record of a cache's dataset; default
        :func:`uqvision.evalsets.cache_eval_set` of its attrs.

    Returns
    -------
    CacheGroups

    Raises
    ------
    uqmetrics.InputError
        No complete cache, a cache without ``logits`` or with NaN or infinite logits (naming
        the file and counting the samples that hold one), caches of several prediction modes
        for one model, two caches of one model that are in different class spaces (another
        ``class`` coordinate: e.g. a model without recorded class names whose OOD cache took
        its classes from the OOD folder) or that are the same cache with other logits (the
        same model, dataset, mode, pass and sample; identical files are read once), naming
        both files.
    """
    paths = [i.path for i in index_caches(
        [caches] if isinstance(caches, (str, os.PathLike)) else caches)]
    if not paths:
        raise InputError("no complete prediction cache found")
    groups: dict[tuple[str, str], list[xr.Dataset]] = defaultdict(list)
    sets: dict[str, dict] = {}
    modes: dict[str, set] = defaultdict(set)
    methods: dict[str, set] = defaultdict(set)
    checksums = []
    seen: dict[tuple, tuple[Path, str]] = {}  # one cache's identity -> (its file, checksum)
    spaces: dict[str, xr.Dataset] = {}  # model -> its first cache
    for path in paths:
        ds = read_cache(path)
        if "logits" not in ds:
            raise InputError(f"cache {Path(path).name!r} has no logits")
        model, name = str(ds.attrs["model"]), str(ds.attrs["dataset_name"])
        key = (model, name, str(ds.attrs["mode"]), int(ds.attrs.get("pass_index", 0)),
               int(ds.attrs.get("sample_index", 0)))
        checksum = input_checksum(ds)
        if key in seen:
            if seen[key][1] == checksum:  # the same file given twice, or a copy of it
                continue
            raise InputError(
                f"caches {str(seen[key][0])!r} and {str(path)!r} are both model {model!r} on "
                f"dataset {name!r} (mode {key[2]!r}, pass {key[3]}, sample {key[4]}) with "
                "other logits: score one of them (two predictions of one model under one name "
                "are never averaged)")
        seen[key] = (Path(path), checksum)
        check_finite_logits(ds, path)
        if model in spaces:
            _check_class_space(spaces[model], ds, f"model {model!r} has caches",
                               "a model's caches share its classes (a model that records no "
                               "class names takes them from its in-distribution folder, never "
                               "from an OOD folder)")
        else:
            spaces[model] = ds
        groups[model, name].append(ds)
        sets[name] = record(ds)
        modes[model].add(str(ds.attrs["mode"]))
        methods[model].add(str(ds.attrs.get("method", "")))
        checksums.append(checksum)
    for model, m in modes.items():
        if len(m) > 1:
            raise InputError(f"model {model!r} has caches of several prediction modes "
                             f"{sorted(m)}: score the caches of one mode")
    return CacheGroups(groups, sets, {m: next(iter(v)) for m, v in modes.items()},
                       {m: next(iter(v)) if len(v) == 1 else "" for m, v in methods.items()},
                       checksums)


def _source(ds: xr.Dataset) -> str:
    """The file a cache was read from (its ``encoding["source"]``), or its model's name."""
    return str(ds.encoding.get("source") or f"<model {ds.attrs.get('model')!r}>")


def _check_class_space(first: xr.Dataset, ds: xr.Dataset, subject: str, rule: str) -> None:
    """Refuse two caches in different class spaces (their ``class`` coordinates), naming
    both files; ``subject`` starts the message and ``rule`` ends it."""
    a, b = first["class"].values, ds["class"].values
    if a.shape == b.shape and np.array_equal(a, b):
        return
    raise InputError(
        f"{subject} in two class spaces: {_source(first)!r} "
        f"({first.attrs.get('dataset_name')!r}) has {a.size} classes, {_source(ds)!r} "
        f"({ds.attrs.get('dataset_name')!r}) has {b.size}"
        + (" in another order" if a.size == b.size else "") + f"; {rule}")


def group_predictors(models: list[str], modes: Mapping[str, str], methods: Mapping[str, str],
                     ensembles: Iterable[str]) -> list[Predictor]:
    """The models, then one ensemble row per (method of ``ensembles``, mode) with >= 2 models.

    Parameters
    ----------
    models : list of str
        The models, in row order.
    modes, methods : mapping
        Each model's prediction mode and training method (:class:`CacheGroups`).
    ensembles : iterable of str
        Training methods whose models are also scored together, per prediction mode.

    Returns
    -------
    list of Predictor
        A ``single`` row per model, then the ``ensemble`` rows (per method in the given order,
        per mode sorted), named ``<method>[<k>]``, or ``<method>_<mode>[<k>]`` for a mode other
        than ``plain``.

    Raises
    ------
    uqmetrics.InputError
        An ensemble row's name is a model's.
    """
    out = [Predictor(m, "single", modes[m], (m,)) for m in models]
    for method in ensembles:
        by_mode: dict[str, list[str]] = defaultdict(list)
        for m in models:
            if methods[m] == method:
                by_mode[modes[m]].append(m)
        for mode, members in sorted(by_mode.items()):
            if len(members) < 2:
                continue
            name = f"{method}{'' if mode == 'plain' else '_' + mode}[{len(members)}]"
            if name in models:
                raise InputError(f"ensemble row {name!r} (the {len(members)} models of method "
                                 f"{method!r}) has the name of a model: rename that model's "
                                 "caches or leave the method out of ensembles")
            out.append(Predictor(name, "ensemble", mode, tuple(members)))
    return out


def mean_softmax(caches: list[xr.Dataset]) -> tuple[np.ndarray, np.ndarray]:
    """One model's predictive distribution on one dataset.

    Parameters
    ----------
    caches : list of xarray.Dataset
        The model's caches of the dataset (aligned: :func:`uqvision.cache.check_aligned`),
        each with ``logits`` (sample, class) or (pass, sample, class) and ``label``.

    Returns
    -------
    labels : numpy.ndarray
        (n_samples,) int64, the first cache's.
    probs : numpy.ndarray
        (n_samples, n_classes): the softmax averaged over every pass of every cache (TTA
        passes, MC-dropout samples), each pass weighted equally.
    """
    from uqmetrics.calibration import softmax  # scipy: imported on use

    check_aligned(caches)
    total: Any = None
    count = 0
    for c in caches:
        p = softmax(c["logits"].values)
        p = p[None] if p.ndim == 2 else p
        s = p.sum(axis=0)
        total = s if total is None else total + s
        count += p.shape[0]
    return np.asarray(caches[0]["label"].values, np.int64), total / count


class PredictorProbs:
    """The probabilities of the predictors on one dataset, each member's computed once.

    Parameters
    ----------
    groups : dict
        ``(model, dataset_name) -> [xarray.Dataset, ...]`` (:attr:`CacheGroups.groups`).
    name : str
        The ``dataset_name``.

    Examples
    --------
    A predictor's ``(labels, probs)`` on the dataset, where every member has caches of it:

    >>> probs = PredictorProbs(read.groups, "test")  # doctest: +SKIP
    >>> labels, p = probs(pred) if probs.has(pred) else (None, None)  # doctest: +SKIP
    """

    def __init__(self, groups: dict[tuple[str, str], list[xr.Dataset]], name: str):
        self.groups, self.name = groups, name
        self._member: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def has(self, pred: Predictor) -> bool:
        """Whether every member of ``pred`` has caches of the dataset."""
        return all((m, self.name) in self.groups for m in pred.members)

    def first(self, pred: Predictor) -> xr.Dataset:
        """The first cache of ``pred``'s first member on the dataset."""
        return self.groups[pred.members[0], self.name][0]

    def __call__(self, pred: Predictor) -> tuple[np.ndarray, np.ndarray]:
        """``pred``'s labels and probabilities on the dataset.

        Parameters
        ----------
        pred : Predictor

        Returns
        -------
        labels : numpy.ndarray
            (n_samples,) int64, the first member's.
        probs : numpy.ndarray
            (n_samples, n_classes): a model's :func:`mean_softmax`, an ensemble's mean over its
            members (each member weighted equally, whatever its number of passes).

        Raises
        ------
        uqmetrics.InputError
            An ensemble's members' caches are not aligned (:func:`uqvision.cache.
            check_aligned`).
        """
        for m in pred.members:
            if m not in self._member:
                self._member[m] = mean_softmax(self.groups[m, self.name])
        if len(pred.members) > 1:
            check_aligned([self.groups[m, self.name][0] for m in pred.members])
        labels = self._member[pred.members[0]][0]
        return labels, sum(self._member[m][1] for m in pred.members) / len(pred.members)


def fit_predictor_temperature(model: str, dataset: str, logp: np.ndarray, labels: np.ndarray,
                              option: str, size: float, n: int) -> float:
    """A predictor's temperature on its calibration dataset, refused where it means nothing.

    Parameters
    ----------
    model : str
        The predictor's name (for the errors).
    dataset : str
        Its calibration dataset's ``dataset_name``.
    logp : numpy.ndarray
        (k, C) log-probabilities of the ``k`` images the temperature is fitted on.
    labels : numpy.ndarray
        (k,) their labels.
    option, size : str, float
        The config field that chose them (``calibration_size``, ``temperature_size``: the
        errors name it and its ``--`` option) and its value.
    n : int
        The images of the calibration dataset (``k`` of them fit).

    Returns
    -------
    float
        :func:`uqmetrics.calibration.fit_temperature` with ``strict``.

    Raises
    ------
    uqmetrics.InputError
        Fewer than :data:`uqmetrics.calibration.MIN_TEMPERATURE_SAMPLES` images, or a
        temperature on a bound of the search (the NLL has no minimum inside it), naming the
        model, the option and the bound.
    """
    from uqmetrics.calibration import MIN_TEMPERATURE_SAMPLES, fit_temperature  # scipy

    k, flag = labels.size, "--" + option.replace("_", "-")
    if k < MIN_TEMPERATURE_SAMPLES:
        raise InputError(
            f"{option} {size:g} ({flag}): model {model!r} would fit its temperature on {k} of "
            f"the {n} images of calibration dataset {dataset!r}; the minimum is "
            f"{MIN_TEMPERATURE_SAMPLES} images (give a fraction of at least "
            f"{MIN_TEMPERATURE_SAMPLES / n:.2g}, or more calibration images)")
    try:
        return fit_temperature(logp, labels, strict=True)
    except InputError as exc:
        raise InputError(f"model {model!r}, calibration dataset {dataset!r} ({k} images, "
                         f"{flag} {size:g}): {exc}") from None


def pick_dataset(kind: str, given: str | None, names: list[str], default: str | None,
                 model: str) -> str:
    """Choose one of a predictor's clean datasets.

    Parameters
    ----------
    kind : str
        What the dataset is for (``calibration``, ``clean``): named in the errors, with its
        option ``--<kind>-dataset``.
    given : str or None
        The dataset asked for; ``None``: the default.
    names : list of str
        The predictor's clean datasets to choose from.
    default : str or None
        The dataset chosen without ``given`` where it is among ``names``.
    model : str
        The predictor's name (for the errors).

    Returns
    -------
    str
        ``given``; else ``default`` where it is among ``names``; else the only one of ``names``.

    Raises
    ------
    uqmetrics.InputError
        ``given`` is not among ``names``; no ``given`` and no default among several names.

    Examples
    --------
    >>> pick_dataset("calibration", None, ["test", "val"], "val", "m")
    'val'
    >>> pick_dataset("clean", None, ["test"], None, "m")
    'test'
    """
    if given is not None:
        if given not in names:
            raise InputError(f"model {model!r} has no clean caches of {kind} dataset {given!r}; "
                             f"its clean datasets: {names}")
        return given
    if default is not None and default in names:
        return default
    if len(names) == 1:
        return names[0]
    raise InputError(f"model {model!r} has clean caches of several datasets {names}: choose "
                     f"the {kind} dataset (--{kind}-dataset)")
