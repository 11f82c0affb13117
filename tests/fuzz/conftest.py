"""Fuzzing settings: a few examples in the normal test run, many in the CI fuzz
stage (GDRPY_FUZZ_EXAMPLES=N, see scripts/ci/80-fuzz.sh)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "gdrpy-fuzz",
    max_examples=int(os.environ.get("GDRPY_FUZZ_EXAMPLES", "15")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=os.environ.get("GDRPY_FUZZ_SEED") is None,
)
settings.load_profile("gdrpy-fuzz")
