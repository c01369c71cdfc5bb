"""Candidate trie of one decode iteration (design §1–§3): build, verify-batch inputs, acceptance walk.

The draft tree (Cartesian over per-depth candidate lists) and the n-gram paths are merged into one trie
hanging from the root token r. `verify_inputs` turns it into the token ids, position ids and tree attention
mask of the verify pass; `walk` reads the target's tokens back and picks the accepted path.
Node indices always have parents before children, so the engine can compact K/V by copying forward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass
class Trie:
    tokens: list[int]  # node 0 is the root
    parents: list[int]  # -1 for the root
    depths: list[int]  # root 0
    children: list[dict[int, int]]  # token id -> child node index
    from_ngram: list[bool]  # node lies on an n-gram candidate path
    from_tree: list[bool]  # node was proposed by the draft tree

    def __len__(self) -> int:
        return len(self.tokens)


def _child(trie: Trie, parent: int, token: int) -> int:
    """Index of `parent`'s child carrying `token`, created if missing (so duplicates merge)."""
    node = trie.children[parent].get(token)
    if node is not None:
        return node
    node = len(trie.tokens)
    trie.tokens.append(token)
    trie.parents.append(parent)
    trie.depths.append(trie.depths[parent] + 1)
    trie.children.append({})
    trie.from_ngram.append(False)
    trie.from_tree.append(False)
    trie.children[parent][token] = node
    return node


def build_trie(
    root: int, level_tokens: Sequence[Sequence[int]], ngram_paths: Sequence[Sequence[int]]
) -> Trie:
    """Merge the Cartesian draft tree and the n-gram paths (each starting at depth 1) under `root`.

    The root itself is flagged as neither tree nor n-gram: it was sampled, not proposed.
    """
    trie = Trie(
        tokens=[int(root)], parents=[-1], depths=[0], children=[{}], from_ngram=[False], from_tree=[False]
    )
    frontier = [0]
    for level in level_tokens:
        # plain ints: a tensor element as dict key would never match the target's token in walk()
        level = [int(t) for t in level]
        nxt = []
        for parent in frontier:
            for token in level:
                node = _child(trie, parent, token)
                trie.from_tree[node] = True
                nxt.append(node)
        frontier = nxt
    for path in ngram_paths:
        node = 0
        for token in path:
            node = _child(trie, node, int(token))
            trie.from_ngram[node] = True
    return trie


def verify_inputs(trie: Trie, start_pos: int, pad_to: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids [pad_to], position ids [pad_to] and tree mask [pad_to, pad_to] for the verify pass (CPU).

    mask[i, j] is True iff node j is node i or one of its ancestors. Padding rows (token = root, position =
    start_pos) see only themselves, so no attention row is all-masked, and no real row sees a padding column.
    """
    n = len(trie.tokens)
    if pad_to < n:
        raise ValueError(f"pad_to={pad_to} is smaller than the trie ({n} nodes)")
    pad = pad_to - n
    tokens = torch.tensor(trie.tokens + [trie.tokens[0]] * pad, dtype=torch.long)
    positions = torch.tensor(trie.depths + [0] * pad, dtype=torch.long) + start_pos
    mask = torch.eye(pad_to, dtype=torch.bool)
    # climb all nodes one level at a time: max-depth gathers instead of a per-node loop; the root is its own
    # parent here so that shallow nodes just stay on it
    up = torch.tensor([0] + trie.parents[1:], dtype=torch.long)
    rows = torch.arange(n)
    anc = rows
    for _ in range(max(trie.depths)):
        anc = up[anc]
        mask[rows, anc] = True
    return tokens, positions, mask


def walk(trie: Trie, target: Callable[[int], int] | Sequence[int]) -> tuple[list[int], list[int]]:
    """Accepted node indices (root first) and emitted tokens: accepted ones below the root, then the target's.

    target(i) (or target[i]) is the target's token for the position after node i. A callable lets the
    caller sample lazily, only along the walked path (at most depth + 1 rows instead of every node).
    """
    if isinstance(target, torch.Tensor):
        target = target.tolist()
    target_of = target if callable(target) else target.__getitem__
    children = trie.children
    accepted = [0]
    node = 0
    # Lossless by construction: the target's token at each node is a deterministic function of the node's
    # history and the position-keyed noise, exactly what plain decoding would sample there; we only descend
    # into the child carrying that very token, so at most one path can match and no draft is ever favoured.
    while (child := children[node].get(token := int(target_of(node)))) is not None:
        accepted.append(child)
        node = child
    emitted = [trie.tokens[i] for i in accepted[1:]]
    emitted.append(token)
    return accepted, emitted
