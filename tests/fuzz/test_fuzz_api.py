"""Fuzz the public API: every callable, one argument at a time spoiled with a hostile value
(:data:`hostile.HOSTILE`), from a valid call. Each answer keeps the error contract
(:func:`hostile.check_answer`): success with a value of the right kind, or a SeqpackError /
SeqpackTypeError naming the argument. Nothing else (no IndexError, OverflowError,
MemoryError, AttributeError, RuntimeError from torch) may escape."""

from __future__ import annotations

import collections
import io
import os
import tempfile

import numpy as np
import pytest
import torch
from hostile import Target, check_answer, hostile_values
from hypothesis import given, settings
from hypothesis import strategies as st
from wrapper_data import FIELDS

from seqpack import cost as cost_mod
from seqpack.collective import gather_lengths
from seqpack.compute.attention import ThdAttention, thd_attention
from seqpack.compute.mamba import Mamba2Mixer
from seqpack.cost import CostModel, ModelSpec
from seqpack.cost.terms import sequence_features
from seqpack.errors import SeqpackError
from seqpack.interop.nemo import process_input_for_thd, split_batch_into_thd_chunks
from seqpack.loader import PackingConfig, wrap_data_iterator
from seqpack.mock_data import (
    MockSFTDataset,
    bimodal_lengths,
    constant_lengths,
    generate_lengths,
    lengths_from_config,
    lengths_from_file,
    lognormal_lengths,
    pareto_lengths,
    uniform_lengths,
    write_lengths,
)
from seqpack.schedulers import Schedule, get_scheduler
from seqpack.schedulers.balanced import BalancedScheduler
from seqpack.schedulers.dp_balanced import DpBalancedScheduler
from seqpack.stats import StepStats
from seqpack.thd import (
    PackedBatch,
    batch_from_layout,
    dualchunk_to_sequential,
    gather_order,
    normalize_sample,
    pack_sequences,
    pad_multiple_for,
    padded_lengths,
    padding_only_batch,
    partition_indices,
    reorder_seq_chunks,
    sample_sequences,
    seq_idx_from_cu_seqlens,
    shard_for_cp,
    split_packed_sample,
    token_layout,
    unshard_from_cp,
)
from seqpack.topology import Topology

_TMP = tempfile.mkdtemp(prefix="seqpack-fuzz-")
_CSV = os.path.join(_TMP, "lengths.csv")
write_lengths(_CSV, [5, 9, 3])
LENGTHS = [5, 9, 3, 12, 7, 1]
SAMPLE_WORDS = ("sample", "length")  # messages about one sample name it by index
FILE_WORDS = ("file",)  # messages about a file name it by its path


def _samples():
    return [
        {"input_ids": torch.arange(1, 6), "labels": torch.arange(2, 7), "loss_mask": torch.ones(5)},
        {"input_ids": torch.arange(3), "labels": torch.arange(3), "loss_mask": torch.ones(3)},
    ]


def _batch():
    return pack_sequences(_samples(), pad_multiple=4)


def _nemo():
    return {
        "input_ids": torch.tensor([[1, 2, 3, 99, 4, 5], [6, 7, 8, 9, 10, 11]]),
        "labels": torch.tensor([[2, 3, 99, 4, 5, 6], [7, 8, 9, 10, 11, 12]]),
        "position_ids": torch.tensor([[0, 1, 2, 0, 0, 1], [0, 1, 2, 3, 4, 5]]),
        "seq_lens": torch.tensor([[3, 2], [6, -1000]]),
        "seq_lens_padded": torch.tensor([[4, 2], [6, -1000]]),
    }


def _schedule():
    return get_scheduler("balanced").schedule(LENGTHS, dp_size=2, max_tokens_per_rank=16)


def _wrap_and_run(data_iterator, **options):
    return list(wrap_data_iterator(data_iterator, Topology.single(), **options))


def _items():
    return iter(_samples() * 3)


class _FakeMesh:
    """What Topology.from_device_mesh reads of a one-rank DeviceMesh with a dim named dp."""

    mesh_dim_names = ("dp",)
    ndim = 1

    def size(self, dim=None):
        return 1

    def get_local_rank(self, dim=None):
        return 0

    def get_group(self, dim=None):
        return None


def _state():
    it = wrap_data_iterator(_items(), Topology.single(), samples_per_rank=2, max_tokens_per_rank=16)
    next(it)
    return it.state_dict()


def _load_state(**state):
    it = wrap_data_iterator(_items(), Topology.single(), samples_per_rank=2, max_tokens_per_rank=16)
    it.load_state_dict(state)
    return list(it)


def _field_spoiler(make, call):
    """A target over the fields of a mapping ``make()``: spoil one, ``call(mapping)``."""

    def run(**fields):
        return call(fields)

    return run, lambda: dict(make())


SAMPLE_FIELDS = {"input_ids": "any", "labels": "any", "loss_mask": "any", "position_ids": "any"}
_pack_one, _sample_fields = _field_spoiler(
    lambda: {**_samples()[0], "position_ids": torch.arange(5)}, lambda s: pack_sequences([s, _samples()[1]])
)
_nemo_call, _nemo_fields = _field_spoiler(_nemo, process_input_for_thd)
_arrays_call, _arrays_fields = _field_spoiler(lambda: _schedule().to_arrays(), Schedule.from_arrays)

STATE_KEYS = (
    "version",
    "topology",
    "config",
    "config_fingerprint",
    "steps",
    "consumed",
    "deferred_samples",
    "iterator",
    "scheduler",
    "finished",
    "dropped_at_end",
    "data_ended",
)

SCHEDULE_ARGS = {
    "lengths": "any",
    "dp_size": "int",
    "cp_size": "int",
    "max_tokens_per_rank": "int",
    "pad_multiple": "int",
    "cost": "any",
    "on_oversize": "str",
    "origin": "any",
    "bytes_per_token": "opt_number",
}
SCHEDULE_ALIASES = {"lengths": SAMPLE_WORDS, "max_tokens_per_rank": ("capacity",), "cp_size": ("capacity",)}


def _schedule_target(name):
    return Target(
        f"{name}.schedule",
        lambda **kw: get_scheduler(name).schedule(**kw),
        lambda: dict(
            lengths=list(LENGTHS),
            dp_size=2,
            cp_size=1,
            max_tokens_per_rank=16,
            pad_multiple=1,
            cost=None,
            on_oversize="error",
            origin=None,
            bytes_per_token=None,
        ),
        SCHEDULE_ARGS,
        SCHEDULE_ALIASES,
    )


def _packed_batch(**fields):
    return PackedBatch(**fields).to("cpu")


def _batch_fields():
    batch = _batch()
    return {
        f: getattr(batch, f)
        for f in (
            "input_ids",
            "labels",
            "loss_mask",
            "position_ids",
            "seq_idx",
            "padding_mask",
            "cu_seqlens",
            "cu_seqlens_padded",
            "max_seqlen",
            "sample_ids",
        )
    }


TARGETS = [
    Target(
        "Schedule.validate",
        lambda **kw: _schedule().validate(**kw),
        lambda: dict(lengths=list(LENGTHS), dp_size=2, cp_size=1, max_tokens_per_rank=16, pad_multiple=1),
        {"lengths": "any", "dp_size": "any", "cp_size": "any", "max_tokens_per_rank": "any", "pad_multiple": "any"},
        {"lengths": (*SAMPLE_WORDS, "schedule")},
    ),
    Target(
        "gather_lengths",
        lambda **kw: gather_lengths(**kw),
        lambda: dict(lengths=[3, 4], extras=[1]),
        {"lengths": "any", "extras": "any"},
    ),
    Target(
        "padding_only_batch",
        lambda **kw: padding_only_batch(**kw),
        lambda: dict(num_tokens=8, pad_token_id=0),
        {"num_tokens": "int", "pad_token_id": "int"},
    ),
    Target(
        "reorder_seq_chunks",
        lambda **kw: reorder_seq_chunks(**kw),
        lambda: dict(x=torch.arange(8), chunk_ids=torch.tensor([0, 3, 1, 2]), cu_seqlens_padded=[0, 4, 8], dim=0),
        {"x": "any", "chunk_ids": "any", "cu_seqlens_padded": "any", "dim": "int"},
    ),
    Target(
        "PackedBatch",
        _packed_batch,
        _batch_fields,
        dict.fromkeys(FIELDS, "any"),
    ),
    Target("PackedBatch.to", lambda **kw: _batch().to(**kw), lambda: dict(device="cpu"), {"device": "any"}),
    Target(
        "Topology.from_device_mesh",
        lambda **kw: Topology.from_device_mesh(**kw),
        lambda: dict(mesh=_FakeMesh()),
        {"mesh": "any"},
    ),
    Target(
        "PackingConfig.resolve",
        lambda **kw: PackingConfig(samples_per_rank=2, max_tokens_per_rank=16).resolve(**kw),
        lambda: dict(topology=Topology.single()),
        {"topology": "any"},
    ),
    *(_schedule_target(name) for name in ("balanced", "dp_balanced", "empty")),
    Target(
        "BalancedScheduler",
        lambda **kw: BalancedScheduler(**kw).schedule(LENGTHS, dp_size=2, max_tokens_per_rank=16),
        lambda: dict(
            order="heavy_first",
            min_microbatches=1,
            microbatch_multiple=1,
            num_microbatches=None,
            max_repair_moves=None,
            locality="auto",
            locality_tolerance=0.001,
        ),
        {
            "order": "str",
            "min_microbatches": "int",
            "microbatch_multiple": "int",
            "num_microbatches": "opt_int",
            "max_repair_moves": "opt_int",
            "locality": "auto_or_bool",
            "locality_tolerance": "number",
        },
    ),
    Target(
        "DpBalancedScheduler",
        lambda **kw: DpBalancedScheduler(**kw).schedule(LENGTHS, dp_size=2, max_tokens_per_rank=16),
        lambda: dict(microbatch_multiple=1),
        {"microbatch_multiple": "int"},
    ),
    Target(
        "get_scheduler",
        lambda **kw: get_scheduler(**kw),
        lambda: dict(name="balanced"),
        {"name": "any"},
        {"name": ("scheduler",)},
    ),
    Target(
        "pack_sequences",
        lambda **kw: pack_sequences(**kw),
        lambda: dict(samples=_samples(), pad_multiple=4, pad_to=None, pad_token_id=0, sample_ids=None),
        {"samples": "any", "pad_multiple": "int", "pad_to": "opt_int", "pad_token_id": "int", "sample_ids": "any"},
        {"samples": ("sample",), "pad_to": ("pack",)},
    ),
    Target("pack_sequences(sample field)", _pack_one, _sample_fields, SAMPLE_FIELDS),
    Target(
        "normalize_sample", lambda **kw: normalize_sample(**kw), lambda: dict(sample=_samples()[0]), {"sample": "any"}
    ),
    Target(
        "sample_sequences", lambda **kw: sample_sequences(**kw), lambda: dict(sample=_samples()[0]), {"sample": "any"}
    ),
    Target(
        "split_packed_sample",
        lambda **kw: split_packed_sample(**kw),
        lambda: dict(sample={**_samples()[0], "cu_seqlens": torch.tensor([0, 2, 5])}),
        {"sample": "any"},
    ),
    Target(
        "pad_multiple_for",
        lambda **kw: pad_multiple_for(**kw),
        lambda: dict(cp_size=2, tp_size=2, sequence_parallel=True, fp8=False),
        {"cp_size": "int", "tp_size": "int", "sequence_parallel": "bool", "fp8": "bool"},
    ),
    Target(
        "padded_lengths",
        lambda **kw: padded_lengths(**kw),
        lambda: dict(lengths=[3, 5], pad_multiple=4),
        {"lengths": "any", "pad_multiple": "int"},
        {"lengths": SAMPLE_WORDS},
    ),
    Target(
        "partition_indices",
        lambda **kw: partition_indices(**kw),
        lambda: dict(cu_seqlens_padded=[0, 4, 12], total_tokens=12, cp_size=2, cp_rank=1),
        {"cu_seqlens_padded": "any", "total_tokens": "int", "cp_size": "int", "cp_rank": "int"},
    ),
    Target(
        "shard_for_cp",
        lambda **kw: shard_for_cp(**kw),
        lambda: dict(batch=_batch(), cp_size=2, cp_rank=1),
        {"batch": "any", "cp_size": "int", "cp_rank": "int"},
    ),
    Target(
        "unshard_from_cp",
        lambda **kw: unshard_from_cp(**kw),
        lambda: dict(parts=[torch.arange(6), torch.arange(6)], cu_seqlens_padded=[0, 4, 12], cp_size=2),
        {"parts": "any", "cu_seqlens_padded": "any", "cp_size": "int"},
    ),
    Target(
        "batch_from_layout",
        lambda **kw: batch_from_layout(**kw),
        lambda: dict(
            cu_seqlens=[0, 3, 7], cu_seqlens_padded=[0, 4, 8], max_seqlen=4, sample_ids=[0, 1], cp_size=1, cp_rank=0
        ),
        {
            "cu_seqlens": "any",
            "cu_seqlens_padded": "any",
            "max_seqlen": "int",
            "sample_ids": "any",
            "cp_size": "int",
            "cp_rank": "int",
        },
    ),
    Target(
        "token_layout",
        lambda **kw: token_layout(**kw),
        lambda: dict(cu_seqlens_padded=[0, 4, 8], cu_seqlens=[0, 3, 7], total_tokens=8),
        {"cu_seqlens_padded": "any", "cu_seqlens": "any", "total_tokens": "opt_int"},
    ),
    Target(
        "seq_idx_from_cu_seqlens",
        lambda **kw: seq_idx_from_cu_seqlens(**kw),
        lambda: dict(cu_seqlens_padded=[0, 4, 8], total_tokens=8),
        {"cu_seqlens_padded": "any", "total_tokens": "int"},
    ),
    Target(
        "gather_order",
        lambda **kw: gather_order(**kw),
        lambda: dict(cu_seqlens_padded=[0, 4, 12], total_tokens=12, cp_size=2),
        {"cu_seqlens_padded": "any", "total_tokens": "int", "cp_size": "int"},
    ),
    Target(
        "dualchunk_to_sequential",
        lambda **kw: dualchunk_to_sequential(**kw),
        lambda: dict(x=torch.arange(12), cu_seqlens_padded=[0, 4, 12], cp_size=2, dim=0),
        {"x": "any", "cu_seqlens_padded": "any", "cp_size": "int", "dim": "int"},
    ),
    Target(
        "process_input_for_thd",
        lambda **kw: process_input_for_thd(**kw),
        lambda: dict(batch=_nemo(), seq_lens_padding_value=-1000, padding_token_id=0),
        {"batch": "any", "seq_lens_padding_value": "int", "padding_token_id": "int"},
    ),
    Target(
        "process_input_for_thd(batch field)",
        _nemo_call,
        _nemo_fields,
        {k: "any" for k in ("input_ids", "labels", "position_ids", "seq_lens", "seq_lens_padded")},
    ),
    Target(
        "split_batch_into_thd_chunks",
        lambda **kw: split_batch_into_thd_chunks(**kw),
        lambda: dict(batch=_nemo(), num_chunks=2, seq_lens_padding_value=-1000, padding_token_id=0),
        {"batch": "any", "num_chunks": "int", "seq_lens_padding_value": "int", "padding_token_id": "int"},
    ),
    Target(
        "CostModel",
        lambda **kw: CostModel(**kw).cost([3, 5]),
        lambda: dict(linear=1.0, quadratic=0.5, constant=0.0),
        {"linear": "number", "quadratic": "number", "constant": "number"},
    ),
    Target(
        "CostModel.cost",
        lambda **kw: CostModel(1.0, 0.5).cost(**kw),
        lambda: dict(lengths=[3, 5]),
        {"lengths": "any"},
        {"lengths": SAMPLE_WORDS},
    ),
    Target(
        "CostModel.from_transformer",
        lambda **kw: CostModel.from_transformer(**kw),
        lambda: dict(
            hidden_size=64,
            num_layers=2,
            num_attention_heads=4,
            ffn_hidden_size=128,
            num_query_groups=2,
            vocab_size=100,
            causal=True,
        ),
        {
            "hidden_size": "int",
            "num_layers": "int",
            "num_attention_heads": "int",
            "ffn_hidden_size": "int",
            "num_query_groups": "opt_int",
            "vocab_size": "opt_int",
            "causal": "bool",
        },
    ),
    Target(
        "CostModel.fit",
        lambda **kw: CostModel.fit(**kw),
        lambda: dict(microbatches=[[100], [200, 50], [400], [30, 30, 30]], seconds=[1.0, 2.1, 4.3, 1.0]),
        {"microbatches": "any", "seconds": "any"},
    ),
    Target(
        "CostModel.from_preset",
        lambda **kw: CostModel.from_preset(**kw),
        lambda: dict(name="llama3-8b", constant=0.0),
        {"name": "any", "constant": "number"},
        {"name": ("model", "preset")},
    ),
    Target(
        "model_preset",
        lambda **kw: cost_mod.model_preset(**kw),
        lambda: dict(name="llama3-8b"),
        {"name": "any"},
        {"name": ("model", "preset")},
    ),
    Target(
        "ModelSpec",
        lambda **kw: ModelSpec(**kw).cost_model(),
        lambda: dict(hidden_size=64, num_layers=2, num_attention_heads=4, ffn_hidden_size=128),
        {"hidden_size": "int", "num_layers": "int", "num_attention_heads": "int", "ffn_hidden_size": "int"},
    ),
    Target(
        "transformer_flops",
        lambda **kw: cost_mod.transformer_flops(**kw),
        lambda: dict(
            hidden_size=64, num_layers=2, num_attention_heads=4, ffn_hidden_size=128, seqlen_sum=10, seqlen_sq_sum=50
        ),
        {"hidden_size": "int", "num_layers": "int", "seqlen_sum": "int", "seqlen_sq_sum": "int"},
    ),
    Target(
        "mamba2_flops",
        lambda **kw: cost_mod.mamba2_flops(**kw),
        lambda: dict(seqlen_sum=10, hidden_size=64),
        {"seqlen_sum": "int", "hidden_size": "int"},
    ),
    Target(
        "lognormal_lengths",
        lambda **kw: lognormal_lengths(**kw),
        lambda: dict(n=5, min_seq_len=1, max_seq_len=100, mean_seq_len=20.0, sigma=1.0, seed=0),
        {
            "n": "int",
            "min_seq_len": "int",
            "max_seq_len": "int",
            "mean_seq_len": "number",
            "sigma": "number",
            "seed": "opt_int",
        },
    ),
    Target(
        "uniform_lengths",
        lambda **kw: uniform_lengths(**kw),
        lambda: dict(n=5, min_seq_len=1, max_seq_len=9, seed=1),
        {"n": "int", "min_seq_len": "int", "max_seq_len": "int", "seed": "opt_int"},
    ),
    Target(
        "pareto_lengths",
        lambda **kw: pareto_lengths(**kw),
        lambda: dict(n=5, min_seq_len=1, max_seq_len=99, alpha=1.2, seed=1),
        {"n": "int", "alpha": "number", "seed": "opt_int"},
    ),
    Target(
        "bimodal_lengths",
        lambda **kw: bimodal_lengths(**kw),
        lambda: dict(
            n=5,
            min_seq_len=1,
            max_seq_len=999,
            short_mean=20.0,
            long_mean=500.0,
            long_fraction=0.25,
            short_sigma=0.6,
            long_sigma=0.4,
            seed=0,
        ),
        {
            "n": "int",
            "short_mean": "number",
            "long_mean": "number",
            "long_fraction": "number",
            "short_sigma": "number",
            "long_sigma": "number",
        },
    ),
    Target(
        "constant_lengths",
        lambda **kw: constant_lengths(**kw),
        lambda: dict(n=5, length=7),
        {"n": "int", "length": "int"},
    ),
    Target(
        "generate_lengths",
        lambda **kw: generate_lengths(**kw),
        lambda: dict(name="constant", n=3, length=4),
        {"name": "any", "n": "int", "length": "int"},
        {"name": ("distribution",)},
    ),
    Target(
        "lengths_from_config",
        lambda **kw: lengths_from_config(**kw),
        lambda: dict(
            config={
                "mode": "distribution",
                "type": "lognormal",
                "min_seq_len": 1,
                "max_seq_len": 50,
                "mean_seq_len": 10,
            },
            num_samples=4,
            seed=0,
        ),
        {"config": "any", "num_samples": "opt_int", "seed": "opt_int"},
        os_errors=("config",),
    ),
    Target(
        "lengths_from_file",
        lambda **kw: lengths_from_file(**kw),
        lambda: dict(path=_CSV, column=None),
        {"path": "any", "column": "any"},
        {"path": FILE_WORDS},
        os_errors=("path",),
    ),
    Target(
        "write_lengths",
        lambda **kw: write_lengths(**kw),
        lambda: dict(path=os.path.join(_TMP, "out.csv"), lengths=[3, 4], column="length"),
        {"path": "any", "lengths": "any", "column": "str"},
        {"lengths": SAMPLE_WORDS, "path": FILE_WORDS},
        os_errors=("path",),
    ),
    Target(
        "MockSFTDataset",
        lambda **kw: list(MockSFTDataset(**kw)),
        lambda: dict(lengths=[4, 6], vocab_size=100, seed=0, prompt_fraction=0.0),
        {"lengths": "any", "vocab_size": "int", "seed": "int", "prompt_fraction": "number"},
        {"lengths": SAMPLE_WORDS},
    ),
    Target(
        "MockSFTDataset.write_parquet",
        lambda **kw: MockSFTDataset([4, 6]).write_parquet(**kw),
        lambda: dict(path=os.path.join(_TMP, "mock.parquet"), rows_per_group=1, progress=False),
        {"path": "any", "rows_per_group": "int", "progress": "any"},
        os_errors=("path",),
    ),
    Target(
        "StepStats.from_schedule",
        lambda **kw: StepStats.from_schedule(**kw),
        lambda: dict(schedule=_schedule(), cost=None, flops=None, empty_samples=0),
        {"schedule": "any", "cost": "any", "flops": "opt_number", "empty_samples": "int"},
    ),
    Target(
        "Schedule.from_arrays",
        _arrays_call,
        _arrays_fields,
        {k: "any" for k in ("limits", *Schedule.ARRAY_FIELDS)},
        {k: ("schedule",) for k in Schedule.ARRAY_FIELDS} | {"limits": ("schedule",)},
    ),
    Target(
        "PackingConfig",
        lambda **kw: PackingConfig(**kw),
        lambda: dict(
            samples_per_rank=2,
            max_tokens_per_rank=16,
            scheduler="balanced",
            scheduler_options=None,
            data_owner="tp0",
            on_oversize="error",
            drop_last=True,
            pad_multiple=None,
            sequence_parallel=False,
            fp8=False,
            cost=None,
            flops_fn=None,
            check_schedule=False,
            validate_ranks=True,
            sync="lockstep",
            calibrate=False,
            prefetch=1,
            prefetch_bytes=1 << 20,
        ),
        {
            "sync": "any",
            "calibrate": "bool",
            "prefetch": "int",
            "prefetch_bytes": "int",
            "samples_per_rank": "int",
            "max_tokens_per_rank": "int",
            "scheduler": "any",
            "scheduler_options": "any",
            "data_owner": "str",
            "on_oversize": "str",
            "drop_last": "bool",
            "pad_multiple": "opt_int",
            "sequence_parallel": "bool",
            "fp8": "bool",
            "cost": "any",
            "flops_fn": "any",
            "check_schedule": "bool",
            "validate_ranks": "bool",
        },
        {"scheduler": ("scheduler",), "scheduler_options": ("scheduler",)},
    ),
    Target(
        "Topology",
        lambda **kw: Topology(**kw),
        lambda: dict(
            dp_size=1,
            cp_size=1,
            tp_size=1,
            pp_size=1,
            dp_rank=0,
            cp_rank=0,
            tp_rank=0,
            pp_rank=0,
            world_size=None,
            groups={},
        ),
        {
            "dp_size": "int",
            "cp_size": "int",
            "tp_size": "int",
            "pp_size": "int",
            "dp_rank": "int",
            "cp_rank": "int",
            "tp_rank": "int",
            "pp_rank": "int",
            "world_size": "opt_int",
            "groups": "any",
        },
        {"world_size": ("world_size",), "groups": ("group", "axis")},
    ),
    Target(
        "wrap_data_iterator",
        _wrap_and_run,
        lambda: dict(
            data_iterator=_items(),
            samples_per_rank=2,
            max_tokens_per_rank=16,
            scheduler="balanced",
            on_oversize="error",
            drop_last=True,
            pad_multiple=None,
        ),
        {
            "data_iterator": "any",
            "samples_per_rank": "int",
            "max_tokens_per_rank": "int",
            "scheduler": "any",
            "on_oversize": "str",
            "drop_last": "bool",
            "pad_multiple": "opt_int",
        },
        {"data_iterator": ("data_iterator", "sample"), "max_tokens_per_rank": ("capacity", "max_tokens_per_rank")},
    ),
    Target(
        "PackingIterator.load_state_dict",
        _load_state,
        _state,
        {k: "any" for k in STATE_KEYS},
        {k: ("state", k) for k in STATE_KEYS},
    ),
    Target(
        "ThdAttention",
        lambda **kw: ThdAttention(**kw),
        lambda: dict(num_heads=4, head_dim=8, num_kv_heads=2, backend="torch", softmax_scale=None, cp_comm_type="p2p"),
        {
            "num_heads": "int",
            "head_dim": "int",
            "num_kv_heads": "opt_int",
            "backend": "str",
            "softmax_scale": "opt_number",
            "cp_comm_type": "str",
        },
    ),
    Target(
        "Mamba2Mixer",
        lambda **kw: Mamba2Mixer(**kw),
        lambda: dict(d_model=16, d_state=8, d_conv=4, expand=2, headdim=8, ngroups=1, backend="torch"),
        {
            "d_model": "int",
            "d_state": "int",
            "d_conv": "int",
            "expand": "int",
            "headdim": "int",
            "ngroups": "int",
            "backend": "str",
        },
    ),
]


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    """Hostile relative paths ('abc', '1') name files here, not in the checkout."""
    monkeypatch.chdir(tmp_path)


@pytest.mark.slow
def test_every_target_is_called_validly_first():
    failed = {}
    for target in TARGETS:
        try:
            target.call(**target.valid())
        except Exception as exc:  # noqa: BLE001 - list them all
            failed[target.name] = f"{type(exc).__name__}: {exc}"
    assert not failed, failed


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
@pytest.mark.slow
def test_hostile_arguments_get_a_clear_seqpack_error_or_are_used_as_given(target):
    outcomes = collections.Counter()

    @settings(max_examples=40)
    @given(arg=st.sampled_from(sorted(target.args)), value=hostile_values)
    def spoil_one(arg, value):
        kwargs = target.valid()
        kwargs[arg] = value
        outcomes[check_answer(target, arg, value, kwargs)] += 1

    spoil_one()
    assert outcomes["refused"] > 0, outcomes  # not vacuous: hostile values were met and refused


def test_the_state_dict_survives_torch_save():
    # The load_state_dict target spoils a state that itself round-trips.
    buf = io.BytesIO()
    torch.save(_state(), buf)
    buf.seek(0)
    assert _load_state(**torch.load(buf, weights_only=True))


def test_fuzz_values_cover_the_edges():
    from hostile import HOSTILE

    names = {name for name, _ in HOSTILE}
    assert {"2**63", "2**64", "nan", "None", "True", "np.uint64(2**64-1)", "torch.tensor([1.5])"} <= names
    assert np.isnan(dict(HOSTILE)["nan"]())


# --- attention windows and dynamic CP's ring figures: the whole range of values -----------------

WINDOW_EDGES = [-(2**63), -2, -1, 0, 1, 2**31 - 2, 2**31 - 1, 2**31, 2**62, 2**63 - 1, 2**63, 2**64]
window_bounds = st.one_of(st.integers(-3, 40), st.sampled_from(WINDOW_EDGES), hostile_values)


def _window_ok(value, *, unbounded: bool) -> bool:
    integral = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    return integral and (0 <= int(value) <= 2**31 - 1 or (unbounded and int(value) == -1))


def _refused_by_name(call, names: tuple[str, ...], *, out_of_range: bool) -> str:
    try:
        call()
    except SeqpackError as exc:
        message = str(exc)
        assert any(name in message for name in names), (names, message)
        if out_of_range:
            assert "2147483647" in message, message  # the valid range, not only the value
        return "refused"
    return "ok"


@pytest.mark.slow
def test_windows_are_taken_in_range_and_refused_by_name_outside():
    outcomes = collections.Counter()
    q = torch.randn(7, 2, 4, dtype=torch.float64)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    shape = dict(hidden_size=64, num_layers=2, num_attention_heads=4, ffn_hidden_size=128)

    @settings(max_examples=120)
    @given(left=window_bounds, right=window_bounds)
    def spoil(left, right):
        ok = _window_ok(left, unbounded=True) and _window_ok(right, unbounded=True)
        bad = "window[0]" if not _window_ok(left, unbounded=True) else "window[1]"
        integral = all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in (left, right))
        for build in (
            lambda: ThdAttention(2, 4, backend="torch", causal=False, window=(left, right)),
            lambda: thd_attention(q, q, q, cu, cu, causal=False, window=(left, right)),  # the forward runs too
        ):
            answer = _refused_by_name(build, (bad,), out_of_range=integral)
            assert answer == ("ok" if ok else "refused"), (left, right)
            outcomes[answer] += 1
        ok = _window_ok(left, unbounded=False)
        for name, build in (
            ("window_size", lambda: ModelSpec(**shape, window_size=left).sequence_flops([5, 3000])),
            (
                "window",
                lambda: sequence_features(np.array([5, 2**31]), CostModel(1, 0, windowed=1.0, window=left).window),
            ),
            (
                "window",
                lambda: CostModel.fit([[100], [200, 50], [400], [30, 30, 30], [7]], [1, 2, 4, 1, 0.1], window=left),
            ),
        ):
            if left is None:
                continue  # None is "no window" for these
            integral = isinstance(left, (int, np.integer)) and not isinstance(left, (bool, np.bool_))
            answer = _refused_by_name(build, (name,), out_of_range=integral)
            assert answer == ("ok" if ok else "refused"), (name, left)
            outcomes[answer] += 1

    spoil()
    assert outcomes["ok"] and outcomes["refused"], outcomes


RING_FIGURES = ("ring_step", "ring_token", "ring_token_inter")


@pytest.mark.slow
def test_ring_figures_are_refused_by_name_and_a_free_ring_under_dynamic_cp():
    outcomes = collections.Counter()
    figure_values = st.one_of(st.sampled_from([0, 0.0, 1e-4, 2e-8, 3]), hostile_values)

    @settings(max_examples=120)
    @given(figures=st.dictionaries(st.sampled_from((*RING_FIGURES, "ranks_per_node")), figure_values))
    def spoil(figures):
        try:
            cost = CostModel(1.0, 0.0, **figures)
            config = PackingConfig(samples_per_rank=4, max_tokens_per_rank=64, dynamic_cp=True, cost=cost)
        except SeqpackError as exc:
            message = str(exc)
            assert "ring term" in message or any(name in message for name in figures), (figures, message)
            outcomes["refused"] += 1
            return
        assert config.cost is not None and config.cost.has_ring, figures  # never free
        outcomes["ok"] += 1

    spoil()
    assert outcomes["ok"] and outcomes["refused"], outcomes
    with pytest.raises(SeqpackError, match="without a CP ring term every CP group would look free"):
        PackingConfig(samples_per_rank=4, max_tokens_per_rank=64, dynamic_cp=True, cost=CostModel(1.0, 0.0))
