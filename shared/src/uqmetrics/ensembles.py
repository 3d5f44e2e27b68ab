"""TODO module ensembles."""

__all__: list[str] = []
