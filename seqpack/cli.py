"""The ``seqpack`` command."""

from __future__ import annotations

import argparse
import sys

import seqpack


def _cmd_demo(args: argparse.Namespace) -> int:
    """Pack a few mock sequences and show their THD layout and CP shards."""
    import numpy as np
    import torch

    from seqpack.cp import shard_for_cp
    from seqpack.thd import pack_sequences, pad_multiple_for

    rng = np.random.default_rng(args.seed)
    lengths = rng.integers(1, 12, args.sequences)
    samples = [{"input_ids": torch.from_numpy(rng.integers(1, 100, n))} for n in lengths]
    pad_multiple = pad_multiple_for(args.cp)
    batch = pack_sequences(samples, pad_multiple=pad_multiple)
    print(f"{args.sequences} sequences of lengths {lengths.tolist()} packed with pad_multiple={pad_multiple}")
    print(f"  cu_seqlens        {batch.cu_seqlens.tolist()}")
    print(f"  cu_seqlens_padded {batch.cu_seqlens_padded.tolist()}")
    print(f"  input_ids         {batch.input_ids.tolist()}")
    print(f"  position_ids      {batch.position_ids.tolist()}")
    print(f"  real / total      {batch.num_real_tokens} / {batch.num_tokens} tokens")
    for rank in range(args.cp):
        shard = shard_for_cp(batch, args.cp, rank)
        print(f"  cp rank {rank}: positions {shard.position_ids.tolist()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seqpack",
        description="Sequence packing and load balancing for distributed LLM training.",
    )
    parser.add_argument("--version", action="version", version=f"seqpack {seqpack.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="show packing and CP sharding of mock sequences")
    demo.add_argument("--sequences", type=int, default=5)
    demo.add_argument("--cp", type=int, default=2)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
