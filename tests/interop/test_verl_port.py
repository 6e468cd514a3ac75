"""verl 0.9.1's ``tests/utils/test_seqlen_balancing.py`` cases, run against seqpack's drop-in
and, where verl is installed, against verl's own functions on the same inputs.

verl 0.9.1 ships no tests in its wheel or sdist; the cases are those of verl's repository as
of its newest copy at hand (main, 2026-01-29): ``test_seqlen_balancing``,
``test_dynamic_batch``, ``test_seqlen_balancing_distributed_params`` (in
tests/distributed/test_verl_dist.py), the three ``test_group_balanced_partitions*``; plus the
contract verl 0.9.1's ``rearrange_micro_batches`` adds over them, read from its source:
``force_group_size`` (consecutive rows kept in one micro-batch), the count grown until the cap
holds, no agreement without a ``dp_group``. ``test_dataproto_split_uneven`` tests verl's
DataProto, nothing of seqpack's.

Each case runs as ``impl="seqpack"`` always and as ``impl="verl"`` when verl imports (its own
venv: verl pins transformers < 5.11), so an assertion that holds for seqpack but not for verl
shows here as a verl failure, not as a claim.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.interop import verl as drop_in

try:
    from verl.utils import seqlen_balancing as verl_balancing
except ImportError:  # verl is not installed in the main environment
    verl_balancing = None

IMPLS = ["seqpack", pytest.param("verl", marks=pytest.mark.skipif(verl_balancing is None, reason="verl not installed"))]


def module(impl: str) -> Any:
    return drop_in if impl == "seqpack" else verl_balancing


def create_random_mask(input_ids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """verl's ``create_random_mask(max_ratio_of_left_padding=0.1, max_ratio_of_valid_token=0.9,
    min_ratio_of_valid_token=0.5)``: left padding, then 50-90% valid tokens, then right padding."""
    rows, width = input_ids.shape
    mask = torch.zeros(rows, width, dtype=torch.int64)
    for i in range(rows):
        valid = int(torch.randint(int(0.5 * width), int(0.9 * width) + 1, (1,), generator=generator))
        left = int(torch.randint(0, int(0.1 * width) + 1, (1,), generator=generator))
        mask[i, left : left + valid] = 1
    return mask


def make_batch(impl: str, rows: int = 20, width: int = 100, seed: int = 0) -> Any:
    """verl's test batch: a TensorDict for verl (its functions index one), a dict for seqpack."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, 10, (rows, width), generator=g)
    data = {"input_ids": input_ids, "attention_mask": create_random_mask(input_ids, g)}
    if impl == "verl":
        from tensordict import TensorDict

        return TensorDict(data, batch_size=[rows])
    return data


def reverse_idx(order: list[int]) -> list[int]:
    """verl's ``get_reverse_idx``."""
    inverse = list(order)
    for i, idx in enumerate(order):
        inverse[idx] = i
    return inverse


def concat(micro_batches: list[Any], key: str) -> torch.Tensor:
    return torch.cat([mb[key] for mb in micro_batches])


def rows_of(batch: Any) -> int:
    return int(batch["attention_mask"].shape[0])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("seed", range(3))
def test_seqlen_balancing(impl, seed):
    # verl: rearrange 20 x 100 with max_token_len=300, concatenate, put back with the reverse
    # index: the batch again.
    batch = make_batch(impl, seed=seed)
    micro_batches, indices = module(impl).rearrange_micro_batches(batch, max_token_len=300)
    inverse = torch.tensor(reverse_idx(list(itertools.chain.from_iterable(indices))))
    for key in ("input_ids", "attention_mask"):
        torch.testing.assert_close(concat(micro_batches, key)[inverse], batch[key])


@pytest.mark.parametrize("impl", IMPLS)
def test_dynamic_batch(impl):
    # verl: prepare_dynamic_batch + restore_dynamic_batch on input_ids.
    batch = make_batch(impl, seed=11)
    micro_batches, indices = module(impl).rearrange_micro_batches(batch, max_token_len=300)
    flat = concat(micro_batches, "input_ids")
    restored = flat[torch.tensor(reverse_idx(list(itertools.chain.from_iterable(indices))))]
    torch.testing.assert_close(restored, batch["input_ids"])


@pytest.mark.parametrize("impl", IMPLS)
def test_every_micro_batch_within_the_cap(impl):
    # verl 0.9.1 grows the count from ceil(tokens / max_token_len) until every micro-batch
    # holds at most max_token_len real tokens; five rows of 60 with a cap of 100 need five.
    width = 60
    mask = torch.ones(5, width, dtype=torch.int64)
    batch = {"input_ids": torch.arange(5 * width).view(5, width), "attention_mask": mask}
    if impl == "verl":
        from tensordict import TensorDict

        batch = TensorDict(batch, batch_size=[5])
    micro_batches, indices = module(impl).rearrange_micro_batches(batch, max_token_len=100)
    assert len(micro_batches) == 5
    assert all(int(mb["attention_mask"].sum()) <= 100 for mb in micro_batches)


def grouped_batch(impl: str, group_lengths: list[list[int]], width: int) -> Any:
    lengths = [s for group in group_lengths for s in group]
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).to(torch.int64)
    data = {"input_ids": torch.arange(len(lengths))[:, None].expand(-1, width).clone(), "attention_mask": mask}
    if impl == "verl":
        from tensordict import TensorDict

        return TensorDict(data, batch_size=[len(lengths)])
    return data


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("size", [2, 3])
def test_force_group_size_keeps_consecutive_rows_together(impl, size):
    rng = np.random.default_rng(size)
    group_lengths = [rng.integers(10, 60, size=size).tolist() for _ in range(12)]
    batch = grouped_batch(impl, group_lengths, width=64)
    cap = 3 * 60
    micro_batches, indices = module(impl).rearrange_micro_batches(batch, cap, force_group_size=size)
    assert sorted(itertools.chain.from_iterable(indices)) == list(range(12 * size))
    for rows, mb in zip(indices, micro_batches, strict=True):
        assert rows == sorted(rows) and len(rows) % size == 0
        groups = {r // size for r in rows}
        assert sorted(r for g in groups for r in range(g * size, (g + 1) * size)) == rows  # whole groups only
        assert int(mb["attention_mask"].sum()) <= cap
        assert mb["input_ids"][:, 0].tolist() == rows
    assert len(indices) >= -(-sum(map(sum, group_lengths)) // cap)


@pytest.mark.parametrize("impl", IMPLS)
def test_force_group_size_refusals(impl):
    batch = grouped_batch(impl, [[10, 20], [30, 40], [50]], width=64)  # 5 rows
    with pytest.raises(ValueError if impl == "seqpack" else AssertionError, match="divisible by force_group_size 2"):
        module(impl).rearrange_micro_batches(batch, 100, force_group_size=2)
    batch = grouped_batch(impl, [[10, 20], [60, 60]], width=64)  # a pair of 120 tokens
    with pytest.raises(ValueError, match="max_token_len=100"):
        module(impl).rearrange_micro_batches(batch, 100, force_group_size=2)


@pytest.mark.parametrize("impl", IMPLS)
def test_min_num_micro_batch_counts_groups(impl):
    batch = grouped_batch(impl, [[10, 10]] * 4, width=16)
    micro_batches, _ = module(impl).rearrange_micro_batches(batch, 100, min_num_micro_batch=4, force_group_size=2)
    assert len(micro_batches) == 4
    with pytest.raises(ValueError, match="5"):  # five micro-batches of four pairs: one would be empty
        module(impl).rearrange_micro_batches(batch, 100, min_num_micro_batch=5, force_group_size=2)


def test_force_group_size_is_checked():
    batch = grouped_batch("seqpack", [[10, 10]], width=16)
    with pytest.raises(ConfigError, match="force_group_size must be a positive integer, got 0"):
        drop_in.rearrange_micro_batches(batch, 100, force_group_size=0)
    with pytest.raises(SeqpackTypeError, match="force_group_size"):
        drop_in.rearrange_micro_batches(batch, 100, force_group_size=1.5)


def group_cases() -> list[tuple[list[int], list[int], int]]:
    return [
        ([100] * 4 + [200] * 4 + [150] * 4 + [50] * 4, [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4, 2),
        ([100, 200, 150, 50, 300, 250], [0, 1, 2, 3, 4, 5], 2),
        (
            [100, 100, 200, 200, 150, 150, 50, 50, 300, 300, 250, 250, 180, 180, 120, 120],
            [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7],
            4,
        ),
    ]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", range(3))
def test_group_balanced_partitions(impl, case):
    # verl: test_group_balanced_partitions, ..._single_sample_groups, ..._equal_size.
    seqlen_list, uid_list, k = group_cases()[case]
    partitions = module(impl).get_group_balanced_partitions(seqlen_list, uid_list, k_partitions=k)
    assert len(partitions) == k
    assert set(itertools.chain.from_iterable(partitions)) == set(range(len(seqlen_list)))
    for partition in partitions:
        for uid in {uid_list[i] for i in partition}:
            assert all(i in partition for i, u in enumerate(uid_list) if u == uid)


@pytest.mark.skipif(verl_balancing is None, reason="verl not installed")
@pytest.mark.parametrize("seed", range(6))
def test_counts_against_verl(seed):
    # On verl-like batches both take the same count whenever verl's fits: seqpack's is the
    # fewest that fit its own balanced plan, verl's the first its Karmarkar-Karp fits.
    rng = np.random.default_rng(seed)
    rows = int(rng.integers(8, 64))
    lengths = np.clip(rng.lognormal(np.log(600), 0.8, size=rows).astype(np.int64), 16, 2048)
    cap = int(rng.choice([2048, 3072, 4096]))
    mask = (torch.arange(2048)[None, :] < torch.from_numpy(lengths)[:, None]).to(torch.int64)
    ids = torch.zeros(rows, 2048, dtype=torch.int64)
    from tensordict import TensorDict

    ours, ours_ix = drop_in.rearrange_micro_batches({"input_ids": ids, "attention_mask": mask}, cap)
    theirs, theirs_ix = verl_balancing.rearrange_micro_batches(
        TensorDict({"input_ids": ids, "attention_mask": mask}, batch_size=[rows]), cap
    )
    assert max(int(lengths[ix].sum()) for ix in ours_ix) <= cap
    assert max(int(lengths[ix].sum()) for ix in theirs_ix) <= cap  # verl 0.9.1 holds the cap too
    assert len(ours) <= len(theirs)


@pytest.mark.slow
@pytest.mark.skipif(verl_balancing is None, reason="verl not installed")
@pytest.mark.parametrize("mrope", [False, True], ids=["positions", "mrope-positions"])
@pytest.mark.parametrize("impl", IMPLS)
def test_verls_engine_call_site_with_its_no_padding_tensordict(monkeypatch, impl, mrope):
    # verl's engines call rearrange_micro_batches from prepare_micro_batches with the TensorDict
    # of left_right_2_no_padding: jagged nested input_ids and position_ids beside plain tensors
    # and NonTensorData, which the drop-in must select as verl's index_select_tensor_dict does.
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine import utils as engine_utils
    from verl.workers.utils.padding import left_right_2_no_padding

    rows, width, response, cap = 12, 48, 16, 96
    g = torch.Generator().manual_seed(int(mrope))
    mask = create_random_mask(torch.zeros(rows, width), g)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    data = TensorDict(
        {
            "input_ids": torch.randint(0, 100, (rows, width), generator=g),
            "attention_mask": mask,
            "response_mask": mask[:, -response:],
            "position_ids": positions[:, None].expand(-1, 4, -1) + torch.arange(4)[:, None] if mrope else positions,
        },
        batch_size=[rows],
    )
    data = left_right_2_no_padding(data)
    tu.assign_non_tensor_data(data, "max_token_len_per_gpu", cap)
    assert data["input_ids"].is_nested and data["position_ids"].is_nested  # not vacuous: jagged values
    monkeypatch.setattr(engine_utils, "rearrange_micro_batches", module(impl).rearrange_micro_batches)
    micro_batches, indices = engine_utils.prepare_micro_batches(data)
    assert len(micro_batches) > 1 and sorted(itertools.chain.from_iterable(indices)) == list(range(rows))
    whole = {key: data[key].unbind() for key in ("input_ids", "position_ids")}
    for micro_batch, index in zip(micro_batches, indices, strict=True):
        assert isinstance(micro_batch, TensorDict) and micro_batch.batch_size == torch.Size([len(index)])
        assert sum(piece.shape[0] for piece in micro_batch["input_ids"].unbind()) <= cap
        torch.testing.assert_close(micro_batch["loss_mask"], data["loss_mask"][index])
        for key, pieces in whole.items():
            got = micro_batch[key].unbind()
            assert len(got) == len(index) and all(torch.equal(a, pieces[i]) for a, i in zip(got, index, strict=True))
        assert micro_batch["max_seq_len"] == width and micro_batch["max_token_len_per_gpu"] == cap
