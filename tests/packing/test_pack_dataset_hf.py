"""Packed rows in Hugging Face's and TRL's hands, on a tiny Llama built from a config (no
download): what docs/packing.md says to pass gives every document its own loss."""

from __future__ import annotations

import pathlib

import pytest
import torch

import seqpack

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "packing.md"


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def documents():
    g = torch.Generator().manual_seed(1)
    return [{"input_ids": torch.randint(1, 64, (n,), generator=g).tolist()} for n in (7, 5, 9)]


def _per_document_loss(model, documents):
    """The loss of every document on its own, weighted by its targets (what packing must give)."""
    total = targets = 0.0
    for doc in documents:
        ids = torch.tensor([doc["input_ids"]])
        total += float(model(input_ids=ids, labels=ids).loss) * (ids.shape[1] - 1)
        targets += ids.shape[1] - 1
    return total / targets


@torch.no_grad()
def test_packed_rows_give_each_document_its_loss_with_what_the_docs_say_to_pass(model, documents):
    text = DOC.read_text()
    assert "use_cache=False" in text and 'label_format="unshifted"' in text
    want = _per_document_loss(model, documents)
    (row,) = seqpack.pack_dataset(documents, 32, label_format="unshifted")
    inputs = dict(input_ids=row["input_ids"][None], position_ids=row["position_ids"][None], labels=row["labels"][None])
    assert float(model(**inputs, use_cache=False).loss) == pytest.approx(want, abs=1e-5)
    # Without use_cache=False the model builds a cache, reads no document boundary from
    # position_ids, and every token attends to the documents before it in the row.
    assert abs(float(model(**inputs).loss) - want) > 1e-4
    # Next-token ("shifted") labels are shifted once more by the model: a token two ahead.
    (shifted,) = seqpack.pack_dataset(documents, 32)
    loss = float(model(**{**inputs, "labels": shifted["labels"][None]}, use_cache=False).loss)
    assert abs(loss - want) > 1e-3


@torch.no_grad()
def test_trls_padding_free_collator_reads_the_documents_from_seq_lengths(model, documents):
    datasets = pytest.importorskip("datasets")
    collator_type = pytest.importorskip("trl.trainer.sft_trainer").DataCollatorForLanguageModeling
    packed = seqpack.pack_dataset(datasets.Dataset.from_list(documents * 2), 24, label_format="unshifted")
    # SFTTrainer keeps these columns of a prepared dataset (its signature columns) and drops the rest.
    rows = list(packed.select_columns(["input_ids", "labels", "seq_lengths"]))
    batch = collator_type(pad_token_id=0, padding_free=True)(rows)
    assert batch["position_ids"][0].tolist() == [p for r in packed["position_ids"] for p in r]
    assert batch["labels"][0].tolist() == [t for r in packed["labels"] for t in r]
    assert batch["cu_seq_lens_q"].shape[0] == 2 * len(documents) + 1  # every document, not one per packed row
    loss = float(model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], labels=batch["labels"],
                       use_cache=False).loss)  # fmt: skip
    assert loss == pytest.approx(_per_document_loss(model, documents), abs=1e-5)
