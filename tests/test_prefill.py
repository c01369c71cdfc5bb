"""The chunked prefill (model/prefill.py) computes what one causal forward over the whole text does."""

from __future__ import annotations

import torch

from tokenswift.bench.shapes import preset, random_model
from tokenswift.model import prefill as prefill_module
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.masks import causal_mask
from tokenswift.model.prefill import prefill


def test_chunks_give_the_whole_texts_states_logits_and_queries(monkeypatch):
    monkeypatch.setattr(prefill_module, "PREFILL_CHUNK", 7)  # 30 tokens: four chunks, the last one short
    lm = random_model("llama3.1-8b", *preset("llama3.1-8b", tiny=True), "cpu", torch.float64)
    cfg, n = lm.config, 30
    tokens = torch.randint(cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(0))

    def cache():
        return KVCache(cfg.n_layers, cfg.n_kv_heads, n, cfg.head_dim, "cpu", torch.float64)

    whole_cache, chunked_cache = cache(), cache()
    pos = torch.arange(n)
    whole = lm.model(tokens, pos, whole_cache, 0, causal_mask(0, n, pos, None, "cpu"), logits="last",
                     capture_queries=True)
    out = prefill(lm.model, tokens, chunked_cache, keep=10, last=True)
    assert torch.allclose(out.hidden, whole.hidden[-10:], atol=1e-10)
    assert torch.allclose(out.logits, whole.logits, atol=1e-10)
    assert all(torch.allclose(q, w[-1], atol=1e-10) for q, w in zip(out.queries, whole.queries, strict=True))
    assert torch.allclose(chunked_cache.k[0], whole_cache.k[0], atol=1e-10)
    assert prefill(lm.model, tokens, cache(), keep=n).hidden.shape[0] == n
