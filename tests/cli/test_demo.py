"""seqpack demo: a real (small) multi-process run, argument errors, port clash, dead rank."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from seqpack.cli import main
from seqpack.cli.demo.data import padded_microbatches
from seqpack.cli.demo.settings import DemoSettings

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
    assert all(r["tokens_per_s"] > 0 and r["steps"] == 2 for r in modes.values())
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


def test_demo_argument_errors(capsys, tmp_path):
    assert main(["demo", "--dp", "0"]) == 2
    assert "--dp must be a positive integer, got 0" in capsys.readouterr().err
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
