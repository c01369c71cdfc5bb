"""The fast path's attention: which cache slots a block of queries sees, and the kernels that read only those.

T new tokens at cache slots start..start+T-1 see the committed prefix [0, start) and, among themselves, a tree
mask; `start` and the tree live in device buffers (Visible), so one captured graph serves every length.
Attention reads only the filled part of the cache, by one of three kernels (measured on the device by
`bench-gpu`, chosen with fastpath.FastOptions.attention):
- "flex": FlexAttention whose block mask lists only the KV blocks below start+T, rebuilt on the device each
  step. For fewer than 128 query rows and a power-of-two GQA group, PyTorch's inductor picks its split-KV
  decoding kernel (flash-decoding class), each block serving a KV head's whole query group.
- "flex-fold": the same with each KV head's query heads folded into the query axis: the decoding kernel
  also for groups that are not a power of two (Qwen2.5: 7 and 6), when group * T < 128.
- "sdpa": scaled_dot_product_attention over the filled length rounded up to `bucket` slots, under a mask
  built on the device; one graph per bucket.
- "auto" (default): "flex" for power-of-two groups, else "flex-fold" (inductor's rule, see above).
Each kernel is called as the eager forward.SpanAttention is, by the model's one forward (Transformer.run).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from tokenswift.model import masks
from tokenswift.model.forward import Transformer, fold_groups, merge_heads, sdpa_folded

BLOCK = 128  # FlexAttention's KV block: the filled length is read in steps of this many slots
MIN_FLEX_HEAD_DIM = 16
ATTENTION = ("auto", "flex", "flex-fold", "sdpa")


class Visible:
    """The committed prefix [0, start) plus, among the T new slots, the tree mask: both device buffers."""

    def __init__(self, t: int, capacity: int, device, start: torch.Tensor | None = None):
        self.t, self.capacity = t, capacity
        self.start = start if start is not None else torch.zeros((), dtype=torch.long, device=device)
        self.tree = torch.ones(t, t, dtype=torch.bool, device=device)
        self.offsets = torch.arange(t, device=device)
        self.slots_range = torch.arange(capacity, device=device)

    def mask(self, span: int) -> torch.Tensor:
        """[T, span] bool, True where query i may attend to slot j (masks.visible)."""
        return masks.visible(self.slots_range[None, :span] - self.start, self.offsets[:, None], self.tree)


class SdpaAttention:
    """SDPA over the first `span` slots (the filled length rounded up) under a mask built on the device."""

    def __init__(self, model: Transformer, visible: Visible, span: int):
        self.cfg, self.visible, self.span = model.cfg, visible, span
        self.mask: torch.Tensor | None = None

    def prepare(self) -> None:
        # One mask per pass, shared by all layers; repeated per query head of a group (rows j*T + t).
        self.mask = self.visible.mask(self.span).repeat(self.cfg.group, 1)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return sdpa_folded(self.cfg, q, k[:, :self.span], v[:, :self.span], self.mask)


class FlexKernel:
    """flex_attention as one loaded model runs it (LoadedModel.flex): on CUDA compiled at its first call and kept
    while the model is (the compiled code keys on shapes, so every pass and span of every job shares it); elsewhere
    eager (compiled it would materialise no less on a CPU, and the tests want eager there).

    Each pass shape (AR, draft, every verify batch, per span) is one specialisation: dynamo's default limit (8)
    would be reached within a job. Past a limit dynamo runs flex_attention uncompiled, materialising every score,
    without a word: this kernel fails instead, so the fast path's fallback (selftest.py) takes SDPA and says why.
    The limits hold for this kernel's calls only, not for the process."""

    def __init__(self, recompile_limit: int = 512, accumulated_recompile_limit: int = 4096):
        self.limits = {"recompile_limit": recompile_limit, "accumulated_recompile_limit": accumulated_recompile_limit,
                       "fail_on_recompile_limit_hit": True}
        self.compiled: Callable | None = None

    def __call__(self, q: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        from torch.nn.attention.flex_attention import flex_attention

        if q.device.type != "cuda":
            return flex_attention(q, *args, **kwargs)
        if self.compiled is None:
            self.compiled = torch.compile(flex_attention, dynamic=False)
        with torch._dynamo.config.patch(self.limits):
            return self.compiled(q, *args, **kwargs)


class FlexAttention:
    """FlexAttention over the first `span` slots that visits only the KV blocks below start+T.

    The block mask's tensors are static buffers rewritten on the device each pass: blocks wholly inside the
    prefix are "full" (no mask evaluated), the one or two blocks holding the new slots are "partial", the
    rest are never read. The decoding kernel sizes its split-KV tiles by the KV length it is given, so that
    length is the span (a power of two above the filled length, fastpath.FastPasses), not the capacity: at 4K
    filled in a 100K cache, a capacity-sized split would leave 30 of 32 splits idle. On the engine's slot-major
    cache (kv_cache.KVCache) the span's strides do not depend on the capacity either, so the compiled kernel
    of a span serves every job."""

    def __init__(self, model: Transformer, visible: Visible, fold: bool, span: int | None = None,
                 kernel: FlexKernel | None = None):
        """kernel: the loaded model's (LoadedModel.flex); None: a kernel of this attention's own."""
        from torch.nn.attention.flex_attention import BlockMask

        cfg, dev = model.cfg, visible.start.device
        self.cfg, self.visible, self.fold = cfg, visible, fold
        self.span = span = span or visible.capacity
        t = visible.t
        q_len = cfg.group * t if fold else t
        q_blocks, kv_blocks = math.ceil(q_len / BLOCK), math.ceil(span / BLOCK)
        self.kv_blocks = kv_blocks
        self.block_range = torch.arange(kv_blocks, dtype=torch.int32, device=dev)
        self.kv_num = torch.zeros(1, 1, q_blocks, dtype=torch.int32, device=dev)
        self.kv_idx = torch.zeros(1, 1, q_blocks, kv_blocks, dtype=torch.int32, device=dev)
        self.full_num = torch.zeros(1, 1, q_blocks, dtype=torch.int32, device=dev)
        self.full_idx = self.block_range.expand(1, 1, q_blocks, kv_blocks).contiguous()
        start, tree = visible.start, visible.tree

        def mask_mod(b, h, q_idx, kv_idx):
            return masks.visible(kv_idx - start, q_idx % t if fold else q_idx, tree)  # folded rows are j*T + t

        self.block_mask = BlockMask.from_kv_blocks(
            self.kv_num, self.kv_idx, self.full_num, self.full_idx, BLOCK_SIZE=BLOCK, mask_mod=mask_mod,
            seq_lengths=(q_len, span), compute_q_blocks=False)
        self.kernel = kernel or FlexKernel()
        # The decoding kernel packs a KV head's group * T query rows into one tile of next_pow2 rows and
        # finds no config once that exceeds the 128-row mask block (a verify batch): cap the tile at 128.
        rows = cfg.group * t
        decoding = not fold and cfg.group > 1 and power_of_two(cfg.group) and t < BLOCK
        self.kernel_options = {"BLOCK_M": BLOCK} if decoding and rows > BLOCK else None

    def prepare(self) -> None:
        start, t = self.visible.start, self.visible.t
        first = (start // BLOCK).to(torch.int32)  # blocks [0, first) lie wholly in the prefix
        last = ((start + t + BLOCK - 1) // BLOCK).to(torch.int32)  # blocks [first, last) hold new slots
        self.full_num.copy_(first.expand_as(self.full_num))
        self.kv_num.copy_((last - first).expand_as(self.kv_num))
        partial = (self.block_range + first).clamp(max=self.kv_blocks - 1)
        self.kv_idx.copy_(partial.expand_as(self.kv_idx))

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        k, v = k[:, :self.span], v[:, :self.span]
        if self.fold:
            out = self.kernel(fold_groups(cfg, q)[None], k[None], v[None], block_mask=self.block_mask)
        else:
            out = self.kernel(q.transpose(0, 1)[None], k[None], v[None], block_mask=self.block_mask,
                              enable_gqa=cfg.group > 1, kernel_options=self.kernel_options)
        return merge_heads(cfg, out[0], q.shape[0])


def power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def effective_kind(kind: str, cfg) -> str:
    if cfg.head_dim < MIN_FLEX_HEAD_DIM:
        return "sdpa"  # FlexAttention's kernels need a head_dim of at least 16 (tl.dot): tiny test models
    if kind == "auto":
        return "flex" if power_of_two(cfg.group) else "flex-fold"
    return kind


def make_attention(kind: str, model: Transformer, visible: Visible, span: int, flex: FlexKernel | None = None):
    """The attention of one pass; flex: the loaded model's compiled kernel, for the flex kinds."""
    kind = effective_kind(kind, model.cfg)
    if kind == "sdpa":
        return SdpaAttention(model, visible, span)
    return FlexAttention(model, visible, fold=kind == "flex-fold", span=span, kernel=flex)
