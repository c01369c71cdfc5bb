"""Chunked prefill: a text's tokens into a fresh KV cache, causal, PREFILL_CHUNK tokens per forward.

One forward over the whole text would hold a [text, text] mask and every layer's [heads, text, text] scores at
once; in chunks, a forward holds [chunk, filled] of them. The engine fills its window this way, and head
training computes its features by the same path, so heads learn on the states the engine's drafters read.

A rebuilt cache must hold the values the cache it replaces held, bit for bit, or a resumed run samples otherwise
at near-ties and its text parts from the uninterrupted run's within a few dozen tokens (q4 and float32). An
uninterrupted run prefilled its window once, when the window was built, and computed every token after that one
row at a time (plain steps, verify rows). So `replay_from` cuts the text there: the window is prefilled as it was,
in the same chunks, and the tokens since are replayed as exact rows (forward's exact_rows), each computed as the
plain step at its position computed it. A GEMM's sums, unlike a row's, depend on the chunk they are computed in.

A model whose rows beat its GEMMs (Transformer.prefills_by_rows: GGUF-quantized weights on the C kernels) prefills
every token as an exact row: then a window's slots are the same whichever chunks computed them, so a window may
be filled ahead of its shift, a piece at a time (decode/lookahead.py).
"""

from __future__ import annotations

import torch

from tokenswift.model.forward import ForwardOut, Transformer
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.masks import causal_mask

PREFILL_CHUNK = 1024
REPLAY_CHUNK = 64  # exact rows per forward when replaying: any count gives the same rows; this many share a weight read


def prefill(model: Transformer, tokens: torch.Tensor, cache: KVCache, keep: int, last: bool = False,
            keep_layers: tuple[int, ...] = (), replay_from: int | None = None, start: int = 0) -> ForwardOut:
    """tokens [n] at slots and positions start..start+n-1 of `cache`; from index `replay_from` on (when given), as
    exact rows. start > 0 (a model that prefills by rows only): the slots before hold the window's first tokens
    already. Returns the last-layer states of the last `keep` tokens (and theirs of the layers in keep_layers) and,
    when `last`, the last token's logits [1, V] and its queries per layer ([heads, head_dim] each)."""
    n = tokens.shape[0]
    by_rows = model.prefills_by_rows
    if start and not by_rows:
        raise ValueError("prefill: only a model that prefills by rows starts past slot 0")
    cut = 0 if by_rows else n if replay_from is None else replay_from
    chunks = [(i, min(i + PREFILL_CHUNK, cut), False) for i in range(0, cut, PREFILL_CHUNK)]
    chunks += [(i, min(i + REPLAY_CHUNK, n), True) for i in range(cut, n, REPLAY_CHUNK)]
    window, dev = model.cfg.sliding_window, tokens.device
    out, states, layers = None, [], [[] for _ in keep_layers]
    for i, end, exact in chunks:
        pos = torch.arange(start + i, start + end, device=dev)
        mask = causal_mask(start + i, end - i, pos, window, dev)
        out = model(tokens[i:end], pos, cache, start + i, mask, logits="last" if last and end == n else "none",
                    capture_queries=last and end == n, exact_rows=exact, keep_layers=keep_layers)
        if keep and end > n - keep:
            first = max(0, n - keep - i)
            states.append(out.hidden[first:])
            for rows, layer in zip(layers, out.layers or (), strict=True):
                rows.append(layer[first:])
    return ForwardOut(out.logits, torch.cat(states) if states else out.hidden[:0],
                      [q[-1] for q in out.queries] if last else None,
                      [torch.cat(rows) for rows in layers] if keep_layers else None)
