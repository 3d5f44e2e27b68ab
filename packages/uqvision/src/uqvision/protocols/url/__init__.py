"""V.4 — URL: transfer of uncertainty from an upstream to unseen downstream classes
(docs/conventions.md#v-4).

- :mod:`~.heads`: the uncertainty heads (:data:`~.heads.U_HEADS`) and :class:`~.heads.URLModel`,
  a network that gives its own uncertainty (``predicts_uncertainty``, the contract
  :func:`uqvision.predict.predict` relies on), defined in
  :mod:`uqvision.methods.uncertainty_heads`;
- :mod:`~.vmf`: von Mises–Fisher sampling and the expected likelihood kernel
  (:mod:`uqvision.methods.vmf`);
- :mod:`~.crop`: the crop intervention and its prediction mode (``--mode crop``);
- :mod:`~.methods`: the eleven representation learners, defined and registered in
  :data:`~uqvision.training.method.TRAINING_METHODS` by :mod:`uqvision.methods.representation`
  (other protocols train some of them: issue 41);
- :mod:`~.score`: R@1, R-AUROC, crop consistency, human alignment, OOD AUROC
  (``uqvision score url``, alias ``transfer``);
- :mod:`~.plots`: the paper's Figures 1, 2 and 4 (``uqvision plot --transfer``);
- :mod:`~.reproduce`: ``uqvision reproduce url``.
"""

from __future__ import annotations

import argparse

from ..base import LazyReproduction, Plots, Protocol, ReportTable, ReproduceFlags

__all__ = ["DESCRIPTION", "PROTOCOL", "REPRESENTATION_METHODS"]

#: The representation learners, in the paper's order (:data:`TRAINING_METHODS` entries,
#: registered by :mod:`~.methods`).
REPRESENTATION_METHODS = ("ce", "infonce", "mcinfonce", "elk", "nivmf", "hib", "hetxl", "sngp",
                          "losspred", "ensemble", "mcdropout")

#: One line: the protocol and its driver (``uqvision reproduce url``).
DESCRIPTION = "URL transfer (V.4): eleven uncertainty-aware representation learners, zero-shot"


def _score(a: argparse.Namespace):
    """URL (V.4): R@1, R-AUROC, crop consistency, human alignment, OOD AUROC per method"""
    from .score import score_transfer_caches  # imported on use

    return score_transfer_caches(a.caches)


def _add_reproduce_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--upstream", default=None, metavar="ROOT",
                   help="real upstream folder (train/ val/ test/); the same as --set upstream=")
    p.add_argument("--downstream", nargs="+", default=None, metavar="ROOT",
                   help="real downstream folders (val/ test/ each), zero-shot; the same as --set "
                        "downstream=A,B")


def _reproduce_flags(a: argparse.Namespace) -> dict[str, str]:
    """The driver options ``--upstream`` and ``--downstream`` stand for."""
    options = {}
    if a.upstream is not None:
        options["upstream"] = a.upstream
    if a.downstream is not None:
        options["downstream"] = ",".join(a.downstream)
    return options


def _draw(scores, out):
    """``uqvision plot --transfer FILE``: the paper's Figures 1, 2 and 4."""
    from .plots import draw_figures  # figures: imported on use

    return draw_figures(scores, out)


def _rescore(result, path):
    """The score file recomputed from the runs' caches it records (``uqvision verify``)."""
    from .score import rescore_transfer  # imported on use

    return rescore_transfer(result)


#: The URL protocol (registered in :data:`uqvision.protocols.VISION_PROTOCOLS`).
PROTOCOL = Protocol("url", DESCRIPTION, score=_score, score_name="transfer",
                    reproduce=LazyReproduction("url", DESCRIPTION, f"{__name__}.reproduce"),
                    methods=REPRESENTATION_METHODS, section="v-4",
                    registers=(f"{__name__}.crop", f"{__name__}.methods"),
                    reproduce_flags=ReproduceFlags(_add_reproduce_flags, _reproduce_flags),
                    smoke_options={"methods": "ce,losspred"}, rescore=_rescore,
                    plots=Plots(_draw, "transfer score file: R-AUROC per method, against R@1, "
                                "and upstream against downstream (Figures 1, 2, 4)"),
                    report=ReportTable(rows=("method",),  # headline: the generic rule
                                       images="per downstream dataset and seed: its test "
                                              "classes' images (zero-shot); val_*: its "
                                              "validation classes' images; upstream_*: the "
                                              "upstream test set's images; *_mean: the mean "
                                              "over datasets and seeds"))
