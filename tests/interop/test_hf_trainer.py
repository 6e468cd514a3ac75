"""SeqpackTrainerMixin with the real TRL ``SFTTrainer`` and ``transformers.Trainer`` (tiny Llamas
built from configs, tokenized rows, no downloads): its steps equal TRL's own padding-free and
padded runs, on one process and on two gloo processes; each optimizer step is one whole seqpack
step whatever its microbatch count; what cannot be made exact is refused by name.

The runs come from examples/hf_trainer.py (imported here; the 2-process test runs it with
torchrun as a user would)."""

from __future__ import annotations

import functools
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

pytest.importorskip("trl", reason="trl is not installed (pip install 'seqpack[hf-test]')")
pytest.importorskip("accelerate", reason="accelerate is not installed (pip install 'seqpack[hf-test]')")

import datasets  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from seqpack.errors import ConfigError, SeqpackTypeError  # noqa: E402
from seqpack.interop.hf import SeqpackTrainerMixin  # noqa: E402
from seqpack.loader import Step  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("hf_trainer_example", REPO / "examples" / "hf_trainer.py")
assert _spec is not None and _spec.loader is not None
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)

transformers.logging.set_verbosity_error()
datasets.disable_progress_bars()


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), (a, b)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


# --- equal to TRL's own runs --------------------------------------------------------------------


def _count_microbatches(monkeypatch) -> list[int]:
    """The microbatch count of each step example.PackedSFTTrainer runs from now on."""
    counts: list[int] = []
    training_step = example.PackedSFTTrainer.training_step

    def counted(self, model, inputs, num_items_in_batch=None):
        counts.append(inputs.num_microbatches)
        return training_step(self, model, inputs, num_items_in_batch)

    monkeypatch.setattr(example.PackedSFTTrainer, "training_step", counted)
    return counts


RUN = dict(steps=20, batch_size=16, samples=512)


@functools.cache
def _trl_padding_free_run() -> tuple[list[float], torch.Tensor]:
    """TRL's own padding-free run of RUN (losses, final parameters): the reference of both
    tests below, run once per process."""
    return example.run(max_tokens_per_rank=None, padding_free=True, **RUN)


@pytest.mark.slow
def test_20_steps_equal_trls_padding_free_run(monkeypatch):
    """fp32, AdamW, 16 rows a step packed into microbatches of at most 256 tokens, the
    gradient accumulated over them, against TRL's one padding-free batch per step."""
    counts = _count_microbatches(monkeypatch)
    reference, reference_params = _trl_padding_free_run()
    losses, params = example.run(max_tokens_per_rank=256, **RUN)
    assert len(losses) == 20 and len(counts) == 20 and min(counts) >= 2, counts  # several microbatches a step
    assert _max_diff(losses, reference) <= 1e-5
    assert float((params - reference_params).abs().max()) <= 1e-5


@pytest.mark.slow
def test_one_microbatch_per_step_trains_as_trls_padding_free_run_bit_for_bit(monkeypatch):
    """With one microbatch per step the computation is TRL's padding-free batch's."""
    counts = _count_microbatches(monkeypatch)
    reference, reference_params = _trl_padding_free_run()
    losses, params = example.run(max_tokens_per_rank=4096, **RUN)
    assert counts == [1] * 20
    assert _max_diff(losses, reference) <= 1e-6  # the log's float32 rounding of the summed loss
    assert torch.equal(params, reference_params)


@pytest.mark.slow
def test_two_processes_equal_one_unpacked_process(tmp_path):
    """torchrun, 2 gloo processes with 8 rows each per step, balanced and packed into
    microbatches of at most 128 tokens, against one process of TRL's padded SFTTrainer with 16
    rows per step (the same rows: accelerate's rank shards of one seeded sampler)."""
    out = tmp_path / "run.pt"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["examples/hf_trainer.py", "--steps", "6", "--batch-size", "8", "--max-tokens-per-rank", "128"]
    command += ["--samples", "256", "--out", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    got = torch.load(out)
    reference, reference_params = example.run(steps=6, batch_size=16, max_tokens_per_rank=None, samples=256)
    assert len(got["losses"]) == 6
    assert _max_diff(got["losses"], reference) <= 1e-5
    assert float((got["params"] - reference_params).abs().max()) <= 1e-5


@pytest.mark.slow
def test_logged_token_metrics_equal_trls_padding_free_run(tmp_path, monkeypatch):
    """TRL logs ``mean_token_accuracy`` and ``entropy`` per forward as means over its supervised
    tokens; over a step of several microbatches the mixin logs them over the step's tokens, as
    TRL's one padding-free batch a step does (a plain average of the microbatches' was off by
    up to 0.04 / 0.16)."""
    counts = _count_microbatches(monkeypatch)
    logs = []
    for packed in (False, True):
        args = example.sft_config(str(tmp_path), steps=6, batch_size=16, padding_free=not packed)
        common = dict(
            model=example.tiny_model(),
            args=args,
            train_dataset=example.sft_dataset(128),
            processing_class=example.tiny_tokenizer(),
        )
        trainer = (
            example.PackedSFTTrainer(**common, seqpack_config={"max_tokens_per_rank": 256})
            if packed
            else trl.SFTTrainer(**common)
        )
        trainer.train()
        logs.append([entry for entry in trainer.state.log_history if "entropy" in entry])
    reference, got = logs
    assert len(got) == len(reference) == 6 and min(counts) >= 2, counts  # several microbatches a step
    for key in ("mean_token_accuracy", "entropy", "loss"):
        assert _max_diff([e[key] for e in got], [e[key] for e in reference]) <= 1e-5, key


# --- one optimizer step is one seqpack step ------------------------------------------------------


class _Recorder(TrainerCallback):
    def __init__(self, events):
        self.events = events

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.events.append(("optimizer",))


class _RecordingSFTTrainer(example.PackedSFTTrainer):
    """Records each step the Trainer hands to training_step and each microbatch's loss call."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.events.append(("step", inputs.step, inputs.num_microbatches, num_items_in_batch))
        return super().training_step(model, inputs, num_items_in_batch)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.events.append(("microbatch", num_items_in_batch))
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


@pytest.mark.slow
def test_each_optimizer_step_runs_one_whole_seqpack_step(tmp_path):
    """Over 8 steps of 2 epochs (5 steps each: 40 rows, 8 a step), each optimizer step runs
    exactly the microbatches of one seqpack step, with its count, while the count changes."""
    args = example.sft_config(str(tmp_path), steps=8, batch_size=8)
    trainer = _RecordingSFTTrainer(
        model=example.tiny_model(),
        args=args,
        train_dataset=example.sft_dataset(40, seed=3, max_prompt=90),
        processing_class=example.tiny_tokenizer(),
        seqpack_config={"max_tokens_per_rank": 256},
    )
    trainer.events = events = []
    trainer.add_callback(_Recorder(events))
    trainer.train()
    # events: ("step", k, m, count), m x ("microbatch", count), ("optimizer",), per step
    counts, i = [], 0
    while i < len(events):
        kind, k, m, count = events[i]
        assert kind == "step" and k == len(counts) % 5  # each epoch's steps count from 0
        assert events[i + 1 : i + 1 + m] == [("microbatch", count)] * m
        assert events[i + 1 + m] == ("optimizer",)
        counts.append(m)
        i += m + 2
    assert len(counts) == 8 == trainer.state.global_step
    assert len(set(counts)) > 1, counts  # not vacuous: the microbatch count changed between steps


@pytest.mark.slow
def test_tokens_seen_count_every_microbatch(tmp_path):
    """``include_num_input_tokens_seen`` and the FLOPs estimate read a step's microbatches
    (the Trainer's own code would look for ``input_ids`` in the Step)."""
    args = example.sft_config(str(tmp_path), steps=3, batch_size=8, include_num_input_tokens_seen="all")
    trainer = _RecordingSFTTrainer(
        model=example.tiny_model(),
        args=args,
        train_dataset=example.sft_dataset(40),
        processing_class=example.tiny_tokenizer(),
        seqpack_config={"max_tokens_per_rank": 128},
    )
    trainer.events = []
    tokens = []
    training_step = trainer.training_step
    trainer.training_step = lambda model, step, count=None: (
        tokens.append(sum(int(b.input_ids.numel()) for b in step.microbatches)) or training_step(model, step, count)
    )
    trainer.train()
    assert len(tokens) == 3 and trainer.state.num_input_tokens_seen == sum(tokens) > 0
    assert trainer.state.total_flos > 0


@pytest.mark.slow
def test_plain_trainer_reads_trls_completion_mask(tmp_path):
    """transformers.Trainer with the mixin: rows with TRL's ``completion_mask`` (no labels)
    train exactly as rows with the labels TRL's dataset preparation builds from it (the token,
    -100 where the mask is 0); and unlike rows that keep every token (not vacuous)."""

    class PackedTrainer(SeqpackTrainerMixin, Trainer):
        pass

    masked = example.sft_dataset(64)
    labelled = masked.map(
        lambda row: {
            "labels": [t if m else -100 for t, m in zip(row["input_ids"], row["completion_mask"], strict=True)]
        },
        remove_columns=["completion_mask"],
    )
    unmasked = masked.remove_columns(["completion_mask"])
    runs = []
    for dataset in (masked, labelled, unmasked):
        trainer = PackedTrainer(
            model=example.tiny_model(),
            args=TrainingArguments(**example.training_settings(str(tmp_path), steps=3, batch_size=8)),
            train_dataset=dataset,
            seqpack_config={"max_tokens_per_rank": 128},
        )
        trainer.train()
        runs.append([entry["loss"] for entry in trainer.state.log_history if "loss" in entry])
    assert len(runs[0]) == 3 and runs[0] == runs[1]
    assert _max_diff(runs[0], runs[2]) > 0.01


@pytest.mark.slow
def test_the_documented_snippet_trains(tmp_path):
    # As written: on this machine's CPUs, or a GPU where there is one.
    text = (REPO / "docs" / "integrations.md").read_text()
    found = re.search(r"<!-- tested: tests/interop/test_hf_trainer.py[^>]*-->\n```python\n(.*?)```", text, re.S)
    assert found, "docs/integrations.md lost its tested SeqpackTrainerMixin block"
    namespace = {
        "model": example.tiny_model(),
        "dataset": example.sft_dataset(64),
        "tokenizer": example.tiny_tokenizer(),
        "output_dir": str(tmp_path),
        "max_steps": 2,
    }
    exec(compile(found.group(1), "docs/integrations.md[SeqpackTrainerMixin]", "exec"), namespace)
    trainer = namespace["trainer"]
    assert isinstance(trainer, SeqpackTrainerMixin) and trainer.state.global_step == 2
    assert all(entry["loss"] > 0 for entry in trainer.state.log_history if "loss" in entry)


# --- refused by name ------------------------------------------------------------------------------


def _sft(tmp_path, seqpack_config=None, trainer_class=None, **overrides):
    args = example.sft_config(str(tmp_path), steps=2, batch_size=4, **overrides)
    trainer_class = trainer_class or example.PackedSFTTrainer
    return trainer_class(
        model=example.tiny_model(),
        args=args,
        train_dataset=example.sft_dataset(16),
        processing_class=example.tiny_tokenizer(),
        seqpack_config={"max_tokens_per_rank": 128} if seqpack_config is None else seqpack_config,
    )


@pytest.mark.parametrize(
    ("overrides", "seqpack_config", "words"),
    [
        ({"gradient_accumulation_steps": 2}, None, "gradient_accumulation_steps=2"),
        ({}, {"max_tokens_per_rank": 128, "samples_per_rank": 8}, "samples_per_rank=8"),
        ({"packing": True, "max_length": 64}, None, "packing=True"),
        ({}, {"samples_per_rank": 4}, "max_tokens_per_rank"),
        ({}, {"max_tokens_per_rank": 128, "max_token": 64}, r"unknown field\(s\) \['max_token'\]"),
    ],
)
@pytest.mark.slow
def test_settings_that_cannot_be_exact_are_refused(tmp_path, overrides, seqpack_config, words):
    with pytest.raises(ConfigError, match=words):
        _sft(tmp_path, seqpack_config, **overrides)


def test_a_data_collator_is_refused_by_name(tmp_path):
    # The mixin reads rows itself; a collator given for training would be silently unused.
    collator = transformers.DataCollatorWithPadding(example.tiny_tokenizer())
    args = example.sft_config(str(tmp_path), steps=2, batch_size=4)
    words = r"data_collator=DataCollatorWithPadding would not be used for training"
    with pytest.raises(ConfigError, match=words):
        example.PackedSFTTrainer(
            model=example.tiny_model(),
            args=args,
            data_collator=collator,
            train_dataset=example.sft_dataset(16),
            seqpack_config={"max_tokens_per_rank": 128},
        )
    with pytest.raises(ConfigError, match=words):  # positionally, as Trainer's third argument
        example.PackedSFTTrainer(example.tiny_model(), args, collator, seqpack_config={"max_tokens_per_rank": 128})


def test_a_seqpack_config_of_another_type_is_refused(tmp_path):
    with pytest.raises(SeqpackTypeError, match="seqpack_config"):
        _sft(tmp_path, seqpack_config=[("max_tokens_per_rank", 128)])


def test_batches_other_than_one_whole_step_are_refused(tmp_path):
    trainer = _sft(tmp_path)
    batch = {"input_ids": torch.ones(1, 4, dtype=torch.long)}
    with pytest.raises(ConfigError, match="must be a whole seqpack Step, got dict"):
        trainer.training_step(trainer.model, batch)
    with pytest.raises(ConfigError, match="asked for 2 batches"):
        trainer.get_batch_samples(iter([]), 2, torch.device("cpu"))
    steps = iter(trainer.get_train_dataloader())
    step = next(steps)
    assert isinstance(step, Step) and step.num_microbatches >= 1
    with pytest.raises(ConfigError, match="num_items_in_batch=1: a count from other batches"):
        trainer.training_step(trainer.model, step, torch.tensor(1))  # a count from other batches
    steps.close()
    with pytest.raises(ConfigError, match="resume_from_checkpoint"):
        trainer.train(resume_from_checkpoint=str(tmp_path))


@pytest.mark.slow
def test_gradient_accumulation_changed_after_construction_is_refused(tmp_path):
    trainer = _sft(tmp_path)
    trainer.args.gradient_accumulation_steps = 3
    with pytest.raises(ConfigError, match="gradient_accumulation_steps=3"):
        trainer.train()


def test_a_loss_without_num_items_in_batch_is_refused(tmp_path):
    class Plain(torch.nn.Module):  # forward without **kwargs: the Trainer cannot pass the count
        def __init__(self):
            super().__init__()
            self.inner = example.tiny_model()

        def forward(self, input_ids, labels=None):
            return self.inner(input_ids=input_ids, labels=labels)

    class PackedTrainer(SeqpackTrainerMixin, Trainer):
        pass

    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, use_cpu=True, report_to=[])
    with pytest.raises(ConfigError, match="model_accepts_loss_kwargs=False"):
        PackedTrainer(
            model=Plain(), args=args, train_dataset=example.sft_dataset(8), seqpack_config={"max_tokens_per_rank": 64}
        )
