import json
import math

import numpy as np
import pytest

from seqpack.mock_data import (
    DISTRIBUTIONS,
    bimodal_lengths,
    constant_lengths,
    generate_lengths,
    lengths_from_config,
    lognormal_lengths,
    pareto_lengths,
    uniform_lengths,
    write_lengths,
)

MEGATRON = {
    "mode": "distribution",
    "type": "lognormal",
    "min_seq_len": 1024,
    "max_seq_len": 8192,
    "mean_seq_len": 4096,
    "lognormal_sigma": 1.1,
}


def test_lognormal_parameterization_matches_megatron():
    # mu = ln(mean) - sigma^2/2: with a wide clip range the sample mean is mean_seq_len.
    x = lognormal_lengths(200_000, min_seq_len=1, max_seq_len=10**9, mean_seq_len=4096, sigma=0.5, seed=1)
    assert x.dtype == np.int64 and x.shape == (200_000,)
    assert abs(x.mean() / 4096 - 1) < 0.01
    assert abs(np.median(x) / (4096 * math.exp(-0.125)) - 1) < 0.01
    y = lognormal_lengths(10_000, min_seq_len=1024, max_seq_len=8192, mean_seq_len=4096, seed=0)
    assert y.min() == 1024 and y.max() == 8192  # clipped at both ends (sigma 1.1)
    # Own generator: same seed same lengths, and the global RNG is untouched.
    np.random.seed(5)
    before = np.random.random()
    np.random.seed(5)
    assert np.array_equal(y, lognormal_lengths(10_000, min_seq_len=1024, max_seq_len=8192, mean_seq_len=4096))
    assert np.random.random() == before
    assert not np.array_equal(
        y, lognormal_lengths(10_000, min_seq_len=1024, max_seq_len=8192, mean_seq_len=4096, seed=1)
    )


def test_other_distributions():
    u = uniform_lengths(5000, min_seq_len=10, max_seq_len=20, seed=0)
    assert u.min() == 10 and u.max() == 20
    p = pareto_lengths(100_000, min_seq_len=100, max_seq_len=10**9, alpha=1.5, seed=0)
    # P(L > x) = (100/x)^1.5 -> P(L > 400) = 1/8.
    assert p.min() >= 100 and abs((p > 400).mean() - 0.125) < 0.005
    b = bimodal_lengths(
        50_000, min_seq_len=16, max_seq_len=32768, short_mean=500, long_mean=16000, long_fraction=0.3, seed=0
    )
    assert abs((b > 4000).mean() - 0.3) < 0.01
    assert np.array_equal(constant_lengths(3, length=7), [7, 7, 7])
    assert set(DISTRIBUTIONS) == {"lognormal", "uniform", "pareto", "bimodal", "constant"}
    assert np.array_equal(
        generate_lengths("uniform", 10, min_seq_len=1, max_seq_len=5, seed=3),
        uniform_lengths(10, min_seq_len=1, max_seq_len=5, seed=3),
    )


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: lognormal_lengths(-1, min_seq_len=1, max_seq_len=2, mean_seq_len=1),
            "n must be an integer >= 0, got -1",
        ),
        (
            lambda: lognormal_lengths(3, min_seq_len=9, max_seq_len=2, mean_seq_len=1),
            "min_seq_len=9 is larger than max_seq_len=2",
        ),
        (lambda: lognormal_lengths(3, min_seq_len=1, max_seq_len=2, mean_seq_len=0), "mean_seq_len must be > 0"),
        (lambda: uniform_lengths(3, min_seq_len=0, max_seq_len=2), "min_seq_len must be a positive integer"),
        (lambda: pareto_lengths(3, min_seq_len=1, max_seq_len=2, alpha=-1), "alpha must be > 0, got -1"),
        (lambda: pareto_lengths(3, min_seq_len=1, max_seq_len=2, alpha=0), "alpha must be > 0, got 0"),
        (lambda: lognormal_lengths(3, min_seq_len=1, max_seq_len=2, mean_seq_len=1, sigma=-1), "sigma must be >= 0"),
        (
            lambda: bimodal_lengths(3, min_seq_len=1, max_seq_len=9, short_mean=2, long_mean=5, long_fraction=2),
            "long_fraction must be in",
        ),
        (lambda: generate_lengths("zipf", 3), "unknown length distribution 'zipf'"),
        (
            lambda: generate_lengths("uniform", 3, min_seq_len=1, max_seq_len=2, mean=3),
            "bad parameters for the 'uniform'",
        ),
    ],
)
def test_generator_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_sigma_of_minus_zero_is_zero():
    lengths = lognormal_lengths(4, min_seq_len=1, max_seq_len=100, mean_seq_len=10, sigma=-0.0)
    assert lengths.tolist() == [10] * 4


def test_lengths_from_config_megatron_distribution(tmp_path):
    expected = lognormal_lengths(100, min_seq_len=1024, max_seq_len=8192, mean_seq_len=4096, sigma=1.1, seed=0)
    assert np.array_equal(lengths_from_config(MEGATRON, num_samples=100), expected)
    assert np.array_equal(lengths_from_config(json.dumps(MEGATRON), num_samples=100), expected)
    assert np.array_equal(lengths_from_config({**MEGATRON, "num_samples": 100}), expected)
    assert not np.array_equal(lengths_from_config(MEGATRON, num_samples=100, seed=1), expected)
    pareto = {"mode": "distribution", "type": "pareto", "min_seq_len": 64, "max_seq_len": 4096, "alpha": 1.1}
    assert lengths_from_config(pareto, num_samples=10).shape == (10,)


def test_lengths_from_config_file_mode(tmp_path):
    write_lengths(tmp_path / "lens.csv", [5, 6, 7])
    assert lengths_from_config({"mode": "file", "path": str(tmp_path / "lens.csv")}).tolist() == [5, 6, 7]
    # A config file: relative paths are relative to its folder.
    (tmp_path / "cfg.json").write_text(json.dumps({"mode": "file", "path": "lens.csv"}))
    assert lengths_from_config(tmp_path / "cfg.json").tolist() == [5, 6, 7]


@pytest.mark.parametrize(
    "config, match",
    [
        ("{not json", "config is not valid JSON"),
        ("[1, 2]", "config must be a JSON object"),
        ({"mode": "magic"}, "'mode' must be 'distribution' or 'file'"),
        ({"mode": "file"}, "file-mode config needs a 'path'"),
        ({**MEGATRON, "type": "zipf"}, "'type' must be one of"),
        (MEGATRON, "needs num_samples"),
        ({**MEGATRON, "num_samples": 4, "bogus": 1}, "bad parameters for the 'lognormal'"),
    ],
)
def test_lengths_from_config_errors(config, match):
    with pytest.raises(ValueError, match=match):
        lengths_from_config(config)


def test_mistakes_are_seqpack_errors():
    from seqpack.errors import ConfigError, SeqpackTypeError

    with pytest.raises(ConfigError, match="seed must be an integer >= 0, got -1"):
        uniform_lengths(3, min_seq_len=1, max_seq_len=5, seed=-1)
    with pytest.raises(SeqpackTypeError, match="min_seq_len must be a positive integer, got 1.5"):
        uniform_lengths(3, min_seq_len=1.5, max_seq_len=5)
    with pytest.raises(SeqpackTypeError, match="alpha must be a number"):
        pareto_lengths(3, min_seq_len=1, max_seq_len=5, alpha="big")
    with pytest.raises(ConfigError, match="max_seq_len=.* is too large"):
        uniform_lengths(3, min_seq_len=1, max_seq_len=2**63)
    # A wrong type inside a known parameter is not "bad parameters" (the signature binds).
    with pytest.raises(SeqpackTypeError, match="max_seq_len"):
        generate_lengths("uniform", 3, min_seq_len=1, max_seq_len="9")
    assert uniform_lengths(2, min_seq_len=1, max_seq_len=5, seed=None).shape == (2,)  # fresh entropy allowed


def test_config_paths_are_named(tmp_path):
    from seqpack.errors import ConfigError

    with pytest.raises(IsADirectoryError, match="is a directory"):
        lengths_from_config(str(tmp_path))
    with pytest.raises(ConfigError, match="neither a JSON object nor an existing file"):
        lengths_from_config(str(tmp_path / "missing.json"))
    (tmp_path / "cfg.json").write_text("{broken")
    with pytest.raises(ConfigError, match=r"config file .*cfg.json is not valid JSON"):
        lengths_from_config(str(tmp_path / "cfg.json"))
