"""The mini-batches of a step on the wire (:mod:`seqpack.collective.wire`): every
microbatch row names its mini-batch and that mini-batch's loss-token count
(``StepOk.minibatch_bounds``, ``minibatch_loss_tokens``; ``PackingConfig.minibatches``)."""

from __future__ import annotations

import numpy as np

from seqpack.collective.messages import StepOk
from seqpack.errors import WireError

__all__ = ["decode_minibatches", "minibatch_rows"]


def minibatch_rows(msg: StepOk) -> tuple[list[int], list[int]]:
    """Each microbatch's mini-batch and that mini-batch's loss-token count (0 uncounted).

    Raises:
        WireError: Bounds that do not run from 0 to the microbatch count, or counts that do
            not match them.
    """
    m = len(msg.microbatches)
    bounds = list(msg.minibatch_bounds or (0, m))
    if bounds[0] != 0 or bounds[-1] != m or any(b < a for a, b in zip(bounds[:-1], bounds[1:], strict=False)):
        raise WireError(f"minibatch_bounds {bounds} do not rise from 0 to the {m} microbatches")
    counts = msg.minibatch_loss_tokens
    if counts is None:
        counts = (msg.num_loss_tokens or 0,) * (len(bounds) - 1)
    if len(counts) != len(bounds) - 1:
        raise WireError(f"{len(counts)} minibatch_loss_tokens for {len(bounds) - 1} mini-batches")
    which = [j for j in range(len(bounds) - 1) for _ in range(bounds[j], bounds[j + 1])]
    counted = msg.num_loss_tokens is not None
    return which, [int(counts[j]) if counted else 0 for j in which]


def decode_minibatches(per_mb: np.ndarray, counted: bool) -> dict[str, tuple[int, ...]]:
    """``StepOk``'s mini-batch fields from the microbatch rows (none with one mini-batch).

    Raises:
        WireError: Mini-batch numbers that do not run 0, 1, ... in order, or one mini-batch
            with two counts or a negative one.
    """
    which = per_mb["minibatch"].astype(np.int64)
    if not which.size or not which.any():
        return {}
    steps = np.diff(which)
    if which[0] != 0 or np.any((steps != 0) & (steps != 1)):
        raise WireError(f"microbatch mini-batches {which.tolist()} do not run 0, 1, ... in order")
    bounds = (0, *(np.flatnonzero(steps) + 1).tolist(), int(which.shape[0]))
    out: dict[str, tuple[int, ...]] = {"minibatch_bounds": tuple(int(b) for b in bounds)}
    if counted:
        counts = per_mb["minibatch_loss_tokens"].astype(np.int64)
        firsts = counts[list(bounds[:-1])]
        if np.any(counts != np.repeat(firsts, np.diff(bounds))) or np.any(firsts < 0):
            raise WireError(f"microbatch mini-batch counts {counts.tolist()} differ in one mini-batch or are negative")
        out["minibatch_loss_tokens"] = tuple(int(c) for c in firsts)
    return out
