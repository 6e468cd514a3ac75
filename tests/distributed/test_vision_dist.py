"""Vision-language samples through wrap_data_iterator on gloo dp=2 (PackingConfig(mrope=)),
on tiny random-init HF VLMs (tests/vlm_data.py), fp32:

- every sample arrives exactly once, with its pixels and grid rows, some across ranks;
- each supervised token's loss (routed back by Step.to_origin) equals its loss with the
  sample run alone, and every parameter's gradient (language model and vision tower), summed
  over both ranks, equals the sum of the samples' alone, within 1e-5 relative;
- locality="auto" decides from the real bytes per token: pixel-heavy samples turn it on where
  text-only samples of the same lengths leave it off;
- CP > 1 is refused by name.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from wrapper_data import ScatterScheduler, mesh_topology

pytest.importorskip("transformers")

from vlm_data import FAMILIES, IGNORE, IMAGE, PATCH_DIM, QWEN2_SPEC, mixed_samples, tiny_vlm  # noqa: E402

from seqpack.errors import ConfigError  # noqa: E402
from seqpack.interop.hf import to_hf  # noqa: E402
from seqpack.loader import wrap_data_iterator  # noqa: E402
from seqpack.schedulers.balanced import BalancedScheduler  # noqa: E402
from seqpack.thd import MRopeSpec  # noqa: E402

TOL = 1e-5
DP2 = (("dp", 2),)


def _data(family: str, rank: int) -> list[dict]:
    """Rank ``rank``'s samples: two images, a video, a text-only one (its own seed)."""
    return mixed_samples(family, seed=1 + rank)


def _token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token losses ``[T]`` (0 where the target is -100)."""
    return F.cross_entropy(logits, targets, reduction="none", ignore_index=IGNORE)


def _alone(model, samples: list[dict]) -> list[torch.Tensor]:
    """Each sample run alone: its per-token losses ``[L]``; the gradients of their sum stay on
    the model."""
    from vlm_data import alone_kwargs

    out = []
    for sample in samples:
        logits = model(**alone_kwargs(sample, model)).logits[0]
        targets = torch.cat([sample["labels"][1:], torch.tensor([IGNORE])])
        losses = _token_losses(logits, targets)
        losses.sum().backward()
        out.append(losses.detach())
    return out


def _grads(model) -> dict[str, torch.Tensor]:
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _exact_dp2(family: str, scheduler: str) -> dict:
    rank = dist.get_rank()
    topology = mesh_topology(DP2)
    model = tiny_vlm(family)
    spec = MRopeSpec.from_hf(model.config)
    every = [_data(family, r) for r in range(2)]
    alone = [_alone(model, samples) for samples in every]
    reference = _grads(model)
    it = wrap_data_iterator(
        _data(family, rank),
        topology,
        samples_per_rank=3,
        max_tokens_per_rank=64,
        pad_multiple=4,
        scheduler=ScatterScheduler() if scheduler == "test_scatter" else scheduler,
        label_format="unshifted",
        mrope=spec,
    )
    steps = list(it)
    seen, worst_loss, grids, moved_pixels = [], 0.0, 0, 0
    for step in steps:
        values = []
        for batch in step.microbatches:
            assert batch.mrope_position_ids is not None and batch.mm_token_type_ids is not None
            kwargs = {k: v for k, v in to_hf(batch).items() if k not in ("labels", "shift_labels")}
            losses = _token_losses(model(**kwargs).logits[0], batch.labels)
            losses.sum().backward()
            values.append(losses.detach())
            ids = [int(g) for g in batch.sample_ids.tolist() if g >= 0]
            seen += ids
            # One step of 3 samples a rank: ids 0-2 read by rank 0, 3-5 by rank 1; the first two carry pixels.
            moved_pixels += sum(1 for g in ids if g // 3 != rank and g % 3 < 2)
            grids += 0 if batch.image_grid_thw is None else int(batch.image_grid_thw.shape[0])
        for got, want in zip(step.to_origin(values), alone[rank], strict=True):
            assert got.shape == want.shape
            worst_loss = max(worst_loss, float((got - want).abs().max() / want.abs().max()))
    worst_grad, vision_grad = 0.0, 0.0
    for name, p in model.named_parameters():
        grad = torch.zeros_like(p) if p.grad is None else p.grad.clone()
        dist.all_reduce(grad)
        if name in reference:
            worst_grad = max(worst_grad, _relative(grad, reference[name]))
            if "visual" in name:
                vision_grad = max(vision_grad, float(reference[name].abs().max()))
    everyone = [None, None]
    dist.all_gather_object(everyone, seen)
    moved = sum(step.exchange_bytes.get("sent", 0) for step in steps)
    return dict(
        seen=sorted(everyone[0] + everyone[1]),
        loss=worst_loss,
        grad=worst_grad,
        vision_grad=vision_grad,
        images=grids,
        sent=moved,
        moved_pixels=moved_pixels,
    )


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("scheduler", ["balanced", "test_scatter"])
def test_dp2_packs_give_each_token_its_loss_and_the_summed_gradients_alone(dist_pools, family, scheduler):
    if scheduler == "test_scatter" and family not in ("qwen2_vl", "qwen3_vl"):
        pytest.skip("the scatter plan moves every other sample: two families are enough")
    results = dist_pools.get(2).run(_exact_dp2, family, scheduler)
    for result in results:
        assert result["seen"] == list(range(6))  # every sample exactly once, over both ranks
        assert result["loss"] < TOL and result["grad"] < TOL
        assert result["vision_grad"] > 0  # the vision tower's gradients are checked, not absent
    assert sum(result["images"] for result in results) == 4  # two two-image samples
    if scheduler == "test_scatter":  # samples with images or a video ran on the rank that did not read them
        assert sum(result["moved_pixels"] for result in results) > 0 and sum(r["sent"] for r in results) > 0


class _Recording(BalancedScheduler):
    """Balanced with locality="auto", recording each decision."""

    def __init__(self) -> None:
        super().__init__(locality="auto")
        self.decisions: list[bool] = []

    def uses_locality(self, *, sequences, tokens, dp_size, bytes_per_token):
        decision = super().uses_locality(
            sequences=sequences, tokens=tokens, dp_size=dp_size, bytes_per_token=bytes_per_token
        )
        self.decisions.append(decision)
        return decision


def _heavy(gen: torch.Generator, pixels: bool) -> dict:
    """An image of 40 x 80 patches (800 placeholders) between text; or the same length of text."""
    text = torch.randint(2, 100, (8,), generator=gen)
    if not pixels:
        return {"input_ids": torch.randint(2, 100, (8 + 802 + 8,), generator=gen)}
    image = torch.cat([torch.tensor([122]), torch.full((800,), IMAGE), torch.tensor([123])])
    return {
        "input_ids": torch.cat([text, image, text]),
        "pixel_values": torch.randn(40 * 80, PATCH_DIM, generator=gen),
        "image_grid_thw": torch.tensor([[1, 40, 80]]),
    }


def _locality(pixels: bool) -> list[bool]:
    gen = torch.Generator().manual_seed(dist.get_rank())
    scheduler = _Recording()
    it = wrap_data_iterator(
        [_heavy(gen, pixels) for _ in range(4)],
        mesh_topology(DP2),
        samples_per_rank=4,
        max_tokens_per_rank=2048,
        pad_multiple=4,
        scheduler=scheduler,
        mrope=QWEN2_SPEC,
    )
    for step in it:
        assert len(step.microbatches) >= 1
    return scheduler.decisions


def test_locality_auto_decides_from_the_pixels_bytes(dist_pools):
    pool = dist_pools.get(2)
    # 8 sequences of 818 tokens at dp 2: locality pays above 1e-6 * 8 * 2 * 25e9 / (0.5 * 6544) = 122
    # bytes a token. Text moves 20; the image adds 3200 patches * 96 bytes + 3 * 818 mRoPE words.
    assert pool.run(_locality, True) == [[True], [True]]
    assert pool.run(_locality, False) == [[False], [False]]


def _refused_under_cp() -> str:
    try:
        topology = mesh_topology((("cp", 2),))
        wrap_data_iterator([], topology, samples_per_rank=1, max_tokens_per_rank=64, mrope=QWEN2_SPEC)
    except ConfigError as exc:
        return str(exc)
    return ""


def test_cp2_is_refused_by_name(dist_pools):
    for message in dist_pools.get(2).run(_refused_under_cp):
        assert "mrope" in message and "CP-sharded" in message


def _payloads(broken: bool) -> tuple[dict, str]:
    """Ids 0, 1 read by rank 0, id 2 by rank 1; 0 and 2 swap ranks, 1 stays home."""
    import numpy as np

    from seqpack.collective.payloads import exchange_payloads

    rank = dist.get_rank()
    sizes, src, dst = np.array([5, 3, 4]), np.array([0, 0, 1]), np.array([1, 0, 0])

    def encode(gid: int) -> torch.Tensor:
        n = int(sizes[gid]) - (1 if broken and rank == 0 else 0)
        return torch.full((n,), gid + 10, dtype=torch.uint8)

    try:
        got, sent, received = exchange_payloads(encode, sizes, src, dst, None, rank=rank, num_ranks=2)
    except ConfigError as exc:
        return {}, str(exc)
    return {gid: data.tolist() for gid, data in got.items()} | {"sent": sent, "received": received}, ""


def test_payloads_reach_the_rank_that_runs_them_and_a_bad_size_strands_no_peer(dist_pools):
    pool = dist_pools.get(2)
    (zero, _), (one, _) = pool.run(_payloads, False)
    assert zero == {2: [12] * 4, "sent": 5, "received": 4}
    assert one == {0: [10] * 5, "sent": 4, "received": 5}
    (_, error), (_, fine) = pool.run(_payloads, True)
    assert "global sample 0 encodes to 4 bytes" in error and "announced 5" in error and fine == ""
