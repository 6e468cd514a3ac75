"""``plan_dynamic_cp``: one step's sequences onto CP groups of the DP x CP ranks.

The planner searches one number, the *height* ``H``: the longest a sequence may run alone.
For a given ``H`` (``_rounds.build``):

1. **Sizes.** Every sequence gets the smallest allowed group size that holds it and runs it
   within ``H`` (the fastest size that holds it when none does): long sequences spread over
   as many ranks as they need, and more when that shortens them to ``H``; short ones stay
   on one rank unless even they exceed ``H`` (Megatron dev's dynamic-CP idea).
2. **Group rounds.** Sequences on more than one rank become groups, placed tallest first
   into the first round with enough free ranks (first-fit decreasing height); a round's
   height is its tallest group's time.
3. **Fill.** Sequences on one rank go, longest first, into the bin furthest below its
   *floor* among those with room: the free ranks of the group rounds (floor: the round's
   height, so filling them up to it is free), the room left in the groups themselves, and
   as few new rounds of single ranks as the tokens need (floor 0; one more when the bins
   cannot hold them).

Each plan is then laid out (every round's groups left to right, largest first, which puts
powers of two on aligned blocks) and scored exactly under the sync
(:func:`~seqpack.schedulers.predicted_step_time`; ``_candidate.score``). ``H`` is tried on a grid
of the times the longest sequences take at each allowed size, refined around the best, and
with one or two more rounds at the best; a static-CP plan (every round cut into equal
groups sized for the longest sequence) is also scored, so the result is never worse than it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from seqpack.cost import CostModel, check_cost_model
from seqpack.errors import ConfigError, ScheduleError, SeqpackTypeError
from seqpack.options import MAX_TOKENS, GroupSizes, OnOversize, Sync
from seqpack.schedulers.dynamic_cp._candidate import Bins, Problem, score
from seqpack.schedulers.dynamic_cp._replica import build_replica
from seqpack.schedulers.dynamic_cp._rounds import build, build_static
from seqpack.schedulers.group_sizes import allowed_group_sizes, group_holds
from seqpack.schedulers.request import as_lengths
from seqpack.schedulers.schedule import Schedule
from seqpack.thd import group_padded_lengths
from seqpack.validation import check_choice, check_positive_int

__all__ = ["plan_dynamic_cp"]

_COARSE = 24  # heights tried on the first pass of the search
_FINE = 12  # heights tried between the best coarse height's neighbours
_TOP = 64  # the longest sequences whose times make the grid (all that need a group too)


def _height_grid(p: Problem, top_n: int | None = None) -> np.ndarray:
    """Heights worth trying: the times of the longest sequences (``top_n`` of them: by
    default ``_TOP`` and all that need a group) alone at every power-of-2 size (and R) that
    holds them, ascending."""
    if p.lengths.shape[0] == 0:
        return np.zeros(0, dtype=np.float64)
    need_group = int(np.count_nonzero(group_padded_lengths(p.lengths, 1, p.pad_multiple) > p.capacity))
    top = p.lengths[: max(_TOP, need_group) if top_n is None else top_n]
    sizes = p.sizes[((p.sizes & (p.sizes - 1)) == 0) | (p.sizes == p.num_ranks)]
    out = []
    k, a, b, step, token, inter = (float(v) for v in p.coef)
    for c in sizes.tolist():
        padded = group_padded_lengths(top, c, p.pad_multiple)
        s = padded[padded <= c * p.capacity].astype(np.float64)
        ring = (c - 1) * (step + (inter if c > p.ranks_per_node else token) * s / c) if c > 1 else 0.0
        out.append(k + (a * s + b * s * s) / c + ring)
    return np.unique(np.concatenate(out))


def _search_heights(p: Problem, replica: bool = False, coarse_n: int = _COARSE, fine_n: int = _FINE) -> Bins:
    """The best plan over the height grid (coarse, then refined around the best), then
    at the best height without widening and with one or two more rounds (replica: one
    fewer or one more), then at the longest sequence's time on each size; ties keep the
    first found."""
    tried: dict[tuple[float, int, bool], Bins] = {}

    builder = build_replica if replica else build

    def attempt(height: float, more: int = 0, widen: bool = True) -> Bins:
        if (height, more, widen) not in tried:
            tried[(height, more, widen)] = score(p, builder(p, height, more, widen))
        return tried[(height, more, widen)]

    grid = _height_grid(p)
    picks = np.unique(np.linspace(0, grid.shape[0] - 1, min(coarse_n, grid.shape[0])).round().astype(np.int64))
    coarse = [*grid[picks].tolist(), math.inf]
    best_i = min(range(len(coarse)), key=lambda i: (attempt(coarse[i]).score, i))
    lo = int(picks[best_i - 1]) + 1 if best_i > 0 else 0
    hi = int(picks[best_i + 1]) if best_i + 1 < picks.shape[0] else grid.shape[0]
    between = grid[lo:hi]
    spots = np.linspace(0, between.shape[0] - 1, min(fine_n, between.shape[0])).round().astype(np.int64)
    best_h = min([coarse[best_i], *between[np.unique(spots)].tolist()], key=lambda h: attempt(h).score)
    best = attempt(best_h)
    widen = replica or attempt(best_h, widen=False).score >= best.score
    best = attempt(best_h, widen=widen)
    for more in (-1, 1) if replica else (1, 2):
        candidate = attempt(best_h, more, widen)
        if candidate.score < best.score:
            best = candidate
        elif not replica:
            break
    if replica == (p.sync == Sync.REPLICA):  # the longest sequence's time at each size (the grid's
        # picks can miss the best there); only in the builder made for the sync
        for height in _height_grid(p, top_n=1).tolist():
            if height >= best.score:
                continue
            for more in (0, -1) if replica else (0,):
                candidate = attempt(height, more)
                best = candidate if candidate.score < best.score else best
    return best


def _search(p: Problem) -> Bins:
    """The best of the height search, the same search with power-of-2 sizes only (when any
    size is allowed: every such plan is one too) and static CP."""
    best = _search_heights(p)
    if p.sync == Sync.REPLICA:
        coarse = _COARSE // 2 - 2  # the anchors cost time: two fewer even picks
        candidate = _search_heights(p, replica=True, coarse_n=coarse, fine_n=_FINE // 2)
        best = candidate if candidate.score < best.score else best
    if p.in_nodes:
        pow2 = p.sizes[((p.sizes & (p.sizes - 1)) == 0) | (p.sizes == p.num_ranks)]
        candidate = _search_heights(dataclasses.replace(p, sizes=pow2))
        best = candidate if candidate.score < best.score else best
    static = score(p, build_static(p))
    return static if static.score < best.score else best


def _apply_oversize(
    lengths: np.ndarray, sizes: np.ndarray, capacity: int, pad_multiple: int, on_oversize: OnOversize
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lengths to pack with, dropped ids, truncated ids) for sequences longer than the
    largest group holds."""
    multiple = np.where(sizes > 1, 2 * sizes * pad_multiple, pad_multiple)
    holds = group_holds(sizes, capacity, pad_multiple)
    fits = int(holds.max())
    if fits < 1:
        raise ConfigError(f"max_tokens_per_rank={capacity} is smaller than pad_multiple={pad_multiple}: nothing fits")
    over = np.flatnonzero(lengths > fits)
    effective, none = lengths.copy(), np.zeros(0, dtype=np.int64)
    if over.size == 0:
        return effective, none, none
    if on_oversize == OnOversize.ERROR:
        i, ranks = int(over[0]), int(sizes[-1])
        raise ScheduleError(
            f"sample {i} has {int(lengths[i])} tokens, more than one sequence may hold on all {ranks} ranks "
            f"together: {ranks} x max_tokens_per_rank={capacity} = {ranks * capacity} tokens, at most {fits} once "
            f"padded to a multiple of {int(multiple[np.argmax(holds)])}; {over.size} sample(s) are too long. "
            "Raise max_tokens_per_rank or use more ranks, or pass on_oversize='truncate' or 'drop'"
        )
    if on_oversize == OnOversize.DROP:
        effective[over] = 0
        return effective, over.astype(np.int64), none
    effective[over] = fits
    return effective, none, over.astype(np.int64)


def _to_plan(p: Problem, bins: Bins, **fields: object) -> Schedule:
    """The scored candidate as a plan: groups by (round run order, first rank), ids in pack
    order (longest first)."""
    assert bins.start is not None and bins.run_round is not None
    nb = bins.size.shape[0]
    g_order = np.lexsort((bins.start, bins.run_round))
    group_of_bin = np.empty(nb, dtype=np.int64)
    group_of_bin[g_order] = np.arange(nb, dtype=np.int64)
    positions = np.flatnonzero(bins.seq_bin >= 0)
    group = group_of_bin[bins.seq_bin[positions]]
    packed = np.lexsort((positions, group))
    return Schedule(
        num_microbatches=int(bins.run_round.max()) + 1 if nb else 0,
        group_round=bins.run_round[g_order],
        group_start=bins.start[g_order],
        group_size=bins.size[g_order],
        group_counts=np.bincount(group, minlength=nb).astype(np.int64),
        assigned=p.ids[positions[packed]],
        **fields,  # type: ignore[arg-type]
    )


def plan_dynamic_cp(
    lengths: Sequence[int] | np.ndarray,
    *,
    dp_size: int,
    cp_size: int = 1,
    max_tokens_per_rank: int,
    pad_multiple: int = 1,
    cost: CostModel,
    sync: str = "lockstep",
    group_sizes: str = "pow2",
    on_oversize: str = "error",
) -> Schedule:
    """Plan one step with dynamic context parallelism: per microbatch round, the
    ``dp_size * cp_size`` ranks split into CP groups, each running one packed microbatch.

    Pure and deterministic (same input, same plan, on every rank). Every sequence that fits
    on all ranks together is scheduled; capacity per rank is never exceeded.

    Args:
        lengths: int64 ``[N]`` real lengths in global order.
        dp_size, cp_size: The DP x CP mesh whose ``R = dp_size * cp_size`` ranks are planned.
        max_tokens_per_rank: Padded tokens one rank may hold in one microbatch.
        pad_multiple: Padding of a sequence alone on a rank (groups pad to ``2c`` times it).
        cost: The cost of a microbatch on its group (a model without ``reference_size`` is
            the cost on a group of ``cp_size`` ranks; without ring terms, CP groups look free).
        sync: ``"lockstep"`` (FSDP) or ``"replica"`` (DDP): the step time minimised.
        group_sizes: ``"pow2"`` (aligned powers of two, and all R) or ``"any"``.
        on_oversize: ``"error"``, ``"truncate"`` or ``"drop"`` for a sequence longer than
            one sequence may hold on all ranks.

    Raises:
        ScheduleError: An oversize sequence under ``on_oversize="error"``.
        ConfigError, SeqpackTypeError, SampleError: Bad arguments or lengths.
    """
    original = as_lengths(lengths)
    dp_size = check_positive_int("dp_size", dp_size)
    cp_size = check_positive_int("cp_size", cp_size)
    capacity = check_positive_int("max_tokens_per_rank", max_tokens_per_rank)
    pad_multiple = check_positive_int("pad_multiple", pad_multiple)
    mode, policy = check_choice("sync", sync, Sync), check_choice("on_oversize", on_oversize, OnOversize)
    sizes_mode = check_choice("group_sizes", group_sizes, GroupSizes)
    if sizes_mode == GroupSizes.STATIC:
        raise ConfigError("plan_dynamic_cp takes group_sizes='pow2' or 'any': static plans are the other schedulers'")
    if check_cost_model("cost", cost) is None:
        raise SeqpackTypeError("cost must be a seqpack.CostModel, got None")
    ranks = dp_size * cp_size
    if ranks * capacity > MAX_TOKENS:
        raise ConfigError(f"{ranks} ranks x max_tokens_per_rank={capacity} tokens is too large (at most 2**53)")
    sizes = allowed_group_sizes(ranks, sizes_mode)
    effective, dropped, truncated = _apply_oversize(original, sizes, capacity, pad_multiple, policy)
    active = np.flatnonzero(effective > 0)
    active = active[np.lexsort((active, -effective[active]))]
    p = Problem(
        active,
        effective[active],
        sizes,
        cost.group_coefficients(cp_size),
        cost.ranks_per_node,
        ranks,
        capacity,
        pad_multiple,
        mode,
        in_nodes=sizes_mode == GroupSizes.ANY,
    )
    best = _search(p)
    return _to_plan(
        p,
        best,
        lengths=effective,
        original_lengths=original,
        dp_size=dp_size,
        cp_size=cp_size,
        max_tokens_per_rank=capacity,
        pad_multiple=pad_multiple,
        group_sizes=sizes_mode,
        dropped=dropped,
        truncated=truncated,
    )
