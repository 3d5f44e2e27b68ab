"""V.5 — Predictive uncertainty under dataset shift (Ovadia et al. 2019;
docs/conventions.md#v-5).

- :mod:`~.score`: accuracy, NLL, Brier, ECE, AURC and AUROC of every model per corruption and
  severity and on the clean set, un-scaled and with the temperature fitted on clean
  validation data, and the mean corruption errors against a baseline model
  (:func:`~.score.score_shift`, ``uqvision score shift``);
- :mod:`~.reproduce`: ``uqvision reproduce shift``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ...options import ConfigOption, add_config_options, config_kwargs
from ...roles import ensemble_option, legacy_config, role_option
from ..base import LazyReproduction, Plots, Protocol, ReportTable
from ..headline import headline_score_table

__all__ = ["DESCRIPTION", "PROTOCOL", "SHIFT_OPTIONS"]

#: One line: the protocol and its driver (``uqvision reproduce shift``).
DESCRIPTION = ("V.5 (Shift): accuracy, NLL, Brier, ECE, AURC, AUROC per corruption and "
               "severity, un-scaled and temperature-scaled on clean validation data, and mCE")


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1), got {text!r}")
    return value


#: The options of ``uqvision score shift`` generated from :class:`~.score.ShiftConfig`.
SHIFT_OPTIONS = (
    ConfigOption("calibration_size", type=_fraction,
                 help="shift: fraction of the clean calibration caches' samples the "
                      "temperature is fitted on (default {default})"),
    role_option("test", "shift"),
    role_option("calibration", "shift"),
    ConfigOption("baseline",
                 help="shift: the model the corruption errors (mCE, relative mCE) are "
                      "normalised by, or published:alexnet (AlexNet's published ImageNet-C "
                      "errors: mCE only) (default: none computed)"),
    ensemble_option("shift"),
    ConfigOption("overlay", metavar="FILE",
                 help="shift: the label sets of the relabelled caches (ImageNet ReaL): ReaL's "
                      "real.json or a label-overlay file"),
)


def _add_options(p: argparse.ArgumentParser) -> None:
    from .score import ShiftConfig  # imported on use

    add_config_options(p, ShiftConfig, SHIFT_OPTIONS)


def _score(a: argparse.Namespace):
    """metrics per corruption and severity, clean and temperature-scaled, and mCE (V.5)"""
    from .score import ShiftConfig, score_shift  # imported on use

    kw = config_kwargs(a, SHIFT_OPTIONS)
    return score_shift(a.caches, ShiftConfig(**kw, seed=a.seed))


def _draw(scores: str | os.PathLike, out: str | os.PathLike) -> list[Path]:
    """``uqvision plot --shift FILE``: boxes per severity, heat maps, accuracy vs ECE."""
    from .figures import draw_figures  # figures: imported on use

    return draw_figures(scores, out)


def _rescore(result, path):
    """The score file recomputed from the caches and with the configuration it records
    (``uqvision verify``)."""
    from ...provenance import recorded_caches, recorded_config
    from .score import ShiftConfig, score_shift  # imported on use

    return score_shift(recorded_caches(result),
                       ShiftConfig(**legacy_config(recorded_config(result))))


#: Its leaderboard (Ovadia's and ImageNet-C's tables): the report site's default view and the
#: table ``uqvision score shift`` prints (with ECE at severity 5, un-scaled; sorted by clean
#: top-1).
REPORT = ReportTable(
    rows=("model",),
    headline=("clean_accuracy[calibration=none]",
              "clean_ece[calibration=none]",
              "clean_ece[calibration=temperature]", "mean_corruption_error",
              "relative_mean_corruption_error"),
    means=("accuracy[calibration=none]", "ece[calibration=none]"),
    images="clean_*: the clean test set's images (those the temperature is "
           "not fitted on); per corruption and severity, and their means: "
           "that corrupted copy's images; the temperature: n_calibration "
           "images of the calibration set; mCE: every corruption and "
           "severity")


#: The Shift protocol (registered in :data:`uqvision.protocols.VISION_PROTOCOLS`).
PROTOCOL = Protocol("shift", DESCRIPTION, score=_score, score_name="shift",
                    add_options=_add_options,
                    reproduce=LazyReproduction("shift", DESCRIPTION, f"{__name__}.reproduce"),
                    methods=("deep_ensemble",), section="v-5",
                    plots=Plots(_draw, "shift score file: metrics per severity (boxes over "
                                       "corruptions), corruption x severity heat maps, "
                                       "accuracy vs ECE"),
                    rescore=_rescore,
                    score_table=headline_score_table(
                        REPORT, sort=(("clean_accuracy[calibration=none]", True),),
                        means=("ece[calibration=none,severity=5]",)),
                    report=REPORT)
