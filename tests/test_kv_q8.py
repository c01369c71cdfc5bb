"""The q8 KV cache (kv_q8.py, kv_q8.h, attention_q8.c): rows of 8-bit integers and a scale, written the same by torch
(a prefill) and the C kernels (a step); attention over them by integer dot products, the vector loops (VNNI, AVX2)
bit for bit the portable ones; a verify batch's rows still a plain step's rows; and TokenSwift still plain decoding's
text."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from speed import AR
from test_native_rows import CFG, block_of, cache_layer, tree_block

from tokenswift.decode.generate import Generator
from tokenswift.model import native
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.kv_q8 import Q8, dequantize, quantize
from tokenswift.model.loading import compact_cache
from tokenswift.model.masks import with_prefix
from tokenswift.model.native_rows import NativeBlock, NativeRows
from tokenswift.settings import Settings

PROMPT = ("Once upon a time, a little girl named Lily found a shiny red ball in the park. She wanted to play with "
          "her friend Tom, so she")  # longer than a C forward's rows: the prompt's prefill runs torch's operators


# The default model's heads (64 wide) and those of most 7-12B models (Llama 3.1 8B, Mistral 7B, Qwen2.5 7B: 128).
WIDE = dataclasses.replace(CFG, head_dim=128)


def q8_layer(seed: int, cfg=CFG) -> tuple[torch.Tensor, torch.Tensor]:
    if cfg.head_dim == CFG.head_dim:
        keys, values = cache_layer(seed=seed)
    else:
        gen = torch.Generator().manual_seed(seed)
        keys, values = (torch.randn(cfg.n_kv_heads, 4096, cfg.head_dim, generator=gen) for _ in range(2))
    return quantize(keys * 3, key=True), quantize(values, key=False)  # keys of a trained model's spread


def test_a_row_is_its_integers_and_scale():
    x = torch.tensor([[0.5, -1.0, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0]])
    for key in (True, False):
        rows = quantize(x, key)
        assert rows.dtype == Q8 and rows.shape == (2, 8)
        scales = x.abs().amax(1, keepdim=True) / 127
        assert torch.equal(dequantize(rows, key), torch.tensor([[64, -127, 32, 0], [0, 0, 0, 0]]) * scales)
    assert quantize(x, key=True)[0, :4].tolist() == [192, 1, 160, 128]  # a key's bytes carry +128
    assert quantize(x, key=False)[0, :4].tolist() == [64, 129, 32, 0]  # a value's are two's complement


def test_a_layer_stores_q8_rows_as_torch_quantizes_them():
    rows = NativeRows(native.kernels())
    layer = NativeBlock(rows, CFG, block_of(CFG, seed=5))
    x = torch.randn(4, CFG.dim, generator=torch.Generator().manual_seed(6)) * 3
    angles = torch.arange(4.0)[:, None] * torch.linspace(0.1, 1.0, CFG.head_dim)
    cos, sin, slots = angles.cos(), angles.sin(), torch.tensor([2, 3, 7, 9])
    caches = [KVCache(1, CFG.n_kv_heads, 12, CFG.head_dim, "cpu", dtype) for dtype in (torch.float32, Q8)]
    queries = [layer.before_attention(x.clone(), cos, sin, slots, *cache.layers[0]) for cache in caches]
    assert torch.equal(queries[0], queries[1])
    assert torch.equal(caches[1].k[:, :, slots], quantize(caches[0].k[:, :, slots], key=True))
    assert torch.equal(caches[1].v[:, :, slots], quantize(caches[0].v[:, :, slots], key=False))


@pytest.mark.parametrize(("t", "span", "cfg"), [(1, 1, CFG), (1, 1000, CFG), (3, 700, CFG), (4, 257, CFG),
                                                (16, 2048, CFG), (1, 1000, WIDE), (4, 257, WIDE)])
def test_the_vector_loops_are_the_portable_ones_and_near_attention_over_the_rows(request, t, span, cfg):
    vector = NativeRows(native.kernels())
    request.getfixturevalue("kernel_builds")
    # test_compact_cache's builds too: one compile each. Without AVX-512 the vector loops are AVX2's.
    avx2, portable = (NativeRows(native.kernels(flags)) for flags in (("-mno-avx512f",), ("-mno-avx2",)))
    assert vector.lib.attention_q8_fast(cfg.head_dim) and avx2.lib.attention_q8_fast(cfg.head_dim)
    assert not portable.lib.attention_q8_fast(cfg.head_dim)
    keys, values = q8_layer(t, cfg)
    q = torch.randn(t, cfg.n_heads, cfg.head_dim, generator=torch.Generator().manual_seed(span))
    mask = torch.rand(t, span, generator=torch.Generator().manual_seed(t)) > 0.3
    mask[:, 0] = True
    out = vector.attend(cfg, q, keys[:, :span], values[:, :span], mask)
    assert torch.equal(out, portable.attend(cfg, q, keys[:, :span], values[:, :span], mask))
    assert torch.equal(out, avx2.attend(cfg, q, keys[:, :span], values[:, :span], mask))
    # Over the rows' own values, the error is the query's and the weights' 8 bits: ~1% of the outputs' size.
    wide = NativeRows(native.kernels()).attend(cfg, q, dequantize(keys[:, :span], True).contiguous(),
                                               dequantize(values[:, :span], False).contiguous(), mask)
    assert torch.allclose(out, wide, atol=0.02 * wide.abs().max().item(), rtol=0)


@pytest.mark.parametrize("cfg", [CFG, WIDE])
def test_a_rows_attention_over_a_q8_cache_does_not_depend_on_the_rows_beside_it(cfg):
    rows = NativeRows(native.kernels())
    keys, values = q8_layer(3, cfg)
    q = torch.randn(5, cfg.n_heads, cfg.head_dim, generator=torch.Generator().manual_seed(4))
    span = 1000
    mask = torch.ones(5, span, dtype=torch.bool)
    mask[:, 995:] = tree_block([-1, 0, 1, 2, 2])
    together = rows.attend(cfg, q, keys[:, :span], values[:, :span], mask)
    for row in range(5):
        seen = mask[row].nonzero().flatten()
        alone = rows.attend(cfg, q[row:row + 1], keys[:, seen], values[:, seen], None)
        assert torch.equal(alone, together[row:row + 1])


def test_a_verify_batch_over_a_q8_cache_computes_each_row_as_the_plain_steps(smollm2_q4):
    """The default model (head_dim 64: the vector loops), its prefix prefilled into a q8 cache by torch."""
    model, cfg = smollm2_q4.model, smollm2_q4.config
    prefix = torch.randint(2, 500, (70,), generator=torch.Generator().manual_seed(9))
    parents = [-1, 0, 0, 1, 1, 2, 3, 3, 4, 6, 6]
    tokens = torch.randint(2, 500, (len(parents),), generator=torch.Generator().manual_seed(10))
    block = tree_block(parents)
    positions = block.sum(1) - 1 + 70

    def fresh() -> KVCache:
        cache = KVCache(cfg.n_layers, cfg.n_kv_heads, 128, cfg.head_dim, "cpu", Q8)
        model(prefix, torch.arange(70), cache, 0, torch.ones(70, 70, dtype=torch.bool).tril(), logits="none")
        return cache

    with torch.inference_mode():
        verify = model(tokens, positions, fresh(), 70, with_prefix(block, 70, positions, None), logits="none",
                       exact_rows=True).hidden
        for node in (8, len(parents) - 1):
            cache, path = fresh(), block[node].nonzero().flatten()
            for i, along in enumerate(path.tolist()):
                plain = model(tokens[along:along + 1], torch.tensor([70 + i]), cache, 70 + i, logits="none")
            assert torch.equal(plain.hidden, verify[node:node + 1])


def test_the_default_model_writes_the_same_text_by_tokenswift_over_a_q8_cache(smollm2_q4):
    lm = compact_cache(smollm2_q4, "q8")
    prompt = lm.encode("The lighthouse keeper climbed the stairs each night, and on the last night of the year")
    settings = Settings(max_new_tokens=120, seed=4, ignore_eos=True, temperature=0.9, min_p=0.1)
    plain = Generator(lm, settings, prompt, options=AR).run()
    assert Generator(lm, settings, prompt).run() == plain
