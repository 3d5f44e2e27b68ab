"""TODO module classification."""

__all__: list[str] = []
