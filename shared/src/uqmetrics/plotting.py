"""TODO module plotting."""

__all__: list[str] = []
