"""Tiny GGUF files written by the tests with the `gguf` package, as llama.cpp's converter lays them out.

The weights come from a tiny random Hugging Face model (tiny_models), the tokenizer from stories260k's
SentencePiece model, so the files are small and need nothing downloaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tiny_models import hf_model

from tokenswift.model import kquant_ref

LAYER_NAMES = {  # Hugging Face name inside model.layers.N -> GGUF name inside blk.N
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(name: str) -> str:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = name.split(".", 3)
    module, suffix = rest.rsplit(".", 1)
    return f"blk.{layer}.{LAYER_NAMES[module]}.{suffix}"


def llama_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp stores Llama's Q/K rows interleaved per rotary pair; its readers undo this."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def add_tokenizer(writer, stories: Path) -> None:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(stories / "tokenizer.model"))
    n = sp.get_piece_size()
    kinds = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1 for i in range(n)]
    writer.add_tokenizer_model("llama")
    writer.add_token_list([sp.id_to_piece(i) for i in range(n)])
    writer.add_token_scores([sp.get_score(i) for i in range(n)])
    writer.add_token_types(kinds)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)


def write_gguf(path: Path, stories: Path, case: str = "llama-gqa-tied", qtype: str = "F32",
               arch: str | None = None, raw_type: str | None = None, kinds: dict[str, str] | None = None,
               **sizes):
    """Write a tiny model as GGUF with its 2-D weights in `qtype`; returns the Hugging Face model it holds.

    arch overrides the architecture written into the file; raw_type stores one weight as random bytes of that
    (unsupported) type, to test that the loader refuses it. kinds: GGUF tensor name -> its type (the project's
    reference quantizer, K kinds included), as a K-quant mix chooses per tensor. sizes: the model's config
    overrides (hidden_size=256 and up, for the K kinds' super-blocks)."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    model = hf_model(case, **sizes)
    cfg = model.config
    family = arch or cfg.model_type
    w = gguf.GGUFWriter(str(path), family)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(cfg.vocab_size)
    add_tokenizer(w, stories)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # llama.cpp writes a tied head once, as the embedding
        data = tensor.float().numpy()
        if cfg.model_type == "llama" and name.endswith("q_proj.weight"):
            data = llama_permute(data, cfg.num_attention_heads)
        if cfg.model_type == "llama" and name.endswith("k_proj.weight"):
            data = llama_permute(data, cfg.num_key_value_heads)
        if raw_type and name.endswith("layers.0.mlp.up_proj.weight"):
            kind = Q[raw_type]
            block, size = gguf.GGML_QUANT_SIZES[kind]
            raw = np.random.default_rng(0).integers(0, 255, (data.shape[0], data.shape[1] // block * size))
            w.add_tensor(gguf_name(name), raw.astype(np.uint8), raw_dtype=kind)
        elif kinds and gguf_name(name) in kinds:
            kind = kinds[gguf_name(name)]
            w.add_tensor(gguf_name(name), kquant_ref.quantize(data, kind), raw_dtype=Q[kind])
        elif data.ndim == 2 and qtype != "F32":
            w.add_tensor(gguf_name(name), quants.quantize(data, Q[qtype]), raw_dtype=Q[qtype])
        else:
            w.add_tensor(gguf_name(name), data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model
