"""SeqpackTrainerMixin on a plain ``transformers.Trainer`` (a tiny Llama from a config, no
download): the launches it cannot make exact (DeepSpeed, DataParallel, accelerate's tp / cp /
sp, unscaled losses over several processes, a topology other than the processes) are refused
by name when the train loader is made; outside the training read (evaluation) it leaves the
Trainer's own column handling and FLOP count alone."""

from __future__ import annotations

import types

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate", reason="accelerate is not installed (pip install 'seqpack[hf-test]')")
datasets = pytest.importorskip("datasets")

from transformers import Trainer, TrainingArguments  # noqa: E402

from seqpack import Topology  # noqa: E402
from seqpack.errors import ConfigError, SeqpackTypeError  # noqa: E402
from seqpack.interop.hf import SeqpackTrainerMixin  # noqa: E402

ROWS = [
    {"input_ids": [3, 4, 5, 6], "labels": [3, 4, 5, 6], "note": "a"},
    {"input_ids": [7, 8, 9], "labels": [7, 8, 9], "note": "b"},
]


class PackedTrainer(SeqpackTrainerMixin, Trainer):
    pass


def _model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def _args(tmp_path, **overrides):
    return TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, per_device_eval_batch_size=2,
                             use_cpu=True, report_to=[], **overrides)  # fmt: skip


def _trainer(tmp_path, topology=None, **overrides):
    rows = datasets.Dataset.from_list(ROWS)
    return PackedTrainer(model=_model(), args=_args(tmp_path, **overrides), train_dataset=rows,
                         seqpack_config={"max_tokens_per_rank": 64}, seqpack_topology=topology)  # fmt: skip


def test_a_topology_of_another_type_is_refused_naming_it(tmp_path):
    with pytest.raises(SeqpackTypeError, match=r"seqpack_topology must be a Topology, got dict"):
        _trainer(tmp_path, topology={"dp_size": 1})


def test_a_topology_other_than_the_processes_is_refused_by_its_sizes(tmp_path):
    trainer = _trainer(tmp_path, topology=Topology(dp_size=2, groups={"dp": object()}))
    with pytest.raises(
        ConfigError, match=r"seqpack_topology has dp_size=2 over 2 ranks, but accelerate runs 1 processes"
    ):
        trainer.get_train_dataloader()


def _accelerator(kind="DistributedType.MULTI_CPU", processes=1):
    return types.SimpleNamespace(distributed_type=kind, num_processes=processes)


@pytest.mark.parametrize(
    ("launch", "words"),
    [
        (lambda t, mp: mp.setattr(t, "accelerator", _accelerator("DistributedType.DEEPSPEED")),
         r"DeepSpeed steps its optimizer on its own schedule"),
        (lambda t, mp: mp.setattr(t, "get_cp_size", lambda: 2), r"accelerate's cp_size=2; the mixin balances over DP"),
        (lambda t, mp: mp.setattr(t, "get_tp_size", lambda: 4), r"accelerate's tp_size=4"),
        (lambda t, mp: mp.setattr(type(t.args), "n_gpu", property(lambda _: 2)), r"n_gpu=2 \(DataParallel\)"),
        (lambda t, mp: (mp.setattr(t, "accelerator", _accelerator(processes=2)),
                        mp.setattr(t.args, "average_tokens_across_devices", False)),
         r"average_tokens_across_devices=False on 2 processes"),
    ],
    ids=["deepspeed", "cp", "tp", "data-parallel", "unscaled-loss"],
)  # fmt: skip
def test_launches_that_cannot_be_exact_are_refused_when_the_loader_is_made(tmp_path, monkeypatch, launch, words):
    trainer = _trainer(tmp_path)
    launch(trainer, monkeypatch)
    with pytest.raises(ConfigError, match=words):
        trainer.get_train_dataloader()


@pytest.mark.parametrize("as_dataset", [True, False], ids=["dataset", "list"])
def test_evaluation_batches_drop_the_columns_the_model_does_not_take_as_the_trainers_do(tmp_path, as_dataset):
    trainer = _trainer(tmp_path)
    plain = Trainer(model=_model(), args=_args(tmp_path))
    rows = ROWS[:1] * 2  # one length: the default collator stacks them
    batches = [next(iter(t.get_eval_dataloader(datasets.Dataset.from_list(rows) if as_dataset else rows)))
               for t in (trainer, plain)]  # fmt: skip
    assert sorted(batches[0]) == sorted(batches[1]) == ["input_ids", "labels"]  # "note" left out
    for key in batches[1]:
        assert torch.equal(batches[0][key], batches[1][key])


def test_the_flops_of_a_plain_batch_are_the_trainers(tmp_path):
    trainer = _trainer(tmp_path)
    batch = {"input_ids": torch.ones(2, 8, dtype=torch.long)}
    flops = trainer.floating_point_ops(batch)
    assert flops == Trainer.floating_point_ops(trainer, batch) > 0
    assert flops == 6 * trainer.model.num_parameters(exclude_embeddings=True) * 16


def test_an_epoch_with_no_step_left_gives_the_trainer_no_batch(tmp_path):
    assert _trainer(tmp_path).get_batch_samples(iter([]), 1, torch.device("cpu")) == ([], None)
