"""Issue 41 item 5: the vision encoder's work in the balance, on image mixes described from
public figures.

Each step draws ``--samples-per-rank`` samples per DP rank from a mix, plans them with
``balanced`` into microbatches of ``--max-tokens-per-rank`` tokens, and prints the lockstep step
time (:func:`seqpack.schedulers.predicted_step_time`, training FLOPs) of

- **tokens**: the plan balancing the language model's cost alone (``sample_cost=None``, what
  frameworks do today), reported with each sample's encoder cost added to its microbatch;
- **summed**: the plan balancing language model + encoder (``sample_cost=`` the encoder's
  FLOPs, :meth:`seqpack.cost.VisionSpec.sample_flops`);
- **rebal**: the summed plan with encoder rebalancing (issue 41 item 4) as
  ``encoder_rebalance="auto"`` runs it: in every microbatch round,
  :func:`~seqpack.schedulers.encoder_plan.plan_encoders` places the round's images on its DP
  ranks by encoder FLOPs (home first), and the round is routed where
  :func:`~seqpack.schedulers.encoder_plan.rebalance_pays` says so (each rank's language-model
  FLOPs as ``other_load``, at the default 400 TFLOP/s and 25 GB/s a rank; bf16 patches and
  embeddings). The route's all-to-alls put a barrier between the encoder and the language
  model, so a routed round costs its busiest encoder load plus its busiest language-model
  cost plus the exchange (in FLOPs at that rate), a round at home ``max_d (enc_d + lm_d)``;
- **forced**: the same with ``encoder_rebalance=True``: every round whose plan moves an image
  is routed;
- **tok+rebal**: ``"auto"`` over the token-only plan (no encoder cost in the plan);

each over the **lower bound** :func:`seqpack.schedulers.objective.round_sum_lower_bound` of the
summed costs (knapsack in cost-per-token order):
``total / dp + max(0, costliest sample - K / dp)``, which no plan of ``sum_m max_d`` beats at any
microbatch count; and the **encoder imbalance** of each plan: the largest DP rank's encoder
FLOPs over the mean (the rank that stalls the others at the next collective when the encoder
runs where its sequence runs; after forced rebalancing, each rank's encoder FLOPs of the
images it encodes), and the share of rounds ``"auto"`` routes over each plan. For a routed
round the bound's ``total / dp`` part still holds (``max enc + max lm`` is at least the
round's mean); its knapsack part assumes a sample's images stay with it. Figures are means
over ``--steps`` steps (seeds 0..steps-1).

Models (published shapes): Qwen2-VL-7B (Qwen2-7B language model: h 3584, 28 layers, 28 heads,
4 KV heads, SwiGLU 18944, vocab 152064; ViT: 1280 wide, 32 blocks, 16 heads, MLP 5120, full
attention over each image) and Qwen2.5-VL-7B (the same language model; ViT 1280 wide, 32
blocks, SwiGLU 3420, 112-pixel windows with full attention in blocks 7, 15, 23, 31). Patches of
14 px, 2 frames per temporal patch, 2 x 2 patches per language token. Cost in training FLOPs
(``ModelSpec.cost_model()``, no per-microbatch constant), the encoder's FLOPs in the same units.

Mixes (assumptions, each stated; the shares are rounded, the resolutions are the datasets'
typical sizes, not measured here):

- ``si``: LLaVA-OneVision's single-image stage (Li et al. 2024, 3.2M samples: general, docs /
  charts / screens, math, OCR and a language-only part): 8% text-only, 30% thumbnails
  (224-448 px a side, web caption data), 37% photos (COCO-like 480-640 px: ShareGPT4V /
  LLaVA-Instruct's COCO images), 25% high-resolution (documents, charts, SAM images: long side
  1,500-2,304 px, LLaVA-OneVision's largest input 2304 x 2304).
- ``ov``: LLaVA-OneVision's OneVision stage (1.6M samples: 0.69M single-image, 0.56M
  multi-image, 0.35M video): 5% text-only, 41% single images (12% thumbnails, 17% photos,
  12% high-resolution), 33% multi-image (2-6 photos or thumbnails, LLaVA-Interleave-style),
  21% video (16-64 frames at 2 fps, 448 x 252 px a frame: qwen-vl-utils' per-frame limit
  gives frames of about that size).
- ``docs``: a document-heavy SFT mix (DocVQA / ChartQA / InfoVQA-like: page scans of
  1,700 x 2,200 px): 5% text-only, 60% high-resolution, 35% photos.

Image sizes become Qwen2-VL grids as its processor's ``smart_resize`` makes them (sides rounded
to 28 px, between 56 x 56 and ``--max-pixels``: by default qwen-vl-utils' 28 x 28 x 16384, which
keeps these images whole; transformers 5.24's processor default is 28 x 28 x 1280, at most
1,280 tokens an image, the second table in benchmarks/results/multimodal.txt); a sample's
tokens are its text (log-normal, median 250 tokens, sigma 0.8, clipped to [16, 4096];
text-only samples median 600, sigma 1.0) plus ``t*h*w/4`` placeholders and 2 vision markers
per image or video. Every sample fits one microbatch (the largest: a 2304 x 2304 image, 6,724
tokens, plus 4,096 of text).

    python benchmarks/multimodal.py [--dp 8 64 256 1024] [--steps 3] [--max-pixels 12845056] [--out FILE]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402

import numpy as np  # noqa: E402

from seqpack.cost import ModelSpec, VisionSpec  # noqa: E402
from seqpack.schedulers import get_scheduler, predicted_step_time  # noqa: E402
from seqpack.schedulers.balanced.locality import LINK_BYTES_PER_SECOND  # noqa: E402
from seqpack.schedulers.encoder_plan import (  # noqa: E402
    DEFAULT_SECONDS_PER_FLOP,
    plan_encoders,
    rebalance_pays,
    route_bytes,
)
from seqpack.schedulers.objective import round_sum_lower_bound  # noqa: E402
from seqpack.schedulers.schedule import Schedule  # noqa: E402
from seqpack.schedulers.step_time import rank_times  # noqa: E402

PATCH, MERGE, TEMPORAL = 14, 2, 2
MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 16384

_LM = dict(
    hidden_size=3584,
    num_layers=28,
    num_attention_heads=28,
    ffn_hidden_size=18944,
    num_query_groups=4,
    vocab_size=152064,
)
_VIT = dict(
    num_layers=32,
    num_attention_heads=16,
    patch_size=PATCH,
    temporal_patch_size=TEMPORAL,
    spatial_merge_size=MERGE,
    out_hidden_size=3584,
)
MODELS = {
    "qwen2-vl-7b": ModelSpec(**_LM, vision=VisionSpec(hidden_size=1280, ffn_hidden_size=5120, **_VIT)),
    "qwen2.5-vl-7b": ModelSpec(
        **_LM,
        vision=VisionSpec(
            hidden_size=1280,
            ffn_hidden_size=3420,
            gated_linear_unit=True,
            window_size=112,
            full_attention_layers=(7, 15, 23, 31),
            **_VIT,
        ),
    ),
}

# kind -> share, per mix (module docstring).
MIXES: dict[str, dict[str, float]] = {
    "si": {"text": 0.08, "thumb": 0.30, "photo": 0.37, "hires": 0.25},
    "ov": {"text": 0.05, "thumb": 0.12, "photo": 0.17, "hires": 0.12, "multi": 0.33, "video": 0.21},
    "docs": {"text": 0.05, "photo": 0.35, "hires": 0.60},
}


def smart_resize(height: int, width: int, max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """Qwen2-VL's processor resize (transformers' ``smart_resize``): sides multiples of 28,
    pixels within ``[MIN_PIXELS, max_pixels]``, the aspect ratio kept as closely as may be."""
    factor = PATCH * MERGE
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < MIN_PIXELS:
        beta = math.sqrt(MIN_PIXELS / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def _image(rng: np.random.Generator, kind: str, max_pixels: int) -> tuple[int, int, int]:
    """One image's grid ``(t, h, w)`` in patches."""
    if kind == "thumb":
        side = rng.uniform(224, 448)
    elif kind == "photo":
        side = rng.uniform(480, 640)
    else:  # hires
        side = rng.uniform(1500, 2304)
    aspect = rng.uniform(0.75, 1.33)
    h, w = smart_resize(int(side), int(side * aspect), max_pixels)
    return 1, h // PATCH, w // PATCH


def _sample(rng: np.random.Generator, kind: str, max_pixels: int) -> tuple[int, list[tuple[int, int, int]]]:
    """One sample: its text tokens and its grids."""
    if kind == "text":
        return int(np.clip(rng.lognormal(np.log(600), 1.0), 16, 4096)), []
    text = int(np.clip(rng.lognormal(np.log(250), 0.8), 16, 4096))
    if kind == "multi":
        count = int(rng.integers(2, 7))
        return text, [_image(rng, "photo" if rng.random() < 0.5 else "thumb", max_pixels) for _ in range(count)]
    if kind == "video":
        frames = int(rng.integers(8, 33)) * 2  # 16-64 frames, whole temporal patches
        h, w = smart_resize(252, 448)
        return text, [(frames // TEMPORAL, h // PATCH, w // PATCH)]
    return text, [_image(rng, kind, max_pixels)]


@dataclasses.dataclass
class Step:
    lengths: np.ndarray  # tokens per sample
    grids: np.ndarray  # [k, 3]
    owner: np.ndarray  # [k]: the sample of each grid


def draw(mix: str, n: int, seed: int, max_pixels: int = MAX_PIXELS) -> Step:
    """``n`` samples of ``mix``, images resized to at most ``max_pixels``."""
    rng = np.random.default_rng(seed)
    kinds, shares = zip(*MIXES[mix].items(), strict=True)
    chosen = rng.choice(len(kinds), size=n, p=np.array(shares) / sum(shares))
    lengths, grids, owner = np.zeros(n, np.int64), [], []
    for i, k in enumerate(chosen.tolist()):
        text, sample_grids = _sample(rng, kinds[k], max_pixels)
        lengths[i] = text + sum(t * h * w // MERGE**2 + 2 for t, h, w in sample_grids)
        grids += sample_grids
        owner += [i] * len(sample_grids)
    return Step(lengths, np.array(grids, np.int64).reshape(-1, 3), np.array(owner, np.int64))


def encoder_imbalance(plan: Schedule, encoder: np.ndarray) -> float:
    """The largest DP rank's encoder FLOPs over the mean (1.0: even)."""
    per_rank = np.bincount(plan.replica_of()[plan.assigned], weights=encoder[plan.assigned], minlength=plan.dp_size)
    mean = float(per_rank.mean())
    return float(per_rank.max()) / mean if mean > 0 else 1.0


BYTES = 2  # bf16 patches and embeddings


def rebalanced(plan: Schedule, cost, step: Step, vision: VisionSpec, forced: bool) -> tuple[float, float, float]:
    """``plan``'s lockstep step time with each round's images placed by plan_encoders, routed
    where ``"auto"`` pays (``forced``: wherever the plan moves one); the encoder imbalance after
    it (max/mean of each rank's encoder FLOPs over the step); the share of rounds routed."""
    lm = rank_times(dataclasses.replace(plan, sample_cost=None), cost)  # [M, dp]
    replica, rounds, _ = plan.placement()
    home, image_round = replica[step.owner], rounds[step.owner]
    image_flops = vision.grid_flops(step.grids)
    patches = step.grids.prod(axis=1).astype(np.float64)
    pixel_bytes = patches * vision.in_channels * vision.temporal_patch_size * vision.patch_size**2 * BYTES
    embed_bytes = patches / vision.spatial_merge_size**2 * vision.out_hidden_size * BYTES
    per_rank, total, routed = np.zeros(plan.dp_size), 0.0, 0
    for m in range(plan.num_microbatches):
        images = image_round == m
        enc = plan_encoders(image_flops[images], home[images], plan.dp_size)
        price = dict(seconds_per_cost=DEFAULT_SECONDS_PER_FLOP, other_load=lm[m])
        if enc.moved.any() and (forced or rebalance_pays(enc, pixel_bytes[images], embed_bytes[images], **price)):
            exchange = route_bytes(enc, pixel_bytes[images], embed_bytes[images], plan.dp_size).max()
            total += float(lm[m].max() + enc.load.max()) + exchange / LINK_BYTES_PER_SECOND / DEFAULT_SECONDS_PER_FLOP
            per_rank += enc.load
            routed += 1
        else:
            total += float((lm[m] + enc.home_load).max())
            per_rank += enc.home_load
    mean = float(per_rank.mean())
    return total, float(per_rank.max()) / mean if mean > 0 else 1.0, routed / max(plan.num_microbatches, 1)


def measure(
    model: str, mix: str, dp: int, per_rank: int, capacity: int, seed: int, max_pixels: int = MAX_PIXELS
) -> dict[str, float]:
    """One step's figures (module docstring)."""
    spec = MODELS[model]
    assert spec.vision is not None
    cost = spec.cost_model()
    step = draw(mix, dp * per_rank, seed, max_pixels)
    encoder = spec.vision.sample_flops(step.grids, step.owner, step.lengths.shape[0])
    scheduler = get_scheduler("balanced")
    limits = dict(dp_size=dp, max_tokens_per_rank=capacity, cost=cost)
    tokens = scheduler.schedule(step.lengths, **limits)
    tokens = dataclasses.replace(tokens, sample_cost=encoder)  # reported with the encoder's work
    summed = scheduler.schedule(step.lengths, **limits, sample_cost=encoder)
    per_seq = cost.cost(step.lengths) + encoder
    bound = round_sum_lower_bound(step.lengths, per_seq, dp, capacity)
    rebal, _, routed = rebalanced(summed, cost, step, spec.vision, forced=False)
    forced, enc_rebal, _ = rebalanced(summed, cost, step, spec.vision, forced=True)
    tok_rebal, _, tok_routed = rebalanced(tokens, cost, step, spec.vision, forced=False)
    return {
        "tokens": predicted_step_time(tokens, cost) / bound,
        "summed": predicted_step_time(summed, cost) / bound,
        "rebal": rebal / bound,
        "forced": forced / bound,
        "tok_rebal": tok_rebal / bound,
        "routed": routed,
        "tok_routed": tok_routed,
        "enc_tokens": encoder_imbalance(tokens, encoder),
        "enc_summed": encoder_imbalance(summed, encoder),
        "enc_rebal": enc_rebal,
        "encoder_share": float(encoder.sum() / per_seq.sum()),
        "bound_pflops": bound / 1e15,
        "microbatches": float(summed.num_microbatches),
    }


HEAD = (
    f"{'model':<14}{'mix':<6}{'dp':>6}{'enc share':>10}{'bound PF':>10}{'M':>5}"
    f"{'tokens/LB':>11}{'summed/LB':>11}{'rebal/LB':>10}{'forced/LB':>11}{'tok+reb/LB':>12}"
    f"{'routed':>8}{'tok routed':>12}{'enc imb tok':>13}{'enc imb sum':>13}{'enc imb forced':>16}"
)


def row(model: str, mix: str, dp: int, f: dict[str, float]) -> str:
    return (
        f"{model:<14}{mix:<6}{dp:>6}{f['encoder_share']:>10.1%}{f['bound_pflops']:>10.1f}{f['microbatches']:>5.1f}"
        f"{f['tokens']:>11.3f}{f['summed']:>11.3f}{f['rebal']:>10.3f}{f['forced']:>11.3f}{f['tok_rebal']:>12.3f}"
        f"{f['routed']:>8.0%}{f['tok_routed']:>12.0%}{f['enc_tokens']:>13.2f}{f['enc_summed']:>13.2f}"
        f"{f['enc_rebal']:>16.2f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp", type=int, nargs="+", default=[8, 64, 256, 1024])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--mixes", nargs="+", default=list(MIXES))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--samples-per-rank", type=int, default=16)
    parser.add_argument("--max-tokens-per-rank", type=int, default=16384)
    parser.add_argument("--max-pixels", type=int, default=MAX_PIXELS)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()
    lines = [
        f"# balanced, lockstep; {args.samples_per_rank} samples per DP rank, {args.max_tokens_per_rank} tokens per "
        f"microbatch; images at most {args.max_pixels:,} pixels; means over {args.steps} steps",
        "# X/LB: predicted step time (LM + encoder FLOPs) over round_sum_lower_bound of the summed costs; "
        "enc imb: max/mean encoder FLOPs per DP rank",
        HEAD,
    ]
    print("\n".join(lines), flush=True)
    for model in args.models:
        for mix in args.mixes:
            for dp in args.dp:
                runs = [
                    measure(model, mix, dp, args.samples_per_rank, args.max_tokens_per_rank, s, args.max_pixels)
                    for s in range(args.steps)
                ]
                mean = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
                lines.append(row(model, mix, dp, mean))
                print(lines[-1], flush=True)
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
