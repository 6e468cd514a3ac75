"""Wrap an existing torch DataLoader over a Hugging Face-style dataset of token dicts.

    python examples/wrap_existing_loader.py                    # one process
    torchrun --standalone --nproc-per-node 2 examples/wrap_existing_loader.py

Your dataset already yields ``{"input_ids": [...], "labels": [...]}`` per example (a
``datasets.Dataset`` after tokenization looks like this). Give seqpack one example at a time:
a ``DataLoader`` with ``batch_size=None`` does exactly that, and keeps its workers, prefetch
and sampler. Every rank reads its own shard (``data_owner="all"``: no TP broadcast, the
NeMo-RL / verl regime). The packing iterator is resumable: save ``state_dict()`` with your
checkpoint and load it into a fresh iterator over the same loader.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from seqpack import Topology, wrap_data_iterator


class TokenizedExamples(Dataset):
    """Stands in for a tokenized HF dataset: lists of ints, prompt tokens masked with -100."""

    def __init__(self, num_examples: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(num_examples):
            prompt = int(torch.randint(4, 64, (1,), generator=g))
            answer = int(torch.randint(4, 256, (1,), generator=g))
            ids = torch.randint(1, 32000, (prompt + answer,), generator=g).tolist()
            labels = [-100] * prompt + ids[prompt + 1 :] + [-100]
            self.rows.append({"input_ids": ids, "labels": labels})

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = self.rows[i]
        return {key: torch.tensor(value, dtype=torch.int64) for key, value in row.items()}


def main() -> None:
    if "RANK" in __import__("os").environ:
        dist.init_process_group("gloo")
        mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
        topology = Topology.from_device_mesh(mesh)
    else:
        topology = Topology.single()
    rank, world = topology.dp_rank, topology.dp_size

    dataset = TokenizedExamples(400)
    shard = torch.utils.data.Subset(dataset, range(rank, len(dataset), world))  # or a DistributedSampler
    loader = DataLoader(shard, batch_size=None, shuffle=False, num_workers=0)

    def wrap(loader_iter):
        return wrap_data_iterator(
            loader_iter,
            topology,
            samples_per_rank=32,
            max_tokens_per_rank=2048,
            data_owner="all",
            check_schedule=True,  # all-reduce the schedule's hash: catches ranks reading mismatched data
        )

    steps = wrap(iter(loader))
    first = next(steps)
    state = steps.state_dict()  # goes into your checkpoint
    second = next(steps)

    # Resume: a fresh iterator over the same loader reproduces the next step exactly.
    resumed = wrap(iter(loader))
    resumed.load_state_dict(state)
    again = next(resumed)
    pairs = zip(second.microbatches, again.microbatches, strict=True)
    same = all(torch.equal(a.input_ids, b.input_ids) for a, b in pairs)

    if rank == 0:
        for step in (first, second):
            st = step.stats
            print(
                f"step {step.step}: {st.num_sequences} sequences -> {step.num_microbatches} microbatches per rank, "
                f"{st.real_tokens} real / {st.padded_tokens} padded tokens, imbalance {st.imbalance:.3f}"
            )
        mb = second.microbatches[0]
        print(
            f"microbatch 0: cu_seqlens {mb.cu_seqlens[:6].tolist()}..., max_seqlen {mb.max_seqlen}, "
            f"loss tokens {int(mb.loss_mask.sum())}"
        )
        print(f"resumed step {again.step} identical to step {second.step}: {same}")
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
