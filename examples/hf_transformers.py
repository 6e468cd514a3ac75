"""Fine-tune a Hugging Face causal LM on packed, balanced batches (copy this script).

    torchrun --standalone --nproc-per-node 2 examples/hf_transformers.py

A tiny Llama built from a config (random weights, nothing downloaded); on CPUs gloo, on GPUs
NCCL. What it shows, in order:

1. a ``dp`` device mesh and the seqpack ``Topology`` read from it;
2. a ``datasets.Dataset`` of tokenized SFT rows with Hugging Face-style ``labels`` (a copy of
   ``input_ids``, -100 on the prompt), each DP rank reading its own shard of it;
3. ``wrap_data_iterator(..., label_format="unshifted")``: seqpack shifts those labels itself,
   balances the step over the DP ranks and packs each microbatch;
4. the model sharded with FSDP2 (``fully_shard``), called as ``model(**to_hf(batch))``:
   ``[1, T]`` inputs, ``position_ids`` restarting per sequence, no attention mask,
   ``use_cache=False`` (with a cache HF would attend across the packed documents);
5. the per-token loss of the whole step: HF's loss with ``num_items_in_batch =
   Step.num_loss_tokens`` (the step's supervised tokens on every DP rank), times the number of
   ranks FSDP averages gradients over, so the gradient is the step's token mean's.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch
import torch.distributed as dist
from datasets import Dataset
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

from seqpack import Topology, wrap_data_iterator
from seqpack.interop.hf import to_hf

VOCAB = 128


def sft_rows(count: int, seed: int = 0) -> dict[str, list[list[int]]]:
    """Toy tokenized chat rows: a prompt of 16 frequent tokens, then an answer that repeats it
    (something a tiny model starts to learn in a few steps); ``labels`` as HF's SFT
    preprocessing writes them."""
    rng = np.random.default_rng(seed)
    rows: dict[str, list[list[int]]] = {"input_ids": [], "labels": []}
    for _ in range(count):
        prompt = rng.integers(2, 18, int(rng.integers(4, 40))).tolist()
        ids = [1, *prompt, 0, *prompt]  # 1: start, 0: separator
        rows["input_ids"].append(ids)
        rows["labels"].append([-100] * (len(prompt) + 2) + prompt)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--samples-per-rank", type=int, default=16)
    parser.add_argument("--max-tokens-per-rank", type=int, default=256)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)

    # 1. Mesh and topology: every rank a DP rank (FSDP shards over the same ranks).
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))
    topology = Topology.from_device_mesh(mesh)

    # 2. The dataset, and this DP rank's shard of it.
    dataset = Dataset.from_dict(sft_rows(args.steps * args.samples_per_rank * topology.dp_size))
    shard = dataset.shard(num_shards=topology.dp_size, index=topology.dp_rank)

    # 3. Packed, balanced steps; the labels are HF's, so label_format="unshifted".
    steps = wrap_data_iterator(
        shard,
        topology,
        samples_per_rank=args.samples_per_rank,
        max_tokens_per_rank=args.max_tokens_per_rank,
        label_format="unshifted",
    )

    # 4. A tiny Llama, sharded with FSDP2 over the dp ranks.
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()

    # 5. The step's per-token loss. FSDP averages gradients over its dp ranks: x dp_size.
    for step in steps:
        total = torch.zeros((), device=device)
        for batch in step.microbatches:  # the same number on every rank
            out = model(**to_hf(batch.to(device), num_items_in_batch=step.num_loss_tokens))
            (out.loss * topology.dp_size).backward()  # out.loss = this microbatch's token losses / step's count
            total += out.loss.detach()
        optimizer.step()
        optimizer.zero_grad()
        dist.all_reduce(total)  # every DP rank's share: the step's token-mean loss
        if dist.get_rank() == 0:
            print(
                f"step {step.step}: loss {float(total):.4f} over {step.num_loss_tokens} loss tokens, "
                f"{step.num_microbatches} microbatches, {step.stats.real_tokens} real tokens, "
                f"imbalance {step.stats.imbalance:.3f}",
                flush=True,
            )
    dist.barrier()  # nobody tears gloo down while a peer still finishes its last collective
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
