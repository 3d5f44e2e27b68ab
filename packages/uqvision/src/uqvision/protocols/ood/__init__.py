"""V.6 — OOD detection (OpenOOD v1.5, Zhang et al. 2023, "OpenOOD v1.5: enhanced benchmark
for out-of-distribution detection"; docs/conventions.md#v-6).

- :mod:`~.score`: FPR@95TPR, AUROC, AUPR-In and AUPR-Out of every detector of
  :data:`uqmetrics.metrics.detectors.DETECTORS` on every model, deep ensemble and MC-dropout network,
  per OOD set and averaged over the near and far sets, with each predictor's ID accuracy and
  cost (:func:`~.score.score_ood`, ``uqvision score ood``);
- :mod:`~.figures`: bars per detector (near vs far), the detector x model heat map, score
  histograms and AUROC against forward passes (``uqvision plot --ood FILE``);
- :mod:`~.findings`: OpenOOD v1.5's findings as sign tests;
- :mod:`~.reproduce`: ``uqvision reproduce ood``.
"""

from __future__ import annotations

from ...options import ConfigOption
from ...roles import ensemble_option, role_option
from ..base import ReportTable, config_scoring, folder_protocol
from ..headline import headline_score_table

__all__ = ["DESCRIPTION", "OOD_OPTIONS", "PROTOCOL"]

#: One line: the protocol and its driver (``uqvision reproduce ood``).
DESCRIPTION = ("V.6 (OpenOOD v1.5): FPR@95TPR, AUROC, AUPR-In/Out of post-hoc detectors and UQ "
               "methods on near- and far-OOD sets, with ID accuracy and cost")


def _detector_names() -> list[str]:
    from uqmetrics.metrics.detectors import list_detectors  # numpy only

    return list_detectors()


#: The options of ``uqvision score ood`` generated from :class:`~.score.OodConfig`.
OOD_OPTIONS = (
    ConfigOption("detectors", nargs="+", metavar="DETECTOR", choices=_detector_names,
                 help="ood: the detectors scored, each refused where the caches lack its "
                      "inputs; registered (plugins of the entry-point group "
                      "uqmetrics.detectors included): %(choices)s (default: the built-in "
                      "default set the caches allow; a plugin detector is scored only when "
                      "named here)"),
    role_option("test", "ood", help="ood: dataset_name of the ID test set (default: the only "
                "set of role test but the fit set; two are refused, naming them; never a set "
                "of role fit)"),
    role_option("fit", "ood", help="ood: dataset_name of the ID training subset the feature "
                "detectors (mahalanobis, knn, vim, react, and plugins that fit) fit on "
                "(default: the only set of role fit; none: those detectors are skipped)"),
    ensemble_option("ood"),
    ConfigOption("keep_scores",
                 help="ood: also keep every image's u (u_id, u_ood) for the score histograms"),
    ConfigOption("tune_detectors",
                 help="ood: select the hyper-parameters of every detector with a search grid "
                      "(react percentile, knn k, vim D, gen gamma and M, energy T) per "
                      "predictor as OpenOOD v1.5's automatic parameter search: the grid "
                      "point of the highest AUROC of the OOD validation set against the ID "
                      "validation set; the grids and the chosen values are recorded in the "
                      "attr detector_search (default: the fixed defaults)"),
    ConfigOption("validation", metavar="NAME",
                 help="ood: with --tune-detectors, dataset_name of the ID validation set "
                      "(default: the only set of role calibration; never the test or fit "
                      "set)"),
    ConfigOption("ood_validation", metavar="NAME",
                 help="ood: with --tune-detectors, dataset_name of the OOD validation set, a "
                      "set of role ood-val (uqvision sweep --ood-sets "
                      "ood-val:ood-far:NAME=PATH; default: the only one); never a test OOD "
                      "set"),
    ConfigOption("fpr_positive", choices=("out", "in"),
                 help="ood: the positives of fpr_at_95_tpr: out (OpenOOD v1.5: ID images "
                      "flagged at 95%% OOD recall) or in (OpenOOD v1.0, ODIN: OOD images kept "
                      "at 95%% ID recall); default {default}"),
)


#: ``score``, ``add_options`` and ``rescore`` of the protocol (:class:`~.score.OodConfig`,
#: :func:`~.score.score_ood`, imported on use).
_SCORING = config_scoring(
    f"{__name__}.score", "OodConfig", "score_ood", OOD_OPTIONS,
    "FPR@95, AUROC, AUPR-In/Out per detector, model and OOD set; near/far means (V.6)")


#: Its leaderboard (OpenOOD v1.5's table): the report site's default view and the table
#: ``uqvision score ood`` prints, a row per model and detector ranked by near-OOD AUROC (as
#: OpenOOD's leaderboard), then far-OOD AUROC.
REPORT = ReportTable(
    rows=("model", "detector"),
    headline=("near_fpr_at_95_tpr", "near_auroc", "far_fpr_at_95_tpr", "far_auroc",
              "id_accuracy"),
    images="id_accuracy and the in-distribution side of every AUROC and FPR@95: every image "
           "of the ID set (attr id_dataset); near_*, far_*: the mean over the near or far OOD "
           "sets, each with all its images; feature detectors are fitted on the fit set")


#: The OOD-detection protocol (registered in :data:`uqvision.protocols.VISION_PROTOCOLS`).
PROTOCOL = folder_protocol(__name__, DESCRIPTION, **_SCORING,
                           methods=("deep_ensemble", "mc_dropout"), section="v-6",
                           smoke_options={},
                           plots="ood score file: AUROC/FPR@95 bars per detector (near vs far), "
                                 "detector x model heat map, ID vs OOD score histograms, AUROC "
                                 "vs forward passes",
                           score_table=headline_score_table(
                               REPORT, sort=(("near_auroc", True), ("far_auroc", True))),
                           report=REPORT)
