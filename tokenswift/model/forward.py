"""Our compact decoder forward for Llama, Mistral and Qwen2 checkpoints (RMSNorm, RoPE, GQA, SwiGLU).

Batch size 1 throughout: a forward call takes a block of T query tokens with explicit positions, writes
their K/V into a cache at slots start..start+T-1 and attends to slots [0, start+T) under a boolean mask.
The same call serves chunked prefill (causal mask), single-token decoding (no mask), the draft pass over
the partial cache, and tree verification (an arbitrary mask, positions = L + depth).

Module names mirror transformers' (model.layers.N.self_attn.o_proj, ...) except two fused products: each
layer's q/k/v projections are one qkv_proj and its gate/up projections one gate_up_proj, so a decoding step
runs four products per layer instead of seven (fused_state() renames a Hugging Face state dict; every tensor's
shape is then checked by load_state_dict).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tokenswift.model import kv_q8
from tokenswift.model.config import ModelConfig
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.masks import causal_mask
from tokenswift.model.native_rows import MAX_ROWS, PRODUCT_ROWS, NativeBlock, NativeRows, SeenSlots
from tokenswift.model.quant import BlockProduct
from tokenswift.model.rope import apply_rope

# A CPU float32 product of a few rows streams the weight once: with the model's C kernels (native_rows.linear, up to
# PRODUCT_ROWS rows), else as weight @ x.T, since MKL's small-M GEMM re-packs the weight on every call (2 rows
# cost 2.1x one row for a 49K-row LM head, 4 rows 1.8x) and its one-row GEMV reaches two thirds of the bandwidth,
# while weight @ x.T with 2 or 4 columns streams the weight once (0.7-0.9x the old one row;
# scripts/bench_products.py has the table). An odd count of columns takes a slower kernel (3: 1.0-1.5x), so one
# row is sent as two and three as four. A small weight is read from cache, where MKL's GEMV is the faster (64x64:
# 2 us against 8): stories260k and the test models keep F.linear.
COLUMN_ROWS = 4
COLUMN_MIN_WEIGHT = 1 << 16  # elements (256 KiB in float32); the default model's smallest is 192x576
SHARED_HEAD_ROWS = 16  # up to this many candidate rows share one LM-head product in 16-bit weights


def column_product(rows: int, weight: torch.Tensor) -> bool:
    """Whether `rows` rows times `weight` take weight @ x.T (else F.linear)."""
    return (0 < rows <= COLUMN_ROWS and weight.device.type == "cpu" and weight.dtype == torch.float32
            and weight.numel() >= COLUMN_MIN_WEIGHT)


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
            native: NativeRows | None = None) -> torch.Tensor:
    """x [M, in] @ weight[out, in].T (+ bias): every projection of the model, its heads and drafters; native: the
    model's C kernels where the forward has them."""
    if native is not None and x.dim() == 2 and 0 < x.shape[0] <= PRODUCT_ROWS and weight.numel() >= COLUMN_MIN_WEIGHT:
        out = native.linear(x, weight)
        return out if bias is None else out + bias
    if x.dim() != 2 or not column_product(x.shape[0], weight):
        return F.linear(x, weight, bias)
    rows = x.shape[0]
    x = x.contiguous()
    cols = torch.cat((x, x[-1:])) if rows % 2 else x
    out = torch.mm(weight, cols.t())[:, :rows].t()
    return out if bias is None else out + bias


class Linear(nn.Linear):
    """nn.Linear (same parameters and state-dict names) whose product is project()."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return project(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in at least float32 as the reference does; bf16 variance loses too much.
        if x.dtype in (torch.bfloat16, torch.float16):
            work = x.float()
            return self.weight * (work * torch.rsqrt(work.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.qkv_proj = Linear(cfg.dim, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [..., T, dim] -> q [..., T, heads, head_dim], k and v [..., T, kv_heads, head_dim], q and k rotated
        (one RoPE call for both)."""
        cfg = self.cfg
        qkv = self.qkv_proj(x).unflatten(-1, (cfg.n_heads + 2 * cfg.n_kv_heads, cfg.head_dim))
        rotated = apply_rope(qkv[..., :cfg.n_heads + cfg.n_kv_heads, :], cos, sin)
        return rotated[..., :cfg.n_heads, :], rotated[..., cfg.n_heads:, :], qkv[..., cfg.n_heads + cfg.n_kv_heads:, :]

    def forward(self, x, cos, sin, keys, values, slots, attend):
        """keys, values: this layer's whole cache [kv_heads, capacity, head_dim]; slots: [T] device tensor of the
        slots the new K/V go to (no host value: one captured graph serves every length); attend(q, keys, values).
        keys None (the draft layer's training): no cache, x may have batch dims, and attend gets this call's own
        k and v, [..., T, kv_heads, head_dim]. Returns the output and q."""
        q, k, v = self.qkv(x, cos, sin)
        if keys is not None:  # a compact (bf16, q8) cache stores them rounded as the C kernels round them
            keys.index_copy_(1, slots, stored(k.transpose(0, 1), keys.dtype, key=True))
            values.index_copy_(1, slots, stored(v.transpose(0, 1), values.dtype, key=False))
            k, v = keys, values
        return self.o_proj(attend(q, k, v)), q


def stored(x: torch.Tensor, dtype: torch.dtype, key: bool) -> torch.Tensor:
    """Keys or values as a cache of `dtype` holds them."""
    return kv_q8.quantize(x, key) if dtype == kv_q8.Q8 else x.to(dtype)


def read(rows: torch.Tensor, dtype: torch.dtype, key: bool) -> torch.Tensor:
    """A cache's keys or values as `dtype` (what stored() kept, widened)."""
    return kv_q8.dequantize(rows, key).to(dtype) if rows.dtype == kv_q8.Q8 else rows.to(dtype)


def fold_groups(cfg: ModelConfig, q: torch.Tensor) -> torch.Tensor:
    """q [T, heads, dim] -> [kv_heads, group * T, dim]: GQA without repeating K/V, each KV head's group of query
    heads folded into the query axis (row j*T + t is query head j of the group at token t)."""
    return q.transpose(0, 1).reshape(cfg.n_kv_heads, cfg.group * q.shape[0], cfg.head_dim)


def merge_heads(cfg: ModelConfig, out: torch.Tensor, t: int) -> torch.Tensor:
    """Attention output per head, [heads, T, dim] (or folded, [kv_heads, group * T, dim]) -> [T, heads * dim]."""
    return out.reshape(cfg.n_heads, t, cfg.head_dim).transpose(0, 1).reshape(t, -1)


def sdpa_folded(cfg: ModelConfig, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask) -> torch.Tensor:
    """SDPA of q [T, heads, dim] over keys/values [kv_heads, S, dim] -> [T, heads * dim], queries folded
    (fold_groups: rows j*T + t of the mask)."""
    # 4-D inputs: fused CUDA kernels take [batch, heads, tokens, dim]; 3-D would fall back to math.
    out = F.scaled_dot_product_attention(fold_groups(cfg, q)[None], keys[None], values[None], attn_mask=mask)[0]
    return merge_heads(cfg, out, q.shape[0])


class SpanAttention:
    """The eager attention: the slots [0, span) under a mask ([T, span] bool, True = may attend) or, for one token
    that sees the whole filled cache, none. By SDPA; where the forward runs on the model's C kernels (native: up to
    MAX_ROWS tokens, any number in a verify pass) they attend, over the mask's slot lists (seen_slots).
    The fast path's kernels (attention.py) take the same call."""

    def __init__(self, cfg: ModelConfig, span: int, mask: torch.Tensor | None, dtype: torch.dtype,
                 native: NativeRows | None = None):
        self.cfg, self.span, self.native = cfg, span, native
        self.mask = mask if self.native is not None or mask is None else attention_bias(mask, cfg.group, dtype)
        self.seen: SeenSlots | None = None  # the C kernel's form of the mask, built once for every layer

    def seen_slots(self, t: int) -> SeenSlots:
        """The mask as the C kernel takes it, for the forward's t tokens."""
        if self.seen is None:
            self.seen = SeenSlots.of(self.mask, t, self.span)
        return self.seen

    def __call__(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        keys, values = keys[:, :self.span], values[:, :self.span]
        if keys.dtype != q.dtype:  # a compact cache: its stored values, widened exactly, as the C kernel reads them
            keys, values = read(keys, q.dtype, key=True), read(values, q.dtype, key=False)
        return sdpa_folded(self.cfg, q, keys, values, self.mask)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up_proj = Linear(cfg.dim, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, -1)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, x, cos, sin, keys, values, slots, attend, native: NativeBlock | None = None):
        """native: this layer in C; x [T, dim], the forward's own activations, is then updated in place."""
        if native is not None:
            x = x.contiguous()
            q = native.before_attention(x, cos, sin, slots, keys, values)
            native.after_attention(x, attend(q, keys, values))
            return x, q
        attn, q = self.self_attn(self.input_layernorm(x), cos, sin, keys, values, slots, attend)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), q


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        # Left uninitialised: every Transformer is built on the meta device, then given a checkpoint's weights
        # (loading.build_model) or filled (bench.shapes); a random init on meta would import torch._dynamo (1.8 s).
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim, _weight=torch.empty(cfg.vocab_size, cfg.dim))
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)


@dataclass
class ForwardOut:
    logits: torch.Tensor | None  # [T, vocab] (None when not asked for)
    hidden: torch.Tensor  # [T, dim]: last layer's output before the final norm (the draft heads' input)
    queries: list[torch.Tensor] | None  # per layer [T, n_heads, head_dim] post-RoPE, when captured
    layers: list[torch.Tensor] | None = None  # [T, dim] outputs of the layers asked for (keep_layers), ascending


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        if not cfg.tie_embeddings:
            self.lm_head = Linear(cfg.dim, cfg.vocab_size, bias=False)
        # The model's own logits may come from a quantized copy of the head (int4.py); drafters keep head_weight.
        self.quantized_head: nn.Module | None = None
        # The C kernels of a layer's steps for a few rows (native_rows.py), set by loading for float32 on the CPU.
        self.native: NativeRows | None = None
        self.rope_cos: torch.Tensor | None = None
        self.rope_sin: torch.Tensor | None = None

    def set_rope(self, cos: torch.Tensor, sin: torch.Tensor) -> None:
        self.rope_cos, self.rope_sin = cos, sin

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The frozen LM head on a normalised state (shared with the draft heads)."""
        if self.quantized_head is not None:
            return self.quantized_head(hidden)
        return project(hidden, self.head_weight, None, self.native)

    @property
    def prefills_by_rows(self) -> bool:
        """Whether prefill runs every token as an exact row (the C kernels, prefill.py) rather than torch's GEMMs:
        for GGUF-quantized weights, whose integer products and the cache's own attention kernel beat dequantizing
        for a GEMM and SDPA (the default model in q4, 1 thread, a 6,144-token window: 23.6 s against 41.4, of
        which SDPA took 24 s; with float32 weights the GEMMs win, 9.4 s against 14.6 for 2,048 tokens)."""
        return self.native is not None and isinstance(self.model.layers[0].mlp.down_proj, BlockProduct)

    @property
    def rows_apart(self) -> bool:
        """Whether an exact-rows forward runs its rows one at a time: 16-bit weights on a CPU, where torch rounds a
        batch of rows unlike one row (bfloat16 TokenSwift parted from plain decoding at token 15 on stories260k). The
        C kernels (float32, q4) are row-exact; float64 rounds far below a flip; a GPU's text is reported instead."""
        weight = self.model.norm.weight
        return self.native is None and weight.device.type == "cpu" and weight.dtype in (torch.bfloat16, torch.float16)

    @property
    def head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.cfg.tie_embeddings else self.lm_head.weight

    def logits_of(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of last-layer states (ForwardOut.hidden rows): the final norm, then the LM head. Verification
        asks for the rows its walk visits only; the head is a large share of a pass on a 49K vocabulary."""
        return self.head(self.model.norm(hidden))

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        start: int,
        mask: torch.Tensor | None = None,
        logits: str = "all",
        capture_queries: bool = False,
        exact_rows: bool = False,
        keep_layers: tuple[int, ...] = (),
    ) -> ForwardOut:
        """The eager call. tokens, positions: [T]. mask: [T, start+T] bool (True = may attend) or None for a
        single token that sees the whole filled cache. logits: "all", "last" or "none". exact_rows (a verify
        pass): the C kernels run every row whatever T, so each row is bit for bit what a one-row step at its
        position computes; without it they take up to MAX_ROWS rows and a longer chunk (prefill) runs torch's
        GEMMs and attention, whose sums are ordered otherwise (and from quant.DENSE_ROWS rows q4's dequantize
        the weight). keep_layers: the layers (numbered from 1) whose outputs ForwardOut.layers returns."""
        t = tokens.shape[0]
        if start + t > cache.capacity:
            raise RuntimeError(f"KV cache full: need {start + t} slots, have {cache.capacity}")
        # Checked where it costs nothing: on a GPU it would be a host sync in every forward, and the engine
        # keeps its positions inside the table (loading.rope_positions).
        if positions.device.type == "cpu" and t and int(positions.max()) >= self.rope_cos.shape[0]:
            raise ValueError(f"position {int(positions.max())} beyond the RoPE table ({self.rope_cos.shape[0]})")
        if exact_rows and t > 1 and self.rows_apart:
            return self._rows_apart(tokens, positions, cache, start, mask, logits, capture_queries, keep_layers)
        native = self.native if t <= MAX_ROWS or exact_rows else None
        attend = SpanAttention(self.cfg, start + t, mask, self.model.norm.weight.dtype, native)
        slots = torch.arange(start, start + t, device=tokens.device)
        queries = [] if capture_queries else None
        kept = [] if keep_layers else None
        x = self.run(tokens, positions, cache, slots, attend, queries, native, keep_layers, kept)
        out = None
        if logits == "all":
            out = self.logits_of(x)
        elif logits == "last":
            out = self.logits_of(x[-1:])
        return ForwardOut(out, x, queries, kept)

    def _rows_apart(self, tokens, positions, cache: KVCache, start: int, mask: torch.Tensor | None, logits: str,
                    capture_queries: bool, keep_layers: tuple[int, ...]) -> ForwardOut:
        """forward() with exact rows where only a one-row call is exact (rows_apart): row i writes its K/V at slot
        start + i and attends as the plain step at its position does (_step_attention); the LM head a row apart."""
        if mask is None:
            raise ValueError("a block of rows needs its mask")
        t, dev, rows = tokens.shape[0], tokens.device, []
        # a chain (a replay) sees every row before it, though a sliding window's mask hides some; a tree what it shows
        tree = None if bool((positions == torch.arange(start, start + t, device=dev)).all()) else mask
        for i in range(t):
            queries, kept = [] if capture_queries else None, [] if keep_layers else None
            x = self.run(tokens[i:i + 1], positions[i:i + 1], cache, torch.tensor([start + i], device=dev),
                         self._step_attention(i, start, positions, tree), queries, None, keep_layers, kept)
            rows.append((x, queries, kept))

        def joined(part: int) -> list[torch.Tensor]:  # each layer's rows, row after row
            return [torch.cat(layer) for layer in zip(*(row[part] for row in rows), strict=True)]

        head = {"all": rows, "last": rows[-1:]}.get(logits, [])
        out = torch.cat([self.logits_of(row[0]) for row in head]) if head else None
        return ForwardOut(out, torch.cat([row[0] for row in rows]), joined(1) if capture_queries else None,
                          joined(2) if keep_layers else None)

    def _step_attention(self, i: int, start: int, positions: torch.Tensor, tree: torch.Tensor | None):
        """Row i's attention as the plain step at its position n computes it: over slots holding positions 0..n in
        order (the slots before `start`, then its path among the new rows: in a chain the slots themselves, read in
        place; in a tree those its mask shows, gathered), under the plain step's own mask (a sliding window's)."""
        n, window = int(positions[i]), self.cfg.sliding_window
        step_mask = causal_mask(n, 1, positions[i:i + 1], window, positions.device) if window is not None else None
        attend = SpanAttention(self.cfg, n + 1, step_mask, self.model.norm.weight.dtype)
        if tree is None:
            return attend
        path = torch.arange(start, start + i + 1, device=positions.device)[tree[i, start:start + i + 1]]
        if path.shape[0] != n - start + 1:  # the window hid one of its ancestors: it cannot be told from a sibling
            raise ValueError(f"a candidate tree as deep as the sliding window ({window})")
        seen = torch.cat((torch.arange(start, device=positions.device), path))
        return lambda q, keys, values: attend(q, keys[:, seen], values[:, seen])

    def run(self, tokens, positions, cache: KVCache, slots, attend, queries: list | None = None,
            native: NativeRows | None = None, keep: tuple[int, ...] = (), kept: list | None = None) -> torch.Tensor:
        """The one decoder forward, eager or captured: tokens at `positions` write their K/V at `slots` and
        attend through `attend` (SpanAttention, or a fast-path kernel). Returns the last layer's output
        (before the final norm); appends each layer's post-RoPE queries to `queries` when given. native: the C
        kernels for a layer's steps (a few rows on the CPU), else torch's operators. Appends the outputs of the
        layers numbered in `keep` (from 1) to `kept`."""
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        x = self.model.embed_tokens(tokens)
        if native is not None:  # attend is the forward's SpanAttention over this cache
            return native.run_layers(self.cfg, x, cos, sin, slots, cache, attend.seen_slots(x.shape[0]), queries,
                                     keep, kept)
        for number, (layer, (keys, values)) in enumerate(zip(self.model.layers, cache.layers, strict=True), start=1):
            x, q = layer(x, cos, sin, keys, values, slots, attend)
            if queries is not None:
                queries.append(q)
            if number in keep:
                kept.append(x)
        return x


def shared_head_rows(model: Transformer, dtype: torch.dtype) -> int:
    """How many candidate rows one LM-head product serves in a verify pass (a model of `dtype`): as many as cost about
    one row."""
    if dtype in (torch.bfloat16, torch.float16):
        return 0 if model.rows_apart else SHARED_HEAD_ROWS  # a row apart, as a plain step's head computes it
    if dtype == torch.float32 and model.native is not None and model.quantized_head is None:
        # a float32 head read once for 8 rows
        return PRODUCT_ROWS
    head = model.quantized_head
    if head is not None:  # q4: sized as its float weight, which a K-quant file's model never dequantizes
        return COLUMN_ROWS if head.out_features * head.in_features >= COLUMN_MIN_WEIGHT else 0
    return COLUMN_ROWS if column_product(COLUMN_ROWS, model.head_weight) else 0


def fused_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict with transformers' names -> ours: every `<prefix>self_attn.{q,k,v}_proj.{weight,bias}` becomes
    `<prefix>self_attn.qkv_proj.*` (rows q, k, v) and `<prefix>mlp.{gate,up}_proj.weight` becomes
    `<prefix>mlp.gate_up_proj.weight`. Other tensors, and a state already fused, pass unchanged."""
    out = dict(state)
    for name in state:
        for parts, fused in ((("q_proj", "k_proj", "v_proj"), "qkv_proj"), (("gate_proj", "up_proj"), "gate_up_proj")):
            first = f".{parts[0]}."
            if first not in f".{name}":
                continue
            names = [name.replace(first[1:], f"{part}.", 1) for part in parts]
            if all(n in state for n in names):
                out[name.replace(first[1:], f"{fused}.", 1)] = torch.cat([state[n] for n in names])
                for n in names:
                    out.pop(n, None)
    return out


def attention_bias(mask: torch.Tensor, group: int, dtype: torch.dtype) -> torch.Tensor:
    """[T, K] bool (True = may attend) -> [group*T, K] additive bias for the GQA-folded queries, built once per
    forward: every layer shares it, and SDPA would otherwise turn a bool mask into a bias in each layer."""
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, -math.inf)
    return bias.repeat(group, 1)
