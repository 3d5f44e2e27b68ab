"""V.8 — uncertainty disentanglement (Mucsányi, Kirchhof & Oh 2024, "Benchmarking Uncertainty
Disentanglement: Specialized Uncertainties for Specialized Tasks"; docs/conventions.md#v-8).

- :mod:`~.score`: every estimator of :data:`uqmetrics.metrics.disentangle.ESTIMATORS` of every
  predictor scored on untangle's tasks: rank correlation with the true label entropy, OOD and
  shift AUROC, correctness AUROC, AURC, abstinence, and the rank correlation of each
  predictor's aleatoric and epistemic estimates; accuracy, ECE, log and Brier scores per
  predictor (:func:`~.score.score_disentangle`, ``uqvision score disentangle``);
- :mod:`~.truth`: the true label distributions (the stand-in's exact ones; ImageNet-ReaL's
  label sets by untangle's rule, :func:`~.truth.real_label_distributions`);
- :mod:`~.figures`: the estimator x task heat map and the estimates against the truth
  (``uqvision plot --disentangle FILE``);
- :mod:`~.findings`: untangle's main claim and the specialisation of each estimate, as sign
  tests;
- :mod:`~.reproduce`: ``uqvision reproduce disentangle`` on the ``hierarchy`` stand-in with
  label ambiguity, held-out families, local ImageNet-C and nested training subsets.
"""

from __future__ import annotations

from ...options import ConfigOption
from ...roles import ensemble_option, role_option
from ..base import ReportTable, config_scoring, folder_protocol
from ..headline import headline_score_table

__all__ = ["DESCRIPTION", "DISENTANGLE_OPTIONS", "PROTOCOL", "REPORT"]

#: One line: the protocol and its driver (``uqvision reproduce disentangle``).
DESCRIPTION = ("V.8 (untangle): aleatoric and epistemic estimates scored against known label "
               "ambiguity, held-out families, corruption and training-set size")

#: The options of ``uqvision score disentangle`` generated from :class:`~.score.
#: DisentangleConfig`.
DISENTANGLE_OPTIONS = (
    ConfigOption("truth", metavar="PATH",
                 help="disentangle: the test images' true label distributions: a hierarchy "
                      "folder (uqvision data hierarchy --ambiguity F) or ImageNet-ReaL's "
                      "real.json (untangle's rule); default: no aleatoric task"),
    role_option("test", "disentangle"),
    role_option("calibration", "disentangle"),
    role_option("fit", "disentangle", help="disentangle: dataset_name of the ID training subset "
                "the DDU feature density fits on (default: the only set of role fit; none: "
                "that estimator is NaN)"),
    ensemble_option("disentangle"),
    ConfigOption("temperature", help="disentangle: add a temperature-scaled row per "
                 "single-pass model, its temperature fitted on the calibration set"),
)

_SCORING = config_scoring(
    f"{__name__}.score", "DisentangleConfig", "score_disentangle", DISENTANGLE_OPTIONS,
    "every estimator x untangle's tasks: aleatoric rank correlation, OOD/shift AUROC, "
    "correctness, abstinence, disentanglement (V.8)")

#: Its leaderboard: a row per predictor and estimator.
REPORT = ReportTable(
    rows=("model", "estimator"),
    headline=("aleatoric_spearman", "ood_auroc", "shift_auroc", "correctness_auroc", "auac"),
    images="every number on the ID test images (aleatoric_spearman: those with a true label "
           "distribution); ood_auroc against the held-out families' images; shift_auroc the "
           "mean over the corruption severities")

#: The disentanglement protocol (registered in :data:`uqvision.protocols.VISION_PROTOCOLS`).
PROTOCOL = folder_protocol(__name__, DESCRIPTION, **_SCORING,
                           methods=("deep_ensemble", "mc_dropout", "swag", "kfac_laplace"),
                           section="v-8", smoke_options={},
                           plots="disentangle score file: estimator x task heat map, estimates "
                                 "against the true label entropy",
                           score_table=headline_score_table(
                               REPORT, sort=(("ood_auroc", True),)),
                           report=REPORT)
