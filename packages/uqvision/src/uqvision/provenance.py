"""Versions of the libraries that shape a result (recorded in checkpoints and caches)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["versions"]

_PACKAGES = ("uqvision", "uqmetrics", "torch", "torchvision", "timm", "numpy")


def versions() -> dict[str, str]:
    """``{package: version}`` for uqvision, uqmetrics, torch, torchvision, timm, numpy."""
    out = {}
    for p in _PACKAGES:
        try:
            out[p] = version(p)
        except PackageNotFoundError:  # pragma: no cover - source checkout
            out[p] = "unknown"
    return out
