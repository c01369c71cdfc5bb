"""A decoder layer's steps for a few rows on the CPU in float32, by the C kernels attention_kernel.c and
layer_kernels.c: attention over the KV cache, RMSNorm (with the residual add before it), RoPE with the cache
write, SwiGLU, and the float32 products of a few rows.

A decoding step, a draft pass and a verify batch run 1 to a few rows, where torch's cost is dispatch: the
default model's step ran ~1,240 operators (about 11 of its 29 ms in q4 on this 2-core machine), and torch's
flash-attention kernel, which runs a few rows as small GEMMs per KV block, took 0.66 ms a layer at a 2K-token
context. The forward (forward.py) is the same with or without these: each module takes them where it would call
torch's operators. Loading sets them on a float32 CPU model (Transformer.native) where a C compiler builds them;
prefill chunks (more than MAX_ROWS rows) keep torch's operators, whose GEMMs pay off there; attention takes
the kernel up to ATTEND_ROWS rows.
"""

from __future__ import annotations

import ctypes
import math

import torch

from tokenswift.model import native
from tokenswift.model.config import ModelConfig

MAX_ROWS = 16  # query tokens per forward for which the kernels are used
PRODUCT_ROWS = 8  # float32 products of up to this many rows stream the weight once; more rows: MKL's GEMM
# The attention kernel re-reads each slot's key and value per query row (from L1): from about 4 tokens on (12 rows
# of the default model), torch's kernel, which makes the rows one GEMM, is the faster.
ATTEND_ROWS = 4


class NativeRows:
    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib

    @classmethod
    def for_model(cls, device: torch.device, dtype: torch.dtype) -> NativeRows | None:
        """The kernels for a model on `device` in `dtype`: float32 on the CPU where they build, else None."""
        if device.type != "cpu" or dtype != torch.float32:
            return None
        lib = native.available()
        return cls(lib) if lib is not None else None

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x [rows, in] @ weight [out, in].T for a float32 weight (forward.project: up to PRODUCT_ROWS rows)."""
        x = x.contiguous()
        out = torch.empty(x.shape[0], weight.shape[0])
        self.lib.f32_matmul(weight.data_ptr(), weight.shape[0], weight.shape[1], x.data_ptr(), x.shape[0],
                            out.data_ptr(), torch.get_num_threads())
        return out

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        self.lib.rms_norm(x.data_ptr(), weight.data_ptr(), eps, x.numel() // x.shape[-1], x.shape[-1], out.data_ptr())
        return out

    def add_rms_norm(self, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + y, rms_norm(x + y))."""
        x, y = x.contiguous(), y.contiguous()
        total, out = torch.empty_like(x), torch.empty_like(x)
        self.lib.add_rms_norm(x.data_ptr(), y.data_ptr(), weight.data_ptr(), eps, x.numel() // x.shape[-1],
                              x.shape[-1], total.data_ptr(), out.data_ptr())
        return total, out

    def rope_store(self, cfg: ModelConfig, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """qkv [T, (heads + 2 kv_heads) * head_dim] -> q [T, heads, head_dim] rotated; the rotated keys and the values
        written to `slots` of keys/values ([kv_heads, capacity, head_dim], the same strides)."""
        t = qkv.shape[0]
        _same_strides(keys, values)
        qkv, cos, sin, slots = qkv.contiguous(), cos.contiguous(), sin.contiguous(), slots.contiguous()
        q = torch.empty(t, cfg.n_heads, cfg.head_dim)
        self.lib.rope_store(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), t, cfg.n_heads, cfg.n_kv_heads,
                            cfg.head_dim, slots.data_ptr(), keys.data_ptr(), values.data_ptr(), keys.stride(0),
                            keys.stride(1), q.data_ptr())
        return q

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[rows, 2 n] (gate, up) -> silu(gate) * up."""
        gate_up = gate_up.contiguous()
        n = gate_up.shape[-1] // 2
        out = torch.empty(*gate_up.shape[:-1], n)
        self.lib.swiglu(gate_up.data_ptr(), gate_up.numel() // (2 * n), n, out.data_ptr())
        return out

    def attend(self, cfg: ModelConfig, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               mask: torch.Tensor | None) -> torch.Tensor:
        """q [T, heads, head_dim]; keys, values [kv_heads, span, head_dim] (a cache's layer); mask None (every row
        sees every slot) or [T, span] bool -> [T, heads * head_dim]."""
        t, span = q.shape[0], keys.shape[1]
        _same_strides(keys, values)
        q = q.contiguous()
        out = torch.empty(t, cfg.n_heads * cfg.head_dim)
        if mask is not None:
            mask = mask.contiguous()
        if self.lib.attend_rows(q.data_ptr(), t, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, keys.data_ptr(),
                                values.data_ptr(), keys.stride(0), keys.stride(1), span,
                                mask.data_ptr() if mask is not None else None, 1.0 / math.sqrt(cfg.head_dim),
                                out.data_ptr(), torch.get_num_threads()):
            raise MemoryError("row attention: out of memory for the per-chunk partial sums")
        return out


def _same_strides(keys: torch.Tensor, values: torch.Tensor) -> None:
    if keys.stride() != values.stride() or keys.stride(2) != 1:
        raise ValueError("native rows: keys and values must share strides, with a contiguous last dim")
