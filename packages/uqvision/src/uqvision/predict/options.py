"""The command-line options of a prediction, generated from :class:`~uqvision.predict.
PredictConfig` (:data:`PREDICT_OPTIONS`, :func:`add_predict_options`) and the config they give
(:func:`predict_config`): ``uqvision predict``'s, ``uqvision sweep``'s and the ``[predict]``
table of ``uqvision evaluate``. Imports no torch (docs/conventions.md#fast-help).
"""

from __future__ import annotations

import argparse
import dataclasses

from uqmetrics.runs.run_config import add_config_option

from .. import catalog
from ..options import (
    COUNT,
    INDEX,
    SEED,
    ConfigOption,
    add_config_options,
    config_kwargs,
    device_type,
    given_options,
)
from .config import AMP_MODES, DECODERS, PREDICT_CONFIG_OPTIONS, PredictConfig

__all__ = ["MODE_OPTIONS", "PREDICT_OPTIONS", "add_predict_options", "check_mode_options",
           "predict_config"]


def predict_config(a: argparse.Namespace) -> PredictConfig:
    """The :class:`~uqvision.predict.PredictConfig` the prediction options parsed in ``a`` give
    (``--zero-shot``, ``uqvision predict``'s own: embeddings and no logits).

    Raises
    ------
    uqmetrics.InputError
        An option given that the chosen ``--mode`` does not use (:func:`check_mode_options`).
    """
    check_mode_options(a)
    zero_shot = getattr(a, "zero_shot", False)  # predict only
    kw = config_kwargs(a, PREDICT_OPTIONS)
    if zero_shot:
        kw["embeddings"] = True
    return PredictConfig(**kw, logits=not zero_shot)


#: The prediction options only some modes use: field -> those modes (``--passes``: the TTA
#: augmentations or MC-dropout passes; ``--first-pass`` and ``--tta-policy``: TTA's).
MODE_OPTIONS: dict[str, tuple[str, ...]] = {"passes": ("tta", "mc_dropout"),
                                            "first_pass": ("tta",), "tta_policy": ("tta",)}
#: The modes known to use none of :data:`MODE_OPTIONS` but those that name them: ``plain``
#: and ``crop`` (URL's) run one pass, ``mc_dropout`` reads no augmentation. A mode a plugin
#: registers is not checked.
_CHECKED_MODES = ("plain", "tta", "mc_dropout", "crop")


def check_mode_options(a: argparse.Namespace) -> None:
    """Refuse an option of :data:`MODE_OPTIONS` given (on the command line, in a ``--config``
    file or an evaluation's ``[predict]`` table) with a value other than its default where the
    chosen ``--mode`` does not use it: it would be silently ignored (``--passes 5`` with
    ``--mode plain`` makes one pass). The message names both options and the values.

    Raises
    ------
    uqmetrics.InputError
    """
    from uqmetrics import InputError

    mode = getattr(a, "mode", None)
    if mode not in _CHECKED_MODES:
        return
    given = given_options(a)
    defaults = {f.name: f.default for f in dataclasses.fields(PredictConfig)}
    for opt in PREDICT_OPTIONS:
        modes = MODE_OPTIONS.get(opt.field)
        if modes is None or mode in modes or opt.field not in given:
            continue
        value = getattr(a, opt.field, None)
        if value == defaults[opt.field]:  # a recorded run's default (first-pass = 0)
            continue
        flag = opt.flag or "--" + opt.field.replace("_", "-")
        raise InputError(f"{flag} {value}: --mode {mode} does not use it (it is for --mode "
                         f"{' or '.join(modes)}); leave {flag} out, or give the mode that "
                         "uses it")


#: ``uqvision predict`` / ``sweep`` options generated from :class:`PredictConfig` (defaults
#: from its fields).
PREDICT_OPTIONS = (
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
    ConfigOption("seed", type=SEED),
    ConfigOption("batch_size", type=COUNT),
    ConfigOption("num_workers", flag="--workers", type=INDEX, launcher=True,
                 help="DataLoader workers (default: the cores the network leaves idle, at "
                      "most 4: on CUDA all but one, at least 1; on the CPU the cores beyond "
                      "--threads; 0 for a single batch or inside a Dask worker)"),
    ConfigOption("device", type=device_type, help="cpu | cuda | cuda:N", launcher=True),
    ConfigOption("amp", choices=lambda: list(AMP_MODES),
                 help="autocast: fp16 (CUDA only) or bf16 (default: {default}; part of a "
                      "cache's identity)"),
    ConfigOption("channels_last", negatable=True, default=None,
                 help="run the network on NHWC tensors, or not (faster for most CNNs on CPU "
                      "and with --amp on GPU; logits equal to float rounding; part of a "
                      "cache's identity; default: by architecture, on the CPU for the "
                      "convolutional timm families of uqvision.predict."
                      "CHANNELS_LAST_CPU_FAMILIES, recorded in the caches)"),
    ConfigOption("decoder", choices=lambda: DECODERS.names(),
                 help="how the images are decoded (part of a cache's identity; default: "
                      "{default}; --mode plain and mc_dropout):\n" + DECODERS.describe()),
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


def add_predict_options(p: argparse.ArgumentParser) -> None:
    """The prediction options (:data:`PREDICT_OPTIONS`), ``--labels``, ``--subset``,
    ``--dataset-name``, ``--overwrite`` and ``--config`` on ``p``."""
    add_config_options(p, PredictConfig, [o for o in PREDICT_OPTIONS
                                          if o.field != "channels_last"])
    add_config_options(p, _FlagOf, [o for o in PREDICT_OPTIONS if o.field == "channels_last"])
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
