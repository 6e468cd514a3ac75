"""Fuzz seqpack.interop.torchtitan's dataloader: random lengths, microbatch counts, step sizes and
a save point anywhere (between steps, inside one, before the first, after the last). The
contract: the microbatches handed out before the save plus those of a fresh loader resumed from
it are exactly the uninterrupted run's, each in torchtitan's form with ``positions``
restarting at every sequence; or, when the pinned count does not fit a step, one ConfigError
naming both counts."""

from __future__ import annotations

import collections

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack import wrap_data_iterator
from seqpack.errors import ConfigError, SeqpackError
from seqpack.interop import torchtitan as tt
from seqpack.topology import Topology


def loader(lengths: list[int], per_step: int, samples_per_rank: int, pinned: int) -> tt.SeqpackDataLoader:
    data = [
        {"input_ids": torch.arange(n) + 100 * i, "labels": torch.arange(n) + 100 * i + 1} for i, n in enumerate(lengths)
    ]
    steps = wrap_data_iterator(
        iter(data), Topology.single(), samples_per_rank=samples_per_rank, max_tokens_per_rank=64,
        scheduler_options={"num_microbatches": pinned}, prefetch=0,
    )  # fmt: skip
    return tt.SeqpackDataLoader(steps, per_step)


@pytest.mark.slow
def test_resume_anywhere_gives_the_uninterrupted_run():
    outcomes: collections.Counter[str] = collections.Counter()

    @settings(max_examples=25, deadline=None)
    @given(
        lengths=st.lists(st.integers(1, 60), min_size=4, max_size=24),
        samples_per_rank=st.integers(2, 6),
        per_step=st.integers(1, 4),
        mismatch=st.booleans(),
        save_at=st.integers(0, 40),
    )
    def run(lengths, samples_per_rank, per_step, mismatch, save_at):
        pinned = per_step + 1 if mismatch else per_step
        try:
            whole = list(loader(lengths, per_step, samples_per_rank, pinned))
        except ConfigError as error:
            assert mismatch and f"has {pinned} microbatches but torchtitan's optimizer step takes {per_step}" in str(
                error
            )
            outcomes["refused"] += 1
            return
        except SeqpackError as error:  # StepFailed: the pinned count cannot hold a step, named
            assert f"num_microbatches={pinned} cannot hold" in str(error)
            outcomes["too_few"] += 1
            return
        assert not mismatch or not whole  # a mismatch is refused at the first step
        for inputs, labels in whole:
            positions = inputs["positions"][0]
            assert inputs["input"].shape == labels.shape == (1, positions.shape[0])
            assert int(positions[0]) == 0 and bool(((positions[1:] == 0) | (positions[1:] == positions[:-1] + 1)).all())
        first = loader(lengths, per_step, samples_per_rank, pinned)
        it = iter(first)
        taken = [next(it) for _ in range(save_at % (len(whole) + 1))]
        state = first.state_dict()
        resumed = loader(lengths, per_step, samples_per_rank, pinned)
        resumed.load_state_dict(state)
        got = taken + list(resumed)
        assert len(got) == len(whole)
        for (a_in, a_lab), (b_in, b_lab) in zip(got, whole, strict=True):
            assert torch.equal(a_in["input"], b_in["input"]) and torch.equal(a_lab, b_lab)
        outcomes["inside" if len(taken) % per_step else "between"] += 1

    run()
    assert min(outcomes[k] for k in ("refused", "inside", "between")) > 0, outcomes
