"""V.2 — Pitfalls of in-domain uncertainty estimation: ensembles (docs/conventions.md#v-2).

- :mod:`~.score`: metrics vs ensemble size and the Deep Ensemble Equivalent of every method
  (:func:`~.score.score_ensembles`, ``uqvision score pitfalls``, alias ``ensembles``); its groups are
  built from the general methods only (:data:`uqvision.methods.GENERAL_METHODS`);
- :mod:`~.plots`: metrics and DEE vs ensemble size (``uqvision plot --ensembles``);
- :mod:`~.reproduce`: ``uqvision reproduce pitfalls``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ...methods import GENERAL_METHODS
from ...options import COUNT, ConfigOption, add_config_options, config_kwargs
from ..base import LazyReproduction, Plots, Protocol, ReportTable

__all__ = ["DESCRIPTION", "ENSEMBLE_OPTIONS", "PROTOCOL"]

#: One line: the protocol and its driver (``uqvision reproduce pitfalls``).
DESCRIPTION = ("V.2 (Pitfalls): every ensembling method trained, predicted plain and with TTA, "
               "CLL and DEE vs number of samples")


def _ensemble_options() -> tuple[ConfigOption, ...]:
    """The ensembles options of ``uqvision score`` generated from :class:`~.score.
    EnsembleConfig` (defaults from its fields): ``ENSEMBLE_OPTIONS``, built on first use (its
    help lists the ensemble methods of :mod:`~.score`)."""
    from .score import ENSEMBLE_METHODS  # imported on use

    return (
        ConfigOption("members", nargs="+",
                     help="ensembles: the deep ensemble's model names, whatever their method "
                          "attr (default: the caches of method deep_ensemble)"),
        ConfigOption("methods", nargs="+", choices=ENSEMBLE_METHODS.names,
                     help="ensembles: methods (default: every one with caches; a cache's "
                          "method attr decides its group)\n" + ENSEMBLE_METHODS.describe()),
        ConfigOption("n_orders", type=COUNT),
        ConfigOption("reference", choices=ENSEMBLE_METHODS.names,
                     help="ensembles: the method DEE is measured against"),
    )


def __getattr__(name: str):
    if name == "ENSEMBLE_OPTIONS":  # built when first asked for, then kept
        globals()[name] = _ensemble_options()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _add_options(p: argparse.ArgumentParser) -> None:
    from .score import EnsembleConfig  # imported on use

    add_config_options(p, EnsembleConfig, __getattr__("ENSEMBLE_OPTIONS"))


def _score(a: argparse.Namespace):
    """metrics vs ensemble size and the Deep Ensemble Equivalent of every method (V.2)"""
    from .score import EnsembleConfig, score_ensembles  # imported on use

    kw = config_kwargs(a, __getattr__("ENSEMBLE_OPTIONS"))
    kw["methods"] = tuple(kw["methods"]) if kw["methods"] else None
    return score_ensembles(a.caches, EnsembleConfig(**kw, seed=a.seed, dataset=a.dataset))


def _draw(scores: str | os.PathLike, out: str | os.PathLike) -> list[Path]:
    """``uqvision plot --ensembles FILE``: metrics and DEE vs ensemble size."""
    from .plots import plot_ensembles  # figures: imported on use

    return plot_ensembles(scores, out)


def _rescore(result, path):
    """The score file recomputed from the caches and with the configuration it records
    (``uqvision verify``): the caches of its own groups; those of ``extra_methods`` as
    recorded there."""
    from uqmetrics.runs.io import decode_attr

    from ...provenance import recorded_config
    from .score import EnsembleConfig, Source, score_ensembles  # imported on use

    cfg = recorded_config(result)
    extra = {m: [Source(**s) for s in v] for m, v in (cfg.pop("extra_methods") or {}).items()}
    sources = decode_attr(result.attrs["sources"])
    caches = list(dict.fromkeys(s["path"] for name, members in sources.items()
                                if name not in extra for m in members for s in m))
    members = cfg.pop("members")
    return score_ensembles(caches, EnsembleConfig(
        **cfg, members=list(members) if members is not None else None, extra_methods=extra))


#: The Pitfalls protocol (registered in :data:`uqvision.protocols.VISION_PROTOCOLS`); it
#: compares the general methods (``reproduce.PITFALLS_METHODS``).
PROTOCOL = Protocol("pitfalls", DESCRIPTION, score=_score, score_name="ensembles",
                    add_options=_add_options,
                    reproduce=LazyReproduction("pitfalls", DESCRIPTION, f"{__name__}.reproduce"),
                    methods=tuple(GENERAL_METHODS), section="v-2",
                    plots=Plots(_draw, "ensembles score file: metrics and DEE vs ensemble size"),
                    rescore=_rescore,
                    report=ReportTable(rows=("method",),  # headline: the generic rule
                                       images="every image of the scored dataset, per method, "
                                              "member order and ensemble size"))
