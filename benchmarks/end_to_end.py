"""Real tokens/s of the tiny hybrid LM: packed + balanced vs packed + dp_balanced vs padded.

Two gloo ranks (dp=2, cp=1), one per core, one torch thread each, so that a rank waiting on an
imbalanced peer really idles. The scheduler balances the tiny model's own cost, measured on
this CPU (``seqpack demo --cost measured``). The three modes train the same model from the
same weights on the same global batches, taking turns step by step, so the machine's noise
falls on all of them alike; their losses must agree.

    python benchmarks/end_to_end.py [--steps 6] [--data mock,stdlib] [--repeats 2]

Targets (lognormal SFT mix): balanced >= 2.0x padded and >= 1.15x dp_balanced.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import tempfile

import torch

from seqpack.cli.demo.launch import launch
from seqpack.cli.demo.settings import DemoSettings

TARGETS = {"padded": 2.0, "dp_balanced": 1.15}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_once(settings: DemoSettings) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        code = launch(dataclasses.replace(settings, json_out=out))
        if code != 0:
            raise SystemExit(f"benchmark run failed with exit code {code}: {settings}")
        with open(out) as f:
            return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="measured steps per mode and repeat")
    parser.add_argument("--repeats", type=int, default=3, help="independent runs per dataset (different data)")
    parser.add_argument("--data", default="mock,stdlib")
    parser.add_argument("--samples-per-rank", type=int, default=32)
    parser.add_argument("--max-tokens-per-rank", type=int, default=8192)
    parser.add_argument("--max-seq-len", type=int, default=4096)
    parser.add_argument("--mean-seq-len", type=int, default=512)
    parser.add_argument("--verbose", action="store_true", help="print every step")
    parser.add_argument(
        "--cost",
        default="measured",
        choices=["measured", "online", "flops"],
        help="scheduler cost: measured once on this CPU, or that then calibrated online (the demo's default)",
    )
    args = parser.parse_args()

    base = DemoSettings(
        dp=2,
        cp=1,
        threads=1,
        steps=args.steps,
        warmup_steps=1,
        samples_per_rank=args.samples_per_rank,
        max_tokens_per_rank=args.max_tokens_per_rank,
        max_seq_len=args.max_seq_len,
        mean_seq_len=args.mean_seq_len,
        sigma=1.1,
        cost=args.cost,
        quiet=not args.verbose,
    )
    print(f"# machine: {_cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}")
    print(
        f"# settings: dp=2 x cp=1 gloo ranks, 1 thread each; tiny hybrid LM d_model={base.d_model} pattern "
        f"{base.pattern}; {base.samples_per_rank} samples per rank per step; capacity {base.max_tokens_per_rank} "
        f"tokens per microbatch; sequences <= {base.max_seq_len}; padded baseline: "
        f"{base.max_tokens_per_rank // base.max_seq_len} sequences per microbatch, each padded to the longest; "
        f"lognormal lengths mean {base.mean_seq_len} (sigma {base.sigma}, clipped to [{base.min_seq_len}, "
        f"{base.max_seq_len}]); {base.steps} measured steps after 1 warm-up, x{args.repeats} runs per dataset; "
        f"scheduler cost {args.cost} (measured: fitted on this CPU once; online: then calibrated from the "
        f"microbatch times); FSDP2 over both ranks, one unit for the model"
    )
    print(
        f"{'data':<8}{'run':>4}  {'mode':<12}{'real tok/s':>11}{'vs padded':>11}{'vs dp_bal':>11}"
        f"{'pad %':>8}{'imbalance':>11}{'round imb':>11}{'mbs/step':>10}{'final loss':>12}"
    )
    verdicts = []
    for data in [d.strip() for d in args.data.split(",") if d.strip()]:
        sums = {}
        for run in range(args.repeats):
            settings = dataclasses.replace(base, data=data, seed=run)
            report = run_once(settings)
            results = {r["mode"]: r for r in report["results"]}
            losses = {round(r["last_loss"], 3) for r in results.values()}
            for mode, r in results.items():
                sums.setdefault(mode, []).append(r)
                imb = f"{r['imbalance']:.3f}" if r["imbalance"] is not None else "n/a"
                rimb = f"{r['round_imbalance']:.3f}" if r["round_imbalance"] is not None else "n/a"
                print(
                    f"{data:<8}{run:>4}  {mode:<12}{r['tokens_per_s']:>11,.0f}"
                    f"{r['tokens_per_s'] / results['padded']['tokens_per_s']:>10.2f}x"
                    f"{r['tokens_per_s'] / results['dp_balanced']['tokens_per_s']:>10.2f}x"
                    f"{r['pad_fraction'] * 100:>7.1f}%{imb:>11}{rimb:>11}{r['microbatches_per_step']:>10.1f}"
                    f"{r['last_loss']:>12.4f}"
                )
            if len(losses) != 1:
                print(f"  WARNING: modes ended at different losses {sorted(losses)}")
        # Aggregate over runs: total real tokens / total seconds.
        tps = {m: sum(r["real_tokens"] for r in rs) / sum(r["seconds"] for r in rs) for m, rs in sums.items()}
        for other, target in TARGETS.items():
            ratio = tps["balanced"] / tps[other]
            verdict = "PASS" if ratio >= target else "FAIL"
            scope = "target" if data == "mock" else "reported (target is for the lognormal mix)"
            verdicts.append(
                f"{verdict if data == 'mock' else '----'}  {data}: balanced {tps['balanced']:,.0f} tok/s = "
                f"{ratio:.2f}x {other} ({tps[other]:,.0f} tok/s); {scope} >= {target}x"
            )
    print("\nresults over all runs (total real tokens / total time)")
    for line in verdicts:
        print("  " + line)


if __name__ == "__main__":
    main()
