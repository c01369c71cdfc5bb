"""Rotary position embeddings as a table indexed by absolute position.

A table keyed by position (rather than frequencies recomputed per forward call) makes the rotation of a
token a pure function of its position, which is what keeps tree verification and token-by-token decoding
bit-compatible. Frequencies of the scaled types come from transformers' own rope functions (linear, llama3,
yarn, ...), so every scaling type matches the reference models; they and the config class they read are
imported only for such a checkpoint (hf_files.py says why).

Dynamic NTK scaling is the one stateful type in transformers: frequencies depend on the longest sequence
seen so far. We use the per-position rule that transformers' token-by-token decoding produces: position p
is rotated with the frequencies for a sequence of length max(p + 1, max_position_embeddings).
"""

from __future__ import annotations

import torch


def _rope_params(hf) -> dict:
    params = dict(getattr(hf, "rope_parameters", None) or {})
    params.setdefault("rope_type", "default")
    params.setdefault("rope_theta", getattr(hf, "rope_theta", 10000.0))
    return params


def _head_dim(hf) -> int:
    return getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads


def _dynamic_inv_freq(hf, params: dict, positions: torch.Tensor) -> torch.Tensor:
    dim = _head_dim(hf)
    factor = params["factor"]
    max_pos = hf.max_position_embeddings
    seq_len = torch.clamp(positions.double() + 1, min=max_pos)[:, None]
    base = params["rope_theta"] * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    exponents = torch.arange(0, dim, 2, dtype=torch.float64)[None, :] / dim
    return 1.0 / (base**exponents)  # [positions, dim/2]


def _transformers_rope(hf, kind: str) -> tuple[torch.Tensor, float]:
    """transformers' inverse frequencies and attention scaling for a scaled RoPE type, from its own config class
    built from the same config.json (hf_files.CheckpointConfig or a transformers config: both have to_dict)."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return ROPE_INIT_FUNCTIONS[kind](AutoConfig.for_model(**hf.to_dict()), torch.device("cpu"))


def rope_table(hf, length: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape [length, head_dim], already multiplied by the attention scaling; the sin
    table's first half is negated (apply_rope's rotation without a negation per call)."""
    params = _rope_params(hf)
    kind = params["rope_type"]
    positions = torch.arange(length, dtype=torch.float64)
    if kind == "dynamic":
        freqs = positions[:, None] * _dynamic_inv_freq(hf, params, positions)
        scale = 1.0
    else:
        if kind == "default":
            dim = _head_dim(hf)
            inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
            scale = 1.0
        else:
            inv_freq, scale = _transformers_rope(hf, kind)
        freqs = positions[:, None] * inv_freq.double()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    signed_sin = torch.cat((-freqs.sin(), freqs.sin()), dim=-1)
    return (emb.cos() * scale).to(device, dtype), (signed_sin * scale).to(device, dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [..., T, heads, head_dim]; cos/sin: [T, head_dim] rows of rope_table for the tokens' positions.

    The rotation pairs element i with i + head_dim/2: x * cos + [-x2, x1] * sin, computed as x * cos +
    roll(x) * signed sin (one op instead of slices, a negation and a concatenation; the same products)."""
    return x * cos[:, None, :] + x.roll(x.shape[-1] // 2, -1) * sin[:, None, :]
