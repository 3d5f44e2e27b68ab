"""A name → item registry, shared by the tasks and the methods."""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(dict, Generic[T]):
    """A dict of named items (each with a ``name``) that refuses duplicates and answers an
    unknown name with the valid ones.

    Parameters
    ----------
    kind : str
        What the items are, for messages ("task", "method").
    sort : bool
        List names sorted (else in registration order).
    """

    def __init__(self, kind: str, *, sort: bool = False):
        super().__init__()
        self.kind = kind
        self.sort = sort

    def register(self, item: T) -> T:
        """Register ``item`` under ``item.name`` (returns it, so it can be used inline)."""
        if item.name in self:
            raise ValueError(f"{self.kind} {item.name!r} is already registered")
        self[item.name] = item
        return item

    def lookup(self, name: str) -> T:
        try:
            return self[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; valid {self.kind}s: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        return sorted(self) if self.sort else list(self)
