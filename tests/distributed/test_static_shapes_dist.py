"""Static shapes through the whole wrapper on gloo (``PackingConfig(static_shapes=...)``): on
every rank (readers, TP receivers, middle pipeline stages) every microbatch has a bucket's
token count (its CP shard: bucket / cp), ``max_sequences + 1`` offsets and ``max_seqlen``
the bucket; each is, bit for bit, its CP shard of its replica's microbatch packed alone with
the same shapes; every sequence read arrives in exactly one microbatch, and ``to_origin``
brings every token back to its reader."""

from __future__ import annotations

import numpy as np
import pytest
from dynamic_cp_data import CAPACITY, SPR, samples_of
from wrapper_data import mesh_topology

from seqpack.loader import wrap_data_iterator
from seqpack.schedulers import Schedule
from seqpack.thd import StaticShapes, pack_sequences
from seqpack.thd.cp import shard_for_cp

pytestmark = pytest.mark.processes

LONG = 60  # fits one rank's capacity
# name -> (mesh layout, CP size)
LAYOUTS = {
    "dp2cp2": ((("dp", 2), ("cp", 2)), 2),
    "dp2tp2": ((("dp", 2), ("tp", 2)), 1),
    "pp3": ((("pp", 3),), 1),
}
FIELDS = ("input_ids", "labels", "loss_mask", "position_ids", "seq_idx", "padding_mask", "cu_seqlens",
          "cu_seqlens_padded", "sample_ids")  # fmt: skip


def shapes_for(cp: int, tail: str, max_sequences: int) -> StaticShapes:
    capacity = CAPACITY * cp
    return StaticShapes(
        token_buckets=tuple(capacity * k // 4 for k in range(1, 5)), max_sequences=max_sequences, tail_padding=tail
    )


def run_steps(name: str, tail: str, cp_layout: str, max_sequences: int) -> dict:
    layout, cp = LAYOUTS[name]
    topo = mesh_topology(layout)
    reads = topo.tp_rank == 0 and topo.pp_rank in (0, topo.pp_size - 1)  # data_owner='tp0'
    data = iter(samples_of(topo.dp_rank, steps=2, long=LONG)) if reads else None
    steps = wrap_data_iterator(
        data, topo, samples_per_rank=SPR, max_tokens_per_rank=CAPACITY, cp_layout=cp_layout, prefetch=0,
        static_shapes=shapes_for(cp, tail, max_sequences),
    )  # fmt: skip
    out: dict = {"coords": (topo.dp_rank, topo.cp_rank, topo.tp_rank, topo.pp_rank), "steps": []}
    with steps:
        for step in steps:
            batches = [
                {
                    name: None if getattr(b, name) is None else getattr(b, name).numpy().copy()
                    for name in FIELDS
                } | {"meta": (b.cp_size, b.cp_rank, b.max_seqlen, b.num_loss_tokens)}
                for b in step.microbatches
            ]  # fmt: skip
            back = None
            if reads and topo.pp_rank == 0:  # every token back to its reader, through its shard's input ids
                back = [t.numpy() for t in step.to_origin([b.input_ids.double() for b in step.microbatches])]
            out["steps"].append({"plan": step.schedule.to_arrays(), "batches": batches, "back": back})
    return out


# max_sequences below what the plans would pack otherwise: the schedulers respect it.
CASES = [
    ("dp2cp2", "append_dummy_seq", "dualchunk", 4),
    ("dp2cp2", "extend_last", "contiguous", 3),
    ("dp2tp2", "append_dummy_seq", "dualchunk", 3),
    ("pp3", "extend_last", "dualchunk", 2),
]


@pytest.mark.parametrize("name, tail, cp_layout, max_sequences", CASES)
def test_every_rank_gets_fixed_shapes_and_every_token_once(dist_pools, name, tail, cp_layout, max_sequences):
    layout, cp = LAYOUTS[name]
    world = int(np.prod([size for _, size in layout]))
    results = dist_pools.get(world).run(run_steps, name, tail, cp_layout, max_sequences, timeout=600)
    shapes = shapes_for(cp, tail, max_sequences)
    buckets = shapes.buckets()
    read = [samples_of(d, steps=2, long=LONG) for d in range(2)]
    checked = 0
    for r in results:
        dp, cp_rank, tp, pp = r["coords"]
        middle = pp == 1
        assert len(r["steps"]) == 2
        for k, step in enumerate(r["steps"]):
            plan = Schedule.from_arrays(step["plan"])
            pool = [s for d in range(plan.dp_size) for s in read[d][SPR * k : SPR * (k + 1)]]
            seen = sorted(int(i) for row in plan.assignment for ids in row for i in ids)
            assert seen == list(range(plan.dp_size * SPR))  # every sequence in exactly one microbatch
            for m, got in enumerate(step["batches"]):
                ids = plan.assignment[m][dp]
                assert ids.size <= shapes.max_real_sequences
                assert got["cu_seqlens"].shape == (max_sequences + 1,) and got["sample_ids"].shape == (max_sequences,)
                bucket = got["meta"][2]
                assert bucket in buckets and got["seq_idx"].shape == (bucket // cp,)
                if ids.size == 0:  # a filler of the smallest bucket
                    assert bucket == buckets[0] and (got["sample_ids"] == -1).all()
                    continue
                whole = pack_sequences(
                    [pool[i] for i in ids], pad_multiple=plan.pad_multiple, sample_ids=ids, static_shapes=shapes
                )
                want = shard_for_cp(whole, cp, cp_rank, layout=cp_layout)
                for field in FIELDS:
                    if middle and field in ("input_ids", "labels", "loss_mask"):
                        assert got[field] is None
                        continue
                    a, b = got[field], getattr(want, field).numpy()
                    assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), (name, k, m, field)
                assert got["meta"] == (cp, cp_rank, want.max_seqlen, whole.num_loss_tokens)
                checked += 1
            if step["back"] is not None:
                mine = read[dp][SPR * k : SPR * (k + 1)]
                assert len(step["back"]) == SPR
                for sample, back in zip(mine, step["back"], strict=True):
                    assert np.array_equal(back, sample["input_ids"].double().numpy())
    assert checked >= 8
