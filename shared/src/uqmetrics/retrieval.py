"""TODO module retrieval."""

__all__: list[str] = []
