"""The per-step machinery: from a data iterator to packed, scheduled, CP-sharded steps.

Entry points: :func:`wrap_data_iterator`, :class:`PackingIterator`, :class:`PackingConfig`,
:class:`Step`. Modules, in the order a step runs through them: ``config``, ``iterator``
(``next()``; ``prefetch`` runs it ahead on a thread), ``producer`` (one step on every rank),
``phases`` (read, gather, schedule), ``cp_mode`` (exchange and pack, static or dynamic CP),
``step`` (the hand-over), ``resume``; beside them ``construction`` (the constructor's checks),
``calibration`` (calibration as data), ``labels``, ``grouping``, ``gather_fields``,
``sample_cost``, ``vision_payload``, ``encoder_option`` and ``origin`` (``Step.to_origin``).
"""

from __future__ import annotations

from seqpack.loader.config import PackingConfig
from seqpack.loader.iterator import PackingIterator, wrap_data_iterator
from seqpack.loader.resume import ResumeState
from seqpack.loader.step import Step

__all__ = ["PackingConfig", "PackingIterator", "ResumeState", "Step", "wrap_data_iterator"]
