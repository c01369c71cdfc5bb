"""NgramTable against a brute-force recount of the same text."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tokenswift.decode.ngram import NgramTable


def brute_top_k(ids: list[int], end: int, first: int, k: int, n: int = 4) -> list[tuple[int, ...]]:
    grams = [tuple(ids[s : s + n]) for s in range(end - n + 1)]
    counts = Counter(g for g in grams if g[0] == first)
    seen: dict[tuple[int, ...], int] = {}
    for g in grams:
        if g[0] == first:
            seen.setdefault(g[1:], len(seen))
    order = sorted(seen, key=lambda c: (-counts[(first, *c)], seen[c]))
    return order[:k]


@pytest.mark.parametrize("seed", range(6))
def test_incremental_matches_recount(seed: int) -> None:
    rng = random.Random(seed)
    vocab = rng.choice([3, 4, 6])
    n = 4
    table = NgramTable(n)
    ids: list[int] = []
    end = 0
    query_ks = [1, 3, 20]
    for _ in range(120):
        ids.extend(rng.randrange(vocab) for _ in range(rng.randint(0, 5)))
        lag = rng.choice([0, 0, 2, 7, 30])
        end = max(end, min(len(ids), max(5, len(ids) - lag)))  # never decreases, may lag behind len(ids)
        table.advance(ids, end)
        # query a few keys every step, so the cached rankings are repaired incrementally, not rebuilt
        for first in range(vocab):
            k = rng.choice(query_ks)
            assert table.top_k(first, k) == brute_top_k(ids, end, first, k), (first, k, end)
    grams = Counter(tuple(ids[s : s + n]) for s in range(end - n + 1))
    assert len(table) == len(grams)
    for gram, c in grams.items():
        assert table.count(gram) == c
    for first in range(vocab):
        assert table.top_k(first, 1000) == brute_top_k(ids, end, first, 1000)


def test_advance_adds_each_ngram_once() -> None:
    table = NgramTable()
    ids = [1, 2, 3, 4, 1, 2, 3, 4]
    table.advance(ids, 3)
    assert len(table) == 0
    table.advance(ids, 4)
    assert table.count((1, 2, 3, 4)) == 1
    table.advance(ids, 4)
    table.advance(ids, 2)  # a smaller end is a no-op
    assert table.count((1, 2, 3, 4)) == 1
    table.advance(ids, 100)  # clamped to len(ids)
    assert table.count((1, 2, 3, 4)) == 2
    assert len(table) == 4
    table.advance(ids + [9], 9)
    assert table.count((2, 3, 4, 9)) == 1 and table.count((2, 3, 4, 1)) == 1
    assert table.count((3, 4, 9)) == 0  # wrong length: never counted
    assert table.top_k(2, 5) == [(3, 4, 1), (3, 4, 9)]


def test_ties_broken_by_first_seen() -> None:
    table = NgramTable()
    ids = [7, 5, 5, 5, 7, 1, 1, 1, 7, 2, 2, 2, 7, 1, 1, 1, 0]
    table.advance(ids, len(ids))
    assert table.top_k(7, 1) == [(1, 1, 1)]  # query first so the later updates go through the cache
    assert table.top_k(7, 3) == [(1, 1, 1), (5, 5, 5), (2, 2, 2)]
    more = ids + [7, 2, 2, 2, 7, 5, 5, 5]
    table.advance(more, len(more))
    # (5,5,5), (1,1,1), (2,2,2) all count 2: first-seen order decides
    assert table.top_k(7, 3) == [(5, 5, 5), (1, 1, 1), (2, 2, 2)]
    assert table.top_k(7, 3) == brute_top_k(more, len(more), 7, 3)


def test_k_beyond_available_and_unknown_first() -> None:
    table = NgramTable()
    table.advance([1, 2, 3, 4, 5], 5)
    assert table.top_k(1, 50) == [(2, 3, 4)]
    assert table.top_k(9, 5) == []
    assert table.top_k(1, 0) == []
    # a newcomer enters a cached list that is not full
    table.advance([1, 2, 3, 4, 5, 1, 9, 9, 9], 9)
    assert table.top_k(1, 50) == [(2, 3, 4), (9, 9, 9)]


def test_rebuild_equals_incremental() -> None:
    rng = random.Random(42)
    ids = [rng.randrange(5) for _ in range(400)]
    inc = NgramTable()
    for end in range(0, 401, 7):
        inc.advance(ids[:end], end)
        inc.top_k(ids[0], 4)
    inc.advance(ids, 400)
    fresh = NgramTable()
    fresh.advance(ids, 400)
    assert len(fresh) == len(inc)
    for first in range(5):
        assert fresh.top_k(first, 10) == inc.top_k(first, 10)


def test_four_grams_wait_out_the_penalty_window_only_under_a_penalty():
    """With a penalty a 4-gram counts once it has left the window (inside it the penalty works against repeating
    it); without one it counts at once: a greedy model that loops repeats what it wrote a few tokens ago."""
    from tokenswift.settings import Settings, Speculation

    assert Speculation().lag(Settings(penalty=1.2, penalty_window=512)) == 512
    assert Speculation().lag(Settings(penalty=1.0, penalty_window=512)) == 0
    assert Speculation(ngram_lag=7).lag(Settings(penalty=1.2, penalty_window=512)) == 7
