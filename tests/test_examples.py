"""The examples a user copies must keep working: run each one as a user would.

The multi-rank ones run as ``torchrun --standalone`` starts them (harness.run_script: the
same environment, the script as ``__main__``), forked from the test fork server instead of
paying torchrun's agent and a torch import per rank; tests/interop/test_hf_trainer.py runs
examples/hf_trainer.py under torchrun itself."""

import os
import re
import subprocess
import sys

import pytest
from harness import context, run_script

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples")


def _run(args, timeout=300):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.processes
def test_train_tiny_hybrid_trains_under_cp():
    out = run_script(
        os.path.join(EXAMPLES, "train_tiny_hybrid.py"),
        [
            "--dp",
            "2",
            "--cp",
            "2",
            "--steps",
            "3",
            "--samples-per-rank",
            "8",
            "--max-tokens-per-rank",
            "1024",
        ],
        nproc=4,
    )
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", out)]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert "imbalance" in out


@pytest.mark.processes
def test_hf_transformers_fsdp2_trains_on_packed_steps():
    pytest.importorskip("transformers")
    pytest.importorskip("datasets")
    out = run_script(os.path.join(EXAMPLES, "hf_transformers.py"), ["--steps", "5"], nproc=2)
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+) over \d+ loss tokens", out)]
    assert len(losses) == 5 and losses[-1] < losses[0] - 0.5, out
    assert all(int(m) > 1 for m in re.findall(r"(\d+) microbatches", out))  # several per step


@pytest.mark.processes
def test_wrap_existing_loader_single_process_and_resume():
    out = _run([sys.executable, "examples/wrap_existing_loader.py"])
    assert "resumed step 1 identical to step 1: True" in out


# One layout: the example's pp=3 run has a middle stage and the TP broadcast; TP with DP > 1 is
# tests/distributed/test_wrapper_dist.py's "dp2tp2-tp0" layout (the same wrapper, in the gloo pool).
@pytest.mark.parametrize("layout", [["--tp", "2", "--pp", "3", "--dp", "1"]])
@pytest.mark.processes
def test_megatron_style_broadcasts_and_middle_stage(layout):
    world = 1
    for size in layout[1::2]:
        world *= int(size)
    out = run_script(os.path.join(EXAMPLES, "megatron_style.py"), layout, nproc=world)
    lines = [line for line in out.splitlines() if line.startswith("rank ")]
    assert len(lines) == world * 2  # two steps per rank
    # The TP copies and pipeline stages of one DP replica saw the same layout each step.
    seen = {}
    for line in lines:
        dp = re.search(r"dp=(\d+)/", line).group(1)
        step = re.search(r"step (\d+):", line).group(1)
        shape = re.search(r"cu_seqlens_q (\[[^\]]*\]).*max_seqlen_q (\d+)", line).groups()
        seen.setdefault((dp, step), set()).add(shape)
    assert all(len(layouts) == 1 for layouts in seen.values()), seen
    assert len(seen) == 2 * int(layout[-1])
    if "3" in layout[3]:
        assert any("pp=1/3" in line and "None (metadata only)" in line for line in lines)
        assert not any("pp=0/3" in line and "None (metadata only)" in line for line in lines)


@pytest.mark.processes
def test_rl_rollouts_log_probs_come_back_exactly_once_and_equal_the_unpacked_ones(monkeypatch, capsys):
    """The example's main() as ``python examples/rl_rollouts.py`` runs it, its two ranks
    started from the test fork server instead of the example's spawn context."""
    monkeypatch.syspath_prepend(EXAMPLES)  # the ranks import the example by name
    import rl_rollouts

    forkserver = context()
    monkeypatch.setattr(rl_rollouts.mp, "get_context", lambda method: forkserver)
    rl_rollouts.main(["--prompts", "6", "--responses", "3", "--max-tokens", "512", "--group"])
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("rank ")]
    assert len(lines) == 2 and all("exactly once in read order: True" in line for line in lines), out
    assert sum(int(re.search(r"(\d+) ran on the other rank", line).group(1)) for line in lines) > 0, out  # not vacuous
    diffs = [float(re.search(r"alone: ([0-9.e+-]+)", line).group(1)) for line in lines]
    assert max(diffs) < 1e-10, out
    assert all("groups split over replicas: 0" in line for line in lines), out  # each prompt's responses together


@pytest.mark.processes
def test_vlm_sft_trains_a_tiny_qwen2_vl_on_two_ranks_exactly():
    """examples/vlm_sft.py on 2 gloo ranks: images, two-image samples, a video and text through
    the wrapper, each round's images encoded across the ranks (encoder_rebalance=True); the
    first step's loss equals its samples run alone (the model's own positions), every sample
    runs once a step, the loss falls, and images move where a round's encoder work is uneven,
    never raising its busiest rank's load."""
    pytest.importorskip("transformers")
    out = run_script(os.path.join(EXAMPLES, "vlm_sft.py"), ["--steps", "5", "--check"], nproc=2)
    lines = [line for line in out.splitlines() if line.startswith("step ") and "tokens, loss" in line]
    losses = [float(re.search(r"loss (\d+\.\d+)", line).group(1)) for line in lines]
    assert len(losses) == 5 and losses[-1] < losses[0] - 0.5, out
    assert all("every sample once: True" in line for line in lines), out
    assert all(re.search(r"encoder imbalance \d+\.\d+", line) for line in lines), out
    rounds = [re.search(r"per round (\d+\.\d+) -> (\d+\.\d+) rebalanced, images moved (\d+)", line) for line in lines]
    assert all(rounds), out
    assert all(float(m.group(2)) <= float(m.group(1)) + 1e-9 for m in rounds), out
    assert sum(int(m.group(3)) for m in rounds) > 0, out
    diff = float(re.search(r"unpacked: \|diff\| ([0-9.e+-]+)", out).group(1))
    assert diff < 1e-5, out
