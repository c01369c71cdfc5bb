"""The C kernels of a layer's steps for a few rows on the CPU (tokenswift/model/native_rows.py): a layer in C
(float32, float64 or GGUF blocks), attention and few-row products compute what torch's operators compute, on the AVX2
path and the portable one; a row's attention and products do not depend on the rows beside it; and a float32 or
float64 model's forward with them gives the logits it gives without them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from tokenswift.model import native
from tokenswift.model.config import ModelConfig
from tokenswift.model.forward import Block, SpanAttention, attention_bias, sdpa_folded
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.masks import with_prefix
from tokenswift.model.native_rows import NativeBlock, NativeRows
from tokenswift.model.quant import QuantLinear

CFG = ModelConfig(family="llama", vocab_size=64, dim=576, n_layers=1, n_heads=9, n_kv_heads=3, head_dim=64,
                  intermediate_size=64, norm_eps=1e-5, qkv_bias=False, tie_embeddings=True,
                  max_position_embeddings=4096, sliding_window=None, bos_token_id=None, eos_token_ids=())


@pytest.fixture(scope="module")
def rows() -> NativeRows:
    return NativeRows(native.kernels())


def cache_layer(capacity: int = 4096, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    cache = KVCache(1, CFG.n_kv_heads, capacity, CFG.head_dim, "cpu", torch.float32)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    return cache.layers[0]


@pytest.mark.parametrize(("t", "span"), [(1, 1), (1, 300), (3, 700), (4, 257), (16, 2048)])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_is_sdpas(rows, t, span, masked):
    keys, values = cache_layer()
    keys, values = keys[:, :span], values[:, :span]
    q = torch.randn(t, CFG.n_heads, CFG.head_dim, generator=torch.Generator().manual_seed(t))
    mask = None
    if masked:  # a tree's mask: some slots hidden, whole chunks of slots too
        mask = torch.rand(t, span, generator=torch.Generator().manual_seed(span)) > 0.3
        mask[:, 256:512] = False
        mask[:, 0] = True
    reference = sdpa_folded(CFG, q, keys, values, attention_bias(mask, CFG.group, torch.float32) if masked else None)
    assert torch.allclose(rows.attend(CFG, q, keys, values, mask), reference, rtol=1e-5, atol=1e-6)


def test_a_rows_attention_does_not_depend_on_the_rows_beside_it(rows):
    keys, values = cache_layer(seed=1)
    q = torch.randn(4, CFG.n_heads, CFG.head_dim, generator=torch.Generator().manual_seed(2))
    span = 901  # a last chunk of 5 slots: its padded lanes must not move a sum
    together = rows.attend(CFG, q, keys[:, :span], values[:, :span], torch.ones(4, span, dtype=torch.bool))
    for row in range(4):
        alone = rows.attend(CFG, q[row:row + 1], keys[:, :span], values[:, :span], None)
        assert torch.equal(alone, together[row:row + 1])
    # A row that sees fewer slots gets what a shorter span gives (a verify row versus the plain step before it).
    mask = torch.ones(2, span + 40, dtype=torch.bool)
    mask[0, span:] = False
    pair = rows.attend(CFG, q[:2], keys[:, :span + 40], values[:, :span + 40], mask)
    assert torch.equal(pair[:1], rows.attend(CFG, q[:1], keys[:, :span], values[:, :span], None))


def tree_block(parents: list[int]) -> torch.Tensor:
    """[T, T] bool: node i sees itself and its ancestors (a parent is listed before its children)."""
    block = torch.eye(len(parents), dtype=torch.bool)
    for node, parent in enumerate(parents):
        if parent >= 0:
            block[node] |= block[parent]
    return block


@pytest.mark.parametrize("prefix", [60, 62, 125, 1000, 1024])
def test_a_tree_rows_attention_is_the_plain_steps_over_its_path_bit_for_bit(rows, prefix):
    """A verify row sees the prefix, then its ancestors and itself, with other candidates' slots between them; a
    plain step at its position sees the same keys and values in contiguous slots. The kernel must cut both into the
    same chunks, or the sums round otherwise (60, 62, 125: the paths cross a chunk boundary, where a kernel that
    cut the cache's slots into chunks was caught; 1000, 1024: within a chunk, and at its start)."""
    keys, values = cache_layer(seed=6)
    parents = [-1, 0, 0, 1, 1, 2, 3, 3, 4, 6, 6, 9] + [11] * 8  # 20 nodes, branching, one long chain
    t, block = len(parents), tree_block(parents)
    mask = with_prefix(block, prefix, torch.arange(t), None)
    q = torch.randn(t, CFG.n_heads, CFG.head_dim, generator=torch.Generator().manual_seed(8))
    tree = rows.attend(CFG, q, keys[:, :prefix + t], values[:, :prefix + t], mask)
    for node in range(1, t):
        path = block[node].nonzero().flatten() + prefix  # its ancestors' slots and its own, in order
        plain_keys, plain_values = keys[:, :prefix + len(path)].clone(), values[:, :prefix + len(path)].clone()
        plain_keys[:, prefix:], plain_values[:, prefix:] = keys[:, path], values[:, path]
        plain = rows.attend(CFG, q[node:node + 1], plain_keys, plain_values, None)
        assert torch.equal(plain, tree[node:node + 1])


def test_few_row_products_are_torchs_and_a_rows_product_is_its_own(rows):
    gen = torch.Generator().manual_seed(7)
    weight, x = torch.randn(300, 584, generator=gen), torch.randn(11, 584, generator=gen)  # 584: a tail past 16s
    together = rows.linear(x, weight)
    assert torch.allclose(together, x @ weight.t(), rtol=1e-5, atol=1e-4)
    for row in range(11):  # 11 rows: a tile of 8 and one of 3
        assert torch.equal(rows.linear(x[row:row + 1], weight), together[row:row + 1])


def block_of(cfg: ModelConfig, seed: int) -> Block:
    """A layer with random weights (norm weights near 1, as trained ones are)."""
    torch.manual_seed(seed)
    block = Block(cfg)
    with torch.no_grad():
        for name, tensor in block.named_parameters():
            tensor.copy_(1 + 0.1 * torch.randn_like(tensor) if "norm" in name else 0.05 * torch.randn_like(tensor))
    return block


def q8_of(linear: torch.nn.Linear) -> QuantLinear:
    weight = linear.weight.detach().numpy()
    data = quants.quantize(weight, GGMLQuantizationType.Q8_0)
    blocks = torch.from_numpy(np.ascontiguousarray(data).view(np.uint8).reshape(weight.shape[0], -1).copy())
    return QuantLinear("Q8_0", blocks, linear.out_features, linear.in_features)


def run_layer(block: Block, native_block: NativeBlock | None, t: int, slot_major: bool):
    """The layer over t tokens after 5 cached ones, in the block's dtype: (its output, q, the cache's keys and
    values)."""
    cfg, gen = block.self_attn.cfg, torch.Generator().manual_seed(t)
    dtype = block.input_layernorm.weight.dtype
    cache = KVCache(1, cfg.n_kv_heads, 24, cfg.head_dim, "cpu", dtype, slot_major=slot_major)
    cache.k[:, :, :5] = torch.randn(cfg.n_kv_heads, 5, cfg.head_dim, generator=gen)
    cache.v[:, :, :5] = torch.randn(cfg.n_kv_heads, 5, cfg.head_dim, generator=gen)
    keys, values = cache.layers[0]
    x = torch.randn(t, cfg.dim, generator=gen, dtype=dtype)
    cos, sin = (torch.randn(t, cfg.head_dim, generator=gen, dtype=dtype) for _ in range(2))
    slots = torch.arange(5, 5 + t)
    with torch.no_grad():
        out, q = block(x, cos, sin, keys, values, slots, SpanAttention(cfg, 5 + t, None, dtype), native_block)
    return out, q, cache.k.clone(), cache.v.clone()


@pytest.mark.parametrize(("t", "slot_major", "bias"), [(1, False, False), (3, True, True), (16, False, False)])
def test_a_native_layer_computes_torchs_layer(rows, t, slot_major, bias):
    cfg = dataclasses.replace(CFG, intermediate_size=96, qkv_bias=bias)
    block = block_of(cfg, seed=t)
    ours = run_layer(block, NativeBlock(rows, cfg, block), t, slot_major)
    for got, expected in zip(ours, run_layer(block, None, t, slot_major), strict=True):
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert ours[2][:, :, 5 + t:].eq(0).all()  # nothing written past the new tokens' slots


def test_a_native_layer_of_gguf_blocks_computes_torchs_layer(rows):
    """q4 models: the layer's products are the quantized kernel's, the rest the same as a float32 layer's."""
    cfg = dataclasses.replace(CFG, intermediate_size=96)
    block = block_of(cfg, seed=9)
    attn, mlp = block.self_attn, block.mlp
    attn.qkv_proj, attn.o_proj = q8_of(attn.qkv_proj), q8_of(attn.o_proj)
    mlp.gate_up_proj, mlp.down_proj = q8_of(mlp.gate_up_proj), q8_of(mlp.down_proj)
    ours = run_layer(block, NativeBlock(rows, cfg, block), 2, False)
    for got, expected in zip(ours, run_layer(block, None, 2, False), strict=True):
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_a_rows_layer_does_not_depend_on_the_rows_beside_it(rows):
    """A plain step (1 token) and a verify batch (up to 16) compute the same for the same row, bit for bit: the
    whole layer, attention included."""
    cfg = dataclasses.replace(CFG, intermediate_size=96)
    native_block = NativeBlock(rows, cfg, block_of(cfg, seed=11))
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(16, cfg.dim, generator=gen)
    cos, sin = torch.randn(16, cfg.head_dim, generator=gen), torch.randn(16, cfg.head_dim, generator=gen)
    cached = torch.randn(2, cfg.n_kv_heads, 5, cfg.head_dim, generator=gen)

    def halves(t: int):
        cache = KVCache(1, cfg.n_kv_heads, 24, cfg.head_dim, "cpu", torch.float32)
        cache.k[0, :, :5], cache.v[0, :, :5] = cached
        keys, values = cache.layers[0]
        h = x[:t].clone()
        q = native_block.before_attention(h, cos[:t], sin[:t], torch.arange(5, 5 + t), keys, values)
        mask = torch.ones(t, 5 + t, dtype=torch.bool).tril(5)  # each row sees the slots up to its own
        native_block.after_attention(h, rows.attend(cfg, q, keys[:, :5 + t], values[:, :5 + t], mask))
        return h[:1], q[:1], keys[:, 5], values[:, 5]

    for t in (4, 16):
        for alone, beside in zip(halves(1), halves(t), strict=True):
            assert torch.equal(alone, beside)


def test_the_portable_path_computes_what_the_avx2_path_does(rows, kernel_builds):
    portable = NativeRows(native.kernels(("-mno-avx2",)))
    keys, values = cache_layer(seed=5)
    q = torch.randn(3, CFG.n_heads, CFG.head_dim, generator=torch.Generator().manual_seed(6))
    mask = torch.ones(3, 600, dtype=torch.bool)
    mask[1, 300:] = False
    ours = portable.attend(CFG, q, keys[:, :600], values[:, :600], mask)
    assert torch.allclose(ours, rows.attend(CFG, q, keys[:, :600], values[:, :600], mask), rtol=1e-5, atol=1e-6)
    cfg = dataclasses.replace(CFG, intermediate_size=96)
    block = block_of(cfg, seed=8)
    layers = [run_layer(block, NativeBlock(lib, cfg, block), 2, False) for lib in (portable, rows)]
    for got, expected in zip(*layers, strict=True):
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)
    weight, x = torch.randn(40, 72), torch.randn(3, 72)
    assert torch.allclose(portable.linear(x, weight), rows.linear(x, weight), rtol=1e-5, atol=1e-5)


def test_attention_in_blocks_of_rows_is_attention_a_row_at_a_time(rows, kernel_builds):
    """With AVX-512's 32 registers the kernel takes a KV head's query rows three at a time, each key and value
    loaded once for them; AVX2 takes them one by one. Every sum is the same, bit for bit."""
    one_by_one = NativeRows(native.kernels(("-mno-avx512f",)))
    keys, values = cache_layer(seed=9)
    q = torch.randn(5, CFG.n_heads, CFG.head_dim, generator=torch.Generator().manual_seed(10))
    mask = torch.ones(5, 1000, dtype=torch.bool)
    mask[:, 995:] = torch.ones(5, 5, dtype=torch.bool).tril()
    mask[4, 997] = False  # a tree: the last token's parent is the third
    assert torch.equal(one_by_one.attend(CFG, q, keys[:, :1000], values[:, :1000], mask),
                       rows.attend(CFG, q, keys[:, :1000], values[:, :1000], mask))


@pytest.mark.parametrize(("fixture", "tolerance"), [("stories32", 1e-4), ("stories64", 1e-12)])
def test_a_cpu_model_runs_them_and_gives_torchs_logits(request, fixture, tolerance):
    """float32 and float64 models on the CPU run the kernels, and their logits are torch's to the dtype's precision."""
    model = request.getfixturevalue(fixture).model
    dtype = model.model.embed_tokens.weight.dtype
    assert isinstance(model.native, NativeRows) and model.native.dtype == dtype
    tokens, mask = torch.tensor([1, 403, 261, 9, 77]), torch.ones(5, 5, dtype=torch.bool).tril()
    mask[4, 3] = False  # a tree: the last token's parent is the third

    def logits() -> torch.Tensor:
        cache = KVCache(model.cfg.n_layers, model.cfg.n_kv_heads, 16, model.cfg.head_dim, "cpu", dtype)
        model(tokens[:2], torch.arange(2), cache, 0, mask[:2, :2])
        return model(tokens[2:], torch.tensor([2, 3, 3]), cache, 2, mask[2:]).logits

    with_kernels = logits()
    kernels, model.native = model.native, None
    try:
        without = logits()
    finally:
        model.native = kernels
    assert torch.allclose(with_kernels, without, rtol=tolerance, atol=tolerance)
    assert not torch.equal(with_kernels, without)  # the kernels ran: their sums round differently


def test_float64_kernels_compute_torchs_attention_layer_and_products(kernel_builds):
    """The row kernels built for float64 (native.DOUBLE: the portable loops' sums, in four lanes on AVX2), to
    float64's precision; a row's attention and products do not depend on the rows beside it (the products take four
    weight rows at a time); the products' four lanes are the portable loops' sums bit for bit, their tails too."""
    rows64 = NativeRows(native.kernels(native.DOUBLE), torch.float64)
    keys, values = (part.double() for part in cache_layer(seed=3))
    q = torch.randn(4, CFG.n_heads, CFG.head_dim, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    mask = torch.rand(4, 700, generator=torch.Generator().manual_seed(5)) > 0.3
    mask[:, 0] = True
    reference = sdpa_folded(CFG, q, keys[:, :700], values[:, :700], attention_bias(mask, CFG.group, torch.float64))
    together = rows64.attend(CFG, q, keys[:, :700], values[:, :700], mask)
    assert torch.allclose(together, reference, rtol=1e-12, atol=1e-12)
    assert torch.equal(rows64.attend(CFG, q[1:2], keys[:, :700], values[:, :700], mask[1:2]), together[1:2])
    block = block_of(dataclasses.replace(CFG, intermediate_size=96, qkv_bias=True), seed=13).double()
    ours = run_layer(block, NativeBlock(rows64, block.self_attn.cfg, block), 3, False)
    for got, expected in zip(ours, run_layer(block, None, 3, False), strict=True):
        assert got.dtype == torch.float64 and torch.allclose(got, expected, rtol=1e-12, atol=1e-12)
    weight, x = torch.randn(300, 584, dtype=torch.float64), torch.randn(5, 584, dtype=torch.float64)
    product = rows64.linear(x, weight)
    assert torch.allclose(product, x @ weight.t(), rtol=1e-12, atol=1e-11)
    assert torch.equal(rows64.linear(x[2:3], weight), product[2:3])
    assert torch.equal(rows64.linear(x, weight[1:8]), product[:, 1:8])  # nor on the weight rows beside its own
    portable = NativeRows(native.kernels(("-mno-avx2", *native.DOUBLE)), torch.float64)
    weight, x = torch.randn(301, 587, dtype=torch.float64), torch.randn(3, 587, dtype=torch.float64)
    assert torch.equal(portable.linear(x, weight), rows64.linear(x, weight))


@pytest.mark.parametrize("fixture", ["stories32", "stories64"])
def test_a_verify_batch_computes_each_row_as_the_plain_steps_along_its_path(request, fixture):
    """The engine's verify pass (exact_rows) over a tree of more rows than MAX_ROWS: every row's state and logits are
    bit for bit those of plain one-token steps along its path, whose K/V sit in contiguous slots (without exact_rows a
    batch this size takes torch's GEMMs and attention, which order their sums otherwise)."""
    from tokenswift.model.native_rows import MAX_ROWS

    model = request.getfixturevalue(fixture).model
    cfg, dtype = model.cfg, model.model.embed_tokens.weight.dtype
    prefix = torch.randint(2, 500, (70,), generator=torch.Generator().manual_seed(9))
    parents = [-1, 0, 0, 1, 1, 2, 3, 3, 4, 6, 6, 9] + [11 + i for i in range(9)]  # 21 nodes: a long chain too
    t = len(parents)
    assert t > MAX_ROWS
    tokens = torch.randint(2, 500, (t,), generator=torch.Generator().manual_seed(10))
    block = tree_block(parents)
    positions = block.sum(1) - 1 + 70  # a node's depth below the root at 70

    def fresh() -> KVCache:
        cache = KVCache(cfg.n_layers, cfg.n_kv_heads, 128, cfg.head_dim, "cpu", dtype)
        model(prefix, torch.arange(70), cache, 0, torch.ones(70, 70, dtype=torch.bool).tril())
        return cache

    mask = with_prefix(block, 70, positions, None)
    verify = model(tokens, positions, fresh(), 70, mask, logits="none", exact_rows=True).hidden
    for node in (8, 10, t - 1):
        cache, path = fresh(), block[node].nonzero().flatten()
        for i, along in enumerate(path.tolist()):
            plain = model(tokens[along:along + 1], torch.tensor([70 + i]), cache, 70 + i)
        # The engine takes each visited row's logits from its own state (Engine._verify), one row as a step does.
        assert torch.equal(plain.hidden, verify[node:node + 1])
        assert torch.equal(plain.logits, model.logits_of(verify[node:node + 1]))


@pytest.mark.parametrize("fixture", ["stories32", "stories64"])
def test_the_layers_in_one_call_are_the_layers_one_by_one(request, fixture):
    """Transformer.run's single C call (run_layers) computes, writes to the cache, captures and keeps what each layer's
    NativeBlock and attention compute called one by one, bit for bit: a tree batch behind a prefix, with every
    layer's queries captured and two layers' outputs kept."""
    model = request.getfixturevalue(fixture).model
    cfg, dtype = model.cfg, model.model.embed_tokens.weight.dtype
    prefix = torch.randint(2, 500, (70,), generator=torch.Generator().manual_seed(11))
    tokens = torch.randint(2, 500, (5,), generator=torch.Generator().manual_seed(12))
    block = tree_block([-1, 0, 0, 1, 2])
    positions = block.sum(1) - 1 + 70
    mask = with_prefix(block, 70, positions, None)
    keep = (1, cfg.n_layers - 1)

    def fresh() -> KVCache:
        cache = KVCache(cfg.n_layers, cfg.n_kv_heads, 96, cfg.head_dim, "cpu", dtype)
        model(prefix, torch.arange(70), cache, 0, torch.ones(70, 70, dtype=torch.bool).tril())
        return cache

    cache = fresh()
    out = model(tokens, positions, cache, 70, mask, logits="none", capture_queries=True, exact_rows=True,
                keep_layers=keep)
    by_layer, x, queries, kept = fresh(), model.model.embed_tokens(tokens), [], []
    attend = SpanAttention(cfg, 75, mask, dtype, model.native)
    cos, sin = model.rope_cos[positions], model.rope_sin[positions]
    for number, (layer, native_block, (keys, values)) in enumerate(
            zip(model.model.layers, model.native.blocks, by_layer.layers, strict=True), start=1):
        def one_layer(q, k, v):
            return model.native.attend(cfg, q, k[:, :75], v[:, :75], attend.seen_slots(5))

        x, q = layer(x, cos, sin, keys, values, torch.arange(70, 75), one_layer, native_block)
        queries.append(q)
        if number in keep:
            kept.append(x.clone())
    assert torch.equal(out.hidden, x)
    assert all(torch.equal(a, b) for a, b in zip(out.queries, queries, strict=True))
    assert len(out.layers) == 2 and all(torch.equal(a, b) for a, b in zip(out.layers, kept, strict=True))
    assert torch.equal(cache.k, by_layer.k) and torch.equal(cache.v, by_layer.v)
