"""V.1 — selective prediction over a model zoo (docs/conventions.md#v-1).

- :mod:`~.score`: one row per model and row kind, with and without temperature scaling
  (:func:`~.score.score_selective`, ``uqvision score selective``);
- :mod:`~.metadata`: the model-metadata tables (``uqvision metadata``);
- :mod:`~.analysis`: the paper's analyses of a score file;
- :mod:`~.plots`: the paper's figures (``uqvision plot --selective``);
- :mod:`~.commands`: its parts of the command line: ``uqvision metadata``, the scoring of
  ``uqvision sweep``, ``plot --selective`` and the results table of ``score selective``;
- :mod:`~.reproduce`: ``uqvision reproduce selective`` (a zoo with controlled regimes).
"""

from __future__ import annotations

import argparse

from ...options import (
    COUNT,
    Command,
    ConfigOption,
    add_config_options,
    config_kwargs,
    count_or_fraction,
    positive_float,
)
from ...roles import legacy_config, role_option
from ..base import LazyReproduction, Plots, Protocol, ReportTable, ScoreTable
from .commands import SWEEP_SCORING, draw_figures, metadata_arguments, results_of, run_metadata

__all__ = ["DESCRIPTION", "PROTOCOL", "SELECTIVE_OPTIONS", "add_selective_options",
           "coverage_fraction", "selective_config"]

#: One line: the protocol and its driver (``uqvision reproduce selective``).
DESCRIPTION = ("V.1 (523 classifiers): a zoo with controlled regimes trained on the hierarchy "
               "stand-in; scores, the paper's analyses and figures")


def coverage_fraction(text: str) -> float:
    """argparse type: a coverage in (0, 1] (``--aurc-coverage``)."""
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be a coverage in (0, 1], got {text}")
    return value


def _sac_rules() -> tuple[str, ...]:
    from uqmetrics import SAC_RULES  # uqmetrics' metric modules, imported on first use

    return SAC_RULES


#: The scoring options of ``uqvision score`` and ``sweep`` generated from
#: :class:`~.score.SelectiveConfig` (defaults from its fields).
SELECTIVE_OPTIONS = (
    ConfigOption("calibration_size", type=count_or_fraction,
                 help="selective: calibration samples, a count or a fraction in (0, 1) "
                      "(default: %(default)s)"),
    ConfigOption("sac_rule", choices=_sac_rules,
                 help="selective: SAC rule; largest = the paper's definition, first_drop = its "
                      "official code (reproduces its published SAC values; default: %(default)s)"),
    ConfigOption("mc_passes", type=COUNT,
                 help="selective: MC-dropout passes per +mc_dropout row; caches with fewer are "
                      "refused (default: %(default)s)"),
    ConfigOption("none_samples", choices=("heldout", "all"),
                 help="selective: the images the unscaled row (calibration=none) is scored on: "
                      "heldout = those of the temperature-scaled row (comparable; default), "
                      "all = every image, as the paper's official code"),
    ConfigOption("aurc_coverage", type=coverage_fraction, metavar="C",
                 help="selective: aurc_c/eaurc_c over the coverages [0, C]; the Selective "
                      "paper fixes no range: the default {default} is this project's choice"),
)


def selective_config(a: argparse.Namespace, **kw):
    """The :class:`~.score.SelectiveConfig` of parsed options (``score``, ``sweep``)."""
    from .score import SelectiveConfig  # imported on use

    return SelectiveConfig(**config_kwargs(a, SELECTIVE_OPTIONS),
                           metadata=tuple(a.metadata or ()), seed=a.seed, **kw)


def add_selective_options(p: argparse.ArgumentParser) -> None:
    """The scoring options ``uqvision score`` and ``uqvision sweep`` share."""
    from .score import SelectiveConfig  # imported on use

    add_config_options(p, SelectiveConfig, SELECTIVE_OPTIONS)
    p.add_argument("--metadata", action="append", default=None, metavar="FILE",
                   help="selective: extra model-metadata table (repeatable; see "
                        "uqvision metadata --fields)")


#: ``score selective --test NAME``: the set scored.
_TEST_OPTION = role_option("test", "selective", help="selective: dataset_name of the set "
                           "scored (default: the only set of role test; a set of role shift "
                           "or calibration when named; never a set of role fit)")


def _add_options(p: argparse.ArgumentParser) -> None:
    from .score import ROW_KINDS, SelectiveConfig  # imported on use

    add_selective_options(p)
    add_config_options(p, SelectiveConfig, (_TEST_OPTION,))
    p.add_argument("--row-kinds", nargs="+", choices=ROW_KINDS.names(), default=None,
                   help="selective: row kinds (default: all)\n" + ROW_KINDS.describe())


def _score(a: argparse.Namespace):
    """one row per model and row kind, with and without temperature scaling (V.1)"""
    from .score import SelectiveConfig, score_selective  # imported on use

    kinds = tuple(a.row_kinds) if a.row_kinds else SelectiveConfig.kinds
    return score_selective(a.caches, selective_config(a, test=a.test, kinds=kinds))


def _rescore(result, path):
    """The score file recomputed from the caches and with the configuration it records
    (``uqvision verify``)."""
    from ...provenance import recorded_caches, recorded_config
    from .score import SelectiveConfig, score_selective  # imported on use

    config = legacy_config(recorded_config(result))
    if "none_samples" not in config and "sample_set" in result.coords:
        # before the option, the none row was scored on every image (sample_set "all")
        config["none_samples"] = str(result["sample_set"].sel(calibration="none").values)
    return score_selective(recorded_caches(result), SelectiveConfig(**config))


def _check_options(a: argparse.Namespace, n_test: int) -> None:
    """The calibration size against the test set's ``n_test`` images (``ValueError`` naming
    --calibration-size)."""
    from .score import resolve_calibration_size  # imported on use

    resolve_calibration_size(a.calibration_size, n_test)


#: The selective-prediction protocol (registered in :data:`uqvision.protocols.VISION_PROTOCOLS`).
PROTOCOL = Protocol(
    "selective", DESCRIPTION, score=_score, score_name="selective", add_options=_add_options,
    reproduce=LazyReproduction("selective", DESCRIPTION, f"{__name__}.reproduce"),
    methods=("deep_ensemble",), section="v-1",
    commands={"metadata": Command(run_metadata, metadata_arguments,
                                  "model metadata tables: columns, known models, unknown "
                                  "models")},
    score_table=ScoreTable(results_of),
    plots=Plots(draw_figures,
                "selective score file: the Selective paper's scatter and paired figures"),
    sweep=SWEEP_SCORING, rescore=_rescore, check_options=_check_options,
    report=ReportTable(
        rows=("model",),
        headline=tuple(f"{v}[calibration=none]" for v in (
            "accuracy", "auroc", "aurc", "eaurc", "aurc_c", "eaurc_c", "sac_99", "sac_95", "ece",
            "nll", "brier")),
        images="calibration=temperature: the n_eval images outside the n_calib the "
               "temperature is fitted on; calibration=none: the same images (sample_set "
               "heldout, the default) or every image (sample_set all, --none-samples all); "
               "n_scored says how many"),
    after_predict="auroc/ece/aurc: uqvision score selective --caches {caches} --out FILE.nc")
