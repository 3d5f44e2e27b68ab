"""V.7 — Conformal prediction sets (Angelopoulos, Bates, Malik, Jordan 2021, "Uncertainty sets
for image classifiers using conformal prediction"; docs/conventions.md#v-7).

- :mod:`~.score`: coverage and set size of the Top-K, Naive, THR, APS, RAPS and
  class-conditional (Mondrian) APS sets of every model, deep ensemble and MC-dropout network at
  each miscoverage level, un-scaled, temperature-scaled, and scaled by a temperature fitted on
  each trial's calibration draw (Table 1's "Platt"), over random calibration/evaluation splits
  of clean data (means, standard deviations and medians over the trials), and the coverage
  left when the sets calibrated on clean data meet corrupted or naturally shifted images
  (:func:`~.score.score_conformal`, ``uqvision score conformal``);
- :mod:`~.figures`: set size against accuracy, coverage and size against the level, coverage
  per class, coverage against severity (``uqvision plot --conformal FILE``);
- :mod:`~.findings`: the paper's claims as sign tests;
- :mod:`~.reproduce`: ``uqvision reproduce conformal``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ...options import COUNT, ConfigOption, add_config_options, config_kwargs
from ...roles import ensemble_option, legacy_config, role_option
from ..base import LazyReproduction, Plots, Protocol, ReportTable
from ..headline import headline_score_table

__all__ = ["CONFORMAL_OPTIONS", "DESCRIPTION", "MAX_TRIALS", "PROTOCOL"]

#: One line: the protocol and its driver (``uqvision reproduce conformal``).
DESCRIPTION = ("V.7 (Conformal): coverage and set size of Top-K, Naive, THR, APS, RAPS and "
               "Mondrian APS sets per model and level, un-scaled and temperature-scaled (RAPS "
               "Table 1: medians, Platt scaling per trial), and under shift")


#: The most random splits a conformal run may draw (``--trials``; the paper draws 100): each
#: trial holds a permutation of the conformal pool and its sets.
MAX_TRIALS = 10_000


def _trials(text: str) -> int:
    """argparse type of ``--trials`` (and of its key in a ``--config`` file): a count in
    [1, :data:`MAX_TRIALS`]."""
    value = COUNT(text)
    if value > MAX_TRIALS:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_TRIALS} (each trial holds a "
                                         f"permutation of the conformal pool), got {value}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1), got {text!r}")
    return value


#: The options of ``uqvision score conformal`` generated from :class:`~.score.ConformalConfig`.
CONFORMAL_OPTIONS = (
    ConfigOption("alphas", nargs="+", type=_fraction, metavar="ALPHA",
                 help="conformal: the miscoverage levels (default {default})"),
    ConfigOption("n_cal", type=COUNT,
                 help="conformal: calibration images per trial (default: half the conformal "
                      "pool)"),
    ConfigOption("trials", type=_trials,
                 help="conformal: random calibration/evaluation splits (default {default})"),
    ConfigOption("temperature_size", type=_fraction,
                 help="conformal: fraction of the clean calibration caches the temperature is "
                      "fitted on, never in a conformal split (default {default})"),
    role_option("test", "conformal", help="conformal: dataset_name of the test set, the "
                "conformal pool (default: the only set of role test; two are refused, naming "
                "them; never a set of role fit)"),
    role_option("calibration", "conformal", help="conformal: dataset_name of the set the "
                "temperature is fitted on (default: the only set of role calibration, else "
                "the test set, whose rest is then the pool; never a set of role fit)"),
    ensemble_option("conformal"),
)


def _add_options(p: argparse.ArgumentParser) -> None:
    from .score import ConformalConfig  # imported on use

    add_config_options(p, ConformalConfig, CONFORMAL_OPTIONS)


def _score(a: argparse.Namespace):
    """coverage and set size of Top-K, Naive, THR, APS, RAPS, Mondrian APS; under shift (V.7)"""
    import sys
    import warnings

    from .score import ConformalConfig, ShortCalibrationWarning, score_conformal

    kw = config_kwargs(a, CONFORMAL_OPTIONS)
    with warnings.catch_warnings(record=True) as caught:  # said in one line below
        warnings.simplefilter("always", ShortCalibrationWarning)
        ds = score_conformal(a.caches, ConformalConfig(**kw, seed=a.seed))
    for w in caught:
        if issubclass(w.category, ShortCalibrationWarning):
            print(f"uqvision score conformal: note: {w.message}", file=sys.stderr, flush=True)
        else:  # the others as they came (an ensemble of several architectures)
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return ds


def _draw(scores: str | os.PathLike, out: str | os.PathLike) -> list[Path]:
    """``uqvision plot --conformal FILE``: size vs accuracy, vs level, per class, vs severity."""
    from .figures import draw_figures  # figures: imported on use

    return draw_figures(scores, out)


def _rescore(result, path):
    """The score file recomputed from the caches and with the configuration it records
    (``uqvision verify``; a too small ``n_cal`` was said when it was scored, and is in its
    ``notes``, compared as the rest)."""
    import warnings

    from ...provenance import recorded_caches, recorded_config
    from .score import ConformalConfig, ShortCalibrationWarning, score_conformal

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShortCalibrationWarning)
        return score_conformal(recorded_caches(result),
                               ConformalConfig(**legacy_config(recorded_config(result))))


def _table1(ds) -> list[str]:
    """RAPS's Table 1 columns of a conformal result: top-1 and top-5 accuracy, then the
    coverage and the mean set size of Top-K, Naive, APS and RAPS, medians over the trials, at
    calibration ``platt`` (each level of the file; a file without them: its un-scaled means)."""
    from .score import TABLE1_METHODS

    methods = [m for m in TABLE1_METHODS if m in [str(v) for v in ds.indexes["method"]]]
    if "platt" not in [str(v) for v in ds.indexes["calibration"]] or "coverage_median" not in ds:
        return [f"{v}[method={m},alpha=*,calibration=none]" for v in ("coverage", "mean_set_size")
                for m in methods]
    return ["accuracy_median", "top5_accuracy_median"] + [
        f"{v}_median[method={m},alpha=*,calibration=platt]" for v in ("coverage", "mean_set_size")
        for m in methods]


#: Its leaderboard, RAPS's Table 1 as published (Angelopoulos et al. 2021; ``experiments/
#: table1.py``): a row per model (in the file's order), the medians over the trials of top-1
#: and top-5 accuracy, then of the coverage and the mean set size of Top-K, Naive, APS and
#: RAPS, with a temperature fitted on each trial's calibration draw (``platt``). The report
#: site's default view and the table ``uqvision score conformal`` prints.
REPORT = ReportTable(
    rows=("model",), metrics={"coverage": ("coverage", None),
                              "coverage_median": ("coverage", None)},
    headline=_table1,
    images="coverage and set sizes: the median over the trials' random splits of the pool "
           "(attr pool_dataset), n_cal images calibrating (and fitting the platt temperature), "
           "the pool's others evaluated; accuracies: each trial's evaluated images; the "
           "temperature of calibration 'temperature': n_temperature images of the calibration "
           "set, never in the pool")


#: The conformal-prediction protocol (registered in
#: :data:`uqvision.protocols.VISION_PROTOCOLS`).
PROTOCOL = Protocol("conformal", DESCRIPTION, score=_score, score_name="conformal",
                    add_options=_add_options,
                    reproduce=LazyReproduction("conformal", DESCRIPTION,
                                               f"{__name__}.reproduce"),
                    methods=("deep_ensemble", "mc_dropout"), section="v-7",
                    plots=Plots(_draw, "conformal score file: set size vs accuracy, coverage "
                                       "and size vs level, coverage per class, coverage vs "
                                       "severity"),
                    rescore=_rescore,
                    score_table=headline_score_table(REPORT, sort=(("model", None),)),
                    report=REPORT)
