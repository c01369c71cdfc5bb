"""The partial cache's selection against a direct computation of q·k importance (design §4)."""

from __future__ import annotations

import torch

from tokenswift.model.config import ModelConfig
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.partial_cache import PartialCache

CFG = ModelConfig(family="llama", vocab_size=32, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                  intermediate_size=64, norm_eps=1e-5, qkv_bias=False, tie_embeddings=True,
                  max_position_embeddings=512, sliding_window=None, bos_token_id=1, eos_token_ids=(2,))


def random_full(length, seed=0):
    full = KVCache(CFG.n_layers, CFG.n_kv_heads, 256, CFG.head_dim, "cpu", torch.float64)
    g = torch.Generator().manual_seed(seed)
    full.k[:, :, :length] = torch.randn(CFG.n_layers, CFG.n_kv_heads, length, CFG.head_dim, generator=g,
                                        dtype=torch.float64)
    full.v[:, :, :length] = torch.randn(full.v[:, :, :length].shape, generator=g, dtype=torch.float64)
    return full


def queries(seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(CFG.n_heads, CFG.head_dim, generator=g, dtype=torch.float64) for _ in range(CFG.n_layers)]


def test_fills_with_everything_until_the_budget():
    full = random_full(20)
    pc = PartialCache(CFG, budget=32, sinks=4, device="cpu", dtype=torch.float64)
    pc.extend(full, 0, 12, None)
    pc.extend(full, 12, 20, None)
    assert pc.n == 20 and not pc.selected
    assert torch.equal(pc.cache.k[:, :, :20], full.k[:, :, :20])


def test_selection_matches_direct_importance():
    length, budget, sinks = 100, 32, 4
    full, q = random_full(length), queries()
    pc = PartialCache(CFG, budget=budget, sinks=sinks, device="cpu", dtype=torch.float64)
    pc.extend(full, 0, 30, None)
    assert pc.needs_selection(length - 30)
    pc.extend(full, 30, length, q)
    assert pc.selected and pc.n == budget
    for layer in range(CFG.n_layers):
        for head in range(CFG.n_kv_heads):
            group = q[layer][head * 2:(head + 1) * 2]  # query heads 2h, 2h+1 share KV head h
            scores = [sum(float(group[g] @ full.k[layer, head, t]) for g in range(2)) for t in range(length)]
            ranked = sorted(range(sinks, length), key=lambda t: scores[t], reverse=True)[:budget - sinks]
            ascending = list(reversed(ranked))  # least important first: overwritten first
            expected = torch.stack([full.k[layer, head, t] for t in range(sinks)] + [full.k[layer, head, t]
                                                                                     for t in ascending])
            assert torch.equal(pc.cache.k[layer, head, :budget], expected)
            assert torch.equal(pc.cache.v[layer, head, :sinks], full.v[layer, head, :sinks])


def test_recent_tokens_overwrite_least_important_then_reselect():
    full, q = random_full(120), queries()
    pc = PartialCache(CFG, budget=24, sinks=4, device="cpu", dtype=torch.float64)
    pc.extend(full, 0, 60, q)
    assert pc.selections == 1
    kept_most_important = pc.cache.k[:, :, 23].clone()
    pc.extend(full, 60, 63, None)  # three recent tokens replace the three least important slots
    assert torch.equal(pc.cache.k[:, :, 4:7], full.k[:, :, 60:63])
    assert torch.equal(pc.cache.k[:, :, 23], kept_most_important)
    assert pc.written == 3
    pc.extend(full, 63, 80, None)  # 20 written of the 20 selected slots: still no reselection
    assert pc.selections == 1 and pc.needs_selection(1)
    pc.extend(full, 80, 81, q)
    assert pc.selections == 2 and pc.written == 0
