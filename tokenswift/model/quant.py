"""Products with GGUF-quantized weights on the CPU (`--dtype q4`): the file's own Q4_0, Q4_1 and Q8_0 blocks
times float32 activations, by the C kernel quant_kernels.c (built and loaded by native.py).

Torch's CPU int4 kernel (`_weight_int4pack_mm_for_cpu`) dequantizes to bfloat16 and multiplies in floating
point: on this 2-core AVX2 machine it was no faster per weight than a float32 product, so a q4 step cost as much
as a float32 one. The kernel does what llama.cpp does: it quantizes each activation block of 32 to int8 and takes
integer dot products (two AVX2 instructions per 32 products), reading each weight once per call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import quantize
from torch import nn

from tokenswift.model.errors import ModelLoadError
from tokenswift.model.native import kernels

GROUP = 32
KINDS = {"Q4_0": 0, "Q4_1": 1, "Q8_0": 2}
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
PACKED = 8  # quant_kernels.c: the kind number of a weight packed by qk_pack is PACKED + its GGUF kind's


# From this many rows on (prefill chunks, large verify batches) a product dequantizes the weight and runs a float32
# GEMM: MKL's blocked kernel then beats the integer dot products, whose per-block scaling costs per row (measured
# on a 1536x576 Q4_1 weight, 1 thread: 8 rows 0.45 ms vs 1.0; 32 rows 1.5 vs 1.1; 1024 rows 65 vs 23).
DENSE_ROWS = 32


class QuantLinear(nn.Module):
    """y = x @ W.T with W as GGUF blocks ([out, in / 32 * block bytes] uint8); float32 in and out, no bias."""

    def __init__(self, kind: str, blocks: torch.Tensor, out_features: int, in_features: int):
        super().__init__()
        if kind not in KINDS or in_features % GROUP:
            raise ModelLoadError(f"quantized weights must be {', '.join(KINDS)} with rows of whole blocks of "
                                 f"{GROUP}; got {kind} with {in_features} columns")
        if tuple(blocks.shape) != (out_features, in_features // GROUP * BLOCK_BYTES[kind]):
            raise ModelLoadError(f"{kind} blocks of shape {tuple(blocks.shape)} for a {out_features}x{in_features} "
                                 "weight")
        self.kind, self.out_features, self.in_features = kind, out_features, in_features
        self.register_buffer("blocks", blocks.to(torch.uint8).contiguous())
        self._lib = kernels()
        # The products' copy of the weight and its kind number for the kernel (looked up once: forward runs ~120
        # times a step): repacked where this machine's kernels take packed weights (quant_packed.c, AVX-512 VNNI),
        # else the blocks themselves.
        self.product_weight, self._kind = self.blocks, KINDS[kind]
        if size := self._lib.qk_packed_bytes(KINDS[kind], out_features, in_features):
            self.product_weight = torch.empty(size, dtype=torch.uint8)
            self._lib.qk_pack(KINDS[kind], self.blocks.data_ptr(), out_features, in_features,
                              self.product_weight.data_ptr())
            self._kind = PACKED + KINDS[kind]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A decoding step calls this four times per layer: skip the no-op conversions (each is a dispatched op).
        flat = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if flat.dtype != torch.float32 or not flat.is_contiguous():
            flat = flat.float().contiguous()
        if flat.shape[0] >= DENSE_ROWS:
            return F.linear(flat, self.dequantized()).view(*x.shape[:-1], self.out_features).to(x.dtype)
        out = torch.empty(flat.shape[0], self.out_features)
        if self._lib.qk_matmul(self._kind, self.product_weight.data_ptr(), self.out_features, self.in_features,
                               flat.data_ptr(), flat.shape[0], out.data_ptr(), torch.get_num_threads()):
            raise MemoryError("quantized product: out of memory for the activations' int8 copy")
        if x.dim() != 2:
            out = out.view(*x.shape[:-1], self.out_features)
        return out if x.dtype == torch.float32 else out.to(x.dtype)

    @classmethod
    def q8(cls, weight: torch.Tensor) -> QuantLinear:
        """A float weight [out, in] as Q8_0 blocks (the gguf package's quantizer): a quarter of float32's bytes, for
        a product the weight's read dominates (the draft layer's, a row at a time)."""
        blocks = quantize(weight.detach().float().cpu().numpy(), GGMLQuantizationType.Q8_0)
        return cls("Q8_0", torch.from_numpy(blocks), *weight.shape)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight these blocks hold (for checks against the model's own weights)."""
        out = torch.empty(self.out_features, self.in_features)
        self._lib.qk_rows(KINDS[self.kind], self.blocks.data_ptr(), self.in_features, self.out_features,
                          out.data_ptr())
        return out
