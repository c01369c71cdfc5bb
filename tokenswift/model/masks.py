"""Which cache slots a block of new tokens may attend to: one rule for every pass.

T new tokens sit at slots start..start+T-1 behind a committed prefix [0, start). Each sees the whole prefix and,
among the new tokens, the ones its block mask allows: itself and those before it in a prefill, its ancestors in
the verification trie. With a sliding window (Mistral) a query at position p also sees only keys at positions
above p - window.

`visible` is the rule for slots relative to a `start` held on the device: the fast path's mask (attention.Visible:
one captured graph serves every length) and the FlexAttention kernel's per-element mask_mod evaluate it.
`with_prefix` is the same rule where the host knows `start` (the eager passes): the prefix's columns are all
True, so it copies the block behind them instead of looking it up per element (5x cheaper at a 60K prefix).
`causal_mask` is a prefill's (model/prefill.py), and the layer drafter's over its own windowed cache.
"""

from __future__ import annotations

import torch


def visible(rel: torch.Tensor, row: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """Whether new token `row` may see the slot `rel` places after the first new slot (negative: the prefix),
    under the [T, T] bool `block` among the new tokens. Broadcasts over `rel` and `row`."""
    t = block.shape[0]
    return (rel < 0) | ((rel < t) & block[row, rel.clamp(0, t - 1)])


def with_prefix(block: torch.Tensor, prefix: int, positions: torch.Tensor, window: int | None) -> torch.Tensor:
    """[t, prefix+t] bool (True = may attend): a [t, t] mask among new tokens at `positions`, behind a committed
    prefix whose slot is its position."""
    t = block.shape[0]
    mask = torch.ones(t, prefix + t, dtype=torch.bool, device=block.device)
    mask[:, prefix:] = block
    if window is not None:
        key_pos = torch.cat((torch.arange(prefix, device=block.device), positions))
        mask &= key_pos[None, :] > positions[:, None] - window
    return mask


def causal_mask(prefix: int, t: int, positions: torch.Tensor, window: int | None, device) -> torch.Tensor:
    """[t, prefix+t]: every new token sees the whole prefix and the new tokens up to itself."""
    return with_prefix(torch.ones(t, t, dtype=torch.bool, device=device).tril(), prefix, positions, window)
