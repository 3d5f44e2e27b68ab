"""``uqvision evaluate FILE``: the whole evaluation of a model zoo in one resumable command, a
thin layer over :mod:`uqvision.evaluate` (imported when the command runs; docs/evaluate.md).
"""

from __future__ import annotations

import argparse
import dataclasses

from .base import _print


def _args_evaluate(p: argparse.ArgumentParser) -> None:
    from uqmetrics.runs.config_options import mark_launcher
    from uqmetrics.runs.sweep import add_cluster_options  # imported when the command is parsed

    from ..evaluate import add_launcher_options
    from ..options import COUNT

    p.add_argument("file", metavar="FILE",
                   help="the evaluation (TOML): models, sets and their roles, protocols and "
                        "their options, the ensemble rows, the output folder (docs/evaluate.md; "
                        "examples/standin.toml, examples/imagenet.toml)")
    p.add_argument("--out", default=None,
                   help="the output folder instead of the file's out (caches/, scores/, "
                        "plots/, site/, evaluate.state.json)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan and its cost: the models and their weights, the cells "
                        "to compute and those complete, the scores to compute and why; "
                        "nothing is computed, downloaded or written")
    p.add_argument("--overwrite", action="store_true",
                   help="recompute everything, the caches included, and replace what the "
                        "output folder holds (a rerun without it computes only what is "
                        "missing or out of date)")
    p.add_argument("--no-figures", action="store_true",
                   help="draw no figure (as the file's figures = false): the scores and the "
                        "site only")
    add_cluster_options(p, workers="--n-workers")  # --scheduler, --cluster, --jobs, ...
    mark_launcher(p.add_argument("--cell-threads", type=COUNT, default=None,
                                 help="torch threads inside each sweep cell (default: "
                                      "--threads)"))
    # --device, the loader's --workers: where and how the models run, which the file's
    # [predict] table never gives (a file is data)
    add_launcher_options(p)


def _cmd_evaluate(a: argparse.Namespace) -> int:
    from uqmetrics.runs.sweep import ClusterSpec

    from ..evaluate import (
        dry_run_lines,
        launcher_settings,
        plan_evaluation,
        read_evaluation,
        run_evaluation,
    )
    from . import main  # each score runs as ``uqvision score NAME``
    from .predict import say_left_out

    evaluation = read_evaluation(a.file, out=a.out)
    if a.no_figures:
        evaluation = dataclasses.replace(evaluation, figures=False)
    plan = plan_evaluation(evaluation, overwrite=a.overwrite, launcher=launcher_settings(a))
    by_name = {s.name: s for s in evaluation.sets}
    for name, skipped in plan.skipped.items():  # [predict] skip-bad-images = true
        say_left_out(a.command, f"{evaluation.source}: [predict] skip-bad-images",
                     f"[sets.{name}] {str(by_name[name].path)!r}", skipped)
    # checked before a dry run too: the same refusals (--gpus off cuda, fewer GPUs than asked)
    cluster = ClusterSpec.from_args(a, device=str(plan.config.device))
    if a.dry_run:  # with --gpus the local cluster has one worker per GPU, not --n-workers
        for line in dry_run_lines(plan, n_workers=len(cluster.gpus) if cluster.gpus else a.n_workers):
            _print(line)
        return 0
    report = run_evaluation(plan, command=main, scheduler=cluster, n_workers=a.n_workers,
                            threads=a.cell_threads or a.threads, log=_print)
    return report.status
