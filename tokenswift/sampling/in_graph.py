"""Sampling inside a captured pass: the engine's Sampler given penalty windows and noise positions computed on
the device, and the verify pass's inputs packed on the host for one copy.

A verify graph samples the target's token after every trie node (row i: position positions[i] + 1, window = the
history + the node's path), so a verify pass costs one replay and one host read of the targets.
"""

from __future__ import annotations

import torch

from tokenswift.sampling.alternatives import top_rows
from tokenswift.sampling.sampler import Sampler
from tokenswift.sampling.trie import Trie, verify_inputs
from tokenswift.sampling.windows import last_ids, node_windows
from tokenswift.settings import SettingsError

MAX_DEPTH = 16  # deepest trie path a verify batch may hold (gamma + 1 <= 9 levels; n-grams 4)


def packed_size(t: int, paths: bool) -> int:
    """Elements of a packed verify pass's inputs for t rows: [start | tokens | positions | tree mask | paths]."""
    return 1 + 2 * t + t * t + (t * MAX_DEPTH if paths else 0)


def pack_verify_inputs(trie: Trie, start: int, t: int, paths: bool, out: torch.Tensor) -> torch.Tensor:
    """A packed verify pass's inputs, [start | tokens | positions | tree mask | paths], written into `out`."""
    tokens, positions, tree = verify_inputs(trie, start, t)
    parts = [torch.tensor([start]), tokens, positions, tree.flatten().long()]
    if paths:
        parts.append(trie_paths(trie, t).flatten())
    return torch.cat(parts, out=out)


def trie_paths(trie: Trie, rows: int) -> torch.Tensor:
    """[rows, MAX_DEPTH] token ids of each node's path below the root (left-aligned, -1 padded)."""
    paths = torch.full((rows, MAX_DEPTH), -1, dtype=torch.long)
    for i in range(1, len(trie.tokens)):  # parents come before children: extend the parent's path
        d = trie.depths[i]
        paths[i, : d - 1] = paths[trie.parents[i], : d - 1]
        paths[i, d - 1] = trie.tokens[i]
    return paths


class DeviceSampler:
    """The engine's Sampler inside a graph: penalty windows and noise keys computed on the device.

    Row i of a verify batch gets the window and position the host sampler would give that trie node (history +
    the node's path, position positions[i] + 1), so each row gets exactly the token the host-driven walk draws."""

    def __init__(self, sampler: Sampler, ids: torch.Tensor):
        s = sampler.s
        if sampler.adaptive is not None:
            raise SettingsError("adaptive_target", "Adaptive-P keeps a history the captured passes cannot: run it "
                                                   "off the fast path (without --fast)")
        self.sampler, self.ids = sampler, ids
        self.w = s.history_length
        self.offsets = torch.arange(self.w, device=ids.device)
        # The noise is keyed by story index, which a context shift moves away from the slot (design §3).
        self.key_offset = torch.zeros((), dtype=torch.int64, device=ids.device)

    def __call__(self, logits: torch.Tensor, start: torch.Tensor, positions: torch.Tensor,
                 paths: torch.Tensor | None, top: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens [T] for rows whose next position is positions + 1; start = the committed length, so row
        i lies at depth positions[i] - start below the root and its window adds paths[i]. top: a [T, ROW] buffer
        for each row's alternatives (alternatives.top_rows), filled when given."""
        windows = None
        if self.w:
            history = last_ids(self.ids, start + 1, self.offsets)
            if paths is None:
                windows = history.expand(logits.shape[0], self.w)
            else:
                windows = node_windows(history, paths, positions - start)
        keys = positions + 1 + self.key_offset
        scores = self.sampler.process(logits, windows, positions=keys)
        tokens = self.sampler.choose(scores, keys)
        if top is not None:
            top.copy_(top_rows(scores, tokens))
        return tokens
