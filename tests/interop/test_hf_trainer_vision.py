"""SeqpackTrainerMixin with a vision-language model: a tiny random-init Qwen2-VL
(tests/vlm_data.py, built from a config of the installed transformers) trained by
``transformers.Trainer`` and by TRL's ``SFTTrainer`` on one process from a ``datasets.Dataset``
of processor-style rows (images of several sizes, two-image rows, a video, text-only rows).
Each step's logged loss and the final parameters (language model and vision tower) equal an
unpacked reference that runs every row alone, the model computing its own positions; the mixin
takes ``mrope`` from the model's config. TRL's own ``padding_free`` on the same rows drops the
pixels and trains something else."""

from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("accelerate", reason="accelerate is not installed (pip install 'seqpack[hf-test]')")
pytest.importorskip("datasets")

import datasets  # noqa: E402
import transformers  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402
from vlm_data import alone_kwargs, text_sample, tiny_vlm, two_image_sample, video_sample  # noqa: E402

from seqpack.cost import ModelSpec  # noqa: E402
from seqpack.errors import ConfigError  # noqa: E402
from seqpack.interop.hf import SeqpackTrainerMixin  # noqa: E402
from seqpack.thd import MRopeSpec  # noqa: E402

transformers.logging.set_verbosity_error()
datasets.disable_progress_bars()

STEPS, BATCH, LR = 4, 6, 3e-3


class PackedTrainer(SeqpackTrainerMixin, Trainer):
    """transformers' Trainer whose optimizer steps are seqpack steps."""


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _rows(count: int, seed: int = 0) -> list[dict]:
    """Processor-style samples: one image (grids 4x4 to 8x6 patches), two images, a 2-step
    video, text only, in turn."""
    gen = torch.Generator().manual_seed(seed)
    grids = [(1, 4, 4), (1, 8, 6), (1, 2, 4), (1, 6, 6)]
    rows = []
    for i in range(count):
        kind = i % 4
        if kind == 0:
            sample = two_image_sample(gen, grids=(grids[(i // 4) % 4],))
        elif kind == 1:
            sample = two_image_sample(gen, grids=(grids[(i // 4 + 1) % 4], grids[(i // 4 + 2) % 4]))
        elif kind == 2:
            sample = video_sample(gen, frame_runs=False)
        else:
            sample = text_sample(gen, n=5 + i % 7)
        ids = sample["input_ids"]
        sample["mm_token_type_ids"] = (ids == 120).long() + 2 * (ids == 121).long()
        rows.append(sample)
    return rows


def _dataset(rows: list[dict]) -> datasets.Dataset:
    """The rows as a dataset (lists, None where a row has no images or no video)."""
    keys = ("input_ids", "labels", "mm_token_type_ids", "pixel_values", "image_grid_thw")
    keys += ("pixel_values_videos", "video_grid_thw")
    return datasets.Dataset.from_list(
        [{key: row[key].tolist() if key in row else None for key in keys} for row in rows]
    )


def _args(tmp_path, **overrides) -> TrainingArguments:
    settings = dict(
        output_dir=str(tmp_path),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        learning_rate=LR,
        lr_scheduler_type="constant",
        optim="adamw_torch",
        train_sampling_strategy="sequential",  # the reference reads the rows in order
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    return TrainingArguments(**{**settings, **overrides})


@functools.cache
def _reference_run() -> tuple[list[float], torch.Tensor]:
    return _reference(_rows(STEPS * BATCH))


def _reference(rows: list[dict]) -> tuple[list[float], torch.Tensor]:
    """The Trainer's run unpacked: each step's rows one by one, the model computing its own
    positions, HF's loss over the step's supervised tokens; AdamW and the gradient clipping of
    the Trainer's defaults."""
    model = tiny_vlm("qwen2_vl")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    losses = []
    for k in range(STEPS):
        step = rows[k * BATCH : (k + 1) * BATCH]
        count = sum(int((row["labels"][1:] != -100).sum()) for row in step)
        total = 0.0
        for row in step:
            alone = alone_kwargs({k: v for k, v in row.items() if k != "mm_token_type_ids"}, model)
            out = model(**alone, labels=row["labels"][None], num_items_in_batch=count)
            out.loss.backward()
            total += float(out.loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return losses, _params(model)


def _params(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_trainer_steps_on_a_vlm_equal_the_rows_run_alone(tmp_path):
    rows = _rows(STEPS * BATCH)
    model = tiny_vlm("qwen2_vl")
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = PackedTrainer(
        model=model,
        args=_args(tmp_path),
        train_dataset=_dataset(rows),
        seqpack_config={"max_tokens_per_rank": 48, "model": ModelSpec.from_hf(model.config)},
    )
    assert trainer._seqpack_config.mrope == MRopeSpec.from_hf(model.config)  # taken from the model
    counts = []
    training_step = trainer.training_step
    trainer.training_step = lambda model, step, count=None: (
        counts.append(step.num_microbatches) or training_step(model, step, count)
    )
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    reference, reference_params = _reference_run()
    assert len(losses) == STEPS and len(counts) == STEPS and min(counts) >= 2, counts  # several microbatches
    assert max(abs(a - b) for a, b in zip(losses, reference, strict=True)) <= 1e-5, (losses, reference)
    assert float((_params(trainer.model) - reference_params).abs().max()) <= 1e-5
    moved = {name for name, p in trainer.model.named_parameters() if not torch.equal(p.detach(), start[name])}
    assert any("visual" in name for name in moved) and any("language_model" in name for name in moved)
    assert trainer.seqpack_encoder_rebalance is None  # "auto" on one process: no hooks


def test_the_mixin_hooks_the_model_with_its_config_topology_and_calibrated_price(tmp_path, monkeypatch):
    import seqpack.interop.hf as hf
    from seqpack.schedulers.encoder_plan import DEFAULT_SECONDS_PER_FLOP

    calls, hooks = [], object()

    def rebalance_for_config(model, topology, config, price):
        calls.append((model, topology, config, price()))
        return hooks

    monkeypatch.setattr(hf, "rebalance_for_config", rebalance_for_config)
    model = tiny_vlm("qwen2_vl")
    for mode in ("auto", False):
        trainer = PackedTrainer(
            model=model,
            args=_args(tmp_path),
            train_dataset=_dataset(_rows(BATCH)),
            seqpack_config={"max_tokens_per_rank": 48, "encoder_rebalance": mode},
        )
        assert trainer.seqpack_encoder_rebalance is None  # not before the first loader
        trainer.get_train_dataloader()
        trainer.get_train_dataloader()  # hooked once
        assert trainer.seqpack_encoder_rebalance is hooks
        (got, topology, config, price), *more = calls
        assert not more and got is model and topology.dp_size == 1 and config.encoder_rebalance == mode
        assert config.mrope == MRopeSpec.from_hf(model.config) and price == DEFAULT_SECONDS_PER_FLOP
        calls.clear()


def test_a_given_mrope_must_be_the_models(tmp_path):
    model = tiny_vlm("qwen2_vl")
    other = MRopeSpec(model_type="qwen2_vl", image_token_id=7, video_token_id=8)
    with pytest.raises(ConfigError, match=r"mrope=MRopeSpec\(.*image_token_id=7.*the model's config gives"):
        PackedTrainer(
            model=model,
            args=_args(tmp_path),
            train_dataset=_dataset(_rows(4)),
            seqpack_config={"max_tokens_per_rank": 48, "mrope": other},
        )


def test_trls_sft_trainer_with_the_mixin_is_exact_where_its_padding_free_drops_the_pixels(tmp_path):
    """TRL 1.16 refuses padding_free for datasets of raw images; given the processor's rows it
    runs, but its collator keeps only the text fields (no pixels: the placeholders train as
    text) with one ``[1, T]`` row of positions. The mixin in TRL's SFTTrainer (its dataset
    preparation, gradient checkpointing and loss) is exact on the same rows."""
    trl = pytest.importorskip("trl", reason="trl is not installed (pip install 'seqpack[hf-test]')")
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    class PackedSFTTrainer(SeqpackTrainerMixin, trl.SFTTrainer):
        pass

    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, 128)}}
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<pad>")), pad_token="<pad>", eos_token="<eos>"
    )
    rows = _rows(STEPS * BATCH)
    reference, reference_params = _reference_run()
    runs = {}
    for padding_free in (False, True):
        settings = _args(tmp_path).to_dict()
        settings.update(bf16=False, max_length=None, padding_free=padding_free)
        common = dict(args=trl.SFTConfig(**settings), train_dataset=_dataset(rows), processing_class=tokenizer)
        if padding_free:
            trainer = trl.SFTTrainer(model=tiny_vlm("qwen2_vl"), **common)
            batch = trainer.data_collator([trainer.train_dataset[i] for i in range(BATCH)])
            assert "pixel_values" not in batch and batch["position_ids"].shape[0] == 1  # what TRL's path gives
        else:
            trainer = PackedSFTTrainer(model=tiny_vlm("qwen2_vl"), seqpack_config={"max_tokens_per_rank": 48}, **common)
        trainer.train()
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        runs[padding_free] = (losses, _params(trainer.model))
    losses, params = runs[False]
    assert max(abs(a - b) for a, b in zip(losses, reference, strict=True)) <= 1e-5, (losses, reference)
    assert float((params - reference_params).abs().max()) <= 1e-5
    trl_losses = runs[True][0]
    assert max(abs(a - b) for a, b in zip(trl_losses, reference, strict=True)) > 1e-2, (trl_losses, reference)
