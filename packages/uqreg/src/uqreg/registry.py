"""uqreg's registries use the project's one :class:`uqmetrics.registry.Registry`."""

from uqmetrics.registry import Registry

__all__ = ["Registry"]
