"""predicted_step_time with a Schedule whose lengths do not match its assignment (issue 24 item 7)."""

import dataclasses

import numpy as np
import pytest

from seqpack.cost import CostModel
from seqpack.errors import SeqpackError
from seqpack.schedulers import BalancedScheduler, predicted_step_time


def test_schedule_of_other_lengths_is_a_clear_error():
    schedule = BalancedScheduler().schedule(np.array([100, 200, 300, 400]), dp_size=2, max_tokens_per_rank=512)
    other = dataclasses.replace(schedule, lengths=np.array([100, 200]))
    # Today: IndexError "index 2 is out of bounds for axis 0 with size 2" from stats.microbatch_costs.
    with pytest.raises(SeqpackError, match=r"lengths"):
        predicted_step_time(other, CostModel(linear=1.0, quadratic=0.0))
