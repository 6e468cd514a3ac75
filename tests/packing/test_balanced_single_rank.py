"""balanced at dp_size=1 plans with the single-rank packer where it reaches the fewest
microbatches any plan can have (Martello-Toth's bound), and keeps its own plan otherwise."""

from __future__ import annotations

import dataclasses

import numpy as np

from seqpack.mock_data import generate_lengths
from seqpack.packing import pack_lengths
from seqpack.schedulers import get_scheduler
from seqpack.schedulers.balanced.exact import bin_lower_bound
from seqpack.schedulers.balanced.stages import DEFAULT

LOGNORMAL = dict(min_seq_len=16, max_seq_len=8192, mean_seq_len=1000, sigma=1.1)


def _packs(schedule):
    return sorted(sorted(mb[0].tolist()) for mb in schedule.assignment)


def test_balanced_at_one_replica_uses_the_packer():
    lengths = generate_lengths("lognormal", 3000, seed=1, **LOGNORMAL)
    schedule = get_scheduler("balanced").schedule(lengths, dp_size=1, max_tokens_per_rank=8192)
    schedule.validate(lengths)
    packing = pack_lengths(lengths, 8192)
    assert packing.num_packs == bin_lower_bound(lengths, 8192)  # the packer reached the bound
    assert _packs(schedule) == sorted(packing.pack(k).tolist() for k in range(packing.num_packs))
    # Another composition (the ablation's) runs the plan: same count, its own packs.
    other = dataclasses.replace(DEFAULT, refine=DEFAULT.refine[1:])
    planned = get_scheduler("balanced", stages=other).schedule(lengths, dp_size=1, max_tokens_per_rank=8192)
    planned.validate(lengths)
    assert planned.num_microbatches == schedule.num_microbatches
    assert _packs(planned) != _packs(schedule)
    # Heaviest round first, as the plan orders them.
    model = get_scheduler("balanced").resolve_cost(None)
    costs = [float(model.cost(lengths[mb[0]]).sum()) for mb in schedule.assignment]
    assert costs == sorted(costs, reverse=True)


def test_the_plan_runs_where_the_packer_misses_the_bound_or_the_options_bind():
    # verl-like tight batches: 6 microbatches hold them; min_microbatches=4 is met.
    rng = np.random.RandomState(1841)
    lengths = [int(rng.randint(50, 91)) for _ in range(25) if rng.randint(0, 11) >= 0]
    schedule = get_scheduler("balanced", min_microbatches=4).schedule(lengths, dp_size=1, max_tokens_per_rank=300)
    schedule.validate(lengths)
    assert schedule.num_microbatches == 6
    # More microbatches than the packer's: the plan spreads the sequences.
    short = generate_lengths("lognormal", 200, seed=2, **LOGNORMAL)
    fewest = pack_lengths(short, 8192).num_packs
    spread = get_scheduler("balanced", min_microbatches=fewest + 3).schedule(short, dp_size=1, max_tokens_per_rank=8192)
    spread.validate(short)
    assert spread.num_microbatches == fewest + 3
    multiple = get_scheduler("balanced", microbatch_multiple=4).schedule(short, dp_size=1, max_tokens_per_rank=8192)
    assert multiple.num_microbatches % 4 == 0
