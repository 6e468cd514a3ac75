"""``seqpack mock``: write mock sequence lengths, or a mock SFT dataset of random tokens."""

from __future__ import annotations

import argparse

from seqpack.cli.exit import CommandError
from seqpack.cli.files import check_output_file
from seqpack.cli.length_sources import add_source_args, load_lengths
from seqpack.cli.progress import Progress
from seqpack.validation import check_int

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "mock",
        help="write mock sequence lengths or a mock SFT dataset",
        description="Draw sequence lengths from a distribution or a Megatron mock-dataset config and write them "
        "(CSV, Parquet, Arrow, JSONL), or write a mock SFT dataset of random tokens (Parquet).",
    )
    add_source_args(p, allow_file=False)
    p.add_argument("-n", "--num-samples", type=int, default=10000, help="how many lengths (default 10000)")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="output file; format from its extension")
    p.add_argument("--dataset", action="store_true", help="write a MockSFTDataset (input_ids) as Parquet")
    p.add_argument("--vocab-size", type=int, default=32000, help="vocabulary of --dataset tokens (default 32000)")
    p.add_argument("-q", "--quiet", action="store_true")
    return p


def run(args: argparse.Namespace) -> int:
    from seqpack.cli.commands.stats import length_summary
    from seqpack.mock_data import write_lengths
    from seqpack.mock_data.io import file_format

    out = args.output
    check_int("--num-samples", args.num_samples, minimum=0)
    check_output_file("-o", out)
    if args.dataset:
        if not out.endswith(".parquet"):
            raise CommandError(f"--dataset writes Parquet; -o {out!r} does not end in .parquet")
        from seqpack.mock_data.sft import MIN_VOCAB_SIZE  # here: a dataset is torch tensors, lengths are not

        check_int("--vocab-size", args.vocab_size, minimum=MIN_VOCAB_SIZE)
    else:
        file_format(out)  # an unknown extension is refused before the lengths are drawn
    lengths, source = load_lengths(args, args.num_samples)
    if args.dataset:
        if lengths.size and lengths.min() < 1:
            raise CommandError(f"a mock dataset needs lengths >= 1; {source} gives {int(lengths.min())}")
        from seqpack.mock_data.sft import MockSFTDataset

        dataset = MockSFTDataset(lengths, vocab_size=args.vocab_size, seed=args.seed)
        with Progress(len(dataset), "write", enabled=not args.quiet) as bar:
            dataset.write_parquet(out, progress=bar.update)
        what = f"mock SFT dataset ({args.vocab_size}-token vocabulary)"
    else:
        write_lengths(out, lengths)
        what = "lengths"
    if not args.quiet:
        print(f"wrote {lengths.size} {what} from {source} to {out}")
        if lengths.size:
            s = length_summary(lengths, model=None)
            print(f"  tokens {s['tokens']}, mean {s['mean']:.1f}, min {s['min']}, max {s['max']}")
    return 0
