import os

import pytest
from hypothesis import settings

# CI runs the same examples every time, so that a red build always reproduces; set
# HYPOTHESIS_PROFILE=explore locally to search with fresh random examples.
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)  # CI machines vary in load
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Tests share two cores with each other's actors: one torch thread each keeps them from thrashing.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray cluster for the whole test session (starting one costs seconds)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=True, ignore_reinit_error=True)
    yield ray
    ray.shutdown()
