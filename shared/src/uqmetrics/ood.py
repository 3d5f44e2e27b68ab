"""TODO module ood."""

__all__: list[str] = []
