"""``plan_dynamic_cp``: one step's sequences onto CP groups of the DP x CP ranks, the best of
candidates (``_rounds``) over the *height* ``H``, the longest a sequence may run alone, and of
static CP's, each scored exactly (docs/dynamic_cp.md, "The planner").
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from seqpack.errors import ConfigError, SeqpackTypeError
from seqpack.options import GroupSizes, Sync
from seqpack.schedulers.dynamic_cp import _rounds
from seqpack.schedulers.dynamic_cp._rounds import Bins, Problem, score
from seqpack.schedulers.group_sizes import allowed_group_sizes, dynamic_group_sizes, group_holds
from seqpack.schedulers.request import Request, apply_oversize, check_capacity
from seqpack.schedulers.schedule import Schedule
from seqpack.schedulers.shape_limits import refuse_dynamic
from seqpack.thd import group_pad_multiple, group_padded_lengths

__all__ = ["plan_dynamic_cp"]

_COARSE = 24  # heights tried on the first pass of the search (the replica builder: 10)
_FINE = 12  # heights tried between the best coarse height's neighbours (the replica builder: 6)
_TOP = 64  # the longest sequences whose times make the grid (all that need a group too)


def _height_grid(p: Problem, top_n: int | None = None) -> np.ndarray:
    """Ascending: the times alone of the ``top_n`` longest sequences (default: ``_TOP`` and
    all that need a group) at every size of ``pow2_sizes`` that holds them."""
    need_group = int(np.count_nonzero(group_padded_lengths(p.lengths, 1, p.pad_multiple) > p.capacity))
    top = p.lengths[: max(_TOP, need_group) if top_n is None else top_n]
    out = []
    k, a, b, step, token, inter = (float(v) for v in p.coef)
    for c in p.pow2_sizes.tolist():
        padded = group_padded_lengths(top, c, p.pad_multiple)
        s = padded[padded <= c * p.capacity].astype(np.float64)
        ring = (c - 1) * (step + (inter if c > p.ranks_per_node else token) * s / c) if c > 1 else 0.0
        out.append(k + (a * s + b * s * s) / c + ring)
    return np.unique(np.concatenate(out))


def _search_heights(p: Problem, replica: bool = False) -> Bins:
    """The best candidate of the height search (docs/dynamic_cp.md, step 5); ties: the first found."""
    tried: dict[tuple[float, int, bool], Bins] = {}

    def attempt(height: float, more: int = 0, widen: bool = True) -> Bins:
        if (height, more, widen) not in tried:
            built = _rounds.build_replica(p, height, more) if replica else _rounds.build(p, height, more, widen)
            tried[(height, more, widen)] = score(p, built)
        return tried[(height, more, widen)]

    grid = _height_grid(p)
    coarse_n, fine_n = (_COARSE // 2 - 2, _FINE // 2) if replica else (_COARSE, _FINE)
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
    if replica == (p.sync == Sync.REPLICA):  # the longest sequence's time on each size, for the sync's builder
        for height in _height_grid(p, top_n=1).tolist():
            if height >= best.score:
                continue
            for more in (0, -1) if replica else (0,):
                best = min(best, attempt(height, more), key=lambda bins: bins.score)
    return best


def _search(p: Problem) -> Bins:
    """The best of the height searches and the static-CP candidates (docs/dynamic_cp.md, step 5)."""
    candidates = [_search_heights(p)]
    if p.sync == Sync.REPLICA:
        candidates.append(_search_heights(p, replica=True))
    if p.in_nodes:
        candidates.append(_search_heights(dataclasses.replace(p, sizes=p.pow2_sizes)))
    candidates.append(score(p, _rounds.build_static(p)))
    if p.sync == Sync.REPLICA:  # static CP as ``balanced`` plans it: replica-first beats the fill above
        candidates.extend(score(p, bins) for bins in _rounds.build_balanced(p))
    return min(candidates, key=lambda bins: bins.score)  # ties: the first


def _to_plan(p: Problem, bins: Bins, request: Request, oversize: tuple[np.ndarray, ...]) -> Schedule:
    """The scored candidate as a plan of ``request`` (``apply_oversize``'s ``oversize``): groups
    by (run order, first rank), ids longest first."""
    assert bins.start is not None and bins.run_round is not None
    nb = bins.size.shape[0]
    g_order = np.lexsort((bins.start, bins.run_round))
    positions = np.flatnonzero(bins.seq_bin >= 0)
    group = np.argsort(g_order)[bins.seq_bin[positions]]  # each placed sequence's group
    packed = np.lexsort((positions, group))
    effective, dropped, truncated = oversize
    return Schedule(
        num_microbatches=int(bins.run_round.max()) + 1 if nb else 0,
        group_round=bins.run_round[g_order],
        group_start=bins.start[g_order],
        group_size=bins.size[g_order],
        group_counts=np.bincount(group, minlength=nb).astype(np.int64),
        assigned=p.ids[positions[packed]],
        lengths=effective,
        original_lengths=request.lengths,
        dp_size=request.dp_size,
        cp_size=request.cp_size,
        max_tokens_per_rank=p.capacity,
        pad_multiple=p.pad_multiple,
        group_sizes=GroupSizes.ANY if p.in_nodes else GroupSizes.POW2,
        dropped=dropped,
        truncated=truncated,
        origin=request.origin,
    )


def plan_dynamic_cp(request: Request, *, group_sizes: str | GroupSizes = GroupSizes.POW2) -> Schedule:
    """Plan one step with dynamic context parallelism (docs/dynamic_cp.md): per microbatch
    round the ``dp_size * cp_size`` ranks split into CP groups, each running one packed
    microbatch. Pure and deterministic; a sequence longer than the largest group holds goes
    by ``on_oversize``.

    Args:
        request: The checked step (:meth:`Request.of <seqpack.schedulers.request.Request.of>`);
            ``cost``, required, is a microbatch's cost on its group; ``bytes_per_token`` is
            not used.
        group_sizes: ``"pow2"`` (aligned powers of two, and all R) or ``"any"``.

    Raises:
        ScheduleError: An oversize sequence under ``on_oversize="error"``.
        ConfigError: ``group_sizes`` not ``"pow2"`` or ``"any"``, ``static_shapes`` given,
            a nonzero ``sample_cost``, a capacity nothing fits or past 2**53 over all ranks.
        SeqpackTypeError: ``request.cost`` None.
    """
    sizes_mode = dynamic_group_sizes(group_sizes, "plan_dynamic_cp")
    refuse_dynamic(request.static_shapes, "scheduler 'dynamic_cp'")
    if request.sample_cost is not None and request.sample_cost.any():
        i = int(request.sample_cost.nonzero()[0][0])
        raise ConfigError(
            f"scheduler 'dynamic_cp' does not plan a sample_cost (sample {i}'s is {float(request.sample_cost[i])!r}): "
            "balance it with a static-CP scheduler ('balanced')"
        )
    cost = request.cost
    if cost is None:
        raise SeqpackTypeError("cost must be a seqpack.CostModel, got None")
    ranks, capacity = request.dp_size * request.cp_size, request.max_tokens_per_rank
    check_capacity(ranks * capacity, ranks, "dp_size*cp_size")
    sizes = allowed_group_sizes(ranks, sizes_mode)
    holds = group_holds(sizes, capacity, request.pad_multiple)
    largest = int(np.argmax(holds))
    effective, dropped, truncated = apply_oversize(
        request.lengths,
        request.on_oversize,
        fits=int(holds[largest]),
        multiple=group_pad_multiple(int(sizes[largest]), request.pad_multiple),
        limit=f"one sequence may hold on all {ranks} ranks together: {ranks} x max_tokens_per_rank={capacity} = "
        f"{ranks * capacity} tokens",
        remedy="max_tokens_per_rank or use more ranks",
    )
    active = np.flatnonzero(effective > 0)
    active = active[np.lexsort((active, -effective[active]))]
    p = Problem(
        active,
        effective[active],
        sizes,
        cost.group_coefficients(request.cp_size),
        cost.ranks_per_node,
        ranks,
        capacity,
        request.pad_multiple,
        request.sync,
        in_nodes=sizes_mode == GroupSizes.ANY,
    )
    return _to_plan(p, _search(p), request, (effective, dropped, truncated))
