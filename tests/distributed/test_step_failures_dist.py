"""A step that fails on one rank fails on every rank, the same way (gloo, 4 ranks).

A fault is injected in one phase of step 1 on one rank (read, gather, schedule, exchange,
pack, broadcast, delivery; a phase holding a collective fails after it, or in the local work
before it that it guards), under dynamic CP, static CP, plain DP and TP: every rank raises one
``StepFailed`` with the same message, naming the failing rank and phase, and none hangs (the
pool call has a timeout). Also: grouped sequences under dynamic CP with mini-batches, where a
replica's block runs an empty microbatch (issue 39)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from dynamic_cp_data import SPR, samples_of
from harness import RankFailure
from wrapper_data import mesh_topology

from seqpack.collective import broadcast, exchange
from seqpack.errors import StepFailed
from seqpack.loader import cp_mode, phases, producer, wrap_data_iterator
from seqpack.loader.step import DeviceCopy

LAYOUTS = {
    "dynamic": (("dp", 2), ("cp", 2)),
    "static": (("dp", 2), ("cp", 2)),
    "dp": (("dp", 4),),
    "tp": (("dp", 2), ("tp", 2)),
    "pp": (("pp", 2), ("dp", 2)),
    "pp4": (("pp", 4),),
}


def _failing(original: Callable[..., Any], *, after: bool) -> Callable[..., Any]:
    """``original`` that raises on its second call (step 1), before or after running."""
    calls = [0]

    def call(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] != 2:
            return original(*args, **kwargs)
        if after:
            original(*args, **kwargs)
        raise RuntimeError("injected fault")

    return call


# phase -> (what the message names it by, the object and attribute patched, fail after the call)
FAULTS: dict[str, tuple[str, Any, str, bool]] = {
    "read": ("bad input", phases.Reader, "read", False),
    "gather": ("gather failed", phases, "gather_lengths", True),
    "schedule": ("schedule failed", phases, "schedule", False),
    "exchange": ("exchange failed", exchange, "_Source", False),
    "pack": ("packing failed", cp_mode.CpMode, "pack", False),
    "broadcast": ("broadcast failed", producer, "broadcast_tp", True),
    "pp broadcast": ("broadcast failed", producer, "broadcast_pp", True),
    "encode": ("broadcast failed", broadcast, "encode_step", False),
    "delivery": ("delivery failed", DeviceCopy, "place", False),
}


@contextlib.contextmanager
def _fault(phase: str | None) -> Iterator[None]:
    if phase is None:
        yield
        return
    _, owner, name, after = FAULTS[phase]
    with mock.patch.object(owner, name, _failing(getattr(owner, name), after=after)):
        yield


def run_faults(layout: str, cases: list[tuple[str, int]]) -> list[list[str]]:
    """Per case, this rank's outcome of steps 0..2 with ``phase`` failing on global rank ``rank``."""
    topo = mesh_topology(LAYOUTS[layout])
    me = dist.get_rank()
    out = []
    for phase, rank in cases:
        seen: list[str] = []
        reads = topo.tp_rank == 0 and not topo.is_middle_stage
        data = iter(samples_of(topo.dp_rank, steps=3, long=30)) if reads else None
        it = wrap_data_iterator(
            data, topo, samples_per_rank=SPR, max_tokens_per_rank=48, dynamic_cp=layout == "dynamic"
        )
        with _fault(phase if rank == me else None), it:
            for _ in range(3):
                try:
                    seen.append(f"ok {len(next(it).microbatches)}")
                except StepFailed as exc:
                    seen.append(f"StepFailed rank={exc.rank}: {exc}")
                    break
        out.append(seen)
    return out


def _cases(layout: str) -> list[tuple[str, int]]:
    """(phase, failing global rank): each phase on two ranks, every rank failing some phase."""
    if layout == "tp":  # the broadcast's source is TP rank 0, its receivers TP rank 1
        return [("broadcast", 1), ("broadcast", 3), ("encode", 0), ("encode", 2), ("delivery", 1), ("read", 2)]
    if layout == "pp4":  # stages 0 and 3 read, 1 and 2 receive the first stage's layout
        edges = [(p, r) for p in ("read", "gather", "schedule", "pack") for r in (0, 3)]
        return [*edges, ("pp broadcast", 1), ("pp broadcast", 2), ("encode", 0), ("delivery", 2)]
    return [(p, r) for i, p in enumerate(list(FAULTS)[:5] + ["delivery"]) for r in ((i + 1) % 4, (i + 3) % 4)]


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_fault_in_any_phase_fails_every_rank_alike(dist_pools, layout):
    cases = _cases(layout)
    try:
        results = dist_pools.get(4).run(run_faults, layout, cases, timeout=60)
    except RankFailure as exc:  # a hang (Timeout) or an exception other than StepFailed
        pytest.fail(f"{layout}: {exc}")
    for c, (phase, rank) in enumerate(cases):
        seen = [r[c] for r in results]
        assert all(s == seen[0] for s in seen), (layout, phase, rank, seen)  # one agreed outcome
        assert seen[0][0].startswith("ok"), seen[0]  # step 0 ran: the fault is step 1's
        failed = seen[0][1]
        name = FAULTS[phase][0]
        assert failed.startswith(f"StepFailed rank={rank}:") and f"global rank {rank}" in failed, (phase, failed)
        assert name in failed and "injected fault" in failed, (phase, failed)


# -- grouped sequences under dynamic CP with mini-batches ------------------------------------


def run_grouped_minibatches() -> list[list[tuple[int, list[int], int]]]:
    """DP rank 0's first two samples of every step are a group; every step's microbatches:
    (cp size, cu_seqlens_padded, sequences)."""
    topo = mesh_topology(LAYOUTS["dynamic"])
    data = samples_of(topo.dp_rank, steps=2, long=30)
    if topo.dp_rank == 0:
        for i in range(len(data)):
            if i % SPR < 2:
                data[i] = {**data[i], "group_id": torch.tensor(i // SPR)}
    it = wrap_data_iterator(iter(data), topo, samples_per_rank=SPR, max_tokens_per_rank=48, dynamic_cp=True,
                            minibatches=2)  # fmt: skip
    with it:
        return [
            [(mb.cp_size, mb.cu_seqlens_padded.tolist(), int((mb.sample_ids >= 0).sum())) for mb in step.microbatches]
            for step in it
        ]


def test_grouped_minibatches_under_dynamic_cp(dist_pools):
    """The group runs on one replica's 2-rank block while the other replica's block runs a
    padding-only microbatch: padded for its 2 ranks (it had dynamic CP's one-rank multiple,
    and packing failed on that replica's ranks only)."""
    results = dist_pools.get(4).run(run_grouped_minibatches, timeout=60)
    assert all(len(steps) == 2 for steps in results)
    fillers = 0
    for steps in results:
        for batches in steps:
            for cp_size, cu, count in batches:
                assert cp_size == 1 or all(v % (2 * cp_size) == 0 for v in cu), (cp_size, cu)
                fillers += cp_size == 2 and count == 0
    assert fillers  # not vacuous: a 2-rank block ran an empty microbatch
