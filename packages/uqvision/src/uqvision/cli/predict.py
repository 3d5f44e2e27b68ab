"""``uqvision predict``: caches of per-sample outputs of models over an image folder. Its
options, generated from :class:`~uqvision.predict.PredictConfig`, are also ``uqvision
sweep``'s and ``uqvision evaluate``'s (:mod:`uqvision.predict.options`, re-exported here as
:func:`_add_predict_options`, :func:`_predict_config`, ``_PREDICT_OPTIONS``), and so is the
reading of ``--data`` before anything runs (:func:`_data`: the folder in its layout;
:func:`_check_images`: its images).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from uqmetrics import InputError
from uqmetrics.runs.run_config import config_in_by_digest

from ..options import check_output_folder
from ..predict.options import (  # noqa: F401  (re-exported: the names cli and tests read)
    PREDICT_OPTIONS as _PREDICT_OPTIONS,
)
from ..predict.options import _FlagOf  # noqa: F401
from ..predict.options import add_predict_options as _add_predict_options
from ..predict.options import predict_config as _predict_config
from ..protocols import VISION_PROTOCOLS
from .base import _print

if TYPE_CHECKING:
    from ..data import ImageFolderDataset
    from ..predict import PredictConfig

T = TypeVar("T")


def _data(a: argparse.Namespace) -> ImageFolderDataset:
    """``--data`` scanned once, in its layout (class folders, flat with ``--labels`` or a label
    file found beside it, or without one for an OOD set, a tar; :mod:`uqvision.layouts`),
    ``--subset`` applied; an ``--out``
    inside it is refused first. How it is labelled (the label file read, those passed over,
    the subset) is said on stderr in one line (:func:`uqvision.data.describe_labels`)."""
    from ..data import ImageFolderDataset, check_output_outside, describe_labels
    from ..evalsets import EVAL_SETS

    check_output_outside(a.data, getattr(a, "out", None))
    if a.labels is not None and not os.path.lexists(a.labels):  # not said as --data's
        raise InputError(f"--labels {a.labels!r} does not exist")
    # an evaluation set whose class map labels nothing (an OOD set) needs no class folders
    unlabelled = EVAL_SETS.lookup(_predict_config(a).eval_set).class_map == "none"
    folder = ImageFolderDataset(a.data, labels=a.labels, subset=a.subset, unlabelled=unlabelled,
                                option="--data")  # its errors name the option
    line = describe_labels(folder)
    if line and int(os.environ.get("RANK", "0")) == 0:
        print(f"uqvision {a.command}: {line}", file=sys.stderr, flush=True)
    return folder


#: What an OS error about a file the user named says (``errno`` -> words), after the option.
_OS_ERRORS = {errno.ENOENT: "does not exist", errno.EISDIR: "is a folder, not a file",
              errno.ENOTDIR: "has a file where a folder is expected",
              errno.EACCES: "cannot be read (permission denied)"}


def named_input(option: str, value: object, check: Callable[[], T]) -> T:
    """``check()``, its refusal of the input the user gave as ``option value`` (a missing,
    damaged or unreadable file, a bad name) restated as one :class:`~uqmetrics.InputError`
    naming the option and the value: ``--init 'nope.pt': does not exist``. Used by the
    ``predict``, ``sweep`` and ``train`` commands before any work."""
    try:
        return check()
    except (ValueError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            what = _OS_ERRORS.get(exc.errno, exc.strerror or str(exc))
            at = exc.filename
            text = what if at is None or str(at) == str(value) else f"{str(at)!r} {what}"
        elif isinstance(exc, json.JSONDecodeError):
            text = f"not a JSON file ({exc})"
        else:
            text = str(exc) or type(exc).__name__
        raise InputError(f"{option} {str(value)!r}: {' '.join(text.split())}") from None


def say_left_out(command: str, option: str, where: str, skipped: Mapping[str, str]) -> None:
    """Say on stderr, in one line, which unreadable images a command leaves out of a folder
    (``skipped``: image -> what is wrong; nothing when empty), and by which ``option`` (how
    the user asked for it: ``--skip-bad-images``, an evaluation's ``[predict]`` key):
    ``uqvision predict``, ``sweep`` (each folder) and ``evaluate`` (each set) say it alike.
    Rank 0 alone under ``torchrun``."""
    if not skipped or int(os.environ.get("RANK", "0")) != 0:
        return
    shown = "; ".join(f"{rel}: {why}" for rel, why in list(skipped.items())[:5])
    more = f"; ... ({len(skipped)} in all)" if len(skipped) > 5 else ""
    print(f"uqvision {command}: {option}: {len(skipped)} unreadable image(s) of {where} left "
          f"out: {shown}{more}", file=sys.stderr, flush=True)


def _check_images(a: argparse.Namespace, data: ImageFolderDataset | None = None) -> None:
    """The images of ``--data``, checked before anything runs (:func:`uqvision.data.
    readable_images`); with ``--skip-bad-images`` the log says which are left out
    (:func:`say_left_out`)."""
    from ..data import readable_images

    folder = readable_images(data or _data(a), skip_bad=a.skip_bad_images)
    say_left_out(a.command, "--skip-bad-images", repr(a.data), folder.skipped)


def _cmd_predict(a: argparse.Namespace) -> int:
    from uqmetrics.runs.sweep import undone_if_refused

    check_output_folder("--out", a.out)
    # a command that fails leaves nothing behind: the --out folder it made (the caches' locks
    # make it before the model runs), while it holds nothing, is removed, with the parents it
    # made; a folder that was there, or one that holds a cache written, is kept
    with undone_if_refused(a.out, errors=(BaseException,)):
        return _predict(a)


def _predict(a: argparse.Namespace) -> int:
    """``uqvision predict``'s work, once ``--out`` is known to be writable."""
    from ..models import check_model_spec
    from ..predict import check_caches, predict_to_files

    _predict_config(a)  # an option the --mode does not use, first
    for spec in a.model:  # names, checkpoint files, sidecars: before anything runs
        named_input("--model", spec, partial(check_model_spec, spec))
    data = _data(a)
    _check_images(a, data)
    # every model's classes and existing caches, before anything runs (read once)
    checked = [check_caches(spec, data, a.out, _predict_config(a), dataset_name=a.dataset_name,
                            overwrite=a.overwrite) for spec in a.model]
    if a.dry_run:
        import torch

        for line in dry_run_lines(a.model, checked, _predict_config(a),
                                  cuda_available=torch.cuda.is_available()):
            _print(line)
        return 0
    written: list[Path] = []
    for spec, plan in zip(a.model, checked, strict=True):
        paths = predict_to_files(spec, data, a.out, _predict_config(a),
                                 dataset_name=a.dataset_name, overwrite=a.overwrite,
                                 checked=plan, progress=True)  # off under uqvision --quiet
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


def dry_run_lines(models: list[str], checked: list[tuple[dict, set]], config: PredictConfig,
                  *, cuda_available: bool) -> list[str]:
    """What ``uqvision predict --dry-run`` prints: per model, the caches it would compute and
    those complete (reused), then the suggestion to decode on the GPU when there is one to
    make (:func:`uqvision.predict.decoder_suggestion`: ``cuda_available`` and Pillow
    decoding)."""
    from ..predict import decoder_suggestion

    lines = []
    for spec, (paths, missing) in zip(models, checked, strict=True):
        lines.append(f"{spec}: {len(missing)} of {len(paths)} cache(s) to compute, "
                     f"{len(paths) - len(missing)} complete (decoder {config.decoder}, device "
                     f"{config.device})")
    hint = decoder_suggestion(config.decoder, config.device, cuda_available)
    return lines + ([hint] if hint else [])


def _config_files_predict(a: argparse.Namespace, config) -> list[Path]:
    """``OUT/predict.<digest>.config.toml``: runs add caches to a shared folder, each its own
    file (named by its options; :func:`uqmetrics.runs.run_config.config_in_by_digest`), none
    for ``--dry-run``, which writes nothing."""
    return [] if getattr(a, "dry_run", False) else [config_in_by_digest(a.out, "predict",
                                                                        config)]


def _args_predict(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, action="append",
                   help="NAME or NAME=CHECKPOINT (timm arch[.tag], or tv/<torchvision name>); "
                        "repeatable")
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True, help="cache directory")
    p.add_argument("--zero-shot", action="store_true",
                   help="embeddings (and u) only, no logits: a folder of classes the model "
                        "never saw (URL's downstream sets)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the models, the folder and the caches there, list the caches "
                        "to compute and those complete, and on a machine with CUDA suggest "
                        "--decoder torchvision; nothing is computed or written")
    _add_predict_options(p)
