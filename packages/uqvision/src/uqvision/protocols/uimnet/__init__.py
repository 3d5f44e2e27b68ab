"""V.3 — UIMNET: in-domain and out-domain uncertainty on a clustered class split
(docs/conventions.md#v-3).

- :mod:`~.split`: the Ward in/out class split (``uqvision split``);
- :mod:`~.methods`: the ten algorithms, registered in
  :data:`~uqvision.training.method.TRAINING_METHODS`;
- :mod:`~.measures`: the seven uncertainty measures (and ``jacobian_softmax``);
- :mod:`~.augment`: the ``tta`` measure's augmentation policies;
- :mod:`~.score`: in/out-domain metrics over measures (``uqvision score uimnet``);
- :mod:`~.plots`: heat maps and in/out-domain histograms (``uqvision plot --uimnet FILE``);
- :mod:`~.reproduce`: ``uqvision reproduce uimnet``.
"""

from __future__ import annotations

import argparse

from ... import catalog
from ...options import SEED, check_output_file, check_output_folder
from ..base import Command, LazyReproduction, Plots, Protocol, ReportTable

__all__ = ["DEFAULT_GMM_FIT", "DESCRIPTION", "PROTOCOL", "UIMNET_ALGORITHMS"]

#: The algorithm names of the paper, in its order (:data:`TRAINING_METHODS` entries, registered
#: by :mod:`~.methods`).
UIMNET_ALGORITHMS = ("erm", "mixup", "soft_labeler", "mc_dropout", "mimo", "rbf", "rnd", "oc",
                     "deep_ae", "due")

#: One line: the protocol and its driver (``uqvision reproduce uimnet``).
DESCRIPTION = "UIMNET (V.3): clustered in/out class split, ten algorithms, seven measures"


def _score(a: argparse.Namespace):
    """UIMNET ensembles: in-domain and out-domain metrics over measures, with the oracle (V.3)"""
    from .measures import DEFAULT_GMM_FIT  # imported on use
    from .score import score_ood

    return score_ood(a.caches[0], gmm_fit=getattr(a, "gmm_fit", None) or DEFAULT_GMM_FIT)


#: The GMM fit ``score_ood`` and ``uqvision reproduce uimnet`` use unless told otherwise
#: (docs/conventions.md#v-3): class Gaussians on the in-domain training split with Ledoit–Wolf
#: covariances (the fits: :data:`~.measures.GMM_FITS`).
DEFAULT_GMM_FIT = "train-ledoit-wolf"


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gmm-fit", choices=catalog.names("GMM fit"), default=None,
                   help=f"ood: the fit of the gmm measure (default {DEFAULT_GMM_FIT}; "
                        "docs/conventions.md#v-3)")


def _draw(scores, out):
    """``uqvision plot --uimnet FILE``: the out-domain heat maps and in/out histograms."""
    from .plots import draw_figures  # figures: imported on use

    return draw_figures(scores, out)


def _cmd_split(a: argparse.Namespace) -> int:
    from .index import make_index_files  # imported on use
    from .split import split_from_caches, write_split

    check_output_file("--out", a.out, None)
    if a.train:
        check_output_folder("--index-dir", a.index_dir)
    split = split_from_caches(a.embeddings)
    print(str(write_split(split, a.out)), flush=True)
    if a.train:
        for seed in a.seeds:
            for p in make_index_files(a.train, split["in_classes"], a.index_dir, seed=seed,
                                      val_fraction=a.val_fraction).values():
                print(str(p), flush=True)
    return 0


def _args_split(p: argparse.ArgumentParser) -> None:
    p.add_argument("--embeddings", nargs="+", required=True,
                   help="prediction caches with embeddings (uqvision predict --embeddings)")
    p.add_argument("--out", required=True, help="split file (.json)")
    p.add_argument("--train", default=None, help="training folder: also write index files")
    p.add_argument("--index-dir", default="index", help="folder of the index files")
    p.add_argument("--seeds", type=SEED, nargs="+", default=[0], help="data seeds")
    p.add_argument("--val-fraction", type=float, default=0.1)


#: The UIMNET protocol (registered in :data:`uqvision.protocols.VISION_PROTOCOLS`).
def _rescore(result, path):
    """The score file recomputed from the caches folder of the ensemble cells it records
    (its ``caches/``: ``ensembles/`` and ``runs/``), with its recorded configuration
    (``uqvision verify``)."""
    from pathlib import Path

    from ...provenance import recorded_caches, recorded_config
    from .score import score_ood  # imported on use

    cfg = recorded_config(result)
    folders = {Path(p).parent.parent for p in recorded_caches(result)
               if Path(p).parent.name == "ensembles"}
    if len(folders) != 1:
        raise ValueError(f"the result's ensemble cells lie in {len(folders)} caches folders "
                         f"({sorted(map(str, folders))}), not one")
    return score_ood(folders.pop(), ks=tuple(cfg["ks"]), fit_fraction=cfg["fit_fraction"],
                     split_seed=cfg["split_seed"], gmm_fit=cfg["gmm_fit"])


PROTOCOL = Protocol(
    "uimnet", DESCRIPTION, score=_score, score_name="uimnet", add_options=_add_options,
    reproduce=LazyReproduction("uimnet", DESCRIPTION, f"{__name__}.reproduce"),
    methods=UIMNET_ALGORITHMS, registers=(f"{__name__}.methods",), section="v-3",
    rescore=_rescore,
    report=ReportTable(rows=("algorithm",),  # headline: the generic rule
                       images="acc1, acc5, nll, ece: the in-domain test images (the "
                              "temperature fitted on in-domain validation); auc, in_as_in, "
                              "out_as_out: those against the out-domain images; mean and std "
                              "over the data seeds"),
    plots=Plots(_draw, "uimnet score file: AUC, InAsIn, OutAsOut per algorithm x measure "
                       "(heat maps) and u histograms in- vs out-domain (from its caches)"),
    commands={"split": Command(_cmd_split, _args_split,
                               "UIMNET in/out class split (Ward) and 90/10 index files")},
    smoke_options={"algorithms": "erm,mc_dropout", "mc_passes": "2", "tta": "1",
                   "jacobian_max": "8", "spectral": "0,1", "width": "6"})
