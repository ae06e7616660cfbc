"""Shared pytest configuration: Hypothesis profiles.

``ci`` (the default): no deadline (CI machines are slow and shared), derandomized so a
run is reproducible, a moderate number of examples. ``dev``: more examples, random.
Select with ``HYPOTHESIS_PROFILE=dev``.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=25,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=200)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
