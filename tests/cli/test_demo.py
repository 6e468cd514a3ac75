"""seqpack demo: a real (small) multi-process run, argument errors, port clash, dead rank."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from seqpack.cli import main
from seqpack.cli.demo import predict as gpu
from seqpack.cli.demo import settings as demo_settings
from seqpack.cli.demo.data import padded_microbatches
from seqpack.cli.demo.settings import GPU_CAPACITY, DemoSettings
from seqpack.cost import CostModel
from seqpack.schedulers import get_scheduler, predicted_step_time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.processes
def test_demo_runs_all_modes_and_reports(tmp_path):
    out = tmp_path / "demo.json"
    cmd = [
        sys.executable,
        "-m",
        "seqpack.cli",
        "demo",
        "--dp",
        "2",
        "--cp",
        "1",
        "--steps",
        "2",
        "--samples-per-rank",
        "6",
        "--max-tokens-per-rank",
        "1024",
        "--max-seq-len",
        "256",
        "--mean-seq-len",
        "64",
        "--d-model",
        "32",
        "--pattern",
        "AM",
        "--predict-dp",
        "4",
        "--json-out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "summary: dp=2 cp=1" in proc.stdout and "[   balanced] step  3/3" in proc.stdout
    report = json.loads(out.read_text())
    modes = {r["mode"]: r for r in report["results"]}
    assert set(modes) == {"balanced", "dp_balanced", "padded"}
    # Same data, same initial weights, same global mean loss: the modes train identically.
    losses = {m: (r["first_loss"], r["last_loss"]) for m, r in modes.items()}
    assert losses["balanced"][0] == pytest.approx(losses["padded"][0], rel=1e-5)
    assert losses["balanced"][1] == pytest.approx(losses["dp_balanced"][1], rel=1e-4)
    assert losses["balanced"][1] == pytest.approx(losses["padded"][1], rel=1e-4)
    assert modes["padded"]["pad_fraction"] > modes["balanced"]["pad_fraction"]
    assert modes["padded"]["microbatches_per_step"] > modes["balanced"]["microbatches_per_step"]
    assert all(r["tokens_per_s"] > 0 and r["busy_tokens_per_s"] > 0 and r["steps"] == 2 for r in modes.values())
    assert "busy tok/s" in proc.stdout and "predicted, not measured" in proc.stdout
    assert {(r["gpu"], r["mode"]) for r in report["gpu_prediction"]} == {
        (c.name, m) for c in gpu.GPU_CLOCKS for m in ("balanced", "dp_balanced", "padded")
    }
    # Online calibration (the default cost): every trained step's prediction was checked
    # against its measured time (the last one after the end of data), and printed.
    for mode in ("balanced", "dp_balanced"):
        steps = [p[0] for p in modes[mode]["predictions"]]
        assert steps == [0, 1, 2] and all(p[1] > 0 and p[2] > 0 for p in modes[mode]["predictions"])
        assert modes[mode]["prediction_error_mean_abs"] is not None
        fitted = modes[mode]["predicted_by_fitted"]
        assert 0 <= fitted <= 3 and (modes[mode]["prediction_error_fitted"] is None) == (fitted == 0)
    assert "padded" in modes and "predictions" not in modes["padded"]
    assert "step 1: predicted" in proc.stdout and "online cost (balanced)" in proc.stdout


@pytest.mark.processes
def test_demo_context_parallel_on_one_replica(tmp_path):
    """``--cp 2`` on two cores: one replica of two CP ranks, the hybrid model's CP path, and
    online calibration with a single replica."""
    out = tmp_path / "demo.json"
    flags = {"--dp": 1, "--cp": 2, "--steps": 1, "--samples-per-rank": 6, "--max-tokens-per-rank": 512}
    flags |= {"--max-seq-len": 512, "--mean-seq-len": 64, "--d-model": 32, "--pattern": "AM", "--predict-dp": 0}
    cmd = [sys.executable, "-m", "seqpack.cli", "demo", *(str(a) for kv in flags.items() for a in kv)]
    proc = subprocess.run([*cmd, "--json-out", str(out)], capture_output=True, text=True, timeout=600, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    modes = {r["mode"]: r for r in json.loads(out.read_text())["results"]}
    assert modes["balanced"]["last_loss"] == pytest.approx(modes["padded"]["last_loss"], rel=1e-4)
    assert "dp=1 x cp=2" in proc.stdout


def test_demo_argument_errors(capsys, tmp_path):
    assert main(["demo", "--dp", "-1"]) == 2
    assert "--dp must be an integer >= 0, got -1" in capsys.readouterr().err
    assert main(["demo", "--data", str(tmp_path / "missing.parquet")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["demo", "--modes", "balanced,fast"]) == 2
    assert "--modes must be a non-empty subset" in capsys.readouterr().err
    assert main(["demo", "--max-seq-len", "9000"]) == 2
    assert "raise --max-tokens-per-rank" in capsys.readouterr().err


def test_demo_port_in_use_is_a_clear_error(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert main(["demo", "--port", str(port)]) == 2
    assert f"--port {port} is already in use" in capsys.readouterr().err


def _children(pid):
    out = subprocess.run(["ps", "-ww", "-o", "pid=,args=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if "multiprocessing-fork" in line or "spawn_main" in line]


@pytest.mark.processes
def test_demo_dead_rank_ends_the_run_with_an_error():
    cmd = [
        sys.executable,
        "-m",
        "seqpack.cli",
        "demo",
        "--dp",
        "2",
        "--cp",
        "1",
        "--steps",
        "200",
        "--quiet",
        "--d-model",
        "32",
        "--pattern",
        "AM",
        "--max-tokens-per-rank",
        "1024",
        "--max-seq-len",
        "1024",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        deadline = time.time() + 120
        workers = []
        while time.time() < deadline and len(workers) < 2:
            time.sleep(0.5)
            workers = _children(proc.pid)
        assert len(workers) == 2, "demo workers did not start"
        time.sleep(3)
        os.kill(workers[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "died" in err or "raised" in err


def test_padded_baseline_pads_to_longest_and_attends_pads():
    import torch

    settings = DemoSettings(dp=1, cp=2, max_tokens_per_rank=16, max_seq_len=8, mean_seq_len=4, min_seq_len=1)
    samples = [{"input_ids": torch.arange(1, n + 1)} for n in (3, 7, 2, 2, 5)]
    batches = padded_microbatches(samples, settings, list(range(5)))
    # capacity 32 // max_seq_len 8 = 4 sequences per microbatch, each padded to its longest (x4).
    assert [b.num_sequences for b in batches] == [4, 1]
    assert batches[0].seq_lens_padded().tolist() == [8, 8, 8, 8]
    assert batches[1].seq_lens_padded().tolist() == [8]
    assert torch.equal(batches[0].cu_seqlens, batches[0].cu_seqlens_padded)
    assert batches[0].num_real_tokens == 14


def test_default_layout_is_one_rank_per_usable_core(monkeypatch):
    monkeypatch.setattr(demo_settings, "usable_cores", lambda: 2)
    assert (DemoSettings().dp, DemoSettings().cp) == (2, 1)
    assert DemoSettings(cp=2).dp == 1  # two CP ranks fill the two cores
    assert DemoSettings(dp=3).dp == 3  # an explicit --dp is kept
    monkeypatch.setattr(demo_settings, "usable_cores", lambda: 64)
    assert DemoSettings().dp == demo_settings.MAX_DEFAULT_DP
    with pytest.raises(ValueError, match="--dp must be"):
        DemoSettings(dp=-1)


def test_prediction_settings_are_checked():
    with pytest.raises(ValueError, match="--predict-dp must be"):
        DemoSettings(predict_dp=-1)
    with pytest.raises(ValueError, match="or pass --predict-dp 0"):
        DemoSettings(max_seq_len=2 * GPU_CAPACITY, max_tokens_per_rank=2 * GPU_CAPACITY)
    DemoSettings(max_seq_len=2 * GPU_CAPACITY, max_tokens_per_rank=2 * GPU_CAPACITY, predict_dp=0)


def _padded_by_hand(lengths, dp, per_mb, clock):
    """Lockstep time of fixed microbatches, each sequence padded to its microbatch's longest."""
    total = 0.0
    rows = np.asarray(lengths).reshape(dp, -1)
    for start in range(0, rows.shape[1], per_mb):
        worst = 0.0
        for row in rows:
            group = row[start : start + per_mb]
            longest = -(-int(group.max()) // clock.pad_multiple) * clock.pad_multiple
            worst = max(worst, clock.cost.microbatch_cost([longest] * len(group)))
        total += worst
    return total


def test_gpu_prediction_prices_each_mode_s_plans_with_each_clock():
    settings = DemoSettings(dp=2, predict_dp=4, steps=2, samples_per_rank=6, max_tokens_per_rank=2048, max_seq_len=1024)
    rows = gpu.predict(settings)
    batches = gpu.gpu_lengths(settings)
    per_gpu = gpu.gpu_samples_per_rank(settings)
    assert batches.shape == (2, 4 * per_gpu) and per_gpu == 6 * GPU_CAPACITY // 2048
    assert batches.max() <= 1024 and len(np.unique(batches)) > 10
    for clock in gpu.GPU_CLOCKS:
        mine = {r["mode"]: r for r in rows if r["gpu"] == clock.name}
        for mode in ("balanced", "dp_balanced"):
            plans = [
                get_scheduler(mode).schedule(
                    b, dp_size=4, max_tokens_per_rank=GPU_CAPACITY, pad_multiple=clock.pad_multiple, cost=clock.cost,
                    sync="lockstep",
                )
                for b in batches
            ]  # fmt: skip
            assert mine[mode]["step_s"] == pytest.approx(np.mean([predicted_step_time(p, clock.cost) for p in plans]))
            assert mine[mode]["microbatches"] == np.mean([p.num_microbatches for p in plans])
        per_mb = GPU_CAPACITY // 1024
        by_hand = np.mean([_padded_by_hand(b, 4, per_mb, clock) for b in batches])
        assert mine["padded"]["step_s"] == pytest.approx(by_hand)
        assert mine["padded"]["microbatches"] == -(-per_gpu // per_mb)
        assert mine["padded"]["step_s"] > mine["balanced"]["step_s"]  # not vacuous: the modes differ
    table = gpu.format_prediction(rows, settings)
    assert "predicted, not measured" in table and "dp=4 GPUs" in table
    h200 = {r["mode"]: r["step_s"] for r in rows if r["gpu"] == "H200"}
    assert f"{h200['dp_balanced'] / h200['balanced']:.2f}x" in table
    assert f"{h200['balanced'] * 1e3:,.1f}" in table


def _h200_rows():
    path = os.path.join(REPO, "benchmarks/results/gpu/h200_2026-11-28/gpu_step_transformer.json")
    with open(path) as f:
        calibration = json.load(f)["calibration"]
    return calibration["packs"], calibration["seconds"]


def _h100_rows():
    path = "/work/shared/data/h100_te_clock.json"
    if not os.path.exists(path):
        pytest.skip(f"{path} (the H100 measurements) is not on this machine")
    with open(path) as f:
        rows = json.load(f)["h2048x4"]["microbatches"]
    return [r["lengths"] for r in rows], [r["seconds"] for r in rows]


@pytest.mark.parametrize("name, rows", [("H100", _h100_rows), ("H200", _h200_rows)])
def test_gpu_clocks_are_fits_of_the_measured_microbatches(name, rows):
    clock = next(c for c in gpu.GPU_CLOCKS if c.name == name)
    packs, seconds = rows()
    padded = [[-(-n // clock.pad_multiple) * clock.pad_multiple for n in pack] for pack in packs]
    fit = CostModel.fit(padded, seconds)
    assert clock.cost.coefficients == pytest.approx(fit.coefficients, rel=1e-6)


def test_default_data_gives_the_planner_choices():
    """Every default step holds several microbatches per replica and a long tail, where
    next-fit's rounds cost the tiny model >= 1.1x balanced's (its FLOPs, lockstep)."""
    from seqpack.cli.demo.data import load_dataset, sample_order

    settings = DemoSettings(dp=2)
    dataset, vocab = load_dataset(settings)
    cost = settings.tiny_config(vocab).model_spec().cost_model()
    lengths = dataset.lengths[sample_order(settings, len(dataset))]
    for batch in lengths.reshape(settings.total_steps, -1):
        plans = {
            mode: get_scheduler(mode).schedule(
                batch, dp_size=2, max_tokens_per_rank=settings.max_tokens_per_rank, cost=cost, sync="lockstep"
            )
            for mode in ("balanced", "dp_balanced")
        }
        assert plans["balanced"].num_microbatches >= 2 and batch.max() > 4 * batch.mean()
        step = {mode: predicted_step_time(plan, cost) for mode, plan in plans.items()}
        assert step["dp_balanced"] >= 1.1 * step["balanced"]
