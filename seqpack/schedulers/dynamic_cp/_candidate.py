"""A candidate plan while the planner builds it: the step in planning order (``Problem``)
and its microbatches ("bins", one group each) with where every sequence went (``Bins``);
``score`` lays a candidate out and predicts its step time exactly."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from seqpack.options import Sync
from seqpack.schedulers import _kernels


@dataclasses.dataclass(frozen=True)
class Problem:
    """One step, in planning order (longest first, ties by id)."""

    ids: np.ndarray
    lengths: np.ndarray
    sizes: np.ndarray
    coef: np.ndarray
    ranks_per_node: int
    num_ranks: int
    capacity: int
    pad_multiple: int
    sync: Sync
    in_nodes: bool  # lay groups smaller than a node inside one (any size); else plainly (aligned powers of 2)

    @property
    def pow2_sizes(self) -> np.ndarray:
        """The allowed sizes that are powers of two, and ``num_ranks``."""
        return self.sizes[((self.sizes & (self.sizes - 1)) == 0) | (self.sizes == self.num_ranks)]


@dataclasses.dataclass
class Bins:
    """A candidate plan: its bins (microbatches of one group each) and where each sequence
    (by planning position) went."""

    size: np.ndarray
    round: np.ndarray
    room: np.ndarray
    load: np.ndarray
    floor: np.ndarray
    tokens: np.ndarray
    s: np.ndarray
    ss: np.ndarray
    seq_bin: np.ndarray
    score: float = math.inf
    start: np.ndarray | None = None
    run_round: np.ndarray | None = None

    @classmethod
    def empty(cls, n: int) -> Bins:
        z, f = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        return cls(z, z, z, f, f, z, f, f, np.full(n, -1, dtype=np.int64))

    @property
    def fill_arrays(self) -> tuple[np.ndarray, ...]:
        """The bin arrays the fill kernel (``cp_planner.lpt``) reads and updates, in its order."""
        return self.size, self.room, self.load, self.floor, self.tokens, self.s, self.ss

    def extend(
        self,
        size: np.ndarray | int,
        round_: np.ndarray,
        *,
        room: np.ndarray | int = 0,
        load: np.ndarray | float = 0.0,
        floor: np.ndarray | float = 0.0,
        tokens: np.ndarray | int = 0,
        s: np.ndarray | float = 0.0,
        ss: np.ndarray | float = 0.0,
    ) -> None:
        """Append one bin per entry of ``round_`` (a scalar field: the same for every new bin)."""
        for name, value in zip(
            ("size", "round", "room", "load", "floor", "tokens", "s", "ss"),
            (size, round_, room, load, floor, tokens, s, ss),
            strict=True,
        ):
            old = getattr(self, name)
            new = np.broadcast_to(np.asarray(value, dtype=old.dtype), round_.shape)
            setattr(self, name, np.concatenate([old, new]))


def score(p: Problem, bins: Bins) -> Bins:
    """Lay the candidate out and order its rounds heaviest first (unless the builder fixed
    both), then score it exactly."""
    nb = bins.size.shape[0]
    if bins.start is None:
        order = np.lexsort((np.arange(nb), -bins.size, bins.round))
        if p.in_nodes:
            bins.start = _kernels.cp_planner.layout_in_nodes(
                order, bins.round, bins.size, p.ranks_per_node, p.num_ranks
            )
        else:
            bins.start = _kernels.cp_planner.layout(order, bins.round, bins.size)
    start = bins.start
    count = np.bincount(bins.seq_bin[bins.seq_bin >= 0], minlength=nb)
    idle = float(p.coef[0])  # an idle group runs a padding-only filler under either sync
    times = _kernels.cp_planner.bin_times(bins.size, start, count, bins.s, bins.ss, p.coef, p.ranks_per_node, idle)
    rounds = int(bins.round.max()) + 1 if nb else 0
    heights = np.full(rounds, -np.inf)
    np.maximum.at(heights, bins.round, times)
    if bins.run_round is None:
        run_order = np.lexsort((np.arange(rounds), -heights))
        run_round = np.empty(rounds, dtype=np.int64)
        run_round[run_order] = np.arange(rounds, dtype=np.int64)
        bins.run_round = run_round[bins.round]
    if p.sync == Sync.LOCKSTEP:
        bins.score = float(heights.sum())
    else:
        by_run = np.lexsort((start, bins.run_round))
        bins.score = float(_kernels.cp_planner.replica_finish(by_run, start, bins.size, times, p.num_ranks))
    return bins
