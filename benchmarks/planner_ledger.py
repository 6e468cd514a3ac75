"""What each part of ``seqpack/schedulers/`` costs in lines, beside what it buys.

Counts the lines of every file of the planner (code, docstring, comment, blank), groups them
by the part they serve, and prints each part beside the measured gain that justifies it: the
``balanced`` stages' rows of the ablation summary (benchmarks/results/ablation.txt, written by
benchmarks/ablation.py), and for the other parts the results file that measures them. Every
file must belong to exactly one part: a new file fails the script until it is placed.

    python benchmarks/planner_ledger.py [--ablation benchmarks/results/ablation.txt]
"""

from __future__ import annotations

import argparse
import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLANNER = ROOT / "seqpack" / "schedulers"

# part -> (files under seqpack/schedulers, the ablation stages it holds, where its gain is measured)
PARTS: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    "plan type, request, checks, registry": (
        ("__init__.py", "schedule.py", "request.py", "base.py", "schedule_checks.py", "registry.py"),
        (),
        "the contract every scheduler meets",
    ),
    "baselines (dp_balanced, empty)": (("dp_balanced.py", "empty.py", "_kernels/consecutive.py"), (), "schedulers.txt"),
    "objective, step time": (("objective.py", "step_time.py"), (), "what every plan is judged by"),
    "balanced: round targets, grid": (
        (
            "balanced/__init__.py",
            "balanced/scheduler.py",
            "balanced/stages.py",
            "balanced/rounds.py",
            "_kernels/grid.py",
        ),
        ("-round_targets", "-more_rounds", "-token_rules"),
        "ablation.txt",
    ),
    "balanced: exact search, bin completion": (
        ("balanced/exact.py", "_kernels/bin_search.py"),
        ("-exact_search", "-bin_completion"),
        "ablation.txt",
    ),
    "balanced: replica-first, per-replica repair": (
        ("balanced/replicas.py", "_kernels/replica_repair.py", "_kernels/matching.py"),
        ("-replica_first", "-per_replica"),
        "ablation.txt",
    ),
    "balanced: locality": (
        ("balanced/locality.py", "_kernels/locality_swaps.py"),
        ("-locality", "-home_swaps", "-pair_swaps", "-relabel", "-origin_order"),
        "ablation.txt, locality_trees.txt",
    ),
    "kernel loading and cache": (
        ("_kernels/__init__.py", "_kernels/_jit.py"),
        (),
        "-",
    ),
    "dynamic CP": (
        tuple(f"dynamic_cp/{p.name}" for p in sorted((PLANNER / "dynamic_cp").glob("*.py")))
        + ("_kernels/cp_planner.py", "group_sizes.py"),
        (),
        "dynamic_cp.txt, dynamic_cp_ablation.txt",
    ),
    "RL groups, mini-batches": (("sample_groups.py", "minibatches.py"), (), "rl_groups.txt"),
    "static shapes": (("shape_limits.py", "bucket_ladder.py"), (), "static_shapes_ladder.txt, docs/thd.md"),
    "encoder plan (vision)": (("encoder_plan.py",), (), "encoder_plan.txt"),
}


def line_kinds(path: Path) -> dict[str, int]:
    """Lines of ``path`` by kind: docstring, comment (only a comment), blank, code."""
    text = path.read_text()
    lines = text.splitlines()
    kinds = dict.fromkeys(range(1, len(lines) + 1), "code")
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                for n in range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1):
                    kinds[n] = "docstring"
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT and lines[tok.start[0] - 1].strip().startswith("#"):
            kinds[tok.start[0]] = "comment"
    for n, line in enumerate(lines, 1):
        if not line.strip():
            kinds[n] = "blank"
    counts = dict.fromkeys(("code", "docstring", "comment", "blank"), 0)
    for kind in kinds.values():
        counts[kind] += 1
    return counts


def ablation_rows(path: Path) -> dict[str, str]:
    """The summary rows of an ablation results file, by stage."""
    rows: dict[str, str] = {}
    if not path.exists():
        return rows
    text = path.read_text()
    summary = text[text.find("## summary") :]
    for line in summary.splitlines():
        if line.startswith("-") and not line.startswith("--"):
            rows[line.split()[0]] = " ".join(line.split()[1:])
    return rows


def main(argv: list[str] | None = None) -> dict[str, dict[str, int]]:
    """Print the ledger; returns each part's line counts (and ``"total"``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ablation", type=Path, default=ROOT / "benchmarks" / "results" / "ablation.txt")
    args = parser.parse_args(argv)
    files = {p.relative_to(PLANNER).as_posix() for p in PLANNER.rglob("*.py")}
    placed = [f for names, _, _ in PARTS.values() for f in names]
    unplaced, twice = files - set(placed), {f for f in placed if placed.count(f) > 1}
    if unplaced or twice or set(placed) - files:
        raise SystemExit(
            f"place every file once: unplaced {sorted(unplaced)}, twice {sorted(twice)}, "
            f"missing {sorted(set(placed) - files)}"
        )
    rows = ablation_rows(args.ablation)
    print(
        f"# {PLANNER.relative_to(ROOT)}: lines by part; gains from {args.ablation.relative_to(ROOT)} (summary columns:"
    )
    print("# best gain, where, worst, home points, where, fewer M, cpu off/on) or the results file named")
    print(f"{'part':46} {'lines':>6} {'code':>6} {'doc':>5} {'comm':>5} {'blank':>6}  measured in")
    totals = dict.fromkeys(("lines", "code", "docstring", "comment", "blank"), 0)
    ledger = {"total": totals}
    for part, (names, stages, where) in PARTS.items():
        counts = dict.fromkeys(("code", "docstring", "comment", "blank"), 0)
        for name in names:
            for kind, n in line_kinds(PLANNER / name).items():
                counts[kind] += n
        lines = sum(counts.values())
        for kind, n in counts.items():
            totals[kind] += n
        totals["lines"] += lines
        ledger[part] = {"lines": lines, **counts}
        c = counts
        print(f"{part:46} {lines:6d} {c['code']:6d} {c['docstring']:5d} {c['comment']:5d} {c['blank']:6d}  {where}")
        for stage in stages:
            print(f"{'':8}{stage:22} {rows.get(stage, 'not in the ablation file')}")
    t = totals
    print(f"{'total':46} {t['lines']:6d} {t['code']:6d} {t['docstring']:5d} {t['comment']:5d} {t['blank']:6d}")
    return ledger


if __name__ == "__main__":
    main()
