import torch
import torch.distributed as dist

from seqpack.compute.tiny_lm import TinyConfig, TinyHybridLM
from seqpack.thd import pack_sequences, pad_multiple_for
from seqpack.thd.cp import shard_for_cp, unshard_from_cp

CFG = TinyConfig(d_model=32, pattern="AMA", num_heads=4, num_kv_heads=2, d_state=8, mamba_headdim=8)


def _cp_equivalence(lengths):
    cp, rank = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(3)
    batch = pack_sequences(
        [{"input_ids": torch.randint(1, 256, (n,), generator=g)} for n in lengths], pad_multiple=pad_multiple_for(cp)
    )
    torch.manual_seed(0)
    reference = TinyHybridLM(CFG).double()
    torch.manual_seed(0)
    model = TinyHybridLM(CFG, cp_group=dist.group.WORLD).double()
    full_total, full_count = reference.loss_sum(batch)
    full_total.backward()
    shard = shard_for_cp(batch, cp, rank)
    logits = model(shard)
    total, count = model.loss_sum(shard)
    total.backward()
    summed = torch.stack([total.detach(), count])
    dist.all_reduce(summed)
    parts = [torch.empty_like(logits) for _ in range(cp)]
    dist.all_gather(parts, logits.detach().contiguous())
    gathered = unshard_from_cp(parts, batch.cu_seqlens_padded, cp)
    worst = 0.0
    for (_, p), (_, q) in zip(reference.named_parameters(), model.named_parameters(), strict=True):
        grad = q.grad.clone()
        dist.all_reduce(grad)  # parameter gradients are summed over the CP group
        worst = max(worst, float((grad - p.grad).abs().max()))
    full_logits = reference(batch).detach()
    return (
        float((gathered - full_logits).abs().max()),
        float((summed[0] - full_total.detach()).abs()),
        float(summed[1] - full_count),
        worst,
    )


def test_tiny_lm_cp2_matches_single_rank(dist_pools):
    for logit_err, loss_err, count_err, grad_err in dist_pools.get(2).run(_cp_equivalence, [11, 1, 6, 20]):
        assert logit_err < 1e-9 and loss_err < 1e-9 and count_err == 0 and grad_err < 1e-9
