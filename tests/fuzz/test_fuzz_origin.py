"""Fuzz ``Step.to_origin`` (issue 29): random sample counts with zero-length samples (plain and
inside pre-packed samples), random lengths, oversize policies, samples held back a step,
static and dynamic CP, random per-microbatch values of random dtype and trailing shape, per
token and per sequence. Whatever happens, every step returns exactly one value per sequence
its DP rank read, in read order (those held back from the last step first, those held back for
the next left out), equal to a slow reference that maps every microbatch row back by its
sample id: a zero-length sample and a dropped sequence get an empty value, a truncated one
its trained tokens. The zero-length ones are what ``stats.empty_samples`` counts. Wrong values
raise a SeqpackError naming ``values``.

One process (hypothesis), and on gloo dp=2 and dp=2 x cp=2, where every value encodes its
sample id and position so that each rank can check what it gets back without the others'
microbatches."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from wrapper_data import ScatterScheduler, mesh_topology

from seqpack.cost import default_cost_model
from seqpack.errors import SeqpackError
from seqpack.loader import wrap_data_iterator
from seqpack.topology import Topology

EXAMPLES = int(os.environ.get("SEQPACK_FUZZ_EXAMPLES", "40"))
RING = dataclasses.replace(default_cost_model(), ring_step=0.5, ring_token=2e-3, reference_size=1)
DTYPES = (torch.float64, torch.float32, torch.int64)

# A sequence of the data: (item, sub) and its length; token j of it is item*1000 + sub*100 + j + 1.
Read = tuple[tuple[int, int], int]


@st.composite
def datasets(draw) -> list[list[int]]:
    """Per item, the lengths of its sequences (one: a plain sample; 2-3: pre-packed); zeros
    are zero-length samples or sequences."""
    out = []
    for _ in range(draw(st.integers(0, 16))):
        if draw(st.integers(0, 4)) == 0:
            out.append(draw(st.lists(st.integers(0, 15), min_size=2, max_size=3)))
        else:
            out.append([0 if draw(st.integers(0, 4)) == 0 else draw(st.integers(1, 40))])
    return out


def items_of(lengths: list[list[int]], rank: int = 0) -> list[dict]:
    """The samples of ``lengths`` (rank ``rank``'s tokens offset by ``rank * 10**6``)."""
    out = []
    for i, subs in enumerate(lengths):
        seqs = [torch.arange(n, dtype=torch.int64) + rank * 10**6 + i * 1000 + s * 100 + 1 for s, n in enumerate(subs)]
        if len(subs) == 1:
            out.append({"input_ids": seqs[0]})
        else:
            cu = np.r_[0, np.cumsum(subs)].astype(np.int32)
            out.append({"input_ids": torch.cat(seqs), "cu_seqlens": torch.from_numpy(cu)})
    return out


def reads_of(lengths: list[list[int]], spr: int) -> list[list[Read]]:
    """What the wrapper reads in each step: the sequences of ``spr`` items, in order."""
    steps = [lengths[k : k + spr] for k in range(0, len(lengths), spr)]
    return [[((k * spr + i, s), n) for i, subs in enumerate(step) for s, n in enumerate(subs)] for k, step in
            enumerate(steps)]  # fmt: skip


def reference(step, values: list[torch.Tensor], per_sequence: bool) -> dict[int, torch.Tensor]:
    """Slow reference (one process, no CP): every row of every microbatch back to its global
    id by ``sample_ids`` and ``cu_seqlens`` (real tokens only, padding left out)."""
    out: dict[int, list[torch.Tensor]] = {}
    for batch, value in zip(step.microbatches, values, strict=True):
        cu, cu_padded = batch.cu_seqlens.tolist(), batch.cu_seqlens_padded.tolist()
        for i, gid in enumerate(batch.sample_ids.tolist()):
            if gid < 0:
                continue
            if per_sequence:
                out.setdefault(gid, []).append(value[i])
            else:
                start = cu_padded[i]
                for row in range(start, start + cu[i + 1] - cu[i]):
                    out.setdefault(gid, []).append(value[row])
    return {gid: rows[0] if per_sequence else torch.stack(rows) for gid, rows in out.items()}


def expected_step(step, pool: list[Read], offset: int) -> tuple[list[Read | None], list[Read]]:
    """What a step must return, in order, on the rank whose pool (sequences held back from the
    last step, then those read) is ``pool``: ``None`` for a zero-length one; its global ids
    are ``offset`` + its index among the pool's non-empty sequences. Also what it holds back."""
    sched = step.schedule
    kept = [seq for seq in pool if seq[1] > 0]
    ids = {seq: offset + g for g, seq in enumerate(kept)}
    assert [int(sched.original_lengths[ids[seq]]) for seq in kept] == [n for _, n in kept]
    held = {int(g) for g in sched.deferred.tolist()}
    order = [None if n == 0 else (who, n) for who, n in pool if n == 0 or ids[(who, n)] not in held]
    return order, [seq for seq in kept if ids[seq] in held]


def _values(step, dtype: torch.dtype, trailing: tuple[int, ...], per_sequence: bool, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for batch in step.microbatches:
        rows = batch.num_sequences if per_sequence else batch.num_tokens
        x = torch.randn((rows, *trailing), generator=gen, dtype=torch.float64) * 1000
        out.append(x.to(dtype))
    return out


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    lengths=datasets(),
    spr=st.integers(1, 7),
    plan=st.sampled_from(["empty", "test_defer", "dynamic"]),
    on_oversize=st.sampled_from(["error", "drop", "truncate"]),
    capacity=st.sampled_from([16, 24, 48]),
    dtype=st.sampled_from(DTYPES),
    trailing=st.sampled_from([(), (1,), (3,), (2, 2)]),
    seed=st.integers(0, 2**31),
)
@pytest.mark.slow
def test_one_value_per_sequence_read_in_read_order(lengths, spr, plan, on_oversize, capacity, dtype, trailing, seed):
    capacity = 48 if on_oversize == "error" else capacity  # 40 tokens (44 padded) fit
    options: dict = dict(samples_per_rank=spr, max_tokens_per_rank=capacity, on_oversize=on_oversize, prefetch=0,
                         drop_last=False)  # fmt: skip
    if plan == "dynamic":
        options.update(dynamic_cp=True, cost=RING)
    else:
        options.update(scheduler=ScatterScheduler(defer_longest=True) if plan == "test_defer" else "empty",
                       pad_multiple=4)  # fmt: skip
    it = wrap_data_iterator(iter(items_of(lengths)), Topology.single(), **options)
    reads = reads_of(lengths, spr)
    carried: list[Read] = []
    returned = 0
    for k, step in enumerate(it):
        pool = carried + (reads[k] if k < len(reads) else [])
        order, carried = expected_step(step, pool, 0)
        ids = step.origin_ids.tolist()
        assert [g < 0 for g in ids] == [seq is None for seq in order]  # -1 exactly where a zero-length one was read
        assert step.stats.empty_samples == ids.count(-1)  # what stats count is what comes back empty
        for per_sequence in (False, True):
            values = _values(step, dtype, trailing, per_sequence, seed + k)
            back = step.to_origin(values, per_sequence=per_sequence)
            ref = reference(step, values, per_sequence)
            assert len(back) == len(order)  # one value per sequence read, exactly
            for gid, seq, got in zip(ids, order, back, strict=True):
                assert got.dtype == (dtype if values else torch.float32)
                if gid < 0 or gid not in ref:  # zero-length, or dropped for its length: empty
                    assert got.shape[0] == 0 and (not values or got.shape[1:] == trailing)
                    assert gid < 0 or gid in step.schedule.dropped.tolist()
                    continue
                assert torch.equal(got, ref[gid])
                if not per_sequence:  # and these are the tokens read there, in order
                    assert seq is not None and got.shape[0] == int(step.schedule.lengths[gid]) <= seq[1]
        tokens = step.to_origin([mb.input_ids for mb in step.microbatches])
        for seq, got in zip(order, tokens, strict=True):
            if seq is not None and got.numel():
                (item, sub), _ = seq
                first = item * 1000 + sub * 100 + 1
                assert got.tolist() == list(range(first, first + got.shape[0]))
        returned += len(order)
        sched = step.schedule
        for what, seen in (
            ("zero-length", -1 in ids),
            ("held back", sched.deferred.size),
            ("dropped", sched.dropped.size),
            ("truncated", sched.truncated.size),
            ("no microbatch", not values),
        ):
            if seen:
                event(what)  # --hypothesis-show-statistics: what the examples reached
    # Every sequence read came back once, but those of the end: a step that only finds the end
    # of data returns nothing (counted in dropped_at_end and empty_at_end).
    assert returned + it.dropped_at_end + it.empty_at_end == sum(len(subs) for subs in lengths)


WRONG = {
    "missing": lambda v, b: v[:-1],
    "extra": lambda v, b: [*v, v[0]],
    "rows": lambda v, b: [torch.cat([v[0], v[0][:1]]), *v[1:]],
    "scalar": lambda v, b: [torch.tensor(1.0), *v[1:]],
    "dtype": lambda v, b: v[:-1] + [v[-1].to(torch.float16)] if len(v) > 1 else [v[0].to(torch.float16), v[0]],
    "trailing": lambda v, b: v[:-1] + [v[-1][:, None]] if len(v) > 1 else [v[0], v[0]],
    "not tensors": lambda v, b: [x.tolist() for x in v],
    "a tensor": lambda v, b: torch.cat(v),
    "a dict": lambda v, b: dict(enumerate(v)),
    "None": lambda v, b: None,
    "per sequence rows": lambda v, b: [torch.zeros(x.num_sequences + 1) for x in b],
}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=12),
    wrong=st.sampled_from(sorted(WRONG)),
    dynamic=st.booleans(),
)
@pytest.mark.slow
def test_wrong_values_are_a_seqpack_error_naming_values(lengths, wrong, dynamic):
    options: dict = dict(samples_per_rank=len(lengths), max_tokens_per_rank=48, prefetch=0, drop_last=False)
    options.update(dict(dynamic_cp=True, cost=RING) if dynamic else dict(scheduler="empty", pad_multiple=4))
    step = next(wrap_data_iterator(iter(items_of([[n] for n in lengths])), Topology.single(), **options), None)
    if step is None or not step.microbatches:
        return  # nothing ran: no values to get wrong
    values = [torch.randn(mb.num_tokens, dtype=torch.float64) for mb in step.microbatches]
    bad = WRONG[wrong](values, step.microbatches)
    with pytest.raises(SeqpackError, match=r"values"):
        step.to_origin(bad, per_sequence=wrong == "per sequence rows")
    assert len(step.to_origin(values)) == len(lengths)  # the step still works


# --- gloo ----------------------------------------------------------------------------------

LAYOUTS = {"dp2": (("dp", 2),), "dp2cp2": (("dp", 2), ("cp", 2))}


def _encoded(batch, trailing: int) -> torch.Tensor:
    """Every real token's value says whose it is: ``gid * 1000 + position`` (then ``-j`` in
    the other columns); pads get -7, which must never come back."""
    gid = batch.sample_ids.to(torch.float64)[batch.seq_idx.to(torch.int64)]
    col = torch.where(batch.padding_mask, -7.0, gid * 1000 + batch.position_ids.to(torch.float64))
    return torch.stack([col] + [col * 0 - j for j in range(1, trailing)], 1) if trailing else col


def run_gloo(layout, lengths: list[list[list[int]]], spr: int, plan: str, on_oversize: str) -> dict:
    topo = mesh_topology(layout)
    cp = topo.cp_size
    capacity = 48 if on_oversize == "error" else 24  # below 40 tokens: some sequences dropped or truncated
    options: dict = dict(samples_per_rank=spr, max_tokens_per_rank=capacity // cp, prefetch=0, drop_last=False,
                         on_oversize=on_oversize)  # fmt: skip
    if plan == "dynamic":
        options.update(dynamic_cp=True, cost=RING)
    else:
        options.update(scheduler=ScatterScheduler(defer_longest=plan == "test_defer"),
                       pad_multiple=None if cp > 1 else 4)  # fmt: skip
    it = wrap_data_iterator(iter(items_of(lengths[topo.dp_rank], topo.dp_rank)), topo, **options)
    out: dict = {"dp_rank": topo.dp_rank, "steps": []}
    with it:
        for step in it:
            pool_ids = np.flatnonzero(step.schedule.origin == topo.dp_rank)
            back = step.to_origin([_encoded(mb, 2) for mb in step.microbatches])
            rows = step.to_origin([mb.sample_ids.to(torch.float64) for mb in step.microbatches], per_sequence=True)
            out["steps"].append({
                "ids": step.origin_ids.tolist(), "offset": int(pool_ids[0]) if pool_ids.size else 0,
                "back": [t.tolist() for t in back], "rows": [t.tolist() for t in rows],
                "lengths": step.schedule.lengths.tolist(), "original": step.schedule.original_lengths.tolist(),
                "deferred": step.schedule.deferred.tolist(), "dropped": step.schedule.dropped.tolist(),
                "empty_samples": step.stats.empty_samples,
            })  # fmt: skip
    return out


def check_gloo(results, lengths: list[list[list[int]]], spr: int) -> int:
    """Every rank's steps against its read order; returns how many empty values came back."""
    empties = 0
    dp = len(lengths)
    by_dp = {}
    for r in results:
        by_dp.setdefault(r["dp_rank"], r)
        assert r["steps"] == by_dp[r["dp_rank"]]["steps"]  # CP ranks of a replica get the same values
    for d in range(dp):
        reads, carried = reads_of(lengths[d], spr), []
        for k, step in enumerate(by_dp[d]["steps"]):
            pool = carried + (reads[k] if k < len(reads) else [])
            kept = [seq for seq in pool if seq[1] > 0]
            ids = {seq: step["offset"] + g for g, seq in enumerate(kept)}
            held = set(step["deferred"])
            order = [seq for seq in pool if seq[1] == 0 or ids[seq] not in held]
            carried = [seq for seq in kept if ids[seq] in held]
            assert len(step["back"]) == len(step["rows"]) == len(step["ids"]) == len(order)
            for seq, gid, got, row in zip(order, step["ids"], step["back"], step["rows"], strict=True):
                if seq[1] == 0:
                    assert gid == -1 and got == [] and row == []
                    empties += 1
                    continue
                assert step["original"][gid] == seq[1]
                if gid in step["dropped"]:
                    assert got == [] and row == []
                    continue
                n = step["lengths"][gid]
                assert got == [[gid * 1000 + j, -1.0] for j in range(n)] and row == float(gid)
        assert sum(s["empty_samples"] for s in by_dp[d]["steps"]) == sum(
            s["empty_samples"] for s in by_dp[0]["steps"]
        )  # the count is global, the same on every rank
    assert sum(s["empty_samples"] for s in by_dp[0]["steps"]) == empties  # what stats count comes back empty
    return empties


@pytest.mark.parametrize(
    ("name", "plan", "on_oversize", "seed"),
    [
        ("dp2", "test_scatter", "error", 0),
        ("dp2", "test_defer", "drop", 1),
        ("dp2cp2", "test_defer", "truncate", 2),
        ("dp2cp2", "dynamic", "error", 3),
        ("dp2cp2", "dynamic", "drop", 4),
    ],
)
def test_gloo_one_value_per_sequence_read(dist_pools, name, plan, on_oversize, seed):
    rng = np.random.default_rng(seed)
    dp = dict(LAYOUTS[name])["dp"]
    lengths = [[[int(n)] if rng.random() < 0.8 else [int(v) for v in rng.integers(0, 16, 3)]
                for n in np.where(rng.random(13) < 0.3, 0, rng.integers(1, 41, 13))] for _ in range(dp)]  # fmt: skip
    spr = int(rng.integers(3, 7))
    layout = LAYOUTS[name]
    pool = dist_pools.get(int(np.prod([s for _, s in layout])))
    results = pool.run(run_gloo, layout, lengths, spr, plan, on_oversize)
    assert check_gloo(results, lengths, spr) > 0  # not vacuous: zero-length samples came back empty
