"""The dynamic partial KV cache that the draft pass attends to (design §4).

Layout of each layer and KV head: |S| sink slots (the first tokens, always kept), then |B|-|S| slots chosen
by importance, ordered from least to most important, and one scratch slot for the draft root. Newly
committed tokens overwrite the selected slots least-important-first; once |B|-|S| tokens have been written
since the last selection, we select again from the full cache. Importance is the raw post-RoPE dot product
q·k of the last committed token's query, summed over the query heads of the KV head's GQA group (keys are
never repeated). Until the budget fills (a prompt shorter than |B|), the cache is simply everything so far.

Only drafting reads this cache: what it holds changes speed, never the emitted tokens.
"""

from __future__ import annotations

import torch

from tokenswift.model.config import ModelConfig
from tokenswift.model.forward import read
from tokenswift.model.kv_cache import KVCache


class PartialCache:
    def __init__(self, cfg: ModelConfig, budget: int, sinks: int, device, dtype):
        self.cfg, self.budget, self.sinks = cfg, budget, sinks
        self.cache = KVCache(cfg.n_layers, cfg.n_kv_heads, budget + 1, cfg.head_dim, device, dtype)
        self.n = 0  # filled slots; the draft root is written at slot n
        self.selected = False  # True once slots are chosen by importance
        self.written = 0  # tokens written over selected slots since the last selection
        self.selections = 0

    def reset(self) -> None:
        """Empty it: the full cache was refilled (a context shift), so every slot here is stale."""
        self.n, self.selected, self.written = 0, False, 0

    def needs_selection(self, count: int) -> bool:
        """Whether committing `count` more tokens will trigger a selection (callers then keep queries)."""
        if not self.selected:
            return self.n + count > self.budget
        return self.written + count > self.budget - self.sinks

    def extend(self, full: KVCache, start: int, end: int, queries: list[torch.Tensor] | None) -> None:
        """Committed tokens [start, end) of the full cache enter the cache.

        queries: per layer, the last committed token's query [n_heads, head_dim]; needed only when a
        selection is due."""
        count = end - start
        if self.needs_selection(count):
            if queries is None:
                raise ValueError("a partial-cache selection is due but no query was captured")
            self.select(full, end, queries)
            return
        dst = self.n if not self.selected else self.sinks + self.written
        self.cache.k[:, :, dst:dst + count] = full.k[:, :, start:end]
        self.cache.v[:, :, dst:dst + count] = full.v[:, :, start:end]
        if self.selected:
            self.written += count
        else:
            self.n += count

    def select(self, full: KVCache, length: int, queries: list[torch.Tensor]) -> None:
        cfg, s, keep = self.cfg, self.sinks, self.budget - self.sinks
        for layer, q in enumerate(queries):
            keys, values = full.view(layer, length)
            group_q = q.view(cfg.n_kv_heads, cfg.group, cfg.head_dim).sum(dim=1)  # [kv_heads, head_dim]
            scores = torch.einsum("kld,kd->kl", read(keys[:, s:], group_q.dtype, key=True), group_q)
            # topk with largest=False over the negated ranking would do too; sorting ascending puts the
            # least important first, where newly committed tokens will overwrite them.
            idx = torch.topk(scores, keep, dim=-1).indices.flip(-1) + s
            gather = idx[..., None].expand(-1, -1, keys.shape[-1])  # a q8 row's bytes, its scale among them
            self.cache.k[layer, :, :s] = keys[:, :s]
            self.cache.v[layer, :, :s] = values[:, :s]
            self.cache.k[layer, :, s:self.budget] = keys.gather(1, gather)
            self.cache.v[layer, :, s:self.budget] = values.gather(1, gather)
        self.n, self.written, self.selected = self.budget, 0, True
        self.selections += 1
