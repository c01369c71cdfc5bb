"""Counter-based integer hashes of (seed, absolute position): every random draw of the sampler (the Gumbel
noise, XTC's coin) is a pure function of them, the same for plain decoding and every trie node (sampler.py)."""

from __future__ import annotations

import torch

M32 = 0xFFFFFFFF


def mix32(x):
    """A 32-bit integer mixer (Wellons' lowbias32) that gives identical results for Python ints and int64
    tensors: products of two 32-bit numbers may wrap in int64, but their low 32 bits stay exact."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def position_key(seed: int, position: int) -> int:
    """A 32-bit key for (seed, absolute position)."""
    k = mix32((seed & M32) ^ mix32((seed >> 32) & M32 ^ 0x5BD1E995))
    k = mix32(k ^ (position & M32))
    return mix32(k ^ mix32((position >> 32) & M32 ^ 0x27D4EB2F))


def position_keys(seed: int, positions: list[int] | torch.Tensor, device) -> torch.Tensor:
    """[R] int64 keys of host positions (hashed on the host) or of an int64 device tensor (hashed there, inside a
    captured graph): the same integers either way."""
    if isinstance(positions, torch.Tensor):
        return position_key(seed, positions)
    return torch.tensor([position_key(seed, p) for p in positions], dtype=torch.int64, device=device)


def uniform(h: torch.Tensor) -> torch.Tensor:
    """32-bit hashes as float64 draws in (0, 1), never 0 or 1 (the Gumbel noise takes log(-log(u)))."""
    return (h.double() + 0.5) * 2.0**-32
