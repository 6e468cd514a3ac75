import pytest

from harness import PoolRegistry


@pytest.fixture(scope="session")
def dist_pools():
    """``dist_pools.get(world_size).run(fn, *args)`` runs ``fn`` on every rank of a gloo group."""
    registry = PoolRegistry()
    yield registry
    registry.close()
