"""Model shapes for `bench-gpu`: the paper's target models with their real dimensions, random weights.

Decoding time depends on the shapes, not on the weights, so a preset gives a ModelConfig plus a synthetic
transformers config (the RoPE table and context limit are read from it, exactly as for a checkpoint).
Presets exist for timing only: real checkpoints are always read from their own config.json.
`tiny` shrinks a preset (keeping its family, GQA ratio, biases, tying and RoPE type) so the benchmark
runs on a CPU in seconds.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from tokenswift.model.config import ModelConfig
from tokenswift.model.forward import Transformer
from tokenswift.model.heads import DraftHeads, new_heads
from tokenswift.model.hf_files import CheckpointConfig
from tokenswift.model.loading import LoadedModel, rope_positions
from tokenswift.model.rope import rope_table

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}

PRESETS: dict[str, dict] = {
    "llama3.1-8b": dict(family="llama", vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                        intermediate_size=14336, norm_eps=1e-5, qkv_bias=False, tie_embeddings=False,
                        rope_theta=500000.0, rope_scaling=LLAMA3_ROPE, bos_token_id=128000,
                        eos_token_ids=(128001, 128008, 128009)),
    "qwen2.5-7b": dict(family="qwen2", vocab_size=152064, dim=3584, n_layers=28, n_heads=28, n_kv_heads=4,
                       intermediate_size=18944, norm_eps=1e-6, qkv_bias=True, tie_embeddings=False,
                       rope_theta=1e6, rope_scaling=None, bos_token_id=151643, eos_token_ids=(151643,)),
    "qwen2.5-1.5b": dict(family="qwen2", vocab_size=151936, dim=1536, n_layers=28, n_heads=12, n_kv_heads=2,
                         intermediate_size=8960, norm_eps=1e-6, qkv_bias=True, tie_embeddings=True,
                         rope_theta=1e6, rope_scaling=None, bos_token_id=151643, eos_token_ids=(151643,)),
}
MAX_POSITIONS = 131072  # all three are used at 128K context (Llama-3.1 natively; Qwen2.5 with YaRN)
TINY_HEAD_DIM = 16


def _hf_config(config: ModelConfig, rope_theta: float, rope_scaling: dict | None) -> CheckpointConfig:
    """The config.json fields our RoPE table and context limit read."""
    return CheckpointConfig(dict(
        model_type=config.family, vocab_size=config.vocab_size, hidden_size=config.dim,
        intermediate_size=config.intermediate_size, num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads, num_key_value_heads=config.n_kv_heads, head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings, rms_norm_eps=config.norm_eps,
        rope_theta=rope_theta, rope_scaling=rope_scaling, tie_word_embeddings=config.tie_embeddings,
        bos_token_id=config.bos_token_id, eos_token_id=list(config.eos_token_ids)))


def preset(name: str, tiny: bool = False) -> tuple[ModelConfig, object]:
    """(ModelConfig, synthetic HF config) of a named preset, optionally shrunk."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    spec = dict(PRESETS[name])
    theta, scaling = spec.pop("rope_theta"), spec.pop("rope_scaling")
    config = ModelConfig(head_dim=spec["dim"] // spec["n_heads"], max_position_embeddings=MAX_POSITIONS,
                         sliding_window=None, **spec)
    if tiny:
        config = shrink(config)
    return config, _hf_config(config, theta, scaling)


def shrink(config: ModelConfig) -> ModelConfig:
    """Two layers, head_dim 16, at most 2 KV heads with the same query heads per KV head, vocabulary 512."""
    kv = min(config.n_kv_heads, 2)
    heads = kv * config.group
    dim = heads * TINY_HEAD_DIM
    return dataclasses.replace(config, vocab_size=512, dim=dim, n_layers=2, n_heads=heads, n_kv_heads=kv,
                               head_dim=TINY_HEAD_DIM, intermediate_size=2 * dim, bos_token_id=1,
                               eos_token_ids=(2,))


def parameter_count(config: ModelConfig) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in Transformer(config).parameters())


@torch.no_grad()
def random_model(name: str, config: ModelConfig, hf, device, dtype, gamma: int = 3, seed: int = 0) -> LoadedModel:
    """A model (and gamma draft heads) of the given shape with random weights, allocated once in `dtype`."""
    with torch.device("meta"):
        net = Transformer(config).to(dtype)
    net = net.to_empty(device=device).eval().requires_grad_(False)
    generator = torch.Generator(device=device).manual_seed(seed)
    for pname, p in net.named_parameters():
        _fill(pname, p, generator)
    net.set_rope(*rope_table(hf, rope_positions(hf), device, dtype))
    heads = random_heads(config, device, dtype, gamma, seed + 1)
    return LoadedModel(name, Path(name), net, None, hf, heads, torch.device(device), dtype, random_heads=True)


@torch.no_grad()
def random_heads(config: ModelConfig, device, dtype, gamma: int = 3, seed: int = 1) -> DraftHeads:
    heads = new_heads(config, gamma).to(device=device, dtype=dtype).requires_grad_(False)
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, p in heads.named_parameters():
        _fill(name, p, generator)
    return heads


def _fill(name: str, p: torch.Tensor, generator: torch.Generator) -> None:
    if "norm" in name:
        p.fill_(1.0)  # unit norms keep activations in range through random layers
    else:
        p.normal_(0.0, 0.02, generator=generator)
