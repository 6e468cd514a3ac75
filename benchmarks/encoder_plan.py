"""Encoder rebalancing's plan on random microbatch rounds (docs/multimodal.md, "Encoder
rebalancing": the table "What the plan buys").

Each round gives every DP rank 0, 1, 2 or 4 images (probabilities .3, .5, .1, .1; an
assumption, not a dataset's figure), each ``(1, s, s + 2k)`` patches with ``s`` drawn from
``--sides`` and ``k`` from 0..7, home on that rank. Costs are Qwen2-VL-7B's encoder training
FLOPs (ViT 1280 wide, 32 blocks, 16 heads, MLP 5120, 14 px patches, merge 2, out 3584). Per
``dp`` it prints the means over ``--rounds`` rounds of: the busiest rank's encoder FLOPs with
every image home and under :func:`~seqpack.schedulers.encoder_plan.plan_encoders`, each over
the bound ``max(largest image, total / dp)``; the share of images moved; how often
``rebalance_pays`` (``"auto"``) routes; the encoder time saved on the busiest rank and the
busiest rank's exchange time (bf16 pixels and embeddings, defaults of ``rebalance_pays``); the
plan's time on one rank.

    python benchmarks/encoder_plan.py --sides 16,32,48,64,96
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from seqpack.cost import VisionSpec
from seqpack.schedulers.balanced.locality import LINK_BYTES_PER_SECOND
from seqpack.schedulers.encoder_plan import DEFAULT_SECONDS_PER_FLOP, plan_encoders, rebalance_pays, route_bytes

SPEC = VisionSpec(
    1280,
    num_layers=32,
    num_attention_heads=16,
    ffn_hidden_size=5120,
    patch_size=14,
    temporal_patch_size=2,
    spatial_merge_size=2,
    out_hidden_size=3584,
    in_channels=3,
)
BF16 = 2


def _round(rng: np.random.Generator, dp: int, sides: list[int]) -> tuple[np.ndarray, np.ndarray]:
    counts = rng.choice([0, 1, 2, 4], p=[0.3, 0.5, 0.1, 0.1], size=dp)
    home = np.repeat(np.arange(dp, dtype=np.int64), counts)
    side = rng.choice(sides, size=home.size)
    grids = np.stack([np.ones_like(side), side, side + 2 * rng.integers(0, 8, size=home.size)], axis=1)
    return grids.astype(np.int64).reshape(-1, 3), home


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sides", default="16,32,48,64,96", help="image sides in patches, comma-separated")
    parser.add_argument("--dp", default="8,64,256,1024")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    sides = [int(s) for s in args.sides.split(",")]
    rng = np.random.default_rng(0)
    print("| dp | home / bound | plan / bound | images moved | auto on | gain ms | exchange ms | plan ms |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for dp in (int(d) for d in args.dp.split(",")):
        rows = []
        for _ in range(args.rounds):
            grids, home = _round(rng, dp, sides)
            costs = SPEC.grid_flops(grids)
            start = time.perf_counter()
            plan = plan_encoders(costs, home, dp)
            seconds = time.perf_counter() - start
            patches = grids.prod(axis=1).astype(np.float64)
            pixels = patches * SPEC.in_channels * SPEC.temporal_patch_size * SPEC.patch_size**2 * BF16
            embeds = patches / SPEC.spatial_merge_size**2 * SPEC.out_hidden_size * BF16
            exchange = route_bytes(plan, pixels, embeds, dp).max(initial=0.0) / LINK_BYTES_PER_SECOND
            rows.append(
                (
                    plan.home_load.max() / plan.lower_bound,
                    plan.load.max() / plan.lower_bound,
                    plan.moved.mean(),
                    rebalance_pays(plan, pixels, embeds, seconds_per_cost=DEFAULT_SECONDS_PER_FLOP),
                    plan.gain * DEFAULT_SECONDS_PER_FLOP * 1e3,
                    exchange * 1e3,
                    seconds * 1e3,
                )
            )
        m = np.mean(np.array(rows, dtype=np.float64), axis=0)
        print(f"| {dp} | {m[0]:.2f} | {m[1]:.3f} | {m[2]:.0%} | {m[3]:.0%} | {m[4]:.1f} | {m[5]:.2f} | {m[6]:.1f} |")


if __name__ == "__main__":
    main()
