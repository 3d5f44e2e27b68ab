"""The predictors a protocol scores, read from prediction caches: every model and its ensembles,
and the sets each one is scored on, chosen by their roles.

A protocol that scores models and ensembles of them (the ``model`` dimension of its result:
:mod:`uqvision.protocols.shift`, :mod:`uqvision.protocols.ood`,
:mod:`uqvision.protocols.conformal`) reads its caches with :func:`read_cache_groups` (the
caches grouped by ``(model, dataset_name)``, each dataset's evaluation set and role, each
model's one prediction mode, training method, training run and architecture, the input
checksums), takes its sets by role and name with :func:`pick_set` (``--test val``,
``--calibration val``, ``--fit fit``: without one, the only set of that role; never a set of
role ``fit`` as a test or calibration set; two candidates are refused, naming them and the
option) and builds its rows with :func:`group_predictors`: every model, then one *ensemble*
row per group of models **declared together**, and only those:

- the members of one ``uqvision train --members K`` run (the caches' ``ensemble`` id, with
  ``ensemble_size`` >= 2), per prediction mode, named ``<method>[<k>]``
  (``<method>_<mode>[<k>]`` for a mode other than ``plain``, e.g. ``deep_ensemble_tta[5]``);
- each ensemble of the config's ``ensembles`` (``--ensemble NAME=M1,M2,...``), named NAME.

Models trained alone (``method`` ``single``), or whose caches record no run they were trained
with, never form an ensemble of themselves. An ensemble of models of different architectures
is scored, with a :class:`MixedEnsembleWarning` and a note in the result.

:func:`mean_softmax` is a model's predictive distribution on one dataset: the softmax averaged
over its caches and passes; :class:`PredictorProbs` that of every predictor on one dataset (an
ensemble's: the mean of its members'), and :func:`fit_predictor_temperature` fits a
predictor's temperature on its calibration set (refused on too few images or at a bound of the
search).
"""

from __future__ import annotations

import os
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from uqmetrics import InputError, UqmetricsWarning, input_checksum

from .cache import check_aligned, check_finite_logits, index_caches, read_cache
from .evalsets import cache_eval_set
from .exceptions import UqvisionWarning
from .roles import LABELLED_ROLES, declared_ensembles

if TYPE_CHECKING:  # xarray is imported on use (by read_cache)
    import xarray as xr

__all__ = ["CacheGroups", "MixedEnsembleWarning", "Predictor", "PredictorProbs",
           "check_members", "declared_ensembles", "fit_predictor_temperature",
           "group_predictors", "mean_softmax", "pick_set", "pick_test_and_calibration",
           "read_cache_groups", "set_roles"]


class MixedEnsembleWarning(UqvisionWarning, UqmetricsWarning):
    """An ensemble row averages models of different architectures (a declared ``--ensemble``
    of a ResNet and a ViT, say): it is scored, and the result's ``notes`` say so."""


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
    runs : dict
        ``model -> (ensemble id, ensemble size)``: the ``uqvision train`` run it was trained
        in (its caches' ``ensemble`` and ``ensemble_size`` attrs; ``("", 0)`` where none is
        recorded or its caches record several).
    architectures : dict
        ``model -> architecture``: its caches' ``architecture`` attr (else ``model_name``;
        ``""`` where none is recorded).
    """

    groups: dict[tuple[str, str], list[xr.Dataset]]
    sets: dict[str, dict]
    modes: dict[str, str]
    methods: dict[str, str]
    checksums: list[str]
    runs: dict[str, tuple[str, int]]
    architectures: dict[str, str]

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
        ``record(cache) -> dict``: the evaluation-set record of a cache's dataset (with its
        ``set_role``); default :func:`uqvision.evalsets.cache_eval_set` of its attrs.

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
        both files; caches of one dataset that record two roles (naming both files); caches
        of two dataset names that hold the same images read the same way (one dataset
        fingerprint, evaluation set and member: one folder predicted under two names, which
        would be scored in two roles, e.g. as the test set and as its own calibration or OOD
        set), naming both files.
    """
    given = [caches] if isinstance(caches, (str, os.PathLike)) else list(caches)
    paths = [i.path for i in index_caches(given)]
    if not paths:
        raise InputError("no complete prediction cache found in "
                         + (", ".join(repr(os.fspath(p)) for p in given) or "(none given)"))
    groups: dict[tuple[str, str], list[xr.Dataset]] = defaultdict(list)
    sets: dict[str, dict] = {}
    modes: dict[str, set] = defaultdict(set)
    methods: dict[str, set] = defaultdict(set)
    runs: dict[str, set] = defaultdict(set)
    archs: dict[str, set] = defaultdict(set)
    roles: dict[str, tuple[str, Path]] = {}  # dataset_name -> (its role, the first file)
    checksums = []
    seen: dict[tuple, tuple[Path, str]] = {}  # one cache's identity -> (its file, checksum)
    spaces: dict[str, xr.Dataset] = {}  # model -> its first cache
    images: dict[tuple[str, str, str], tuple[str, Path]] = {}  # what a set is -> (name, file)
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
        role = sets[name].get("set_role", "")
        if roles.setdefault(name, (role, Path(path)))[0] != role:
            _two_roles(name, *roles[name], role, Path(path))
        fingerprint = str(ds.attrs.get("dataset_fingerprint", ""))
        if fingerprint:  # the same images, labelled the same way, under one name only
            what = (fingerprint, str(sets[name].get("eval_set", "")),
                    str(sets[name].get("eval_member", "")))
            other, other_path = images.setdefault(what, (name, Path(path)))
            if other != name:
                raise InputError(
                    f"caches {str(other_path)!r} (dataset {other!r}) and {str(path)!r} (dataset "
                    f"{name!r}) hold the same images (dataset fingerprint "
                    f"{fingerprint[:17]}...): one set under two names would be scored as two "
                    "sets (its own calibration, fit or OOD set); score the caches of one name")
        modes[model].add(str(ds.attrs["mode"]))
        methods[model].add(str(ds.attrs.get("method", "")))
        runs[model].add((str(ds.attrs.get("ensemble", "")),
                         int(ds.attrs.get("ensemble_size", 0) or 0)))
        archs[model].add(str(ds.attrs.get("architecture") or ds.attrs.get("model_name") or ""))
        checksums.append(checksum)
    for model, m in modes.items():
        if len(m) > 1:
            raise InputError(f"model {model!r} has caches of several prediction modes "
                             f"{sorted(m)}: score the caches of one mode")
    return CacheGroups(groups, sets, {m: next(iter(v)) for m, v in modes.items()},
                       {m: next(iter(v)) if len(v) == 1 else "" for m, v in methods.items()},
                       checksums,
                       {m: next(iter(v)) if len(v) == 1 else ("", 0) for m, v in runs.items()},
                       {m: next(iter(v)) if len(v) == 1 else "" for m, v in archs.items()})


def _two_roles(name: str, role: str, path: Path, other: str, other_path: Path) -> None:
    """Refuse two caches of dataset ``name`` that record two roles, naming both files."""
    raise InputError(f"caches {str(path)!r} and {str(other_path)!r} of dataset {name!r} record "
                     f"two roles, {role!r} and {other!r} (attr set_role): a set plays one role; "
                     "predict it again under another name (uqvision sweep --sets "
                     "ROLE:NAME=PATH) or remove the caches of the other role")


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


def group_predictors(read: CacheGroups, ensembles: Any = None, *,
                     models: list[str] | None = None) -> tuple[list[Predictor], list[str]]:
    """The models, then one ensemble row per group of models declared together.

    Parameters
    ----------
    read : CacheGroups
        The caches (:func:`read_cache_groups`): each model's mode, method, training run and
        architecture.
    ensembles : mapping or iterable of str, optional
        The declared ensembles (:func:`uqvision.roles.declared_ensembles`: ``{name:
        members}`` or ``NAME=M1,M2,...`` strings; ``--ensemble``).
    models : list of str, optional
        The models, in row order (default every model, sorted).

    Returns
    -------
    predictors : list of Predictor
        A ``single`` row per model; then an ``ensemble`` row per training run with two or more
        of its members among the models, per prediction mode (its caches' ``ensemble`` id,
        from ``uqvision train --members K``), named ``<method>[<k>]``, or
        ``<method>_<mode>[<k>]`` for a mode other than ``plain`` (``ensemble`` for members
        that record no method; with the run's id, ``<name>@<id>``, where two runs would share a
        name); then each declared ensemble, named as declared. Models trained alone, or
        recording no run, are never grouped of themselves.
    notes : list of str
        One line per ensemble of models of different architectures (each also a
        :class:`MixedEnsembleWarning`), and per run with members missing from the caches.

    Raises
    ------
    uqmetrics.InputError
        A declared ensemble with a member that has no caches (naming the models) or members
        of several prediction modes; a row whose name is a model's or another row's.
    """
    models = read.models if models is None else list(models)
    out = [Predictor(m, "single", read.modes[m], (m,)) for m in models]
    notes: list[str] = []
    runs: dict[tuple[str, str], list[str]] = defaultdict(list)  # (run id, mode) -> members
    for m in models:
        run, size = read.runs.get(m, ("", 0))
        if run and size >= 2:
            runs[run, read.modes[m]].append(m)
    trained = []
    for (run, mode), members in sorted(runs.items()):
        if len(members) < 2:
            continue
        methods = {read.methods[m] for m in members}
        method = methods.pop() if len(methods) == 1 and "" not in methods else "ensemble"
        name = f"{method}{'' if mode == 'plain' else '_' + mode}[{len(members)}]"
        size = read.runs[members[0]][1]
        if len(members) < size:
            notes.append(f"ensemble {name} (uqvision train run {run}): {len(members)} of its "
                         f"{size} members have caches")
        trained.append((name, run, mode, members))
    counts: dict[str, int] = defaultdict(int)
    for name, *_ in trained:
        counts[name] += 1
    for name, run, mode, members in trained:
        out.append(Predictor(name if counts[name] == 1 else f"{name}@{run}", "ensemble", mode,
                             tuple(members)))
    for name, members in declared_ensembles(ensembles).items():
        missing = [m for m in members if m not in read.modes]
        if missing:
            raise InputError(f"ensembles (--ensemble) {name}={','.join(members)}: no caches of "
                             f"model(s) {missing}; the models: {sorted(read.modes)}")
        mode = {read.modes[m] for m in members}
        if len(mode) > 1:
            raise InputError(f"ensembles (--ensemble) {name}={','.join(members)}: its members "
                             f"have caches of several prediction modes {sorted(mode)}: declare "
                             "an ensemble of one mode")
        out.append(Predictor(name, "ensemble", mode.pop(), tuple(members)))
    seen: set[str] = set()
    for pred in out:
        if pred.name in seen:
            raise InputError(f"ensemble row {pred.name!r} (of models {list(pred.members)}) has "
                             "the name of a model or another row: declare it under another "
                             "name (--ensemble NAME=...)")
        seen.add(pred.name)
    for pred in out[len(models):]:
        archs = {m: read.architectures.get(m, "") for m in pred.members}
        if len(set(archs.values()) - {""}) > 1:
            note = (f"ensemble {pred.name} averages models of different architectures: "
                    + ", ".join(f"{m} ({a or '?'})" for m, a in archs.items()))
            warnings.warn(note, MixedEnsembleWarning, stacklevel=2)
            notes.append(note)
    return out, notes


def pick_set(role: str, given: str | None, sets: Mapping[str, Mapping[str, Any]], *,
             option: str, accept: Iterable[str] = LABELLED_ROLES,
             exclude: Iterable[str | None] = ()) -> str | None:
    """The set of a role a protocol scores: the one named, else the only set of that role.

    Parameters
    ----------
    role : str
        The role wanted (``test``, ``calibration``, ``fit``): named in the errors.
    given : str or None
        The ``dataset_name`` asked for (``--test val``); ``None``: the only set whose caches
        record role ``role``.
    sets : mapping
        ``dataset_name -> record`` with its ``set_role`` (:attr:`CacheGroups.sets`,
        :func:`set_roles`).
    option : str
        The option that names the set (``--test``), in the errors.
    accept : iterable of str
        The roles a set named for ``role`` may record (default ``test`` and
        ``calibration``: never ``fit``, an OOD set or a shifted one).
    exclude : iterable of str
        Sets that are not candidates without ``given`` (the set chosen for another role).

    Returns
    -------
    str or None
        ``given``; else the only set of role ``role`` but ``exclude``; ``None`` where there
        is none.

    Raises
    ------
    uqmetrics.InputError
        ``given`` has no caches, or records a role not in ``accept`` (a ``fit`` set: training
        images); several sets of role ``role`` without ``given``: one line naming them and
        ``option``.

    Examples
    --------
    >>> sets = {"val": {"set_role": "test"}, "fit": {"set_role": "fit"}}
    >>> pick_set("test", None, sets, option="--test"), pick_set("fit", None, sets, option="--fit")
    ('val', 'fit')
    >>> pick_set("calibration", None, sets, option="--calibration") is None
    True
    """
    accept = tuple(accept)
    listed = ", ".join(f"{n} ({sets[n].get('set_role') or '?'})" for n in sorted(sets))
    if given is not None:
        if given not in sets:
            raise InputError(f"{option} {given!r}: no caches of dataset {given!r}; the caches' "
                             f"sets (role): {listed}")
        got = sets[given].get("set_role", "")
        if got not in accept:
            why = " (an ID training subset: training images are never scored)" \
                if got == "fit" else ""
            raise InputError(f"{option} {given!r}: dataset {given!r} has role {got!r}{why}, "
                             f"never a {role} set (a {role} set has role "
                             f"{' or '.join(map(repr, accept))}); the caches' sets (role): "
                             f"{listed}")
        return given
    skip = {e for e in exclude if e is not None}
    found = sorted(n for n, r in sets.items() if r.get("set_role") == role and n not in skip)
    if len(found) > 1:
        raise InputError(f"the caches hold {len(found)} sets of role {role!r}: "
                         f"{', '.join(map(repr, found))}; name the {role} set ({option} NAME)")
    return found[0] if found else None


def pick_test_and_calibration(sets: Mapping[str, Mapping[str, Any]], test: str | None,
                              calibration: str | None) -> tuple[str, str]:
    """The test and calibration sets of a protocol that calibrates on clean data (shift,
    conformal): each the one named (``--test``, ``--calibration``), else the only set of
    its role (:func:`pick_set`; the named one of the other role is not a candidate); a missing
    calibration set is the test set (the protocol splits it), a missing test set the
    calibration set (its held-out rest).

    Returns
    -------
    (test, calibration) : (str, str)
        Dataset names; the same one where the protocol splits it.

    Raises
    ------
    uqmetrics.InputError
        As :func:`pick_set`; neither set found (naming the caches' sets and ``--test``).
    """
    cal = pick_set("calibration", calibration, sets, option="--calibration", exclude=(test,))
    chosen = pick_set("test", test, sets, option="--test", exclude=(calibration,))
    if cal is None and chosen is None:
        listed = ", ".join(f"{n} ({sets[n].get('set_role') or '?'})" for n in sorted(sets))
        raise InputError(f"no set of role 'test' or 'calibration' among the caches' sets (role): "
                         f"{listed}; predict the clean test set (a clean folder's default role "
                         "is test; uqvision sweep --sets test:NAME=PATH) or name it (--test NAME)")
    return chosen or cal, cal or chosen  # type: ignore[return-value]


def check_members(pred: Predictor, groups: Mapping[tuple[str, str], Any], name: str, role: str,
                  option: str) -> None:
    """Refuse a predictor a member of which has no caches of the ``role`` set ``name``
    (naming the model, the set and its option)."""
    lacking = [m for m in pred.members if (m, name) not in groups]
    if lacking:
        whose = "" if pred.kind == "single" else f" (a member of {pred.name!r})"
        raise InputError(f"model {lacking[0]!r}{whose} has no caches of the {role} set {name!r} "
                         f"({option}): predict it on that set, or score the caches of the "
                         "models that have")


def set_roles(infos: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """``dataset_name -> {"set_role": role}`` of indexed caches (:class:`uqvision.cache.
    CacheInfo`, their headers read again): what :func:`pick_set` chooses among for a protocol
    that reads caches one dataset at a time (``score selective``).

    Raises
    ------
    uqmetrics.InputError
        Caches of one dataset that record two roles, naming both files.
    """
    from uqmetrics.runs.io import open_netcdf

    out: dict[str, dict[str, Any]] = {}
    first: dict[str, Path] = {}
    for info in infos:
        with open_netcdf(info.path) as ds:  # the header only
            role = cache_eval_set(ds.attrs)["set_role"]
        name = info.dataset_name
        if name in out and out[name]["set_role"] != role:
            _two_roles(name, out[name]["set_role"], first[name], role, Path(info.path))
        out.setdefault(name, {"set_role": role})
        first.setdefault(name, Path(info.path))
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
    from uqmetrics.metrics.calibration import softmax  # scipy: imported on use

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
        :func:`uqmetrics.metrics.calibration.fit_temperature` with ``strict``.

    Raises
    ------
    uqmetrics.InputError
        Fewer than :data:`uqmetrics.metrics.calibration.MIN_TEMPERATURE_SAMPLES` images, or a
        temperature on a bound of the search (the NLL has no minimum inside it), naming the
        model, the option and the bound.
    """
    from uqmetrics.metrics.calibration import MIN_TEMPERATURE_SAMPLES, fit_temperature  # scipy

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
