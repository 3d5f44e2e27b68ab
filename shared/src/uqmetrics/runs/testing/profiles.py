"""Hypothesis profiles: ``ci`` (no deadline, blob printed, derandomised) and ``dev``."""

import os


def register_profiles() -> None:
    """Register the ``ci`` and ``dev`` profiles and load ``$HYPOTHESIS_PROFILE`` (default dev)."""
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "ci",
        deadline=None,
        print_blob=True,
        derandomize=True,
        max_examples=60,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile("dev", deadline=None, max_examples=30)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
