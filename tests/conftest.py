import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "distributed"))

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", deadline=None, max_examples=60, derandomize=True)
settings.register_profile("dev", deadline=None, max_examples=60)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def dist_pools():
    """``dist_pools.get(world_size).run(fn, *args)`` runs ``fn`` on every rank of a gloo group.

    One registry for the whole session, so tests/distributed and tests/fuzz share the worker
    pools (starting one costs seconds)."""
    from harness import PoolRegistry

    registry = PoolRegistry()
    yield registry
    registry.close()


def pytest_configure(config):
    import kernel_tier

    kernel_tier.check()
