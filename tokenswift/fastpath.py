"""The GPU fast path (opt-in): the engine's three model passes with static shapes, device-side lengths and
CUDA graphs, so plain decoding runs near the memory-bandwidth limit and TokenSwift runs on top of it.

One block forward serves every pass: T new tokens at cache slots start..start+T-1 see the committed prefix
[0, start) and, among themselves, a tree mask. AR is T = 1 over the full cache, the draft pass T = 1 over
the partial cache (plus the draft heads), verify T = the padded candidate batch over the full cache.
All shapes are fixed per pass, and `start`, the positions and the tree live in device buffers that the
host fills before a replay, so one captured graph serves every step at every context length.

Attention reads only the filled part of the cache, by one of three kernels (measured on the device by
`bench-gpu`, chosen with FastOptions.attention):
- "flex": FlexAttention whose block mask lists only the KV blocks below start+T, rebuilt on the device each
  step; PyTorch runs its split-KV decoding kernel for short query blocks, with GQA heads sharing K/V.
- "flex-fold": the same with each KV head's query heads folded into the query axis (K/V read once per
  KV head even where the GQA decoding kernel does not apply).
- "sdpa": scaled_dot_product_attention over the filled length rounded up to `bucket` slots, under a mask
  built on the device; one graph per bucket.

The compile boundary is `Pass._compute`: it takes no arguments and touches only static buffers. It is
captured as a CUDA graph ("cuda", the default on CUDA), compiled with torch.compile mode="reduce-overhead"
("compile"), or run eagerly ("none": CPU, where the tests check it against the eager model). The engine's
loop, the trie, the n-gram table and the walk stay on the host.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .kv_cache import KVCache
from .loading import LoadedModel
from .model import Transformer
from .rope import apply_rope
from .sampling import Sampler
from .trie import Trie

BLOCK = 128  # FlexAttention's KV block: the filled length is read in steps of this many slots
ATTENTION = ("flex", "flex-fold", "sdpa")
GRAPHS = ("cuda", "compile", "none")


@dataclass(frozen=True)
class FastOptions:
    attention: str = "flex"  # kernel of the AR and draft passes (see the module docstring)
    verify_attention: str | None = None  # kernel of the verify pass; None = the same as `attention`
    graphs: str | None = None  # "cuda" | "compile" | "none"; None = "cuda" on a CUDA device, else "none"
    bucket: int = 2048  # sdpa: KV span granularity in slots (one graph per span and pass)
    batched_targets: bool = True  # sample every trie node's target token at once: one host sync per verify

    def __post_init__(self) -> None:
        for name in ("attention", "verify_attention"):
            value = getattr(self, name)
            if value is not None and value not in ATTENTION:
                raise ValueError(f"{name}: unknown kernel {value!r}; use one of {', '.join(ATTENTION)}")
        if self.graphs is not None and self.graphs not in GRAPHS:
            raise ValueError(f"graphs: unknown mode {self.graphs!r}; use one of {', '.join(GRAPHS)}")
        if self.bucket < 1:
            raise ValueError("bucket: must be >= 1")


def enable(lm: LoadedModel, options: FastOptions | None = None) -> None:
    """Turn the fast path on for every Engine built on `lm` (the Generator needs no new argument)."""
    lm.extras["fast"] = options or FastOptions()


def options_of(lm: LoadedModel) -> FastOptions | None:
    return lm.extras.get("fast")


# -- which slots a block of queries sees ------------------------------------------------------------------


class Visible:
    """The committed prefix [0, start) plus, among the T new slots, the tree mask: both device buffers."""

    def __init__(self, t: int, capacity: int, device):
        self.t, self.capacity = t, capacity
        self.start = torch.zeros((), dtype=torch.long, device=device)
        self.tree = torch.ones(t, t, dtype=torch.bool, device=device)
        self.offsets = torch.arange(t, device=device)
        self.slots_range = torch.arange(capacity, device=device)

    def mask(self, span: int) -> torch.Tensor:
        """[T, span] bool, True where query i may attend to slot j."""
        rel = self.slots_range[None, :span] - self.start
        block = self.tree.gather(1, rel.clamp(0, self.t - 1).expand(self.t, span))
        return (rel < 0) | ((rel < self.t) & block)


class SdpaAttention:
    """SDPA over the first `span` slots (the filled length rounded up), GQA folded into the query axis."""

    def __init__(self, model: Transformer, visible: Visible, span: int):
        self.cfg, self.visible, self.span = model.cfg, visible, span
        self.mask: torch.Tensor | None = None

    def prepare(self) -> None:
        # One mask per pass, shared by all layers; repeated per query head of a group (rows j*T + t).
        self.mask = self.visible.mask(self.span).repeat(self.cfg.group, 1)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cfg, t = self.cfg, q.shape[0]
        qg = q.transpose(0, 1).reshape(cfg.n_kv_heads, cfg.group * t, cfg.head_dim)
        out = F.scaled_dot_product_attention(qg, k[:, :self.span], v[:, :self.span], attn_mask=self.mask)
        return out.view(cfg.n_heads, t, cfg.head_dim).transpose(0, 1).reshape(t, -1)


_compiled_flex: Callable | None = None


def flex_kernel(device: torch.device) -> Callable:
    """flex_attention, compiled on CUDA (eager it materialises all scores; on CPU the tests want eager)."""
    global _compiled_flex  # one compiled wrapper per process, like gpt-fast's; its cache keys on shapes
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda":
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


class FlexAttention:
    """FlexAttention that visits only the KV blocks below start+T.

    The block mask's tensors are static buffers rewritten on the device each pass: blocks wholly inside the
    prefix are "full" (no mask evaluated), the one or two blocks holding the new slots are "partial", the
    rest are never read. That is the split-KV decoding loop bounded by the filled length, not the capacity."""

    def __init__(self, model: Transformer, visible: Visible, fold: bool):
        from torch.nn.attention.flex_attention import BlockMask

        cfg, dev = model.cfg, visible.start.device
        self.cfg, self.visible, self.fold = cfg, visible, fold
        t = visible.t
        q_len = cfg.group * t if fold else t
        q_blocks, kv_blocks = math.ceil(q_len / BLOCK), math.ceil(visible.capacity / BLOCK)
        self.kv_blocks = kv_blocks
        self.block_range = torch.arange(kv_blocks, dtype=torch.int32, device=dev)
        self.kv_num = torch.zeros(1, 1, q_blocks, dtype=torch.int32, device=dev)
        self.kv_idx = torch.zeros(1, 1, q_blocks, kv_blocks, dtype=torch.int32, device=dev)
        self.full_num = torch.zeros(1, 1, q_blocks, dtype=torch.int32, device=dev)
        self.full_idx = self.block_range.expand(1, 1, q_blocks, kv_blocks).contiguous()
        start, tree = visible.start, visible.tree

        def mask_mod(b, h, q_idx, kv_idx):
            row = q_idx % t if fold else q_idx  # folded rows are j*T + t
            rel = kv_idx - start
            return (rel < 0) | ((rel < t) & tree[row, rel.clamp(0, t - 1)])

        self.block_mask = BlockMask.from_kv_blocks(
            self.kv_num, self.kv_idx, self.full_num, self.full_idx, BLOCK_SIZE=BLOCK, mask_mod=mask_mod,
            seq_lengths=(q_len, visible.capacity), compute_q_blocks=False)
        self.kernel = flex_kernel(dev)

    def prepare(self) -> None:
        start, t = self.visible.start, self.visible.t
        first = (start // BLOCK).to(torch.int32)  # blocks [0, first) lie wholly in the prefix
        last = ((start + t + BLOCK - 1) // BLOCK).to(torch.int32)  # blocks [first, last) hold new slots
        self.full_num.copy_(first.expand_as(self.full_num))
        self.kv_num.copy_((last - first).expand_as(self.kv_num))
        partial = (self.block_range + first).clamp(max=self.kv_blocks - 1)
        self.kv_idx.copy_(partial.expand_as(self.kv_idx))

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cfg, t = self.cfg, q.shape[0]
        if self.fold:
            qg = q.transpose(0, 1).reshape(cfg.n_kv_heads, cfg.group * t, cfg.head_dim)
            out = self.kernel(qg[None], k[None], v[None], block_mask=self.block_mask)
        else:
            out = self.kernel(q.transpose(0, 1)[None], k[None], v[None], block_mask=self.block_mask,
                              enable_gqa=cfg.group > 1)
        return out.view(cfg.n_heads, t, cfg.head_dim).transpose(0, 1).reshape(t, -1)


def make_attention(kind: str, model: Transformer, visible: Visible, span: int):
    if kind == "sdpa":
        return SdpaAttention(model, visible, span)
    return FlexAttention(model, visible, fold=kind == "flex-fold")


# -- one static-shape pass ------------------------------------------------------------------------------


class Pass:
    """T new tokens through the model at slots start..start+T-1 of one cache, with static shapes.

    Inputs (tokens, positions, start, tree) and outputs (logits, per-layer queries) are buffers allocated
    once; `_compute` reads and writes only those, so it can be captured once and replayed every step."""

    def __init__(self, model: Transformer, cache: KVCache, t: int, kind: str, span: int, graphs: str,
                 heads=None, draft_rows: int = 1, queries: bool = False, pool=None):
        cfg, dev = model.cfg, model.rope_cos.device
        self.model, self.cache, self.heads, self.draft_rows = model, cache, heads, draft_rows
        self.tokens = torch.zeros(t, dtype=torch.long, device=dev)
        self.positions = torch.zeros(t, dtype=torch.long, device=dev)
        self.visible = Visible(t, cache.capacity, dev)
        self.attention = make_attention(kind, model, self.visible, span)
        rows = draft_rows if draft_rows > 1 else t
        self.logits = torch.empty(rows, cfg.vocab_size, dtype=model.rope_cos.dtype, device=dev)
        shape = (cfg.n_layers, t, cfg.n_heads, cfg.head_dim)
        self.queries = torch.empty(shape, dtype=self.logits.dtype, device=dev) if queries else None
        self.graphs, self.pool = graphs, pool
        self.graph: torch.cuda.CUDAGraph | None = None
        self._run = self._compute
        if graphs == "compile":
            for buf in self._buffers():
                torch._dynamo.mark_static_address(buf)  # no copies into cudagraph-owned inputs
            self._run = torch.compile(self._compute, mode="reduce-overhead", fullgraph=True, dynamic=False)

    def _buffers(self) -> list[torch.Tensor]:
        bufs = [self.tokens, self.positions, self.visible.start, self.visible.tree, self.logits,
                self.cache.k, self.cache.v, self.model.rope_cos, self.model.rope_sin]
        return bufs + ([self.queries] if self.queries is not None else [])

    @torch.inference_mode()
    def __call__(self) -> None:
        if self.graphs != "cuda":
            self._run()
        elif self.graph is None:
            self.graph = capture(self._compute, self.pool)  # lazily: the buffers now hold real inputs
            self.graph.replay()
        else:
            self.graph.replay()

    def _compute(self) -> None:
        """The compile boundary: embed, the decoder layers writing K/V into the cache, the LM head."""
        model = self.model
        cos, sin = model.rope_cos[self.positions], model.rope_sin[self.positions]
        slots = self.visible.start + self.visible.offsets
        self.attention.prepare()
        x = model.model.embed_tokens(self.tokens)
        for i, layer in enumerate(model.model.layers):
            x = self._layer(layer, i, x, cos, sin, slots)
        rows = [model.model.norm(x)]
        if self.draft_rows > 1:
            rows.extend(self.heads(x)[: self.draft_rows - 1])  # chained draft heads on the pre-norm state
        self.logits.copy_(model.head(torch.cat(rows)))

    def _layer(self, layer, i: int, x, cos, sin, slots) -> torch.Tensor:
        cfg, attn, t = self.model.cfg, layer.self_attn, x.shape[0]
        h = layer.input_layernorm(x)
        q = apply_rope(attn.q_proj(h).view(t, cfg.n_heads, cfg.head_dim), cos, sin)
        k = apply_rope(attn.k_proj(h).view(t, cfg.n_kv_heads, cfg.head_dim), cos, sin)
        v = attn.v_proj(h).view(t, cfg.n_kv_heads, cfg.head_dim)
        keys, values = self.cache.k[i], self.cache.v[i]
        keys.index_copy_(1, slots, k.transpose(0, 1))  # device-side slots: no host sync, any context
        values.index_copy_(1, slots, v.transpose(0, 1))
        if self.queries is not None:
            self.queries[i].copy_(q)
        x = x + attn.o_proj(self.attention(q, keys, values))
        return x + layer.mlp(layer.post_attention_layernorm(x))


def capture(fn: Callable[[], None], pool) -> torch.cuda.CUDAGraph:
    """Warm up on a side stream (compiles flex kernels, sets up cuBLAS), then capture one call.

    Graphs of one engine share a memory pool: they replay one at a time on one stream, and their outputs
    live in buffers allocated outside the pool, so one graph's scratch never holds another's result. The
    warm-up calls write the same K/V the real call writes, so they change nothing."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        fn()
    return graph


# -- the passes of one engine ----------------------------------------------------------------------------


class FastPasses:
    """AR, draft and verify passes over one full KV cache, each created (and captured) on first use."""

    def __init__(self, lm: LoadedModel, cache: KVCache, options: FastOptions | None = None):
        options = options or FastOptions()
        if lm.config.sliding_window is not None:
            raise ValueError("the fast path does not implement sliding-window attention; run without it")
        self.lm, self.cache, self.options = lm, cache, options
        self.graphs = options.graphs or ("cuda" if lm.device.type == "cuda" else "none")
        if self.graphs != "none" and lm.device.type != "cuda":
            raise ValueError(f"graphs={self.graphs!r} needs a CUDA device")
        self.pool = torch.cuda.graph_pool_handle() if self.graphs == "cuda" else None
        self.passes: dict[tuple, Pass] = {}
        lm.ensure_positions(cache.capacity)  # the RoPE table is read by captured graphs: fix it before

    def _span(self, kind: str, cache: KVCache, end: int) -> int:
        if kind != "sdpa":
            return cache.capacity  # flex reads only the listed blocks: one graph for every length
        bucket = self.options.bucket
        return min(cache.capacity, -(-end // bucket) * bucket)

    def _get(self, name: str, cache: KVCache, t: int, kind: str, end: int, **kw) -> Pass:
        span = self._span(kind, cache, end)
        key = (name, id(cache), t, kind, span)
        if key not in self.passes:
            self.passes[key] = Pass(self.lm.model, cache, t, kind, span, self.graphs, pool=self.pool, **kw)
        return self.passes[key]

    def ar(self, token: torch.Tensor, n: int) -> torch.Tensor:
        """Logits [1, V] after `token` (a device tensor [1]) at slot and position n; K/V written at n."""
        _check_room(self.cache, n, 1)
        p = self._get("ar", self.cache, 1, self.options.attention, n + 1)
        p.tokens.copy_(token)
        p.positions.fill_(n)
        p.visible.start.fill_(n)
        p()
        return p.logits

    def draft(self, cache: KVCache, root: int, position: int, start: int, rows: int) -> torch.Tensor:
        """Draft logits [rows, V] for the root at `position`, written at slot `start` of the partial cache:
        row 0 from the base head, rows 1.. from the chained draft heads."""
        _check_room(cache, start, 1)
        p = self._get("draft", cache, 1, self.options.attention, start + 1, heads=self.lm.heads,
                      draft_rows=rows)
        p.tokens.fill_(root)
        p.positions.fill_(position)
        p.visible.start.fill_(start)
        p()
        return p.logits

    def verify(self, tokens: torch.Tensor, positions: torch.Tensor, tree: torch.Tensor,
               start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [T, V] and per-layer queries [layers, T, heads, head_dim] of a padded candidate batch."""
        t = tokens.shape[0]
        _check_room(self.cache, start, t)
        kind = self.options.verify_attention or self.options.attention
        p = self._get("verify", self.cache, t, kind, start + t, queries=True)
        p.tokens.copy_(tokens)
        p.positions.copy_(positions)
        p.visible.tree.copy_(tree)
        p.visible.start.fill_(start)
        p()
        return p.logits, p.queries

    def wrap_drafter(self, drafter) -> FastDrafter:
        return FastDrafter(drafter, self)


def _check_room(cache: KVCache, start: int, t: int) -> None:
    # Checked on the host, which knows the length: a device-side index_copy_ out of range would be an
    # asynchronous CUDA error far from its cause.
    if start + t > cache.capacity:
        raise RuntimeError(f"KV cache full: need {start + t} slots, have {cache.capacity}")


class FastDrafter:
    """TokenSwift's heads drafter with its draft pass on the fast path: the same proposals, static shapes."""

    def __init__(self, inner, passes: FastPasses):
        self.inner, self.passes = inner, passes
        self.partial, self.widths, self.sampler = inner.partial, inner.widths, inner.sampler

    def start(self, full: KVCache, length: int, queries: list[torch.Tensor]) -> None:
        self.inner.start(full, length, queries)

    def wants_queries(self, count: int) -> bool:
        return self.inner.wants_queries(count)

    def commit(self, full: KVCache, start: int, end: int, queries) -> None:
        self.inner.commit(full, start, end, queries)

    def propose(self, root: int, position: int, window: torch.Tensor | None) -> list[list[int]]:
        logits = self.passes.draft(self.partial.cache, root, position, self.partial.n, len(self.widths))
        if window is not None:  # as HeadsDrafter: only the penalty can change which tokens lead
            logits = self.sampler.penalize(logits, window.expand(logits.shape[0], -1))
        best = torch.topk(logits, max(self.widths), dim=-1).indices.tolist()
        return [best[i][:w] for i, w in enumerate(self.widths)]


# -- the target's tokens for every trie node at once -----------------------------------------------------


def node_windows(buf: torch.Tensor, trie: Trie, length: int, w: int) -> torch.Tensor:
    """[nodes, w] penalty windows, padded with -1: node i sees the last w tokens of ids[:length+1] + its path.

    Row i is cat(history tail of w tokens, path_i)[d_i : d_i + w] with d_i the node's depth; the penalty
    only asks which ids occur in a window, so this equals the engine's per-node `_window`."""
    n, end = len(trie.tokens), length + 1
    depth = max(trie.depths)
    paths = torch.full((n, max(depth, 1)), -1, dtype=torch.long)
    depths = torch.tensor(trie.depths, dtype=torch.long)
    for i in range(1, n):  # parents come before children: extend the parent's path by one token
        parent, d = trie.parents[i], trie.depths[i]
        paths[i, : d - 1] = paths[parent, : d - 1]
        paths[i, d - 1] = trie.tokens[i]
    dev = buf.device
    tail = buf[max(0, end - w):end]
    history = torch.cat((torch.full((w - tail.numel(),), -1, dtype=torch.long, device=dev), tail))
    rows = torch.cat((history.expand(n, w), paths.to(dev)), dim=1)
    cols = depths.to(dev)[:, None] + torch.arange(w, device=dev)[None, :]
    return rows.gather(1, cols)


def node_targets(sampler: Sampler, logits: torch.Tensor, trie: Trie, buf: torch.Tensor, length: int,
                 w: int | None) -> list[int]:
    """The target's token after every trie node, sampled in one batch with one host sync.

    Row-wise sampling with each node's own penalty window and position-keyed noise (position length+d+1)
    gives each node exactly the token the per-node walk would sample (design §3)."""
    n = len(trie.tokens)
    windows = node_windows(buf, trie, length, w) if w else None
    positions = [length + d + 1 for d in trie.depths]
    return sampler.sample(logits[:n], windows, positions).tolist()
