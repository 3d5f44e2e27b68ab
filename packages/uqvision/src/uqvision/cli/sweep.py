"""``uqvision sweep``: a model zoo predicted and scored on Dask (:mod:`uqvision.sweep`, imported
when the command runs). Its options (the models and zoos, ``--list-zoos``, the extra
evaluation sets ``--sets [ROLE:]EVALSET=PATH ...`` (each set's role recorded in its caches) and
OOD sets ``--ood-sets OODSET=PATH ...``,
predicted but not scored here, the prediction options, each scoring protocol's own), the checks of everything the arguments, the folder and
the caches can tell before the first model runs, and the report of the models that failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from uqmetrics import InputError
from uqmetrics.runs.config_options import mark_launcher
from uqmetrics.runs.run_config import config_in_by_digest, recording
from uqmetrics.runs.sweep import ClusterSpec, add_cluster_options

from ..options import COUNT, check_output_folder
from ..protocols import VISION_PROTOCOLS, SweepScoring
from .base import _print
from .predict import (
    _add_predict_options,
    _check_images,
    _data,
    _predict_config,
    say_left_out,
)
from .score import score_run_config


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
    from ..sweep import FAILURE_KINDS

    counts: dict[str, int] = {}
    for rec in failed.values():
        kind = rec.get("kind", "failed")
        counts[kind] = counts.get(kind, 0) + 1
    return "; ".join(f"{counts[k]} {k if k != 'weights' else 'without weights'}: "
                     f"{FAILURE_KINDS[k].split(': ', 1)[1]}"
                     for k in FAILURE_KINDS if counts.get(k))


#: Where a sweep keeps the content hashes of its folders (below --out): the check that no
#: image of --data is in an OOD set reads them back while the folders are unchanged.
HASHES_DIR = "content_hashes"
#: What a sweep writes into below --out (besides the shared decoding's folder in caches/, its
#: log and the figures of plots/<dataset>/): a link at any of them, or on the way, is refused
#: before any work (:func:`uqmetrics.runs.io.refuse_links`; the lock, which refuses a link
#: itself, too: else the content hashes would be written first). The files written whole
#: (the failures, the configuration) replace a link, never write through it.
_WRITTEN_INSIDE = ("caches", "caches/.sweep.lock", HASHES_DIR, "scores", "plots")


def _sweep_scorers() -> list[SweepScoring]:
    """The protocols' scoring of a sweep's caches (:attr:`Protocol.sweep`), in registry order."""
    return [p.sweep for p in VISION_PROTOCOLS.values() if p.sweep is not None]


def _cmd_sweep(a: argparse.Namespace) -> int:
    from uqmetrics.runs.io import refuse_links, safe_name
    from uqmetrics.runs.sweep import read_failures

    from ..data import readable_images
    from ..evalsets import EVAL_SETS
    from ..sweep import (  # Dask, xarray: imported on use
        FAILURES_FILE,
        LOG_FILE,
        check_ood_targets,
        dry_run_sweep,
        sweep_predictions,
        sweep_targets,
    )
    from ..sweep.decode import DECODED_DIR
    from ..zoo import ZOOS

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
    if a.weights_dir is not None and not Path(a.weights_dir).is_dir():
        # else every model would silently load its pretrained weights from the hub instead
        raise InputError(f"--weights-dir {a.weights_dir!r}: not a folder (the folder of the "
                         "models' <name>.safetensors/.pth files)")
    out = Path(a.out)
    for folder in (out, out / "caches", out / "scores", out / "plots"):
        check_output_folder("--out", folder)
    failures = out / FAILURES_FILE
    recorded = read_failures(failures)
    config = _predict_config(a)
    # --scheduler/--cluster...: one GPU per cell on jobs with --gpus-per-job when on cuda
    cluster = ClusterSpec.from_args(a, device=str(config.device))
    data = _data(a)
    dataset = a.dataset_name or Path(data.root).resolve().name
    # an --out received from someone else (results to resume or add to): a link where the
    # sweep writes would have it write, append and delete where the link points
    refuse_links("--out", out, [*_WRITTEN_INSIDE, f"caches/{DECODED_DIR}", LOG_FILE,
                                f"plots/{safe_name(dataset)}"])
    _check_images(a, data)
    # --sets, --ood-sets: each EVALSET=PATH checked and every member folder found and scanned,
    # once; the OOD sets predicted with the --data's options (--embeddings, --cache-variables)
    sets = sweep_targets(data, config, a.sets or (), dataset_name=a.dataset_name,
                         ood_sets=a.ood_sets or ())[1:]
    for target in sets:  # each folder's images, and those --skip-bad-images leaves out
        say_left_out(a.command, "--skip-bad-images", f"{target.option} {target.source!r}"
                     + (f" (member {target.member})" if target.member else ""),
                     readable_images(target.folder, skip_bad=a.skip_bad_images).skipped)
    # each scoring protocol checks its options and its score file before any model runs, and
    # before the OOD overlap check writes its content hashes (a refused sweep leaves nothing)
    plans = [scorer.plan(a, out=out, data=data, dataset=dataset, config=config)
             for scorer in _sweep_scorers()]
    ood = [t for t in sets if EVAL_SETS.lookup(t.config.eval_set).role == "ood"]
    if ood and not a.dry_run:  # an ID image in an OOD set is an error: by its pixels
        from ..data import NearDuplicateWarning

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", NearDuplicateWarning)
            check_ood_targets(data, ood, cache_dir=out / HASHES_DIR)
        for w in caught:  # near duplicates: one line each, and the sweep goes on
            if issubclass(w.category, NearDuplicateWarning):
                print(f"uqvision sweep: note: {w.message}", file=sys.stderr, flush=True)
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    sweep_args = {"zoos": a.zoo or (), "weights_dir": a.weights_dir,
                  "dataset_name": a.dataset_name, "threads": a.cell_threads or a.threads,
                  "overwrite": a.overwrite, "failures_file": failures,
                  "retry_failed": not a.skip_failed, "sets": sets}
    if a.dry_run:
        dry = dry_run_sweep(a.models or [], data, out / "caches", config,
                            n_workers=cluster.local_workers(a.n_workers), **sweep_args)
        for line in dry.lines():
            _print(line)
        if ood:
            _print(f"{len(ood)} OOD set(s): checked disjoint from --data by content hash when "
                   "the sweep runs (reads every image; not by --dry-run)")
        for plan in plans:
            _print(plan.line)
        import torch

        from ..predict import decoder_suggestion

        hint = decoder_suggestion(config.decoder, config.device, torch.cuda.is_available())
        if hint:
            _print(hint)
        return 0
    if recorded:
        previous = [str(r.get("model", "?")) for r in recorded]
        print(f"uqvision sweep: {len(previous)} model(s) failed in the previous run "
              f"({failures}): {_names(previous)}; "
              + ("left out (--skip-failed)" if a.skip_failed else "retrying them"),
              file=sys.stderr, flush=True)
    report = sweep_predictions(a.models or [], data, out / "caches", config,
                               scheduler=cluster, n_workers=a.n_workers, progress=True,
                               log_file=out / LOG_FILE,
                               share_decoding=not a.no_shared_decoding, **sweep_args)
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
    scored = report.of_dataset(dataset)  # the protocols score the --data's caches only
    scoring = [p for p in VISION_PROTOCOLS.values() if p.sweep is not None]
    for proto, plan in zip(scoring, plans, strict=True):
        if plan.target is None:
            _print(plan.line)
        elif scored.paths:  # the score file records its score alone, part of this sweep
            with recording(score_run_config(proto, {
                    **vars(a), "dataset": dataset, "test": dataset, "out": str(plan.target),
                    "caches": [str(out / "caches")]})):
                plan.finish(scored, _print)
    # exit 1 when a model failed (as uqreg sweep does for failed cells): the others are computed,
    # scored and kept, and a rerun resumes them
    return 1 if report.failed or not report.paths else 0


class _ListZoos(argparse.Action):
    """``--list-zoos [NAME]``: print the zoos, or the members of zoo NAME one per line, and
    exit (like ``--help``, before the required options); an unknown NAME is a one-line error
    naming the known zoos (exit code 2)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs="?", default=argparse.SUPPRESS,
                         metavar="NAME", **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from ..zoo import ZOOS, zoo_models

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
    from ..evalsets import EVAL_SETS
    from ..roles import SET_ROLES
    from ..zoo import ZOOS

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
    p.add_argument("--sets", nargs="+", action="extend", default=None,
                   metavar="[ROLE:]EVALSET[:NAME]=PATH",
                   help="extra evaluation sets every model also predicts, once each, into "
                        "caches/ (as uqvision predict --eval-set EVALSET; repeatable): "
                        "EVALSET one of " + ", ".join(EVAL_SETS.names()) + "; an expanded set "
                        "(imagenet-c) stands for every member folder below PATH "
                        "(<corruption>/<severity>/), one cache per model and member, named "
                        "<set>-<member> (imagenet-c-fog-3; a set of one folder: by the "
                        "folder's name, or NAME: imagenet-real:real=/data/imagenet/val). "
                        "ROLE (" + ", ".join(SET_ROLES) + ") declares the role the set plays, "
                        "recorded in its caches for the score commands: ROLE:NAME=PATH is a "
                        "folder of the model's classes (fit:fit=/data/imagenet-fit, "
                        "calibration:val=...); without one a set plays its default role (test "
                        "for a clean folder, shift for a shifted one, ood-near/ood-far). "
                        "Resumed and listed by --dry-run as the --data cells "
                        "are; only predicted here, not scored: a protocol that reads such sets "
                        "scores them from OUT/caches (uqvision score NAME)")
    ood = [n for n in EVAL_SETS.names() if EVAL_SETS[n].role == "ood"]
    p.add_argument("--ood-sets", nargs="+", action="extend", default=None,
                   metavar="OODSET[:NAME]=PATH",
                   help="OOD sets every model also predicts, once each, into caches/ (as "
                        "--sets, restricted to the sets of role ood; repeatable): OODSET one of "
                        + ", ".join(f"{n} ({EVAL_SETS[n].ood_split})" for n in ood)
                        + " (ood-near, ood-far: any other folder); PATH a folder, a .tar or an "
                        "image list (OpenOOD's benchmark_imglist/imagenet/test_ninco.txt, read "
                        "under its images_largescale/); caches named by the set, or NAME "
                        "(ood-near:mine=/data/x), recording eval_set, role ood and ood_split. "
                        "Each set is checked disjoint from --data by its pixels (SHA-256 of "
                        "every decoded image, kept in OUT/" + HASHES_DIR + "/) before any model "
                        "runs; near duplicates (a perceptual hash) are reported. "
                        "Predicted with the --data's options: pass --embeddings / "
                        "--cache-variables when the detectors need them")
    p.add_argument("--out", required=True, help="sweep directory: " + ", ".join(
        ["caches/", *(s.outputs for s in _sweep_scorers() if s.outputs), "sweep_failures.json",
         "sweep.log (full tracebacks)"]))
    p.add_argument("--weights-dir", default=None, help="folder of <name>.safetensors/.pth files")
    add_cluster_options(p, workers="--n-workers")  # --scheduler, --cluster, --jobs, ...
    mark_launcher(p.add_argument("--cell-threads", type=COUNT, default=None,
                                 help="torch threads inside each Dask cell (default: --threads)"))
    p.add_argument("--no-shared-decoding", action="store_true",
                   help="every model decodes the images itself (default: once per "
                        "preprocessing group, the models of a folder that resize and crop "
                        "alike, into caches/.decoded/, removed once the group is done)")
    for scorer in _sweep_scorers():  # the scoring protocols' options
        scorer.add_options(p)
    _add_predict_options(p)  # with --config


def _config_files_sweep(a: argparse.Namespace, config) -> list[Path]:
    """``OUT/sweep.<digest>.config.toml``: a sweep resumes its folder, each run its own file
    (named by its options; :func:`uqmetrics.runs.run_config.config_in_by_digest`); none for
    ``--dry-run``, which writes nothing."""
    return [] if a.dry_run else [config_in_by_digest(a.out, "sweep", config)]
