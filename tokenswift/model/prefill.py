"""Chunked prefill: a text's tokens into a fresh KV cache, causal, PREFILL_CHUNK tokens per forward.

One forward over the whole text would hold a [text, text] mask and every layer's [heads, text, text] scores at
once; in chunks, a forward holds [chunk, filled] of them. The engine fills its window this way, and head
training computes its features by the same path, so heads learn on the states the engine's drafters read.
"""

from __future__ import annotations

import torch

from tokenswift.model.forward import ForwardOut, Transformer
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.masks import causal_mask

PREFILL_CHUNK = 1024


def prefill(model: Transformer, tokens: torch.Tensor, cache: KVCache, keep: int, last: bool = False,
            keep_layers: tuple[int, ...] = ()) -> ForwardOut:
    """tokens [n] at slots and positions 0..n-1 of `cache`. Returns the last-layer states of the last `keep`
    tokens (and theirs of the layers in keep_layers) and, when `last`, the last token's logits [1, V] and its
    queries per layer ([heads, head_dim] each)."""
    window, dev, n = model.cfg.sliding_window, tokens.device, tokens.shape[0]
    out, states, layers = None, [], [[] for _ in keep_layers]
    for start in range(0, n, PREFILL_CHUNK):
        end = min(start + PREFILL_CHUNK, n)
        pos = torch.arange(start, end, device=dev)
        mask = causal_mask(start, end - start, pos, window, dev)
        out = model(tokens[start:end], pos, cache, start, mask, logits="last" if last else "none",
                    capture_queries=last and end == n, keep_layers=keep_layers)
        if end > n - keep:
            cut = max(0, n - keep - start)
            states.append(out.hidden[cut:])
            for rows, layer in zip(layers, out.layers or (), strict=True):
                rows.append(layer[cut:])
    return ForwardOut(out.logits, torch.cat(states), [q[-1] for q in out.queries] if last else None,
                      [torch.cat(rows) for rows in layers] if keep_layers else None)
