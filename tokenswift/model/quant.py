"""Products with GGUF-quantized weights on the CPU (`--dtype q4`): the file's own Q4_0, Q4_1 and Q8_0 blocks
(quant_kernels.c), and the Q5_0, Q5_1, Q4_K, Q5_K and Q6_K blocks of K-quant files (kquant_kernels.c), times
float32 activations, by the C kernels (built and loaded by native.py).

Torch's CPU int4 kernel (`_weight_int4pack_mm_for_cpu`) dequantizes to bfloat16 and multiplies in floating
point: on this 2-core AVX2 machine it was no faster per weight than a float32 product, so a q4 step cost as much
as a float32 one. The kernel does what llama.cpp does: it quantizes each activation block of 32 to int8 and takes
integer dot products, reading each weight once per call (repacked a group of rows at a time where the CPU has AVX2
or AVX-512 VNNI: quant_packed.c).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quantize
from torch import nn

from tokenswift.model.errors import ModelLoadError
from tokenswift.model.native import kernels
from tokenswift.model.pages import huge_pages

KINDS = {"Q4_0": 0, "Q4_1": 1, "Q8_0": 2, "Q5_0": 3, "Q5_1": 4, "Q4_K": 5, "Q5_K": 6, "Q6_K": 7}
LEGACY = ("Q4_0", "Q4_1", "Q8_0")  # the kinds of the files that load through a float conversion (int4.py)
BLOCKS = {kind: GGML_QUANT_SIZES[GGMLQuantizationType[kind]] for kind in KINDS}  # kind -> (weights, bytes) a block
PACKED = 8  # quant_kernels.c: the kind number of a weight packed by qk_pack is PACKED + its GGUF kind's
STACKED = 16  # quant_kernels.c: a product whose rows are several weights' (StackedQuant)


# From this many rows on (prefill chunks, large verify batches) a product dequantizes the weight and runs a float32
# GEMM: MKL's blocked kernel then beats the integer dot products, whose per-block scaling costs per row (measured
# on a 1536x576 Q4_1 weight, 1 thread: 8 rows 0.45 ms vs 1.0; 32 rows 1.5 vs 1.1; 1024 rows 65 vs 23).
DENSE_ROWS = 32


class BlockProduct(nn.Module):
    """A product the C kernels run (quant_kernels.c's qk_matmul): subclasses set product_weight (what the kernel
    reads), _kind (its kind number), _lib (the kernels, looked up once: forward runs ~120 times a step),
    out_features and in_features, and define dequantized() (the float32 weight: prefill's GEMM)."""

    product_weight: torch.Tensor
    _kind: int
    _lib: object
    out_features: int
    in_features: int
    dense_rows: int | None = DENSE_ROWS  # None: every call runs the kernels (mapped.py's products)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A decoding step calls this four times per layer: skip the no-op conversions (each is a dispatched op).
        flat = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if flat.dtype != torch.float32 or not flat.is_contiguous():
            flat = flat.float().contiguous()
        if self.dense_rows is not None and flat.shape[0] >= self.dense_rows:
            return F.linear(flat, self.dequantized()).view(*x.shape[:-1], self.out_features).to(x.dtype)
        out = torch.empty(flat.shape[0], self.out_features)
        if self._lib.qk_matmul(self._kind, self.product_weight.data_ptr(), self.out_features, self.in_features,
                               flat.data_ptr(), flat.shape[0], out.data_ptr(), torch.get_num_threads()):
            raise MemoryError("quantized product: out of memory for the activations' int8 copy")
        if x.dim() != 2:
            out = out.view(*x.shape[:-1], self.out_features)
        return out if x.dtype == torch.float32 else out.to(x.dtype)


class QuantLinear(BlockProduct):
    """y = x @ W.T with W as GGUF blocks ([out, in / block weights * block bytes] uint8); float32 in and out, no
    bias. The blocks may be a read-only map of the file: they are read, never written or copied (K kinds)."""

    def __init__(self, kind: str, blocks: torch.Tensor, out_features: int, in_features: int, pack: bool = True):
        """pack=False: no packed copy even where the kernels take one (an embedding only looked up, a part that a
        fused product packs)."""
        super().__init__()
        if kind not in KINDS:
            raise ModelLoadError(f"quantized weights must be one of {', '.join(KINDS)}; got {kind}")
        if in_features % BLOCKS[kind][0]:
            raise ModelLoadError(f"{kind} weights must have rows of whole blocks of {BLOCKS[kind][0]}; got "
                                 f"{in_features} columns")
        if tuple(blocks.shape) != (out_features, in_features // BLOCKS[kind][0] * BLOCKS[kind][1]):
            raise ModelLoadError(f"{kind} blocks of shape {tuple(blocks.shape)} for a {out_features}x{in_features} "
                                 "weight")
        self.kind, self.out_features, self.in_features = kind, out_features, in_features
        self.register_buffer("blocks", blocks if blocks.dtype == torch.uint8 and blocks.is_contiguous()
                             else blocks.to(torch.uint8).contiguous())
        self._lib = lib = kernels()
        # The products' copy of the weight and its kind number for the kernel: repacked where this machine's
        # kernels take packed weights (quant_packed.c, the blocks of 32: AVX2 or AVX-512 VNNI; kquant_packed.c and
        # q6k_packed.c, the K kinds: VNNI), in memory asked for huge pages, else the blocks themselves.
        self.product_weight, self._kind = self.blocks, KINDS[kind]
        if pack and (size := lib.qk_packed_bytes(KINDS[kind], out_features, in_features)):
            self.product_weight = huge_pages(size)
            lib.qk_pack(KINDS[kind], self.blocks.data_ptr(), out_features, in_features, self.product_weight.data_ptr())
            self._kind = PACKED + KINDS[kind]

    @classmethod
    def q8(cls, weight: torch.Tensor) -> QuantLinear:
        """A float weight [out, in] as Q8_0 blocks (the gguf package's quantizer): a quarter of float32's bytes, for
        a product the weight's read dominates (the draft layer's, a row at a time)."""
        blocks = quantize(weight.detach().float().cpu().numpy(), GGMLQuantizationType.Q8_0)
        return cls("Q8_0", torch.from_numpy(blocks), *weight.shape)

    def dequantized(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The float32 weight these blocks hold (for checks against the model's own weights), or its `rows` only."""
        blocks = self.blocks if rows is None else self.blocks[rows].contiguous()
        out = torch.empty(blocks.shape[0], self.in_features)
        self._lib.qk_rows(KINDS[self.kind], blocks.data_ptr(), self.in_features, blocks.shape[0], out.data_ptr())
        return out


class StackedQuant(BlockProduct):
    """y = x @ [W_1; W_2; ...].T, one product whose rows are the parts' (a layer's q/k/v, gate/up), each part
    read in its own kind where it lies: a K-quant file stores attn_v or a layer's ffn_down in Q6_K beside Q4_K, and
    concatenating them would copy the file's bytes."""

    def __init__(self, parts: list[QuantLinear]):
        super().__init__()
        if len({p.in_features for p in parts}) != 1:
            raise ModelLoadError("stacked products: every part must read the same input")
        self.parts = nn.ModuleList(parts)
        self.kind = "+".join(dict.fromkeys(p.kind for p in parts))
        self.out_features, self.in_features = sum(p.out_features for p in parts), parts[0].in_features
        # quant_kernels.c's struct part per part: its kind number, its rows, where its weight lies.
        self.product_weight = torch.tensor([[p._kind, p.out_features, p.product_weight.data_ptr()] for p in parts],
                                           dtype=torch.int64)
        self._kind, self._lib = STACKED, kernels()

    def dequantized(self) -> torch.Tensor:
        return torch.cat([p.dequantized() for p in self.parts])


class QuantEmbedding(nn.Module):
    """A token embedding kept as the file's blocks: the rows a forward looks up are dequantized then (a step reads
    one). weight, the whole table in float32 (a tied LM head for drafters), is dequantized the first time it is
    asked for."""

    def __init__(self, table: QuantLinear):
        super().__init__()
        self.table = table
        self.num_embeddings, self.embedding_dim = table.out_features, table.in_features

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        ids = tokens.reshape(-1).to(torch.int64).contiguous()
        if len(ids) and not 0 <= int(ids.min()) <= int(ids.max()) < self.num_embeddings:
            raise IndexError(f"token id out of range for an embedding of {self.num_embeddings} rows")
        out = torch.empty(len(ids), self.embedding_dim)
        kernels().qk_take(KINDS[self.table.kind], self.table.blocks.data_ptr(), self.embedding_dim, ids.data_ptr(),
                          len(ids), out.data_ptr())
        return out.view(*tokens.shape, self.embedding_dim)

    @functools.cached_property
    def weight(self) -> torch.Tensor:
        return self.table.dequantized()
