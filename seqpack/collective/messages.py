"""The three outcomes of a step as they travel between ranks: :class:`StepOk`,
:class:`StepEnd`, :class:`StepError` (encoded by :mod:`seqpack.collective.wire`)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from seqpack.collective.agree import Status
from seqpack.schedulers import Schedule
from seqpack.thd import PackedBatch

__all__ = ["StepEnd", "StepError", "StepMessage", "StepOk"]


@dataclasses.dataclass(frozen=True)
class StepOk:
    """A step's schedule and this CP rank's microbatches (token fields ``None`` for layout)."""

    step: int
    schedule: Schedule
    microbatches: list[PackedBatch]
    empty_samples: int = 0  # zero-length samples dropped this step (global)
    position_ids: bool = False  # samples carried their own position_ids (sent on the wire)
    num_loss_tokens: int | None = None  # supervised tokens of the global step (every microbatch's count set too)
    group_starts: tuple[int, ...] | None = None  # dynamic CP: plane rank each microbatch's CP group starts at
    minibatch_bounds: tuple[int, ...] | None = None  # k + 1 microbatch offsets of the mini-batches (None: one)
    minibatch_loss_tokens: tuple[int, ...] | None = None  # supervised tokens of each mini-batch (when counted)
    empty_at: tuple[int, ...] = ()  # this DP rank's zero-length sequences: pool index of each (Step.to_origin)
    status: ClassVar[Status] = Status.OK

    @property
    def fingerprint(self) -> int:
        return self.schedule.fingerprint()


@dataclasses.dataclass(frozen=True)
class StepEnd:
    """End of data: no step; ``dropped_at_end`` sequences of a partial last step were dropped."""

    step: int
    dropped_at_end: int = 0
    empty_samples: int = 0
    status: ClassVar[Status] = Status.END


@dataclasses.dataclass(frozen=True)
class StepError:
    """A step failed; ``rank`` is the global rank where it failed (``None``: no single one)."""

    step: int
    message: str
    rank: int | None = None
    status: ClassVar[Status] = Status.ERROR


StepMessage = StepOk | StepEnd | StepError
