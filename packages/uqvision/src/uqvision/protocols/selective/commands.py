"""The selective protocol's parts of the command line (moved here from :mod:`uqvision.cli`, which
names no protocol):

- ``uqvision metadata``: the model-metadata tables (:func:`run_metadata`,
  :func:`metadata_arguments`);
- its scoring of ``uqvision sweep``: the scores, figures and results table of a zoo
  (:data:`SWEEP_SCORING`, :func:`sweep_scores_file`);
- the figures of ``uqvision plot --selective`` (:func:`draw_figures`) and the results table of
  ``uqvision score selective`` (:func:`results_of`).

Every function imports what it runs when called: importing this module (the protocol's
registration does) loads no scoring, plotting or metadata code (``tests/test_import.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path

from uqmetrics import InputError, read_dataset, write_dataset

from ...options import check_output_file
from ..base import SweepPlan, SweepScoring, check_protocol_file, option_input_error

__all__ = ["SWEEP_SCORING", "draw_figures", "metadata_arguments", "plan_sweep", "results_of",
           "run_metadata", "sweep_scores_file"]


def _say(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------------------------
# uqvision metadata


def run_metadata(a: argparse.Namespace) -> int:
    """``uqvision metadata``: the table's columns, the models the tables know, or the unknown
    models of caches, score files, zoos or patterns (with ``--template``, a table to fill in)."""
    from .metadata import (  # tables: imported on use (start-up time)
        COLUMNS,
        METADATA_FIELDS,
        ModelMetadata,
        load_metadata,
        unknown_models,
        write_metadata,
    )

    if a.fields:
        _say(",".join(COLUMNS))
        _say(METADATA_FIELDS.describe())
        return 0
    try:
        tables = load_metadata(a.metadata or ())
    except (OSError, ValueError) as exc:  # an extra table: named with --metadata
        named = option_input_error(exc, {"--metadata": a.metadata or []})
        if named is None:
            raise
        raise named from None
    keys = _model_keys(a)
    named = _named_model_keys(a)  # --zoo / --models: rows filled from timm's pretrained cfgs
    if keys is None and named is None:
        for key in sorted(tables.rows):
            _say(key)
        return 0
    unknown = unknown_models((keys or []) + (named or []), tables)
    if a.template:
        from .metadata import template_metadata

        check_output_file("--template", a.template, a.overwrite)
        to_fill = [k for k in unknown if k in set(named or ())]
        filled = {r.key: r for r in (template_metadata(to_fill, progress=True) if to_fill
                                     else ())}
        _say(str(write_metadata([filled.get(k) or ModelMetadata(k) for k in unknown],
                                a.template)))
    for key in unknown:
        _say(key)
    if unknown:
        print(f"{len(unknown)} of {len(set((keys or []) + (named or [])))} models have no "
              "metadata; fill in a copy of --template FILE and pass it with --metadata FILE (or "
              "list it in $UQVISION_MODEL_METADATA)", file=sys.stderr)
    return 0


def _named_model_keys(a: argparse.Namespace) -> list[str] | None:
    """Metadata keys of the models of --zoo / --models (None when neither is given)."""
    if not (a.zoo or a.models):
        return None
    from ...sweep import expand_models
    from ...zoo import zoo_models
    from .metadata import model_metadata_key

    try:
        names = zoo_models(a.zoo or ())
    except ValueError as exc:
        raise InputError(f"--zoo: {exc}") from None
    names += [s.name for s in expand_models(a.models or ())]
    return list(dict.fromkeys(model_metadata_key(n) for n in names))


def _model_keys(a: argparse.Namespace) -> list[str] | None:
    """Metadata keys of the models in --caches / --scores (None when neither is given)."""
    if not (a.caches or a.scores):
        return None
    from uqmetrics.runs.io import open_netcdf

    from ...cache import check_caches, index_caches
    from .score import cache_metadata_key  # scoring: imported on use

    # every file given is read: one that is not a prediction cache (or a selective score
    # file) is refused, named, before any output
    files = check_caches("--caches", a.caches, every=True)[0] if a.caches else []
    for path in a.scores or ():
        check_protocol_file("--scores", path, "selective")
    keys = []
    for info in index_caches(files):
        with open_netcdf(info.path) as ds:  # the attrs only
            keys.append(cache_metadata_key(dict(ds.attrs)))
    for path in a.scores or ():
        scores = read_dataset(path)
        if "metadata_key" not in scores.coords and "metadata_key" not in scores.data_vars:
            raise InputError(f"--scores {path!r} has no metadata_key (written before model "
                             "metadata were recorded: score its caches again, or give them "
                             "as --caches)")
        keys += [str(k) for k in scores["metadata_key"].values]
    return keys


def metadata_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``uqvision metadata``."""
    p.add_argument("--fields", action="store_true", help="describe the table's columns")
    p.add_argument("--caches", nargs="+", default=None, help="list the models of these caches "
                   "that no table knows")
    p.add_argument("--scores", nargs="+", default=None,
                   help="... or of these selective score files")
    p.add_argument("--metadata", action="append", default=None, metavar="FILE",
                   help="extra table (repeatable), read after the shipped one and "
                        "$UQVISION_MODEL_METADATA")
    p.add_argument("--zoo", action="append", default=None, metavar="NAME",
                   help="... or of these zoos (repeatable; uqvision sweep --list-zoos)")
    p.add_argument("--models", nargs="+", default=None, metavar="PATTERN",
                   help="... or of these models (names or wildcards, as uqvision sweep)")
    p.add_argument("--template", default=None, metavar="FILE",
                   help="write the unknown models as a table to fill in: models of --zoo/"
                        "--models get the parameters, input size (crop and interpolation in "
                        "notes) and pre-training data their timm config and tag say, every "
                        "other cell 'unknown'; models of --caches/--scores 'unknown' rows")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --template")


# --------------------------------------------------------------------------------------------
# uqvision sweep


def sweep_scores_file(out: Path, dataset: str, overwrite: bool) -> Path:
    """``<out>/scores/selective-<dataset>.nc``: one score file per dataset, so that a second
    dataset swept into the same ``--out`` replaces nothing. An existing file there that is not
    the selective scores of that dataset is refused (before any work) unless ``--overwrite``."""
    from uqmetrics.runs.io import safe_name

    path = out / "scores" / f"selective-{safe_name(dataset)}.nc"
    check_output_file("--out", path, None)
    if path.exists() and not overwrite:
        from uqmetrics.runs.io import open_netcdf

        try:
            with open_netcdf(path) as ds:
                attrs = dict(ds.attrs)
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            attrs = {"error": " ".join(str(exc).split())}
        got = (attrs.get("protocol"), attrs.get("dataset_name"))
        if got != ("selective", dataset):
            what = (f"unreadable ({attrs['error']})" if "error" in attrs else
                    f"protocol {got[0]!r}, dataset {got[1]!r}")
            raise InputError(f"--out {str(out)!r}: {str(path)!r} is not the selective scores "
                             f"of dataset {dataset!r} ({what}); move it away, or pass "
                             "--overwrite to replace it")
    return path


def plan_sweep(a: argparse.Namespace, *, out: Path, data, dataset: str, config) -> SweepPlan:
    """The selective scoring of a sweep (:attr:`SweepScoring.plan`): plain and MC-dropout caches
    are scored into :func:`sweep_scores_file`; ``--calibration-size`` and ``--mc-passes`` are
    checked against the images and the passes before any model runs."""
    from ...data import readable_images
    from .score import ROW_KINDS, resolve_calibration_size  # scoring: imported on use

    scored_modes = list(dict.fromkeys(k.mode for k in ROW_KINDS.values()))
    if config.mode not in scored_modes:
        return SweepPlan(None, reason=(
            f"--mode {config.mode} caches are not scored: the selective protocol scores "
            f"{' and '.join(scored_modes)} caches (softmax response; MC-dropout entropy); "
            f"score TTA or ensemble caches with uqvision score pitfalls --caches "
            f"{out / 'caches'}"))
    readable = readable_images(data, skip_bad=a.skip_bad_images)  # checked once: memoized
    n_images = len(readable)
    try:
        resolve_calibration_size(a.calibration_size, n_images)
    except ValueError:
        raise InputError(
            f"--calibration-size {a.calibration_size:g}: --data {a.data!r} has {n_images} "
            "image(s) to score" + (f" ({len(readable.skipped)} left out)"
                                   if readable.skipped else "")
            + f"; give a count in [1, {n_images - 1}] or a fraction in (0, 1), e.g. "
            "--calibration-size 0.1 (the default 5000 is ImageNet's)") from None
    if config.mode == "mc_dropout" and config.passes < a.mc_passes:
        raise InputError(f"--mc-passes {a.mc_passes}: the MC-dropout caches of this sweep "
                         f"hold {config.passes} passes (--passes {config.passes}); give "
                         f"--mc-passes {config.passes} or --passes {a.mc_passes}")
    target = sweep_scores_file(out, dataset, a.overwrite)
    return SweepPlan(target, finish=partial(_finish_sweep, a, out=out, dataset=dataset,
                                            target=target))


def _finish_sweep(a: argparse.Namespace, report, log, *, out: Path, dataset: str,
                  target: Path) -> None:
    """After the sweep: the scores, their figures (the paper's, AURC vs accuracy, risk-coverage
    curves), the results table."""
    from uqmetrics.runs.io import safe_name

    from ...results import results_table  # the results table (docs/conventions.md#v-1-table)
    from . import selective_config
    from .plots import RISK_COVERAGE_MAX_MODELS, plot_selective  # figures: imported on use
    from .score import score_selective

    ds = score_selective([out / "caches"], selective_config(a, test=dataset))
    # the table of every row of the scores (the caches of earlier runs too, not only this
    # run's), and neither file replaces one that holds rows it lacks
    table = results_table([out / "caches"], scores=ds)
    stem = f"results-{safe_name(dataset)}"
    target, stem = _beside_if_rows_lost(target, stem, [str(m) for m in ds["model"].values],
                                        table.column("model"), log)
    log(str(write_dataset(ds, target, overwrite=True)))
    figures = out / "plots" / safe_name(dataset)
    models = int((ds["method"].values == "softmax").sum())  # the paper's figures' rows
    drawn = plot_selective(ds, figures) if models else []
    note = (f"; no risk-coverage figure for {models} models (more than "
            f"{RISK_COVERAGE_MAX_MODELS}: uqvision plot --caches FILES draws a subset)"
            if models > RISK_COVERAGE_MAX_MODELS else "")
    log(f"figures: {figures} ({len(drawn)} files{note})")
    log(table.format())
    for path in table.write(target.parent, stem, overwrite=True):
        log(str(path))


def _rows_of(path: Path, table: bool) -> set[str]:
    """The ``model`` rows of an existing score file (or results table ``.json``); none for a
    file that is not there or cannot be read (a foreign one was refused before the sweep)."""
    try:
        if table:
            from ...results import ResultsTable

            return set(ResultsTable.read(path).column("model"))
        from uqmetrics.runs.io import open_netcdf

        with open_netcdf(path) as ds:
            return {str(m) for m in ds["model"].values}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()


def _beside_if_rows_lost(target: Path, stem: str, scored: list[str], tabled: list[str],
                         log) -> tuple[Path, str]:
    """Where a sweep writes its score file and results table: ``target`` and ``stem``, unless
    the files there hold rows (models) these lack (their caches in ``caches/`` are gone or
    cannot be read: another user's files, a deleted model); then those files are kept and the
    new ones go beside them, ``<name>.<k>`` for the first free ``k``, said in one line. A
    results table or score file never loses rows (docs/conventions.md#v-1-table)."""
    folder = target.parent
    lost = sorted((_rows_of(target, False) - set(scored))
                  | (_rows_of(folder / f"{stem}.json", True) - set(tabled)))
    if not lost:
        return target, stem
    k = 1
    while any((folder / name).exists() for name in (
            f"{target.stem}.{k}.nc", f"{stem}.{k}.csv", f"{stem}.{k}.json")):
        k += 1
    new_target, new_stem = folder / f"{target.stem}.{k}.nc", f"{stem}.{k}"
    shown = ", ".join(lost[:5]) + (f", ... (+{len(lost) - 5} more)" if len(lost) > 5 else "")
    log(f"note: {str(target)!r} and {stem}.csv/.json hold {len(lost)} model(s) this run did "
        f"not score ({shown}: their caches in caches/ are gone or cannot be read); they are "
        f"kept as they are, and this run's scores and table go beside them: {new_target.name}, "
        f"{new_stem}.csv/.json")
    return new_target, new_stem


def _sweep_options(p: argparse.ArgumentParser) -> None:
    from . import add_selective_options

    add_selective_options(p)


#: The selective scoring of ``uqvision sweep`` (:attr:`uqvision.protocols.Protocol.sweep`).
SWEEP_SCORING = SweepScoring(
    add_options=_sweep_options, plan=plan_sweep,
    outputs="scores/selective-<dataset>.nc and results-<dataset>.csv/.json, plots/<dataset>/")


# --------------------------------------------------------------------------------------------
# uqvision plot --selective, uqvision score selective


def draw_figures(scores: str | os.PathLike, out: str | os.PathLike) -> list[Path]:
    """``uqvision plot --selective FILE``: the Selective paper's scatter and paired figures."""
    from .plots import plot_selective  # figures: imported on use

    return plot_selective(scores, out)


def results_of(a: argparse.Namespace, scores):
    """The results table ``uqvision score selective`` prints and writes beside the score file
    (:func:`uqvision.results.results_table` of the caches and their scores)."""
    from ...results import results_table  # imported on use

    return results_table(a.caches, scores=scores)
