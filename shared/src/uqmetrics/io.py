"""TODO module io."""

__all__: list[str] = []
