"""PackingConfig(dynamic_cp=True): its options, what it refuses by name, its fingerprint."""

import dataclasses

import pytest

from seqpack.calibrate import CostCalibrator
from seqpack.cost import DEFAULT_MODEL, INTERCONNECTS, CostModel, ModelSpec, get_interconnect, model_preset
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.loader import PackingConfig
from seqpack.loader.config import resolved_cost
from seqpack.options import GroupSizes
from seqpack.schedulers import DynamicCpScheduler
from seqpack.topology import Topology

COMPUTE = CostModel(1e-6, 1e-9, 1e-3)
COST = CostModel(1e-6, 1e-9, 1e-3, ring_step=1e-4, ring_token=2e-8)


def dynamic(**kw):
    kw.setdefault("samples_per_rank", 4)
    kw.setdefault("max_tokens_per_rank", 64)
    kw.setdefault("dynamic_cp", True)
    kw.setdefault("cost", COST)
    return PackingConfig(**kw)


def test_the_cost_is_the_one_cost_and_group_sizes_are_the_schedulers_option():
    config = dynamic(scheduler_options={"group_sizes": "any"})
    scheduler = config.build_scheduler()
    assert isinstance(scheduler, DynamicCpScheduler) and scheduler.group_sizes is GroupSizes.ANY
    assert resolved_cost(config, scheduler) is COST  # the ring included
    assert dynamic().build_scheduler().group_sizes is GroupSizes.POW2
    given = DynamicCpScheduler(group_sizes="any")
    assert dynamic(scheduler=given).build_scheduler() is given
    # A fitted group cost may find the ring free: its reference size says it prices CP groups.
    measured = dataclasses.replace(COMPUTE, reference_size=1)
    assert dynamic(cost=measured).cost is measured


@pytest.mark.parametrize(
    "kw, error, message",
    [
        ({"cost": COMPUTE}, ConfigError, "without a CP ring term every CP group would look free"),
        ({"scheduler": "dp_balanced"}, ConfigError, "scheduler='dp_balanced' would not be used"),
        ({"scheduler": "dynamic_cp"}, ConfigError, "scheduler='dynamic_cp' would not be used"),
        (
            {"scheduler_options": {"order": "pipeline"}},
            ConfigError,
            r"unknown option\(s\) \[.order.\] of scheduler .dynamic_cp.",
        ),
        ({"scheduler_options": {"group_sizes": "odd"}}, ConfigError, "group_sizes must be one of"),
        (
            {"scheduler": DynamicCpScheduler(), "scheduler_options": {"group_sizes": "any"}},
            ConfigError,
            "without scheduler_options",
        ),
        ({"calibrate": CostCalibrator(CostModel(1.0, 0.0, 0.0))}, ConfigError, "fits \\(1, S, SS\\), not a dynamic CP"),
        ({"cp_layout": "contiguous"}, ConfigError, "cp_layout='contiguous' is not supported with dynamic_cp=True"),
        ({"group_microbatch": True}, ConfigError, "group_microbatch=True is not supported with dynamic_cp=True"),
        ({"equal_samples_per_replica": True}, ConfigError, "equal_samples_per_replica=True is not supported"),
        ({"dynamic_cp": 1}, SeqpackTypeError, "dynamic_cp must be True or False"),
        ({"dynamic_cp": None}, SeqpackTypeError, "dynamic_cp must be True or False"),
        ({"dynamic_cp": False, "scheduler": "dynamic_cp"}, ConfigError, "pass dynamic_cp=True instead"),
        ({"dynamic_cp": False, "scheduler": DynamicCpScheduler()}, ConfigError, "pass dynamic_cp=True instead"),
        # asked one way: the cost is `cost`, the group sizes a scheduler option
        ({"group_cost": COST}, TypeError, "unexpected keyword argument 'group_cost'"),
        ({"cp_group_sizes": "any"}, TypeError, "unexpected keyword argument 'cp_group_sizes'"),
        ({"planning_cost": COST}, TypeError, "unexpected keyword argument 'planning_cost'"),
    ],
)
def test_refusals_name_the_option(kw, error, message):
    with pytest.raises(error, match=message):
        dynamic(**kw)


def test_in_the_fingerprint():
    off = PackingConfig(samples_per_rank=4, max_tokens_per_rank=64)
    assert off.summary()["dynamic_cp"] == "False"
    on = dynamic()
    assert on.summary()["dynamic_cp"] == "True" and "ring_step=0.0001" in on.summary()["cost"]
    assert "DynamicCpScheduler(group_sizes='pow2')" == on.summary()["scheduler"]
    wider = dynamic(scheduler_options={"group_sizes": "any"})
    assert len({off.fingerprint(), on.fingerprint(), wider.fingerprint()}) == 3
    assert dynamic(cost=dataclasses.replace(COST, ring_step=2e-4)).fingerprint() != on.fingerprint()


def test_resolve_uses_the_single_rank_padding():
    topology = Topology(dp_size=2, cp_size=2, dp_rank=0, cp_rank=0, groups={"dp": object(), "cp": object()})
    assert dynamic().resolve(topology).pad_multiple == 1  # not 2*cp: a group of c pads to 2*c times it
    assert dynamic(fp8=True).resolve(topology).pad_multiple == 16
    assert dynamic(pad_multiple=3).resolve(topology).pad_multiple == 3
    with pytest.raises(ConfigError, match="max_tokens_per_rank=8 is smaller than pad_multiple=16"):
        dynamic(max_tokens_per_rank=8, fp8=True).resolve(topology)


def test_calibrate_under_dynamic_cp_fits_the_group_cost():
    assert dynamic(calibrate=True).calibrate is True
    cal = CostCalibrator(dataclasses.replace(COST, reference_size=1))
    assert cal.fits_groups and dynamic(calibrate=cal, cost=cal.prior).calibrate is cal
    with pytest.raises(ConfigError, match="prices CP groups .* pass dynamic_cp=True"):
        PackingConfig(samples_per_rank=4, max_tokens_per_rank=64, calibrate=cal)


def test_dynamic_cp_alone_plans_with_the_default_models_flops_and_an_h100_ring():
    config = dynamic(cost=None)
    assert config.cost is None
    prior = resolved_cost(config, config.build_scheduler())
    assert prior == CostModel.from_model(model_preset(DEFAULT_MODEL), "h100-nvlink-ib400")
    assert prior.has_ring and prior.reference_size == 1
    assert prior.at(1) == model_preset(DEFAULT_MODEL).cost_model()  # its compute terms: the FLOPs model's


def test_the_default_ring_is_te_p2p_over_the_named_links_in_flops():
    spec = ModelSpec(hidden_size=1024, num_layers=4, num_attention_heads=8, ffn_hidden_size=4096, num_query_groups=2)
    cost = CostModel.from_model(spec, "a100-nvlink-ib200")
    links = INTERCONNECTS["a100-nvlink-ib200"]
    kv_bytes = 2 * 2 * 128 * 2  # K and V, 2 groups, head width 1024/8, bf16
    transfers = 3 * 4  # forward K/V, backward K/V and dK/dV, per attention layer
    assert cost.ring_token == pytest.approx(transfers * kv_bytes / links.intra_node_bandwidth * links.device_flops)
    assert cost.ring_token_inter == pytest.approx(
        transfers * kv_bytes / links.inter_node_bandwidth * links.device_flops
    )
    assert cost.ring_step == pytest.approx(transfers * links.step_latency * links.device_flops)
    assert cost.at(1) == spec.cost_model() and cost.ranks_per_node == links.ranks_per_node


def test_the_default_ring_refuses_what_it_cannot_price():
    with pytest.raises(ConfigError, match=r"unknown interconnect 'tpu'; valid: h100-nvlink-ib400"):
        CostModel.from_model(model_preset("llama3-8b"), "tpu")
    mamba = ModelSpec(
        hidden_size=256, num_layers=2, num_attention_heads=4, ffn_hidden_size=512, hybrid_layer_pattern="MM"
    )
    with pytest.raises(ConfigError, match="no attention layer"):
        CostModel.from_model(mamba)
    with pytest.raises(SeqpackTypeError, match="interconnect must be a name"):
        get_interconnect(3)
