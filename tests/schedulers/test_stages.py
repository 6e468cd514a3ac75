"""The balanced planner as a composition of stages (seqpack/schedulers/balanced/stages.py):
the scheduler runs the default composition, and each composition benchmarks/ablation.py
builds without one stage plans differently on a workload where that stage acts."""

import numpy as np
import pytest
from benchmark_module import benchmark_module

from seqpack.cost import CostModel
from seqpack.errors import SeqpackTypeError
from seqpack.mock_data import lognormal_lengths
from seqpack.schedulers import get_scheduler
from seqpack.schedulers.balanced.stages import DEFAULT

COST = CostModel(24576.0, 1.0)


def _tight(seed):
    """A few sequences of 100-900 tokens into 2-4 replicas of 1,000 tokens: the bins are
    tight enough that the bin rules and the microbatch count matter."""
    rng = np.random.default_rng(seed)
    n, dp = int(rng.integers(8, 40)), int(rng.integers(2, 5))
    return rng.integers(100, 900, n), {"dp_size": dp, "max_tokens_per_rank": 1000, "cost": COST}


def _sft(n=1024, dp=16):
    lengths = lognormal_lengths(n, min_seq_len=1024, max_seq_len=8192, mean_seq_len=4096, seed=0)
    return lengths, {"dp_size": dp, "max_tokens_per_rank": 16384, "cost": COST}


def _heavy_tail():
    """benchmarks/heavy_tail.py's lengths (seed 0) at 3 microbatches, sync='replica'."""
    rng = np.random.default_rng(0)
    lengths = np.clip((128 * (1 + rng.pareto(1.3, 4096))).astype(np.int64), 16, 32768)
    return lengths, {"dp_size": 32, "max_tokens_per_rank": 32768, "cost": COST, "sync": "replica"}


def _verl(seed):
    """benchmarks/heavy_tail.py's verl-like batch: 25 sequences of 50-90 tokens in bins of 300."""
    rs = np.random.RandomState(seed)
    lengths = []
    for _ in range(25):
        rs.randint(0, 11)
        lengths.append(int(rs.randint(50, 91)))
    return np.array(lengths), {"dp_size": 1, "max_tokens_per_rank": 300}


# stage -> (lengths, schedule() arguments, BalancedScheduler options): a step where it acts.
CASES = {
    "round_targets": (*_tight(0), {"locality": False}),
    "token_rules": (*_tight(91), {"locality": False}),
    "exact_search": (*_tight(70), {"locality": False}),
    "bin_completion": (*_verl(349), {"min_microbatches": 4}),  # 6 microbatches, 7 without
    "replica_first": (*_heavy_tail(), {"locality": False, "num_microbatches": 3}),
    "more_rounds": (*_tight(12), {"locality": False}),
    "origin_order": (np.full(512, 4096), _sft()[1], {"locality": False}),
    "relabel": (*_sft(), {"locality": False}),
    "per_replica": (_sft()[0], {**_sft()[1], "sync": "replica"}, {"locality": True}),
    "home_swaps": (*_sft(), {"locality": True}),
    "pair_swaps": (*_sft(512, 8), {"locality": True}),
}


@pytest.fixture(scope="module")
def ablation():
    with benchmark_module("ablation") as module:
        yield module


def test_every_stage_has_a_step_where_it_acts(ablation):
    assert set(CASES) == set(ablation.ABLATIONS)
    assert get_scheduler("balanced").stages is DEFAULT


@pytest.mark.parametrize("stage", sorted(CASES))
@pytest.mark.slow
def test_the_composition_without_a_stage_plans_without_it(ablation, stage):
    lengths, kwargs, options = CASES[stage]
    full = get_scheduler("balanced", **options).schedule(lengths, **kwargs)
    without = ablation.composition([stage])
    assert without != DEFAULT and ablation.composition([]) is DEFAULT
    off = get_scheduler("balanced", **options, stages=without).schedule(lengths, **kwargs)
    off.validate(lengths)
    assert (off.fingerprint(), off.num_microbatches) != (full.fingerprint(), full.num_microbatches)


def test_compositions_stack_and_stages_are_checked(ablation):
    both = ablation.composition(["replica_first", "relabel"])
    assert both.refine == ablation.composition(["replica_first"]).refine and both.relabel is not DEFAULT.relabel
    with pytest.raises(SeqpackTypeError, match="stages must be a seqpack.schedulers.balanced.stages.Stages"):
        get_scheduler("balanced", stages=("repair",))
