"""Prefetch on gloo process groups: steps prepared by the background thread are the same as
the synchronous wrapper's (dp=2, dp=2 x cp=2, dp=2 x tp=2, pp=3) while the main thread runs
collectives of its own on the topology's groups; errors arrive with the step they belong to,
identically on every rank; resume across prefetch depths; close() mid-run, with a peer that
hangs and with a peer that was killed, returns in bounded time and the process exits.
"""

from __future__ import annotations

import os
import queue
import re
import tempfile
import threading
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
from test_wrapper_dist import SEED, _check_run, _roundtrip, _scheduler, _summary
from wrapper_data import items, mesh_topology, wait_until

from seqpack.loader import wrap_data_iterator
from seqpack.loader.resume import StateKey
from seqpack.topology import Topology

LAYOUTS = {
    "dp2": ((("dp", 2),), "tp0"),
    "dp2cp2": ((("dp", 2), ("cp", 2)), "tp0"),
    "dp2tp2-tp0": ((("dp", 2), ("tp", 2)), "tp0"),
    "pp3": ((("pp", 3),), "tp0"),
}
DEPTHS = (0, 1, 3)


def _world(layout) -> int:
    return int(np.prod([size for _, size in layout]))


# --- worker side ---------------------------------------------------------------------------


class Counted:
    """The rank's data, counting what the wrapper has pulled (the thread reads ahead)."""

    def __init__(self, data):
        self.data, self.pulled = data, 0

    def __iter__(self):
        for item in self.data:
            self.pulled += 1
            yield item


def _reads(topo: Topology, owner: str) -> bool:
    return owner == "all" or (topo.tp_rank == 0 and (topo.is_first_stage or topo.is_last_stage))


def _wrap(topo: Topology, owner: str, k: int, count: int, bad=None, **kwargs):
    data = Counted(items(SEED, topo.dp_rank, count, bad=bad)) if _reads(topo, owner) else None
    it = wrap_data_iterator(
        data,
        topo,
        samples_per_rank=6,
        max_tokens_per_rank=96 // topo.cp_size if topo.cp_size > 1 else 48,
        scheduler=_scheduler(kwargs.pop("scheduler", "test_defer")),
        data_owner=owner,
        pad_multiple=None if topo.cp_size > 1 else 4,
        prefetch=k,
        **kwargs,
    )
    return it, data


def _model_collective(topo: Topology) -> None:
    # A training stand-in on the main thread: collectives on the topology's (the model's)
    # groups while the wrapper's thread runs its own on the wrapper's groups.
    for axis in ("dp", "cp", "tp", "pp"):
        if topo.size(axis) > 1:
            value = torch.ones(3)
            dist.all_reduce(value, group=topo.group(axis))
            assert value.tolist() == [topo.size(axis)] * 3


def run_depths(layout, owner):
    topo = mesh_topology(layout)
    out = {"rank": dist.get_rank(), "coords": topo.signature(), "runs": {}, "read_ahead": None}
    for k in DEPTHS:
        it, data = _wrap(topo, owner, k, 30)
        axes = [a for a in ("dp", "cp", "tp", "pp") if topo.size(a) > 1]
        own = [it._comm.group(a) is not topo.group(a) for a in axes]
        assert all(own) if k else not any(own), (k, own)  # prefetch runs on groups of its own
        steps = []
        for step in it:
            steps.append(_summary(step))
            if len(steps) == 1 and k == 3 and data is not None:
                # Not vacuous: the thread reads the next three steps while we wait here.
                out["read_ahead"] = wait_until(lambda data=data: data.pulled >= 24, timeout=20.0)
            _model_collective(topo)
        out["runs"][k] = steps
        out["dropped_at_end"] = it.dropped_at_end
    # Resume across depths: save after two steps under k=3 (more are prepared), resume with k=1.
    it, _ = _wrap(topo, owner, 3, 30)
    next(it), next(it)
    time.sleep(0.05)
    state = _roundtrip(it.state_dict())
    out["state_steps"], out["state_deferred"] = state[StateKey.STEPS], len(state[StateKey.DEFERRED_SAMPLES])
    it.close()
    resumed, _ = _wrap(topo, owner, 1, 30)
    resumed.load_state_dict(state)
    out["resumed"] = [_summary(step) for step in resumed]
    return out


def _same(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert (x["step"], x["M"], x["fp"], x["assignment"], x["deferred"]) == (
            y["step"],
            y["M"],
            y["fp"],
            y["assignment"],
            y["deferred"],
        )
        assert x["stats"] == y["stats"] and x["bytes"] == y["bytes"]
        for p, q in zip(x["mbs"], y["mbs"], strict=True):
            for key, value in p.items():
                assert np.array_equal(value, q[key]) if isinstance(value, np.ndarray) else value == q[key], key


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_prefetch_depths_give_identical_steps_and_resume_across_depths(dist_pools, name):
    layout, owner = LAYOUTS[name]
    results = dist_pools.get(_world(layout)).run(run_depths, layout, owner)
    for r in results:
        reference = r["runs"][0]
        assert len(reference) == 5
        for k in DEPTHS[1:]:
            _same(r["runs"][k], reference)
        _same(r["runs"][3][:2] + r["resumed"], reference)
        assert r["state_steps"] == 2
    readers = [r for r in results if r["read_ahead"] is not None]
    assert readers and all(r["read_ahead"] for r in readers)
    # Everything that arrived is right (the synchronous checks, on the k=3 run).
    cfg = {"items": 30, "data_owner": owner, "pad_multiple": None if dict(layout).get("cp", 1) > 1 else 4}
    _check_run([dict(r, steps=r["runs"][3], error=None) for r in results], layout, cfg)
    assert sum(r["state_deferred"] for r in results) > 0  # not vacuous: deferred samples were saved


def run_error(layout, owner, where, index, k):
    from seqpack.errors import StepFailed

    topo = mesh_topology(layout)
    bad = {"index": index, "kind": "missing_input_ids"} if all(topo.rank(a) == v for a, v in where.items()) else None
    it, _ = _wrap(topo, owner, k, 30, bad=bad, scheduler="empty")
    out = {"rank": dist.get_rank(), "steps": [], "error": None}
    try:
        for step in it:
            out["steps"].append(step.step)
            _model_collective(topo)
    except StepFailed as exc:
        out.update(error=str(exc), step=exc.step, failed_rank=exc.rank, cause=type(exc.__cause__).__name__)
    out["thread_alive"] = it._bg.prefetcher._thread.is_alive() if it._bg.prefetcher else None
    out["groups_left"] = len(it._bg.groups)
    return out


@pytest.mark.parametrize(
    "name, where, index, k",
    [
        ("dp2", {"dp": 1}, 9, 2),  # step 1 fails while steps 2-3 would be prepared
        ("dp2tp2-tp0", {"dp": 0, "tp": 0}, 14, 3),  # step 2; crosses the TP broadcast
        ("pp3", {"pp": 2}, 9, 1),  # the last stage's data; crosses the PP agreement
    ],
)
def test_an_error_mid_run_arrives_with_its_step_identically_on_every_rank(dist_pools, name, where, index, k):
    layout, owner = LAYOUTS[name]
    results = dist_pools.get(_world(layout)).run(run_error, layout, owner, where, index, k)
    failed_step = index // 6
    assert len({r["error"] for r in results}) == 1 and results[0]["error"]
    assert re.search(r"bad input on DP rank \d .* has no 'input_ids'", results[0]["error"])
    for r in results:
        assert r["steps"] == list(range(failed_step)) and r["step"] == failed_step
        assert r["thread_alive"] is False and r["groups_left"] == 0  # a failed iterator releases both
    culprits = [r["rank"] for r in results if r["cause"] == "SampleError"]
    assert culprits == [results[0]["failed_rank"]]


def run_close_and_rebuild(layout, owner):
    topo = mesh_topology(layout)
    it, _ = _wrap(topo, owner, 2, 60)
    next(it), next(it)
    groups = list(it._bg.groups)
    assert groups
    tick = time.perf_counter()
    it.close()
    seconds = time.perf_counter() - tick
    gone = all(g not in dist.distributed_c10d._world.pg_map for g in groups)
    # A new iterator creates new groups after the old ones are gone, alike on every rank.
    again, _ = _wrap(topo, owner, 2, 18)
    steps = [s.step for s in again]
    # Users may bring their own groups (here: the topology's, which this loop never uses
    # concurrently); the wrapper then creates none for its collectives, only the model's
    # plane group Step.to_origin runs on (dp and cp both above 1).
    own, _ = _wrap(topo, owner, 2, 18, wrapper_groups=topo)
    assert own._bg.groups == own.cp_groups.owned() and own._comm.group("dp") is topo.group("dp")
    assert len(own.cp_groups.owned()) == (topo.dp_size > 1 and topo.cp_size > 1)
    own_steps = [s.step for s in own]
    return {
        "seconds": seconds,
        "alive": it._bg.prefetcher._thread.is_alive(),
        "gone": gone,
        "steps": steps,
        "own_steps": own_steps,
    }


def test_close_mid_run_stops_the_thread_and_frees_the_groups(dist_pools):
    layout, owner = LAYOUTS["dp2cp2"]
    results = dist_pools.get(4).run(run_close_and_rebuild, layout, owner)
    for r in results:
        assert r["seconds"] < 10 and not r["alive"] and r["gone"]
        assert r["steps"] == r["own_steps"] == [0, 1, 2]


def run_bad_groups(layout, case):
    topo = mesh_topology(layout)
    try:
        if case == "swapped":
            groups = {"dp": topo.group("cp"), "cp": topo.group("dp")}
            _wrap(topo, "tp0", 1, 6, wrapper_groups=groups)
        else:  # a topology over half the world: refused, and under prefetch even when chosen
            me = dist.get_rank()
            halves = [dist.new_group([0, 1]), dist.new_group([2, 3])]
            half = Topology.from_groups(dp=halves[me // 2], world_size=2, partial=case == "half_partial")
            _wrap(half, "tp0", 1, 6)
    except ValueError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize(
    "case, message",
    [
        ("swapped", r"the dp group given has ranks \[\d, \d\] but the topology's dp group has \[\d, \d\]"),
        ("half", r"the topology spans 2 of the 4 initialised ranks \(.*\): the ranks outside it pack their own"),
        ("half_partial", r"\(partial=True\): prefetch=1 runs on process groups .* pass wrapper_groups"),
    ],
)
def test_wrong_wrapper_groups_are_named_on_every_rank(dist_pools, case, message):
    errors = set(dist_pools.get(4).run(run_bad_groups, LAYOUTS["dp2cp2"][0], case))
    assert len(errors) == 1 and None not in errors, errors
    assert re.search(message, errors.pop())


# --- a peer that hangs or dies: separate processes (the pool's workers must stay healthy) ---


def _peer(rank, world, store_path, scenario, results):
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    topo = Topology.from_groups(dp=dist.group.WORLD)
    report = {"rank": rank}
    if scenario == "hang":
        stuck = threading.Event()

        def data():  # rank 2's data hangs at its second step (its thread waits in user code)
            for i, item in enumerate(items(SEED, rank, 60)):
                if rank == 2 and i == 6:
                    stuck.wait(120)
                yield item

        it = wrap_data_iterator(
            data(), topo, samples_per_rank=6, max_tokens_per_rank=48, scheduler="empty", prefetch=1, group_timeout=60
        )
        next(it)
        time.sleep(3.0)  # the threads of ranks 0 and 1 now wait for rank 2 in step 1's gather (slack for a loaded CI)
        prefetcher = it._bg.prefetcher  # stuck: alive, and step 1 never became ready
        report["stuck"] = prefetcher._thread.is_alive() and not prefetcher._ready
        if rank != 1:  # rank 1 leaves without close(): interpreter exit must not hang either
            tick = time.perf_counter()
            it.close(timeout=1.0)
            report["close_seconds"] = time.perf_counter() - tick
    else:  # "kill": rank 1 dies after the first step; rank 0's next() must raise, not hang
        it = wrap_data_iterator(
            items(SEED, rank, 60),
            topo,
            samples_per_rank=6,
            max_tokens_per_rank=48,
            scheduler="empty",
            prefetch=2,
            group_timeout=60,
        )
        next(it)
        if rank == 1:
            os._exit(3)
        tick = time.perf_counter()
        try:
            for _ in range(8):
                next(it)
        except Exception as exc:  # the gloo failure of the step being prepared
            report["error"] = f"{type(exc).__name__}: {exc}"[:300]
        report["error_seconds"] = time.perf_counter() - tick
        tick = time.perf_counter()
        it.close(timeout=5.0)
        report["close_seconds"] = time.perf_counter() - tick
    results.put(report)
    report_time = time.perf_counter()
    results.put({"rank": rank, "exiting": report_time})


def test_close_and_exit_are_bounded_when_a_peer_hangs_or_dies():
    """ "hang" runs in spawned interpreters, whose exit is the interpreter's own (atexit, the
    daemon threads at shutdown); "kill", whose rank 0 exits after its thread has ended, in
    processes from the test fork server (torch already imported: seconds less)."""
    import torch.multiprocessing as mp
    from harness import context

    contexts = {"hang": mp.get_context("spawn"), "kill": context()}
    queues = {scenario: ctx.Queue() for scenario, ctx in contexts.items()}
    procs = {}
    with tempfile.TemporaryDirectory(prefix="seqpack-peer-") as tmp:
        for scenario, world in (("hang", 3), ("kill", 2)):
            store = os.path.join(tmp, f"store-{scenario}")
            ctx, results = contexts[scenario], queues[scenario]
            procs[scenario] = [
                ctx.Process(target=_peer, args=(r, world, store, scenario, results), daemon=True) for r in range(world)
            ]
        for group in procs.values():
            for p in group:
                p.start()
        reports = []
        deadline = time.monotonic() + 120
        for scenario, expected in (("hang", 3 * 2), ("kill", 1 * 2)):  # hang: 3 ranks x 2 reports; kill: rank 0's 2
            try:
                for _ in range(expected):
                    reports.append(queues[scenario].get(timeout=max(1.0, deadline - time.monotonic())))
            except queue.Empty:
                pass
        exited = {}
        for scenario, group in procs.items():
            for rank, p in enumerate(group):
                p.join(timeout=max(1.0, deadline - time.monotonic()))
                exited[(scenario, rank)] = p.exitcode
                if p.is_alive():
                    p.kill()
                    p.join()
    # Every process ended on its own: no hang at interpreter exit with a thread stuck in a
    # collective (hang: ranks 0, 1) or in user code (hang: rank 2).
    assert exited == {("hang", 0): 0, ("hang", 1): 0, ("hang", 2): 0, ("kill", 0): 0, ("kill", 1): 3}, exited
    done = [r for r in reports if "exiting" not in r]
    hang = sorted((r for r in done if "stuck" in r), key=lambda r: r["rank"])
    assert [r["rank"] for r in hang] == [0, 1, 2]
    assert all(r["stuck"] for r in hang)  # not vacuous: the threads were stuck
    assert all(r["close_seconds"] < 5 for r in hang if r["rank"] != 1)
    (kill,) = [r for r in done if "error_seconds" in r]
    assert "error" in kill and kill["error_seconds"] < 30, kill  # raised by next(), no hang
    assert kill["close_seconds"] < 10  # close(timeout=5.0) plus slack for a loaded machine


# --- the producer's collectives can be abandoned -----------------------------------------------


def _abandon_case():
    import datetime

    from seqpack.collective.groups import CollectiveAbandoned, abandonable, collective

    rank = dist.get_rank()
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=60))
    out = {}
    total = torch.tensor([rank + 1])
    with abandonable(lambda: False):  # polled, and completes like a blocking one
        collective(dist.all_reduce, total, group=group)
    out["sum"] = int(total)
    dist.barrier()
    if rank == 0:  # rank 1 joins 3 s late: rank 0 leaves when asked, after 0.3 s
        deadline = time.monotonic() + 0.3
        tick = time.monotonic()
        try:
            with abandonable(lambda: time.monotonic() > deadline):
                collective(dist.all_reduce, torch.zeros(1), group=group)
            out["left"] = None
        except CollectiveAbandoned as exc:
            out["left"] = (time.monotonic() - tick, str(exc))
    else:
        time.sleep(3.0)
        collective(dist.all_reduce, torch.zeros(1), group=group)  # completes rank 0's op
    dist.barrier()
    dist.destroy_process_group(group)
    return out


def test_a_polled_collective_completes_and_can_be_abandoned(dist_pools):
    zero, one = dist_pools.get(2).run(_abandon_case)
    assert zero["sum"] == one["sum"] == 3
    seconds, message = zero["left"]
    assert 0.3 <= seconds < 2.0, seconds
    assert "all_reduce left unfinished" in message


# --- ranks that differ in prefetch, or disagree on a setting -------------------------------


def run_mixed_depths(layout, owner):
    topo = mesh_topology(layout)
    mine = (0, 2)[dist.get_rank() % 2]
    runs = {}
    for name, k in (("same", 0), ("mixed", mine)):
        it, _ = _wrap(topo, owner, k, 30)
        runs[name] = [_summary(step) for step in it]
        runs[name + "_own_groups"] = any(
            it._comm.group(a) is not topo.group(a) for a in ("dp", "cp") if topo.size(a) > 1
        )
    return runs


@pytest.mark.parametrize("name", ["dp2", "dp2cp2"])
def test_ranks_may_differ_in_prefetch(dist_pools, name):
    layout, owner = LAYOUTS[name]
    results = dist_pools.get(_world(layout)).run(run_mixed_depths, layout, owner)
    for runs in results:
        assert len(runs["same"]) >= 3  # not vacuous
        _same(runs["mixed"], runs["same"])
        assert runs["mixed_own_groups"] and not runs["same_own_groups"]  # one rank prefetching: every rank's groups


def run_disagreeing_setting():
    topo = mesh_topology((("dp", 2),))
    try:
        wrap_data_iterator(
            items(SEED, topo.dp_rank, 12), topo, samples_per_rank=6 + topo.dp_rank, max_tokens_per_rank=48
        )
    except Exception as exc:  # noqa: BLE001 - the type is part of the answer
        return type(exc).__name__, str(exc)
    return None


def run_bad_type_on_one_rank():
    topo = mesh_topology((("dp", 2),))
    try:
        wrap_data_iterator(
            items(SEED, topo.dp_rank, 12), topo, samples_per_rank=6, max_tokens_per_rank=48,
            prefetch=1.5 if topo.dp_rank == 1 else 1,
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc)
    return None


def test_ranks_disagreeing_on_a_setting_are_told_which_and_the_values(dist_pools):
    results = dist_pools.get(2).run(run_disagreeing_setting)
    assert results[0] == results[1]
    kind, message = results[0]
    assert kind == "ConfigError"
    assert "samples_per_rank: 6 on dp rank 0, 7 on dp rank 1" in message, message


def test_a_wrong_type_on_one_rank_is_a_type_error_on_every_rank(dist_pools):
    results = dist_pools.get(2).run(run_bad_type_on_one_rank)
    assert results[0] == results[1]
    kind, message = results[0]
    assert kind == "SeqpackTypeError" and "prefetch must be" in message and "1.5" in message, results
