"""The commands built from the protocol registry (:data:`~uqvision.protocols.VISION_PROTOCOLS`):
``uqvision score PROTOCOL`` (a sub-command per protocol that scores: the common options, the
protocol's own, its table beside the score file), ``uqvision plot`` (``--SCORE_NAME FILE`` per
protocol that draws its score files) and ``uqvision reproduce NAME`` (a sub-command per
protocol with a driver: the options of :class:`~uqvision.protocols.ReproduceOptions` and the
protocol's shorthands of ``--set`` pairs).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from functools import partial
from pathlib import Path

from uqmetrics import InputError, write_dataset
from uqmetrics.runs.config_options import mark_launcher
from uqmetrics.runs.io import check_apart
from uqmetrics.runs.run_config import (
    add_config_option,
    config_beside,
    config_in_by_digest,
    current_run_config,
    derived_config,
)

from ..cache import check_caches
from ..exceptions import SkippedCacheWarning
from ..options import (
    SEED,
    ConfigOption,
    add_config_options,
    check_output_file,
    check_output_folder,
    config_kwargs,
    device_type,
    set_pairs,
)
from ..protocols import (
    VISION_PROTOCOLS,
    Protocol,
    ReproduceOptions,
    score_protocol,
)
from ..protocols.base import check_protocol_file, option_input_error
from ..score_options import _retire, add_score_options
from .base import _add_subcommands, _Parser, _print, _progress


def _options_given(a: argparse.Namespace) -> dict[str, object]:
    """The options of a parsed command line as typed (``--calibration-size``) -> their values
    (what :func:`~uqvision.protocols.base.option_input_error` names)."""
    return {f"--{dest.replace('_', '-')}": value for dest, value in vars(a).items()
            if value is not None and not isinstance(value, bool)}


def _cmd_score(a: argparse.Namespace) -> int:
    protocol = score_protocol(a.protocol)
    out = Path(a.out)
    if out.suffix.lower() != ".nc":  # the table beside it is STEM.csv and STEM.json
        raise InputError(f"--out {a.out!r} must be a score file ending in .nc (its table is "
                         f"written beside it: STEM.csv, STEM.json), e.g. "
                         f"--out {str(out.with_suffix('.nc'))!r}")
    outputs = [out] + ([out.with_name(out.stem + suffix) for suffix in
                        protocol.score_table.suffixes] if protocol.score_table else [])
    for path in outputs:  # the score file and the table beside it
        check_apart(path, {"--caches": a.caches})  # --overwrite never replaces an input
        check_output_file("--out", path, a.overwrite)
    files, skipped = check_caches("--caches", a.caches)
    listed = "; ".join(f"{p.name} ({why})" for p, why in skipped.items())
    if skipped and not a.skip_incomplete:
        raise InputError(f"--caches: {len(skipped)} of {len(files)} cache files would not be "
                         f"scored: {listed}; recompute them, or pass --skip-incomplete to score "
                         "the others")
    from ..predictors import MixedEnsembleWarning  # imported on use

    table = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore", SkippedCacheWarning)  # said in the summary line
        warnings.simplefilter("always", MixedEnsembleWarning)  # one line each, below
        try:
            ds = protocol.score(a)
            if protocol.score_table is not None:
                table = protocol.score_table.make(a, ds)
        except (OSError, ValueError) as exc:  # a file an option gave: named with the option
            named = option_input_error(exc, _options_given(a))
            if named is None:
                raise
            raise named from None
    for w in caught:
        if issubclass(w.category, MixedEnsembleWarning):
            print(f"uqvision score {a.protocol}: warning: {w.message}", file=sys.stderr,
                  flush=True)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    line = str(write_dataset(ds, a.out, overwrite=a.overwrite))
    if skipped:
        line += (f"  (--skip-incomplete: {len(skipped)} of {len(files)} cache files not "
                 f"scored: {listed})")
    _print(line)
    if table is not None:  # the headline columns, as wide as a terminal; all of them: the CSV
        terminal = getattr(table, "terminal", None)
        _print(table.format() if terminal is None else
               terminal(full=str(out.parent / f"{out.stem}.csv")))
        for path in table.write(out.parent, out.stem, overwrite=a.overwrite):
            _print(str(path))
    return 0


def _args_score(p: argparse.ArgumentParser) -> None:
    _retire(p, "--protocol", "the protocol is now the sub-command: write 'uqvision score {value} "
                             "--caches ...' instead of 'uqvision score --protocol {value} "
                             "--caches ...'")
    _add_subcommands(p, "protocol", "PROTOCOL", "protocols (uqvision score PROTOCOL -h for its "
                     "options)", [
                         (proto.name, proto.score_names[1:], _first_line(proto.score.__doc__),
                          partial(_args_score_protocol, proto))
                         for proto in VISION_PROTOCOLS.values() if proto.score is not None])


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


#: The options of ``uqvision score NAME`` (:func:`uqvision.score_options.add_score_options`).
_args_score_protocol = add_score_options


def score_run_config(proto: Protocol, values: dict) -> dict:
    """The run configuration of ``uqvision score NAME`` with ``values`` (option destinations;
    the others at their defaults), as part of the command running: what a sweep records in
    the score file it writes, so that ``uqvision rerun`` scores again (``--with-sweep``: the
    sweep; :func:`uqmetrics.runs.run_config.derived_config`)."""
    p = _Parser(prog=f"uqvision score {proto.name}")
    _args_score_protocol(proto, p)
    return derived_config(p, values, part_of=current_run_config())


def _config_files_score(a: argparse.Namespace, config) -> list[Path]:
    """``<score file stem>.config.toml`` beside the score file."""
    return [config_beside(a.out)]


def _plotted() -> list[Protocol]:
    """The protocols whose score files ``uqvision plot --NAME FILE`` draws."""
    return [p for p in VISION_PROTOCOLS.values() if p.plots is not None]


def _plot_flags(proto: Protocol) -> list[str]:
    """The options of ``uqvision plot`` that give a score file of ``proto``: ``--NAME`` (the
    protocol's name, as ``score NAME`` and ``reproduce NAME``), then ``--SCORE_NAME``, its
    alias where it differs, both from the protocol registry."""
    return list(dict.fromkeys(f"--{n}" for n in (proto.name, proto.score_name) if n))


#: How many items a one-line message names before it gives only their count.
_NAMED = 3


def _some(items: list[str]) -> str:
    """The first :data:`_NAMED` of ``items`` and the count of the rest (one line however many
    there are): ``'a' (why); 'b' (why); 'c' (why) and 7 more``."""
    shown = "; ".join(items[:_NAMED])
    return shown + (f" and {len(items) - _NAMED} more" if len(items) > _NAMED else "")


def _check_plot_caches(caches: list[str]) -> None:
    """:func:`~uqvision.cache.check_caches` of ``plot --caches``, the files that are no
    complete cache named three and counted (a folder of many foreign files: one short line)."""
    try:
        check_caches("--caches", caches)
    except InputError as exc:
        from ..cache import incomplete_caches

        try:
            files, skipped = incomplete_caches([str(c) for c in caches])
        except (OSError, ValueError):
            raise exc from None
        if not files or len(skipped) != len(files) or len(skipped) <= _NAMED:
            raise
        shown = " ".join(repr(str(c)) for c in caches)
        by_why: dict[str, list[str]] = {}
        for path, why in skipped.items():
            by_why.setdefault(why, []).append(repr(str(path)))
        raise InputError(f"--caches {shown}: no complete prediction cache found among its "
                         f"{len(files)} .nc files: " + "; ".join(
                             f"{len(paths)} {why}: {_some(paths).replace('; ', ', ')}"
                             for why, paths in by_why.items())) from None


def other_tool(path: str | Path) -> str | None:
    """The tool other than uqvision that wrote the result file ``path`` (``uqreg``), as its
    attrs say (the command of its ``run_config``, else a ``title`` that begins with a tool
    whose ``<tool>_version`` is recorded); None when uqvision wrote it, when it says nothing,
    or when it cannot be read (the readers say why)."""
    from uqmetrics.runs.io import READ_ERRORS, decode_attr, open_netcdf

    try:
        if not Path(path).is_file():
            return None
        with open_netcdf(path) as ds:
            attrs = dict(ds.attrs)
    except READ_ERRORS:
        return None
    try:
        run = decode_attr(attrs.get("run_config"))
    except (TypeError, ValueError):
        run = None
    words = (str(run.get("command", "")) if isinstance(run, dict) else "").split()
    if not words:  # no command recorded: a title naming a tool whose version is recorded
        words = [w for w in str(attrs.get("title", "")).split()[:1] if f"{w}_version" in attrs]
    tool = words[0] if words else ""
    return tool if tool and tool != "uqvision" and tool.isidentifier() else None


def _cmd_plot(a: argparse.Namespace) -> int:
    from ..plots import plot_caches, skipped_figures  # figures: imported on use

    flags = ["--caches", *("/".join(_plot_flags(p)) for p in _plotted())]
    files = [(p, getattr(a, p.name)) for p in _plotted() if getattr(a, p.name)]
    if not (a.caches or files):
        raise InputError(f"nothing to plot (give {', '.join(flags[:-1])} and/or {flags[-1]})"
                         if len(flags) > 1 else "nothing to plot (give --caches)")
    for proto, file in files:  # a score file of the option's protocol, before any work
        option = a.plot_flags.get(proto.name, f"--{proto.name}")
        tool = other_tool(file)
        if tool is not None:
            raise InputError(f"{option} {str(file)!r} is a result of {tool} (its attrs say so), "
                             f"not a uqvision score file: draw it with {tool} plot")
        check_protocol_file(option, file, proto.name)
    if a.caches:
        _check_plot_caches(a.caches)
    check_output_folder("--out", a.out)
    paths = []
    try:
        with skipped_figures(_print):
            if a.caches:
                paths += plot_caches(a.caches, a.out, dataset=a.dataset)
            for proto, file in files:
                paths += proto.plots.draw(file, a.out)
    except OSError as exc:  # a figure that cannot be saved (a full disk, a read-only folder)
        raise _out_error(exc, a) from None
    if not paths:
        raise InputError(f"the files given ({', '.join(flags)}) hold nothing to plot")
    for p in paths:
        _print(str(p))
    return 0


def _out_error(exc: OSError, a: argparse.Namespace) -> BaseException:
    """An OS error of ``uqvision plot`` as an :class:`~uqmetrics.InputError` naming the option
    that gave the file at fault: ``--out`` for the folder, a parent or a figure in it, else the option
    of an input file (:func:`~uqvision.protocols.base.option_input_error`); ``exc`` itself
    when no option gave it."""
    from uqmetrics import error_line

    out = Path(a.out)
    at = Path(exc.filename) if exc.filename is not None else None
    if at is not None and (at == out or out in at.parents or at in out.parents):
        rest = error_line(exc).removeprefix(f"{exc.filename}:").strip()
        return InputError(f"--out {a.out!r}: " + (rest if at == out
                                                   else f"{str(at)!r}: {rest}"))
    given = {"--caches": a.caches, **{a.plot_flags.get(p.name, f"--{p.name}"): getattr(a, p.name)
                                      for p in _plotted()}}
    return option_input_error(exc, given) or exc


class _PlotFile(argparse.Action):
    """``--NAME FILE`` of ``uqvision plot``, recording the spelling given (the name or its
    alias, the score name) for the messages about the file."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        given = dict(getattr(namespace, "plot_flags", None) or {})
        given[self.dest] = option_string or f"--{self.dest}"
        namespace.plot_flags = given


def _args_plot(p: argparse.ArgumentParser) -> None:
    p.add_argument("--caches", nargs="+", default=None, metavar="CACHE",
                   help="prediction caches (files or folders): a reliability diagram per "
                        "model and the risk-coverage curves of all")
    for proto in _plotted():  # --NAME FILE (alias --SCORE_NAME): a protocol's score file
        flags = _plot_flags(proto)
        p.add_argument(*flags, dest=proto.name, default=None, metavar="FILE",
                       action=_PlotFile,
                       help=proto.plots.help)
    p.add_argument("--dataset", default=None, metavar="NAME",
                   help="with --caches: draw the caches of this dataset_name only (e.g. val; "
                        "default: the only one they hold)")
    p.add_argument("--out", required=True, help="figure directory")
    p.set_defaults(plot_flags={})


def _cmd_reproduce(a: argparse.Namespace) -> int:
    proto = VISION_PROTOCOLS.lookup(a.name)
    driver = proto.reproduce
    if a.scale not in driver.scales:
        raise ValueError(f"--scale {a.scale!r} is not a scale of {a.name!r}; choose from "
                         f"{list(driver.scales)}")
    check_output_folder("--out", a.out)
    options = set_pairs(a.set)
    if proto.reproduce_flags is not None:  # its own options: shorthands of --set pairs
        options.update(proto.reproduce_flags.options(a))
    # the driver's steps on stderr (none under uqvision --quiet), its result on stdout
    out = driver.run(a.out, **config_kwargs(a, _REPRODUCE_OPTIONS), options=options,
                     log=_progress)
    _print(str(out))
    return 0


#: ``uqvision reproduce`` options generated from :class:`ReproduceOptions` (the defaults every
#: driver's ``run`` has).
_REPRODUCE_OPTIONS = (
    ConfigOption("scale", help="smoke (tests, minutes) or cpu (2 cores; times per protocol "
                               "in docs/reproduction-vision.md); a driver lists its scales "
                               "(default: {default})"),
    ConfigOption("data", help="a real image folder (train/ val/ test/) instead of the stand-in"),
    ConfigOption("arch", help="timm architecture for --data (and a driver's real folders)"),
    ConfigOption("seed", type=SEED),
    ConfigOption("device", type=device_type, launcher=True,
                 help="where every network trains and predicts: cpu | cuda | cuda:N"),
    ConfigOption("overwrite"),
)
#: The driver options (``--set KEY=VALUE``) that say how the work runs, never taken from a file
#: (:func:`uqmetrics.runs.config_options.mark_launcher`): the processes a driver starts
#: (``workers``) and the torch threads of each (``threads``), the names every driver, a
#: plugin's too, gives them.
_SET_LAUNCHER_KEYS = ("workers", "threads")


def _args_reproduce(p: argparse.ArgumentParser) -> None:
    _add_subcommands(p, "name", "NAME", "papers (uqvision reproduce NAME -h for its options)", [
        (name, (), proto.reproduce.description, partial(_args_reproduce_protocol, proto))
        for name, proto in VISION_PROTOCOLS.items_ordered() if proto.reproduce is not None])


def _args_reproduce_protocol(proto: Protocol, p: argparse.ArgumentParser) -> None:
    """The options of ``uqvision reproduce NAME``: the common ones and the protocol's own."""
    p.add_argument("--out", required=True)
    add_config_options(p, ReproduceOptions, _REPRODUCE_OPTIONS)
    if proto.reproduce_flags is not None:
        proto.reproduce_flags.add(p)
    mark_launcher(p.add_argument("--set", action="append", metavar="KEY=VALUE",
                                 help="driver option (repeatable)"), keys=_SET_LAUNCHER_KEYS)
    add_config_option(p)


def _config_files_reproduce(a: argparse.Namespace, config) -> list[Path]:
    """``OUT/reproduce-NAME.<digest>.config.toml``: a reproduction resumes its folder, each
    run its own file (named by its options)."""
    return [config_in_by_digest(a.out, f"reproduce-{a.name}", config)]
