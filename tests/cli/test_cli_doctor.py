"""seqpack doctor: the environment report as text and JSON."""

import json
import logging

import pytest

from seqpack.cli import main
from seqpack.schedulers import _kernels


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


@pytest.mark.parametrize("configured", [True, False], ids=["NUMBA_CACHE_DIR", "numba's own choice"])
def test_warm_refuses_a_cache_it_cannot_create_before_compiling(tmp_path, monkeypatch, capsys, caplog, configured):
    """A cache folder under a file: numba would cache beside the sources instead of in
    NUMBA_CACHE_DIR (while the report named it), or, with the sources' folder read-only too,
    fail with "no locator available". Exit 2 with one line naming the folder and the fix."""
    (tmp_path / "file").write_text("")
    unusable = tmp_path / "file" / "cache"
    if configured:
        monkeypatch.setenv("NUMBA_CACHE_DIR", str(unusable))
    else:  # a read-only install (site-packages) and a user cache under a file
        monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
        monkeypatch.setenv("XDG_CACHE_HOME", str(unusable))
        monkeypatch.setattr(_kernels, "_writable", lambda directory: False)
    with caplog.at_level(logging.WARNING, logger="seqpack.schedulers._kernels"):  # --warm silences the notice
        assert main(["doctor", "--warm"]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # refused before the first family
    which = f"NUMBA_CACHE_DIR={unusable}" if configured else "numba's kernel cache"
    assert err.startswith(f"seqpack doctor: error: {which}: cannot create or write {unusable}/"), err
    assert err.endswith("(Not a directory): set NUMBA_CACHE_DIR to a directory this user can write, and run the job "
                        "with the same NUMBA_CACHE_DIR\n")  # fmt: skip
