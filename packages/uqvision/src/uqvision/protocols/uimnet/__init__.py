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
from pathlib import Path

from uqmetrics import InputError

from ... import catalog
from ...options import SEED, check_output_file, check_output_folder
from ..base import Command, LazyReproduction, Plots, Protocol, ReportTable, fraction

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


def _index_files(a: argparse.Namespace) -> list[str]:
    """The index files ``uqvision split --train`` writes, per data seed:
    ``<--index-dir>/seed<S>.{train,val}.json`` (:func:`~.index.make_index_files`)."""
    return [str(Path(a.index_dir) / f"seed{seed}.{part}.json")
            for seed in a.seeds for part in ("train", "val")]


def _train_folder(a: argparse.Namespace):
    """``--train`` scanned once (before the caches are read); an
    :class:`~uqmetrics.InputError` naming ``--train`` and its value when it does not exist or
    is no image folder."""
    from ...data import ImageFolderDataset
    from ...layouts import is_folder

    if not a.train or not (Path(a.train).exists() or is_folder(a.train)):
        raise InputError(f"--train {a.train!r} does not exist: give the training image folder "
                         "the index files list")
    try:
        return ImageFolderDataset(a.train)
    except (OSError, ValueError) as exc:
        raise InputError(f"--train {a.train!r}: {' '.join(str(exc).split())}") from None


def _cmd_split(a: argparse.Namespace) -> int:
    """``uqvision split``: every output and ``--train`` checked before anything is written
    (an existing split or index file is replaced only with ``--overwrite``)."""
    from ...data import ClassSubset
    from .index import make_index_files  # imported on use
    from .split import split_from_caches, write_split

    check_output_file("--out", a.out, a.overwrite)
    folder = None
    if a.train is not None:
        check_output_folder("--index-dir", a.index_dir)
        for path in _index_files(a):
            if Path(path).absolute() == Path(a.out).absolute():
                raise InputError(f"--out {a.out!r} is one of the index files written in "
                                 f"--index-dir {a.index_dir!r}: choose another --out")
            check_output_file(f"--index-dir {a.index_dir!r}:", path, a.overwrite)
        folder = _train_folder(a)
    split = split_from_caches(a.embeddings)
    if folder is not None:  # the in-domain classes of the caches, in --train
        try:
            ClassSubset(folder, split["in_classes"])
        except ValueError as exc:
            raise InputError(f"--train {a.train!r} is not the folder of --embeddings: "
                             f"{exc}") from None
    print(str(write_split(split, a.out)), flush=True)
    if folder is not None:
        for seed in a.seeds:
            for p in make_index_files(folder, split["in_classes"], a.index_dir, seed=seed,
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
    p.add_argument("--val-fraction", type=fraction, default=0.1,
                   help="the fraction of each in-domain class's images in validation, in "
                        "(0, 1) (default: 0.1)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing split file (--out) and index files")


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
