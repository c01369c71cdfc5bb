"""4-bit weights as the GGUF file stores them (`--dtype q4`): the CPU decoder's projections read Q4_0/Q4_1 blocks.

A Q4_1 block holds 32 weights as w = d * q + m (q in 0..15, d and m float16); Q4_0 as w = d * (q - 8). Both are
exactly torch's group-wise int4 format, w = (q - 8) * scale + zero with groups of 32 (scale d; zero m + 8d,
or 0), so `_weight_int4pack_mm_for_cpu` multiplies by the file's own 4-bit values: a fifth of the float32 bytes,
the weight traffic llama.cpp has. Its activations are bfloat16 (its float32 path is scalar code, 30x slower),
so is the KV cache, and scales and zeros are rounded to bfloat16. The token embedding and the LM head keep the
model's other weights, in bfloat16.

Like --dtype bfloat16 this trades exactness for speed: products with a few rows or one give equal rows, but
attention does not, and bfloat16 rounding turns its last-bit differences into different tokens after a few
dozen; `bench` reports the first divergence from plain decoding. Exactness is proven in float64.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from tokenswift.model.errors import ModelLoadError
from tokenswift.model.forward import Transformer

GROUP = 32
# Block bytes per type: Q4_0 = float16 d + 16 bytes of nibbles; Q4_1 adds float16 m after d.
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20}
GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


class Q4Linear(nn.Module):
    """y = x @ W.T with W in torch's packed int4 layout; bias-free (the projections q4 replaces have none)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor):
        """q [out, in] int in 0..15; scale, zero [out, in / GROUP]: w = (q - 8) * scale + zero."""
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1))
        self.register_buffer("scales_zeros", torch.stack((scale.t(), zero.t()), -1).to(torch.bfloat16).contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scales_zeros)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def blocks_of(kind: str, data: np.ndarray, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_0/Q4_1 tensor's bytes -> (q [rows, cols] uint8, scale, zero [rows, cols / 32] float32)."""
    blocks = np.ascontiguousarray(data).reshape(rows, cols // GROUP, BLOCK_BYTES[kind])
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if kind == "Q4_1":
        m, nibbles = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32), blocks[..., 4:]
        zero = m + 8 * d
    else:
        nibbles, zero = blocks[..., 2:], np.zeros_like(d)
    # Byte j of a block holds weight j in its low nibble and weight j + 16 in its high one.
    q = np.concatenate((nibbles & 0x0F, nibbles >> 4), axis=-1).reshape(rows, cols)
    return torch.from_numpy(q), torch.from_numpy(d), torch.from_numpy(zero)


def llama_rows(rows: int, heads: int) -> torch.Tensor:
    """llama.cpp stores Llama's Q and K rows interleaved per head; this order undoes it (as transformers does)."""
    half = rows // heads // 2
    return torch.arange(rows).reshape(heads, half, 2).transpose(1, 2).reshape(rows)


def use_q4_weights(model: Transformer, gguf_path: Path, state: dict[str, torch.Tensor]) -> None:
    """Replace every layer's projections by the GGUF file's own 4-bit blocks. Each is checked against the float
    weight in `state`, the checkpoint converted from the same file: a mismatch is a ModelLoadError."""
    from gguf import GGUFReader

    if any(layer.self_attn.q_proj.bias is not None for layer in model.model.layers):
        raise ModelLoadError("--dtype q4 supports models without attention biases (Llama, Mistral); use bfloat16")
    tensors = {t.name: t for t in GGUFReader(gguf_path).tensors}
    cfg = model.cfg
    for i, layer in enumerate(model.model.layers):
        for attr, short in GGUF_NAMES.items():
            owner, name = attr.split(".")
            old = getattr(getattr(layer, owner), name)
            tensor = tensors.get(f"blk.{i}.{short}.weight")
            kind = tensor.tensor_type.name if tensor is not None else "missing"
            if kind not in BLOCK_BYTES:
                raise ModelLoadError(f"--dtype q4 needs Q4_0 or Q4_1 projections; {gguf_path.name} stores "
                                     f"blk.{i}.{short}.weight as {kind}: use float32 or bfloat16")
            q, scale, zero = blocks_of(kind, tensor.data, old.out_features, old.in_features)
            reference = state[f"model.layers.{i}.{attr}.weight"].float()
            if short in ("attn_q", "attn_k") and not _close(q, scale, zero, reference):
                order = llama_rows(old.out_features, cfg.n_heads if short == "attn_q" else cfg.n_kv_heads)
                q, scale, zero = q[order], scale[order], zero[order]
            if not _close(q, scale, zero, reference):
                raise ModelLoadError(f"{gguf_path.name}: blk.{i}.{short}.weight does not match the model's own "
                                     "weight once unpacked; this file's layout is not supported by --dtype q4")
            setattr(getattr(layer, owner), name, Q4Linear(q, scale, zero))


def _close(q, scale, zero, reference: torch.Tensor) -> bool:
    # The float weight was dequantized from float16 d and m; ours is (q - 8) * d + (m + 8d): equal to rounding.
    w = (q.float() - 8).view(*scale.shape, GROUP) * scale[..., None] + zero[..., None]
    return torch.allclose(w.view_as(reference), reference, rtol=1e-3, atol=1e-5)
