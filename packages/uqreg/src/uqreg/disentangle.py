"""The disentanglement study (docs/conventions.md#r-7-study): each part of a mean–variance
method's predictive variance scored against its exact value, per x and as complexity grows.

On a heteroscedastic task (R.7) the aleatoric variance σ²(x) is known and the exact epistemic
variance is the flat-prior posterior's ``G(x)ᵀ Σ_post G(x)`` (:func:`uqreg.reference.reference_decomposition`).
:func:`run_disentangle` trains the mean–variance methods (``<method>+mv``) on every
(task, complexity) of a :class:`DisentangleScale`, beside the exact oracle (method ``blr``, whose
estimates are the exact values: the ceiling of every score), and :func:`scores` computes, once
and for every method:

=========================  ======================================================================
variable                   definition (per method, complexity; ``est`` a method's estimate)
=========================  ======================================================================
aleatoric_ratio            per x: mean over repetitions of est. aleatoric / σ²(x)
epistemic_ratio            per x: mean over repetitions of est. epistemic / exact epistemic
truth_coverage             per x: fraction of repetitions with |μ − f(x)| < z·sqrt(est. epistemic)
new_coverage               per x: fraction of repetitions with |y_new − μ| < z·sqrt(est. total)
log10_aleatoric_ratio      per repetition and region: mean over the region's x of log10 ratio
log10_epistemic_ratio      the same for the epistemic part
aleatoric_spearman         Spearman over the region's x of est. aleatoric with σ²(x)
epistemic_spearman         Spearman of est. epistemic with the exact epistemic variance
epistemic_leakage          Spearman of est. epistemic with the true aleatoric σ²(x)
aleatoric_leakage          Spearman of est. aleatoric with the exact epistemic variance
estimates_spearman         Spearman of est. epistemic with est. aleatoric (untangle's measure)
region_truth_coverage      mean over the region's x of the truth's coverage (per repetition)
region_new_coverage        the same for the fresh noisy targets
=========================  ======================================================================

z = z_{1−α/2} (α = 0.05), the coverages R.4's (:func:`covered`: strict, so a band of width 0
covers nothing); y_new are fresh noisy targets at the test inputs
(:meth:`uqreg.tasks.TaskInstance.test_targets`); region ``in`` = the test points whose every
coordinate lies in the closed training box (``in_distribution``, as the coverage study), ``out``
the others. The oracle's leakage is not 0: it is the rank correlation of the two *true* parts
over x, the value a method that disentangles perfectly reaches.

Results are one netCDF file per task, ``OUT/<task>/study.nc``, combined from one file per
(complexity, method) cell (``OUT/<task>/cells/``), each written atomically
(:func:`uqmetrics.write_dataset`); a rerun at the same scale skips the cells already written,
and files of another scale or configuration are refused unless ``overwrite`` (:func:`run_task`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import uqmetrics
from uqmetrics.metrics.registry import Registry

from .engine import TrainConfig
from .study import covered, flat_json
from .tasks import get_task

#: The heteroscedastic tasks of the study, one per family (R.7).
TASKS = ("sinusoid_het", "styblinski_tang_het", "polynomial_het")
#: Every mean–variance method (``<method>+mv``), in registration order.
MV_METHODS = ("bd+mv", "cd+mv", "vd+mv", "ens+mv", "ens_adv+mv", "ens_bs+mv")
#: The exact oracle's name in the ``method`` dim.
ORACLE = "blr"
#: Miscoverage of the bands.
ALPHA = 0.05
REGIONS = ("in", "out")
_WHERE = {"in": "inside the box", "out": "outside the box"}
#: Per-x scores (method, complexity, point).
POINT_SCORES = ("aleatoric_ratio", "epistemic_ratio", "truth_coverage", "new_coverage")
#: Per-repetition scores over a region (method, complexity, repetition, region).
REGION_SCORES = ("log10_aleatoric_ratio", "log10_epistemic_ratio", "aleatoric_spearman", "epistemic_spearman",
                 "epistemic_leakage", "aleatoric_leakage", "estimates_spearman", "region_truth_coverage",
                 "region_new_coverage")


def spearman(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman rank correlation along the last axis (average ranks for ties); NaN where either
    side is constant.

    Parameters
    ----------
    a, b : ndarray, shape (..., T)
        Broadcast against each other.
    """
    from scipy.stats import rankdata

    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    ra = rankdata(a, axis=-1)
    rb = rankdata(b, axis=-1)
    ra = ra - ra.mean(axis=-1, keepdims=True)
    rb = rb - rb.mean(axis=-1, keepdims=True)
    den = np.sqrt((ra**2).sum(axis=-1) * (rb**2).sum(axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (ra * rb).sum(axis=-1) / np.where(den > 0, den, 1.0), np.nan)


def score_arrays(mean, epistemic, aleatoric, truth, exact_epistemic, exact_aleatoric, new_targets, inside,
                 alpha: float = ALPHA) -> dict[str, np.ndarray]:
    """Every score of the study for one method at one complexity (the module docstring's table).

    Parameters
    ----------
    mean, epistemic, aleatoric : ndarray, shape (R, T)
        The method's predictive mean and its two variance estimates, per repetition.
    truth, exact_epistemic, exact_aleatoric : ndarray, shape (T,)
        The noise-free f(x), the exact epistemic variance and σ²(x).
    new_targets : ndarray, shape (R, T)
        Fresh noisy targets at the test inputs.
    inside : ndarray of bool, shape (T,)
        In the training box.

    Returns
    -------
    dict
        :data:`POINT_SCORES` of shape (T,) and :data:`REGION_SCORES` of shape (R, 2) (region
        ``in``, ``out``; NaN for a region without points).
    """
    from scipy.stats import norm

    z = float(norm.ppf(1 - alpha / 2))
    mean, epi, ale, y_new = (np.asarray(v, dtype=np.float64) for v in (mean, epistemic, aleatoric, new_targets))
    truth, t_epi, t_ale = (np.asarray(v, dtype=np.float64) for v in (truth, exact_epistemic, exact_aleatoric))
    inside = np.asarray(inside, dtype=bool)
    ale_ratio, epi_ratio = ale / t_ale, epi / t_epi
    cov_truth = covered(mean, np.sqrt(epi), truth, z)
    cov_new = covered(mean, np.sqrt(epi + ale), y_new, z)
    out = {"aleatoric_ratio": ale_ratio.mean(axis=0), "epistemic_ratio": epi_ratio.mean(axis=0),
           "truth_coverage": cov_truth.mean(axis=0), "new_coverage": cov_new.mean(axis=0)}
    per_region = {name: [] for name in REGION_SCORES}
    for mask in (inside, ~inside):
        if not mask.any():
            for name in REGION_SCORES:
                per_region[name].append(np.full(mean.shape[0], np.nan))
            continue
        e, a, te, ta = epi[:, mask], ale[:, mask], t_epi[mask], t_ale[mask]
        per_region["log10_aleatoric_ratio"].append(np.log10(ale_ratio[:, mask]).mean(axis=1))
        per_region["log10_epistemic_ratio"].append(np.log10(epi_ratio[:, mask]).mean(axis=1))
        per_region["aleatoric_spearman"].append(spearman(a, ta))
        per_region["epistemic_spearman"].append(spearman(e, te))
        per_region["epistemic_leakage"].append(spearman(e, ta))
        per_region["aleatoric_leakage"].append(spearman(a, te))
        per_region["estimates_spearman"].append(spearman(e, a))
        per_region["region_truth_coverage"].append(cov_truth[:, mask].mean(axis=1))
        per_region["region_new_coverage"].append(cov_new[:, mask].mean(axis=1))
    out.update({name: np.stack(v, axis=-1) for name, v in per_region.items()})
    return out


def scores(raw):
    """The dataset ``raw`` (:func:`run_cell`'s, combined over complexity) with :func:`score_arrays`
    for every method and complexity added: :data:`POINT_SCORES` over (method, complexity, point)
    and :data:`REGION_SCORES` over (method, complexity, repetition, region)."""

    m, c, r, t = (raw.sizes[d] for d in ("method", "complexity", "repetition", "point"))
    arrays = {n: np.full((m, c, t), np.nan) for n in POINT_SCORES}
    arrays.update({n: np.full((m, c, r, 2), np.nan) for n in REGION_SCORES})
    for j in range(c):
        sub = raw.isel(complexity=j)
        for i in range(m):
            s = sub.isel(method=i)
            got = score_arrays(s.prediction.values, s.epistemic_variance.values, s.aleatoric_variance.values,
                               sub.truth.values, sub.exact_epistemic_variance.values,
                               sub.exact_aleatoric_variance.values, sub.new_targets.values,
                               sub.in_distribution.values, float(raw.attrs.get("alpha", ALPHA)))
            for n, v in got.items():
                arrays[n][i, j] = v
    ds = raw.assign_coords(region=list(REGIONS))
    for n in POINT_SCORES:
        ds[n] = (("method", "complexity", "point"), arrays[n])
    for n in REGION_SCORES:
        ds[n] = (("method", "complexity", "repetition", "region"), arrays[n])
    ds.attrs["score_convention"] = (
        "docs/conventions.md#r-7-study: ratios = estimate / exact part; Spearman over the region's test points, "
        "per repetition; epistemic_leakage = Spearman(est. epistemic, sigma^2(x)); aleatoric_leakage = "
        "Spearman(est. aleatoric, exact epistemic); estimates_spearman = Spearman(est. epistemic, est. aleatoric) "
        "(untangle's measure); truth_coverage: |mu - f| < z sqrt(est. epistemic); new_coverage: "
        "|y_new - mu| < z sqrt(est. epistemic + est. aleatoric) (strict, as R.4's coverage; not finite: not "
        "covered); z = z_(1-alpha/2); region in = every "
        "coordinate in the closed training box")
    return ds


# -- the study ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DisentangleScale:
    """A size of the study: the tasks with their complexities, the methods, the repetitions and
    the training configuration (its ``recipe`` and ``nll_beta`` included)."""

    name: str
    description: str
    tasks: dict
    methods: tuple[str, ...] = MV_METHODS
    repetitions: int = 5
    seed: int = 0
    train: TrainConfig = field(default_factory=TrainConfig)


#: The study's training recipe: ``sum`` (R.3b: under ``paper`` the E.1 networks collapse) and
#: β-NLL with β = 0.5 (Seitzer et al. 2022's recommendation).
STUDY_TRAIN = {"recipe": "sum", "nll_beta": 0.5}

SCALES: Registry[DisentangleScale] = Registry("scale")
SCALES.register(DisentangleScale(
    "paper", "every mean-variance method, 120 members, 200 MC passes, k = 50, f_main 1-10, d 1-4: a GPU",
    {"sinusoid_het": tuple(range(1, 11)), "styblinski_tang_het": (1, 2, 3, 4), "polynomial_het": (2,)},
    repetitions=50, train=TrainConfig(members=120, mc_samples=200, **STUDY_TRAIN)))
SCALES.register(DisentangleScale(
    "cpu", "every mean-variance method, 8 members, 50 MC passes, k = 5, f_main 1-3, d 1-2: minutes on 2 CPU cores",
    {"sinusoid_het": (1, 2, 3), "styblinski_tang_het": (1, 2), "polynomial_het": (2,)},
    repetitions=5, train=TrainConfig(members=8, mc_samples=50, **STUDY_TRAIN)))
SCALES.register(DisentangleScale(
    "smoke", "seconds: for tests",
    {"sinusoid_het": (1, 2)}, methods=("ens+mv", "bd+mv"), repetitions=3,
    train=TrainConfig(members=3, epochs=5, mc_samples=5, **STUDY_TRAIN)))


def run_cell(task: str, complexity: int, method: str, repetitions: int, *, seed: int = 0,
             train: TrainConfig | None = None):
    """One cell of the study: ``method`` (a ``<method>+mv``, or :data:`ORACLE`) trained on
    ``repetitions`` noise draws of ``task`` at ``complexity``.

    Returns
    -------
    xarray.Dataset
        ``prediction`` (the predictive mean), ``epistemic_variance``, ``aleatoric_variance`` (method, complexity,
        repetition, point) with length-1 method and complexity dims; attr ``wall_time_s``.
    """
    import xarray as xr

    from .methods import get_method
    from .reference import reference_decomposition

    inst = get_task(task).instance(complexity, seed)
    reps = np.arange(repetitions)
    y = inst.targets(reps)
    t0 = time.perf_counter()
    if method == ORACLE:
        dec = reference_decomposition(inst, y)
        mean = dec.mean
        epi, ale = (np.broadcast_to(v, mean.shape) for v in (dec.epistemic_variance, dec.aleatoric_variance))
    else:
        dec = get_method(method).train_predict(inst, y, reps, train or TrainConfig()).decompose()
        mean, epi, ale = dec.mean, dec.epistemic_variance, dec.aleatoric_variance
    dims = ("method", "complexity", "repetition", "point")
    return xr.Dataset({k: (dims, np.asarray(v, dtype=np.float64)[None, None])
                       for k, v in (("prediction", mean), ("epistemic_variance", epi), ("aleatoric_variance", ale))},
                      coords={"method": [method], "complexity": [int(complexity)], "repetition": reps,
                              "point": np.arange(mean.shape[1])},
                      attrs={"wall_time_s": time.perf_counter() - t0})


def task_data(task: str, complexities, repetitions: int, seed: int = 0):
    """The exact parts and the test data of ``task`` (complexity, point): ``truth``,
    ``exact_epistemic_variance``, ``exact_aleatoric_variance``, ``in_distribution``, and the
    fresh targets ``new_targets`` (complexity, repetition, point); the test points' plotting
    coordinates (``x``, ``lambda``, ``x1``/``x2``) as coords."""
    import xarray as xr

    from .reference import reference_decomposition

    rows = {k: [] for k in ("truth", "exact_epistemic_variance", "exact_aleatoric_variance", "in_distribution",
                            "new_targets")}
    reps = np.arange(repetitions)
    coords = {}
    for c in complexities:
        inst = get_task(task).instance(int(c), seed)
        dec = reference_decomposition(inst, inst.targets(reps))
        rows["truth"].append(inst.f_test)
        rows["exact_epistemic_variance"].append(dec.epistemic_variance)
        rows["exact_aleatoric_variance"].append(dec.aleatoric_variance)
        rows["in_distribution"].append(inst.in_distribution)
        rows["new_targets"].append(inst.test_targets(reps))
        coords = {k: ("point", np.asarray(v)) for k, v in inst.test_coords.items()}
    cp = ("complexity", "point")
    t = get_task(task)
    return xr.Dataset({k: (("complexity", "repetition", "point") if k == "new_targets" else cp, np.stack(v))
                       for k, v in rows.items()},
                      coords={"complexity": [int(c) for c in complexities], "repetition": reps, **coords},
                      attrs={"task": task, "complexity_name": t.complexity_name, "train_box": list(t.train_box),
                             "alpha": ALPHA})


def _cell_config(scale: DisentangleScale, task: str, complexity, method: str, train: TrainConfig) -> str:
    """What a cell is computed from (its attr ``cell_config``, JSON): task, complexity, method,
    repetitions, seed, the training configuration, and the method's revision where it is not 0
    (:func:`uqreg.methods.method_revisions`: a cell of an earlier revision is never reused; the
    configuration of every other cell is what it always was)."""
    from .methods import method_revisions

    config = {"task": task, "complexity": int(complexity), "method": method,
              "repetitions": int(scale.repetitions), "seed": int(scale.seed), "train": vars(train)}
    if rev := method_revisions([method]):
        config["revision"] = rev[method]
    return json.dumps(config, sort_keys=True, default=str)


def _differences(found: str | None, asked: str) -> str:
    """The fields of two :func:`_cell_config` values that differ, ``name found (asked value)``,
    ``train.<field>`` for the training configuration's."""
    try:
        old = json.loads(found) if found else {}
    except (TypeError, ValueError):
        old = {}
    found, new = flat_json(old), flat_json(json.loads(asked))
    diffs = [f"{k} {found.get(k, 'absent')} (asked {new.get(k, 'absent')})"
             for k in sorted(found.keys() | new.keys()) if found.get(k, "absent") != new.get(k, "absent")]
    return ", ".join(diffs) if diffs else "no cell_config recorded"


def _scale_of(found: str | None, task: str, complexity, method: str) -> str | None:
    """The registered scale whose cell ``(task, complexity, method)`` has the configuration
    ``found`` (on its device, whatever its method's revision): what a cell written before cells
    recorded their scale was computed at; None for none."""
    try:
        old = json.loads(found)
        device = old["train"]["device"]
    except (TypeError, ValueError, KeyError):
        return None
    old.pop("revision", None)
    for _, sc in SCALES.items_ordered():
        if complexity not in sc.tasks.get(task, ()) or method not in (ORACLE, *sc.methods):
            continue
        mine = json.loads(_cell_config(sc, task, complexity, method, replace(sc.train, device=device)))
        mine.pop("revision", None)
        if mine == old:
            return sc.name
    return None


def _task_cells(scale: DisentangleScale, task: str, out_dir, *, device: str = "cpu",
                overwrite: bool = False) -> list[tuple]:
    """The cells of one task of ``scale`` in ``out_dir``, checked before any work:
    ``[(complexity, method, path, config, cell or None)]``, ``cell`` the file on disk when it was
    computed from ``config`` (reused), None when it is to be computed (missing, or another
    configuration's under ``overwrite``).

    Raises
    ------
    uqmetrics.InputError
        Without ``overwrite``: ``out_dir/study.nc`` holds a study of another scale
        (:func:`uqreg.study.reproduced_study`, the check of ``uqreg reproduce`` and
        ``reproduce real``), or a cell file was computed from another configuration (another
        scale, seed, device, or an earlier revision of its method), naming the file, the scale
        it records and the one asked, and the fields that differ.
    """
    from .study import reproduced_study

    out = Path(out_dir)
    if (out / "study.nc").exists():
        done = reproduced_study(out / "study.nc", scale.name, overwrite=overwrite)
        if done is not None:
            done.close()
    train = replace(scale.train, device=device)
    rows = []
    for c in scale.tasks[task]:
        for m in (ORACLE, *scale.methods):
            path = out / "cells" / f"c{c}_{m}.nc"
            config = _cell_config(scale, task, c, m, train)
            cell = uqmetrics.read_dataset(path) if path.exists() else None
            if cell is not None and cell.attrs.get("cell_config") != config:
                found = cell.attrs.get("cell_config")
                recorded = cell.attrs.get("reproduce_scale") or _scale_of(found, task, c, m)
                cell.close()
                cell = None
                if not overwrite:
                    what = f"at scale {recorded!r}" if recorded is not None else "by another run"
                    raise uqmetrics.InputError(
                        f"--scale {scale.name}: {path} holds a cell computed {what}, from another configuration "
                        f"than scale {scale.name!r} asks for ({_differences(found, config)}); pass --overwrite "
                        f"to replace it, or write to another --out")
            rows.append((c, m, path, config, cell))
    return rows


def run_task(scale: DisentangleScale, task: str, out_dir, *, device: str = "cpu", progress: bool = True,
             overwrite: bool = False):
    """Run (or resume) one task of ``scale``: every (complexity, method) cell not yet in
    ``out_dir/cells`` is trained and written; then the cells, the task data and :func:`scores`
    are combined and written to ``out_dir/study.nc`` (returned, as a Dataset).

    A cell records what it was computed from (attr ``cell_config``: task, complexity, method,
    repetitions, seed, training configuration, and the method's revision where it is not 0) and
    the scale (attr ``reproduce_scale``). Before any work (:func:`_task_cells`), a ``study.nc``
    of another scale, or a cell on disk computed from anything else (an earlier run at another
    scale, seed or device into the same folder, or by an earlier revision of its method), is an
    error naming it, unless ``overwrite``: then it is computed again and replaced. Its
    ``study.nc`` is rewritten from this scale's cells each run (a rerun at the same scale
    computes only the missing cells).

    Raises
    ------
    uqmetrics.InputError
        See :func:`_task_cells`.
    """
    import xarray as xr

    out = Path(out_dir)
    train = replace(scale.train, device=device)
    methods = (ORACLE, *scale.methods)
    cells = []
    wall = {}
    for c, m, path, config, cell in _task_cells(scale, task, out, device=device, overwrite=overwrite):
        if cell is None:
            if progress:
                print(f"disentangle: {task} c={c} {m}", flush=True)
            cell = run_cell(task, c, m, scale.repetitions, seed=scale.seed, train=train)
            cell.attrs["cell_config"] = config
            cell.attrs["reproduce_scale"] = scale.name
            uqmetrics.write_dataset(cell, path, overwrite=overwrite)  # another configuration's: only if overwrite
            cell = uqmetrics.read_dataset(path)
        wall[f"c{c}_{m}"] = float(cell.attrs.get("wall_time_s", np.nan))
        cells.append(cell[["prediction", "epistemic_variance", "aleatoric_variance"]])
    est = xr.combine_by_coords(cells, combine_attrs="drop")
    data = task_data(task, scale.tasks[task], scale.repetitions, scale.seed)
    raw = xr.merge([est, data], combine_attrs="override").reindex({"method": list(methods)})  # merge sorts the methods
    raw.attrs = dict(data.attrs)
    raw.attrs.update({"title": f"uqreg disentangle study: {task}", "reproduce_scale": scale.name,
                      "train": json.dumps({k: v for k, v in vars(train).items()}, default=str),
                      "wall_time_s": json.dumps(wall), "oracle": ORACLE, "seed": int(scale.seed)})
    ds = scores(raw)
    # this scale's study from this scale's cells (one of another scale was refused above unless overwrite)
    uqmetrics.write_dataset(ds, out / "study.nc", overwrite=True)
    return ds


# -- findings ---------------------------------------------------------------------------------------------


def _ratio_claim(ds, method, part: str, region: str):
    """Geometric mean over repetitions and complexities of the region's mean ratio, whether most
    of those (repetition, complexity) cells lie above 1, and the two-sided sign test's p-value
    (twice :func:`uqmetrics.metrics.stats.sign_test` of the majority side, at most 1)."""
    from uqmetrics.metrics.stats import sign_test

    v = ds[f"log10_{part}_ratio"].sel({"method": method, "region": region}).values.ravel()
    v = v[np.isfinite(v)]
    k_above, n = int((v > 0).sum()), int(v.size)
    above = k_above * 2 >= n
    p = min(1.0, 2 * sign_test(max(k_above, n - k_above), n))
    return 10 ** float(v.mean()) if n else np.nan, above, p, n


def findings(studies: dict) -> list[tuple[str, str, str, str]]:
    """``[(task, method, finding, statistics)]``: per task and method, the ratio of each estimated
    part to its exact value in and out of the box (geometric mean over repetitions and
    complexities; one-sided sign test over those cells of "above" or "below" 1, whichever
    holds in most, doubled: two-sided), the leakage beside the oracle's, and the coverage of the
    two bands beside the oracle's. A claim "above"/"below" 1 is made only where p < 0.05, else
    "not distinguishable from 1": the sample size sets the tolerance, no threshold is tuned."""
    rows = []
    for task, ds in studies.items():
        for m in [str(x) for x in ds.method.values if x != ORACLE]:
            for part in ("aleatoric", "epistemic"):
                for region in REGIONS:
                    g, above, p, n = _ratio_claim(ds, m, part, region)
                    word = ("above" if above else "below") if p < 0.05 else "not distinguishable from"
                    rows.append((task, m, (f"{part} estimate is {g:.2g}× the exact value {_WHERE[region]} "
                                          f"({word} 1)"), f"two-sided sign test p = {p:.2g} over {n} (repetition, complexity) cells"))
            for region in REGIONS:
                s = ds.sel(region=region)
                leak = float(s.epistemic_leakage.sel({"method": m}).mean())
                leak_o = float(s.epistemic_leakage.sel({"method": ORACLE}).mean())
                unt = float(s.estimates_spearman.sel({"method": m}).mean())
                unt_o = float(s.estimates_spearman.sel({"method": ORACLE}).mean())
                rows.append((task, m, (f"leakage {_WHERE[region]}: Spearman(est. epistemic, σ²) = {leak:+.2f} (oracle "
                                      f"{leak_o:+.2f}); untangle's Spearman(estimates) = {unt:+.2f} (oracle "
                                      f"{unt_o:+.2f})"), "mean over repetitions and complexities"))
                ct, cn = (float(s[v].sel({"method": m}).mean()) for v in ("region_truth_coverage", "region_new_coverage"))
                ct_o, cn_o = (float(s[v].sel({"method": ORACLE}).mean())
                              for v in ("region_truth_coverage", "region_new_coverage"))
                rows.append((task, m, (f"coverage {_WHERE[region]}: truth by the epistemic band {ct:.2f} (oracle {ct_o:.2f}), "
                                      f"new targets by the total band {cn:.2f} (oracle {cn_o:.2f})"),
                             f"nominal {1 - ALPHA:.2f}"))
    return rows


def summary_table(studies: dict) -> str:
    """A markdown table per task, method and complexity: the geometric-mean ratios of the two
    parts in / out of the box, the Spearman of each estimate with its truth, the leakage, the
    estimates' Spearman and the two coverages (means over repetitions)."""
    lines = [("| task | method | c | aleatoric ratio in / out | epistemic ratio in / out | ρ(ale, σ²) in / out | "
             "ρ(epi, exact) in / out | leakage ρ(epi, σ²) in / out | ρ(epi, ale) in / out | truth cov. in / out | "
             "new cov. in / out |"), "|---|---|---|---|---|---|---|---|---|---|---|"]
    for task, ds in studies.items():
        for m in ds.method.values:
            for c in ds.complexity.values:
                s = ds.sel({"method": m, "complexity": c})

                def pair(name, fmt="{:.2f}", log=False, s=s):
                    vals = [float(s[name].sel(region=r).mean()) for r in REGIONS]
                    return " / ".join(fmt.format(10**v if log else v) for v in vals)

                lines.append(f"| {task} | {m} | {int(c)} | {pair('log10_aleatoric_ratio', '{:.2g}', True)} | "
                             f"{pair('log10_epistemic_ratio', '{:.2g}', True)} | {pair('aleatoric_spearman')} | "
                             f"{pair('epistemic_spearman')} | {pair('epistemic_leakage')} | "
                             f"{pair('estimates_spearman')} | {pair('region_truth_coverage')} | "
                             f"{pair('region_new_coverage')} |")
    return "\n".join(lines)


def reproduce_disentangle(out_dir, *, scale: str = "cpu", device: str = "cpu", progress: bool = True,
                          overwrite: bool = False) -> list[Path]:
    """``uqreg reproduce disentangle``: run (or resume) every task of the scale, draw the figures
    (:func:`uqreg.plots.plot_variances`, :func:`uqreg.plots.plot_leakage`) and write
    ``findings.md`` (:func:`summary_table` and :func:`findings`, atomically). Returns the paths
    written.

    Raises
    ------
    uqmetrics.InputError
        Before any work, without ``overwrite``: a task's ``study.nc`` or a cell file there is of
        another scale or configuration (:func:`run_task`).
    """
    import matplotlib.pyplot as plt
    from uqmetrics.report.plotting import save_figure
    from uqmetrics.runs.io import write_text_file

    from .plots import plot_leakage, plot_variances

    sc = SCALES.lookup(scale)
    out = Path(out_dir)
    t0 = time.perf_counter()
    for task in sc.tasks:  # every task's files checked before any work
        for *_, cell in _task_cells(sc, task, out / task, device=device, overwrite=overwrite):
            if cell is not None:
                cell.close()
    studies = {task: run_task(sc, task, out / task, device=device, progress=progress, overwrite=overwrite)
               for task in sc.tasks}
    paths = [out / task / "study.nc" for task in sc.tasks]
    figs = out / "figures"
    for task, ds in studies.items():
        for name, fig in ((f"disentangle_{task}_variances", plot_variances(ds)),
                          (f"disentangle_{task}_leakage", plot_leakage(ds))):
            paths.append(save_figure(fig, figs / f"{name}.png"))
            plt.close(fig)
    text = [f"# Disentanglement study, scale {scale}", "", (f"wall time of this run {time.perf_counter() - t0:.0f} s "
            "(cells resumed from disk cost nothing)"), "", summary_table(studies), "", "## Findings", "",
            "| task | method | finding | statistics |", "|---|---|---|---|"]
    text += [f"| {' | '.join(row)} |" for row in findings(studies)]
    target = write_text_file(out / "findings.md", "\n".join(text) + "\n", overwrite=True)  # atomic
    paths.append(target)
    return paths


__all__ = ["MV_METHODS", "ORACLE", "POINT_SCORES", "REGION_SCORES", "SCALES", "TASKS", "DisentangleScale",
           "findings", "reproduce_disentangle", "run_cell", "run_task", "score_arrays", "scores", "spearman",
           "summary_table", "task_data"]
