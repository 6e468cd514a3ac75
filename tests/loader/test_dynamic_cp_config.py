"""PackingConfig(dynamic_cp=True): its options, what it refuses by name, its fingerprint."""

import pytest

from seqpack.calibrate import CostCalibrator, GroupCostCalibrator
from seqpack.cost import (
    DEFAULT_MODEL,
    INTERCONNECTS,
    CostModel,
    GroupCost,
    ModelSpec,
    default_cost_model,
    get_interconnect,
    model_preset,
)
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.loader import PackingConfig
from seqpack.loader.config import resolved_cost
from seqpack.options import GroupSizes
from seqpack.topology import Topology

COMPUTE = CostModel(1e-6, 1e-9, 1e-3)
RING = {"ring_step": 1e-4, "ring_token": 2e-8}


def dynamic(**kw):
    kw.setdefault("samples_per_rank", 4)
    kw.setdefault("max_tokens_per_rank", 64)
    kw.setdefault("dynamic_cp", True)
    kw.setdefault("group_cost", RING)
    return PackingConfig(**kw)


def test_ring_figures_are_added_to_the_cost():
    config = dynamic(cost=COMPUTE, cp_group_sizes="any")
    assert config.group_cost == GroupCost(COMPUTE, **RING)
    assert config.cp_group_sizes is GroupSizes.ANY
    assert resolved_cost(config, config.build_scheduler()) == config.group_cost  # the ring included
    assert config.group_cost.compute == COMPUTE
    given = GroupCost(COMPUTE, ring_step=3.0, ranks_per_node=4)
    assert dynamic(group_cost=given).group_cost is given
    assert dynamic(group_cost=given, cost=COMPUTE).group_cost is given


@pytest.mark.parametrize(
    "kw, error, message",
    [
        ({"group_cost": None, "cost": CostModel(1.0, 0.0)}, ConfigError, "needs group_cost in the units of that cost"),
        ({"group_cost": model_preset("llama3-8b"), "cost": CostModel(1.0, 0.0)}, ConfigError, "in the units"),
        ({"group_cost": {"ring_latency": 1.0}}, ConfigError, r"unknown group_cost figure\(s\) \['ring_latency'\]"),
        ({"group_cost": {"ring_step": -1.0}}, ConfigError, "ring_step"),
        ({"group_cost": 3}, SeqpackTypeError, "group_cost must be a GroupCost or a mapping"),
        # Ring figures without a ring term: every CP group would look free, as with None.
        ({"group_cost": {}}, ConfigError, r"group_cost=\{\} has no ring term .* every CP group would look free"),
        ({"group_cost": {"ranks_per_node": 4}}, ConfigError, r"group_cost=\{'ranks_per_node': 4\} has no ring term"),
        ({"group_cost": {"ring_step": 0.0, "ring_token": 0}}, ConfigError, "has no ring term"),
        (
            {"group_cost": GroupCost(COMPUTE), "cost": CostModel(1.0, 0.0)},
            ConfigError,
            "group_cost.compute=.* differs from cost=",
        ),
        ({"scheduler": "dp_balanced"}, ConfigError, "scheduler='dp_balanced'.* would not be used"),
        ({"scheduler_options": {"order": "pipeline"}}, ConfigError, "leave scheduler at 'balanced'"),
        ({"calibrate": CostCalibrator(CostModel(1.0, 0.0, 0.0))}, ConfigError, "not a dynamic CP group cost"),
        ({"cp_layout": "contiguous"}, ConfigError, "cp_layout='contiguous' is not supported with dynamic_cp=True"),
        ({"group_microbatch": True}, ConfigError, "group_microbatch=True is not supported with dynamic_cp=True"),
        ({"equal_samples_per_replica": True}, ConfigError, "equal_samples_per_replica=True is not supported"),
        ({"cp_group_sizes": "odd"}, ConfigError, "cp_group_sizes must be one of"),
        ({"dynamic_cp": 1}, SeqpackTypeError, "dynamic_cp must be True or False"),
        ({"dynamic_cp": False}, ConfigError, "group_cost is an option of dynamic CP"),
        ({"dynamic_cp": False, "group_cost": None, "cp_group_sizes": "any"}, ConfigError, "cp_group_sizes is an"),
    ],
)
def test_refusals_name_the_option(kw, error, message):
    with pytest.raises(error, match=message):
        dynamic(**kw)


def test_one_ring_figure_is_a_ring_term_and_a_given_group_cost_is_taken_as_it_is():
    assert dynamic(group_cost={"ring_token_inter": 1e-7}).group_cost.ring_token_inter == 1e-7
    measured = GroupCost(COMPUTE)  # e.g. fitted: a ring too cheap to measure is the caller's finding
    assert dynamic(group_cost=measured).group_cost is measured


def test_in_the_fingerprint():
    off = PackingConfig(samples_per_rank=4, max_tokens_per_rank=64)
    assert off.summary()["dynamic_cp"] == "False" and off.summary()["group_cost"] == "None"
    on = dynamic()
    assert on.summary()["dynamic_cp"] == "True" and "ring_step=0.0001" in on.summary()["group_cost"]
    assert len({off.fingerprint(), on.fingerprint(), dynamic(cp_group_sizes="any").fingerprint()}) == 3
    assert dynamic(group_cost={"ring_step": 2e-4}).fingerprint() != on.fingerprint()


def test_resolve_uses_the_single_rank_padding():
    topology = Topology(dp_size=2, cp_size=2, dp_rank=0, cp_rank=0, groups={"dp": object(), "cp": object()})
    assert dynamic().resolve(topology).pad_multiple == 1  # not 2*cp: a group of c pads to 2*c times it
    assert dynamic(fp8=True).resolve(topology).pad_multiple == 16
    assert dynamic(pad_multiple=3).resolve(topology).pad_multiple == 3
    with pytest.raises(ConfigError, match="max_tokens_per_rank=8 is smaller than pad_multiple=16"):
        dynamic(max_tokens_per_rank=8, fp8=True).resolve(topology)


def test_calibrate_under_dynamic_cp_fits_the_group_cost():
    assert dynamic(calibrate=True).calibrate is True
    cal = GroupCostCalibrator(GroupCost(COMPUTE, **RING))
    assert dynamic(calibrate=cal, group_cost=cal.prior).calibrate is cal
    with pytest.raises(ConfigError, match="pass dynamic_cp=True"):
        PackingConfig(samples_per_rank=4, max_tokens_per_rank=64, calibrate=cal)


def test_dynamic_cp_alone_plans_with_the_default_models_flops_and_an_h100_ring():
    config = dynamic(group_cost=None)
    prior = GroupCost.from_model(model_preset(DEFAULT_MODEL), "h100-nvlink-ib400")
    assert config.group_cost == prior and config.group_cost.compute == default_cost_model()
    assert config.group_cost.has_ring and config.planning_cost is config.group_cost
    spec = model_preset("qwen2.5-7b")
    assert dynamic(group_cost=spec).group_cost == GroupCost.from_model(spec)


def test_the_default_ring_is_te_p2p_over_the_named_links_in_flops():
    spec = ModelSpec(hidden_size=1024, num_layers=4, num_attention_heads=8, ffn_hidden_size=4096, num_query_groups=2)
    cost = GroupCost.from_model(spec, "a100-nvlink-ib200")
    links = INTERCONNECTS["a100-nvlink-ib200"]
    kv_bytes = 2 * 2 * 128 * 2  # K and V, 2 groups, head width 1024/8, bf16
    transfers = 3 * 4  # forward K/V, backward K/V and dK/dV, per attention layer
    assert cost.ring_token == pytest.approx(transfers * kv_bytes / links.intra_node_bandwidth * links.device_flops)
    assert cost.ring_token_inter == pytest.approx(
        transfers * kv_bytes / links.inter_node_bandwidth * links.device_flops
    )
    assert cost.ring_step == pytest.approx(transfers * links.step_latency * links.device_flops)
    assert cost.compute == spec.cost_model() and cost.ranks_per_node == links.ranks_per_node


def test_the_default_ring_refuses_what_it_cannot_price():
    with pytest.raises(ConfigError, match=r"unknown interconnect 'tpu'; valid: h100-nvlink-ib400"):
        GroupCost.from_model(model_preset("llama3-8b"), "tpu")
    mamba = ModelSpec(
        hidden_size=256, num_layers=2, num_attention_heads=4, ffn_hidden_size=512, hybrid_layer_pattern="MM"
    )
    with pytest.raises(ConfigError, match="no attention layer"):
        GroupCost.from_model(mamba)
    with pytest.raises(SeqpackTypeError, match="interconnect must be a name"):
        get_interconnect(3)
