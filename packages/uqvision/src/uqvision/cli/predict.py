"""``uqvision predict``: caches of per-sample outputs of models over an image folder. Its
options, generated from :class:`~uqvision.predict.PredictConfig`, are also ``uqvision
sweep``'s (:func:`_add_predict_options`), and so is the reading of ``--data`` before anything
runs (:func:`_data`: the folder in its layout; :func:`_check_images`: its images).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from uqmetrics.run_config import add_config_option, config_in_by_digest

from .. import catalog
from ..options import (
    COUNT,
    INDEX,
    ConfigOption,
    add_config_options,
    check_output_folder,
    config_kwargs,
    device_type,
)
from ..predict.config import AMP_MODES, PREDICT_CONFIG_OPTIONS, PredictConfig
from ..protocols import VISION_PROTOCOLS
from .base import _print

if TYPE_CHECKING:
    from ..data import ImageFolderDataset


def _predict_config(a: argparse.Namespace) -> PredictConfig:
    zero_shot = getattr(a, "zero_shot", False)  # predict only
    kw = config_kwargs(a, _PREDICT_OPTIONS)
    if zero_shot:
        kw["embeddings"] = True
    return PredictConfig(**kw, logits=not zero_shot)


def _data(a: argparse.Namespace) -> ImageFolderDataset:
    """``--data`` scanned once, in its layout (class folders, flat with ``--labels`` or a label
    file found beside it, or without one for an OOD set, a tar; :mod:`uqvision.layouts`),
    ``--subset`` applied; an ``--out``
    inside it is refused first. How it is labelled (the label file read, those passed over,
    the subset) is said on stderr in one line (:func:`uqvision.data.describe_labels`)."""
    from ..data import ImageFolderDataset, check_output_outside, describe_labels
    from ..evalsets import EVAL_SETS

    check_output_outside(a.data, getattr(a, "out", None))
    # an evaluation set whose class map labels nothing (an OOD set) needs no class folders
    unlabelled = EVAL_SETS.lookup(_predict_config(a).eval_set).class_map == "none"
    folder = ImageFolderDataset(a.data, labels=a.labels, subset=a.subset, unlabelled=unlabelled)
    line = describe_labels(folder)
    if line and int(os.environ.get("RANK", "0")) == 0:
        print(f"uqvision {a.command}: {line}", file=sys.stderr, flush=True)
    return folder


def _check_images(a: argparse.Namespace, data: ImageFolderDataset | None = None) -> None:
    """The images of ``--data``, checked before anything runs (:func:`uqvision.data.
    readable_images`); with ``--skip-bad-images`` the log says which are left out."""
    from ..data import readable_images

    folder = readable_images(data or _data(a), skip_bad=a.skip_bad_images)
    if folder.skipped and int(os.environ.get("RANK", "0")) == 0:
        shown = "; ".join(f"{rel}: {why}" for rel, why in list(folder.skipped.items())[:5])
        more = f"; ... ({len(folder.skipped)} in all)" if len(folder.skipped) > 5 else ""
        print(f"uqvision {a.command}: --skip-bad-images: {len(folder.skipped)} unreadable "
              f"image(s) of {a.data!r} left out: {shown}{more}", file=sys.stderr, flush=True)


def _cmd_predict(a: argparse.Namespace) -> int:
    from ..models import check_model_spec
    from ..predict import check_caches, predict_to_files

    check_output_folder("--out", a.out)
    for spec in a.model:  # names, checkpoint files, sidecars: before anything runs
        check_model_spec(spec)
    data = _data(a)
    _check_images(a, data)
    # every model's classes and existing caches, before anything runs (read once)
    checked = [check_caches(spec, data, a.out, _predict_config(a), dataset_name=a.dataset_name,
                            overwrite=a.overwrite) for spec in a.model]
    written: list[Path] = []
    for spec, plan in zip(a.model, checked, strict=True):
        paths = predict_to_files(spec, data, a.out, _predict_config(a),
                                 dataset_name=a.dataset_name, overwrite=a.overwrite,
                                 checked=plan)
        if int(os.environ.get("RANK", "0")) == 0:
            for p in paths:
                _print(str(p))
            written += paths
    if written and int(os.environ.get("RANK", "0")) == 0:
        # top-1/top-5 and costs: the uncertainty metrics would import the scorers (scipy,
        # 2.3 s), which predict never loads (docs/conventions.md#v-1-table, #v-predict-speed)
        from ..results import results_table

        _print(results_table(written, metrics=False).format())
        for proto in VISION_PROTOCOLS.values():  # how to score them, say the protocols
            if proto.after_predict:
                _print(proto.after_predict.format(caches=a.out))
    return 0


#: ``uqvision predict`` / ``sweep`` options generated from :class:`PredictConfig` (defaults
#: from its fields).
_PREDICT_OPTIONS = (
    ConfigOption("mode", choices=lambda: catalog.names("prediction mode"),
                 help="prediction mode:\n" + catalog.describe("prediction mode")),
    ConfigOption("passes", type=COUNT,
                 help="TTA augmentations or MC-dropout passes (default: 30 for mc_dropout, the "
                      "Selective paper's count; 1 otherwise)"),
    ConfigOption("first_pass", type=INDEX, help="index of the first TTA pass"),
    ConfigOption("samples", type=COUNT,
                 help="prediction samples of a run trained with a method (snapshots, posterior "
                      "draws, passes; default: all snapshots, 10 draws, 1 network)"),
    ConfigOption("first_sample", type=INDEX, help="index of the first sample"),
    ConfigOption("train_data",
                 help="training folder for BatchNorm updates of sampled weights (SWAG, "
                      "Laplace; default: the one the checkpoint's sidecar records)"),
    ConfigOption("tta_policy", choices=lambda: catalog.names("augmentation"),
                 help="augmentation of --mode tta:\n" + catalog.describe("augmentation")),
    ConfigOption("seed", type=INDEX),
    ConfigOption("batch_size", type=COUNT),
    ConfigOption("num_workers", flag="--workers", type=INDEX, launcher=True,
                 help="DataLoader workers (default: the cores the network leaves idle, at "
                      "most 4: on CUDA all but one, at least 1; on the CPU the cores beyond "
                      "--threads; 0 for a single batch or inside a Dask worker)"),
    ConfigOption("device", type=device_type, help="cpu | cuda | cuda:N"),
    ConfigOption("amp", choices=lambda: list(AMP_MODES),
                 help="autocast: fp16 (CUDA only) or bf16 (default: {default}; part of a "
                      "cache's identity)"),
    ConfigOption("channels_last", negatable=True, default=None,
                 help="run the network on NHWC tensors, or not (faster for most CNNs on CPU "
                      "and with --amp on GPU; logits equal to float rounding; part of a "
                      "cache's identity; default: by architecture, on the CPU for the "
                      "convolutional timm families of uqvision.predict."
                      "CHANNELS_LAST_CPU_FAMILIES, recorded in the caches)"),
    ConfigOption("embeddings",
                 help="also cache pre-logit features (what the feature-based OOD detectors "
                      "and URL's zero-shot measures read)"),
    ConfigOption("allow_random_init", flag="--random-init",
                 help="models without a checkpoint get random weights (code-path checks only)"),
    ConfigOption("skip_bad_images",
                 help="leave out images that do not read (empty, truncated, not an image), "
                      "recorded in the caches' attrs; without it they stop the command before "
                      "any work"),
    *PREDICT_CONFIG_OPTIONS,  # the evaluation set and the cache's extra variables
)


@dataclasses.dataclass
class _FlagOf:
    """The flag form of ``PredictConfig.channels_last`` (its default ``None``, by
    architecture, is the option's ``default``)."""

    channels_last: bool = False


def _add_predict_options(p: argparse.ArgumentParser) -> None:
    add_config_options(p, PredictConfig, [o for o in _PREDICT_OPTIONS
                                          if o.field != "channels_last"])
    add_config_options(p, _FlagOf, [o for o in _PREDICT_OPTIONS if o.field == "channels_last"])
    p.add_argument("--labels", default=None, metavar="FILE",
                   help="label file of a flat --data folder or archive: the ILSVRC2012 devkit "
                        "(its folder, ground-truth .txt or .tar.gz) or LOC_val_solution.csv "
                        "(default: looked for beside --data, then one folder up; the first "
                        "found is read, the devkit before the csv)")
    p.add_argument("--subset", action="store_true",
                   help="--data holds part of the images of its label file (e.g. 40 of "
                        "ImageNet's 50,000): the labelled images absent are left out, recorded "
                        "in the caches as counts and a hash; without it they stop the command")
    p.add_argument("--dataset-name", default=None, help="default: the data folder's name")
    p.add_argument("--overwrite", action="store_true")
    add_config_option(p)


def _config_files_predict(a: argparse.Namespace, config) -> list[Path]:
    """``OUT/predict.<digest>.config.toml``: runs add caches to a shared folder, each its own
    file (named by its options; :func:`uqmetrics.run_config.config_in_by_digest`)."""
    return [config_in_by_digest(a.out, "predict", config)]


def _args_predict(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, action="append",
                   help="NAME or NAME=CHECKPOINT (timm arch[.tag], or tv/<torchvision name>); "
                        "repeatable")
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True, help="cache directory")
    p.add_argument("--zero-shot", action="store_true",
                   help="embeddings (and u) only, no logits: a folder of classes the model "
                        "never saw (URL's downstream sets)")
    _add_predict_options(p)
