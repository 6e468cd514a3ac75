"""Mini-batch planning beyond tests/schedulers/test_groups.py: equal counts per replica in
every mini-batch, and each mini-batch's loss tokens against a slow sum."""

from __future__ import annotations

import numpy as np

from seqpack.schedulers import get_scheduler
from seqpack.schedulers.request import Request


def test_minibatches_with_equal_counts_give_every_replica_as_many_in_each():
    from seqpack.schedulers.minibatches import minibatch_loss_tokens, schedule_minibatches

    rng = np.random.default_rng(3)
    lengths = rng.integers(5, 400, size=48)
    origin = np.repeat(np.arange(4), 12)
    plan, starts = schedule_minibatches(
        get_scheduler("balanced"),
        Request.of(lengths, dp_size=4, max_tokens_per_rank=1024, origin=origin),
        minibatches=2,
        equal_counts=True,
    )
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        per_replica = [sum(int(row[r].size) for row in plan.assignment[a:b]) for r in range(4)]
        assert per_replica == [6] * 4  # 24 sequences per mini-batch over 4 replicas
    # Each mini-batch's loss tokens: the slow sum over its ids.
    counts = rng.integers(0, 50, size=48)
    got = minibatch_loss_tokens(plan, starts, counts)
    for j, (a, b) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        ids = [int(i) for row in plan.assignment[a:b] for cell in row for i in cell]
        assert got[j] == sum(int(counts[i]) for i in ids)
    assert sum(got) == int(counts.sum())
