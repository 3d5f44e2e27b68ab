"""TODO module confidence."""

__all__: list[str] = []
