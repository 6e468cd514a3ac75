"""Fuzz the distributed wrapper on gloo (3 and 4 ranks): random layouts, schedulers, uneven
and empty per-rank data, ``drop_last`` both ways, oversize policies, a bad sample somewhere,
and resume. Whatever happens, every sequence a rank read is delivered exactly once (tokens
intact, across replicas and CP shards) or counted as dropped:

* drops are counted: ``StepStats.dropped_sequences`` (``on_oversize="drop"``),
  ``PackingIterator.dropped_at_end`` (a partial last step under ``drop_last=True``);
  truncations are counted in ``truncated_sequences`` / ``truncated_tokens``; zero-length
  samples in ``empty_samples``;
* error-and-continue: a bad sample fails its step with the same ``StepFailed`` on every rank;
  ``next()`` raises again and ``state_dict()`` refuses; an iterator resumed from the last
  state saved before the failure, over the fixed data, delivers the rest: before + after is
  exactly once;
* resume without an error replays the remaining steps identically.
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wrapper_data import EMPTY_EVERY, ScatterScheduler, expected_sequences, identity, items, mesh_topology

from seqpack.errors import ResumeError, StepFailed
from seqpack.loader import wrap_data_iterator
from seqpack.thd import StaticShapes
from seqpack.thd.cp import unshard_from_cp

SEED = 23
# CI-sized; SEQPACK_FUZZ_EXAMPLES=200 HYPOTHESIS_PROFILE=dev explores further.
EXAMPLES = int(os.environ.get("SEQPACK_FUZZ_EXAMPLES", "30"))
MAX_LEN = 40  # longest sequence in wrapper_data.items
LAYOUTS = {
    "dp3": (("dp", 3),),
    "dp4": (("dp", 4),),
    "dp2cp2": (("dp", 2), ("cp", 2)),
    "dp2tp2": (("dp", 2), ("tp", 2)),
}
TAILS = ("append_dummy_seq", "extend_last")
BAD_KINDS = ("missing_input_ids", "unequal_lengths", "not_a_mapping", "oversize")

# --- worker side ---------------------------------------------------------------------------


class Counting:
    """The data iterator, counting the items taken from it (skips on resume included)."""

    def __init__(self, source):
        self.source, self.taken = source, 0

    def __iter__(self):
        for item in self.source:
            self.taken += 1
            yield item


def _summary(step) -> dict[str, Any]:
    return {
        "stats": {k: getattr(step.stats, k) for k in ("num_sequences", "dropped_sequences", "dropped_tokens",
                                                       "truncated_sequences", "truncated_tokens", "empty_samples")},
        "mbs": [
            {"input_ids": b.input_ids.numpy().copy(), "cu": b.cu_seqlens.numpy().copy(),
             "cu_padded": b.cu_seqlens_padded.numpy().copy(), "filler": bool((b.sample_ids < 0).all()),
             "shape": (b.num_tokens, b.cu_seqlens.shape[0], b.max_seqlen)}
            for b in step.microbatches
        ],
    }  # fmt: skip


def _roundtrip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def static_shapes(cfg) -> StaticShapes | None:
    """The scenario's fixed shapes: one bucket (the capacity) or two (half of it too)."""
    if cfg["static"] is None:
        return None
    buckets, slots, tail = cfg["static"]
    capacity = cfg["max_tokens"]
    ladder = "capacity" if buckets == 1 else (capacity // 2, capacity)
    return StaticShapes(token_buckets=ladder, max_sequences=slots, tail_padding=tail)


def run_scenario(layout, cfg) -> dict[str, Any]:
    topo = mesh_topology(layout)
    reads = topo.tp_rank == 0
    count = cfg["items"][topo.dp_rank]
    bad = cfg["bad"] if cfg["bad"] and cfg["bad"]["dp"] == topo.dp_rank else None

    def wrapped(spoiled: bool):
        data = Counting(items(SEED, topo.dp_rank, count, bad=bad if spoiled else None)) if reads else None
        scheduler = ScatterScheduler(defer_longest=True) if cfg["scheduler"] == "test_defer" else cfg["scheduler"]
        it = wrap_data_iterator(
            data, topo, samples_per_rank=cfg["spr"], max_tokens_per_rank=cfg["max_tokens"] // topo.cp_size,
            scheduler=scheduler, drop_last=cfg["drop_last"], on_oversize=cfg["on_oversize"],
            pad_multiple=4 if topo.cp_size == 1 else None, static_shapes=static_shapes(cfg),
        )  # fmt: skip
        return it, data

    out: dict[str, Any] = {"coords": (topo.dp_rank, topo.cp_rank, topo.tp_rank), "steps": [], "failure": None}
    it, data = wrapped(spoiled=True)
    states = [_roundtrip(it.state_dict())]
    try:
        for step in it:
            out["steps"].append(_summary(step))
            states.append(_roundtrip(it.state_dict()))
    except StepFailed as exc:
        out["failure"] = {"message": str(exc), "step": exc.step}
        with pytest.raises(StepFailed, match="cannot continue"):
            next(it)
        with pytest.raises(ResumeError, match=f"failed at step {exc.step}"):
            it.state_dict()
        # Fix the data, resume from the last state saved before the failure.
        it, data = wrapped(spoiled=False)
        it.load_state_dict(states[-1])
        out["after"] = [_summary(step) for step in it]
    out["taken"] = data.taken if data is not None else None
    out["dropped_at_end"] = it.dropped_at_end
    out["empty_at_end"] = it.empty_at_end
    resume_at = cfg["resume_at"]
    if out["failure"] is None and resume_at is not None and resume_at < len(states):
        replay, _ = wrapped(spoiled=False)
        replay.load_state_dict(states[resume_at])
        out["replayed"] = [_summary(step) for step in replay]
    return out


# --- checks in the test process ------------------------------------------------------------


def _sizes(layout) -> dict[str, int]:
    return {"dp": 1, "cp": 1, "tp": 1, **dict(layout)}


def _delivered(results, layout, cfg, key: str, first: int = 0) -> list[tuple[tuple[int, int, int], int, int]]:
    """(identity, delivered length, step) of every sequence in ``result[key]`` steps, tokens
    checked, CP shards reassembled; TP copies must equal TP rank 0's."""
    sizes = _sizes(layout)
    shapes = static_shapes(cfg)
    by = {r["coords"]: r for r in results}
    out = []
    steps = len(by[(0, 0, 0)][key])
    for k in range(steps):
        for d in range(sizes["dp"]):
            mbs = [by[(d, c, 0)][key][k]["mbs"] for c in range(sizes["cp"])]
            for t in range(1, sizes["tp"]):
                twin = by[(d, 0, t)][key][k]["mbs"]
                assert all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(twin, mbs[0], strict=True))
            for m in range(len(mbs[0])):
                if shapes is not None:  # fixed shapes on every CP rank, fillers too: a bucket, max_sequences slots
                    for c in range(sizes["cp"]):
                        tokens, offsets, max_seqlen = mbs[c][m]["shape"]
                        bucket = tokens * sizes["cp"]
                        assert bucket in shapes.buckets(cfg["max_tokens"]) and max_seqlen == bucket
                        assert offsets == shapes.max_sequences + 1
                    assert int((mbs[0][m]["cu"][1:] > mbs[0][m]["cu"][:-1]).sum()) <= shapes.max_real_sequences
                if mbs[0][m]["filler"]:  # a padding-only microbatch of a replica with nothing to run
                    continue
                parts = [torch.from_numpy(mbs[c][m]["input_ids"]) for c in range(sizes["cp"])]
                cu, cu_padded = mbs[0][m]["cu"], mbs[0][m]["cu_padded"]
                ids = unshard_from_cp(parts, torch.from_numpy(cu_padded), sizes["cp"]).numpy()
                for s in range(cu.shape[0] - 1):
                    n = int(cu[s + 1] - cu[s])
                    start = int(cu_padded[s])
                    if n == 0:  # a fixed-shape pack's tail slot or unused slots
                        continue
                    who = identity(ids[start])
                    # Tokens intact: sequence tokens count up from their first.
                    assert np.array_equal(ids[start : start + n], ids[start] + np.arange(n)), who
                    out.append((who, n, first + k))
    return out


def _stat_sum(results, key: str, field: str) -> int:
    return sum(step["stats"][field] for step in results[0].get(key, []))


def check_scenario(results, layout, cfg) -> dict[str, int]:
    sizes = _sizes(layout)
    by = {r["coords"]: r for r in results}
    failures = {repr(r["failure"]) for r in results}
    assert len(failures) == 1, failures  # every rank: the same outcome, the same message
    failure = results[0]["failure"]
    before = _delivered(results, layout, cfg, "steps")
    after = _delivered(results, layout, cfg, "after", first=len(results[0]["steps"])) if failure else []
    delivered = before + after
    keys = ["steps", "after"] if failure else ["steps"]
    # What the readers consumed, in item indices (skips on resume included).
    expected: dict[tuple[int, int, int], int] = {}
    empties = 0
    for d in range(sizes["dp"]):
        taken = by[(d, 0, 0)]["taken"]
        expected.update(expected_sequences(SEED, d, taken))
        empties += sum(1 for i in range(taken) if i % EMPTY_EVERY == 7)
    who = [w for w, _, _ in delivered]
    assert len(who) == len(set(who)), "a sequence was delivered twice"
    assert set(who) <= set(expected), set(who) - set(expected)
    dropped = sum(_stat_sum(results, key, "dropped_sequences") for key in keys)
    dropped_at_end = {r["dropped_at_end"] for r in results}
    assert len(dropped_at_end) == 1
    missing = set(expected) - set(who)
    assert len(missing) == dropped + dropped_at_end.pop(), (len(missing), dropped)  # counted, not lost
    empty_at_end = results[0]["empty_at_end"]
    assert sum(_stat_sum(results, key, "empty_samples") for key in keys) + empty_at_end == empties
    truncated = [(w, n) for w, n, _ in delivered if n < expected[w]]
    assert all(n <= expected[w] for w, n, _ in delivered)
    assert sum(_stat_sum(results, key, "truncated_sequences") for key in keys) == len(truncated)
    assert sum(_stat_sum(results, key, "truncated_tokens") for key in keys) == sum(
        expected[w] - n for w, n in truncated
    )
    if failure is None and cfg["resume_at"] is not None and "replayed" in results[0]:
        replayed = _delivered(results, layout, cfg, "replayed", first=cfg["resume_at"])
        assert [(w, n, k) for w, n, k in delivered if k >= cfg["resume_at"]] == replayed
    return {"delivered": len(who), "missing": len(missing), "failed": int(failure is not None),
            "truncated": len(truncated), "empties": empties}  # fmt: skip


@st.composite
def scenarios(draw):
    name = draw(st.sampled_from(sorted(LAYOUTS)))
    dp = _sizes(LAYOUTS[name])["dp"]
    on_oversize = draw(st.sampled_from(["error", "drop", "truncate"]))
    cfg = {
        "items": [draw(st.integers(0, 22)) for _ in range(dp)],
        "spr": draw(st.integers(2, 7)),
        "scheduler": draw(st.sampled_from(["balanced", "dp_balanced", "empty", "test_defer"])),
        "drop_last": draw(st.booleans()),
        "on_oversize": on_oversize,
        # Below MAX_LEN sequences are too long: dropped or truncated (counted); "error" fits all.
        "max_tokens": 48 if on_oversize == "error" else draw(st.sampled_from([24, 32, 48])),
        "bad": None,
        "resume_at": draw(st.none() | st.integers(0, 3)),
        # Fixed shapes: (buckets, max_sequences, tail_padding).
        "static": draw(st.none() | st.tuples(st.sampled_from([1, 2]), st.integers(2, 6), st.sampled_from(TAILS))),
    }
    if draw(st.booleans()):
        d = draw(st.integers(0, dp - 1))
        if cfg["items"][d]:
            cfg["bad"] = {"dp": d, "index": draw(st.integers(0, cfg["items"][d] - 1)),
                          "kind": draw(st.sampled_from(BAD_KINDS if on_oversize == "error" else BAD_KINDS[:-1])),
                          "length": 500}  # fmt: skip  # an oversize sample is only a mistake under "error"
    return name, cfg


def test_every_sequence_read_is_delivered_once_or_counted_as_dropped(dist_pools):
    seen = {"delivered": 0, "missing": 0, "failed": 0, "truncated": 0, "empties": 0, "resumed": 0, "static": 0}

    @settings(max_examples=EXAMPLES, suppress_health_check=list(HealthCheck))
    @given(scenarios())
    def one(scenario):
        name, cfg = scenario
        layout = LAYOUTS[name]
        world = int(np.prod([size for _, size in layout]))
        results = dist_pools.get(world).run(run_scenario, layout, cfg, timeout=120)
        for key, value in check_scenario(results, layout, cfg).items():
            seen[key] += value
        seen["resumed"] += int("replayed" in results[0] or results[0]["failure"] is not None)
        seen["static"] += int(cfg["static"] is not None)

    one()
    # Not vacuous: the runs delivered, dropped, truncated, failed and resumed, some with fixed shapes.
    assert all(seen[key] > 0 for key in seen), seen


def run_probe(layout) -> int:
    return dist.get_world_size()


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_each_layout_runs(dist_pools, name):
    layout = LAYOUTS[name]
    cfg = {"items": [9] * _sizes(layout)["dp"], "spr": 3, "scheduler": "balanced", "drop_last": False,
           "on_oversize": "truncate", "max_tokens": 24, "bad": None, "resume_at": 1,
           "static": (2, 30, "extend_last")}  # fmt: skip
    world = int(np.prod([size for _, size in layout]))
    results = dist_pools.get(world).run(run_scenario, layout, cfg)
    seen = check_scenario(results, layout, cfg)
    assert seen["delivered"] > 0 and seen["truncated"] > 0 and "replayed" in results[0]
