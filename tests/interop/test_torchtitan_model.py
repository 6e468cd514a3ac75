"""torchtitan 0.3's own pieces with seqpack: the trainer's attributes the adapter uses exist on
its ``Trainer``; and (opt-in, ``SEQPACK_TORCHTITAN_MODEL=1``) its llama3 decoder with flex
attention, fed seqpack microbatches in the trainer's form (``input`` + ``positions``, its
document mask built by ``get_attention_masks``), gives every sequence the logits it gets alone.
Compiling flex attention on CPU takes minutes, so the model test is off by default. Both skip
without torchtitan (it lives in its own venv: it pins datasets < 4.8)."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

torchtitan = pytest.importorskip("torchtitan")

from seqpack import wrap_data_iterator  # noqa: E402
from seqpack.interop import torchtitan as tt  # noqa: E402
from seqpack.topology import Topology  # noqa: E402


def test_the_trainer_has_what_install_uses():
    from torchtitan.components.checkpointer.base import DATALOADER
    from torchtitan.trainer import Trainer

    hints = Trainer.__annotations__
    for name in ("gradient_accumulation_steps", "num_pipeline_parallel_microbatches", "dataloader", "parallel_dims"):
        assert name in hints, name
    assert DATALOADER == "dataloader"  # the checkpointer's key install() replaces


@pytest.mark.skipif(os.environ.get("SEQPACK_TORCHTITAN_MODEL") != "1", reason="opt-in: SEQPACK_TORCHTITAN_MODEL=1")
def test_decoder_on_seqpack_microbatches_equals_each_sequence_alone():
    from torchtitan.models.llama3 import model_registry

    config = model_registry("debugmodel", attn_backend="flex").model
    config = dataclasses.replace(config, layers=config.layers[:2])
    torch.manual_seed(0)
    model = config.build()
    model.init_weights(buffer_device=torch.device("cpu"))
    model.eval()

    g = torch.Generator().manual_seed(1)
    lengths = [37, 5, 64, 18, 90, 3, 41, 26]
    sequences = [torch.randint(0, 2048, (n + 1,), generator=g) for n in lengths]
    samples = [{"input_ids": s[:-1], "labels": s[1:]} for s in sequences]
    steps = wrap_data_iterator(
        iter(samples), Topology.single(), samples_per_rank=len(samples), max_tokens_per_rank=128,
        scheduler_options={"num_microbatches": 3}, prefetch=0,
    )  # fmt: skip
    loader = tt.SeqpackDataLoader(steps, 3)
    by_first_token = {int(s["input_ids"][0]): s for s in samples}
    seen = worst = 0.0
    shared = 0  # sequences that shared their microbatch with another (packing really happened)
    with torch.no_grad():
        for inputs, labels in loader:
            masks = model.get_attention_masks(positions=inputs["positions"])
            packed = model(inputs["input"], positions=inputs["positions"], attention_masks=masks)[0]  # (T, V)
            starts = torch.nonzero(inputs["positions"][0] == 0).flatten().tolist()
            shared += len(starts) if len(starts) > 1 else 0
            for start in starts:
                sample = by_first_token[int(inputs["input"][0, start])]
                n = sample["input_ids"].shape[0]
                ids = sample["input_ids"][None]
                alone_positions = torch.arange(n)[None]
                alone_masks = model.get_attention_masks(positions=alone_positions)
                alone = model(ids, positions=alone_positions, attention_masks=alone_masks)[0]  # (n, V)
                assert torch.equal(labels[0, start : start + n - 1], sample["labels"][: n - 1])
                worst = max(worst, float((packed[start : start + n] - alone).abs().max()))
                seen += 1
    assert seen == len(samples) and shared >= 4
    print(f"max |packed - alone| over {int(seen)} sequences ({shared} packed with others): {worst:.3g}")
    assert worst < 1e-5
