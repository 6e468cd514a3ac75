"""Issue 24 on gloo (dp=2): ranks that differ in prefetch with validate_ranks=False and under
calibration, in who passes wrapper_groups, Ctrl-C inside one rank's data iterator, and a one-rank topology
among several initialised ranks. One pool call runs every case (a pool costs seconds)."""

from __future__ import annotations

import logging

import torch.distributed as dist
from test_wrapper_dist import SEED
from wrapper_data import items, mesh_topology

from seqpack._logging import reset_warn_once
from seqpack.calibrate import CostCalibrator
from seqpack.cost import CostModel
from seqpack.loader import wrap_data_iterator
from seqpack.topology import Topology

DP2 = (("dp", 2),)


def _wrap(topo, data, **kwargs):
    kwargs.setdefault("samples_per_rank", 6)
    kwargs.setdefault("max_tokens_per_rank", 48)
    kwargs.setdefault("pad_multiple", 4)
    return wrap_data_iterator(data, topo, **kwargs)


def _steps(it) -> list[tuple[int, int, list[int]]]:
    return [(s.step, s.num_microbatches, [b.num_tokens for b in s.microbatches]) for s in it]


def _outcome(call) -> str:
    try:
        call()
    except BaseException as exc:  # noqa: BLE001 - the type is part of the answer
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def _interrupted(topo, k: int) -> list[str]:
    """Rank 0's data iterator raises KeyboardInterrupt at its 8th sample (step 1)."""

    def data():
        for index, item in enumerate(items(SEED, topo.dp_rank, 40)):
            if topo.dp_rank == 0 and index == 7:
                raise KeyboardInterrupt
            yield item

    it = _wrap(topo, data(), prefetch=k)
    seen = [_outcome(lambda: next(it)) for _ in range(3)]
    seen.append(_outcome(it.state_dict))
    it.close()
    return seen


def _warnings(make_topology) -> list[str]:
    reset_warn_once()
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("seqpack")
    logger.addHandler(handler)
    try:
        topo = make_topology()
        it = _wrap(topo, items(SEED, dist.get_rank(), 12), prefetch=0)
        counts = [s.num_microbatches for s in it]
    finally:
        logger.removeHandler(handler)
    assert counts  # not vacuous: the wrapper ran
    return [r.getMessage() for r in records if r.levelno >= logging.WARNING]


def run_cases():
    topo = mesh_topology(DP2)
    rank = dist.get_rank()
    out = {}
    # Ranks that differ in prefetch without the settings' comparison: the same steps as one value.
    out["same"] = _steps(_wrap(topo, items(SEED, topo.dp_rank, 30), prefetch=0, validate_ranks=False))
    out["mixed"] = _steps(_wrap(topo, items(SEED, topo.dp_rank, 30), prefetch=(0, 2)[rank], validate_ranks=False))
    # Under calibration the prefetch depth decides which steps' times ride each gather: ranks that
    # differ in it send the deepest rank's (a WireError on one rank and SIGABRT on the other before).
    for name, depths in (("calibrated_same", (2, 2)), ("calibrated_mixed", (0, 2))):
        calibrator = CostCalibrator(CostModel(1e-4, 1e-7, 1e-3), min_points=4, warmup_steps=0)
        data = items(SEED, topo.dp_rank, 36)
        it = _wrap(topo, data, prefetch=depths[rank], calibrate=calibrator, scheduler="balanced")
        fingerprints = []
        for step in it:
            step.record_times([1e-3 + 1e-4 * b.num_tokens + 1e-6 * b.num_tokens**2 for b in step.microbatches])
            fingerprints.append((step.schedule_fingerprint, step.stats.calibrated))
        out[name] = fingerprints
    # wrapper_groups on one rank only: one error everywhere, before any step.
    groups = topo if rank == 0 else None
    for validate in (True, False):
        out[f"groups_{validate}"] = _outcome(
            lambda v=validate: _wrap(topo, items(SEED, topo.dp_rank, 12), wrapper_groups=groups, validate_ranks=v)
        )
    # A bad argument on one rank with validate_ranks=False: the same error on both, no hang.
    out["bad_arg"] = _outcome(
        lambda: _wrap(topo, items(SEED, topo.dp_rank, 12), pin_memory=(False, "yes")[rank], validate_ranks=False)
    )
    for k in (0, 1):
        out[f"interrupted_{k}"] = _interrupted(topo, k)
    out["warn_bare"] = _warnings(Topology)
    out["warn_allowed"] = _warnings(lambda: Topology.single(allow_distributed=True))
    out["warn_mesh"] = _warnings(lambda: topo)
    return out


def test_prefetch_groups_interrupts_and_alone_across_ranks(dist_pools):
    results = dist_pools.get(2).run(run_cases)
    for rank, out in enumerate(results):
        assert len(out["same"]) >= 3 and out["mixed"] == out["same"], rank
        assert out["calibrated_mixed"] == out["calibrated_same"], rank
        assert any(calibrated for _, calibrated in out["calibrated_same"])  # not vacuous: a fitted model was used
        for validate in (True, False):
            assert out[f"groups_{validate}"] == results[0][f"groups_{validate}"]
            assert "ConfigError: wrapper_groups was passed on some ranks and not on others" in out[f"groups_{validate}"]
        assert out["bad_arg"] == results[0]["bad_arg"] and "pin_memory" in out["bad_arg"], out["bad_arg"]
        for k in (0, 1):
            first, again, third, state = out[f"interrupted_{k}"]
            assert first == "ok", first  # step 0 is delivered
            if rank == 0:
                assert again == "KeyboardInterrupt: ", (k, again)  # Ctrl-C stays Ctrl-C where it happened
            else:
                assert again.startswith("StepFailed: bad input on DP rank 0") and "at step 1" in again, (k, again)
                assert again.endswith("KeyboardInterrupt"), again
            assert third.startswith("StepFailed: this iterator failed at step 1 and cannot continue"), third
            assert "step -1" not in third and "KeyboardInterrupt" in third, third
            assert state.startswith("ResumeError"), state
        assert len(out["warn_bare"]) == 1 and "one-rank topology on rank" in out["warn_bare"][0], out["warn_bare"]
        assert out["warn_allowed"] == [] and out["warn_mesh"] == []
