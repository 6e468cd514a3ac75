"""seqpack.thd.mrope at its edges: MRopeSpec refuses a temporal spacing that is no positive
finite number and a config without a placeholder id, naming them; the runs of a sample are
those of itertools.groupby, an empty sample has none and no positions."""

from __future__ import annotations

import itertools
import math
import types

import pytest
import torch

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.thd.mrope import MRopeSpec, mrope_positions, placeholder_runs


def _spec(**overrides):
    return MRopeSpec(**{"model_type": "qwen2_5_vl", "image_token_id": 5, "video_token_id": 6, **overrides})


@pytest.mark.parametrize("value", [True, "2", None])
def test_a_tokens_per_second_that_is_no_number_is_a_type_error_naming_it(value):
    with pytest.raises(SeqpackTypeError, match=rf"MRopeSpec.tokens_per_second must be a number, got {value!r}"):
        _spec(tokens_per_second=value)


@pytest.mark.parametrize("value", [0, -1.0, math.inf, math.nan])
def test_a_tokens_per_second_that_is_not_finite_and_positive_is_refused_naming_it(value):
    with pytest.raises(ConfigError, match=rf"tokens_per_second must be finite and > 0, got {value}"):
        _spec(tokens_per_second=value)


def test_an_integer_tokens_per_second_is_a_number():
    assert _spec(tokens_per_second=2).tokens_per_second == 2


@pytest.mark.parametrize(
    ("ids", "missing"),
    [({"image_token_id": 5}, "video_token_id"), ({"video_token_id": 6}, "image_token_id"),
     ({}, "image_token_id or video_token_id")],
)  # fmt: skip
def test_a_config_without_a_placeholder_id_is_refused_naming_it(ids, missing):
    config = types.SimpleNamespace(
        model_type="qwen2_vl", vision_config=types.SimpleNamespace(spatial_merge_size=2), **ids
    )
    with pytest.raises(ConfigError, match=rf"the qwen2_vl config has no {missing}$"):
        MRopeSpec.from_hf(config)
    spec = MRopeSpec.from_hf(types.SimpleNamespace(**{**vars(config), "image_token_id": 5, "video_token_id": 6}))
    assert (spec.image_token_id, spec.video_token_id, spec.spatial_merge_size) == (5, 6, 2)


@pytest.mark.parametrize("seed", range(5))
def test_placeholder_runs_are_the_groups_of_equal_types(seed):
    g = torch.Generator().manual_seed(seed)
    length = int(torch.randint(1, 40, (1,), generator=g))
    # Long runs: each value repeated a random number of times.
    kinds = torch.randint(0, 3, (length,), generator=g)
    types_ = torch.repeat_interleave(kinds, torch.randint(1, 5, (length,), generator=g))
    expected, at = [], 0
    for kind, run in itertools.groupby(types_.tolist()):
        n = len(list(run))
        expected.append((kind, at, at + n))
        at += n
    assert placeholder_runs(types_) == expected


def test_one_token_is_one_run_and_an_empty_sample_has_none_and_no_positions():
    assert placeholder_runs(torch.tensor([2])) == [(2, 0, 1)]
    assert placeholder_runs(torch.zeros(0, dtype=torch.int64)) == []
    positions = mrope_positions([], {}, _spec())
    assert positions.dtype == torch.int64 and positions.shape == (3, 0)
