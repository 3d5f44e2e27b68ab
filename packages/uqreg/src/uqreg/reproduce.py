"""Reproduce the paper's Figures 1–7 and the recipe sensitivity (``uqreg reproduce``).

Runs the three experiments as resumable sweeps (E.1 sinusoid, E.2 Styblinski–Tang, E.3 2-D
polynomial) at a chosen scale and draws the figures from the combined study files; the
recipe-sensitivity studies ``recipes_e1`` (E.1, f_main 1–3) and ``recipes_e3`` (E.3) run every
method under every registered recipe (docs/conventions.md#r-3b), and :func:`findings_table`
tells which of the paper's findings (docs/conventions.md#r-4) hold under which recipe:

===========  ===========================================================================
figure       content
===========  ===========================================================================
fig1         E.1, f_main = 1: prediction ± z·std of BLR, BD, VD, EnsBS
fig2         E.1, f_main = 5 (or the largest run): the same
fig3         E.1: deviation, uncertainty, coverage vs f_main at x = −2.38, 1.2, −5.11
fig4         E.2, d = 2: prediction bands along the diagonal
fig5         E.2, d = 4 (or the largest run): the same
fig6         E.2: deviation, uncertainty, coverage vs d at λ = 0.5996, 0.074
fig7         E.3: log10 deviation, log10 uncertainty, coverage maps of BLR, BD, EnsBS
===========  ===========================================================================

Scales (registered in :data:`SCALES`): ``paper`` uses the presets ``paper-e1/e2/e3`` (120
members, 200 MC passes, 50/50/30 repetitions, f_main 1–10, d 1–4); ``cpu`` is what two CPU cores
finish in about an hour or two; ``smoke`` takes seconds (tests).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import uqmetrics
from uqmetrics.metrics.registry import Registry
from uqmetrics.runs.io import write_text_file

from .engine import RECIPES, TrainConfig
from .engine.config import cuda_plan_defaults, is_int
from .presets import PRESETS
from .study import StudyConfig, record_identity, reproduce_identity, reproduced_study

BAND_METHODS = ("blr", "bd", "vd", "ens_bs")
MAP_METHODS = ("blr", "bd", "ens_bs")

_CPU_TRAIN = TrainConfig(members=20, mc_samples=100)
_CPU_TRAIN_SMALL = TrainConfig(members=8, mc_samples=100)
_SMOKE_TRAIN = TrainConfig(members=3, epochs=5, mc_samples=5)
#: The recipes of the sensitivity studies (every registered one).
SENSITIVITY_RECIPES = tuple(RECIPES.names())


@dataclass(frozen=True)
class Scale:
    """A named set of study configurations, one per experiment."""

    name: str
    description: str
    studies: dict


#: The experiments, in the order they run.
EXPERIMENTS = ("e1", "e2", "e3", "recipes_e1", "recipes_e3")

SCALES: Registry[Scale] = Registry("scale")
SCALES.register(Scale("paper", "the paper's sizes (presets paper-e1/e2/e3); a GPU or a cluster", {
    "e1": PRESETS.lookup("paper-e1").config, "e2": PRESETS.lookup("paper-e2").config,
    "e3": PRESETS.lookup("paper-e3").config,
    "recipes_e1": replace(PRESETS.lookup("paper-e1").config, complexities=(1, 2, 3), recipes=SENSITIVITY_RECIPES),
    "recipes_e3": replace(PRESETS.lookup("paper-e3").config, recipes=SENSITIVITY_RECIPES),
}))
SCALES.register(Scale("cpu", "reduced repetitions, members and levels: hours on two CPU cores", {
    "e1": StudyConfig(task="sinusoid", complexities=(1, 2, 3, 4, 5), repetitions=10, train=_CPU_TRAIN),
    "e2": StudyConfig(task="styblinski_tang", complexities=(1, 2), repetitions=6, train=_CPU_TRAIN_SMALL),
    "e3": StudyConfig(task="polynomial", complexities=(2,), repetitions=6, train=_CPU_TRAIN_SMALL),
    "recipes_e1": StudyConfig(task="sinusoid", complexities=(1, 2, 3), repetitions=10, recipes=SENSITIVITY_RECIPES,
                              train=_CPU_TRAIN),
    "recipes_e3": StudyConfig(task="polynomial", complexities=(2,), repetitions=6, recipes=SENSITIVITY_RECIPES,
                              train=_CPU_TRAIN_SMALL),
}))
SCALES.register(Scale("smoke", "seconds: for tests of this module", {
    "e1": StudyConfig(task="sinusoid", complexities=(1, 2), methods=BAND_METHODS, repetitions=2, train=_SMOKE_TRAIN),
    "e2": StudyConfig(task="styblinski_tang", complexities=(1, 2), methods=BAND_METHODS, repetitions=2,
                      train=_SMOKE_TRAIN),
    "e3": StudyConfig(task="polynomial", complexities=(2,), methods=MAP_METHODS, repetitions=2, train=_SMOKE_TRAIN),
    "recipes_e1": StudyConfig(task="sinusoid", complexities=(1, 2), methods=("blr", "bd", "ens_bs"), repetitions=2,
                              recipes=("paper", "none"), train=_SMOKE_TRAIN),
    "recipes_e3": StudyConfig(task="polynomial", complexities=(2,), methods=("blr", "ens"), repetitions=2,
                              recipes=("paper", "none"), train=_SMOKE_TRAIN),
}))


@dataclass(frozen=True)
class Reproduction:
    """A reproduction beside the paper's, ``uqreg reproduce NAME``: ``run(out_dir, scale=, device=,
    progress=, overwrite=)`` writes into ``out_dir/<folder>`` and returns the paths written
    (``overwrite``: replace results of another scale there, :func:`uqreg.study.reproduced_study`)."""

    name: str
    description: str
    folder: str
    run: object

    def __call__(self, out_dir, *, scale: str, device: str = "cpu", progress: bool = True,
                 overwrite: bool = False) -> list[Path]:
        return self.run(Path(out_dir) / self.folder, scale=scale, device=device, progress=progress,
                        overwrite=overwrite)


def _disentangle(out, **kw):
    from .disentangle import reproduce_disentangle  # torch: imported on use

    return reproduce_disentangle(out, **kw)


def _real(out, **kw):
    from .real import reproduce_real  # torch: imported on use

    return reproduce_real(out, **kw)


#: The reproductions beside the paper's (``uqreg reproduce disentangle|real``).
STUDIES: Registry[Reproduction] = Registry("reproduction")
STUDIES.register(Reproduction("disentangle", "the mean-variance methods' aleatoric and epistemic variances against "
                              "their exact values on the heteroscedastic tasks (R.7)", "disentangle", _disentangle))
STUDIES.register(Reproduction("real", "every method on scikit-learn's diabetes data under random and gap splits: "
                              "scores before and after recalibration, coverage of held-out targets (R.9); scales "
                              "cpu and smoke", "real", _real))


class SweepFailed(RuntimeError):
    """Cells of an experiment's sweep failed: not a user's mistake (``uqreg reproduce`` reports it
    on one line with exit code 1, like ``uqreg sweep``); the finished cells are kept and a rerun
    retries only the failed ones.

    Attributes
    ----------
    experiment : str
    failed : dict
        Cell key to its one-line error.
    """

    def __init__(self, experiment: str, failed: dict):
        self.experiment, self.failed = experiment, dict(failed)
        cells = "; ".join(f"{key}: {' '.join(str(err).split())}" for key, err in self.failed.items())
        super().__init__(f"{experiment}: {len(self.failed)} cell(s) failed ({cells}); rerun the same command to "
                         f"retry them (finished cells are kept)")


def _nearest(values, target):
    values = [int(v) for v in values]
    return target if target in values else max(values)


def draw_figures(e1, e2, e3, out_dir) -> list[Path]:
    """Figures 1–7 from the three study datasets (any may be None: its figures are skipped)."""
    import matplotlib.pyplot as plt  # figures: imported on use (uqreg reproduce -h needs none)
    from uqmetrics.report.plotting import save_figure

    from .plots import plot_bands, plot_coverage_map, plot_probes

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs = {}
    if e1 is not None:
        m = [x for x in BAND_METHODS if x in e1.method.values]
        for fig, target in (("fig1", 1), ("fig2", 5)):  # the largest level run stands in for 5
            c = _nearest(e1.complexity.values, target)
            figs[f"{fig}_e1_bands_fmain{c}"] = plot_bands(e1, c, methods=m)
        figs["fig3_e1_vs_fmain"] = plot_probes(e1)
    if e2 is not None:
        m = [x for x in BAND_METHODS if x in e2.method.values]
        for fig, target in (("fig4", 2), ("fig5", 4)):  # the largest dimension run stands in for 4
            d = _nearest(e2.complexity.values, target)
            if fig == "fig5" and d == _nearest(e2.complexity.values, 2):
                continue  # nothing beyond Figure 4 was run
            figs[f"{fig}_e2_bands_d{d}"] = plot_bands(e2, d, methods=m)
        figs["fig6_e2_vs_d"] = plot_probes(e2)
    if e3 is not None:
        figs["fig7_e3_coverage_map"] = plot_coverage_map(e3, methods=[x for x in MAP_METHODS if x in e3.method.values])
    paths = []
    for name, fig in figs.items():
        paths.append(save_figure(fig, out / f"{name}.png"))
        plt.close(fig)
    return paths


def coverage_table(ds, *, points: dict | None = None, recipe=None) -> str:
    """A markdown table of coverage per method (rows) and complexity (columns): in/out region
    averages and, when given, named probe points ``{label: point index}``; one recipe (default
    the first)."""
    if "recipe" in ds.dims:
        ds = ds.sel(recipe=ds.recipe.values[0] if recipe is None else recipe)
    cname = ds.attrs.get("complexity_name", "complexity")
    head = "| method | " + " | ".join(f"{cname}={c}" for c in ds.complexity.values) + " |"
    lines = [head, "|" + "---|" * (len(ds.complexity) + 1)]
    for m in ds.method.values:
        cells = []
        for c in ds.complexity.values:
            sel = {"method": m, "complexity": c}
            parts = [f"{float(ds.region_coverage.sel({**sel, 'region': r})):.2f}" for r in ("in", "out")]
            if points:
                parts += [f"{float(ds.coverage.sel({**sel, 'point': p})):.2f}" for p in points.values()]
            cells.append(" / ".join(parts))
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def recipe_table(ds) -> str:
    """A markdown table per recipe and method: in/out coverage, collapsed fraction and R² of the
    fit, each at every complexity (``a / b / c``; equal values once)."""
    cname = ds.attrs.get("complexity_name", "complexity")
    span = f"{cname} = " + " / ".join(str(c) for c in ds.complexity.values)
    lines = [f"| recipe | method | coverage in ({span}) | coverage out | collapsed | R² of the fit |",
             "|---|---|---|---|---|---|"]

    def fmt(values, pct=False):
        vals = [f"{v:.0%}" if pct else f"{v:.2f}" for v in np.atleast_1d(values)]
        return vals[0] if len(set(vals)) == 1 else " / ".join(vals)

    for r in ds.recipe.values:
        for m in ds.method.values:
            s = ds.sel({"recipe": r, "method": m})
            lines.append(f"| {r} | {m} | {fmt(s.region_coverage.sel(region='in').values)} | "
                         f"{fmt(s.region_coverage.sel(region='out').values)} | "
                         f"{fmt(s.collapsed_fraction.mean('repetition').values, pct=True)} | "
                         f"{fmt(s.fit_r2.mean('repetition').values)} |")
    return "\n".join(lines)


DROPOUT = ("bd", "cd", "vd")
ROBUST_ENSEMBLES = ("ens_adv", "ens_bs")
#: "near 0.95": within this distance (the paper's plots put "near" at roughly this spread)
NEAR = 0.10


def _findings_e1(s) -> dict[str, tuple[bool, str]]:
    """R.4's E.1 findings on one recipe of a sinusoid study ``s`` (no recipe dim)."""
    def cov(m, region="in"):
        return s.region_coverage.sel({"method": m, "region": region}).values

    def se(m, region="in"):
        return s.region_coverage_se.sel({"method": m, "region": region}).values

    deep = [m for m in s.method.values if m != "blr" and "+" not in str(m)]  # conformal versions are not findings
    out = {}
    if "blr" in s.method.values:
        ok = bool(np.all(np.abs(cov("blr") - 0.95) <= 2 * se("blr") + 1e-12))
        out["reference covers 0.95 at every complexity (E.1)"] = (ok, f"blr {cov('blr').min():.2f}–{cov('blr').max():.2f}")
    drop = [m for m in DROPOUT if m in s.method.values]
    if drop:
        under = all(np.all(cov(m) < 0.95 - 2 * se(m)) for m in drop)
        trend = float(np.mean([cov(m)[-1] - cov(m)[0] for m in drop]))
        ok = under and (len(s.complexity) < 2 or trend < 0)
        lo, hi = min(cov(m).min() for m in drop), max(cov(m).max() for m in drop)
        out["dropout variants under-cover, increasingly with complexity (E.1)"] = (
            ok, f"{'/'.join(drop)} {lo:.2f}–{hi:.2f}, change first→last {trend:+.2f}")
    rob = [m for m in ROBUST_ENSEMBLES if m in s.method.values]
    if rob:
        low = min(cov(m).min() for m in rob)
        out[f"adversarial and bootstrap ensembles cover near (±{NEAR}) or above 0.95 (E.1)"] = (
            low >= 0.95 - NEAR, f"{'/'.join(rob)} min {low:.2f}")
    if deep:
        first = [float(cov(m)[0]) for m in deep]
        n_ok = sum(c >= 0.95 - NEAR for c in first)
        out["in distribution nearly all methods cover (E.1, Figs. 1–2, lowest f_main)"] = (
            n_ok >= len(deep) - 1, f"{n_ok} of {len(deep)} deep methods ≥ {0.95 - NEAR:.2f}")
        worst = max(float(np.max(cov(m, "out"))) for m in deep)
        out["out of distribution every deep method under-covers (E.1)"] = (
            all(np.all(cov(m, "out") < 0.95 - 2 * se(m, "out")) for m in deep), f"max {worst:.2f}")
        out.update(_diagnostics(s, deep, "E.1"))
    return out


def _diagnostics(s, deep: list, label: str) -> dict[str, tuple[bool, str]]:
    """The preconditions the findings rest on (R.3b): at no complexity are most deep networks
    collapsed, and the deep methods fit the truth in distribution (mean R² > 0.5)."""
    frac = s.collapsed_fraction.sel({"method": deep}).mean(("method", "repetition"))
    r2 = float(s.fit_r2.sel({"method": deep}).mean())
    return {
        f"(diagnostic) at every complexity most deep networks are not collapsed ({label})": (
            bool(frac.max() < 0.5), f"collapsed {float(frac.min()):.0%}–{float(frac.max()):.0%} per level"),
        f"(diagnostic) the deep methods fit the truth in distribution, mean R² > 0.5 ({label})": (
            r2 > 0.5, f"mean R² {r2:.2f}"),
    }


def _findings_e3(s) -> dict[str, tuple[bool, str]]:
    """R.4's E.3 findings on one recipe of a polynomial study ``s`` (no recipe dim)."""
    def cov(m, region):
        return float(s.region_coverage.sel({"method": m, "region": region}).mean())

    deep = [m for m in s.method.values if m != "blr" and "+" not in str(m)]  # conformal versions are not findings
    out = {}
    if "ens_bs" in s.method.values:
        cin, cout = cov("ens_bs", "in"), cov("ens_bs", "out")
        out["EnsBS covers near 0.95 in distribution and falls well below it outside (E.3)"] = (
            cin >= 0.95 - NEAR and cout < 0.95 - 2 * NEAR, f"in {cin:.2f}, out {cout:.2f}")
    if deep:
        worst = max(cov(m, "out") for m in deep)
        out["out of distribution every deep method under-covers (E.3)"] = (worst < 0.95 - NEAR, f"max {worst:.2f}")
        out.update(_diagnostics(s, deep, "E.3"))
    return out


def findings(e1=None, e3=None) -> dict[str, dict[str, tuple[bool, str]]]:
    """``{finding: {recipe: (holds, evidence)}}`` for the paper's findings
    (docs/conventions.md#r-4) on an E.1 (sinusoid) and an E.3 (polynomial) study, per recipe of
    each. The thresholds are stated in each finding; "near" means within :data:`NEAR`;
    "under-covers" means below 0.95 by more than two standard errors of the region coverage."""
    table: dict[str, dict[str, tuple[bool, str]]] = {}
    for ds, judge in ((e1, _findings_e1), (e3, _findings_e3)):
        if ds is None:
            continue
        for r in (ds.recipe.values if "recipe" in ds.dims else [None]):
            sub = ds if r is None else ds.sel(recipe=r)
            for name, verdict in judge(sub).items():
                table.setdefault(name, {})[str(r)] = verdict
    return table


def findings_table(e1=None, e3=None) -> str:
    """:func:`findings` as a markdown table: one row per finding, one column per recipe."""
    table = findings(e1, e3)
    recipes = list(dict.fromkeys(r for row in table.values() for r in row))
    lines = ["| finding (docs/conventions.md#r-4) | " + " | ".join(recipes) + " |",
             "|---|" + "---|" * len(recipes)]
    for name, row in table.items():
        cells = [f"{'**holds**' if row[r][0] else 'fails'}: {row[r][1]}" if r in row else "–" for r in recipes]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def draw_recipe_figures(studies: dict, out_dir) -> list[Path]:
    """One recipe-comparison figure per sensitivity study (:func:`uqreg.plots.plot_recipes`)."""
    import matplotlib.pyplot as plt  # figures: imported on use (uqreg reproduce -h needs none)
    from uqmetrics.report.plotting import save_figure

    from .plots import plot_recipes

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, ds in studies.items():
        if ds is None:
            continue
        fig = plot_recipes(ds)
        paths.append(save_figure(fig, out / f"fig_{name}.png"))
        plt.close(fig)
    return paths


def reproduce(out_dir, *, scale: str = "cpu", experiments=EXPERIMENTS, device: str = "cpu",
              scheduler: str | None = None, n_workers: int = 2, chunk_repetitions: int = 5,
              progress: bool = True, overwrite: bool = False) -> list[Path]:
    """Run (or resume) the sweeps of ``experiments`` at ``scale``; draw Figures 1–7 and the
    recipe figures, and write ``findings.md`` (:func:`findings_table` and :func:`recipe_table`).

    Each experiment's combined study is written to ``out_dir/<exp>/study.nc``; an existing
    combined file of the same scale and configuration (device included, and its methods'
    revisions: :func:`uqreg.study.reproduce_identity`) is reused as it is (one of another scale
    or configuration is an error, or replaced under ``overwrite``: :func:`uqreg.study.reproduced_study`).

    Raises
    ------
    ValueError
        Before any work, for unknown or no experiments, an unknown scale, ``n_workers`` or
        ``chunk_repetitions`` below 1.
    uqmetrics.InputError
        Before any work, when an experiment's ``study.nc`` is there from another scale or
        configuration.
    SweepFailed
        When cells of an experiment failed (the finished cells are kept; rerun to retry).
    """
    from .sweep import (  # Dask: imported on use (uqreg reproduce -h needs none)
        run_study_sweep,
        sweep_config,
    )

    studies = SCALES.lookup(scale).studies
    experiments = tuple(experiments)
    unknown = set(experiments) - set(EXPERIMENTS)
    if unknown or not experiments:
        raise ValueError(f"experiments must be among {', '.join(EXPERIMENTS)}, got "
                         f"{sorted(unknown) if unknown else 'none'}")
    for name, value in (("n_workers", n_workers), ("chunk_repetitions", chunk_repetitions)):
        if (scheduler is None or name != "n_workers") and (not is_int(value) or value < 1):
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    out = Path(out_dir)
    configs = {exp: replace(studies[exp], train=cuda_plan_defaults(replace(studies[exp].train, device=device)))
               for exp in experiments}  # auto plan on CUDA
    identity = {exp: reproduce_identity(sweep_config(cfg)) for exp, cfg in configs.items()}
    # the studies already there, of this scale and configuration (another's: refused before any work)
    results = {exp: ds for exp in experiments if (out / exp / "study.nc").exists()
               and (ds := reproduced_study(out / exp / "study.nc", scale, overwrite=overwrite,
                                           identity=identity[exp])) is not None}
    for exp in EXPERIMENTS:
        if exp not in experiments:
            results[exp] = None
            continue
        target = out / exp / "study.nc"
        if exp in results:
            continue
        ds, report = run_study_sweep(configs[exp], out / exp, chunk_repetitions=chunk_repetitions,
                                     scheduler=scheduler, n_workers=n_workers, progress=progress)
        if ds is None:
            raise SweepFailed(exp, report.failed)
        ds.attrs["reproduce_scale"] = scale
        record_identity(ds, identity[exp])
        uqmetrics.write_dataset(ds, target, overwrite=overwrite)  # another scale's: refused above unless overwrite
        results[exp] = ds
    paths = draw_figures(results["e1"], results["e2"], results["e3"], out / "figures")
    sensitivity = {k: results[k] for k in ("recipes_e1", "recipes_e3")}
    paths += draw_recipe_figures(sensitivity, out / "figures")
    if any(v is not None for v in sensitivity.values()):
        text = ["# Which of the paper's findings hold under which recipe", "",
                findings_table(sensitivity["recipes_e1"], sensitivity["recipes_e3"]), ""]
        for name, ds in sensitivity.items():
            if ds is not None:
                text += [f"## {name}", "", recipe_table(ds), ""]
        target = write_text_file(out / "findings.md", "\n".join(text), overwrite=True)  # atomic
        paths.append(target)
    return paths
