"""Candidate trie: structure, merging, verify-pass inputs and the acceptance walk."""

from __future__ import annotations

import random

import pytest
import torch

from tokenswift.sampling.trie import build_trie, verify_inputs, walk
from tokenswift.settings import max_nodes

LEVELS = [[10], [20, 21, 22], [30, 31, 32], [40, 41, 42]]


def ancestors(parents: list[int], i: int) -> set[int]:
    out = {i}
    while parents[i] >= 0:
        i = parents[i]
        out.add(i)
    return out


def path_node(trie, tokens: list[int]) -> int:
    node = 0
    for t in tokens:
        node = trie.children[node][t]
    return node


def assert_well_formed(trie) -> None:
    n = len(trie.tokens)
    assert len(trie.parents) == len(trie.depths) == len(trie.children) == n
    assert len(trie.from_ngram) == len(trie.from_tree) == n
    assert trie.parents[0] == -1 and trie.depths[0] == 0
    for i in range(1, n):
        p = trie.parents[i]
        assert 0 <= p < i  # parents before children: forward K/V compaction is safe
        assert trie.depths[i] == trie.depths[p] + 1
        assert trie.children[p][trie.tokens[i]] == i
    for i, kids in enumerate(trie.children):
        assert all(trie.parents[c] == i for c in kids.values())


def test_cartesian_tree_1333() -> None:
    trie = build_trie(5, LEVELS, [])
    assert len(trie.tokens) == 41 == max_nodes([1, 3, 3, 3], 0)
    assert_well_formed(trie)
    assert [trie.depths.count(d) for d in range(5)] == [1, 1, 3, 9, 27]
    assert trie.tokens[0] == 5
    assert all(trie.from_tree[1:]) and not trie.from_tree[0] and not any(trie.from_ngram)
    for d in range(1, 5):
        for i in (j for j in range(41) if trie.depths[j] == d - 1):
            assert sorted(trie.children[i]) == LEVELS[d - 1]


def test_ngram_paths_merge() -> None:
    paths = [[10, 20, 30], [10, 20, 30], [10, 20, 99], [10, 77, 78], [11, 12, 13], [11, 12, 14]]
    trie = build_trie(5, LEVELS, paths)
    assert_well_formed(trie)
    # new nodes: 99 under 10-20; 77,78 under 10; 11,12,13 from the root; 14 under 11-12
    assert len(trie.tokens) == 41 + 1 + 2 + 3 + 1
    assert sorted(trie.children[0]) == [10, 11]  # a differing first token opens a new branch at depth 1
    shared = path_node(trie, [10, 20, 30])
    assert trie.from_ngram[shared] and trie.from_tree[shared]
    assert trie.from_ngram[path_node(trie, [10, 20])] and trie.from_ngram[path_node(trie, [10])]
    assert not trie.from_ngram[path_node(trie, [10, 21])]
    new = path_node(trie, [11, 12, 14])
    assert trie.from_ngram[new] and not trie.from_tree[new] and trie.depths[new] == 3


@pytest.mark.parametrize("seed", range(20))
def test_max_nodes_bound_random(seed: int) -> None:
    rng = random.Random(seed)
    widths = [rng.randint(1, 3) for _ in range(rng.randint(1, 4))]
    vocab = 6
    levels = [rng.sample(range(vocab), w) for w in widths]
    k, m = rng.randint(0, 8), rng.randint(1, 4)
    paths = [[rng.randrange(vocab) for _ in range(rng.randint(1, m))] for _ in range(k)]
    trie = build_trie(rng.randrange(vocab), levels, paths)
    assert_well_formed(trie)
    assert len(trie.tokens) <= max_nodes(widths, k, m)
    # The bound is reached when nothing merges: distinct tokens per level, paths of m tokens sharing none.
    levels = [[10 * (d + 1) + j for j in range(w)] for d, w in enumerate(widths)]
    paths = [[1000 + 10 * i + j for j in range(m)] for i in range(k)]
    assert len(build_trie(0, levels, paths).tokens) == max_nodes(widths, k, m)


def test_max_nodes_is_tight_for_disjoint_paths() -> None:
    paths = [[100 + 4 * i + j for j in range(4)] for i in range(20)]
    trie = build_trie(5, LEVELS, paths)
    assert len(trie.tokens) == max_nodes([1, 3, 3, 3], 20, 4) == 121


def test_verify_inputs_mask_positions_padding() -> None:
    trie = build_trie(5, LEVELS, [[10, 20, 99], [11, 12, 13, 14]])
    n, pad_to, start = len(trie.tokens), 64, 1000
    tokens, positions, mask = verify_inputs(trie, start, pad_to)
    assert tokens.dtype == positions.dtype == torch.int64 and mask.dtype == torch.bool
    assert tokens.shape == positions.shape == (pad_to,) and mask.shape == (pad_to, pad_to)
    assert tokens[:n].tolist() == trie.tokens and tokens[n:].tolist() == [5] * (pad_to - n)
    assert positions[:n].tolist() == [start + d for d in trie.depths]
    assert positions[n:].tolist() == [start] * (pad_to - n)
    expected = torch.zeros(pad_to, pad_to, dtype=torch.bool)
    for i in range(n):
        for j in ancestors(trie.parents, i):
            expected[i, j] = True
    for i in range(n, pad_to):
        expected[i, i] = True
    assert torch.equal(mask, expected)
    assert mask.any(dim=1).all()


def test_verify_inputs_exact_size_and_too_small() -> None:
    trie = build_trie(5, LEVELS, [])
    _, _, mask = verify_inputs(trie, 0, 41)
    assert mask.shape == (41, 41) and mask[:, 0].all()
    with pytest.raises(ValueError):
        verify_inputs(trie, 0, 40)


def targets_along(trie, path: list[int], stop_token: int) -> list[int]:
    """Target tokens agreeing with `path`, then `stop_token`; elsewhere a token that matches no child."""
    target = [-1] * len(trie.tokens)
    node = 0
    for t in path:
        target[node] = t
        node = trie.children[node][t]
    target[node] = stop_token
    return target


def test_walk_full_acceptance() -> None:
    trie = build_trie(5, LEVELS, [])
    target = targets_along(trie, [10, 22, 31, 40], 7)
    accepted, emitted = walk(trie, target)
    assert emitted == [10, 22, 31, 40, 7]
    assert [trie.depths[i] for i in accepted] == [0, 1, 2, 3, 4]
    assert [trie.tokens[i] for i in accepted] == [5, 10, 22, 31, 40]


def test_walk_rejects_at_root() -> None:
    trie = build_trie(5, LEVELS, [])
    accepted, emitted = walk(trie, targets_along(trie, [], 11))
    assert accepted == [0] and emitted == [11]


def test_walk_stops_in_the_middle() -> None:
    trie = build_trie(5, LEVELS, [])
    target = torch.tensor(targets_along(trie, [10, 21], 35))  # a tensor works too
    accepted, emitted = walk(trie, target)
    assert emitted == [10, 21, 35] and len(accepted) == 3
    assert all(isinstance(t, int) for t in emitted)


def test_walk_ngram_branch() -> None:
    trie = build_trie(5, LEVELS, [[10, 20, 30, 50], [10, 60, 61, 62]])
    accepted, emitted = walk(trie, targets_along(trie, [10, 60, 61, 62], 3))
    assert emitted == [10, 60, 61, 62, 3]
    assert all(trie.from_ngram[i] for i in accepted[1:])
    assert not trie.from_tree[accepted[2]]
    accepted, emitted = walk(trie, targets_along(trie, [10, 20, 30, 50], 4))
    assert emitted == [10, 20, 30, 50, 4]
