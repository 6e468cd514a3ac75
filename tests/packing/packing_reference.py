"""Slow, obvious twins of seqpack.packing's kernel: plain lists and sorted sizes, no trees."""

from __future__ import annotations

import bisect
from collections import Counter


def pack_sizes_reference(lengths: list[int], max_tokens: int) -> list[int]:
    """The pack of each length, by the rules of seqpack.packing._kernel (its docstring),
    written as plainly as they read."""
    left = Counter(lengths)
    sizes = sorted(left)  # distinct lengths still left, ascending

    def take(size: int) -> None:
        left[size] -= 1
        if left[size] == 0:
            sizes.remove(size)

    def largest_at_most(x: int) -> int | None:
        i = bisect.bisect_right(sizes, x)
        return sizes[i - 1] if i else None

    entries: list[tuple[int, int]] = []  # (length, pack), in the order lengths are taken
    room_of: list[int] = []
    for size in sorted((x for x in lengths if 2 * x > max_tokens), reverse=True):
        take(size)
        entries.append((size, len(room_of)))
        room_of.append(max_tokens - size)
    big = len(room_of)
    p = 0
    while sizes:
        if p < big:
            pack, room = p, room_of[p]
        else:
            pack, room = len(room_of), max_tokens
            room_of.append(max_tokens)
        p += 1
        while room > 0 and sizes:
            shortest, longest = sizes[0], sizes[-1]
            if shortest > room:
                break
            picks: list[int] = []
            if left[room] > 0:
                picks = [room]
            elif room - longest >= 2 * shortest:
                rest = room - longest
                k = rest // shortest
                if -(-rest // k) <= longest:
                    picks = [longest]
            else:
                candidates = [x for x in reversed(sizes) if x <= room - shortest][:8]
                for x in candidates:
                    if 2 * x < room:
                        break
                    y = room - x
                    if left[y] > (1 if y == x else 0):
                        picks = [x, y]
                        break
            if not picks:
                for x in [x for x in reversed(sizes) if x <= room - 2 * shortest][:16]:
                    rest = room - x
                    k = rest // shortest
                    if -(-rest // k) <= longest:
                        picks = [x]
                        break
            if not picks:
                x = largest_at_most(room - shortest)
                picks = [x if x is not None else largest_at_most(room)]
            for x in picks:
                take(x)
                entries.append((x, pack))
                room -= x
    # The sequences of each length, in ascending index, in the order that length was taken.
    queue: dict[int, list[int]] = {}
    for i, x in enumerate(lengths):
        queue.setdefault(x, []).append(i)
    pack_of = [-1] * len(lengths)
    for size, pack in entries:
        pack_of[queue[size].pop(0)] = pack
    return pack_of
