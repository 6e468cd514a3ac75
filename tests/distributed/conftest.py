"""The ``dist_pools`` fixture lives in tests/conftest.py, shared with tests/fuzz."""
