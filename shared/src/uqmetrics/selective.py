"""TODO module selective."""

__all__: list[str] = []
