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


# -- Tiers (README "Tests") ---------------------------------------------------------------
# quick: unit tests, no process groups, no subprocesses, not slow (`./dev test -m quick`).
# Everything else still runs in the full suite. A test that starts processes is marked
# `processes` (tests/distributed and users of `dist_pools` are marked here); under
# `-m quick` starting one fails the test, so a missing mark is found, not trusted.
_NOT_QUICK = ("slow", "processes", "gpu")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "dist_pools" in getattr(item, "fixturenames", ()) or "distributed" in item.path.parts:
            item.add_marker(pytest.mark.processes)
        if not any(item.get_closest_marker(name) for name in _NOT_QUICK):
            item.add_marker(pytest.mark.quick)


def _refuse(what):
    def start(*args, **kwargs):
        raise AssertionError(f"a quick-tier test started {what}: mark it @pytest.mark.processes")

    return start


@pytest.fixture(autouse=True)
def _quick_tier_starts_no_process(request, monkeypatch):
    if request.config.getoption("markexpr") == "quick":
        import multiprocessing.process
        import platform
        import subprocess

        import torch.distributed

        # The standard library's platform.platform() runs `uname -p` once and caches it: run
        # it here, so a test asking for it is not taken for one that starts processes.
        platform.platform()

        monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("a subprocess"))
        monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse("a process"))
        monkeypatch.setattr(torch.distributed, "init_process_group", _refuse("a process group"))
    yield
