import numpy as np
import pytest

from seqpack.cli.memory import PeakMemory, available_bytes, step_bytes_estimate


def test_peak_memory_sees_a_temporary_allocation():
    with PeakMemory() as peak:
        block = np.ones(40 << 20, dtype=np.uint8)  # 40 MiB, touched
        del block
    if peak.bytes is None:
        pytest.skip("no /proc/self/status on this OS")
    assert peak.bytes >= 30 << 20 and peak.seconds > 0


def test_step_estimate_grows_with_sequences_and_cells():
    base = step_bytes_estimate(64, 8, 1)
    assert step_bytes_estimate(6400, 8, 1) > base and step_bytes_estimate(64, 800, 1) > base
    assert step_bytes_estimate(64, 8, 4) > base
    have = available_bytes()
    assert have is None or have > 0
