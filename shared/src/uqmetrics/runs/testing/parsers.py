"""A command-line parser as the project's tools build theirs, for tests of
:mod:`uqmetrics.runs.run_config` and :mod:`uqmetrics.runs.config_options` on small tools of their own."""

from __future__ import annotations

import argparse

from ..run_config import finish_parse

__all__ = ["ToolParser"]


class ToolParser(argparse.ArgumentParser):
    """As the tools' parsers: one-line errors (exit code 2), no abbreviated options, and
    :func:`~uqmetrics.runs.run_config.finish_parse` at the end of every parse (``--config``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        ns, extras = super().parse_known_args(args, namespace)
        return finish_parse(self, ns, args), extras

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")
