"""``uqvision`` command line: a thin layer over the library API.

Commands (:data:`COMMANDS`): ``data``, ``train``, ``predict``, ``score PROTOCOL``, ``sweep``,
``plot``, ``reproduce PROTOCOL``, ``demo``, then the commands the protocols bring
(``uqvision <command> -h`` for options). Choices and their help come from the registries:
dataset makers, prediction modes, augmentations, training methods, zoos. Every protocol's part
comes from :data:`~uqvision.protocols.VISION_PROTOCOLS` (:class:`~uqvision.protocols.Protocol`:
its ``score`` sub-command and options, its ``reproduce`` sub-command and options, its ``plot``
option, its scoring of ``sweep``, its commands, the line ``predict`` prints): no module of
this package names a protocol. Every command that writes results (``data``, ``train``,
``predict``, ``score NAME``, ``sweep``, ``reproduce NAME``) takes ``--config FILE`` and writes
its fully resolved configuration beside them (:attr:`Command.config_files`;
:mod:`uqmetrics.runs.run_config`), also recorded in the result files' ``run_config`` attr, which
``uqvision rerun RESULT.nc`` runs again. ``predict`` runs under ``torchrun`` as is (``torchrun
--nproc_per_node N -m uqvision predict ...``): samples are sharded exactly and the logits
gathered before rank 0 writes.

A command imports what it runs and no more (docs/conventions.md#fast-help): the parsers are
built from light modules (no torch, timm or Dask: ``uqvision -h`` and every ``COMMAND -h``),
the names of the registries whose modules import torch from :mod:`uqvision.catalog`, and
:func:`main` adds only the arguments of the command it runs, down to the protocol of
``score`` and ``reproduce`` and the maker of ``data``; then it fills the registries
(:func:`uqvision.load_registries`) and runs the command, which imports what it uses (scoring,
plotting, metadata, sweeps and the demo only where used: ``uqvision predict`` and ``uqvision
train`` load no scoring module, no scipy, matplotlib or Dask). Errors name the sub-command
that failed (``uqvision data digits: error: ...``).

Progress (bars, progress lines) goes to stderr, results (paths written, tables) to stdout;
``uqvision --quiet COMMAND`` turns every progress bar and line of the process off
(:func:`uqmetrics.runs.sweep.set_progress`); errors still print.

One concern per module (every name that tests and tools read is importable from
``uqvision.cli`` itself):

- :mod:`~.base`: the parser (one-line errors, no abbreviated options, retired options, lazy
  sub-commands), the help formatter, the building of sub-commands, the result line;
- :mod:`~.train`: ``data MAKER`` and ``train``;
- :mod:`~.predict`: ``predict`` and the reading of ``--data`` (shared with ``sweep``); its
  options are :mod:`uqvision.predict.options` (shared with ``sweep`` and ``evaluate``);
- :mod:`~.score`: ``score``, ``plot`` and ``reproduce``, built from the protocol registry
  (``score NAME``'s options: :mod:`uqvision.score_options`, also ``evaluate``'s);
- :mod:`~.sweep`: ``sweep`` and its report of the models that failed;
- :mod:`~.demo`: ``demo``;
- :mod:`~.report`: ``report`` (the static leaderboard site of score files; the protocols'
  hooks: :mod:`uqvision.report_hooks`);
- :mod:`~.compare`: ``compare`` (a score file beside a published table);
- here: ``plugins``, :data:`COMMANDS` (the protocols' commands included), :func:`build_parser`
  and :func:`main`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from uqmetrics import run_command
from uqmetrics.metrics.registry import Registry
from uqmetrics.runs.run_config import rerun, run_recorded
from uqmetrics.runs.sweep import set_progress

from .. import load_registries
from ..options import COUNT, Command
from ..protocols import VISION_PROTOCOLS
from .base import _add_subcommands, _HelpFormatter, _Parser, _print
from .compare import _args_compare, _cmd_compare
from .demo import (
    _DEMO_OPTIONS,  # noqa: F401
    _args_demo,
    _cmd_demo,
)
from .evaluate import _args_evaluate, _cmd_evaluate
from .predict import (  # noqa: F401
    _PREDICT_OPTIONS,
    _args_predict,
    _cmd_predict,
    _config_files_predict,
    _predict_config,
)
from .report import _args_report, _cmd_report
from .score import (
    _REPRODUCE_OPTIONS,  # noqa: F401
    _args_plot,
    _args_reproduce,
    _args_score,
    _cmd_plot,
    _cmd_reproduce,
    _cmd_score,
    _config_files_reproduce,
    _config_files_score,
)
from .sweep import _args_sweep, _cmd_sweep, _config_files_sweep
from .train import (
    _TRAIN_OPTIONS,  # noqa: F401
    _args_data,
    _args_train,
    _cmd_data,
    _cmd_train,
    _config_files_data,
    _config_files_train,
)
from .verify import _args_verify, _cmd_verify

__all__ = ["COMMANDS", "Command", "build_parser", "main"]


def _cmd_rerun(a: argparse.Namespace) -> int:
    """``uqvision rerun RESULT``: the recorded command, printed, its options read back from
    ``RESULT`` (``--config RESULT``: no launcher option, no ``--overwrite``), ``--out``,
    ``--overwrite`` and the options after ``RESULT`` given here overriding them
    (:func:`uqmetrics.runs.run_config.rerun`). A score file a sweep wrote records the score command
    on the sweep's caches (rerun: the score alone) and the sweep (``--with-sweep``)."""
    return rerun(a.result, "uqvision", main, parser=build_parser(lazy=True), out=a.out,
                 overwrite=a.overwrite, options=a.options, yes=a.yes, whole=a.with_sweep)


def _args_rerun(p: argparse.ArgumentParser) -> None:
    p.add_argument("result", help="a result file (.nc: a score file, a cache) written by a "
                                  "uqvision command; any other option after it is the "
                                  "command's (e.g. --cluster slurm --jobs 4: a result file "
                                  "never gives launcher options)")
    p.add_argument("--out", default=None,
                   help="where the run writes, as the recorded command's --out: a file (.nc) "
                        "for a score file, a folder for caches, a sweep, a reproduction "
                        "(default: the recorded one, refused unless --overwrite)")
    p.add_argument("--with-sweep", action="store_true",
                   help="a score file written by uqvision sweep: run that sweep again (its "
                        "caches, then its scores; --out: its folder) instead of the score "
                        "alone")
    p.add_argument("--overwrite", action="store_true", help="replace the results there")
    p.add_argument("--yes", action="store_true",
                   help="run a command recorded by another user or on another host (or by a "
                        "file that records neither): read the command printed first")
    p.set_defaults(options=[])


def _cmd_plugins(a: argparse.Namespace) -> int:
    from ..plugins import PLUGIN_REGISTRIES, plugin_report

    _print(plugin_report())
    return 1 if any(reg.broken for reg in PLUGIN_REGISTRIES) else 0


#: ``uqvision NAME``: the subcommands, in help order.
COMMANDS: Registry[Command] = Registry("command")
COMMANDS.add("data", Command(_cmd_data, _args_data, "write a development image folder",
                             _config_files_data))
COMMANDS.add("train", Command(_cmd_train, _args_train,
                              "train a timm architecture with a training method (also under "
                              "torchrun); save a checkpoint", _config_files_train))
COMMANDS.add("predict", Command(_cmd_predict, _args_predict,
                                "cache per-sample logits of models over a folder",
                                _config_files_predict))
COMMANDS.add("score", Command(_cmd_score, _args_score, "score caches with a protocol",
                              _config_files_score))
COMMANDS.add("sweep", Command(_cmd_sweep, _args_sweep, "cache and score a model zoo on Dask",
                              _config_files_sweep))
COMMANDS.add("evaluate", Command(_cmd_evaluate, _args_evaluate, "the whole evaluation of a zoo "
                                 "from a TOML file: sweep, scores, figures, site (resumable)"))
COMMANDS.add("plot", Command(_cmd_plot, _args_plot,
                             "reliability, risk-coverage, metric-vs-size figures"))
COMMANDS.add("reproduce", Command(_cmd_reproduce, _args_reproduce,
                                  "reproduce a paper's protocol on the stand-in or a real folder",
                                  _config_files_reproduce))
COMMANDS.add("rerun", Command(_cmd_rerun, _args_rerun,
                              "run again the command a result file (.nc) records (its "
                              "run_config; printed first; --yes for one recorded by another "
                              "user or host), --out, --overwrite and launcher options given "
                              "here"))
COMMANDS.add("verify", Command(_cmd_verify, _args_verify,
                               "recompute a score file's (or a report site's) entries from "
                               "the caches it names; agree/disagree per metric (exit 1 on "
                               "any disagreement)"))
COMMANDS.add("report", Command(_cmd_report, _args_report,
                               "a static leaderboard site of score files (opens from disk)"))
COMMANDS.add("compare", Command(_cmd_compare, _args_compare,
                                "a score file's rows beside a published table's (Selective, "
                                "Pitfalls, OpenOOD v1.5, RAPS, ImageNet-C), matched by "
                                "checkpoint, with the differences"))
COMMANDS.add("plugins", Command(_cmd_plugins, lambda p: None,
                                "list the installed plugins (entry points); exit status 1 when "
                                "one did not load"))
COMMANDS.add("demo", Command(_cmd_demo, _args_demo,
                             "the whole chain on digits (a few minutes on 2 CPUs); torch "
                             "threads: --threads before the command (default 1)"))


def _add_protocol_commands() -> None:
    """The commands the protocols bring (``metadata``, ``split``), after the general ones,
    plugins' protocols included (their entries are loaded here: a protocol's entry imports
    no torch, its scorer and driver are imported on use)."""
    VISION_PROTOCOLS.load_plugins()
    for proto in VISION_PROTOCOLS.values():
        for name, cmd in proto.commands.items():
            COMMANDS.add(name, cmd)


_add_protocol_commands()


def build_parser(*, lazy: bool = False) -> argparse.ArgumentParser:
    """The argparse parser of ``uqvision``: one subparser per entry of :data:`COMMANDS`, and
    one per protocol under ``score`` and ``reproduce``.

    With ``lazy``, a subcommand's arguments are added when that command is parsed (what
    :func:`main` does: a command imports only what it runs); without, every subparser is
    complete (for tools and tests that inspect them)."""
    ap = _Parser(prog="uqvision", description=__doc__.split("\n")[0],
                 formatter_class=_HelpFormatter, lazy=lazy)
    ap.add_argument("--threads", type=COUNT, default=None,
                    help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--quiet", action="store_true",
                    help="no progress bar or progress line (stderr) in any command; results "
                         "and errors still print (uqmetrics.runs.sweep.set_progress)")
    _add_subcommands(ap, "command", None, None, [
        (name, (), cmd.description, cmd.arguments) for name, cmd in COMMANDS.items_ordered()])
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``uqvision`` console script."""
    try:  # a command's options import what it runs: a Ctrl-C may come during the imports
        parser = build_parser(lazy=True)
        args, extras = parser.parse_known_args(argv)
    except KeyboardInterrupt:
        print("uqvision: interrupted", file=sys.stderr)
        return 130
    command = parser.innermost()  # its errors name it: "uqvision score NAME: error: ..."
    if extras and args.command != "rerun":  # rerun passes them to the command it runs
        command.error(f"unrecognized arguments: {' '.join(extras)}")
    if extras:
        args.options = extras
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    cmd = COMMANDS.lookup(args.command)
    # --quiet: one switch for the whole process while the command runs (given back after, for
    # a caller that runs main() again)
    shown = set_progress(False) if args.quiet else None
    try:
        load_registries()  # the parsers were built from light modules; the command runs on all
        # its configuration recorded (uqmetrics.runs.run_config), its errors naming the
        # sub-command
        return run_command("uqvision", command.prog.partition(" ")[2],
                           lambda: run_recorded(args, lambda: cmd.run(args), cmd.config_files))
    finally:
        if shown is not None:
            set_progress(shown)
