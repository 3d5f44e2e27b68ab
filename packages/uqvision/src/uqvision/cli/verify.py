"""``uqvision verify TARGET``: recompute a score file's entries from the caches it names, with
each protocol's own scorer (:attr:`uqvision.protocols.Protocol.rescore`), check every cache's
hashes and identity, and print agree/disagree per metric with the tolerance used
(:mod:`uqmetrics.report.verify`). Exit status 0 when everything agrees, 1 otherwise, 2 for bad input
(a target that is not a result file or a site, a result of ``uqreg``: ``uqreg verify`` verifies
it).
"""

from __future__ import annotations

import argparse

from ..protocols import VISION_PROTOCOLS
from .base import _print


def _rescorer(protocol: str):
    """The rescoring of a registered protocol (None: unknown, or none recorded)."""
    if protocol not in VISION_PROTOCOLS.names():
        return None
    return VISION_PROTOCOLS.lookup(protocol).rescore


def add_tolerance_options(p: argparse.ArgumentParser) -> None:
    """``--rtol`` and ``--atol`` (shared with ``uqreg verify``)."""
    from uqmetrics.report.verify import DEFAULT_ATOL, DEFAULT_RTOL, tolerance

    p.add_argument("--rtol", type=tolerance, default=DEFAULT_RTOL,
                   help="relative tolerance (default %(default)g: recomputation is the same "
                        "code on the same caches, so only float rounding may differ)")
    p.add_argument("--atol", type=tolerance, default=DEFAULT_ATOL,
                   help="absolute tolerance, for values near 0 (default %(default)g)")


def _args_verify(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="RESULT_OR_SITE_ENTRY",
                   help="a score file (.nc: every entry), a report site folder (every entry) "
                        "or SITE#ENTRY_ID (one entry: SITE#PROTOCOL:ROW)")
    add_tolerance_options(p)


def _cmd_verify(a: argparse.Namespace) -> int:
    from uqmetrics.report.verify import verify  # imported on use

    return verify(a.target, _rescorer, rtol=a.rtol, atol=a.atol, out=_print, tool="uqvision")
