"""The options of ``uqvision score NAME`` (:func:`add_score_options`): the common ones
(``--caches``, ``--out``, ``--seed``, ...) and the protocol's own, the options of before roles as
hidden aliases and the retired ones refused; what the command line builds its score commands
with, and what ``uqvision evaluate`` checks a protocol's options against.
"""

from __future__ import annotations

import argparse

from uqmetrics.runs.run_config import add_config_option

from .options import SEED
from .protocols import Protocol
from .roles import RETIRED_ROLE_OPTIONS, ROLE_ALIASES

__all__ = ["add_score_options"]


def _retire(p: argparse.ArgumentParser, flag: str, message: str) -> None:
    """Refuse ``flag`` on ``p``'s line, before anything else is parsed, with ``message``
    (``{value}``: the value given to it), e.g. ``uqvision score --protocol X``: on a parser
    that refuses retired options (``p.retired``: :class:`uqvision.cli.base._Parser`); another
    parser has none. The one definition, which the command line imports too."""
    retired = getattr(p, "retired", None)
    if retired is not None:
        retired[flag] = message


def add_score_options(proto: Protocol, p: argparse.ArgumentParser) -> None:
    """The options of ``uqvision score NAME``: the common ones and the protocol's own (a
    protocol that takes its sets by role has ``--test`` etc., and the options they replace as
    hidden aliases; the others ``--dataset``)."""
    p.add_argument("--caches", nargs="+", required=True, help="cache files or directories")
    table = proto.score_table
    p.add_argument("--out", required=True, help="score file (.nc)" + (
        f"; the table beside it: STEM{'/'.join(table.suffixes)}" if table else ""))
    p.add_argument("--seed", type=SEED, default=0)
    if proto.add_options is not None:
        proto.add_options(p)
    options = p._option_string_actions
    if "--test" not in options:
        p.add_argument("--dataset", default=None)
    for old, new in ROLE_ALIASES.items():  # the options of before roles: hidden aliases
        if new in options and old not in options:
            action = options[new]
            p.add_argument(old, dest=action.dest, action=type(action), metavar=action.metavar,
                           default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    for old, (new, message) in RETIRED_ROLE_OPTIONS.items():
        if new in options:
            _retire(p, old, message)
    p.add_argument("--skip-incomplete", action="store_true",
                   help="score the complete caches when some are unreadable or partial (named "
                        "in the summary line); without it they stop the command")
    p.add_argument("--overwrite", action="store_true")
    add_config_option(p)
