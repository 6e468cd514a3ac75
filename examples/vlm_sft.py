"""Supervised fine-tuning of a vision-language model on packed, balanced steps (copy this script).

    torchrun --standalone --nproc-per-node 2 examples/vlm_sft.py

A tiny random-init Qwen2-VL built from its config (nothing downloaded); on CPUs gloo, on GPUs
NCCL. What it shows, in order:

1. every rank a DP rank, and the seqpack ``Topology`` of them;
2. samples as Qwen2-VL's processor gives them (``input_ids`` with one placeholder per merged
   patch between vision-start and vision-end tokens, ``pixel_values``, ``image_grid_thw``,
   ``mm_token_type_ids``, HF-style ``labels``): images of several sizes through transformers'
   own ``Qwen2VLImageProcessor``, samples with two images, a video, text-only samples. The
   video's frames are cut into patches the way ``Qwen2VLVideoProcessor`` does (written out
   here: that processor, and so ``Qwen2VLProcessor``, needs torchvision); the placeholder
   counts are the processor's ``t*h*w / merge_size**2``;
3. ``wrap_data_iterator`` with ``PackingConfig(mrope=MRopeSpec.from_hf(config))``: each sample's
   pixels travel with it to the rank that runs it, and each microbatch carries its pixels,
   grids and per-sequence mRoPE positions; ``model=ModelSpec.from_hf(config)`` balances the
   vision encoder's FLOPs beside the tokens'; ``rebalance_for_steps(model, steps)`` then lets each
   microbatch round encode its images on any DP rank of the round (``encoder_rebalance``:
   ``True`` here, where the plan moves an image; ``"auto"``, the default, only where the encoder
   time saved pays for the exchange, which this tiny tower's never does), the embeddings
   routed back, differentiably;
4. ``model(**to_hf(batch, num_items_in_batch=step.num_loss_tokens))``: HF's loss is then this
   microbatch's token losses over the step's supervised tokens on every rank, so summing the
   gradients over the ranks (one all-reduce a step) gives the step's token-mean gradient
   (docs/integrations.md, "The loss contract"; under DDP / FSDP, which average, multiply the
   loss by the DP size instead);
5. per step: the tokens, the loss, the encoder imbalance (the largest rank's encoder FLOPs
   over the mean, over the step) and, over the step's microbatch rounds, the encoder imbalance
   with every image encoded where its sequence runs and after rebalancing (the busiest rank's
   encoder FLOPs over the mean, summed over the rounds), and the images moved. ``--check``
   also runs the first step's samples one by one, unpacked, with the model computing its own
   positions, and prints how far the packed step's loss is from theirs.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import transformers
from torch.distributed.device_mesh import init_device_mesh

from seqpack import PackingConfig, Topology, wrap_data_iterator
from seqpack.cost import ModelSpec
from seqpack.interop.hf import to_hf
from seqpack.interop.hf_encoder import rebalance_for_steps
from seqpack.thd import MRopeSpec

VOCAB = 128
IMAGE, VIDEO, START, END = 120, 121, 122, 123  # placeholder and vision-start / -end token ids
PATCH, MERGE, TEMPORAL = 2, 2, 2  # the tiny vision tower's patch side (pixels), merge and temporal patch
IGNORE = -100


def tiny_qwen2_vl() -> transformers.Qwen2VLForConditionalGeneration:
    """A 2-layer Qwen2-VL of width 32 with a 2-block vision tower, random weights (seeded)."""
    config = transformers.Qwen2VLConfig(
        text_config=dict(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0},
            bos_token_id=0,
            eos_token_id=1,
        ),
        vision_config=dict(
            depth=2,
            embed_dim=16,
            hidden_size=32,
            num_heads=2,
            patch_size=PATCH,
            spatial_merge_size=MERGE,
            temporal_patch_size=TEMPORAL,
        ),
        image_token_id=IMAGE,
        video_token_id=VIDEO,
        vision_start_token_id=START,
        vision_end_token_id=END,
    )
    torch.manual_seed(0)
    return transformers.Qwen2VLForConditionalGeneration(config).float()


def image_processor() -> transformers.BaseImageProcessor:
    """transformers' Qwen2-VL image processor at the tiny tower's patch sizes (PIL backend: no
    torchvision needed), keeping images between 8 x 8 and 32 x 32 pixels."""
    return transformers.Qwen2VLImageProcessorPil(
        patch_size=PATCH, merge_size=MERGE, temporal_patch_size=TEMPORAL, min_pixels=8 * 8, max_pixels=32 * 32
    )


def video_pixels(frames: np.ndarray, processor: transformers.BaseImageProcessor) -> tuple[torch.Tensor, list[int]]:
    """``pixel_values_videos`` and the grid row of ``frames`` (uint8 ``[T, H, W, 3]``, sides
    multiples of ``PATCH * MERGE``), as ``Qwen2VLVideoProcessor`` lays them out: rescaled and
    normalised like the images, ``TEMPORAL`` frames a patch."""
    mean = torch.tensor(processor.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(processor.image_std).view(1, 3, 1, 1)
    video = (torch.from_numpy(frames).permute(0, 3, 1, 2).float() / 255 - mean) / std  # [T, C, H, W]
    t, c, height, width = video.shape
    gt, gh, gw = t // TEMPORAL, height // PATCH, width // PATCH
    patches = video.view(gt, TEMPORAL, c, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)  # the video processor's order
    return patches.reshape(gt * gh * gw, c * TEMPORAL * PATCH * PATCH), [gt, gh, gw]


def sft_sample(rng: np.random.Generator, processor, images: list[tuple[int, int]], video: tuple | None) -> dict:
    """One processor-style sample: a prompt with each image (or the video) in it, then an answer
    that repeats the prompt's words (what a tiny model learns in a few steps). Labels: -100 on
    the prompt and its placeholders, as SFT preprocessing writes them."""
    words = rng.integers(2, 18, int(rng.integers(3, 12))).tolist()
    parts: list[list[int]] = [[1]]  # a start token
    sample: dict[str, torch.Tensor] = {}
    if images:
        pictures = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in images]
        out = processor(images=pictures, return_tensors="pt")
        sample["pixel_values"], sample["image_grid_thw"] = out["pixel_values"], out["image_grid_thw"]
        for grid in out["image_grid_thw"].tolist():
            parts += [[START] + [IMAGE] * (grid[0] * grid[1] * grid[2] // MERGE**2) + [END], [18]]
    if video is not None:
        frames = rng.integers(0, 256, (*video, 3), dtype=np.uint8)
        pixels, grid = video_pixels(frames, processor)
        sample["pixel_values_videos"], sample["video_grid_thw"] = pixels, torch.tensor([grid])
        parts += [[START] + [VIDEO] * (grid[0] * grid[1] * grid[2] // MERGE**2) + [END], [19]]
    prompt = [t for part in parts for t in part] + words + [0]  # 0: the separator
    ids = torch.tensor(prompt + words)
    labels = torch.tensor([IGNORE] * len(prompt) + words)
    types = (ids == IMAGE).long() + 2 * (ids == VIDEO).long()
    return {"input_ids": ids, "labels": labels, "mm_token_type_ids": types, **sample}


def dataset(count: int, seed: int = 0) -> list[dict]:
    """A mix of what a VLM SFT set holds: one image of one of four sizes (8 x 8 to 32 x 32
    pixels, 4 to 64 placeholders), two images, a video of 4 frames, or text only."""
    rng = np.random.default_rng(seed)
    processor = image_processor()
    sizes = [(8, 8), (12, 20), (24, 16), (32, 32)]
    samples = []
    for i in range(count):
        kind = i % 5
        if kind in (0, 1):
            samples.append(sft_sample(rng, processor, [sizes[int(rng.integers(0, 4))]], None))
        elif kind == 2:
            samples.append(sft_sample(rng, processor, [sizes[int(rng.integers(0, 4))] for _ in range(2)], None))
        elif kind == 3:
            samples.append(sft_sample(rng, processor, [], (4, 16, 16)))
        else:
            samples.append(sft_sample(rng, processor, [], None))
    return samples


def alone_loss_sum(model, sample: dict, device: torch.device) -> torch.Tensor:
    """The summed token losses of ``sample`` run alone, the model computing its own positions."""
    keys = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "mm_token_type_ids")
    kwargs = {key: sample[key].to(device) for key in keys if key in sample}
    kwargs["mm_token_type_ids"] = kwargs["mm_token_type_ids"][None]
    logits = model(input_ids=sample["input_ids"][None].to(device), use_cache=False, **kwargs).logits[0]
    return F.cross_entropy(logits[:-1], sample["labels"][1:].to(device), ignore_index=IGNORE, reduction="sum")


def sum_gradients(model: torch.nn.Module) -> None:
    """Sum every gradient over the ranks in one all-reduce (a rank whose step had no image has
    none for the vision tower: zeros)."""
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()


def encoder_imbalance(step) -> float:
    """The largest DP rank's encoder cost over the mean (1.0: even; no images: 1.0)."""
    plan = step.schedule
    if plan is None or plan.sample_cost is None:
        return 1.0
    per_rank = np.bincount(
        plan.replica_of()[plan.assigned], weights=plan.sample_cost[plan.assigned], minlength=plan.dp_size
    )
    return float(per_rank.max() / per_rank.mean()) if per_rank.mean() > 0 else 1.0


def round_loads(hooks) -> tuple[float, float, float]:
    """The last round's busiest rank's encoder FLOPs, home and rebalanced, and their mean (zeros
    without hooks or images)."""
    plan = None if hooks is None or hooks.last is None else hooks.last.plan
    if plan is None:
        return 0.0, 0.0, 0.0
    load = plan.load if hooks.last.routed else plan.home_load  # "auto" may keep a moving plan home
    return float(plan.home_load.max()), float(load.max()), float(plan.home_load.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--samples-per-rank", type=int, default=10)
    parser.add_argument("--max-tokens-per-rank", type=int, default=256)
    parser.add_argument("--check", action="store_true", help="compare step 0 with its samples run alone")
    choices = {"true": True, "auto": "auto", "false": False}
    parser.add_argument("--encoder-rebalance", choices=choices, default="true", help="PackingConfig.encoder_rebalance")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)

    # 1. Every rank a DP rank.
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))
    topology = Topology.from_device_mesh(mesh)

    # 2. The samples, and this DP rank's shard of them (each step reads samples_per_rank of it).
    samples = dataset(args.steps * args.samples_per_rank * topology.dp_size)
    shard = samples[topology.dp_rank :: topology.dp_size]

    # 3. The model, and packed steps that carry its images: mrope for the positions and pixels,
    #    model for the encoder's cost in the balance.
    model = tiny_qwen2_vl().to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    config = PackingConfig(
        samples_per_rank=args.samples_per_rank,
        max_tokens_per_rank=args.max_tokens_per_rank,
        label_format="unshifted",  # HF-style labels
        mrope=MRopeSpec.from_hf(model.config),
        model=ModelSpec.from_hf(model.config),
        encoder_rebalance=choices[args.encoder_rebalance],
    )
    steps = wrap_data_iterator(shard, topology, config, device=device)
    # Each microbatch round's images encoded on any DP rank (None when off). Collective.
    hooks = rebalance_for_steps(model, steps)

    # 4. The step's token-mean loss: each rank's share, gradients summed over the ranks.
    for step in steps:
        if args.check and step.step == 0:
            with torch.no_grad():
                alone = sum(alone_loss_sum(model, s, device) for s in shard[: args.samples_per_rank])
            alone = alone.reshape(1)
            dist.all_reduce(alone)
        total = torch.zeros((), device=device)
        ids = []
        loads = np.zeros(3)  # busiest rank's encoder FLOPs home / rebalanced, and the mean, summed over rounds
        moved = hooks.moved_images if hooks is not None else 0
        for batch in step.microbatches:  # the same number on every rank
            out = model(**to_hf(batch, num_items_in_batch=step.num_loss_tokens))
            out.loss.backward()
            total += out.loss.detach()
            loads += round_loads(hooks)
            ids += [int(i) for i in batch.sample_ids.tolist() if i >= 0]
        sum_gradients(model)
        optimizer.step()
        optimizer.zero_grad()
        dist.all_reduce(total)
        everyone: list[list[int] | None] = [None] * topology.dp_size
        dist.all_gather_object(everyone, ids)
        expected = list(range(topology.dp_size * args.samples_per_rank))  # a step's ids, every rank's
        once = sorted(i for seen in everyone for i in seen or []) == expected
        if dist.get_rank() == 0:
            home, rebalanced = (loads[0] / loads[2], loads[1] / loads[2]) if loads[2] > 0 else (1.0, 1.0)
            moved = (hooks.moved_images if hooks is not None else 0) - moved
            print(
                f"step {step.step}: {step.stats.real_tokens} tokens, loss {float(total):.4f} over "
                f"{step.num_loss_tokens} loss tokens, {step.num_microbatches} microbatches, "
                f"encoder imbalance {encoder_imbalance(step):.3f}, per round {home:.3f} -> {rebalanced:.3f} "
                f"rebalanced, images moved {moved}, every sample once: {once}",
                flush=True,
            )
            if args.check and step.step == 0:
                diff = abs(float(total) - float(alone) / step.num_loss_tokens)
                print(f"step 0 loss vs its samples run alone, unpacked: |diff| {diff:.2e}", flush=True)
    dist.barrier()  # nobody tears gloo down while a peer still finishes its last collective
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
