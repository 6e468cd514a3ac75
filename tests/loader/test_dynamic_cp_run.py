"""Running a dynamic-CP plan, the pure parts: the pieces and the exchange plan against slow
references, the blocks that get process groups, the stats, ``PackedBatch.cp_group``, and the
compute stages choosing the batch's group (TE's group switching with a stand-in module)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from seqpack.collective.cp_groups import CpGroups, new_cp_groups, plane_blocks
from seqpack.collective.exchange import plan_shard_exchange
from seqpack.cost import CostModel
from seqpack.errors import ConfigError
from seqpack.options import CpLayout
from seqpack.schedulers import Request, Schedule, predicted_step_time
from seqpack.schedulers.dynamic_cp import plan_dynamic_cp
from seqpack.schedulers.dynamic_cp.pieces import plan_pieces, shard_layout
from seqpack.stats import StepStats, moved_tokens
from seqpack.thd import group_pad_multiple, pack_sequences
from seqpack.thd.cp import held_runs, partition_indices, run_indices, shard_for_cp
from seqpack.topology import Topology

COST = CostModel(1.0, 1e-3, 1e-5, ring_step=0.5, ring_token=2e-3, ranks_per_node=4, reference_size=1)


def a_plan(lengths, dp, cp, capacity=64, pad=1, counts=None):
    request = Request.of(lengths, dp_size=dp, cp_size=cp, max_tokens_per_rank=capacity, pad_multiple=pad, cost=COST)
    plan = plan_dynamic_cp(request)
    if counts is not None:
        plan = dataclasses.replace(plan, origin=np.repeat(np.arange(dp), counts))
    return plan


def exchange_reference(plan, cp, rank):
    """Per (src, dst) the ids whose piece for dst src cuts, by looping over every id and rank."""
    start, size, tokens = shard_layout(plan)
    send = {d: [] for d in range(plan.num_ranks)}
    recv = {s: [] for s in range(plan.num_ranks)}
    keep = []
    for gid in range(plan.num_sequences):
        for j in range(max(int(size[gid]), 0)):
            dst = int(start[gid]) + j
            src = int(plan.origin[gid]) * cp + dst % cp
            if src == rank and dst == rank:
                keep.append(gid)
            elif src == rank:
                send[dst].append(gid)
            elif dst == rank:
                recv[src].append(gid)
    return send, recv, keep, tokens


@given(
    st.lists(st.integers(1, 250), min_size=1, max_size=24),
    st.sampled_from([(4, 1), (2, 2), (1, 4), (2, 4), (3, 2)]),
    st.integers(0, 2**31),
)
@pytest.mark.slow
def test_the_exchange_plan_matches_a_slow_reference(lengths, mesh, seed):
    dp, cp = mesh
    counts = np.random.default_rng(seed).multinomial(len(lengths), [1 / dp] * dp)
    plan = a_plan(lengths, dp, cp, counts=counts)
    start, size, tokens = shard_layout(plan)
    moved = 0
    for rank in range(plan.num_ranks):
        got = plan_shard_exchange(start, size, tokens, plan.origin, cp_size=cp, num_ranks=plan.num_ranks, rank=rank)
        send, recv, keep, _ = exchange_reference(plan, cp, rank)
        assert [ids.tolist() for ids in got.send_ids] == [sorted(send[d]) for d in range(plan.num_ranks)]
        assert [ids.tolist() for ids in got.recv_ids] == [sorted(recv[s]) for s in range(plan.num_ranks)]
        assert got.keep_ids.tolist() == sorted(keep)
        assert got.send_tokens.tolist() == [int(tokens[send[d]].sum()) for d in range(plan.num_ranks)]
        assert got.recv_tokens.tolist() == [int(tokens[recv[s]].sum()) for s in range(plan.num_ranks)]
        moved += int(got.send_tokens.sum())
    # every piece once: kept or sent, and what one rank sends another receives
    assert moved == got.moved_tokens == int(moved_tokens(plan)[0].sum())
    pieces = plan_pieces(plan)
    assert pieces.gid.shape[0] == int(size[size > 0].sum())


def test_a_static_shaped_group_moves_nothing():
    # dp=2 x cp=2; every sequence on both CP ranks of the replica that read it: as static CP.
    lengths = np.array([100, 90, 100, 80], dtype=np.int64)
    int64 = lambda values: np.array(values, dtype=np.int64)  # noqa: E731
    plan = Schedule(
        num_microbatches=2, group_round=int64([0, 0, 1, 1]), group_start=int64([0, 2, 0, 2]),
        group_size=int64([2, 2, 2, 2]), group_counts=int64([1, 1, 1, 1]), assigned=int64([0, 2, 1, 3]),
        lengths=lengths, original_lengths=lengths, dp_size=2, cp_size=2, max_tokens_per_rank=60, pad_multiple=1,
    )  # fmt: skip
    plan.validate(lengths)
    assert plan.origin.tolist() == [0, 0, 1, 1]
    per_id, sent, received = moved_tokens(plan)
    assert per_id.sum() == sent.sum() == received.sum() == 0
    moved = dataclasses.replace(plan, origin=int64([1, 0, 1, 0]))  # ids 0 and 3 read by the other replica
    assert moved_tokens(moved)[0].tolist() == [100, 0, 0, 80]  # both shards of each cross the wire


@given(st.lists(st.integers(1, 90), min_size=1, max_size=6), st.sampled_from([1, 2, 3, 4]), st.integers(1, 3))
@pytest.mark.slow
def test_dualchunk_runs_are_the_partition_of_each_sequence(lengths, size, pad):
    multiple = group_pad_multiple(size, pad)
    samples = [{"input_ids": torch.arange(n) + 1000 * i} for i, n in enumerate(lengths)]
    whole = pack_sequences(samples, pad_multiple=multiple)
    cu = whole.cu_seqlens_padded.to(torch.int64).numpy()
    for j in range(size):
        base, length = cu[:-1], cu[1:] - cu[:-1]
        index = run_indices(*held_runs(base, length, size, j, CpLayout.DUALCHUNK)).numpy()
        expected = partition_indices(whole.cu_seqlens_padded, int(cu[-1]), size, j)
        assert index.tolist() == expected.tolist()
        assert torch.equal(whole.input_ids[torch.from_numpy(index)], shard_for_cp(whole, size, j).input_ids)


def test_plane_blocks():
    assert plane_blocks(4, "pow2") == [(0, 2), (2, 2), (0, 4)]
    assert plane_blocks(6, "pow2") == [(0, 2), (2, 2), (4, 2), (0, 4), (0, 6)]
    assert plane_blocks(1, "pow2") == []
    assert plane_blocks(3, "any") == [(0, 2), (1, 2), (0, 3)]
    # every group of a plan is a block with a process group (or one rank)
    plan = a_plan([380, 30, 20, 10, 250, 90, 60, 130], 3, 2, capacity=64)
    assert plan.group_size.max() == 6  # 380 tokens need all 6 ranks
    blocks = set(plane_blocks(6, "pow2"))
    for g in range(plan.num_groups):
        start, size = int(plan.group_start[g]), int(plan.group_size[g])
        assert size == 1 or (start, size) in blocks


def test_cp_groups_lookup_and_single_rank():
    groups = new_cp_groups(Topology.single())
    assert groups.plane is None and groups.blocks == {} and groups.group(0, 1) is None
    marker = object()
    groups = CpGroups(plane_rank=2, num_ranks=4, blocks={(2, 2): marker})
    assert groups.group(2, 2) is marker and groups.group(2, 1) is None and groups.owned() == [marker]
    with pytest.raises(ConfigError, match="no CP group for block start=0 size=4 on plane rank 2"):
        groups.group(0, 4)


def test_stats_of_a_dynamic_plan():
    """StepStats.from_schedule accounts a dynamic plan per plane rank, in the group cost."""
    lengths = np.array([300, 40, 30, 20, 20, 10, 5, 5])
    plan = a_plan(lengths, 2, 2, capacity=100, counts=[4, 4])
    stats = StepStats.from_schedule(plan, COST, sync="lockstep", empty_samples=2)
    assert stats.num_sequences == 8 and stats.real_tokens == int(lengths.sum()) == stats.seqlen_sum
    assert stats.seqlen_sq_sum == int((lengths**2).sum()) and stats.empty_samples == 2
    assert stats.padded_tokens >= int(plan.group_tokens().sum()) and len(stats.replica_cost) == 4
    assert stats.num_microbatches == plan.num_microbatches
    assert stats.predicted_step_time == predicted_step_time(plan, COST)
    assert stats.imbalance >= 1.0 and stats.cost_model == COST
    assert stats.moved_tokens == int(moved_tokens(plan)[0].sum())


def test_packed_batch_cp_group():
    batch = shard_for_cp(pack_sequences([{"input_ids": torch.arange(8)}], pad_multiple=4), 2, 1)
    marker = object()
    grouped = dataclasses.replace(batch, cp_group=marker)
    assert grouped.to("cpu").cp_group is marker and grouped == batch  # not compared, kept by .to()
    assert "cp_group" not in repr(grouped)
    with pytest.raises(ConfigError, match="cp_group is set on a batch with cp_size=1"):
        dataclasses.replace(pack_sequences([{"input_ids": torch.arange(8)}]), cp_group=marker)


def test_one_rank_runs_every_sequence_alone_through_the_wrapper():
    from seqpack.loader import wrap_data_iterator

    rng = np.random.default_rng(0)
    data = [{"input_ids": torch.from_numpy(rng.integers(0, 50, int(n)))} for n in rng.integers(1, 60, 12)]
    options = {"samples_per_rank": 6, "max_tokens_per_rank": 64, "cost": COST, "prefetch": 0}
    steps = list(wrap_data_iterator(iter(data), Topology.single(), dynamic_cp=True, **options))
    assert len(steps) == 2
    for k, step in enumerate(steps):
        assert isinstance(step.schedule, Schedule) and step.num_microbatches == step.schedule.num_microbatches
        assert step.origin_ids.tolist() == list(range(6))
        for batch in step.microbatches:
            ids = batch.sample_ids.tolist()
            whole = pack_sequences([data[6 * k + i] for i in ids], sample_ids=ids)
            assert torch.equal(batch.input_ids, whole.input_ids) and batch.cp_group is None
        assert step.num_loss_tokens == sum(int(s["input_ids"].shape[0]) - 1 for s in data[6 * k : 6 * k + 6])
        assert step.stats.predicted_step_time == predicted_step_time(step.schedule, COST)
        back = step.to_origin([b.input_ids * 3 for b in step.microbatches])  # one rank: every value stays here
        assert [t.tolist() for t in back] == [(data[6 * k + i]["input_ids"] * 3).tolist() for i in range(6)]
        with pytest.raises(ConfigError, match="values holds 0 tensors"):
            step.to_origin([])


@pytest.mark.parametrize("kind", ["batch", "layout"])
def test_a_dynamic_step_round_trips_through_the_wire(kind):
    from seqpack.collective.wire import STEP_FIELDS, Kind, StepOk, decode_step, encode_step
    from seqpack.errors import WireError

    rng = np.random.default_rng(1)
    lengths = np.array([230, *rng.integers(3, 40, 9)])
    samples = [{"input_ids": torch.from_numpy(rng.integers(0, 50, int(n)))} for n in lengths]
    plan = a_plan(lengths, 2, 2, capacity=64, counts=[5, 5])
    me = 1  # plane rank 1: a shard of the long sequence's group, then its own microbatches
    batches, starts = [], []
    for g in plan.rank_group()[:, me].tolist():
        ids, start, size = plan.group_ids(g), int(plan.group_start[g]), int(plan.group_size[g])
        whole = pack_sequences([samples[i] for i in ids], pad_multiple=group_pad_multiple(size, 1), sample_ids=ids)
        batches.append(shard_for_cp(whole, size, me - start) if size > 1 else whole)
        starts.append(start)
    assert len({b.cp_size for b in batches}) > 1  # microbatches of different CP sizes in one message
    msg = StepOk(step=3, schedule=plan, microbatches=batches, group_starts=tuple(starts))
    got = decode_step(encode_step(msg, kind=Kind.BATCH if kind == "batch" else Kind.LAYOUT))
    assert isinstance(got.schedule, Schedule) and got.schedule.fingerprint() == plan.fingerprint()
    assert np.array_equal(got.schedule.origin, plan.origin) and got.group_starts == tuple(starts)
    for a, b in zip(batches, got.microbatches, strict=True):
        assert (a.cp_size, a.cp_rank, a.max_seqlen) == (b.cp_size, b.cp_rank, b.max_seqlen)
        assert torch.equal(a.cu_seqlens_padded, b.cu_seqlens_padded) and torch.equal(a.seq_idx, b.seq_idx)
        assert torch.equal(a.position_ids, b.position_ids)
        assert (b.input_ids is None) == (kind == "layout")
        if kind == "batch":
            assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
    # Shards of different CP sizes travel only with their groups' starts (flag 8).
    with pytest.raises(WireError, match=r"microbatch \d+ is shard \d+/\d+ .*, microbatch 0 is"):
        encode_step(dataclasses.replace(msg, group_starts=None))
    with pytest.raises(WireError, match="group starts .* for .* microbatches"):
        encode_step(dataclasses.replace(msg, group_starts=tuple(starts[:-1])))
    wire = encode_step(msg)
    wire.ints[[name for name, _ in STEP_FIELDS].index("group_sizes")] = 7
    with pytest.raises(WireError, match="group_sizes code 7 is not one of 0..2"):
        decode_step(wire)


@pytest.mark.parametrize("policy", ["truncate", "drop"])
def test_oversize_sequences_are_cut_or_dropped_and_counted(policy):
    from seqpack.loader import wrap_data_iterator

    lengths = [10, 100, 30, 7]  # 100 > one rank's 64 tokens, and one rank is all there is
    data = [{"input_ids": torch.arange(n) % 50} for n in lengths]
    options = {"samples_per_rank": 4, "max_tokens_per_rank": 64, "cost": COST, "on_oversize": policy}
    (step,) = list(wrap_data_iterator(iter(data), Topology.single(), dynamic_cp=True, **options))
    packed = {}
    for b in step.microbatches:
        packed.update(zip(b.sample_ids.tolist(), b.seq_lens().tolist(), strict=True))
    if policy == "truncate":
        assert packed[1] == 64 and step.stats.truncated_tokens == 36 and step.num_loss_tokens == 9 + 63 + 29 + 6
    else:
        assert 1 not in packed and step.stats.dropped_tokens == 100 and step.num_loss_tokens == 9 + 29 + 6
