"""seqpack doctor: the environment report as text and JSON."""

import json

import pytest

from seqpack.cli import main


@pytest.mark.slow
@pytest.mark.processes
def test_doctor_text_names_every_package_and_the_auto_choice(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for name in ("torch", "transformer_engine", "transformer_engine_torch", "mamba_ssm", "causal_conv1d", "numba"):
        assert name in out
    assert 'backend="auto" on bf16 CUDA inputs' in out


@pytest.mark.slow
@pytest.mark.processes
def test_doctor_json_is_the_report(capsys):
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) >= {"torch", "packages", "auto", "numba"}
    assert set(report["packages"]) == {"transformer_engine", "transformer_engine_torch", "mamba_ssm", "causal_conv1d"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--warm", "--jobs", "0"], "--jobs must be a positive integer, got 0"),
        (["--jobs", "2"], "--jobs=2 is for --warm: the report runs in one process"),
    ],
)
def test_jobs_out_of_place_is_one_line_naming_it(capsys, args, message):
    assert main(["doctor", *args]) == 2
    assert capsys.readouterr().err == f"seqpack doctor: error: {message}\n"
