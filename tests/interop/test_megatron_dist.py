"""Megatron-LM's own ``wrap_data_iterator`` with seqpack's scheduler installed, on gloo ranks
laid out by Megatron's ``parallel_state``: dp=2, dp=2 x cp=2, dp=2 x tp=2, and pp=2 with VPP,
then the five layouts of Megatron's own ``test_wrap_dataloader`` (tests/unit_tests/
test_sequence_packing.py) on 8 ranks, its checks (keys, counts, tokens kept) subsumed by these
(skipped where Megatron is not installed: tests/interop/megatron_venv.sh).

Megatron's packing path hard-codes CUDA (at d98e8a64dd): data_schedule.py:705
(``wrap_data_iterator``'s ``dev = torch.cuda.current_device()``) and data_schedule_utils.py:113,
125, 149 (``.cuda()`` in ``_get_global_seqlens_and_ids``), 486, 491, 512
(``torch.cuda.current_device()`` in ``reroute_samples_to_dcp_ranks``) and 608
(``get_batch_and_global_seqlens``). :func:`cuda_on_cpu` points exactly those two calls at the
CPU while a rank runs, so every line of Megatron's ``run`` runs unchanged on gloo.

Checked on every rank: the microbatch count is agreed and a multiple of the VPP group size;
the FLOPs sums are the step's; the packs each rank gets equal Megatron's own
``build_packed_microbatches`` of seqpack's groups for that rank; without CP and VPP, Megatron's
``get_batch_on_this_rank_for_sequence_packing`` turns them into the same tokens, labels and
``PackedSeqParams`` on every TP rank and stage; and across the DP replicas every sequence
arrives exactly once.
"""

from __future__ import annotations

import contextlib
import itertools
import random
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core.datasets.data_schedule")

# (tp, pp, cp, vpp, microbatch_group_size_per_vp_stage, world): dp=2 with cp=2, tp=2, pp=2 and
# VPP; then Megatron's test_wrap_dataloader layouts on 8 ranks (its VPP group size is pp; pp=4
# has middle stages, which get the packs' metadata only).
LAYOUTS = [(1, 1, 1, None, None, 2), (1, 1, 2, None, None, 4), (2, 1, 1, None, None, 4), (1, 2, 1, 2, 3, 4)]
LAYOUTS += [(1, 1, 8, None, None, 8), (2, 1, 4, None, None, 8), (2, 4, 1, None, None, 8), (2, 2, 1, None, None, 8)]
LAYOUTS += [(1, 4, 1, 4, 4, 8)]
MAX_SEQLEN_PER_DP_CP_RANK = 1024
ITEMS_PER_RANK = 8


def _config(multiple, vpp):
    """The fields of Megatron's config that ``wrap_data_iterator`` and its scheduler read."""
    return SimpleNamespace(
        max_seqlen_per_dp_cp_rank=MAX_SEQLEN_PER_DP_CP_RANK,
        microbatch_group_size_per_vp_stage=multiple,
        virtual_pipeline_model_parallel_size=vpp,
        sequence_packing_scheduler="dp_balanced",
    )


@contextlib.contextmanager
def cuda_on_cpu() -> Iterator[None]:
    """``torch.cuda.current_device()`` is the CPU and ``Tensor.cuda()`` stays put (module docstring)."""
    saved = torch.cuda.current_device, torch.Tensor.cuda
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.cuda.current_device, torch.Tensor.cuda = saved


@contextlib.contextmanager
def megatron_layout(tp: int, pp: int, vpp: int | None, cp: int = 1, **install_options: Any) -> Iterator[None]:
    """Megatron's ``parallel_state`` laid out (under :func:`cuda_on_cpu`), seqpack installed with
    ``install_options`` (``install=False``: the code under test installs it), and afterwards
    Megatron's own scheduler back in ``scheduler_map`` and the layout destroyed."""
    from megatron.core import parallel_state as ps
    from megatron.core.datasets import data_schedule

    from seqpack.interop.megatron import install

    key = data_schedule.PackingSchedulerEnum.DP_BALANCED
    with cuda_on_cpu():
        ps.initialize_model_parallel(tp, pp, vpp, context_parallel_size=cp, create_gloo_process_groups=False)
        megatrons = data_schedule.scheduler_map[key]
        try:
            if install_options.pop("install", True):
                install(**install_options)
            yield
        finally:
            data_schedule.scheduler_map[key] = megatrons
            ps.destroy_model_parallel()


def items(dp_rank: int, count: int = ITEMS_PER_RANK) -> list[dict[str, torch.Tensor]]:
    """DP rank ``dp_rank``'s pre-packed samples (Megatron's SFT form: 1 to 3 sequences each, padded
    to 16); a token is ``sequence key * 10_000 + position``, so a pack says which sequences it holds."""
    rng = random.Random(dp_rank)
    out = []
    for item in range(count):
        lengths = [16 * rng.randint(1, 40) for _ in range(rng.randint(1, 3))]
        keys = [1000 * dp_rank + 10 * item + s for s in range(len(lengths))]
        tokens = torch.cat([k * 10_000 + torch.arange(n) for k, n in zip(keys, lengths, strict=True)])
        cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        positions = torch.cat([torch.arange(n) for n in lengths])
        out.append(
            {
                "tokens": tokens,
                "labels": tokens + 1,
                "loss_mask": (positions % 3 > 0).float(),
                "position_ids": positions,
            }
            | {"cu_seqlens": cu_seqlens}
        )
    return out


def sequences(dp_size: int) -> list[dict[str, torch.Tensor]]:
    """Every sequence of the step in Megatron's global order, in the unpacked form its packer takes."""
    out = []
    for dp_rank in range(dp_size):
        for item in items(dp_rank):
            cu = item["cu_seqlens"].tolist()
            for a, b in zip(cu, cu[1:], strict=False):
                piece = {k: item[k][a:b] for k in ("tokens", "labels", "loss_mask", "position_ids")}
                out.append(piece | {"original_seq_len": torch.tensor([b - a]), "padded_seq_len": torch.tensor([b - a])})
    return out


def run_wrap(tp: int, pp: int, cp: int, vpp: int | None, multiple: int | None) -> dict[str, object]:
    from megatron.core import parallel_state as ps
    from megatron.core.datasets import data_schedule
    from megatron.core.rerun_state_machine import RerunDataIterator

    config = _config(multiple, vpp)
    with megatron_layout(tp, pp, vpp, cp):
        dp_rank = ps.get_data_parallel_rank()
        tp0 = ps.get_tensor_model_parallel_rank() == 0
        first = ps.is_pipeline_first_stage(ignore_virtual=True)
        last = ps.is_pipeline_last_stage(ignore_virtual=True)
        reads = tp0 and (first or last)
        iterator = RerunDataIterator(iter(items(dp_rank))) if reads else None
        if vpp is not None and tp0:
            iterator = [iterator if (v == 0 and first) or (v == vpp - 1 and last) else None for v in range(vpp)]
        new_iterator, num_micro_batches, seqlen_sum, seqlen_sq_sum = data_schedule.wrap_data_iterator(
            iterator, config, ITEMS_PER_RANK
        )
        if vpp is not None and tp0:
            new_iterator = new_iterator[-1 if last and not first else 0]
        checked = check_packs(new_iterator, num_micro_batches, cp, multiple, reads, vpp)
    return checked | {"num_micro_batches": num_micro_batches, "sums": (seqlen_sum, seqlen_sq_sum), "reads": reads}


def check_packs(
    new_iterator, num_micro_batches: int, cp: int, multiple: int | None, reads: bool, vpp: int | None
) -> dict[str, object]:
    """Compare this rank's packs with Megatron's ``build_packed_microbatches`` of seqpack's
    groups (middle pipeline stages: the metadata ``broadcast_to_pp_group`` sends them); without
    CP and VPP, also what Megatron's ``get_batch_on_this_rank_for_sequence_packing`` makes of
    them on every rank (TE's CP partition needs CUDA)."""
    from megatron.core import parallel_state as ps
    from megatron.core.datasets.data_schedule import get_batch_on_this_rank_for_sequence_packing
    from megatron.core.datasets.data_schedule_utils import build_packed_microbatches
    from megatron.core.rerun_state_machine import RerunDataIterator

    from seqpack.interop.megatron import SeqpackPackingScheduler

    step = sequences(ps.get_data_parallel_world_size())
    seqlens = [(i, int(s["padded_seq_len"])) for i, s in enumerate(step)]
    scheduler = SeqpackPackingScheduler(MAX_SEQLEN_PER_DP_CP_RANK, cp, ps.get_data_parallel_world_size(), multiple)
    groups = scheduler.get_groups_and_subsamples(seqlens)
    dcp_rank = ps.get_data_parallel_group(with_context_parallel=True).rank()
    want = build_packed_microbatches([[step[i] for i in m[dcp_rank]] for m in groups], "cpu")
    got = [next(new_iterator) for _ in range(num_micro_batches)] if new_iterator is not None else []
    keys_read: list[int] = []
    for g, w in zip(got, want, strict=False):
        keys = w.keys() if reads else {"cu_seqlens", "cu_seqlens_padded", "max_seqlen"}
        assert keys <= g.keys(), sorted(keys - g.keys())
        for key in keys:
            assert torch.equal(g[key], w[key]), key
        if reads:
            keys_read += (g["tokens"][g["cu_seqlens_padded"][:-1].long()] // 10_000).tolist()
    if cp == 1 and vpp is None:
        replay = RerunDataIterator(iter(got)) if got else None
        for w in want:
            tokens, labels, _, _, _, params, _ = get_batch_on_this_rank_for_sequence_packing(replay)
            assert torch.equal(params.cu_seqlens_q, w["cu_seqlens_padded"])
            assert (tokens is not None) == ps.is_pipeline_first_stage()
            assert (labels is not None) == ps.is_pipeline_last_stage()
            assert tokens is None or torch.equal(tokens[0], w["tokens"])
            assert labels is None or torch.equal(labels[0], w["labels"])
    return {
        "planned": len(groups),
        "want_sums": (sum(n for _, n in seqlens), sum(n * n for _, n in seqlens)),
        "replica": (ps.get_data_parallel_rank(), ps.get_context_parallel_rank(), ps.is_pipeline_first_stage()),
        "keys": keys_read,
        "all_keys": [int(s["tokens"][0]) // 10_000 for s in step],
        "checked": len(got),
    }


@pytest.mark.slow
@pytest.mark.parametrize(("tp", "pp", "cp", "vpp", "multiple", "world"), LAYOUTS)
def test_megatrons_wrap_data_iterator_runs_seqpacks_plan(dist_pools, tp, pp, cp, vpp, multiple, world):
    results = dist_pools.get(world).run(run_wrap, tp, pp, cp, vpp, multiple, timeout=600)
    counts = {r["num_micro_batches"] for r in results}
    assert len(counts) == 1 and counts == {results[0]["planned"]}
    assert counts.pop() % (multiple or 1) == 0
    assert all(r["sums"] == r["want_sums"] for r in results)  # Megatron's FLOPs sums
    assert sum(r["checked"] for r in results) >= results[0]["planned"]  # not vacuous: packs were compared
    # Every sequence exactly once over the replicas, as read by one rank of each (CP rank 0 of the first stage).
    readers = [r for r in results if r["reads"] and r["replica"][1:] == (0, True)]
    seen = [k for r in readers for k in r["keys"]]
    assert sorted(seen) == sorted(results[0]["all_keys"]) and len(seen) > len(readers) * ITEMS_PER_RANK


def run_example(tp: int, cp: int, prefetch: bool) -> list[list[int]]:
    """examples/megatron_scheduler.py's loop (``run_steps``) on this rank, under :func:`cuda_on_cpu`."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "megatron_scheduler.py"
    spec = importlib.util.spec_from_file_location("megatron_scheduler_example", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    args = SimpleNamespace(cp=cp, steps=2, samples_per_rank=8, max_seqlen_per_dp_cp_rank=4096, prefetch=prefetch)
    with megatron_layout(tp, 1, None, cp, install=False):  # the example installs seqpack itself
        return example.run_steps(args, torch.device("cpu"))


@pytest.mark.slow
@pytest.mark.parametrize("prefetch", [False, True])
def test_the_example_runs_megatrons_loop_with_seqpack(dist_pools, prefetch):
    results = dist_pools.get(4).run(run_example, 1, 2, prefetch, timeout=600)  # dp=2 x cp=2
    assert all(len(steps) == 2 for steps in results)
    for step in range(2):
        counts = {len(steps[step]) for steps in results}
        assert len(counts) == 1 and counts.pop() >= 1
        assert all(0 < tokens <= 4096 * 2 for steps in results for tokens in steps[step])


def run_bad_sample(bad_rank: int) -> str:
    """``wrap_data_iterator`` at dp=2 where DP rank ``bad_rank``'s item 3 lacks ``labels``: what each rank raises."""
    from megatron.core import parallel_state as ps
    from megatron.core.datasets import data_schedule

    from seqpack.errors import SampleError

    config = _config(None, None)
    with megatron_layout(1, 1, None):
        step = items(ps.get_data_parallel_rank())
        if ps.get_data_parallel_rank() == bad_rank:
            del step[3]["labels"]
        try:
            data_schedule.wrap_data_iterator(iter(step), config, ITEMS_PER_RANK)
        except SampleError as exc:
            return str(exc)
    return "no error"


@pytest.mark.slow
def test_a_sample_without_a_required_key_fails_every_dp_rank(dist_pools):
    messages = dist_pools.get(2).run(run_bad_sample, 1, timeout=120)
    assert "sample 3 of this rank's step lacks ['labels']" in messages[1]
    assert "another DP rank lacks a key" in messages[0]


# Microbatches read per step: the third step reads fewer (a batch-size ramp), so the plan made
# ahead for it (for 8) is not used and two items read ahead wait for the fourth step.
PREFETCH_STEPS = (8, 8, 6, 6)


def run_steps(tp: int, pp: int, cp: int, vpp: int | None, multiple: int | None, prefetch: int) -> dict[str, object]:
    """``wrap_data_iterator`` for each count of :data:`PREFETCH_STEPS` on one data iterator of
    this rank, seqpack installed with ``prefetch``, then (where every rank reads: a rank that
    does not would wait for the readers' broadcast) once more past the end of the data. Returns
    each step's microbatch count, this rank's packs and the sequences in them, and how many
    plans were made ahead."""
    import logging

    from megatron.core import parallel_state as ps
    from megatron.core.datasets import data_schedule
    from megatron.core.rerun_state_machine import RerunDataIterator

    made_ahead: list[str] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: made_ahead.append(record.getMessage())  # type: ignore[method-assign]
    log = logging.getLogger("seqpack.interop.megatron")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    config = _config(multiple, vpp)
    steps, keys, ended = [], [], "not asked"
    try:
        with megatron_layout(tp, pp, vpp, cp, prefetch=prefetch):
            tp0 = ps.get_tensor_model_parallel_rank() == 0
            first = ps.is_pipeline_first_stage(ignore_virtual=True)
            last = ps.is_pipeline_last_stage(ignore_virtual=True)
            reads = tp0 and (first or last)
            dp = (ps.get_data_parallel_rank(), ps.get_data_parallel_world_size(), ps.get_context_parallel_rank())
            iterator = RerunDataIterator(iter(items(dp[0], sum(PREFETCH_STEPS)))) if reads else None
            if vpp is not None and tp0:
                iterator = [iterator if (v == 0 and first) or (v == vpp - 1 and last) else None for v in range(vpp)]
            for count in PREFETCH_STEPS:
                new_iterator, num_micro_batches, *_ = data_schedule.wrap_data_iterator(iterator, config, count)
                if vpp is not None and tp0:
                    new_iterator = new_iterator[-1 if last and not first else 0]
                packs = [next(new_iterator) for _ in range(num_micro_batches)] if new_iterator is not None else []
                steps.append((num_micro_batches, [{k: v.tolist() for k, v in p.items()} for p in packs]))
                starts = [p["tokens"][p["cu_seqlens_padded"][:-1].long()] for p in packs if first and "tokens" in p]
                keys.append([k // 10_000 for s in starts for k in s.tolist()])
            if tp * pp == 1:
                try:
                    data_schedule.wrap_data_iterator(iterator, config, PREFETCH_STEPS[-1])
                    ended = "no end"
                except StopIteration:
                    ended = "StopIteration"
    finally:
        log.removeHandler(handler)
    return {"steps": steps, "keys": keys, "ended": ended, "made_ahead": len(made_ahead), "reads": reads, "dp": dp}


@pytest.mark.slow
@pytest.mark.parametrize(("tp", "pp", "cp", "vpp", "multiple", "world"), LAYOUTS[:4])
def test_prefetch_plans_each_step_ahead_into_the_same_packs(dist_pools, tp, pp, cp, vpp, multiple, world):
    pool = dist_pools.get(world)
    synchronous = pool.run(run_steps, tp, pp, cp, vpp, multiple, 0, timeout=600)
    ahead = pool.run(run_steps, tp, pp, cp, vpp, multiple, 1, timeout=600)
    assert [r["steps"] for r in ahead] == [r["steps"] for r in synchronous]  # same groups, same packs
    # Steps 2 and 4 took the plan made during the step before; step 3 (fewer microbatches) did not.
    assert [r["made_ahead"] for r in ahead] == [2 if r["reads"] else 0 for r in ahead]
    assert all(r["made_ahead"] == 0 for r in synchronous)
    # Past the end of the data, Megatron's StopIteration, read ahead or not (every rank reads).
    assert {r["ended"] for r in ahead + synchronous} == {"StopIteration" if tp * pp == 1 else "not asked"}
    # Each step holds every sequence its items hold, once, over the replicas (CP rank 0 of the first stage).
    readers = [r for r in ahead if r["reads"] and r["dp"][2] == 0 and r["keys"][0]]
    assert len(readers) == readers[0]["dp"][1]
    bounds = [0, *itertools.accumulate(PREFETCH_STEPS)]
    for step in range(len(PREFETCH_STEPS)):
        want = []
        for dp_rank in range(readers[0]["dp"][1]):
            for item in items(dp_rank, bounds[-1])[bounds[step] : bounds[step + 1]]:
                want += [int(item["tokens"][a]) // 10_000 for a in item["cu_seqlens"][:-1].tolist()]
        assert sorted(k for r in readers for k in r["keys"][step]) == sorted(want)


def run_too_few(vpp: int, multiple: int) -> str:
    """``wrap_data_iterator`` at dp=2 x pp=2 under VPP where each DP rank reads one sequence: what each rank raises."""
    from megatron.core import parallel_state as ps
    from megatron.core.datasets import data_schedule

    from seqpack.errors import ScheduleError

    positions = torch.arange(32)
    sample = {"tokens": positions, "labels": positions + 1, "loss_mask": torch.ones(32), "position_ids": positions}
    sample["cu_seqlens"] = torch.tensor([0, 32], dtype=torch.int32)
    with megatron_layout(1, 2, vpp):
        first = ps.is_pipeline_first_stage(ignore_virtual=True)
        iterator = [iter([sample]) if v == (0 if first else vpp - 1) else None for v in range(vpp)]
        try:
            data_schedule.wrap_data_iterator(iterator, _config(multiple, vpp), 1)
        except ScheduleError as exc:
            return str(exc)
    return "no error"


@pytest.mark.slow
def test_a_vpp_multiple_the_step_cannot_fill_is_named_on_every_planning_rank(dist_pools):
    messages = dist_pools.get(4).run(run_too_few, 2, 3, timeout=120)  # every rank reads: stage 0 or 1
    for message in messages:
        assert "2 sequences cannot fill 3 microbatches on each of 2 DP replicas" in message
        assert "microbatch_group_size_per_vp_stage=3" in message
