"""benchmarks/planner_ledger.py: every planner file counted once, in a part, and every stage it
quotes is a row of the ablation summary (so the ledger cannot rot when files or stages move)."""

from pathlib import Path

from benchmark_module import benchmark_module

ROOT = Path(__file__).resolve().parents[2]


def test_ledger_counts_every_planner_line_once(capsys):
    with benchmark_module("planner_ledger") as ledger:
        parts = ledger.main([])
        rows = ledger.ablation_rows(ROOT / "benchmarks" / "results" / "ablation.txt")
        stages = [s for _, quoted, _ in ledger.PARTS.values() for s in quoted]
    files = list((ROOT / "seqpack" / "schedulers").rglob("*.py"))
    assert parts["total"]["lines"] == sum(len(f.read_text().splitlines()) for f in files)
    assert sum(p["lines"] for name, p in parts.items() if name != "total") == parts["total"]["lines"]
    assert stages and all(s in rows for s in stages), [s for s in stages if s not in rows]
    assert "not in the ablation file" not in capsys.readouterr().out


def test_line_kinds(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        '"""Doc\nstring."""\n\n# a comment\nx = 1  # code, not a comment line\n\n\ndef f():\n    """One."""\n'
    )
    with benchmark_module("planner_ledger") as ledger:
        assert ledger.line_kinds(path) == {"code": 2, "docstring": 3, "comment": 1, "blank": 3}
