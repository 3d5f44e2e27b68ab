"""TODO module regression."""

__all__: list[str] = []
