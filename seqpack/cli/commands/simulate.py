"""``seqpack simulate``: compare schedulers on a length distribution at any scale, on one CPU."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from seqpack.cli.exit import CommandError
from seqpack.cli.length_sources import add_source_args, load_lengths
from seqpack.cli.memory import PeakMemory, available_bytes, step_bytes_estimate
from seqpack.cli.progress import Progress
from seqpack.cli.tables import format_table
from seqpack.errors import ConfigError
from seqpack.validation import check_int, check_number

if TYPE_CHECKING:
    from seqpack.cost import ModelSpec
    from seqpack.schedulers import Schedule, Scheduler
    from seqpack.stats import StepStats

__all__ = ["add_parser", "check_fits", "check_pad_multiple", "run", "simulate"]

_LOCALITY: dict[str, bool | str] = {"auto": "auto", "on": True, "off": False}


def check_pad_multiple(
    pad_multiple: object, cp_size: int, *, name: str = "pad_multiple", cp_name: str = "cp_size"
) -> int:
    """The wrapper's rule for ``pad_multiple``: a positive int, and under CP a multiple of
    ``2*cp`` (DualChunkSwap cuts every sequence into ``2*cp`` equal chunks).

    Raises:
        ConfigError: Naming ``name`` (e.g. ``--pad-multiple``), ``cp_name`` and the values.
    """
    value = check_int(name, pad_multiple, minimum=1)
    if cp_size > 1 and value % (2 * cp_size):
        raise ConfigError(
            f"{name} {value} is not a multiple of 2 * {cp_name} = {2 * cp_size}: DualChunkSwap cuts every "
            f"sequence into 2 * {cp_name} chunks of equal length (try {name} {2 * cp_size})"
        )
    return value


def simulate(
    lengths: np.ndarray,
    *,
    schedulers: Sequence[str],
    dp_size: int,
    cp_size: int = 1,
    max_tokens_per_rank: int,
    pad_multiple: int | None = None,
    global_batch: int,
    steps: int,
    model: str | None = "llama3-8b",
    on_oversize: str = "error",
    scheduler_options: dict[str, dict[str, Any]] | None = None,
    progress: bool = False,
    keep_first: bool = False,
    bytes_per_token: float | None = None,
    sync: str = "lockstep",
) -> dict[str, Any]:
    """Schedule ``steps`` global batches of ``lengths`` with each scheduler and account them.

    Step ``k`` takes ``lengths[k*global_batch : (k+1)*global_batch]`` (repeating).
    ``pad_multiple`` defaults to the wrapper's (:func:`~seqpack.thd.pad_multiple_for`).
    Zero-length samples are dropped and counted, as the wrapper does. Every scheduler plans
    for ``sync`` with the same cost model (the preset's training FLOPs; token counts when
    ``model`` is None) and is accounted under both. Samples sit on DP ranks in contiguous
    equal blocks, as the wrapper reads them; moved tokens count what the exchange carries,
    in bytes at ``bytes_per_token`` (default 20), which ``balanced``'s ``locality="auto"``
    also gets (each step's row says whether it ran locality, and above which bytes per
    token it would). Each plan is timed (wall clock) and its peak resident memory measured
    (:class:`~seqpack.cli.memory.PeakMemory`). Memory stays ``O(global_batch + dp *
    microbatches)`` whatever the steps: only scalars are kept per step.

    Returns ``{"config": ..., "results": {name: aggregates}}``; with ``keep_first`` each
    result also holds ``"first"``: ``(schedule, StepStats)`` of step 0.

    Raises:
        ConfigError: No lengths, a non-positive ``global_batch`` or ``steps``, or a
            ``pad_multiple`` the wrapper would refuse under CP.
    """
    from seqpack.cost import CostModel, model_preset
    from seqpack.schedulers import get_scheduler
    from seqpack.stats import SAMPLE_BYTES_PER_TOKEN
    from seqpack.thd import pad_multiple_for

    spec = model_preset(model) if model else None
    cost = spec.cost_model() if spec else CostModel.tokens()
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        raise ConfigError("no lengths to simulate")
    global_batch = check_int("global_batch", global_batch, minimum=1)
    steps = check_int("steps", steps, minimum=1)
    bytes_per_token = SAMPLE_BYTES_PER_TOKEN if bytes_per_token is None else bytes_per_token
    bytes_per_token = check_number("bytes_per_token", bytes_per_token, minimum=0.0)
    pad_multiple = pad_multiple_for(cp_size) if pad_multiple is None else check_pad_multiple(pad_multiple, cp_size)
    options = scheduler_options or {}
    built = {name: get_scheduler(name, **options.get(name, {})) for name in schedulers}
    for sched in built.values():  # load compiled kernels before anything is timed
        sched.schedule([1, 1], dp_size=2, max_tokens_per_rank=2)
    limits = {
        "dp_size": dp_size,
        "cp_size": cp_size,
        "max_tokens_per_rank": max_tokens_per_rank,
        "pad_multiple": pad_multiple,
        "cost": cost,
        "on_oversize": on_oversize,
        "sync": sync,
    }
    per, first = _schedule_steps(
        built, lengths, global_batch, steps, limits, spec, bytes_per_token, keep_first=keep_first, progress=progress
    )
    results = {}
    for name, rows in per.items():
        results[name] = _aggregate(rows)
        if keep_first:
            results[name]["first"] = first[name]
    config = dict(limits, capacity=max_tokens_per_rank * cp_size, global_batch=global_batch, steps=steps)
    config.update(model=model, bytes_per_token=bytes_per_token, lengths_available=int(lengths.size))
    config.update(lengths_repeated=steps * global_batch > lengths.size)
    config["cost"] = {"linear": cost.linear, "quadratic": cost.quadratic, "constant": cost.constant}
    return {"config": config, "results": results}


def _schedule_steps(
    built: Mapping[str, Scheduler],
    lengths: np.ndarray,
    global_batch: int,
    steps: int,
    limits: dict[str, Any],
    spec: ModelSpec | None,
    bytes_per_token: float,
    *,
    keep_first: bool,
    progress: bool,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """Every scheduler's rows (:func:`_step_row`) over ``steps`` steps, and with ``keep_first``
    each one's ``(schedule, StepStats)`` of step 0."""
    from seqpack.stats import StepStats

    per: dict[str, list[dict[str, Any]]] = {name: [] for name in built}
    first: dict[str, Any] = {}
    with Progress(steps * len(built), "simulate", enabled=progress) as bar:
        for step in range(steps):
            # Positions wrap around the lengths: memory O(global_batch), whatever the steps.
            batch = lengths[np.arange(step * global_batch, (step + 1) * global_batch, dtype=np.int64) % lengths.size]
            empty = int(np.count_nonzero(batch == 0))
            batch = batch[batch > 0]
            for name, sched in built.items():
                bar.update(0, step=step, planning=name)  # what runs (a plan at dp=10**7 takes a minute)
                with PeakMemory() as peak:
                    s = sched.schedule(batch, **limits, bytes_per_token=bytes_per_token)
                st = StepStats.from_schedule(
                    s, limits["cost"], empty_samples=empty, bytes_per_token=bytes_per_token, sync=limits["sync"]
                )
                if spec is not None:  # every term of the model (sliding-window layers included)
                    st.flops = float(spec.sequence_flops(s.lengths[s.assigned]))  # O(sequences), not O(dp cells)
                locality = _locality_row(sched, s, bytes_per_token)
                if keep_first and step == 0:
                    first[name] = (s, st)
                del s  # one step's schedule at a time
                per[name].append({**_step_row(st, peak, limits["dp_size"]), **locality})
                bar.update(1, step=step, plan_s=round(peak.seconds, 3))
    return per, first


def _locality_row(sched: Scheduler, schedule: Schedule, bytes_per_token: float) -> dict[str, Any]:
    """For a scheduler with a locality switch (``balanced``): whether this step ran it, and
    the bytes per token above which ``locality="auto"`` runs it for this step's shape."""
    from seqpack.schedulers.balanced import BalancedScheduler
    from seqpack.schedulers.balanced.locality import break_even_bytes_per_token
    from seqpack.thd import padded_lengths

    if not isinstance(sched, BalancedScheduler):
        return {}
    active = schedule.lengths[schedule.lengths > 0]
    shape = dict(
        sequences=int(active.shape[0]),
        tokens=int(padded_lengths(active, schedule.pad_multiple).sum()),
        dp_size=schedule.dp_size,
    )
    return {
        "locality": sched.uses_locality(**shape, bytes_per_token=bytes_per_token),
        "locality_break_even": break_even_bytes_per_token(**shape),
    }


def _step_row(st: StepStats, peak: PeakMemory, dp_size: int) -> dict[str, Any]:
    """What :func:`simulate` keeps of one step of one scheduler (scalars only)."""
    total = float(st.replica_cost.sum())
    return {
        "microbatches": st.num_microbatches,
        "min_microbatches": st.min_microbatches,
        "bound_ratio": st.bound_ratio,
        "imbalance": st.imbalance,
        "round_imbalance": st.round_imbalance,
        "round_lower_bound": st.round_lower_bound,
        "pad_fraction": st.pad_fraction,
        "moved_fraction": st.moved_fraction,
        "moved_bytes": st.moved_bytes,
        "rank_moved_bytes": st.max_rank_moved_bytes,
        "peak_bytes": peak.bytes,
        "flops": st.flops,
        "replica_wait": float(st.replica_cost.max()),
        "round_wait": st.round_imbalance * total / dp_size,
        "ideal": total / dp_size,
        "seconds": peak.seconds,
        "dropped": st.dropped_sequences,
        "truncated": st.truncated_sequences,
        "deferred": st.deferred_sequences,
        "sequences": st.num_sequences,
        "empty": st.empty_samples,
    }


def _aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One scheduler's steps summed up: means, worst cases, exact counts, and the steps."""
    col = {k: np.array([r[k] for r in rows], dtype=np.float64) for k in rows[0] if rows[0][k] is not None}
    return {
        "microbatches": float(col["microbatches"].mean()),
        "min_microbatches": float(col["min_microbatches"].mean()),
        "bound_ratio": float(col["bound_ratio"].mean()),
        "bound_ratio_max": float(col["bound_ratio"].max()),
        "round_imbalance": float(col["round_imbalance"].mean()),
        "round_imbalance_max": float(col["round_imbalance"].max()),
        "round_lower_bound": float(col["round_lower_bound"].mean()),
        "pad_fraction": float(col["pad_fraction"].mean()),
        "moved_fraction": float(col["moved_fraction"].mean()),
        "moved_bytes": float(col["moved_bytes"].mean()),
        "rank_moved_bytes": float(col["rank_moved_bytes"].mean()),
        "peak_bytes": int(col["peak_bytes"].max()) if "peak_bytes" in col else None,
        "flops_per_step": float(col["flops"].mean()) if "flops" in col else None,
        "replica_wait": float(col["replica_wait"].mean()),
        "round_wait": float(col["round_wait"].mean()),
        "ideal": float(col["ideal"].mean()),
        "seconds_mean": float(col["seconds"].mean()),
        "seconds_max": float(col["seconds"].max()),
        "dropped": sum(int(r["dropped"]) for r in rows),  # counts stay exact ints
        "truncated": sum(int(r["truncated"]) for r in rows),
        "deferred": sum(int(r["deferred"]) for r in rows),
        "empty": sum(int(r["empty"]) for r in rows),  # zero-length samples dropped, as the wrapper does
        **(
            {
                "locality_steps": sum(bool(r["locality"]) for r in rows),
                "locality_break_even": float(np.median([r["locality_break_even"] for r in rows])),
            }
            if "locality" in rows[0]
            else {}
        ),
        "steps": [dict(r) for r in rows],
    }


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from seqpack.cost import DEFAULT_MODEL, MODEL_PRESETS
    from seqpack.options import OnOversize, Order, Sync

    p = subparsers.add_parser(
        "simulate",
        help="compare schedulers on a length distribution at any scale",
        description="Schedule global batches of sequence lengths with one or more schedulers and compare "
        "balance, microbatches, padding, FLOPs and scheduling time. Runs on one CPU for any number of replicas: "
        "plan runs bigger than the machine you sit at.",
    )
    add_source_args(p, allow_file=True)
    topo = p.add_argument_group("topology and limits")
    topo.add_argument("--dp", type=int, default=8, help="data-parallel replicas (default 8)")
    topo.add_argument("--cp", type=int, default=1, help="context-parallel ranks per replica (default 1)")
    topo.add_argument("--max-tokens-per-rank", type=int, default=16384, help="tokens per rank per microbatch")
    topo.add_argument(
        "--pad-multiple", type=int, help="pad every sequence to a multiple of this (default 1, or 2*cp under CP; "
        "under CP it must be a multiple of 2*cp)"
    )  # fmt: skip
    topo.add_argument("--global-batch", type=int, help="sequences per step (default 16 per replica)")
    topo.add_argument("--steps", type=int, default=10, help="steps to simulate (default 10)")
    topo.add_argument(
        "--on-oversize", choices=[str(v) for v in OnOversize], default="error", help="sequences longer than capacity"
    )
    run_ = p.add_argument_group("schedulers and cost")
    run_.add_argument("--schedulers", default="balanced,dp_balanced,empty", help="comma-separated names")
    run_.add_argument("--order", choices=[str(v) for v in Order], default="heavy_first", help="balanced's order")
    run_.add_argument(
        "--sync",
        choices=[str(v) for v in Sync],
        default="lockstep",
        help="what a step waits for, planned and reported: lockstep (FSDP, pipeline; default) or replica (DDP/ZeRO-1)",
    )
    run_.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        choices=sorted(MODEL_PRESETS) + ["tokens"],
        help=f"cost model: a preset's training FLOPs (default {DEFAULT_MODEL}) or plain tokens",
    )
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print a JSON report instead of the table")
    out.add_argument("--per-step", action="store_true", help="with --json: include every step's figures")
    out.add_argument(
        "--plot", metavar="FILE.png", help="draw per-replica load of step 0 for each scheduler (needs matplotlib)"
    )
    out.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    run_.add_argument(
        "--locality",
        choices=["auto", "on", "off"],
        default="auto",
        help="balanced keeps samples on the rank that read them when that costs at most 0.1%% of step time: "
        "auto (default) only where the bytes it keeps home at --bytes-per-token are worth its plan time",
    )
    run_.add_argument(
        "--bytes-per-token",
        type=float,
        default=None,
        help="bytes one sample token carries through the exchange, for the moved-bytes figures and "
        "--locality auto (default 20: int64 input_ids and labels, float32 loss_mask)",
    )
    return p


def run(args: argparse.Namespace) -> int:
    from seqpack.cli import plots
    from seqpack.schedulers import available_schedulers

    names = [s.strip() for s in args.schedulers.split(",") if s.strip()]
    unknown = [s for s in names if s not in available_schedulers()]
    if unknown or not names:
        raise CommandError(
            f"--schedulers {args.schedulers!r}: unknown scheduler(s) {unknown}; "
            f"available: {', '.join(available_schedulers())}"
        )
    for flag in ("dp", "cp", "max_tokens_per_rank", "steps", "global_batch"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise CommandError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    if args.pad_multiple is not None:  # checked here to name the flags; None: simulate() picks the wrapper's default
        check_pad_multiple(args.pad_multiple, args.cp, name="--pad-multiple", cp_name="--cp")
    if args.bytes_per_token is not None and not args.bytes_per_token >= 0:
        raise CommandError(f"--bytes-per-token must be >= 0, got {args.bytes_per_token}")
    fmt = plots.plot_target("--plot", args.plot) if args.plot else plots.DEFAULT_FORMAT
    global_batch = args.global_batch or 16 * args.dp
    check_fits(args.dp, args.cp, args.max_tokens_per_rank, global_batch, args.steps, args.global_batch is None)
    lengths, source = load_lengths(args, global_batch * args.steps)
    where = f"--lengths {args.lengths}" if getattr(args, "lengths", None) is not None else source
    if len(lengths) == 0:
        raise CommandError(f"{where}: no lengths in it, nothing to simulate")
    if not np.any(np.asarray(lengths) > 0):
        raise CommandError(f"{where}: all {len(lengths)} lengths are 0 (empty samples are dropped): nothing to do")
    options: dict[str, dict[str, Any]] = {"balanced": {"order": args.order, "locality": _LOCALITY[args.locality]}}
    try:
        report = simulate(
            lengths,
            schedulers=names,
            dp_size=args.dp,
            cp_size=args.cp,
            max_tokens_per_rank=args.max_tokens_per_rank,
            pad_multiple=args.pad_multiple,
            global_batch=global_batch,
            steps=args.steps,
            model=None if args.model == "tokens" else args.model,
            on_oversize=args.on_oversize,
            scheduler_options=options,
            progress=not args.no_progress,
            keep_first=bool(args.plot),
            bytes_per_token=args.bytes_per_token,
            sync=args.sync,
        )
    except ValueError as err:  # the schedulers' refusals of these lengths and limits (e.g. an oversize sequence)
        hint = " (--on-oversize truncate or drop)" if "on_oversize" in str(err) else ""
        raise CommandError(f"{err}{hint}") from None
    report["config"]["source"] = source
    report["config"]["balanced"] = options["balanced"]
    if args.plot:
        plots.replica_loads(report, args.plot, fmt=fmt)
    if args.json:
        out: dict[str, Any] = {"config": report["config"], "results": {}}
        for name, r in report["results"].items():
            out["results"][name] = {k: v for k, v in r.items() if k != "first" and (args.per_step or k != "steps")}
        print(json.dumps(out, indent=2))
        return 0
    _print_report(report, source, global_batch)
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0


def check_fits(
    dp_size: int, cp_size: int, max_tokens_per_rank: int, global_batch: int, steps: int, default_batch: bool
) -> None:
    """Refuse, before any work, a run whose one step (``O(global_batch + dp * microbatches)``,
    microbatches estimated for sequences of a quarter of the capacity) and whose lengths of
    all steps cannot fit in this machine's memory.

    Raises:
        CommandError: Naming ``--dp``, ``--global-batch`` and ``--steps`` with the estimate.
    """
    capacity = max_tokens_per_rank * cp_size
    microbatches = max(1, -(-global_batch * (capacity // 4) // (dp_size * capacity)))
    need = step_bytes_estimate(global_batch, dp_size, microbatches) + 8 * global_batch * steps
    have = available_bytes()
    if have is None or need <= 0.8 * have:
        return
    batch = f"--global-batch {global_batch:,}" + (" (16 per replica by default)" if default_batch else "")
    raise CommandError(
        f"--dp {dp_size:,} with {batch} and --steps {steps:,} needs about {need / 2**30:.1f} GiB "
        f"(one step's schedule holds {dp_size:,} x ~{microbatches:,} microbatches and {global_batch:,} sequences; "
        f"the lengths of all steps are read first) but this machine has {have / 2**30:.1f} GiB available: "
        "lower --dp, --global-batch or --steps"
    )


def _print_report(report: dict[str, Any], source: str, global_batch: int) -> None:
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
        "moved %: tokens that change DP rank (the all-to-all's payload), with samples read in rank order;\n"
        f"  MB/rank: what the busiest rank sends or receives at {cfg['bytes_per_token']:g} bytes per token.\n"
        "plan ms: scheduling time per step (mean); peak MB: the most memory one plan took."
    )
    for name, r in report["results"].items():
        if "locality_steps" in r:
            print(_locality_note(name, r, cfg))
    empty = max((r["empty"] for r in report["results"].values()), default=0)
    if empty:
        print(f"{empty} zero-length samples dropped over {cfg['steps']} steps (as the wrapper does), not scheduled")
    lost = {n: (r["dropped"], r["truncated"]) for n, r in report["results"].items() if r["dropped"] or r["truncated"]}
    for name, (dropped, truncated) in lost.items():
        print(f"{name}: {dropped} sequences dropped, {truncated} truncated (on_oversize={cfg['on_oversize']})")


def _locality_note(name: str, result: dict[str, Any], cfg: dict[str, Any]) -> str:
    """What locality did for ``name`` (a ``balanced``), and why under ``"auto"``."""
    option = cfg.get("balanced", {}).get("locality", "auto") if name == "balanced" else "auto"
    ran, steps = result["locality_steps"], cfg["steps"]
    state = "on" if ran == steps else "off" if ran == 0 else f"on in {ran} of {steps} steps"
    if option != "auto":
        return f"{name}: locality {state} (--locality {'on' if option else 'off'})"
    return (
        f"{name}: locality auto: {state} at {cfg['bytes_per_token']:g} bytes per token; it pays above "
        f"{result['locality_break_even']:,.0f} bytes per token for these steps\n  (its plan time against the "
        "tokens it keeps home at 25 GB/s per rank; docs/scale.md); --locality on|off to choose"
    )
