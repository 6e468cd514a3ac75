"""Step.to_origin and Step.origin_ids on one rank: one value per sequence read, in read order,
an empty one for a zero-length sample (static and dynamic CP, per token and per sequence,
with samples held back a step), and refusals naming the value. The multi-rank behaviour is in
tests/distributed/test_origin_dist.py and test_dynamic_cp_origin_dist.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from wrapper_data import ScatterScheduler

from seqpack.cost import default_cost_model
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.loader import wrap_data_iterator
from seqpack.topology import Topology

RING = dataclasses.replace(default_cost_model(), ring_step=0.5, ring_token=2e-3, reference_size=1)


def _wrap(data, dynamic: bool, **kwargs):
    options = dict(samples_per_rank=6, max_tokens_per_rank=32, prefetch=0, drop_last=False)
    options.update(kwargs)
    if dynamic:
        options.update(dynamic_cp=True, cost=RING)
    else:
        options.setdefault("scheduler", "empty")
    return wrap_data_iterator(iter(data), Topology.single(), **options)


def _read(n: int, empty: set[int]) -> list[list[int]]:
    return [[] if i in empty else [100 * i + j for j in range(3 + i % 4)] for i in range(n)]


@pytest.mark.parametrize("dynamic", [False, True])
def test_an_empty_sample_gets_an_empty_value_in_its_place(dynamic):
    read = _read(6, {2})
    step = next(_wrap([{"input_ids": ids} for ids in read], dynamic))
    assert step.stats.empty_samples == 1 and step.stats.num_sequences == 5
    assert step.origin_ids.tolist() == [0, 1, -1, 2, 3, 4]
    tokens = [torch.stack([mb.input_ids.double(), -mb.input_ids.double()], 1) for mb in step.microbatches]
    back = step.to_origin(tokens)
    assert len(back) == 6  # one per sample read, the empty one included
    assert [b[:, 0].long().tolist() for b in back] == read
    assert all(b.dtype == torch.float64 and b.shape[1:] == (2,) for b in back)
    rows = step.to_origin([mb.sample_ids.float()[:, None] for mb in step.microbatches], per_sequence=True)
    assert [r.tolist() for r in rows] == [[0.0], [1.0], [], [2.0], [3.0], [4.0]]
    assert rows[2].shape == (0, 1) and rows[2].dtype == torch.float32


@pytest.mark.parametrize("dynamic", [False, True])
def test_empty_samples_at_the_ends_and_in_a_row(dynamic):
    read = _read(12, {0, 4, 5, 11})
    steps = list(_wrap([{"input_ids": ids} for ids in read], dynamic))
    back = [b.tolist() for step in steps for b in step.to_origin([mb.input_ids for mb in step.microbatches])]
    assert back == read
    ids = [step.origin_ids.tolist() for step in steps]
    assert ids == [[-1, 0, 1, 2, -1, -1], [0, 1, 2, 3, 4, -1]]
    assert [s.stats.empty_samples for s in steps] == [3, 1]


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_step_of_empty_samples_only(dynamic):
    steps = list(_wrap([{"input_ids": []}] * 6 + [{"input_ids": [5, 6]}], dynamic))
    assert len(steps) == 2 and steps[0].num_microbatches == 0 and steps[0].stats.empty_samples == 6
    back = steps[0].to_origin([])  # nothing ran: no values, and no dtype to give the empty ones
    assert [(b.tolist(), b.dtype) for b in back] == [([], torch.float32)] * 6
    assert steps[0].origin_ids.tolist() == [-1] * 6
    assert [b.tolist() for b in steps[1].to_origin([mb.input_ids for mb in steps[1].microbatches])] == [[5, 6]]


def test_a_pre_packed_sample_with_an_empty_sequence():
    packed = {"input_ids": [7, 8, 9, 10], "cu_seqlens": torch.tensor([0, 2, 2, 4], dtype=torch.int32)}
    step = next(_wrap([{"input_ids": [1]}, packed, {"input_ids": [2, 3]}], False, samples_per_rank=3))
    back = [b.tolist() for b in step.to_origin([mb.input_ids for mb in step.microbatches])]
    assert back == [[1], [7, 8], [], [9, 10], [2, 3]]  # one value per sequence read
    assert step.origin_ids.tolist() == [0, 1, -1, 2, 3] and step.stats.empty_samples == 1


def test_empty_samples_beside_samples_held_back_a_step():
    read = _read(12, {1, 8})
    steps = list(_wrap([{"input_ids": ids} for ids in read], False, scheduler=ScatterScheduler(defer_longest=True),
                       max_tokens_per_rank=64))  # fmt: skip
    got = [[b.tolist() for b in step.to_origin([mb.input_ids for mb in step.microbatches])] for step in steps]
    # The longest of each step's pool waits for the next step (first in its pool); empty
    # samples stay in the step that read them, where they were read.
    pool, expected = [], []
    for k, step in enumerate(steps):
        pool = pool + read[6 * k : 6 * k + 6]
        kept = [s for s in pool if s]  # global id g is the g-th non-empty sequence of the pool
        later = [kept[g] for g in step.schedule.deferred.tolist()]
        expected.append([s for s in pool if s not in later])
        pool = later
    assert got == expected
    assert any(step.schedule.deferred.size for step in steps)  # not vacuous: something waited
    assert sum(len(g) for g in got) == len(read)


@pytest.mark.parametrize("dynamic", [False, True])
def test_wrong_values_are_refused_by_name(dynamic):
    step = next(_wrap([{"input_ids": ids} for ids in _read(6, {2})], dynamic))
    values = [mb.input_ids for mb in step.microbatches]
    with pytest.raises(ConfigError, match=rf"values holds {len(values) + 1} tensors but this step has {len(values)}"):
        step.to_origin([*values, values[0]])
    with pytest.raises(SeqpackTypeError, match="values must be a list of tensors"):
        step.to_origin([v.tolist() for v in values])
    with pytest.raises(ConfigError, match=r"values\[0\] has shape \(1,\) but microbatch 0 holds"):
        step.to_origin([torch.zeros(1)] + values[1:])


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_step_whose_every_sequence_is_dropped(dynamic):
    data = [{"input_ids": list(range(1, 18))}, {"input_ids": []}]
    step = next(_wrap(data, dynamic, samples_per_rank=2, max_tokens_per_rank=16, on_oversize="drop"))
    assert step.num_microbatches == 0 and step.stats.dropped_sequences == 1 and step.stats.empty_samples == 1
    assert step.origin_ids.tolist() == [0, -1]
    assert [b.tolist() for b in step.to_origin([])] == [[], []]
