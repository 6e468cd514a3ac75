"""PackingConfig and the option enums: validation names the bad value, one fingerprint."""

import dataclasses

import pytest

from seqpack.cost import CostModel, model_preset
from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.loader import PackingConfig
from seqpack.options import DataOwner, OnOversize
from seqpack.thd import StaticShapes
from seqpack.topology import Topology


def _config(**kw):
    kw.setdefault("samples_per_rank", 4)
    kw.setdefault("max_tokens_per_rank", 64)
    return PackingConfig(**kw)


def test_strings_become_enum_members_and_compare_equal():
    c = _config(data_owner="all", on_oversize="drop")
    assert c.data_owner is DataOwner.ALL and c.data_owner == "all"
    assert c.on_oversize is OnOversize.DROP


@pytest.mark.parametrize(
    "kw, error, message",
    [
        ({"samples_per_rank": 0}, ConfigError, "samples_per_rank must be a positive integer, got 0"),
        (
            {"samples_per_rank": 2.0},
            SeqpackTypeError,
            r"samples_per_rank must be a positive integer, got 2.0 \(float\)",
        ),
        ({"max_tokens_per_rank": True}, SeqpackTypeError, "max_tokens_per_rank must be a positive integer, got True"),
        ({"max_tokens_per_rank": 2**63}, ConfigError, r"max_tokens_per_rank=9223372036854775808 is too large"),
        ({"data_owner": "rank0"}, ConfigError, r"data_owner must be one of \('tp0', 'all'\), got 'rank0'"),
        ({"drop_last": 1}, SeqpackTypeError, "drop_last must be True or False, got 1"),
        ({"pad_multiple": -2}, ConfigError, "pad_multiple must be a positive integer, got -2"),
        ({"scheduler": "nope"}, ValueError, "unknown scheduler 'nope'"),
        ({"scheduler_options": {"order": "sideways"}}, ValueError, "order must be one of"),
        ({"scheduler_options": [1]}, SeqpackTypeError, "scheduler_options must be a mapping, got list"),
        (
            {"cost": model_preset("llama3-8b")},
            SeqpackTypeError,
            r"got ModelSpec \(ModelSpec.cost_model\(\) gives one\)",
        ),
        ({"flops_fn": 3}, SeqpackTypeError, "flops_fn must be callable, got int"),
        ({"minibatches": 0}, ConfigError, "minibatches must be a positive integer, got 0"),
        ({"minibatches": 2.0}, SeqpackTypeError, "minibatches must be a positive integer, got 2.0"),
        ({"minibatches": 5}, ConfigError, "minibatches=5 is more than samples_per_rank=4"),
    ],
)
def test_bad_values_are_named(kw, error, message):
    with pytest.raises(error, match=message):
        _config(**kw)


def test_frozen_and_keyword_only():
    c = _config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.samples_per_rank = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        PackingConfig(4, 64)  # type: ignore[misc]


def test_fingerprint_covers_every_field_that_changes_the_data():
    base = _config(scheduler="balanced")
    same = _config(scheduler="balanced", flops_fn=lambda s, ss: 1.0, validate_ranks=False)
    assert base.fingerprint() == same.fingerprint()  # stats-only and check-only fields do not count
    for change in (
        {"samples_per_rank": 5},
        {"max_tokens_per_rank": 32},
        {"pad_multiple": 8},
        {"on_oversize": "truncate"},
        {"drop_last": False},
        {"data_owner": "all"},
        {"check_schedule": True},
        {"scheduler_options": {"order": "pipeline"}},
        {"scheduler": "dp_balanced"},
        {"cost": CostModel(1.0, 0.0)},
        {"minibatches": 2},
        {"static_shapes": StaticShapes(max_sequences=4)},
        {"static_shapes": StaticShapes(max_sequences=4, tail_padding="extend_last")},
    ):
        assert base.replace(**change).fingerprint() != base.fingerprint(), change


def test_every_option_that_changes_the_data_is_in_the_summary():
    summary = _config().summary()
    assert {"minibatches", "sync", "calibrate", "label_format", "cp_layout", "static_shapes", "dynamic_cp"} <= set(
        summary
    )
    assert _config(minibatches=3).summary()["minibatches"] == "3"
    assert _config(minibatches=3).fingerprint() != _config().fingerprint()


def test_resolve_pad_multiple_against_the_topology():
    topo = Topology(dp_size=1, cp_size=2, world_size=2, groups={"cp": object()})
    assert _config().resolve(topo).pad_multiple == 4
    with pytest.raises(ConfigError, match="pad_multiple=3 is not a multiple of 2\\*cp_size=4"):
        _config(pad_multiple=3).resolve(topo)
    with pytest.raises(ConfigError, match=r"max_tokens_per_rank\(1\) \* cp\(2\) = 2 is smaller than pad_multiple=4"):
        _config(max_tokens_per_rank=1).resolve(topo)


def test_static_shapes_are_checked_against_the_topology():
    topo = Topology(dp_size=1, cp_size=2, world_size=2, groups={"cp": object()})
    ladder = StaticShapes(token_buckets=(32, 64, 128), max_sequences=4)
    assert _config(static_shapes=ladder).resolve(topo).static_shapes is ladder  # capacity 64 * 2 = 128
    assert _config(static_shapes=StaticShapes(max_sequences=4)).resolve(topo).pad_multiple == 4
    with pytest.raises(ConfigError, match=r"largest token bucket 64 .* must be the microbatch's capacity"):
        _config(static_shapes=StaticShapes(token_buckets=(32, 64), max_sequences=4)).resolve(topo)
    with pytest.raises(ConfigError, match=r"largest token bucket 256 .* capacity .* = 128"):
        _config(static_shapes=StaticShapes(token_buckets=(128, 256), max_sequences=4)).resolve(topo)
    with pytest.raises(ConfigError, match="token bucket 30 is not a multiple of pad_multiple=4"):
        _config(static_shapes=StaticShapes(token_buckets=(30, 128), max_sequences=4)).resolve(topo)


def test_static_shapes_refusals_name_the_value():
    with pytest.raises(SeqpackTypeError, match="static_shapes must be a seqpack.StaticShapes or None, got dict"):
        _config(static_shapes={"max_sequences": 4})
    with pytest.raises(ConfigError, match="static_shapes is not supported with dynamic_cp=True"):
        _config(static_shapes=StaticShapes(max_sequences=4), dynamic_cp=True)
