import json
import time

import numpy as np
import pytest

from seqpack.cli import main, simulate
from seqpack.mock_data import lognormal_lengths, write_lengths


def test_simulate_table(capsys):
    assert main(["simulate", "--dp", "8", "--steps", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    for name in ("balanced", "dp_balanced", "empty"):
        assert f"\n{name} " in out
    assert "replica/LB" in out and "round imb." in out and "2 steps x 128 sequences into dp=8 x cp=1" in out


def test_simulate_json_from_file_and_config(tmp_path, capsys):
    path = tmp_path / "lens.csv"
    write_lengths(path, lognormal_lengths(300, min_seq_len=64, max_seq_len=4096, mean_seq_len=1024))
    args = [
        "simulate",
        "--lengths",
        str(path),
        "--dp",
        "4",
        "--cp",
        "2",
        "--max-tokens-per-rank",
        "2048",
        "--global-batch",
        "100",
        "--steps",
        "3",
        "--json",
        "--no-progress",
        "--schedulers",
        "balanced,dp_balanced",
    ]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config"]["pad_multiple"] == 4 and report["config"]["capacity"] == 4096
    assert report["config"]["lengths_repeated"] is False
    bal, mega = report["results"]["balanced"], report["results"]["dp_balanced"]
    assert bal["bound_ratio"] <= mega["bound_ratio"] and bal["flops_per_step"] == mega["flops_per_step"] > 0
    assert "steps" not in bal
    cfg = json.dumps({"mode": "file", "path": str(path)})
    assert (
        main(
            [
                "simulate",
                "--config",
                cfg,
                "--dp",
                "2",
                "--steps",
                "1",
                "--json",
                "--per-step",
                "--no-progress",
                "--model",
                "tokens",
                "--max-tokens-per-rank",
                "4096",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["config"]["model"] is None and len(report["results"]["balanced"]["steps"]) == 1


@pytest.mark.slow
def test_simulate_plot(tmp_path, capsys):
    png = tmp_path / "load.png"
    assert (
        main(
            [
                "simulate",
                "--dp",
                "4",
                "--steps",
                "1",
                "--plot",
                str(png),
                "--no-progress",
                "--order",
                "pipeline",
                "--sync",
                "replica",
            ]
        )
        == 0
    )
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 20_000
    assert f"plot written to {png}" in capsys.readouterr().out


def test_simulate_1024_replicas_is_fast():
    lengths = lognormal_lengths(16384, min_seq_len=1024, max_seq_len=8192, mean_seq_len=4096)
    start = time.perf_counter()
    report = simulate(
        lengths,
        schedulers=["balanced", "dp_balanced", "empty"],
        dp_size=1024,
        max_tokens_per_rank=16384,
        global_batch=16384,
        steps=1,
    )
    assert time.perf_counter() - start < 20  # generous: shared CI cores
    assert report["results"]["balanced"]["bound_ratio"] < 1.05


def test_simulate_errors(capsys):
    assert main(["simulate", "--schedulers", "balanced,magic", "--no-progress"]) == 2
    assert "unknown scheduler(s) ['magic']" in capsys.readouterr().err
    assert main(["simulate", "--dp", "0", "--no-progress"]) == 2
    assert "--dp must be >= 1" in capsys.readouterr().err
    assert main(["simulate", "--max-tokens-per-rank", "1000", "--steps", "1", "--no-progress"]) == 2
    assert "--on-oversize truncate or drop" in capsys.readouterr().err
    assert (
        main(
            [
                "simulate",
                "--max-tokens-per-rank",
                "1000",
                "--steps",
                "1",
                "--no-progress",
                "--on-oversize",
                "drop",
                "--dp",
                "2",
            ]
        )
        == 0
    )
    assert "sequences dropped" in capsys.readouterr().out


def test_simulate_applies_the_wrappers_pad_multiple_rule():
    from seqpack.errors import ConfigError

    lengths = lognormal_lengths(64, min_seq_len=16, max_seq_len=512, mean_seq_len=128)
    kwargs = dict(schedulers=["balanced"], dp_size=2, cp_size=2, max_tokens_per_rank=1024, global_batch=32, steps=1)
    assert simulate(lengths, **kwargs)["config"]["pad_multiple"] == 4  # pad_multiple_for(cp=2)
    assert simulate(lengths, pad_multiple=8, **kwargs)["config"]["pad_multiple"] == 8
    with pytest.raises(ConfigError, match="pad_multiple 6 is not a multiple of 2 \\* cp_size = 4"):
        simulate(lengths, pad_multiple=6, **kwargs)
    with pytest.raises(ConfigError, match="pad_multiple must be a positive integer, got 0"):
        simulate(lengths, pad_multiple=0, **kwargs)


def test_simulate_repeats_lengths_without_materializing_every_step():
    lengths = lognormal_lengths(10, min_seq_len=16, max_seq_len=512, mean_seq_len=128)
    report = simulate(lengths, schedulers=["empty"], dp_size=2, max_tokens_per_rank=1024, global_batch=7, steps=3,
                      model=None)  # fmt: skip
    assert report["config"]["lengths_repeated"] is True
    steps = report["results"]["empty"]["steps"]
    pool = np.tile(lengths, 3)  # the obvious reference: the lengths repeated, cut into steps of 7
    for k, step in enumerate(steps):
        assert step["sequences"] == 7
        assert step["ideal"] * 2 == pytest.approx(pool[7 * k : 7 * (k + 1)].sum())  # token cost: total / dp


@pytest.mark.slow
def test_simulate_reports_moved_tokens_plan_time_and_memory():
    lengths = lognormal_lengths(4096, min_seq_len=1024, max_seq_len=8192, mean_seq_len=4096)
    kwargs = dict(dp_size=64, max_tokens_per_rank=16384, global_batch=1024, steps=2, bytes_per_token=100)
    on = simulate(lengths, schedulers=["balanced", "dp_balanced"], scheduler_options=_locality(True), **kwargs)
    off = simulate(lengths, schedulers=["balanced"], scheduler_options=_locality(False), **kwargs)
    bal, ref = on["results"]["balanced"], on["results"]["dp_balanced"]
    assert bal["moved_fraction"] < off["results"]["balanced"]["moved_fraction"] <= ref["moved_fraction"]
    row = bal["steps"][0]
    assert row["rank_moved_bytes"] > 0 and row["moved_bytes"] >= row["rank_moved_bytes"]
    assert on["config"]["bytes_per_token"] == 100.0 and bal["seconds_mean"] > 0
    assert bal["peak_bytes"] is None or bal["peak_bytes"] >= 0


def _locality(value):
    return {"balanced": {"locality": value}}


def test_simulate_decides_locality_auto_by_the_bytes_per_token_and_says_so(capsys):
    lengths = lognormal_lengths(2048, min_seq_len=1024, max_seq_len=8192, mean_seq_len=4096)
    kwargs = dict(schedulers=["balanced"], dp_size=64, max_tokens_per_rank=16384, global_batch=1024, steps=2)
    moved = {}
    for payload in (20, 4096):
        for option in ("auto", True, False):
            r = simulate(lengths, scheduler_options=_locality(option), bytes_per_token=payload, **kwargs)
            moved[payload, option] = r["results"]["balanced"]["moved_fraction"]
            steps = r["results"]["balanced"]["locality_steps"]
            assert steps == (2 if option is True or (option == "auto" and payload == 4096) else 0)
            assert 20 < r["results"]["balanced"]["locality_break_even"] < 4096
    assert moved[20, "auto"] == moved[20, False] > moved[20, True]  # token ids: off
    assert moved[4096, "auto"] == moved[4096, True] < moved[4096, False]  # a 1K-float row per token: on
    args = ["simulate", "--dp", "64", "--global-batch", "1024", "--steps", "2", "--no-progress"]
    assert main([*args, "--schedulers", "balanced,dp_balanced"]) == 0
    out = capsys.readouterr().out
    assert "balanced: locality auto: off at 20 bytes per token; it pays above " in out and "dp_balanced: loc" not in out
    assert main([*args, "--schedulers", "balanced", "--bytes-per-token", "4096"]) == 0
    assert "balanced: locality auto: on at 4096 bytes per token" in capsys.readouterr().out
    assert main([*args, "--schedulers", "balanced", "--locality", "on"]) == 0
    assert "balanced: locality on (--locality on)" in capsys.readouterr().out
    assert main([*args, "--schedulers", "balanced", "--locality", "off", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config"]["balanced"]["locality"] is False and report["results"]["balanced"]["locality_steps"] == 0


@pytest.mark.slow
def test_simulate_many_replicas_few_sequences(capsys):
    # dp x dp data would be 74.5 GiB here; the plan is O(N + dp).
    args = ["simulate", "--dp", "100000", "--global-batch", "64", "--steps", "1", "--schedulers", "balanced"]
    assert main([*args, "--no-progress", "--bytes-per-token", "4096"]) == 0
    out = capsys.readouterr().out
    assert "dp=100000" in out and "MB/rank" in out and "peak MB" in out


def test_simulate_accounts_a_step_by_its_sequences_not_its_replicas(monkeypatch):
    """A step's FLOPs come from the ids it trains: the per-replica view (``Schedule.assignment``,
    an array per replica and microbatch) took 40% of a dp=10**6 run of 1,000 sequences."""
    from seqpack.cost import model_preset
    from seqpack.schedulers import Schedule

    def per_replica_view(schedule):
        raise AssertionError("simulate built Schedule.assignment: O(dp x microbatches) arrays")

    monkeypatch.setattr(Schedule, "assignment", property(per_replica_view))
    lengths = lognormal_lengths(48, min_seq_len=64, max_seq_len=4096, mean_seq_len=1024)
    report = simulate(lengths, schedulers=["balanced", "dp_balanced", "empty"], dp_size=200, max_tokens_per_rank=4096,
                      global_batch=48, steps=1)  # fmt: skip
    flops = float(model_preset("llama3-8b").sequence_flops(lengths))  # every sequence trained once
    assert [r["flops_per_step"] for r in report["results"].values()] == [flops] * 3


def test_simulate_refuses_what_cannot_fit(monkeypatch, capsys):
    from seqpack.cli.commands import simulate as command

    monkeypatch.setattr(command, "available_bytes", lambda: 1 << 30)
    assert main(["simulate", "--dp", "10000000", "--global-batch", "64", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--dp 10,000,000 with --global-batch 64 and --steps 10 needs about" in err
    assert "1.0 GiB available: lower --dp, --global-batch or --steps" in err
    assert main(["simulate", "--bytes-per-token", "-1", "--no-progress"]) == 2
    assert "--bytes-per-token must be >= 0, got -1.0" in capsys.readouterr().err


def test_simulate_names_the_file_when_it_holds_nothing_to_schedule(tmp_path, capsys):
    empty, zeros, half = tmp_path / "empty.csv", tmp_path / "zeros.csv", tmp_path / "half.csv"
    empty.write_text("length\n")
    zeros.write_text("length\n" + "0\n" * 128)
    half.write_text("length\n" + "0\n100\n" * 60)
    assert main(["simulate", "--lengths", str(empty), "--no-progress"]) == 2
    assert f"--lengths {empty}: no lengths in it" in capsys.readouterr().err
    assert main(["simulate", "--lengths", str(zeros), "--global-batch", "128", "--steps", "1", "--no-progress"]) == 2
    assert f"--lengths {zeros}: all 128 lengths are 0" in capsys.readouterr().err
    args = ["simulate", "--lengths", str(half), "--global-batch", "120", "--steps", "1", "--dp", "4", "--no-progress"]
    assert main(args) == 0
    assert "60 zero-length samples dropped over 1 steps" in capsys.readouterr().out
