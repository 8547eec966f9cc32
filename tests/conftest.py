import os

import pytest

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
