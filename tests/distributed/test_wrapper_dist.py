"""wrap_data_iterator on gloo process groups: dp=4, dp2 x cp2, dp2 x tp2 (both data owners),
dp2 x pp2, cp=4, pp=3 (a middle stage).

For every layout: every sequence's tokens arrive exactly once across replicas and
reassemble from the CP shards into exactly the pack of the samples they name; TP copies are
identical; middle stages get the first stage's layout without tokens; every rank agrees on
the number of microbatches and on exact stats. Then end of data, bad input on one rank,
iterator ownership, resume and the schedule check.
"""

from __future__ import annotations

import io
import itertools
import re

import numpy as np
import pytest
import torch
import torch.distributed as dist
from wrapper_data import (
    EMPTY_EVERY,
    TOKEN_FIELDS,
    BrokenScheduler,
    ScatterScheduler,
    batch_arrays,
    check_full_batch,
    expected_sequences,
    items,
    mesh_topology,
)

from seqpack.cost import CostModel
from seqpack.loader import wrap_data_iterator
from seqpack.loader.resume import StateKey
from seqpack.schedulers import available_schedulers
from seqpack.thd import pad_multiple_for
from seqpack.thd.cp import unshard_from_cp
from seqpack.topology import Topology

SEED = 11

# name -> (mesh layout, data owner)
LAYOUTS = {
    "dp4": ((("dp", 4),), "tp0"),
    "dp2cp2": ((("dp", 2), ("cp", 2)), "tp0"),
    "dp2tp2-tp0": ((("dp", 2), ("tp", 2)), "tp0"),
    "tp2dp2-all": ((("tp", 2), ("dp", 2)), "all"),  # also: mesh dims in another order
    "dp2pp2": ((("pp", 2), ("dp", 2)), "tp0"),
    "cp4": ((("cp", 4),), "tp0"),
    "pp3": ((("pp", 3),), "tp0"),
    "pp3-all": ((("pp", 3),), "all"),
}
SCHEDULERS = sorted(available_schedulers()) + ["test_scatter"]  # "balanced", "dp_balanced" once merged


# --- worker side ---------------------------------------------------------------------------


def _matches(topo: Topology, where: dict | None) -> bool:
    return where is not None and all(topo.rank(axis) == value for axis, value in where.items())


def _scheduler(name: str):
    if name == "test_scatter":
        return ScatterScheduler()
    if name == "test_defer":
        return ScatterScheduler(defer_longest=True)
    if name == "test_broken":
        return BrokenScheduler()
    return name


def _summary(step) -> dict:
    return {
        "step": step.step,
        "M": step.num_microbatches,
        "fp": step.schedule_fingerprint,
        "loss_tokens": step.num_loss_tokens,
        "stats": step.stats.as_dict(),
        "assignment": [[ids.tolist() for ids in row] for row in step.schedule.assignment],
        "deferred": step.schedule.deferred.tolist(),
        "mbs": [batch_arrays(b) for b in step.microbatches],
        "bytes": dict(step.exchange_bytes),
    }


def _roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _wrapped(topo: Topology, cfg: dict):
    reads = cfg["data_owner"] == "all" or (topo.tp_rank == 0 and (topo.is_first_stage or topo.is_last_stage))
    if _matches(topo, cfg.get("flip_iterator_at")):
        reads = not reads
    count = cfg["items"]
    if isinstance(count, dict):
        count = count.get(topo.dp_rank, count["default"])
    seed = SEED + cfg.get("lane_seed_step", 0) * topo.cp_rank
    bad = cfg.get("bad") if _matches(topo, cfg.get("bad_at")) else None
    data = items(seed, topo.dp_rank, count, bad=bad) if reads else None
    return wrap_data_iterator(
        data,
        topo,
        samples_per_rank=cfg.get("spr", 6),
        max_tokens_per_rank=cfg.get("max_tokens", 96 // topo.cp_size if topo.cp_size > 1 else 48),
        scheduler=_scheduler(cfg["scheduler"]),
        data_owner=cfg["data_owner"],
        drop_last=cfg.get("drop_last", True),
        check_schedule=cfg.get("check", True),
        pad_multiple=cfg.get("pad_multiple"),
        on_oversize=cfg.get("on_oversize", "error"),
        cp_layout=cfg.get("cp_layout", "dualchunk"),
    )


def run_wrapper(layout, cfg: dict) -> dict:
    topo = mesh_topology(layout)
    out = {"rank": dist.get_rank(), "coords": topo.signature(), "steps": [], "error": None}
    try:
        it = _wrapped(topo, cfg)
        resume_at = cfg.get("resume_at")
        state = None
        for step in it:
            out["steps"].append(_summary(step))
            if len(out["steps"]) == resume_at:
                state = _roundtrip(it.state_dict())
                out["deferred_in_state"] = len(state[StateKey.DEFERRED_SAMPLES])
        out["dropped_at_end"] = it.dropped_at_end
        if resume_at is not None:
            fresh = _wrapped(topo, cfg)
            fresh.load_state_dict(state)
            out["resumed"] = [_summary(step) for step in fresh]
    except ValueError as exc:
        out["error"] = str(exc)
    return out


# --- checks in the test process ------------------------------------------------------------


def _sizes(layout) -> dict:
    sizes = {"dp": 1, "cp": 1, "tp": 1, "pp": 1}
    sizes.update(dict(layout))
    return sizes


def _check_run(results: list[dict], layout, cfg: dict) -> dict:
    """Check a whole run; returns what it saw (for the not-vacuous assertions)."""
    sizes = _sizes(layout)
    dp, cp, tp, pp = (sizes[a] for a in ("dp", "cp", "tp", "pp"))
    pm = cfg.get("pad_multiple") or pad_multiple_for(cp)
    errors = {r["rank"]: r["error"] for r in results if r["error"]}
    assert not errors, errors
    counts = {len(r["steps"]) for r in results}
    assert len(counts) == 1, f"ranks ran different numbers of steps: {counts}"
    by_coords = {tuple(r["coords"][f"{a}_rank"] for a in ("dp", "cp", "tp", "pp")): r for r in results}
    saw = {
        "padding": False,
        "multi_seq": False,
        "multi_mb": False,
        "filler": False,
        "sent": 0,
        "deferred": 0,
        "empty": 0,
    }
    seen_all = []
    for k in range(counts.pop()):
        steps = {c: r["steps"][k] for c, r in by_coords.items()}
        ref = steps[(0, 0, 0, 0)]
        for c, s in steps.items():  # every rank: same step, schedule and stats
            assert (s["step"], s["M"], s["fp"], s["assignment"]) == (
                ref["step"],
                ref["M"],
                ref["fp"],
                ref["assignment"],
            ), c
            assert s["stats"] == ref["stats"], c
            assert len(s["mbs"]) == ref["M"]
            assert s["loss_tokens"] == ref["loss_tokens"] and isinstance(s["loss_tokens"], int), c
        seen_step, padded_tokens, loss_tokens = [], 0, 0
        for d, t, p in itertools.product(range(dp), range(tp), range(pp)):
            middle = 0 < p < pp - 1
            for m in range(ref["M"]):
                parts = [steps[(d, c, t, p)]["mbs"][m] for c in range(cp)]
                for c, part in enumerate(parts):
                    assert (part["cp_size"], part["cp_rank"], part["cp_layout"]) == (
                        cp,
                        c,
                        cfg.get("cp_layout", "dualchunk"),
                    )
                    for name in ("cu_seqlens", "cu_seqlens_padded", "sample_ids"):  # global on every CP rank
                        assert np.array_equal(part[name], parts[0][name]), name
                cell = ref["assignment"][m][d]
                assert parts[0]["sample_ids"].tolist() == (cell if cell else [-1])
                # The whole microbatch's count, on every CP shard, TP copy and stage alike.
                assert {part["num_loss_tokens"] for part in parts} == {steps[(d, 0, 0, 0)]["mbs"][m]["num_loss_tokens"]}
                full = {name: parts[0][name] for name in ("cu_seqlens", "cu_seqlens_padded", "sample_ids")}
                full["max_seqlen"] = parts[0]["max_seqlen"]
                cu_padded = torch.from_numpy(parts[0]["cu_seqlens_padded"])
                for name in TOKEN_FIELDS:
                    if parts[0][name] is None:
                        full[name] = None
                        continue
                    shards = [torch.from_numpy(part[name]) for part in parts]
                    full[name] = (
                        unshard_from_cp(shards, cu_padded, cp, layout=cfg.get("cp_layout", "dualchunk")).numpy()
                        if cp > 1
                        else parts[0][name]
                    )
                if middle:  # metadata only, same layout as the first stage
                    assert all(full[name] is None for name in ("input_ids", "labels", "loss_mask"))
                    first = steps[(d, 0, t, 0)]["mbs"][m]
                    for c, part in enumerate(parts):
                        twin = steps[(d, c, t, 0)]["mbs"][m]
                        for name in ("position_ids", "seq_idx", "padding_mask", "cu_seqlens", "cu_seqlens_padded"):
                            assert np.array_equal(part[name], twin[name]), name
                        assert part["dtypes"] == {
                            n: v for n, v in twin["dtypes"].items() if n not in ("input_ids", "labels", "loss_mask")
                        }
                    assert full["max_seqlen"] == first["max_seqlen"]
                    continue
                seen = check_full_batch(full, SEED, pm)
                supervised = (full["labels"] != -100) & (full["loss_mask"] > 0)
                assert parts[0]["num_loss_tokens"] == int(supervised.sum())
                if t == 0 and p == 0:
                    loss_tokens += parts[0]["num_loss_tokens"]
                    seen_step += seen
                    padded_tokens += int(full["cu_seqlens_padded"][-1])
                    saw["padding"] |= bool(full["padding_mask"][: int(full["cu_seqlens"][-1])].any()) if seen else False
                    saw["multi_seq"] |= len(seen) > 1
                    saw["filler"] |= not seen
            # TP copies are identical, field by field.
            if t > 0:
                for c in range(cp):
                    for a, b in zip(steps[(d, c, t, p)]["mbs"], steps[(d, c, 0, p)]["mbs"], strict=True):
                        for name, value in a.items():
                            if isinstance(value, np.ndarray):
                                assert np.array_equal(value, b[name]) and value.dtype == b[name].dtype, name
                            else:
                                assert value == b[name], name
        # Stats are exact integers over the real lengths of the whole global batch.
        lengths = [n for _, n in seen_step]
        stats = ref["stats"]
        assert stats["seqlen_sum"] == sum(lengths) and stats["seqlen_sq_sum"] == sum(n * n for n in lengths)
        assert stats["num_sequences"] == len(lengths) and stats["padded_tokens"] == padded_tokens
        assert stats["num_microbatches"] == ref["M"]
        assert ref["loss_tokens"] == loss_tokens  # the global step: every replica, every microbatch
        spr, count = cfg.get("spr", 6), cfg["items"]
        held = [count.get(r, count["default"]) if isinstance(count, dict) else count for r in range(dp)]
        empties = sum(1 for r in range(dp) for i in range(k * spr, min((k + 1) * spr, held[r])) if i % EMPTY_EVERY == 7)
        assert stats["empty_samples"] == empties  # zero-length samples were dropped and counted
        saw["empty"] += empties
        saw["multi_mb"] |= ref["M"] > 1
        saw["deferred"] += len(ref["deferred"])
        saw["sent"] += sum(s["bytes"].get("sent", 0) for s in steps.values())
        seen_all += seen_step
    # Exactly once across replicas and steps; whatever is missing was dropped at the end.
    who = [w for w, _ in seen_all]
    assert len(who) == len(set(who)), "a sequence arrived twice"
    count = cfg["items"]
    expected = {}
    for r in range(dp):
        expected.update(
            expected_sequences(SEED, r, count.get(r, count["default"]) if isinstance(count, dict) else count)
        )
    assert set(who) <= set(expected)
    dropped = {r["dropped_at_end"] for r in results}
    assert len(dropped) == 1
    assert len(expected) - len(who) == dropped.pop()
    return saw


def _run(dist_pools, name, cfg):
    layout, owner = LAYOUTS[name]
    cfg = dict(cfg, data_owner=owner)
    world = int(np.prod([size for _, size in layout]))
    results = dist_pools.get(world).run(run_wrapper, layout, cfg)
    return layout, cfg, results


# --- tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dp2cp2", "cp4"])
def test_the_contiguous_cp_layout_arrives_cut_as_asked(dist_pools, name):
    cfg = {"scheduler": "balanced", "items": 18, "cp_layout": "contiguous"}
    layout, cfg, results = _run(dist_pools, name, cfg)
    saw = _check_run(results, layout, cfg)  # every shard is the contiguous slice; unsharded, every sequence once
    assert saw["padding"] and saw["multi_seq"]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_sequence_arrives_once_and_reassembles(dist_pools, name, scheduler):
    cfg = {"scheduler": scheduler, "items": 18}
    if _sizes(LAYOUTS[name][0])["cp"] == 1:
        cfg["pad_multiple"] = 4  # see padding without CP too
    layout, cfg, results = _run(dist_pools, name, cfg)
    saw = _check_run(results, layout, cfg)
    assert len(results[0]["steps"]) == 3
    assert saw["padding"] and saw["multi_seq"] and saw["multi_mb"] and saw["empty"]
    dp = _sizes(layout)["dp"]
    if scheduler == "test_scatter" and dp > 1:
        assert saw["sent"] > 0  # samples really crossed the wire
    if scheduler == "empty" and dp > 1:
        assert saw["sent"] == 0  # nothing moves when every sample stays on its replica
    if name in ("dp4", "dp2cp2") and scheduler == "empty":
        assert saw["filler"]  # an empty (microbatch, replica) cell got a padding-only batch


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_end_of_data_ends_every_rank_on_the_same_step(dist_pools, name, drop_last):
    # DP rank 1 (or the only replica) runs out in the middle of the fourth step.
    cfg = {"scheduler": "test_scatter", "items": {1: 20, "default": 24}, "drop_last": drop_last}
    if _sizes(LAYOUTS[name][0])["dp"] == 1:
        cfg["items"] = 20
    layout, cfg, results = _run(dist_pools, name, cfg)
    _check_run(results, layout, cfg)
    steps = len(results[0]["steps"])
    assert steps == (3 if drop_last else 4)
    assert all((r["dropped_at_end"] > 0) == drop_last for r in results)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_resume_reproduces_the_next_steps(dist_pools, name):
    cfg = {"scheduler": "test_defer", "items": 24, "resume_at": 2}
    if _sizes(LAYOUTS[name][0])["cp"] == 1:
        cfg["pad_multiple"] = 4
    layout, cfg, results = _run(dist_pools, name, cfg)
    _check_run(results, layout, cfg)
    for r in results:
        assert len(r["steps"]) == 4
        resumed = r["resumed"]
        assert len(resumed) == 2
        for a, b in zip(r["steps"][2:], resumed, strict=True):
            assert a["fp"] == b["fp"] and a["stats"] == b["stats"]
            for x, y in zip(a["mbs"], b["mbs"], strict=True):
                for key, value in x.items():
                    assert np.array_equal(value, y[key]) if isinstance(value, np.ndarray) else value == y[key]
    # Not vacuous: the readers saved a deferred sample in their state.
    assert sum(r.get("deferred_in_state", 0) for r in results) > 0


BAD_CASES = [
    # (layout, where the bad sample is, kind, expected message fragment)
    ("dp4", {"dp": 2}, "missing_input_ids", r"bad input on DP rank 2 .* has no 'input_ids'"),
    ("dp4", {"dp": 3}, "unequal_lengths", r"bad input on DP rank 3 .*'labels' has \d+ tokens but 'input_ids' has"),
    ("dp4", {"dp": 1}, "oversize", r"sample \d+ has 500 tokens.* capacity 48 tokens.*of DP rank 1's pool"),
    ("dp2cp2", {"dp": 1, "cp": 1}, "unequal_lengths", r"bad input on DP rank 1 \(global rank \d, dp=1/2 cp=1/2"),
    ("dp2tp2-tp0", {"dp": 1, "tp": 0}, "missing_input_ids", r"bad input on DP rank 1 .* tp=0/2"),
    ("tp2dp2-all", {"dp": 0, "tp": 1}, "unequal_lengths", r"bad input on DP rank 0 .* tp=1/2"),
    ("pp3", {"pp": 2}, "not_a_mapping", r"bad input on DP rank 0 .* pp=2/3.*must be a mapping"),
    ("cp4", {"cp": 2}, "missing_input_ids", r"bad input on DP rank 0 .* cp=2/4"),
]


@pytest.mark.parametrize("name, where, kind, message", BAD_CASES, ids=[f"{c[0]}-{c[2]}" for c in BAD_CASES])
def test_bad_input_on_one_rank_raises_the_same_error_everywhere(dist_pools, name, where, kind, message):
    cfg = {"scheduler": "test_scatter", "items": 18, "bad_at": where, "bad": {"index": 9, "kind": kind, "length": 500}}
    _, _, results = _run(dist_pools, name, cfg)
    errors = {r["error"] for r in results}
    assert len(errors) == 1 and None not in errors, errors  # all ranks, one message
    error = errors.pop()
    assert re.search(message, error), error
    assert all(len(r["steps"]) == 1 for r in results)  # the first step went through, the second failed


@pytest.mark.parametrize(
    "name, where, message",
    [
        (
            "dp2tp2-tp0",
            {"dp": 1, "tp": 1},
            r"rank \d \(dp=1/2 cp=0/1 tp=1/2 pp=0/1\) got a data_iterator but must not read",
        ),
        (
            "dp2tp2-tp0",
            {"dp": 0, "tp": 0},
            r"rank \d \(dp=0/2 cp=0/1 tp=0/2 pp=0/1\) got data_iterator=None but must read",
        ),
        (
            "pp3",
            {"pp": 1},
            r"rank 1 \(dp=0/1 cp=0/1 tp=0/1 pp=1/3\) got a data_iterator but must not read data \(data_owner='tp0'",
        ),
        ("tp2dp2-all", {"dp": 1, "tp": 1}, r"got data_iterator=None but must read data \(data_owner='all'"),
    ],
)
def test_wrong_iterator_ownership_is_named_on_every_rank(dist_pools, name, where, message):
    _, _, results = _run(dist_pools, name, {"scheduler": "empty", "items": 6, "flip_iterator_at": where})
    errors = {r["error"] for r in results}
    assert len(errors) == 1 and None not in errors, errors
    assert re.search(message, errors.pop())


@pytest.mark.parametrize("name", ["dp2tp2-tp0", "pp3", "dp2cp2"])
def test_a_scheduler_bug_reaches_every_rank_instead_of_stranding_receivers(dist_pools, name):
    _, _, results = _run(dist_pools, name, {"scheduler": "test_broken", "items": 6})
    errors = {r["error"] for r in results}
    assert len(errors) == 1 and None not in errors, errors
    assert "RuntimeError: index 7 out of bounds in a scheduler bug" in errors.pop()


@pytest.mark.parametrize("check", [True, False])
def test_schedule_check_catches_cp_lanes_reading_different_data(dist_pools, check):
    # CP lane 1 reads other data than lane 0: the lanes compute different schedules. The
    # comparison rides on the per-step status all-reduce, so it holds without check_schedule.
    cfg = {"scheduler": "test_scatter", "items": 12, "lane_seed_step": 1, "check": check}
    _, _, results = _run(dist_pools, "dp2cp2", cfg)
    errors = {r["error"] for r in results}
    assert len(errors) == 1 and None not in errors
    assert "ranks of the cp group disagree on schedules (fingerprints cp rank 0:" in errors.pop()


def test_mismatched_arguments_across_ranks_are_caught_at_construction(dist_pools):
    layout, _ = LAYOUTS["dp4"]
    results = dist_pools.get(4).run(run_mismatched, layout, {"max_tokens": {3: 64}})
    errors = set(results)
    assert len(errors) == 1
    assert "ranks of the dp group disagree on wrapper arguments" in errors.pop()


def run_mismatched(layout, cfg):
    topo = mesh_topology(layout)
    try:
        wrap_data_iterator(
            items(SEED, topo.dp_rank, 6),
            topo,
            samples_per_rank=6,
            scheduler=cfg.get("scheduler", "empty"),
            max_tokens_per_rank=cfg.get("max_tokens", {}).get(topo.dp_rank, 48),
            scheduler_options=cfg.get("options", {}).get(topo.dp_rank),
            cost=cfg.get("cost", {}).get(topo.dp_rank),
        )
    except ValueError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize(
    "cfg",
    [
        {"scheduler": "balanced", "options": {2: {"order": "pipeline"}}},
        {"scheduler": "balanced", "options": {1: {"locality": True}}},
        {"scheduler": "balanced", "cost": {0: CostModel(1.0, 0.5)}},
    ],
)
def test_ranks_with_other_scheduler_options_or_cost_are_caught_at_construction(dist_pools, cfg):
    layout, _ = LAYOUTS["dp4"]
    errors = set(dist_pools.get(4).run(run_mismatched, layout, cfg))
    assert len(errors) == 1
    assert "ranks of the dp group disagree on wrapper arguments" in errors.pop()


@pytest.mark.parametrize("name", ["dp4", "dp2cp2", "pp3"])
def test_one_rank_running_dry_without_drop_last_gives_one_partial_step_then_the_end(dist_pools, name):
    # DP rank 1 holds 20 items, the others 40: the step where rank 1 runs dry is yielded
    # (drop_last=False) and is the last one; the others' later data is never read, and no
    # sample that was read is lost (_check_run: each exactly once, nothing dropped).
    cfg = {"scheduler": "test_scatter", "items": {1: 20, "default": 40}, "drop_last": False}
    if _sizes(LAYOUTS[name][0])["dp"] == 1:
        cfg["items"] = 20
    layout, cfg, results = _run(dist_pools, name, cfg)
    steps = {len(r["steps"]) for r in results}
    assert steps == {4}
    assert all(r["dropped_at_end"] == 0 for r in results)
    sizes = _sizes(layout)
    if sizes["dp"] > 1:
        # Every rank read exactly as far as the last step: 4 steps of 6, except rank 1's 20.
        last = results[0]["steps"][-1]["stats"]
        assert last["num_sequences"] > 0
        cfg_exact = dict(cfg, items={1: 20, "default": 24})  # what was read: check exactly-once on it
        _check_run(results, layout, cfg_exact)


def run_failure_contract(layout, where):
    from seqpack.errors import ResumeError, StepFailed

    topo = mesh_topology(layout)
    reads = topo.tp_rank == 0 and (topo.is_first_stage or topo.is_last_stage)
    bad = {"index": 9, "kind": "missing_input_ids"} if _matches(topo, where) else None
    it = wrap_data_iterator(
        items(SEED, topo.dp_rank, 18, bad=bad) if reads else None,
        topo,
        samples_per_rank=6,
        max_tokens_per_rank=96 // topo.cp_size if topo.cp_size > 1 else 48,
        scheduler="empty",
    )
    next(it)
    out = {"rank": dist.get_rank()}
    try:
        next(it)
    except StepFailed as exc:
        out.update(message=str(exc), step=exc.step, failed_rank=exc.rank, cause=type(exc.__cause__).__name__)
    try:
        next(it)
    except StepFailed as exc:
        out["again"] = (str(exc), exc.step)
    try:
        it.state_dict()
    except ResumeError as exc:
        out["state"] = str(exc)
    return out


@pytest.mark.parametrize("name, where", [("dp4", {"dp": 2}), ("dp2tp2-tp0", {"dp": 1, "tp": 0}), ("pp3", {"pp": 2})])
def test_step_failed_names_step_and_rank_everywhere_and_the_iterator_refuses_to_continue(dist_pools, name, where):
    layout, _ = LAYOUTS[name]
    sizes = _sizes(layout)
    results = dist_pools.get(sizes["dp"] * sizes["cp"] * sizes["tp"] * sizes["pp"]).run(
        run_failure_contract, layout, where
    )
    assert len({r["message"] for r in results}) == 1
    assert {r["step"] for r in results} == {1}
    failed = {r["failed_rank"] for r in results}
    assert len(failed) == 1
    culprit = failed.pop()
    # The original exception is the __cause__ on the failing rank only.
    assert [r["rank"] for r in results if r["cause"] == "SampleError"] == [culprit]
    assert all(r["cause"] == "NoneType" for r in results if r["rank"] != culprit)
    for r in results:
        assert "cannot continue" in r["again"][0] and r["again"][1] == 1
        assert "failed at step 1" in r["state"]
