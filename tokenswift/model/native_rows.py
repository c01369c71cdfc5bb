"""A decoder layer's steps for a few rows on the CPU in float32 (and float64), by the C kernels attention_kernel.c and
layer_kernels.c: a layer in two calls around its attention (NativeBlock: the norms, the four products, RoPE with
the cache write, SwiGLU, the residual adds), attention over the KV cache, and the float32 products of a few rows
(the LM head).

A decoding step, a draft pass and a verify batch run 1 to a few rows, where torch's cost is dispatch: the
default model's step ran ~1,240 operators (about 11 of its 29 ms in q4 on this 2-core machine), then, one C call
per step, ~420 with ~10 ms of Python around them; torch's flash-attention kernel, which runs a few rows as small
GEMMs per KV block, took 0.66 ms a layer at a 2K-token context. The forward (forward.py) runs all its layers in
one call where it has them (run_layers: each layer's two block calls and its attention, in C; the Python around
three calls a layer was a fifth of a q4 step of the default model); the draft layer hands its one layer to a
NativeBlock (Block.forward). Loading sets them on a
float32 CPU model (Transformer.native), q4 included, and on a float64 one (native.DOUBLE), where a C compiler builds
them; a float model's prefill chunks (more than MAX_ROWS rows) keep torch's operators, whose GEMMs pay off there
(a quantized model's prefill runs the kernels: Transformer.prefills_by_rows). A verify batch
runs on the kernels whatever its rows (the forward's exact_rows), attention included, so each row is bit for bit
what a plain step computes: torch's GEMMs order their sums otherwise (in q4, from quant.DENSE_ROWS rows, they
dequantize the weight).
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

import torch
from torch import nn

from tokenswift.model import native
from tokenswift.model.config import ModelConfig
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.kv_q8 import Q8, row_width
from tokenswift.model.quant import BlockProduct

MAX_ROWS = 16  # query tokens per forward for which the kernels are used (a verify pass: any number)
PRODUCT_ROWS = 8  # a float32 product of up to this many rows outside a layer (the LM head, the draft layer's fc and
# head) streams the weight once
CACHE_KINDS = {torch.bfloat16: 1, Q8: 2}  # a float32 model's compact caches, as real.h numbers them (0: its own dtype)
DENSE_KIND = -1  # struct product's kind for a dense weight; GGUF blocks carry QuantLinear's kind number


class Product(ctypes.Structure):
    _fields_ = [("weight", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
                ("kind", ctypes.c_int64)]


class Layout(ctypes.Structure):
    """layer_kernels.c's struct block: where a layer's weights are and its sizes."""
    _fields_ = [("qkv", Product), ("o", Product), ("gate_up", Product), ("down", Product),
                ("input_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p), ("eps", ctypes.c_double),
                ("dim", ctypes.c_int64), ("heads", ctypes.c_int64), ("kv_heads", ctypes.c_int64),
                ("head_dim", ctypes.c_int64), ("intermediate", ctypes.c_int64)]


class NativeBlock:
    """One decoder layer (forward.Block) by the C kernels, in two calls around its attention. It holds the layer's
    weights (float32, or GGUF blocks for q4) for as long as it lives: the C side has their addresses only."""

    def __init__(self, rows: NativeRows, cfg: ModelConfig, block: nn.Module):
        self.rows, self.lib, self.cfg = rows, rows.lib, cfg  # rows: the model's kernels (their products)
        attn, mlp = block.self_attn, block.mlp
        if block.input_layernorm.eps != block.post_attention_layernorm.eps:
            raise ValueError("native block: the layer's two norms must share their eps")
        self.tensors: list[torch.Tensor] = []
        products = [self._product(m) for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)]
        norms = [self._keep(norm.weight) for norm in (block.input_layernorm, block.post_attention_layernorm)]
        self.layout = Layout(*products, *norms, block.input_layernorm.eps, cfg.dim, cfg.n_heads, cfg.n_kv_heads,
                             cfg.head_dim, cfg.intermediate_size)
        self.ref = ctypes.byref(self.layout)

    def _keep(self, tensor: torch.Tensor) -> int:
        tensor = tensor.detach()
        if tensor.dtype not in (self.rows.dtype, torch.uint8) or not tensor.is_contiguous():
            raise ValueError(f"native block: weights must be contiguous {self.rows.dtype} (or GGUF blocks)")
        self.tensors.append(tensor)
        return tensor.data_ptr()

    def _product(self, module: nn.Module) -> Product:
        if isinstance(module, BlockProduct):  # its weight (blocks, packed blocks or a StackedQuant's parts table)
            self.tensors.append(module.product_weight)
            return Product(module.product_weight.data_ptr(), None, module.out_features, module.in_features,
                           module._kind)
        bias = self._keep(module.bias) if module.bias is not None else None
        return Product(self._keep(module.weight), bias, module.out_features, module.in_features, DENSE_KIND)

    def before_attention(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                         keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """x [T, dim] -> q [T, heads, head_dim] rotated; the rotated keys and the values written to `slots` of
        keys/values (this layer's cache, [kv_heads, capacity, head_dim], the same strides; the kernels' dtype, or
        a compact cache's bfloat16 or q8 rows, rounded as torch rounds)."""
        kind = self.rows.cache_element(keys, values)
        _contiguous(x)
        cos, sin, slots = cos.contiguous(), sin.contiguous(), slots.contiguous()
        q = torch.empty(x.shape[0], self.cfg.n_heads, self.cfg.head_dim, dtype=self.rows.dtype)
        if self.lib.block_in(self.ref, x.data_ptr(), x.shape[0], cos.data_ptr(), sin.data_ptr(), slots.data_ptr(),
                             keys.data_ptr(), values.data_ptr(), kind, keys.stride(0), keys.stride(1), q.data_ptr(),
                             torch.get_num_threads()):
            raise MemoryError("native block: out of memory for a layer's activations")
        return q

    def after_attention(self, x: torch.Tensor, attn: torch.Tensor) -> None:
        """x [T, dim] (contiguous) += the attention output attn [T, heads * head_dim] projected, then += the MLP of
        its post-attention norm: in place."""
        attn = attn.contiguous()
        _contiguous(x)
        if self.lib.block_out(self.ref, x.data_ptr(), attn.data_ptr(), x.shape[0], torch.get_num_threads()):
            raise MemoryError("native block: out of memory for a layer's activations")


class NativeRows:
    """A model's kernels: its layers' NativeBlocks (blocks), attention, and few-row products, in `dtype`
    (float32, or float64 with a library built with native.DOUBLE)."""

    def __init__(self, lib: ctypes.CDLL, dtype: torch.dtype = torch.float32):
        self.lib, self.dtype = lib, dtype
        self.blocks: list[NativeBlock] = []  # a model's layers (for_model)
        self.layouts = None  # their Layouts' addresses, a C array (run_layers)

    @classmethod
    def for_model(cls, model: nn.Module) -> NativeRows | None:
        """The kernels for `model` (forward.Transformer, its final weights loaded): on the CPU in float32 or float64,
        where they build, else None."""
        weight = model.model.norm.weight  # the model's dtype (a quantized embedding's table is not float)
        if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.float64):
            return None
        lib = native.available(native.DOUBLE if weight.dtype == torch.float64 else ())
        if lib is None:
            return None
        rows = cls(lib, weight.dtype)
        rows.blocks = [NativeBlock(rows, model.cfg, block) for block in model.model.layers]
        rows.layouts = (ctypes.c_void_p * len(rows.blocks))(*(ctypes.addressof(b.layout) for b in rows.blocks))
        return rows

    def run_layers(self, cfg: ModelConfig, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   slots: torch.Tensor, cache: KVCache, seen: SeenSlots, queries: list | None,
                   keep: tuple[int, ...], kept: list | None) -> torch.Tensor:
        """Every layer of the model (its blocks) on x [T, dim], in one C call (layer_kernels.c's run_layers: each
        layer's block_in, attention and block_out, as NativeBlock and attend run them one by one): writes the K/V
        of the T tokens to `slots` of every layer, returns the last layer's output. Appends each layer's rotated
        queries [T, heads, head_dim] to `queries` when given, and the outputs of the layers numbered in `keep`
        (from 1) to `kept`."""
        keys, values = cache.layers[0]
        kind = self.cache_element(keys, values)
        t = x.shape[0]
        x = x.contiguous()
        cos, sin, slots = cos.contiguous(), sin.contiguous(), slots.contiguous()
        n = len(self.blocks)
        captured = torch.empty(n, t, cfg.n_heads, cfg.head_dim, dtype=self.dtype) if queries is not None else None
        flags = torch.tensor([number in keep for number in range(1, n + 1)], dtype=torch.int64) if keep else None
        saved = torch.empty(len(keep), t, cfg.dim, dtype=self.dtype) if keep else None
        layer_bytes = cache.k.stride(0) * cache.k.element_size()
        if self.lib.run_layers(self.layouts, n, x.data_ptr(), t, cos.data_ptr(), sin.data_ptr(), slots.data_ptr(),
                               keys.data_ptr(), values.data_ptr(), layer_bytes, kind, keys.stride(0),
                               keys.stride(1), seen.shared, seen.tail.data_ptr(), seen.count.data_ptr(),
                               seen.tail.shape[1], 1.0 / math.sqrt(cfg.head_dim),
                               captured.data_ptr() if captured is not None else None,
                               flags.data_ptr() if flags is not None else None,
                               saved.data_ptr() if saved is not None else None, torch.get_num_threads()):
            raise MemoryError("native layers: out of memory for a layer's activations")
        if queries is not None:
            queries.extend(captured.unbind(0))
        if keep:
            kept.extend(saved.unbind(0))
        return x

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x [rows, in] @ weight [out, in].T for a weight of the kernels' dtype (forward.project: up to PRODUCT_ROWS
        rows)."""
        x = x.contiguous()
        out = torch.empty(x.shape[0], weight.shape[0], dtype=self.dtype)
        self.lib.dense_matmul(weight.data_ptr(), weight.shape[0], weight.shape[1], x.data_ptr(), x.shape[0],
                            out.data_ptr(), torch.get_num_threads())
        return out

    def cache_element(self, keys: torch.Tensor, values: torch.Tensor) -> int:
        """What a cache layer holds, as the C kernels take it (real.h's KV_REAL, KV_BF16, KV_Q8): the kernels' dtype,
        or for a float32 model's compact cache bfloat16 or q8 rows (kv_q8.py); anything else is refused (the C side
        reads them unchecked)."""
        _same_strides(keys, values)
        kind = CACHE_KINDS.get(keys.dtype) if keys.dtype != self.dtype else 0
        if keys.dtype != values.dtype or kind is None or (kind and self.dtype != torch.float32):
            raise ValueError(f"native rows: a {keys.dtype} cache for {self.dtype} kernels")
        return kind

    def attend(self, cfg: ModelConfig, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               mask: torch.Tensor | SeenSlots | None) -> torch.Tensor:
        """q [T, heads, head_dim]; keys, values [kv_heads, span, head_dim] (a cache's layer: the kernels' dtype or
        bfloat16); mask None (every row sees every slot), [T, span] bool, or the SeenSlots of one (a forward's
        layers share them) -> [T, heads * head_dim]."""
        t, span = q.shape[0], keys.shape[1]
        kind = self.cache_element(keys, values)
        if keys.shape[-1] != (row_width(cfg.head_dim) if keys.dtype == Q8 else cfg.head_dim):
            raise ValueError(f"row attention: cache rows of {keys.shape[-1]} elements for head_dim {cfg.head_dim}")
        seen = mask if isinstance(mask, SeenSlots) else SeenSlots.of(mask, t, span)
        if seen.span != span or seen.count.shape[0] != t:  # the C side reads the lists unchecked
            raise ValueError(f"row attention: slots seen by {seen.count.shape[0]} rows over {seen.span} slots, "
                             f"for {t} rows over {span}")
        q = q.contiguous()
        out = torch.empty(t, cfg.n_heads * cfg.head_dim, dtype=self.dtype)
        if self.lib.attend_rows(q.data_ptr(), t, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, keys.data_ptr(),
                                values.data_ptr(), kind, keys.stride(0), keys.stride(1), seen.shared,
                                seen.tail.data_ptr(), seen.count.data_ptr(), seen.tail.shape[1],
                                1.0 / math.sqrt(cfg.head_dim),
                                out.data_ptr(), torch.get_num_threads()):
            raise MemoryError("row attention: out of memory for the per-chunk partial sums")
        return out


@dataclass(frozen=True)
class SeenSlots:
    """The cached slots each query token sees, as attention_kernel.c takes them: all of [0, shared), then its own
    ascending slots tail[i, :count[i]]. The kernel cuts a token's slots into chunks in this order, so a verify
    batch's tree row (the prefix, then its ancestors among other candidates' slots) is cut as a plain step at its
    position cuts its contiguous slots, and rounds the same."""

    span: int  # the cache slots [0, span) the lists refer to
    shared: int
    tail: torch.Tensor  # [T, width] int64 (width: the most any token has)
    count: torch.Tensor  # [T] int64

    @classmethod
    def of(cls, mask: torch.Tensor | None, t: int, span: int) -> SeenSlots:
        """From a [T, span] bool mask (True = may attend), or None: every token sees [0, span)."""
        if mask is None:
            return cls(span, span, torch.zeros(t, 0, dtype=torch.int64), torch.zeros(t, dtype=torch.int64))
        if tuple(mask.shape) != (t, span):
            raise ValueError(f"row attention: a mask of shape {tuple(mask.shape)} for {t} rows over {span} slots")
        hidden = (~mask.all(0)).nonzero()
        shared = int(hidden[0]) if len(hidden) else span
        rest = mask[:, shared:]
        count = rest.sum(1)
        width = int(count.max()) if t else 0
        # A stable sort puts each row's visible slots first, in slot order.
        order = torch.sort((~rest).to(torch.uint8), dim=1, stable=True).indices[:, :width]
        return cls(span, shared, (order + shared).contiguous(), count.contiguous())


def _contiguous(x: torch.Tensor) -> None:
    if not x.is_contiguous():  # the C side reads and writes it as [T, dim] rows (Block.forward makes it so)
        raise ValueError("native block: the layer's input must be contiguous (it is updated in place)")


def _same_strides(keys: torch.Tensor, values: torch.Tensor) -> None:
    if keys.stride() != values.stride() or keys.stride(2) != 1:
        raise ValueError("native rows: keys and values must share strides, with a contiguous last dim")
