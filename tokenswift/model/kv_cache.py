"""A static, preallocated key/value cache for batch size 1.

One buffer per K and V for all layers, [layers, kv_heads, capacity, head_dim]: K/V stay at kv_heads (no
GQA repetition) and attention reads only the filled prefix, so the cost of a step grows with the context,
not with the capacity. Keys are stored after RoPE, at their absolute positions. A cache of dtype kv_q8.Q8 holds
q8 rows (kv_q8.py): its last axis is a row's bytes, head_dim + 4.
"""

from __future__ import annotations

import torch

from tokenswift.model import pages
from tokenswift.model.kv_q8 import Q8, row_width


def row_bytes(head_dim: int, dtype: torch.dtype) -> int:
    """The bytes of one head's key (or value) at one slot of a cache of `dtype`."""
    return row_width(head_dim) if dtype == Q8 else head_dim * torch.empty((), dtype=dtype).element_size()


class KVCache:
    def __init__(self, n_layers: int, n_kv_heads: int, capacity: int, head_dim: int, device, dtype,
                 slot_major: bool = False):
        """slot_major: stored as [layers, capacity, kv_heads, head_dim] (k and v are still indexed [layer, head,
        slot]), so a layer's first n slots have the same strides whatever the capacity. The fast path's compiled
        kernels specialise on strides: with this layout one compilation serves caches of every capacity."""
        width = row_width(head_dim) if dtype == Q8 else head_dim
        shape = (n_layers, capacity, n_kv_heads, width) if slot_major else (n_layers, n_kv_heads, capacity, width)
        if torch.device(device).type == "cpu":  # a step streams the cache: on huge pages (pages.py)
            self.k, self.v = pages.zeros(shape, dtype), pages.zeros(shape, dtype)
        else:
            self.k = torch.zeros(shape, device=device, dtype=dtype)
            self.v = torch.zeros(shape, device=device, dtype=dtype)
        if slot_major:
            self.k, self.v = self.k.transpose(1, 2), self.v.transpose(1, 2)
        self.capacity = capacity
        # Each layer's (keys, values) views, made once: a decoding step would otherwise index both per layer.
        self.layers = list(zip(self.k.unbind(0), self.v.unbind(0), strict=True))

    def view(self, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer, :, :length], self.v[layer, :, :length]

    def commit(self, src: torch.Tensor, dst_start: int) -> None:
        """Move the K/V of slots `src` (ascending) to contiguous slots from dst_start, in every layer.

        Tree verification writes every candidate node's K/V after the committed prefix; only the accepted
        path may stay visible, so it is compacted right behind the prefix and the rest is left beyond the
        new length, where attention never reads."""
        dst = slice(dst_start, dst_start + src.numel())
        self.k[:, :, dst] = self.k[:, :, src]
        self.v[:, :, dst] = self.v[:, :, src]

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2
