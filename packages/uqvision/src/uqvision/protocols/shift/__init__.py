"""V.5 — Predictive uncertainty under dataset shift (Ovadia et al. 2019;
docs/conventions.md#v-5).

- :mod:`~.score`: accuracy, NLL, Brier, ECE, AURC and AUROC of every model per corruption and
  severity and on the clean set, un-scaled and with the temperature fitted on clean
  validation data, and the mean corruption errors against a baseline model
  (:func:`~.score.score_shift`, ``uqvision score shift``);
- :mod:`~.reproduce`: ``uqvision reproduce shift``.
"""

from __future__ import annotations

from ...options import ConfigOption
from ...roles import ensemble_option, role_option
from ..base import ReportTable, config_scoring, folder_protocol, fraction
from ..headline import headline_score_table

__all__ = ["DESCRIPTION", "PROTOCOL", "SHIFT_OPTIONS"]

#: One line: the protocol and its driver (``uqvision reproduce shift``).
DESCRIPTION = ("V.5 (Shift): accuracy, NLL, Brier, ECE, AURC, AUROC per corruption and "
               "severity, un-scaled and temperature-scaled on clean validation data, and mCE")


#: The options of ``uqvision score shift`` generated from :class:`~.score.ShiftConfig`.
SHIFT_OPTIONS = (
    ConfigOption("calibration_size", type=fraction,
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


#: ``score``, ``add_options`` and ``rescore`` of the protocol (:class:`~.score.ShiftConfig`,
#: :func:`~.score.score_shift`, imported on use).
_SCORING = config_scoring(
    f"{__name__}.score", "ShiftConfig", "score_shift", SHIFT_OPTIONS,
    "metrics per corruption and severity, clean and temperature-scaled, and mCE (V.5)")


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
PROTOCOL = folder_protocol(
    __name__, DESCRIPTION, **_SCORING, methods=("deep_ensemble",), section="v-5",
    plots="shift score file: metrics per severity (boxes over corruptions), corruption x "
          "severity heat maps, accuracy vs ECE",
    score_table=headline_score_table(REPORT, sort=(("clean_accuracy[calibration=none]", True),),
                                     means=("ece[calibration=none,severity=5]",)),
    report=REPORT)
