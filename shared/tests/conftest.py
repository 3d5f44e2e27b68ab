from uqmetrics.testing import register_profiles

register_profiles()
