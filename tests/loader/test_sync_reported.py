"""One objective: ``sync`` always has a value (default ``"lockstep"``), and the step time the
wrapper reports is the one its scheduler was asked to minimise."""

from __future__ import annotations

import pytest
from wrapper_data import items

from seqpack.cost import CostModel
from seqpack.loader import PackingConfig, wrap_data_iterator
from seqpack.schedulers import predicted_step_time
from seqpack.schedulers.balanced import BalancedScheduler
from seqpack.topology import Topology

COST = CostModel(1.0, 0.05, 3.0)


class _Recording(BalancedScheduler):
    """``balanced``, remembering the sync each step was planned for."""

    def __init__(self) -> None:
        super().__init__()
        self.planned_for: list[str] = []

    def plan(self, request):  # type: ignore[no-untyped-def]
        self.planned_for.append(request.sync)
        return super().plan(request)


def test_the_default_is_lockstep_and_none_is_refused():
    assert PackingConfig(samples_per_rank=2, max_tokens_per_rank=8).sync == "lockstep"
    with pytest.raises(ValueError, match="sync must be one of"):
        PackingConfig(samples_per_rank=2, max_tokens_per_rank=8, sync=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("sync", [None, "lockstep", "replica"])
def test_what_is_planned_is_what_is_reported(sync):
    scheduler = _Recording()
    options = {} if sync is None else {"sync": sync}
    config = PackingConfig(samples_per_rank=8, max_tokens_per_rank=48, scheduler=scheduler, cost=COST, **options)
    steps = list(wrap_data_iterator(items(3, 0, 24), Topology.single(), config))
    assert len(steps) == 3 and scheduler.planned_for == [sync or "lockstep"] * 3
    for step in steps:
        assert step.num_microbatches > 1  # not vacuous: the two syncs can differ
        reported = step.stats.predicted_step_time
        assert reported == pytest.approx(predicted_step_time(step.schedule, COST, sync=config.sync), rel=1e-12)
