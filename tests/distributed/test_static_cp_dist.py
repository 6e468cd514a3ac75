"""Static CP on gloo: every CP-sharded batch of the wrapper carries the topology's CP group as
``cp_group`` (readers, TP receivers), and a model built without a group computes on it what
one process computes on the whole pack."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from dynamic_cp_data import CAPACITY, SPR, Probe, samples_of
from wrapper_data import mesh_topology

from seqpack.loader import wrap_data_iterator
from seqpack.schedulers import Schedule
from seqpack.thd import pack_sequences
from seqpack.thd.cp import shard_for_cp, unshard_from_cp

TOL = 1e-10
LONG = 100  # fits a replica's CP group of 2 (2 x CAPACITY)
LAYOUTS = {"dp2cp2": (("dp", 2), ("cp", 2)), "cp2tp2": (("cp", 2), ("tp", 2))}


def run_static_step(name: str, prefetch: int) -> dict:
    topo = mesh_topology(LAYOUTS[name])
    data = iter(samples_of(topo.dp_rank, long=LONG)) if topo.tp_rank == 0 else None
    steps = wrap_data_iterator(data, topo, samples_per_rank=SPR, max_tokens_per_rank=CAPACITY, prefetch=prefetch)
    with steps:
        step = next(steps)
        mine = topo.group("cp")
        probe = Probe()
        return {
            "dp_rank": topo.dp_rank,
            "cp_rank": topo.cp_rank,
            "tp_rank": topo.tp_rank,
            "plan": step.schedule.to_arrays(),
            "groups": [
                (b.cp_group is mine, dist.get_process_group_ranks(b.cp_group), b.cp_size, b.cp_rank)
                for b in step.microbatches
            ],
            "cp_ranks": topo.global_ranks("cp"),
            "probe": [(o.numpy(), g) for o, g in (probe.loss(b) for b in step.microbatches)],
        }


@pytest.mark.parametrize("name, prefetch", [("dp2cp2", 0), ("dp2cp2", 1), ("cp2tp2", 0)])
def test_batches_carry_the_cp_group_and_a_model_without_one_runs_on_it(dist_pools, name, prefetch):
    results = dist_pools.get(4).run(run_static_step, name, prefetch, timeout=600)
    plan = Schedule.from_arrays(results[0]["plan"])
    samples = [s for d in range(plan.dp_size) for s in samples_of(d, long=LONG)]
    probe = Probe()
    worst = 0.0
    for r in results:  # the topology's CP group itself, on every rank (TP receivers too)
        assert r["groups"] and all(g == (True, r["cp_ranks"], 2, r["cp_rank"]) for g in r["groups"])
    for tp in {r["tp_rank"] for r in results}:
        for d in range(plan.dp_size):
            lane = sorted((r for r in results if (r["dp_rank"], r["tp_rank"]) == (d, tp)), key=lambda r: r["cp_rank"])
            for m, ids in enumerate(row[d] for row in plan.assignment):
                if ids.size == 0:
                    continue
                whole = pack_sequences([samples[i] for i in ids], pad_multiple=plan.pad_multiple, sample_ids=ids)
                out, grads = probe.loss(whole)
                got = unshard_from_cp([torch.from_numpy(x["probe"][m][0]) for x in lane], whole.cu_seqlens_padded, 2)
                worst = max(worst, float((got - out).abs().max()))
                for key, grad in grads.items():
                    worst = max(worst, float(np.abs(sum(x["probe"][m][1][key] for x in lane) - grad).max()))
    assert worst < TOL, worst


FIELDS = ("input_ids", "labels", "loss_mask", "position_ids", "seq_idx", "padding_mask", "cu_seqlens",
          "cu_seqlens_padded", "sample_ids")  # fmt: skip


def run_static_batches(layout: str) -> dict:
    topo = mesh_topology(LAYOUTS["dp2cp2"])
    steps = wrap_data_iterator(
        iter(samples_of(topo.dp_rank, steps=2, long=LONG)), topo, samples_per_rank=SPR,
        max_tokens_per_rank=CAPACITY, cp_layout=layout, prefetch=0,
    )  # fmt: skip
    out: dict = {"dp_rank": topo.dp_rank, "cp_rank": topo.cp_rank, "steps": []}
    with steps:
        for step in steps:
            out["steps"].append(
                {
                    "plan": step.schedule.to_arrays(),
                    "batches": [
                        {
                            **{name: getattr(b, name).numpy().copy() for name in FIELDS},
                            "meta": (b.cp_size, b.cp_rank, b.cp_layout.value, b.max_seqlen, b.num_loss_tokens),
                        }
                        for b in step.microbatches
                    ],
                }
            )
    return out


@pytest.mark.parametrize("layout", ["dualchunk", "contiguous"])
def test_every_rank_gets_its_shard_of_its_replicas_pack_bit_for_bit(dist_pools, layout):
    """Each rank's batch of every step and round is, field by field and bit for bit, its CP
    shard (in the config's layout) of its replica's microbatch packed alone; an empty cell is
    a padding-only filler."""
    results = dist_pools.get(4).run(run_static_batches, layout, timeout=600)
    samples = [
        [s for d in range(2) for s in samples_of(d, steps=2, long=LONG)[SPR * k : SPR * (k + 1)]] for k in range(2)
    ]
    checked = 0
    for r in results:
        assert len(r["steps"]) == 2
        for k, step in enumerate(r["steps"]):
            plan = Schedule.from_arrays(step["plan"])
            assert len(step["batches"]) == plan.num_microbatches
            for m, got in enumerate(step["batches"]):
                ids = plan.assignment[m][r["dp_rank"]]
                if ids.size == 0:
                    assert got["sample_ids"].tolist() == [-1] and not got["loss_mask"].any()
                    continue
                whole = pack_sequences([samples[k][i] for i in ids], pad_multiple=plan.pad_multiple, sample_ids=ids)
                want = shard_for_cp(whole, 2, r["cp_rank"], layout=layout)
                for name in FIELDS:
                    a, b = got[name], getattr(want, name).numpy()
                    assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), (k, m, name)
                meta = (2, r["cp_rank"], layout, want.max_seqlen, whole.num_loss_tokens)
                assert got["meta"] == meta
                checked += 1
    assert checked >= 8


def run_after_the_end(name: str) -> dict:
    topo = mesh_topology({"dp2": (("dp", 2),), "dp2cp2": LAYOUTS["dp2cp2"]}[name])
    steps = wrap_data_iterator(
        iter(samples_of(topo.dp_rank, long=LONG * topo.cp_size // 2)), topo, samples_per_rank=SPR,
        max_tokens_per_rank=CAPACITY,
    )  # fmt: skip
    held = list(steps)  # the iterator ended: it freed the groups it created
    values = [b.input_ids.to(torch.float64) for b in held[-1].microbatches]
    try:
        return {"back": [t.tolist() for t in held[-1].to_origin(values)]}
    except Exception as exc:  # the test compares what every rank raised
        return {"raised": (type(exc).__name__, str(exc))}


@pytest.mark.parametrize("name", ["dp2", "dp2cp2"])
def test_to_origin_after_the_end(dist_pools, name):
    """The plane group the iterator created (dp and cp above 1) is freed with it: a held step's
    to_origin says so on every rank; on the topology's own group (cp 1) it still runs."""
    results = dist_pools.get(4 if name == "dp2cp2" else 2).run(run_after_the_end, name, timeout=600)
    if name == "dp2":
        assert all("back" in r and r["back"] for r in results)
        return
    raised = {r.get("raised") for r in results}
    assert len(raised) == 1, raised
    kind, message = raised.pop()
    assert kind == "ConfigError" and "to_origin of step 0 after its iterator ended or was closed" in message
