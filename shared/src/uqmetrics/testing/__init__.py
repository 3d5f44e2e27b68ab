"""Testing helpers: Hypothesis strategies and profiles shared by every package's tests."""

from .profiles import register_profiles

__all__ = ["register_profiles"]
