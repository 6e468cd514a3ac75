"""The ``seqpack`` command: ``mock``, ``simulate``, ``stats`` and ``demo``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import seqpack

# Defaults of every distribution's parameters when the command line leaves them out
# (lognormal: the example config of Megatron's mock SFT dataset).
DIST_DEFAULTS: dict[str, dict[str, Any]] = {
    "lognormal": {"min_seq_len": 1024, "max_seq_len": 8192, "mean_seq_len": 4096, "sigma": 1.1},
    "uniform": {"min_seq_len": 128, "max_seq_len": 8192},
    "pareto": {"min_seq_len": 128, "max_seq_len": 32768, "alpha": 1.2},
    "bimodal": {"min_seq_len": 64, "max_seq_len": 32768, "short_mean": 1024, "long_mean": 16384,
                "long_fraction": 0.25},
    "constant": {"length": 4096},
}
_DIST_ARGS = ("min_seq_len", "max_seq_len", "mean_seq_len", "sigma", "alpha", "short_mean", "long_mean",
              "long_fraction", "length")


class CommandError(Exception):
    """A user error the command reports in one line (exit status 2)."""


# ---------------------------------------------------------------------------------------
# Lengths from the command line
# ---------------------------------------------------------------------------------------
def _add_source_args(p: argparse.ArgumentParser, *, allow_file: bool) -> None:
    src = p.add_argument_group("lengths (one source; default: --dist lognormal)")
    if allow_file:
        src.add_argument("--lengths", metavar="FILE", help="CSV, Parquet, Arrow or JSONL file of lengths")
        src.add_argument("--column", help="length column of --lengths (name or 0-based index)")
    src.add_argument("--config", metavar="JSON", help="Megatron mock-dataset config: a JSON string or file")
    src.add_argument("--dist", choices=sorted(DIST_DEFAULTS), help="named distribution (default lognormal)")
    src.add_argument("--seed", type=int, default=0, help="seed of the generated lengths (default 0)")
    dist = p.add_argument_group("distribution parameters (defaults per distribution; see docs/schedulers.md)")
    dist.add_argument("--min-seq-len", type=int)
    dist.add_argument("--max-seq-len", type=int)
    dist.add_argument("--mean-seq-len", type=float, help="lognormal mean")
    dist.add_argument("--sigma", type=float, help="lognormal sigma (Megatron's lognormal_sigma)")
    dist.add_argument("--alpha", type=float, help="Pareto tail index")
    dist.add_argument("--short-mean", type=float, help="bimodal: mean of the short mode")
    dist.add_argument("--long-mean", type=float, help="bimodal: mean of the long mode")
    dist.add_argument("--long-fraction", type=float, help="bimodal: share of long sequences")
    dist.add_argument("--length", type=int, help="constant: the length")


def _dist_params(args: argparse.Namespace, name: str) -> dict[str, Any]:
    params = dict(DIST_DEFAULTS[name])
    for key in _DIST_ARGS:
        value = getattr(args, key, None)
        if value is None:
            continue
        if key not in params:
            raise CommandError(f"--{key.replace('_', '-')} does not apply to the {name!r} distribution")
        params[key] = value
    for key in ("min_seq_len", "max_seq_len", "length"):
        if key in params:
            params[key] = int(params[key])
    return params


def _load_lengths(args: argparse.Namespace, n: int | None) -> tuple[np.ndarray, str]:
    """Lengths and a one-line description of where they came from."""
    from seqpack.mock_data import generate_lengths, lengths_from_config, lengths_from_file

    sources = [s for s in ("lengths", "config", "dist") if getattr(args, s, None)]
    if len(sources) > 1:
        raise CommandError(f"give one source of lengths, got --{' and --'.join(sources)}")
    try:
        if getattr(args, "lengths", None):
            column = args.column
            if column is not None and column.isdigit():
                column = int(column)
            return lengths_from_file(args.lengths, column=column), f"file {args.lengths}"
        if args.config:
            return lengths_from_config(args.config, num_samples=n, seed=args.seed), "config"
        name = args.dist or "lognormal"
        params = _dist_params(args, name)
        if name != "constant":
            params["seed"] = args.seed
        shown = ", ".join(f"{k}={v}" for k, v in params.items() if k != "seed")
        return generate_lengths(name, n or 0, **params), f"{name}({shown}, seed={args.seed})"
    except (ValueError, FileNotFoundError) as err:
        raise CommandError(str(err)) from None


# ---------------------------------------------------------------------------------------
# seqpack mock
# ---------------------------------------------------------------------------------------
def _cmd_mock(args: argparse.Namespace) -> int:
    from seqpack.mock_data import MockSFTDataset, write_lengths

    lengths, source = _load_lengths(args, args.num_samples)
    out = args.output
    if args.dataset:
        if not out.endswith(".parquet"):
            raise CommandError(f"--dataset writes Parquet; {out} does not end in .parquet")
        if lengths.size and lengths.min() < 1:
            raise CommandError("a mock dataset needs lengths >= 1")
        MockSFTDataset(lengths, vocab_size=args.vocab_size, seed=args.seed).write_parquet(
            out, progress=not args.quiet
        )
        what = f"mock SFT dataset ({args.vocab_size}-token vocabulary)"
    else:
        try:
            write_lengths(out, lengths)
        except ValueError as err:
            raise CommandError(str(err)) from None
        what = "lengths"
    if not args.quiet:
        print(f"wrote {lengths.size} {what} from {source} to {out}")
        if lengths.size:
            print(f"  tokens {int(lengths.sum())}, mean {lengths.mean():.1f}, min {lengths.min()}, max {lengths.max()}")
    return 0


# ---------------------------------------------------------------------------------------
# seqpack stats
# ---------------------------------------------------------------------------------------
PERCENTILES = (1, 10, 25, 50, 75, 90, 99)


def length_summary(lengths: np.ndarray, model: str | None = "llama3-8b") -> dict[str, Any]:
    """Count, tokens, mean, std, percentiles of ``lengths`` and, for a model preset, the
    share of training FLOPs spent in attention's quadratic term."""
    from seqpack.cost import model_preset

    arr = np.asarray(lengths, dtype=np.int64)
    out: dict[str, Any] = {"count": int(arr.size), "tokens": int(arr.sum())}
    if arr.size == 0:
        return out
    out.update(mean=float(arr.mean()), std=float(arr.std()), min=int(arr.min()), max=int(arr.max()))
    for q, v in zip(PERCENTILES, np.percentile(arr, PERCENTILES)):
        out[f"p{q}"] = float(v)
    out["zeros"] = int(np.count_nonzero(arr == 0))
    if model:
        spec = model_preset(model)
        sq = int(np.dot(arr, arr)) if int(arr.max()) ** 2 * arr.size < 2**62 else sum(v * v for v in arr.tolist())
        total = spec.flops(int(arr.sum()), sq)
        out["model"] = model
        out["train_flops"] = float(total)
        out["attention_share"] = spec.quadratic_flops * sq / total if total else 0.0
    return out


def _plot_histogram(lengths: np.ndarray, path: str, title: str, bins: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arr = lengths[lengths > 0]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    log = arr.size and arr.max() / max(arr.min(), 1) > 50
    edges = np.geomspace(max(arr.min(), 1), arr.max() + 1, bins + 1) if log else bins
    ax.hist(arr, bins=edges, color="#4C72B0", edgecolor="white", linewidth=0.4)
    if log:
        ax.set_xscale("log")
    for q, style in ((50, "--"), (99, ":")):
        v = np.percentile(arr, q)
        ax.axvline(v, color="#C44E52", linestyle=style, linewidth=1.2, label=f"p{q} = {v:,.0f}")
    ax.axvline(arr.mean(), color="#55A868", linestyle="-", linewidth=1.2, label=f"mean = {arr.mean():,.0f}")
    ax.set_xlabel("sequence length (tokens)" + (", log scale" if log else ""))
    ax.set_ylabel("sequences")
    ax.set_title(title)
    ax.legend(frameon=False)
    ax.grid(alpha=0.25)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _cmd_stats(args: argparse.Namespace) -> int:
    from seqpack.mock_data import lengths_from_file

    column = int(args.column) if args.column is not None and args.column.isdigit() else args.column
    try:
        lengths = lengths_from_file(args.file, column=column)
        summary = length_summary(lengths, None if args.model == "none" else args.model)
    except (ValueError, FileNotFoundError) as err:
        raise CommandError(str(err)) from None
    if args.plot:
        if not lengths.size:
            raise CommandError(f"{args.file} holds no lengths to plot")
        _plot_histogram(lengths, args.plot, f"{args.file}: {lengths.size:,} sequences", args.bins)
    if args.json:
        print(json.dumps({"file": args.file, **summary}, indent=2))
        return 0
    print(f"{args.file}: {summary['count']:,} sequences, {summary['tokens']:,} tokens")
    if summary["count"]:
        print(f"  mean {summary['mean']:,.1f}  std {summary['std']:,.1f}  min {summary['min']:,}  max {summary['max']:,}")
        print("  " + "  ".join(f"p{q} {summary[f'p{q}']:,.0f}" for q in PERCENTILES))
        if summary["zeros"]:
            print(f"  {summary['zeros']} zero-length samples")
        if "model" in summary:
            print(
                f"  {summary['model']}: {summary['train_flops'] / 1e12:,.1f} TFLOP to train on once; "
                f"attention's quadratic term is {100 * summary['attention_share']:.1f}% of it"
            )
    if args.plot:
        print(f"  histogram written to {args.plot}")
    return 0


# ---------------------------------------------------------------------------------------
# seqpack simulate
# ---------------------------------------------------------------------------------------
def simulate(
    lengths: np.ndarray,
    *,
    schedulers: Sequence[str],
    dp_size: int,
    cp_size: int = 1,
    max_tokens_per_rank: int,
    pad_multiple: int = 1,
    global_batch: int,
    steps: int,
    model: str | None = "llama3-8b",
    on_oversize: str = "error",
    scheduler_options: dict[str, dict[str, Any]] | None = None,
    progress: bool = False,
    keep_first: bool = False,
) -> dict[str, Any]:
    """Schedule ``steps`` global batches of ``lengths`` with each scheduler and account them.

    Step ``k`` takes ``lengths[k*global_batch : (k+1)*global_batch]`` (the lengths repeat
    when there are fewer). Zero-length samples are dropped and counted, as the wrapper does.
    Every scheduler is fed the same cost model (the preset's training FLOPs; token counts
    when ``model`` is None) and accounted in it.

    Returns:
        ``{"config": ..., "results": {name: aggregates}}``; with ``keep_first`` each result
        also holds ``"first"``: ``(schedule, StepStats)`` of step 0.
    """
    from seqpack.cost import CostModel, model_preset
    from seqpack.progress import Progress
    from seqpack.schedulers import get_scheduler
    from seqpack.schedulers.base import default_origin
    from seqpack.stats import StepStats

    spec = model_preset(model) if model else None
    cost = spec.cost_model() if spec else CostModel.tokens()
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        raise CommandError("no lengths to simulate")
    need = steps * global_batch
    reps = -(-need // lengths.size)
    pool = np.tile(lengths, reps)[:need] if reps > 1 else lengths[:need]
    options = scheduler_options or {}
    built = {name: get_scheduler(name, **options.get(name, {})) for name in schedulers}
    for sched in built.values():  # load compiled kernels before anything is timed
        sched.schedule([1, 1], dp_size=2, max_tokens_per_rank=2)
    per: dict[str, list[dict[str, Any]]] = {name: [] for name in schedulers}
    first: dict[str, Any] = {}
    with Progress(steps * len(schedulers), "simulate", enabled=progress) as bar:
        for step in range(steps):
            batch = pool[step * global_batch : (step + 1) * global_batch]
            empty = int(np.count_nonzero(batch == 0))
            batch = batch[batch > 0]
            for name, sched in built.items():
                start = time.perf_counter()
                s = sched.schedule(
                    batch,
                    dp_size=dp_size,
                    cp_size=cp_size,
                    max_tokens_per_rank=max_tokens_per_rank,
                    pad_multiple=pad_multiple,
                    cost=cost,
                    on_oversize=on_oversize,
                )
                elapsed = time.perf_counter() - start
                st = StepStats.from_schedule(s, cost, empty_samples=empty)
                if spec is not None:
                    st.flops = float(spec.flops(st.seqlen_sum, st.seqlen_sq_sum))
                if keep_first and step == 0:
                    first[name] = (s, st)
                total = sum(st.replica_cost)
                replica, _, _ = s.placement()
                stays = replica == default_origin(batch.shape[0], dp_size)
                moved = 1.0 - float(s.lengths[stays].sum()) / max(float(s.lengths.sum()), 1.0)
                per[name].append(
                    {
                        "microbatches": st.num_microbatches,
                        "min_microbatches": st.min_microbatches,
                        "bound_ratio": st.bound_ratio,
                        "imbalance": st.imbalance,
                        "round_imbalance": st.round_imbalance,
                        "round_lower_bound": st.round_lower_bound,
                        "pad_fraction": st.pad_fraction,
                        "moved_fraction": moved,
                        "flops": st.flops,
                        "replica_wait": max(st.replica_cost),
                        "round_wait": st.round_imbalance * total / dp_size,
                        "ideal": total / dp_size,
                        "seconds": elapsed,
                        "dropped": st.dropped_sequences,
                        "truncated": st.truncated_sequences,
                        "deferred": st.deferred_sequences,
                        "sequences": st.num_sequences,
                        "empty": st.empty_samples,
                    }
                )
                bar.update(1, step=step)
    results = {}
    for name, rows in per.items():
        col = {k: np.array([r[k] for r in rows], dtype=np.float64) for k in rows[0] if rows[0][k] is not None}
        agg = {
            "microbatches": float(col["microbatches"].mean()),
            "min_microbatches": float(col["min_microbatches"].mean()),
            "bound_ratio": float(col["bound_ratio"].mean()),
            "bound_ratio_max": float(col["bound_ratio"].max()),
            "round_imbalance": float(col["round_imbalance"].mean()),
            "round_imbalance_max": float(col["round_imbalance"].max()),
            "round_lower_bound": float(col["round_lower_bound"].mean()),
            "pad_fraction": float(col["pad_fraction"].mean()),
            "moved_fraction": float(col["moved_fraction"].mean()),
            "flops_per_step": float(col["flops"].mean()) if "flops" in col else None,
            "replica_wait": float(col["replica_wait"].mean()),
            "round_wait": float(col["round_wait"].mean()),
            "ideal": float(col["ideal"].mean()),
            "seconds_mean": float(col["seconds"].mean()),
            "seconds_max": float(col["seconds"].max()),
            "dropped": int(col["dropped"].sum()),
            "truncated": int(col["truncated"].sum()),
            "deferred": int(col["deferred"].sum()),
            "steps": [{k: v for k, v in r.items()} for r in rows],
        }
        if keep_first:
            agg["first"] = first[name]
        results[name] = agg
    config = {
        "dp_size": dp_size,
        "cp_size": cp_size,
        "max_tokens_per_rank": max_tokens_per_rank,
        "capacity": max_tokens_per_rank * cp_size,
        "pad_multiple": pad_multiple,
        "global_batch": global_batch,
        "steps": steps,
        "model": model,
        "cost": {"linear": cost.linear, "quadratic": cost.quadratic, "constant": cost.constant},
        "on_oversize": on_oversize,
        "lengths_available": int(lengths.size),
        "lengths_repeated": reps > 1,
    }
    return {"config": config, "results": results}


def format_table(report: dict[str, Any]) -> str:
    """The side-by-side table ``seqpack simulate`` prints."""
    head = (
        f"{'scheduler':<12} {'microbatches':>12} {'replica/LB':>11} {'max':>7} {'round imb.':>11} "
        f"{'(bound)':>8} {'pad %':>6} {'moved %':>7} {'FLOP/step':>10} {'sched ms':>9}"
    )
    lines = [head, "-" * len(head)]
    for name, r in report["results"].items():
        flops = f"{r['flops_per_step']:.3e}" if r["flops_per_step"] is not None else "-"
        lines.append(
            f"{name:<12} {r['microbatches']:>6.1f} ({r['min_microbatches']:>3.0f}) {r['bound_ratio']:>11.4f} "
            f"{r['bound_ratio_max']:>7.4f} {r['round_imbalance']:>11.4f} {r['round_lower_bound']:>8.4f} "
            f"{100 * r['pad_fraction']:>6.2f} {100 * r['moved_fraction']:>7.1f} {flops:>10} "
            f"{1e3 * r['seconds_mean']:>9.2f}"
        )
    return "\n".join(lines)


def _plot_replicas(report: dict[str, Any], path: str) -> None:
    """Per-replica load of step 0 for each scheduler, relative to the lower bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from seqpack.cost import CostModel
    from seqpack.stats import microbatch_costs

    cfg = report["config"]
    cost = CostModel(**cfg["cost"])
    names = list(report["results"])
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 2.4 * len(names) + 0.8), dpi=120, sharex=True, squeeze=False)
    dp = cfg["dp_size"]
    x = np.arange(dp)
    ymax = 1.0
    for name in names:
        _, st = report["results"][name]["first"]
        ymax = max(ymax, max(st.replica_cost) / st.lower_bound)
    for ax, name in zip(axes[:, 0], names):
        schedule, st = report["results"][name]["first"]
        costs = microbatch_costs(schedule, cost) / st.lower_bound  # [M, dp]
        m_count = costs.shape[0]
        if dp <= 128 and m_count <= 64:
            bottom = np.zeros(dp)
            colors = plt.cm.viridis(np.linspace(0.1, 0.9, max(m_count, 1)))
            for m in range(m_count):
                ax.bar(x, costs[m], bottom=bottom, width=0.85, color=colors[m], linewidth=0)
                bottom += costs[m]
        else:
            ax.fill_between(x, costs.sum(axis=0), step="mid", color="#4C72B0", alpha=0.8, linewidth=0)
        ax.axhline(1.0, color="#C44E52", linestyle="--", linewidth=1.0)
        ax.set_ylim(0, ymax * 1.08)
        ax.set_ylabel("load / bound")
        ax.set_title(
            f"{name}: {m_count} microbatches, busiest replica {st.bound_ratio:.3f} x bound, "
            f"rounds {st.round_imbalance:.3f} x ideal",
            fontsize=10,
            loc="left",
        )
        ax.grid(axis="y", alpha=0.25)
    axes[-1, 0].set_xlabel(
        "DP replica" + ("  (bar segments: microbatch 0, 1, ... from the bottom)" if dp <= 128 else "")
    )
    fig.suptitle(
        f"Per-replica cost of step 0, dp={dp} cp={cfg['cp_size']}, capacity {cfg['capacity']:,} tokens, "
        f"model {cfg['model'] or 'tokens'}; dashed: max(total/dp, largest sequence)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from seqpack.schedulers import available_schedulers
    from seqpack.thd import pad_multiple_for

    names = [s.strip() for s in args.schedulers.split(",") if s.strip()]
    unknown = [s for s in names if s not in available_schedulers()]
    if unknown or not names:
        raise CommandError(f"unknown scheduler(s) {unknown}; available: {', '.join(available_schedulers())}")
    for flag in ("dp", "cp", "max_tokens_per_rank", "steps", "global_batch"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise CommandError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    global_batch = args.global_batch or 16 * args.dp
    lengths, source = _load_lengths(args, global_batch * args.steps)
    pad_multiple = args.pad_multiple or pad_multiple_for(args.cp)
    options: dict[str, dict[str, Any]] = {"balanced": {"order": args.order, "objective": args.objective}}
    try:
        report = simulate(
            lengths,
            schedulers=names,
            dp_size=args.dp,
            cp_size=args.cp,
            max_tokens_per_rank=args.max_tokens_per_rank,
            pad_multiple=pad_multiple,
            global_batch=global_batch,
            steps=args.steps,
            model=None if args.model == "tokens" else args.model,
            on_oversize=args.on_oversize,
            scheduler_options=options,
            progress=not args.no_progress,
            keep_first=bool(args.plot),
        )
    except ValueError as err:
        hint = " (--on-oversize truncate or drop)" if "on_oversize" in str(err) else ""
        raise CommandError(f"{err}{hint}") from None
    report["config"]["source"] = source
    report["config"]["balanced"] = options["balanced"]
    if args.plot:
        _plot_replicas(report, args.plot)
    if args.json:
        out = {"config": report["config"], "results": {}}
        for name, r in report["results"].items():
            out["results"][name] = {k: v for k, v in r.items() if k not in ("first",) and (args.per_step or k != "steps")}
        print(json.dumps(out, indent=2))
        return 0
    cfg = report["config"]
    print(f"lengths: {source}{' (repeated to fill the steps)' if cfg['lengths_repeated'] else ''}")
    print(
        f"{cfg['steps']} steps x {global_batch} sequences into dp={cfg['dp_size']} x cp={cfg['cp_size']}, "
        f"capacity {cfg['capacity']:,} tokens per microbatch (pad multiple {cfg['pad_multiple']}), "
        f"cost: {cfg['model'] + ' training FLOPs' if cfg['model'] else 'tokens'}"
    )
    print()
    print(format_table(report))
    print()
    print(
        "microbatches: mean per step (token lower bound).\n"
        "replica/LB: busiest replica's cost / max(total/dp, largest sequence), mean and max over steps:\n"
        "  what DDP, ZeRO-1 and pipeline-parallel steps wait for.\n"
        "round imb.: sum over microbatches of the slowest replica / sum of the means: what FSDP waits for;\n"
        "  (bound): the best any schedule can reach with this capacity.\n"
        "moved %: tokens that change DP rank (the all-to-all's payload), with samples read in rank order."
    )
    lost = {n: (r["dropped"], r["truncated"]) for n, r in report["results"].items() if r["dropped"] or r["truncated"]}
    for name, (dropped, truncated) in lost.items():
        print(f"{name}: {dropped} sequences dropped, {truncated} truncated (on_oversize={cfg['on_oversize']})")
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0


# ---------------------------------------------------------------------------------------
# seqpack demo (seqpack/demo.py)
# ---------------------------------------------------------------------------------------
def _cmd_demo(args: argparse.Namespace) -> int:
    from seqpack import demo

    return demo.run(args)


def build_parser() -> argparse.ArgumentParser:
    from seqpack.cost import DEFAULT_MODEL, MODEL_PRESETS
    from seqpack.schedulers.base import ON_OVERSIZE

    parser = argparse.ArgumentParser(
        prog="seqpack",
        description="Sequence packing and load balancing for distributed LLM training.",
    )
    parser.add_argument("--version", action="version", version=f"seqpack {seqpack.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    mock = sub.add_parser(
        "mock",
        help="write mock sequence lengths or a mock SFT dataset",
        description="Draw sequence lengths from a distribution or a Megatron mock-dataset config and write them "
        "(CSV, Parquet, Arrow, JSONL), or write a mock SFT dataset of random tokens (Parquet).",
    )
    _add_source_args(mock, allow_file=False)
    mock.add_argument("-n", "--num-samples", type=int, default=10000, help="how many lengths (default 10000)")
    mock.add_argument("-o", "--output", required=True, metavar="FILE", help="output file; format from its extension")
    mock.add_argument("--dataset", action="store_true", help="write a MockSFTDataset (input_ids) as Parquet")
    mock.add_argument("--vocab-size", type=int, default=32000, help="vocabulary of --dataset tokens")
    mock.add_argument("-q", "--quiet", action="store_true")
    mock.set_defaults(func=_cmd_mock)

    sim = sub.add_parser(
        "simulate",
        help="compare schedulers on a length distribution at any scale",
        description="Schedule global batches of sequence lengths with one or more schedulers and compare "
        "balance, microbatches, padding, FLOPs and scheduling time. Runs on one CPU for any number of replicas: "
        "plan runs bigger than the machine you sit at.",
    )
    _add_source_args(sim, allow_file=True)
    topo = sim.add_argument_group("topology and limits")
    topo.add_argument("--dp", type=int, default=8, help="data-parallel replicas (default 8)")
    topo.add_argument("--cp", type=int, default=1, help="context-parallel ranks per replica (default 1)")
    topo.add_argument("--max-tokens-per-rank", type=int, default=16384, help="tokens per rank per microbatch")
    topo.add_argument("--pad-multiple", type=int, help="pad every sequence to a multiple of this (default 1, or 2*cp under CP)")
    topo.add_argument("--global-batch", type=int, help="sequences per step (default 16 per replica)")
    topo.add_argument("--steps", type=int, default=10, help="steps to simulate (default 10)")
    topo.add_argument("--on-oversize", choices=ON_OVERSIZE, default="error", help="sequences longer than capacity")
    run = sim.add_argument_group("schedulers and cost")
    run.add_argument("--schedulers", default="balanced,dp_balanced,empty", help="comma-separated names")
    run.add_argument("--order", choices=("heavy_first", "pipeline"), default="heavy_first", help="balanced's order")
    run.add_argument(
        "--objective",
        choices=("both", "rounds", "replicas"),
        default="both",
        help="balanced's objective: both (default), rounds (FSDP), replicas (DDP/ZeRO-1/PP)",
    )
    run.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        choices=sorted(MODEL_PRESETS) + ["tokens"],
        help=f"cost model: a preset's training FLOPs (default {DEFAULT_MODEL}) or plain tokens",
    )
    out = sim.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print a JSON report instead of the table")
    out.add_argument("--per-step", action="store_true", help="with --json: include every step's figures")
    out.add_argument("--plot", metavar="FILE.png", help="draw per-replica load of step 0 for each scheduler")
    out.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    sim.set_defaults(func=_cmd_simulate)

    st = sub.add_parser(
        "stats",
        help="summarize a file of sequence lengths",
        description="Count, mean, percentiles and attention's FLOPs share of the lengths in FILE.",
    )
    st.add_argument("file", metavar="FILE", help="CSV, Parquet, Arrow or JSONL file of lengths")
    st.add_argument("--column", help="length column (name or 0-based index)")
    st.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODEL_PRESETS) + ["none"])
    st.add_argument("--plot", metavar="FILE.png", help="draw a histogram")
    st.add_argument("--bins", type=int, default=60)
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_cmd_stats)

    from seqpack import demo as demo_module

    demo = sub.add_parser(
        "demo",
        help="train a tiny hybrid LM on packed, balanced batches across CPU ranks (gloo, FSDP2)",
        description=demo_module.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo_module.add_arguments(demo)
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except CommandError as err:
        print(f"seqpack {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
