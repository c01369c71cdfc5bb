"""A K-quant GGUF file on the q4 path (mapped.py): read where it lies, no float copy in the cache; its logits those
of the file's weights; TokenSwift writes what plain decoding writes, token for token."""

from __future__ import annotations

import pytest
import torch
from gguf_files import write_gguf
from speed import AR, speed

from tokenswift.bench.shapes import random_heads
from tokenswift.decode.generate import Generator
from tokenswift.model import mapped
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.loading import load_model
from tokenswift.model.masks import causal_mask
from tokenswift.model.quant import QuantEmbedding, QuantLinear, StackedQuant
from tokenswift.model.run_defaults import default_dtype
from tokenswift.settings import Settings
from worker.holder import param_count

# Every kind in one file, mixed inside the fused products: rows of 256 take the K kinds, the MLP's 288-wide
# down projection the legacy Q5_0/Q5_1 (as a K-quant mix falls back where rows are not a multiple of 256).
SIZES = dict(hidden_size=256, intermediate_size=288, num_attention_heads=4, num_key_value_heads=2)
LAYER_KINDS = {"attn_q": "Q4_K", "attn_k": "Q5_K", "attn_v": "Q6_K", "attn_output": "Q5_K", "ffn_gate": "Q4_K",
               "ffn_up": "Q6_K"}
KINDS = {"token_embd.weight": "Q6_K", **{f"blk.{i}.{short}.weight": kind for i in range(2)
                                         for short, kind in LAYER_KINDS.items()},
         "blk.0.ffn_down.weight": "Q5_0", "blk.1.ffn_down.weight": "Q5_1"}


@pytest.fixture(scope="module")
def kquant(tmp_path_factory, stories_path):
    folder = tmp_path_factory.mktemp("kquant")
    path = folder / "tiny-k.gguf"
    write_gguf(path, stories_path, "llama-gqa-tied", kinds=KINDS, **SIZES)
    return path


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENSWIFT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def logits(lm, ids: torch.Tensor, exact_rows: bool = False) -> torch.Tensor:
    """All rows' logits from one pass; exact_rows: each row by the C kernels (q4: the block products)."""
    cfg, t = lm.config, len(ids)
    cache = KVCache(cfg.n_layers, cfg.n_kv_heads, t, cfg.head_dim, lm.device, lm.dtype)
    positions = torch.arange(t)
    with torch.no_grad():
        return lm.model(ids, positions, cache, 0, causal_mask(0, t, positions, None, "cpu"),
                        exact_rows=exact_rows).logits


def test_a_k_quant_file_runs_from_its_own_blocks(kquant, home):
    assert mapped.reads_in_place(kquant) and default_dtype("cpu", kquant) == "q4"
    lm = load_model(str(kquant), dtype="q4")
    assert lm.precision == "q4"
    assert lm.path.name.endswith("-header") and not (lm.path / "model.safetensors").exists()  # config, tokenizer
    layer = lm.model.model.layers[1]
    qkv, down = layer.self_attn.qkv_proj, layer.mlp.down_proj
    assert isinstance(qkv, StackedQuant) and qkv.kind == "Q4_K+Q5_K+Q6_K" and down.kind == "Q5_1"
    embedding = lm.model.model.embed_tokens
    assert isinstance(embedding, QuantEmbedding) and lm.model.quantized_head is embedding.table
    size = kquant.stat().st_size
    for product in (qkv.parts[2], down, embedding.table):  # views of the one map of the file, not copies
        assert isinstance(product, QuantLinear) and product.blocks.untyped_storage().nbytes() == size
    ids = torch.randint(3, lm.config.vocab_size, (40,), generator=torch.Generator().manual_seed(0))
    dense = load_model(str(kquant))  # float32: the file dequantized
    assert param_count(lm) == param_count(dense)
    # down's packed copy serves the products and its file pages were handed back: read again, they are the file's
    assert torch.allclose(down.dequantized(), dense.model.model.layers[1].mlp.down_proj.weight, atol=1e-6)
    ours, reference = logits(lm, ids, True), logits(dense, ids)
    assert torch.nn.functional.cosine_similarity(ours, reference, dim=-1).min() > 0.99
    assert (ours.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.9


def test_tokenswift_writes_what_plain_decoding_writes(kquant, home):
    lm = load_model(str(kquant), dtype="q4")
    lm.heads = random_heads(lm.config, lm.device, lm.dtype)
    prompt = lm.encode("Once upon a time, a little cat sat by the fire. The cat")
    accepted = 0
    for seed, temperature in ((3, 0.0), (4, 0.8)):
        settings = Settings(max_new_tokens=48, seed=seed, temperature=temperature, ignore_eos=True)
        plain = Generator(lm, settings, prompt, options=AR).run()
        swift = Generator(lm, settings, prompt, options=speed(drafter="fused"))
        assert swift.run() == plain and len(plain) == 48
        assert swift.metrics().steps < 48 and swift.metrics().verify_batch > 1  # drafts were verified in batches
        accepted += swift.metrics().accepted
    assert accepted > 0


def test_the_model_tab_says_what_a_file_is_and_refuses_what_cannot_fit(kquant):
    from dataclasses import replace

    from tokenswift.model.gguf_checkpoint import inspect_gguf
    from tokenswift.model.gguf_summary import summarize
    from ui.model.model import _gguf_note, check_spec

    summary = summarize(kquant)
    assert summary.quantization == "Q6_K" and summary.context_length == 512  # no file type: the commonest blocks
    kv = 2 * 2 * 2 * 64 * 4  # K and V, 2 layers, 2 KV heads of 64, float32
    assert summary.kv_bytes_per_token == kv and summary.memory_bytes("q4", 100) == summary.file_bytes + 100 * kv
    _, note = check_spec(str(kquant), "", "cpu", "q4")
    assert note.startswith("GGUF file: llama, Q6_K, ") and "512-token context" in note and "as it is" in note
    huge = replace(summary, parameters=10**14)  # 400 TB in float32: no computer here holds it
    with pytest.raises(ValueError, match="needs about .* GB in float32 at 512 tokens, more than this computer's"):
        _gguf_note(inspect_gguf(kquant), huge, "float32")
