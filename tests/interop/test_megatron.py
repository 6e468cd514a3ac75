"""seqpack.interop.megatron against Megatron-LM itself (skipped where it is not installed: make
its venv with tests/interop/megatron_venv.sh). One process here; Megatron's
``wrap_data_iterator`` on gloo ranks: tests/interop/test_megatron_dist.py.

Ported from Megatron-LM's tests/unit_tests/test_sequence_packing.py: ``test_wrap_dataloader``
(its layouts and workload, scheduled here; its layouts run end to end in
test_megatron_dist.py, which also feeds seqpack's packs to Megatron's
``get_batch_on_this_rank_for_sequence_packing`` without CP). Not ported: that function's own
test with CP (TE's ``thd_get_partitioned_indices`` needs CUDA) and the THD padding-mask tests
(no scheduler in them).
"""

from __future__ import annotations

import random
import sys
from types import SimpleNamespace

import numpy as np
import pytest

data_schedule = pytest.importorskip("megatron.core.datasets.data_schedule")

from benchmark_module import benchmark_module  # noqa: E402
from megatron.core.transformer import TransformerConfig  # noqa: E402

from seqpack.cost import CostModel, ModelSpec  # noqa: E402
from seqpack.errors import ConfigError, SampleError, ScheduleError, SeqpackTypeError  # noqa: E402
from seqpack.interop.megatron import SeqpackPackingScheduler, install  # noqa: E402
from seqpack.interop.megatron_plan import plan_lengths  # noqa: E402

# Megatron's test_wrap_dataloader: (tp, pp, cp, vpp) on 8 ranks, 64 sequences of 2048 to 8192
# tokens padded to 16, max_seqlen_per_dp_cp_rank 8192, microbatch_group_size_per_vp_stage = pp.
LAYOUTS = [(1, 1, 8, None), (2, 1, 4, None), (2, 4, 1, None), (2, 2, 1, None), (1, 4, 1, 4)]


def megatron_workload(seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(i, -(-rng.randint(2048, 8192) // 16) * 16) for i in range(64)]


@pytest.mark.slow
@pytest.mark.parametrize(("tp", "pp", "cp", "vpp"), LAYOUTS)
def test_megatrons_wrap_dataloader_layouts_schedule_every_sequence_once(tp, pp, cp, vpp):
    dp = 8 // (tp * pp * cp)
    multiple = None if vpp is None else pp
    ours = SeqpackPackingScheduler(8192, cp, dp, multiple)
    theirs = data_schedule.DpBalancedScheduler(8192, cp, dp, multiple)
    assert isinstance(ours, data_schedule.BasePackingScheduler)
    assert ours.get_required_sample_keys() == theirs.get_required_sample_keys()
    for seed in range(3):
        workload = megatron_workload(seed)
        length = dict(workload)
        groups = ours.get_groups_and_subsamples(workload)
        assert len(groups) % (multiple or 1) == 0 and all(len(m) == dp * cp for m in groups)
        ids = sorted(i for m in groups for j in range(0, dp * cp, cp) for i in m[j])
        assert ids == list(range(64))
        for m in groups:
            for j in range(dp * cp):
                assert m[j] is m[j - j % cp] and m[j]  # a replica's CP ranks share one non-empty group
                assert sum(length[i] for i in m[j]) <= 8192 * cp
        # On Megatron's own workload, never more microbatches than its next-fit (which may
        # assert "Not enough samples to move" under VPP: it splits only the last groups).
        try:
            assert len(groups) <= len(theirs.get_groups_and_subsamples(workload))
        except AssertionError as exc:
            assert vpp is not None and "Not enough samples to move" in str(exc)


def test_install_puts_seqpack_behind_dp_balanced():
    key = data_schedule.PackingSchedulerEnum.DP_BALANCED
    cost = CostModel(1.0, 0.01)
    replaced = install(cost=cost, order="as_planned")
    try:
        assert replaced is data_schedule.DpBalancedScheduler
        scheduler = data_schedule.scheduler_map[key](4096, 2, 4, None)  # as wrap_data_iterator builds it
        assert isinstance(scheduler, SeqpackPackingScheduler) and scheduler.cost is cost
        assert scheduler.scheduler.order == "as_planned" and scheduler.cp_size == 2 and scheduler.dp_size == 4
    finally:
        data_schedule.scheduler_map[key] = replaced


def test_bad_options_are_refused_at_install_by_name():
    key = data_schedule.PackingSchedulerEnum.DP_BALANCED
    for options, error, match in [
        ({"order": "sideways"}, ConfigError, "order"),
        ({"sync": "never"}, ConfigError, "sync"),
        ({"cost": ModelSpec(64, 2, 4, 256)}, SeqpackTypeError, "cost_model"),
        ({"dynamic_cp": True}, ConfigError, "dynamic_cp=True: Megatron's hybrid CP"),
        ({"microbatch_multiple": 2}, ConfigError, "microbatch_group_size_per_vp_stage"),
        ({"prefetch": 2}, ConfigError, r"prefetch=2 is too large \(at most 1\)"),
        ({"prefetch": "yes"}, SeqpackTypeError, "prefetch must be an integer >= 0"),
    ]:
        with pytest.raises(error, match=match):
            install(**options)
        assert data_schedule.scheduler_map[key] is data_schedule.DpBalancedScheduler
    with pytest.raises(SeqpackTypeError, match="max_seqlen_per_dp_cp_rank must be a positive integer, got None"):
        SeqpackPackingScheduler(None, 1, 2, None)  # Megatron's config left it unset


class OneRank:
    """A process group of one rank (``run`` reads only ``rank()`` and ``size()`` before it pulls data)."""

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1


def config(**fields):
    return SimpleNamespace(**{"max_seqlen_per_dp_cp_rank": 64, "virtual_pipeline_model_parallel_size": None, **fields})


def test_run_refuses_hybrid_cp_and_a_sample_without_a_required_key():
    scheduler = SeqpackPackingScheduler(64, 1, 1, None)
    groups = (OneRank(), OneRank(), OneRank(), OneRank(), "cpu")
    with pytest.raises(ConfigError, match="hybrid_context_parallel=True"):
        scheduler.run(iter([]), 1, *groups, config(hybrid_context_parallel=True))
    sample = {"tokens": 1, "loss_mask": 1, "position_ids": 1, "cu_seqlens": 1}
    with pytest.raises(SampleError, match=r"sample 0 of this rank's step lacks \['labels'\]"):
        scheduler.run(iter([sample]), 1, *groups, config())


def test_prefetch_refuses_what_it_cannot_read_ahead_from_before_reading():
    scheduler = SeqpackPackingScheduler(64, 1, 1, None, prefetch=1)
    groups = (OneRank(), OneRank(), OneRank(), OneRank(), "cpu")
    sample = {"tokens": 1, "labels": 1, "loss_mask": 1, "position_ids": 1, "padded_seq_len": 1}
    data = iter([sample])  # a list iterator cannot be weakly referenced
    with pytest.raises(ConfigError, match="prefetch=1 needs a data iterator that can be weakly referenced"):
        scheduler.run(data, 1, *groups, config())
    assert next(data) is sample  # nothing was read


def test_the_planning_process_answers_in_order_and_its_end_falls_back_to_planning_here(caplog):
    from seqpack.interop.megatron import _Planner, _PlannerGone, _ReadAhead

    planner = _Planner()
    lengths, options = np.array([5, 9, 3, 7, 12, 2], dtype=np.int64), {"microbatch_multiple": 1}
    sizes = {"max_seqlen_per_dp_cp_rank": 16, "cp_size": 1, "dp_size": 2}
    first = planner.submit(lengths, options, sizes)
    second = planner.submit(np.array([99, 1], dtype=np.int64), options, sizes)  # 99 > the capacity
    assert first.result(120) == plan_lengths(lengths, options, **sizes)
    with pytest.raises(ScheduleError):
        second.result(120)
    planner.process.kill()
    planner.process.wait()
    gone = planner.submit(lengths, options, sizes)
    with pytest.raises(_PlannerGone, match="seqpack's planning process ended"):
        gone.result(120)
    scheduler = SeqpackPackingScheduler(16, 1, 2, None)
    pairs = list(enumerate(lengths.tolist()))
    scheduler._ahead = _ReadAhead([], pairs=pairs, plan=gone)
    assert scheduler.get_groups_and_subsamples(pairs) == first.result()  # planned here instead
    assert "planning this step here" in caplog.text


def test_the_cost_follows_megatrons_transformer_config():
    transformer = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2)
    scheduler = SeqpackPackingScheduler(64, 1, 1, None)
    with pytest.raises(SampleError):  # the config is read before the first sample
        scheduler.run(iter([{}]), 1, OneRank(), OneRank(), OneRank(), OneRank(), "cpu", transformer)
    spec = ModelSpec(64, 2, 4, 256, num_query_groups=2, kv_channels=16, gated_linear_unit=False)
    assert scheduler.cost == spec.cost_model()


@pytest.mark.slow
def test_the_comparison_benchmark_runs_at_toy_size(capsys, monkeypatch):
    with benchmark_module("megatron_compare") as bench:
        monkeypatch.setattr(sys, "argv", ["megatron_compare.py", "--quick"])
        assert bench.main() == 0
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("  sft-lognormal")]
    assert [int(r[0].split()[-1]) for r in rows] == [1, 2, 4]  # the VPP multiples
    for _, megatron, seqpack in rows:
        assert float(seqpack.split()[0]) <= float(megatron.split()[0])  # microbatches
        assert float(seqpack.split()[3]) < 1  # predicted step time, seqpack's over Megatron's
