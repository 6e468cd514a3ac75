"""The per-step machinery: from a data iterator to packed, scheduled, CP-sharded steps.

Entry points: :func:`wrap_data_iterator`, :class:`PackingIterator`, :class:`PackingConfig`,
:class:`Step`. Modules, in the order a step runs through them:

- :mod:`~seqpack.loader.config`: :class:`PackingConfig` (frozen, validated, fingerprinted).
- :mod:`~seqpack.loader.phases`: the phases of one step on a rank that reads data (read,
  gather lengths, schedule, exchange, pack + CP shard), each a short function.
- :mod:`~seqpack.loader.cp_mode`: the exchange and pack phases behind one interface, the CP
  mode chosen once per iterator: static CP (phases 4-5) or dynamic CP (shard exchange over
  the plane, per-round packing with each microbatch's CP group).
- :mod:`~seqpack.loader.grouping`: the ``group_id`` sample field (read beside the tokens,
  carried in the gather; groups then stay on one replica).
- :mod:`~seqpack.loader.labels`: labels where samples are read (``label_format`` checked and
  brought to next-token targets) and the per-sequence loss-token counts that ride the gather.
- :mod:`~seqpack.loader.calibration`: online calibration as data: what a step takes in (the
  model to plan with, the time words that ride the gather) and gives back (the combined
  times, absorbed once between steps).
- :mod:`~seqpack.loader.producer`: :class:`~seqpack.loader.producer.StepProducer` runs one step on every rank (phases,
  agreements, TP/PP broadcast, stats) and never raises.
- :mod:`~seqpack.loader.prefetch`: the background thread that runs the producer ahead.
- :mod:`~seqpack.loader.step`: :class:`Step`, what ``next()`` hands over, and the hand-over
  itself (the prepared step, its resume bookkeeping, the device copy).
- :mod:`~seqpack.loader.resume`: :class:`ResumeState`, the versioned resume state.
- :mod:`~seqpack.loader.construction`: what the constructor checks and agrees on besides the
  config (iterator ownership, a topology over part of the job, the settings compared under
  ``validate_ranks=False``, the prefetch flag, ``wrapper_groups``, a one-rank topology).
- :mod:`~seqpack.loader.iterator`: :class:`PackingIterator` (a thin iterator over the
  producer) and :func:`wrap_data_iterator`.
"""

from __future__ import annotations

from seqpack.loader.config import PackingConfig
from seqpack.loader.iterator import PackingIterator, wrap_data_iterator
from seqpack.loader.resume import ResumeState
from seqpack.loader.step import Step

__all__ = ["PackingConfig", "PackingIterator", "ResumeState", "Step", "wrap_data_iterator"]
