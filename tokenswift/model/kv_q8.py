"""The q8 KV cache's rows (kv_q8.h), written and read by torch where the C kernels are not the ones running: a
prefill chunk's keys and values, the eager attention over them, a partial cache's ranking.

A head's key or value at one slot is a row of head_dim 8-bit integers and their float32 scale (head_dim + 4 bytes,
a uint8 tensor's last axis): x ~ scale * integer, scale = max|x| / 127, each integer round(x * (127 / max|x|)),
ties to even. Keys store the integers plus 128 (unsigned bytes, the operand vpdpbusd reads unsigned), values as
they are. The same float32 operations as kv_q8.h, in the same order, so both store the same bytes.
"""

from __future__ import annotations

import torch

Q8 = torch.uint8  # a KV cache of this dtype holds q8 rows
SCALE_BYTES = 4
KEY_BIAS = 128


def row_width(head_dim: int) -> int:
    return head_dim + SCALE_BYTES


def quantize(x: torch.Tensor, key: bool) -> torch.Tensor:
    """x [..., d] float32 -> [..., d + 4] uint8 rows."""
    x = x.float()
    top = x.abs().amax(dim=-1, keepdim=True)
    inv = torch.where(top > 0, 127.0 / top, torch.zeros_like(top))
    integers = torch.round(x * inv).clamp_(-127, 127).to(torch.int16)
    data = (integers + KEY_BIAS if key else integers).to(torch.uint8)  # a value's negatives wrap to their byte
    scale = (top / 127.0).contiguous().view(torch.uint8)
    return torch.cat((data, scale), dim=-1)


def dequantize(rows: torch.Tensor, key: bool) -> torch.Tensor:
    """[..., d + 4] uint8 rows -> [..., d] float32, each scale * integer."""
    data, scale = rows[..., :-SCALE_BYTES], rows[..., -SCALE_BYTES:].contiguous().view(torch.float32)
    integers = data.to(torch.int16) - KEY_BIAS if key else data.view(torch.int8).to(torch.int16)
    return integers.float() * scale
