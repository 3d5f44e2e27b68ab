"""TODO module calibration."""

__all__: list[str] = []
