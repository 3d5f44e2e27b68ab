"""Testing helpers: Hypothesis strategies and profiles shared by every package's tests."""

from .attrs import steady_attrs
from .profiles import register_profiles

__all__ = ["register_profiles", "steady_attrs"]
