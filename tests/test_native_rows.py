"""The C kernels of a layer's steps for a few float32 rows on the CPU (tokenswift/model/native_rows.py): each
computes what torch's operators compute, on the AVX2 path and the portable one; a row's attention does not depend
on the rows beside it; and a float32 model's forward with them gives the logits it gives without them."""

from __future__ import annotations

import pytest
import torch

from tokenswift.model import native
from tokenswift.model.config import ModelConfig
from tokenswift.model.forward import attention_bias, sdpa_folded
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.native_rows import NativeRows
from tokenswift.model.rope import apply_rope

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


def test_layer_steps_are_torchs(rows):
    gen = torch.Generator().manual_seed(3)
    x, y, w = torch.randn(3, 576, generator=gen), torch.randn(3, 576, generator=gen), torch.rand(576, generator=gen)
    norm = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    assert torch.allclose(rows.rms_norm(x, w, 1e-5), norm, rtol=1e-5, atol=1e-6)
    total, normed = rows.add_rms_norm(x, y, w, 1e-5)
    assert torch.equal(total, x + y)
    assert torch.allclose(normed, rows.rms_norm(x + y, w, 1e-5), rtol=1e-6, atol=1e-7)
    gate_up = torch.randn(3, 128, generator=gen) * 4
    gate, up = gate_up.chunk(2, -1)
    assert torch.allclose(rows.swiglu(gate_up), torch.nn.functional.silu(gate) * up, rtol=1e-5, atol=1e-6)


def test_few_row_products_are_torchs_and_a_rows_product_is_its_own(rows):
    gen = torch.Generator().manual_seed(7)
    weight, x = torch.randn(300, 584, generator=gen), torch.randn(11, 584, generator=gen)  # 584: a tail past 16s
    together = rows.linear(x, weight)
    assert torch.allclose(together, x @ weight.t(), rtol=1e-5, atol=1e-4)
    for row in range(11):  # 11 rows: a tile of 8 and one of 3
        assert torch.equal(rows.linear(x[row:row + 1], weight), together[row:row + 1])


def test_rope_and_the_cache_write_are_torchs(rows):
    gen = torch.Generator().manual_seed(4)
    t, width = 2, (CFG.n_heads + 2 * CFG.n_kv_heads) * CFG.head_dim
    qkv = torch.randn(t, width, generator=gen)
    cos, sin = torch.randn(t, CFG.head_dim, generator=gen), torch.randn(t, CFG.head_dim, generator=gen)
    slots = torch.tensor([5, 9])
    for slot_major in (False, True):
        cache = KVCache(1, CFG.n_kv_heads, 16, CFG.head_dim, "cpu", torch.float32, slot_major=slot_major)
        keys, values = cache.layers[0]
        q = rows.rope_store(CFG, qkv, cos, sin, slots, keys, values)
        heads = qkv.view(t, -1, CFG.head_dim)
        rotated = apply_rope(heads[:, :CFG.n_heads + CFG.n_kv_heads], cos, sin)
        assert torch.allclose(q, rotated[:, :CFG.n_heads], rtol=1e-6, atol=1e-6)
        assert torch.allclose(keys[:, slots].transpose(0, 1), rotated[:, CFG.n_heads:], rtol=1e-6, atol=1e-6)
        assert torch.equal(values[:, slots].transpose(0, 1), heads[:, CFG.n_heads + CFG.n_kv_heads:])
        assert not keys[:, :5].any() and not values[:, 10:].any()  # nothing else written


def test_the_portable_path_computes_what_the_avx2_path_does(rows, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENSWIFT_CACHE", str(tmp_path))
    portable = NativeRows(native.kernels(("-mno-avx2",)))
    keys, values = cache_layer(seed=5)
    q = torch.randn(3, CFG.n_heads, CFG.head_dim, generator=torch.Generator().manual_seed(6))
    mask = torch.ones(3, 600, dtype=torch.bool)
    mask[1, 300:] = False
    ours = portable.attend(CFG, q, keys[:, :600], values[:, :600], mask)
    assert torch.allclose(ours, rows.attend(CFG, q, keys[:, :600], values[:, :600], mask), rtol=1e-5, atol=1e-6)
    gate_up = torch.randn(2, 64)
    assert torch.allclose(portable.swiglu(gate_up), rows.swiglu(gate_up), rtol=1e-6, atol=1e-7)
    weight, x = torch.randn(40, 72), torch.randn(3, 72)
    assert torch.allclose(portable.linear(x, weight), rows.linear(x, weight), rtol=1e-5, atol=1e-5)


def test_a_float32_cpu_model_runs_them_and_gives_torchs_logits(stories32):
    model = stories32.model
    assert isinstance(model.native, NativeRows)
    tokens, mask = torch.tensor([1, 403, 261, 9, 77]), torch.ones(5, 5, dtype=torch.bool).tril()
    mask[4, 3] = False  # a tree: the last token's parent is the third

    def logits() -> torch.Tensor:
        cache = KVCache(model.cfg.n_layers, model.cfg.n_kv_heads, 16, model.cfg.head_dim, "cpu", torch.float32)
        model(tokens[:2], torch.arange(2), cache, 0, mask[:2, :2])
        return model(tokens[2:], torch.tensor([2, 3, 3]), cache, 2, mask[2:]).logits

    with_kernels = logits()
    kernels, model.native = model.native, None
    try:
        without = logits()
    finally:
        model.native = kernels
    assert torch.allclose(with_kernels, without, rtol=1e-4, atol=1e-4)
    assert not torch.equal(with_kernels, without)  # the kernels ran: their sums round differently


def test_a_float64_model_keeps_torchs_operators(stories64):
    assert stories64.model.native is None
