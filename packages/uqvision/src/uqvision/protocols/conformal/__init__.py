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

from ...options import COUNT, ConfigOption
from ...roles import ensemble_option, role_option
from ..base import ReportTable, config_scoring, folder_protocol, fraction
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


#: The options of ``uqvision score conformal`` generated from :class:`~.score.ConformalConfig`.
CONFORMAL_OPTIONS = (
    ConfigOption("alphas", nargs="+", type=fraction, metavar="ALPHA",
                 help="conformal: the miscoverage levels (default {default})"),
    ConfigOption("n_cal", type=COUNT,
                 help="conformal: calibration images per trial (default: half the conformal "
                      "pool)"),
    ConfigOption("trials", type=_trials,
                 help="conformal: random calibration/evaluation splits (default {default})"),
    ConfigOption("temperature_size", type=fraction,
                 help="conformal: fraction of the clean calibration caches the temperature is "
                      "fitted on, never in a conformal split (default {default})"),
    role_option("test", "conformal",
                help="conformal: dataset_name of the test set, the conformal pool (default: "
                     "the only set of role test; two are refused, naming them; never a set of "
                     "role fit)"),
    role_option("calibration", "conformal",
                help="conformal: dataset_name of the set the temperature is fitted on "
                     "(default: the only set of role calibration, else the test set, whose "
                     "rest is then the pool; never a set of role fit)"),
    ensemble_option("conformal"),
)


#: ``score``, ``add_options`` and ``rescore`` of the protocol (:class:`~.score.ConformalConfig`,
#: :func:`~.score.score_conformal`, imported on use).
_SCORING = config_scoring(
    f"{__name__}.score", "ConformalConfig", "score_conformal", CONFORMAL_OPTIONS,
    "coverage and set size of Top-K, Naive, THR, APS, RAPS, Mondrian APS; under shift (V.7)",
    notes="ShortCalibrationWarning", name="conformal")


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
PROTOCOL = folder_protocol(__name__, DESCRIPTION, methods=("deep_ensemble", "mc_dropout"),
                           section="v-7", **_SCORING, report=REPORT,
                           plots="conformal score file: set size vs accuracy, coverage and size "
                                 "vs level, coverage per class, coverage vs severity",
                           score_table=headline_score_table(REPORT, sort=(("model", None),)))
