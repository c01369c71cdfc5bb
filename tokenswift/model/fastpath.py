"""The GPU fast path (opt-in on the CLI, the worker's default on CUDA): the engine's three model passes with
static shapes, device-side lengths and CUDA graphs, so plain decoding runs near the memory-bandwidth limit and
TokenSwift runs on top of it.

Every pass runs the model's one forward (forward.Transformer.run): T new tokens at cache slots start..start+T-1.
AR is T = 1 over the full cache, the draft pass T = 1 over the partial cache (plus the draft heads), verify
T = the padded candidate batch over the full cache. All shapes are fixed per pass, and `start`, the positions
and the tree live in device buffers that the host fills before a replay, so one captured graph serves every
step at every context length. Attention reads only the filled cache (attention.py). The AR and verify graphs
also sample (sampling/in_graph.py), so an AR step costs one replay and one host read for its token, and a
verify pass one replay and one read for the target's token after every trie node.

The capture boundary is `Pass._compute`: it takes no arguments and touches only static buffers. It is captured
as a CUDA graph ("cuda", the default on CUDA) or run eagerly ("none": CPU, where the tests check it against
the eager model). (torch.compile's "reduce-overhead" mode was a third way; it compiled one code object for
every pass shape and ran into dynamo's recompile limit, so it is gone: flex kernels are compiled on their own,
the rest is graphs.) The engine's loop, the trie, the n-gram table and the walk stay on the host.

No path is trusted unrun: the worker and the CLI use one only after selftest.py compared it with the eager
passes, and a pass that raises (FastPathError) sends the job back to the queue for the next path down.
"""

from __future__ import annotations

import functools
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from tokenswift.model.attention import ATTENTION, Visible, effective_kind, make_attention
from tokenswift.model.forward import Transformer
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.loading import LoadedModel
from tokenswift.sampling.alternatives import ROW
from tokenswift.sampling.in_graph import MAX_DEPTH, DeviceSampler, pack_verify_inputs, packed_size
from tokenswift.sampling.sampler import Sampler
from tokenswift.sampling.trie import Trie

CAPACITY_STEP = 4096  # fast-path caches are allocated in these steps, so runs share compiled kernels
FLEX_MIN_SPAN = 4096  # the shortest KV length a flex pass is built for
GRAPHS = ("cuda", "none")
# The dtypes the fast path was tested in (against the eager passes, selftest.TOLERANCE); no other may run on it.
DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class FastOptions:
    attention: str = "auto"  # kernel of the AR and draft passes (attention.py)
    verify_attention: str | None = None  # kernel of the verify pass; None = the same as `attention`
    graphs: str | None = None  # "cuda" | "none"; None = "cuda" on a CUDA device, else "none"
    bucket: int = 2048  # sdpa: KV span granularity in slots (one graph per span and pass)
    # Passes kept (the least recently used goes first): each holds its buffers and, on a GPU, a captured graph,
    # and a long run meets a new span every few thousand tokens for each batch shape.
    max_passes: int = 48
    # Builds a pass's attention, (kind, model, visible, span) -> kernel; None: attention.make_attention. Tests
    # inject a kernel that fails or lies here, to see the self-test and the fallback catch it (selftest.py).
    attention_factory: Callable | None = None

    def __post_init__(self) -> None:
        for name in ("attention", "verify_attention"):
            value = getattr(self, name)
            if value is not None and value not in ATTENTION:
                raise ValueError(f"{name}: unknown kernel {value!r}; use one of {', '.join(ATTENTION)}")
        if self.graphs is not None and self.graphs not in GRAPHS:
            raise ValueError(f"graphs: unknown mode {self.graphs!r}; use one of {', '.join(GRAPHS)}")
        if self.bucket < 1:
            raise ValueError("bucket: must be >= 1")
        if self.max_passes < 1:
            raise ValueError("max_passes: must be >= 1")


class FastPathError(RuntimeError):
    """A fast-path pass raised: the job can go on from its saved tokens on the next path down (selftest.py)."""

    def __init__(self, kind: str, error: BaseException):
        super().__init__(f"the fast path's {kind} attention failed: {type(error).__name__}: {error}")
        self.kind = kind


def padded_capacity(slots: int) -> int:
    return -(-slots // CAPACITY_STEP) * CAPACITY_STEP


# -- one static-shape pass ------------------------------------------------------------------------------


class Pass:
    """T new tokens through the model at slots start..start+T-1 of one cache, with static shapes.

    Inputs (tokens, positions, start, tree) and outputs (logits, per-layer queries) are buffers allocated
    once; `_compute` reads and writes only those, so it can be captured once and replayed every step.

    A verify pass (packed=True) keeps all its inputs in one int64 buffer, [start | tokens | positions | tree |
    paths], so the host fills them with one copy from pinned memory (FastPasses.verify)."""

    def __init__(self, model: Transformer, cache: KVCache, t: int, kind: str, span: int, graphs: str,
                 heads=None, draft_rows: int = 1, queries: bool = False, pool=None,
                 sampler: DeviceSampler | None = None, packed: bool = False, factory: Callable | None = None,
                 alternatives: bool = False, drafts=None):
        cfg, dev = model.cfg, model.rope_cos.device
        self.model, self.cache, self.heads, self.draft_rows = model, cache, heads, draft_rows
        # With a sampler, the pass also draws the target's token after every row (row i: position
        # positions[i] + 1, penalty window = history + the row's trie path when packed, else the history).
        self.sampler = sampler
        self.inputs = self.tree_in = self.paths = start = None
        if packed:
            self.inputs = torch.zeros(packed_size(t, sampler is not None), dtype=torch.long, device=dev)
            paths = self.inputs.numel() - (1 + 2 * t + t * t)
            start, self.tokens, self.positions, tree, rest = self.inputs.split([1, t, t, t * t, paths])
            start, self.tree_in = start.view(()), tree.view(t, t)
            self.paths = rest.view(t, MAX_DEPTH) if sampler else None
            self.host_inputs = torch.empty(self.inputs.shape, dtype=torch.long, pin_memory=dev.type == "cuda")
        else:
            self.tokens = torch.zeros(t, dtype=torch.long, device=dev)
            self.positions = torch.zeros(t, dtype=torch.long, device=dev)
        self.visible = Visible(t, cache.capacity, dev, start)
        self.attention = (factory or make_attention)(effective_kind(kind, cfg), model, self.visible, span)
        rows = draft_rows if draft_rows > 1 else t
        self.logits = torch.empty(rows, cfg.vocab_size, dtype=model.rope_cos.dtype, device=dev)
        self.hidden = torch.empty(t, cfg.dim, dtype=self.logits.dtype, device=dev)  # what the fused drafter reads
        shape = (cfg.n_layers, t, cfg.n_heads, cfg.head_dim)
        self.queries = torch.empty(shape, dtype=self.logits.dtype, device=dev) if queries else None
        # What the host reads after a sampling pass, in one copy: the sampled tokens, then with `drafts` (the fused
        # drafter's device_drafts.DeviceDrafts) every row's next proposals.
        self.drafts = drafts
        self.readout = torch.zeros(t + (drafts.size(t) if drafts else 0), dtype=torch.long, device=dev)
        self.sampled = self.readout[:t] if sampler else None
        # Each sampled row's alternatives (alternatives.py), from the scores its token is drawn from.
        self.top = torch.zeros(t, ROW, dtype=torch.float64, device=dev) if sampler and alternatives else None
        self.graphs, self.pool = graphs, pool
        self.graph: torch.cuda.CUDAGraph | None = None
        self.built = False  # called once: captured, compiled, warmed up

    def read(self, n: int) -> tuple[list[int], list[int] | None]:
        """A sampling pass's results, in the one host read of its step: the tokens sampled after its first n rows,
        and with drafts every row's (flat: DeviceDrafts.levels' input; else None)."""
        if self.drafts is None:
            return self.sampled[:n].tolist(), None
        values = self.readout.tolist()
        return values[:n], values[self.sampled.numel():]

    @torch.inference_mode()
    def __call__(self) -> None:
        if self.graphs != "cuda":
            self._compute()
        elif self.graph is None:
            self.graph = capture(self._compute, self.pool)  # lazily: the buffers now hold real inputs
            self.graph.replay()
        else:
            self.graph.replay()

    def _compute(self) -> None:
        """The compile boundary: the model's one forward (forward.Transformer.run) with this pass's attention,
        then the LM head (and the draft heads, or the sampler)."""
        model = self.model
        if self.tree_in is not None:
            self.visible.tree.copy_(self.tree_in != 0)
        slots = self.visible.start + self.visible.offsets
        self.attention.prepare()
        queries = [] if self.queries is not None else None
        x = model.run(self.tokens, self.positions, self.cache, slots, self.attention, queries)
        self.hidden.copy_(x)
        if queries is not None:
            torch.stack(queries, out=self.queries)
        if self.draft_rows == 1:
            self.logits.copy_(model.logits_of(x))
            if self.sampler is not None:
                self.sampled.copy_(self.sampler(self.logits, self.visible.start, self.positions, self.paths,
                                                self.top))
            if self.drafts is not None:
                self.readout[self.sampled.numel():].copy_(
                    self.drafts(x, self.sampled, self.visible.start, self.positions, self.paths).flatten())
            return
        # The draft pass (drafting.HeadsDrafter): the base head's row, then the chained draft heads' rows on the
        # pre-norm state. Heads that read the next token get the depth-1 guess they extend: the token the target
        # would draw from the base row (its window ends at the root, at position `positions[0]`).
        self.logits[:1].copy_(model.logits_of(x))
        first = None
        if self.heads.next_token:
            base = self.logits[:1]
            first = self.sampler(base, self.positions[0], self.positions, None) if self.sampler else base.argmax(-1)
        self.logits[1:].copy_(self.heads.logits(model, x, first, self.draft_rows - 1))


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
    # Captured on this stream, not torch.cuda.graph's default one: that is created once per process, on whichever
    # device was current then (cuda:N needs its own device's stream; the caller made it current).
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        fn()
    return graph


# -- the passes of one engine ----------------------------------------------------------------------------


class FastPasses:
    """AR, draft and verify passes over one full KV cache, each created (and captured) on first use."""

    def __init__(self, lm: LoadedModel, cache: KVCache, options: FastOptions | None = None,
                 sampler: Sampler | None = None, ids: torch.Tensor | None = None, queries: bool = True,
                 alternatives: bool = False):
        """sampler and ids (the engine's token buffer, slot = position): sample inside the graphs. queries: the
        verify pass keeps every layer's queries (the paper drafter's partial cache selects with them).
        alternatives: the sampling passes also record each row's alternatives (read with `alternatives`)."""
        options = options or FastOptions()
        if lm.config.sliding_window is not None:
            raise ValueError("the fast path does not implement sliding-window attention; run without it")
        if lm.dtype not in DTYPES:
            raise ValueError(f"the fast path was never tested in {lm.dtype}; run without it")
        self.lm, self.cache, self.options = lm, cache, options
        self.factory = options.attention_factory or functools.partial(make_attention, flex=lm.flex)
        self.graphs = options.graphs or ("cuda" if lm.device.type == "cuda" else "none")
        if self.graphs != "none" and lm.device.type != "cuda":
            raise ValueError(f"graphs={self.graphs!r} needs a CUDA device")
        self.pool = torch.cuda.graph_pool_handle() if self.graphs == "cuda" else None
        self.passes: OrderedDict[tuple, Pass] = OrderedDict()  # least recently used first
        # The AR and verify passes sample too (one host sync per step), and the draft pass for next-token heads.
        self.draw = DeviceSampler(sampler, ids) if sampler is not None and ids is not None else None
        self.ids, self.queries, self.record = ids, queries, alternatives
        self.sampled_last: Pass | None = None  # the last pass that sampled: its alternatives are read next
        # The fused drafter's proposals made inside the sampling passes (device_drafts.DeviceDrafts), set by the
        # engine once its drafter exists: then an iteration reads the host once.
        self.drafts = None
        # Seconds spent in passes' first calls (capture, kernel compilation, warm-up): one-off costs the engine
        # books apart from decoding, so neither the adaptive policy nor time saved counts them.
        self.build_s = 0.0

    def set_key_offset(self, offset: int) -> None:
        """Story index minus slot for the tokens sampled next (a context shift moved the window)."""
        if self.draw is not None:
            self.draw.key_offset.fill_(offset)

    def _span(self, kind: str, cache: KVCache, end: int) -> int:
        """The KV length a pass is built for (one graph each), at least the filled length `end`."""
        if effective_kind(kind, self.lm.config) != "sdpa":
            # Flex skips the unfilled blocks itself but sizes its split-KV tiles by this length: a power of two
            # keeps at least half of the splits busy with a handful of graphs (4K, 8K, ... 128K).
            return min(cache.capacity, max(FLEX_MIN_SPAN, 1 << (end - 1).bit_length()))
        bucket = self.options.bucket  # SDPA reads the whole span: fine steps
        return min(cache.capacity, -(-end // bucket) * bucket)

    def _get(self, name: str, cache: KVCache, t: int, kind: str, end: int, **kw) -> Pass:
        span = self._span(kind, cache, end)
        key = (name, id(cache), t, kind, span)
        if key in self.passes:
            self.passes.move_to_end(key)
            return self.passes[key]
        while len(self.passes) >= self.options.max_passes:
            self.passes.popitem(last=False)
        self.passes[key] = Pass(self.lm.model, cache, t, kind, span, self.graphs, pool=self.pool,
                                factory=self.factory, **kw)
        return self.passes[key]

    def _run(self, p: Pass) -> None:
        dev = self.lm.device
        # cuda:N: the capture's side stream, the graph, its pool and each replay's stream must be device N's,
        # not the current device's (0 unless set): tensors name their device, streams and graphs do not.
        with torch.cuda.device(dev) if dev.type == "cuda" else nullcontext():
            if p.built:
                p()
                return
            t0 = time.perf_counter()
            p()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)  # once per pass: its capture is timed whole
        p.built = True
        self.build_s += time.perf_counter() - t0

    @contextmanager
    def _guard(self, kind: str) -> Iterator[None]:
        """A pass, up to the host read of its results (where an asynchronous device error surfaces), that raises
        becomes a FastPathError naming its kernel. A full cache (checked before) and running out of memory
        are no fault of the path: they stay what they are."""
        try:
            yield
        except torch.OutOfMemoryError:
            raise
        except Exception as error:  # noqa: BLE001 - whatever the kernel raised, the next path down may not
            raise FastPathError(effective_kind(kind, self.lm.config), error) from error

    def ar(self, token: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [1, V] and last-layer state [1, dim] after `token` (a device tensor [1]) at slot and position n;
        K/V written at n. Both are the pass's buffers, overwritten by its next replay."""
        _check_room(self.cache, n, 1)
        with self._guard(self.options.attention):
            p = self._ar(token, n, None)
        return p.logits, p.hidden

    def ar_token(self, n: int, drafts: bool = False) -> tuple[int, torch.Tensor, list[int] | None]:
        """One AR step in one graph: the token in slot n of `ids` through the model, then the sampled
        token for position n + 1 (the step's only host read), the state [1, dim], and with `drafts` (and
        self.drafts set) the drafts below the sampled token, read with it (DeviceDrafts.levels' input)."""
        if self.draw is None:
            raise RuntimeError("ar_token needs FastPasses(..., sampler=, ids=)")
        _check_room(self.cache, n, 1)
        drafter = self.drafts if drafts else None
        with self._guard(self.options.attention):
            p = self.sampled_last = self._ar(self.ids[n:n + 1], n, self.draw, drafter)
            tokens, drafted = p.read(1)
            return tokens[0], p.hidden, drafted

    def _ar(self, token: torch.Tensor, n: int, sampler: DeviceSampler | None, drafts=None) -> Pass:
        name = ("ar" if sampler is None else "ar+sample") + ("+drafts" if drafts else "")
        p = self._get(name, self.cache, 1, self.options.attention, n + 1, sampler=sampler,
                      alternatives=self.record and sampler is not None, drafts=drafts)
        p.tokens.copy_(token)
        p.positions.fill_(n)
        p.visible.start.fill_(n)
        self._run(p)
        return p

    def draft(self, cache: KVCache, root: int, position: int, start: int, rows: int) -> torch.Tensor:
        """Draft logits [rows, V] for the root at `position`, written at slot `start` of the partial cache:
        row 0 from the base head, rows 1.. from the chained draft heads (drafting.HeadsDrafter)."""
        _check_room(cache, start, 1)
        with self._guard(self.options.attention):
            # The pass samples only for heads that read the next token (their depth-1 guess); else nothing reads it.
            sampler = self.draw if rows > 1 and self.lm.heads.next_token else None
            p = self._get("draft", cache, 1, self.options.attention, start + 1, heads=self.lm.heads,
                          draft_rows=rows, sampler=sampler)
            p.tokens.fill_(root)
            p.positions.fill_(position)
            p.visible.start.fill_(start)
            self._run(p)
        return p.logits

    def verify(self, trie: Trie, start: int, t: int
               ) -> tuple[torch.Tensor, torch.Tensor | None, list[int] | None, torch.Tensor, list[int] | None]:
        """The trie's candidates, padded to t rows, after `start` committed tokens: logits [t, V], per-layer
        queries [layers, t, heads, head_dim] (None unless FastPasses keeps them), the target's token after each
        trie node when the pass samples (its `tolist` is the one host sync), last-layer states [t, dim], and with
        self.drafts every row's drafts, read with the targets (DeviceDrafts.levels' input; else None).

        Every input (start, tokens, positions, tree mask, each node's path) is built on the host into one
        pinned buffer and reaches the device in one asynchronous copy."""
        _check_room(self.cache, start, t)
        kind = self.options.verify_attention or self.options.attention
        drafts = self.drafts if self.draw is not None else None
        name = ("verify" if self.draw is None else "verify+sample") + ("+drafts" if drafts else "")
        with self._guard(kind):
            p = self.sampled_last = self._get(name, self.cache, t, kind, start + t, queries=self.queries,
                                              sampler=self.draw, packed=True,
                                              alternatives=self.record and self.draw is not None, drafts=drafts)
            # Rewriting the host buffer is safe: the previous copy from it finished before its targets were read.
            pack_verify_inputs(trie, start, t, self.draw is not None, p.host_inputs)
            p.inputs.copy_(p.host_inputs, non_blocking=True)
            self._run(p)
            targets, drafted = p.read(len(trie.tokens)) if self.draw is not None else (None, None)
        return p.logits, p.queries, targets, p.hidden, drafted


    def alternatives(self, rows: list[int]) -> torch.Tensor:
        """[len(rows), ROW] alternatives of rows of the last sampling pass (alternatives.top_rows)."""
        return self.sampled_last.top[rows]


def _check_room(cache: KVCache, start: int, t: int) -> None:
    # Checked on the host, which knows the length: a device-side index_copy_ out of range would be an
    # asynchronous CUDA error far from its cause.
    if start + t > cache.capacity:
        raise RuntimeError(f"KV cache full: need {start + t} slots, have {cache.capacity}")
