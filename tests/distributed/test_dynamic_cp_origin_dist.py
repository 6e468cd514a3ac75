"""Step.to_origin under dynamic CP on gloo (dp=4 and dp=2 x cp=2, a sequence of 3.5x a rank's
capacity among short ones, zero-length samples, with prefetch): every value computed on a
group's shards comes back to the ranks of the replica that read its sample, in read order, pads
removed, exactly once, an empty value in the place of each zero-length sample. A mistake on one
rank, and a call after the iterator freed its groups, raise the same named error everywhere."""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist
from dynamic_cp_data import CAPACITY, GROUP_COST, LAYOUTS, SPR, samples_of
from wrapper_data import mesh_topology

from seqpack.errors import ConfigError
from seqpack.loader import wrap_data_iterator

STEPS = 3


def read_by(dp_rank: int) -> list[dict[str, torch.Tensor]]:
    """samples_of(dp_rank), with zero-length samples: the third of every step on every rank,
    and the last of DP rank 1's steps."""
    samples = samples_of(dp_rank, steps=STEPS)
    for i in range(len(samples)):
        if i % SPR == 2 or (dp_rank == 1 and i % SPR == SPR - 1):
            samples[i] = {"input_ids": torch.zeros(0, dtype=torch.int64)}
    return samples


def _wrap(topo, prefetch: int):
    return wrap_data_iterator(
        iter(read_by(topo.dp_rank)), topo, samples_per_rank=SPR, max_tokens_per_rank=CAPACITY, dynamic_cp=True,
        cost=GROUP_COST, prefetch=prefetch,
    )  # fmt: skip


def run_to_origin(name: str, prefetch: int) -> dict:
    topo = mesh_topology(LAYOUTS[name])
    it = _wrap(topo, prefetch)
    out: dict = {"rank": dist.get_rank(), "dp_rank": topo.dp_rank, "tokens": [], "pairs": [], "rows": [],
                 "wide": 0, "moved": 0}  # fmt: skip
    with it:
        for step in it:
            # Per token: the token id and its position's parity, two columns; per sequence: its id.
            values = [torch.stack([mb.input_ids.to(torch.float64) * 2 + 1, mb.input_ids.to(torch.float64)], 1)
                      for mb in step.microbatches]  # fmt: skip
            flat = [mb.input_ids.to(torch.int64) + 5 for mb in step.microbatches]
            per_seq = [mb.sample_ids.to(torch.float64)[:, None] for mb in step.microbatches]
            back, back_flat = step.to_origin(values), step.to_origin(flat)
            seq_back = step.to_origin(per_seq, per_sequence=True)
            ids = step.origin_ids.tolist()
            assert len(back) == len(back_flat) == len(seq_back) == len(ids)
            out["tokens"] += [((t[:, 0] - 1) / 2).to(torch.int64).tolist() for t in back]
            out["pairs"] += [bool(torch.equal(t[:, 1], (t[:, 0] - 1) / 2)) for t in back]
            out["tokens_flat"] = out.get("tokens_flat", []) + [(t - 5).tolist() for t in back_flat]
            out["rows"] += [(gid, s.tolist()) for gid, s in zip(ids, seq_back, strict=True)]
            out["kinds"] = out.get("kinds", set()) | {(t.dtype, t.shape[1:]) for t in back}
            out["wide"] += sum(mb.cp_size > 1 for mb in step.microbatches)
            ran = {int(g) for mb in step.microbatches for g in mb.sample_ids.tolist() if g >= 0}
            out["moved"] += len({g for g in ids if g >= 0} - ran)
            out["empty_samples"] = out.get("empty_samples", 0) + step.stats.empty_samples
    return out


@pytest.mark.parametrize(("name", "prefetch"), [("dp4", 1), ("dp2cp2", 1), ("dp2cp2", 0)])
def test_values_come_back_to_the_reading_rank_in_order_exactly_once(dist_pools, name, prefetch):
    results = dist_pools.get(4).run(run_to_origin, name, prefetch)
    for r in results:
        read = [s["input_ids"].tolist() for s in read_by(r["dp_rank"])]
        assert r["tokens"] == read  # every sample this replica read, in read order, pads removed, once
        assert r["tokens_flat"] == read  # an empty value in the place of every zero-length sample
        assert all(r["pairs"])
        assert all(row == ([float(gid)] if gid >= 0 else []) for gid, row in r["rows"])
        assert r["kinds"] == {(torch.float64, (2,))}  # the empty values too
        assert [gid for gid, _ in r["rows"]].count(-1) == read.count([]) > 0  # not vacuous
    dp = max(r["dp_rank"] for r in results) + 1
    assert results[0]["empty_samples"] == STEPS * (dp + 1)  # counted, every DP rank's
    assert sum(r["wide"] for r in results) > 0  # some groups spread over several ranks
    assert sum(r["moved"] for r in results) > 0  # and values crossed ranks to come back


def _raised(step, values) -> tuple[str, str, bool] | None:
    try:
        step.to_origin(values)
    except Exception as exc:  # the test compares what every rank raised
        return type(exc).__name__, str(exc), isinstance(exc, ConfigError)
    return None


def run_mistake(name: str, after_the_end: bool) -> dict:
    """A wrong tensor count on the last rank alone at step 0, then a right call everywhere;
    or, ``after_the_end``, to_origin of the last step once the iterator ended (which frees
    its dynamic-CP groups)."""
    topo = mesh_topology(LAYOUTS[name])
    wrong = dist.get_rank() == dist.get_world_size() - 1
    out: dict = {"steps": 0}
    for step in _wrap(topo, 1):
        values = [mb.input_ids.to(torch.float64) for mb in step.microbatches]
        if out["steps"] == 0 and not after_the_end:
            out["raised"] = _raised(step, values[:-1] if wrong else values)
        out["after"] = [t.tolist() for t in step.to_origin(values)]  # still in step everywhere
        out["steps"] += 1
    if after_the_end:
        out["raised"] = _raised(step, values)
    return out


@pytest.mark.parametrize(
    ("after_the_end", "pattern"),
    [
        (False, r"to_origin of step 0 on DP rank 1, CP rank 1 \(global rank 3\): values holds \d+ tensors but"),
        (True, rf"to_origin of step {STEPS - 1} after its iterator ended or was closed: the plane process group"),
    ],
)
def test_a_mistake_is_one_named_error_on_every_rank(dist_pools, after_the_end, pattern):
    results = dist_pools.get(4).run(run_mistake, "dp2cp2", after_the_end)
    raised = {r["raised"] for r in results}
    assert len(raised) == 1, raised  # every rank: the same error, the same message
    kind, message, named = raised.pop()
    assert kind == "ConfigError" and named, message
    assert re.search(pattern, message), message
    assert all(r["steps"] == STEPS and r["after"] for r in results)
