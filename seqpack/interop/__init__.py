"""Adapters to other frameworks' batch formats.

Modules:
    nemo: NeMo Automodel's BSHD packed batches to THD (:func:`process_input_for_thd`,
        :func:`split_batch_into_thd_chunks`), its contract kept.
    hf: Hugging Face transformers: :func:`to_hf`, a packed microbatch as the keyword
        arguments of a causal LM's ``forward``, and ``SeqpackTrainerMixin``, one seqpack step
        per optimizer step of a ``Trainer`` / TRL ``SFTTrainer`` (transformers itself is not
        imported).
    hf_rows: what the Trainer mixin needs no trainer for: a ``Trainer``'s training rows (HF
        labels, TRL's ``completion_mask`` / ``assistant_masks``) as seqpack samples, the loader
        of steps the Trainer iterates, the mixin's ``PackingConfig``.
    verl: drop-ins for verl 0.9.1's ``rearrange_micro_batches``,
        ``get_seqlen_balanced_partitions`` and ``get_group_balanced_partitions``, planned by
        seqpack's scheduler, never over ``max_token_len`` (import them from
        ``seqpack.interop.verl``).
    verl_batch: a verl batch's rows (real tokens, row checks, selection), TensorDicts included.
    torchtitan: torchtitan 0.3's ``ParallelDims`` as a ``Topology`` and a dataloader feeding
        its ``Trainer`` one seqpack step per optimizer step (``seqpack.interop.torchtitan``).
    megatron: seqpack's scheduler behind Megatron-LM's own ``wrap_data_iterator``
        (:func:`install`; importing it needs Megatron-LM).
    megatron_plan: its pure part (Megatron's groups planned by seqpack, the checks, the cost
        model from a ``TransformerConfig``), no Megatron import.
"""

from __future__ import annotations

from seqpack.interop.hf import to_hf
from seqpack.interop.nemo import process_input_for_thd, split_batch_into_thd_chunks

__all__ = ["process_input_for_thd", "split_batch_into_thd_chunks", "to_hf"]
