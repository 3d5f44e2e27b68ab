"""``uqvision compare RESULT --published NAME``: a score file's numbers beside a published
table's, matched by checkpoint, with the differences (:mod:`uqvision.published`; imported
when the command runs, the table names read from the package's data folder).
"""

from __future__ import annotations

import argparse

from .base import _print


def _args_compare(p: argparse.ArgumentParser) -> None:
    from ..published import names  # the data folder only: no torch, timm or xarray

    p.add_argument("result", metavar="RESULT",
                   help="a score file (.nc) of the table's protocol, whose rows (models) hold "
                        "the published checkpoints, e.g. resnet50.tv_in1k or "
                        "tv/resnet50.IMAGENET1K_V1")
    p.add_argument("--published", required=True, choices=names(), metavar="NAME",
                   help="the published table: %(choices)s (docs/conventions.md, V.pub)")


def _cmd_compare(a: argparse.Namespace) -> int:
    from pathlib import Path

    from uqmetrics import InputError

    from ..published import compare, format_comparison

    if Path(a.result).is_dir():
        raise InputError(f"result {a.result!r} is a folder, not a result file: give a score "
                         "file (.nc) in it")
    _print(format_comparison(compare(a.result, a.published)))
    return 0
