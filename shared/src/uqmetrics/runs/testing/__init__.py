"""Testing helpers: Hypothesis strategies and profiles shared by every package's tests.

It lives inside :mod:`uqmetrics.runs`, the layer it depends on: its parsers finish a parse as the
command-line tools do (:func:`uqmetrics.runs.run_config.finish_parse`) and its attrs helpers
are about result files, so it may import :mod:`uqmetrics.runs` and :mod:`uqmetrics.metrics`
below it and nothing above; a fourth top-level folder would sit outside the three layers.
"""

from .attrs import steady_attrs
from .profiles import register_profiles

__all__ = ["register_profiles", "steady_attrs"]
