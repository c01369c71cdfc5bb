"""The n-gram reuse table (design §5): counts of the committed text's n-grams, keyed by first token.

`NgramTable.top_k(first, k)` returns the most frequent continuations of `first`, by count descending, ties
broken by first-seen order. The engine asks for the same first tokens again and again while the table grows
by a few n-grams per iteration, so each queried key keeps a small ranked list of its best `cap` continuations
that every update repairs in O(cap); no dict is ever re-sorted after the first query of its key.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


class NgramTable:
    """n-gram counts of committed text keyed by first token (n = 4 by default)."""

    def __init__(self, n: int = 4) -> None:
        if n < 2:
            raise ValueError(f"n must be at least 2, got {n}")
        self._n = n
        self._next_start = 0  # the n-gram starting here is the next one to add
        self._distinct = 0
        self._serial = 0  # first-seen stamp, the tie-breaker
        # first token -> continuation -> [count, first-seen stamp]; lists so an update mutates in place
        self._stats: dict[int, dict[tuple[int, ...], list[int]]] = {}
        # first token -> (capacity, the best min(capacity, len(stats[first])) continuations in rank order)
        self._ranked: dict[int, tuple[int, list[tuple[int, ...]]]] = {}

    @property
    def n(self) -> int:
        return self._n

    def __len__(self) -> int:
        """Number of distinct n-grams."""
        return self._distinct

    def count(self, gram: Sequence[int]) -> int:
        """How often the n-gram `gram` was added (0 if never)."""
        stat = self._stats.get(gram[0], {}).get(tuple(gram[1:]))
        return stat[0] if stat else 0

    def advance(self, ids: Sequence[int], end: int) -> None:
        """Add every n-gram lying inside ids[:end] that is not in the table yet.

        `ids` must keep the prefix seen by earlier calls; an `end` below the one reached before is a no-op.
        """
        end = min(end, len(ids))
        start = self._next_start
        if start + self._n > end:
            return
        # one conversion per call: tensor elements or numpy ints would hash differently from Python ints
        seg = [int(t) for t in ids[start:end]]
        n = self._n
        for s in range(len(seg) - n + 1):
            self._add(seg[s], tuple(seg[s + 1 : s + n]))
        self._next_start = end - n + 1

    def top_k(self, first: int, k: int) -> list[tuple[int, ...]]:
        """The k most frequent continuations (tuples of n-1 tokens) of n-grams starting with `first`."""
        if k <= 0:
            return []
        cached = self._ranked.get(first)
        if cached is None or cached[0] < k:
            stats = self._stats.get(first)
            if not stats:
                return []
            # dict order is first-seen order, so the stamp tie-break equals a stable sort on count
            best = heapq.nsmallest(k, stats.items(), key=lambda item: (-item[1][0], item[1][1]))
            cached = (k, [cont for cont, _ in best])
            self._ranked[first] = cached
        return cached[1][:k]

    def _add(self, first: int, cont: tuple[int, ...]) -> None:
        stats = self._stats.setdefault(first, {})
        stat = stats.get(cont)
        if stat is None:
            stats[cont] = [1, self._serial]
            self._serial += 1
            self._distinct += 1
            cached = self._ranked.get(first)
            # a newcomer ranks last of all (lowest count, newest), so it enters only a list that is not full
            if cached is not None and len(cached[1]) < cached[0]:
                cached[1].append(cont)
            return
        stat[0] += 1
        cached = self._ranked.get(first)
        if cached is not None:
            _promote(cached[1], stats, cont)


def _promote(
    ranked: list[tuple[int, ...]], stats: dict[tuple[int, ...], list[int]], cont: tuple[int, ...]
) -> None:
    """Repair `ranked` after the count of `cont` went up by one.

    Only `cont` moved, and only upward, so it either bubbles up inside the list or, when it was outside
    (the list is then full), it may displace the last entry.
    """
    count, stamp = stats[cont]
    try:
        i = ranked.index(cont)
    except ValueError:
        last_count, last_stamp = stats[ranked[-1]]
        if (count, -stamp) <= (last_count, -last_stamp):
            return
        i = len(ranked) - 1
        ranked[i] = cont
    while i > 0:
        above_count, above_stamp = stats[ranked[i - 1]]
        if (above_count, -above_stamp) >= (count, -stamp):
            break
        ranked[i] = ranked[i - 1]
        i -= 1
    ranked[i] = cont
