"""benchmarks/gpu_step.py runs end to end on the CPU at toy sizes (the GPU run uses the same code)."""

import json

import pytest
from benchmark_module import benchmark_module


@pytest.fixture(scope="module")
def gpu_step():
    with benchmark_module("gpu_step") as module:
        yield module


@pytest.mark.parametrize("model", ["transformer", "hybrid"])
@pytest.mark.slow
@pytest.mark.processes
def test_gpu_step_toy_run_reports_every_scheduler(gpu_step, tmp_path, model, capsys):
    out, js = tmp_path / "r.txt", tmp_path / "r.json"
    data = gpu_step.main(["--toy", "--model", model, "--out", str(out), "--json", str(js)])
    text = out.read_text()
    assert json.loads(js.read_text())["schedulers"].keys() == data["schedulers"].keys()
    assert text.strip() in capsys.readouterr().out  # printed as written
    names = list(data["schedulers"])
    fit = data["calibration"]["fit"]
    if "error" in fit:  # CostModel.fit may refuse noisy toy timings: then it is said, and the row is missing
        assert names == ["balanced (FLOPs)", "dp_balanced", "padded"] and fit["error"] in text
    else:
        assert names == ["balanced (FLOPs)", "balanced (fitted)", "dp_balanced", "padded"]
    total = data["lengths"]["sum"]
    for name, r in data["schedulers"].items():
        assert r["real_tokens"] == total, name  # every sequence ran exactly once
        assert r["microbatches"] == len(r["seconds"]) and all(len(row) == 2 for row in r["seconds"])  # dp=2
        assert r["lockstep_s"] >= r["replica_s"] > 0  # sum of round maxima >= the largest replica sum
        assert r["tokens_per_s_lockstep"] == pytest.approx(total / r["lockstep_s"])
        assert name in text
    assert data["schedulers"]["padded"]["microbatches"] == 4  # 8 samples per rank, 256 // 128 = 2 per microbatch
    assert "M = RMSNorm + Mamba2Mixer" in data["model"] if model == "hybrid" else "A = torch reference" in data["model"]


def test_gpu_step_rejects_a_bad_model(gpu_step):
    with pytest.raises(SystemExit):
        gpu_step.main(["--toy", "--model", "moe"])


def test_padded_cells_keep_each_replicas_own_samples_in_order(gpu_step):
    import numpy as np

    s, _ = gpu_step.parse_args(["--toy"])
    lengths = np.arange(1, 17)  # dp=2 x 8 samples
    cells = gpu_step.padded_cells(lengths, s)
    assert cells == [[[1, 2], [9, 10]], [[3, 4], [11, 12]], [[5, 6], [13, 14]], [[7, 8], [15, 16]]]
    mb = gpu_step.padded_microbatch([3, 7], s, gpu_step.torch.device("cpu"))
    assert mb.bshd == (2, 8) and mb.batch.num_tokens == 16 and mb.real_tokens == 10  # 7 rounded up to 4k
    assert mb.batch.cu_seqlens.tolist() == [0, 8, 16]  # pads computed as real, as a padded BSHD batch


def test_gpu_step_without_cuda_refuses_full_sizes_and_points_to_toy(gpu_step, monkeypatch, capsys):
    monkeypatch.setattr(gpu_step.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        gpu_step.main([])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "no CUDA device here" in err and "run with --toy" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "bogus"], "--device must be auto, cpu, cuda or cuda:N, got 'bogus'"),
        (["--device", "meta"], "--device must be auto, cpu, cuda or cuda:N, got 'meta'"),
        (["--device", "cpu"], "--device cpu: these sizes need at least 8.7 GiB"),
        (["--device", "cpu", "--max-tokens-per-rank", "128", "--hidden", "64", "--ffn", "128"], None),
    ],
)
def test_gpu_step_refuses_devices_and_cpu_sizes_before_building(gpu_step, monkeypatch, capsys, argv, message):
    monkeypatch.setattr(gpu_step, "memory_limit", lambda: 8 * 2**30)  # an 8 GiB machine
    if message is None:
        s, _ = gpu_step.parse_args(argv)  # sizes of one's own fit: accepted
        assert s.device == "cpu" and gpu_step.cpu_bytes(s) < 2**30
        return
    with pytest.raises(SystemExit) as exc:
        gpu_step.parse_args(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_gpu_step_refuses_cuda_without_a_device(gpu_step, monkeypatch, capsys):
    monkeypatch.setattr(gpu_step.torch.cuda, "is_available", lambda: False)
    for argv in (["--device", "cuda"], ["--device", "cuda:1"], []):
        with pytest.raises(SystemExit):
            gpu_step.parse_args(argv)
        err = capsys.readouterr().err
        assert "no CUDA device here" in err and "--toy" in err, err
