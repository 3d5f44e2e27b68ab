"""What a protocol is: :class:`Protocol`, everything the command line and the tests need of it
(its scorer and options of ``uqvision score``, its reproduction driver and options of ``uqvision
reproduce``, its figures of ``uqvision plot``, its scoring of ``uqvision sweep``, the training
methods it compares, its extra commands), and :class:`Reproduction` (a driver of ``uqvision
reproduce``); and what the protocol folders build theirs from, so that none repeats another:
the wiring of a folder's scorer, options and figures (:func:`folder_protocol`,
:func:`config_scoring`, :func:`lazy_figures`), the scales and steps of the drivers that train a
deep ensemble and an MC-dropout network (:data:`ENSEMBLE_SCALES`, :func:`corrupted_study_driver`,
:func:`finish_reproduction`), and the figures' boilerplate (:func:`draw_protocol_figures`). The
findings' vocabulary is :mod:`uqvision.protocols.findings` (its test and table re-exported here).

A protocol folder's ``__init__`` builds one :class:`Protocol`, ``PROTOCOL``;
:mod:`uqvision.protocols` registers it in :data:`~uqvision.protocols.VISION_PROTOCOLS` (one line).
The command line (:mod:`uqvision.cli`) knows no protocol: it builds ``uqvision score NAME``,
``uqvision reproduce NAME``, the ``plot`` and ``sweep`` options and the extra commands from the
registry. Importing a protocol imports only what registers its training methods and prediction
modes: its scorer, its options, its commands and its driver import their modules when first
used (through :class:`LazyReproduction` for the driver), so that ``uqvision predict`` and
``uqvision train`` load no scoring code.
"""

from __future__ import annotations

import argparse
import importlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uqmetrics.metrics.exceptions import InputError
from uqmetrics.runs.io import read_dataset

from ..cache import incomplete_caches
from ..options import Command, add_config_options, config_kwargs
from .findings import findings_table, sign_verdict  # re-exported: their home is findings

__all__ = [
    "CORRUPTED_SCALES",
    "ENSEMBLE_SCALES",
    "Command",
    "DriverScale",
    "LazyReproduction",
    "Plots",
    "Protocol",
    "ReportTable",
    "ReproduceFlags",
    "ReproduceOptions",
    "Reproduction",
    "ScoreTable",
    "SweepPlan",
    "SweepScoring",
    "check_clean_members",
    "check_protocol_file",
    "clean_study_predictors",
    "config_scoring",
    "corrupted_study",
    "corrupted_study_driver",
    "corrupted_study_settings",
    "draw_protocol_figures",
    "ensemble_runs",
    "findings_table",
    "finish_reproduction",
    "folder_protocol",
    "fraction",
    "incomplete_caches",
    "lazy_figures",
    "option_input_error",
    "protocol_result",
    "sign_verdict",
    "train_and_predict",
]


@dataclass(frozen=True)
class ReproduceOptions:
    """The options every driver takes besides its output folder, its ``--set`` options and its
    log: the defaults of ``Reproduction.run`` (``uqvision reproduce`` generates its options
    from these fields; tests/test_protocols_common.py checks each driver's signature against
    them).

    Attributes
    ----------
    scale : str
        A scale of the driver (``smoke``: tests, minutes; ``cpu``: 2 cores, times per protocol in
        docs/reproduction-vision.md).
    data : str or None
        A real image folder (``train/ val/ test/``) instead of the generated stand-in.
    arch : str or None
        The timm architecture for ``data`` (and URL's ``upstream``).
    seed : int
    device : str
        Where every network trains and predicts: ``cpu``, ``cuda`` or ``cuda:N``.
    overwrite : bool
        Recompute outputs that exist.
    """

    scale: str = "smoke"
    data: str | None = None
    arch: str | None = None
    seed: int = 0
    device: str = "cpu"
    overwrite: bool = False


@dataclass(frozen=True)
class DriverScale:
    """What every scale of a driver that trains on the generated stand-in has (a driver's own
    scale dataclass adds its sizes after these fields).

    Attributes
    ----------
    name : str
        The scale (``--scale``: ``smoke``, ``cpu``, ...).
    description : str
        One line: its sizes and its time.
    hierarchy : str
        The scale of the generated ``hierarchy`` stand-in (:func:`uqvision.hierarchy.
        make_hierarchy`).
    """

    name: str
    description: str
    hierarchy: str


@dataclass(frozen=True)
class Reproduction:
    """A paper reproduction (``uqvision reproduce NAME``).

    Attributes
    ----------
    name, description : str
        The protocol's name and one-line help.
    run : callable
        ``run(out, *, scale, data=None, arch=None, seed=0, overwrite=False, options=None,
        log=print, device="cpu") -> Path`` (``options``: the ``--set key=value`` pairs as a
        dict of strings; ``device``: where every network trains and predicts, ``--device``).
    scales : tuple of str
        The scales the driver knows (``smoke`` for tests, ``cpu`` for a 2-core machine, ...).
    """

    name: str
    description: str
    run: Callable[..., Path]
    scales: tuple[str, ...] = ("smoke", "cpu")


class LazyReproduction:
    """A :class:`Reproduction` whose module is imported on the first use of ``run`` or
    ``scales`` (a driver imports the training, prediction and scoring stack).

    Parameters
    ----------
    name, description : str
        As the driver's (known without the import).
    module : str
        The module whose ``REPRODUCTION`` is the driver, e.g.
        ``"uqvision.protocols.url.reproduce"``.

    Examples
    --------
    >>> from uqvision.protocols import VISION_PROTOCOLS
    >>> driver = VISION_PROTOCOLS.lookup("url").reproduce
    >>> driver.name, driver.scales, driver.driver.run is driver.run
    ('url', ('smoke', 'cpu'), True)
    """

    def __init__(self, name: str, description: str, module: str):
        self.name = name
        self.description = description
        self.module = module

    @property
    def driver(self) -> Reproduction:
        """The module's :class:`Reproduction` (the module imported on first use)."""
        driver = importlib.import_module(self.module).REPRODUCTION
        if driver.name != self.name:
            raise RuntimeError(f"{self.module}.REPRODUCTION is {driver.name!r}, not {self.name!r}")
        return driver

    @property
    def run(self) -> Callable[..., Path]:
        """The driver's ``run`` (see :class:`Reproduction`)."""
        return self.driver.run

    @property
    def scales(self) -> tuple[str, ...]:
        """The driver's scales."""
        return self.driver.scales

    def __repr__(self) -> str:
        return f"LazyReproduction({self.name!r}, module={self.module!r})"


@dataclass(frozen=True)
class ReproduceFlags:
    """A protocol's own options of ``uqvision reproduce NAME``, beside the common ones
    (:class:`ReproduceOptions`, ``--out``, ``--set``): shorthands of driver options, e.g. URL's
    ``--upstream ROOT --downstream ROOT ...`` for ``--set upstream=ROOT --set
    downstream=A,B``.

    Attributes
    ----------
    add : callable
        ``add(parser)``: adds the options.
    options : callable
        ``options(args) -> dict``: the driver options (``--set`` key -> string) the parsed
        options stand for; they override the ``--set`` pairs of the same key.
    """

    add: Callable[[argparse.ArgumentParser], None]
    options: Callable[[argparse.Namespace], dict[str, str]]


@dataclass(frozen=True)
class ReportTable:
    """The leaderboard a protocol's readers look for: the report site's default view of its
    score files (``uqvision report``, :class:`uqmetrics.report.ReportHook`; docs/report.md).

    Attributes
    ----------
    rows : tuple of str
        The dims stacked into one row, the score file's ``entries`` dim first (e.g.
        ``("model", "detector")``: a row per model and detector).
    headline : tuple of str or callable
        The metric columns shown by default, in uqmetrics.report's names (``near_auroc``,
        ``coverage[alpha=*,calibration=none]``; ``*``: every label of that dim), or
        ``headline(ds) -> list of str``; empty: the generic rule.
    metrics : mapping
        Variables shown as metric columns although the file tags no metric on them (e.g.
        conformal ``coverage``, where neither direction is better): variable -> (metric,
        greater_is_better or None).
    means : tuple of str
        Derived columns, the mean of a variable at the named labels over its other dims
        (``accuracy[calibration=none]`` over corruption and severity).
    images : str
        Which images each number covers, in words; the page adds the datasets and the counts
        the file and its caches record.
    """

    rows: tuple[str, ...] = ("model",)
    headline: tuple[str, ...] | Callable[[Any], Sequence[str]] = ()
    metrics: Mapping[str, tuple[str, bool | None]] = field(default_factory=dict)
    means: tuple[str, ...] = ()
    images: str = ""


@dataclass(frozen=True)
class Plots:
    """What ``uqvision plot --SCORE_NAME FILE`` draws from a score file of the protocol (the
    option is named after :attr:`Protocol.score_name`, e.g. ``--ensembles``).

    Attributes
    ----------
    draw : callable
        ``draw(score_file, out) -> list of Path``: the figures written into folder ``out``
        (imports the plotting code on use).
    help : str
        The option's help.
    """

    draw: Callable[[str | os.PathLike, str | os.PathLike], list[Path]]
    help: str

    def draw_as(self, score_file: str | os.PathLike, out: str | os.PathLike,
                fmt: str = "svg") -> list[Path]:
        """:attr:`draw` with every figure saved as ``fmt`` instead of PNG
        (:func:`uqmetrics.report.plotting.figure_format`: the one save path of every figure), e.g. the
        SVG figures ``uqvision report`` inlines.

        Returns
        -------
        list of Path
            The files written into ``out`` (suffix ``.<fmt>``).
        """
        from uqmetrics.report.plotting import figure_format  # matplotlib: imported on use

        with figure_format(fmt):
            return self.draw(score_file, out)


@dataclass(frozen=True)
class ScoreTable:
    """A table ``uqvision score NAME`` prints and writes beside the score file: ``STEM.csv`` and
    ``STEM.json`` for a score file ``STEM.nc`` (checked before any work, like the score file).

    Attributes
    ----------
    make : callable
        ``make(args, scores) -> table`` from the parsed options and the scores just computed;
        the table has ``format() -> str`` (printed) and ``write(folder, stem, *, overwrite) ->
        paths`` (as :class:`uqvision.results.ResultsTable`).
    suffixes : tuple of str
        The files ``write`` makes, ``STEM + suffix`` each.
    """

    make: Callable[[argparse.Namespace, Any], Any]
    suffixes: tuple[str, ...] = (".csv", ".json")


@dataclass(frozen=True)
class SweepPlan:
    """What a protocol will do with the caches of one ``uqvision sweep`` (its
    :attr:`SweepScoring.plan`, made before any model runs).

    Attributes
    ----------
    target : Path or None
        The score file it writes; None when these caches are not scored (``reason`` says why).
    reason : str
        Why they are not scored, and how to score them otherwise.
    finish : callable or None
        ``finish(report, log)`` after the sweep (``report``: the
        :class:`uqvision.sweep.SweepReport`, when it cached any model): scores ``target`` and
        writes what goes with it (figures, tables), each path said through ``log``.
    """

    target: Path | None
    reason: str = ""
    finish: Callable[[Any, Callable[[str], None]], None] | None = None

    @property
    def line(self) -> str:
        """The ``scores: ...`` line of the sweep's summary."""
        return f"scores: {self.target}" if self.target is not None else \
            f"scores: none ({self.reason})"


@dataclass(frozen=True)
class SweepScoring:
    """How a protocol scores the caches of ``uqvision sweep`` (the selective protocol's zoo).

    Attributes
    ----------
    add_options : callable
        ``add_options(parser)``: its options of ``uqvision sweep``.
    plan : callable
        ``plan(args, *, out, data, dataset, config) -> SweepPlan``, called before any model
        runs (``out``: the sweep folder, ``data``: the image folder, ``dataset``: its name,
        ``config``: the :class:`uqvision.predict.PredictConfig` of the caches): checks its
        options against them and refuses (``InputError`` naming the option) a target it must
        not replace.
    outputs : str
        What it writes in the sweep folder (the help of ``--out``).
    """

    add_options: Callable[[argparse.ArgumentParser], None]
    plan: Callable[..., SweepPlan]
    outputs: str = ""


@dataclass(frozen=True)
class Protocol:
    """One evaluation protocol: everything the command line and the tests need of it.

    Attributes
    ----------
    name : str
        The folder's name; ``uqvision score NAME``, ``uqvision reproduce NAME``.
    description : str
        One line (CLI help).
    score : callable or None
        ``score(args) -> xarray.Dataset`` from the parsed ``uqvision score NAME`` options
        (``args.caches``, ``args.dataset``, ``args.seed`` and the protocol's own options).
    score_name : str
        The other name ``uqvision score`` knows the protocol by (``ensembles``, ``ood``, ...:
        what the score is of; an alias of ``name``) and the option of ``uqvision plot``
        (``--ensembles``).
    add_options : callable or None
        ``add_options(parser)``: the protocol's own options of ``uqvision score NAME``.
    reproduce : Reproduction or LazyReproduction or None
        The driver of ``uqvision reproduce NAME`` (lazily imported: :class:`LazyReproduction`).
    methods : tuple of str
        The training methods (entries of ``TRAINING_METHODS``) the protocol compares.
    registers : tuple of str
        The modules that register its own training methods and prediction modes, imported
        when the registries are filled (:func:`uqvision.load_registries`), not with the
        protocol: its entry, which the command line reads to build its options, imports no
        torch (docs/conventions.md#fast-help).
    commands : mapping
        Extra subcommands, name -> :class:`Command` (e.g. UIMNET's ``split``).
    smoke_options : mapping
        ``--set`` options for the cheapest run of the driver (``tests/test_protocols_common.py``).
    section : str
        The anchor of the protocol's section of ``docs/conventions.md`` (``v-1``): the
        repository's documentation tests require it.
    reproduce_flags : ReproduceFlags or None
        Its own options of ``uqvision reproduce NAME`` (URL's ``--upstream``/``--downstream``).
    score_table : ScoreTable or None
        A table ``uqvision score NAME`` prints and writes beside the score file.
    plots : Plots or None
        What ``uqvision plot --SCORE_NAME FILE`` draws.
    sweep : SweepScoring or None
        How ``uqvision sweep`` scores its caches with this protocol (its options, its checks
        before any work, its scores, figures and tables after).
    after_predict : str
        A line ``uqvision predict`` prints after the caches it wrote (``{caches}``: their
        folder), e.g. how to score them; empty: none.
    rescore : callable or None
        ``rescore(result, result_path) -> xarray.Dataset``: a score file of the protocol
        recomputed by its own scorer from the caches (attr ``caches``) and with the
        configuration (attr ``config``) it records (``uqvision verify``, :mod:`uqmetrics.report.verify`);
        None: its score files cannot be verified (``verify`` says so, never agreement).
    report : ReportTable or None
        Its leaderboard on the report site (rows, headline columns, ...); None: the generic
        reading (the row dim most metric variables have, the generic headline rule).
    check_options : callable or None
        ``check_options(args, n_test)``: refuse (``ValueError`` naming the option) parsed
        ``uqvision score NAME`` options that its scorer would refuse on a test set of
        ``n_test`` images, so that ``uqvision evaluate`` refuses them before the sweep (the
        selective protocol's calibration size); None: nothing to check.
    """

    name: str
    description: str
    score: Callable[[argparse.Namespace], Any] | None = None
    score_name: str = ""
    add_options: Callable[[argparse.ArgumentParser], None] | None = None
    reproduce: Reproduction | LazyReproduction | None = None
    methods: tuple[str, ...] = ()
    registers: tuple[str, ...] = ()
    commands: Mapping[str, Command] = field(default_factory=dict)
    smoke_options: Mapping[str, str] = field(default_factory=dict)
    section: str = ""
    reproduce_flags: ReproduceFlags | None = None
    score_table: ScoreTable | None = None
    plots: Plots | None = None
    sweep: SweepScoring | None = None
    after_predict: str = ""
    rescore: Callable[[Any, Path], Any] | None = None
    report: ReportTable | None = None
    check_options: Callable[[argparse.Namespace, int], None] | None = None

    @property
    def scales(self) -> tuple[str, ...]:
        """The reproduction's scales (none without a driver)."""
        return self.reproduce.scales if self.reproduce else ()

    @property
    def score_names(self) -> tuple[str, ...]:
        """``uqvision score``'s names of the protocol: ``name``, then ``score_name`` when it
        differs (its alias)."""
        return (self.name,) + ((self.score_name,) if self.score_name not in ("", self.name)
                               else ())



# ---------------------------------------------------------------------------------------------
# the scoring and the figures of a protocol whose scorer takes its caches and a config


def fraction(text: str) -> float:
    """argparse type of an option that is a fraction in (0, 1) (and of its key in a
    ``--config`` file)."""
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1), got {text!r}")
    return value


fraction.__name__ = "_fraction"  # argparse's "invalid _fraction value: ..." as it always said


def config_scoring(module: str, config: str, scorer: str, options: Sequence[Any], help: str,
                   *, notes: str | None = None, name: str = "") -> dict[str, Callable]:
    """The ``score``, ``add_options`` and ``rescore`` of a :class:`Protocol` whose scorer is
    ``scorer(caches, Config(...))`` (shift, ood, conformal), each importing ``module`` (the
    protocol's scoring module) on use: the options' help needs no scoring code.

    Parameters
    ----------
    module : str
        The module of the config dataclass and the scorer, e.g.
        ``"uqvision.protocols.shift.score"``.
    config, scorer : str
        Their names in ``module`` (``"ShiftConfig"``, ``"score_shift"``).
    options : sequence of uqvision.options.ConfigOption
        The protocol's options of ``uqvision score NAME``, generated from the config's fields
        (:func:`uqvision.options.add_config_options`).
    help : str
        The one line ``uqvision score`` lists the protocol with (``score.__doc__``).
    notes : str, optional
        The name in ``module`` of a warning class said as one line on stderr when scoring
        (``uqvision score NAME: note: ...``; the other warnings as they came) and not said
        when rescoring (``uqvision verify``).
    name : str
        The protocol's name in those lines.

    Returns
    -------
    dict
        ``{"score": ..., "add_options": ..., "rescore": ...}``, the :class:`Protocol`
        fields.
    """
    def load(attr: str) -> Any:
        return getattr(importlib.import_module(module), attr)  # imported on use

    def add_options(p: argparse.ArgumentParser) -> None:
        add_config_options(p, load(config), options)

    def score(a: argparse.Namespace) -> Any:
        import sys
        import warnings

        make, run = load(config), load(scorer)
        kw = config_kwargs(a, options)
        if notes is None:
            return run(a.caches, make(**kw, seed=a.seed))
        said = load(notes)
        with warnings.catch_warnings(record=True) as caught:  # said in one line below
            warnings.simplefilter("always", said)
            ds = run(a.caches, make(**kw, seed=a.seed))
        for w in caught:
            if issubclass(w.category, said):
                print(f"uqvision score {name}: note: {w.message}", file=sys.stderr, flush=True)
            else:  # the others as they came (an ensemble of several architectures)
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return ds

    def rescore(result: Any, path: Path) -> Any:
        """The score file recomputed from the caches and with the configuration it records
        (``uqvision verify``; the ``notes`` warning was said when it was scored, and is in
        its ``notes``, compared as the rest)."""
        import warnings

        from ..provenance import recorded_caches, recorded_config
        from ..roles import legacy_config

        make, run = load(config), load(scorer)
        if notes is None:
            return run(recorded_caches(result), make(**legacy_config(recorded_config(result))))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", load(notes))
            return run(recorded_caches(result), make(**legacy_config(recorded_config(result))))

    score.__doc__ = help
    return {"score": score, "add_options": add_options, "rescore": rescore}


def folder_protocol(package: str, description: str, *, plots: str = "",
                    **fields: Any) -> Protocol:
    """The :class:`Protocol` of a protocol folder: named after the folder (``score_name`` the
    same unless given), its driver ``REPRODUCTION`` of ``<package>.reproduce``
    (:class:`LazyReproduction`), and, with ``plots`` (the help of ``uqvision plot
    --NAME``), its figures ``<package>.figures.draw_figures`` (:func:`lazy_figures`).

    Parameters
    ----------
    package : str
        The folder's package (its ``__init__``'s ``__name__``, e.g.
        ``"uqvision.protocols.shift"``).
    description : str
        One line (:attr:`Protocol.description`).
    plots : str
        The help of its figures' option; empty: no figures.
    **fields
        The other fields of :class:`Protocol` (e.g. ``**config_scoring(...)``).
    """
    name = package.rsplit(".", 1)[-1]
    if plots:
        fields["plots"] = Plots(lazy_figures(f"{package}.figures"), plots)
    return Protocol(name, description, score_name=fields.pop("score_name", name),
                    reproduce=LazyReproduction(name, description, f"{package}.reproduce"),
                    **fields)


def lazy_figures(module: str, function: str = "draw_figures") -> Callable[..., list[Path]]:
    """``draw(scores, out) -> list of Path`` of :class:`Plots`: ``function`` of ``module``
    (the protocol's figures, matplotlib), imported on use."""

    def draw(scores: str | os.PathLike, out: str | os.PathLike) -> list[Path]:
        return getattr(importlib.import_module(module), function)(scores, out)

    return draw


def clean_study_predictors(caches: Any, config: Any, *, one_class_space: bool = False
                           ) -> tuple[Any, str, str, list, list[str]]:
    """What a scorer that calibrates on clean data (shift, conformal) reads first: the caches
    grouped (:func:`uqvision.predictors.read_cache_groups`), its test and calibration sets
    (:func:`uqvision.predictors.pick_test_and_calibration` of ``config.test`` and
    ``config.calibration``) and its predictors (:func:`uqvision.predictors.group_predictors`
    of ``config.ensembles``).

    Parameters
    ----------
    caches : path or iterable of paths
        Cache files or folders of them.
    config : dataclass
        The scorer's config, with ``test``, ``calibration`` and ``ensembles``.
    one_class_space : bool, default False
        Refuse caches of several class spaces (a result with a ``class`` dimension).

    Returns
    -------
    read : uqvision.predictors.CacheGroups
    test, calibration : str
        The sets' ``dataset_name``.
    predictors : list of uqvision.predictors.Predictor
    notes : list of str
        What forming the ensemble rows noted.
    """
    from ..predictors import group_predictors, pick_test_and_calibration, read_cache_groups

    read = read_cache_groups(caches)
    if one_class_space:
        read.check_one_class_space()  # the result's class dim: one class space for every model
    test, cal = pick_test_and_calibration(read.sets, config.test, config.calibration)
    preds, notes = group_predictors(read, config.ensembles)
    return read, test, cal, preds, notes


def check_clean_members(predictors: Sequence[Any], groups: Any, test: str,
                        calibration: str) -> None:
    """Refuse a predictor without caches of the calibration set, then of the test set, for
    every member (:func:`uqvision.predictors.check_members`, naming ``--calibration`` or
    ``--test``): the sets of :func:`clean_study_predictors`."""
    from ..predictors import check_members

    for pred in predictors:
        check_members(pred, groups, calibration, "calibration", "--calibration")
        check_members(pred, groups, test, "test", "--test")


# ---------------------------------------------------------------------------------------------
# what several drivers do: train a deep ensemble and an MC-dropout network, then predict


#: The networks of the drivers that compare a deep ensemble with MC dropout on the generated
#: stand-in (shift, ood, conformal), per scale: the settings of :func:`ensemble_runs` and the
#: ``hierarchy`` scale. ``smoke``: the hierarchy smoke set, a half-width timm test_resnet, two
#: members and an MC-dropout network of three epochs; ``cpu``: the cpu hierarchy, the
#: full-width test_resnet, five members and an MC-dropout network (10 passes) of 15 epochs.
ENSEMBLE_SCALES = {
    "smoke": {"arch": "test_resnet", "input_size": 32, "dropout_p": 0.3, "hierarchy": "smoke",
              "epochs": 3.0, "members": 2, "batch_size": 32,
              "model_kwargs": {"channels": [16, 24, 24, 48]}, "dropout_passes": 3},
    "cpu": {"arch": "test_resnet", "input_size": 32, "dropout_p": 0.3, "hierarchy": "cpu",
            "epochs": 15.0, "members": 5, "batch_size": 128, "model_kwargs": {},
            "dropout_passes": 10},
}
#: The settings of the studies under corruption (:func:`corrupted_study`: shift, conformal) per
#: scale, beside their corruptions: :data:`ENSEMBLE_SCALES` and the corruption processes
#: (``workers``); at ``cpu`` every severity.
CORRUPTED_SCALES = {
    "smoke": {**ENSEMBLE_SCALES["smoke"], "workers": 1},
    "cpu": {**ENSEMBLE_SCALES["cpu"], "workers": 2, "severities": (1, 2, 3, 4, 5)},
}


def ensemble_runs(settings: Mapping[str, Any], seed: int, device: str, *, tag: str,
                  **config: Any) -> list[tuple[str, Any, dict]]:
    """The networks of a driver that compares a deep ensemble with MC dropout.

    Parameters
    ----------
    settings : mapping
        The driver's scale settings: ``arch``, ``epochs``, ``batch_size``, ``input_size``,
        ``model_kwargs``, ``members`` (the ensemble's size), ``dropout_passes`` (0: no
        MC-dropout network) and ``dropout_p``.
    seed : int
        The driver's seed: member ``j`` trains with seed ``1000 * seed + j``, the MC-dropout
        network with ``1000 * seed + 100``.
    device : str
        Where every network trains.
    tag : str
        The prefix of each run's training tag (``<tag>_<name>``), the protocol's name.
    **config
        Further fields of every :class:`~uqvision.training.loop.ImageTrainConfig` (e.g.
        ``classes``).

    Returns
    -------
    list of tuple
        ``(name, train config, predict options)`` of every network: the members
        ``deep_ensemble_s<seed>`` (mode ``plain``), then ``mc_dropout_s<seed>`` (mode
        ``mc_dropout`` with ``dropout_passes`` passes).
    """
    from ..training.loop import ImageTrainConfig  # torch: imported on use

    s = settings
    common = {"arch": s["arch"], "epochs": s["epochs"], "batch_size": s["batch_size"],
              "input_size": s["input_size"], "augment": "crop",
              "model_kwargs": dict(s["model_kwargs"]), "device": device, **config}
    runs = []
    for j in range(s["members"]):
        member_seed = seed * 1000 + j
        name = f"deep_ensemble_s{member_seed}"
        runs.append((name, ImageTrainConfig(method="deep_ensemble", seed=member_seed,
                                            tag=f"{tag}_{name}", **common), {"mode": "plain"}))
    if s["dropout_passes"]:
        dropout_seed = seed * 1000 + 100
        name = f"mc_dropout_s{dropout_seed}"
        runs.append((name, ImageTrainConfig(method="mc_dropout", hparams={"p": s["dropout_p"]},
                                            seed=dropout_seed, tag=f"{tag}_{name}", **common),
                     {"mode": "mc_dropout", "passes": s["dropout_passes"]}))
    return runs


def train_and_predict(runs: Sequence[tuple[str, Any, dict]], models: Path, train: Path,
                      predict: Callable[[str, dict, bool], int], *, overwrite: bool = False,
                      log: Callable[[str], None] = print) -> None:
    """Train every run unless its checkpoint is current, then let it predict.

    Parameters
    ----------
    runs : sequence of tuple
        ``(name, train config, predict options)`` (:func:`ensemble_runs`).
    models : pathlib.Path
        The folder of the checkpoints, ``<name>.safetensors`` (exists).
    train : pathlib.Path
        The training image folder.
    predict : callable
        ``predict(spec, options, trained) -> n``: writes the run's caches and returns how
        many; ``spec`` is ``<arch>=<checkpoint>``, ``options`` the run's predict options,
        ``trained`` whether the run was (re)trained now (its caches are then overwritten).
    overwrite : bool, default False
        Retrain every run; else a run is retrained only where its checkpoint's sidecar does not
        record its config or ``train``'s images (its dataset fingerprint, computed once:
        :func:`uqvision.training.runs.run_matches`).
    log : callable, default print
        Receives one line per run (trained or reused, the caches, the times).
    """
    from ..data import dataset_fingerprint
    from ..training.loop import train_model  # torch: imported on use
    from ..training.runs import run_matches

    fingerprint = None  # of train, computed once, when a checkpoint is there to compare
    for name, config, how in runs:
        t1 = time.perf_counter()
        ckpt = models / f"{name}.safetensors"
        if fingerprint is None and not overwrite and ckpt.is_file():
            fingerprint = dataset_fingerprint(train)
        trained = overwrite or not run_matches(ckpt, config, data_fingerprint=fingerprint)
        if trained:
            train_model(train, ckpt, config)
        t2 = time.perf_counter()
        n = predict(f"{config.arch}={ckpt}", how, trained)
        log(f"  {name}: {'trained' if trained else 'reused'} ({t2 - t1:.0f} s), {n} caches "
            f"({time.perf_counter() - t2:.0f} s)")


def finish_reproduction(out: Path, path: str | os.PathLike, t0: float, figures: Sequence[Path],
                        findings: str, log: Callable[[str], None]) -> Path:
    """The end of a driver that draws figures and tests findings (shift, ood, conformal):
    ``findings`` (the table of its ``format_findings``) written as ``OUT/findings.md``, then
    where the figures and findings are and the score file ``path`` with the time since ``t0``
    (:func:`time.perf_counter`), each a line through ``log``.

    Returns
    -------
    Path
        ``path``.
    """
    (out / "findings.md").write_text(findings, encoding="utf-8")
    log(f"figures: {out / 'figures'} ({len(figures)} files); findings: {out / 'findings.md'}")
    log(f"wrote {path} ({time.perf_counter() - t0:.0f} s)")
    return Path(path)


# ---------------------------------------------------------------------------------------------
# what a protocol's figures and findings read


def draw_protocol_figures(result: Any, out_dir: str | os.PathLike,
                          read: Callable[[Any], Any],
                          figures: Callable[[Any], Sequence[tuple[str, Callable[[], Any]]]]
                          ) -> list[Path]:
    """A protocol's figures into ``out_dir`` (its ``draw_figures``, ``uqvision plot``).

    Parameters
    ----------
    result : xarray.Dataset or path
        A result of the protocol (or its file).
    out_dir : path
        The folder (created).
    read : callable
        ``read(result) -> xarray.Dataset``: the result read and checked to be one of the
        protocol (:func:`protocol_result`).
    figures : callable
        ``figures(ds) -> [(file name, make), ...]``: the figures the result allows, each
        drawn by ``make() -> Figure`` when saved.

    Returns
    -------
    list of pathlib.Path
        The figures written (:func:`uqmetrics.report.plotting.save_figures`).
    """
    from uqmetrics.report.plotting import save_figures  # matplotlib: imported on use

    ds = read(result)
    return save_figures(figures(ds), out_dir)


def _check_protocol(found: Any, protocol: str, where: str, *, required: bool) -> None:
    """Raise :class:`~uqmetrics.InputError` (``where``: what the file is called, e.g.
    ``--ood 'a.nc'``) unless ``found`` (its attr ``protocol``) is ``protocol``; a file that
    records none passes unless ``required``."""
    if found is None and required:
        raise InputError(f"{where} must be a result of protocol {protocol!r}, got a file that "
                         f"records no protocol (not a score file: a prediction cache?); give "
                         f"a score file of uqvision score {protocol}")
    if found is not None and found != protocol:
        raise InputError(f"{where} must be a result of protocol {protocol!r}, got one of "
                         f"protocol {found!r}")


def check_protocol_file(option: str, path: str | os.PathLike, protocol: str) -> None:
    """Refuse, before any work, a file given as ``option`` (``uqvision plot --SCORE_NAME FILE``,
    ``uqvision metadata --scores FILE``) that is not a result of ``protocol``: missing, a
    folder, unreadable (not netCDF, truncated), recording no protocol (a prediction cache) or
    another one; each message names the option and the path. Only the attrs are read.

    Raises
    ------
    uqmetrics.InputError
    """
    from uqmetrics.runs.io import READ_ERRORS, decode_attr, open_netcdf

    p = Path(path)
    where = f"{option} {str(p)!r}"
    if p.is_dir():
        raise InputError(f"{where} is a folder; give a score file (.nc) of uqvision score "
                         f"{protocol}")
    if not p.is_file():
        raise InputError(f"{where} does not exist")
    try:
        with open_netcdf(p) as ds:
            found = decode_attr(ds.attrs.get("protocol"))
    except READ_ERRORS as exc:
        raise InputError(f"{where} cannot be read (not netCDF, or truncated): "
                         f"{' '.join(str(exc).split())}") from None
    _check_protocol(found, protocol, where, required=True)


def option_input_error(exc: BaseException, options: Mapping[str, Any]) -> InputError | None:
    """``exc``, raised by reading a file given on the command line, as an
    :class:`~uqmetrics.InputError` naming the option that gave it (``--metadata 'a.csv': does
    not exist``); None when no option gave the file at fault.

    Parameters
    ----------
    exc : BaseException
        An OS error whose ``filename`` is a value of ``options``, or a ``ValueError`` whose
        message begins with such a value and a colon (``a.csv:3: ...``, as the readers of
        tables name their file); anything else is not mapped.
    options : mapping
        The option as typed (``--metadata``) -> its value (a path, or a list of them).

    Examples
    --------
    >>> str(option_input_error(ValueError("t.csv:2: bad row"), {"--metadata": ["t.csv"]}))
    "--metadata 't.csv': 2: bad row"
    """
    from uqmetrics import error_line

    if not isinstance(exc, (OSError, ValueError)):
        return None
    filename = exc.filename if isinstance(exc, OSError) else None
    text = error_line(exc)
    for flag, value in options.items():
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if not isinstance(v, (str, os.PathLike)) or not os.fspath(v):
                continue
            given = os.fspath(v)
            if filename is not None and os.fspath(filename) == given:
                rest = text.removeprefix(f"{given}:").strip()
            elif filename is None and text.startswith(f"{given}:"):
                rest = text[len(given) + 1:].strip()
            else:
                continue
            return InputError(f"{flag} {given!r}: {rest}")
    return None


def protocol_result(result: Any, protocol: str, dims: Sequence[str] = ("model",), *,
                    option: str | None = None) -> Any:
    """``result`` (an ``xarray.Dataset`` or the path of a result file) checked to be a result
    of ``protocol`` with the dimensions ``dims``: what a protocol's figures and findings read.
    The messages name the file (and ``option``, the command-line option that gave it).

    Raises
    ------
    uqmetrics.InputError
        A result of another protocol (attr ``protocol``), or one without a dim of ``dims``.
    """
    import xarray as xr  # results: imported on use (start-up time of train and predict)

    if isinstance(result, xr.Dataset):
        ds, where = result, "result" if option is None else option
    else:
        ds = read_dataset(result)
        where = f"{'result' if option is None else option} {str(result)!r}"
    _check_protocol(ds.attrs.get("protocol"), protocol, where, required=False)
    article = "an" if protocol[:1] in "aeiou" else "a"
    for dim in dims:
        if dim not in ds.dims:
            raise InputError(f"{where} must have a {dim} dim ({article} {protocol} result), got "
                             f"dims {list(ds.dims)}")
    return ds


def corrupted_study_settings(protocol: str, scales: Mapping[str, Mapping[str, Any]],
                             keys: Sequence[str], ints: Sequence[str], *, scale: str,
                             arch: str | None, data: str | None,
                             options: Mapping[str, str]) -> dict[str, Any]:
    """The settings of a :func:`corrupted_study` driver (shift, conformal): the scale's, with
    the ``--set`` ``options`` (``keys``: those allowed) parsed over them — ``corruptions`` a
    comma list of names, ``severities`` of integers, ``ints`` integers, any other a float —
    ``arch`` replacing the scale's network and a ``data`` folder dropping the stand-in's
    ``model_kwargs``.

    Raises
    ------
    uqmetrics.InputError
        An unknown scale or option, or a value of the wrong type, each named.
    """
    if scale not in scales:
        raise InputError(f"reproduce {protocol}: unknown scale {scale!r}; known: "
                         f"{list(scales)}")
    s = dict(scales[scale])
    unknown = sorted(set(options) - set(keys))
    if unknown:
        raise InputError(f"--set: unknown option(s) {unknown} of reproduce {protocol}; known: "
                         f"{list(keys)}")
    try:
        for k, v in options.items():
            if k == "corruptions":
                s[k] = tuple(x.strip() for x in str(v).split(",") if x.strip())
            elif k == "severities":
                s[k] = tuple(int(x) for x in str(v).split(","))
            elif k in ints:
                s[k] = int(v)
            else:
                s[k] = float(v)
    except ValueError as exc:
        raise InputError(f"--set: {exc}") from None
    if arch is not None:
        s["arch"] = arch
    if data is not None:
        s["model_kwargs"] = {}
    return s


def corrupted_study_driver(protocol: str, scales: Mapping[str, Mapping[str, Any]],
                           keys: Sequence[str], ints: Sequence[str],
                           finish: Callable[..., Path]) -> Callable[..., Path]:
    """The ``run`` of a driver of a study under corruption (shift, conformal; see
    :class:`Reproduction`): its settings (:func:`corrupted_study_settings` of ``scales``,
    ``keys`` and ``ints``), its networks and caches (:func:`corrupted_study`, tag
    ``protocol``), then ``finish(out, s, caches, seed=seed, log=log, t0=t0) -> Path``: the
    protocol's scores, figures and findings from the caches (``s``: the settings, ``t0``: the
    run's start, :func:`time.perf_counter`).
    """

    def run(out, *, scale: str = "smoke", data: str | None = None, arch: str | None = None,
            seed: int = 0, overwrite: bool = False, options: dict | None = None,
            log: Callable[[str], None] = print, device: str = "cpu") -> Path:
        t0 = time.perf_counter()
        s = corrupted_study_settings(protocol, scales, keys, ints, scale=scale, arch=arch,
                                     data=data, options=dict(options or {}))
        out = Path(out)
        caches = corrupted_study(out, s, tag=protocol, data=data, seed=seed, scale=scale,
                                 overwrite=overwrite, log=log, device=device)
        return finish(out, s, caches, seed=seed, log=log, t0=t0)

    run.__doc__ = (f"Run the {protocol} protocol at ``scale`` into ``out``; returns "
                   f"``out/{protocol}.nc``.")
    return run


def corrupted_study(out: Path, s: Mapping[str, Any], *, tag: str, data: str | None, seed: int,
                    scale: str, overwrite: bool, log: Callable[[str], None],
                    device: str) -> Path:
    """The networks and caches of a study under corruption (the shift and conformal drivers).

    The ``hierarchy`` stand-in (``OUT/data``, unless ``data`` names a folder with ``train``,
    ``val`` and ``test``) has its test split corrupted as ImageNet-C is made
    (:func:`uqvision.data.corruptions.make_corrupted_folder` into ``OUT/data-c``, the
    ``corruptions`` and ``severities`` of ``s``). The deep ensemble's members and the
    MC-dropout network (:func:`ensemble_runs`) are trained on ``train`` and predict ``val``,
    ``test`` and every corrupted member (eval set ``imagenet-c``) with the pinned
    :data:`uqvision.predict.REFERENCE_EXECUTION` (:func:`train_and_predict`), into
    ``OUT/caches``.

    Steps, each skipped when its output is already complete (a rerun resumes)::

        OUT/data/                 make_hierarchy (not with data)
        OUT/data-c/<c>/<s>/       make_corrupted_folder of the test split
        OUT/models/<run>.*        uqvision.training.loop.train_model
        OUT/caches/*.nc           uqvision.predict: val, test and every corrupted member

    Parameters
    ----------
    out : Path
    s : mapping
        The scale's settings: ``hierarchy``, ``corruptions``, ``severities``, ``input_size``,
        ``workers`` and those of :func:`ensemble_runs`.
    tag : str
        The runs' tag prefix (the protocol's name).
    data, seed, scale, overwrite, log, device
        The driver's options (``scale == "smoke"``: no progress lines of the corruption).

    Returns
    -------
    Path
        ``OUT/caches``.

    Raises
    ------
    FileNotFoundError
        A split folder of ``data`` missing.
    """
    from ..data import check_split_classes
    from ..data.corruptions import make_corrupted_folder
    from ..evalsets import iter_member_folders
    from ..hierarchy import ensure_hierarchy
    from ..predict import REFERENCE_EXECUTION, PredictConfig, predict_to_files

    t0 = time.perf_counter()
    if data is None:
        root = out / "data"
        ensure_hierarchy(root, scale=s["hierarchy"], seed=seed, overwrite=overwrite)
    else:
        root = Path(data)
    train, val, test = root / "train", root / "val", root / "test"
    for p in (train, val, test):
        if not p.is_dir():
            raise FileNotFoundError(f"{str(p)!r} does not exist (need ROOT/train, ROOT/val and "
                                    "ROOT/test)")
    check_split_classes(train, {"val": val, "test": test}, same=("val",))
    corrupted = make_corrupted_folder(
        test, out / "data-c", corruptions=s["corruptions"], severities=s["severities"],
        resize=s["input_size"], crop=s["input_size"], seed=seed, workers=s["workers"],
        progress=log if scale != "smoke" else False, overwrite=overwrite)
    log(f"corrupted test split: {corrupted} ({time.perf_counter() - t0:.0f} s)")

    models, caches = out / "models", out / "caches"
    models.mkdir(parents=True, exist_ok=True)
    base = {"batch_size": 256, "device": device, "seed": seed, **REFERENCE_EXECUTION}
    members = [(m, f) for m, f in iter_member_folders(corrupted, "imagenet-c")
               if m.corruption in s["corruptions"] and m.severity in s["severities"]]

    def predict(spec: str, how: dict, trained: bool) -> int:
        n = 0
        for folder, role in ((val, "calibration"), (test, "test")):  # their roles, declared
            n += len(predict_to_files(spec, folder, caches,
                                      PredictConfig(role=role, **how, **base),
                                      overwrite=trained))
        for member, folder in members:
            n += len(predict_to_files(
                spec, folder, caches,
                PredictConfig(eval_set="imagenet-c", eval_member=member.name, **how, **base),
                overwrite=trained))
        return n

    train_and_predict(ensemble_runs(s, seed, device, tag=tag), models, train, predict,
                      overwrite=overwrite, log=log)
    return caches
