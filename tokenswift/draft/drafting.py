"""Drafting strategies behind one small interface.

A drafter proposes, for the root token r at position L, candidate tokens for each depth below r (a list
per depth, the widths of the tree); the engine merges them with the n-gram candidates into one trie and
verifies. Drafting only affects speed: whatever a drafter proposes, verification emits the target's
tokens. The one-pass drafter (fused_drafter.py) implements the same protocol; `bench` compares them.
"""

from __future__ import annotations

from typing import Protocol

import torch

from tokenswift.model.kv_cache import KVCache
from tokenswift.model.loading import LoadedModel
from tokenswift.model.partial_cache import PartialCache
from tokenswift.sampling.sampler import Sampler
from tokenswift.settings import Speculation

# Devices whose drafts are ranked with one host read for every depth (_noisy_best_one_read); elsewhere one per depth.
ONE_READ_DEVICES = frozenset({"cuda"})


class Drafter(Protocol):
    uses_hidden: bool  # whether the engine must observe() the last committed token's last-layer state
    # Seconds the last propose() spent catching up on rows committed by plain steps (the adaptive policy's plain
    # gear): the cost of switching from plain steps to drafting, not of the shape it drafted (adaptive.py).
    switch_s: float

    def start(self, full: KVCache, length: int, queries: list[torch.Tensor]) -> None:
        """Called after every prefill (the first, and each context shift): `length` tokens are in the full
        cache, which may hold entirely new contents."""

    def propose(self, root: int, position: int, window: torch.Tensor | None, depth: int,
                key: int) -> list[list[int]]:
        """Candidate tokens for the first `depth` depths (depth 1 first) below the root at `position`: a
        smaller shape of the adaptive policy asks for fewer, and each depth costs an LM-head product. `key`:
        the noise position the token at depth 1 is sampled with (depth d: key + d - 1)."""

    def commit(self, full: KVCache, start: int, end: int, queries: list[torch.Tensor] | None) -> None:
        """Tokens [start, end) were committed to the full cache."""

    def wants_queries(self, count: int) -> bool:
        """Whether the next commit of up to `count` tokens needs the last token's queries."""

    def observe(self, hidden: torch.Tensor, following: list[int], first: int) -> None:
        """The last-layer states [n, dim] of the tokens just committed at slots first.., and the token that
        follows each (the last one: the new root). Called only when uses_hidden."""

    def ngram_prefix(self, root: int, levels: list[list[int]]) -> list[int]:
        """The proposed tokens below the root that n-gram continuations hang from (their first is the key)."""


def best_per_depth(logits: torch.Tensor, sampler: Sampler, window: torch.Tensor | None,
                   widths: list[int], key: int, vocab: torch.Tensor | None = None) -> list[list[int]]:
    """The top widths[d] tokens of draft row d (every drafter's last step); row d guesses the token sampled
    with the noise of position key + d. vocab: the token ids of the columns when the rows score a draft
    vocabulary only (then penalty and filters apply within it).

    Greedy: the penalty is the only processing that changes which tokens lead. Sampling: the target's token at
    a position is argmax(processed scores + that position's Gumbel noise) (sampler.py), and the noise is known
    before the token is drawn. So a draft row is ranked the same way: its processed scores plus the very noise
    its position will be sampled with. Where the draft's distribution is near the model's, its best noisy
    guess is the token the model then draws; ranked without the noise, the guess is the most likely token,
    which a sample at T=1 takes only as often as its probability. Only the proposals change, never the text."""
    windows = window.expand(logits.shape[0], -1) if window is not None else None
    if sampler.noise is None:
        scores = sampler.penalize(logits, windows, vocab)
        best = torch.topk(scores, max(widths), dim=-1).indices
        best = (best if vocab is None else vocab[best]).tolist()
        return [best[d][:w] for d, w in enumerate(widths)]
    if logits.device.type in ONE_READ_DEVICES:
        return _noisy_best_one_read(logits, sampler, windows, widths, key, vocab)
    scores = sampler.process(logits, windows, vocab, [key + d for d in range(logits.shape[0])])
    levels = []
    for d, w in enumerate(widths):
        ids, noisy = sampler.noisy(scores[d], key + d, vocab)
        levels.append(ids[torch.topk(noisy, min(w, len(ids))).indices].tolist())
    return levels


def _noisy_best_one_read(logits: torch.Tensor, sampler: Sampler, windows: torch.Tensor | None,
                         widths: list[int], key: int, vocab: torch.Tensor | None) -> list[list[int]]:
    """best_per_depth's sampling ranking with one host read for every depth (rank_on_device). Where a host read
    waits for the device (CUDA) that beats a read per depth; on a CPU the per-row noise of the few tokens the
    filters keep is cheaper (a 49K-token vocabulary's full noise costs milliseconds there)."""
    keys = torch.arange(key, key + logits.shape[0], device=logits.device)
    best = rank_on_device(logits, sampler, windows, keys, max(widths), vocab).tolist()
    return [[t for t in best[d][:w] if t >= 0] for d, w in enumerate(widths)]


def rank_on_device(logits: torch.Tensor, sampler: Sampler, windows: torch.Tensor | None, keys: torch.Tensor,
                   k: int, vocab: torch.Tensor | None) -> torch.Tensor:
    """[R, k] the best k token ids of each draft row as best_per_depth ranks them, -1 where a filter leaves fewer,
    with no host read: row r is sampled with the noise of position keys[r] (every value the one `Sampler.noisy`
    draws for it), so this also runs inside a captured pass (device_drafts.py)."""
    if sampler.noise is None:
        best = torch.topk(sampler.penalize(logits, windows, vocab), min(k, logits.shape[-1]), dim=-1).indices
        return best if vocab is None else vocab[best]
    scores = sampler.process(logits, windows, vocab, keys)
    noisy = scores.double() + sampler.noise.gumbel(keys, vocab)
    top = torch.topk(noisy, min(k, noisy.shape[-1]), dim=-1)
    ids = top.indices if vocab is None else vocab[top.indices]
    return torch.where(torch.isfinite(top.values), ids, -1)  # a filtered-out token is never proposed


class HeadsDrafter:
    """TokenSwift's drafter (design §1–§2, §4): one pass of the target over the partial cache, then the
    base LM head and the chained draft heads give depth 1..gamma+1 distributions.

    The pass runs eagerly, or, given the fast path's passes (fastpath.FastPasses), as its captured draft pass;
    both compute the same rows (heads that read the next token get the token the target would draw from the
    base row)."""

    uses_hidden = False
    switch_s = 0.0

    def __init__(self, lm: LoadedModel, spec: Speculation, sampler: Sampler, budget: int, passes=None):
        self.lm, self.sampler, self.passes = lm, sampler, passes
        gamma = min(spec.gamma, lm.heads.gamma) if lm.heads is not None else 0
        self.widths = list(spec.tree[: gamma + 1])
        self.partial = PartialCache(lm.config, budget, spec.sinks, lm.device, lm.cache_dtype)

    def start(self, full: KVCache, length: int, queries: list[torch.Tensor]) -> None:
        self.partial.reset()
        self.partial.extend(full, 0, length, queries)

    def wants_queries(self, count: int) -> bool:
        return self.partial.needs_selection(count)

    def observe(self, hidden: torch.Tensor, following: list[int], first: int) -> None:
        pass  # the draft pass computes its own state

    def ngram_prefix(self, root: int, levels: list[list[int]]) -> list[int]:
        return [levels[0][0]]  # the base head's top-1 over the partial cache: the paper keys n-grams by it

    def propose(self, root: int, position: int, window: torch.Tensor | None, depth: int,
                key: int) -> list[list[int]]:
        widths, partial = self.widths[:depth], self.partial
        if self.passes is not None:  # one captured pass for every depth (static shapes): a smaller shape cuts
            logits = self.passes.draft(partial.cache, root, position, partial.n, len(self.widths))
        else:
            logits = self._draft_logits(root, position, window, len(widths), key)
        return best_per_depth(logits, self.sampler, window, widths, key)

    def _draft_logits(self, root: int, position: int, window: torch.Tensor | None, rows: int,
                      key: int) -> torch.Tensor:
        lm, partial = self.lm, self.partial
        tokens = torch.tensor([root], device=lm.device)
        pos = torch.tensor([position], device=lm.device)
        out = lm.model(tokens, pos, partial.cache, partial.n, logits="all")
        if rows == 1:
            return out.logits
        # Heads that read the next token get the depth-1 candidate they extend: the base row's best guess, the
        # token the target would draw from it (best_per_depth's first pick there).
        first = self.sampler.sample(out.logits, window, [key]) if lm.heads.next_token else None
        return torch.cat([out.logits, lm.heads.logits(lm.model, out.hidden, first, rows - 1)])

    def commit(self, full: KVCache, start: int, end: int, queries: list[torch.Tensor] | None) -> None:
        self.partial.extend(full, start, end, queries)
