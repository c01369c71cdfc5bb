"""The compact KV cache (keys and values in bfloat16, loading.compact_cache): the C kernels store them rounded as torch
rounds and read them widened, so attention over a bf16 cache is, bit for bit, attention over a float32 cache holding
the rounded values, on every path the kernels build but AVX-512 BF16's (there scores and weighted sums take
vdpbf16ps, over q and the weights rounded to bf16: close to it); a verify batch's rows are still plain steps' rows;
and TokenSwift still writes plain decoding's text."""

from __future__ import annotations

import pytest
import torch
from speed import AR, speed
from test_native_rows import CFG, block_of, cache_layer, tree_block

from tokenswift.decode.generate import Generator
from tokenswift.model import native
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.kv_q8 import Q8
from tokenswift.model.loading import compact_cache
from tokenswift.model.masks import with_prefix
from tokenswift.model.native_rows import NativeBlock, NativeRows
from tokenswift.settings import Settings

PROMPT = ("Once upon a time, a little girl named Lily found a shiny red ball in the park. She wanted to play with "
          "her friend Tom, so she")  # longer than a C forward's rows: the prompt's prefill runs torch's operators


def rounded_layer(seed: int) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """A cache layer in bf16 and the same values in float32."""
    keys, values = cache_layer(seed=seed)
    compact = keys.to(torch.bfloat16), values.to(torch.bfloat16)
    return compact, (compact[0].float(), compact[1].float())


@pytest.mark.parametrize("flags", [(), ("-mno-avx512f",), ("-mno-avx2",)])
@pytest.mark.parametrize(("t", "span"), [(1, 1), (1, 1000), (3, 700), (4, 257), (16, 2048)])
def test_attention_over_a_bf16_cache_is_float32_attention_over_its_values(request, flags, t, span):
    if flags:
        request.getfixturevalue("kernel_builds")
    rows = NativeRows(native.kernels(flags))
    (keys, values), (keys32, values32) = rounded_layer(seed=t)
    q = torch.randn(t, CFG.n_heads, CFG.head_dim, generator=torch.Generator().manual_seed(span))
    mask = torch.rand(t, span, generator=torch.Generator().manual_seed(t)) > 0.3
    mask[:, 0] = True
    dot_bf16 = rows.lib.attention_dot_bf16()
    for seen in (None, mask) if t == 1 else (mask,):
        compact = rows.attend(CFG, q, keys[:, :span], values[:, :span], seen)
        wide = rows.attend(CFG, q, keys32[:, :span], values32[:, :span], seen)
        if not dot_bf16:
            assert torch.equal(compact, wide)
            continue
        # The products of q and of the weights rounded to bf16, in pairs: within a few bf16 roundings of float32's
        # (outputs here are up to ~0.4), and not float32's (one slot's weight is 1 whatever its score).
        assert torch.allclose(compact, wide, atol=2e-3, rtol=0)
        assert span == 1 or not torch.equal(compact, wide)


def test_a_rows_attention_over_a_bf16_cache_does_not_depend_on_the_rows_beside_it():
    rows = NativeRows(native.kernels())
    (keys, values), _ = rounded_layer(seed=3)
    q = torch.randn(5, CFG.n_heads, CFG.head_dim, generator=torch.Generator().manual_seed(4))
    span = 1000
    mask = torch.ones(5, span, dtype=torch.bool)
    mask[:, 995:] = tree_block([-1, 0, 1, 2, 2])  # a tree: the last token's parent is the third
    together = rows.attend(CFG, q, keys[:, :span], values[:, :span], mask)
    for row in range(5):
        seen = mask[row].nonzero().flatten()
        alone = rows.attend(CFG, q[row:row + 1], keys[:, seen], values[:, seen], None)
        assert torch.equal(alone, together[row:row + 1])


def test_a_layer_stores_its_keys_and_values_in_bf16_as_torch_rounds_them():
    rows = NativeRows(native.kernels())
    block = block_of(CFG, seed=5)
    layer = NativeBlock(rows, CFG, block)
    x = torch.randn(4, CFG.dim, generator=torch.Generator().manual_seed(6)) * 3
    angles = torch.arange(4.0)[:, None] * torch.linspace(0.1, 1.0, CFG.head_dim)
    cos, sin, slots = angles.cos(), angles.sin(), torch.tensor([2, 3, 7, 9])
    caches = [KVCache(1, CFG.n_kv_heads, 12, CFG.head_dim, "cpu", dtype) for dtype in (torch.float32, torch.bfloat16)]
    queries = [layer.before_attention(x.clone(), cos, sin, slots, *cache.layers[0]) for cache in caches]
    assert torch.equal(queries[0], queries[1])
    assert torch.equal(caches[1].k, caches[0].k.to(torch.bfloat16))
    assert torch.equal(caches[1].v, caches[0].v.to(torch.bfloat16))


def test_a_verify_batch_over_a_bf16_cache_computes_each_row_as_the_plain_steps(stories32):
    """As test_native_rows' verify test, with the prefix prefilled into a bf16 cache by torch's operators."""
    model, cfg = stories32.model, stories32.config
    prefix = torch.randint(2, 500, (70,), generator=torch.Generator().manual_seed(9))
    parents = [-1, 0, 0, 1, 1, 2, 3, 3, 4, 6, 6, 9] + [11 + i for i in range(9)]
    tokens = torch.randint(2, 500, (len(parents),), generator=torch.Generator().manual_seed(10))
    block = tree_block(parents)
    positions = block.sum(1) - 1 + 70

    def fresh() -> KVCache:
        cache = KVCache(cfg.n_layers, cfg.n_kv_heads, 128, cfg.head_dim, "cpu", torch.bfloat16)
        model(prefix, torch.arange(70), cache, 0, torch.ones(70, 70, dtype=torch.bool).tril())
        return cache

    mask = with_prefix(block, 70, positions, None)
    verify = model(tokens, positions, fresh(), 70, mask, logits="none", exact_rows=True).hidden
    for node in (8, 10, len(parents) - 1):
        cache, path = fresh(), block[node].nonzero().flatten()
        for i, along in enumerate(path.tolist()):
            plain = model(tokens[along:along + 1], torch.tensor([70 + i]), cache, 70 + i)
        assert torch.equal(plain.hidden, verify[node:node + 1])


@pytest.mark.parametrize(("kind", "dtype"), [("bf16", torch.bfloat16), ("q8", Q8)])
@pytest.mark.parametrize(("drafter", "sampling"), [("paper", dict(temperature=0.0)),
                                                   ("fused", dict(temperature=1.0, min_p=0.1, penalty=1.2))])
def test_tokenswift_equals_plain_decoding_with_a_compact_cache(stories32, drafter, sampling, kind, dtype):
    """bf16, and q8 (kv_q8.py; at stories260k's head_dim of 8, its portable loops)."""
    from test_exactness import random_heads, with_heads

    lm = compact_cache(with_heads(stories32, random_heads(stories32, 1)), kind)
    prompt = lm.encode(PROMPT)
    settings = Settings(max_new_tokens=300, seed=2, ignore_eos=True, **sampling)
    plain = Generator(lm, settings, prompt, options=AR).run()
    gen = Generator(lm, settings, prompt, options=speed(ngram_topk=20, budget=48, sinks=16, drafter=drafter))
    assert gen.run() == plain
    assert gen.metrics().steps < 300  # drafts were accepted
    assert gen._engine.cache.k.dtype == dtype


def test_float64_and_gpu_models_keep_a_full_precision_cache(stories64):
    assert compact_cache(stories64, "float32").cache_dtype == torch.float64
    with pytest.raises(ValueError, match="float32 or q4"):
        compact_cache(stories64, "bf16")


def test_q4_runs_a_compact_cache_by_default_and_other_precisions_keep_theirs(smollm2_q4, stories32, stories64):
    """auto (load_model's and the CLI's default): for q4, the app's CPU configuration, q8 where the kernels have its
    integer products and bf16 elsewhere (loading.compact_cache's measurements); full precision elsewhere (float64
    for the exactness proofs)."""
    fast = smollm2_q4.model.native.lib.attention_q8_fast(smollm2_q4.config.head_dim)
    assert (smollm2_q4.kv_cache, smollm2_q4.cache_dtype) == (("q8", Q8) if fast else ("bf16", torch.bfloat16))
    assert (stories32.kv_cache, stories32.cache_dtype) == ("float32", torch.float32)
    assert stories64.cache_dtype == torch.float64 and compact_cache(stories64, "auto").cache_dtype == torch.float64
    assert compact_cache(smollm2_q4, "float32").cache_dtype == torch.float32  # --kv-cache float32
