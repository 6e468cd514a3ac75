"""Train a tiny attention + Mamba2 LM on packed, balanced THD batches (copy this script).

    torchrun --standalone --nproc-per-node 4 examples/train_tiny_hybrid.py --dp 2 --cp 2

On CPUs it uses gloo; on GPUs NCCL (and Transformer Engine / mamba_ssm kernels when
installed). What it shows, in order:

1. a ``dp x cp`` device mesh and the seqpack ``Topology`` read from it;
2. each DP rank reading its own slice of a dataset (the CP ranks of a replica read the same);
3. ``wrap_data_iterator``: gather lengths, balance FLOPs, all-to-all, pack THD, CP-shard;
4. a model sharded with FSDP2 over the flattened ``dp x cp`` mesh, fed ``PackedBatch``es;
5. the loss normalised by the global count of loss tokens, so the gradient is exactly the
   global mean loss's gradient whatever the packing.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from seqpack import Topology, wrap_data_iterator
from seqpack.compute.tiny_lm import TinyConfig, TinyHybridLM
from seqpack.mock_data import MockSFTDataset, lognormal_lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--cp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--samples-per-rank", type=int, default=16)
    parser.add_argument("--max-tokens-per-rank", type=int, default=2048)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)

    # 1. Mesh and topology. Groups are looked up by axis name, never by rank arithmetic.
    mesh = init_device_mesh(device.type, (args.dp, args.cp), mesh_dim_names=("dp", "cp"))
    topology = Topology.from_device_mesh(mesh)

    # 2. Data: lognormal SFT lengths (Megatron's mock); DP rank d reads block d of each step.
    total = args.steps * args.dp * args.samples_per_rank
    max_len = args.max_tokens_per_rank * args.cp  # the longest sequence one microbatch holds
    lengths = lognormal_lengths(total, min_seq_len=16, max_seq_len=max_len, mean_seq_len=max_len // 8, seed=0)
    dataset = MockSFTDataset(lengths, vocab_size=256, seed=0)

    def my_samples():
        for step in range(args.steps):
            start = (step * args.dp + topology.dp_rank) * args.samples_per_rank
            for i in range(start, start + args.samples_per_rank):
                yield dataset[i]  # {"input_ids", "labels"}: 1-D tensors

    # 3. The model, sharded over dp x cp (CP ranks hold different tokens of the same sequences).
    cfg = TinyConfig(vocab_size=256, d_model=64, pattern="AMAM", num_heads=4, num_kv_heads=2)
    torch.manual_seed(0)
    model = TinyHybridLM(cfg, cp_group=topology.group("cp")).to(device)
    flat = mesh["dp", "cp"]._flatten("dp_cp")
    for block in model.blocks:
        fully_shard(block, mesh=flat)
    fully_shard(model, mesh=flat)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    # 4. The wrapper balances this model's own training FLOPs across replicas and microbatches.
    spec = cfg.model_spec()
    steps = wrap_data_iterator(
        my_samples(),
        topology,
        samples_per_rank=args.samples_per_rank,
        max_tokens_per_rank=args.max_tokens_per_rank,
        scheduler="balanced",
        cost=spec.cost_model(),
        flops_fn=spec.flops,
    )

    world = dist.get_world_size()
    for step in steps:
        batches = [mb.to(device) for mb in step.microbatches]
        loss_tokens = torch.stack([b.loss_mask.sum() for b in batches]).sum().reshape(1)
        dist.all_reduce(loss_tokens)
        total_loss = torch.zeros((), device=device)
        for batch in batches:  # every rank runs step.num_microbatches of them
            loss_sum, _ = model.loss_sum(batch)
            # FSDP averages gradients over dp x cp ranks; x world turns that into a sum.
            (loss_sum * world / loss_tokens).backward()
            total_loss += loss_sum.detach()
        optimizer.step()
        optimizer.zero_grad()
        dist.all_reduce(total_loss)
        if dist.get_rank() == 0:
            st = step.stats
            print(
                f"step {step.step}: loss {float(total_loss / loss_tokens):.3f}, {step.num_microbatches} microbatches, "
                f"{st.real_tokens} real tokens, pad {st.pad_fraction:.1%}, imbalance {st.imbalance:.3f}, "
                f"{st.flops / 1e9:.1f} GFLOPs",
                flush=True,
            )
    dist.barrier()  # nobody tears gloo down while a peer still finishes its last collective
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
