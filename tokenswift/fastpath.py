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
  step. For fewer than 128 query rows and a power-of-two GQA group, PyTorch's inductor picks its split-KV
  decoding kernel (flash-decoding class), each block serving a KV head's whole query group.
- "flex-fold": the same with each KV head's query heads folded into the query axis: the decoding kernel
  also for groups that are not a power of two (Qwen2.5: 7 and 6), when group * T < 128.
- "sdpa": scaled_dot_product_attention over the filled length rounded up to `bucket` slots, under a mask
  built on the device; one graph per bucket.
- "auto" (default): "flex" for power-of-two groups, else "flex-fold" (inductor's rule, see above).

The AR and verify graphs also sample (DeviceSampler: the same row-wise sampler with position-keyed noise
computed on the device), so an AR step costs one replay and one host sync for its token, and a verify pass
one replay and one sync for the target's token after every trie node.

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

from .drafting import best_per_depth
from .kv_cache import KVCache
from .loading import LoadedModel
from .model import Transformer
from .rope import apply_rope
from .sampling import M32, Sampler, mix32, position_key
from .trie import Trie

BLOCK = 128  # FlexAttention's KV block: the filled length is read in steps of this many slots
MIN_FLEX_HEAD_DIM = 16
MAX_DEPTH = 16  # deepest trie path a verify batch may hold (gamma + 1 <= 9 levels; n-grams 4)
CAPACITY_STEP = 4096  # fast-path caches are allocated in these steps, so runs share compiled kernels
ATTENTION = ("auto", "flex", "flex-fold", "sdpa")
GRAPHS = ("cuda", "compile", "none")


@dataclass(frozen=True)
class FastOptions:
    attention: str = "auto"  # kernel of the AR and draft passes (see the module docstring)
    verify_attention: str | None = None  # kernel of the verify pass; None = the same as `attention`
    graphs: str | None = None  # "cuda" | "compile" | "none"; None = "cuda" on a CUDA device, else "none"
    bucket: int = 2048  # sdpa: KV span granularity in slots (one graph per span and pass)
    sample_in_graph: bool = True  # sample inside the AR and verify graphs: one host sync per step

    def __post_init__(self) -> None:
        for name in ("attention", "verify_attention"):
            value = getattr(self, name)
            if value is not None and value not in ATTENTION:
                raise ValueError(f"{name}: unknown kernel {value!r}; use one of {', '.join(ATTENTION)}")
        if self.graphs is not None and self.graphs not in GRAPHS:
            raise ValueError(f"graphs: unknown mode {self.graphs!r}; use one of {', '.join(GRAPHS)}")
        if self.bucket < 1:
            raise ValueError("bucket: must be >= 1")


def padded_capacity(slots: int) -> int:
    return -(-slots // CAPACITY_STEP) * CAPACITY_STEP


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

    def buffers(self) -> list[torch.Tensor]:
        return [self.start, self.tree, self.offsets, self.slots_range]

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

    def buffers(self) -> list[torch.Tensor]:
        return []

    def prepare(self) -> None:
        # One mask per pass, shared by all layers; repeated per query head of a group (rows j*T + t).
        self.mask = self.visible.mask(self.span).repeat(self.cfg.group, 1)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cfg, t = self.cfg, q.shape[0]
        qg = q.transpose(0, 1).reshape(cfg.n_kv_heads, cfg.group * t, cfg.head_dim)
        # 4-D inputs: CUDA's fused SDPA kernels (memory-efficient, cuDNN) take only [batch, heads, L, E]
        out = F.scaled_dot_product_attention(qg[None], k[None, :, :self.span], v[None, :, :self.span],
                                             attn_mask=self.mask)
        return out.view(cfg.n_heads, t, cfg.head_dim).transpose(0, 1).reshape(t, -1)


_compiled_flex: Callable | None = None


def flex_kernel(device: torch.device) -> Callable:
    """flex_attention, compiled on CUDA (eager it materialises all scores; on CPU the tests want eager)."""
    global _compiled_flex  # one compiled wrapper per process, like gpt-fast's; its cache keys on shapes
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda":
        return flex_attention
    if _compiled_flex is None:
        # Each pass shape (AR, draft, every verify batch, per model) is one specialisation: the default
        # recompile limit (8) would silently fall back to the unfused kernel after a few.
        for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 512))
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


class FlexAttention:
    """FlexAttention that visits only the KV blocks below start+T.

    The block mask's tensors are static buffers rewritten on the device each pass: blocks wholly inside the
    prefix are "full" (no mask evaluated), the one or two blocks holding the new slots are "partial", the
    rest are never read. That is the split-KV decoding loop bounded by the filled length, not the capacity."""

    def __init__(self, model: Transformer, visible: Visible, fold: bool, compiled: bool):
        from torch.nn.attention.flex_attention import BlockMask, flex_attention

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
        # Inside a torch.compile'd pass the plain function is traced in; elsewhere it must be compiled itself.
        self.kernel = flex_kernel(dev) if compiled else flex_attention
        # The decoding kernel packs a KV head's group * T query rows into one tile of next_pow2 rows and
        # finds no config once that exceeds the 128-row mask block (a verify batch): cap the tile at 128.
        rows = cfg.group * t
        decoding = not fold and cfg.group > 1 and power_of_two(cfg.group) and t < BLOCK
        self.kernel_options = {"BLOCK_M": BLOCK} if decoding and rows > BLOCK else None

    def buffers(self) -> list[torch.Tensor]:
        return [self.block_range, self.kv_num, self.kv_idx, self.full_num, self.full_idx]

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
                              enable_gqa=cfg.group > 1, kernel_options=self.kernel_options)
        return out.view(cfg.n_heads, t, cfg.head_dim).transpose(0, 1).reshape(t, -1)


def power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def effective_kind(kind: str, cfg) -> str:
    if cfg.head_dim < MIN_FLEX_HEAD_DIM:
        return "sdpa"  # FlexAttention's kernels need a head_dim of at least 16 (tl.dot): tiny test models
    if kind == "auto":
        return "flex" if power_of_two(cfg.group) else "flex-fold"
    return kind


def make_attention(kind: str, model: Transformer, visible: Visible, span: int, graphs: str):
    kind = effective_kind(kind, model.cfg)
    if kind == "sdpa":
        return SdpaAttention(model, visible, span)
    return FlexAttention(model, visible, fold=kind == "flex-fold", compiled=graphs != "compile")


# -- one static-shape pass ------------------------------------------------------------------------------


class Pass:
    """T new tokens through the model at slots start..start+T-1 of one cache, with static shapes.

    Inputs (tokens, positions, start, tree) and outputs (logits, per-layer queries) are buffers allocated
    once; `_compute` reads and writes only those, so it can be captured once and replayed every step."""

    def __init__(self, model: Transformer, cache: KVCache, t: int, kind: str, span: int, graphs: str,
                 heads=None, draft_rows: int = 1, queries: bool = False, pool=None,
                 sampler: DeviceSampler | None = None):
        cfg, dev = model.cfg, model.rope_cos.device
        self.model, self.cache, self.heads, self.draft_rows = model, cache, heads, draft_rows
        self.tokens = torch.zeros(t, dtype=torch.long, device=dev)
        self.positions = torch.zeros(t, dtype=torch.long, device=dev)
        self.visible = Visible(t, cache.capacity, dev)
        self.attention = make_attention(kind, model, self.visible, span, graphs)
        rows = draft_rows if draft_rows > 1 else t
        self.logits = torch.empty(rows, cfg.vocab_size, dtype=model.rope_cos.dtype, device=dev)
        shape = (cfg.n_layers, t, cfg.n_heads, cfg.head_dim)
        self.queries = torch.empty(shape, dtype=self.logits.dtype, device=dev) if queries else None
        # With a sampler, the pass also draws the target's token after every row (row i: position
        # positions[i] + 1, penalty window = history + the row's trie path).
        self.sampler = sampler
        self.paths = torch.full((t, MAX_DEPTH), -1, dtype=torch.long, device=dev) if sampler else None
        self.sampled = torch.zeros(t, dtype=torch.long, device=dev) if sampler else None
        self.graphs, self.pool = graphs, pool
        self.graph: torch.cuda.CUDAGraph | None = None
        self._run = self._compute
        if graphs == "compile":
            for buf in self._buffers():
                torch._dynamo.mark_static_address(buf)  # no copies into cudagraph-owned inputs
            self._run = torch.compile(self._compute, mode="reduce-overhead", fullgraph=True, dynamic=False)

    def _buffers(self) -> list[torch.Tensor]:
        bufs = [self.tokens, self.positions, self.logits, self.cache.k, self.cache.v, self.model.rope_cos,
                self.model.rope_sin, self.queries, self.paths, self.sampled, *self.visible.buffers(),
                *self.attention.buffers(), *(self.sampler.buffers() if self.sampler else [])]
        return [b for b in bufs if b is not None]

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
            after = None
            if self.heads.next_token:  # the base head's best guess; in the graph, before the host's penalty
                after = model.model.embed_tokens(model.head(rows[0]).argmax(-1))
            rows.extend(self.heads(x, after)[: self.draft_rows - 1])  # chained draft heads on the pre-norm state
        self.logits.copy_(model.head(torch.cat(rows)))
        if self.sampler is not None:
            self.sampled.copy_(self.sampler(self.logits, self.visible.start, self.positions, self.paths))

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

    def __init__(self, lm: LoadedModel, cache: KVCache, options: FastOptions | None = None,
                 sampler: Sampler | None = None, ids: torch.Tensor | None = None):
        """sampler and ids (the engine's token buffer, slot = position): sample inside the graphs."""
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
        in_graph = sampler is not None and ids is not None and options.sample_in_graph
        self.sampler = DeviceSampler(sampler, ids) if in_graph else None
        self.ids = ids

    def set_key_offset(self, offset: int) -> None:
        """Story index minus slot for the tokens sampled next (a context shift moved the window)."""
        if self.sampler is not None:
            self.sampler.key_offset.fill_(offset)

    def _span(self, kind: str, cache: KVCache, end: int) -> int:
        if effective_kind(kind, self.lm.config) != "sdpa":
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
        return self._ar(token, n, None).logits

    def ar_token(self, n: int) -> int:
        """One AR step in one graph: the token in slot n of `ids` through the model, then the sampled
        token for position n + 1. Its `int` is the step's only host sync."""
        if self.sampler is None:
            raise RuntimeError("ar_token needs FastPasses(..., sampler=, ids=) with sample_in_graph")
        return int(self._ar(self.ids[n:n + 1], n, self.sampler).sampled[0])

    def _ar(self, token: torch.Tensor, n: int, sampler: DeviceSampler | None) -> Pass:
        _check_room(self.cache, n, 1)
        name = "ar" if sampler is None else "ar+sample"
        p = self._get(name, self.cache, 1, self.options.attention, n + 1, sampler=sampler)
        p.tokens.copy_(token)
        p.positions.fill_(n)
        p.visible.start.fill_(n)
        p()
        return p

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

    def verify(self, tokens: torch.Tensor, positions: torch.Tensor, tree: torch.Tensor, start: int,
               trie: Trie | None = None) -> tuple[torch.Tensor, torch.Tensor, list[int] | None]:
        """Logits [T, V], per-layer queries [layers, T, heads, head_dim] of a padded candidate batch, and,
        given the trie and a sampler, the target's token after each trie node (one host sync)."""
        t = tokens.shape[0]
        _check_room(self.cache, start, t)
        kind = self.options.verify_attention or self.options.attention
        sampler = self.sampler if trie is not None else None
        name = "verify" if sampler is None else "verify+sample"
        p = self._get(name, self.cache, t, kind, start + t, queries=True, sampler=sampler)
        p.tokens.copy_(tokens)
        p.positions.copy_(positions)
        p.visible.tree.copy_(tree)
        p.visible.start.fill_(start)
        if sampler is not None:
            p.paths.copy_(trie_paths(trie, t), non_blocking=True)
        p()
        targets = p.sampled[: len(trie.tokens)].tolist() if sampler is not None else None
        return p.logits, p.queries, targets

    def wrap_drafter(self, drafter) -> FastDrafter:
        return FastDrafter(drafter, self)


def _check_room(cache: KVCache, start: int, t: int) -> None:
    # Checked on the host, which knows the length: a device-side index_copy_ out of range would be an
    # asynchronous CUDA error far from its cause.
    if start + t > cache.capacity:
        raise RuntimeError(f"KV cache full: need {start + t} slots, have {cache.capacity}")


class FastDrafter:
    """TokenSwift's heads drafter with its draft pass on the fast path: the same proposals, static shapes."""

    uses_hidden = False

    def __init__(self, inner, passes: FastPasses):
        self.inner, self.passes = inner, passes
        self.partial, self.widths, self.sampler = inner.partial, inner.widths, inner.sampler

    def start(self, full: KVCache, length: int, queries: list[torch.Tensor]) -> None:
        self.inner.start(full, length, queries)

    def wants_queries(self, count: int) -> bool:
        return self.inner.wants_queries(count)

    def commit(self, full: KVCache, start: int, end: int, queries) -> None:
        self.inner.commit(full, start, end, queries)

    def observe(self, hidden: torch.Tensor) -> None:
        pass

    def ngram_prefix(self, root: int, levels: list[list[int]]) -> list[int]:
        return self.inner.ngram_prefix(root, levels)

    def propose(self, root: int, position: int, window: torch.Tensor | None, depth: int,
                key: int) -> list[list[int]]:
        # one captured draft pass for every depth: static shapes; a smaller shape takes its share below
        logits = self.passes.draft(self.partial.cache, root, position, self.partial.n, len(self.widths))
        return best_per_depth(logits, self.sampler, window, self.widths, key)


# -- sampling on the device ----------------------------------------------------------------------------


def trie_paths(trie: Trie, rows: int) -> torch.Tensor:
    """[rows, MAX_DEPTH] token ids of each node's path below the root (left-aligned, -1 padded)."""
    paths = torch.full((rows, MAX_DEPTH), -1, dtype=torch.long)
    for i in range(1, len(trie.tokens)):  # parents come before children: extend the parent's path
        d = trie.depths[i]
        paths[i, : d - 1] = paths[trie.parents[i], : d - 1]
        paths[i, d - 1] = trie.tokens[i]
    return paths


def node_windows(history: torch.Tensor, paths: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
    """[rows, w] penalty windows: row i is the last w tokens of history + path_i, i.e.
    cat(history, path_i)[d_i : d_i + w] with d_i its depth (-1 = no token). The penalty only asks which
    ids occur in a window, so this equals the engine's per-node `_window`."""
    rows, w = paths.shape[0], history.shape[0]
    both = torch.cat((history.expand(rows, w), paths), dim=1)
    return both.gather(1, depths[:, None] + torch.arange(w, device=history.device)[None, :])


class DeviceSampler:
    """Sampler.sample with device-side lengths, windows and noise keys, so it can live inside a graph.

    Same row-wise operations as Sampler.sample (penalty, temperature, filters, then Gumbel-max with the
    position-keyed noise, design §3): each row gets exactly the token the host-driven sampler draws."""

    def __init__(self, sampler: Sampler, ids: torch.Tensor):
        s = sampler.s
        self.sampler, self.ids = sampler, ids
        self.w = s.penalty_length if s.penalty != 1.0 and s.penalty_length > 0 else 0
        self.offsets = torch.arange(self.w, device=ids.device)
        # The noise is keyed by story index, which a context shift moves away from the slot (design §3).
        self.key_offset = torch.zeros((), dtype=torch.int64, device=ids.device)

    def buffers(self) -> list[torch.Tensor]:
        noise = [self.sampler.noise.token_mix] if self.sampler.noise is not None else []
        return [self.ids, self.offsets, self.key_offset, *noise]

    def history(self, end: torch.Tensor) -> torch.Tensor:
        """The last w ids before slot `end` (a device scalar), -1 where there are fewer."""
        idx = end - self.w + self.offsets
        return torch.where(idx >= 0, self.ids[idx.clamp(min=0)], -1)

    def __call__(self, logits: torch.Tensor, start: torch.Tensor, positions: torch.Tensor,
                 paths: torch.Tensor | None) -> torch.Tensor:
        """Tokens [T] for rows whose next position is positions + 1; start = the committed length, so row
        i lies at depth positions[i] - start below the root and its window adds paths[i]."""
        windows = None
        if self.w:
            history = self.history(start + 1)
            if paths is None:
                windows = history.expand(logits.shape[0], self.w)
            else:
                windows = node_windows(history, paths, positions - start)
        scores = self.sampler.process(logits, windows)
        if self.sampler.noise is None:
            return scores.argmax(dim=-1)
        return (scores.double() + self.gumbel(positions + 1 + self.key_offset)).argmax(dim=-1)

    def gumbel(self, positions: torch.Tensor) -> torch.Tensor:
        # sampling.Noise.gumbel with the key computed on the device: position_key and mix32 give the
        # same integers for int64 tensors as for Python ints.
        keys = position_key(self.sampler.s.seed, positions)[:, None]
        h = mix32(self.sampler.noise.token_mix[None, :] ^ keys)
        h = mix32((h + keys) & M32)
        u = (h.double() + 0.5) * 2.0**-32
        return -torch.log(-torch.log(u))
