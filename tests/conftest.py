"""Shared test configuration.

Hypothesis runs derandomized in CI (and whenever HYPOTHESIS_PROFILE=ci), so a CI run is
reproducible; locally the default profile explores new examples each run.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
)
