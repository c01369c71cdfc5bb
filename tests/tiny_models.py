"""Tiny random Hugging Face models covering the architectures and RoPE variants we support."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

VOCAB = 512  # the stories260k tokenizer's size, so saved tiny checkpoints can reuse its tokenizer

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=512, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)

CASES = {
    "llama-mha": ("llama", dict(num_key_value_heads=4, tie_word_embeddings=False)),
    "llama-gqa-tied": ("llama", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "llama-linear": ("llama", dict(num_key_value_heads=2, rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "llama-dynamic": ("llama", dict(num_key_value_heads=2, max_position_embeddings=64,
                                    rope_scaling={"rope_type": "dynamic", "factor": 2.0})),
    "llama3": ("llama", dict(num_key_value_heads=1, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64})),
    "llama-yarn": ("llama", dict(num_key_value_heads=2, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128})),
    "mistral-window": ("mistral", dict(num_key_value_heads=2, sliding_window=48)),
    "qwen2-bias-gqa": ("qwen2", dict(num_key_value_heads=2, tie_word_embeddings=False)),
    "qwen2-yarn-tied": ("qwen2", dict(num_key_value_heads=1, tie_word_embeddings=True, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128})),
}


def hf_model(case: str, seed: int = 0, dtype=torch.float32, **overrides):
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    family, extra = CASES[case]
    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "mistral": (MistralConfig, MistralForCausalLM),
               "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    config_cls, model_cls = classes[family]
    config = config_cls(**(BASE | extra | overrides))
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(config).to(dtype).eval()
    with torch.no_grad():  # random init leaves norms at 1 and biases at 0: perturb so they are tested
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def save_checkpoint(model, directory: Path, tokenizer_from: Path, **save_kwargs) -> Path:
    model.save_pretrained(directory, **save_kwargs)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"):
        if (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, directory / name)
    return directory
