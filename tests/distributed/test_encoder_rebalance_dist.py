"""Encoder rebalancing on gloo dp=2 and dp=4 (seqpack.interop.hf_encoder.rebalance_encoder), on
tiny random-init HF VLMs (tests/vlm_data.py), fp32.

Each rank packs its own microbatch per round (pack_sequences(mrope=)): round 1 puts four images
on rank 0 and text elsewhere, round 2 an image and a video on the last rank, round 3 text only.
With mode=True the plan moves images off the busy rank (asserted): each supervised token's loss
equals its loss with the sample run alone, and every parameter's gradient (language model and
vision tower), summed over the ranks, equals the sum of the samples' alone, within 1e-5
relative. mode="auto" keeps the tiny model's images home (its encoder time is far below the
exchange's) and routes them at a second per FLOP, with the same losses. Through the wrapper (wrap_data_iterator with
PackingConfig(mrope=, encoder_rebalance=True) and rebalance_for_steps(model, steps), which
hooks the model on a DP group of its own): the same, per token via Step.to_origin.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

pytest.importorskip("transformers")

from vlm_data import IGNORE, alone_kwargs, text_sample, tiny_vlm, two_image_sample, video_sample  # noqa: E402
from wrapper_data import mesh_topology  # noqa: E402

from seqpack.interop.hf import to_hf  # noqa: E402
from seqpack.interop.hf_encoder import rebalance_encoder, rebalance_for_steps  # noqa: E402
from seqpack.loader import PackingConfig, wrap_data_iterator  # noqa: E402
from seqpack.thd import MRopeSpec, pack_sequences  # noqa: E402

TOL = 1e-5


def _rounds(family: str, rank: int, num_ranks: int) -> list[list[dict]]:
    """Rank ``rank``'s samples in each of three rounds (seeded by rank)."""
    gen = torch.Generator().manual_seed(10 + rank)
    last = num_ranks - 1
    if rank == 0:
        first = [two_image_sample(gen, ((1, 8, 8), (1, 8, 12))), two_image_sample(gen, ((1, 8, 8), (1, 4, 8)))]
    else:
        first = [text_sample(gen, 9)]
    if rank == last:
        video = video_sample(gen, frame_runs=family.startswith("qwen3"), grid=(2, 8, 8))
        second = [two_image_sample(gen, ((1, 8, 8), (1, 4, 4))), video]
    else:
        second = [text_sample(gen, 6), text_sample(gen, 5)]
    return [first, second, [text_sample(gen, 7)]]


def _token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, targets, reduction="none", ignore_index=IGNORE)


def _alone(model, sample: dict) -> torch.Tensor:
    """One sample alone: its per-token losses ``[L]`` (the gradient of their sum stays on the model)."""
    logits = model(**alone_kwargs(sample, model)).logits[0]
    losses = _token_losses(logits, torch.cat([sample["labels"][1:], torch.tensor([IGNORE])]))
    losses.sum().backward()
    return losses.detach()


def _packed_round(model, spec, samples: list[dict]) -> list[torch.Tensor]:
    """One packed forward and backward of ``samples``: each sample's per-token losses."""
    batch = pack_sequences(samples, mrope=spec, pad_multiple=4, label_format="unshifted")
    kwargs = {k: v for k, v in to_hf(batch).items() if k not in ("labels", "shift_labels")}
    losses = _token_losses(model(**kwargs).logits[0], batch.labels)
    losses.sum().backward()
    cu = batch.cu_seqlens_padded.tolist()
    return [losses[cu[i] : cu[i] + s["input_ids"].numel()].detach() for i, s in enumerate(samples)]


def _worst(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(float((g - w).abs().max() / w.abs().max()) for g, w in zip(got, want, strict=True))


def _exact(family: str) -> dict:
    rank, num_ranks = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(num_ranks)))
    model = tiny_vlm(family)
    spec = MRopeSpec.from_hf(model.config)
    every = [_rounds(family, r, num_ranks) for r in range(num_ranks)]
    alone = [[_alone(model, s) for s in samples] for samples in every[rank]]
    for r in range(num_ranks):  # the reference gradient: every rank's samples alone
        if r != rank:
            for samples in every[r]:
                for sample in samples:
                    _alone(model, sample)
    reference = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)

    hooks = rebalance_encoder(model, group, mode=True)
    worst_loss, routed = 0.0, []
    for samples, want in zip(every[rank], alone, strict=True):
        worst_loss = max(worst_loss, _worst(_packed_round(model, spec, samples), want))
        routed.append(hooks.last.routed)
    moved = hooks.moved_images
    hooks.remove()
    worst_grad, vision_grad = 0.0, 0.0
    for name, p in model.named_parameters():
        grad = torch.zeros_like(p) if p.grad is None else p.grad.clone()
        dist.all_reduce(grad)
        if name in reference:
            worst_grad = max(
                worst_grad, float((grad - reference[name]).norm() / reference[name].norm().clamp_min(1e-30))
            )
            if "visual" in name:
                vision_grad = max(vision_grad, float(reference[name].abs().max()))
    own_tower_grad = any(p.grad is not None and "visual" in n for n, p in model.named_parameters())
    model.zero_grad(set_to_none=True)

    hooks = rebalance_encoder(model, group)  # "auto": the tiny model's encoder is not worth the exchange
    auto_loss = _worst(_packed_round(model, spec, every[rank][0]), alone[0])
    auto = (hooks.last.routed, hooks.last.plan is not None and bool(hooks.last.plan.moved.any()))
    hooks.remove()
    # "auto" at a second per FLOP: the same round's gain now pays for its exchange.
    hooks = rebalance_encoder(model, group, seconds_per_flop=1.0)
    paid_loss = _worst(_packed_round(model, spec, every[rank][0]), alone[0])
    paid = hooks.last.routed
    hooks.remove()
    model.zero_grad(set_to_none=True)
    return dict(
        loss=worst_loss,
        grad=worst_grad,
        vision_grad=vision_grad,
        routed=routed,
        moved=moved,
        own_tower_grad=own_tower_grad,
        auto=auto,
        auto_loss=auto_loss,
        paid=paid,
        paid_loss=paid_loss,
    )


@pytest.mark.parametrize(("family", "ranks"), [("qwen2_vl", 2), ("qwen3_vl", 2), ("qwen2_5_vl", 4), ("qwen2_vl", 4)])
def test_rebalanced_encoder_gives_each_token_its_loss_and_the_summed_gradients_alone(dist_pools, family, ranks):
    results = dist_pools.get(ranks).run(_exact, family)
    for result in results:
        assert result["loss"] < TOL and result["grad"] < TOL, result
        assert result["vision_grad"] > 0  # the vision tower's gradients are checked, not absent
        assert result["routed"] == [True, True, False]  # rounds 1 and 2 move images; round 3 has none
        assert result["moved"] > 0
        assert result["auto"] == (False, False) and result["auto_loss"] < TOL
        assert result["paid"] and result["paid_loss"] < TOL
    # Images encoded away from home: ranks without images of their own got tower gradients.
    assert all(result["own_tower_grad"] for result in results)


def _wrapped(family: str) -> dict:
    """dp=2 through the wrapper: rank 0 reads a four-image sample and a text one, rank 1 text."""
    rank = dist.get_rank()
    topology = mesh_topology((("dp", 2),))
    model = tiny_vlm(family)
    spec = MRopeSpec.from_hf(model.config)

    def data(r: int) -> list[dict]:
        gen = torch.Generator().manual_seed(20 + r)
        if r == 0:
            return [two_image_sample(gen, ((1, 8, 8), (1, 8, 12), (1, 8, 8), (1, 4, 8))), text_sample(gen, 9)]
        return [text_sample(gen, 11), text_sample(gen, 6)]

    every = [data(r) for r in range(2)]
    alone = [[_alone(model, s) for s in samples] for samples in every]
    reference = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    config = PackingConfig(
        samples_per_rank=2,
        max_tokens_per_rank=128,
        pad_multiple=4,
        label_format="unshifted",
        mrope=spec,
        encoder_rebalance=True,
    )
    steps = wrap_data_iterator(data(rank), topology, config)
    hooks = rebalance_for_steps(model, steps)
    own_group = hooks.group is not None and hooks.group is not dist.group.WORLD and hooks.mode is True
    worst_loss, rounds = 0.0, 0
    for step in steps:
        values = []
        for batch in step.microbatches:
            kwargs = {k: v for k, v in to_hf(batch).items() if k not in ("labels", "shift_labels")}
            losses = _token_losses(model(**kwargs).logits[0], batch.labels)
            losses.sum().backward()
            values.append(losses.detach())
            rounds += 1
        for got, want in zip(step.to_origin(values), alone[rank], strict=True):
            worst_loss = max(worst_loss, float((got - want).abs().max() / want.abs().max()))
    moved = hooks.moved_images
    hooks.remove()
    worst_grad = 0.0
    for name, p in model.named_parameters():
        grad = torch.zeros_like(p) if p.grad is None else p.grad.clone()
        dist.all_reduce(grad)
        if name in reference:
            want = reference[name]
            worst_grad = max(worst_grad, float((grad - want).norm() / want.norm().clamp_min(1e-30)))
    return dict(loss=worst_loss, grad=worst_grad, moved=moved, rounds=rounds, own_group=own_group)


def test_through_the_wrapper_with_encoder_rebalance_true(dist_pools):
    results = dist_pools.get(2).run(_wrapped, "qwen2_vl")
    for result in results:
        assert result["loss"] < TOL and result["grad"] < TOL, result
        assert result["moved"] > 0 and result["rounds"] >= 1 and result["own_group"]
    assert results[0]["rounds"] == results[1]["rounds"]  # one forward per round on every rank
