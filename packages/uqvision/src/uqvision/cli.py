"""``uqvision`` command line: a thin layer over the library API.

Commands (:data:`COMMANDS`): ``data``, ``train``, ``predict``, ``score``, ``sweep``, ``plot``,
``reproduce``, ``metadata``, ``demo`` (``uqvision <command> -h`` for options). Choices and their
help come from the registries: dataset makers, prediction modes, augmentations, score
protocols, row kinds, ensemble methods, reproductions, metadata fields. ``predict`` runs under
``torchrun`` as is (``torchrun --nproc_per_node N -m uqvision predict ...``): samples are sharded
exactly and the logits gathered before rank 0 writes.

A command imports what it runs and no more: this module imports the registries and the
prediction and training layers (``import uqvision`` fills every registry, scoring code
excluded); scoring, plotting, metadata, sweeps and the demo are imported by the commands that
use them, and :func:`main` adds only the arguments of the command it runs (``uqvision
predict`` and ``uqvision train`` load no scoring module, no scipy, matplotlib or Dask).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import textwrap
import typing
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from uqmetrics import InputError, read_dataset, run_command, write_dataset
from uqmetrics.registry import Registry

from .data import (
    DATASET_MAKERS,
    TTA_POLICIES,
    ImageFolderDataset,
    check_output_outside,
    describe_labels,
    image_view,
    read_index_file,
    readable_images,
)
from .exceptions import SkippedCacheWarning
from .methods import TRAINING_METHODS
from .models import check_model_spec
from .options import (
    COUNT,
    INDEX,
    ConfigOption,
    add_config_options,
    check_output_file,
    check_output_folder,
    config_kwargs,
    device_type,
    non_negative_float,
    positive_float,
    set_pairs,
)
from .predict import AMP_MODES, PASS_MODES, PredictConfig, check_caches, predict_to_files
from .protocols import VISION_PROTOCOLS, ReproduceOptions, score_protocol
from .protocols.selective import add_selective_options, selective_config
from .training.loop import ImageTrainConfig, checkpoint_files, epoch_batches, train_model

__all__ = ["COMMANDS", "Command", "build_parser", "main"]

#: Options of ``uqvision data`` that every maker takes (the others come from the signatures).
_COMMON_MAKER_OPTIONS = ("root", "seed", "overwrite")
#: Earlier spellings of maker options, still accepted.
_MAKER_ALIASES = {"n_classes": ["--classes"], "n_per_class": ["--per-class"]}


def _print(msg: str) -> None:
    print(msg, flush=True)




def _maker_options() -> dict[str, tuple[type, list[str], dict[str, object]]]:
    """Keyword options of the registered dataset makers: name -> (type, makers, defaults)."""
    out: dict[str, tuple[type, list[str], dict[str, object]]] = {}
    for maker_name, maker in DATASET_MAKERS.items_ordered():
        hints = typing.get_type_hints(maker)
        for name, param in inspect.signature(maker).parameters.items():
            if param.kind is not param.KEYWORD_ONLY or name in _COMMON_MAKER_OPTIONS:
                continue
            hint = hints.get(name, str)
            kind = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
            entry = out.setdefault(name, (kind, [], {}))
            entry[1].append(maker_name)
            entry[2][maker_name] = param.default
    return out


def _cmd_data(a: argparse.Namespace) -> int:
    check_output_folder("--out", a.out)
    maker = DATASET_MAKERS.lookup(a.kind)
    accepted = inspect.signature(maker).parameters
    given = {k: getattr(a, k) for k in _maker_options() if getattr(a, k) is not None}
    foreign = sorted(k for k in given if k not in accepted)
    if foreign:
        raise ValueError(f"options {['--' + k.replace('_', '-') for k in foreign]} do not apply "
                         f"to dataset maker {a.kind!r}")
    root = maker(a.out, seed=a.seed, overwrite=a.overwrite, **given)
    _print(str(root))
    return 0


def _args_data(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=DATASET_MAKERS.names(),
                   help="dataset maker:\n" + DATASET_MAKERS.describe())
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=INDEX, default=0)
    p.add_argument("--overwrite", action="store_true")
    for name, (kind, _makers, defaults) in _maker_options().items():
        flags = ["--" + name.replace("_", "-"), *_MAKER_ALIASES.get(name, [])]
        p.add_argument(*flags, dest=name, type=kind, default=None,
                       help="option of " + ", ".join(f"{m} (default {d})"
                                                     for m, d in defaults.items()))


def _cmd_train(a: argparse.Namespace) -> int:
    seeds = a.seeds or [0]
    if len(seeds) > 1 and "{seed}" not in a.out:
        raise InputError("--out: with several --seeds, it must contain '{seed}'")
    if len(set(seeds)) != len(seeds):
        raise InputError(f"--seeds lists a seed twice: {seeds}")
    for seed in seeds:  # every output, before the first run trains
        for path in checkpoint_files(a.out.format(seed=seed)):
            check_output_file("--out", path, a.overwrite)
    classes = _classes_option(a.classes)
    if a.index_file is not None and classes is None:  # the classes the index file records
        classes = tuple(read_index_file(a.index_file)["classes"])
    try:
        model_kwargs = json.loads(a.model_kwargs)
    except json.JSONDecodeError as err:
        raise InputError(f"--model-kwargs {a.model_kwargs!r} is not JSON ({err})") from None
    cfgs = [ImageTrainConfig(**{**config_kwargs(a, _TRAIN_OPTIONS),
                                "augment": None if a.augment == "none" else a.augment},
                             arch=a.arch, hparams=set_pairs(a.set), seed=seed,
                             model_kwargs=model_kwargs, classes=classes) for seed in seeds]
    hp = cfgs[0].method_hparams()  # a bad --set is refused here, before any run
    n = len(image_view(a.data, classes=classes, index_file=a.index_file))
    steps = TRAINING_METHODS.lookup(a.method).total_steps(
        hp, len(epoch_batches(n, hp.batch_size, 0, 0)))
    if steps == 0 and a.init_checkpoint is None:
        raise InputError(f"--epochs/--set: method {a.method!r} would take no gradient step "
                         f"(epochs={getattr(hp, 'epochs', '?')}) and starts from no checkpoint "
                         "(--init): the saved network would be untrained")
    for seed, cfg in zip(seeds, cfgs, strict=True):
        r = train_model(a.data, a.out.format(seed=seed), cfg, overwrite=a.overwrite)
        if int(os.environ.get("RANK", "0")) == 0:
            _print(f"{r.checkpoint}  {a.method}  loss={r.losses[-1] if r.losses else float('nan'):.4f}"
                   f"  epochs={r.epochs:g}  steps={r.steps}  {r.wall_time_s:.1f}s")
    return 0


def _classes_option(value: str | None) -> tuple[str, ...] | dict[str, str] | None:
    """``--classes``: folder classes as ``a,b,c`` or a JSON file holding a list of them or an
    object folder class -> label (``ValueError`` naming the option on anything else)."""
    if value is None:
        return None
    if value.endswith(".json"):
        try:
            loaded = json.loads(Path(value).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"--classes {value!r}: cannot read a JSON list or object "
                             f"({err})") from None
        if isinstance(loaded, dict) and all(isinstance(v, str) for v in loaded.values()):
            return {str(k): v for k, v in loaded.items()}
        if isinstance(loaded, list) and all(isinstance(v, str) for v in loaded):
            return tuple(loaded)
        raise ValueError(f"--classes {value!r} must hold a list of class names or an object "
                         f"class -> label name, got {type(loaded).__name__}")
    names = tuple(c.strip() for c in value.split(","))
    if not all(names):
        raise ValueError(f"--classes expects class names separated by commas, got {value!r}")
    return names


def _predict_config(a: argparse.Namespace) -> PredictConfig:
    zero_shot = getattr(a, "zero_shot", False)
    return PredictConfig(**config_kwargs(a, _PREDICT_OPTIONS),
                         embeddings=getattr(a, "embeddings", False) or zero_shot,
                         logits=not zero_shot)


def _data(a: argparse.Namespace) -> ImageFolderDataset:
    """``--data`` scanned once, in its layout (class folders, flat with ``--labels`` or a label
    file found beside it, a tar; :mod:`uqvision.layouts`), ``--subset`` applied; an ``--out``
    inside it is refused first. How it is labelled (the label file read, those passed over,
    the subset) is said on stderr in one line (:func:`uqvision.data.describe_labels`)."""
    check_output_outside(a.data, getattr(a, "out", None))
    folder = ImageFolderDataset(a.data, labels=a.labels, subset=a.subset)
    line = describe_labels(folder)
    if line and int(os.environ.get("RANK", "0")) == 0:
        print(f"uqvision {a.command}: {line}", file=sys.stderr, flush=True)
    return folder


def _check_images(a: argparse.Namespace, data: ImageFolderDataset | None = None) -> None:
    """The images of ``--data``, checked before anything runs (:func:`uqvision.data.
    readable_images`); with ``--skip-bad-images`` the log says which are left out."""
    folder = readable_images(data or _data(a), skip_bad=a.skip_bad_images)
    if folder.skipped and int(os.environ.get("RANK", "0")) == 0:
        shown = "; ".join(f"{rel}: {why}" for rel, why in list(folder.skipped.items())[:5])
        more = f"; ... ({len(folder.skipped)} in all)" if len(folder.skipped) > 5 else ""
        print(f"uqvision {a.command}: --skip-bad-images: {len(folder.skipped)} unreadable "
              f"image(s) of {a.data!r} left out: {shown}{more}", file=sys.stderr, flush=True)


def _cmd_predict(a: argparse.Namespace) -> int:
    check_output_folder("--out", a.out)
    for spec in a.model:  # names, checkpoint files, sidecars: before anything runs
        check_model_spec(spec)
    data = _data(a)
    _check_images(a, data)
    # every model's classes and existing caches, before anything runs (read once)
    checked = [check_caches(spec, data, a.out, _predict_config(a), dataset_name=a.dataset_name,
                            overwrite=a.overwrite) for spec in a.model]
    written: list[Path] = []
    for spec, plan in zip(a.model, checked, strict=True):
        paths = predict_to_files(spec, data, a.out, _predict_config(a),
                                 dataset_name=a.dataset_name, overwrite=a.overwrite,
                                 checked=plan)
        if int(os.environ.get("RANK", "0")) == 0:
            for p in paths:
                _print(str(p))
            written += paths
    if written and int(os.environ.get("RANK", "0")) == 0:
        # top-1/top-5 and costs: the selective metrics would import the scorers (scipy, 2.3 s),
        # which predict never loads (docs/conventions.md#v-1-table, #v-predict-speed)
        from .results import results_table

        _print(results_table(written, metrics=False).format())
        _print(f"auroc/ece/aurc: uqvision score --protocol selective --caches {a.out} "
               "--out FILE.nc")
    return 0


def _cmd_score(a: argparse.Namespace) -> int:
    from .protocols.selective.score import incomplete_caches  # scoring: imported on use

    protocol = score_protocol(a.protocol)
    check_output_file("--out", a.out, a.overwrite)
    out = Path(a.out)
    table_stem = out.stem if protocol.name == "selective" else None  # results table beside it
    if table_stem is not None:
        for suffix in (".csv", ".json"):
            check_output_file("--out", out.with_name(table_stem + suffix), a.overwrite)
    files, skipped = incomplete_caches(a.caches)
    listed = "; ".join(f"{p.name} ({why})" for p, why in skipped.items())
    if skipped and not a.skip_incomplete:
        raise InputError(f"--caches: {len(skipped)} of {len(files)} cache files would not be "
                         f"scored: {listed}; recompute them, or pass --skip-incomplete to score "
                         "the others")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedCacheWarning)  # said in the summary line
        ds = protocol.score(a)
        if table_stem is not None:
            from .results import results_table

            table = results_table(a.caches, scores=ds)
    line = str(write_dataset(ds, a.out, overwrite=a.overwrite))
    if skipped:
        line += (f"  (--skip-incomplete: {len(skipped)} of {len(files)} cache files not "
                 f"scored: {listed})")
    _print(line)
    if table_stem is not None:
        _print(table.format())
        for path in table.write(out.parent, table_stem, overwrite=a.overwrite):
            _print(str(path))
    return 0


def _one_line(text: str) -> str:
    """``text`` on one line, whole (an error's suggested fix is at its end)."""
    return " ".join(str(text).split())


#: How many names a line about several failed models lists before "... (+N more)".
_SHOWN_NAMES = 5


def _names(rows: Sequence[str]) -> str:
    shown = ", ".join(rows[:_SHOWN_NAMES])
    return shown + (f", ... (+{len(rows) - _SHOWN_NAMES} more)" if len(rows) > _SHOWN_NAMES
                    else "")


def _failure_lines(failed: dict[str, dict], where: str) -> list[str]:
    """One line per failed model, complete; models that failed for one shared cause (their
    weights not cached while offline, the hub unreachable) share one line."""
    by_cause: dict[str, list[str]] = {}
    for row, rec in failed.items():
        if rec.get("cause") and not rec.get("left_out"):
            by_cause.setdefault(rec["cause"], []).append(row)
    shared = {row for rows in by_cause.values() if len(rows) > 1 for row in rows}
    lines = []
    for row, rec in sorted(failed.items()):
        if row in shared:
            continue
        notes = [f"{len(rec['cells'])} cell(s)"] if rec.get("cells") else []
        if rec.get("attempts", 1) > 1:
            notes.append(f"failed {rec['attempts']} runs in a row")
        if rec.get("left_out"):
            notes.append(f"not retried (--skip-failed), failed at {rec['time']}")
        lines.append(f"  FAILED {row}: {_one_line(rec['error'])}"
                     + (f" ({'; '.join(notes)})" if notes else ""))
    for cause, rows in by_cause.items():
        if len(rows) > 1:
            lines.append(f"  FAILED {len(rows)} models, {_one_line(cause)}: "
                         f"{_names(sorted(rows))} (each recorded in {where}); fetch the weights "
                         "where the network is allowed (or point HF_HUB_CACHE / TORCH_HOME at "
                         "a cache that holds them), or give local files as NAME=FILE or with "
                         "--weights-dir")
    return lines


def _failure_advice(failed: dict[str, dict]) -> str:
    """What to do about the failed models, by kind (uqvision.sweep.FAILURE_KINDS), one clause
    each: a refusal needs --overwrite, a failure a rerun."""
    from .sweep import FAILURE_KINDS

    counts: dict[str, int] = {}
    for rec in failed.values():
        kind = rec.get("kind", "failed")
        counts[kind] = counts.get(kind, 0) + 1
    return "; ".join(f"{counts[k]} {k if k != 'weights' else 'without weights'}: "
                     f"{FAILURE_KINDS[k].split(': ', 1)[1]}"
                     for k in FAILURE_KINDS if counts.get(k))


def _sweep_scores_file(out: Path, dataset: str, overwrite: bool) -> Path:
    """``<out>/scores/selective-<dataset>.nc``: one score file per dataset, so that a second
    dataset swept into the same ``--out`` replaces nothing. An existing file there that is not
    the selective scores of that dataset is refused (before any work) unless ``--overwrite``."""
    from .cache import safe_name

    path = out / "scores" / f"selective-{safe_name(dataset)}.nc"
    check_output_file("--out", path, None)
    if path.exists() and not overwrite:
        import xarray as xr  # imported on use

        try:
            with xr.open_dataset(path, engine="netcdf4") as ds:
                attrs = dict(ds.attrs)
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            attrs = {"error": _one_line(exc)}
        got = (attrs.get("protocol"), attrs.get("dataset_name"))
        if got != ("selective", dataset):
            what = (f"unreadable ({attrs['error']})" if "error" in attrs else
                    f"protocol {got[0]!r}, dataset {got[1]!r}")
            raise InputError(f"--out {str(out)!r}: {str(path)!r} is not the selective scores "
                             f"of dataset {dataset!r} ({what}); move it away, or pass "
                             "--overwrite to replace it")
    return path


def _cmd_sweep(a: argparse.Namespace) -> int:
    from uqmetrics.sweep import read_failures

    from .cache import safe_name
    from .protocols.selective.score import (  # scoring: imported on use
        ROW_KINDS,
        resolve_calibration_size,
        score_selective,
    )
    from .sweep import (  # Dask, xarray: imported on use
        FAILURES_FILE,
        LOG_FILE,
        RISK_COVERAGE_MAX_MODELS,
        dry_run_sweep,
        sweep_figures,
        sweep_predictions,
    )
    from .zoo import ZOOS

    # everything the arguments, the folder and the caches can tell is checked here, before the
    # first model runs (docs/conventions.md#v-1-zoos)
    if not (a.models or a.zoo):
        raise InputError("give --models PATTERN... and/or --zoo NAME (uqvision sweep "
                         "--list-zoos lists the zoos)")
    for zoo in a.zoo or ():
        try:
            ZOOS.lookup(zoo)
        except ValueError as exc:
            raise InputError(f"--zoo: {exc}") from None
    out = Path(a.out)
    for folder in (out, out / "caches", out / "scores", out / "plots"):
        check_output_folder("--out", folder)
    failures = out / FAILURES_FILE
    recorded = read_failures(failures)
    config = _predict_config(a)
    data = _data(a)
    _check_images(a, data)
    dataset = a.dataset_name or Path(data.root).resolve().name
    scored_modes = list(dict.fromkeys(k.mode for k in ROW_KINDS.values()))
    scores_path = None
    if config.mode in scored_modes:
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
        scores_path = _sweep_scores_file(out, dataset, a.overwrite)
    sweep_args = {"zoos": a.zoo or (), "weights_dir": a.weights_dir,
                  "dataset_name": a.dataset_name, "threads": a.cell_threads or a.threads,
                  "overwrite": a.overwrite, "failures_file": failures,
                  "retry_failed": not a.skip_failed}
    not_scored = (f"--mode {config.mode} caches are not scored: the selective protocol scores "
                  f"{' and '.join(scored_modes)} caches (softmax response; MC-dropout entropy); "
                  "score TTA or ensemble caches with uqvision score --protocol ensembles "
                  f"--caches {out / 'caches'}")
    if a.dry_run:
        plan = dry_run_sweep(a.models or [], data, out / "caches", config,
                             n_workers=a.n_workers, **sweep_args)
        for line in plan.lines():
            _print(line)
        _print(f"scores: {scores_path}" if scores_path is not None else f"scores: none "
               f"({not_scored})")
        return 0
    if recorded:
        previous = [str(r.get("model", "?")) for r in recorded]
        print(f"uqvision sweep: {len(previous)} model(s) failed in the previous run "
              f"({failures}): {_names(previous)}; "
              + ("left out (--skip-failed)" if a.skip_failed else "retrying them"),
              file=sys.stderr, flush=True)
    report = sweep_predictions(a.models or [], data, out / "caches", config,
                               scheduler=a.scheduler, n_workers=a.n_workers, progress=True,
                               log_file=out / LOG_FILE, **sweep_args)
    failed = report.failed_models
    _print(f"computed {len(report.computed)}, skipped {len(report.skipped)} (already complete), "
           f"failed {len(failed)} model(s)")
    for line in _failure_lines(failed, str(failures)):
        _print(line)
    if failed:
        where = (f"recorded in {failures}" if report.failures_error is None else
                 f"NOT recorded: {failures} could not be written ({report.failures_error})")
        logged = (f"; full tracebacks in {out / LOG_FILE}"
                  if (out / LOG_FILE).is_file() and any(r.get("cells") for r in failed.values())
                  else "")
        print(f"uqvision sweep: {len(failed)} model(s) failed, {where}{logged}; "
              f"{_failure_advice(failed)}", file=sys.stderr, flush=True)
    if scores_path is None:
        _print(f"scores: none ({not_scored})")
    elif report.paths:
        from .protocols.selective.plots import plot_selective  # figures: imported on use
        from .results import results_table  # the results table (docs/conventions.md#v-1-table)

        ds = score_selective([out / "caches"], selective_config(a, dataset=dataset))
        _print(str(write_dataset(ds, scores_path, overwrite=True)))
        figures = out / "plots" / safe_name(dataset)
        models = int((ds["method"].values == "softmax").sum())  # the paper's figures' rows
        drawn = ((plot_selective(ds, figures) if models else [])
                 + sweep_figures(ds, report.paths, figures))
        note = (f"; no risk-coverage figure for {models} models (more than "
                f"{RISK_COVERAGE_MAX_MODELS}: uqvision plot --caches FILES draws a subset)"
                if models > RISK_COVERAGE_MAX_MODELS else "")
        _print(f"figures: {figures} ({len(drawn)} files{note})")
        table = results_table(report.paths, scores=ds)
        _print(table.format())
        for path in table.write(out / "scores", f"results-{safe_name(dataset)}", overwrite=True):
            _print(str(path))
    # exit 1 when a model failed (as uqreg sweep does for failed cells): the others are computed,
    # scored and kept, and a rerun resumes them
    return 1 if report.failed or not report.paths else 0


def _cmd_plot(a: argparse.Namespace) -> int:
    from .plots import plot_caches  # figures: imported on use (start-up time)
    from .protocols.pitfalls.plots import plot_ensembles
    from .protocols.selective.plots import plot_selective

    if not (a.caches or a.ensembles or a.selective):
        raise InputError("nothing to plot (give --caches, --ensembles and/or --selective)")
    check_output_folder("--out", a.out)
    paths = []
    if a.caches:
        paths += plot_caches(a.caches, a.out, dataset=a.dataset)
    if a.ensembles:
        paths += plot_ensembles(a.ensembles, a.out)
    if a.selective:
        paths += plot_selective(a.selective, a.out)
    if not paths:
        raise InputError("the files given (--caches, --ensembles, --selective) hold nothing to "
                         "plot")
    for p in paths:
        _print(str(p))
    return 0


def _cmd_metadata(a: argparse.Namespace) -> int:
    from .protocols.selective.metadata import (  # tables: imported on use (start-up time)
        COLUMNS,
        METADATA_FIELDS,
        ModelMetadata,
        load_metadata,
        unknown_models,
        write_metadata,
    )

    if a.fields:
        _print(",".join(COLUMNS))
        _print(METADATA_FIELDS.describe())
        return 0
    tables = load_metadata(a.metadata or ())
    keys = _model_keys(a)
    named = _named_model_keys(a)  # --zoo / --models: rows filled from timm's pretrained cfgs
    if keys is None and named is None:
        for key in sorted(tables.rows):
            _print(key)
        return 0
    unknown = unknown_models((keys or []) + (named or []), tables)
    if a.template:
        from .protocols.selective.metadata import template_metadata

        check_output_file("--template", a.template, a.overwrite)
        to_fill = [k for k in unknown if k in set(named or ())]
        filled = {r.key: r for r in (template_metadata(to_fill, progress=True) if to_fill
                                     else ())}
        _print(str(write_metadata([filled.get(k) or ModelMetadata(k) for k in unknown],
                                  a.template)))
    for key in unknown:
        _print(key)
    if unknown:
        print(f"{len(unknown)} of {len(set((keys or []) + (named or [])))} models have no "
              "metadata; fill in a copy of --template FILE and pass it with --metadata FILE (or "
              "list it in $UQVISION_MODEL_METADATA)", file=sys.stderr)
    return 0


def _named_model_keys(a: argparse.Namespace) -> list[str] | None:
    """Metadata keys of the models of --zoo / --models (None when neither is given)."""
    if not (a.zoo or a.models):
        return None
    from .protocols.selective.metadata import model_metadata_key
    from .sweep import expand_models
    from .zoo import zoo_models

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
    import xarray as xr  # imported on use: predict/train do not need it here

    from .cache import index_caches
    from .protocols.selective.score import cache_metadata_key  # scoring: imported on use

    keys = []
    for info in index_caches(a.caches or ()):
        with xr.open_dataset(info.path) as ds:  # the attrs only
            keys.append(cache_metadata_key(dict(ds.attrs)))
    for path in a.scores or ():
        keys += [str(k) for k in read_dataset(path)["metadata_key"].values]
    return keys


def _cmd_demo(a: argparse.Namespace) -> int:
    from .demo import DemoConfig, run_demo, summary  # the whole chain: imported on use

    check_output_folder("--out", a.out)
    r = run_demo(a.out, DemoConfig(**config_kwargs(a, _DEMO_OPTIONS)), log=_print)
    _print(summary(r))
    _print(f"demo done in {r.wall_time_s:.0f} s: {r.selective}, {r.ensembles}")
    return 0


# --------------------------------------------------------------------------------------------
# arguments of each command


#: ``uqvision train`` options generated from :class:`ImageTrainConfig` (defaults from its
#: fields; ``--augment none`` is ``augment=None``).
_TRAIN_OPTIONS = (
    ConfigOption("method", choices=TRAINING_METHODS.names,
                 help="training method:\n" + TRAINING_METHODS.describe()),
    ConfigOption("epochs", type=non_negative_float,
                 help="shorthand for --set epochs= (0 only with --init)"),
    ConfigOption("batch_size", type=COUNT, help="shorthand for --set batch_size="),
    ConfigOption("lr", type=positive_float,
                 help="shorthand for the method's initial learning rate (lr_init or lr0)"),
    ConfigOption("init_checkpoint", flag="--init", help="start from this local checkpoint"),
    ConfigOption("val_data",
                 help="validation folder (K-FAC Laplace tunes its noise scale on it)"),
    ConfigOption("amp", help="autocast (fp16 on CUDA, bf16 on CPU)"),
    ConfigOption("index_file", metavar="FILE",
                 help="train on the images of this index file only "
                      "(uqvision.data.make_index_files: UIMNET's 90/10 in-domain split), with "
                      "the classes it records unless --classes names them"),
    ConfigOption("spectral",
                 help="one-sided spectral normalisation of the featurizer (conv/linear sigma "
                      "and BatchNorm Lipschitz constant at most 5; UIMNET)"),
    ConfigOption("input_size", type=COUNT),
    ConfigOption("augment", choices=lambda: [*TTA_POLICIES.names(), "none"],
                 help="training augmentation:\n" + TTA_POLICIES.describe()
                      + "\nnone: no augmentation"),
    ConfigOption("drop_rate", type=float),
    ConfigOption("device", type=device_type, help="cpu | cuda | cuda:N"),
    ConfigOption("num_workers", flag="--workers", type=INDEX),
)


def _args_train(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", required=True, help="timm architecture, e.g. resnet10t, test_vit")
    p.add_argument("--data", required=True, help="training image folder")
    p.add_argument("--out", required=True, help="checkpoint path ('{seed}' for several seeds)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="a hyper-parameter of the method (repeatable), e.g. cycles=5; "
                        "uqvision's former AdamW recipe: optimizer=adamw schedule=onecycle "
                        "lr_init=3e-3 weight_decay=0.05")
    p.add_argument("--seeds", type=INDEX, nargs="+", help="one run per seed (default 0)")
    p.add_argument("--classes", default=None, metavar="A,B,C | FILE.json",
                   help="train on these folder classes only, the head's classes in this order; "
                        "a JSON file holds a list, or an object folder class -> label to group "
                        "classes (UIMNET's in-vs-out oracle)")
    add_config_options(p, ImageTrainConfig, _TRAIN_OPTIONS)
    p.add_argument("--model-kwargs", default="{}", help="JSON kwargs for timm.create_model")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing checkpoint (and its sidecar and state file)")


#: ``uqvision predict`` / ``sweep`` options generated from :class:`PredictConfig` (defaults
#: from its fields).
_PREDICT_OPTIONS = (
    ConfigOption("mode", choices=PASS_MODES.names,
                 help="prediction mode:\n" + PASS_MODES.describe()),
    ConfigOption("passes", type=COUNT,
                 help="TTA augmentations or MC-dropout passes (default: 30 for mc_dropout, the "
                      "Selective paper's count; 1 otherwise)"),
    ConfigOption("first_pass", type=INDEX, help="index of the first TTA pass"),
    ConfigOption("samples", type=COUNT,
                 help="prediction samples of a run trained with a method (snapshots, posterior "
                      "draws, passes; default: all snapshots, 10 draws, 1 network)"),
    ConfigOption("first_sample", type=INDEX, help="index of the first sample"),
    ConfigOption("train_data",
                 help="training folder for BatchNorm updates of sampled weights (SWAG, "
                      "Laplace; default: the one the checkpoint's sidecar records)"),
    ConfigOption("tta_policy", choices=TTA_POLICIES.names,
                 help="augmentation of --mode tta:\n" + TTA_POLICIES.describe()),
    ConfigOption("seed", type=INDEX),
    ConfigOption("batch_size", type=COUNT),
    ConfigOption("num_workers", flag="--workers", type=INDEX,
                 help="DataLoader workers (default: the cores the network leaves idle, at "
                      "most 4: on CUDA all but one, at least 1; on the CPU the cores beyond "
                      "--threads; 0 for a single batch or inside a Dask worker)"),
    ConfigOption("device", type=device_type, help="cpu | cuda | cuda:N"),
    ConfigOption("amp", choices=lambda: list(AMP_MODES),
                 help="autocast: fp16 (CUDA only) or bf16 (default: {default}; part of a "
                      "cache's identity)"),
    ConfigOption("channels_last", negatable=True,
                 help="run the network on NHWC tensors (faster for most CNNs on CPU and with "
                      "--amp on GPU; logits equal to float rounding; part of a cache's "
                      "identity; default: {default})"),
    ConfigOption("allow_random_init", flag="--random-init",
                 help="models without a checkpoint get random weights (code-path checks only)"),
    ConfigOption("skip_bad_images",
                 help="leave out images that do not read (empty, truncated, not an image), "
                      "recorded in the caches' attrs; without it they stop the command before "
                      "any work"),
)


def _add_predict_options(p: argparse.ArgumentParser) -> None:
    add_config_options(p, PredictConfig, _PREDICT_OPTIONS)
    p.add_argument("--labels", default=None, metavar="FILE",
                   help="label file of a flat --data folder or archive: the ILSVRC2012 devkit "
                        "(its folder, ground-truth .txt or .tar.gz) or LOC_val_solution.csv "
                        "(default: looked for beside --data, then one folder up; the first "
                        "found is read, the devkit before the csv)")
    p.add_argument("--subset", action="store_true",
                   help="--data holds part of the images of its label file (e.g. 40 of "
                        "ImageNet's 50,000): the labelled images absent are left out, recorded "
                        "in the caches as counts and a hash; without it they stop the command")
    p.add_argument("--dataset-name", default=None, help="default: the data folder's name")
    p.add_argument("--overwrite", action="store_true")


def _args_predict(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, action="append",
                   help="NAME or NAME=CHECKPOINT (timm arch[.tag], or tv/<torchvision name>); "
                        "repeatable")
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True, help="cache directory")
    p.add_argument("--embeddings", action="store_true", help="also cache pre-logit features")
    p.add_argument("--zero-shot", action="store_true",
                   help="embeddings (and u) only, no logits: a folder of classes the model "
                        "never saw (URL's downstream sets)")
    _add_predict_options(p)


def _score_names() -> list[str]:
    """``--protocol`` choices: each protocol's score name, then its own name where it differs."""
    names = [p.score_name for p in VISION_PROTOCOLS.values() if p.score is not None]
    return names + [p.name for p in VISION_PROTOCOLS.values() if p.score is not None
                    and p.name not in names]


def _args_score(p: argparse.ArgumentParser) -> None:
    p.add_argument("--protocol", choices=_score_names(), required=True, metavar="PROTOCOL",
                   help="score protocol:\n" + "\n".join(
                       f"{q.score_name}: {(q.score.__doc__ or '').strip().splitlines()[0]}"
                       + (f" (also: {q.name})" if q.name != q.score_name else "")
                       for q in VISION_PROTOCOLS.values() if q.score is not None))
    p.add_argument("--caches", nargs="+", required=True, help="cache files or directories")
    p.add_argument("--out", required=True, help="score file (.nc)")
    p.add_argument("--dataset", default=None)
    p.add_argument("--seed", type=INDEX, default=0)
    for proto in VISION_PROTOCOLS.values():  # each protocol's own options
        if proto.add_options is not None:
            proto.add_options(p)
    p.add_argument("--skip-incomplete", action="store_true",
                   help="score the complete caches when some are unreadable or partial (named "
                        "in the summary line); without it they stop the command")
    p.add_argument("--overwrite", action="store_true")


class _ListZoos(argparse.Action):
    """``--list-zoos [NAME]``: print the zoos, or the members of zoo NAME one per line, and
    exit (like ``--help``, before the required options); an unknown NAME is a one-line error
    naming the known zoos (exit code 2)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs="?", default=argparse.SUPPRESS,
                         metavar="NAME", **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from .zoo import ZOOS, zoo_models

        if values is None:
            print(ZOOS.describe(), flush=True)
            parser.exit(0)
        try:
            names = zoo_models([values])
        except ValueError as exc:
            parser.error(f"argument --list-zoos: {exc}")
        try:
            print("\n".join(names), flush=True)
        except BrokenPipeError:  # uqvision sweep --list-zoos timm-in1k | head
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        parser.exit(0)


def _args_sweep(p: argparse.ArgumentParser) -> None:
    from .zoo import ZOOS

    p.add_argument("--models", nargs="+", default=None,
                   help="names, NAME=CHECKPOINT, or wildcards (resnet*, vit_*.augreg*); with "
                        "--zoo, the union (each model once); one of the two is required")
    p.add_argument("--zoo", action="append", default=None, metavar="NAME",
                   help="a named model list (repeatable):\n" + ZOOS.describe())
    p.add_argument("--list-zoos", action=_ListZoos,
                   help="list the zoos and exit; with a NAME, the members of that zoo, one per "
                        "line")
    p.add_argument("--skip-failed", action="store_true",
                   help="leave out the models that sweep_failures.json lists from the previous "
                        "run (default: retry them; they are reported as failed again either way)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the models, where each one's weights are (local file, cache, "
                        "random init, missing), the cells to compute and those complete on "
                        "disk, and the cost (cells x images; a time when earlier caches there "
                        "record theirs); nothing is computed, downloaded or written")
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True,
                   help="sweep directory: caches/, scores/selective-<dataset>.nc and "
                        "results-<dataset>.csv/.json, plots/<dataset>/, sweep_failures.json, "
                        "sweep.log (full tracebacks)")
    p.add_argument("--weights-dir", default=None, help="folder of <name>.safetensors/.pth files")
    p.add_argument("--scheduler", default=None, help="Dask scheduler address (default: local)")
    p.add_argument("--n-workers", type=COUNT, default=2)
    p.add_argument("--cell-threads", type=COUNT, default=None,
                   help="torch threads inside each Dask cell (default: --threads)")
    add_selective_options(p)
    _add_predict_options(p)


def _args_plot(p: argparse.ArgumentParser) -> None:
    p.add_argument("--caches", nargs="+", default=None)
    p.add_argument("--ensembles", default=None, help="ensembles score file")
    p.add_argument("--selective", default=None,
                   help="selective score file: the Selective paper's scatter and paired figures")
    p.add_argument("--dataset", default=None)
    p.add_argument("--out", required=True, help="figure directory")


def _args_metadata(p: argparse.ArgumentParser) -> None:
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


#: ``uqvision demo`` options generated from :class:`~uqvision.demo.DemoConfig` (defaults from
#: its fields).
_DEMO_OPTIONS = (
    ConfigOption("arch"),
    ConfigOption("members", type=COUNT),
    ConfigOption("epochs", type=COUNT),
    ConfigOption("mc_passes", type=COUNT),
    ConfigOption("max_per_class", type=COUNT),
    ConfigOption("calibration_size", type=positive_float),
    ConfigOption("n_orders", type=COUNT),
    ConfigOption("seed", type=INDEX),
    ConfigOption("device", type=device_type, help="cpu | cuda | cuda:N"),
)


def _args_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True)
    from .demo import DemoConfig  # the whole chain: imported on use

    add_config_options(p, DemoConfig, _DEMO_OPTIONS)


def _cmd_reproduce(a: argparse.Namespace) -> int:
    driver = VISION_PROTOCOLS.lookup(a.name).reproduce
    if a.scale not in driver.scales:
        raise ValueError(f"--scale {a.scale!r} is not a scale of {a.name!r}; choose from "
                         f"{list(driver.scales)}")
    check_output_folder("--out", a.out)
    options = set_pairs(a.set)
    if a.upstream is not None:  # url: real folders (the same as --set upstream=...)
        options["upstream"] = a.upstream
    if a.downstream is not None:
        options["downstream"] = ",".join(a.downstream)
    out = driver.run(a.out, **config_kwargs(a, _REPRODUCE_OPTIONS), options=options, log=_print)
    _print(str(out))
    return 0


#: ``uqvision reproduce`` options generated from :class:`ReproduceOptions` (the defaults every
#: driver's ``run`` has).
_REPRODUCE_OPTIONS = (
    ConfigOption("scale", help="smoke (tests, minutes) or cpu (2 cores, under an hour); a "
                               "driver lists its scales"),
    ConfigOption("data", help="a real image folder (train/ val/ test/) instead of the stand-in"),
    ConfigOption("arch", help="timm architecture for --data / --upstream"),
    ConfigOption("seed", type=INDEX),
    ConfigOption("device", type=device_type,
                 help="where every network trains and predicts: cpu | cuda | cuda:N"),
    ConfigOption("overwrite"),
)


def _args_reproduce(p: argparse.ArgumentParser) -> None:
    names = [n for n, proto in VISION_PROTOCOLS.items_ordered() if proto.reproduce is not None]
    p.add_argument("name", choices=names, help="paper:\n" + "\n".join(
        f"{n}: {VISION_PROTOCOLS[n].reproduce.description}" for n in names))
    p.add_argument("--out", required=True)
    add_config_options(p, ReproduceOptions, _REPRODUCE_OPTIONS)
    p.add_argument("--upstream", default=None, metavar="ROOT",
                   help="url: real upstream folder (train/ val/ test/)")
    p.add_argument("--downstream", nargs="+", default=None, metavar="ROOT",
                   help="url: real downstream folders (val/ test/ each), zero-shot")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="driver option (repeatable)")


@dataclass(frozen=True)
class Command:
    """A subcommand: its handler (args -> exit status), its arguments, its one-line help."""

    run: Callable[[argparse.Namespace], int]
    arguments: Callable[[argparse.ArgumentParser], None]
    description: str


#: ``uqvision NAME``: the subcommands, in help order.
COMMANDS: Registry[Command] = Registry("command")
COMMANDS.add("data", Command(_cmd_data, _args_data, "write a development image folder"))
COMMANDS.add("train", Command(_cmd_train, _args_train,
                              "train a timm architecture with a training method (also under "
                              "torchrun); save a checkpoint"))
COMMANDS.add("predict", Command(_cmd_predict, _args_predict,
                                "cache per-sample logits of models over a folder"))
COMMANDS.add("score", Command(_cmd_score, _args_score, "score caches with a protocol"))
COMMANDS.add("sweep", Command(_cmd_sweep, _args_sweep, "cache and score a model zoo on Dask"))
COMMANDS.add("plot", Command(_cmd_plot, _args_plot,
                             "reliability, risk-coverage, metric-vs-size figures"))
COMMANDS.add("reproduce", Command(_cmd_reproduce, _args_reproduce,
                                  "reproduce a paper's protocol on the stand-in or a real folder"))
COMMANDS.add("metadata", Command(_cmd_metadata, _args_metadata,
                                 "model metadata tables: columns, known models, unknown models"))
COMMANDS.add("demo", Command(_cmd_demo, _args_demo,
                             "the whole chain on digits (a few minutes on 2 CPUs); torch "
                             "threads: --threads before the command (default 1)"))


def _add_protocol_commands() -> None:
    """The commands a protocol brings (UIMNET's ``split``), after the general ones."""
    for proto in VISION_PROTOCOLS.values():
        for name, cmd in proto.commands.items():
            COMMANDS.add(name, Command(cmd.run, cmd.arguments, cmd.description))


_add_protocol_commands()


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (the project's error policy): ``uqvision
    predict: error: argument --seed: must be >= 0, got -1 (see uqvision predict -h)``, exit
    code 2. Options are never abbreviated (``allow_abbrev=False``, here and in every
    subcommand): ``--dataset`` must not be taken as ``--dataset-name``, which renames the
    caches."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} -h)\n")


class _HelpFormatter(argparse.HelpFormatter):
    """Keeps the line breaks of registry descriptions (one line per choice), wraps each."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return [w for line in text.splitlines() for w in (textwrap.wrap(line, width) or [""])]


class _LazySubparsers(argparse._SubParsersAction):
    """Subcommands whose arguments are added when their command is parsed: building every
    command's options would import what every command needs (the scorers, the demo, the
    metadata tables), and ``uqvision predict`` needs none of it. ``uqvision -h`` lists every
    command; ``uqvision COMMAND -h`` shows all of that command's options."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pending: dict[str, Callable[[argparse.ArgumentParser], None]] = {}

    def __call__(self, parser, namespace, values, option_string=None):
        arguments = self.pending.pop(values[0], None)
        if arguments is not None:
            arguments(self.choices[values[0]])
        super().__call__(parser, namespace, values, option_string)


def build_parser(*, lazy: bool = False) -> argparse.ArgumentParser:
    """The argparse parser of ``uqvision``: one subparser per entry of :data:`COMMANDS`.

    With ``lazy``, a subcommand's arguments are added when that command is parsed (what
    :func:`main` does: a command imports only what it runs); without, every subparser is
    complete (for tools and tests that inspect them)."""
    ap = _Parser(prog="uqvision", description=__doc__.split("\n")[0],
                 formatter_class=_HelpFormatter)
    ap.register("action", "parsers", _LazySubparsers)
    ap.add_argument("--threads", type=COUNT, default=None,
                    help="torch intra-op threads (default: torch's choice)")
    sub = ap.add_subparsers(dest="command", required=True)
    for name, cmd in COMMANDS.items_ordered():
        parser = sub.add_parser(name, help=cmd.description, description=cmd.description,
                                formatter_class=_HelpFormatter, allow_abbrev=False)
        if lazy:
            sub.pending[name] = cmd.arguments
        else:
            cmd.arguments(parser)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``uqvision`` console script."""
    try:  # a command's options import what it runs: a Ctrl-C may come during the imports
        args = build_parser(lazy=True).parse_args(argv)
    except KeyboardInterrupt:
        print("uqvision: interrupted", file=sys.stderr)
        return 130
    if args.threads:
        torch.set_num_threads(args.threads)
    return run_command("uqvision", args.command, lambda: COMMANDS.lookup(args.command).run(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
