from uqmetrics.runs.testing import register_profiles

register_profiles()
