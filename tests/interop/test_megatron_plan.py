"""seqpack.interop.megatron_plan without Megatron: the groups keep the contract of Megatron's
``DpBalancedScheduler.get_groups_and_subsamples`` (each id once, per microbatch per DP x CP
rank, CP ranks of a replica sharing one list, the capacity, the VPP multiple, no empty
microbatch), and bad samples and configs are refused by name. Against Megatron itself:
tests/interop/test_megatron.py."""

from __future__ import annotations

import pickle
import re
import runpy
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqpack.cost import ModelSpec
from seqpack.errors import ConfigError, SampleError, ScheduleError
from seqpack.interop.megatron_plan import check_config, check_sample, model_spec, plan_groups, plan_lengths
from seqpack.mock_data import generate_lengths
from seqpack.schedulers import get_scheduler


def groups(lengths, *, capacity, cp=1, dp=1, multiple=1):
    return plan_groups(
        list(enumerate(lengths)),
        get_scheduler("balanced", microbatch_multiple=multiple),
        max_seqlen_per_dp_cp_rank=capacity,
        cp_size=cp,
        dp_size=dp,
    )


@pytest.mark.slow
@given(
    lengths=st.lists(st.integers(1, 64), min_size=1, max_size=60),
    cp=st.integers(1, 3),
    dp=st.integers(1, 4),
    multiple=st.integers(1, 4),
    capacity=st.integers(64, 160),
)
def test_groups_keep_megatrons_contract(lengths, cp, dp, multiple, capacity):
    try:
        got = groups(lengths, capacity=capacity // cp, cp=cp, dp=dp, multiple=multiple)
    except ScheduleError as exc:  # too few sequences for dp x the microbatches: refused by name
        n, m = map(int, re.match(r"(\d+) sequences cannot fill (\d+) microbatches", str(exc)).groups())
        assert n == len(lengths) < dp * m and m % multiple == 0
        return
    assert len(got) % multiple == 0 and all(len(m) == dp * cp for m in got)
    ids = [i for m in got for r in range(dp) for i in m[r * cp]]
    assert sorted(ids) == list(range(len(lengths)))
    for m in got:
        for r in range(dp):
            group = m[r * cp]
            assert all(m[r * cp + c] is group for c in range(cp))  # one list for the replica's CP ranks
            assert group and sum(lengths[i] for i in group) <= (capacity // cp) * cp


@pytest.mark.parametrize("dp", [1, 4])
def test_the_planning_process_plans_what_the_step_would(dp):
    # prefetch=1 sends lengths and the scheduler's options to a process (pickled, as here);
    # a pickled scheduler planned these lengths at dp=1 in 127 microbatches instead of 126.
    shape = dict(min_seq_len=64, max_seq_len=4096, mean_seq_len=512, sigma=1.1, seed=0)
    lengths = generate_lengths("lognormal", 8 * 16384, **shape)[7 * 16384 :]
    sizes = dict(max_seqlen_per_dp_cp_rank=65536, cp_size=1, dp_size=dp, cost=None, sync="replica")
    options = {"microbatch_multiple": 1}
    sent = pickle.loads(pickle.dumps((np.asarray(lengths, dtype=np.int64), options, sizes)))
    here = plan_groups(list(enumerate(lengths.tolist())), get_scheduler("balanced", **options), **sizes)
    assert plan_lengths(*sent[:2], **sent[2]) == here


def test_an_empty_microbatch_of_the_plan_gets_a_sequence():
    # balanced plans 2 rounds of 4 replicas for these 8 sequences with one replica left empty;
    # Megatron cannot pack an empty group, so the fullest group gives its shortest sequence.
    lengths = [153, 284, 245, 83, 278, 244, 388, 254]
    plan = get_scheduler("balanced", microbatch_multiple=2).schedule(lengths, dp_size=4, max_tokens_per_rank=421)
    assert any(len(a) == 0 for r in plan.assignment for a in r)  # not vacuous
    got = groups(lengths, capacity=421, dp=4, multiple=2)
    assert [len(g) for m in got for g in m] == [1] * 8


def test_too_few_sequences_for_the_vpp_multiple_are_refused_by_name():
    with pytest.raises(ScheduleError, match=r"3 sequences cannot fill 4 microbatches on each of 2 DP replicas"):
        groups([10, 20, 30], capacity=100, dp=2, multiple=4)
    with pytest.raises(ScheduleError, match="more than one microbatch holds"):
        groups([10, 200], capacity=100, dp=1)


def test_a_sample_without_a_required_key_is_named():
    sample = {"tokens": 0, "labels": 0, "loss_mask": 0, "position_ids": 0, "cu_seqlens": 0}
    check_sample(sample, 0)
    check_sample({**{k: v for k, v in sample.items() if k != "cu_seqlens"}, "padded_seq_len": 0}, 0)
    with pytest.raises(SampleError, match=r"sample 3 .* lacks \['labels'\]"):
        check_sample({k: v for k, v in sample.items() if k != "labels"}, 3)
    with pytest.raises(SampleError, match=r"lacks \['cu_seqlens or padded_seq_len'\]"):
        check_sample({k: v for k, v in sample.items() if k != "cu_seqlens"}, 0)
    with pytest.raises(SampleError, match="is a list, not a dict"):
        check_sample([sample], 0)


def test_hybrid_cp_is_refused_by_name():
    check_config(SimpleNamespace(hybrid_context_parallel=False))
    with pytest.raises(ConfigError, match="hybrid_context_parallel=True: .*HybridCPDataLoaderWrapper"):
        check_config(SimpleNamespace(hybrid_context_parallel=True))


def transformer_config(**fields):
    """The fields of a Megatron ``TransformerConfig`` after its ``__post_init__``."""
    base = dict(hidden_size=256, num_layers=4, num_attention_heads=8, ffn_hidden_size=1024, num_query_groups=2)
    base |= dict(kv_channels=32, gated_linear_unit=True, window_size=None, num_moe_experts=None)
    base |= dict(moe_shared_expert_intermediate_size=None)
    return SimpleNamespace(**(base | fields))


def test_the_model_spec_follows_the_transformer_config():
    spec = model_spec(transformer_config())
    assert spec == ModelSpec(256, 4, 8, 1024, num_query_groups=2, kv_channels=32, gated_linear_unit=True)
    moe = transformer_config(num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=300)
    assert model_spec(moe).ffn_hidden_size == 600
    shared = transformer_config(
        num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=300, moe_shared_expert_intermediate_size=100
    )
    assert model_spec(shared).ffn_hidden_size == 700
    assert model_spec(transformer_config(window_size=(128, 0))).window_size == 128
    for bad in ({"multi_latent_attention": True}, {"is_hybrid_model": True}, {"window_size": (128, 128)}):
        with pytest.raises(ConfigError, match="pass cost=CostModel"):
            model_spec(transformer_config(**bad))
    assert np.isclose(spec.cost_model().quadratic, ModelSpec(256, 4, 8, 1024, 2).cost_model().quadratic)


def test_importing_the_megatron_scheduler_without_megatron_names_what_is_missing():
    try:
        import megatron.core.datasets.data_schedule  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("Megatron-LM is installed here (tests/interop/test_megatron.py runs)")
    with pytest.raises(ImportError, match="needs Megatron-LM with megatron/core/datasets/data_schedule.py") as info:
        import seqpack.interop.megatron  # noqa: F401
    assert type(info.value).__name__ == "MegatronUnavailableError" and isinstance(info.value, ConfigError)


def test_the_example_plans_a_step_without_megatron(capsys, monkeypatch):
    example = Path(__file__).resolve().parents[2] / "examples" / "megatron_scheduler.py"
    monkeypatch.setattr(sys, "argv", [str(example), "--plan", "--dp", "4"])
    runpy.run_path(str(example), run_name="__main__")
    out = capsys.readouterr().out
    counts = [int(n) for n in re.findall(r"(\d+) microbatches", out)]
    assert len(counts) == 2 and counts[1] <= counts[0]  # seqpack's never more than Megatron's next-fit here
    assert float(re.search(r"step time: (\d\.\d+) x", out).group(1)) < 1
