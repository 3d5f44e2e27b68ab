"""The repeated-retrain coverage study (R.4): task × complexity × method × repetition.

:func:`run_study` trains every method on k noise draws per complexity level and returns ONE
:class:`xarray.Dataset` holding

* raw results ``prediction``, ``uncertainty`` over ``(method, complexity, repetition, point)``
  and ``truth`` over ``(complexity, point)``, with the test inputs ``x_test`` and their plot
  coordinates;
* everything needed to recompute the reference from the file alone: ``x_train``, every
  repetition's ``y_train``, ``gamma``, ``sigma``, the task name;
* the exact ``reference_uncertainty`` and the derived summary of
  :func:`uqmetrics.coverage_summary` (coverage with Wilson/Clopper–Pearson bounds and the
  paper's bars, mean deviation and uncertainty with standard errors, the ratio to the reference,
  in-/out-of-distribution summaries);
* provenance attrs (config, seeds, versions, device, wall time per method).

Arrays whose size changes with the complexity (test inputs of growing dimension, training sets
of growing size) are NaN-padded along ``input_dim`` / ``train_point``; ``n_train`` and
``input_size`` give the valid extents.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import uqmetrics
import xarray as xr
from tqdm.auto import tqdm

from .engine import TrainConfig
from .methods import get_method, list_methods
from .reference import reference_prediction
from .tasks import TaskInstance, get_task

RAW_VARS = ("prediction", "uncertainty")


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
    repetitions : int
        Number k of noise redraws / retrainings per cell.
    first_repetition : int
        Index of the first repetition (a sweep cell runs a slice of repetitions).
    seed : int
        Task seed (γ, training inputs, noise, initialisations ... all derive from it).
    n_train, sigma : optional
        Overrides of the task's training-set size and noise level.
    train : TrainConfig
        Network/optimiser/method hyper-parameters.
    """

    task: str = "sinusoid"
    complexities: tuple[int, ...] | None = None
    methods: tuple[str, ...] | None = None
    repetitions: int = 50
    first_repetition: int = 0
    seed: int = 0
    n_train: int | None = None
    sigma: float | None = None
    train: TrainConfig = field(default_factory=TrainConfig)

    def resolved(self) -> StudyConfig:
        """Fill defaults and validate every field (raises ValueError before any training)."""
        task = get_task(self.task)
        levels = task.default_complexities if self.complexities is None else self.complexities
        comps = tuple(int(c) for c in levels)
        methods = tuple(list_methods() if self.methods is None else self.methods)
        if not methods:
            raise ValueError("methods must name at least one method (None means all)")
        for m in methods:
            get_method(m)
        if len(set(methods)) != len(methods):
            raise ValueError(f"methods must not repeat, got {list(methods)}")
        if isinstance(self.repetitions, bool) or int(self.repetitions) != self.repetitions or self.repetitions < 1:
            raise ValueError(f"repetitions must be an integer >= 1, got {self.repetitions!r}")
        if self.first_repetition < 0:
            raise ValueError(f"first_repetition must be >= 0, got {self.first_repetition!r}")
        if not comps or any(c < 1 for c in comps):
            raise ValueError(f"complexities must be integers >= 1, got {list(comps)}")
        cfg = replace(self, complexities=comps, methods=methods)
        for c in comps:  # validates n_train >= p, sigma > 0, complexity
            cfg.instance(c)
        return cfg

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
        for k in ("complexities", "methods"):
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


def run_raw(config: StudyConfig, *, progress: bool = True) -> xr.Dataset:
    """Train and predict every (complexity, method) of ``config``: the raw dataset, no summary.

    Returns
    -------
    xarray.Dataset
        ``prediction``, ``uncertainty`` (method, complexity, repetition, point) and the task data
        (see the module docstring). Attr ``wall_time_s`` maps method to seconds.
    """
    cfg = config.resolved()
    reps = cfg.repetition_index
    instances = [cfg.instance(c) for c in cfg.complexities]
    n_points = {inst.x_test.shape[0] for inst in instances}
    if len(n_points) != 1:
        raise ValueError(f"task {cfg.task!r} has a varying number of test points across complexities: {n_points}")
    methods = [get_method(m) for m in cfg.methods]
    total = sum(m.n_epochs_total(inst, cfg.train, len(reps)) for inst in instances for m in methods)
    bar = tqdm(total=total, desc=f"{cfg.task} study", unit="epoch", disable=not progress, leave=False)
    wall = {m.name: 0.0 for m in methods}
    pred = np.full((len(methods), len(instances), len(reps), n_points.pop()), np.nan)
    unc = np.full_like(pred, np.nan)
    ys = []
    for j, inst in enumerate(instances):
        y = inst.targets(reps)
        ys.append(y)
        for i, method in enumerate(methods):
            bar.set_postfix_str(f"{inst.task.complexity_name}={inst.complexity} {method.name}")
            t0 = time.perf_counter()
            pred[i, j], unc[i, j] = method.run(inst, y, reps, cfg.train, progress=bar.update)
            wall[method.name] += time.perf_counter() - t0
    bar.close()
    return _assemble(cfg, instances, ys, pred, unc, wall)


def _assemble(cfg, instances, ys, pred, unc, wall) -> xr.Dataset:
    task = get_task(cfg.task)
    reps = cfg.repetition_index
    first = instances[0]
    coords = {
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
    ds = xr.Dataset(
        {
            "prediction": (("method", "complexity", "repetition", "point"), pred),
            "uncertainty": (("method", "complexity", "repetition", "point"), unc),
            "truth": (("complexity", "point"), np.stack([i.f_test for i in instances])),
            "reference_uncertainty": (("complexity", "point"), ref_std),
            "in_distribution": (("complexity", "point"), np.stack([i.in_distribution for i in instances])),
            "x_test": (("complexity", "point", "input_dim"), _pad([i.x_test for i in instances])),
            "x_train": (("complexity", "train_point", "input_dim"), _pad([i.x_train for i in instances])),
            "y_train": (("complexity", "repetition", "train_point"), _pad(ys)),
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
            "wall_time_s": json.dumps(wall),
            "device": cfg.train.device,
        },
    )
    ds["prediction"].attrs["long_name"] = "predicted mean at the test point"
    ds["uncertainty"].attrs["long_name"] = "predicted epistemic standard deviation"
    ds["truth"].attrs["long_name"] = "noise-free ground truth G(x)ᵀγ"
    return ds


def summarize(raw: xr.Dataset) -> xr.Dataset:
    """Add the derived coverage summary (per complexity, with in/out regions) to a raw dataset."""
    summary = uqmetrics.coverage_summary(
        raw[["prediction", "uncertainty", "truth"]],
        reference=raw["reference_uncertainty"],
        regions=raw["in_distribution"].astype(bool),
        region_dims="point",
    )
    derived = {k: v for k, v in summary.data_vars.items() if k not in raw.data_vars}
    out = raw.assign(derived)
    out.attrs.update({k: v for k, v in summary.attrs.items() if k not in raw.attrs})
    return out


def run_study(config: StudyConfig, *, progress: bool = True) -> xr.Dataset:
    """Run a coverage study: :func:`run_raw` then :func:`summarize`, with provenance attrs."""
    cfg = config.resolved()
    t0 = time.perf_counter()
    ds = summarize(run_raw(cfg, progress=progress))
    ds.attrs.update(uqmetrics.provenance_attrs(config=cfg.to_dict(), seed=cfg.seed,
                                               extra={"study_wall_time_s": time.perf_counter() - t0}))
    return ds


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
    post = fit_reference(task.feature_map(x_train, int(complexity)), sub.y_train.values[:, :n], float(ds.attrs["sigma"]))
    return post.predict(task.feature_map(x_test, int(complexity)))
