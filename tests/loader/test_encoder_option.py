"""PackingConfig(encoder_rebalance=): "auto" (the default), True or False; True where the route
cannot run is refused by name (no images without mrope, one DP rank, CP, pipeline stages), and
"auto" there is simply off. rebalance_encoder takes the same values; rebalance_for_config (what
rebalance_for_steps and the Trainer mixin call) installs nothing where the config
is off, and prices at a calibrator's fitted encoder price."""

from __future__ import annotations

import numpy as np
import pytest

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.loader import PackingConfig
from seqpack.thd import MRopeSpec
from seqpack.topology import Topology

SPEC = MRopeSpec(model_type="qwen2_vl", image_token_id=120, video_token_id=121)


def _config(**options) -> PackingConfig:
    return PackingConfig(samples_per_rank=2, max_tokens_per_rank=64, **options)


def test_values_and_the_default():
    assert _config().encoder_rebalance == "auto"
    assert _config(mrope=SPEC, encoder_rebalance=True).encoder_rebalance is True
    assert _config(encoder_rebalance=False).encoder_rebalance is False
    with pytest.raises(ConfigError, match=r"encoder_rebalance must be 'auto', True or False, got 'on'"):
        _config(encoder_rebalance="on")
    for bad in (1, None, np.array([1, 2])):  # 1 is not True
        with pytest.raises(SeqpackTypeError, match=r"encoder_rebalance must be 'auto', True or False, got"):
            _config(encoder_rebalance=bad)
    with pytest.raises(ConfigError, match="encoder_rebalance=True needs mrope"):
        _config(encoder_rebalance=True)
    # Not part of the data: text configs' fingerprints stay.
    assert _config(encoder_rebalance=False).fingerprint() == _config().fingerprint()


def test_true_where_the_route_cannot_run_is_refused_and_auto_is_off():
    dp2 = Topology(dp_size=2, dp_rank=0, world_size=2, groups={"dp": object()})
    cp2 = Topology(dp_size=2, cp_size=2, world_size=4, groups={"dp": object(), "cp": object()})
    forced = _config(mrope=SPEC, encoder_rebalance=True)
    assert forced.resolve(dp2).encoder_rebalance is True
    with pytest.raises(ConfigError, match="one DP rank has no other rank to encode on"):
        forced.resolve(Topology.single())
    with pytest.raises(ConfigError, match="without CP or pipeline stages"):
        forced.resolve(cp2)
    assert _config(mrope=SPEC).resolve(Topology.single()).encoder_rebalance == "auto"


def test_rebalance_encoder_takes_the_same_values():
    pytest.importorskip("transformers")
    from vlm_data import tiny_vlm

    from seqpack.interop.hf_encoder import rebalance_encoder

    model = tiny_vlm("qwen2_vl")
    assert rebalance_encoder(model, None, mode=False) is None
    with pytest.raises(ConfigError, match="mode=True on one rank"):
        rebalance_encoder(model, None, mode=True)
    with pytest.raises(ConfigError, match="encoder_rebalance must be"):
        rebalance_encoder(model, None, mode="yes")
    with pytest.raises(ConfigError, match="seconds_per_flop must be a positive number, got True"):
        rebalance_encoder(model, None, seconds_per_flop=True)
    hooks = rebalance_encoder(model, None)  # "auto" on one rank: nothing ever moves
    assert hooks is not None
    forward = model.model.visual.forward
    hooks.remove()
    assert model.model.visual.forward != forward  # the tower's own forward again


def test_rebalance_for_config_is_off_where_the_config_is():
    pytest.importorskip("transformers")
    from vlm_data import tiny_vlm

    from seqpack.interop.hf_encoder import rebalance_for_config

    model = tiny_vlm("qwen2_vl")
    forward = model.model.visual.forward
    dp2 = Topology(dp_size=2, dp_rank=0, world_size=2, groups={"dp": object()})
    cp2 = Topology(dp_size=2, cp_size=2, world_size=4, groups={"dp": object(), "cp": object()})
    for config, topology in (
        (_config(mrope=SPEC), Topology.single()),  # one DP rank
        (_config(mrope=SPEC), cp2),  # CP
        (_config(), dp2),  # no mrope: text
        (_config(mrope=SPEC, encoder_rebalance=False), dp2),
    ):
        assert rebalance_for_config(model, topology, config) is None  # nothing created, no collective
    assert model.model.visual.forward == forward
    with pytest.raises(ConfigError, match="one DP rank has no other rank to encode on"):
        rebalance_for_config(model, Topology.single(), _config(mrope=SPEC, encoder_rebalance=True))


def test_the_calibrated_price():
    from seqpack.calibrate import CostCalibrator
    from seqpack.cost import CostModel
    from seqpack.interop.hf_encoder import calibrated_seconds_per_flop
    from seqpack.schedulers.encoder_plan import DEFAULT_SECONDS_PER_FLOP

    assert calibrated_seconds_per_flop(None) == DEFAULT_SECONDS_PER_FLOP
    prior = CostModel(linear=1.0, quadratic=0.0)
    # Not fitted: the prior's units are not seconds; no encoder term: no price.
    assert calibrated_seconds_per_flop(CostCalibrator(prior, encoder_price=2.0)) == DEFAULT_SECONDS_PER_FLOP
    assert calibrated_seconds_per_flop(CostCalibrator(prior, prior_in_seconds=True)) == DEFAULT_SECONDS_PER_FLOP
    assert calibrated_seconds_per_flop(CostCalibrator(prior, prior_in_seconds=True, encoder_price=2e-15)) == 2e-15


def test_rebalance_for_config_creates_the_dp_groups_alone():
    """On dp=2 x tp=2 (4 ranks, this one rank 0), the route's groups are the DP groups only:
    no TP group is created for it (torch.distributed faked, the grouping code real)."""
    pytest.importorskip("transformers")
    from unittest import mock

    from vlm_data import tiny_vlm

    from seqpack.collective import groups as groups_module
    from seqpack.interop import hf_encoder
    from seqpack.topology import dist as topology_dist

    dp_group, tp_group = object(), object()
    members = {id(dp_group): [0, 2], id(tp_group): [0, 1]}  # TP fastest: rank = 2 * dp_rank + tp_rank
    topology = Topology(dp_size=2, tp_size=2, world_size=4, groups={"dp": dp_group, "tp": tp_group})
    created: list[list[int]] = []

    def new_group(ranks, backend, timeout):
        created.append(list(ranks))
        return f"group{ranks}"

    def gathered(mine, group):  # what ranks 0..3 send: per created axis, (leader, position)
        axes = {"dp": lambda r: (r % 2, r // 2), "tp": lambda r: (r - r % 2, r % 2)}
        order = ["dp", "tp"][: len(mine)]
        return [[axes[axis](r) for axis in order] for r in range(4)]

    fake = mock.Mock(is_available=lambda: True, is_initialized=lambda: True)
    fake.get_world_size.side_effect = lambda group=None: 4 if group is None else 2
    fake.get_rank.side_effect = lambda group=None: 0
    with (
        mock.patch.object(groups_module, "dist", fake),
        mock.patch.object(groups_module, "new_group", new_group),
        mock.patch.object(groups_module, "all_gather_objects", gathered),
        mock.patch.object(topology_dist, "get_process_group_ranks", lambda g: members[id(g)]),
        mock.patch.object(topology_dist, "is_initialized", lambda: True),
        mock.patch.object(hf_encoder.dist, "get_backend", lambda group=None: "gloo"),
    ):
        hooks = hf_encoder.rebalance_for_config(
            tiny_vlm("qwen2_vl"), topology, _config(mrope=SPEC, data_owner="all", encoder_rebalance=True)
        )
    assert hooks is not None and hooks.group == "group[0, 2]"
    assert created == [[0, 2], [1, 3]]  # every DP group (collective), no TP group
    hooks.remove()
