"""Fine-tune with TRL's ``SFTTrainer`` (or ``transformers.Trainer``) on packed, balanced steps.

    python examples/hf_trainer.py                                   # one process
    torchrun --standalone --nproc-per-node 2 examples/hf_trainer.py  # 2 DP ranks (gloo on CPUs)

A tiny Llama built from a config (random weights, nothing downloaded) and a tokenized SFT
dataset (``input_ids`` and TRL's ``completion_mask``; no tokenizer needed for the data). The
only seqpack lines are the mixin in the class's bases and ``seqpack_config``:

    class PackedSFTTrainer(SeqpackTrainerMixin, SFTTrainer): ...
    trainer = PackedSFTTrainer(model=model, args=SFTConfig(..., per_device_train_batch_size=16),
                               train_dataset=dataset, processing_class=tokenizer,
                               seqpack_config={"max_tokens_per_rank": 256})

Each optimizer step is one seqpack step: ``per_device_train_batch_size`` rows on every rank,
balanced over the ranks and packed into as many microbatches as they need, the loss
normalised by the step's supervised tokens on all ranks. ``--out`` saves the per-step losses
and the final parameters (the tests compare them with an unpacked run).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch
from datasets import Dataset
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

from seqpack.interop.hf import SeqpackTrainerMixin

VOCAB = 64


class PackedSFTTrainer(SeqpackTrainerMixin, SFTTrainer):
    """TRL's SFTTrainer whose optimizer steps are seqpack steps."""


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    """A 2-layer Llama with hidden size 32, random weights from ``seed``."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).to(dtype)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the ``VOCAB`` ids (TRL wants one for its pad and eos ids;
    the data is already tokenized)."""
    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, VOCAB)}}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>")


def sft_dataset(count: int, seed: int = 0, max_prompt: int = 60) -> Dataset:
    """Tokenized SFT rows: a prompt, a separator, an answer that repeats the prompt, and the
    eos; ``completion_mask`` is 1 on the answer and the eos (what TRL's tokenization writes for
    prompt-completion data)."""
    rng = np.random.default_rng(seed)
    rows: dict[str, list[list[int]]] = {"input_ids": [], "completion_mask": []}
    for _ in range(count):
        prompt = rng.integers(2, 20, int(rng.integers(3, max_prompt))).tolist()
        rows["input_ids"].append([*prompt, 20, *prompt, 1])
        rows["completion_mask"].append([0] * (len(prompt) + 1) + [1] * (len(prompt) + 1))
    return Dataset.from_dict(rows)


def training_settings(output_dir: str, *, steps: int, batch_size: int, seed: int = 0) -> dict[str, object]:
    """The run's ``TrainingArguments``: on CPU, a loss logged every step, nothing saved."""
    return dict(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=seed,
        use_cpu=True,
        dataloader_drop_last=True,
        disable_tqdm=True,
    )


def sft_config(output_dir: str, *, steps: int, batch_size: int, seed: int = 0, **overrides: object) -> SFTConfig:
    """``training_settings`` as an ``SFTConfig``: loss on the completions only, no truncation,
    fp32 (TRL defaults to bf16, which on CPUs is autocast)."""
    settings = training_settings(output_dir, steps=steps, batch_size=batch_size, seed=seed)
    return SFTConfig(**{**settings, "completion_only_loss": True, "max_length": None, "bf16": False, **overrides})


def run(
    *,
    steps: int,
    batch_size: int,
    max_tokens_per_rank: int | None,
    samples: int,
    padding_free: bool = False,
    dtype: torch.dtype = torch.float32,
    output_dir: str | None = None,
) -> tuple[list[float], torch.Tensor]:
    """Train the tiny model ``steps`` steps; the logged per-step losses and the final parameters
    (flattened). ``max_tokens_per_rank=None`` runs TRL's own trainer (padded, or its
    ``padding_free`` collator) instead of the seqpack one."""
    with tempfile.TemporaryDirectory() as scratch:
        args = sft_config(output_dir or scratch, steps=steps, batch_size=batch_size, padding_free=padding_free)
        common = dict(
            model=tiny_model(dtype=dtype),
            args=args,
            train_dataset=sft_dataset(samples),
            processing_class=tiny_tokenizer(),
        )
        if max_tokens_per_rank is None:
            trainer: SFTTrainer = SFTTrainer(**common)
        else:
            trainer = PackedSFTTrainer(**common, seqpack_config={"max_tokens_per_rank": max_tokens_per_rank})
        trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    params = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    return losses, params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16, help="rows per rank and step")
    parser.add_argument("--max-tokens-per-rank", type=int, default=256)
    parser.add_argument("--samples", type=int, default=512, help="rows in the dataset")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--out", help="save {'losses', 'params'} here (rank 0)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    losses, params = run(
        steps=args.steps,
        batch_size=args.batch_size,
        max_tokens_per_rank=args.max_tokens_per_rank,
        samples=args.samples,
        dtype=getattr(torch, args.dtype),
    )
    if int(os.environ.get("RANK", 0)) == 0:
        for i, loss in enumerate(losses):
            print(f"step {i}: loss {loss:.6f}", flush=True)
        if args.out:
            torch.save({"losses": losses, "params": params}, args.out)


if __name__ == "__main__":
    main()
